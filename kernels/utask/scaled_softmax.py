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

The row is computed by ``kernels/softmax.py``'s ``row_softmax`` (the softmax family's one
device function, which the library's softmax kernel and ``reduce.py``'s softmax uTask call
too), built with the scale: each thread folds its scaled elements, the block's tree
(``kernels/reduce.py``'s ``block_reduce``) combines them (max, then sum), every thread
writes its own elements.  The uTask declares the shared array and hands it down (only
uTasks, which a kernel calls directly, own shared memory: ``batched.py`` says why).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import from_dtype

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.softmax import make_row_softmax
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
    row_softmax = make_row_softmax(False, dtype, scale)
    LANES = max_block
    DTYPE = from_dtype(dtype)

    @jit(device=True)
    def scaled_softmax_row_utask(u, out, x, rows, width):
        tmp = cuda.shared.array(LANES, DTYPE)  # this uTask's: row_softmax owns no shared memory
        lanes = min(cuda.blockDim.x, LANES)
        if u < rows and width > 0:  # block-uniform: barriers inside are safe
            base = u * width
            row_softmax(tmp, out, base, 1, x, base, 1, width, lanes, min(lanes, width))

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
