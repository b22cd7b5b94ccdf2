"""Fused recurrent-cell and fill uTasks (seed 001): what an LSTM step needs besides two matmuls.

An LSTM step is, per layer (PyTorch ``nn.LSTM``, gate order i, f, g, o)::

    gx = x @ W_ih.T + b_ih            # (B, 4H)   matmul uTasks
    gh = h @ W_hh.T + b_hh            # (B, 4H)   matmul uTasks
    i, f, g, o = split(gx + gh, 4)    # each (B, H)
    c' = sigmoid(f) * c + sigmoid(i) * tanh(g)
    h' = sigmoid(o) * tanh(c')

Cocktailer (through NNFusion) fuses the elementwise tail into one operator; here it
is ``lstm_cell_utask``: uTask ``u`` owns a chunk of the ``B * H`` cell elements, like
an elementwise uTask, and each element reads its four gates from ``gx`` and ``gh``.
It writes ``c_out`` and ``h_out``; ``c_out`` may be ``c`` (each element is read and
written by the same thread), ``h_out`` must not overlap the gate buffers.

``zero`` is a scalar device function for ``make_elementwise_utask(zero).map``: a
fill with 0 (``x * 0`` would keep NaNs of uninitialised memory).
"""

from __future__ import annotations

import math

from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.scalar_ops import sigmoid
from pyflow.kernels.utask.sizes import ceil_div, require_sizes

__all__ = ["lstm_cell_utask", "lstm_cell_utask_count", "zero"]


def lstm_cell_utask_count(batch: int, hidden: int, chunk: int) -> int:
    """uTasks of an LSTM cell over a (batch, hidden) state: ``ceil(batch * hidden / chunk)``.

    >>> lstm_cell_utask_count(2, 5, chunk=4)
    3
    """
    require_sizes("lstm_cell", batch=batch, hidden=hidden)
    require_sizes("lstm_cell", minimum=1, chunk=chunk)
    return ceil_div(batch * hidden, chunk)


@jit(device=True)
def zero(x):
    """0, whatever ``x`` holds (NaN included); the store casts it to the output's dtype."""
    return 0


@jit(device=True)
def lstm_cell_utask(u, h_out, c_out, gx, gh, c, batch, hidden, chunk):
    """uTask ``u`` of the fused LSTM cell; element ``e = b * hidden + j`` of chunk ``u``."""
    # Code plan: 1. the chunk of cell elements u owns; 2. per element, the four gate
    # pre-activations (gx + gh) at columns j, H + j, 2H + j, 3H + j of row b;
    # 3. c' then h', written by the thread that read c.
    n = batch * hidden
    start = u * chunk
    stop = min(n, start + chunk)
    for e in range(start + cuda.threadIdx.x, stop, cuda.blockDim.x):
        b = e // hidden
        j = e - b * hidden
        row = b * 4 * hidden
        i_gate = sigmoid(gx[row + j] + gh[row + j])
        f_gate = sigmoid(gx[row + hidden + j] + gh[row + hidden + j])
        g_gate = math.tanh(gx[row + 2 * hidden + j] + gh[row + 2 * hidden + j])
        o_gate = sigmoid(gx[row + 3 * hidden + j] + gh[row + 3 * hidden + j])
        c_new = f_gate * c[e] + i_gate * g_gate
        c_out[e] = c_new
        h_out[e] = o_gate * math.tanh(c_new)


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array

    i64 = types.int64
    cases = []
    for dtype in ("float32", "float64"):
        x = array(dtype)
        cases.append((f"lstm_cell_utask[{dtype}]", lstm_cell_utask.py_func,
                      (i64, x, x, x, x, x, i64, i64, i64), True))
        cases.append((f"zero[{dtype}]", zero.py_func, (getattr(types, dtype),), True))
    return cases
