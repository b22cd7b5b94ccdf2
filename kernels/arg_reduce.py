"""argmax and argmin: reductions that carry (value, index) pairs (device code).

The host side (axes, dtypes, the row description, two passes) is shared with the
other reductions in ``kernels/reduce.py``; this module holds the kernels.  A row
is folded exactly as ``make_block_reduce`` folds numbers, but on pairs: each thread
keeps the best (value, index) of its share of the row, then a shared-memory tree
of two arrays (values, indices) halves the block's pairs log2(block) times.  That
tree is ``make_block_arg_reduce``'s device function, the one block arg-reduction of
the library's kernels and of Cocktailer's argmax uTask (``kernels/utask/argmax.py``).

Which pair is better is a device function of four arguments, numpy's rules:
* ``argmax_better`` - the larger value; ``argmin_better`` - the smaller one;
* NaN beats every number in both (numpy's argmax and argmin stop at the first NaN);
* equal values go to the lower index (the first occurrence);
* index -1 means "no value yet" and loses to everything.

Every dtype of ``kernels/dtypes.py`` works (bool compares False < True).
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from pyflow.kernels.backend import cuda
from pyflow.kernels.dtypes import kernel_constant
from pyflow.kernels.elementwise import position
from pyflow.kernels.jit import jit

__all__ = ["argmax_better", "argmin_better", "make_block_arg_reduce", "make_arg_reduce", "BETTER"]


@jit(device=True)
def argmax_better(va, ia, vb, ib):
    """Does (value va, index ia) beat (vb, ib) for argmax?  (See the module docstring.)"""
    if ib < 0:
        return True
    if ia < 0:
        return False
    a_nan = va != va
    b_nan = vb != vb
    if a_nan or b_nan:
        return (ia < ib) if (a_nan and b_nan) else a_nan
    if va != vb:
        return va > vb
    return ia < ib


@jit(device=True)
def argmin_better(va, ia, vb, ib):
    """Does (value va, index ia) beat (vb, ib) for argmin?  NaN still wins, as in numpy."""
    if ib < 0:
        return True
    if ia < 0:
        return False
    a_nan = va != va
    b_nan = vb != vb
    if a_nan or b_nan:
        return (ia < ib) if (a_nan and b_nan) else a_nan
    if va != vb:
        return va < vb
    return ia < ib


BETTER = {"argmax": argmax_better, "argmin": argmin_better}


@functools.cache
def make_block_arg_reduce(better):
    """Device function ``block_arg_reduce(values, indices, value, index, active)``: the best of the
    (``value``, ``index``) pairs of threads ``0 .. active - 1`` by ``better``, handed to every thread.

    ``make_block_reduce``'s tree (``kernels/reduce.py``) on pairs: each active thread stores its
    pair, then the first half of the live width keeps the better of pairs t and t + half, the
    width halving (rounding up) until 1, a barrier after each step.  Every thread of the block
    calls it with the same ``active`` (``1 <= active <= blockDim.x``); threads from ``active`` on
    only join the barriers.  ``values`` and ``indices`` are the caller's shared arrays (at least
    ``active`` long), free again on return: a device function declaring shared arrays and reached
    from one kernel along two paths would define them twice, which NVVM rejects
    (``kernels/utask/batched.py``).  The library's kernels pass their whole power-of-two block
    (pairs t and t + block / 2, then t + block / 4, ...); the argmax uTask the threads that hold a pair.
    """

    @jit(device=True)
    def block_arg_reduce(values, indices, value, index, active):
        # Code plan: the tree of make_block_reduce, on (value, index) pairs; every thread
        # reaches every barrier, and reads the winner before the last one.
        t = cuda.threadIdx.x
        if t < active:
            values[t] = value
            indices[t] = index
        cuda.syncthreads()
        width = active
        while width > 1:   # block-uniform: every thread runs the same steps
            half = (width + 1) // 2
            if t < width - half and better(values[t + half], indices[t + half], values[t], indices[t]):
                values[t] = values[t + half]
                indices[t] = indices[t + half]
            cuda.syncthreads()
            width = half
        best_v = values[0]
        best_i = indices[0]
        cuda.syncthreads()
        return best_v, best_i

    return block_arg_reduce


@functools.cache
def make_arg_reduce(op: str, dtype: np.dtype, block: int):
    """``(rows, partials, merge)`` kernels for ``op`` (argmax, argmin) on ``dtype``, ``block`` threads."""
    better = BETTER[op]
    block_arg_reduce = make_block_arg_reduce(better)
    value_type, zero = numba.from_dtype(dtype), kernel_constant(dtype, 0)

    @jit
    def arg_rows(out, out_strides, x, row_shape, row_strides, col_shape, col_strides, rows, width):
        """``out[row]`` = index j of the row's best element (first NaN, first of ties)."""
        # Code plan: 1. block b takes rows b, b + gridDim, ...; 2. thread t keeps the best
        # pair of elements t, t + block, ...; 3. the block's tree picks the best pair.
        values = cuda.shared.array(block, value_type)
        indices = cuda.shared.array(block, numba.int64)
        t = cuda.threadIdx.x
        row = cuda.blockIdx.x
        while row < rows:
            base = position(row, row_shape, row_strides)
            best_v, best_i = value_type(zero), -1
            j = t
            while j < width:
                v = x[base + position(j, col_shape, col_strides)]
                if better(v, j, best_v, best_i):
                    best_v, best_i = v, j
                j += block
            best_v, best_i = block_arg_reduce(values, indices, best_v, best_i, block)
            if t == 0:
                out[position(row, row_shape, out_strides)] = best_i
            row += cuda.gridDim.x

    @jit
    def arg_partials(part_v, part_i, x, col_shape, col_strides, width):
        """Pass 1 of one long row: block b's best (value, index) into ``part_v[b], part_i[b]``."""
        values = cuda.shared.array(block, value_type)
        indices = cuda.shared.array(block, numba.int64)
        t = cuda.threadIdx.x
        best_v, best_i = value_type(zero), -1
        j = cuda.grid(1)
        while j < width:
            v = x[position(j, col_shape, col_strides)]
            if better(v, j, best_v, best_i):
                best_v, best_i = v, j
            j += cuda.gridsize(1)
        best_v, best_i = block_arg_reduce(values, indices, best_v, best_i, block)
        if t == 0:
            part_v[cuda.blockIdx.x] = best_v
            part_i[cuda.blockIdx.x] = best_i

    @jit
    def arg_merge(out, part_v, part_i, n):
        """Pass 2 (one block): the best of the ``n`` partial pairs; ``out[0]`` = its index."""
        values = cuda.shared.array(block, value_type)
        indices = cuda.shared.array(block, numba.int64)
        t = cuda.threadIdx.x
        best_v, best_i = value_type(zero), -1
        j = t
        while j < n:
            if better(part_v[j], part_i[j], best_v, best_i):
                best_v, best_i = part_v[j], part_i[j]
            j += block
        best_v, best_i = block_arg_reduce(values, indices, best_v, best_i, block)
        if t == 0:
            out[0] = best_i

    return arg_rows, arg_partials, arg_merge


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check: both ops, every dtype."""
    from numba import types

    from pyflow.kernels.compile_check import array, tuple_of
    from pyflow.kernels.dtypes import SUPPORTED_DTYPES

    i64, t2 = types.int64, tuple_of(2)
    cases = []
    for op in ("argmax", "argmin"):
        for dtype in SUPPORTED_DTYPES:
            rows, partials, merge = make_arg_reduce(op, dtype, 256)
            x, idx, v = array(dtype.name), array("int64"), numba.from_dtype(dtype)
            cases.append((f"{op}_better[{dtype}]", BETTER[op].py_func, (v, i64, v, i64), True))
            cases.append((f"{op}[{dtype}] block_arg_reduce", make_block_arg_reduce(BETTER[op]).py_func,
                          (x, idx, v, i64, i64), True))
            cases.append((f"{op}[{dtype}] rows", rows.py_func, (idx, t2, x, t2, t2, t2, t2, i64, i64), False))
            if dtype.name in ("float16", "bool", "int64"):
                cases.append((f"{op}[{dtype}] partials", partials.py_func, (x, idx, x, t2, t2, i64), False))
                cases.append((f"{op}[{dtype}] merge", merge.py_func, (idx, x, idx, i64), False))
    return cases
