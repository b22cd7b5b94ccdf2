"""``kernels.layout.flat``: every element of an array sits at ``storage[sum(index * stride)]``, for any view
(transposed, sliced, stepped, broadcast, 0-d, empty), on both of its ways (C-contiguous arrays take
``reshape(-1)``, others ``as_strided``), and the storage is the array's memory, not a copy."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pyflow.kernels.backend import is_simulator
from pyflow.kernels.layout import flat, is_device_array


@st.composite
def views(draw):
    """A view of a fresh array: some axes permuted, sliced with a step, or broadcast."""
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=3)))
    base = np.arange(int(np.prod(shape)), dtype=draw(st.sampled_from([np.float32, np.int64]))).reshape(shape)
    view = base
    if view.ndim and draw(st.booleans()):
        view = view.transpose(draw(st.permutations(range(view.ndim))))
    if view.ndim and draw(st.booleans()):
        view = view[tuple(slice(draw(st.integers(0, 2)), None, draw(st.integers(1, 2))) for _ in view.shape)]
    if draw(st.booleans()):
        view = np.broadcast_to(view, (2,) + view.shape)
    return view


def _elements_at_their_positions(x):
    storage, strides = flat(x)
    host = storage._ary if is_device_array(storage) else storage
    assert host.ndim == 1 and len(strides) == max(x.ndim, 1)
    for index in np.ndindex(*x.shape):
        assert host[sum(i * s for i, s in zip(index, strides))] == x[index]
    return host


@settings(max_examples=150, deadline=None)
@given(views())
def test_every_element_is_at_its_position_in_the_storage(x):
    host = _elements_at_their_positions(x)
    if x.size and x.flags.writeable:   # the storage is the array's memory
        host[0] = 99
        assert x.flat[0] == 99 if x.flags.c_contiguous else np.any(x == 99)


def test_a_contiguous_array_whose_one_long_axis_has_an_odd_stride_takes_the_short_way():
    x = np.arange(12.0).reshape(3, 4)[1:2]   # shape (1, 4): C-contiguous, its first stride 4 elements
    storage, strides = flat(x)
    assert strides == (4, 1) and storage.base is not None and np.shares_memory(storage, x)
    assert flat(np.float32(3.0).reshape(()))[1] == (0,) and flat(np.zeros((0, 3)))[0].size == 0


def test_a_device_array_gives_a_device_storage():
    if not is_simulator():
        return
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    for x in (np.arange(6.0).reshape(2, 3), np.arange(6.0).reshape(2, 3).T):
        storage, strides = flat(FakeCUDAArray(x))
        assert isinstance(storage, FakeCUDAArray) and np.shares_memory(storage._ary, x)
        _elements_at_their_positions(x)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_coalesced_dims_find_the_same_element_of_every_operand_with_fewer_dims(data):
    """``coalesce_dims`` (elementwise kernels' strided path): for every linear index of the iteration, each
    operand's element is the one the full shape finds; two operands laid out alike merge into one dim."""
    from pyflow.kernels.elementwise import position
    from pyflow.kernels.layout import coalesce_dims, padded_strides

    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    strides_of = []
    for _ in range(data.draw(st.integers(1, 3))):
        view = np.arange(int(np.prod([n * 2 for n in shape]))).reshape(tuple(n * 2 for n in shape))
        view = view[tuple(slice(0, None, data.draw(st.integers(1, 2))) for _ in shape)][tuple(slice(0, n) for n in shape)]
        if data.draw(st.booleans()):   # broadcast along some dims
            view = view[tuple(slice(0, 1) if data.draw(st.booleans()) else slice(None) for _ in shape)]
        _, strides = flat(view)
        strides_of.append(padded_strides(view.shape, strides, shape))
    merged_shape, merged = coalesce_dims(shape, strides_of)
    assert int(np.prod(merged_shape)) == int(np.prod(shape)) and len(merged_shape) <= len(shape)
    for strides, merged_strides in zip(strides_of, merged):
        for i in range(int(np.prod(shape))):
            assert position.py_func(i, merged_shape, merged_strides) == position.py_func(i, shape, strides)
    dense = tuple(int(np.prod(shape[d + 1:])) for d in range(len(shape)))
    assert coalesce_dims(shape, [dense, dense]) == ((int(np.prod(shape)),), [(1,), (1,)])
