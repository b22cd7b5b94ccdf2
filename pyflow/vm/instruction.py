"""Seed 002: ``Instruction``: one unit of VM work on one vm stream, and its edges.

An instruction is a *policy* (what to do: run an op's kernel, release a tensor,
record an event...; see ``pyflow/vm/policies/``) bound to a *vm stream* (where to
do it), plus the DAG bookkeeping the engine needs:

* ``in_edges``  - earlier instructions it must follow (from the dependence objects);
* ``out_edges`` - later instructions that follow it;
* its life: received -> (pending) -> ready -> dispatched -> launched -> done -> released.

"Launched" means the worker ran the policy's ``compute`` (on a GPU: the kernel is
queued on the ep stream).  "Done" is ``launched`` plus, when the instruction
recorded an ep event, that event having completed.  An edge ``src -> dst`` lets
``dst`` go once ``src`` is *released* or, cheaper, once ``src`` is merely
*dispatched* when order is already guaranteed (same vm stream: a stream is FIFO;
``policy.prescheduleable`` may widen this, e.g. StreamWait on one worker thread).
"""

from __future__ import annotations

import itertools

__all__ = ["Instruction"]

_serials = itertools.count()


class Instruction:
    """A policy bound to a vm stream, with its edges and status."""

    __slots__ = ("serial", "count", "stream", "policy", "in_edges", "out_edges", "accessed", "queued", "held", "dispatched",
                 "launched", "released", "event", "received_at", "dispatched_at", "started_at", "launched_at",
                 "released_at")

    def __init__(self, stream, policy):
        self.serial = next(_serials)
        self.count = 1              # how many received instructions this stands for (fusion)
        self.stream = stream        # a VmStream
        self.policy = policy
        self.in_edges: set = set()
        self.out_edges: set = set()
        self.accessed: tuple = ()   # the dependence objects it touched (the engine forgets it there on release)
        self.queued = False         # in the engine's ready list
        self.held = False           # held back by the engine's throttle on memory allocated ahead
        self.dispatched = False
        self.launched = False
        self.released = False
        self.event = None           # an ep event recorded after compute, if any
        # Wall-clock marks (time.perf_counter, None until reached) for hang reports and tracing
        self.received_at = self.dispatched_at = self.started_at = self.launched_at = self.released_at = None

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def failed(self) -> bool:
        """Did any of its policies (a fused group's members) fail?"""
        return any(p.failure is not None for p in self.policy.members())

    @property
    def times(self) -> dict:
        """The marks reached so far: received, dispatched, started, launched, released."""
        marks = {"received": self.received_at, "dispatched": self.dispatched_at, "started": self.started_at,
                 "launched": self.launched_at, "released": self.released_at}
        return {what: at for what, at in marks.items() if at is not None}

    # --- status ------------------------------------------------------------------

    def done(self) -> bool:
        """Launched, and the recorded event (if any) has completed."""
        if not self.launched:
            return False
        return self.event is None or self.event.query_done()

    def dispatchable(self) -> bool:
        """Not dispatched yet, and every in-edge ``src`` is satisfied: released (it left ``in_edges``), or
        dispatched where the policy lets a dispatched ``src`` count (``prescheduleable``; module docstring)."""
        if self.dispatched:
            return False
        for src in self.in_edges:
            if not (src.dispatched and self.policy.prescheduleable(src.stream, self.stream)):
                return False
        return True

    def __repr__(self) -> str:
        state = ("released" if self.released else "launched" if self.launched
                 else "dispatched" if self.dispatched else "waiting")
        return f"<{self.name} #{self.serial} on {self.stream.name}: {state}>"
