"""``flow.load``: the object tree back from a ``flow.save`` archive, never trusting its bytes (``__init__.py``).

``load`` checks the archive (a zip with ``data.json`` of this format and version, else a
``SerializationError`` naming the file), then ``_Reader`` rebuilds each node: containers and
plain values, arrays read with ``allow_pickle=False``, tensors put where ``map_location`` says
(a global tensor on its saved placement and SBP), and pickles only with ``weights_only=False``.
Every malformed node is a ``SerializationError``, never a crash deeper in.
"""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import re
import struct
import zipfile
import zlib

import numpy as np

from pyflow.device import Device
from pyflow.errors import ArgumentTypeError, DeviceError, SerializationError
from pyflow.framework import args
from pyflow.framework.dtypes import SUPPORTED_DTYPES
from pyflow.framework.placement import placement as Placement
from pyflow.framework.sbp import SbpParallel
from pyflow.framework.tensor import Tensor, tensor
from pyflow.nn.parameter import Parameter
from pyflow.serialization.writer import DATA, FORMAT, PLAIN, VERSION, location_of, name_of

__all__ = ["load"]

_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")   # a zip's first member, or an empty zip
_SBP = re.compile(r"S\((\d+)\)|B|P")
# what zipfile and numpy raise for damaged bytes (struct, zlib: a damaged header, a foreign deflated member;
# RuntimeError: a flipped "encrypted" flag; NotImplementedError: a flipped compression method)
_DAMAGED = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, struct.error, zlib.error,
            NotImplementedError, RuntimeError)


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
            self.mapping = {(location_of(k) if isinstance(k, Device) else k): v for k, v in map_location.items()}
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
        if kind in PLAIN:
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
    name = name_of(f)
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
        raw = archive.read(DATA)
    except KeyError:
        raise SerializationError(f"load: {name} is a zip archive but not one flow.save wrote (no {DATA}; a "
                                 "PyTorch checkpoint or an .npz?)", path=name) from None
    except _DAMAGED as error:
        raise SerializationError(f"load: {name} is truncated or corrupt: {error}", path=name) from None
    with archive:
        try:
            header = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as error:   # (UnicodeDecodeError is a ValueError)
            raise SerializationError(f"load: {name} is corrupt: its {DATA} is not JSON ({error})", path=name) from None
        if type(header) is not dict or header.get("format") != FORMAT:
            raise SerializationError(f"load: {name} is a zip archive but not one flow.save wrote", path=name)
        if header.get("version") != VERSION:
            raise SerializationError(f"load: {name} has format version {header.get('version')!r}; this pyflow "
                                     f"reads version {VERSION} (was it written by a newer pyflow?)", path=name)
        try:
            return _Reader(archive, name, map_location, weights_only).node(header.get("root"), "obj")
        except RecursionError:
            raise SerializationError(f"load: {name} is nested too deeply to load", path=name) from None
