"""index_add (torch's ``index_add_``) and scatter_add (``scatter_add_``) on both targets (``kernels/index_add.py``).

* Both equal ``np.add.at`` in the accumulate dtype bit for bit (float16: on a float32
  copy of out, rounded back once; every other dtype: in itself), on every numeric
  dtype, with repeated indices, random (negative too) axes and random layouts of out,
  index and source (permuted, sliced with a step, broadcast inputs); so cuda (the
  simulator) equals the CPU twin bit for bit, run after run.  Integers wrap around.
* float16 sums do not stall: 4096 ones added into one float16 zero give 4096 (2048
  if every add were rounded to float16), and a partial sum past 65504 is no inf.
* Both equal PyTorch's ``index_add_`` / ``scatter_add_`` bit for bit, float16 too.
  One corner of torch's CPU ``index_add_``: it sums float16 in float32 only for out
  of rank 2 or more, the first or last axis and an int64 index; otherwise it rounds
  every add to float16 (``np.add.at``'s way).  There the kernels equal torch run on
  its float32 path (the axis moved to the front of a 2-D copy), and the direct call
  within the rounding of its adds.
* An index outside ``[0, size)`` raises IndexOutOfRangeError naming the op, the
  (largest) bad value, the axis and its size, and leaves ``out`` untouched on both
  targets; with ``check=False`` on cuda, the bad entries are skipped.
* Wrong shapes, dtypes and axes raise ShapeError / DTypeError / AxisError.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow.kernels.index_add  # noqa: F401  (registers index_add, scatter_add)
from pyflow.errors import AxisError, DTypeError, IndexOutOfRangeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.dtypes import NUMERIC_DTYPES
from pyflow.kernels.layout import broadcast_view
from pyflow.kernels.registry import get_kernel
from tests.strategies import TARGETS, int_dtypes, numeric_dtypes, operands, shapes, to_host


def on(target, array):
    array = np.array(array, order="C")
    return array if target == "cpu" else cuda.to_device(array)


def assert_bit_equal(actual, expected, what):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, \
        f"{what}: {actual.shape} {actual.dtype} vs {expected.shape} {expected.dtype}"
    bits = np.dtype(f"u{actual.dtype.itemsize}")
    differ = actual.view(bits) != expected.view(bits)
    if differ.any():
        first = tuple(np.argwhere(differ)[0])
        raise AssertionError(f"{what}: {int(differ.sum())} of {actual.size} values differ in their bits; first at "
                             f"{list(first)}: {actual[first]!r} vs {expected[first]!r}")


def out_on(target, out):
    """(view, storage) of the Operand ``out`` on ``target``: a fresh copy of its base, viewed."""
    storage = out.base.copy() if target == "cpu" else cuda.to_device(out.base)
    return out.view(storage), storage


def assert_only_the_view_changed(storage, out, what):
    """The cells of ``out.base`` outside the view are as they were."""
    inside = np.zeros(out.base.shape, bool)
    out.view(inside)[...] = True
    assert_bit_equal(to_host(storage)[~inside], out.base[~inside], f"{what}: cells outside the view changed")


def add_at(out, where, source):
    """A copy of out after ``np.add.at(out, where, source)``, summed as PyTorch's CPU scatter_add_ does:
    float16 in float32, every element rounded to float16 once at the end; any other dtype in itself."""
    if out.dtype != np.float16:
        expected = out.copy()
        np.add.at(expected, where, source)
        return expected
    total = out.astype(np.float32)
    np.add.at(total, where, source.astype(np.float32))
    with np.errstate(over="ignore"):
        return total.astype(np.float16)


def expected_index_add(out, axis, index, source):
    return add_at(out, (slice(None),) * (axis % out.ndim) + (np.asarray(index),), source)


def expected_scatter_add(out, axis, index, source):
    where = list(np.indices(index.shape, sparse=True))
    where[axis % out.ndim] = index
    return add_at(out, tuple(where), source)


# --- the input space ------------------------------------------------------------------


@st.composite
def index_add_cases(draw):
    """(out shape, axis, index length): up to 6 indices into an axis of at most 4 (so repeats are common)."""
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=4))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    return shape, axis, draw(st.integers(0, 6)) if shape[axis] else 0  # an empty axis admits no index


@st.composite
def scatter_add_cases(draw):
    """(out shape, axis, index shape): index no larger than out off the axis, any length (0 to 5) along it."""
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=4))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    index_shape = [draw(st.integers(0, n)) for n in shape]
    index_shape[axis] = draw(st.integers(0, 5)) if shape[axis] else 0
    return shape, axis, tuple(index_shape)


# --- results ----------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=40)
@given(data=st.data(), case=index_add_cases(), dtype=numeric_dtypes, index_dtype=int_dtypes)
def test_index_add_equals_add_at_bit_for_bit(target, data, case, dtype, index_dtype):
    shape, axis, length = case
    n = shape[axis]
    out = data.draw(operands(shape, dtype, allow_broadcast=False), label="out")
    index = data.draw(operands((length,), index_dtype, low=0, high=max(n - 1, 0)), label="index")
    source_shape = tuple(length if d == axis % len(shape) else m for d, m in enumerate(shape))
    source = data.draw(operands(source_shape, dtype), label="source")
    expected = expected_index_add(out.numpy(), axis, index.numpy(), source.numpy())
    view, storage = out_on(target, out)
    get_kernel("index_add", target)(view, index.on(target), source.on(target), axis=axis)
    what = (f"index_add {dtype} out{shape} {out.layout} axis {axis} index {index.numpy().tolist()} {index.layout} "
            f"source {source.layout} on {target}")
    assert_bit_equal(to_host(view), expected, what)
    assert_only_the_view_changed(storage, out, what)


@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=40)
@given(data=st.data(), case=scatter_add_cases(), dtype=numeric_dtypes, index_dtype=int_dtypes)
def test_scatter_add_equals_add_at_bit_for_bit(target, data, case, dtype, index_dtype):
    shape, axis, index_shape = case
    n = shape[axis]
    out = data.draw(operands(shape, dtype, allow_broadcast=False), label="out")
    index = data.draw(operands(index_shape, index_dtype, low=0, high=max(n - 1, 0)), label="index")
    source = data.draw(operands(index_shape, dtype), label="source")
    expected = expected_scatter_add(out.numpy(), axis, index.numpy(), source.numpy())
    view, storage = out_on(target, out)
    get_kernel("scatter_add", target)(view, index.on(target), source.on(target), axis=axis)
    what = (f"scatter_add {dtype} out{shape} {out.layout} axis {axis} index{index_shape} {index.layout} "
            f"source {source.layout} on {target}")
    assert_bit_equal(to_host(view), expected, what)
    assert_only_the_view_changed(storage, out, what)


def torch_rounds_float16_per_add(ndim, axis, index_dtype):
    """Whether torch's CPU ``index_add_`` adds float16 in float16 (each add rounded, as np.add.at does)
    rather than through its scatter_add_, which sums in float32: for out of rank 1, an axis in the middle
    or an int32 index (torch 2.x, ``index_add_cpu_out``)."""
    return ndim < 2 or axis % ndim not in (0, ndim - 1) or np.dtype(index_dtype) != np.int64


def torch_index_add_in_float32(torch, out, axis, index, source):
    """torch's ``index_add_`` on its float32-summing path: the axis moved to the front of a 2-D copy
    (rank 2, axis 0, int64 index), then moved back."""
    axis %= out.ndim
    front, source_front = np.moveaxis(out, axis, 0), np.moveaxis(source, axis, 0)
    rest = front.shape[1:]
    result = torch.tensor(front.reshape(front.shape[0], math.prod(rest))).index_add_(
        0, torch.tensor(np.asarray(index, np.int64)), torch.tensor(source_front.reshape(len(index), math.prod(rest))))
    return np.moveaxis(result.numpy().reshape(front.shape), 0, axis)


def assert_within_per_add_rounding(actual, expected, magnitude, count, what):
    """float16 sums that differ only by rounding ``count`` adds: at most ``count + 1`` half-steps of
    float16 at the size of the sum of |terms|."""
    bound = (count + 1) * np.finfo(np.float16).eps / 2 * magnitude + 2.0**-24
    error = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    assert (error <= bound).all(), f"{what}: {actual!r} vs {expected!r} (allowed {bound!r})"


@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=25)
@given(data=st.data(), add=index_add_cases(), scatter=scatter_add_cases(), dtype=numeric_dtypes,
       index_dtype=int_dtypes)
def test_index_add_and_scatter_add_equal_torch(target, data, add, scatter, dtype, index_dtype):
    torch = pytest.importorskip("torch", reason="the PyTorch references need torch (pip install -e '.[torch]')")

    def torch_result(method, out, axis, index, source, absolute=False):
        out, source = (np.abs(a.astype(np.float64)) if absolute else a for a in (out, source))
        return getattr(torch.tensor(out), method)(axis, torch.tensor(index), torch.tensor(source)).numpy()

    shape, axis, length = add
    out = data.draw(operands(shape, dtype, allow_broadcast=False), label="index_add out")
    index = data.draw(operands((length,), index_dtype, low=0, high=max(shape[axis] - 1, 0)), label="index_add index")
    source = data.draw(operands(tuple(length if d == axis % len(shape) else m for d, m in enumerate(shape)), dtype),
                       label="index_add source")
    operands_ = (out.numpy(), axis, index.numpy(), source.numpy())
    view, _ = out_on(target, out)
    get_kernel("index_add", target)(view, index.on(target), source.on(target), axis=axis)
    what = (f"index_add {dtype} out{shape} axis {axis} index {index.numpy().tolist()} {index_dtype} vs torch "
            f"on {target}")
    assert_bit_equal(to_host(view), torch_index_add_in_float32(torch, *operands_), what)
    if np.dtype(dtype) == np.float16 and torch_rounds_float16_per_add(len(shape), axis, index_dtype):
        assert_within_per_add_rounding(to_host(view), torch_result("index_add_", *operands_),
                                       torch_result("index_add_", *operands_, absolute=True), length, what)
    else:
        assert_bit_equal(to_host(view), torch_result("index_add_", *operands_), what)

    shape, axis, index_shape = scatter
    out = data.draw(operands(shape, dtype, allow_broadcast=False), label="scatter_add out")
    index = data.draw(operands(index_shape, np.int64, low=0, high=max(shape[axis] - 1, 0)),
                      label="scatter_add index")
    source = data.draw(operands(index_shape, dtype), label="scatter_add source")
    operands_ = (out.numpy(), axis, index.numpy(), source.numpy())
    view, _ = out_on(target, out)
    get_kernel("scatter_add", target)(view, index.on(target), source.on(target), axis=axis)
    assert_bit_equal(to_host(view), torch_result("scatter_add_", *operands_),
                     f"scatter_add {dtype} out{shape} axis {axis} index{index_shape} vs torch on {target}")


@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=15)
@given(data=st.data(), shape=shapes(min_dims=1, max_dims=3, max_side=3), length=st.integers(1, 64))
def test_long_float16_sums_equal_torch_and_the_float32_reference(target, data, shape, length):
    """Up to 64 terms per element, where rounding every add to float16 would be off in most elements."""
    torch = pytest.importorskip("torch", reason="the PyTorch references need torch (pip install -e '.[torch]')")
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    if not shape[axis]:
        return
    out = data.draw(operands(shape, np.float16, allow_broadcast=False), label="out")
    index = data.draw(operands((length,), np.int64, low=0, high=shape[axis] - 1), label="index")
    source = data.draw(operands(tuple(length if d == axis % len(shape) else m for d, m in enumerate(shape)),
                                np.float16), label="source")
    view, _ = out_on(target, out)
    get_kernel("index_add", target)(view, index.on(target), source.on(target), axis=axis)
    what = f"index_add float16 out{shape} axis {axis} {length} indices on {target}"
    assert_bit_equal(to_host(view), expected_index_add(out.numpy(), axis, index.numpy(), source.numpy()), what)
    assert_bit_equal(to_host(view), torch_index_add_in_float32(torch, out.numpy(), axis, index.numpy(),
                                                               source.numpy()), f"{what} vs torch")
    scatter_index = np.broadcast_to(np.expand_dims(index.numpy(), tuple(d for d in range(len(shape))
                                                                         if d != axis % len(shape))),
                                    source.numpy().shape)
    view, _ = out_on(target, out)
    get_kernel("scatter_add", target)(view, on(target, scatter_index), source.on(target), axis=axis)
    expected = torch.tensor(out.numpy()).scatter_add_(axis, torch.tensor(scatter_index),
                                                      torch.tensor(source.numpy())).numpy()
    what = f"scatter_add float16 out{shape} axis {axis} {length} indices on {target}"
    assert_bit_equal(to_host(view), expected, f"{what} vs torch")
    assert_bit_equal(to_host(view), expected_scatter_add(out.numpy(), axis, scatter_index, source.numpy()), what)


@pytest.mark.parametrize("target", TARGETS)
def test_float16_sums_are_rounded_once_not_per_add(target):
    """4096 ones into one float16 zero: 4096 (rounding every add stalls at 2048, where 2048 + 1 rounds back
    to 2048); 60000 + 10000 - 10000: 60000 (no inf on the way); a sum past 65504 ends as inf.  As torch."""
    torch = pytest.importorskip("torch", reason="the PyTorch references need torch (pip install -e '.[torch]')")
    ones = np.ones((2, 4096), np.float16)
    per_add = np.zeros((2, 3), np.float16)
    np.add.at(per_add, (slice(None), np.ones(4096, np.int64)), ones)
    assert per_add[0, 1] == 2048  # what rounding every add gives
    cases = [  # out, index along axis 1, source
        (np.zeros((2, 3), np.float16), np.ones(4096, np.int64), ones),
        (np.array([[60000, 1, 2]], np.float16), np.array([0, 0, 2]), np.array([[10000, -10000, 0.5]], np.float16)),
        (np.array([[60000, 1, 2]], np.float16), np.array([0, 1, 0]), np.array([[3000, 1, 3000]], np.float16)),
    ]
    wanted = [[[0, 4096, 0], [0, 4096, 0]], [[60000, 1, 2.5]], [[np.inf, 2, 2]]]
    for (out, index, source), values in zip(cases, wanted):
        scatter_index = np.broadcast_to(index, source.shape)
        for op, idx, method in (("index_add", index, "index_add_"), ("scatter_add", scatter_index, "scatter_add_")):
            expected = getattr(torch.tensor(out), method)(1, torch.tensor(idx), torch.tensor(source)).numpy()
            assert expected.tolist() == values, f"torch's {method} gives {expected.tolist()}"
            dev = on(target, out)
            get_kernel(op, target)(dev, on(target, idx), on(target, source), axis=1)
            assert_bit_equal(to_host(dev), expected, f"{op} float16 {values} on {target}")
            assert_bit_equal(to_host(dev), (expected_index_add(out, 1, index, source) if op == "index_add" else
                                            expected_scatter_add(out, 1, scatter_index, source)), f"{op} reference")


@pytest.mark.parametrize("dtype", [d for d in NUMERIC_DTYPES if d.kind in "iu"], ids=str)
def test_integers_wrap_around_on_both_targets(dtype):
    info = np.iinfo(dtype)
    out = np.array([[info.max, info.min, 0]], dtype)
    source = np.array([[1, info.max, info.min, info.max, -1 if info.min else 1]], dtype)
    index = np.array([0, 0, 1, 2, 1])
    expected = expected_index_add(out, 1, index, source)
    assert expected[0, 0] == dtype.type(info.max + 1 + info.max - (info.max - info.min + 1))  # wrapped
    scatter_index = index[None]
    expected_scatter = expected_scatter_add(out, 1, scatter_index, source)
    for target in TARGETS:
        dev = on(target, out)
        get_kernel("index_add", target)(dev, on(target, index), on(target, source), axis=1)
        assert_bit_equal(to_host(dev), expected, f"index_add {dtype} wrapping on {target}")
        dev = on(target, out)
        get_kernel("scatter_add", target)(dev, on(target, scatter_index), on(target, source), axis=-1)
        assert_bit_equal(to_host(dev), expected_scatter, f"scatter_add {dtype} wrapping on {target}")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_repeated_indices_add_in_index_order_on_both_targets_run_after_run(dtype):
    """Terms whose sum depends on the order: big + small - big + small is small in index order (small is
    lost against big in the accumulate dtype: float32 for float16), 2 * small in most others.  Every run on
    every target gives the reference's bits."""
    big, small = {np.float16: (2.0**15, 2.0**-10), np.float32: (2.0**25, 1.0), np.float64: (2.0**54, 1.0)}[dtype]
    terms = np.array([big, small, -big, small, 0.5], dtype)
    index = np.array([3, 3, 3, 3, 0], np.int32)
    source = np.tile(terms, (2, 1))
    out = np.zeros((2, 4), dtype)
    expected = expected_index_add(out, 1, index, source)
    assert expected[0, 3] == small and expected[0, 0] == 0.5
    for target in TARGETS:
        for run in range(2):
            dev = on(target, out)
            get_kernel("index_add", target)(dev, on(target, index), on(target, source), axis=1)
            assert_bit_equal(to_host(dev), expected, f"index_add run {run} on {target}")
            dev = on(target, out)
            get_kernel("scatter_add", target)(dev, on(target, np.tile(index, (2, 1))), on(target, source), axis=1)
            assert_bit_equal(to_host(dev), expected, f"scatter_add run {run} on {target}")


