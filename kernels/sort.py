"""topk: the k largest (or smallest) elements along an axis, sorted, with their indices.

    topk(values, indices, x, *, k, axis=-1, largest=True, stream=0)

``values[..., r, ...]`` is the r-th element of the order below and
``indices[..., r, ...]`` (int64) its position along ``axis``; both have x's shape
with ``k`` along ``axis``.  The order (PyTorch's ``torch.topk``, made exact):
* by value, largest first (``largest=False``: smallest first);
* NaN counts as larger than every number: first when largest, last otherwise;
* equal values (also -0.0 and 0.0) go in index order, the lower index first.
Both targets give exactly the same values and indices, NaN and ties included.

The CUDA kernel is for **small k**: at most ``MAX_TOPK`` (64); a larger k is a
``ShapeError`` on cuda (the CPU twin takes any k; a sort-based kernel would be the
tool there).  One block per row (rows as in ``kernels/reduce.py``); per row:
1. each thread keeps the best k of its elements (t, t + block, ...) sorted in a
   local array, inserting each element it reads (every element is read once);
2. k rounds: every thread offers its best element not yet taken, a shared-memory
   tree (``block_first``) picks the block's best, thread 0 writes it as result r,
   and the thread that offered it moves on to its next one.
The global r-th element is always some thread's best untaken one, so k rounds
find the top k.  The CPU twin is numpy's stable argsort (of the reversed row, for
largest first, so that ties keep the lower index first).

dtypes: every dtype of ``kernels/dtypes.py`` (bool: True is the larger).  ``k``
is 0..size of the axis; a 0-d tensor has no axis (``AxisError``).
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.dtypes import SUPPORTED_DTYPES, check_dtype, kernel_constant
from pyflow.kernels.elementwise import position
from pyflow.kernels.jit import jit
from pyflow.kernels.launch import launcher, require_device_arrays, rows_config
from pyflow.kernels.layout import flat, normalize_axis
from pyflow.kernels.reduce import coalesce
from pyflow.kernels.registry import register

__all__ = ["MAX_TOPK", "topk_before", "make_topk", "topk_cpu", "topk_cuda", "local_size"]

MAX_TOPK = 64   # the largest k the CUDA kernel takes (each thread keeps k candidates in local memory)


# --- device code ----------------------------------------------------------------


@jit(device=True)
def topk_before(va, ia, vb, ib, largest):
    """Does (value va, index ia) come before (vb, ib) in topk's order?  Index -1: no element (last)."""
    if ib < 0:
        return True
    if ia < 0:
        return False
    a_nan = va != va
    b_nan = vb != vb
    if a_nan or b_nan:
        if a_nan and b_nan:
            return ia < ib
        return a_nan == largest  # NaN is the largest value
    if va != vb:
        return (va > vb) == largest
    return ia < ib


@functools.cache
def make_topk(dtype: np.dtype, block: int, cap: int):
    """``(topk_rows, block_first)`` for ``dtype``, ``block`` threads, k up to ``cap`` (the local arrays)."""
    value_type, zero = numba.from_dtype(dtype), kernel_constant(dtype, 0)

    @jit(device=True)
    def block_first(values, indices, t, v, i, largest):
        # Code plan: the tree of reduce.make_block_reduce on (value, index) pairs, topk's order.
        values[t] = v
        indices[t] = i
        cuda.syncthreads()
        half = block // 2
        while half > 0:
            if t < half and topk_before(values[t + half], indices[t + half], values[t], indices[t], largest):
                values[t] = values[t + half]
                indices[t] = indices[t + half]
            cuda.syncthreads()
            half //= 2
        first_v = values[0]
        first_i = indices[0]
        cuda.syncthreads()
        return first_v, first_i

    @jit
    def topk_rows(values, v_strides, v_step, indices, i_strides, i_step, x, row_shape, x_strides, x_step,
                  rows, width, k, largest):
        """For each row: its first k elements in topk's order, into ``values`` and ``indices``."""
        # Code plan (see the module docstring): 1. each thread inserts its elements into its
        # sorted local top k; 2. k rounds of "offer your best untaken, the block picks one".
        mine_v = cuda.local.array(cap, value_type)
        mine_i = cuda.local.array(cap, numba.int64)
        shared_v = cuda.shared.array(block, value_type)
        shared_i = cuda.shared.array(block, numba.int64)
        t = cuda.threadIdx.x
        row = cuda.blockIdx.x
        while row < rows:
            base = position(row, row_shape, x_strides)
            count = 0
            j = t
            while j < width:
                v = x[base + j * x_step]
                p = -1
                if count < k:  # room left: take it
                    p = count
                    count += 1
                elif topk_before(v, j, mine_v[k - 1], mine_i[k - 1], largest):
                    p = k - 1  # better than my k-th: it replaces it
                if p >= 0:
                    while p > 0 and topk_before(v, j, mine_v[p - 1], mine_i[p - 1], largest):
                        mine_v[p] = mine_v[p - 1]
                        mine_i[p] = mine_i[p - 1]
                        p -= 1
                    mine_v[p] = v
                    mine_i[p] = j
                j += block
            head = 0
            for r in range(k):
                offer_v, offer_i = value_type(zero), -1
                if head < count:
                    offer_v, offer_i = mine_v[head], mine_i[head]
                best_v, best_i = block_first(shared_v, shared_i, t, offer_v, offer_i, largest)
                if t == 0:
                    values[position(row, row_shape, v_strides) + r * v_step] = best_v
                    indices[position(row, row_shape, i_strides) + r * i_step] = best_i
                if offer_i >= 0 and offer_i == best_i:
                    head += 1
            row += cuda.gridDim.x

    return topk_rows, block_first


