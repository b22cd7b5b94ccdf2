"""cumsum equals numpy's np.cumsum on both targets: every dtype, axis and layout, rows longer than a block.

Integers exactly; floats up to the rounding of a different order of additions
(numpy adds left to right, the kernel in a tree), bounded like the float sums in
``test_reduce.py``.  0-d and zero-size shapes, strided outputs, and the refusals.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyflow.errors import AxisError, DTypeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.registry import get_kernel
from pyflow.kernels.scan import cumsum_result_dtype
from tests.strategies import TARGETS, all_dtypes, assert_close, empty_on, operands, shapes, to_host


def on(target, array):
    return array if target == "cpu" else cuda.to_device(array)


def assert_cumsum(actual, x, axis, what):
    """Exact for integers; for floats within 2 * width * eps * (running sum of |x|) of the exact sums."""
    dtype = cumsum_result_dtype(x.dtype)
    assert actual.dtype == dtype and actual.shape == x.shape, what
    if dtype.kind != "f":
        assert_close(actual, np.cumsum(x, axis=axis, dtype=np.int64), what=what)
        return
    exact = np.cumsum(x.astype(np.float64), axis=axis)
    bound = 2 * max(x.shape[axis], 1) * np.finfo(dtype).eps * np.cumsum(np.abs(x.astype(np.float64)), axis=axis)
    ok = np.abs(actual - exact) <= bound + np.finfo(dtype).tiny
    assert ok.all(), f"{what}: {actual[~ok]} != {exact[~ok]}"


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), shape=shapes(min_dims=1), dtype=all_dtypes)
def test_cumsum_equals_numpy(target, data, shape, dtype):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    x = data.draw(operands(shape, dtype), label="x")
    out = empty_on(target, shape, cumsum_result_dtype(dtype))
    get_kernel("cumsum", target)(out, x.on(target), axis=axis)
    assert_cumsum(to_host(out), x.numpy(), axis, f"cumsum {dtype}{shape} {x.layout} axis={axis} on {target}")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), width=st.integers(33, 100), rows=st.integers(1, 3), dtype=st.sampled_from(["int8", "float32"]))
def test_rows_longer_than_a_block_carry_their_total_across_chunks(target, data, width, rows, dtype):
    x = data.draw(operands((width, rows), np.dtype(dtype), allow_broadcast=False), label="x")
    out = empty_on(target, (width, rows), cumsum_result_dtype(dtype))
    get_kernel("cumsum", target)(out, x.on(target), axis=0)
    assert_cumsum(to_host(out), x.numpy(), 0, f"cumsum of {width} {dtype} along axis 0 on {target}")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), shape=shapes(min_dims=2, min_side=1, max_side=4))
def test_output_may_be_a_strided_view(target, data, shape):
    x = data.draw(operands(shape, np.dtype(np.int32)), label="x")
    out = data.draw(operands(shape, np.dtype(np.int64), allow_broadcast=False), label="out")
    view = out.view(out.base.copy() if target == "cpu" else cuda.to_device(out.base))
    get_kernel("cumsum", target)(view, x.on(target), axis=1)
    assert_close(to_host(view), np.cumsum(x.numpy(), axis=1), what=f"cumsum into a {out.layout} output")


@pytest.mark.parametrize("target", TARGETS)
def test_float16_adds_up_in_float32(target):
    """3000 ones: a float16 running sum stops at 2048; the float32 one reaches 3000 (a float16 too)."""
    x = np.ones(3000, np.float16)
    out = empty_on(target, x.shape, np.float16)
    get_kernel("cumsum", target)(out, on(target, x), axis=0)
    assert to_host(out)[-1] == 3000 and (to_host(out) == np.arange(1, 3001).astype(np.float16)).all()


@pytest.mark.parametrize("target", TARGETS)
def test_bad_arguments_are_refused_before_any_launch(target):
    run = get_kernel("cumsum", target)
    with pytest.raises(AxisError, match="cumsum: axis 0 is out of range for a 0-d tensor"):
        run(empty_on(target, (), np.int64), empty_on(target, (), np.int64), axis=0)
    with pytest.raises(AxisError, match="cumsum: axis 2 is out of range for a tensor of rank 2"):
        run(empty_on(target, (2, 3), np.int64), empty_on(target, (2, 3), np.int64), axis=2)
    with pytest.raises(DTypeError, match="cumsum: output dtype is int32, expected int64"):
        run(empty_on(target, (3,), np.int32), empty_on(target, (3,), np.int32), axis=0)
    with pytest.raises(ShapeError, match=r"cumsum: output has shape \(2,\), expected \(3,\)"):
        run(empty_on(target, (2,), np.float32), empty_on(target, (3,), np.float32), axis=0)
    with pytest.raises(DTypeError, match="cumsum: unsupported dtype complex64"):
        run(empty_on(target, (3,), np.complex64), empty_on(target, (3,), np.complex64), axis=0)
    if target == "cpu":
        with pytest.raises(DTypeError, match="cumsum: unsupported dtype object"):
            run(np.empty(2, object), np.array([1, 2], object), axis=0)
