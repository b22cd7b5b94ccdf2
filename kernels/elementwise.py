"""Elementwise kernels: map (1 input), zip (2), where (3), fill, cast, copy.

MiniTorch-style factories build every kernel from a scalar device function
(``kernels/scalar_ops.py``): ``make_map(scalar_ops.relu)`` is the relu kernel,
``make_zip(scalar_ops.add)`` the add kernel.  Each factory has two versions:
* **strided** - operands of any layout: transposed, sliced, broadcast with
  stride 0 (see ``kernels/layout.py``); dims that every operand steps over
  as one run are merged first (``layout.coalesce_dims``), so a ``where`` of
  dense operands finds its elements with no division;
* **contiguous** - a fast path when every operand is C-contiguous with the
  output's shape (zip: or a single element, as a Python scalar becomes: its
  step is 0, so ``x * 1.5`` needs no index arithmetic per element).
``launch_map(op, fn, out, x, stream=)`` launches ``make_map(fn)``: every unary op's
cuda kernel is that call, and so can be an op defined outside the library.

The ops themselves are data in ``kernels/ufuncs.py``: for each op the dtypes it
accepts, its result dtype (numpy's, with ``int32 / int32`` giving float64 as in
numpy), its scalar device function (per kind of dtype) and its CPU twin, a numpy
function writing into ``out``.  Both sides give IEEE results (inf, nan) silently,
as a GPU does.  The host functions check shapes and dtypes before any launch.
An empty output launches nothing.

dtypes (``kernels/dtypes.py``): copy, cast, fill, where and the comparisons take
all nine; the rest as ``kernels/ufuncs.py`` says.  float16 compiles on a GPU for
every op: math functions without a float16 version (tanh, fmod) compute in float32.
Casting to bool is ``x != 0`` (NaN is True), as numpy's ``astype(bool)``; a float
cast to an integer type it does not fit is undefined, as in C and numpy.

Kernel rules: one read per input element and one write per output element;
threads stride over the output in a grid-stride loop.
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels import scalar_ops
from pyflow.kernels.backend import cuda
from pyflow.kernels.dtypes import BOOL, SUPPORTED_DTYPES, check_dtype
from pyflow.kernels.jit import jit
from pyflow.kernels.launch import elementwise_config, launcher, require_device_arrays
from pyflow.kernels.layout import (as_kernel_shape, broadcast_shapes, coalesce_dims, contiguous_strides, flat,
                                   kernel_operand)
from pyflow.kernels.registry import register
from pyflow.kernels.ufuncs import (BINARY, COMPARE, UNARY, binary_result_dtype, compute_dtype, device_function,
                                   unary_result_dtype)

__all__ = ["UNARY", "BINARY", "COMPARE", "make_map", "make_zip", "launch_map", "position",
           "unary_result_dtype", "binary_result_dtype", "SUPPORTED_DTYPES"]


# --- device code ----------------------------------------------------------------


@jit(device=True)
def position(i, shape, strides):
    """Storage position of the ``i``-th element (row-major order) of a strided array.

    ``0 <= i < prod(shape)``, so what is left of ``i`` at the first dim is its index
    there: no division for it (a 1-D operand costs none at all).
    """
    p = 0
    for d in range(len(shape) - 1, 0, -1):
        p += (i % shape[d]) * strides[d]
        i //= shape[d]
    return p + i * strides[0]


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
def make_zip(fn, compute=None):
    """The kernel ``out[idx] = fn(a[idx], b[idx])``, inputs broadcast to ``shape``.

    ``compute`` (a numpy dtype) is the dtype both inputs are converted to first, as
    numpy's loop does (``uint8 + int8`` adds int16s); ``None``: the common one.
    """
    to = numba.from_dtype(np.dtype(compute)) if compute is not None else scalar_ops.identity

    @jit
    def zip_strided(out, out_strides, shape, a, a_strides, b, b_strides, n):
        i = cuda.grid(1)
        while i < n:
            va = to(a[position(i, shape, a_strides)])
            vb = to(b[position(i, shape, b_strides)])
            out[position(i, shape, out_strides)] = fn(va, vb)
            i += cuda.gridsize(1)

    @jit
    def zip_contiguous(out, a, b, steps, n):
        # a step is 1 (an operand laid out as the output) or 0 (one element, read by every i); ``steps`` is
        # (a's, b's): a tuple, so that the simulator's compiled tier takes (1, 1) as a constant and vectorizes
        i = cuda.grid(1)
        while i < n:
            out[i] = fn(to(a[i * steps[0]]), to(b[i * steps[1]]))
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
    grid, block = elementwise_config(n, [out.dtype] + [x.dtype for x in inputs])
    out_storage, out_strides = flat(out)
    operands = [kernel_operand(x, shape) for x in inputs]
    dense, single = contiguous_strides(shape), (0,) * len(shape)
    steps = [1 if s == dense else 0 if s == single else None for _, s in operands]   # zip's steps
    if contiguous is not None and out_strides == dense and None not in steps and (len(steps) == 2 or steps == [1]):
        args = [operands[0][0]] if len(steps) == 1 else [operands[0][0], operands[1][0], tuple(steps)]
        launcher(contiguous, grid, block, stream)(out_storage, *args, n)
        return
    shape, (out_strides, *strides) = coalesce_dims(shape, [out_strides] + [s for _, s in operands])
    args = [out_storage, out_strides, shape]
    for (storage, _), operand_strides in zip(operands, strides):
        args += [storage, operand_strides]
    launcher(strided, grid, block, stream)(*args, *extra, n)


def launch_map(op: str, fn, out, x, *, stream=0) -> None:
    """Launch ``make_map(fn)`` on ``stream``: ``out[idx] = fn(x[idx])`` for device arrays ``out`` and ``x``
    of one shape (any strides; ``op`` names the op in errors).  The dtypes are the caller's to check.

    Every unary op's cuda kernel is this call with its scalar device function; so is the kernel of an op
    written outside the library (``tutorials/09_adding_an_op.py``).
    """
    _launch(op, *make_map(fn), out, [x], stream=stream)


def _unary_cuda(op):
    def run(out, x, *, stream=0):
        _check_out(op, out, x.shape, unary_result_dtype(op, x.dtype))
        launch_map(op, device_function(op, x.dtype), out, x, stream=stream)
    return run


def _unary_cpu(op):
    def run(out, x, *, stream=0):
        _check_out(op, out, x.shape, unary_result_dtype(op, x.dtype))
        with np.errstate(all="ignore"):  # IEEE inf/nan without warnings, as on a GPU
            UNARY[op].twin(x, out=out)
    return run


def _binary_cuda(op):
    def run(out, a, b, *, stream=0):
        dtype = binary_result_dtype(op, a.dtype, b.dtype)
        _check_out(op, out, broadcast_shapes(a.shape, b.shape, op=op), dtype)
        compute = compute_dtype(op, a.dtype, b.dtype)
        strided, contiguous = make_zip(device_function(op, compute), _conversion(compute))
        _launch(op, strided, contiguous, out, [a, b], stream=stream)
    return run


def _conversion(compute):
    """What make_zip converts the inputs to: nothing for a bool loop (the logical ops test
    ``x != 0`` themselves, as numpy's conversion to bool does)."""
    return None if compute == BOOL else compute


def _binary_cpu(op, table):
    def run(out, a, b, *, stream=0):
        _check_out(op, out, broadcast_shapes(a.shape, b.shape, op=op), binary_result_dtype(op, a.dtype, b.dtype))
        with np.errstate(all="ignore"):  # integer division by zero: 0, as on a GPU
            table[op].twin(a, b, out=out)
    return run


def _converter(out_dtype, in_dtype):
    """The (strided, contiguous) copy kernels: ``x != 0`` into bool (NaN is True); float16 into an integer
    through float32 (truncation, see ``scalar_ops.through_float32``); else a plain store."""
    out_dtype, in_dtype = np.dtype(out_dtype), np.dtype(in_dtype)
    if out_dtype == BOOL and in_dtype != BOOL:
        return make_map(scalar_ops.nonzero)
    if in_dtype == np.float16 and out_dtype.kind in "iu":
        return make_map(scalar_ops.through_float32)
    return make_map(scalar_ops.identity)


def _check_where(out, cond, a, b):
    if np.dtype(cond.dtype) != np.bool_:
        raise DTypeError(f"where: condition must be bool, got {cond.dtype}")
    for d in (a.dtype, b.dtype):
        check_dtype("where", d)
    expected = np.result_type(a.dtype, b.dtype)
    _check_out("where", out, broadcast_shapes(cond.shape, a.shape, b.shape, op="where"), expected)


def _check_cast(op, out, x):
    for d in (out.dtype, x.dtype):
        check_dtype(op, d)
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
    check_dtype("fill", out.dtype)
    _check_out("fill", out, out.shape, None)
    shape, n = as_kernel_shape(out.shape), math.prod(out.shape)
    if n:
        storage, strides = flat(out)
        shape, (strides,) = coalesce_dims(shape, [strides])
        grid, block = elementwise_config(n, [out.dtype])
        launcher(fill_strided, grid, block, stream)(storage, strides, shape, out.dtype.type(value), n)


def _fill_cpu(out, value, *, stream=0):
    check_dtype("fill", out.dtype)
    _check_out("fill", out, out.shape, None)
    out[...] = value


def _cast_cuda(op):
    def run(out, x, *, stream=0):
        _check_cast(op, out, x)
        _launch(op, *_converter(out.dtype, x.dtype), out, [x], stream=stream)
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
        register(_op, "cuda", _binary_cuda(_op))
        register(_op, "cpu", _binary_cpu(_op, _table))
for _op in ("cast", "copy"):
    register(_op, "cuda", _cast_cuda(_op))
    register(_op, "cpu", _cast_cpu(_op))
register("where", "cuda", _where_cuda)
register("where", "cpu", _where_cpu)
register("fill", "cuda", _fill_cuda)
register("fill", "cpu", _fill_cpu)


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check.

    Every op's strided kernel for every dtype it accepts (inputs of one dtype, as
    the framework casts them; plus one mixed pair per binary op), its contiguous
    kernel for one dtype; where, fill and cast for every dtype.
    """
    from numba import types

    from pyflow.kernels.compile_check import array, tuple_of

    i64, t2 = types.int64, tuple_of(2)
    cases = [("position", position.py_func, (i64, t2, t2), True)]
    for op, u in sorted(UNARY.items()):
        for dtype in u.accepts:
            x, out = array(dtype.name), array(unary_result_dtype(op, dtype).name)
            strided, contiguous = make_map(device_function(op, dtype))
            cases.append((f"{op}[{dtype}] strided", strided.py_func, (out, t2, t2, x, t2, i64), False))
            if dtype == u.accepts[-1]:
                cases.append((f"{op}[{dtype}] contiguous", contiguous.py_func, (out, x, i64), False))
    for op, u in sorted(BINARY.items()) + sorted(COMPARE.items()):
        mixed = ("int64", "float64") if u.accepts[-1].kind == "f" else ("uint8", "int16")
        for a, b in [(d.name, d.name) for d in u.accepts] + [mixed]:
            out, compute = array(binary_result_dtype(op, a, b).name), compute_dtype(op, a, b)
            strided, contiguous = make_zip(device_function(op, compute), _conversion(compute))
            cases.append((f"{op}[{a},{b}] strided", strided.py_func,
                          (out, t2, t2, array(a), t2, array(b), t2, i64), False))
            if (a, b) == mixed:
                cases.append((f"{op}[{a},{b}] contiguous", contiguous.py_func,
                              (out, array(a), array(b), t2, i64), False))   # the operands, their steps
    b1 = array("bool")
    for dtype in SUPPORTED_DTYPES:
        a, scalar = array(dtype.name), getattr(types, dtype.name)
        cases.append((f"where[{dtype}]", where_strided.py_func, (a, t2, t2, b1, t2, a, t2, a, t2, i64), False))
        cases.append((f"fill[{dtype}]", fill_strided.py_func, (a, t2, t2, scalar, i64), False))
        for target in SUPPORTED_DTYPES:  # every conversion (float16 -> bool needs x != 0)
            strided, _ = _converter(target, dtype)
            cases.append((f"cast[{dtype}->{target}]", strided.py_func, (array(target.name), t2, t2, a, t2, i64),
                          False))
    for x, y in (("float16", "bool"), ("int8", "uint8"), ("float16", "int64")):
        out = array(np.result_type(x, y).name)
        cases.append((f"where[{x},{y}]", where_strided.py_func, (out, t2, t2, b1, t2, array(x), t2, array(y), t2, i64),
                      False))
    return cases
