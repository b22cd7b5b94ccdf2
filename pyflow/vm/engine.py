"""Seed 002: ``VirtualMachineEngine``: the instruction lists and the ``schedule()`` round.

The engine holds every instruction from receipt to release:

* ``pending``       - appended by callers (``receive``, under a lock);
* ``lively``        - every instruction between handling and release, in receipt order;
* ``ready``         - dispatchable instructions, waiting for ``dispatch``;
* ``barriers``      - barrier instructions waiting to become the oldest lively one;
* ``active_streams`` - vm streams with dispatched, unreleased instructions.

``schedule()`` is one round, in OneFlow's order:

1. release finished instructions: per active stream, pop the head of its running
   list while it is done; releasing forgets its accesses, erases its out-edges
   and makes newly dispatchable instructions ready;
2. run the first barrier once every instruction received before it is released;
3. handle pending: take a window of new instructions, fuse, consume their
   dependences (create in-edges), make the dispatchable ones ready;
4. dispatch ready instructions, then *pre-schedule*: successors whose edges are
   now satisfied (same stream, src dispatched) become ready at once;
5. (probes: pyflow's VM runs its waits elsewhere, so there are none here).

The engine is pure bookkeeping and runs on one thread at a time (the scheduler
thread, or the caller in step-through mode).  *How* to dispatch and run a barrier
is the VM's business, passed in as functions.

**Safe points.**  Between any two of its small steps (one release, one handled
instruction, one dispatch) the engine's lists are consistent, and it calls
``_safe_point``.  There, a Ctrl-C that arrived during the round is raised
(``pyflow/vm/interrupts.py``), and tests may inject an exception with
``interrupt_hook(point)``: whatever is raised at a safe point leaves the engine
able to continue with the next round.
"""

from __future__ import annotations

import collections
import itertools
import threading

from pyflow.vm import interrupts
from pyflow.vm.instruction import Instruction
from pyflow.vm.policies.fuse import Fuse

__all__ = ["VirtualMachineEngine"]

DEFAULT_WINDOW = 10


