"""Seed 000: an *emulated asynchronous* execution provider -- what OneFlow's
``ep::CudaDevice`` / ``ep::CudaStream`` / ``ep::CudaEvent`` do on a GPU, acted out with
Python threads. Used for CUDA under the simulator (arrays are ``FakeCUDAArray``) and
for ``mock`` devices (arrays are numpy).

Numba's simulator runs every launch synchronously, so a missing stream wait never
shows there. Here each ep stream is a named worker thread draining a FIFO queue:
``launch`` enqueues and returns at once; events are real cross-thread signals;
optional seeded random delays before each task shuffle the timing so that a
missing ``wait_event`` gives a wrong answer in a test instead of passing silently::

    with emulation(max_delay=0.002, seed=123):   # streams created here sleep 0..2 ms per task
        stream = get_device("cuda:0").create_stream("compute")

``PYFLOW_EMU_MAX_DELAY_US`` / ``PYFLOW_EMU_SEED`` set the defaults (0 us: no delay).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import random
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from pyflow.device.device import Device as DeviceSymbol
from pyflow.device.ep import base
from pyflow.device.ep.cpu import CpuEvent, HostMemoryDevice, TaskErrors, check_copy, task_name
from pyflow.errors import StreamExecutionError
from pyflow.kernels.backend import cuda, is_simulator

__all__ = [
    "EmulationSettings",
    "emulation",
    "emulation_settings",
    "EmulatedEvent",
    "EmulatedStream",
    "EmulatedDevice",
    "shutdown_all_streams",
]


# --- settings ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EmulationSettings:
    """How emulated streams behave: ``max_delay`` seconds of random sleep before each
    task (0: none) drawn from a ``random.Random`` seeded from ``seed`` (None: unseeded)."""

    max_delay: float = 0.0
    seed: int | None = None


def _settings_from_env() -> EmulationSettings:
    delay_us = os.environ.get("PYFLOW_EMU_MAX_DELAY_US", "0").strip() or "0"
    seed = os.environ.get("PYFLOW_EMU_SEED", "").strip()
    return EmulationSettings(max_delay=float(delay_us) * 1e-6, seed=int(seed) if seed else None)


# Process-wide, not thread-local: the VM creates ep streams lazily on its own threads,
# and those must see the settings the test (on the main thread) chose.
_base = _settings_from_env()   # in force outside every ``emulation`` block
_open: list = []               # (token, changes) of each block open now, in the order entered
_settings = _base
_settings_lock = threading.Lock()


def emulation_settings() -> EmulationSettings:
    """The settings that streams created now will use."""
    return _settings


@contextlib.contextmanager
def emulation(max_delay: float | None = None, seed: int | None = None) -> Iterator[EmulationSettings]:
    """Within the block, new emulated streams use these settings (None: keep current).

    Process-wide (every thread sees them).  Blocks may overlap on several threads (ranks of one process)
    and close in any order: each takes away only its own changes (the environment's settings with those
    of every block still open, oldest first), as the simulator's ``configure`` does.
    """
    global _settings
    if max_delay is not None and not (isinstance(max_delay, (int, float)) and 0 <= max_delay < float("inf")):
        raise ValueError(f"max_delay must be a finite number of seconds >= 0, got {max_delay!r}")
    changes = {k: v for k, v in (("max_delay", None if max_delay is None else float(max_delay)),
                                 ("seed", seed)) if v is not None}
    token = object()
    with _settings_lock:
        _open.append((token, changes))
        _settings = current = _with_open_changes()
    try:
        yield current
    finally:
        with _settings_lock:
            _open[:] = [entry for entry in _open if entry[0] is not token]
            _settings = _with_open_changes()


def _with_open_changes() -> EmulationSettings:
    found = _base
    for _, changes in _open:
        found = dataclasses.replace(found, **changes)
    return found


# --- events and streams --------------------------------------------------------------------


class EmulatedEvent(base.Event):
    """A CUDA-like event: each ``record_event`` gives it a fresh ``threading.Event``
    that the recording stream's worker sets once it reaches that point."""

    def __init__(self) -> None:
        self._signal: threading.Event | None = None  # None: never recorded, so done
        self.recorded_on = None   # the stream of the latest record

    def query_done(self) -> bool:
        """True when the latest record was reached (or there never was one)."""
        signal = self._signal
        return signal is None or signal.is_set()

    def sync(self) -> None:
        """Block until the latest record was reached."""
        signal = self._signal
        if signal is not None:
            signal.wait()


_STOP = None  # the sentinel that ends a worker loop
_live_streams: "weakref.WeakSet[EmulatedStream]" = weakref.WeakSet()


