"""Seed 000: the CUDA execution provider on a real GPU (OneFlow ``ep::CudaDevice`` /
``ep::CudaStream`` / ``ep::CudaEvent``), over numba.cuda.

Used only when ``pyflow.kernels.backend.is_gpu()``; under the simulator the
registry uses ``emulated.py`` instead. Every numba call runs inside
``with cuda.gpus[index]:`` so the device's primary context is current on whatever
thread calls (the VM calls from its worker threads).

``launch`` runs ``fn`` right away on the caller's thread: ``fn`` launches kernels
with ``stream.native``, and those run asynchronously on the GPU. An exception from
``fn`` (the host side of a launch) is kept for the next ``sync()``, as on every
provider; an asynchronous device error surfaces from ``sync()`` as well.

Who ran when (``base.set_work_owner``): the host cannot see a kernel start, so work launched (or a
copy queued) while the thread has a work owner is put between two timing events
(``cuda.event(timing=True)``) recorded on the stream, and reported to the owner once the end event is
done: at the stream's ``sync()``, or when a later timed launch finds it done (``event.query()``).  GPU
times become ``time.perf_counter()`` seconds through the stream's *anchor*: an event recorded and
synchronized once, at the first timed launch, with the perf_counter read right after its synchronize
(``started = anchor_host + anchor.elapsed_time(start) / 1000``).  So the times are exact relative to
each other and off by the anchor's latency (the time from the GPU reaching the anchor to the host
returning from its synchronize: microseconds) in absolute terms.  Without a work owner (the common
case) no event is made and nothing is recorded.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from pyflow.device.device import Device as DeviceSymbol
from pyflow.device.ep import base
from pyflow.device.ep.cpu import CpuEvent, TaskErrors, check_copy, task_name
from pyflow.errors import AllocationError, StreamExecutionError
from pyflow.kernels.backend import cuda

__all__ = ["CudaDevice", "CudaStream", "CudaEvent", "gpu_count"]


def gpu_count() -> int:
    """How many GPUs numba sees (raises numba's ``CudaSupportError`` without a driver)."""
    return len(cuda.gpus)


def _is_out_of_memory(error: BaseException) -> bool:
    """Whether a numba ``CudaAPIError`` is CUDA_ERROR_OUT_OF_MEMORY."""
    driver = cuda.cudadrv.driver
    return isinstance(error, driver.CudaAPIError) and (
        error.code == driver.binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY or "OUT_OF_MEMORY" in str(error.code)
    )


class CudaEvent(base.Event):
    """A ``cuda.event()`` (never recorded: done, as in CUDA)."""

    def __init__(self, device: "CudaDevice") -> None:
        self.device = device
        with device.activated():
            self.native = cuda.event(timing=False)

    def query_done(self) -> bool:
        """``cudaEventQuery`` == success."""
        with self.device.activated():
            return self.native.query()

    def sync(self) -> None:
        """``cudaEventSynchronize``."""
        with self.device.activated():
            self.native.synchronize()


class CudaStream(base.EpStream):
    """A ``cuda.stream()``; kernels launched with ``native`` are queued on it."""

    def __init__(self, device: "CudaDevice", name: str) -> None:
        self.device = device
        self.name = name
        self.destroyed = False
        self._errors = TaskErrors(f"{device.device}/{name}")
        self._anchor: tuple | None = None   # (the anchor event, perf_counter right after it was reached)
        self._timed: list = []              # (owner, task, start event, end event), in stream order
        self._timed_lock = threading.Lock()
        with device.activated():
            self._native = cuda.stream()

    @property
    def native(self) -> Any:
        """The numba stream (``kernel[grid, block, stream.native](...)``)."""
        return self._native

    def busy(self) -> tuple:
        """The host cannot see what a GPU stream is doing: it may be busy."""
        return ("device work", None)

    def launch(self, fn: Callable[..., Any], *args: Any, name: str | None = None) -> None:
        """Run ``fn(*args)`` now with the device active; its kernels run asynchronously."""
        if self.destroyed:
            raise StreamExecutionError(f"stream {self.device.device}/{self.name} was destroyed")
        try:
            self._enqueue(fn, args, name)
        except Exception as error:
            self._errors.add(task_name(fn, name), error)

    def _enqueue(self, fn: Callable[..., Any], args: tuple, name: str | None) -> None:
        """``fn(*args)`` with the device active; timed on the stream when the thread has a work owner."""
        owner = base.work_owner()
        with self.device.activated():
            if owner is None:
                fn(*args)
                return
            if self._anchor is None:
                anchor = cuda.event(timing=True)
                anchor.record(self._native)
                anchor.synchronize()
                self._anchor = (anchor, time.perf_counter())
            self._report()   # what finished meanwhile: the pending list stays short
            start, end = cuda.event(timing=True), cuda.event(timing=True)
            start.record(self._native)
            try:
                fn(*args)
            finally:   # (a failed launch still reports: what it queued before failing ran)
                end.record(self._native)
                with self._timed_lock:
                    self._timed.append((owner, task_name(fn, name), start, end))

    def _report(self) -> None:
        """Tell the owner of each timed task whose end event is done when it ran.  Events of one stream
        complete in order: the first not done ends the look.  (Asked even right after a ``synchronize``:
        another thread may have recorded an end event since.)"""
        with self._timed_lock:
            done = 0
            for _, _, _, end in self._timed:
                if not end.query():
                    break
                done += 1
            finished, self._timed[:done] = self._timed[:done], []
        if not finished:
            return
        anchor, anchor_host = self._anchor
        for owner, task, start, end in finished:
            owner.ran(self, task, anchor_host + anchor.elapsed_time(start) / 1000,
                      anchor_host + anchor.elapsed_time(end) / 1000)

    def memcpy_h2d(self, dst_dev: Any, src_host: np.ndarray) -> None:
        """Async copy (truly asynchronous when ``src_host`` is pinned)."""
        check_copy(dst_dev, src_host)
        self._enqueue(dst_dev.copy_to_device, (src_host, self._native), "memcpy_h2d")

    def memcpy_d2h(self, dst_host: np.ndarray, src_dev: Any) -> None:
        """Async copy (truly asynchronous when ``dst_host`` is pinned)."""
        check_copy(dst_host, src_dev)
        self._enqueue(src_dev.copy_to_host, (dst_host, self._native), "memcpy_d2h")

    def memcpy_d2d(self, dst: Any, src: Any) -> None:
        """Async device-to-device copy."""
        check_copy(dst, src)
        self._enqueue(dst.copy_to_device, (src, self._native), "memcpy_d2d")

    def record_event(self, event: base.Event) -> None:
        """``cudaEventRecord(event, stream)``."""
        if not isinstance(event, CudaEvent):
            raise TypeError(f"record_event on {self!r} needs a CudaEvent, got {type(event).__name__}")
        with self.device.activated():
            event.native.record(self._native)

    def wait_event(self, event: base.Event) -> None:
        """``cudaStreamWaitEvent`` (a foreign, non-CPU event is waited for on the host)."""
        if isinstance(event, CudaEvent):
            with self.device.activated():
                event.native.wait(self._native)
        elif not isinstance(event, CpuEvent):
            event.sync()

    def sync(self) -> None:
        """``cudaStreamSynchronize``; raise a kept launch error or a device error."""
        try:
            with self.device.activated():
                self._native.synchronize()
                self._report()
        except cuda.cudadrv.driver.CudaAPIError as error:
            with self._timed_lock:   # (a failed GPU times nothing more)
                self._timed.clear()
            raise StreamExecutionError(f"stream {self.device.device}/{self.name} failed on the GPU: {error}") from error
        self._errors.raise_pending()


class CudaDevice(base.EpDevice):
    """One GPU: numba streams and events, ``memalloc`` memory, ``DeviceNDArray`` views."""

    def __init__(self, device: DeviceSymbol) -> None:
        super().__init__(device)
        self._gpu = cuda.gpus[device.index]
        self.buffers = base.LiveBuffers(device)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def activated(self) -> Iterator[None]:
        """Make this GPU's primary context current on the calling thread for the block."""
        with self._gpu:
            yield

    def set_as_active(self) -> None:
        """``cudaSetDevice``: this GPU becomes the calling thread's current device."""
        cuda.select_device(self.device.index)

    def create_stream(self, name: str | None = None, inline: bool = False) -> CudaStream:
        """A new non-default CUDA stream (its host side is inline anyway)."""
        stream = CudaStream(self, self._name_and_serial(name)[0])
        with self._lock:
            self._streams.append(stream)
        return stream

    def destroy_stream(self, stream: base.EpStream) -> None:
        """Synchronise the stream and drop it (numba frees it when unreferenced)."""
        with self._lock:
            if stream in self._streams:
                self._streams.remove(stream)
        if not stream.destroyed:
            stream.destroyed = True
            stream.sync()

    def create_event(self) -> CudaEvent:
        """A new event (timing disabled, the cheap kind)."""
        return CudaEvent(self)

    def alloc(self, nbytes: int) -> base.RawBuffer:
        """``cudaMalloc`` through numba's context (not zeroed); ``MemoryError`` when the GPU is full."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise AllocationError(f"cannot allocate {nbytes!r} bytes on {self.device}: need an int >= 0")
        try:
            with self.activated():
                memory = cuda.current_context().memalloc(max(int(nbytes), 1))  # cuMemAlloc(0) fails
        except cuda.cudadrv.driver.CudaAPIError as error:
            if _is_out_of_memory(error):
                raise MemoryError(f"{self.device} is out of memory: cudaMalloc({nbytes}) failed: {error}") from error
            raise
        ptr = int(memory.device_pointer_value)
        return self.buffers.add(base.RawBuffer(ptr=ptr, nbytes=int(nbytes), handle=memory, device=self.device))

    def free(self, raw: base.RawBuffer) -> None:
        """Give ``raw`` back: numba's ``cudaFree`` runs once no ``as_array`` view of it is left.

        numba counts the references to an allocation.  ``memalloc`` hands out one
        counted pointer (``raw.handle``) and every ``as_array`` view takes another,
        each with a ``weakref.finalize`` that drops its count and, at zero, frees the
        allocation (it runs numba's finalizer, which queues ``cuMemFree``).  Forcing
        that finalizer here with ``memory.free()`` ran it while views were still
        alive; when the last of them died (at interpreter exit, in weakref's exit
        hook, after the VM's shutdown had shrunk its caching allocators) numba freed
        the allocation a second time and printed "RuntimeError: Freeing dead memory".
        So pyflow only drops its own reference: numba frees the memory when the last
        view is gone, which is at once when none is left, and a view that outlives
        the free never points at freed memory.  (Freed memory goes to numba's list
        of pending frees, which it flushes in batches and before retrying an
        allocation that ran out of memory.)
        """
        self.buffers.remove(raw)
        memory, raw.handle = raw.handle, None
        with self.activated():
            del memory  # the last reference may go here: numba then frees with this GPU's context current

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        """``cudaMallocHost`` as a numpy uint8 array (freed when unreferenced)."""
        with self.activated():
            return cuda.pinned_array(int(nbytes), dtype=np.uint8)

    def as_array(self, raw: base.RawBuffer, offset: int, shape: Sequence[int], dtype: Any, strides=None) -> Any:
        """A ``DeviceNDArray`` over ``raw.handle.view(offset, offset + extent)``."""
        if raw.device is not self.device or raw.handle is None:
            raise ValueError(f"buffer at {raw.ptr:#x} is not a live buffer of {self.device}")
        shape, dtype, strides, extent = base.view_extent(offset, shape, dtype, strides)
        if offset + extent > raw.nbytes:
            raise ValueError(
                f"view of {extent} bytes at offset {offset} ({shape}, {dtype}) reaches past the end of a "
                f"{raw.nbytes}-byte buffer on {self.device}"
            )
        with self.activated():
            return cuda.cudadrv.devicearray.DeviceNDArray(
                shape, strides, dtype, gpu_data=raw.handle.view(int(offset), int(offset) + extent)
            )
