"""Seed 000: ``DeviceType`` and ``Device`` -- OneFlow's ``device_type.proto`` enum and
``oneflow::Device`` (``Symbol<Device>``), the interned (type, index) pair behind
``flow.tensor(..., device="cuda:1")``.

Lowest layer of pyflow: imports nothing from pyflow but ``pyflow.errors`` and
``pyflow.env`` (the rank context).  Whether an index really exists (cuda:9 on a
1-GPU machine) is *not* checked here; the ep registry
(``pyflow.device.ep.get_device``) checks that.  A device type without an index
means the calling rank's own device, as in OneFlow: ``Device("cuda")`` is
``cuda:<local rank>`` (``cuda:0`` outside ``flow.distributed.run``; the one cpu is ``cpu:0``).

>>> Device("cuda:1")
device(type='cuda', index=1)
>>> Device("cuda", 1) is Device("cuda:1") is Device(DeviceType.cuda, 1)
True
>>> str(Device("cpu"))
'cpu:0'
"""

from __future__ import annotations

import enum
import operator
import re
import threading
from typing import Union

from pyflow.errors import DeviceError

__all__ = ["DeviceType", "Device", "DeviceLike"]


class DeviceType(enum.Enum):
    """Kinds of device (OneFlow: ``kInvalidDevice``, ``kCPU``, ``kCUDA``, ``kMockDevice``).

    ``mock`` is a pseudo device for tests: it behaves like an accelerator with
    asynchronous streams but its kernels take numpy arrays.
    """

    invalid = 0
    cpu = 1
    cuda = 2
    mock = 3

    @classmethod
    def parse(cls, name: "str | DeviceType") -> "DeviceType":
        """The valid (non-``invalid``) device type called ``name``; ``DeviceError`` otherwise.

        >>> DeviceType.parse("cuda")
        <DeviceType.cuda: 2>
        """
        if isinstance(name, DeviceType):
            member = name
        elif isinstance(name, str) and name in cls.__members__:
            member = cls[name]
        else:
            raise DeviceError(f"unknown device type {name!r}: expected one of {_valid_types()}")
        if member is DeviceType.invalid:
            raise DeviceError(f"device type 'invalid' cannot be used: expected one of {_valid_types()}")
        return member


def _valid_types() -> str:
    return ", ".join(t.name for t in DeviceType if t is not DeviceType.invalid)


# "type" or "type:index"; the type is a word, the index ASCII digits (sign kept for the message).
_SPEC = re.compile(r"(?P<type>[A-Za-z_][A-Za-z0-9_]*)(?::(?P<index>-?[0-9]+))?", re.ASCII)

DeviceLike = Union["Device", str, DeviceType]


class Device:
    """An interned device symbol: one object per (device type, index), forever.

    Accepted spellings (all return the *same* object for the same key)::

        Device("cuda:1")   Device("cuda", 1)   Device(DeviceType.cuda, 1)
        Device("cuda")     # the calling rank's: index = its local rank (0 outside ranks)
        Device(existing_device)

    Attributes: ``type`` (``"cuda"``), ``device_type`` (``DeviceType.cuda``), ``index``.
    ``str(d)`` is ``"cuda:1"`` and ``Device(str(d)) is d`` for every device.
    Immutable, hashable (by identity, which equals by key), picklable (unpickling
    returns the interned object). Bad input raises ``DeviceError``.
    """

    __slots__ = ("_device_type", "_index", "__weakref__")

    _interned: dict[tuple[DeviceType, int], "Device"] = {}
    _lock = threading.Lock()

    def __new__(cls, spec: DeviceLike, index: int | None = None) -> "Device":
        if isinstance(spec, Device):
            if index is not None:
                raise DeviceError(f"index given twice: {spec!r} already has index {spec.index}, got index={index!r}")
            return spec
        if isinstance(spec, DeviceType):
            device_type = DeviceType.parse(spec)
            idx = _default_index(device_type) if index is None else _check_index(index, spec.name)
        elif isinstance(spec, str):
            device_type, parsed = _parse_spec(spec)
            if parsed is not None and index is not None:
                raise DeviceError(f"index given twice: {spec!r} already names index {parsed}, got index={index!r}")
            idx = parsed if parsed is not None else (
                _default_index(device_type) if index is None else _check_index(index, spec))
        else:
            raise DeviceError(
                f"cannot make a device from {type(spec).__name__} {spec!r}: expected a string like "
                f"'cuda:1', a DeviceType, or a Device"
            )
        return cls._intern(device_type, idx)

    @classmethod
    def _intern(cls, device_type: DeviceType, index: int) -> "Device":
        key = (device_type, index)
        found = cls._interned.get(key)  # fast path: dict reads are atomic
        if found is not None:
            return found
        with cls._lock:
            found = cls._interned.get(key)
            if found is None:
                found = object.__new__(cls)
                object.__setattr__(found, "_device_type", device_type)
                object.__setattr__(found, "_index", index)
                cls._interned[key] = found
            return found

    # --- attributes -------------------------------------------------------------

    @property
    def type(self) -> str:
        """The device type's name, e.g. ``"cuda"`` (as in torch / oneflow)."""
        return self._device_type.name

    @property
    def device_type(self) -> DeviceType:
        """The device type as an enum member."""
        return self._device_type

    @property
    def index(self) -> int:
        """The device index (OneFlow: ``device_id``)."""
        return self._index

    # --- value semantics ----------------------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Device is immutable (tried to set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Device is immutable (tried to delete {name!r})")

    def __repr__(self) -> str:
        return f"device(type={self.type!r}, index={self._index})"

    def __str__(self) -> str:
        return f"{self.type}:{self._index}"

    # Interned: equality is identity, so the default identity hash is right (and fast).
    __hash__ = object.__hash__

    def __reduce__(self) -> tuple:
        return (Device, (self.type, self._index))

    def __copy__(self) -> "Device":
        return self

    def __deepcopy__(self, memo: dict) -> "Device":
        return self


def _default_index(device_type: DeviceType) -> int:
    """The index a bare device type means: the calling rank's local rank (OneFlow's Device::New(type));
    the one cpu is always cpu:0."""
    if device_type is DeviceType.cpu:
        return 0
    from pyflow import env

    return env.current().local_rank


def _parse_spec(spec: str) -> tuple[DeviceType, int | None]:
    """Split ``"cuda:1"`` into (DeviceType.cuda, 1); ``"cuda"`` gives (DeviceType.cuda, None)."""
    match = _SPEC.fullmatch(spec)
    if match is None:
        raise DeviceError(
            f"malformed device string {spec!r}: expected 'type' or 'type:index' with no spaces, "
            f"type one of {_valid_types()} and index a non-negative integer (e.g. 'cuda:1')"
        )
    device_type = DeviceType.parse(match["type"])
    if match["index"] is None:
        return device_type, None
    index = int(match["index"])
    if index < 0:
        raise DeviceError(f"negative device index in {spec!r}: the index must be >= 0")
    return device_type, index


def _check_index(index: object, what: str) -> int:
    """``index`` as a non-negative int; ``DeviceError`` for bools, floats, negatives."""
    if isinstance(index, bool) or not hasattr(type(index), "__index__"):
        raise DeviceError(
            f"device index for {what!r} must be a non-negative int, got {type(index).__name__} {index!r}"
        )
    value = operator.index(index)
    if value < 0:
        raise DeviceError(f"negative device index {value} for {what!r}: the index must be >= 0")
    return value
