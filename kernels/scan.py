"""cumsum: the running sum along one axis (a block-level scan), with its numpy twin.

    cumsum(out, x, *, axis, stream=0)        out[..., j, ...] = x[..., 0, ...] + ... + x[..., j, ...]

Rows are described as in ``kernels/reduce.py``: the other axes number the rows
(one block each; blocks grid-stride over the rows), the summed axis is the row.
Each thread of a block owns a **segment** of ``ceil(width / block)`` consecutive
elements of its row:

    thread 0: x0 x1 x2 | thread 1: x3 x4 x5 | thread 2: x6 x7        (width 8, block 4)
    1. each thread adds up its segment:        3 sums
    2. the block scans the sums in shared memory: what comes before each segment
    3. each thread walks its segment again, from that start: out = start + x0, + x1, ...

Kernel rules: each element is read twice and written once, whatever the row's
length; the scan of the segment sums lives in shared memory (Hillis-Steele:
log2(block) steps, in step d every thread adds the value d places to its left);
every thread reaches every barrier, a fixed number of them per row (a barrier per
``block`` elements, as a chunk-by-chunk scan has, costs a long row thousands).

dtypes: every dtype of ``kernels/dtypes.py``.  The result is numpy's ``np.cumsum``
dtype (bool and integers: int64; floats keep theirs); float16 adds up in float32
and rounds each output once, on both targets.  A float sum may differ from
numpy's in the last bits (numpy adds left to right, the scan in a tree).
A 0-d tensor has no axis (``AxisError``, as in ``np.take_along_axis``).

>>> import numpy as np
>>> out = np.empty(4, np.int64)
>>> cumsum_cpu(out, np.array([1, 2, 3, 4], np.int8), axis=0); out
array([ 1,  3,  6, 10])
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np

from pyflow.kernels.backend import cuda
from pyflow.kernels.dtypes import SUPPORTED_DTYPES, check_dtype, kernel_constant
from pyflow.kernels.elementwise import position
from pyflow.kernels.jit import jit
from pyflow.kernels.launch import launcher, require_device_arrays, rows_config
from pyflow.kernels.layout import flat, normalize_axis
from pyflow.kernels.reduce import _check_out, coalesce
from pyflow.kernels.registry import register

__all__ = ["cumsum_result_dtype", "cumsum_accumulate_dtype", "make_cumsum", "cumsum_cpu", "cumsum_cuda"]


def cumsum_result_dtype(dtype) -> np.dtype:
    """numpy's ``np.cumsum`` dtype: int64 for bool and integers, floats keep theirs."""
    dtype = check_dtype("cumsum", dtype, SUPPORTED_DTYPES)
    return dtype if dtype.kind == "f" else np.dtype(np.int64)


def cumsum_accumulate_dtype(dtype) -> np.dtype:
    """What the running sum is kept in: float32 for float16, else the result dtype."""
    result = cumsum_result_dtype(dtype)
    return np.dtype(np.float32) if result == np.float16 else result


# --- device code ----------------------------------------------------------------


