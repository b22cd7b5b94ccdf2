"""Seed 003 (5.5): an actor's slots, one per regst desc of its task (``base.py``: the Actor that holds them).

* ``InSlot``  - a consumed regst desc: the regsts that arrived from the producer, in piece order,
  and how this actor's acts read them (``mode``: one piece per act, a piece **held** for
  several acts, or several pieces **absorbed** per act: the rates of ``base.py``'s docstring);
* ``OutSlot`` - a produced regst desc: its regsts (regst num of them), the free ones first in line,
  the copy an act is filling, and the consumers each filled one goes to.
"""

from __future__ import annotations

import bisect

from pyflow.compiler.task_graph import pieces_per_call

__all__ = ["InSlot", "OutSlot"]


class InSlot:
    """A consumed regst desc: the regsts that arrived, kept in piece order."""

    def __init__(self, key: str, desc, producer_task, acts_per_call: int):
        self.key = key                  # "in_0", "in_1"... or "ctrl"
        self.desc = desc
        self.producer = desc.producer   # actor id to return regsts to
        self.producer_op = producer_task.op_name
        made = pieces_per_call(producer_task, next(k for k, rid in producer_task.produced.items() if rid == desc.id))
        if made == acts_per_call:
            self.mode, self.ratio = "one", 1
        elif acts_per_call % made == 0:
            self.mode, self.ratio = "held", acts_per_call // made      # uses per piece
        elif made % acts_per_call == 0:
            self.mode, self.ratio = "absorb", made // acts_per_call    # pieces per act
        else:
            raise ValueError(f"regst desc {desc.lbn}: {made} pieces per call cannot feed {acts_per_call} acts")
        self.regsts: list = []          # sorted by piece
        self.uses = 0                   # acts that used the front regst ("held")
        self.eord = False

    def expected_piece(self, acts: int, acts_per_call: int) -> tuple:
        """The piece the act number ``acts`` (counted from the first call) reads from this slot."""
        n, j = divmod(acts, acts_per_call)
        if self.mode == "held":
            return (n, j // self.ratio)
        if self.mode == "absorb":
            return (n, j * self.ratio + self.ratio - 1)
        return (n, j)

    def add(self, regst) -> None:
        regsts = self.regsts
        if not regsts or regsts[-1].piece < regst.piece:
            regsts.append(regst)   # the usual case: pieces arrive in order
        else:
            bisect.insort(regsts, regst, key=lambda r: r.piece)

    def ready(self, acts: int, acts_per_call: int) -> bool:
        return bool(self.regsts) and self.regsts[0].piece == self.expected_piece(acts, acts_per_call)

    def ready_at(self, n: int, j: int) -> bool:
        """``ready`` for the act at piece ``(n, j)`` (the hot path: one comparison in the common mode)."""
        regsts = self.regsts
        if not regsts:
            return False
        if self.mode == "one":
            return regsts[0].piece == (n, j)
        if self.mode == "held":
            return regsts[0].piece == (n, j // self.ratio)
        return regsts[0].piece == (n, j * self.ratio + self.ratio - 1)


class OutSlot:
    """A produced regst desc: every copy of it, the free ones first in line."""

    def __init__(self, key: str, desc, regsts: list, acts_per_piece: int, consumers: list):
        self.key = key
        self.desc = desc
        self.regsts = regsts            # all copies (regst num of them)
        self.free = list(regsts)        # FIFO of free copies
        self.acts_per_piece = acts_per_piece
        self.consumers = consumers      # actor ids
        self.current = None             # the copy being filled (taken from ``free`` by an act)
        self.pinned_source = None       # the InSlot whose memory this alias (or inplace) regst is, if consumed

    def all_back(self) -> bool:
        return self.current is None and len(self.free) == len(self.regsts)
