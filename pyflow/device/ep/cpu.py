"""Seed 000: the CPU execution provider (OneFlow ``ep::CpuDevice`` / ``ep::CpuStream`` /
``ep::CpuEvent``), plus ``HostMemory``, the numpy-backed memory that the CPU and the
emulated providers share.

OneFlow's CPU stream computes synchronously on its VM worker thread, so here
``launch`` runs the work inline on the caller's thread and every event is always
done. A task's exception is still kept and raised by the next ``sync()``, exactly
as on an asynchronous stream, so code written against one provider works on all.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np

from pyflow.device.device import Device as DeviceSymbol
from pyflow.device.ep import base
from pyflow.errors import AllocationError, StreamExecutionError

__all__ = ["ALIGNMENT", "HostMemory", "HostMemoryDevice", "TaskErrors", "CpuDevice", "CpuStream", "CpuEvent"]

ALIGNMENT = 512  # every buffer's ptr is a multiple of this, like cudaMalloc's (>= 256)


class HostMemory:
    """numpy uint8 buffers with ``ptr`` aligned to ``ALIGNMENT``, bookkeeping, optional limit.

    ``limit`` (bytes, None = unlimited) lets tests make a device run out of memory.
    """

    def __init__(self, device: DeviceSymbol, limit: int | None = None) -> None:
        self.device = device
        self.limit = limit
        self.bytes_in_use = 0
        self.buffers = base.LiveBuffers(device)
        self._lock = threading.Lock()

    def alloc(self, nbytes: int) -> base.RawBuffer:
        """A fresh zero-filled buffer; ``MemoryError`` past ``limit`` (or when numpy fails)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise AllocationError(f"cannot allocate {nbytes!r} bytes on {self.device}: need an int >= 0")
        nbytes = int(nbytes)
        with self._lock:
            if self.limit is not None and self.bytes_in_use + nbytes > self.limit:
                raise MemoryError(
                    f"{self.device} is out of memory: asked for {nbytes} bytes, {self.bytes_in_use} of "
                    f"{self.limit} bytes in use"
                )
            self.bytes_in_use += nbytes
        try:
            backing = np.zeros(max(nbytes, 1) + ALIGNMENT, dtype=np.uint8)
        except MemoryError:
            with self._lock:
                self.bytes_in_use -= nbytes
            raise
        start = (-backing.ctypes.data) % ALIGNMENT
        handle = backing[start : start + max(nbytes, 1)]
        return self.buffers.add(
            base.RawBuffer(ptr=handle.ctypes.data, nbytes=nbytes, handle=handle, device=self.device))

    def free(self, raw: base.RawBuffer) -> None:
        """Forget ``raw``; ``DoubleFreeError`` / ``InvalidFreeError`` if it is not live here."""
        self.buffers.remove(raw)
        with self._lock:
            self.bytes_in_use -= raw.nbytes
        raw.handle = None  # drop the memory; later views through raw fail loudly

    def view(self, raw: base.RawBuffer, offset: int, shape: Sequence[int], dtype: Any, strides) -> np.ndarray:
        """A numpy view into a live buffer (see ``base.EpDevice.as_array``)."""
        if raw.device is not self.device:
            raise ValueError(f"buffer at {raw.ptr:#x} lives on {raw.device}, not {self.device}")
        if raw.handle is None:
            raise ValueError(f"buffer at {raw.ptr:#x} on {self.device} was freed")
        return base.numpy_view(raw, raw.handle, offset, shape, dtype, strides)


class TaskErrors:
    """The errors of failed tasks on one stream, kept until the next ``sync()``."""

    def __init__(self, stream_name: str) -> None:
        self.stream_name = stream_name
        self._errors: list[tuple[str, BaseException]] = []
        self._lock = threading.Lock()

    def add(self, task_name: str, error: BaseException) -> None:
        """Remember that task ``task_name`` raised ``error``."""
        with self._lock:
            self._errors.append((task_name, error))

    def raise_pending(self) -> None:
        """Raise ``StreamExecutionError`` for the first kept error (then forget them all)."""
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            task, error = errors[0]
            more = f" (and {len(errors) - 1} later failed task(s))" if len(errors) > 1 else ""
            failure = StreamExecutionError(
                f"task {task!r} on stream {self.stream_name!r} failed: {type(error).__name__}: {error}{more}"
            )
            failure.task = task  # the VM names the failed op with it
            raise failure from error


