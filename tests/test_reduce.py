"""Reductions (reduce_sum/max/min/mean, argmax, argmin) and softmax / log_softmax equal numpy on both targets.

Every axis subset (None, an int, a tuple, negative axes, ``()``), keepdims, 0-d
and zero-size inputs, and non-contiguous layouts; all nine dtypes of
``kernels/dtypes.py`` (numpy's result dtypes, but int64 for the sum of uint8);
NaN and ties; the two-pass path of a long single row; errors where numpy refuses
(``ValueError`` there, ``ShapeError`` / ``AxisError`` / ``DTypeError`` here).
"""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import pyflow.kernels.reduce as reduce_module
from pyflow.errors import AxisError, DTypeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.layout import broadcast_view
from pyflow.kernels.dtypes import SUPPORTED_DTYPES
from pyflow.kernels.reduce import ARG_REDUCTIONS, REDUCTIONS, plan_reduce, result_dtype
from pyflow.kernels.registry import get_kernel
from tests.strategies import (TARGETS, all_dtypes, assert_close, empty_on, float_dtypes, int_dtypes, operands,
                              shapes, to_host)

AXES_OPS = sorted(op for op in REDUCTIONS if op not in ARG_REDUCTIONS)   # take any set of axes
float16s = float_dtypes | st.just(np.dtype(np.float16))
ALL_OPS = sorted(REDUCTIONS)
# 0-d and zero-size shapes, and (as often) shapes with several rows of several elements
any_shapes = st.one_of(shapes(), shapes(min_dims=2, min_side=2, max_side=6))


