"""The row argmax uTask (seed 001): greedy decoding's ``tok = argmax(logits + noise)``, one row per uTask.

The Cocktailer artifact's Seq2seq picks each step's tokens with
``output = (out(h) + std[id]).argmax(1)``: per batch row, the index of the largest
logit after adding that step's noise (or forcing) row.  Fused, uTask ``u`` owns row
``u`` (``rows`` rows of ``width`` elements, flat) and computes

    out[u] = the first j that maximises x[u, j] + y[u, j]

(pass a zero ``y`` for a plain argmax).  The sum is formed in the inputs' dtype, as
the separate ``+`` would be.  Ties and NaN follow ``torch.argmax`` and
``numpy.argmax``, through ``arg_reduce.argmax_better``: the first maximal index
wins, and NaN counts as larger than every number (the first NaN wins).  The index
is written as a float into ``out`` (a token id, see ``embedding.py``).

Code plan (``reduce.py``'s, carrying (value, index) pairs):
1. each active thread ``t`` scans the elements ``t, t + lanes, ...`` of the row in
   increasing order and keeps its best pair (so ties keep the earlier index);
2. ``kernels/arg_reduce.py``'s ``block_arg_reduce`` (the library's argmax and argmin use
   the same tree) halves the live pairs each step (a barrier after each), the better
   of two pairs winning, the smaller index on a tie, and hands the winner to every thread;
3. thread 0 writes its index.

The uTask declares the tree's two shared arrays (``batched.py`` explains why a device
function with shared memory must be the one a kernel calls).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import from_dtype
from numba import types as numba_types

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels.arg_reduce import argmax_better, make_block_arg_reduce
from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.utask.reduce import MAX_BLOCK
from pyflow.kernels.utask.sizes import require_sizes

__all__ = ["make_argmax_sum_row_utask", "make_argmax_sum_row_kernel", "argmax_sum_row_utask_count"]

_DTYPES = (np.dtype("float32"), np.dtype("float64"))


def argmax_sum_row_utask_count(rows: int, width: int) -> int:
    """uTasks of a row argmax: one per row.  An empty row has no argmax: ``width >= 1``.

    >>> argmax_sum_row_utask_count(3, 11)
    3
    """
    require_sizes("argmax_sum_row", rows=rows)
    require_sizes("argmax_sum_row", minimum=1 if rows else 0, width=width)
    return int(rows)


def _normalize(dtype, max_block):
    dtype = np.dtype(dtype)
    if dtype not in _DTYPES:
        raise DTypeError(f"argmax_sum_row uTasks: unsupported dtype {dtype}; expected float32 or float64")
    require_sizes("argmax_sum_row", minimum=1, max_block=max_block)
    if max_block > MAX_BLOCK:
        raise ShapeError(f"argmax_sum_row uTasks: max_block {max_block} is larger than a block can be ({MAX_BLOCK})")
    return dtype, int(max_block)


# --- device code ----------------------------------------------------------------


def make_argmax_sum_row_utask(dtype="float32", max_block: int = MAX_BLOCK):
    """``argmax_sum_row_utask(u, out, x, y, rows, width)``: ``out[u] = argmax_j(x[u, j] + y[u, j])``.

    ``x``, ``y`` hold ``rows * width`` elements of ``dtype``, ``out`` at least ``rows``.
    Blocks of up to ``max_block`` threads share the work; more only join the barriers.
    A ``u >= rows`` (or ``width == 0``) writes nothing.
    """
    return _build(*_normalize(dtype, max_block))


@functools.cache
def _build(dtype, max_block):
    LANES = max_block
    DTYPE = from_dtype(dtype)
    INDEX = numba_types.int64
    block_arg_reduce = make_block_arg_reduce(argmax_better)

    @jit(device=True)
    def argmax_sum_row_utask(u, out, x, y, rows, width):
        values = cuda.shared.array(LANES, DTYPE)   # the tree's values ...
        indices = cuda.shared.array(LANES, INDEX)  # ... and their indices
        t = cuda.threadIdx.x
        lanes = min(cuda.blockDim.x, LANES)
        active = min(lanes, width)
        if u < rows and width > 0:  # block-uniform: barriers inside are safe
            base = u * width
            best = x[base] + y[base]  # a placeholder of the right type for idle threads
            best_j = -1
            # 1. this thread's elements, in increasing order: a tie keeps the earlier
            if t < active:
                best = x[base + t] + y[base + t]
                best_j = t
                for j in range(t + lanes, width, lanes):
                    v = x[base + j] + y[base + j]
                    if argmax_better(v, j, best, best_j):
                        best = v
                        best_j = j
            # 2. the block's tree; 3. the winner's index, as a token id of out's dtype
            best, best_j = block_arg_reduce(values, indices, best, best_j, active)
            if t == 0:
                out[u] = best_j

    return argmax_sum_row_utask


def make_argmax_sum_row_kernel(dtype="float32", max_block: int = MAX_BLOCK):
    """Kernel ``(u_begin, u_end, out, x, y, rows, width)``: uTasks ``u_begin <= u < u_end``."""
    return _build_kernel(*_normalize(dtype, max_block))


@functools.cache
def _build_kernel(dtype, max_block):
    utask = _build(dtype, max_block)

    @jit
    def argmax_sum_row_kernel(u_begin, u_end, out, x, y, rows, width):
        for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):  # block-uniform
            utask(u, out, x, y, rows, width)

    return argmax_sum_row_kernel


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array

    i64 = types.int64
    cases = []
    for dtype in ("float32", "float64"):
        x = array(dtype)
        cases.append((f"argmax_sum_row_utask[{dtype}]", make_argmax_sum_row_utask(dtype, 256).py_func,
                      (i64, x, x, x, i64, i64), True))
        cases.append((f"argmax_sum_row_kernel[{dtype}]", make_argmax_sum_row_kernel(dtype, 256).py_func,
                      (i64, i64, x, x, x, i64, i64), False))
    return cases
