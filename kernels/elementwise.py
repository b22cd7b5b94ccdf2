"""Elementwise kernels: map (1 input), zip (2), where (3), fill, cast, copy.

MiniTorch-style factories build every kernel from a scalar device function
(``kernels/scalar_ops.py``): ``make_map(scalar_ops.relu)`` is the relu kernel,
``make_zip(scalar_ops.add)`` the add kernel.  Each factory has two versions:
* **strided** - operands of any layout: transposed, sliced, broadcast with
  stride 0 (see ``kernels/layout.py``);
* **contiguous** - a fast path when every operand is C-contiguous with the
  output's shape.

Every op also has a CPU twin, a numpy ufunc writing into ``out``.  Both sides
give IEEE results (inf, nan) silently, as a GPU does.  The host
functions check shapes and dtypes before any launch.  An empty output launches
nothing.  Result dtypes are numpy's own (``np.add.resolve_dtypes``), so
``int32 / int32`` gives float64 here exactly as in numpy.

Kernel rules: one read per input element and one write per output element;
threads stride over the output in a grid-stride loop.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels import scalar_ops
from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.launch import elementwise_config, launcher, require_device_arrays
from pyflow.kernels.layout import (as_kernel_shape, broadcast_shapes, contiguous_strides, flat,
                                   kernel_operand)
from pyflow.kernels.registry import register

__all__ = ["UNARY", "BINARY", "COMPARE", "make_map", "make_zip", "position",
           "unary_result_dtype", "binary_result_dtype", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = tuple(np.dtype(t) for t in ("float32", "float64", "int32", "int64", "bool"))
_NUMERIC = SUPPORTED_DTYPES[:4]


def _relu_cpu(x, out):
    np.maximum(x, np.zeros((), x.dtype), out=out)


def _sigmoid_cpu(x, out):
    # exp(-log(1 + exp(-x))): stable for every x, no overflow warnings
    np.exp(-np.logaddexp(0, -x), out=out)


# op name -> (scalar device function, numpy twin writing into out, numpy ufunc giving the dtype)
UNARY = {
    "neg": (scalar_ops.neg, lambda x, out: np.negative(x, out=out), np.negative),
    "relu": (scalar_ops.relu, _relu_cpu, np.positive),
    "sigmoid": (scalar_ops.sigmoid, _sigmoid_cpu, np.exp),
    "tanh": (scalar_ops.tanh, lambda x, out: np.tanh(x, out=out), np.tanh),
    "exp": (scalar_ops.exp, lambda x, out: np.exp(x, out=out), np.exp),
    "log": (scalar_ops.log, lambda x, out: np.log(x, out=out), np.log),
    "sqrt": (scalar_ops.sqrt, lambda x, out: np.sqrt(x, out=out), np.sqrt),
    "abs": (scalar_ops.absolute, lambda x, out: np.absolute(x, out=out), np.absolute),
}
BINARY = {
    "add": (scalar_ops.add, np.add), "sub": (scalar_ops.sub, np.subtract),
    "mul": (scalar_ops.mul, np.multiply), "div": (scalar_ops.div, np.true_divide),
    "max": (scalar_ops.maximum, np.maximum), "min": (scalar_ops.minimum, np.minimum),
    "pow": (scalar_ops.power, np.power),
}
COMPARE = {
    "eq": (scalar_ops.eq, np.equal), "ne": (scalar_ops.ne, np.not_equal),
    "lt": (scalar_ops.lt, np.less), "le": (scalar_ops.le, np.less_equal),
    "gt": (scalar_ops.gt, np.greater), "ge": (scalar_ops.ge, np.greater_equal),
}


# --- device code ----------------------------------------------------------------


@jit(device=True)
def position(i, shape, strides):
    """Storage position of the ``i``-th element (row-major order) of a strided array."""
    p = 0
    for d in range(len(shape) - 1, -1, -1):
        p += (i % shape[d]) * strides[d]
        i //= shape[d]
    return p


@functools.cache
def make_map(fn):
    """The kernel ``out[idx] = fn(x[idx])`` over every index of ``shape``."""

    @jit
    def map_strided(out, out_strides, shape, x, x_strides, n):
        # Code plan: grid-stride over linear indices; turn each into a storage
        # position per operand (its own strides); read once, write once.
        i = cuda.grid(1)
        while i < n:
            out[position(i, shape, out_strides)] = fn(x[position(i, shape, x_strides)])
            i += cuda.gridsize(1)

    @jit
    def map_contiguous(out, x, n):
        i = cuda.grid(1)
        while i < n:
            out[i] = fn(x[i])
            i += cuda.gridsize(1)

    return map_strided, map_contiguous


@functools.cache
def make_zip(fn):
    """The kernel ``out[idx] = fn(a[idx], b[idx])``, inputs broadcast to ``shape``."""

    @jit
    def zip_strided(out, out_strides, shape, a, a_strides, b, b_strides, n):
        i = cuda.grid(1)
        while i < n:
            va = a[position(i, shape, a_strides)]
            vb = b[position(i, shape, b_strides)]
            out[position(i, shape, out_strides)] = fn(va, vb)
            i += cuda.gridsize(1)

    @jit
    def zip_contiguous(out, a, b, n):
        i = cuda.grid(1)
        while i < n:
            out[i] = fn(a[i], b[i])
            i += cuda.gridsize(1)

    return zip_strided, zip_contiguous


@jit
def where_strided(out, out_strides, shape, cond, c_strides, a, a_strides, b, b_strides, n):
    """``out[idx] = a[idx] if cond[idx] else b[idx]`` (all broadcast to ``shape``)."""
    i = cuda.grid(1)
    while i < n:
        if cond[position(i, shape, c_strides)]:
            value = a[position(i, shape, a_strides)]
        else:
            value = b[position(i, shape, b_strides)]
        out[position(i, shape, out_strides)] = value
        i += cuda.gridsize(1)


@jit
def fill_strided(out, out_strides, shape, value, n):
    """``out[idx] = value`` for every index."""
    i = cuda.grid(1)
    while i < n:
        out[position(i, shape, out_strides)] = value
        i += cuda.gridsize(1)


# --- dtype and shape rules (numpy's) ----------------------------------------------


@functools.lru_cache(maxsize=None)
def unary_result_dtype(op: str, dtype) -> np.dtype:
    """The dtype numpy gives ``op`` on ``dtype`` (relu keeps the dtype)."""
    dtype = np.dtype(dtype)
    if dtype not in _NUMERIC:
        raise DTypeError(f"{op}: unsupported dtype {dtype}; expected one of "
                         f"{', '.join(map(str, _NUMERIC))}")
    return UNARY[op][2].resolve_dtypes((dtype, None))[1]


@functools.lru_cache(maxsize=None)
def binary_result_dtype(op: str, a, b) -> np.dtype:
    """The dtype numpy gives ``op`` on ``a`` and ``b`` (comparisons: bool)."""
    a, b = np.dtype(a), np.dtype(b)
    numeric_only = op in BINARY
    for d in (a, b):
        if d not in (_NUMERIC if numeric_only else SUPPORTED_DTYPES):
            raise DTypeError(f"{op}: unsupported dtype {d} (inputs {a}, {b})")
    ufunc = (BINARY.get(op) or COMPARE[op])[1]
    return ufunc.resolve_dtypes((a, b, None))[2]


def _check_out(op: str, out, shape, dtype) -> None:
    if tuple(out.shape) != tuple(shape):
        raise ShapeError(f"{op}: output has shape {tuple(out.shape)}, expected {tuple(shape)}")
    if dtype is not None and np.dtype(out.dtype) != np.dtype(dtype):
        raise DTypeError(f"{op}: output dtype is {out.dtype}, expected {np.dtype(dtype)}")
    if math.prod(out.shape) and any(s == 0 and n > 1 for s, n in zip(out.strides, out.shape)):
        raise ShapeError(f"{op}: the output is a broadcast view (stride 0): threads would race")


def _plan(op, out, *inputs):
    """Shared checks; returns the kernel shape and element count (0: nothing to do)."""
    shape = broadcast_shapes(*[x.shape for x in inputs], op=op)
    _check_out(op, out, shape, None)
    return as_kernel_shape(shape), math.prod(shape)


# --- launching on a GPU or in the simulator ----------------------------------------


def _launch(op, strided, contiguous, out, inputs, extra=(), stream=0):
    require_device_arrays(op, out, *inputs)
    shape, n = _plan(op, out, *inputs)
    if n == 0:
        return
    grid, block = elementwise_config(n)
    out_storage, out_strides = flat(out)
    operands = [kernel_operand(x, shape) for x in inputs]
    dense = contiguous_strides(shape)
    if contiguous is not None and out_strides == dense and all(s == dense for _, s in operands):
        launcher(contiguous, grid, block, stream)(out_storage, *[st for st, _ in operands], n)
        return
    args = [out_storage, out_strides, shape]
    for storage, strides in operands:
        args += [storage, strides]
    launcher(strided, grid, block, stream)(*args, *extra, n)


def _unary_cuda(op):
    strided, contiguous = make_map(UNARY[op][0])

    def run(out, x, *, stream=0):
        _check_out(op, out, x.shape, unary_result_dtype(op, x.dtype))
        _launch(op, strided, contiguous, out, [x], stream=stream)
    return run


def _unary_cpu(op):
    def run(out, x, *, stream=0):
        _check_out(op, out, x.shape, unary_result_dtype(op, x.dtype))
        with np.errstate(all="ignore"):  # IEEE inf/nan without warnings, as on a GPU
            UNARY[op][1](x, out)
    return run


def _binary_cuda(op, table):
    strided, contiguous = make_zip(table[op][0])

    def run(out, a, b, *, stream=0):
        _check_out(op, out, broadcast_shapes(a.shape, b.shape, op=op), binary_result_dtype(op, a.dtype, b.dtype))
        _launch(op, strided, contiguous, out, [a, b], stream=stream)
    return run


def _binary_cpu(op, table):
    def run(out, a, b, *, stream=0):
        _check_out(op, out, broadcast_shapes(a.shape, b.shape, op=op), binary_result_dtype(op, a.dtype, b.dtype))
        with np.errstate(all="ignore"):
            table[op][1](a, b, out=out)
    return run


_copy_strided, _copy_contiguous = make_map(scalar_ops.identity)


def _check_where(out, cond, a, b):
    if np.dtype(cond.dtype) != np.bool_:
        raise DTypeError(f"where: condition must be bool, got {cond.dtype}")
    expected = np.result_type(a.dtype, b.dtype)
    _check_out("where", out, broadcast_shapes(cond.shape, a.shape, b.shape, op="where"), expected)


def _check_cast(op, out, x):
    for d in (out.dtype, x.dtype):
        if np.dtype(d) not in SUPPORTED_DTYPES:
            raise DTypeError(f"{op}: unsupported dtype {d}")
    if op == "copy" and np.dtype(out.dtype) != np.dtype(x.dtype):
        raise DTypeError(f"copy: dtypes differ ({x.dtype} -> {out.dtype}); use cast")
    _check_out(op, out, broadcast_shapes(x.shape, out.shape, op=op), None)


def _where_cuda(out, cond, a, b, *, stream=0):
    _check_where(out, cond, a, b)
    _launch("where", where_strided, None, out, [cond, a, b], stream=stream)


def _where_cpu(out, cond, a, b, *, stream=0):
    _check_where(out, cond, a, b)
    np.copyto(out, np.where(cond, a, b))


def _fill_cuda(out, value, *, stream=0):
    require_device_arrays("fill", out)
    _check_out("fill", out, out.shape, None)
    shape, n = as_kernel_shape(out.shape), math.prod(out.shape)
    if n:
        storage, strides = flat(out)
        grid, block = elementwise_config(n)
        launcher(fill_strided, grid, block, stream)(storage, strides, shape, out.dtype.type(value), n)


def _fill_cpu(out, value, *, stream=0):
    _check_out("fill", out, out.shape, None)
    out[...] = value


def _cast_cuda(op):
    def run(out, x, *, stream=0):
        _check_cast(op, out, x)
        _launch(op, _copy_strided, _copy_contiguous, out, [x], stream=stream)
    return run


def _cast_cpu(op):
    def run(out, x, *, stream=0):
        _check_cast(op, out, x)
        np.copyto(out, x, casting="unsafe")
    return run


for _op in UNARY:
    register(_op, "cuda", _unary_cuda(_op))
    register(_op, "cpu", _unary_cpu(_op))
for _table in (BINARY, COMPARE):
    for _op in _table:
        register(_op, "cuda", _binary_cuda(_op, _table))
        register(_op, "cpu", _binary_cpu(_op, _table))
for _op in ("cast", "copy"):
    register(_op, "cuda", _cast_cuda(_op))
    register(_op, "cpu", _cast_cpu(_op))
register("where", "cuda", _where_cuda)
register("where", "cpu", _where_cpu)
register("fill", "cuda", _fill_cuda)
register("fill", "cpu", _fill_cpu)


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array, tuple_of

    i64, t2 = types.int64, tuple_of(2)
    cases = [("position", position.py_func, (i64, t2, t2), True)]
    for op, (fn, _, _) in sorted(UNARY.items()):
        for dtype, out_dtype in (("float32", "float32"), ("int32", unary_result_dtype(op, "int32").name)):
            strided, contiguous = make_map(fn)
            x, out = array(dtype), array(out_dtype)
            cases.append((f"{op}[{dtype}] strided", strided.py_func, (out, t2, t2, x, t2, i64), False))
            cases.append((f"{op}[{dtype}] contiguous", contiguous.py_func, (out, x, i64), False))
    for op in sorted(BINARY) + sorted(COMPARE):
        fn = (BINARY.get(op) or COMPARE[op])[0]
        for a, b in (("float32", "float32"), ("int64", "float64")):
            out = array(binary_result_dtype(op, a, b).name)
            strided, contiguous = make_zip(fn)
            cases.append((f"{op}[{a},{b}] strided", strided.py_func,
                          (out, t2, t2, array(a), t2, array(b), t2, i64), False))
            cases.append((f"{op}[{a},{b}] contiguous", contiguous.py_func, (out, array(a), array(b), i64), False))
    f32, b1 = array("float32"), array("bool")
    cases.append(("where", where_strided.py_func, (f32, t2, t2, b1, t2, f32, t2, f32, t2, i64), False))
    cases.append(("fill", fill_strided.py_func, (f32, t2, t2, types.float32, i64), False))
    strided, contiguous = make_map(scalar_ops.identity)
    cases.append(("cast[int32->float32]", strided.py_func, (f32, t2, t2, array("int32"), t2, i64), False))
    return cases
