"""Seed 002: how a caller waits on the ``VirtualMachine`` without mistaking slow for hung.

``WaitingMixin`` holds the waiting half of ``VirtualMachine`` (``virtual_machine.py``
inherits it; read that module first: this one is where its callers block):

* **Back pressure** (``apply_back_pressure``): block the caller while more than
  ``high_water`` instructions are in flight, until fewer than ``low_water`` are.
* **Waiting** (``wait_until``) never mistakes work in progress for a hang: if
  nothing moved for ``hang_timeout`` seconds but an instruction is still
  computing (on a worker or an ep stream), it warns once
  (``SlowInstructionWarning``, naming it and for how long) and keeps waiting;
  only when nothing is running either does it raise ``VMHangError``, naming
  each blocked instruction, what it waits for and for how long.  With nothing
  blocked either, it is no hang of the VM: ``VMIdleWaitError`` says so (what is
  awaited was never issued to this VM, or an instruction ended without doing it).
  A wait from a VM thread itself (a callback calling ``numpy()``) is refused at once.
* **Out of memory** (``_wait_device_idle``): let the device's running work
  finish before the allocator's cache is shrunk and the prepare retried.

The mixin owns no state: it reads what ``VirtualMachine.__init__`` creates
(``engine``, ``sync_mode``, ``hang_timeout``, ``high_water``/``low_water``,
``launched``, ``_progress``, ``_waiters``, ``_thread_errors``, ``_thread_ctxs``)
and calls ``check()``, ``threads()`` and ``_schedule_until_idle()``.  The poll
intervals live here; the scheduler loop in ``virtual_machine.py`` uses them too.
"""

from __future__ import annotations

import threading
import time
import warnings

from pyflow.errors import SlowInstructionWarning, VMHangError, VMIdleWaitError

__all__ = ["WaitingMixin"]

_EVENT_POLL_SECONDS = 0.0005
_IDLE_POLL_SECONDS = 0.05


class WaitingMixin:
    """Back pressure, ``wait_until`` and hang detection for ``VirtualMachine``."""

    def apply_back_pressure(self) -> None:
        """Block the caller while too many instructions are in flight (before it builds anything)."""
        if not self.sync_mode and self.engine.in_flight() > self.high_water:
            self.wait_until(lambda: self.engine.in_flight() < self.low_water, "back pressure")

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

    # --- waiting -----------------------------------------------------------------------------

    def _progress_mark(self) -> tuple:
        return (self.engine.received, self.engine.released, self.launched)

    def wait_until(self, predicate, what: str, drive: bool = False) -> None:
        """Block until ``predicate()``.

        If nothing moves for ``hang_timeout`` seconds: while something is still
        running, warn once per instruction and go on waiting; otherwise raise
        ``VMHangError`` naming what is blocked.
        """
        self._refuse_own_thread(what)
        mark, since, warned = self._progress_mark(), time.monotonic(), set()
        while not predicate():
            self.check()
            if drive:
                if not self._schedule_until_idle():
                    time.sleep(_EVENT_POLL_SECONDS)
            else:
                with self._progress:
                    self._waiters += 1   # (read by the scheduler without the lock; see _schedule_until_idle)
                    try:
                        if not predicate() and not self._thread_errors:
                            self._progress.wait(_IDLE_POLL_SECONDS)
                    finally:
                        self._waiters -= 1
            now = time.monotonic()
            if self._progress_mark() != mark:
                mark, since = self._progress_mark(), now
            elif self.hang_timeout is not None and now - since > self.hang_timeout:
                running = self._running()
                if not running and not self.engine.oldest(1):
                    raise VMIdleWaitError(
                        f"{what} is still not done after {now - since:.1f} s, but the VM is idle: no instruction "
                        f"is blocked or running (PYFLOW_VM_HANG_TIMEOUT={self.hang_timeout:g}); what it waits "
                        "for was never issued to this VM, or an instruction ended without doing it")
                if not running:
                    raise VMHangError(self._hang_report(what, now - since))
                for instruction, seconds, where in running:
                    if instruction not in warned:
                        warned.add(instruction)
                        warnings.warn(SlowInstructionWarning(
                            f"{instruction.name} #{instruction.serial} has been running {where} for "
                            f"{seconds:.0f} s while waiting for {what}; still waiting (not a hang: "
                            "Ctrl-C interrupts the wait)"), stacklevel=3)

    def _refuse_own_thread(self, what: str) -> None:
        current = threading.current_thread()
        if current in self.threads():
            raise VMHangError(f"{what} was called on the VM's own thread {current.name!r} (inside an "
                              "instruction's callback): it would wait for itself forever")

    def _running(self) -> list:
        """``(instruction, seconds, where)`` for each instruction computing right now."""
        now, found, seen = time.monotonic(), [], set()
        for ctx in list(self._thread_ctxs.values()):
            instruction = ctx.current
            if instruction is not None:
                seen.add(instruction)
                found.append((instruction, now - ctx.current_since, f"on worker {ctx.thread.name}"))
        for stream in list(self.engine.active_streams):
            for instruction in list(stream.running):
                if instruction in seen or not instruction.launched or instruction.done():
                    continue
                busy = [b for b in (e.busy() for e in stream.ep_streams()) if b is not None]
                computing = [b for b in busy if b[0] not in ("wait_event", "sync")]
                if computing:
                    name, seconds = computing[0]
                    since_launch = now - (instruction.launched_at or now)
                    found.append((instruction, seconds if seconds is not None else since_launch,
                                  f"on {stream.name} (its ep stream runs {name!r})"))
                    break  # the stream's head is what runs; the rest wait behind it
        return found

    def _hang_report(self, what: str, idle: float) -> str:
        now = time.perf_counter()
        lines = [f"the VM made no progress for {idle:.1f} s while waiting for {what} and nothing is "
                 f"running (PYFLOW_VM_HANG_TIMEOUT={self.hang_timeout:g}); blocked instructions, oldest first:"]
        for instruction in self.engine.oldest():
            if not instruction.dispatched:
                if instruction.held:
                    blockers = (f"its stream's worker (held: {instruction.stream.name} has more than "
                                "AHEAD_BYTES allocated for instructions not launched yet)")
                elif instruction.policy.is_barrier:
                    oldest = next(iter(self.engine.lively))
                    blockers = f"every earlier instruction (a barrier; the oldest is {oldest!r})"
                else:
                    blockers = ", ".join(repr(i) for i in list(instruction.in_edges)[:3]) or (
                        "nothing: it is ready, but the scheduler never dispatched it")
                state, since = f"waiting for {blockers}", (instruction.received_at or now)
            elif not instruction.launched:
                state = f"queued on worker {getattr(instruction.stream.thread_ctx, 'key', 'scheduler')}"
                since = (instruction.dispatched_at or now)
            else:
                streams = instruction.stream.ep_streams()
                recorded_on = getattr(instruction.event, "recorded_on", None)
                if recorded_on is not None and recorded_on not in streams:   # (a stream since replaced)
                    streams = [recorded_on]
                busy = [b for b in (e.busy() for e in streams) if b is not None]
                doing = f"; its ep stream is at {busy[0][0]!r}" if busy else "; its ep stream is idle"
                if recorded_on is not None and recorded_on not in instruction.stream.ep_streams():
                    doing += f" (its event was recorded on {recorded_on!r}, which this stream no longer uses)"
                state, since = f"launched, waiting for its device event{doing}", (instruction.launched_at or now)
            lines.append(f"  {instruction.name} #{instruction.serial} on {instruction.stream.name}: "
                         f"{state} (for {now - since:.1f} s)")
        return "\n".join(lines)
