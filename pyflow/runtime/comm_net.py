"""Seed 003 (5.9): CommNet: how one rank's actors talk to the other ranks, and in which order.

OneFlow runs one runtime per process; an actor whose consumer lives on another
machine hands the regst message to CommNet, which moves the message (and the data)
there.  pyflow's compiler already cuts every edge between ranks in two
(``pyflow/compiler/task_graph.py``): a ``send`` task on the sender's rank and a
``recv`` task on the receiver's, so no regst ever crosses ranks; collectives
(all-reduce...) are ``collective`` tasks on every member rank.  Each rank builds
its own Runtime over its own tasks of the one Plan (``Runtime(plan)`` in a rank
thread), and the data crosses through the rank's transport
(``pyflow/distributed/transport.py``) inside the acts.

Two things make that safe with actors, which, unlike the sequential interpreter,
act in whatever order their messages arrive:

* **Order.**  Collectives are matched across ranks by a per-group sequence number
  taken when they are issued, so every rank must issue them in the same order; a
  ``recv`` blocks its thread until the peer's ``send`` arrives, so a rank must not
  wait in a recv before it sent what the peer needs first.  ``CommOrder`` makes the
  communication tasks of a rank (send, recv, collective) act one after another in
  the Plan's order, call after call, as the sequential interpreter runs them: an
  actor of such a task is read-ready only on its turn, and passes the turn on (a
  ``turn`` command to the next one) after its act.  Every rank follows the same
  order, so collectives pair up and a recv only waits for data its peer sends
  before anything it needs from this rank.
* **A trigger.**  A ``recv`` reads no regst, so nothing would tell it that a call
  started, and a ``send`` makes nothing, so the sink tick would not wait for it:
  the compiler's ``rank_ticks.py`` joins both to the rank's ticks.
"""

from __future__ import annotations

import threading

__all__ = ["COMM_KINDS", "is_comm", "CommOrder"]

COMM_KINDS = ("send", "recv", "collective")


def is_comm(task) -> bool:
    """Does ``task`` talk to other ranks (through the transport)?"""
    return task.kind == "boxing" and task.op_type in COMM_KINDS


class CommOrder:
    """The turn of a rank's communication tasks: the Plan's order, micro-batch by micro-batch, call by call."""

    def __init__(self, plan, task_ids: list):
        mine = set(task_ids)
        start, end = plan.loop
        position = {tid: i for i, tid in enumerate(plan.order)}
        comm = [t for t in plan.order if t in mine and is_comm(plan.tasks[t])]
        before = [t for t in comm if position[t] < start]
        loop = [t for t in comm if start <= position[t] < end]
        after = [t for t in comm if position[t] >= end]
        k = plan.loop_times if end > start else 1
        per_loop = [(t, j) for j in range(k) for t in loop if j < plan.tasks[t].time_shape[1]]
        self.sequence = [(t, 0) for t in before] + per_loop + [(t, 0) for t in after]
        self._turn = 0
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.sequence)

    def is_turn_of(self, actor_id: int, piece: tuple) -> bool:
        """Is it ``actor_id``'s turn to act for ``piece`` = (call, j)?"""
        with self._lock:
            call, index = divmod(self._turn, len(self.sequence))
            return call == piece[0] and self.sequence[index] == (actor_id, piece[1])

    def advance(self) -> int:
        """The turn goes to the next task; returns its actor id."""
        with self._lock:
            self._turn += 1
            return self.sequence[self._turn % len(self.sequence)][0]

    def waiting_for(self) -> tuple:
        """(actor id, (call, j)) whose turn it is (for hang reports)."""
        with self._lock:
            call, index = divmod(self._turn, len(self.sequence))
            tid, j = self.sequence[index]
            return tid, (call, j)