def task_name(fn: Callable[..., Any], name: str | None) -> str:
    """The name a task is reported under: ``name`` or the function's name."""
    return name or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def check_copy(dst: Any, src: Any) -> None:
    """``ValueError`` unless ``dst`` and ``src`` have the same shape and dtype."""
    if tuple(dst.shape) != tuple(src.shape) or np.dtype(dst.dtype) != np.dtype(src.dtype):
        raise ValueError(f"memcpy between {src.dtype}{tuple(src.shape)} and {dst.dtype}{tuple(dst.shape)}: "
                         "shapes and dtypes must match")


class CpuEvent(base.Event):
    """A CPU event: work is done when ``launch`` returns, so it is always done."""

    def query_done(self) -> bool:
        """Always True."""
        return True

    def sync(self) -> None:
        """Nothing to wait for."""


class CpuStream(base.EpStream):
    """A CPU stream: ``launch`` runs the work now, on the caller's thread."""

    def __init__(self, device: "CpuDevice", name: str) -> None:
        self.device = device
        self.name = name
        self.destroyed = False
        self._errors = TaskErrors(f"{device.device}/{name}")

    def launch(self, fn: Callable[..., Any], *args: Any, name: str | None = None) -> None:
        """Run ``fn(*args)`` now; its exception is kept for the next ``sync()``."""
        if self.destroyed:
            raise StreamExecutionError(f"stream {self.device.device}/{self.name} was destroyed")
        try:
            base.run_reported(base.work_owner(), self, fn, args, task_name(fn, name))
        except Exception as error:
            error = base.unmasked(error)
            if base.is_interrupt(error):   # (pdb's quit, or a Ctrl-C hidden by a lock's error: base.unmasked)
                raise error
            self._errors.add(task_name(fn, name), error)

    def memcpy_h2d(self, dst_dev: np.ndarray, src_host: np.ndarray) -> None:
        """Copy now (host and "device" are the same memory)."""
        check_copy(dst_dev, src_host)
        self.launch(np.copyto, dst_dev, src_host, name="memcpy_h2d")

    def memcpy_d2h(self, dst_host: np.ndarray, src_dev: np.ndarray) -> None:
        """Copy now."""
        check_copy(dst_host, src_dev)
        self.launch(np.copyto, dst_host, src_dev, name="memcpy_d2h")

    def memcpy_d2d(self, dst: np.ndarray, src: np.ndarray) -> None:
        """Copy now."""
        check_copy(dst, src)
        self.launch(np.copyto, dst, src, name="memcpy_d2d")

    def record_event(self, event: base.Event) -> None:
        """Nothing to record: all earlier work is already done."""

    def wait_event(self, event: base.Event) -> None:
        """Wait on the host for a foreign (non-CPU) event; CPU events are done already."""
        if not isinstance(event, CpuEvent):
            event.sync()

    def sync(self) -> None:
        """Everything already ran; raise a kept task error, if any."""
        self._errors.raise_pending()


class HostMemoryDevice(base.EpDevice):
    """A device whose memory is host memory (``HostMemory``): the CPU and emulated devices.

    ``memory_limit`` (bytes) or ``device.memory.limit`` make ``alloc`` run out of
    memory, for allocator tests.
    """

    def __init__(self, device: DeviceSymbol, memory_limit: int | None = None) -> None:
        super().__init__(device)
        self.memory = HostMemory(device, memory_limit)

    def alloc(self, nbytes: int) -> base.RawBuffer:
        """A zero-filled numpy buffer; ``MemoryError`` past the memory limit."""
        return self.memory.alloc(nbytes)

    def free(self, raw: base.RawBuffer) -> None:
        """Release a buffer from ``alloc``."""
        self.memory.free(raw)

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        """Host memory is already host memory: a plain numpy uint8 array."""
        return np.zeros(nbytes, dtype=np.uint8)


class CpuDevice(HostMemoryDevice):
    """The CPU (always ``cpu:0``): numpy memory, inline streams, always-done events."""

    def create_stream(self, name: str | None = None, inline: bool = False) -> CpuStream:
        """A new inline stream (CPU streams are always inline)."""
        stream = CpuStream(self, self._name_and_serial(name)[0])
        self._streams.append(stream)
        return stream

    def destroy_stream(self, stream: base.EpStream) -> None:
        """Mark the stream destroyed and raise its pending error, if any."""
        if stream in self._streams:
            self._streams.remove(stream)
        stream.destroyed = True
        stream.sync()

    def create_event(self) -> CpuEvent:
        """A new (always done) event."""
        return CpuEvent()

    def as_array(self, raw: base.RawBuffer, offset: int, shape: Sequence[int], dtype: Any, strides=None) -> np.ndarray:
        """A numpy view into ``raw``."""
        return self.memory.view(raw, offset, shape, dtype, strides)
