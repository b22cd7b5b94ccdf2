"""``flow.save`` and ``flow.load``: checkpoints a course can trust (``torch.save`` / ``torch.load``).

**What is saved.**  ``obj`` is a tree: dicts, OrderedDicts, lists and tuples whose leaves are
tensors, numpy arrays and scalars, and plain values (None, bool, int, float, str, bytes).
Module and optimizer state dicts are such trees (an optimizer's integer keys stay integers,
its ``betas`` stay a tuple).  A tensor keeps its dtype, shape, values, device and
``requires_grad`` (a ``Parameter`` stays one).  A view or a non-contiguous tensor saves its
values (a contiguous copy); the same tensor object reached twice loads as one object, but
two views of one storage load as two tensors (PyTorch would keep the sharing).

**The format, and why it is safe.**  A file is a zip archive (stdlib ``zipfile``, stored)::

    data.json        {"format": "pyflow.save", "version": 1, "root": <the tree>}
    tensors/0.npy    the values of each tensor and array, in numpy's .npy format
    pickles/0.pkl    only for objects outside the vocabulary above (see weights_only)

A pickle is a program: unpickling can call any function (``os.system`` included).  Hence
PyTorch's rule, ``weights_only=True`` by default.  Here it is structural: such a load parses
JSON and reads .npy files with ``allow_pickle=False``, and never unpickles anything; a file
that would need it is refused, naming the file and the object's class.  ``save`` pickles what
lies outside the vocabulary (a custom class, a set; the tensors inside still go to .npy
files, as torch does), and ``load(..., weights_only=False)`` unpickles it: use that only for
files you trust.  A bare pickle (``pickle.dump``, torch's legacy format) is never loaded.

**Errors and atomic writes.**  A truncated, corrupt or foreign file is a ``SerializationError``
naming the file.  ``save`` to a path writes a temporary file in the same folder and renames it
over the path (``os.replace``, atomic), so an error or a crash mid-save leaves the earlier file
as it was and never a half-written one.  ``f`` may also be a binary file object (``io.BytesIO``).

**map_location** (as ``torch.load``): None restores each tensor on the device it was saved on;
a device (``"cpu"``, ``flow.device("cuda:1")``) puts every tensor there; a dict maps saved
locations (``{"cuda:0": "cpu"}``; locations are ``"cpu"`` and ``"cuda:<index>"``); a callable
``fn(tensor, location)`` gets each tensor loaded on the cpu and returns the tensor to use
(``lambda t, loc: t`` keeps all on the cpu), or None for the default.

**Global tensors are saved by value.**  ``save`` gathers each one's logical value
(``numpy()`` of a global tensor, a collective: every rank calls ``save`` with the same
object, as every rank must call ``numpy()``) and records its placement and SBP.  Why: the
file then does not depend on how many ranks wrote it, a checkpoint from N ranks opens in a
one-process script, and a ``partial_sum`` tensor, whose pieces mean nothing alone, is saved as
its sum.  Each rank writes the same content (to a path, the last rename wins; readers never see
a partial file).  ``load`` (every rank calls it) rebuilds the global tensor on the saved
placement and SBP (``flow.tensor(value, placement=, sbp=)``); with ``map_location`` a device,
it returns the logical value as a local tensor there instead.

>>> import io, pyflow as flow
>>> buffer = io.BytesIO()
>>> flow.save({"w": flow.tensor([[1.0, 2.0]], requires_grad=True), "step": 3}, buffer)
>>> _ = buffer.seek(0)
>>> loaded = flow.load(buffer)
>>> loaded["w"].tolist(), loaded["w"].requires_grad, loaded["step"]
([[1.0, 2.0]], True, 3)
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import pickle
import re
import struct
import uuid
import zipfile
import zlib

import numpy as np

from pyflow.device import Device, DeviceType
from pyflow.errors import ArgumentTypeError, DeviceError, SerializationError
from pyflow.framework import args
from pyflow.framework.dtypes import SUPPORTED_DTYPES
from pyflow.framework.placement import placement as Placement
from pyflow.framework.sbp import SbpParallel
from pyflow.framework.tensor import Tensor, tensor
from pyflow.nn.parameter import Parameter

__all__ = ["save", "load"]

FORMAT, VERSION = "pyflow.save", 1
_DATA = "data.json"
_PLAIN = (type(None), bool, int, float, str)   # exact types: JSON keeps them apart (1, 1.0, True)
_CONTAINERS = (list, tuple, dict, collections.OrderedDict)
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")   # a zip's first member, or an empty zip
_SBP = re.compile(r"S\((\d+)\)|B|P")
# what zipfile and numpy raise for damaged bytes (struct, zlib: a damaged header, a foreign deflated member;
# RuntimeError: a flipped "encrypted" flag; NotImplementedError: a flipped compression method)
_DAMAGED = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, struct.error, zlib.error,
            NotImplementedError, RuntimeError)


def _location(device: Device) -> str:
    """PyTorch's location tag of a device: ``"cpu"`` or ``"cuda:<index>"``."""
    return "cpu" if device.device_type is DeviceType.cpu else f"cuda:{device.index}"


