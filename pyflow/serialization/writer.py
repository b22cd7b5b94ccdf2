"""``flow.save``: an object tree written as a zip of JSON nodes and .npy members (the format: ``__init__.py``).

``_Writer`` walks the tree: a plain value stays itself, a container becomes a tagged node, a
tensor or an array becomes a .npy member (each tensor object once), and anything else is
pickled, its tensors still going to .npy files.  ``save`` builds the whole archive before a
byte reaches ``f``: to a path through a temporary file renamed over it.  The format's names
(``FORMAT``, ``VERSION``, the ``DATA`` member, the ``PLAIN`` types, ``location_of`` a device)
live here; ``reader.py`` reads them.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import pickle
import uuid
import zipfile

import numpy as np

from pyflow.device import Device, DeviceType
from pyflow.errors import ArgumentTypeError, SerializationError
from pyflow.framework.tensor import Tensor
from pyflow.nn.parameter import Parameter

__all__ = ["save", "FORMAT", "VERSION", "DATA", "PLAIN", "location_of", "name_of"]

FORMAT, VERSION = "pyflow.save", 1
DATA = "data.json"
PLAIN = (type(None), bool, int, float, str)   # exact types: JSON keeps them apart (1, 1.0, True)
_CONTAINERS = (list, tuple, dict, collections.OrderedDict)


def location_of(device: Device) -> str:
    """PyTorch's location tag of a device: ``"cpu"`` or ``"cuda:<index>"``."""
    return "cpu" if device.device_type is DeviceType.cpu else f"cuda:{device.index}"


def name_of(f) -> str:
    """The path ``f`` names, or a file object's name, for messages."""
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.fsdecode(f)
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else f"<{type(f).__name__} object>"


def _write_array(member, values: np.ndarray) -> None:
    """One array as .npy bytes into an open zip member (no pickles: object arrays are refused)."""
    np.save(member, values, allow_pickle=False)


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
        if kind in PLAIN:
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
            node["device"] = location_of(t.device)
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
        archive.writestr(DATA, json.dumps({"format": FORMAT, "version": VERSION, "root": root}))


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
        _write_zip(obj, buffer, name_of(f))
        f.write(buffer.getvalue())
    else:
        raise ArgumentTypeError(f"save: f must be a path (str, os.PathLike) or a binary file object with write(), "
                                f"got {type(f).__name__}")
