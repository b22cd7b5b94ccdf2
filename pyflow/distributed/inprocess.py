"""Ranks as threads of one process: the in-process transport and its watchdog.

``InProcessWorld`` is the meeting point of N rank threads; each rank holds an
``InProcessTransport`` onto it.  A collective is a **round**, keyed by (group,
sequence number): each rank drops its descriptor and payload in, and waits
until every rank of the group has.  Then, on every rank:

* the descriptors are compared: different collectives (divergent code) raise
  ``CollectiveMismatchError`` listing each rank's op and Python line;
* otherwise the rank takes the list of payloads.  Each was copied when it was
  contributed: a rank may reuse its memory as soon as its own collective
  returns, while a slower peer still reads what it sent;
  a ``FailedPiece`` among them (a rank whose input failed) fails it, naming that rank.

Nothing hangs.  While it waits, a rank checks the world: another rank failed
(``abort``) -> ``RankAbortedError`` at once; a rank the round waits for has
already returned from its function (``finish``), or waits itself in another
round that needs this rank -> divergent code, ``CollectiveMismatchError`` at
once; nobody came for ``timeout`` seconds (``PYFLOW_COLLECTIVE_TIMEOUT``,
default 60) -> ``CollectiveTimeoutError`` naming the missing ranks and where
every rank was last seen.  The first two also abort the world, so every rank
stops.
"""

from __future__ import annotations

import collections
import os
import threading
import time

import numpy as np

from pyflow.distributed.transport import CollectiveDesc, FailedPiece, Transport
from pyflow.errors import CollectiveMismatchError, CollectiveTimeoutError, RankAbortedError

__all__ = ["InProcessWorld", "InProcessTransport"]

_POLL_SECONDS = 0.05


def _default_timeout() -> float:
    return float(os.environ.get("PYFLOW_COLLECTIVE_TIMEOUT", "60"))


class _Round:
    __slots__ = ("descs", "payloads", "taken")

    def __init__(self):
        self.descs: dict = {}
        self.payloads: dict = {}
        self.taken = 0


