"""Movement ops (slice, concat, split, add_n, permute, transpose, gather, index_select) equal numpy.

Both targets, every layout (``operands``), 0-d and zero-size shapes, negative
axes and indices, all nine dtypes of ``kernels/dtypes.py``; bad arguments raise
where numpy raises, naming the op.  (dim_gather and index_copy: ``test_indexing.py``.)
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import pyflow as flow
import pyflow.kernels.movement  # noqa: F401  (registers the movement kernels)
from pyflow.errors import AxisError, DTypeError, IndexOutOfRangeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.elementwise import binary_result_dtype
from pyflow.kernels.registry import get_kernel
from tests.strategies import (TARGETS, all_dtypes, assert_close, dtypes, empty_on, int_dtypes, numeric_dtypes,
                              operands, shapes, to_host)

any_dtypes = all_dtypes


def on(target, array):
    """A contiguous host array moved to ``target``."""
    array = np.array(array, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
    return array if target == "cpu" else cuda.to_device(array)


def fancy(x, index, axis):
    """numpy's ``x[:, ..., index]``: checks every index, even when the result is empty.

    numpy 2.0-2.2 only warn there ("Out of bound index found. This was previously
    ignored when the indexing result contained no elements. In the future the
    index error will be raised."); 2.3 raises.  The warning counts as the error.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        try:
            return x[(slice(None),) * axis + (index,)]
        except DeprecationWarning as warning:
            raise IndexError(str(warning)) from None


@st.composite
def shape_and_axis(draw, min_dims=1, max_dims=3, max_side=4):
    shape = draw(shapes(min_dims=min_dims, max_dims=max_dims, max_side=max_side))
    return shape, draw(st.integers(-len(shape), len(shape) - 1))


@st.composite
def basic_slices(draw, shape):
    """starts, stops (ints beyond the ends, negative, or None) and steps 1..3, one per axis."""
    bound = st.none() | st.integers(-max(shape, default=0) - 2, max(shape, default=0) + 2)
    return (tuple(draw(bound) for _ in shape), tuple(draw(bound) for _ in shape),
            tuple(draw(st.integers(1, 3)) for _ in shape))


@st.composite
def parts(draw, total, max_parts=3):
    """Sizes (zeros included) adding up to ``total``."""
    k = draw(st.integers(1, max_parts))
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=k - 1, max_size=k - 1)))
    return [b - a for a, b in zip([0] + cuts, cuts + [total])]


def index_operand(shape, dtype, size):
    """An index array of ``shape`` with valid values in ``[-size, size)`` and a random layout."""
    return operands(shape, dtype, low=-size, high=max(size - 1, -size))


# --- each op equals numpy ----------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), shape=shapes(), dtype=any_dtypes)
def test_slice_copies_numpys_basic_slice(target, data, shape, dtype):
    x = data.draw(operands(shape, dtype), label="x")
    starts, stops, steps = data.draw(basic_slices(shape), label="starts, stops, steps")
    expected = np.asarray(x.numpy()[tuple(map(slice, starts, stops, steps))])
    out = empty_on(target, expected.shape, dtype)
    get_kernel("slice", target)(out, x.on(target), starts=starts, stops=stops, steps=steps)
    assert_close(to_host(out), expected, what=f"slice {shape} {x.layout} [{starts}:{stops}:{steps}]")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), case=shape_and_axis(), sizes=st.lists(st.integers(0, 3), min_size=1, max_size=3),
       dtype=any_dtypes)
def test_concat_equals_numpy_concatenate(target, data, case, sizes, dtype):
    shape, axis = case
    pieces = [data.draw(operands(shape[:axis % len(shape)] + (k,) + shape[axis % len(shape) + 1:], dtype),
                        label=f"input {i}") for i, k in enumerate(sizes)]
    expected = np.concatenate([p.numpy() for p in pieces], axis=axis)
    out = empty_on(target, expected.shape, dtype)
    get_kernel("concat", target)(out, [p.on(target) for p in pieces], axis=axis)
    assert_close(to_host(out), expected, what=f"concat axis {axis} of {[p.layout for p in pieces]}")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), case=shape_and_axis(), dtype=any_dtypes)