class EmulatedStream(base.EpStream):
    """A worker thread named ``pyflow-ep-<device>-<name>`` running queued tasks in order.

    A task's exception is kept (task name + stream name) and raised by the next
    ``sync()``; later tasks still run. ``close()`` drains the queue and joins.

    The worker is a daemon thread only as a last resort: ``pyflow.device.ep.shutdown``
    (registered with ``atexit``) closes and joins every stream. atexit handlers run
    *after* the interpreter joins non-daemon threads, so a non-daemon worker idling on
    its queue would hang interpreter exit before shutdown could stop it; and a task
    that hangs must not keep the process alive.
    """

    def __init__(self, device: "EmulatedDevice", name: str, serial: int, settings: EmulationSettings,
                 inline: bool = False) -> None:
        self.device = device
        self.name = name
        self.settings = settings
        self.inline = inline  # no worker: tasks run at once on the caller (step-through mode)
        seed = None if settings.seed is None else f"{settings.seed}/{device.device}/{name}/{serial}"
        self._rng = random.Random(seed)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._errors = TaskErrors(f"{device.device}/{name}")
        self._lock = threading.Lock()  # orders "is it destroyed?" with "enqueue"
        self.destroyed = False
        self._current: tuple | None = None  # (task name, time.monotonic() it started) while one runs
        self.thread = None
        if not inline:
            self.thread = threading.Thread(target=self._worker_loop, name=f"pyflow-ep-{device.device}-{name}",
                                           daemon=True)
            self.thread.start()
        _live_streams.add(self)

    def _worker_loop(self) -> None:
        while True:
            task = self._queue.get()
            if task is _STOP:
                return
            fn, args, name, owner = task
            if self.settings.max_delay > 0:
                time.sleep(self._rng.uniform(0.0, self.settings.max_delay))
            self._current = (name, time.monotonic())
            try:
                base.run_reported(owner, self, fn, args, name)
            except BaseException as error:  # never let the worker die silently
                self._errors.add(name, error)
            finally:
                self._current = None

    def busy(self) -> tuple | None:
        """``(task name, seconds)`` of the task the worker runs now, or None.  A worker that is gone with tasks
        still queued (which should never happen) says so, so a hang report names it rather than "idle"."""
        current = self._current
        if current is not None:
            return (current[0], time.monotonic() - current[1])
        if self.thread is not None and not self.thread.is_alive() and not self.destroyed:
            return (f"nothing: its worker thread is gone, {self._queue.qsize()} task(s) still queued", None)
        return None

    def _enqueue(self, fn: Callable[..., Any], args: tuple, name: str) -> None:
        with self._lock:
            if self.destroyed:
                raise StreamExecutionError(f"stream {self.device.device}/{self.name} was destroyed")
            if not self.inline:
                self._queue.put((fn, args, name, base.work_owner()))
                return
        try:  # inline: run now, keep the error for sync() as a worker would
            base.run_reported(base.work_owner(), self, fn, args, name)
        except Exception as error:  # noqa: BLE001 - a Ctrl-C must reach the user, not wait for sync()
            error = base.unmasked(error)
            if base.is_interrupt(error):   # (pdb's quit too, and a Ctrl-C hidden by a lock's error)
                raise error
            self._errors.add(name, error)

    def launch(self, fn: Callable[..., Any], *args: Any, name: str | None = None) -> None:
        """Enqueue ``fn(*args)``; returns at once."""
        self._enqueue(fn, args, task_name(fn, name))

    def memcpy_h2d(self, dst_dev: Any, src_host: np.ndarray) -> None:
        """Enqueue a copy host -> device."""
        self._copy(dst_dev, src_host, "memcpy_h2d")

    def memcpy_d2h(self, dst_host: np.ndarray, src_dev: Any) -> None:
        """Enqueue a copy device -> host."""
        self._copy(dst_host, src_dev, "memcpy_d2h")

    def memcpy_d2d(self, dst: Any, src: Any) -> None:
        """Enqueue a copy device -> device."""
        self._copy(dst, src, "memcpy_d2d")

    def _copy(self, dst: Any, src: Any, name: str) -> None:
        check_copy(dst, src)
        self._enqueue(np.copyto, (_host_array(dst), _host_array(src)), name)

    def record_event(self, event: base.Event) -> None:
        """Give ``event`` a fresh signal, set when the worker gets here."""
        if not isinstance(event, EmulatedEvent):
            raise TypeError(f"record_event on {self!r} needs an EmulatedEvent, got {type(event).__name__}")
        signal = threading.Event()
        self._enqueue(signal.set, (), "record_event")
        event._signal, event.recorded_on = signal, self   # (where: for hang reports)

    def wait_event(self, event: base.Event) -> None:
        """Later tasks wait (on the worker, not the host) for the event's latest record."""
        if isinstance(event, EmulatedEvent):
            signal = event._signal  # captured now: a later re-record does not count
            if signal is not None:
                self._enqueue(signal.wait, (), "wait_event")
        elif not isinstance(event, CpuEvent):
            self._enqueue(event.sync, (), "wait_event")

    def sync(self) -> None:
        """Block until every task queued so far ran; raise a kept task error, if any."""
        if self.inline:
            self._errors.raise_pending()
            return
        if threading.current_thread() is self.thread:
            raise StreamExecutionError(
                f"sync() of stream {self.device.device}/{self.name} from its own task would deadlock"
            )
        done = threading.Event()
        with self._lock:
            if not self.destroyed:
                self._queue.put((done.set, (), "sync", None))
        if self.destroyed and not done.is_set():
            self.thread.join()  # destroyed: everything queued runs before the worker stops
        else:
            done.wait()
        self._errors.raise_pending()

    def close(self, timeout: float | None = None) -> None:
        """Run what is queued, stop and join the worker; raise a kept task error, if any."""
        with self._lock:
            already = self.destroyed
            self.destroyed = True
            if not already:
                self._queue.put(_STOP)
        if self.thread is not None and threading.current_thread() is not self.thread:
            self.thread.join(timeout)
            if self.thread.is_alive():
                raise StreamExecutionError(
                    f"stream {self.device.device}/{self.name} did not stop within {timeout} s (a task hangs)"
                )
        _live_streams.discard(self)
        self._errors.raise_pending()