@st.composite
def axes_for(draw, ndim: int):
    """``None``, an int, or a tuple of distinct axes in any order (``()`` too), some negative."""
    kinds = ["none", "tuple"] + (["int"] if ndim else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "none":
        return None
    flip = st.booleans()
    if kind == "int":
        axis = draw(st.integers(0, ndim - 1))
        return axis - ndim if draw(flip) else axis
    chosen = draw(st.permutations(range(ndim)))[:draw(st.integers(0, ndim))]
    return tuple(a - ndim if draw(flip) else a for a in chosen)


@st.composite
def argmax_axis_for(draw, ndim: int):
    """``None`` or one int axis (maybe negative): what argmax and argmin take."""
    if not ndim or draw(st.booleans()):
        return None
    axis = draw(st.integers(0, ndim - 1))
    return axis - ndim if draw(st.booleans()) else axis


def numpy_reduce(op, x, axis, keepdims):
    """numpy's answer, silently (the mean of nothing is nan, with a warning there), in pyflow's
    result dtype (the sum of uint8: int64, not uint64)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = getattr(np, REDUCTIONS[op])(x, axis=axis, keepdims=keepdims)
    return np.asarray(result).astype(result_dtype(op, x.dtype))


def run_reduce(op, target, x, axis, keepdims, out_dtype=None):
    """Run ``op`` on ``target`` into a fresh output shaped like numpy's result; return it on the host."""
    expected_shape = np.sum(np.zeros(x.shape, np.int8), axis=axis, keepdims=keepdims).shape
    out = empty_on(target, expected_shape, out_dtype or result_dtype(op, x.dtype))
    get_kernel(op, target)(out, x, axis=axis, keepdims=keepdims)
    return to_host(out)


def assert_reduced(actual, expected, x, op, what):
    """Exact for ints and max/min/argmax.  A float sum may be added up in another order
    than numpy's (pairwise there, strided then a tree here): both lie within
    width * eps * sum|x| of the exact sum, so allow twice that (divided by width for mean)."""
    if expected.dtype.kind != "f" or op not in ("reduce_sum", "reduce_mean") or not expected.size:
        assert_close(actual, expected, what=what)
        return
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    width = x.size // expected.size
    with np.errstate(all="ignore"):
        magnitude = np.abs(x.astype(np.float64)).sum() if x.size else 0.0
        bound = 2 * width * np.finfo(expected.dtype).eps * magnitude / (width if op == "reduce_mean" else 1)
        diff = np.abs(actual.astype(np.float64) - expected)
    ok = (diff <= bound + 1e-6) | (np.isnan(actual) & np.isnan(expected))
    assert ok.all(), f"{what}: {actual[~ok]} != {expected[~ok]} (bound {bound:g})"


# --- results equal numpy's ------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", AXES_OPS)
@settings(max_examples=40)
@given(data=st.data(), shape=any_shapes, dtype=all_dtypes, keepdims=st.booleans())
def test_reduction_over_any_axes_equals_numpy(target, op, data, shape, dtype, keepdims):
    axis = data.draw(axes_for(len(shape)), label="axis")
    x = data.draw(operands(shape, dtype), label="x")
    try:
        expected = numpy_reduce(op, x.numpy(), axis, keepdims)
    except ValueError:
        assume(False)  # an empty max/min: see test_empty_max_min_argmax_raise_where_numpy_raises
    actual = run_reduce(op, target, x.on(target), axis, keepdims)
    assert actual.dtype == expected.dtype
    assert_reduced(actual, expected, x.numpy(), op, f"{op} {dtype}{shape} {x.layout} axis={axis} on {target}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ARG_REDUCTIONS)
@settings(max_examples=40)
@given(data=st.data(), shape=st.one_of(shapes(min_side=1), shapes(min_dims=2, min_side=2, max_side=6)),
       dtype=all_dtypes, keepdims=st.booleans())
def test_argmax_and_argmin_equal_numpy(target, op, data, shape, dtype, keepdims):
    axis = data.draw(argmax_axis_for(len(shape)), label="axis")
    x = data.draw(operands(shape, dtype), label="x")
    expected = getattr(np, op)(x.numpy(), axis=axis, keepdims=keepdims)
    actual = run_reduce(op, target, x.on(target), axis, keepdims)
    assert_close(actual, expected, what=f"{op} {dtype}{shape} {x.layout} axis={axis} on {target}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ARG_REDUCTIONS)
@given(data=st.data(), shape=st.one_of(shapes(min_dims=1, min_side=1), shapes(min_dims=2, min_side=2, max_side=6)),
       dtype=int_dtypes | st.just(np.dtype(np.bool_)))
def test_argmax_and_argmin_break_ties_toward_the_first_occurrence(target, op, data, shape, dtype):
    axis = data.draw(argmax_axis_for(len(shape)), label="axis")
    x = data.draw(operands(shape, dtype, low=0, high=1), label="x")  # full of ties
    actual = run_reduce(op, target, x.on(target), axis, False)
    assert_close(actual, getattr(np, op)(x.numpy(), axis=axis), what=f"{op} ties axis={axis} on {target}")


@pytest.mark.parametrize("target", TARGETS)
def test_argmax_ties_across_threads_pick_the_lowest_index(target):
    """Rows wider than a block: equal maxima held by different threads and tree levels."""
    x = np.zeros((4, 70), np.float32)
    x[1, [45, 20, 66]] = 5.0   # thread 13 (45 = 13 + 32), thread 20, thread 2 (66 = 2 + 64)
    x[2, [69, 64]] = 1.0
    x[3, [39, 7, 69]] = 2.0  # 7 and 39 are both thread 7's (of 32 threads or fewer)
    dev = x if target == "cpu" else cuda.to_device(x)
    assert run_reduce("argmax", target, dev, 1, False).tolist() == [0, 20, 64, 7]
    dev = -x if target == "cpu" else cuda.to_device(-x)
    assert run_reduce("argmin", target, dev, 1, False).tolist() == [0, 20, 64, 7]


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), shape=st.one_of(shapes(min_dims=1, min_side=1), shapes(min_dims=2, min_side=2, max_side=6)),
       dtype=float16s, specials=st.lists(st.sampled_from([np.nan, np.inf, -np.inf]), min_size=1, max_size=4))
def test_nan_propagates_through_max_and_min_and_argmax_finds_the_first_nan(target, data, shape, dtype, specials):
    """argmin too finds the first NaN (numpy's rule: NaN is the extreme both ways)."""
    x = data.draw(operands(shape, dtype, allow_broadcast=False), label="x")
    base = x.base.copy()
    spots = data.draw(st.lists(st.integers(0, base.size - 1), min_size=len(specials), max_size=len(specials)))
    base.reshape(-1)[spots] = specials
    values = np.array(x.view(base))
    view = x.view(base) if target == "cpu" else x.view(cuda.to_device(base))
    axis = data.draw(argmax_axis_for(len(shape)), label="axis")
    for op in ("reduce_max", "reduce_min", "argmax", "argmin"):
        expected = numpy_reduce(op, values, axis, False)
        assert_close(run_reduce(op, target, view, axis, False), expected, what=f"{op} with {specials} on {target}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape, axis", [((0,), None), ((3, 0), 1), ((0, 2, 0), (0, 2)), ((2, 0), 1)])
def test_sum_of_nothing_is_zero_and_mean_of_nothing_is_nan(target, shape, axis):
    x = empty_on(target, shape, np.float32)
    assert (run_reduce("reduce_sum", target, x, axis, False) == 0).all()
    assert np.isnan(run_reduce("reduce_mean", target, x, axis, False)).all()
    assert (run_reduce("reduce_sum", target, empty_on(target, shape, np.int32), axis, True) == 0).all()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("axis", [None, ()])
def test_0d_input_reduces_to_itself(target, op, axis):
    if op in ARG_REDUCTIONS and axis == ():
        return  # argmax and argmin take None or one int
    x = np.array(7, np.int32)
    actual = run_reduce(op, target, x if target == "cpu" else cuda.to_device(x), axis, False)
    assert actual.shape == () and actual == (0 if op in ARG_REDUCTIONS else 7)


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), shape=shapes(min_dims=2, min_side=1), dtype=float_dtypes)
def test_output_may_be_a_strided_view(target, data, shape, dtype):
    """Writing through a transposed or sliced output hits exactly its cells."""
    x = data.draw(operands(shape, dtype), label="x")
    out = data.draw(operands(shape[1:], dtype, allow_broadcast=False), label="out")
    out_base = out.base.copy()
    out_view = out.view(out_base) if target == "cpu" else out.view(cuda.to_device(out_base))
    get_kernel("reduce_max", target)(out_view, x.on(target), axis=0)
    assert_close(to_host(out_view), np.max(x.numpy(), axis=0), what=f"max into a {out.layout} output")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ALL_OPS)