@pytest.mark.parametrize("target", TARGETS)
def test_empty_index_and_empty_slices_change_nothing(target):
    out = np.arange(6, dtype=np.float32).reshape(2, 3)
    dev = on(target, out)
    get_kernel("index_add", target)(dev, on(target, np.zeros(0, np.int64)), on(target, np.zeros((2, 0), np.float32)),
                                    axis=1)
    get_kernel("scatter_add", target)(dev, on(target, np.zeros((2, 0), np.int64)),
                                      on(target, np.zeros((2, 0), np.float32)), axis=1)
    get_kernel("scatter_add", target)(dev, on(target, np.zeros((0, 2), np.int64)),
                                      on(target, np.zeros((0, 2), np.float32)), axis=1)
    assert_bit_equal(to_host(dev), out, f"empty adds on {target}")
    empty = on(target, np.zeros((0, 3), np.int16))  # nothing off the axis: the indices are still checked
    get_kernel("index_add", target)(empty, on(target, np.array([2, 2])), on(target, np.zeros((0, 2), np.int16)),
                                    axis=1)
    with pytest.raises(IndexOutOfRangeError, match="index_add: index 3 is out of range for dimension 1 of size 3"):
        get_kernel("index_add", target)(empty, on(target, np.array([3])), on(target, np.zeros((0, 1), np.int16)),
                                        axis=1)
    assert to_host(empty).shape == (0, 3)


