"""How a kernel sees an array: flat storage, a shape, and strides counted in elements.

Every kernel in ``pyflow.kernels`` reads and writes *strided* arrays: transposed,
sliced, broadcast (stride 0) or plain contiguous, as in MiniTorch.  The host
wrapper of a kernel turns each array argument into

    storage  a 1-D array starting at the array's first element,
    strides  a tuple with one stride per dimension, in elements (not bytes),

so the element at index ``(i0, i1, ...)`` is ``storage[i0*s0 + i1*s1 + ...]``.
One compiled kernel therefore serves every layout of a given rank and dtype.
Shapes travel as tuples; numba compiles one specialization per rank.

The arrays themselves are the device's own kind: numpy arrays on the CPU,
numba device arrays on a GPU, ``FakeCUDAArray`` in the simulator.  Views of
them are made here too, the same way for all three (``permuted_view``,
``sliced_view``, ``broadcast_view``): numba's ``DeviceNDArray`` transposes only
in 2-D (and copies), and fails to slice an empty array.  This module also does
the argument checks the ops share (broadcasting, axes), raising pyflow's
``ShapeError`` / ``AxisError`` naming the op.

>>> import numpy as np
>>> x = np.arange(12, dtype=np.float32).reshape(3, 4).T    # a transposed view
>>> storage, strides = flat(x)
>>> strides, bool(storage[1 * strides[0] + 2 * strides[1]] == x[1, 2])
((1, 4), True)
>>> broadcast_shapes((3, 1), (4,), op="add")
(3, 4)
>>> permuted_view(np.zeros((2, 3, 4)), (2, 0, 1)).shape
(4, 2, 3)
>>> sliced_view(np.arange(10), (slice(1, None, 3),))
array([1, 4, 7])
"""

from __future__ import annotations

import math

import numpy as np

from pyflow.errors import AxisError, ShapeError
from pyflow.kernels.backend import cuda, is_simulator

__all__ = ["is_device_array", "flat", "kernel_operand", "may_overlap", "broadcast_shapes", "broadcast_view",
           "permuted_view", "sliced_view", "normalize_axis", "normalize_axes", "padded_strides",
           "contiguous_strides", "as_kernel_shape", "coalesce_dims"]

if is_simulator():
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray as _FakeCUDAArray
else:
    _FakeCUDAArray = None


def is_device_array(array) -> bool:
    """True for a CUDA device array (a ``FakeCUDAArray`` in the simulator)."""
    if _FakeCUDAArray is not None:
        return isinstance(array, _FakeCUDAArray)
    return cuda.is_cuda_array(array)


def _is_gpu_array(array) -> bool:
    """True for numba's ``DeviceNDArray`` on a real GPU (memory the host cannot see)."""
    return _FakeCUDAArray is None and is_device_array(array)


def _host(array) -> np.ndarray:
    return array._ary if _FakeCUDAArray is not None and isinstance(array, _FakeCUDAArray) else array