@given(data=st.data(), shape=shapes(min_dims=1, min_side=2, max_side=6), dtype=all_dtypes)
def test_two_pass_reduction_of_one_long_row_equals_numpy(target, op, data, shape, dtype):
    """With the threshold lowered, a full reduction runs pass 1 (partials) and pass 2."""
    assume(int(np.prod(shape)) > 8)
    keepdims = data.draw(st.booleans(), label="keepdims")
    x = data.draw(operands(shape, dtype, low=-2, high=2), label="x")  # ints: ties across blocks
    calls = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reduce_module, "TWO_PASS_WIDTH", 8)
        two_pass = reduce_module._reduce_two_pass
        patch.setattr(reduce_module, "_reduce_two_pass", lambda *a: calls.append(a) or two_pass(*a))
        actual = run_reduce(op, target, x.on(target), None, keepdims)
    assert len(calls) == (1 if target == "cuda" else 0)
    expected = numpy_reduce(op, x.numpy(), None, keepdims)
    assert_reduced(actual, expected, x.numpy(), op, f"two-pass {op} {dtype}{shape} {x.layout} on {target}")


def _softmax_reference(op, x, axis):
    """The textbook formula in float64."""
    x = x.astype(np.float64)
    shifted = x - x.max(axis=axis, keepdims=True)
    log_total = np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    return shifted - log_total if op == "log_softmax" else np.exp(shifted - log_total)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@given(data=st.data(), shape=shapes(min_dims=1), dtype=float_dtypes)
def test_softmax_matches_the_float64_formula_without_overflow(target, op, data, shape, dtype):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    x = data.draw(operands(shape, dtype, low=-1000, high=1000), label="x")  # exp(1000) overflows
    out = empty_on(target, shape, dtype)
    get_kernel(op, target)(out, x.on(target), axis=axis)
    actual = to_host(out)
    assert np.isfinite(actual).all()
    if x.numpy().size:
        assert_close(actual, _softmax_reference(op, x.numpy(), axis).astype(dtype), what=f"{op} axis={axis}")
        total = np.exp(actual.astype(np.float64)) if op == "log_softmax" else actual
        assert_close(total.sum(axis=axis), np.ones(total.sum(axis=axis).shape), dtype=dtype, what="rows sum")


