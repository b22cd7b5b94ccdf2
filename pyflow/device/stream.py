"""Seed 000: ``StreamType``, its traits, the ``Stream`` symbol and ``StreamMgr``
(OneFlow's ``stream_type.h``, ``oneflow::Stream`` = ``Symbol<Stream>``, and the
``StreamMgr`` that hands out ``unique_stream_id``).

A ``Stream`` here is a *description* (which device, what kind of work, which
worker thread launches it); the VM turns each into a ``VmStream`` (``pyflow.vm.stream``)
and that, lazily, into an ``EpStream`` that really queues work (``pyflow.device.ep``).

Stream traits (each a pure function of the stream type and, where it matters,
the device type; "gpu-like" means any device type except cpu)::

    stream type        need_soft_sync   supports_stream_wait  on_independent_thread  allocator_stream_type
    compute            gpu-like         cuda only             no                     compute
    host2device        no               cuda only             no                     compute
    device2host        no               cuda only             no                     device2host
    ccl                no               cuda only             no                     compute
    barrier            no               no                    no                     None
    critical_section   no               no                    yes                    None
    lazy_job_launcher  no               no                    yes                    None
    pinned_compute     gpu-like         cuda only             no                     pinned_compute

thread_uid (which VM worker thread launches the stream's work)::

    0  WORKER_THREAD_UID: the one worker shared by all streams of one device type
       (OneFlow has one ThreadCtx per device type), so the VM keys that worker by
       (device type, 0);
    1  critical_section's own thread;   2  lazy_job_launcher's own thread;
    3+ free for callers that ask for a dedicated worker (Stream.new(..., thread_uid=n)).

>>> s = Stream.new("cuda:0")
>>> s.stream_type, s.thread_uid, s.support_wait_event
(<StreamType.compute: 1>, 0, True)
>>> StreamMgr.stream_for_id(s.unique_stream_id) is s
True
"""

from __future__ import annotations

import enum
import operator
import threading

from pyflow.device.device import Device, DeviceLike, DeviceType
from pyflow.errors import StreamTypeError

__all__ = [
    "StreamType",
    "need_soft_sync",
    "supports_stream_wait",
    "on_independent_thread",
    "allocator_stream_type",
    "WORKER_THREAD_UID",
    "INDEPENDENT_THREAD_UID",
    "Stream",
    "StreamMgr",
    "default_stream",
]


class StreamType(enum.Enum):
    """What kind of work a stream carries (OneFlow ``StreamType``, without kInvalid)."""

    compute = 1            # kernel computation
    host2device = 2        # copies host -> device
    device2host = 3        # copies device -> host
    ccl = 4                # collective communication
    barrier = 5            # thread barrier (runs on the VM scheduler thread)
    critical_section = 6   # critical section (lazy mode), own thread
    lazy_job_launcher = 7  # launches lazy jobs, own thread
    pinned_compute = 8     # kernels whose outputs live in pinned host memory

    @classmethod
    def parse(cls, name: "str | StreamType") -> "StreamType":
        """The stream type called ``name``; ``StreamTypeError`` listing valid names otherwise.

        >>> StreamType.parse("compute")
        <StreamType.compute: 1>
        """
        if isinstance(name, StreamType):
            return name
        if isinstance(name, str) and name in cls.__members__:
            return cls[name]
        valid = ", ".join(cls.__members__)
        raise StreamTypeError(f"unknown stream type {name!r}: expected one of {valid}")


# --- traits (pure functions: the table in the module docstring) ---------------------

_SOFT_SYNC = frozenset({StreamType.compute, StreamType.pinned_compute})
_STREAM_WAIT = frozenset(
    {StreamType.compute, StreamType.host2device, StreamType.device2host, StreamType.ccl, StreamType.pinned_compute}
)
_INDEPENDENT = frozenset({StreamType.critical_section, StreamType.lazy_job_launcher})
_ALLOCATOR_STREAM = {
    StreamType.compute: StreamType.compute,
    StreamType.host2device: StreamType.compute,
    StreamType.ccl: StreamType.compute,
    StreamType.pinned_compute: StreamType.pinned_compute,
    StreamType.device2host: StreamType.device2host,
}


