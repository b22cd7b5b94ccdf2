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
