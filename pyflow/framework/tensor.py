"""Seeds 000/002: ``Tensor``, the user's handle on an ``EagerBlobObject``.

A tensor is a shape, a dtype and a device over a storage.  Ops never run here:
they go through the interpreter, which issues VM instructions and returns at
once.  Only reading values (``numpy()``, ``item()``, ``repr``) waits.

* **Views** share the storage and its dependence object.  ``transpose``,
  ``permute``, basic slicing ``x[1:3, ::2]`` and ``reshape`` of a contiguous tensor
  copy nothing.
* **Memory** is given back when the last tensor (or view) of a storage is garbage
  collected.  A finalizer queues the storage, and the next PhysicalRun issues a
  ReleaseTensor instruction for it.  (A finalizer must not take locks, so it only
  puts into a ``queue.SimpleQueue``.)
"""

from __future__ import annotations

import math
import numbers
import threading
import weakref

import numpy as np

from pyflow import vm
from pyflow.device import Device, DeviceType
from pyflow.errors import DTypeError, IndexOutOfRangeError, ShapeError
from pyflow.framework.interpreter import apply, describe
from pyflow.kernels.layout import contiguous_strides, normalize_axis
from pyflow.vm.eager_blob_object import EagerBlobObject

__all__ = ["Tensor", "tensor", "as_tensor_like"]

_DEFAULT_FLOAT = np.dtype(np.float32)


class _StorageHandle:
    """Alive while some tensor uses the storage; its death queues a ReleaseTensor."""

    __slots__ = ("storage", "__weakref__")

    def __init__(self, storage):
        self.storage = storage
        weakref.finalize(self, vm.get_vm().release_queue.put, storage)