def flat(array):
    """(storage, element strides) of a numpy or device array; see the module docstring.

    Strides must be non-negative multiples of the item size (every view pyflow
    makes is).  A 0-d array is seen as shape (1,) with stride 0.  A C-contiguous
    array (most operands) takes a short way, ``reshape(-1)``: its storage is its
    elements in row-major order, its strides ``contiguous_strides`` (a few us less
    per operand than ``as_strided``, on every launch).
    """
    host = _host(array)
    if not _is_gpu_array(array) and host.flags.c_contiguous:
        storage = host.reshape(-1)
        return (storage if host is array else _FakeCUDAArray(storage)), contiguous_strides(host.shape) or (0,)
    itemsize = array.dtype.itemsize
    shape = tuple(array.shape)
    byte_strides = tuple(array.strides) if shape else (0,)
    if any(s < 0 or s % itemsize for s in byte_strides):
        raise ShapeError(f"strides {byte_strides} of a {array.dtype} array are not non-negative "
                         f"multiples of its item size {itemsize}")
    strides = tuple(s // itemsize for s in byte_strides)
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else 0
    if _is_gpu_array(array):
        from numba.cuda.cudadrv.devicearray import DeviceNDArray

        storage = DeviceNDArray((span,), (itemsize,), array.dtype, gpu_data=array.gpu_data,
                                stream=array.stream)
    else:
        host = np.lib.stride_tricks.as_strided(_host(array), (span,), (itemsize,))
        storage = _FakeCUDAArray(host) if is_device_array(array) else host
    return storage, strides


def may_overlap(a, b) -> bool:
    """Could ``a`` and ``b`` share memory?  (Their byte ranges intersect; empty never does.)"""
    if a.size == 0 or b.size == 0:
        return False
    if not _is_gpu_array(a):
        return bool(np.may_share_memory(_host(a), _host(b)))

    def byte_range(array):
        start = array.__cuda_array_interface__["data"][0]
        extent = sum((n - 1) * s for n, s in zip(array.shape, array.strides)) + array.dtype.itemsize
        return start, start + extent

    (a0, a1), (b0, b1) = byte_range(a), byte_range(b)
    return a0 < b1 and b0 < a1


def kernel_operand(array, shape) -> tuple:
    """(storage, strides) of ``array`` read as if broadcast to the kernel ``shape``."""
    storage, strides = flat(array)
    if array.ndim == 0:
        return storage, (0,) * len(shape)
    return storage, padded_strides(array.shape, strides, shape)


def as_kernel_shape(shape) -> tuple:
    """The shape a kernel iterates over: 0-d becomes (1,)."""
    return tuple(int(n) for n in shape) or (1,)


def contiguous_strides(shape) -> tuple:
    """C-order element strides of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


def coalesce_dims(shape, strides_of) -> tuple:
    """(shape, [strides, ...]): ``shape`` with every two neighbouring dims merged where each operand's
    ``strides`` step over the inner one as one run (``strides[d] == strides[d + 1] * shape[d + 1]``), as
    numpy's iterator and PyTorch's TensorIterator do.  Linear index ``i`` of the iteration still finds the
    same element of every operand, with fewer divisions to find it (``elementwise.position``: one ``%``
    and one ``//`` per dim after the first); dims of size 1 go.

    >>> coalesce_dims((64, 256), [(256, 1), (256, 1), (0, 0)])     # two dense operands and a scalar
    ((16384,), [(1,), (1,), (0,)])
    >>> coalesce_dims((64, 256), [(256, 1), (0, 1)])                # a row broadcast: stays 2-D
    ((64, 256), [(256, 1), (0, 1)])
    >>> coalesce_dims((2, 1, 3), [(3, 7, 1)])
    ((6,), [(1,)])
    """
    shape, strides_of = list(shape), [list(s) for s in strides_of]
    keep = [d for d, n in enumerate(shape) if n != 1] or [len(shape) - 1]
    shape = [shape[d] for d in keep]
    strides_of = [[s[d] for d in keep] for s in strides_of]
    d = len(shape) - 2
    while d >= 0:   # from the innermost pair out: merge d + 1 into d
        if all(s[d] == s[d + 1] * shape[d + 1] for s in strides_of):
            shape[d:d + 2] = [shape[d] * shape[d + 1]]
            for s in strides_of:
                s[d:d + 2] = [s[d + 1]]
        d -= 1
    return tuple(shape), [tuple(s) for s in strides_of]


def padded_strides(array_shape, strides, out_shape) -> tuple:
    """Strides of an input broadcast to ``out_shape``: leading 1s added, stride 0 where size 1."""
    pad = len(out_shape) - len(array_shape)
    shape = (1,) * pad + tuple(array_shape)
    strides = (0,) * pad + tuple(strides)
    return tuple(0 if n == 1 and m != 1 else s for n, m, s in zip(shape, out_shape, strides))


def broadcast_shapes(*shapes, op: str) -> tuple:
    """numpy's broadcast of ``shapes``; ``ShapeError`` naming ``op`` when impossible."""
    first = tuple(shapes[0])
    if all(tuple(s) == first for s in shapes[1:]):
        return first  # the common case, without numpy's machinery
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        listed = ", ".join(str(tuple(s)) for s in shapes)
        raise ShapeError(f"{op}: shapes {listed} cannot be broadcast together") from None


def broadcast_view(array, shape):
    """``array`` seen with ``shape`` (stride 0 on broadcast dims), without copying."""
    shape = tuple(shape)
    if _is_gpu_array(array):
        storage, strides = flat(array)
        element = padded_strides(array.shape, strides, shape)
        itemsize = array.dtype.itemsize
        return _gpu_view(array, shape, tuple(s * itemsize for s in element))
    view = np.broadcast_to(_host(array), shape)
    return _FakeCUDAArray(view) if is_device_array(array) else view


def permuted_view(array, perm):
    """``array`` with its axes in the order ``perm`` (numpy's ``transpose(perm)``), never a copy.

    For every kind of array: numba's ``DeviceNDArray.transpose`` copies, and only
    in 2-D (3-D and up raise ``NotImplementedError``); here a GPU array keeps its
    memory and gets permuted shape and strides.  ``AxisError`` unless ``perm`` is a
    permutation of the axes.
    """
    perm = tuple(int(p) for p in perm)
    if sorted(perm) != list(range(array.ndim)):
        raise AxisError(f"permuted_view: {perm} is not a permutation of the axes of an array of shape "
                        f"{tuple(array.shape)} (expected an order of {tuple(range(array.ndim))})")
    if not _is_gpu_array(array):
        return array.transpose(perm)
    return _gpu_view(array, tuple(array.shape[p] for p in perm), tuple(array.strides[p] for p in perm))


def sliced_view(array, index):
    """``array[index]`` for ``index`` a tuple of slices with positive steps (one per leading dim), never a copy.

    For every kind of array.  numba's ``DeviceNDArray`` slicing is wrong for empty
    arrays: numpy 2 gives them zero strides, which numba's dummy array reads as
    broadcast dims of size 1, and it then refuses to view their NULL memory
    ("non-empty slice into empty slice").  Here a GPU view gets numpy's shape, strides
    and first element, and an empty view touches no memory.
    """
    index = tuple(index) if isinstance(index, tuple) else (index,)
    if len(index) > array.ndim or not all(isinstance(item, slice) for item in index):
        raise ShapeError(f"sliced_view: index {index!r} must be at most {array.ndim} slices for an array of "
                         f"shape {tuple(array.shape)}")
    if any(item.step is not None and item.step <= 0 for item in index):
        raise ShapeError(f"sliced_view: index {index!r} has a step <= 0; only positive steps are supported")
    if not index:
        return array  # numpy's a[()] of a 0-d array would be a scalar
    if not _is_gpu_array(array):
        return array[index]
    index += (slice(None),) * (array.ndim - len(index))
    shape, strides, start = [], [], 0
    for item, n, stride in zip(index, array.shape, array.strides):
        first, stop, step = item.indices(n)
        shape.append(len(range(first, stop, step)))
        strides.append(stride * step)
        start += first * stride
    return _gpu_view(array, tuple(shape), tuple(strides), start)


def _gpu_view(array, shape, byte_strides, start: int = 0):
    """A ``DeviceNDArray`` over ``array``'s memory from byte ``start`` on (strides >= 0).

    An empty view gets numba's own NULL pointer for empty arrays: its memory is
    never sliced (an empty array has none to slice).
    """
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    if math.prod(shape) == 0:
        return DeviceNDArray(shape, byte_strides, array.dtype, stream=array.stream)
    memory = array.gpu_data
    if start:
        extent = array.dtype.itemsize + sum((n - 1) * s for n, s in zip(shape, byte_strides))
        memory = memory.view(start, start + extent)
    return DeviceNDArray(shape, byte_strides, array.dtype, gpu_data=memory, stream=array.stream)


def normalize_axis(axis: int, ndim: int, op: str) -> int:
    """``axis`` in ``[-ndim, ndim)`` as a non-negative int; ``AxisError`` naming ``op``."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise AxisError(f"{op}: axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise AxisError(f"{op}: axis {axis} is out of range for a tensor of rank {ndim} "
                        f"(valid: {-ndim} to {ndim - 1})" if ndim else
                        f"{op}: axis {axis} is out of range for a 0-d tensor")
    return int(axis) % ndim


def normalize_axes(axes, ndim: int, op: str) -> tuple:
    """``None`` (all axes), an int or a sequence of ints -> a sorted tuple of distinct axes."""
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
        axes = (axes,)
    result = tuple(sorted(normalize_axis(a, ndim, op) for a in axes))
    if len(set(result)) != len(result):
        raise AxisError(f"{op}: repeated axis in {tuple(axes)}")
    return result