def _fake_cuda_array_type() -> type:
    """``FakeCUDAArray``, the simulator's stand-in for a device array."""
    return cuda.cudadrv.devicearray.FakeCUDAArray


def _host_array(array: Any) -> np.ndarray:
    """The numpy array behind a numpy or ``FakeCUDAArray`` argument."""
    if isinstance(array, np.ndarray):
        return array
    if is_simulator() and isinstance(array, _fake_cuda_array_type()):
        return array._ary
    raise TypeError(f"emulated streams copy numpy arrays or FakeCUDAArrays, got {type(array).__name__}")


class EmulatedDevice(HostMemoryDevice):
    """An asynchronous device emulated with threads and numpy memory.

    ``fake_cuda_arrays``: ``as_array`` returns ``FakeCUDAArray`` (CUDA in the
    simulator) instead of numpy (mock). ``memory_limit`` as for ``HostMemoryDevice``.
    """

    def __init__(self, device: DeviceSymbol, fake_cuda_arrays: bool = False, memory_limit: int | None = None) -> None:
        super().__init__(device, memory_limit)
        if fake_cuda_arrays and not is_simulator():
            raise ValueError("FakeCUDAArray exists only under the CUDA simulator")
        self.fake_cuda_arrays = fake_cuda_arrays
        self._lock = threading.Lock()

    def create_stream(self, name: str | None = None, inline: bool = False) -> EmulatedStream:
        """A new worker-thread stream using the current ``emulation_settings()``.

        ``inline=True``: no worker; work runs on the caller's thread at once (the VM's
        step-through mode), so a debugger can step from an op into its kernel.
        """
        with self._lock:
            name, serial = self._name_and_serial(name)
            stream = EmulatedStream(self, name, serial, emulation_settings(), inline=inline)
            self._streams.append(stream)
        return stream

    def destroy_stream(self, stream: base.EpStream) -> None:
        """Drain and join the stream's worker; raise its pending error, if any."""
        with self._lock:
            if stream in self._streams:
                self._streams.remove(stream)
        stream.close()

    def create_event(self) -> EmulatedEvent:
        """A new, never-recorded event."""
        return EmulatedEvent()

    def as_array(self, raw: base.RawBuffer, offset: int, shape: Sequence[int], dtype: Any, strides=None) -> Any:
        """A numpy view (mock) or a ``FakeCUDAArray`` around one (simulated CUDA)."""
        view = self.memory.view(raw, offset, shape, dtype, strides)
        return _fake_cuda_array_type()(view) if self.fake_cuda_arrays else view


def shutdown_all_streams(timeout: float | None = None) -> None:
    """Close every emulated stream still alive (created by any device); raise the first error."""
    first: BaseException | None = None
    for stream in list(_live_streams):
        try:
            with stream.device._lock:
                if stream in stream.device._streams:
                    stream.device._streams.remove(stream)
            stream.close(timeout)
        except Exception as error:
            first = first or error
    if first is not None:
        raise first