class Tensor:
    """An eager tensor on a device (``flow.tensor(...)``, or the result of an op)."""

    __slots__ = ("_blob", "_handle", "__weakref__")
    __array_priority__ = 100  # numpy scalars defer to our operators

    def __init__(self, blob: EagerBlobObject, handle: _StorageHandle):
        self._blob = blob
        self._handle = handle

    @classmethod
    def _empty(cls, device, shape, dtype) -> "Tensor":
        blob = EagerBlobObject.empty(Device(device), shape, dtype)
        return cls(blob, _StorageHandle(blob.storage))

    def _view(self, shape, strides, offset) -> "Tensor":
        return Tensor(self._blob.view(shape, strides, offset), self._handle)

    # --- attributes ---------------------------------------------------------------------

    @property
    def shape(self) -> tuple:
        return self._blob.shape

    @property
    def dtype(self) -> np.dtype:
        return self._blob.dtype

    @property
    def device(self) -> Device:
        return self._blob.device

    @property
    def ndim(self) -> int:
        return len(self._blob.shape)

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return math.prod(self._blob.shape)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[normalize_axis(dim, self.ndim, "size")]

    def is_contiguous(self) -> bool:
        blob = self._blob
        return all(n == 1 or s == c for n, s, c in zip(blob.shape, blob.strides, contiguous_strides(blob.shape)))

    # --- reading values (the only waits) ---------------------------------------------------

    def numpy(self) -> np.ndarray:
        """A numpy copy of the values; waits for the ops that produce them."""
        on_cuda = self.device.device_type is DeviceType.cuda
        source = self if self.is_contiguous() or not on_cuda else self.contiguous()
        box: dict = {}
        done = threading.Event()

        def read(ep_stream, blob):  # captures no tensor: the instruction must not keep one alive
            try:
                array = blob.array()
                if on_cuda:
                    host = np.empty(blob.shape, blob.dtype)
                    ep_stream.memcpy_d2h(host, array)
                else:
                    host = np.array(array, copy=True)
                ep_stream.sync()  # the copy landed; earlier kernel errors surface here
                box["value"] = host
            finally:
                done.set()

        machine = vm.get_vm()
        vm.run(lambda builder: builder.access_blob_by_callback(source._blob, read, "const", name="numpy"))
        machine.wait_until(done.is_set, f"numpy() of {self!r:.60}", drive=machine.sync_mode)
        machine.raise_errors()
        return box["value"]

    def item(self):
        if self.numel() != 1:
            raise ShapeError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def __repr__(self) -> str:
        return f"Tensor(shape={list(self.shape)}, dtype={self.dtype}, device='{self.device}')"

    def __str__(self) -> str:
        return f"tensor({np.array2string(self.numpy(), separator=', ')}, device='{self.device}', dtype={self.dtype})"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __bool__(self) -> bool:
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    __hash__ = object.__hash__  # == is elementwise, identity stays the hash

    # --- moving and copying -----------------------------------------------------------------

    def to(self, device=None, dtype=None) -> "Tensor":
        """A copy on ``device`` and/or with ``dtype`` (self if nothing changes)."""
        if isinstance(device, (np.dtype, type)) and dtype is None:
            device, dtype = None, device
        result = self
        if dtype is not None and np.dtype(dtype) != self.dtype:
            (result,) = apply("cast", [result], dtype=np.dtype(dtype))
        if device is not None and Device(device) is not self.device:
            target = Device(device)
            if result.device.device_type is not DeviceType.cpu and target.device_type is not DeviceType.cpu:
                result = result.to("cpu")  # between two accelerators: through the host
            if not result.is_contiguous():
                result = result.contiguous()
            (result,) = apply("copy", [result], device=target)
        return result

    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def cuda(self, index: int = 0) -> "Tensor":
        return self.to(Device("cuda", index))

    def contiguous(self) -> "Tensor":
        if self.is_contiguous():
            return self
        return apply("contiguous", [self])[0]

    # --- views --------------------------------------------------------------------------------

    def permute(self, *dims) -> "Tensor":
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        perm = tuple(normalize_axis(d, self.ndim, f"permute of {describe(self)}") for d in dims)
        if sorted(perm) != list(range(self.ndim)):
            raise ShapeError(f"permute: {dims} is not a permutation of the {self.ndim} dims of {describe(self)}")
        blob = self._blob
        return self._view([blob.shape[d] for d in perm], [blob.strides[d] for d in perm], blob.offset)

    def transpose(self, dim0: int, dim1: int) -> "Tensor":
        perm = list(range(self.ndim))
        what = f"transpose of {describe(self)}"
        a, b = normalize_axis(dim0, self.ndim, what), normalize_axis(dim1, self.ndim, what)
        perm[a], perm[b] = perm[b], perm[a]
        return self.permute(perm)

    @property
    def T(self) -> "Tensor":
        return self.permute(tuple(reversed(range(self.ndim))))

    def reshape(self, *shape) -> "Tensor":
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        try:
            shape = _resolve_shape(shape, self.numel())
        except ShapeError as error:
            raise ShapeError(f"{error} (reshape of {describe(self)})") from None
        source = self.contiguous()
        return source._view(shape, contiguous_strides(shape), source._blob.offset)

    view = reshape

    def flatten(self) -> "Tensor":
        return self.reshape(-1)

    def __getitem__(self, index) -> "Tensor":
        return _basic_index(self, index)

    # --- ops as methods ---------------------------------------------------------------------------

    def _binary(self, name, other, reverse=False):
        other = as_tensor_like(other, self)
        return apply(name, [other, self] if reverse else [self, other])[0]

    def __add__(self, other): return self._binary("add", other)
    def __radd__(self, other): return self._binary("add", other, reverse=True)
    def __sub__(self, other): return self._binary("sub", other)
    def __rsub__(self, other): return self._binary("sub", other, reverse=True)
    def __mul__(self, other): return self._binary("mul", other)
    def __rmul__(self, other): return self._binary("mul", other, reverse=True)
    def __truediv__(self, other): return self._binary("div", other)
    def __rtruediv__(self, other): return self._binary("div", other, reverse=True)
    def __pow__(self, other): return self._binary("pow", other)
    def __rpow__(self, other): return self._binary("pow", other, reverse=True)
    def __matmul__(self, other): return apply("matmul", [self, as_tensor_like(other, self)])[0]
    def __rmatmul__(self, other): return apply("matmul", [as_tensor_like(other, self), self])[0]
    def __neg__(self): return apply("neg", [self])[0]
    def __abs__(self): return apply("abs", [self])[0]
    def __lt__(self, other): return self._binary("lt", other)
    def __le__(self, other): return self._binary("le", other)
    def __gt__(self, other): return self._binary("gt", other)
    def __ge__(self, other): return self._binary("ge", other)
    def __eq__(self, other): return self._binary("eq", other)  # noqa: D105 - elementwise, as in torch
    def __ne__(self, other): return self._binary("ne", other)


