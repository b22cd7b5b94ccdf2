"""Reductions (sum, prod, max, min, mean, argmax, argmin) over any axes (softmax: ``kernels/softmax.py``).

A reduction is a table of **rows**: the kept axes number the rows (one per output
element), the reduced axes number the elements of a row.  The host describes both
as (shape, strides) pairs and a kernel unravels a row number and an element
number with ``position`` (``kernels/elementwise.py``):

    x[row, j] = storage[position(row, row_shape, row_strides) + position(j, col_shape, col_strides)]

Kernel design (as in OneFlow's and CUB's block reductions):
* one block per row; blocks grid-stride over the rows (``launch.rows_config``);
* the threads of a block stride over the row, each folding its elements into one
  value; a shared-memory tree then halves the block's values log2(block) times;
* a single row longer than ``TWO_PASS_WIDTH`` (a full reduction of a big array)
  would keep one block busy while the GPU idles: pass 1 has many blocks, each over
  its own stretch of the row, write partial results into a temporary device array,
  pass 2 reduces the partials;
* argmax and argmin carry (value, index) pairs through the tree (two shared
  arrays; their kernels are in ``kernels/arg_reduce.py``).

numpy is the specification: result dtypes (the sum or product of bool or int32 is
int64, the mean of ints float64, the max of bool bool), shapes (``keepdims``), NaN (max/min
propagate it, argmax and argmin find the first NaN), empty reductions (sum 0, mean
nan, prod 1, max/min/argmax/argmin refused with ``ShapeError`` where numpy raises
``ValueError``).  The CPU twins are numpy itself.  Every dtype of
``kernels/dtypes.py`` is accepted, with two choices of our own:
* the sum and product of uint8 are int64 (numpy: uint64, a dtype pyflow does not
  have; PyTorch: int64);
* float16 sums, products and means accumulate in float32 and round once at the end (numpy does
  so for the mean; PyTorch for both), on both targets; max and min stay float16.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numba
import numpy as np

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels import scalar_ops
from pyflow.kernels.arg_reduce import argmax_better, make_arg_reduce
from pyflow.kernels.backend import cuda, is_simulator
from pyflow.kernels.dtypes import SUPPORTED_DTYPES, check_dtype, kernel_constant
from pyflow.kernels.elementwise import position
from pyflow.kernels.jit import jit
from pyflow.kernels.launch import (SIM_MAX_BLOCKS, compiled_launch, elementwise_config, launcher, one_operation,
                                   require_device_arrays, rows_config)
from pyflow.kernels.layout import flat, normalize_axes, normalize_axis
from pyflow.kernels.registry import register

__all__ = ["REDUCTIONS", "ARG_REDUCTIONS", "REDUCE_DTYPES", "TWO_PASS_WIDTH", "MAX_PARTIALS", "SIM_PARTIALS",
           "result_dtype", "accumulate_dtype", "plan_reduce", "coalesce", "make_block_reduce", "make_reduce",
           "argmax_better"]

# Registered op name (OneFlow's; elementwise already owns "max"/"min") -> numpy's function.
REDUCTIONS = {"reduce_sum": "sum", "reduce_prod": "prod", "reduce_max": "max", "reduce_min": "min",
              "reduce_mean": "mean", "argmax": "argmax", "argmin": "argmin"}
ARG_REDUCTIONS = ("argmax", "argmin")   # take one axis (or None) and give int64 indices
REDUCE_DTYPES = SUPPORTED_DTYPES
TWO_PASS_WIDTH = 1 << 14   # a single row longer than this is reduced in two passes
MAX_PARTIALS = 1024        # at most this many blocks (partial results) in pass 1
# ... and this many on the simulator's compiled tier: there each block costs a dozen passes of its
# threads through the block tree's nodes, while 64 stretches still give every CPU core several
# (1M floats: 64 blocks 1.3 ms, 1024 blocks 1.8 ms of pass 1, one core).
SIM_PARTIALS = 64

COMBINE = {"sum": scalar_ops.add, "prod": scalar_ops.mul, "mean": scalar_ops.add,
           "max": scalar_ops.maximum, "min": scalar_ops.minimum}


def _identity(kind: str, dtype: np.dtype):
    """The value that changes nothing when combined: 0, 1, or the lowest / highest value."""
    if kind in ("sum", "mean"):
        return dtype.type(0)
    if kind == "prod":
        return dtype.type(1)
    if dtype.kind == "b":
        low, high = False, True
    else:
        low, high = (-np.inf, np.inf) if dtype.kind == "f" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
    return dtype.type(low if kind == "max" else high)


# --- device code ----------------------------------------------------------------


@functools.cache
def make_block_reduce(combine):
    """Device function ``block_reduce(cache, value, active)``: ``combine`` of the ``value`` of threads
    ``0 .. active - 1``, handed to every thread of the block (a shared-memory tree).

    The one block reduction of the library's row kernels (here, ``softmax.py``) and of
    Cocktailer's uTasks (``kernels/utask/``).  Every thread of the block calls it with the
    same ``active`` (``1 <= active <= blockDim.x``); threads from ``active`` on only join the
    barriers.  ``cache`` is the caller's shared array (at least ``active`` long), free again
    on return: a device function declaring a shared array and reached from one kernel along
    two paths would define it twice, which NVVM rejects (``kernels/utask/batched.py``).
    The library's kernels pass their whole (power-of-two) block, so the tree pairs thread
    ``t`` with ``t + block / 2``, then ``t + block / 4``, ... (CUB's order); a uTask passes
    the threads that hold a value, and a width that is not a power of two halves rounding up.
    """

    @jit(device=True)
    def block_reduce(cache, value, active):
        # Code plan: 1. each active thread stores its value; 2. the first half of the
        # live width combines pairs (t, t + half), the width halves (rounding up) until
        # 1, a barrier after each step; 3. everyone reads the result, then a barrier so
        # the cache may be reused.  Every thread reaches every barrier.
        t = cuda.threadIdx.x
        if t < active:
            cache[t] = value
        cuda.syncthreads()
        width = active
        while width > 1:   # block-uniform: every thread runs the same steps
            half = (width + 1) // 2
            if t < width - half:
                cache[t] = combine(cache[t], cache[t + half])
            cuda.syncthreads()
            width = half
        total = cache[0]
        cuda.syncthreads()
        return total

    return block_reduce


@functools.cache
def make_reduce(kind: str, acc_dtype: np.dtype, block: int):
    """``(reduce_rows, reduce_partials)`` for ``kind`` (sum, prod, max, min, mean) accumulating in
    ``acc_dtype``, for blocks of ``block`` threads."""
    combine, finish = COMBINE[kind], (scalar_ops.divide if kind == "mean" else scalar_ops.keep)
    block_reduce = make_block_reduce(combine)
    init, acc_type = kernel_constant(acc_dtype, _identity(kind, acc_dtype)), numba.from_dtype(acc_dtype)

    @jit
    def reduce_rows(out, out_strides, x, row_shape, row_strides, col_shape, col_strides, rows, width, count):
        """``out[row] = finish(combine of x[row, 0..width))``; reads each element once, writes once."""
        # Code plan:
        # 1. block b takes rows b, b + gridDim, ... (the same rows for all its threads);
        # 2. thread t folds elements t, t + block, ... of the row into acc;
        # 3. the block folds the accs in shared memory; thread 0 writes the result.
        cache = cuda.shared.array(block, acc_type)
        t = cuda.threadIdx.x
        row = cuda.blockIdx.x
        while row < rows:
            base = position(row, row_shape, row_strides)
            acc = acc_type(init)
            j = t
            while j < width:
                acc = combine(acc, x[base + position(j, col_shape, col_strides)])
                j += block
            total = block_reduce(cache, acc, block)
            if t == 0:
                out[position(row, row_shape, out_strides)] = finish(total, count)
            row += cuda.gridDim.x

    @jit
    def reduce_partials(partial, x, col_shape, col_strides, width):
        """Pass 1 of one long row: block b folds its own stretch of the row into ``partial[b]``."""
        # Code plan (CUB's "even share"): the row is cut into gridDim stretches of ``span``
        # elements, a whole number of blocks each; the threads of block b stride over stretch b
        # by the block.  Neighbouring threads read neighbouring elements (coalesced on a GPU),
        # and a block's reads stay in a few pages (the compiled tier runs a block's threads one
        # after another: a grid-stride loop there leaps gridDim * block elements per read).
        # A thread takes four elements a turn into four accumulators (CUB's items per thread):
        # four independent chains of combines, and a quarter of the loop's turns.
        cache = cuda.shared.array(block, acc_type)
        t = cuda.threadIdx.x
        span = (width + cuda.gridDim.x * block - 1) // (cuda.gridDim.x * block) * block
        start = cuda.blockIdx.x * span
        end = min(start + span, width)
        acc0 = acc_type(init)
        acc1 = acc_type(init)
        acc2 = acc_type(init)
        acc3 = acc_type(init)
        j = start + t
        while j + 3 * block < end:
            acc0 = combine(acc0, x[position(j, col_shape, col_strides)])
            acc1 = combine(acc1, x[position(j + block, col_shape, col_strides)])
            acc2 = combine(acc2, x[position(j + 2 * block, col_shape, col_strides)])
            acc3 = combine(acc3, x[position(j + 3 * block, col_shape, col_strides)])
            j += 4 * block
        while j < end:
            acc0 = combine(acc0, x[position(j, col_shape, col_strides)])
            j += block
        total = block_reduce(cache, combine(combine(acc0, acc1), combine(acc2, acc3)), block)
        if t == 0:
            partial[cuda.blockIdx.x] = total

    return reduce_rows, reduce_partials


# --- shapes, dtypes and the row description (host) -------------------------------


def result_dtype(op: str, dtype) -> np.dtype:
    """The dtype reduction ``op`` gives on ``dtype`` (numpy's, but int64 for the sum or product of uint8).

    >>> [str(result_dtype(op, "bool")) for op in ("reduce_sum", "reduce_max", "reduce_mean", "argmin")]
    ['int64', 'bool', 'float64', 'int64']
    """
    dtype = check_dtype(op, dtype, REDUCE_DTYPES)
    kind = REDUCTIONS[op]
    if op in ARG_REDUCTIONS:
        return np.dtype(np.int64)
    if dtype.kind == "f" or kind in ("max", "min"):
        return dtype
    return np.dtype(np.int64 if kind in ("sum", "prod") else np.float64)


def accumulate_dtype(op: str, dtype) -> np.dtype:
    """The dtype the kernels add up in: float32 for float16 sums, products and means, else the result dtype."""
    result = result_dtype(op, dtype)
    return np.dtype(np.float32) if result == np.float16 and REDUCTIONS[op] in ("sum", "prod", "mean") else result


@dataclasses.dataclass(frozen=True)
class ReducePlan:
    """What a reduction of ``x`` over ``axes`` produces: ``rows`` outputs of ``width`` elements."""

    axes: tuple
    out_shape: tuple
    out_dtype: np.dtype
    rows: int
    width: int
    acc_dtype: np.dtype = None   # what the kernels add up in (accumulate_dtype); argmax/argmin: unused


def plan_reduce(op: str, x, axis, keepdims: bool) -> ReducePlan:
    """Check ``op``'s arguments like numpy does and describe the reduction."""
    out_dtype = result_dtype(op, x.dtype)
    if op in ARG_REDUCTIONS and axis is not None:
        axes = (normalize_axis(axis, x.ndim, op),)
    else:
        axes = normalize_axes(axis, x.ndim, op)
    width = math.prod(x.shape[d] for d in axes)
    if width == 0 and REDUCTIONS[op] in ("max", "min", "argmax", "argmin"):
        raise ShapeError(f"{op}: reduction over the empty axes {axes} of a {tuple(x.shape)} tensor "
                         "has no identity (numpy raises ValueError too)")
    kept = tuple(n for d, n in enumerate(x.shape) if d not in axes)
    out_shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape)) if keepdims else kept
    return ReducePlan(axes, out_shape, out_dtype, math.prod(kept), width, accumulate_dtype(op, x.dtype))


