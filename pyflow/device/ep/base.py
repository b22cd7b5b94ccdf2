"""Seed 000: the ep ("execution provider") interface -- OneFlow's ``ep::Device``,
``ep::Stream`` and ``ep::Event`` -- plus ``RawBuffer``, what ``ep::Device::Alloc``
hands back.

Providers implement these: ``cpu.py`` (numpy, work runs inline), ``cuda.py``
(numba.cuda on a real GPU), ``emulated.py`` (asynchronous streams as worker
threads: CUDA in the simulator, and ``mock`` devices). ``pyflow.device.ep``
(the registry) picks one per device.

Error contract shared by every provider:
- ``alloc`` raises ``MemoryError`` when the device is out of memory (the caching
  allocator catches it, shrinks its cache and retries);
- an exception raised by work queued on a stream never escapes ``launch``: it is
  kept (with the task's and the stream's names) and raised as
  ``StreamExecutionError`` by the next ``sync()`` of that stream, which clears it;
- bad arguments (wrong shapes, a view past the end of a buffer) raise at once;
- an interrupt (``is_interrupt``: Ctrl-C, or a debugger's quit) raised by work run inline
  (step-through mode) is not kept: it goes up to the user at once.

Who ran when (``set_work_owner``): launching is not running (a stream runs its work later,
in order).  Work launched while a thread has a *work owner* set reports to that owner when it
runs, on the thread that runs it: ``owner.ran(stream, task, started, finished)``
(``time.perf_counter()`` seconds).  The VM sets one per instruction while ``flow.trace()``
records, so a kernel's time is the kernel's op's, not that of whatever waits for it.  The
emulated and CPU streams report as they run the work; a real GPU's stream times it with CUDA
timing events and reports once they are done (``cuda.py``).
"""

from __future__ import annotations

import abc
import bdb
import dataclasses
import itertools
import threading
import time
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from pyflow.device.device import Device as DeviceSymbol
from pyflow.device.device import DeviceType
from pyflow.errors import DoubleFreeError, InvalidFreeError

__all__ = ["RawBuffer", "LiveBuffers", "EpDevice", "EpStream", "Event", "view_extent", "numpy_view", "is_interrupt",
           "unmasked", "set_work_owner", "work_owner", "run_reported"]


def is_interrupt(error: BaseException) -> bool:
    """Does ``error`` stop the user's program rather than fail one piece of work?

    Ctrl-C and ``SystemExit`` (no ``Exception`` subclasses), and pdb's ``q``: it raises
    ``bdb.BdbQuit``, an ``Exception``, at whatever line the program is, a kernel's included.  Kept as
    a task's or an op's error, a quit would end nothing: the program went on and failed later.

    >>> is_interrupt(KeyboardInterrupt()), is_interrupt(bdb.BdbQuit()), is_interrupt(ValueError())
    (True, True, False)
    """
    return not isinstance(error, Exception) or isinstance(error, bdb.BdbQuit)


def unmasked(error: BaseException) -> BaseException:
    """The interrupt ``error`` hides, if it was raised while one went up; else ``error`` itself.

    A Ctrl-C lands at any bytecode, so also in the window where ``threading.Condition.wait`` has let
    its lock go and not yet taken it back (the simulator's launching thread waits so).  The
    ``with lock:`` around it then raises ``RuntimeError: release unlocked lock`` *while the
    ``KeyboardInterrupt`` goes up*: the interrupt is only that error's ``__context__``.  Kept as
    the op's failure, it was lost, and an internal error became the op's.  So whoever keeps a
    kernel's error looks behind it first, and raises the interrupt it finds (marked not to show the
    lock's error as its context when it goes up from that handler).

    >>> try:
    ...     try:
    ...         raise KeyboardInterrupt
    ...     finally:
    ...         raise RuntimeError("release unlocked lock")
    ... except RuntimeError as error:
    ...     type(unmasked(error)).__name__, type(unmasked(ValueError())).__name__
    ('KeyboardInterrupt', 'ValueError')
    """
    seen, cause = set(), error
    while cause is not None and id(cause) not in seen:
        if is_interrupt(cause):
            if cause is not error:
                cause.__suppress_context__ = True
            return cause
        seen.add(id(cause))
        cause = cause.__context__
    return error


_launching = threading.local()


def set_work_owner(owner):
    """Work this thread launches from now on reports to ``owner`` (None: nobody) when it runs; returns
    the previous owner, to set back (see the module docstring)."""
    previous = getattr(_launching, "owner", None)
    _launching.owner = owner
    return previous


def work_owner():
    """The calling thread's work owner (what a stream's ``launch`` keeps with the task), or None."""
    return getattr(_launching, "owner", None)