def need_soft_sync(stream_type: StreamType, device_type: DeviceType) -> bool:
    """Whether a RecordEvent on this stream must really record (compute-like, non-CPU)."""
    return stream_type in _SOFT_SYNC and device_type is not DeviceType.cpu


def supports_stream_wait(stream_type: StreamType, device_type: DeviceType) -> bool:
    """Whether another stream can wait on this one on the device (no host round trip)."""
    return stream_type in _STREAM_WAIT and device_type is DeviceType.cuda


def on_independent_thread(stream_type: StreamType) -> bool:
    """Whether the stream's work runs on its own worker thread, not the device type's."""
    return stream_type in _INDEPENDENT


def allocator_stream_type(stream_type: StreamType) -> StreamType | None:
    """The stream type whose allocator serves this stream (None: it allocates nothing)."""
    return _ALLOCATOR_STREAM.get(stream_type)


WORKER_THREAD_UID = 0
INDEPENDENT_THREAD_UID = {StreamType.critical_section: 1, StreamType.lazy_job_launcher: 2}


# --- the Stream symbol and StreamMgr --------------------------------------------------


class Stream:
    """An interned stream symbol: (device, stream_type, thread_uid, support_wait_event).

    Build with ``Stream.new``; the same key always gives the same object, with the
    same dense ``unique_stream_id`` (0, 1, 2, ... in process-wide creation order).
    Immutable, hashable, picklable (unpickling returns the interned object).
    """

    __slots__ = ("_device", "_stream_type", "_thread_uid", "_support_wait_event", "_unique_stream_id")

    def __new__(cls, *args: object, **kwargs: object) -> "Stream":
        raise TypeError("build streams with Stream.new(device, stream_type, thread_uid=None)")

    @staticmethod
    def new(
        device: DeviceLike,
        stream_type: "StreamType | str" = StreamType.compute,
        thread_uid: int | None = None,
        support_wait_event: bool | None = None,
    ) -> "Stream":
        """The stream symbol for these arguments (OneFlow ``Stream::New``).

        ``thread_uid`` defaults to ``INDEPENDENT_THREAD_UID[stream_type]`` for
        critical_section / lazy_job_launcher and to ``WORKER_THREAD_UID`` (0)
        otherwise. ``support_wait_event`` defaults to
        ``supports_stream_wait(stream_type, device.device_type)`` and may only be
        turned off, not on.
        """
        device = Device(device)
        stream_type = StreamType.parse(stream_type)
        if thread_uid is None:
            thread_uid = INDEPENDENT_THREAD_UID.get(stream_type, WORKER_THREAD_UID)
        elif isinstance(thread_uid, bool) or not hasattr(type(thread_uid), "__index__") or thread_uid < 0:
            raise StreamTypeError(f"thread_uid must be a non-negative int, got {thread_uid!r}")
        thread_uid = operator.index(thread_uid)
        can_wait = supports_stream_wait(stream_type, device.device_type)
        if support_wait_event is None:
            support_wait_event = can_wait
        elif not isinstance(support_wait_event, bool):
            raise StreamTypeError(f"support_wait_event must be a bool or None, got {support_wait_event!r}")
        elif support_wait_event and not can_wait:
            raise StreamTypeError(
                f"a {stream_type.name} stream on {device} cannot support stream wait "
                f"(only compute/host2device/device2host/ccl/pinned_compute streams on cuda can)"
            )
        return StreamMgr._get_or_create((device, stream_type, thread_uid, support_wait_event))

    # --- attributes -------------------------------------------------------------

    @property
    def device(self) -> Device:
        """The device the stream's work runs on."""
        return self._device

    @property
    def stream_type(self) -> StreamType:
        """The kind of work the stream carries."""
        return self._stream_type

    @property
    def thread_uid(self) -> int:
        """Id of the VM worker thread that launches this stream's work (see module doc)."""
        return self._thread_uid

    @property
    def support_wait_event(self) -> bool:
        """Whether other streams may wait on this one device-side (StreamWait)."""
        return self._support_wait_event

    @property
    def unique_stream_id(self) -> int:
        """Dense process-wide id in creation order (index into ``StreamMgr``)."""
        return self._unique_stream_id

    @property
    def key(self) -> tuple[Device, StreamType, int, bool]:
        """(device, stream_type, thread_uid, support_wait_event): what makes a stream."""
        return (self._device, self._stream_type, self._thread_uid, self._support_wait_event)

    @property
    def need_soft_sync(self) -> bool:
        """``need_soft_sync(self.stream_type, self.device.device_type)``."""
        return need_soft_sync(self._stream_type, self._device.device_type)

    @property
    def on_independent_thread(self) -> bool:
        """``on_independent_thread(self.stream_type)``."""
        return on_independent_thread(self._stream_type)

    # --- value semantics ------------------------------------------------------------

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Stream is immutable (tried to set {name!r})")

    def __repr__(self) -> str:
        return f"stream({self._device}, {self._stream_type.name}, uid={self._unique_stream_id})"

    __hash__ = object.__hash__  # interned: equality is identity

    def __reduce__(self) -> tuple:
        return (_stream_from_key, self.key)

    def __copy__(self) -> "Stream":
        return self

    def __deepcopy__(self, memo: dict) -> "Stream":
        return self