def test_split_equals_numpy_split_at_the_output_sizes(target, data, case, dtype):
    shape, axis = case
    x = data.draw(operands(shape, dtype), label="x")
    sizes = data.draw(parts(shape[axis]), label="sizes")
    expected = np.split(x.numpy(), np.cumsum(sizes)[:-1], axis=axis)
    outs = [empty_on(target, e.shape, dtype) for e in expected]
    get_kernel("split", target)(outs, x.on(target), axis=axis)
    for i, (o, e) in enumerate(zip(outs, expected)):
        assert_close(to_host(o), e, what=f"split {shape} {x.layout} axis {axis} sizes {sizes}: part {i}")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), shape=shapes(), kinds=st.lists(numeric_dtypes, min_size=1, max_size=4))
def test_add_n_sums_in_numpys_result_dtype(target, data, shape, kinds):
    xs = [data.draw(operands(shape, d), label=f"input {i}") for i, d in enumerate(kinds)]
    dtype = functools.reduce(lambda a, b: binary_result_dtype("add", a, b), kinds)
    expected = functools.reduce(np.add, [x.numpy().astype(dtype) for x in xs])
    out = empty_on(target, shape, dtype)
    get_kernel("add_n", target)(out, [x.on(target) for x in xs])
    assert_close(to_host(out), expected, what=f"add_n of {[str(k) for k in kinds]} {shape}")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), shape=shapes(), dtype=any_dtypes)
def test_permute_equals_numpy_transpose(target, data, shape, dtype):
    x = data.draw(operands(shape, dtype), label="x")
    perm = data.draw(st.permutations(range(len(shape))), label="perm")
    perm = tuple(p - len(shape) if data.draw(st.booleans(), label="negative") else p for p in perm)
    expected = np.transpose(x.numpy(), perm)
    out = empty_on(target, expected.shape, dtype)
    get_kernel("permute", target)(out, x.on(target), perm=perm)
    assert_close(to_host(out), expected, what=f"permute {shape} {x.layout} by {perm}")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), case=shape_and_axis(), dtype=any_dtypes)
def test_transpose_swaps_two_axes_like_numpy_swapaxes(target, data, case, dtype):
    shape, dim0 = case
    dim1 = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim1")
    x = data.draw(operands(shape, dtype), label="x")
    expected = np.swapaxes(x.numpy(), dim0, dim1)
    out = empty_on(target, expected.shape, dtype)
    get_kernel("transpose", target)(out, x.on(target), dim0=dim0, dim1=dim1)
    assert_close(to_host(out), expected, what=f"transpose {shape} {x.layout} ({dim0}, {dim1})")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), table_shape=shapes(min_dims=1, max_side=4), index_shape=shapes(max_dims=2, max_side=3),
       dtype=any_dtypes, index_dtype=int_dtypes)
def test_gather_equals_numpy_indexing_along_axis_0(target, data, table_shape, index_shape, dtype, index_dtype):
    n = table_shape[0]
    if n == 0:
        index_shape = (0,)  # an empty table admits no index
    table = data.draw(operands(table_shape, dtype), label="table")
    index = data.draw(index_operand(index_shape, index_dtype, n), label="indices")
    expected = table.numpy()[index.numpy()]
    out = empty_on(target, expected.shape, dtype)
    get_kernel("gather", target)(out, table.on(target), index.on(target))
    assert_close(to_host(out), expected, what=f"gather {table_shape} {table.layout} by "
                                              f"{index_dtype}{index_shape} {index.layout}")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), case=shape_and_axis(), length=st.integers(0, 4), dtype=any_dtypes,
       index_dtype=int_dtypes)
def test_index_select_equals_numpy_take(target, data, case, length, dtype, index_dtype):
    shape, axis = case
    n = shape[axis]
    x = data.draw(operands(shape, dtype), label="x")
    index = data.draw(index_operand((length if n else 0,), index_dtype, n), label="index")
    expected = np.take(x.numpy(), index.numpy(), axis=axis)
    out = empty_on(target, expected.shape, dtype)
    get_kernel("index_select", target)(out, x.on(target), index.on(target), axis=axis)
    assert_close(to_host(out), expected, what=f"index_select {shape} {x.layout} axis {axis} "
                                              f"by {index.numpy()} ({index.layout})")