@pytest.mark.parametrize("target", TARGETS)
def test_softmax_may_work_in_place(target):
    x = np.arange(12, dtype=np.float64).reshape(3, 4) * 300
    arr = x.copy() if target == "cpu" else cuda.to_device(x)
    get_kernel("softmax", target)(arr, arr, axis=0)
    assert_close(to_host(arr), _softmax_reference("softmax", x, 0))


# --- bad input: a clear error before any launch, where numpy also refuses ------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ALL_OPS + ["softmax", "log_softmax"])
@given(shape=shapes(max_dims=3), past=st.integers(0, 2), negative=st.booleans())
def test_out_of_range_axis_raises_axis_error_like_numpy(target, op, shape, past, negative):
    axis = -len(shape) - 1 - past if negative else len(shape) + past
    # numpy's legacy exception: sum/max/min/argmax of a 0-d array accept the int axis 0
    # or -1 (mean, softmax and every tuple refuse it).  pyflow refuses it everywhere.
    assume(not (shape == () and axis in (0, -1)))
    x = empty_on(target, shape, np.float32)
    with pytest.raises(np.exceptions.AxisError):
        (np.max if op != "argmax" else np.argmax)(np.zeros(shape), axis=axis)
    with pytest.raises(AxisError, match=f"{op}: axis {axis} is out of range"):
        get_kernel(op, target)(empty_on(target, (), np.float32), x, axis=axis)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", AXES_OPS)
@given(shape=shapes(min_dims=1, max_dims=3), data=st.data())
def test_repeated_axis_raises_like_numpy(target, op, shape, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    axes = (axis, axis - len(shape))
    with pytest.raises(ValueError, match="duplicate"):
        np.sum(np.zeros(shape), axis=axes)
    with pytest.raises(AxisError, match=f"{op}: repeated axis"):
        get_kernel(op, target)(empty_on(target, (), np.float32), empty_on(target, shape, np.float32), axis=axes)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ALL_OPS)
@given(data=st.data(), shape=shapes(max_side=2), keepdims=st.booleans())
def test_empty_max_min_argmax_raise_where_numpy_raises(target, op, data, shape, keepdims):
    """numpy: ValueError (no identity); pyflow: ShapeError naming the op, before any launch."""
    axis = data.draw(argmax_axis_for(len(shape)) if op in ARG_REDUCTIONS else axes_for(len(shape)), label="axis")
    x = np.zeros(shape, np.float32)
    try:
        numpy_reduce(op, x, axis, keepdims)
        numpy_raises = False
    except ValueError:
        numpy_raises = True
    assert numpy_raises == (op in ("reduce_max", "reduce_min", "argmax", "argmin") and 0 in
                            [x.shape[a] for a in (range(x.ndim) if axis is None else np.atleast_1d(axis))])
    dev = x if target == "cpu" else cuda.to_device(x)
    if numpy_raises:
        with pytest.raises(ShapeError, match=f"{op}: reduction over the empty axes"):
            run_reduce(op, target, dev, axis, keepdims)
    else:
        run_reduce(op, target, dev, axis, keepdims)


@pytest.mark.parametrize("target", TARGETS)
def test_wrong_output_shape_or_dtype_is_refused(target):
    x = empty_on(target, (2, 3), np.int32)
    run = get_kernel("reduce_sum", target)
    with pytest.raises(ShapeError, match=r"reduce_sum: output has shape \(3,\), expected \(2,\)"):
        run(empty_on(target, (3,), np.int64), x, axis=1)
    with pytest.raises(ShapeError, match=r"expected \(2, 1\)"):
        run(empty_on(target, (2,), np.int64), x, axis=1, keepdims=True)
    with pytest.raises(DTypeError, match="reduce_sum: output dtype is int32, expected int64"):
        run(empty_on(target, (2,), np.int32), x, axis=1)
    with pytest.raises(DTypeError, match="reduce_mean: output dtype is float32, expected float64"):
        get_kernel("reduce_mean", target)(empty_on(target, (2,), np.float32), x, axis=1)
    with pytest.raises(DTypeError, match="argmax: output dtype is int32, expected int64"):
        get_kernel("argmax", target)(empty_on(target, (2,), np.int32), x, axis=1)
    with pytest.raises(ShapeError, match="softmax: output has shape"):
        get_kernel("softmax", target)(empty_on(target, (3, 2), np.float32), empty_on(target, (2, 3), np.float32))