class VirtualMachineEngine:
    """Instruction lists and the schedule() round (no threads of its own)."""

    def __init__(self, window: int = DEFAULT_WINDOW, on_release=None):
        self.window = window
        self._pending: collections.deque = collections.deque()
        self._pending_lock = threading.Lock()
        self.lively: dict[Instruction, None] = {}     # an ordered set, receipt order
        self.ready: collections.deque = collections.deque()
        self._queued: set = set()                      # what is in ``ready``
        self.barriers: collections.deque = collections.deque()
        self.active_streams: dict = {}                 # vm stream -> None, an ordered set
        self.received = 0
        self.released = 0
        self.fused = 0
        self._on_release = on_release or (lambda instruction: None)
        self.interrupt_hook = None  # tests: hook(point) is called at every safe point and may raise

    # --- caller side (any thread) ----------------------------------------------------

    def receive(self, instructions) -> None:
        instructions = list(instructions)
        for instruction in instructions:
            instruction.mark("received")
        with self._pending_lock:
            self._pending.extend(instructions)
            self.received += len(instructions)

    def in_flight(self) -> int:
        return self.received - self.released

    def empty(self) -> bool:
        return self.received == self.released

    # --- the round ------------------------------------------------------------------------

    def schedule(self, dispatch, run_barrier) -> bool:
        """One round; True if it started new work (handled, dispatched or ran a barrier).

        Releasing alone does not count: the worker that launches instructions notifies
        again when it runs dry, so a scheduler need not spin while workers compute.
        """
        self._release_finished()
        barrier = self._try_run_barrier(run_barrier)
        handled = self._handle_pending()
        dispatched = self._dispatch_ready(dispatch)
        return bool(barrier or handled or dispatched)

    def _safe_point(self, point: str) -> None:
        """The lists are consistent here: raise a pending Ctrl-C, or what a test injects."""
        if self.interrupt_hook is not None:
            self.interrupt_hook(point)
        interrupts.checkpoint()

    def _release_finished(self) -> int:
        count = 0
        for stream in list(self.active_streams):
            while stream.running and stream.running[0].done():
                self._release(stream.running.popleft())
                count += 1
                self._safe_point("released")
            if not stream.running:
                self.active_streams.pop(stream, None)
        return count

    def _release(self, instruction: Instruction) -> None:
        instruction.released = True
        instruction.mark("released")
        policy = instruction.policy
        for dep in itertools.chain(policy.input_dependences(), policy.output_dependences(),
                                   [policy.stream_sequential_dependence]):
            if dep is not None:
                dep.forget(instruction)
        for successor in instruction.out_edges:
            successor.in_edges.discard(instruction)
            self._make_ready_if_dispatchable(successor)
        instruction.out_edges = set()
        del self.lively[instruction]
        self.released += instruction.count
        try:
            self._on_release(instruction)  # tracers: their mistakes must not break the round
        except Exception:  # noqa: BLE001
            pass

    def _try_run_barrier(self, run_barrier) -> bool:
        if not self.barriers or next(iter(self.lively)) is not self.barriers[0]:
            return False
        barrier = self.barriers.popleft()
        barrier.dispatched = True
        barrier.mark("dispatched")
        try:
            run_barrier(barrier)
        finally:
            self._release(barrier)  # even if interrupted: it ran (or failed) and must not block the lists
        self._safe_point("barrier")
        return True

    def _handle_pending(self) -> int:
        with self._pending_lock:
            batch = [self._pending.popleft() for _ in range(min(self.window, len(self._pending)))]
        items = self._fuse(batch)
        for k, instruction in enumerate(items):
            self.lively[instruction] = None
            self._consume_dependences(instruction)
            if instruction.policy.is_barrier:
                self.barriers.append(instruction)
            else:
                self._make_ready_if_dispatchable(instruction)
            try:
                self._safe_point("handled")
            except BaseException:
                with self._pending_lock:  # the rest of the batch goes back, in order
                    self._pending.extendleft(reversed(items[k + 1:]))
                raise
        return len(batch)

    def _fuse(self, batch: list) -> list:
        """Merge runs of instructions on one stream that share a stream-sequential dependence."""
        result: list = []
        group: list = []

        def close_group():
            if len(group) > 1:
                fused = Instruction(group[0].stream, Fuse([i.policy for i in group]))
                fused.times = dict(group[0].times)
                fused.count = len(group)  # released once, for all of them
                self.fused += len(group) - 1
                result.append(fused)
            else:
                result.extend(group)
            group.clear()

        for instruction in batch:
            policy = instruction.policy
            joins = (group and policy.fuse_type in ("enable", "tail_only")
                     and instruction.stream is group[-1].stream
                     and policy.stream_sequential_dependence is not None
                     and policy.stream_sequential_dependence is group[0].policy.stream_sequential_dependence
                     and group[-1].policy.fuse_type != "tail_only")
            if not joins:
                close_group()
            group.append(instruction)
            if policy.fuse_type == "none" or policy.stream_sequential_dependence is None:
                close_group()
        close_group()
        return result

    def _consume_dependences(self, instruction: Instruction) -> None:
        policy = instruction.policy
        accesses = [(dep, False) for dep in policy.input_dependences()]
        accesses += [(dep, True) for dep in policy.output_dependences()]
        if policy.stream_sequential_dependence is not None:
            accesses.append((policy.stream_sequential_dependence, True))
        for dep, write in accesses:
            for source in dep.access(instruction, write):
                if not source.released:
                    instruction.in_edges.add(source)
                    source.out_edges.add(instruction)

    def _make_ready_if_dispatchable(self, instruction: Instruction) -> None:
        if (not instruction.policy.is_barrier and instruction not in self._queued
                and instruction.dispatchable()):
            self._queued.add(instruction)
            self.ready.append(instruction)

    def _dispatch_ready(self, dispatch) -> int:
        count = 0
        while self.ready:
            instruction = self.ready.popleft()
            self._queued.discard(instruction)
            if not instruction.dispatchable():
                continue
            instruction.dispatched = True
            instruction.mark("dispatched")
            stream = instruction.stream
            stream.running.append(instruction)
            self.active_streams[stream] = None
            count += 1
            dispatch(instruction)  # may raise an interrupt (step-through mode); it is launched anyway
            for successor in list(instruction.out_edges):  # pre-schedule
                self._make_ready_if_dispatchable(successor)
            self._safe_point("dispatched")
        return count

    # --- reports --------------------------------------------------------------------------

    def oldest(self, n: int = 5) -> list:
        """The ``n`` oldest lively instructions (for hang reports)."""
        return list(itertools.islice(self.lively, n))