def local_size(k: int) -> int:
    """The local arrays' length for ``k``: 8, 16, 32 or 64 (a few compiled kernels serve every k)."""
    size = 8
    while size < k:
        size *= 2
    return size


# --- host ----------------------------------------------------------------------------


def _check(target, values, indices, x, k, axis) -> int:
    op = f"topk ({target})" if target == "cuda" else "topk"
    if target == "cuda":
        require_device_arrays("topk", values, indices, x)
    dtype = check_dtype("topk", x.dtype, SUPPORTED_DTYPES)
    axis = normalize_axis(axis, x.ndim, "topk")
    n = x.shape[axis]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= n:
        raise ShapeError(f"topk: k must be an int from 0 to {n} (the size of axis {axis} of a "
                         f"{tuple(x.shape)} tensor), got {k!r}")
    if target == "cuda" and k > MAX_TOPK:
        raise ShapeError(f"{op}: k={k} is more than the {MAX_TOPK} the CUDA kernel keeps per thread; "
                         "use a smaller k, or sort on the CPU")
    shape = tuple(k if d == axis else n for d, n in enumerate(x.shape))
    for name, array, expected in (("values", values, dtype), ("indices", indices, np.dtype(np.int64))):
        if tuple(array.shape) != shape:
            raise ShapeError(f"topk: {name} has shape {tuple(array.shape)}, expected {shape}")
        if np.dtype(array.dtype) != expected:
            raise DTypeError(f"topk: {name} dtype is {array.dtype}, expected {expected}")
        if math.prod(shape) and any(s == 0 and m > 1 for s, m in zip(array.strides, array.shape)):
            raise ShapeError(f"topk: {name} is a broadcast view (stride 0): threads would race")
    return axis


def topk_cuda(values, indices, x, *, k, axis=-1, largest=True, stream=0):
    axis = _check("cuda", values, indices, x, k, axis)
    width = x.shape[axis]
    rows = math.prod(x.shape) // width if width else 0
    if k == 0 or rows == 0:
        return
    (x_storage, x_strides), (v_storage, v_strides), (i_storage, i_strides) = flat(x), flat(values), flat(indices)
    kept = [d for d in range(x.ndim) if d != axis]
    row_shape, x_rows, v_rows, i_rows = coalesce([x.shape[d] for d in kept], *[[s[d] for d in kept] for s in
                                                                                (x_strides, v_strides, i_strides)])
    blocks, threads = rows_config(rows, width, dtypes=[x.dtype])
    kernel = make_topk(np.dtype(x.dtype), threads, local_size(k))[0]
    launcher(kernel, blocks, threads, stream)(v_storage, v_rows, v_strides[axis], i_storage, i_rows, i_strides[axis],
                                              x_storage, row_shape, x_rows, x_strides[axis], rows, width, k,
                                              bool(largest))


def topk_cpu(values, indices, x, *, k, axis=-1, largest=True, stream=0):
    axis = _check("cpu", values, indices, x, k, axis)
    if largest:  # descending, ties (NaN too) in index order: a stable sort of the reversed row, reversed
        n = x.shape[axis]
        order = n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    else:        # ascending, NaN last, ties in index order
        order = np.argsort(x, axis=axis, kind="stable")
    first = np.take(order, np.arange(k), axis=axis)
    indices[...] = first
    values[...] = np.take_along_axis(x, first, axis=axis)


register("topk", "cuda", topk_cuda)
register("topk", "cpu", topk_cpu)


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check: every dtype, the largest k."""
    from numba import types

    from pyflow.kernels.compile_check import array, tuple_of

    i64, t2, b1 = types.int64, tuple_of(2), types.boolean
    cases = []
    for dtype in SUPPORTED_DTYPES:
        v = numba.from_dtype(dtype)
        rows, first = make_topk(dtype, 256, MAX_TOPK)
        x, idx = array(dtype.name), array("int64")
        cases.append((f"topk_before[{dtype}]", topk_before.py_func, (v, i64, v, i64, b1), True))
        cases.append((f"topk[{dtype}] block_first", first.py_func, (x, idx, types.int32, v, i64, b1), True))
        cases.append((f"topk[{dtype}] rows", rows.py_func,
                      (x, t2, i64, idx, t2, i64, x, t2, t2, i64, i64, i64, i64, b1), False))
    return cases
