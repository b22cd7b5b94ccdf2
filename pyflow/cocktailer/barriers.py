"""Where a persistent kernel needs a grid barrier (seed 001): the barrier plan of ``codegen.py``.

Cocktailer's artifact syncs the grid after every operator.  pyflow syncs only
before an access that conflicts with one another block may have made since the
last barrier: read-after-write, write-after-read or write-after-write on
overlapping elements of a buffer.

* ``Access``: one buffer range a statement reads or writes, with its *pattern*:
  ``("elementwise", chunk, offset)`` when element ``e`` is touched by uTask
  ``e // chunk`` on a fixed thread, or None (any block).  Two elementwise uTask
  families over the same elements with the same chunk put each element on the
  same thread of the same block, so they never need a barrier between them.  A
  view at a run-time offset touches its whole ``bounds`` (or the whole buffer).
* ``Pending``: the accesses made since the last barrier (``CLEAR``: none;
  ``UNKNOWN``: anything, e.g. after a device function the plan cannot see into).
* ``BarrierPlan``: walks a block statement by statement and records in
  ``before`` every statement (or ``("pred"/"trip"/"cond"/"call"/"group", id)``
  for a scalar read) that must wait at a barrier, with the reason.  Loops are
  analysed to a fixpoint: what the end of an iteration left pending meets the
  start of the next.  In a recursive body every call starts a new segment, which
  is entered through a barrier; a ``CallGroup`` starts with a barrier if anything
  its lanes touch is pending (a group cannot wait for another), plans each lane
  on its own, and ends with the barrier that joins its groups.

``optimize.py`` uses the same accesses to find dependences (reclustering), and
``optimize_recursion.py`` to find independent sibling calls (recursion unroll).
"""

from __future__ import annotations

import dataclasses

from pyflow.cocktailer.ir import Branch, Call, CallGroup, FunctionCall, Loop, StmtBlock, TensorRef, UOperator, walk
from pyflow.cocktailer.scalars import Scalar, scalar_loads

__all__ = ["Access", "Pending", "CLEAR", "UNKNOWN", "BarrierPlan", "accesses", "op_accesses", "scalar_accesses",
           "group_accesses", "has_call", "block_has_call"]


@dataclasses.dataclass(frozen=True)
class Access:
    buffer: object
    lo: int
    hi: int
    pattern: tuple | None   # ("elementwise", chunk, absolute offset) or None (any block)
    write: bool

    def conflicts(self, other: "Access") -> bool:
        if self.buffer is not other.buffer or not (self.write or other.write):
            return False
        if self.hi <= self.lo or other.hi <= other.lo or self.hi <= other.lo or other.hi <= self.lo:
            return False
        return self.pattern is None or self.pattern != other.pattern


def accesses(ref: TensorRef, pattern, write: bool):
    if ref.offset.dynamic is None:
        lo = ref.offset.const
        pattern = (pattern[0], pattern[1], lo) if pattern is not None else None
        yield Access(ref.buffer, lo, lo + ref.size, pattern, write)
    else:  # a position known only at run time: anywhere in its bounds, any block
        lo, hi = ref.bounds if ref.bounds is not None else (0, 1 << 62)
        yield Access(ref.buffer, lo, hi, None, write)
    for load in scalar_loads(ref.offset.dynamic) if ref.offset.dynamic is not None else ():
        yield from accesses(load.ref, None, False)


def op_accesses(op: UOperator):
    for ref, pattern in op.reads:
        yield from accesses(ref, pattern, False)
    for ref, pattern in op.writes:
        yield from accesses(ref, pattern, True)


def scalar_accesses(s: Scalar | None):
    for load in scalar_loads(s) if s is not None else ():
        yield from accesses(load.ref, None, False)


@dataclasses.dataclass(frozen=True)
class Pending:
    """Accesses made since the last grid barrier; ``unknown``: anything may have been."""

    accesses: frozenset = frozenset()
    unknown: bool = False

    def needs_barrier(self, new) -> bool:
        new = list(new)
        if not new:
            return False
        return self.unknown or any(a.conflicts(b) for a in self.accesses for b in new)

    def add(self, new) -> "Pending":
        return Pending(self.accesses | frozenset(new), self.unknown)

    def __or__(self, other: "Pending") -> "Pending":
        return Pending(self.accesses | other.accesses, self.unknown or other.unknown)


CLEAR = Pending()
UNKNOWN = Pending(unknown=True)


