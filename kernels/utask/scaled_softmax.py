"""The scaled row softmax uTask (seed 001): Attention's ``softmax(scores * scale)`` as one operator.

The Attention benchmark of the Cocktailer paper scales its scores before the
softmax (``attn = softmax((k @ q^T)^T * 0.125)``).  Two operators (a scale, then
``reduce.py``'s softmax) would need a grid barrier between them: the softmax reads
whole rows, which other blocks' scale chunks wrote.  Fused, uTask ``u`` owns row ``u``
(``rows`` rows of ``width`` elements, flat) and computes

    out[u, j] = exp(scale * x[u, j] - max_j(scale * x[u, j])) / sum_j(...)

stable for either sign of ``scale`` (the max is taken over the scaled values).
``scale`` is a compile-time constant of the factory (generated code passes only
tensors and ints), so ``make_scaled_softmax_row_utask(scale, dtype)`` builds and
caches one device function per ``(scale, dtype)``.  ``out`` may be ``x``.

Code plan as in ``reduce.py``: each thread folds its elements, a shared-memory tree
combines the block's values (max, then sum), every thread normalises what it wrote.
The tree is written out here rather than calling ``reduce.py``'s ``block_reduce``:
a device function with a shared array must be reached from a kernel along one
path only (``batched.py`` explains the numba-cuda linking problem), and two softmax
operators of different widths in one kernel would reach the same ``block_reduce``
specialization through two.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import from_dtype

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels import scalar_ops
from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.utask.reduce import MAX_BLOCK, softmax_row_utask_count
from pyflow.kernels.utask.sizes import require_sizes

__all__ = ["make_scaled_softmax_row_utask", "make_scaled_softmax_row_kernel", "scaled_softmax_row_utask_count"]

_DTYPES = (np.dtype("float32"), np.dtype("float64"))


def scaled_softmax_row_utask_count(rows: int, width: int) -> int:
    """uTasks of a row softmax: one per row.

    >>> scaled_softmax_row_utask_count(4, 6)
    4
    """
    return softmax_row_utask_count(rows, width)


def _normalize(scale, dtype, max_block):
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)) \
            or not math.isfinite(scale):
        raise DTypeError(f"scaled_softmax_row uTasks: scale must be a finite number, got {scale!r}")
    dtype = np.dtype(dtype)
    if dtype not in _DTYPES:
        raise DTypeError(f"scaled_softmax_row uTasks: unsupported dtype {dtype}; expected float32 or float64")
    require_sizes("scaled_softmax_row", minimum=1, max_block=max_block)
    if max_block > MAX_BLOCK:
        raise ShapeError(f"scaled_softmax_row uTasks: max_block {max_block} is larger than a block can be "
                         f"({MAX_BLOCK})")
    return float(scale), dtype, int(max_block)


# --- device code ----------------------------------------------------------------


def make_scaled_softmax_row_utask(scale: float, dtype="float32", max_block: int = MAX_BLOCK):
    """``scaled_softmax_row_utask(u, out, x, rows, width)``: softmax of ``scale * x`` over row ``u``."""
    return _build(*_normalize(scale, dtype, max_block))


@functools.cache
def _build(scale, dtype, max_block):
    LANES = max_block
    DTYPE = from_dtype(dtype)
    SCALE = scale

    @jit(device=True)
    def scaled_softmax_row_utask(u, out, x, rows, width):
        tmp = cuda.shared.array(LANES, DTYPE)  # one value per active thread, then the tree
        t = cuda.threadIdx.x
        lanes = min(cuda.blockDim.x, LANES)
        active = min(lanes, width)
        if u < rows and width > 0:  # block-uniform: barriers inside are safe
            base = u * width
            # 1. the row max of the scaled values: each thread folds its elements into
            #    tmp[t], then a tree halves the live width each step (a barrier each)
            if t < active:
                m = x[base + t] * SCALE
                for j in range(t + lanes, width, lanes):
                    m = scalar_ops.maximum(m, x[base + j] * SCALE)
                tmp[t] = m
            cuda.syncthreads()
            live = active
            while live > 1:
                half = (live + 1) // 2
                if t < live - half:
                    tmp[t] = scalar_ops.maximum(tmp[t], tmp[t + half])
                cuda.syncthreads()
                live = half
            row_max = tmp[0]
            cuda.syncthreads()  # everyone has read tmp[0] before it is overwritten
            # 2. e = exp(scale * x - max) into out (each thread its own elements; all of
            #    x was read in step 1, so out may be x) and the sum, by the same tree
            if t < active:
                s = row_max - row_max
                for j in range(t, width, lanes):
                    e = math.exp(x[base + j] * SCALE - row_max)
                    out[base + j] = e
                    s += e
                tmp[t] = s
            cuda.syncthreads()
            live = active
            while live > 1:
                half = (live + 1) // 2
                if t < live - half:
                    tmp[t] = tmp[t] + tmp[t + half]
                cuda.syncthreads()
                live = half
            total = tmp[0]
            # 3. normalise the elements this thread wrote in step 2
            if t < active:
                for j in range(t, width, lanes):
                    out[base + j] = out[base + j] / total
            cuda.syncthreads()  # everyone has read tmp[0]: the next uTask may overwrite tmp

    return scaled_softmax_row_utask


def make_scaled_softmax_row_kernel(scale: float, dtype="float32", max_block: int = MAX_BLOCK):
    """Kernel ``(u_begin, u_end, out, x, rows, width)``: uTasks ``u_begin <= u < u_end``."""
    return _build_kernel(*_normalize(scale, dtype, max_block))


@functools.cache
def _build_kernel(scale, dtype, max_block):
    utask = _build(scale, dtype, max_block)

    @jit
    def scaled_softmax_row_kernel(u_begin, u_end, out, x, rows, width):
        for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):  # block-uniform
            utask(u, out, x, rows, width)

    return scaled_softmax_row_kernel


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array

    i64 = types.int64
    cases = []
    for scale, dtype in ((0.125, "float32"), (-2.0, "float64")):
        x = array(dtype)
        cases.append((f"scaled_softmax_row_utask[{scale},{dtype}]",
                      make_scaled_softmax_row_utask(scale, dtype, 256).py_func, (i64, x, x, i64, i64), True))
        cases.append((f"scaled_softmax_row_kernel[{scale},{dtype}]",
                      make_scaled_softmax_row_kernel(scale, dtype, 256).py_func, (i64, i64, x, x, i64, i64), False))
    return cases