@pytest.mark.parametrize("target", TARGETS)
def test_unsupported_dtypes_are_refused(target):
    for op in ALL_OPS:
        with pytest.raises(DTypeError, match=f"{op}: unsupported dtype complex64"):
            get_kernel(op, target)(empty_on(target, (), np.int64), empty_on(target, (3,), np.complex64))
    for op in ("softmax", "log_softmax"):
        with pytest.raises(DTypeError, match=f"{op}: needs float32 or float64 input, got int32"):
            get_kernel(op, target)(empty_on(target, (3,), np.int32), empty_on(target, (3,), np.int32))
        with pytest.raises(DTypeError, match=f"{op}: needs float32 or float64 input, got float16"):
            get_kernel(op, target)(empty_on(target, (3,), np.float16), empty_on(target, (3,), np.float16))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ARG_REDUCTIONS)
def test_argmax_and_argmin_take_one_axis_not_a_tuple(target, op):
    with pytest.raises(TypeError):
        getattr(np, op)(np.zeros((2, 3)), axis=(0, 1))
    with pytest.raises(AxisError, match=f"{op}: axis must be an int"):
        get_kernel(op, target)(empty_on(target, (), np.int64), empty_on(target, (2, 3), np.float32), axis=(0, 1))


@pytest.mark.parametrize("target", TARGETS)
def test_broadcast_output_is_refused(target):
    out = broadcast_view(empty_on(target, (1,), np.float32), (3,))
    with pytest.raises(ShapeError, match="broadcast view"):
        get_kernel("reduce_max", target)(out, empty_on(target, (3, 2), np.float32), axis=1)


def test_cuda_kernels_refuse_host_arrays():
    with pytest.raises(DTypeError, match="expected device arrays"):
        get_kernel("reduce_sum", "cuda")(np.zeros((), np.float32), np.zeros(3, np.float32))
    with pytest.raises(DTypeError, match="expected device arrays"):
        get_kernel("softmax", "cuda")(np.zeros(3, np.float32), np.zeros(3, np.float32))


# --- the dtypes added for the framework -------------------------------------------------


def test_result_dtypes_are_numpys_but_the_sum_of_uint8_is_int64():
    for op in ALL_OPS:
        for dtype in SUPPORTED_DTYPES:
            expected = numpy_reduce(op, np.zeros(2, dtype), None, False).dtype
            assert result_dtype(op, dtype) == expected, (op, dtype)
            if not (op in ("reduce_sum", "reduce_prod") and dtype == np.uint8):
                assert expected == getattr(np, REDUCTIONS[op])(np.zeros(2, dtype)).dtype, (op, dtype)
    assert result_dtype("reduce_sum", np.uint8) == np.int64  # numpy: uint64, outside pyflow's dtypes
    assert [result_dtype(op, np.float16) for op in ("reduce_sum", "reduce_mean", "reduce_max")] == [np.float16] * 3


@pytest.mark.parametrize("op", ALL_OPS)
def test_plan_reduce_works_on_metadata_alone_for_every_dtype(op):
    """What the framework calls at the call: shapes and dtypes, no array."""
    for dtype in SUPPORTED_DTYPES:
        meta = types.SimpleNamespace(shape=(2, 3, 4), ndim=3, dtype=np.dtype(dtype))
        plan = plan_reduce(op, meta, 1, True)
        assert plan.out_shape == (2, 1, 4) and plan.out_dtype == result_dtype(op, dtype)
    with pytest.raises(DTypeError, match=f"{op}: unsupported dtype object"):
        plan_reduce(op, types.SimpleNamespace(shape=(2,), ndim=1, dtype=np.dtype(object)), None, False)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean"])
def test_float16_sums_add_up_in_float32(target, op):
    """3000 ones: float16 steps of one stop at 2048; the float32 total is exact, and 3000 is a float16."""
    x = np.ones(3000, np.float16)
    actual = run_reduce(op, target, x if target == "cpu" else cuda.to_device(x), None, False)
    assert actual.dtype == np.float16 and actual == (3000 if op == "reduce_sum" else 1)