def _write_array(member, values: np.ndarray) -> None:
    """One array as .npy bytes into an open zip member (no pickles: object arrays are refused)."""
    np.save(member, values, allow_pickle=False)


# --- save ---------------------------------------------------------------------------------------------------------


class _Writer:
    """Turns the object tree into JSON-able nodes, writing the arrays into the archive on the way.

    A node is a JSON scalar (a plain value), a JSON list (a Python list), or a dict tagged by
    ``"type"``: tuple, dict, ordered_dict (``items``: [key node, value node] pairs, so an int
    key stays an int), bytes, ndarray, tensor, pickle.
    """

    def __init__(self, archive: zipfile.ZipFile, name: str):
        self.archive, self.name = archive, name
        self.tensors: dict[int, tuple] = {}   # id -> (tensor, node); holding the tensor keeps its id unique
        self.files = 0
        self.open: set[int] = set()           # the containers being encoded: meeting one again is a cycle

    def node(self, obj, where: str):
        kind = type(obj)
        if kind in _PLAIN:
            return obj
        if kind is bytes:
            return {"type": "bytes", "hex": obj.hex()}
        if isinstance(obj, Tensor):
            return self.tensor(obj, where)
        if (kind is np.ndarray or isinstance(obj, np.generic)) and not obj.dtype.hasobject:
            return {"type": "ndarray", "file": self.array(np.asarray(obj)), "scalar": kind is not np.ndarray}
        if kind not in _CONTAINERS:
            return self.pickled(obj, where)
        if id(obj) in self.open:
            raise SerializationError(f"save: {where} contains itself (a cycle); cannot save it to {self.name}",
                                     path=self.name)
        self.open.add(id(obj))
        try:
            if kind is list:
                return [self.node(v, f"{where}[{i}]") for i, v in enumerate(obj)]
            if kind is tuple:
                return {"type": "tuple", "items": [self.node(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
            items = [[self.node(k, f"{where} key {k!r}"), self.node(v, f"{where}[{k!r}]")] for k, v in obj.items()]
            return {"type": "dict" if kind is dict else "ordered_dict", "items": items}
        finally:
            self.open.discard(id(obj))

    def tensor(self, t: Tensor, where: str) -> dict:
        seen = self.tensors.get(id(t))
        if seen is not None:
            return seen[1]
        values = t.detach().numpy()   # a view: its values only; a global tensor: the logical value (a collective)
        node = {"type": "tensor", "file": self.array(values), "dtype": str(values.dtype), "shape": list(values.shape),
                "requires_grad": bool(t.requires_grad), "parameter": isinstance(t, Parameter)}
        if t.is_global:
            node["placement"] = {"type": t.placement.type, "ranks": t.placement.ranks}
            node["sbp"] = [s.short() for s in t.sbp]
        else:
            node["device"] = _location(t.device)
        self.tensors[id(t)] = (t, node)
        return node

    def array(self, values: np.ndarray) -> str:
        name = f"tensors/{self.files}.npy"
        self.files += 1
        with self.archive.open(name, "w", force_zip64=values.nbytes > 2**30) as member:
            _write_array(member, values)
        return name

    def pickled(self, obj, where: str) -> dict:
        buffer = io.BytesIO()
        try:
            _TensorPickler(buffer, self, where).dump(obj)
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            raise SerializationError(f"save: cannot save {where} ({type(obj).__qualname__}) to {self.name}: it is no "
                                     f"tensor, array, container or plain value, and pickling it failed: {error}",
                                     path=self.name) from error
        name = f"pickles/{self.files}.pkl"
        self.files += 1
        self.archive.writestr(name, buffer.getvalue())
        return {"type": "pickle", "file": name, "class": f"{type(obj).__module__}.{type(obj).__qualname__}"}


class _TensorPickler(pickle.Pickler):
    """Pickles an object whose tensors go to .npy files: each tensor becomes its node (a persistent id)."""

    def __init__(self, file, writer: _Writer, where: str):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.writer, self.where = writer, where

    def persistent_id(self, obj):
        return self.writer.tensor(obj, self.where) if isinstance(obj, Tensor) else None


def _write_zip(obj, handle, name: str) -> None:
    with zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED) as archive:
        root = _Writer(archive, name).node(obj, "obj")
        archive.writestr(_DATA, json.dumps({"format": FORMAT, "version": VERSION, "root": root}))


def save(obj, f) -> None:
    """Save ``obj`` (tensors, state dicts, containers of them) to ``f``, a path or a binary file object.

    To a path: a temporary file in the same folder, renamed over ``f`` once complete.  To a
    file object: nothing is written unless the whole archive could be built.
    """
    if isinstance(f, (str, bytes, os.PathLike)):
        path = os.fsdecode(f)
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"save: the folder {folder!r} does not exist (saving to {path!r})")
        if os.path.isdir(path):
            raise IsADirectoryError(f"save: {path!r} is a folder; give a file name")
        temp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        try:
            with os.fdopen(fd, "wb") as handle:
                _write_zip(obj, handle, path)
                handle.flush()
                os.fsync(handle.fileno())   # the bytes are on disk before the name points at them
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
    elif callable(getattr(f, "write", None)):
        buffer = io.BytesIO()
        _write_zip(obj, buffer, _name_of(f))
        f.write(buffer.getvalue())
    else:
        raise ArgumentTypeError(f"save: f must be a path (str, os.PathLike) or a binary file object with write(), "
                                f"got {type(f).__name__}")


# --- load ---------------------------------------------------------------------------------------------------------


def _name_of(f) -> str:
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.fsdecode(f)
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else f"<{type(f).__name__} object>"


def _parse_sbp(text) -> SbpParallel:
    """``S(0)``, ``B`` or ``P`` (``SbpParallel.short()``) back to an SbpParallel."""
    found = _SBP.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        raise ValueError(f"bad sbp {text!r}")
    return SbpParallel("split", int(found.group(1))) if found.group(1) else \
        SbpParallel("broadcast" if text == "B" else "partial_sum")


class _Reader:
    """Rebuilds the object tree from the nodes; every malformed node is a SerializationError naming the file."""

    def __init__(self, archive: zipfile.ZipFile, name: str, map_location, weights_only: bool):
        self.archive, self.name, self.weights_only = archive, name, weights_only
        self.tensors: dict[str, Tensor] = {}   # file -> tensor: a tensor saved twice loads as one object
        self.fixed = self.mapping = self.function = None
        if isinstance(map_location, (str, Device)):
            self.fixed = args.device(map_location, "load(map_location=...)")
        elif isinstance(map_location, dict):
            self.mapping = {(_location(k) if isinstance(k, Device) else k): v for k, v in map_location.items()}
        elif callable(map_location):
            self.function = map_location
        elif map_location is not None:
            raise ArgumentTypeError(f"load: map_location must be None, a device, a dict or a callable, got "
                                    f"{type(map_location).__name__}")

    def corrupt(self, what: str) -> SerializationError:
        return SerializationError(f"load: {self.name} is corrupt: {what}", path=self.name)

    def field(self, node: dict, key: str, kind):
        value = node.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.corrupt(f"a {node.get('type')} node's {key!r} is {value!r:.60}")
        return value

    def node(self, node, where: str):
        kind = type(node)
        if kind in _PLAIN:
            return node
        if kind is list:
            return [self.node(v, f"{where}[{i}]") for i, v in enumerate(node)]
        tag = node.get("type") if kind is dict else None
        if tag == "tuple":
            return tuple(self.node(v, f"{where}[{i}]") for i, v in enumerate(self.field(node, "items", list)))
        if tag in ("dict", "ordered_dict"):
            result = {} if tag == "dict" else collections.OrderedDict()
            for pair in self.field(node, "items", list):
                if type(pair) is not list or len(pair) != 2:
                    raise self.corrupt(f"an item of {where} is {pair!r:.60}, not a [key, value] pair")
                key = self.node(pair[0], f"{where} key")
                try:
                    hash(key)
                except TypeError:
                    raise self.corrupt(f"a key of {where} is a {type(key).__name__}") from None
                result[key] = self.node(pair[1], f"{where}[{key!r}]")
            return result
        if tag == "bytes":
            try:
                return bytes.fromhex(self.field(node, "hex", str))
            except ValueError:
                raise self.corrupt(f"{where} is not hex text") from None
        if tag == "ndarray":
            values = self.array(node, where)
            return values[()] if node.get("scalar") is True else values
        if tag == "tensor":
            return self.tensor(node, where)
        if tag == "pickle":
            return self.unpickle(node, where)
        raise self.corrupt(f"{where} is an unknown node {node!r:.80}")

    def array(self, node: dict, where: str) -> np.ndarray:
        name = self.field(node, "file", str)
        try:
            with self.archive.open(name) as member:
                data = member.read()   # checks the member's CRC
            return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
        except KeyError:
            raise self.corrupt(f"{where}'s values ({name}) are missing") from None
        except _DAMAGED as error:
            raise self.corrupt(f"{where}'s values ({name}) cannot be read: {error}") from None

    def tensor(self, node: dict, where: str) -> Tensor:
        name = self.field(node, "file", str)
        if name in self.tensors:
            return self.tensors[name]
        values = self.array(node, where)
        if values.dtype not in SUPPORTED_DTYPES or str(values.dtype) != node.get("dtype") \
                or list(values.shape) != node.get("shape"):
            raise self.corrupt(f"{where}'s values are {values.dtype}{list(values.shape)}, its description says "
                               f"{node.get('dtype')}{node.get('shape')}")
        requires_grad = self.field(node, "requires_grad", bool)
        t = self.global_tensor(node, values, where) if "placement" in node else \
            self.place(values, self.field(node, "device", str), where)
        if node.get("parameter") is True:
            t = Parameter(t, requires_grad)
        elif requires_grad:
            t.requires_grad_(True)
        self.tensors[name] = t
        return t

    def device(self, spec, location: str, where: str) -> Device:
        try:
            return args.device(spec, "load")
        except DeviceError as error:
            raise SerializationError(f"load: {where} in {self.name} was saved on {location}, and {spec!r} cannot "
                                     f"be used here ({error}); pass map_location, e.g. map_location='cpu' or "
                                     f"{{'{location}': 'cpu'}}", path=self.name) from None

    def place(self, values: np.ndarray, location: str, where: str) -> Tensor:
        if self.fixed is not None:
            return tensor(values, device=self.fixed)
        if self.function is not None:
            moved = self.function(tensor(values), location)
            if moved is None:
                return tensor(values, device=self.device(location, location, where))
            if not isinstance(moved, Tensor):
                raise ArgumentTypeError(f"load: map_location returned a {type(moved).__name__} for {where}; it "
                                        "must return a tensor or None")
            return moved.detach()   # a fresh leaf, whatever the callable did
        spec = location if self.mapping is None else self.mapping.get(location, location)
        return tensor(values, device=self.device(spec, location, where))

    def global_tensor(self, node: dict, values: np.ndarray, where: str) -> Tensor:
        if self.fixed is not None:   # a device asked for: the logical value, as a local tensor
            return tensor(values, device=self.fixed)
        spec = self.field(node, "placement", dict)
        try:
            sbp = tuple(_parse_sbp(s) for s in self.field(node, "sbp", list))
        except ValueError as error:
            raise self.corrupt(f"{where}: {error}") from None
        try:
            layout = Placement(self.field(spec, "type", str), spec.get("ranks"))
            return tensor(values, placement=layout, sbp=sbp)
        except DeviceError as error:
            raise SerializationError(
                f"load: {where} in {self.name} is a global tensor on placement {spec} with sbp {node['sbp']}, "
                f"which cannot be rebuilt here ({error}); load it on every rank of a world that has those ranks, "
                "or pass map_location='cpu' to get its logical value as a local tensor", path=self.name) from None

    def unpickle(self, node: dict, where: str):
        name, cls = self.field(node, "file", str), self.field(node, "class", str)
        if self.weights_only:
            raise SerializationError(
                f"load: {self.name} holds a pickled {cls} at {where}, and weights_only=True (the default) loads "
                "only tensors, arrays, containers and plain values, because unpickling can run any code. If you "
                "trust where the file came from, load it with weights_only=False.", path=self.name)
        try:
            data = self.archive.read(name)
        except KeyError:
            raise self.corrupt(f"{where}'s pickle ({name}) is missing") from None
        try:
            return _TensorUnpickler(io.BytesIO(data), self, where).load()
        except (pickle.UnpicklingError, EOFError) as error:
            raise self.corrupt(f"{where}'s pickle ({name}): {error}") from None


class _TensorUnpickler(pickle.Unpickler):
    """The pickler's twin: a persistent id is a tensor node (only used with weights_only=False)."""

    def __init__(self, file, reader: _Reader, where: str):
        super().__init__(file)
        self.reader, self.where = reader, where

    def persistent_load(self, pid):
        if type(pid) is not dict or pid.get("type") != "tensor":
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r:.60}")
        return self.reader.tensor(pid, self.where)