def _check_out(op: str, out, shape, dtype) -> None:
    if tuple(out.shape) != tuple(shape):
        raise ShapeError(f"{op}: output has shape {tuple(out.shape)}, expected {tuple(shape)}")
    if np.dtype(out.dtype) != np.dtype(dtype):
        raise DTypeError(f"{op}: output dtype is {out.dtype}, expected {np.dtype(dtype)}")
    if math.prod(out.shape) and any(s == 0 and n > 1 for s, n in zip(out.strides, out.shape)):
        raise ShapeError(f"{op}: the output is a broadcast view (stride 0): threads would race")


def coalesce(shape, *strides) -> tuple:
    """``(shape, *strides)`` with size-1 dims dropped and neighbours every operand walks as one
    dim merged (fewer divisions in ``position``); at least one dim: ``(1,)`` with stride 0.

    >>> coalesce((2, 1, 3, 4), (12, 99, 4, 1), (0, 0, 4, 1))
    ((2, 12), (12, 1), (0, 1))
    """
    dims = []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        steps = [s[d] for s in strides]
        if dims and all(prev == step * n for prev, step in zip(dims[-1][1], steps)):
            dims[-1] = (dims[-1][0] * n, steps)
        else:
            dims.append((n, steps))
    if not dims:
        return ((1,),) + ((0,),) * len(strides)
    return (tuple(n for n, _ in dims),) + tuple(tuple(s[k] for _, s in dims) for k in range(len(strides)))