def _strided_out(target, out):
    """``out`` (an ``Operand``) as a view of a copy of its base on ``target``."""
    return out.view(out.base.copy() if target == "cpu" else cuda.to_device(out.base))


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), case=shape_and_axis(min_dims=2), dtype=dtypes)
def test_concat_writes_through_a_strided_output_view(target, data, case, dtype):
    shape, axis = case
    halves = [data.draw(operands(shape, dtype), label=f"input {i}") for i in range(2)]
    expected = np.concatenate([h.numpy() for h in halves], axis=axis)
    out = _strided_out(target, data.draw(operands(expected.shape, dtype, allow_broadcast=False), label="out"))
    get_kernel("concat", target)(out, [h.on(target) for h in halves], axis=axis)
    assert_close(to_host(out), expected, what=f"concat into a strided output, axis {axis}")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), table_shape=shapes(min_dims=2, min_side=1, max_side=4), dtype=dtypes)
def test_gather_writes_through_a_strided_output_view(target, data, table_shape, dtype):
    table = data.draw(operands(table_shape, dtype), label="table")
    index = data.draw(index_operand((2,), np.dtype(np.int64), table_shape[0]), label="indices")
    expected = table.numpy()[index.numpy()]
    out = _strided_out(target, data.draw(operands(expected.shape, dtype, allow_broadcast=False), label="out"))
    get_kernel("gather", target)(out, table.on(target), index.on(target))
    assert_close(to_host(out), expected, what="gather into a strided output")


# --- indices out of range ------------------------------------------------------------------


