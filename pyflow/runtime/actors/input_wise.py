"""Seed 003 (5.5.4): the InputWise actor: one act per input, on each input as it arrives.

A normal actor waits until every input of a piece is there, then acts once.  A task that
combines pieces arriving at different times - a boxing ``concat`` of the parts of a split
tensor, an ``add`` of two partial sums, coming from other ranks through recv tasks - can
instead start on whichever piece comes first: OneFlow's ``InputWiseActor`` (its ReduceAdd and
ReduceGather actors were such).  Per piece ``(call, j)`` of its output:

* it is read-ready when its ctrl inputs are there and *some* data input of this piece has
  arrived and was not used yet; it acts on that one alone (the earliest to arrive):
  ``act_input`` (``pyflow/runtime/act.py``) writes it into the output regst, which it
  took at the piece's first act and keeps until the last (with the runtime's timeline on, the act's
  record hears when the kernels it issued ran, as a normal act's: ``timeline.issuing_act``);
* that input goes back to its producer at once (which may then make its next piece);
* the act on the last input sends the output to its consumers and the ctrl inputs back.

So a piece takes as many acts as the task has data inputs, and the work on what arrived
overlaps the wait for the rest.  Which tasks get this actor: ``is_input_wise``.
"""

from __future__ import annotations

import time

from pyflow.runtime.act import act_input
from pyflow.errors import OpError
from pyflow.runtime.actors.base import Actor
from pyflow.runtime.timeline import issuing_act

__all__ = ["InputWiseActor"]


class InputWiseActor(Actor):
    """Acts once per arriving data input; the output goes out after the last input of the piece."""

    kind = "input_wise"

    def __init__(self, runtime, task, thread):
        super().__init__(runtime, task, thread)
        self.inputs = [rid for _, rid in self.data_keys]
        for rid in self.inputs:
            slot = self.in_slots[rid]
            if slot.mode != "one":
                raise ValueError(f"input-wise actor {self.actor_id} ({self.op_name}): input {slot.desc.lbn} comes "
                                 f"{slot.mode} x{slot.ratio} per act; each input must bring one piece per piece")
        if len(self.data_out) != 1:
            raise ValueError(f"input-wise actor {self.actor_id} ({self.op_name}) must make one output, "
                             f"not {len(self.data_out)}")
        self.arrived: list[int] = []    # data regst desc ids, in the order their regsts arrived
        self.used: set[int] = set()     # the data inputs already acted on for the piece in progress
        self.input_acts = 0             # acts so far (``acts`` counts finished pieces)

    def on_arrived(self, regst) -> None:
        super().on_arrived(regst)
        if regst.desc.id in self.inputs:
            self.arrived.append(regst.desc.id)

    def next_input(self):
        """The earliest-arrived data input of the piece in progress not used yet (None: none is here)."""
        for rid in self.arrived:
            if rid not in self.used and self.in_slots[rid].ready(self.acts, self.acts_per_call):
                return rid
        return None

    def is_read_ready(self) -> bool:
        ctrl = all(slot.ready(self.acts, self.acts_per_call) for slot in self.in_slots.values() if slot.key == "ctrl")
        return ctrl and self.next_input() is not None

    def act_once(self) -> None:
        n, j = self.piece()
        rid = self.next_input()
        source = self.in_slots[rid]
        for slot in self.out_slots.values():
            if slot.current is None:
                slot.current = slot.free.pop(0)
        start = time.perf_counter()
        try:
            args = (self.plan, self.task, source.key, source.regsts[0].tensor, self.data_out[0].current.tensor,
                    not self.used)
            if self.runtime._timeline.maxlen:   # the timeline hears when this act's kernels ran, as a normal act's
                issuing_act(self.runtime._device_work, self.actor_id, act_input, args)
            else:
                act_input(*args)
        except Exception as error:
            raise OpError(f"actor {self.actor_id} ({self.kind} actor of op {self.op_name!r}, task kind "
                          f"{self.task.kind}) failed on input {source.key} of piece {(n, j)}: "
                          f"{type(error).__name__}: {error}", op=self.op_name) from error
        end = time.perf_counter()
        self.arrived.remove(rid)
        self.used.add(rid)
        self.input_acts += 1
        if len(self.used) < len(self.inputs):   # more to come: this input goes back now
            regst = source.regsts.pop(0)
            self.runtime.record_act(self, (n, j), start, end, [(rid, regst.index, regst.piece)], [])
            self.give_back([regst], [regst.tensor] if regst.tensor is not None else [])
            return
        self.used.clear()   # the last input: the output goes out, this input and the ctrl inputs go back
        self.acts += 1
        self.after_act(n, j, start, end, slots=[source] + [s for s in self.in_slots.values() if s.key == "ctrl"])

    def why_waiting(self) -> list[str]:
        reasons = super().why_waiting()
        if self.used:
            used = sorted(self.in_slots[rid].key for rid in self.used)
            reasons.append(f"input-wise: acted on {used} of piece {self.piece()}, waits for the other inputs")
        return reasons