def _rows_and_cols(plan: ReducePlan, out, x, keepdims: bool):
    """(out storage, x storage, row_shape, out row strides, x row strides, col_shape, col strides)."""
    out_storage, out_strides = flat(out)
    x_storage, x_strides = flat(x)
    kept = [d for d in range(x.ndim) if d not in plan.axes]
    out_kept = [out_strides[d] for d in kept] if keepdims else list(out_strides[:len(kept)])
    row_shape, out_rows, x_rows = coalesce([x.shape[d] for d in kept], out_kept, [x_strides[d] for d in kept])
    col_shape, x_cols = coalesce([x.shape[d] for d in plan.axes], [x_strides[d] for d in plan.axes])
    return out_storage, x_storage, row_shape, out_rows, x_rows, col_shape, x_cols


# --- launching on a GPU or in the simulator ----------------------------------------


def _count(op, plan: ReducePlan):
    """A reduce kernel's last argument: what a mean divides by (in the dtype it adds up in); unused otherwise."""
    return plan.acc_dtype.type(plan.width) if REDUCTIONS[op] == "mean" else np.int64(plan.width)


def _reduce_two_pass(op, plan, out_storage, x_storage, col_shape, x_cols, stream):
    """One long row: pass 1 writes a partial result per block, pass 2 reduces them (one operation of the
    row's width: in the simulator both passes run on the tier that width gets)."""
    _, threads = rows_config(1, plan.width, dtypes=[x_storage.dtype])
    blocks = min(elementwise_config(plan.width, [x_storage.dtype])[0], MAX_PARTIALS)
    if is_simulator():   # a block is Python threads (threaded tier) or a round of node passes (compiled tier)
        blocks = min(blocks, SIM_PARTIALS if compiled_launch(plan.width, [x_storage.dtype]) else SIM_MAX_BLOCKS)
    _, threads2 = rows_config(1, blocks)
    with one_operation(plan.width):
        if op in ARG_REDUCTIONS:
            part_v = cuda.device_array(blocks, x_storage.dtype, stream=stream)
            part_i = cuda.device_array(blocks, np.int64, stream=stream)
            partials = make_arg_reduce(op, np.dtype(x_storage.dtype), threads)[1]
            launcher(partials, blocks, threads, stream)(part_v, part_i, x_storage, col_shape, x_cols, plan.width)
            merge = make_arg_reduce(op, np.dtype(x_storage.dtype), threads2)[2]
            launcher(merge, 1, threads2, stream)(out_storage, part_v, part_i, blocks)
            return
        acc = plan.acc_dtype
        partial = cuda.device_array(blocks, acc, stream=stream)
        launcher(make_reduce(REDUCTIONS[op], acc, threads)[1], blocks, threads, stream)(
            partial, x_storage, col_shape, x_cols, plan.width)
        launcher(make_reduce(REDUCTIONS[op], acc, threads2)[0], 1, threads2, stream)(
            out_storage, (0,), partial, (1,), (0,), (blocks,), (1,), 1, blocks, _count(op, plan))


