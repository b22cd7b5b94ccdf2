"""dim_gather (torch.gather, np.take_along_axis) and index_copy (torch's index_copy_) on both targets.

Every dtype and layout (the index's too), indices smaller than x off the axis,
zero-size shapes; out-of-range indices (negative ones too) raise naming op, value,
axis and size, and index_copy then leaves ``out`` untouched; repeated indices.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyflow.errors import AxisError, DTypeError, IndexOutOfRangeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.registry import get_kernel
from tests.strategies import TARGETS, all_dtypes, assert_close, empty_on, int_dtypes, operands, shapes, to_host


def on(target, array):
    array = np.array(array, order="C")
    return array if target == "cpu" else cuda.to_device(array)


@st.composite
def gather_case(draw):
    """(x shape, axis, index shape): index no larger than x off the axis, any length along it."""
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=4))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    index_shape = [draw(st.integers(0, n)) for n in shape]
    index_shape[axis] = draw(st.integers(0, 4)) if shape[axis] else 0  # an empty axis admits no index
    return shape, axis, tuple(index_shape)


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), case=gather_case(), dtype=all_dtypes, index_dtype=int_dtypes)
def test_dim_gather_equals_take_along_axis(target, data, case, dtype, index_dtype):
    shape, axis, index_shape = case
    x = data.draw(operands(shape, dtype), label="x")
    n = shape[axis]
    index = data.draw(operands(index_shape, index_dtype, low=0, high=max(n - 1, 0)), label="index")
    part = x.numpy()[tuple(slice(None) if d == axis % len(shape) else slice(0, m) for d, m in enumerate(index_shape))]
    expected = np.take_along_axis(part, index.numpy(), axis=axis)
    out = empty_on(target, index_shape, dtype)
    get_kernel("dim_gather", target)(out, x.on(target), index.on(target), axis=axis)
    assert_close(to_host(out), expected, what=f"dim_gather {shape} {x.layout} axis {axis} by {index_shape} "
                                              f"{index.layout}")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), bad=st.integers(3, 6) | st.integers(-4, -1), axis=st.integers(-2, 1))
def test_dim_gather_index_out_of_range_raises(target, data, bad, axis):
    """[0, size) only: a negative index is out of range too (torch.gather does not wrap)."""
    x = np.zeros((3, 3), np.float32)
    index = np.array(data.draw(st.lists(st.integers(0, 2), min_size=4, max_size=4))).reshape(2, 2)
    index[data.draw(st.integers(0, 1)), data.draw(st.integers(0, 1))] = bad
    message = rf"dim_gather: index {bad} is out of range for dimension {axis % 2} of size 3 \(valid: 0 to 2\)"
    with pytest.raises(IndexOutOfRangeError, match=message):
        get_kernel("dim_gather", target)(empty_on(target, (2, 2), np.float32), on(target, x), on(target, index),
                                         axis=axis)


@pytest.mark.parametrize("target", TARGETS)
def test_dim_gather_refuses_bad_shapes_dtypes_and_axes(target):
    x, run = on(target, np.zeros((2, 3), np.float32)), get_kernel("dim_gather", target)
    with pytest.raises(ShapeError, match=r"dim_gather: index shape \(3, 1\) must have the rank of x"):
        run(empty_on(target, (3, 1), np.float32), x, on(target, np.zeros((3, 1), np.int64)), axis=1)
    with pytest.raises(ShapeError, match="dim_gather: index shape"):
        run(empty_on(target, (2,), np.float32), x, on(target, np.zeros(2, np.int64)), axis=1)
    with pytest.raises(DTypeError, match="dim_gather: indices must be int32 or int64, got float32"):
        run(empty_on(target, (2, 1), np.float32), x, on(target, np.zeros((2, 1), np.float32)), axis=1)
    with pytest.raises(ShapeError, match=r"dim_gather: output has shape \(1, 2\), expected \(2, 1\)"):
        run(empty_on(target, (1, 2), np.float32), x, on(target, np.zeros((2, 1), np.int64)), axis=1)
    with pytest.raises(DTypeError, match="dim_gather: output dtype is float64, expected float32"):
        run(empty_on(target, (2, 1), np.float64), x, on(target, np.zeros((2, 1), np.int64)), axis=1)
    with pytest.raises(AxisError, match="dim_gather: axis 2 is out of range"):
        run(empty_on(target, (2, 1), np.float32), x, on(target, np.zeros((2, 1), np.int64)), axis=2)
    if target == "cpu":  # an object array never reaches a kernel
        objects = np.array([[1, None]], dtype=object)
        with pytest.raises(DTypeError, match="dim_gather: unsupported dtype object"):
            run(np.empty((1, 1), object), objects, np.zeros((1, 1), np.int64), axis=1)
        with pytest.raises(DTypeError, match="index_copy: unsupported dtype object"):
            get_kernel("index_copy", "cpu")(objects, np.zeros(1, np.int64), objects[:, :1], axis=1)


@st.composite
def copy_case(draw):
    """(out shape, axis, distinct indices)."""
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=4))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[axis]
    order = draw(st.permutations(range(n)))
    return shape, axis, list(order[:draw(st.integers(0, n))])


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), case=copy_case(), dtype=all_dtypes, index_dtype=int_dtypes)
def test_index_copy_writes_the_indexed_slices_and_nothing_else(target, data, case, dtype, index_dtype):
    shape, axis, chosen = case
    out = data.draw(operands(shape, dtype, allow_broadcast=False), label="out")
    source_shape = tuple(len(chosen) if d == axis % len(shape) else n for d, n in enumerate(shape))
    source = data.draw(operands(source_shape, dtype), label="source")
    index = np.array(chosen, index_dtype)
    expected = out.numpy()
    expected[(slice(None),) * (axis % len(shape)) + (index,)] = source.numpy()
    target_out = out.view(out.base.copy() if target == "cpu" else cuda.to_device(out.base))
    get_kernel("index_copy", target)(target_out, on(target, index), source.on(target), axis=axis)
    assert_close(to_host(target_out), expected, what=f"index_copy {shape} {out.layout} axis {axis} at {chosen}")


@pytest.mark.parametrize("target", TARGETS)
def test_index_copy_with_a_repeated_index_writes_one_of_the_slices(target):
    out = np.zeros((3, 4), np.int32)
    source = np.arange(1, 13, dtype=np.int32).reshape(3, 4)
    dev = on(target, out)
    get_kernel("index_copy", target)(dev, on(target, np.array([2, 0, 2])), on(target, source), axis=0)
    result = to_host(dev)
    assert (result[0] == source[1]).all() and (result[1] == 0).all()
    assert all((result[2, j] in (source[0, j], source[2, j])) for j in range(4))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("bad", [-1, 3, 7])
def test_index_copy_with_a_bad_index_raises_and_writes_nothing(target, bad):
    out = np.arange(6, dtype=np.float32).reshape(2, 3)
    dev = on(target, out)
    with pytest.raises(IndexOutOfRangeError, match=rf"index_copy: index {bad} is out of range for dimension 1 "
                                                   r"of size 3 \(valid: 0 to 2\)"):
        get_kernel("index_copy", target)(dev, on(target, np.array([0, bad])), on(target, np.ones((2, 2), np.float32)),
                                         axis=-1)
    assert (to_host(dev) == out).all()


def test_unchecked_index_copy_on_cuda_skips_the_bad_slices():
    dev = on("cuda", np.zeros((2, 3), np.float32))
    get_kernel("index_copy", "cuda")(dev, on("cuda", np.array([5, 1])), on("cuda", np.ones((2, 2), np.float32)),
                                     axis=1, check=False)
    assert to_host(dev).tolist() == [[0, 1, 0], [0, 1, 0]]


@pytest.mark.parametrize("target", TARGETS)
def test_index_copy_refuses_bad_shapes_and_dtypes(target):
    out, run = on(target, np.zeros((2, 3), np.float32)), get_kernel("index_copy", target)
    ones = on(target, np.ones((2, 2), np.float32))
    with pytest.raises(ShapeError, match=r"index_copy: index must be 1-D, got shape \(1, 2\)"):
        run(out, on(target, np.zeros((1, 2), np.int64)), ones, axis=1)
    with pytest.raises(ShapeError, match=r"index_copy: source has shape \(2, 2\), expected \(2, 3\)"):
        run(out, on(target, np.zeros(3, np.int64)), ones, axis=1)
    with pytest.raises(DTypeError, match="index_copy: source dtype float64 differs from out's float32"):
        run(out, on(target, np.zeros(2, np.int64)), on(target, np.ones((2, 2))), axis=1)
    with pytest.raises(DTypeError, match="index_copy: indices must be int32 or int64, got bool"):
        run(out, on(target, np.zeros(2, bool)), ones, axis=1)
    with pytest.raises(AxisError, match="index_copy: axis -3 is out of range"):
        run(out, on(target, np.zeros(2, np.int64)), ones, axis=-3)