# --- bad indices: an error naming op, value, axis and size; out untouched ------------------


@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=15)
@given(data=st.data(), op=st.sampled_from(["index_add", "scatter_add"]), axis=st.integers(-2, 1),
       bad=st.integers(-4, -1) | st.integers(3, 6), index_dtype=int_dtypes)
def test_a_bad_index_raises_and_leaves_out_untouched(target, data, op, axis, bad, index_dtype):
    """[0, size) only: a negative index is out of range too (torch wraps none either)."""
    out = np.arange(9, dtype=np.float64).reshape(3, 3)
    if op == "index_add":
        index = np.array(data.draw(st.lists(st.integers(0, 2), min_size=4, max_size=4)), index_dtype)
        index[data.draw(st.integers(0, 3))] = bad
        source = np.ones((3, 4) if axis % 2 else (4, 3))
    else:
        index = np.array(data.draw(st.lists(st.integers(0, 2), min_size=4, max_size=4)), index_dtype).reshape(2, 2)
        index[data.draw(st.integers(0, 1)), data.draw(st.integers(0, 1))] = bad
        source = np.ones((2, 2))
    dev = on(target, out)
    message = rf"{op}: index {bad} is out of range for dimension {axis % 2} of size 3 \(valid: 0 to 2\)"
    with pytest.raises(IndexOutOfRangeError, match=message):
        get_kernel(op, target)(dev, on(target, index), on(target, source), axis=axis)
    assert_bit_equal(to_host(dev), out, f"{op} wrote before raising on {target}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["index_add", "scatter_add"])
def test_the_error_names_the_largest_bad_index(target, op):
    dev = on(target, np.zeros((2, 3), np.int32))
    index = np.array([-5, 4, 1, 9, -1])
    index, source = (index, np.ones((2, 5), np.int32)) if op == "index_add" else (index[None], np.ones((1, 5),
                                                                                                         np.int32))
    with pytest.raises(IndexOutOfRangeError, match=rf"{op}: index 9 is out of range for dimension 1 of size 3"):
        get_kernel(op, target)(dev, on(target, index), on(target, source), axis=1)
    negative = np.array([-5, -2, -1, -9, -3]).reshape(index.shape)
    with pytest.raises(IndexOutOfRangeError, match=rf"{op}: index -1 is out of range for dimension 1 of size 3"):
        get_kernel(op, target)(dev, on(target, negative), on(target, source), axis=1)
    assert (to_host(dev) == 0).all()


def test_unchecked_adds_on_cuda_skip_the_bad_entries():
    dev = on("cuda", np.zeros((2, 3), np.float32))
    get_kernel("index_add", "cuda")(dev, on("cuda", np.array([5, 1, -1, 1])), on("cuda", np.ones((2, 4), np.float32)),
                                    axis=1, check=False)
    assert to_host(dev).tolist() == [[0, 2, 0], [0, 2, 0]]
    dev = on("cuda", np.zeros((2, 3), np.float32))
    get_kernel("scatter_add", "cuda")(dev, on("cuda", np.array([[7, 2], [0, -3]])), on("cuda", np.ones((2, 2),
                                                                                                      np.float32)),
                                      axis=1, check=False)
    assert to_host(dev).tolist() == [[0, 0, 1], [1, 0, 0]]


# --- bad shapes, dtypes, axes ---------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_index_add_refuses_bad_shapes_dtypes_and_axes(target):
    out, run = on(target, np.zeros((2, 3), np.float32)), get_kernel("index_add", target)
    ones = on(target, np.ones((2, 2), np.float32))
    with pytest.raises(ShapeError, match=r"index_add: index must be 1-D, got shape \(1, 2\)"):
        run(out, on(target, np.zeros((1, 2), np.int64)), ones, axis=1)
    with pytest.raises(ShapeError, match=r"index_add: source has shape \(2, 2\), expected \(2, 3\)"):
        run(out, on(target, np.zeros(3, np.int64)), ones, axis=1)
    with pytest.raises(ShapeError, match=r"index_add: source has shape \(2, 2\), expected \(2, 3\) "
                                         r"\(out's shape \(2, 3\) with the 2 indices along axis 0\)"):
        run(out, on(target, np.zeros(2, np.int64)), ones, axis=0)
    with pytest.raises(DTypeError, match="index_add: source dtype float64 differs from out's float32"):
        run(out, on(target, np.zeros(2, np.int64)), on(target, np.ones((2, 2))), axis=1)
    with pytest.raises(DTypeError, match="index_add: indices must be int32 or int64, got bool"):
        run(out, on(target, np.zeros(2, bool)), ones, axis=1)
    with pytest.raises(DTypeError, match="index_add: indices must be int32 or int64, got float32"):
        run(out, on(target, np.zeros(2, np.float32)), ones, axis=1)
    with pytest.raises(DTypeError, match="index_add: unsupported dtype bool"):
        run(on(target, np.zeros((2, 3), bool)), on(target, np.zeros(2, np.int64)),
            on(target, np.ones((2, 2), bool)), axis=1)
    with pytest.raises(AxisError, match="index_add: axis -3 is out of range"):
        run(out, on(target, np.zeros(2, np.int64)), ones, axis=-3)
    with pytest.raises(ShapeError, match="index_add: the output is a broadcast view"):
        run(broadcast_view(on(target, np.zeros((1, 3), np.float32)), (2, 3)), on(target, np.zeros(2, np.int64)),
            ones, axis=1)


@pytest.mark.parametrize("target", TARGETS)
def test_scatter_add_refuses_bad_shapes_dtypes_and_axes(target):
    out, run = on(target, np.zeros((2, 3), np.float32)), get_kernel("scatter_add", target)
    ones = on(target, np.ones((2, 2), np.float32))
    with pytest.raises(ShapeError, match=r"scatter_add: index shape \(2,\) must have the rank of out, \(2, 3\)"):
        run(out, on(target, np.zeros(2, np.int64)), on(target, np.ones(2, np.float32)), axis=1)
    with pytest.raises(ShapeError, match=r"scatter_add: index shape \(3, 1\) .* no larger off axis 1"):
        run(out, on(target, np.zeros((3, 1), np.int64)), on(target, np.ones((3, 1), np.float32)), axis=1)
    with pytest.raises(ShapeError, match=r"scatter_add: source has shape \(2, 2\), expected index's \(2, 1\)"):
        run(out, on(target, np.zeros((2, 1), np.int64)), ones, axis=1)
    with pytest.raises(DTypeError, match="scatter_add: source dtype int32 differs from out's float32"):
        run(out, on(target, np.zeros((2, 2), np.int64)), on(target, np.ones((2, 2), np.int32)), axis=1)
    with pytest.raises(DTypeError, match="scatter_add: indices must be int32 or int64, got uint8"):
        run(out, on(target, np.zeros((2, 2), np.uint8)), ones, axis=1)
    with pytest.raises(DTypeError, match="scatter_add: unsupported dtype bool"):
        run(on(target, np.zeros((2, 3), bool)), on(target, np.zeros((2, 2), np.int64)),
            on(target, np.ones((2, 2), bool)), axis=1)
    with pytest.raises(AxisError, match="scatter_add: axis 2 is out of range"):
        run(out, on(target, np.zeros((2, 2), np.int64)), ones, axis=2)
    with pytest.raises(ShapeError, match="scatter_add: the output is a broadcast view"):
        run(broadcast_view(on(target, np.zeros((2, 1), np.float32)), (2, 3)), on(target, np.zeros((2, 2), np.int64)),
            ones, axis=1)
    if target == "cpu":  # an object array never reaches a kernel
        objects = np.array([[1, None]], dtype=object)
        with pytest.raises(DTypeError, match="scatter_add: unsupported dtype object"):
            run(objects, np.zeros((1, 1), np.int64), objects[:, :1], axis=1)


def test_cuda_adds_refuse_host_arrays():
    dev, host = cuda.to_device(np.zeros((2, 3), np.float32)), np.zeros(2, np.int64)
    with pytest.raises(DTypeError, match=r"index_add \(cuda\): expected device arrays"):
        get_kernel("index_add", "cuda")(dev, host, cuda.to_device(np.ones((2, 2), np.float32)), axis=1)
    with pytest.raises(DTypeError, match=r"scatter_add \(cuda\): expected device arrays"):
        get_kernel("scatter_add", "cuda")(dev, cuda.to_device(np.zeros((2, 2), np.int64)),
                                          np.ones((2, 2), np.float32), axis=1)
