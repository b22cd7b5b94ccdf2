"""Seed 003 (5.5.4): the actors of gradient accumulation: Repeat, Unpack, Acc, Pack.

With ``set_gradient_accumulation_steps(k)`` the compiler wraps the forward and backward
ops in a micro-batch loop by time shapes (``pyflow/compiler/passes/grad_acc.py``): the
ops inside act k times per call.  Four actors cross the loop's border, each defined
by how many pieces it takes and makes per call:

=========  ========  =========  ==========================================================
actor      takes     makes      what an act does (``act`` in ``act.py``)
=========  ========  =========  ==========================================================
Repeat     1         k          passes its input on (its output is an alias of it); the
                                input goes back after the k-th act *and* once every
                                alias came back
Unpack     1         k          act j copies micro-batch j (rows ``j*b .. (j+1)*b``); the
                                input goes back after the k-th act
Acc        k         1          act 0 copies its input, acts 1..k-1 add to it; the sum
                                goes out after the k-th act
Pack       k         1          act j writes its input into rows ``j*b ..`` of its output,
                                which goes out after the k-th act
=========  ========  =========  ==========================================================

All four are the generic actor with the rates of ``base.py``: "held" inputs (one piece
for k acts) for Repeat and Unpack, outputs filled over k acts for Acc and Pack.  The
classes name the rule and check that the Plan gives them those rates.
"""

from __future__ import annotations

from pyflow.runtime.actors.base import Actor

__all__ = ["RepeatActor", "UnpackActor", "AccActor", "PackActor"]


class _OneToK(Actor):
    def __init__(self, runtime, task, thread):
        super().__init__(runtime, task, thread)
        k = self.acts_per_call
        for key, rid in self.data_keys:
            slot = self.in_slots[rid]
            if k > 1 and (slot.mode, slot.ratio) != ("held", k):
                raise ValueError(f"{self.kind} actor {self.actor_id} ({self.op_name}): its input {slot.desc.lbn} "
                                 f"should come once per call and serve {k} acts, got {slot.mode} x{slot.ratio}")


class _KToOne(Actor):
    def __init__(self, runtime, task, thread):
        super().__init__(runtime, task, thread)
        for slot in self.data_out:
            if slot.acts_per_piece != self.acts_per_call:
                raise ValueError(f"{self.kind} actor {self.actor_id} ({self.op_name}): its output {slot.desc.lbn} "
                                 f"should be filled over {self.acts_per_call} acts, got {slot.acts_per_piece}")


class RepeatActor(_OneToK):
    """One input piece -> k acts, each sending the same memory on (an alias); input back after the k-th."""

    kind = "repeat"


class UnpackActor(_OneToK):
    """One input piece -> k outputs, micro-batch j at act j; input back after the k-th."""

    kind = "unpack"


class AccActor(_KToOne):
    """k input pieces -> one output: the sum over the micro-batches, sent after the k-th act."""

    kind = "acc"


class PackActor(_KToOne):
    """k input pieces -> one output: micro-batch j written to rows ``j*b ..``, sent after the k-th act."""

    kind = "pack"
