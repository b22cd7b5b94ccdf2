"""The fused NASRNN cell uTask (seed 001): the elementwise tail of one NASRNN step.

The NASRNN benchmark of the Cocktailer paper (its ``NasRNN`` model) is a recurrent
cell found by architecture search.  A step is two batched matmuls over 8 gates
(``ih = x_t @ W_ih``, ``hh = m @ W_hh``, each (8, B, H), see ``batched.py``) and then,
per cell element::

    l0 = sigmoid(i0 + h0)   l1 = relu(i1 + h1)   l2 = sigmoid(i2 + h2)   l3 = relu(i3 + h3)
    l4 = tanh(i4 + h4)      l5 = sigmoid(i5 + h5) l6 = tanh(i6 + h6)     l7 = sigmoid(i7 + h7)
    a = tanh(l0 * l1)   b = tanh(l2 + l3)   d = tanh(l4 * l5)   e = sigmoid(l6 + l7)
    c' = tanh(a + c) * b
    m' = tanh(c' * tanh(d + e))

(``ig``/``hg`` is gate ``g`` of ``ih``/``hh``).  The artifact writes these ops one by
one; NNFusion fuses them, and so does this uTask: uTask ``u`` owns a chunk of the
``n = B * H`` cell elements, like an elementwise uTask, and element ``e`` reads its
8 gates at ``g * n + e`` of ``ih`` and ``hh``.  It writes ``c_out`` and ``m_out``;
``c_out`` may be ``c`` (each element is read and written by the same thread), neither
output may overlap the gate buffers.
"""

from __future__ import annotations

import math

from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.scalar_ops import relu, sigmoid
from pyflow.kernels.utask.sizes import ceil_div, require_sizes

__all__ = ["GATES", "nasrnn_cell_utask", "nasrnn_cell_utask_count", "nasrnn_cell_kernel"]

GATES = 8


def nasrnn_cell_utask_count(batch: int, hidden: int, chunk: int) -> int:
    """uTasks of a NASRNN cell over a (batch, hidden) state: ``ceil(batch * hidden / chunk)``.

    >>> nasrnn_cell_utask_count(2, 5, chunk=4)
    3
    """
    require_sizes("nasrnn_cell", batch=batch, hidden=hidden)
    require_sizes("nasrnn_cell", minimum=1, chunk=chunk)
    return ceil_div(batch * hidden, chunk)


# --- device code ----------------------------------------------------------------


@jit(device=True)
def nasrnn_cell_utask(u, c_out, m_out, ih, hh, c, n, chunk):
    """uTask ``u`` of the NASRNN cell over ``n`` elements: the elements of chunk ``u``."""
    # Code plan: 1. the chunk [start, stop) u owns; 2. per element, the 8 gate
    # pre-activations ih + hh at g * n + e; 3. c' then m', by the thread that read c.
    start = u * chunk
    stop = min(n, start + chunk)
    for e in range(start + cuda.threadIdx.x, stop, cuda.blockDim.x):
        l0 = sigmoid(ih[e] + hh[e])
        l1 = relu(ih[n + e] + hh[n + e])
        l2 = sigmoid(ih[2 * n + e] + hh[2 * n + e])
        l3 = relu(ih[3 * n + e] + hh[3 * n + e])
        l4 = math.tanh(ih[4 * n + e] + hh[4 * n + e])
        l5 = sigmoid(ih[5 * n + e] + hh[5 * n + e])
        l6 = math.tanh(ih[6 * n + e] + hh[6 * n + e])
        l7 = sigmoid(ih[7 * n + e] + hh[7 * n + e])
        a = math.tanh(l0 * l1)
        b = math.tanh(l2 + l3)
        d = math.tanh(l4 * l5)
        f = sigmoid(l6 + l7)  # the artifact's l2_3 ("e" in the module doc)
        c_new = math.tanh(a + c[e]) * b
        c_out[e] = c_new
        m_out[e] = math.tanh(c_new * math.tanh(d + f))


@jit
def nasrnn_cell_kernel(u_begin, u_end, c_out, m_out, ih, hh, c, n, chunk):
    """uTasks ``u_begin <= u < u_end`` of ``nasrnn_cell_utask`` in the virtual-block loop."""
    for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):
        nasrnn_cell_utask(u, c_out, m_out, ih, hh, c, n, chunk)


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array

    i64 = types.int64
    cases = []
    for dtype in ("float32", "float64"):
        x = array(dtype)
        cases.append((f"nasrnn_cell_utask[{dtype}]", nasrnn_cell_utask.py_func, (i64, x, x, x, x, x, i64, i64), True))
        cases.append((f"nasrnn_cell_kernel[{dtype}]", nasrnn_cell_kernel.py_func,
                      (i64, i64, x, x, x, x, x, i64, i64), False))
    return cases
