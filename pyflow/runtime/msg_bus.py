"""Seed 003: ``ActorMsgBus``: deliver a message to the thread that owns its destination actor.

Every actor lives on exactly one thread (its task's ``thread_id``: one per stream of
a device).  The bus knows which, and picks the cheapest way in (seed 003, 5.3):

* the sender runs on the destination's own thread: the thread's **local queue**
  (a plain deque, no lock: only that thread touches it);
* another thread of this process: the destination thread's **channel** (a
  ``queue.SimpleQueue``, safe across threads);
* another machine: OneFlow hands it to CommNet.  pyflow runs every task of a Plan
  in one process (in-process ranks share it), so there is no such case yet.

Messages sent by a device callback (a VM worker thread, ``device_ctx.py``) come from
no actor thread at all, so they always go through the channel.
"""

from __future__ import annotations

__all__ = ["ActorMsgBus"]


class ActorMsgBus:
    """Routes ``ActorMsg`` s by destination actor id."""

    def __init__(self):
        self._thread_of: dict[int, object] = {}   # actor id -> the Thread that owns it
        # ``thread_of(actor_id)``: the Thread of an actor.  Every message sent asks, so it is the dict's own
        # look-up (no Python function around it)
        self.thread_of = self._thread_of.__getitem__

    def add_route(self, actor_id: int, thread) -> None:
        self._thread_of[actor_id] = thread

    def send(self, msg, from_thread=None) -> None:
        """Deliver ``msg``; ``from_thread`` is the sender's Thread (None: not an actor thread)."""
        self._thread_of[msg.dst].enqueue(msg, local=from_thread is self._thread_of[msg.dst])