def _stream_from_key(device: Device, stream_type: StreamType, thread_uid: int, support_wait_event: bool) -> Stream:
    """Unpickling helper: the interned stream for a key."""
    return Stream.new(device, stream_type, thread_uid, support_wait_event)


class StreamMgr:
    """The process-wide stream table (OneFlow ``StreamMgr``): key -> symbol, id -> symbol.

    Class-level state, thread-safe. Ids are never reused: a symbol lives forever.
    """

    _lock = threading.Lock()
    _key2stream: dict[tuple, Stream] = {}
    _id2stream: list[Stream] = []

    @classmethod
    def _get_or_create(cls, key: tuple[Device, StreamType, int, bool]) -> Stream:
        found = cls._key2stream.get(key)  # fast path: dict reads are atomic
        if found is not None:
            return found
        with cls._lock:
            found = cls._key2stream.get(key)
            if found is None:
                found = object.__new__(Stream)
                for name, value in zip(Stream.__slots__, (*key, len(cls._id2stream))):
                    object.__setattr__(found, name, value)
                cls._id2stream.append(found)
                cls._key2stream[key] = found
            return found

    @classmethod
    def stream_for_id(cls, unique_stream_id: int) -> Stream:
        """The stream whose ``unique_stream_id`` this is; ``KeyError`` if none yet."""
        if isinstance(unique_stream_id, bool) or not isinstance(unique_stream_id, int) or unique_stream_id < 0:
            raise KeyError(f"no stream with unique_stream_id {unique_stream_id!r}")
        streams = cls._id2stream
        if unique_stream_id >= len(streams):
            raise KeyError(f"no stream with unique_stream_id {unique_stream_id} ({len(streams)} streams exist)")
        return streams[unique_stream_id]

    @classmethod
    def num_streams(cls) -> int:
        """How many stream symbols exist (the next id to be handed out)."""
        return len(cls._id2stream)


_default_streams: dict = {}


def default_stream(device: DeviceLike) -> Stream:
    """The device's default stream: ``Stream.new(device, StreamType.compute)``."""
    found = _default_streams.get(device)
    if found is None:
        found = _default_streams[device] = Stream.new(device, StreamType.compute)
    return found