def _reduce_cuda(op):
    def run(out, x, *, axis=None, keepdims=False, stream=0):
        require_device_arrays(op, out, x)
        plan = plan_reduce(op, x, axis, keepdims)
        _check_out(op, out, plan.out_shape, plan.out_dtype)
        if plan.rows == 0:
            return
        out_storage, x_storage, row_shape, out_rows, x_rows, col_shape, x_cols = _rows_and_cols(plan, out, x, keepdims)
        if plan.rows == 1 and plan.width > TWO_PASS_WIDTH:
            _reduce_two_pass(op, plan, out_storage, x_storage, col_shape, x_cols, stream)
            return
        blocks, threads = rows_config(plan.rows, plan.width, dtypes=[x.dtype])
        args = (out_storage, out_rows, x_storage, row_shape, x_rows, col_shape, x_cols, plan.rows, plan.width)
        if op in ARG_REDUCTIONS:
            launcher(make_arg_reduce(op, np.dtype(x.dtype), threads)[0], blocks, threads, stream)(*args)
        else:
            kernel = make_reduce(REDUCTIONS[op], plan.acc_dtype, threads)[0]
            launcher(kernel, blocks, threads, stream)(*args, _count(op, plan))
    return run


def _reduce_cpu(op):
    def run(out, x, *, axis=None, keepdims=False, stream=0):
        plan = plan_reduce(op, x, axis, keepdims)
        _check_out(op, out, plan.out_shape, plan.out_dtype)
        kind = REDUCTIONS[op]
        with np.errstate(all="ignore"):  # IEEE inf/nan without warnings, as on a GPU
            if op in ARG_REDUCTIONS:
                getattr(np, kind)(x, axis=axis, out=out, keepdims=keepdims)
            elif kind == "mean" and plan.width == 0:
                out[...] = np.nan  # numpy's value, without its "Mean of empty slice" warning
            elif kind in ("max", "min"):
                getattr(np, kind)(x, axis=plan.axes, out=out, keepdims=keepdims)
            elif plan.acc_dtype == plan.out_dtype:
                getattr(np, kind)(x, axis=plan.axes, dtype=plan.acc_dtype, out=out, keepdims=keepdims)
            else:  # float16: add up in float32, round once
                np.copyto(out, getattr(np, kind)(x, axis=plan.axes, dtype=plan.acc_dtype, keepdims=keepdims))
    return run


