"""Seeds 000/002: ``Tensor``, the user's handle on an ``EagerBlobObject``.

A tensor is a shape, a dtype and a device over a storage.  Ops never run here:
they go through the interpreter, which issues VM instructions and returns at
once.  Only reading values (``numpy()``, ``item()``, ``repr``, ``np.asarray``) waits.

* **Views** share the storage, its dependence object and its version counter
  (``pyflow/framework/views.py``, ``indexing.py``).
* **In-place writes** (``add_``, ``+=``, ``x[idx] = v``: ``inplace.py``) are VM
  instructions that write the storage; each bumps ``_version``.
* **Memory** is given back when the last tensor (or view) of a storage is garbage
  collected.  A weakref callback queues the storage (``vm.watch``), and the next
  PhysicalRun issues a ReleaseTensor instruction for it.
* **Failures**: reading a tensor whose producing op failed (or anything it was
  computed from) raises that op's ``OpError``, every time; see
  ``pyflow/vm/failure.py``.
* **Global tensors** (seeds 000 §3, 004): a tensor with ``_global`` set is a
  logical tensor on a placement, of which ``_blob`` is this rank's piece.  Its
  ``shape`` is the logical shape; its ops and reads go to the global
  interpreter that ``pyflow.distributed`` installs
  (``interpreter.global_interpreter``), as OneFlow picks its
  EagerGlobalInterpreter for global inputs (and the methods that are not ops to
  its ``global_methods``: ``tensor_methods.py``).

This module holds the class, its attributes, reading values and copying; every other
method (``x.sum()``, ``x.add_(y)``, ``x.view(...)``, ``x.to(...)``, ``x.backward()``) is in
one table, ``METHODS`` in ``pyflow/framework/tensor_methods.py``, which sets them on the class.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from pyflow import vm
from pyflow.device import Device, DeviceType
from pyflow.errors import ArgumentTypeError, DTypeError, ShapeError
from pyflow.framework import args
from pyflow.framework.dtypes import BOOL, DEFAULT_FLOAT, DEFAULT_INT, as_dtype, is_scalar, names, result_type
from pyflow.framework import interpreter, tensor_str
from pyflow.framework.interpreter import apply, describe, global_interpreter
from pyflow.kernels.layout import contiguous_strides
from pyflow.vm.eager_blob_object import EagerBlobObject

__all__ = ["Tensor", "tensor", "as_tensor_like", "eagerly"]


class _StorageHandle:
    """Alive while some tensor uses the storage; its death queues a ReleaseTensor."""

    __slots__ = ("storage", "__weakref__")

    def __init__(self, storage):
        self.storage = storage
        vm.get_vm().watch(self, storage)


class _Version:
    """How many in-place writes a storage has had (shared by all its views; autograd will check it)."""

    __slots__ = ("value",)

    def __init__(self):
        self.value = 0


class Tensor:
    """An eager tensor on a device (``flow.tensor(...)``, or the result of an op).

    ``flow.Tensor(2, 3)`` is, as ``torch.Tensor(2, 3)``, an uninitialised float32
    tensor (``flow.Tensor([1, 2])``: float32 data); ``flow.Tensor`` is also the
    class for ``isinstance`` checks.
    """

    # _autograd: None, or pyflow.autograd's AutogradMeta (requires_grad, grad, grad_fn) for this tensor
    __slots__ = ("_blob", "_handle", "_versions", "_global", "_autograd", "__weakref__")
    __array_priority__ = 100  # numpy scalars defer to our operators

    def __init__(self, *size, dtype=None, device=None):
        if len(size) == 1 and isinstance(size[0], (list, np.ndarray)):
            made = tensor(size[0], dtype=dtype or DEFAULT_FLOAT, device=device or "cpu")
        else:
            from pyflow.framework.creation import empty

            made = empty(*(size or (0,)), dtype=dtype or DEFAULT_FLOAT, device=device)   # Tensor(): shape (0,)
        self._blob, self._handle, self._versions, self._global = made._blob, made._handle, made._versions, None
        self._autograd = None

    @classmethod
    def _wrap(cls, blob: EagerBlobObject, handle: _StorageHandle, versions: _Version) -> "Tensor":
        """The tensor of ``blob`` (how every op makes its results; skips ``__init__``)."""
        t = object.__new__(cls)
        t._blob, t._handle, t._versions, t._global, t._autograd = blob, handle, versions, None, None
        return t

    @classmethod
    def over_blob(cls, blob, handle: _StorageHandle | None) -> "Tensor":
        """A tensor over ``blob``, memory that ``handle`` keeps alive (None: a blob without memory, nn.Graph's
        lazy tensors), with a version counter of its own (a view shares its base's instead: ``_view``)."""
        return cls._wrap(blob, handle, _Version())

    @classmethod
    def _empty(cls, device, shape, dtype) -> "Tensor":
        blob = EagerBlobObject.empty(Device(device), shape, dtype)
        return cls.over_blob(blob, _StorageHandle(blob.storage))

    @classmethod
    def _new(cls, device, shape, dtype, nbytes, strides) -> "Tensor":
        """A fresh tensor from an op's inferred output: shape (a tuple of ints), np.dtype, byte size
        and contiguous strides, all computed once per signature (``interpreter.Inferred``)."""
        blob = EagerBlobObject.of_new_storage(device, shape, dtype, nbytes, strides)
        t = object.__new__(cls)
        t._blob, t._handle, t._versions, t._global, t._autograd = blob, _StorageHandle(blob.storage), _Version(), \
            None, None
        return t

    def _view(self, shape, strides, offset) -> "Tensor":
        lazy = interpreter._lazy_tracer
        if lazy is not None and lazy.active():   # inside nn.Graph.build a view of a captured tensor is an op
            return lazy.view(self, shape, strides, offset)
        return Tensor._wrap(self._blob.view(shape, strides, offset), self._handle, self._versions)

    def _bump_version(self) -> None:
        self._versions.value += 1

    # --- attributes ---------------------------------------------------------------------

    @property
    def shape(self) -> tuple:
        """The shape (of a global tensor: the logical shape, not this rank's piece's)."""
        info = self._global
        return self._blob.shape if info is None else info.shape

    @property
    def dtype(self) -> np.dtype:
        return self._blob.dtype

    @property
    def device(self) -> Device:
        if self._global is not None:
            raise ArgumentTypeError(f"a global tensor has no device but a placement ({self._global.placement}); "
                                    "this rank's piece is .to_local()")
        return self._blob.device

    @property
    def is_global(self) -> bool:
        """Is this a global tensor (a placement and an SBP) rather than a local one?"""
        return self._global is not None

    @property
    def is_local(self) -> bool:
        return self._global is None

    @property
    def placement(self):
        """The placement of a global tensor (``flow.placement``)."""
        if self._global is None:
            raise ArgumentTypeError("a local tensor has no placement: make it global with .to_global(placement, sbp)")
        return self._global.placement

    @property
    def sbp(self) -> tuple:
        """The SBP of a global tensor: a tuple, one per axis of the placement's hierarchy."""
        if self._global is None:
            raise ArgumentTypeError("a local tensor has no sbp: make it global with .to_global(placement, sbp)")
        return self._global.sbp

    @property
    def is_cuda(self) -> bool:
        """On a CUDA device (a global tensor: its placement is of type "cuda", as in OneFlow)."""
        if self._global is not None:
            return self._global.placement.type == "cuda"
        return self.device.device_type is DeviceType.cuda

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def _version(self) -> int:
        """In-place writes to this tensor's storage so far (through any view)."""
        return self._versions.value

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return math.prod(self.shape)

    def element_size(self) -> int:
        return self.dtype.itemsize

    def size(self, dim: int | None = None):
        """The shape; ``size(d)``: the size of dim ``d``."""
        return self.shape if dim is None else self.shape[args.dim(dim, self.ndim, "size", self)]

    def stride(self, dim: int | None = None):
        """Strides in elements (``stride(d)``: of dim ``d``)."""
        strides = self._blob.strides
        return strides if dim is None else strides[args.dim(dim, self.ndim, "stride", self)]

    def is_contiguous(self) -> bool:
        blob = self._blob
        return all(n == 1 or s == c for n, s, c in zip(blob.shape, blob.strides, contiguous_strides(blob.shape)))

    # --- reading values (the only waits) ---------------------------------------------------

    def numpy(self) -> np.ndarray:
        """A numpy copy of the values; waits for the ops that produce them.

        ``OpError`` if the op that wrote them, or one they were computed from, failed.
        A global tensor gives its whole logical value on every rank (every rank must call it).
        """
        if self._global is not None:
            return global_interpreter().numpy(self)
        on_host = self.device.device_type is DeviceType.cpu
        source = self if on_host or self.is_contiguous() else self.contiguous()
        box: dict = {}
        done = threading.Event()

        def read(ep_stream, blob):  # captures no tensor: the instruction must not keep one alive
            try:
                if not on_host:
                    ep_stream.sync()  # the kernels that write the blob have run (or failed) by now
                if blob.storage.failure is None:
                    array = blob.array()
                    if on_host:  # a CPU stream runs inline
                        box["value"] = np.array(array, copy=True)
                    else:
                        host = np.empty(blob.shape, blob.dtype)
                        ep_stream.memcpy_d2h(host, array)
                        ep_stream.sync()
                        box["value"] = host
                box["failure"] = blob.storage.failure
            except BaseException as error:  # noqa: BLE001 - handed to the reader below
                box["error"] = error
            finally:
                done.set()

        machine = vm.get_vm()
        vm.run(lambda builder: builder.access_blob_by_callback(source._blob, read, "const", name="numpy"))
        machine.wait_until(done.is_set, f"numpy() of {describe(self)}", drive=machine.sync_mode)
        if "error" in box:
            raise box["error"]
        failure = box["failure"]
        if failure is not None:
            failure.reported = True
            raise failure.to_error(reading=f"reading {describe(self)}")
        return box["value"]

    def item(self):
        if self.numel() != 1:
            raise ShapeError(f"item() needs a tensor with one element, got shape {self.shape} ({describe(self)})")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """numpy's protocol (``np.asarray(x)``): the values, always a fresh copy."""
        if copy is False:
            raise ValueError("a pyflow tensor cannot be seen by numpy without a copy (use copy=None)")
        values = self.numpy()
        return values if dtype is None else values.astype(dtype, copy=False)

    def __repr__(self) -> str:
        """As PyTorch prints it: ``tensor([1., 2.], device='cuda:0', requires_grad=True)``.

        Reads the values, so it waits for them (a global tensor's: every rank must
        print it); the rules are in ``pyflow/framework/tensor_str.py``.
        """
        return tensor_str.tensor_str(self)

    def __str__(self) -> str:
        return tensor_str.tensor_str(self)

    def __format__(self, spec: str) -> str:
        """``f"{loss:.3f}"`` formats a 0-d tensor's value; other tensors take only ``f"{t}"`` (``str``)."""
        return tensor_str.format_tensor(self, spec)

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

    def __index__(self) -> int:
        """An integer tensor with one element, used as a size or an index."""
        if self.dtype.kind not in "iu":
            raise TypeError(f"only integer tensors can be used as an index, not {describe(self)}")
        return int(self.item())

    __hash__ = object.__hash__  # == is elementwise, identity stays the hash

    # --- moving and copying -----------------------------------------------------------------

    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def cuda(self, index: int | None = None) -> "Tensor":
        """A copy on ``cuda:index`` (no index: this rank's GPU, ``cuda:<local rank>``)."""
        return self.to(Device("cuda", index))

    def type_as(self, other: "Tensor") -> "Tensor":
        """This tensor with ``other``'s dtype."""
        return self.to(dtype=other.dtype)

    def clone(self) -> "Tensor":
        """A copy with its own storage (contiguous), on the same device."""
        return apply("contiguous", [self])[0]

    def detach(self) -> "Tensor":
        """The same storage and version counter, outside any autograd history (``requires_grad`` False)."""
        copy = Tensor._wrap(self._blob, self._handle, self._versions)
        copy._global = self._global
        return copy

    def contiguous(self) -> "Tensor":
        """``self`` if contiguous, else a contiguous copy."""
        return self if self.is_contiguous() else self.clone()


def _as_array(data, dtype) -> np.ndarray:
    """A C-contiguous numpy copy of ``data`` with the dtype torch would give it."""
    op = "tensor"
    if dtype is not None:
        dtype = as_dtype(dtype, op)
    if isinstance(data, (np.ndarray, np.generic)):
        probe = np.asarray(data)
        if dtype is None:
            dtype = as_dtype(probe.dtype, op)   # numpy's dtype is kept, if supported
    else:
        try:
            probe = np.asarray(data)
        except ValueError as error:  # ragged nested lists
            raise ShapeError(f"{op}: the data has no rectangular shape ({error})") from None
    if probe.dtype.kind not in "biuf":
        raise DTypeError(f"{op}: cannot make a tensor from {type(data).__name__} data of dtype {probe.dtype}; "
                         f"supported dtypes: {names()}")
    if dtype is None:  # Python numbers: torch's defaults
        dtype = {"f": DEFAULT_FLOAT, "b": BOOL}.get(probe.dtype.kind, DEFAULT_INT)
    try:
        with np.errstate(all="raise"):
            return np.array(probe, dtype=dtype, copy=True, order="C")
    except (ValueError, OverflowError, FloatingPointError) as error:
        raise DTypeError(f"{op}: cannot convert the data to {dtype}: {error}") from None


def tensor(data, dtype=None, device=None, placement=None, sbp=None, requires_grad: bool = False) -> Tensor:
    """A new tensor holding a copy of ``data`` (numpy array, nested lists, scalar, tensor) on ``device``.

    Python floats become float32, ints int64, bools bool (torch's defaults); a
    numpy array keeps its dtype.  With ``placement=`` and ``sbp=`` (instead of
    ``device=``): a global tensor whose logical value is ``data`` (the same on
    every rank; parallel_id 0's wins).  ``requires_grad=True`` makes it a leaf
    that autograd records (``pyflow/autograd/``); a tensor given as ``data`` is
    copied without its history, as ``torch.tensor`` does.

    >>> tensor([[1, 2], [3, 4]]).dtype, tensor(np.zeros(2, np.float16)).dtype
    (dtype('int64'), dtype('float16'))
    """
    result = _new_tensor(data, dtype, device, placement, sbp)
    return result.requires_grad_(True) if requires_grad else result


def eagerly(make) -> Tensor:
    """``make()``, run eagerly even inside nn.Graph.build: a tensor made from data there (``flow.tensor``,
    ``flow.ones(..., placement=, sbp=)``) is made now and used by the graph as a variable (OneFlow: a
    constant of the job), as a captured tensor is; recorded, its ops would have no data to start from."""
    lazy = interpreter._lazy_tracer
    if lazy is not None and lazy.active():
        with lazy.paused():
            return make()
    return make()


def _new_tensor(data, dtype, device, placement, sbp) -> Tensor:
    if placement is not None or sbp is not None:
        if device is not None:
            raise ArgumentTypeError("tensor(): give device= for a local tensor or placement= and sbp= for a "
                                    "global one, not both")
        values = data.numpy() if isinstance(data, Tensor) else _as_array(data, dtype)
        return eagerly(lambda: global_interpreter().tensor(values, values.dtype if dtype is None else dtype,
                                                           placement, sbp))
    device = "cpu" if device is None else device
    if isinstance(data, Tensor):
        return data.detach().to(device=device, dtype=dtype, copy=True)
    device = args.device(device, "tensor")
    array = _as_array(data, dtype)
    result = Tensor._empty(device, array.shape, array.dtype)

    def fill(ep_stream, blob):
        target = blob.array()
        if blob.device.device_type is DeviceType.cpu:
            target[...] = array
        else:  # in stream order (an asynchronous device)
            ep_stream.memcpy_h2d(target, array)

    vm.run(lambda builder: builder.access_blob_by_callback(result._blob, fill, "mut", name="tensor"))
    return result


def as_tensor_like(value, like: Tensor) -> Tensor:
    """``value`` as a tensor on ``like``'s device (a Python scalar: ``like``'s dtype if it converts)."""
    if isinstance(value, Tensor):
        return value
    if is_scalar(value):
        return tensor(value, dtype=result_type(like, value), device=like.device)
    if isinstance(value, (list, tuple, np.ndarray, np.generic)):
        return tensor(value, device=like.device)
    raise ArgumentTypeError(f"expected a tensor or a number, got {type(value).__name__}: {value!r:.60}")
