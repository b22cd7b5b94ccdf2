"""Seed 003 (5.2): ``Thread`` and ``ThreadMgr``: where actors live, and the poll loop that drives them.

The ThreadMgr makes one Thread per ``thread_id`` in the Plan (a task's thread id is its
stream id: one per (rank, device, stream), so all compute tasks of one device share a
thread, and copies get their own).  A Thread owns its actors and has two queues:

* ``channel`` - a ``queue.SimpleQueue`` for messages from *other* threads;
* ``local``   - a plain deque for messages its own actors send each other (no lock).

Its poll loop takes the next message (local queue first, else block on the channel),
finds the destination actor and calls ``actor.process_msg(msg)``.  Two commands are the
thread's own: ``construct`` builds an actor *on this thread* (OneFlow's
ConstructActor), and ``stop`` leaves the loop at once (teardown after a failure).
The loop also ends by itself when every actor it built has exited (after eord).

Every thread binds the rank context of the code that made the runtime
(``pyflow.env.bound``), so the eager ops its actors issue go to that rank's VM.
An exception escaping an actor stops the whole runtime (``runtime.fail``); the
thread then leaves its loop: no thread dies silently, none is left behind.

**Deterministic mode** (``DeterministicThread``): every actor on one thread, the
caller's, and every pending message in one pool.  ``step()`` delivers one message:
the oldest, or, with a seed, one picked at random (a seedable interleaving), so a
schedule can be replayed and stepped through with pdb.  Waiting for call n delivers
only messages about calls up to n, so the caller's thread is back as soon as its call
is done (a later call's recv could otherwise block it, waiting for a peer rank that is
itself waiting for this rank, e.g. in the collective of ``numpy()`` of a global output).
"""

from __future__ import annotations

import collections
import queue
import random
import threading
import time

from pyflow import env
from pyflow.runtime.actors import make_actor
from pyflow.runtime.msg import CMD, REGST

__all__ = ["Thread", "ThreadMgr", "DeterministicThread"]


class _ActorHome:
    """What both kinds of thread do with a message: construct, or hand it to its actor."""

    def handle(self, msg) -> None:
        if msg.kind == CMD and msg.cmd == "construct":
            actor = make_actor(self.runtime, msg.arg, self)
            self.actors[actor.actor_id] = actor
            self.runtime.on_constructed(actor)
            return
        actor = self.actors.get(msg.dst)
        if actor is None and msg.kind == CMD and msg.cmd == "turn":
            return   # the communication turn passed to an actor that has exited (the runtime is closing)
        if actor is None:
            raise RuntimeError(f"{msg!r} reached thread {self.name!r}, which has no live actor {msg.dst}")
        actor.process_msg(msg)
        if actor.exited:
            del self.actors[msg.dst]


class Thread(_ActorHome):
    """One actor thread: a channel, a local queue, a poll loop."""

    def __init__(self, runtime, thread_id: int, name: str, expected_actors: int):
        self.runtime, self.thread_id, self.name = runtime, thread_id, name
        self.actors: dict = {}
        self.expected_actors = expected_actors
        self.constructed = 0
        self.channel: queue.SimpleQueue = queue.SimpleQueue()
        self.local: collections.deque = collections.deque()
        self.thread = threading.Thread(target=self._poll_loop, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def enqueue(self, msg, local: bool = False) -> None:
        (self.local.append if local else self.channel.put)(msg)

    def handle(self, msg) -> None:
        super().handle(msg)
        if msg.kind == CMD and msg.cmd == "construct":
            self.constructed += 1

    def _poll_loop(self) -> None:
        with env.bound(self.runtime.ctx):
            while True:
                msg = self.local.popleft() if self.local else self.channel.get()
                if msg.kind == CMD and msg.cmd == "stop":
                    break
                try:
                    self.handle(msg)
                except BaseException as error:  # noqa: BLE001 - the runtime stops and reports it
                    self.runtime.fail(error)
                    break
                if self.constructed == self.expected_actors and not self.actors:
                    break   # every actor of this thread exited
        self.actors.clear()

    def join(self, timeout: float | None = None) -> None:
        if self.thread.ident is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def is_alive(self) -> bool:
        return self.thread.is_alive()


class ThreadMgr:
    """One Thread per thread id of the Plan (OneFlow's ThreadMgr)."""

    def __init__(self, runtime, tasks):
        counts = collections.Counter(t.thread_id for t in tasks)
        prefix = f"pyflow-actor-{runtime.name}-" if runtime.name else "pyflow-actor-"
        names = {t.thread_id: f"{prefix}rank{t.rank}-{t.device}-{t.stream}" for t in tasks}
        self.threads = {tid: Thread(runtime, tid, names[tid], counts[tid]) for tid in sorted(counts)}

    def thread(self, thread_id: int) -> Thread:
        return self.threads[thread_id]

    def start(self) -> None:
        for thread in self.threads.values():
            thread.start()

    def stop(self) -> None:
        """Tell every thread to leave its loop now (after a failure)."""
        for thread in self.threads.values():
            thread.enqueue(_STOP)

    def join(self, timeout: float | None = None) -> list:
        """Join every thread within ``timeout`` seconds in all; returns the names of those still alive."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self.threads.values():
            thread.join(None if deadline is None else max(deadline - time.monotonic(), 0.0))
        return [t.name for t in self.threads.values() if t.is_alive()]

    def all(self) -> list:
        return list(self.threads.values())


class DeterministicThread(_ActorHome):
    """Every actor on the caller's thread; one pool of pending messages (see the module docstring)."""

    def __init__(self, runtime, seed: int | None = None):
        self.runtime, self.name, self.thread_id = runtime, "deterministic", None
        self.actors: dict = {}
        self.seed = seed
        self._rng = random.Random(seed) if seed is not None else None
        self._pool: list = []
        self._cond = threading.Condition()
        self.enqueued = 0   # messages ever enqueued

    def enqueue(self, msg, local: bool = False) -> None:
        with self._cond:
            self._pool.append(msg)
            self.enqueued += 1
            self._cond.notify_all()

    def pending(self) -> list:
        """The messages waiting to be delivered, oldest first."""
        with self._cond:
            return list(self._pool)

    def take(self, index: int | None = None, max_call: int | None = None):
        """Remove the next message (the oldest; with a seed, a random one; or ``pending()[index]``).

        With ``max_call``, only messages about calls up to that one are candidates: waiting for
        call n runs the runtime until call n is done, and no further.
        """
        with self._cond:
            if index is not None:
                return self._pool.pop(index)
            candidates = [i for i, msg in enumerate(self._pool) if max_call is None or _call_of(msg) <= max_call]
            if not candidates:
                return None
            pick = self._rng.randrange(len(candidates)) if self._rng is not None else 0
            return self._pool.pop(candidates[pick])

    def wait_for_message(self, seen: int, timeout: float) -> bool:
        """Block until more than ``seen`` messages were ever enqueued (a launch from another thread)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.enqueued > seen, timeout)


def _call_of(msg) -> int:
    """The call a message is about (-1: none, e.g. eord or a command to the thread)."""
    if msg.kind == REGST:
        return msg.piece[0]
    if msg.kind == CMD and msg.cmd in ("launch", "call_done"):
        return msg.arg
    return -1


class _StopMsg:
    kind, cmd, dst = CMD, "stop", None


_STOP = _StopMsg()
