"""Seed 002: ``VirtualMachine``: the scheduler thread, the workers, and waiting safely.

The engine (``engine.py``) is bookkeeping; the VirtualMachine gives it threads:

* ``receive(instructions)`` - the caller's side (OneFlow's ``Receive``): apply
  back pressure, append to the engine's pending list, notify the scheduler.
  OneFlow blocks the caller above 40,000 instructions in flight; pyflow uses
  1,000 (resume at 500), because in Python a deep backlog costs more than it saves
  (``benchmarks/bench_eager_ops.py``: ~160 us/op at 40,000, ~100 us/op at 1,000);
* the **scheduler thread** sleeps on a ``Notifier`` and, when woken (new
  instructions, a worker finished one), runs ``engine.schedule()`` until nothing
  moves.  It polls briefly only while an instruction waits for an ep event;
* **workers**: one ``ThreadCtx`` per (device type, thread uid) computes dispatched
  instructions; barrier instructions run on the scheduler thread;
* **step-through mode** (``sync_mode``): no threads at all.  ``receive`` runs
  the same ``schedule()`` rounds on the caller's thread and computes inline, and
  ep streams are inline too, so pdb can step from ``flow.relu(x)`` into the kernel.

It also owns what must be shared: the vm streams, the caching allocators, and
the errors.  A failed instruction is kept with its name and raised as
``OpError`` at the next synchronisation point; the VM keeps working.  Every wait
(``wait_until``) watches for progress and raises ``VMHangError`` naming the
oldest blocked instructions if nothing moves for ``hang_timeout`` seconds.
Out of memory while preparing: wait for the device's running work, shrink the
allocator's cache, retry once; then the instruction fails with OutOfMemoryError.
"""

from __future__ import annotations

import os
import queue
import threading
import time

from pyflow.device import CachingAllocator, Device, ep
from pyflow.device.ep.base import RawBuffer
from pyflow.device.stream import StreamType
from pyflow.errors import OpError, OutOfMemoryError, StreamExecutionError, VMHangError
from pyflow.vm.engine import VirtualMachineEngine
from pyflow.vm.stream import Stream
from pyflow.vm.thread_ctx import Notifier, ThreadCtx, run_instruction

__all__ = ["VirtualMachine"]

_EVENT_POLL_SECONDS = 0.0005
_IDLE_POLL_SECONDS = 0.05


def _env_float(name: str, default: float) -> float:
    value = float(os.environ.get(name, default))
    return value if value > 0 else None


class PinnedHostBackend:
    """Allocator backend for device2host outputs: page-locked host memory, viewed as CPU memory."""

    def __init__(self, ep_device):
        self.ep_device = ep_device

    def alloc(self, nbytes: int) -> RawBuffer:
        array = self.ep_device.alloc_pinned(nbytes)
        return RawBuffer(ptr=array.ctypes.data, nbytes=nbytes, handle=array, device=Device("cpu"))

    def free(self, raw: RawBuffer) -> None:
        self.ep_device.free_pinned(raw.handle)


