"""Seed 002: ``ThreadCtx`` and its ``WorkerLoop``; the ``Notifier`` that wakes threads.

A ``ThreadCtx`` is one worker thread with a queue.  The scheduler *dispatches* an
instruction by appending it to the queue of its stream's ThreadCtx and notifying
the worker; the worker computes instructions in the order they arrived (so one
stream's instructions keep their order), marks each *launched*, and notifies the
scheduler when its queue runs dry (one wake-up per batch, not per instruction).  An exception in a compute never kills the worker: it is kept on the
instruction and reported by the VM, with the instruction's name, at the next
synchronisation point.

``Notifier`` is OneFlow's: ``notify()`` counts, ``wait()`` sleeps until the count
is non-zero (or a timeout), then clears it; ``close()`` wakes everyone for good.
"""

from __future__ import annotations

import collections
import threading

__all__ = ["Notifier", "ThreadCtx"]


class Notifier:
    """A counter plus a condition variable: notify() never blocks, wait() sleeps."""

    def __init__(self):
        self._cond = threading.Condition()
        self._count = 0
        self.closed = False

    def notify(self) -> None:
        with self._cond:
            self._count += 1
            self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until notified (True), the timeout passes (True) or close() (False)."""
        with self._cond:
            if self._count == 0 and not self.closed:
                self._cond.wait(timeout)
            self._count = 0
            return not self.closed

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class ThreadCtx:
    """One worker thread computing the instructions of the streams that share it."""

    def __init__(self, key, on_launched):
        self.key = key                      # (device type, thread uid)
        self._queue: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self.notifier = Notifier()
        self._on_launched = on_launched     # the VM's hook: wakes the scheduler
        self.thread: threading.Thread | None = None  # started by the first submit

    def submit(self, instruction) -> None:
        """Queue a dispatched instruction for this worker (scheduler thread)."""
        with self._lock:
            self._queue.append(instruction)
            if self.thread is None:
                self.thread = threading.Thread(target=self._worker_loop, daemon=True,
                                               name=f"pyflow-vm-worker-{self.key[0].name}-{self.key[1]}")
                self.thread.start()
        self.notifier.notify()

    def _worker_loop(self) -> None:
        while self.notifier.wait():
            while True:
                with self._lock:
                    if not self._queue:
                        break
                    instruction = self._queue.popleft()
                    last = not self._queue
                run_instruction(instruction)
                self._on_launched(instruction, wake_scheduler=last)
                del instruction  # hold nothing while idle: tensors it references must be freeable

    def stop(self, timeout: float = 10.0) -> None:
        self.notifier.close()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)


def run_instruction(instruction) -> None:
    """Compute one instruction on its stream; never raises (the error is kept)."""
    try:
        if instruction.error is None:
            instruction.stream.run(instruction)
    except BaseException as error:  # noqa: BLE001 - reported at the next sync point
        instruction.error = error
    finally:
        instruction.mark("launched")
        instruction.launched = True
