"""The embedding gather uTask (seed 001): rows of a table picked by token ids that live on the device.

A decoder feeds back its own output.  In the Cocktailer artifact's Seq2seq, step
``t`` starts with ``x = embedding(tok)``, where ``tok`` is what step ``t - 1``'s
argmax wrote, on the device: the host never sees it.  So the gather reads its row
numbers from device memory::

    out[b, j] = weight[tok[b], j]        b < rows, j < dim;  weight is (vocab, dim)

uTask ``u`` owns chunk ``u`` of the ``rows * dim`` output elements, in the layout
of an elementwise uTask (element ``e`` on thread ``(e % chunk) % blockDim``), so a
later elementwise op over ``out`` with the same chunk needs no barrier.

Token ids are held as floats: Cocktailer's loop state and arenas hold float
tensors (an id is exact in float32 below 2**24, in float64 below 2**53), and
``int()`` truncates.  An id outside ``[0, vocab)`` (an argmax never writes one; a
caller's start token might) gives a row of NaN instead of a read outside the table.
"""

from __future__ import annotations

import math

from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.utask.sizes import ceil_div, require_sizes

__all__ = ["embedding_utask", "embedding_utask_count", "embedding_kernel"]


def embedding_utask_count(rows: int, dim: int, chunk: int) -> int:
    """uTasks of a gather of ``rows`` rows of ``dim`` elements: ``ceil(rows * dim / chunk)``.

    >>> embedding_utask_count(2, 5, chunk=4)
    3
    """
    require_sizes("embedding", rows=rows, dim=dim)
    require_sizes("embedding", minimum=1, chunk=chunk)
    return ceil_div(rows * dim, chunk)


# --- device code ----------------------------------------------------------------


@jit(device=True)
def embedding_utask(u, out, weight, ids, rows, dim, vocab, chunk):
    """uTask ``u``: the elements of chunk ``u`` of ``out`` (rows, dim) = ``weight[ids]``."""
    # Code plan: 1. the chunk [start, stop) u owns; 2. per element e = b * dim + j,
    # read token b from device memory, check it, copy weight[token, j].
    start = u * chunk
    stop = min(rows * dim, start + chunk)
    for e in range(start + cuda.threadIdx.x, stop, cuda.blockDim.x):
        b = e // dim
        token = ids[b]
        if token >= 0 and token < vocab:   # False for NaN too
            out[e] = weight[int(token) * dim + (e - b * dim)]
        else:
            out[e] = math.nan


@jit
def embedding_kernel(u_begin, u_end, out, weight, ids, rows, dim, vocab, chunk):
    """uTasks ``u_begin <= u < u_end`` of ``embedding_utask`` in the virtual-block loop."""
    for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):
        embedding_utask(u, out, weight, ids, rows, dim, vocab, chunk)


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array

    i64 = types.int64
    cases = []
    for dtype in ("float32", "float64"):
        x = array(dtype)
        cases.append((f"embedding_utask[{dtype}]", embedding_utask.py_func, (i64, x, x, x, i64, i64, i64, i64), True))
        cases.append((f"embedding_kernel[{dtype}]", embedding_kernel.py_func,
                      (i64, i64, x, x, x, i64, i64, i64, i64), False))
    return cases
