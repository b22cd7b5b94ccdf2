"""Seeds 000/002: ``TensorStorage`` and ``EagerBlobObject``, what VM instructions operate on.

* ``TensorStorage`` is the memory of one or more tensors (views share it): its
  size, its allocation (from a caching allocator, made when the instruction that
  first writes it is *prepared*), its dependence object, and the stream history
  SoftSyncStream needs: ``producer_stream`` (set once, by the first instruction that
  uses it) and ``last_used_stream``; and ``failure``: set when an instruction
  writing it failed (``pyflow/vm/failure.py``), so every later read raises.
* ``EagerBlobObject`` is one tensor's view of a storage: shape, dtype, strides and
  offset in elements.  ``array()`` gives the array a kernel takes (numpy on a CPU,
  a device array for CUDA), made at compute time, when the memory exists.

The framework's ``Tensor`` holds an ``EagerBlobObject``; instructions hold them too,
so memory outlives every instruction that uses it.  Freeing is an instruction of
its own (ReleaseTensor), issued when the last tensor using a storage goes away.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from pyflow.device import DeviceType, ep
from pyflow.kernels.backend import cuda
from pyflow.kernels.layout import contiguous_strides
from pyflow.vm.dependence import LocalDepObject

__all__ = ["TensorStorage", "EagerBlobObject", "NoMemoryError", "storage_mark"]


class NoMemoryError(RuntimeError):
    """``array()`` of a blob whose storage has no memory (the op that makes it failed to prepare)."""

_storage_ids = itertools.count()


def storage_mark() -> int:
    """A number below every later storage's ``id`` and above every earlier one's: a storage whose ``id`` is
    higher than a mark taken before some work was made by that work (the autograd engine asks it of a
    backward rule's results: ``pyflow/autograd/engine.py``)."""
    return next(_storage_ids)


class TensorStorage:
    """The memory behind tensors: allocation, dependence object, stream history."""

    __slots__ = ("id", "device", "nbytes", "allocation", "allocator", "dep", "producer_stream", "last_used_stream",
                 "released", "failure", "__weakref__")

    def __init__(self, device, nbytes: int):
        self.id = next(_storage_ids)
        self.device = device            # pyflow Device the memory belongs to
        self.nbytes = int(nbytes)
        self.allocation = None          # allocator.Allocation once prepared
        self.allocator = None           # who to give it back to
        self.dep = LocalDepObject(f"storage#{self.id}")
        self.producer_stream = None     # device.Stream symbols
        self.last_used_stream = None
        self.released = False
        self.failure = None             # a vm.failure.Failure once an op writing it failed

    @property
    def allocated(self) -> bool:
        return self.allocation is not None

    def allocate(self, allocator) -> None:
        """Take memory from ``allocator`` (raises OutOfMemoryError)."""
        if self.allocation is None:
            self.allocation = allocator.allocate(self.nbytes)
            self.allocator = allocator

    def free(self) -> None:
        """Give the memory back (ReleaseTensor's compute)."""
        if self.allocation is not None:
            self.allocator.deallocate(self.allocation.ptr)
            self.allocation = None
        self.released = True

    def __repr__(self) -> str:
        state = "released" if self.released else "allocated" if self.allocated else "unallocated"
        return f"<TensorStorage #{self.id} {self.nbytes} B on {self.device}, {state}>"


class EagerBlobObject:
    """A tensor's layout over a storage; ``array()`` is what a kernel receives."""

    __slots__ = ("storage", "shape", "dtype", "strides", "offset", "_array")

    def __init__(self, storage: TensorStorage, shape, dtype, strides=None, offset: int = 0):
        self.storage = storage
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.strides = tuple(strides) if strides is not None else contiguous_strides(self.shape)
        self.offset = int(offset)       # in elements, from the start of the storage
        self._array = None              # the kernel's view, made once the memory exists

    @classmethod
    def empty(cls, device, shape, dtype) -> "EagerBlobObject":
        """A new contiguous blob with fresh (not yet allocated) storage."""
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        return cls(TensorStorage(device, nbytes), shape, dtype)

    @classmethod
    def of_new_storage(cls, device, shape: tuple, dtype: np.dtype, nbytes: int, strides: tuple) -> "EagerBlobObject":
        """``empty`` for callers that already hold the normalised layout (the interpreter's ``Inferred``)."""
        blob = object.__new__(cls)
        blob.storage, blob.shape, blob.dtype, blob.strides = TensorStorage(device, nbytes), shape, dtype, strides
        blob.offset, blob._array = 0, None
        return blob

    @property
    def device(self):
        return self.storage.device

    @property
    def dep(self) -> LocalDepObject:
        return self.storage.dep

    def covers_storage(self) -> bool:
        """Is every byte of the storage one element of this blob (a write here rewrites it all)?"""
        nbytes = math.prod(self.shape) * self.dtype.itemsize
        return (self.offset == 0 and nbytes == self.storage.nbytes
                and self.strides == contiguous_strides(self.shape))

    def view(self, shape, strides, offset) -> "EagerBlobObject":
        """Another layout over the same storage (transpose, slice, reshape of contiguous)."""
        return EagerBlobObject(self.storage, shape, self.dtype, strides, offset)

    def array(self):
        """The kernel's view of this blob: numpy (CPU) or a device array (made once)."""
        if self._array is not None and self.storage.allocation is not None:
            return self._array
        self._array = self._make_array()
        return self._array

    def _make_array(self):
        allocation = self.storage.allocation
        if self.storage.nbytes == 0:  # an empty tensor needs no memory (it may never have had any)
            return _empty_array(self.device, self.shape, self.dtype)
        if allocation is None:
            raise NoMemoryError(f"{self!r} has no memory (was the instruction that produces it skipped?)")
        if allocation.raw is None:  # zero bytes: nothing to view, an empty array of the right kind
            return _empty_array(self.device, self.shape, self.dtype)
        itemsize = self.dtype.itemsize
        return ep.get_device(self.device).as_array(
            allocation.raw, allocation.offset + self.offset * itemsize, self.shape, self.dtype,
            tuple(s * itemsize for s in self.strides))

    def __repr__(self) -> str:
        return f"<EagerBlobObject {self.dtype}{list(self.shape)} on {self.device}, storage #{self.storage.id}>"


def _empty_array(device, shape, dtype):
    if device.device_type is DeviceType.cuda:
        return cuda.device_array(shape, dtype)
    return np.empty(shape, dtype)
