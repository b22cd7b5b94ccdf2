"""The Seq2seq decoder's LSTM cell uTask (seed 001): the artifact's gate-major cell with per-gate biases.

The Cocktailer artifact's Seq2seq (``AttnDecoderRNN``) writes its LSTM cell by hand,
with weights stacked by gate, ``weight_ih_l0_t`` and ``weight_hh_l0_t`` (4, H, H), so
a step's gates are two batched matmuls (``batched.py``), each (4, B, H), gate-major::

    ih = x @ weight_ih_l0_t;  hh = h @ weight_hh_l0_t      # ih[g], hh[g]: (B, H), g = i, f, g, o
    z_g = (ih[g] + bias_ih_g) + (hh[g] + bias_hh_g)
    c' = sigmoid(z_1) * c + sigmoid(z_0) * tanh(z_2)
    h' = sigmoid(z_3) * tanh(c')

``cell.py``'s ``lstm_cell_utask`` wants ``nn.LSTM``'s layout (B, 4H) with the biases
already added by the matmuls; here the four bias vectors come stacked as ``b_ih``,
``b_hh`` (4, H) and are added in the cell, in the artifact's order (bias to its own
matmul first).  uTask ``u`` owns a chunk of the ``n = B * H`` cell elements, like
an elementwise uTask; element ``e = b * H + j`` reads gate ``g`` at ``g * n + e`` of
``ih``/``hh`` and at ``g * H + j`` of the biases.  It writes ``h_out`` and ``c_out``;
``c_out`` may be ``c`` (each element is read and written by the same thread), neither
output may overlap the gates.
"""

from __future__ import annotations

import math

from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.scalar_ops import sigmoid
from pyflow.kernels.utask.sizes import ceil_div, require_sizes

__all__ = ["GATES", "gate_lstm_cell_utask", "gate_lstm_cell_utask_count", "gate_lstm_cell_kernel"]

GATES = 4


def gate_lstm_cell_utask_count(batch: int, hidden: int, chunk: int) -> int:
    """uTasks of the cell over a (batch, hidden) state: ``ceil(batch * hidden / chunk)``.

    >>> gate_lstm_cell_utask_count(2, 5, chunk=4)
    3
    """
    require_sizes("gate_lstm_cell", batch=batch, hidden=hidden)
    require_sizes("gate_lstm_cell", minimum=1, chunk=chunk)
    return ceil_div(batch * hidden, chunk)


# --- device code ----------------------------------------------------------------


@jit(device=True)
def gate_lstm_cell_utask(u, h_out, c_out, ih, hh, b_ih, b_hh, c, batch, hidden, chunk):
    """uTask ``u`` of the gate-major LSTM cell: the elements of chunk ``u``."""
    # Code plan: 1. the chunk [start, stop) u owns; 2. per element, the four gate
    # pre-activations (ih + b_ih) + (hh + b_hh); 3. c' then h', by the thread that read c.
    n = batch * hidden
    start = u * chunk
    stop = min(n, start + chunk)
    for e in range(start + cuda.threadIdx.x, stop, cuda.blockDim.x):
        j = e % hidden
        i_gate = sigmoid((ih[e] + b_ih[j]) + (hh[e] + b_hh[j]))
        f_gate = sigmoid((ih[n + e] + b_ih[hidden + j]) + (hh[n + e] + b_hh[hidden + j]))
        g_gate = math.tanh((ih[2 * n + e] + b_ih[2 * hidden + j]) + (hh[2 * n + e] + b_hh[2 * hidden + j]))
        o_gate = sigmoid((ih[3 * n + e] + b_ih[3 * hidden + j]) + (hh[3 * n + e] + b_hh[3 * hidden + j]))
        c_new = f_gate * c[e] + i_gate * g_gate
        c_out[e] = c_new
        h_out[e] = o_gate * math.tanh(c_new)


@jit
def gate_lstm_cell_kernel(u_begin, u_end, h_out, c_out, ih, hh, b_ih, b_hh, c, batch, hidden, chunk):
    """uTasks ``u_begin <= u < u_end`` of ``gate_lstm_cell_utask`` in the virtual-block loop."""
    for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):
        gate_lstm_cell_utask(u, h_out, c_out, ih, hh, b_ih, b_hh, c, batch, hidden, chunk)


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array

    i64 = types.int64
    cases = []
    for dtype in ("float32", "float64"):
        x = array(dtype)
        cases.append((f"gate_lstm_cell_utask[{dtype}]", gate_lstm_cell_utask.py_func,
                      (i64, x, x, x, x, x, x, x, i64, i64, i64), True))
        cases.append((f"gate_lstm_cell_kernel[{dtype}]", gate_lstm_cell_kernel.py_func,
                      (i64, i64, x, x, x, x, x, x, x, i64, i64, i64), False))
    return cases