for _op in REDUCTIONS:
    register(_op, "cuda", _reduce_cuda(_op))
    register(_op, "cpu", _reduce_cpu(_op))


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check: every kind, every dtype."""
    from numba import types

    from pyflow.kernels.compile_check import array, tuple_of

    i64, t1, t2 = types.int64, tuple_of(1), tuple_of(2)
    block = 256
    cases = [("divide[float32]", scalar_ops.divide.py_func, (types.float32, types.float32), True),
             ("keep[int64]", scalar_ops.keep.py_func, (i64, i64), True)]
    for kind in ("sum", "prod", "max", "min", "mean"):
        op = f"reduce_{kind}"
        for dtype in REDUCE_DTYPES:
            acc, res = accumulate_dtype(op, dtype), result_dtype(op, dtype)
            rows, partials = make_reduce(kind, acc, block)
            a, x, out, scalar = array(acc.name), array(dtype.name), array(res.name), numba.from_dtype(acc)
            count = scalar if kind == "mean" else i64
            if dtype == acc:
                fold = make_block_reduce(COMBINE[kind])
                cases.append((f"{op}[{dtype}] block_reduce", fold.py_func, (a, scalar, i64), True))
            cases.append((f"{op}[{dtype}] rows", rows.py_func, (out, t2, x, t2, t2, t2, t2, i64, i64, count), False))
            cases.append((f"{op}[{dtype}] partials", partials.py_func, (a, x, t1, t1, i64), False))
            if dtype.name in ("float16", "bool", "float64"):
                cases.append((f"{op}[{dtype}] pass 2", rows.py_func,
                              (out, t1, a, t1, t1, t1, t1, i64, i64, count), False))
    return cases