def run_reported(owner, stream, fn: Callable[..., Any], args: tuple, name: str) -> None:
    """Run ``fn(*args)``, task ``name`` of ``stream``, and tell ``owner`` (if any) when it ran."""
    if owner is None:
        fn(*args)
        return
    started = time.perf_counter()
    try:
        fn(*args)
    finally:
        owner.ran(stream, name, started, time.perf_counter())


@dataclasses.dataclass(eq=False)
class RawBuffer:
    """One raw device allocation (what OneFlow's ``Alloc`` writes into ``void** ptr``).

    ``ptr`` is the base address, ``nbytes`` the usable size, ``handle`` the object
    keeping the memory alive (a numpy uint8 array, or numba's device pointer), and
    ``device`` the pyflow ``Device`` it lives on. Compared by identity.
    """

    ptr: int
    nbytes: int
    handle: Any
    device: DeviceSymbol


class LiveBuffers:
    """The buffers a device handed out and has not taken back; catches bad frees."""

    def __init__(self, device: DeviceSymbol) -> None:
        self.device = device
        self._live: dict[int, RawBuffer] = {}
        self._freed: "weakref.WeakSet[RawBuffer]" = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, raw: RawBuffer) -> RawBuffer:
        """Record a freshly allocated buffer; returns it."""
        with self._lock:
            self._live[raw.ptr] = raw
        return raw

    def remove(self, raw: RawBuffer) -> None:
        """Forget ``raw``; ``DoubleFreeError`` / ``InvalidFreeError`` if it is not live here."""
        with self._lock:
            if self._live.get(getattr(raw, "ptr", None)) is not raw:
                if isinstance(raw, RawBuffer) and raw in self._freed:
                    raise DoubleFreeError(f"buffer at {raw.ptr:#x} on {self.device} was already freed")
                raise InvalidFreeError(f"{raw!r} was not allocated by {self.device}")
            del self._live[raw.ptr]
            self._freed.add(raw)


class Event(abc.ABC):
    """A marker in a stream's work (OneFlow ``ep::Event``; CUDA event semantics).

    An event that was never recorded counts as done; recording it again makes it
    stand for the newer point (``query_done`` / ``sync`` look at the latest record).
    """

    @abc.abstractmethod
    def query_done(self) -> bool:
        """True when all work queued before the latest ``record_event`` has finished."""

    @abc.abstractmethod
    def sync(self) -> None:
        """Block the calling thread until ``query_done()`` is true."""


class EpStream(abc.ABC):
    """An in-order queue of work on one device (OneFlow ``ep::Stream``).

    Work launched on one stream runs in launch order; work on different streams
    may run in any order unless ordered with ``record_event`` / ``wait_event``.
    """

    device: "EpDevice"
    name: str

    @property
    def native(self) -> Any:
        """The numba stream to pass to kernel launches on a GPU; 0 elsewhere."""
        return 0

    def busy(self) -> tuple | None:
        """What the stream is executing now: ``(task name, seconds so far)``, or None when idle.

        For hang reports.  A stream whose host cannot see its device work (a GPU)
        answers ``("device work", None)``: it may be busy.  Default: idle (inline streams).
        """
        return None

    @abc.abstractmethod
    def launch(self, fn: Callable[..., Any], *args: Any, name: str | None = None) -> None:
        """Enqueue ``fn(*args)`` after the work already queued; may return before it ran.

        ``name`` (default ``fn.__name__``) identifies the task in error messages.
        """

    @abc.abstractmethod
    def memcpy_h2d(self, dst_dev: Any, src_host: np.ndarray) -> None:
        """Stream-ordered copy of a host array into a device array of the same shape/dtype."""

    @abc.abstractmethod
    def memcpy_d2h(self, dst_host: np.ndarray, src_dev: Any) -> None:
        """Stream-ordered copy of a device array into a host array of the same shape/dtype."""

    @abc.abstractmethod
    def memcpy_d2d(self, dst: Any, src: Any) -> None:
        """Stream-ordered copy between two device arrays of the same shape/dtype."""

    @abc.abstractmethod
    def record_event(self, event: Event) -> None:
        """Make ``event`` stand for "everything queued on this stream so far"."""

    @abc.abstractmethod
    def wait_event(self, event: Event) -> None:
        """Later work on this stream waits until ``event``'s recorded work is done.

        The host does not block. Waiting on a never-recorded event waits for nothing;
        the record that counts is the latest one *at the time of this call*.
        """

    @abc.abstractmethod
    def sync(self) -> None:
        """Block the host until everything queued so far is done.

        Raises ``StreamExecutionError`` (``from`` the original exception) if a task
        failed since the last ``sync``; the error is then cleared.
        """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.device.device}/{self.name}>"


