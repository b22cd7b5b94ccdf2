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

**Allocating ahead.**  Dispatching prepares an instruction, and preparing allocates
its outputs.  A user thread issues ops far faster than a worker computes large ones,
so without a bound every queued op would hold fresh memory long before it runs (and
before the tensors it replaces are released): a chain of 16 MB ops would reserve
hundreds of MB and touch cold memory each time.  So an instruction that allocates a
lot (``BIG_ALLOCATION`` or more) is *held* while its stream already has more than
``AHEAD_BYTES`` allocated for instructions its worker has not launched; it is
dispatched once those are launched (the worker wakes the scheduler when it runs
dry).  Small ops are never held.

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
import time

from pyflow.vm import interrupts
from pyflow.vm.interrupts import state as _interrupts
from pyflow.vm.instruction import Instruction
from pyflow.vm.policies.fuse import Fuse

__all__ = ["VirtualMachineEngine"]

DEFAULT_WINDOW = 10
BIG_ALLOCATION = 1 << 20   # bytes: an instruction allocating this much may be held (see "Allocating ahead")
AHEAD_BYTES = 32 << 20     # bytes a stream may have allocated for instructions not launched yet


class VirtualMachineEngine:
    """Instruction lists and the schedule() round (no threads of its own)."""

    def __init__(self, window: int = DEFAULT_WINDOW, on_release=None):
        self.window = window
        self._pending: collections.deque = collections.deque()
        self._pending_lock = threading.Lock()
        self.lively: dict[Instruction, None] = {}     # an ordered set, receipt order
        self.ready: collections.deque = collections.deque()
        self.barriers: collections.deque = collections.deque()
        self.active_streams: dict = {}                 # vm stream -> None, an ordered set
        self.holding: dict = {}                        # vm streams with held instructions, an ordered set
        self.received = 0
        self.released = 0
        self.fused = 0
        self._on_release = on_release      # called with each released instruction (tracers), or None
        self.interrupt_hook = None  # tests: hook(point) is called at every safe point and may raise

    # --- caller side (any thread) ----------------------------------------------------

    def receive(self, instructions) -> None:
        instructions = list(instructions)
        now = time.perf_counter()
        for instruction in instructions:
            instruction.received_at = now
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
            running = stream.running
            while running and running[0].done():
                self._release(running.popleft())
                count += 1
                if self.interrupt_hook is not None or _interrupts.pending:
                    self._safe_point("released")
            if not running:
                del self.active_streams[stream]
        return count

    def _release(self, instruction: Instruction) -> None:
        instruction.released = True
        instruction.released_at = time.perf_counter()
        for dep in instruction.accessed:
            dep.forget(instruction)
        for successor in instruction.out_edges:
            successor.in_edges.discard(instruction)
            self._make_ready_if_dispatchable(successor)
        instruction.out_edges = set()
        del self.lively[instruction]
        self.released += instruction.count
        if self._on_release is not None:
            try:
                self._on_release(instruction)  # tracers: their mistakes must not break the round
            except Exception:  # noqa: BLE001
                pass

    def _try_run_barrier(self, run_barrier) -> bool:
        if not self.barriers or next(iter(self.lively)) is not self.barriers[0]:
            return False
        barrier = self.barriers.popleft()
        barrier.dispatched = True
        barrier.dispatched_at = time.perf_counter()
        try:
            run_barrier(barrier)
        finally:
            self._release(barrier)  # even if interrupted: it ran (or failed) and must not block the lists
        self._safe_point("barrier")
        return True

    def _handle_pending(self) -> int:
        if not self._pending:
            return 0
        with self._pending_lock:
            pending = self._pending
            batch = [pending.popleft() for _ in range(min(self.window, len(pending)))]
        items = self._fuse(batch) if len(batch) > 1 else batch
        for k, instruction in enumerate(items):
            self.lively[instruction] = None
            self._consume_dependences(instruction)
            if instruction.policy.is_barrier:
                self.barriers.append(instruction)
            else:
                self._make_ready_if_dispatchable(instruction)
            if self.interrupt_hook is not None or _interrupts.pending:
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
        for instruction in batch:
            policy = instruction.policy
            joins = (group and policy.fuse_type in ("enable", "tail_only")
                     and instruction.stream is group[-1].stream
                     and policy.stream_sequential_dependence is not None
                     and policy.stream_sequential_dependence is group[0].policy.stream_sequential_dependence
                     and group[-1].policy.fuse_type != "tail_only")
            if not joins:
                self._close_group(group, result)
            group.append(instruction)
            if policy.fuse_type == "none" or policy.stream_sequential_dependence is None:
                self._close_group(group, result)
        self._close_group(group, result)
        return result

    def _close_group(self, group: list, result: list) -> None:
        """``group`` (consecutive fusable instructions) goes to ``result``: as one Fuse if more than one."""
        if len(group) > 1:
            fused = Instruction(group[0].stream, Fuse([i.policy for i in group]))
            fused.received_at = group[0].received_at
            fused.count = len(group)  # released once, for all of them
            self.fused += len(group) - 1
            result.append(fused)
        else:
            result.extend(group)
        group.clear()

    def _consume_dependences(self, instruction: Instruction) -> None:
        policy = instruction.policy
        sequential = policy.stream_sequential_dependence
        accessed = []
        in_edges = instruction.in_edges
        for deps, write in ((policy.input_dependences(), False), (policy.output_dependences(), True),
                            ((sequential,) if sequential is not None else (), True)):
            for dep in deps:
                accessed.append(dep)
                for source in dep.access(instruction, write):
                    if not source.released:
                        in_edges.add(source)
                        source.out_edges.add(instruction)
        instruction.accessed = accessed

    def _make_ready_if_dispatchable(self, instruction: Instruction) -> None:
        if (not instruction.queued and not instruction.policy.is_barrier
                and instruction.dispatchable()):
            instruction.queued = True
            self.ready.append(instruction)

    def _too_far_ahead(self, stream, nbytes: int) -> bool:
        """Would dispatching an instruction allocating ``nbytes`` exceed the stream's AHEAD_BYTES?"""
        ahead = stream.ahead
        while ahead and ahead[0].launched:
            ahead.popleft()
        return bool(ahead) and sum(i.policy.allocates for i in ahead) + nbytes > AHEAD_BYTES

    def _release_held(self) -> None:
        """A stream that caught up gets its oldest held instruction back, at the front of the ready
        list (one per round: the next is checked once this one is dispatched)."""
        for stream in list(self.holding):
            held = stream.held
            if held and not self._too_far_ahead(stream, held[0].policy.allocates):
                instruction = held.popleft()   # (still marked held: _dispatch_ready lets it go)
                instruction.queued = True
                self.ready.appendleft(instruction)
            if not held:
                del self.holding[stream]

    def _dispatch_ready(self, dispatch) -> int:
        count = 0
        ready, active = self.ready, self.active_streams
        if self.holding:
            self._release_held()
        while ready:
            instruction = ready.popleft()
            instruction.queued = False
            if not instruction.dispatchable():
                continue
            stream = instruction.stream
            nbytes = instruction.policy.allocates
            if nbytes >= BIG_ALLOCATION:
                if instruction.held:   # back from the held list: _release_held checked the stream
                    instruction.held = False
                elif stream.held or self._too_far_ahead(stream, nbytes):   # (big ones keep their order)
                    instruction.held = True
                    stream.held.append(instruction)   # its stream has enough memory planned ahead
                    self.holding[stream] = None
                    continue
                stream.ahead.append(instruction)
            instruction.dispatched = True
            instruction.dispatched_at = time.perf_counter()
            stream.running.append(instruction)
            active[stream] = None
            count += 1
            dispatch(instruction)  # may raise an interrupt (step-through mode); it is launched anyway
            if instruction.out_edges:
                for successor in list(instruction.out_edges):  # pre-schedule
                    self._make_ready_if_dispatchable(successor)
            if self.interrupt_hook is not None or _interrupts.pending:
                self._safe_point("dispatched")
        return count

    # --- reports --------------------------------------------------------------------------

    def oldest(self, n: int = 5) -> list:
        """The ``n`` oldest lively instructions (for hang reports)."""
        return list(itertools.islice(self.lively, n))