def load(f, map_location=None, *, weights_only: bool = True):
    """The object that ``save`` wrote to ``f`` (a path or a binary file object); see the module docstring.

    ``SerializationError`` (naming the file) for a truncated, corrupt or foreign file, and,
    with ``weights_only=True`` (the default), for a file that holds pickled objects.
    """
    name = _name_of(f)
    if not isinstance(weights_only, bool):
        raise ArgumentTypeError(f"load: weights_only must be True or False, got {weights_only!r}")
    if isinstance(f, (str, bytes, os.PathLike)):
        with open(name, "rb") as handle:
            return _load_from(handle, name, map_location, weights_only)
    if not callable(getattr(f, "read", None)):
        raise ArgumentTypeError(f"load: f must be a path (str, os.PathLike) or a binary file object with read(), "
                                f"got {type(f).__name__}")
    seekable = callable(getattr(f, "seekable", None)) and f.seekable()
    return _load_from(f if seekable else io.BytesIO(f.read()), name, map_location, weights_only)


def _load_from(handle, name: str, map_location, weights_only: bool):
    start = handle.tell()
    head = handle.read(8)
    if not isinstance(head, bytes):
        raise ArgumentTypeError(f"load: {name} is open in text mode; open it with 'rb'")
    if head[:4] not in _ZIP_MAGIC:
        why = "is empty" if not head else "is a pickle (what pickle.dump and torch's legacy format write); pyflow " \
            "never loads a bare pickle, as unpickling can run any code" if head[:1] == b"\x80" else \
            f"does not start as a zip archive (its first bytes are {head!r})"
        raise SerializationError(f"load: {name} is not a file flow.save wrote: it {why}", path=name)
    handle.seek(start)
    try:
        archive = zipfile.ZipFile(handle)
        raw = archive.read(_DATA)
    except KeyError:
        raise SerializationError(f"load: {name} is a zip archive but not one flow.save wrote (no {_DATA}; a "
                                 "PyTorch checkpoint or an .npz?)", path=name) from None
    except _DAMAGED as error:
        raise SerializationError(f"load: {name} is truncated or corrupt: {error}", path=name) from None
    with archive:
        try:
            header = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as error:   # (UnicodeDecodeError is a ValueError)
            raise SerializationError(f"load: {name} is corrupt: its {_DATA} is not JSON ({error})", path=name) from None
        if type(header) is not dict or header.get("format") != FORMAT:
            raise SerializationError(f"load: {name} is a zip archive but not one flow.save wrote", path=name)
        if header.get("version") != VERSION:
            raise SerializationError(f"load: {name} has format version {header.get('version')!r}; this pyflow "
                                     f"reads version {VERSION} (was it written by a newer pyflow?)", path=name)
        try:
            return _Reader(archive, name, map_location, weights_only).node(header.get("root"), "obj")
        except RecursionError:
            raise SerializationError(f"load: {name} is nested too deeply to load", path=name) from None
