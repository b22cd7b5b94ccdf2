"""softmax and log_softmax along one axis, numerically stable (one block per row).

    softmax(x)_j     = exp(x_j - m) / sum_k exp(x_k - m),      m = max_k x_k
    log_softmax(x)_j = x_j - m - log(sum_k exp(x_k - m))

Subtracting the row maximum ``m`` keeps ``exp`` from overflowing.  The rows are
described as in ``kernels/reduce.py`` (kept axes number the rows, the softmax axis
is the row), and a block folds each row with the same shared-memory tree
(``reduce.make_block_reduce``).  ``make_row_softmax`` is the device function of one
row, which Cocktailer's softmax uTasks (``kernels/utask/``) call too.  float32 and
float64 only; the CPU twin is the numpy formula.
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np

from pyflow.errors import DTypeError
from pyflow.kernels import scalar_ops
from pyflow.kernels.backend import cuda
from pyflow.kernels.elementwise import position
from pyflow.kernels.jit import jit
from pyflow.kernels.launch import launcher, require_device_arrays, rows_config
from pyflow.kernels.layout import flat, normalize_axis
from pyflow.kernels.reduce import _check_out, coalesce, make_block_reduce
from pyflow.kernels.registry import register

__all__ = ["SOFTMAXES", "SOFTMAX_DTYPES", "make_row_softmax", "make_softmax"]

SOFTMAXES = ("softmax", "log_softmax")
SOFTMAX_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))   # of kernels/dtypes.py: no float16 yet


@functools.cache
def _make_load(scale):
    """Device function reading one element: ``v`` itself, or ``v * scale`` (a constant of the code)."""
    if scale is None:
        @jit(device=True)
        def load(v):
            return v
    else:
        SCALE = scale

        @jit(device=True)
        def load(v):
            return v * SCALE
    return load


@functools.cache
def make_row_softmax(log: bool, dtype: np.dtype, scale=None):
    """Device function ``row_softmax(cache, out, out_base, out_step, x, base, step, width, lanes, active)``:
    the softmax (``log=False``) or log_softmax of one row, by the whole block.

    The one softmax of the library's kernel (below) and of Cocktailer's row uTasks
    (``kernels/utask/reduce.py``; ``kernels/utask/scaled_softmax.py`` passes ``scale`` and gets
    ``softmax(scale * x)``, its maximum taken over the scaled values).  The row is
    ``x[base + j * step]`` for ``j < width``, written to ``out[out_base + j * out_step]``;
    ``out`` may be ``x`` (each element is read and written by one thread only; softmax parks
    the element's exp in ``out`` until the sum is known).  Every thread of the block calls
    it; threads ``t < active`` (``1 <= active <= lanes``) take elements ``t, t + lanes, ...``
    and threads from ``active`` on only join the barriers.  ``cache`` is the caller's shared array of
    ``dtype``, at least ``active`` long (``reduce.make_block_reduce`` says why the caller
    declares it), free again on return.
    """
    block_max, block_sum = make_block_reduce(scalar_ops.maximum), make_block_reduce(scalar_ops.add)
    load = _make_load(scale)
    value_type, lowest, zero = numba.from_dtype(dtype), dtype.type(-np.inf), dtype.type(0)

    @jit(device=True)
    def row_softmax(cache, out, out_base, out_step, x, base, step, width, lanes, active):
        # Code plan:
        # 1. m = block max of the row (subtracting it keeps exp from overflowing);
        # 2. s = block sum of exp(x - m); softmax keeps each exp, rounded to the dtype, in out
        #    (an exp is most of an element's cost: each element pays one);
        # 3. each thread finishes its elements: softmax divides the kept exp by s, log_softmax
        #    writes x - m - log(s).  A float32 scaled row computes exp(scale * x - m) in float64.
        t = cuda.threadIdx.x
        m = lowest
        if t < active:
            for j in range(t, width, lanes):
                m = scalar_ops.maximum(m, load(x[base + j * step]))
        m = block_max(cache, m, active)
        s = zero
        if t < active:
            for j in range(t, width, lanes):
                e = math.exp(load(x[base + j * step]) - m)
                s += e
                if not log:
                    out[out_base + j * out_step] = value_type(e)
        s = block_sum(cache, s, active)
        if t < active:
            log_s = math.log(s)
            for j in range(t, width, lanes):
                k = out_base + j * out_step
                out[k] = (load(x[base + j * step]) - m - log_s) if log else (out[k] / s)

    return row_softmax


@functools.cache
def make_softmax(log: bool, dtype: np.dtype, block: int):
    """The softmax (``log=False``) or log_softmax kernel for ``dtype``, ``block`` threads per row."""
    row_softmax = make_row_softmax(log, dtype)
    value_type = numba.from_dtype(dtype)

    @jit
    def softmax_rows(out, out_strides, out_step, x, row_shape, row_strides, step, rows, width):
        """Row by row: ``exp(x - max) / sum(exp(x - max))`` or ``x - max - log(sum(...))``."""
        # Code plan: one block per row (blocks grid-stride over the rows), all its
        # threads folding the row with ``row_softmax``.
        cache = cuda.shared.array(block, value_type)
        row = cuda.blockIdx.x
        while row < rows:
            base = position(row, row_shape, row_strides)
            out_base = position(row, row_shape, out_strides)
            row_softmax(cache, out, out_base, out_step, x, base, step, width, block, block)
            row += cuda.gridDim.x

    return softmax_rows


# --- host ----------------------------------------------------------------------------


def _check_softmax(op, out, x, axis) -> int:
    if np.dtype(x.dtype) not in SOFTMAX_DTYPES:
        raise DTypeError(f"{op}: needs float32 or float64 input, got {x.dtype}")
    axis = normalize_axis(axis, x.ndim, op)
    _check_out(op, out, x.shape, x.dtype)
    return axis


def _softmax_cuda(op):
    def run(out, x, *, axis=-1, stream=0):
        require_device_arrays(op, out, x)
        axis = _check_softmax(op, out, x, axis)
        if x.size == 0:
            return
        (out_storage, out_strides), (x_storage, x_strides) = flat(out), flat(x)
        kept = [d for d in range(x.ndim) if d != axis]
        row_shape, out_rows, x_rows = coalesce([x.shape[d] for d in kept], [out_strides[d] for d in kept],
                                               [x_strides[d] for d in kept])
        rows, width = x.size // x.shape[axis], x.shape[axis]
        blocks, threads = rows_config(rows, width)
        kernel = make_softmax(op == "log_softmax", np.dtype(x.dtype), threads)
        launcher(kernel, blocks, threads, stream)(out_storage, out_rows, out_strides[axis], x_storage, row_shape,
                                                  x_rows, x_strides[axis], rows, width)
    return run


def _softmax_cpu(op):
    def run(out, x, *, axis=-1, stream=0):
        axis = _check_softmax(op, out, x, axis)
        if x.size == 0:
            return
        with np.errstate(all="ignore"):
            shifted = x - np.max(x, axis=axis, keepdims=True)
            e = np.exp(shifted)
            total = np.sum(e, axis=axis, keepdims=True)
            if op == "log_softmax":
                np.subtract(shifted, np.log(total), out=out)
            else:
                np.divide(e, total, out=out)
    return run


for _op in SOFTMAXES:
    register(_op, "cuda", _softmax_cuda(_op))
    register(_op, "cpu", _softmax_cpu(_op))


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array, tuple_of

    i64, t2, block = types.int64, tuple_of(2), 256
    cases = []
    for op in SOFTMAXES:
        for dtype in ("float32", "float64"):
            kernel, x = make_softmax(op == "log_softmax", np.dtype(dtype), block), array(dtype)
            cases.append((f"{op}[{dtype}]", kernel.py_func, (x, t2, i64, x, t2, t2, i64, i64, i64), False))
    return cases