class BarrierPlan:
    """Decides, statement by statement, where grid barriers go (``before`` holds statement ids)."""

    def __init__(self, inline_functions: bool, drop: frozenset = frozenset()):
        self.before: dict = {}     # id(stmt) -> reason
        self.inline = inline_functions
        self.in_recursion = False  # planning a recursive body: a call's resume starts with a barrier

    def _check(self, key, pending: Pending, new, reason: str) -> Pending:
        new = list(new)
        if key in self.before or pending.needs_barrier(new):
            self.before.setdefault(key, reason)
            pending = CLEAR
        return pending.add(new)

    def block(self, block: StmtBlock, pending: Pending) -> Pending:
        for item in block.items:
            pending = self.item(item, pending)
        return pending

    def item(self, item, pending: Pending) -> Pending:
        if isinstance(item, UOperator):
            return self._check(id(item), pending, op_accesses(item), f"before {item.name}")
        if isinstance(item, Loop) and self.in_recursion and has_call(item):
            # a loop holding a call is segments too (``codegen_recursion._Segments.loop``): the trip count is read
            # once where the loop starts, the head (a while loop's test) and the body start new segments
            if item.trip is not None:
                self._check(("trip", id(item)), pending, scalar_accesses(item.trip), "trip count")
            if item.head is not None:
                head = self.block(item.head, CLEAR)
                self._check(("cond", id(item)), head, scalar_accesses(item.cond), "loop condition")
            self.block(item.body, CLEAR)
            return CLEAR
        if isinstance(item, Loop):
            entry = pending
            if item.trip is not None:
                entry = self._check(("trip", id(item)), entry, scalar_accesses(item.trip), "trip count")
            state = entry
            while True:
                head = state
                if item.head is not None:
                    head = self.block(item.head, head)
                    head = self._check(("cond", id(item)), head, scalar_accesses(item.cond), "loop condition")
                end = self.block(item.body, head)
                merged = state | end
                if merged == state:
                    return head if item.head is not None else state
                state = merged
        if isinstance(item, Branch):
            state = self._check(("pred", id(item)), pending, scalar_accesses(item.pred), "branch predicate")
            if self.in_recursion and has_call(item):
                # an arm with a call starts a new segment (a barrier); an arm without one
                # stays in the current segment; the join starts a new segment
                for arm in (item.then, item.orelse):
                    self.block(arm, CLEAR if block_has_call(arm) else state)
                return CLEAR
            return self.block(item.then, state) | self.block(item.orelse, state)
        if isinstance(item, FunctionCall):
            if self.inline:
                return self.block(item.body, pending)
            self.block(item.body, UNKNOWN)     # a separate device function knows nothing of its caller
            return UNKNOWN
        if isinstance(item, Call):
            args = [a for s in item.args for a in scalar_accesses(s)]
            self._check(("call", id(item)), pending, args, "recursion arguments")
            return CLEAR if self.in_recursion else UNKNOWN
        if isinstance(item, CallGroup):
            # once the blocks split into groups, a group cannot wait for another: whatever any lane touches
            # must be settled before the split; inside a lane, its own group's barriers; a join ends it
            self._check(("group", id(item)), pending, group_accesses(item), "before the block groups split")
            for lane in item.lanes:
                self.block(lane.body, CLEAR)
            return CLEAR
        raise TypeError(f"cannot plan barriers for {item!r}")


def group_accesses(group: CallGroup) -> list:
    """Everything the lanes of ``group`` may read or write, the bodies of the functions they call included."""
    out, seen = [], set()

    def visit(block):
        for s in walk(block):
            if isinstance(s, UOperator):
                out.extend(op_accesses(s))
            elif isinstance(s, Branch):
                out.extend(scalar_accesses(s.pred))
            elif isinstance(s, Loop):
                out.extend(scalar_accesses(s.trip))
                out.extend(scalar_accesses(s.cond))
            elif isinstance(s, Call):
                for a in s.args:
                    out.extend(scalar_accesses(a))
                out.extend(accesses(s.result, None, True))
                if id(s.fn) not in seen:
                    seen.add(id(s.fn))
                    visit(s.fn.body)

    visit(group.body)
    return out


def block_has_call(block: StmtBlock) -> bool:
    """Does ``block`` hold a uTask reference (a recursive call), at any depth?"""
    return any(isinstance(s, Call) for s in walk(block))


def has_call(item) -> bool:
    """Does the nested uTask ``item`` hold a uTask reference?"""
    return any(block_has_call(b) for b in item.blocks())