class VirtualMachine:
    """Threads, streams, allocators and errors around one engine."""

    def __init__(self, sync_mode: bool = False, hang_timeout: float | None = None,
                 high_water: int = 1_000, low_water: int = 500):
        self.sync_mode = sync_mode
        self.hang_timeout = hang_timeout if hang_timeout is not None else _env_float("PYFLOW_VM_HANG_TIMEOUT", 120)
        self.high_water, self.low_water = high_water, low_water
        self.engine = VirtualMachineEngine(on_release=self._on_release)
        self.build_lock = threading.RLock()        # one PhysicalRun builds + receives at a time
        self.release_queue: queue.SimpleQueue = queue.SimpleQueue()  # storages whose tensors died
        self.tracers: list = []
        self.launched = 0
        self.closed = False
        self._streams: dict = {}
        self._thread_ctxs: dict = {}
        self._allocators: dict = {}
        self._objects_lock = threading.Lock()
        self._schedule_lock = threading.Lock()
        self._errors: list = []
        self._errors_lock = threading.Lock()
        self._notifier = Notifier()                # wakes the scheduler
        self._progress = threading.Condition()     # wakes waiting callers
        self._scheduler: threading.Thread | None = None

    # --- shared objects -------------------------------------------------------------

    def get_vm_stream(self, symbol) -> Stream:
        """The vm stream of a stream symbol (created on first use)."""
        stream = self._streams.get(symbol)
        if stream is None:
            with self._objects_lock:
                stream = self._streams.get(symbol)
                if stream is None:
                    key = (symbol.device.device_type, symbol.thread_uid)
                    ctx = self._thread_ctxs.get(key)
                    if ctx is None and symbol.stream_type is not StreamType.barrier:
                        ctx = self._thread_ctxs[key] = ThreadCtx(key, self._on_launched)
                    stream = self._streams[symbol] = Stream(self, symbol, ctx)
        return stream

    def allocator(self, device, kind: StreamType) -> CachingAllocator:
        """The caching allocator for ``device`` and allocator stream type ``kind``."""
        key = (Device(device), kind)
        found = self._allocators.get(key)
        if found is None:
            with self._objects_lock:
                found = self._allocators.get(key)
                if found is None:
                    ep_device = ep.get_device(key[0])
                    pinned = kind in (StreamType.device2host, StreamType.pinned_compute)
                    backend = PinnedHostBackend(ep_device) if pinned else ep_device
                    name = f"{key[0]}/pinned" if pinned else str(key[0])
                    found = self._allocators[key] = CachingAllocator(backend, device=name)
        return found

    # --- receiving ---------------------------------------------------------------------

    def receive(self, instructions) -> None:
        """Hand instructions to the engine (OneFlow's Receive)."""
        if self.closed:
            raise RuntimeError("the virtual machine was shut down")
        if not self.sync_mode and self.engine.in_flight() > self.high_water:
            self.wait_until(lambda: self.engine.in_flight() < self.low_water, "back pressure")
        self.engine.receive(instructions)
        if self.sync_mode:
            self._drive_until(self.engine.empty)
        else:
            self._start_scheduler()
            self._notifier.notify()

    def _start_scheduler(self) -> None:
        if self._scheduler is None:
            with self._objects_lock:
                if self._scheduler is None:
                    self._scheduler = threading.Thread(target=self._scheduler_loop, daemon=True,
                                                       name="pyflow-vm-scheduler")
                    self._scheduler.start()

    # --- the scheduler -----------------------------------------------------------------

    def _schedule_until_idle(self) -> bool:
        moved = False
        released = self.engine.released
        with self._schedule_lock:
            while self.engine.schedule(self._dispatch, self._run_barrier):
                moved = True
        if moved or self.engine.released != released:  # a release may be what a caller waits for
            with self._progress:
                self._progress.notify_all()
        return moved

    def _waiting_on_events(self) -> bool:
        return any(s.running and s.running[0].launched and not s.running[0].done()
                   for s in list(self.engine.active_streams))

    def _scheduler_loop(self) -> None:
        while True:
            timeout = _EVENT_POLL_SECONDS if self._waiting_on_events() else (
                _IDLE_POLL_SECONDS if not self.engine.empty() else None)
            if not self._notifier.wait(timeout):
                return
            self._schedule_until_idle()

    def _drive_until(self, predicate) -> None:
        """Step-through mode: run schedule() rounds on this thread until ``predicate()``."""
        self._schedule_until_idle()
        self.wait_until(predicate, "step-through scheduling", drive=True)

    def _dispatch(self, instruction) -> None:
        self._prepare(instruction)
        if self.sync_mode or instruction.stream.on_scheduler_thread:
            run_instruction(instruction)
            self._on_launched(instruction)
        else:
            instruction.stream.thread_ctx.submit(instruction)

    def _run_barrier(self, instruction) -> None:
        run_instruction(instruction)
        self._on_launched(instruction)

    def _prepare(self, instruction) -> None:
        if instruction.error is not None:
            return
        try:
            try:
                instruction.policy.prepare(instruction)
            except OutOfMemoryError:
                # OneFlow's handler: let running work finish, empty the cache, retry once.
                self._wait_device_idle(instruction)
                instruction.stream.allocator.shrink()
                instruction.policy.prepare(instruction)
        except BaseException as error:  # noqa: BLE001 - the instruction fails, the VM goes on
            instruction.error = error

    def _wait_device_idle(self, instruction) -> None:
        device = instruction.stream.device
        deadline = time.monotonic() + (self.hang_timeout or 60)
        while time.monotonic() < deadline:
            self.engine._release_finished()
            busy = [i for s in self.engine.active_streams if s.device is device
                    for i in s.running if i is not instruction]
            if not busy:
                return
            time.sleep(_EVENT_POLL_SECONDS)

    def _on_launched(self, instruction, wake_scheduler: bool = True) -> None:
        self.launched += 1
        if instruction.error is not None:
            self.record_error(instruction.name, instruction.error)
        if wake_scheduler and not self.sync_mode:
            self._notifier.notify()

    def _on_release(self, instruction) -> None:
        for tracer in list(self.tracers):
            tracer.on_release(instruction)

    # --- errors and waiting ------------------------------------------------------------------

    def record_error(self, name: str, error: BaseException) -> None:
        if isinstance(error, StreamExecutionError) and getattr(error, "task", None):
            name = error.task  # an ep task failed: name the op whose kernel it was
        with self._errors_lock:
            self._errors.append((name, error))

    def raise_errors(self) -> None:
        """Raise the first kept error as OpError (and forget them all)."""
        with self._errors_lock:
            errors, self._errors = self._errors, []
        if errors:
            name, error = errors[0]
            if isinstance(error, StreamExecutionError) and error.__cause__ is not None:
                error = error.__cause__  # the kernel's own exception, not the ep stream's wrapper
            more = f" (and {len(errors) - 1} more failed instruction(s))" if len(errors) > 1 else ""
            raise OpError(f"op {name!r} failed: {type(error).__name__}: {error}{more}", op=name) from error

    def _progress_mark(self) -> tuple:
        return (self.engine.received, self.engine.released, self.launched)

    def wait_until(self, predicate, what: str, drive: bool = False) -> None:
        """Block until ``predicate()``; VMHangError if the VM makes no progress for hang_timeout."""
        mark, since = self._progress_mark(), time.monotonic()
        while not predicate():
            if drive:
                if not self._schedule_until_idle():
                    time.sleep(_EVENT_POLL_SECONDS)
            else:
                with self._progress:
                    if not predicate():
                        self._progress.wait(_IDLE_POLL_SECONDS)
            now = time.monotonic()
            if self._progress_mark() != mark:
                mark, since = self._progress_mark(), now
            elif self.hang_timeout is not None and now - since > self.hang_timeout:
                raise VMHangError(self._hang_report(what))

    def _hang_report(self, what: str) -> str:
        lines = [f"the VM made no progress for {self.hang_timeout:g} s while waiting for {what} "
                 f"(PYFLOW_VM_HANG_TIMEOUT); oldest instructions:"]
        for instruction in self.engine.oldest():
            if not instruction.dispatched:
                blockers = ", ".join(repr(i) for i in list(instruction.in_edges)[:3]) or "nothing (a barrier)"
                state = f"waiting for {blockers}"
            elif not instruction.launched:
                state = f"running on worker {getattr(instruction.stream.thread_ctx, 'key', 'scheduler')}"
            else:
                state = "launched, waiting for its event"
            lines.append(f"  {instruction.name} #{instruction.serial} on {instruction.stream.name}: {state}")
        return "\n".join(lines)

    # --- teardown -----------------------------------------------------------------------------

    def ep_streams(self) -> list:
        return [s for stream in list(self._streams.values()) for s in stream.ep_streams()]

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the scheduler and workers and destroy the ep streams (after draining)."""
        if self.closed:
            return
        self.closed = True
        self._notifier.close()
        if self._scheduler is not None and self._scheduler is not threading.current_thread():
            self._scheduler.join(timeout)
        for ctx in self._thread_ctxs.values():
            ctx.stop(timeout)
        for stream in list(self._streams.values()):
            for ep_stream in stream.ep_streams():
                try:
                    stream.ep_device.destroy_stream(ep_stream)
                except Exception:  # noqa: BLE001 - errors were reported at sync points
                    pass
        for allocator in self._allocators.values():
            allocator.shrink()

    def threads(self) -> list:
        """Every thread this VM started (for leak checks)."""
        found = [self._scheduler] if self._scheduler is not None else []
        return found + [ctx.thread for ctx in list(self._thread_ctxs.values()) if ctx.thread is not None]
