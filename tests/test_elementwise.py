"""Elementwise kernels on both targets equal numpy, on every layout, 0-d and empty included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.elementwise import BINARY, COMPARE, UNARY, binary_result_dtype, unary_result_dtype
from pyflow.kernels.registry import get_kernel
from tests.strategies import (TARGETS, assert_close, dtypes, empty_on, float_dtypes, operands, shapes,
                              to_host)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# The mathematical definition, computed in float64 (or exactly for ints).
REFERENCE = {
    "neg": np.negative, "relu": lambda x: np.where(x > 0, x, 0 * x), "sigmoid": _sigmoid,
    "tanh": np.tanh, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "abs": np.abs,
}

two_shapes = mutually_broadcastable_shapes(num_shapes=2, max_dims=3, min_side=0, max_side=4)


def _reference(fn, *arrays, dtype):
    wide = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays]
    with np.errstate(all="ignore"):
        return np.asarray(fn(*wide)).astype(dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", sorted(UNARY))
@given(data=st.data(), shape=shapes(), dtype=dtypes)
def test_unary_op_equals_numpy(target, op, data, shape, dtype):
    x = data.draw(operands(shape, dtype), label="x")
    out_dtype = unary_result_dtype(op, dtype)
    out = empty_on(target, shape, out_dtype)
    get_kernel(op, target)(out, x.on(target))
    expected = _reference(REFERENCE[op], x.numpy(), dtype=out_dtype)
    assert_close(to_host(out), expected, what=f"{op} {dtype} {shape} {x.layout} on {target}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", sorted(BINARY) + sorted(COMPARE))
@given(data=st.data(), shapes_=two_shapes, dtype_a=dtypes, dtype_b=dtypes)
def test_binary_op_broadcasts_like_numpy(target, op, data, shapes_, dtype_a, dtype_b):
    (shape_a, shape_b), shape = shapes_.input_shapes, shapes_.result_shape
    low = 1 if op == "pow" else -10  # no integer to a negative power (numpy raises)
    a = data.draw(operands(shape_a, dtype_a, low=low, high=4 if op == "pow" else 10), label="a")
    b = data.draw(operands(shape_b, dtype_b, low=0 if op == "pow" else -10, high=4 if op == "pow" else 10), label="b")
    out_dtype = binary_result_dtype(op, dtype_a, dtype_b)
    out = empty_on(target, shape, out_dtype)
    get_kernel(op, target)(out, a.on(target), b.on(target))
    ufunc = (BINARY.get(op) or COMPARE[op])[1]
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
       dtype=dtypes)
def test_where_selects_like_numpy(target, data, shapes_, dtype):
    cond_shape, a_shape, b_shape = shapes_.input_shapes
    cond = data.draw(operands(cond_shape, np.dtype(bool)), label="cond")
    a = data.draw(operands(a_shape, dtype), label="a")
    b = data.draw(operands(b_shape, dtype), label="b")
    out = empty_on(target, shapes_.result_shape, dtype)
    get_kernel("where", target)(out, cond.on(target), a.on(target), b.on(target))
    assert_close(to_host(out), np.where(cond.numpy(), a.numpy(), b.numpy()), what="where")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), shape=shapes(), src=dtypes, dst=dtypes)
def test_cast_converts_like_numpy_astype(target, data, shape, src, dst):
    x = data.draw(operands(shape, src), label="x")
    out = empty_on(target, shape, dst)
    get_kernel("cast", target)(out, x.on(target))
    assert_close(to_host(out), x.numpy().astype(dst), what=f"cast {src}->{dst}")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), shape=shapes(), dtype=dtypes, value=st.integers(-5, 5))
def test_fill_and_copy(target, data, shape, dtype, value):
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