@st.composite
def bad_take(draw, op):
    """(shape, axis, index, bad): one index ``bad`` outside ``[-n, n)`` (all, if n = 0); empty outputs too."""
    shape, axis = draw(shape_and_axis(max_side=3))
    axis = 0 if op == "gather" else axis
    n = shape[axis]
    index_shape = draw(shapes(min_dims=1, max_dims=2 if op == "gather" else 1, min_side=1, max_side=3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bad = draw(st.integers(n, n + 3) | st.integers(-n - 3, -n - 1))
    index = rng.integers(-n, n, index_shape) if n else np.full(index_shape, bad)  # n = 0: all bad
    index.reshape(-1)[draw(st.integers(0, index.size - 1))] = bad
    return shape, axis, index.astype(draw(int_dtypes)), bad


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["gather", "index_select"])
@given(data=st.data())
def test_an_index_out_of_range_raises_where_numpy_raises(target, op, data):
    """numpy's ``x[:, ..., index]`` raises IndexError (np.take skips indices when the output is empty)."""
    shape, axis, index, bad = data.draw(bad_take(op), label="shape, axis, index, bad")
    x = np.zeros(shape, np.float32)
    with pytest.raises(IndexError):
        fancy(x, index, axis % len(shape))
    out_shape = shape[:axis % len(shape)] + index.shape + shape[axis % len(shape) + 1:]
    out = empty_on(target, out_shape, np.float32)
    kwargs = {} if op == "gather" else {"axis": axis}
    message = rf"{op}: index {bad} is out of range for dimension {axis % len(shape)} of size {shape[axis]}"
    with pytest.raises(IndexOutOfRangeError, match=message):
        get_kernel(op, target)(out, on(target, x), on(target, index), **kwargs)


@pytest.mark.parametrize("target", TARGETS)
def test_a_bad_index_raises_even_when_an_axis_before_it_is_empty(target):
    """np.take skips its check when an axis before the indexed one is empty (every numpy version):
    the twin checks the indices itself."""
    x, index = np.zeros((0, 3), np.float32), np.array([1, 5])
    with pytest.raises(IndexError):
        fancy(x, index, 1)
    with pytest.raises(IndexOutOfRangeError, match="index_select: index 5 is out of range for dimension 1 of size 3"):
        get_kernel("index_select", target)(empty_on(target, (0, 2), np.float32), on(target, x), on(target, index),
                                           axis=1)


@pytest.mark.parametrize("target", TARGETS)
def test_several_bad_indices_report_the_largest(target):
    table, index = np.zeros((3, 2), np.float32), np.array([[-7, 1], [9, 4]], np.int32)
    with pytest.raises(IndexOutOfRangeError, match=r"index 9 is out of range for dimension 0 of size 3 "
                                                   r"\(valid: -3 to 2\)"):
        get_kernel("gather", target)(empty_on(target, (2, 2, 2), np.float32), on(target, table), on(target, index))


def test_unchecked_gather_skips_bad_indices_and_writes_the_rest():
    table = np.arange(6, dtype=np.float32).reshape(3, 2)
    out = empty_on("cuda", (3, 2), np.float32)
    garbage = to_host(out)[1].copy()
    get_kernel("gather", "cuda")(out, on("cuda", table), on("cuda", np.array([2, 3, -3])), check=False)
    result = to_host(out)
    assert_close(result[[0, 2]], table[[2, 0]], what="rows with valid indices")
    assert (result[1].view(np.uint8) == garbage.view(np.uint8)).all(), "the bad row must be left alone"


def test_checked_gather_waits_on_the_stream_it_was_given():
    stream = cuda.stream()
    table, out = on("cuda", np.zeros((2, 2), np.float32)), empty_on("cuda", (1, 2), np.float32)
    with pytest.raises(IndexOutOfRangeError, match="index -3"):
        get_kernel("gather", "cuda")(out, table, on("cuda", np.array([-3])), stream=stream)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("index_dtype", [np.float32, np.bool_, np.uint8])
def test_indices_must_be_int32_or_int64(target, index_dtype):
    x, index = on(target, np.zeros((3, 2), np.float32)), on(target, np.zeros(2, index_dtype))
    with pytest.raises(DTypeError, match=f"gather: indices must be int32 or int64, got {np.dtype(index_dtype)}"):
        get_kernel("gather", target)(empty_on(target, (2, 2), np.float32), x, index)
    with pytest.raises(DTypeError, match="index_select: indices must be int32 or int64"):
        get_kernel("index_select", target)(empty_on(target, (3, 2), np.float32), x, index, axis=1)


# --- other bad arguments: an error before any launch, where numpy also refuses -------------


@pytest.mark.parametrize("target", TARGETS)
@given(a=shapes(min_dims=1, max_side=3), b=shapes(min_dims=1, max_side=3), axis=st.integers(0, 2))
def test_concat_refuses_shapes_that_numpy_refuses(target, a, b, axis):
    assume(axis < len(a))
    try:
        np.concatenate([np.zeros(a), np.zeros(b)], axis=axis)
        assume(False)
    except ValueError:
        pass  # numpy refuses; so must we
    with pytest.raises(ShapeError, match=r"concat: input shapes .* must have rank"):
        get_kernel("concat", target)(empty_on(target, a, np.float32),
                                     [empty_on(target, a, np.float32), empty_on(target, b, np.float32)], axis=axis)


@pytest.mark.parametrize("target", TARGETS)
def test_concat_needs_inputs_of_rank_at_least_one(target):
    for inputs in ([], [np.zeros(()), np.zeros(())]):
        with pytest.raises(ValueError):
            np.concatenate(inputs, axis=0)
        with pytest.raises(ShapeError, match="concat"):
            get_kernel("concat", target)(empty_on(target, (2,), np.float64),
                                         [on(target, i) for i in inputs], axis=0)


def _bad_axis_calls(target, shape, axis):
    """op -> (numpy call, pyflow call) using ``axis`` on a tensor of ``shape``."""
    x = np.zeros(shape, np.float32)
    dx, out, index = on(target, x), empty_on(target, shape, np.float32), np.zeros(1, np.int64)
    return {
        "concat": (lambda: np.concatenate([x], axis=axis),
                   lambda: get_kernel("concat", target)(out, [dx], axis=axis)),
        "split": (lambda: np.split(x, [0], axis=axis),
                  lambda: get_kernel("split", target)([out], dx, axis=axis)),
        "index_select": (lambda: np.take(x, index, axis=axis),
                         lambda: get_kernel("index_select", target)(out, dx, on(target, index), axis=axis)),
        "transpose": (lambda: np.swapaxes(x, axis, 0),
                      lambda: get_kernel("transpose", target)(out, dx, dim0=axis, dim1=0)),
        "permute": (lambda: np.transpose(x, (axis,) + tuple(range(1, len(shape)))),
                    lambda: get_kernel("permute", target)(out, dx, perm=(axis,) + tuple(range(1, len(shape))))),
    }


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["concat", "split", "index_select", "transpose", "permute"])
@given(shape=shapes(min_dims=1, max_side=2), offset=st.integers(0, 2), negative=st.booleans())
def test_an_axis_out_of_range_raises_axis_error_like_numpy(target, op, shape, offset, negative):
    axis = -len(shape) - 1 - offset if negative else len(shape) + offset
    numpy_call, pyflow_call = _bad_axis_calls(target, shape, axis)[op]
    with pytest.raises(IndexError):  # numpy: AxisError (an IndexError), or IndexError in np.split
        numpy_call()
    with pytest.raises(AxisError, match=rf"{op}: axis {axis} is out of range for a tensor of rank {len(shape)}"):
        pyflow_call()


