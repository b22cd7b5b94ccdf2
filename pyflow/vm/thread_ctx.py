"""Seed 002: ``ThreadCtx`` and its ``WorkerLoop``; the ``Notifier`` that wakes threads.

A ``ThreadCtx`` is one worker thread with a queue.  The scheduler *dispatches* an
instruction by appending it to the queue of its stream's ThreadCtx and notifying
the worker; the worker computes instructions in the order they arrived (so one
stream's instructions keep their order), marks each *launched*, and notifies the
scheduler when its queue runs dry (one wake-up per batch, not per instruction).
An op's exception never kills the worker: the VM marks that op failed
(``pyflow/vm/failure.py``).  Anything else that goes wrong in the loop is caught
too and handed to ``on_thread_error``: the VM raises it at the next call,
naming the thread, and the worker carries on.  ``current`` / ``current_since``
say what the worker is computing right now (for hang reports).

``Notifier`` is OneFlow's: ``notify()`` never blocks, ``wait()`` sleeps until a
notify (or a timeout) and then clears it; ``close()`` wakes the waiter for good.
"""

from __future__ import annotations

import collections
import queue
import threading
import time

from pyflow.device.ep.base import is_interrupt, unmasked

__all__ = ["Notifier", "ThreadCtx"]


class Notifier:
    """Wakes one sleeping thread: notify() never blocks, wait() sleeps until notified.

    A token in a ``queue.SimpleQueue`` (C code: no Python-level lock on the way) and an
    ``armed`` flag, so that a burst of notify() calls puts one token, not thousands.
    No wake-up is lost: a notify() that sees ``armed`` knows a token is queued or the
    waiter has not yet cleared the flag, and the waiter always looks at all the work
    after clearing it.  (An extra token only means one early wake-up.)
    """

    def __init__(self):
        self._tokens: queue.SimpleQueue = queue.SimpleQueue()
        self._armed = False
        self.closed = False

    def notify(self) -> None:
        if not self._armed:
            self._armed = True
            self._tokens.put(None)

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until notified (True), the timeout passes (True) or close() (False)."""
        if not self.closed:
            try:
                self._tokens.get(timeout=timeout)
            except queue.Empty:
                pass
        self._armed = False
        return not self.closed

    def close(self) -> None:
        self.closed = True
        self._tokens.put(None)


class ThreadCtx:
    """One worker thread computing the instructions of the streams that share it."""

    def __init__(self, key, on_launched, on_thread_error):
        self.key = key                      # (device type, thread uid)
        self._queue: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self.notifier = Notifier()
        self._on_launched = on_launched     # the VM's hook: wakes the scheduler
        self._on_thread_error = on_thread_error  # the VM's hook: report an unexpected error
        self.thread: threading.Thread | None = None  # started by the first submit
        self.current = None                 # the instruction being computed, if any
        self.current_since = 0.0            # time.monotonic() when it started

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
                self.current, self.current_since = instruction, time.monotonic()
                try:
                    run_instruction(instruction)
                    self._on_launched(instruction, wake_scheduler=last)
                except BaseException as error:  # noqa: BLE001 - supervised: reported, never silent
                    instruction.launched = True
                    self._on_thread_error(self.thread.name, error)
                finally:
                    self.current = None
                del instruction  # hold nothing while idle: tensors it references must be freeable

    def stop(self, timeout: float = 10.0) -> None:
        self.notifier.close()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)


def run_instruction(instruction) -> None:
    """Compute one instruction on its stream; op errors are failures, never raised here.

    Only an interrupt (step-through mode, on the main thread: Ctrl-C, pdb's quit) escapes.
    Either way the instruction ends *launched*, so the engine can release it.
    """
    try:
        instruction.stream.run(instruction)
    except Exception as error:  # noqa: BLE001 - VmStream.run already failed the members that did not finish
        error = unmasked(error)   # (a Ctrl-C hidden by a lock's error: ``ep.base.unmasked``)
        if is_interrupt(error):
            raise error
    finally:
        instruction.launched_at = time.perf_counter()
        instruction.launched = True
