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
import heapq
import queue
import random
import threading
import time

from pyflow import env
from pyflow.runtime.actors import make_actor
from pyflow.runtime.msg import CMD, REGST

__all__ = ["Thread", "ThreadMgr", "DeterministicThread"]


class _ActorHome:
    """What both kinds of thread do with a message: construct, or hand it to its actor (one dict look-up by
    the destination's actor id: a message never searches for its actor)."""

    constructed = 0   # actors built here so far

    def handle(self, msg) -> None:
        actors = self.actors
        if msg.dst in actors:   # (the usual case: a subscript, no method call)
            actor = actors[msg.dst]
            actor.process_msg(msg)
            if actor.exited:
                del actors[msg.dst]
            return
        if msg.kind == CMD and msg.cmd == "construct":
            actor = make_actor(self.runtime, msg.arg, self)
            actors[actor.actor_id] = actor
            self.constructed += 1
            self.runtime.on_constructed(actor)
            return
        if msg.kind == CMD and msg.cmd == "turn":
            return   # the communication turn passed to an actor that has exited (the runtime is closing)
        raise RuntimeError(f"{msg!r} reached thread {self.name!r}, which has no live actor {msg.dst}")


class Thread(_ActorHome):
    """One actor thread: a channel, a local queue, a poll loop."""

    def __init__(self, runtime, thread_id: int, name: str, expected_actors: int):
        self.runtime, self.thread_id, self.name = runtime, thread_id, name
        self.actors: dict = {}
        self.expected_actors = expected_actors
        self.channel: queue.SimpleQueue = queue.SimpleQueue()
        self.local: collections.deque = collections.deque()
        self.thread = threading.Thread(target=self._poll_loop, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def enqueue(self, msg, local: bool = False) -> None:
        (self.local.append if local else self.channel.put)(msg)

    def enqueue_local(self, msgs: list) -> None:
        """An act's messages to actors of this thread, sent by one of them: its local queue, in order."""
        self.local.extend(msgs)

    def _poll_loop(self) -> None:
        local, channel, actors = self.local, self.channel, self.actors
        with env.bound(self.runtime.ctx):
            while True:
                msg = local.popleft() if local else channel.get()
                if msg.kind == CMD and msg.cmd == "stop":
                    break
                try:
                    if msg.dst in actors:   # (``handle``'s usual case, inlined: this loop runs once per message)
                        actor = actors[msg.dst]
                        actor.process_msg(msg)
                        if actor.exited:
                            del actors[msg.dst]
                    else:
                        self.handle(msg)   # a construct, or a message to an actor that exited
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
    """Every actor on the caller's thread; one pool of pending messages (see the module docstring).

    Each message is stored once with its arrival number and its call (``_call_of`` runs once per message,
    when it arrives): ``(seq, call, msg)``.  Taking the next one is O(1) amortized however many wait (a scan
    of the whole pool per message cost 32,137 ``_call_of`` calls per call of an 85-task plan):

    * ``_queue``  - the messages in arrival order;
    * ``_parked`` - a heap by call of messages that reached the queue's head while their call was beyond
      ``max_call`` (a later call's launch while the caller waits for call n): each is parked once;
    * ``_ready``  - a heap by arrival of parked messages whose call came within ``max_call``.  They left
      the queue's head, so they are older than anything still queued: they go first.

    With a seed the next message is a random one of the candidates (an interleaving to explore, then
    replay): that choice looks at every pending message, as it must.
    """

    def __init__(self, runtime, seed: int | None = None):
        self.runtime, self.name, self.thread_id = runtime, "deterministic", None
        self.actors: dict = {}
        self.seed = seed
        self._rng = random.Random(seed) if seed is not None else None
        self._queue: collections.deque = collections.deque()   # (seq, call, msg), oldest first
        self._parked: list = []                                # heap of (call, seq, msg)
        self._ready: list = []                                 # heap of (seq, call, msg)
        self._lock = threading.Lock()   # guards the pool (a launch may come from another thread)
        self._cond = threading.Condition(self._lock)
        self._waiting = 0   # callers blocked in wait_for_message: only they need a notify
        self.enqueued = 0   # messages ever enqueued (also each message's arrival number)

    def enqueue(self, msg, local: bool = False) -> None:
        call = _call_of(msg)
        with self._lock:
            self._queue.append((self.enqueued, call, msg))
            self.enqueued += 1
            if self._waiting:
                self._cond.notify_all()

    def enqueue_local(self, msgs: list) -> None:
        """``enqueue`` each of ``msgs`` (an act's messages, in order), taking the lock once for all of them."""
        with self._lock:
            first = self.enqueued   # (``_call_of`` inlined for a regst message: an act sends mostly those)
            self._queue.extend([(first + i, msg.piece[0] if msg.kind == REGST else _call_of(msg), msg)
                                for i, msg in enumerate(msgs)])
            self.enqueued = first + len(msgs)
            if self._waiting:
                self._cond.notify_all()

    def _entries(self) -> list:
        """Every pending ``(seq, call, msg)``, oldest first (for stepping: not on the hot path)."""
        parked = [(seq, call, msg) for call, seq, msg in self._parked]
        return sorted(self._ready + parked + list(self._queue), key=lambda entry: entry[0])

    def pending(self) -> list:
        """The messages waiting to be delivered, oldest first."""
        with self._cond:
            return [msg for _, _, msg in self._entries()]

    def take(self, index: int | None = None, max_call: int | None = None):
        """Remove the next message (the oldest; with a seed, a random one; or ``pending()[index]``).

        With ``max_call``, only messages about calls up to that one are candidates: waiting for
        call n runs the runtime until call n is done, and no further.
        """
        limit = _NO_LIMIT if max_call is None else max_call
        parked = self._parked
        if index is None and self._rng is None and not self._ready and (not parked or parked[0][0] > limit):
            # the usual case, without the lock: nothing parked is allowed yet, so the queue's head is next
            # (``popleft`` is atomic against an ``enqueue`` from another thread; only the delivering thread takes)
            try:
                seq, call, msg = self._queue.popleft()
            except IndexError:
                return None
            if call <= limit:
                return msg
            with self._lock:   # a later call's message: parked, as below, and the general case goes on
                heapq.heappush(parked, (call, seq, msg))
        with self._lock:
            if index is not None:
                entries = self._entries()
                chosen = entries.pop(index)
                self._queue, self._parked, self._ready = collections.deque(entries), [], []
                return chosen[2]
            if self._rng is not None:   # (nothing is ever parked in this mode)
                candidates = [i for i, (_, call, _) in enumerate(self._queue) if call <= limit]
                if not candidates:
                    return None
                chosen = self._queue[candidates[self._rng.randrange(len(candidates))]]
                self._queue.remove(chosen)
                return chosen[2]
            while self._parked and self._parked[0][0] <= limit:   # calls now within the limit
                call, seq, msg = heapq.heappop(self._parked)
                heapq.heappush(self._ready, (seq, call, msg))
            while self._ready:
                seq, call, msg = heapq.heappop(self._ready)
                if call <= limit:
                    return msg
                heapq.heappush(self._parked, (call, seq, msg))   # the limit went down since: park it again
            while self._queue:
                seq, call, msg = self._queue.popleft()
                if call <= limit:
                    return msg
                heapq.heappush(self._parked, (call, seq, msg))
            return None

    def wait_for_message(self, seen: int, timeout: float) -> bool:
        """Block until more than ``seen`` messages were ever enqueued (a launch from another thread)."""
        with self._cond:
            self._waiting += 1
            try:
                return self._cond.wait_for(lambda: self.enqueued > seen, timeout)
            finally:
                self._waiting -= 1


_NO_LIMIT = float("inf")   # ``take`` without ``max_call``: every call is allowed


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
