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
the failures:

* **Failures** (``failure.py``): ``fail(policy, error)`` marks what the op writes
  as failed and keeps the failure *pending* for the thread that issued the op,
  until a read of its output or that thread's ``flow.sync()`` reports it
  (``take_failures``).  Fused instructions are prepared and computed member by
  member (``compute_member``), so a failing member fails alone.
* **Waiting** (``waiting.py``): back pressure, ``wait_until`` and hang detection
  (``VMHangError``, ``SlowInstructionWarning``) live in ``WaitingMixin``, which
  ``VirtualMachine`` inherits.
* **Supervision**: the scheduler and the workers catch anything unexpected,
  keep running, and the error is raised as ``VMThreadError`` (naming the
  thread) at the next call into the VM.
* **Ctrl-C** (``interrupts.py``): building and the engine's rounds are critical
  stretches; an interrupt is raised at the next safe point, and at once while a
  kernel runs in step-through mode.
* **Out of memory** while preparing: wait for the device's running work, shrink
  the allocator's cache, retry once; then the op fails with OutOfMemoryError.
"""

from __future__ import annotations

import functools
import os
import queue
import sys
import threading
import time
import weakref

from pyflow.device import CachingAllocator, Device, ep
from pyflow.device.ep.base import RawBuffer, is_interrupt, unmasked
from pyflow.device.stream import StreamType
from pyflow.errors import OutOfMemoryError, VMThreadError
from pyflow.vm import interrupts
from pyflow.vm.engine import VirtualMachineEngine
from pyflow.vm.failure import Failure, first_failure
from pyflow.vm.stream import VmStream
from pyflow.vm.thread_ctx import Notifier, ThreadCtx, run_instruction
from pyflow.vm.waiting import _EVENT_POLL_SECONDS, _IDLE_POLL_SECONDS, WaitingMixin

__all__ = ["VirtualMachine", "report_unseen"]


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


class VirtualMachine(WaitingMixin):
    """Threads, streams, allocators and failures around one engine."""

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
        self._failures: dict[int, list[Failure]] = {}  # thread ident -> failures it issued, not yet seen
        self._failures_lock = threading.Lock()
        self._thread_errors: list = []             # (thread name, error) caught by supervision
        self._watched: dict = {}                   # storage id -> weakref to the handle that keeps it
        self._notifier = Notifier()                # wakes the scheduler
        self._progress = threading.Condition()     # wakes waiting callers
        self._waiters = 0                          # how many callers wait on it now
        self._scheduler: threading.Thread | None = None
        interrupts.install()

    # --- shared objects -------------------------------------------------------------

    def get_vm_stream(self, symbol) -> VmStream:
        """The vm stream of a stream symbol (created on first use)."""
        stream = self._streams.get(symbol)
        if stream is None:
            with self._objects_lock:
                stream = self._streams.get(symbol)
                if stream is None:
                    key = (symbol.device.device_type, symbol.thread_uid)
                    ctx = self._thread_ctxs.get(key)
                    if ctx is None and symbol.stream_type is not StreamType.barrier:
                        ctx = self._thread_ctxs[key] = ThreadCtx(key, self._on_launched, self._on_thread_error)
                    stream = self._streams[symbol] = VmStream(self, symbol, ctx)
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

    def watch(self, handle, storage) -> None:
        """Queue ``storage`` for a ReleaseTensor once ``handle`` (its tensors' keeper) dies.

        The weakref callback is ``SimpleQueue.put`` bound by ``functools.partial``:
        C code only, so no Ctrl-C can land between the handle's death and the
        queueing, and no memory leaks.  The next PhysicalRun turns it into a release.
        """
        self._watched[storage.id] = weakref.ref(handle, functools.partial(self.release_queue.put, storage))

    def unwatch(self, storage) -> None:
        self._watched.pop(storage.id, None)

    # --- receiving ---------------------------------------------------------------------

    def check(self) -> None:
        """Raise what supervision caught in a VM thread (``VMThreadError``), once."""
        if self._thread_errors:
            errors, self._thread_errors = self._thread_errors, []
            name, error = errors[0]
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise VMThreadError(f"the VM's thread {name!r} hit an unexpected error: "
                                f"{type(error).__name__}: {error}{more}; it keeps running", thread=name) from error

    def receive(self, instructions) -> None:
        """Hand instructions to the engine (OneFlow's Receive); never waits."""
        if self.closed:
            raise RuntimeError("the virtual machine was shut down")
        self.engine.receive(instructions)
        if not self.sync_mode:
            self._start_scheduler()
            self._notifier.notify()

    def drive(self) -> None:
        """Step-through mode: run schedule() rounds on this thread until everything was released."""
        self._drive_until(self.engine.empty)

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
        try:
            with interrupts.critical(), self._schedule_lock:
                while self.engine.schedule(self._dispatch, self._run_barrier):
                    moved = True
        finally:
            # a release may be what a caller waits for (nobody waits: no need to take the lock)
            if self._waiters and (moved or self.engine.released != released):
                with self._progress:
                    self._progress.notify_all()
        return moved

    def _waiting_on_events(self) -> bool:
        return any(s.running and s.running[0].launched and not s.running[0].done()
                   for s in list(self.engine.active_streams))

    def _scheduler_loop(self) -> None:
        while True:
            try:
                timeout = _EVENT_POLL_SECONDS if self._waiting_on_events() else (
                    _IDLE_POLL_SECONDS if not self.engine.empty() else None)
                if not self._notifier.wait(timeout):
                    return
                self._schedule_until_idle()
            except BaseException as error:  # noqa: BLE001 - supervised: reported, never silent
                self._on_thread_error(threading.current_thread().name, error)
                time.sleep(_EVENT_POLL_SECONDS)  # a persistent fault must not spin

    def _drive_until(self, predicate) -> None:
        """Step-through mode: run schedule() rounds on this thread until ``predicate()``."""
        self._schedule_until_idle()
        if not predicate():   # (usually it holds already: everything ran inline)
            self.wait_until(predicate, "step-through scheduling", drive=True)

    def _dispatch(self, instruction) -> None:
        inline = self.sync_mode or instruction.stream.on_scheduler_thread
        try:
            self._prepare(instruction)
        except BaseException:  # interrupted: its members failed; launched, so the engine releases it
            instruction.launched = True
            self._on_launched(instruction)
            raise
        if not inline:
            instruction.stream.thread_ctx.submit(instruction)
            return
        self._run_barrier(instruction)

    def _run_barrier(self, instruction) -> None:
        """Run ``instruction`` on this thread (a barrier; any instruction in step-through mode), where Ctrl-C
        and pdb's quit go up at once; launched either way, so the engine releases it."""
        try:
            with interrupts.allowed():  # (raises, on the way in, an interrupt the bookkeeping remembered)
                run_instruction(instruction)
        except BaseException as error:
            if not instruction.launched:   # interrupted on the way in: it never ran, and never will
                for policy in instruction.policy.members():
                    if policy.failure is None:
                        self.fail(policy, error)
                instruction.launched = True
            raise
        finally:
            self._on_launched(instruction)

    def _prepare(self, instruction) -> None:
        """Prepare (allocate) each member on its own; a failing member fails alone."""
        members = instruction.policy.members()
        for k, policy in enumerate(members):
            if not policy.prepares:
                continue
            try:
                self._prepare_member(policy, instruction)
            except BaseException as error:  # an interrupt: nothing after it was prepared
                for rest in members[k:]:
                    if rest.failure is None:
                        self.fail(rest, error)
                raise

    def _prepare_member(self, policy, instruction) -> None:
        if first_failure(policy.read_blobs()) is not None:
            return  # it will not run (its outputs carry the failure): allocate nothing
        try:
            try:
                policy.prepare(instruction)
            except OutOfMemoryError:
                # OneFlow's handler: let running work finish, empty the cache, retry once.
                self._wait_device_idle(instruction)
                instruction.stream.allocator.shrink()
                policy.prepare(instruction)
        except Exception as error:  # noqa: BLE001 - the op fails, the VM goes on
            error = unmasked(error)   # (a Ctrl-C hidden by a lock's error: ``ep.base.unmasked``)
            self.fail(policy, error)
            if is_interrupt(error):   # pdb's quit: the VM goes on, the program does not
                raise error

    def compute_member(self, policy, instruction) -> None:
        """Compute one policy (a fused group's member) unless it, or what it reads, failed."""
        if policy.failure is not None:
            return  # its prepare failed
        if not policy.handles_failed_inputs:
            upstream = first_failure(policy.read_blobs()) or next(
                (b.storage.failure for b in policy.written_blobs()
                 if b.storage.failure is not None and not b.storage.allocated), None)
            if upstream is not None:
                self.propagate(policy, upstream)
                return
        try:
            policy.compute(instruction)
        except BaseException as error:  # noqa: BLE001 - the op fails, nothing else; but an interrupt (Ctrl-C,
            error = unmasked(error)       # pdb's quit, one a lock's error hides) fails this member, then goes up
            self.fail(policy, error)
            if is_interrupt(error):
                raise error

    def _on_launched(self, instruction, wake_scheduler: bool = True) -> None:
        self.launched += 1
        if wake_scheduler and not self.sync_mode:
            self._notifier.notify()

    def _on_release(self, instruction) -> None:
        if self.tracers:
            for tracer in list(self.tracers):
                tracer.on_release(instruction)

    def _on_thread_error(self, thread_name: str, error: BaseException) -> None:
        """Supervision: a VM thread caught something unexpected; the next call raises it."""
        self._thread_errors.append((thread_name, error))
        with self._progress:
            self._progress.notify_all()

    # --- failures ----------------------------------------------------------------------------

    def fail(self, policy, error: BaseException) -> Failure:
        """``policy`` failed: mark what it writes failed; the failure is pending for its thread."""
        interrupted = is_interrupt(error)  # KeyboardInterrupt, SystemExit, pdb's quit: the user saw it
        if interrupted:  # keep a fresh copy: the original's traceback reaches the user's frames and tensors
            error = type(error)(f"{policy.name} was interrupted ({type(error).__name__}) before it finished")
        failure = Failure(policy.name, error, policy.site, policy.thread)
        failure.reported = interrupted
        policy.failure = failure
        for blob in policy.written_blobs():
            blob.storage.failure = failure
        if not failure.reported:
            with self._failures_lock:
                self._failures.setdefault(failure.thread, []).append(failure)
        return failure

    def propagate(self, policy, upstream: Failure) -> None:
        """``policy`` did not run because what it reads failed: what it writes carries that failure."""
        policy.failure = upstream
        for blob in policy.written_blobs():
            blob.storage.failure = upstream

    def take_failures(self, thread: int | None = None) -> list:
        """The failures nobody has seen yet, issued by ``thread`` (None: every thread); now seen."""
        with self._failures_lock:
            threads = list(self._failures) if thread is None else [thread]
            taken = [f for t in threads for f in self._failures.pop(t, ()) if not f.reported]
        for failure in taken:
            failure.reported = True
        return taken

    def raise_failures(self) -> None:
        """Raise the calling thread's unseen failures (the first, listing the others) as OpError."""
        failures = self.take_failures(threading.get_ident())
        if failures:
            raise failures[0].to_error(others=failures[1:])

    # --- teardown -----------------------------------------------------------------------------

    def ep_streams(self) -> list:
        return [s for stream in list(self._streams.values()) for s in stream.ep_streams()]

    def shutdown(self, timeout: float = 10.0, release_held: bool = False) -> list:
        """Stop the scheduler and workers and destroy the ep streams (after draining).

        Returns the failures nobody saw (every thread's); the caller reports them.
        ``release_held``: give back the memory of tensors still alive too (``_free_the_rest``).
        """
        if self.closed:
            return []
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
                except Exception:  # noqa: BLE001 - op errors were kept as failures already
                    pass
        if release_held:
            self._free_the_rest()
        for allocator in self._allocators.values():
            allocator.shrink()
        return self.take_failures()

    def _free_the_rest(self) -> None:
        """Give back the memory of every storage still held (a rank's VM, when the rank ends).

        A failed rank's exception keeps its frames, and so its tensors, alive in the caller.  Their
        releases would be issued by a VM that no longer runs (30 failed ranks kept 180 MiB), so the memory
        goes back now.  Only for a rank: in the user's own thread a tensor may outlive its VM and be used
        by the next one."""
        storages = [ref.__callback__.args[0] for ref in list(self._watched.values())
                    if ref.__callback__ is not None]
        self._watched.clear()
        while True:
            try:
                storages.append(self.release_queue.get_nowait())
            except queue.Empty:
                break
        for storage in storages:
            try:
                storage.free()
            except Exception:  # noqa: BLE001 - shutting down: free what can be freed
                pass

    def threads(self) -> list:
        """Every thread this VM started (for leak checks)."""
        found = [self._scheduler] if self._scheduler is not None else []
        return found + [ctx.thread for ctx in list(self._thread_ctxs.values()) if ctx.thread is not None]


def report_unseen(failures, stream=None) -> None:
    """Print failures nobody read or synced (at shutdown), one per line, to stderr."""
    if not failures:
        return
    stream = stream or sys.stderr
    print(f"pyflow: {len(failures)} failed op(s) were never reported (no read of their outputs and "
          "no flow.sync() in the thread that issued them):", file=stream)
    for failure in failures:
        print(f"  {failure.describe()}", file=stream)