class EpDevice(abc.ABC):
    """One physical (or emulated) device (OneFlow ``ep::Device``; ``Device`` is the symbol that names it).

    Keeps track of the streams it created so ``close()`` can destroy them.
    """

    def __init__(self, device: DeviceSymbol) -> None:
        self.device = device
        self._streams: list[EpStream] = []
        self._stream_serial = itertools.count()

    def _name_and_serial(self, name: str | None) -> tuple[str, int]:
        """(``name`` or ``stream<n>``, n) where n counts this device's streams from 0."""
        serial = next(self._stream_serial)
        return (name if name is not None else f"stream{serial}"), serial

    @property
    def device_type(self) -> DeviceType:
        """The device's type (OneFlow ``device_type()``)."""
        return self.device.device_type

    @property
    def device_index(self) -> int:
        """The device's index (OneFlow ``device_index()``)."""
        return self.device.index

    @abc.abstractmethod
    def create_stream(self, name: str | None = None, inline: bool = False) -> EpStream:
        """A new stream on this device; ``name`` defaults to ``stream<n>``.

        ``inline=True`` asks for a stream whose work runs on the caller's thread when
        launched (for step-through debugging); providers whose host side is inline
        anyway (CPU, a real GPU) ignore it.
        """

    @abc.abstractmethod
    def destroy_stream(self, stream: EpStream) -> None:
        """Finish the stream's queued work and release it; raises its pending error."""

    @abc.abstractmethod
    def create_event(self) -> Event:
        """A new, never-recorded (hence done) event."""

    def destroy_event(self, event: Event) -> None:
        """Release an event (nothing to do for most providers)."""

    @abc.abstractmethod
    def alloc(self, nbytes: int) -> RawBuffer:
        """Allocate ``nbytes`` of device memory; ``MemoryError`` when out of memory."""

    @abc.abstractmethod
    def free(self, raw: RawBuffer) -> None:
        """Give back a buffer from ``alloc``; ``InvalidFreeError`` for one it never gave."""

    @abc.abstractmethod
    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        """Allocate ``nbytes`` of page-locked host memory, as a numpy uint8 array."""

    def free_pinned(self, arr: np.ndarray) -> None:
        """Give back a buffer from ``alloc_pinned`` (freed when unreferenced)."""

    def set_as_active(self) -> None:
        """Make this the calling thread's current device (cudaSetDevice); no-op by default."""

    @abc.abstractmethod
    def as_array(
        self,
        raw: RawBuffer,
        offset: int,
        shape: Sequence[int],
        dtype: Any,
        strides: Sequence[int] | None = None,
    ) -> Any:
        """An array over bytes ``[offset, offset + extent)`` of ``raw``, of the kind this
        device's kernels take (numpy on CPU and mock, ``FakeCUDAArray`` in the CUDA
        simulator, ``DeviceNDArray`` on a GPU). Writes through it change ``raw``.
        ``ValueError`` if the view would reach outside ``raw``.
        """

    def close(self) -> None:
        """Destroy every stream this device created; raise the first pending error."""
        first: BaseException | None = None
        for stream in list(self._streams):
            try:
                self.destroy_stream(stream)
            except Exception as error:  # keep closing the others
                first = first or error
        if first is not None:
            raise first

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.device}>"


def view_extent(offset: int, shape: Sequence[int], dtype: Any, strides: Sequence[int] | None) -> tuple:
    """Validate a view request; return (shape, dtype, strides, nbytes spanned).

    C-contiguous strides when ``strides`` is None. Negative strides and offsets are
    rejected (a view is described from its lowest byte).
    """
    dtype = np.dtype(dtype)
    shape = tuple(map(int, shape))
    if shape and min(shape) < 0:
        raise ValueError(f"negative dimension in shape {shape}")
    if strides is None:
        strides, step = [], dtype.itemsize
        for n in reversed(shape):
            strides.insert(0, step)
            step *= max(n, 1)
    strides = tuple(map(int, strides))
    if len(strides) != len(shape):
        raise ValueError(f"strides {strides} do not match shape {shape}")
    if (strides and min(strides) < 0) or offset < 0:
        raise ValueError(f"negative offset or strides (offset={offset}, strides={strides})")
    if 0 in shape:
        return shape, dtype, strides, 0
    extent = dtype.itemsize
    for n, s in zip(shape, strides):
        extent += (n - 1) * s
    return shape, dtype, strides, extent


def numpy_view(
    raw: RawBuffer, buffer: np.ndarray, offset: int, shape: Sequence[int], dtype: Any, strides: Sequence[int] | None
) -> np.ndarray:
    """A numpy array over ``buffer`` (a uint8 array of ``raw.nbytes``) at ``offset``."""
    shape, dtype, strides, extent = view_extent(offset, shape, dtype, strides)
    if offset + extent > raw.nbytes:
        raise ValueError(
            f"view of {extent} bytes at offset {offset} ({shape}, {dtype}) reaches past the end of a "
            f"{raw.nbytes}-byte buffer on {raw.device}"
        )
    return np.ndarray(shape, dtype, buffer=buffer, offset=int(offset), strides=strides)