@functools.cache
def make_cumsum(acc_dtype: np.dtype, block: int):
    """``(cumsum_rows, block_scan)`` adding up in ``acc_dtype``, ``block`` threads (a power of two)."""
    acc_type, zero = numba.from_dtype(acc_dtype), kernel_constant(acc_dtype, 0)

    @jit(device=True)
    def block_scan(cache, t, value):
        """(value_0 + ... + value_(t-1), value_0 + ... + value_last): the block's exclusive prefix sums."""
        # Code plan (Hillis-Steele): d = 1, 2, 4, ...: every thread t >= d reads the cell
        # d to its left, waits for everyone to read, adds it to its own cell, waits again;
        # then cell t holds the inclusive sum up to t, and cell t - 1 what comes before t.
        cache[t] = value
        cuda.syncthreads()
        d = 1
        while d < block:
            left = cache[t - d] if t >= d else zero
            cuda.syncthreads()
            cache[t] += left
            cuda.syncthreads()
            d *= 2
        before = cache[t - 1] if t > 0 else zero
        total = cache[block - 1]
        cuda.syncthreads()  # before the caller's next row overwrites the cache
        return before, total

    @jit
    def cumsum_rows(out, out_strides, out_step, x, row_shape, x_strides, x_step, rows, width):
        """``out[row, j] = x[row, 0] + ... + x[row, j]`` (``*_step``: the strides along the axis)."""
        # Code plan:
        # 1. thread t owns elements lo..hi-1 of every row (a segment of ceil(width / block));
        # 2. block b takes rows b, b + gridDim, ...: t adds up its segment,
        # 3. the block scans the segment sums: where t's segment starts;
        # 4. t walks its segment again, writing the running sum.
        cache = cuda.shared.array(block, acc_type)
        t = cuda.threadIdx.x
        seg = (width + block - 1) // block
        lo = min(t * seg, width)
        hi = min(lo + seg, width)
        row = cuda.blockIdx.x
        while row < rows:
            x_base = position(row, row_shape, x_strides)
            out_base = position(row, row_shape, out_strides)
            own = zero
            for j in range(lo, hi):
                own += x[x_base + j * x_step]
            running, _ = block_scan(cache, t, own)
            for j in range(lo, hi):
                running += x[x_base + j * x_step]
                out[out_base + j * out_step] = running
            row += cuda.gridDim.x

    return cumsum_rows, block_scan


# --- host ----------------------------------------------------------------------------


def _check(out, x, axis) -> int:
    dtype = cumsum_result_dtype(x.dtype)
    axis = normalize_axis(axis, x.ndim, "cumsum")
    _check_out("cumsum", out, x.shape, dtype)
    return axis


def cumsum_cuda(out, x, *, axis, stream=0):
    require_device_arrays("cumsum", out, x)
    axis = _check(out, x, axis)
    width, rows = x.shape[axis], math.prod(x.shape) // max(x.shape[axis], 1)
    if not x.size:
        return
    out_storage, out_strides = flat(out)
    x_storage, x_strides = flat(x)
    kept = [d for d in range(x.ndim) if d != axis]
    row_shape, out_rows, x_rows = coalesce([x.shape[d] for d in kept], [out_strides[d] for d in kept],
                                           [x_strides[d] for d in kept])
    blocks, threads = rows_config(rows, width, dtypes=[x.dtype])
    kernel = make_cumsum(cumsum_accumulate_dtype(x.dtype), threads)[0]
    launcher(kernel, blocks, threads, stream)(out_storage, out_rows, out_strides[axis], x_storage, row_shape,
                                              x_rows, x_strides[axis], rows, width)


def cumsum_cpu(out, x, *, axis, stream=0):
    axis = _check(out, x, axis)
    acc = cumsum_accumulate_dtype(x.dtype)
    if acc == out.dtype:
        np.cumsum(x, axis=axis, dtype=acc, out=out)
    else:  # float16: add up in float32, round once
        np.copyto(out, np.cumsum(x, axis=axis, dtype=acc))


register("cumsum", "cuda", cumsum_cuda)
register("cumsum", "cpu", cumsum_cpu)


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check: every input dtype."""
    from numba import types

    from pyflow.kernels.compile_check import array, tuple_of

    i64, t2 = types.int64, tuple_of(2)
    cases = []
    for dtype in SUPPORTED_DTYPES:
        acc = cumsum_accumulate_dtype(dtype)
        rows, scan = make_cumsum(acc, 256)
        out, x = array(cumsum_result_dtype(dtype).name), array(dtype.name)
        if dtype == acc:
            cases.append((f"block_scan[{acc}]", scan.py_func, (array(acc.name), types.int32, numba.from_dtype(acc)),
                          True))
        cases.append((f"cumsum[{dtype}]", rows.py_func, (out, t2, i64, x, t2, t2, i64, i64, i64), False))
    return cases