def _resolve_shape(shape, numel: int) -> tuple:
    shape = [int(n) for n in shape]
    unknown = [i for i, n in enumerate(shape) if n == -1]
    if len(unknown) > 1 or any(n < -1 for n in shape):
        raise ShapeError(f"reshape: invalid shape {tuple(shape)}")
    if unknown:
        known = math.prod(n for n in shape if n != -1)
        if known == 0 or numel % known:
            raise ShapeError(f"reshape: cannot infer -1 in {tuple(shape)} for {numel} elements")
        shape[unknown[0]] = numel // known
    if math.prod(shape) != numel:
        raise ShapeError(f"reshape: shape {tuple(shape)} does not hold {numel} elements")
    return tuple(shape)


def _basic_index(t: Tensor, index) -> Tensor:
    """Integers, slices (positive steps), ``...`` and ``None``: a view, like numpy's basic indexing."""
    if not isinstance(index, tuple):
        index = (index,)
    if sum(i is Ellipsis for i in index) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    explicit = sum(i is not None and i is not Ellipsis for i in index)
    if explicit > t.ndim:
        raise IndexOutOfRangeError(f"indexing {describe(t)}: too many indices ({index}) for rank {t.ndim}")
    if Ellipsis in index:
        at = index.index(Ellipsis)
        index = index[:at] + (slice(None),) * (t.ndim - explicit) + index[at + 1:]
    blob = t._blob
    shape, strides, offset, dim = [], [], blob.offset, 0
    for item in index:
        if item is None:
            shape.append(1)
            strides.append(0)
            continue
        size, stride = blob.shape[dim], blob.strides[dim]
        if isinstance(item, numbers.Integral) and not isinstance(item, bool):
            if not -size <= item < size:
                raise IndexOutOfRangeError(f"indexing {describe(t)}: index {item} is out of bounds for "
                                           f"dimension {dim} with size {size}")
            offset += (item % size) * stride
        elif isinstance(item, slice):
            start, stop, step = item.indices(size)
            if step <= 0:
                raise IndexError(f"slice step must be positive, got {item.step}")
            shape.append(len(range(start, stop, step)))
            strides.append(stride * step)
            offset += start * stride if shape[-1] else 0
        else:
            raise TypeError(f"unsupported index {item!r}: integers, slices, ... and None only")
        dim += 1
    shape += blob.shape[dim:]
    strides += blob.strides[dim:]
    return t._view(shape, strides, offset)


def _infer_dtype(data, dtype):
    if dtype is not None:
        return np.dtype(dtype)
    if isinstance(data, (np.ndarray, np.generic)):
        return data.dtype
    probe = np.asarray(data)
    if probe.dtype.kind == "f":
        return _DEFAULT_FLOAT  # Python floats become float32, as in torch / oneflow
    if probe.dtype.kind in "iu":
        return np.dtype(np.int64)
    if probe.dtype.kind == "b":
        return np.dtype(np.bool_)
    raise DTypeError(f"tensor(): cannot make a tensor from {type(data).__name__} data of dtype {probe.dtype}")


def tensor(data, dtype=None, device="cpu") -> Tensor:
    """A new tensor holding a copy of ``data`` (numpy array, nested lists, scalar) on ``device``."""
    if isinstance(data, Tensor):
        return data.to(device=device, dtype=dtype)
    array = np.array(data, dtype=_infer_dtype(data, dtype), copy=True, order="C")
    result = Tensor._empty(device, array.shape, array.dtype)

    def fill(ep_stream, blob):
        target = blob.array()
        if blob.device.device_type is DeviceType.cuda:
            ep_stream.memcpy_h2d(target, array)
        else:
            target[...] = array

    vm.run(lambda builder: builder.access_blob_by_callback(result._blob, fill, "mut", name="tensor"))
    return result


def as_tensor_like(value, like: Tensor) -> Tensor:
    """``value`` as a tensor on ``like``'s device; Python scalars take numpy's weak-scalar dtype."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (bool, int, float)):
        return tensor(value, dtype=np.result_type(like.dtype, value), device=like.device)
    return tensor(value, device=like.device)
