"""Elementwise kernels on both targets equal numpy, on every layout, 0-d and empty included.

Every op with every dtype it accepts (``kernels/ufuncs.py``), the nine dtypes of
``kernels/dtypes.py`` for copy, cast, fill and where; special values (NaN, inf,
signed zeros, halves) exactly, signs of zeros included; and the refusals.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels.backend import cuda, is_gpu
from pyflow.kernels.dtypes import FLOAT_DTYPES, INTEGER_DTYPES, SUPPORTED_DTYPES
from pyflow.kernels.elementwise import BINARY, COMPARE, UNARY, binary_result_dtype, unary_result_dtype
from pyflow.kernels.registry import get_kernel
from tests.strategies import (TARGETS, all_dtypes, assert_close, empty_on, float_dtypes, operands, shapes,
                              to_host)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# The mathematical definition, computed in float64 (or exactly for ints).
REFERENCE = {
    "neg": np.negative, "relu": lambda x: np.where(x > 0, x, 0 * x), "sigmoid": _sigmoid,
    "tanh": np.tanh, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "abs": np.abs,
    "sin": np.sin, "cos": np.cos, "floor": np.floor, "ceil": np.ceil, "round": np.rint, "sign": np.sign,
    "isnan": np.isnan, "isinf": np.isinf, "logical_not": np.logical_not, "bitwise_not": np.invert,
}

two_shapes = mutually_broadcastable_shapes(num_shapes=2, max_dims=3, min_side=0, max_side=4)


def _reference(fn, *arrays, dtype):
    wide = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays]
    with np.errstate(all="ignore"):
        return np.asarray(fn(*wide)).astype(dtype)


def accepted(op):
    """The dtypes ``op`` takes, as a strategy."""
    return st.sampled_from((UNARY.get(op) or BINARY.get(op) or COMPARE[op]).accepts)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", sorted(UNARY))
@given(data=st.data(), shape=shapes())
def test_unary_op_equals_numpy(target, op, data, shape):
    dtype = data.draw(accepted(op), label="dtype")
    x = data.draw(operands(shape, dtype), label="x")
    out_dtype = unary_result_dtype(op, dtype)
    out = empty_on(target, shape, out_dtype)
    get_kernel(op, target)(out, x.on(target))
    expected = _reference(REFERENCE[op], x.numpy(), dtype=out_dtype)
    assert_close(to_host(out), expected, what=f"{op} {dtype} {shape} {x.layout} on {target}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", sorted(BINARY) + sorted(COMPARE))
@given(data=st.data(), shapes_=two_shapes)
def test_binary_op_broadcasts_like_numpy(target, op, data, shapes_):
    """Mixed dtypes too: the framework casts to one dtype first, but the kernels follow numpy anyway."""
    dtype_a, dtype_b = data.draw(accepted(op), label="dtype a"), data.draw(accepted(op), label="dtype b")
    (shape_a, shape_b), shape = shapes_.input_shapes, shapes_.result_shape
    low = 1 if op == "pow" else -10  # no integer to a negative power (numpy raises)
    a = data.draw(operands(shape_a, dtype_a, low=low, high=4 if op == "pow" else 10), label="a")
    b = data.draw(operands(shape_b, dtype_b, low=0 if op == "pow" else -10, high=4 if op == "pow" else 10), label="b")
    out_dtype = binary_result_dtype(op, dtype_a, dtype_b)
    out = empty_on(target, shape, out_dtype)
    get_kernel(op, target)(out, a.on(target), b.on(target))
    ufunc = (BINARY.get(op) or COMPARE[op]).numpy
    with np.errstate(all="ignore"):
        expected = ufunc(a.numpy(), b.numpy())
    what = f"{op} {dtype_a}{shape_a} {a.layout}, {dtype_b}{shape_b} {b.layout} on {target}"
    assert_close(to_host(out), expected, what=what)


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), shape=shapes(min_dims=1), dtype=float_dtypes)
def test_output_may_be_a_strided_view(target, data, shape, dtype):
    """Writing through a transposed/sliced output view hits exactly its cells."""
    a = data.draw(operands(shape, dtype), label="a")
    out = data.draw(operands(shape, dtype, allow_broadcast=False), label="out")
    out_base = out.base.copy()
    out_target = out.view(out_base) if target == "cpu" else out.view(cuda.to_device(out_base))
    get_kernel("exp", target)(out_target, a.on(target))
    result = to_host(out_target)
    assert_close(result, np.exp(a.numpy()), what=f"exp into {out.layout} output")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), shapes_=mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=4),
       dtype=all_dtypes)
def test_where_selects_like_numpy(target, data, shapes_, dtype):
    cond_shape, a_shape, b_shape = shapes_.input_shapes
    cond = data.draw(operands(cond_shape, np.dtype(bool)), label="cond")
    a = data.draw(operands(a_shape, dtype), label="a")
    b = data.draw(operands(b_shape, dtype), label="b")
    out = empty_on(target, shapes_.result_shape, dtype)
    get_kernel("where", target)(out, cond.on(target), a.on(target), b.on(target))
    assert_close(to_host(out), np.where(cond.numpy(), a.numpy(), b.numpy()), what="where")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), shape=shapes(), src=all_dtypes, dst=all_dtypes)
def test_cast_converts_like_numpy_astype(target, data, shape, src, dst):
    # A float outside the integer type it is cast to is undefined (C, numpy, CUDA): keep floats >= 0 for uint8.
    low = 0 if src.kind == "f" and dst.kind == "u" else -10
    x = data.draw(operands(shape, src, low=low), label="x")
    out = empty_on(target, shape, dst)
    get_kernel("cast", target)(out, x.on(target))
    assert_close(to_host(out), x.numpy().astype(dst), what=f"cast {src}->{dst}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dst", INTEGER_DTYPES)
def test_float16_to_an_integer_truncates_toward_zero_as_numpy(target, dst):
    """numba-cuda's own float16 -> integer store rounds to nearest (2.738 -> 3 on an H200): the cast goes
    through float32, which truncates (2), as numpy and C do."""
    values = np.array([2.738, 0.5, 1.5, 0.999, 7.99, 126.9], np.float16)
    if np.dtype(dst).kind == "i":
        values = np.concatenate([values, -values])
    x = cuda.to_device(values) if target == "cuda" else values
    out = empty_on(target, values.shape, dst)
    get_kernel("cast", target)(out, x)
    np.testing.assert_array_equal(to_host(out), values.astype(dst))


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), shape=shapes(), dtype=all_dtypes, value=st.integers(-5, 5))
def test_fill_and_copy(target, data, shape, dtype, value):
    value = abs(value) if dtype.kind == "u" else value  # numpy 2 refuses uint8(-5)
    out = empty_on(target, shape, dtype)
    get_kernel("fill", target)(out, value)
    assert_close(to_host(out), np.full(shape, value, dtype), what="fill")
    x = data.draw(operands(shape, dtype), label="x")
    get_kernel("copy", target)(out, x.on(target))
    assert_close(to_host(out), x.numpy(), what=f"copy from {x.layout}")


@pytest.mark.parametrize("target", TARGETS)
def test_in_place_update_reads_before_it_writes(target):
    x = np.arange(-3, 5, dtype=np.float32).reshape(2, 4)
    arr = x.copy() if target == "cpu" else cuda.to_device(x)
    get_kernel("relu", target)(arr, arr)
    assert_close(to_host(arr), np.maximum(x, 0))


# --- bad input: a clear error before any launch, where numpy also refuses ---------


@pytest.mark.parametrize("target", TARGETS)
@given(shape_a=shapes(min_dims=1, min_side=2), shape_b=shapes(min_dims=1, min_side=2))
def test_shapes_that_do_not_broadcast_raise_like_numpy(target, shape_a, shape_b):
    try:
        np.broadcast_shapes(shape_a, shape_b)
        assume(False)
    except ValueError:
        pass  # numpy refuses; so must we
    a, b = empty_on(target, shape_a, np.float32), empty_on(target, shape_b, np.float32)
    out = empty_on(target, shape_a, np.float32)
    with pytest.raises(ShapeError, match="add: shapes .* cannot be broadcast"):
        get_kernel("add", target)(out, a, b)


@pytest.mark.parametrize("target", TARGETS)
def test_wrong_output_shape_or_dtype_is_refused(target):
    a = empty_on(target, (2, 3), np.float32)
    with pytest.raises(ShapeError, match=r"add: output has shape \(3, 2\), expected \(2, 3\)"):
        get_kernel("add", target)(empty_on(target, (3, 2), np.float32), a, a)
    with pytest.raises(DTypeError, match="expected float32"):
        get_kernel("add", target)(empty_on(target, (2, 3), np.float64), a, a)
    with pytest.raises(DTypeError, match="bool"):
        get_kernel("lt", target)(empty_on(target, (2, 3), np.float32), a, a)
    with pytest.raises(DTypeError, match="unsupported dtype complex64"):
        get_kernel("exp", target)(empty_on(target, (2,), np.complex64), empty_on(target, (2,), np.complex64))
    with pytest.raises(DTypeError, match="condition must be bool"):
        get_kernel("where", target)(a, a, a, a)


def test_cuda_kernels_refuse_host_arrays():
    with pytest.raises(DTypeError, match="expected device arrays"):
        get_kernel("add", "cuda")(np.zeros(3, np.float32), np.zeros(3, np.float32), np.zeros(3, np.float32))


@pytest.mark.parametrize("target", TARGETS)
def test_broadcast_output_is_refused(target):
    from pyflow.kernels.layout import broadcast_view

    a = empty_on(target, (3,), np.float32)
    out = broadcast_view(empty_on(target, (1,), np.float32), (3,))
    with pytest.raises(ShapeError, match="broadcast view"):
        get_kernel("neg", target)(out, a)


@pytest.mark.parametrize("target", TARGETS)
def test_relu_of_signed_zeros_and_infinities_is_like_numpy(target):
    x = np.array([-np.inf, -2.0, -0.0, 0.0, 3.0, np.inf, np.nan], np.float32)
    out = empty_on(target, x.shape, np.float32)
    get_kernel("relu", target)(out, x if target == "cpu" else cuda.to_device(x))
    result, expected = to_host(out), np.maximum(x, np.float32(0))
    np.testing.assert_array_equal(result, expected)
    assert not np.signbit(result[:4]).any(), "relu must not return -0.0"


# --- the new ops: special values, integer division by zero, dtype rules ----------------

SPECIAL_X = [-0.0, 0.0, -0.3, 0.3, -0.5, 0.5, -1.5, 2.5, -2.5, 7.0, -7.0, np.nan, np.inf, -np.inf]
SPECIAL_Y = [3.0, -3.0, 3.0, -3.0, -0.5, 0.5, 0.0, -0.0, 2.0, np.inf, -np.inf, 2.0, 2.0, -0.0]
SPECIAL_OPS = ["floor", "ceil", "round", "sign", "isnan", "isinf", "logical_not", "sin", "cos",
               "floor_divide", "remainder", "logical_and", "logical_xor", "div", "max"]


def _on(target, array):
    return array if target == "cpu" else cuda.to_device(array)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", SPECIAL_OPS)
def test_special_values_give_numpys_results_exactly(target, op):
    """NaN, infinities, signed zeros and halves (round is half-to-even): numpy's value, its zero's sign too."""
    for dtype in FLOAT_DTYPES:
        x, y = np.array(SPECIAL_X, dtype), np.array(SPECIAL_Y, dtype)
        args = (x,) if op in UNARY else (x, y)
        ufunc = (UNARY.get(op) or BINARY.get(op)).numpy
        with np.errstate(all="ignore"):
            expected = ufunc(*args)
        out = empty_on(target, x.shape, expected.dtype)
        get_kernel(op, target)(out, *[_on(target, a) for a in args])
        actual = to_host(out)
        if op in ("sin", "cos"):
            assert_close(actual, expected, what=f"{op} {dtype}")
            continue
        np.testing.assert_array_equal(actual, expected, err_msg=f"{op} {dtype} on {target}")
        if expected.dtype.kind == "f":
            same_sign = np.signbit(actual) == np.signbit(expected)
            nan = np.isnan(expected)
            assert same_sign[~nan].all(), f"{op} {dtype} on {target}: sign of a zero or an infinity differs"
            # A NaN made by an invalid operation (inf // 2, x % 0) has the hardware's sign bit, which IEEE 754
            # leaves open: x86 sets it (numpy there, and the simulator, which computes on the host); a GPU may
            # give its canonical NaN, sign clear (float16 did on an H200).  Only host arithmetic must match it.
            if not (target == "cuda" and is_gpu()):
                assert same_sign[nan].all(), f"{op} {dtype} on {target}: sign bit of a NaN differs from numpy's"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["floor_divide", "remainder"])
def test_integer_division_by_zero_gives_zero_like_numpy(target, op):
    for dtype in INTEGER_DTYPES:
        x = np.array([7, 0, 100, 5, 9], dtype) if dtype.kind == "u" else np.array([7, -7, 0, -100, 5], dtype)
        y = np.array([0, 0, 0, 3, 2], dtype) if dtype.kind == "u" else np.array([0, 0, 0, 3, -2], dtype)
        with np.errstate(all="ignore"):
            expected = BINARY[op].numpy(x, y)
        out = empty_on(target, x.shape, dtype)
        get_kernel(op, target)(out, _on(target, x), _on(target, y))
        np.testing.assert_array_equal(to_host(out), expected, err_msg=f"{op} {dtype}")
        assert (to_host(out)[:3] == 0).all()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not"])
@given(dtype=float_dtypes | st.just(np.dtype(np.float16)))
def test_bitwise_ops_refuse_floats(target, op, dtype):
    x = empty_on(target, (3,), dtype)
    args = (x,) if op in UNARY else (x, empty_on(target, (3,), np.int32))
    with pytest.raises(DTypeError, match=f"{op}: unsupported dtype {dtype}; expected one of bool, uint8"):
        get_kernel(op, target)(empty_on(target, (3,), np.int32), *args)


@pytest.mark.parametrize("target", TARGETS)
def test_cast_to_bool_is_nonzero_nan_included(target):
    for dtype in FLOAT_DTYPES:
        x = np.array([np.nan, 0.0, -0.0, 0.25, -np.inf], dtype)
        out = empty_on(target, x.shape, np.bool_)
        get_kernel("cast", target)(out, _on(target, x))
        np.testing.assert_array_equal(to_host(out), x.astype(bool))


def test_arithmetic_refuses_bool_and_every_op_refuses_objects_and_strings():
    a = np.array([True, False])
    for op in ("neg", "sin", "floor", "sign", "sub", "floor_divide", "remainder"):
        args = (a,) if op in UNARY else (a, a)
        with pytest.raises(DTypeError, match=f"{op}: unsupported dtype bool"):
            get_kernel(op, "cpu")(np.empty(2, np.int8), *args)
    for bad in (np.array(["a", "b"]), np.array([1, None], dtype=object)):
        for op in ("isnan", "logical_not", "eq", "logical_or", "copy", "cast"):
            args = (bad,) if op in UNARY or op in ("copy", "cast") else (bad, bad)
            with pytest.raises(DTypeError, match=f"{op}: unsupported dtype {bad.dtype}"):
                get_kernel(op, "cpu")(np.empty(2, np.bool_), *args)
        with pytest.raises(DTypeError, match=f"fill: unsupported dtype {bad.dtype}"):
            get_kernel("fill", "cpu")(bad.copy(), 1)
        with pytest.raises(DTypeError, match=f"where: unsupported dtype {bad.dtype}"):
            get_kernel("where", "cpu")(bad.copy(), np.ones(2, bool), bad, bad)


def test_result_dtypes_follow_the_documented_rules_and_stay_in_the_dtype_list():
    assert unary_result_dtype("floor", "int16") == np.int16 and unary_result_dtype("round", "uint8") == np.uint8
    assert unary_result_dtype("sin", "int8") == np.float16 and unary_result_dtype("cos", "int32") == np.float64
    assert unary_result_dtype("isnan", "bool") == np.bool_ and unary_result_dtype("bitwise_not", "bool") == np.bool_
    assert binary_result_dtype("logical_xor", "float16", "int64") == np.bool_
    assert binary_result_dtype("remainder", "uint8", "int8") == np.int16
    for op, u in UNARY.items():
        for dtype in u.accepts:
            assert unary_result_dtype(op, dtype) in SUPPORTED_DTYPES, (op, dtype)
    for op, u in {**BINARY, **COMPARE}.items():
        for a in u.accepts:
            for b in u.accepts:
                assert binary_result_dtype(op, a, b) in SUPPORTED_DTYPES, (op, a, b)
