"""topk gives torch.topk's values and indices, made exact: both targets agree bit for bit.

The reference is written here, independently of both kernels: Python's sort of
each row by (NaN first or last, value, index).  Ties, NaN, signed zeros, every
dtype and layout, rows longer than a block, k from 0 to the axis size; and the
refusals (bad k, k above the CUDA kernel's limit, wrong outputs, bad axis).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyflow.errors import AxisError, DTypeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.registry import get_kernel
from pyflow.kernels.sort import MAX_TOPK
from tests.strategies import TARGETS, all_dtypes, empty_on, operands, shapes, to_host


def on(target, array):
    return array if target == "cpu" else cuda.to_device(array)


def reference_topk(x, k, axis, largest):
    """(values, indices) by sorting each row with Python: NaN is larger than every number,
    ties go in index order."""
    moved = np.moveaxis(x, axis, -1)
    rows = moved.reshape(-1, moved.shape[-1]) if moved.size else np.zeros((0, moved.shape[-1]), x.dtype)
    order = []
    for row in rows:
        def key(j):
            v = row[j]
            nan = bool(v != v)
            if largest:
                return (0 if nan else 1, 0.0 if nan else -float(v), j)
            return (1 if nan else 0, 0.0 if nan else float(v), j)
        order.append(sorted(range(len(row)), key=key)[:k])
    indices = np.array(order, np.int64).reshape(moved.shape[:-1] + (k,))
    indices = np.moveaxis(indices, -1, axis)
    return np.take_along_axis(x, indices, axis=axis), indices


def run_topk(target, x, k, axis, largest):
    shape = tuple(k if d == axis % x.ndim else n for d, n in enumerate(x.shape))
    values, indices = empty_on(target, shape, x.dtype), empty_on(target, shape, np.int64)
    get_kernel("topk", target)(values, indices, x if target == "cpu" else x, k=k, axis=axis, largest=largest)
    return to_host(values), to_host(indices)


def assert_same(actual, expected, what):
    (values, indices), (ref_values, ref_indices) = actual, expected
    np.testing.assert_array_equal(indices, ref_indices, err_msg=f"{what}: indices")
    np.testing.assert_array_equal(values, ref_values, err_msg=f"{what}: values")  # NaN equals NaN here
    if values.dtype.kind == "f":
        assert (np.signbit(values) == np.signbit(ref_values)).all(), f"{what}: the sign of a zero"


@st.composite
def tied_operands(draw, shape, dtype):
    """Few distinct values (many ties), and for floats NaN, -0.0 and 0.0 among them."""
    x = draw(operands(shape, dtype, low=-2, high=2))
    if dtype.kind == "f" and x.base.size:
        flat = x.base.reshape(-1)
        for value in (np.nan, -0.0, 0.0, np.nan):
            flat[draw(st.integers(0, flat.size - 1))] = value
    return x


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), shape=shapes(min_dims=1, max_dims=3, max_side=6), dtype=all_dtypes, largest=st.booleans())
def test_topk_equals_a_stable_sort_with_nan_largest(target, data, shape, dtype, largest):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    k = data.draw(st.integers(0, shape[axis]), label="k")
    x = data.draw(tied_operands(shape, dtype), label="x")
    actual = run_topk(target, x.on(target), k, axis, largest)
    what = f"topk k={k} axis={axis} largest={largest} of {dtype}{shape} {x.layout} on {target}"
    assert_same(actual, reference_topk(x.numpy(), k, axis, largest), what)


@pytest.mark.parametrize("largest", [True, False])
@given(data=st.data(), width=st.integers(33, 90), dtype=st.sampled_from(["float32", "int16", "bool"]))
def test_rows_longer_than_a_block_give_the_same_answer_on_both_targets(largest, data, width, dtype):
    """Each thread keeps its own top k; the block merges them: equal to the CPU twin bit for bit."""
    x = data.draw(tied_operands((2, width), np.dtype(dtype)), label="x").numpy()
    k = data.draw(st.integers(1, min(width, MAX_TOPK)), label="k")
    cpu, gpu = run_topk("cpu", x, k, 1, largest), run_topk("cuda", cuda.to_device(x), k, 1, largest)
    assert_same(gpu, cpu, f"topk k={k} of {width} {dtype} largest={largest}")
    assert_same(cpu, reference_topk(x, k, 1, largest), "cpu twin vs reference")


@pytest.mark.parametrize("target", TARGETS)
def test_nan_and_signed_zeros_are_ordered_like_torch(target):
    x = np.array([0.0, np.nan, -0.0, 1.0, np.nan, 0.0, -1.0], np.float32)
    values, indices = run_topk(target, on(target, x), 7, 0, True)
    assert indices.tolist() == [1, 4, 3, 0, 2, 5, 6]
    assert np.signbit(values[4]) and not np.signbit(values[3])
    values, indices = run_topk(target, on(target, x), 3, 0, False)
    assert indices.tolist() == [6, 0, 2]


def test_the_cpu_twin_takes_any_k_and_cuda_refuses_k_above_its_limit():
    x = np.arange(MAX_TOPK + 6, dtype=np.float32)[::-1].copy()
    values, indices = run_topk("cpu", x, MAX_TOPK + 5, 0, True)
    assert indices.tolist() == list(range(MAX_TOPK + 5))
    k = MAX_TOPK + 1
    with pytest.raises(ShapeError, match=rf"topk \(cuda\): k={k} is more than the {MAX_TOPK} the CUDA kernel"):
        run_topk("cuda", cuda.to_device(x), k, 0, True)


@pytest.mark.parametrize("target", TARGETS)
def test_bad_k_axis_and_outputs_are_refused(target):
    x = on(target, np.zeros((2, 3), np.float32))
    run = get_kernel("topk", target)
    values, indices = empty_on(target, (2, 2), np.float32), empty_on(target, (2, 2), np.int64)
    for k in (4, -1, 1.5, True):
        with pytest.raises(ShapeError, match=r"topk: k must be an int from 0 to 3 \(the size of axis 1"):
            run(values, indices, x, k=k)
    with pytest.raises(AxisError, match="topk: axis 2 is out of range"):
        run(values, indices, x, k=1, axis=2)
    with pytest.raises(AxisError, match="topk: axis 0 is out of range for a 0-d tensor"):
        run(empty_on(target, (), np.float32), empty_on(target, (), np.int64), on(target, np.float32(1)), k=1, axis=0)
    with pytest.raises(ShapeError, match=r"topk: values has shape \(2, 2\), expected \(2, 1\)"):
        run(values, indices, x, k=1)
    with pytest.raises(DTypeError, match="topk: indices dtype is int32, expected int64"):
        run(values, empty_on(target, (2, 2), np.int32), x, k=2)
    with pytest.raises(DTypeError, match="topk: values dtype is float64, expected float32"):
        run(empty_on(target, (2, 2), np.float64), indices, x, k=2)
    with pytest.raises(DTypeError, match="topk: unsupported dtype complex64"):
        run(values, indices, on(target, np.zeros((2, 3), np.complex64)), k=2)


def test_k_zero_and_empty_rows_launch_nothing():
    for shape, k in (((3, 4), 0), ((0, 4), 2), ((4, 0), 0)):
        x = np.zeros(shape, np.float32)
        for target in TARGETS:
            values, indices = run_topk(target, on(target, x), k, 1, True)
            assert values.shape == indices.shape == (shape[0], k) and math.prod(values.shape) == 0