@pytest.mark.parametrize("target", TARGETS)
@given(case=shape_and_axis(), extra=st.integers(-2, 2).filter(bool))
def test_split_sizes_must_add_up_to_the_axis(target, case, extra):
    shape, axis = case
    assume(shape[axis] + extra >= 0)
    sizes = [shape[axis] + extra]
    outs = [empty_on(target, shape[:axis % len(shape)] + (k,) + shape[axis % len(shape) + 1:], np.float32)
            for k in sizes]
    with pytest.raises(ShapeError, match=rf"split: output sizes \[{sizes[0]}\] .* add up to {sizes[0]}"):
        get_kernel("split", target)(outs, on(target, np.zeros(shape, np.float32)), axis=axis)


@pytest.mark.parametrize("target", TARGETS)
def test_split_outputs_must_match_x_off_the_axis(target):
    x = on(target, np.zeros((2, 3), np.float32))
    with pytest.raises(ShapeError, match=r"split: output shapes \(1, 3\), \(1, 2\) .* \(x has shape \(2, 3\)\)"):
        get_kernel("split", target)([empty_on(target, s, np.float32) for s in ((1, 3), (1, 2))], x, axis=0)
    with pytest.raises(ShapeError, match="split: needs at least one output"):
        get_kernel("split", target)([], x, axis=0)


@pytest.mark.parametrize("target", TARGETS)
def test_nothing_is_written_when_a_later_input_is_bad(target):
    out = empty_on(target, (4, 2), np.float32)
    before = to_host(out).copy()
    good, bad = on(target, np.ones((2, 2), np.float32)), on(target, np.ones((2, 2), np.float64))
    with pytest.raises(DTypeError, match="concat: input dtypes float32, float64 must all equal the output's float32"):
        get_kernel("concat", target)(out, [good, bad], axis=0)
    first = empty_on(target, (2, 2), np.float32)
    with pytest.raises(DTypeError, match="split: output 1 dtype is float64, expected float32"):
        get_kernel("split", target)([first, bad], on(target, np.ones((4, 2), np.float32)), axis=0)
    with pytest.raises(ShapeError, match="add_n: inputs must have one shape"):
        get_kernel("add_n", target)(out, [good, on(target, np.ones((4, 2), np.float32))])
    assert (to_host(out).view(np.uint8) == before.view(np.uint8)).all()
    assert (to_host(first).view(np.uint8) == 0xCD).all()


@pytest.mark.parametrize("target", TARGETS)
def test_slice_takes_one_positive_step_per_axis(target):
    x, out = on(target, np.zeros((4, 3), np.float32)), empty_on(target, (2, 3), np.float32)
    run = get_kernel("slice", target)
    for steps in ((0, 1), (-1, 1)):
        with pytest.raises(ShapeError, match="slice: steps .* must be positive"):
            run(out, x, starts=(0, 0), stops=(2, 3), steps=steps)
    with pytest.raises(ShapeError, match="slice: starts .* one entry per dimension"):
        run(out, x, starts=(0,), stops=(2,), steps=(1,))
    with pytest.raises(ShapeError, match=r"slice: output has shape \(2, 3\), expected \(1, 3\)"):
        run(out, x, starts=(-1, 0), stops=(None, 3), steps=(1, 1))