class InProcessWorld:
    """What N rank threads share: the rounds in progress, the mailboxes, who failed or finished."""

    def __init__(self, world_size: int, timeout: float | None = None):
        self.world_size = world_size
        self.timeout = _default_timeout() if timeout is None else timeout
        self._cond = threading.Condition()
        self._rounds: dict = {}
        self._mail: dict = collections.defaultdict(collections.deque)
        self.aborted: tuple | None = None    # (rank, error) of the first failure
        self.finished: set = set()           # ranks whose function returned
        self.last_seen: dict = {}            # rank -> the last CollectiveDesc it reached
        self.waiting: dict = {}              # rank -> (group, seq) of the round it waits in now

    # --- the world's state ---------------------------------------------------------------

    def abort(self, rank: int, error: BaseException) -> None:
        """Rank ``rank`` failed: every wait of every rank ends with RankAbortedError."""
        with self._cond:
            if self.aborted is None:
                self.aborted = (rank, error)
            self._cond.notify_all()

    def finish(self, rank: int) -> None:
        """Rank ``rank`` returned from its function: nobody should wait for it any more."""
        with self._cond:
            self.finished.add(rank)
            self._cond.notify_all()

    def _check_aborted(self, rank: int, waiting_for: str) -> None:
        if self.aborted is not None:
            failed, error = self.aborted
            raise RankAbortedError(f"rank {failed} failed ({type(error).__name__}: {error}) while rank {rank} "
                                   f"waited for {waiting_for}")

    def _where(self) -> str:
        lines = []
        for r in range(self.world_size):
            seen = self.last_seen.get(r)
            state = ("returned from its function" if r in self.finished else
                     "waiting in that collective" if r in self.waiting else "running")
            lines.append(f"  rank {r}: {state}; last collective: {seen.describe() if seen else 'none'}")
        return "\n".join(lines)

    # --- a collective round -------------------------------------------------------------------

    def exchange(self, rank: int, group: tuple, seq: int, desc: CollectiveDesc, payload) -> list:
        key = (group, seq)
        deadline = time.monotonic() + self.timeout
        with self._cond:
            entry = self._rounds.setdefault(key, _Round())
            entry.descs[rank], entry.payloads[rank] = desc, payload
            self.last_seen[rank] = desc
            self.waiting[rank] = key
            self._cond.notify_all()
            try:
                while len(entry.descs) < len(group):
                    self._check_aborted(rank, f"collective #{seq} of group {list(group)}: {desc.describe()}")
                    self._check_divergence(rank, key, entry, desc)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        missing = [r for r in group if r not in entry.descs]
                        error = CollectiveTimeoutError(
                            f"collective #{seq} of group {list(group)} waited {self.timeout:g} s "
                            f"(PYFLOW_COLLECTIVE_TIMEOUT) for rank(s) {missing}; rank(s) {sorted(entry.descs)} "
                            f"wait at {desc.describe()}.\nWhere every rank was last seen:\n{self._where()}")
                        self._abort_locked(rank, error)
                        raise error
                    self._cond.wait(min(left, _POLL_SECONDS))
            finally:
                self.waiting.pop(rank, None)
            entry.taken += 1
            if entry.taken == len(group):
                del self._rounds[key]
        keys = {r: entry.descs[r].key() for r in group}
        if len(set(keys.values())) > 1:
            table = "\n".join(f"  rank {r}: {entry.descs[r].describe()}" for r in group)
            raise CollectiveMismatchError(f"the ranks of group {list(group)} reached different collectives "
                                          f"(#{seq}); each rank was doing:\n{table}")
        payloads = [entry.payloads[r] for r in group]
        failed = [p for p in payloads if isinstance(p, FailedPiece) and p.rank != rank]
        if failed:
            raise RankAbortedError(f"rank {failed[0].rank} could not take part in collective #{seq} of group "
                                   f"{list(group)} ({desc.describe()}): {failed[0].reason}")
        return payloads

    def _check_divergence(self, rank: int, key: tuple, entry: _Round, desc: CollectiveDesc) -> None:
        """A missing rank that returned, or that waits in another round needing us, never comes."""
        group, seq = key
        for other in (r for r in group if r not in entry.descs):
            elsewhere = self.waiting.get(other)
            waits_for_us = (elsewhere is not None and elsewhere != key and rank in elsewhere[0]
                            and elsewhere in self._rounds and rank not in self._rounds[elsewhere].descs)
            blocked = waits_for_us  # we are stuck here, so we never get there: a deadlock
            if other in self.finished or blocked:
                there = ("returned from its function" if other in self.finished else
                         f"waits at {self.last_seen[other].describe()} (collective #{elsewhere[1]} of group "
                         f"{list(elsewhere[0])}), which needs rank {rank}")
                error = CollectiveMismatchError(
                    f"rank {rank} waits at collective #{seq} of group {list(group)}: {desc.describe()}, but rank "
                    f"{other} {there}: the ranks ran different code.\n{self._where()}")
                self._abort_locked(rank, error)
                raise error

    def _abort_locked(self, rank: int, error: BaseException) -> None:
        if self.aborted is None:
            self.aborted = (rank, error)
        self._cond.notify_all()

    # --- point to point -------------------------------------------------------------------------

    def send(self, src: int, dst: int, tag: int, array) -> None:
        with self._cond:
            self._mail[(src, dst, tag)].append(array)
            self._cond.notify_all()

    def recv(self, dst: int, src: int, tag: int):
        deadline = time.monotonic() + self.timeout
        with self._cond:
            box = self._mail[(src, dst, tag)]
            while not box:
                self._check_aborted(dst, f"a message from rank {src} (tag {tag})")
                if src in self.finished:
                    raise CollectiveMismatchError(f"rank {dst} waits for a message from rank {src} (tag {tag}), "
                                                  f"which returned from its function without sending it")
                left = deadline - time.monotonic()
                if left <= 0:
                    error = CollectiveTimeoutError(f"rank {dst} waited {self.timeout:g} s for a message from rank "
                                                   f"{src} (tag {tag}).\n{self._where()}")
                    self._abort_locked(dst, error)
                    raise error
                self._cond.wait(min(left, _POLL_SECONDS))
            return box.popleft()


def _copied(payload):
    """``payload`` with every numpy array in it copied (what a network would do by sending it)."""
    if isinstance(payload, np.ndarray):
        return payload.copy()
    if isinstance(payload, dict):
        return {k: _copied(v) for k, v in payload.items()}
    if isinstance(payload, (list, tuple)):
        return type(payload)(_copied(v) for v in payload)
    return payload


class InProcessTransport(Transport):
    """One rank's end of an ``InProcessWorld``."""

    def __init__(self, world: InProcessWorld, rank: int):
        super().__init__()
        self.world, self.rank, self.world_size = world, rank, world.world_size

    def exchange(self, group, seq, desc, payload) -> list:
        return self.world.exchange(self.rank, tuple(group), seq, desc, _copied(payload))

    def send(self, array, dst: int, tag: int) -> None:
        self.world.send(self.rank, dst, tag, array.copy())

    def recv(self, src: int, tag: int):
        return self.world.recv(self.rank, src, tag)
