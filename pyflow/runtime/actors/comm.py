"""Seed 003 (5.9): the actor of a task that talks to other ranks: send, recv, collective.

It is the normal actor (its act is ``act``, ``runtime/act.py``: ``run_boxing_task`` with the
rank's transport) plus one rule from ``pyflow/runtime/comm_net.py``: it is read-ready
only on its **turn**, the rank's communication tasks acting one after another in the
Plan's order, so that every rank issues its collectives in the same order and no
rank waits in a recv for data its peer sends only later.  After its act it hands the
turn to the next one (a ``turn`` command, which only wakes it up).
"""

from __future__ import annotations

from pyflow.runtime.actors.base import Actor
from pyflow.runtime.msg import cmd_msg

__all__ = ["CommActor"]


class CommActor(Actor):
    """A send / recv / collective task: acts on its turn in the rank's communication order."""

    kind = "comm"

    def is_read_ready(self) -> bool:
        return super().is_read_ready() and self.runtime.comm_order.is_turn_of(self.actor_id, self.piece())

    def after_act(self, n: int, j: int, start: float, end: float) -> None:
        super().after_act(n, j, start, end)
        following = self.runtime.comm_order.advance()
        if following != self.actor_id:
            self.runtime.bus.send(cmd_msg(following, "turn"), self.thread)

    def on_cmd(self, msg) -> None:
        if msg.cmd != "turn":   # the turn came: act_until_fail runs next
            super().on_cmd(msg)

    def why_waiting(self) -> list[str]:
        reasons = super().why_waiting()
        holder, piece = self.runtime.comm_order.waiting_for()
        if holder != self.actor_id or piece != self.piece():
            op = self.plan.tasks[holder].op_name if holder in self.plan.tasks else holder
            reasons.append(f"waits for its turn in the rank's communication order (the turn is {op!r}'s, "
                           f"piece {piece})")
        return reasons