@pytest.mark.parametrize("target", TARGETS)
def test_permute_needs_a_permutation(target):
    x, out = on(target, np.zeros((2, 3), np.float32)), empty_on(target, (2, 3), np.float32)
    for perm, error in (((0, 0), AxisError), ((0, -2), AxisError), ((1,), ShapeError), ((1, 0, 2), ShapeError)):
        with pytest.raises(ValueError):
            np.transpose(np.zeros((2, 3)), perm)
        with pytest.raises(error, match="permute: perm"):
            get_kernel("permute", target)(out, x, perm=perm)


@pytest.mark.parametrize("target", TARGETS)
def test_add_n_refuses_no_inputs_bool_and_a_wrong_output_dtype(target):
    a = on(target, np.ones(3, np.int32))
    with pytest.raises(ShapeError, match="add_n: needs at least one input"):
        get_kernel("add_n", target)(empty_on(target, (3,), np.int32), [])
    with pytest.raises(DTypeError, match="add_n: unsupported dtype bool"):
        get_kernel("add_n", target)(empty_on(target, (3,), np.bool_), [on(target, np.ones(3, np.bool_))] * 2)
    with pytest.raises(DTypeError, match="add_n: output dtype is int32, expected float64"):
        get_kernel("add_n", target)(empty_on(target, (3,), np.int32), [a, on(target, np.ones(3, np.float32))])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["slice", "concat", "permute", "transpose", "gather", "index_select", "add_n"])
def test_a_wrong_output_shape_or_dtype_is_refused(target, op):
    x = on(target, np.zeros((2, 3), np.float32))
    calls = {
        "slice": lambda out: get_kernel("slice", target)(out, x, starts=(0, 0), stops=(2, 3), steps=(1, 1)),
        "concat": lambda out: get_kernel("concat", target)(out, [x], axis=0),
        "permute": lambda out: get_kernel("permute", target)(out, x, perm=(0, 1)),
        "transpose": lambda out: get_kernel("transpose", target)(out, x, dim0=1, dim1=1),
        "gather": lambda out: get_kernel("gather", target)(out, x, on(target, np.array([0, 1]))),
        "index_select": lambda out: get_kernel("index_select", target)(out, x, on(target, np.array([0, 1, 2])),
                                                                       axis=1),
        "add_n": lambda out: get_kernel("add_n", target)(out, [x, x]),
    }
    with pytest.raises(ShapeError, match=rf"{op}: output has shape \(3, 2\), expected \(2, 3\)"):
        calls[op](empty_on(target, (3, 2), np.float32))
    with pytest.raises((ShapeError, DTypeError), match=f"{op}: .*float32"):
        calls[op](empty_on(target, (2, 3), np.float64))


def test_cuda_movement_ops_refuse_host_arrays():
    x, index = np.zeros((2, 2), np.float32), np.zeros(2, np.int64)
    calls = {
        "slice": lambda run: run(x, x, starts=(0, 0), stops=(2, 2), steps=(1, 1)),
        "concat": lambda run: run(x, [x], axis=0),
        "split": lambda run: run([x], x, axis=0),
        "add_n": lambda run: run(x, [x, x]),
        "permute": lambda run: run(x, x, perm=(1, 0)),
        "transpose": lambda run: run(x, x, dim0=0, dim1=1),
        "gather": lambda run: run(x, x, index),
        "index_select": lambda run: run(x, x, index, axis=0),
    }
    for op, call in calls.items():
        with pytest.raises(DTypeError, match=rf"{op} \(cuda\): expected device arrays"):
            call(get_kernel(op, "cuda"))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_gather_takes_0d_input_or_index_as_pytorch_does(device):
    """OneFlow's gather tests (as PyTorch): a 0-d input or index counts as 1-d, for dim 0 or -1."""
    x = flow.tensor(3.0, device=device, requires_grad=True)
    for dim in (0, -1):
        assert flow.gather(x, dim, flow.tensor(0, device=device)).tolist() == 3.0
    y = flow.gather(flow.tensor([1.0, 2.0], device=device), 0, flow.tensor(1, device=device))
    assert y.shape == () and y.item() == 2.0
    flow.gather(x, 0, flow.tensor([0, 0], device=device)).sum().backward()
    assert x.grad.item() == 2.0
    with pytest.raises(flow.errors.ShapeError):
        flow.gather(flow.ones(2, 2, device=device), 0, flow.tensor(0, device=device))
