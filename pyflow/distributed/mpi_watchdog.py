"""The comm-net's watchdog: what the other ranks said on the control channel, and the checks that end a stuck wait.

OneFlow's CommNet only moves bytes; a rank that waits forever for a peer that ran
other code, ended early or died hangs the job.  pyflow's CommNet (``mpi_commnet.py``)
carries control messages beside the data, and its thread hands the ones below to this
watchdog, which it also asks, every ``_WATCH_SECONDS``, to look at the operations in
flight (``watch``): a wait that can never end becomes an error naming why.

=========  ========================================================================================
abort      a rank failed: every wait of every rank ends with ``RankAbortedError`` naming it (the
           CommNet itself handles it)
waiting    a collective that waited 0.5 s tells the ranks it waits for; two ranks that keep
           waiting for each other in different collectives ran different code ->
           ``CollectiveMismatchError`` (``deadlock``)
bye        a rank's script ended, after N collectives per group and M sends per (rank, tag): a
           collective or recv that needs more from it fails at once (``never_coming``)
where      a call waiting longer than ``PYFLOW_COLLECTIVE_TIMEOUT`` asks every rank where it is
           (what it waits for, the Python line its main thread is at), then raises
           ``CollectiveTimeoutError`` with that table and aborts every rank; ``census`` asks the
           same when MPI's process manager says a process died, and names the ranks that are silent
=========  ========================================================================================

It also watches the processes of the other ranks on this machine (``peers``: every rank's host
and pid, gathered at start-up): one that ended without saying goodbye died, and every wait ends
with ``RankAbortedError`` naming it and how it ended (``rank 1 failed: its process died: pid 4242
on node0 was killed by signal 9 (SIGKILL)``).  Under a plain MPICH ``mpiexec`` that is the only
word about a dead rank (its process manager kills the others a few seconds later, once the dead
rank's sentinel lets go: ``mpi_sentinel.py``); under ``launch`` it comes before MPICH's ``SIGUSR1``.

It runs on the comm-net thread (no lock of its own; ``CommNet.close`` only reads ``departed()``):
it reads the CommNet's counts and operations in flight, and acts through it (``tell``,
``finish``, ``abort_here``).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import socket
import sys
import sysconfig
import threading
import time

from pyflow.distributed.mpi_sentinel import how_it_ended
from pyflow.errors import CollectiveMismatchError, CollectiveTimeoutError, RankAbortedError

__all__ = ["CollectiveWatchdog", "user_line"]

_PROBE_SECONDS = 0.5    # a collective waiting this long tells the ranks it waits for (divergence check)
_ANSWER_SECONDS = 1.5   # how long the watchdog waits for the answers to "where are you?"
_PEER_SECONDS = 0.1     # how often it looks at the processes of the other ranks on this machine

_NOT_USER = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}) + (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "<")   # ... + pyflow/, "<frozen ...>"


def user_line(frame) -> str:
    """The innermost line of ``frame``'s stack outside pyflow, the standard library and installed packages."""
    from pyflow.vm.failure import describe_site

    while frame is not None and frame.f_code.co_filename.startswith(_NOT_USER):
        frame = frame.f_back
    return "no Python frame outside pyflow" if frame is None else describe_site(
        (frame.f_code.co_filename, frame.f_lineno))


@dataclasses.dataclass
class _PeerWait:
    """What another rank last said it waits for (its ``waiting`` message)."""

    key: tuple
    where: str
    missing: frozenset
    since: float
    count: int
    sent: int = 0    # for a recv: how many messages of its tag this rank had sent the peer when the peer said it


class CollectiveWatchdog:
    """One CommNet's view of the other ranks, and the checks that turn a wait that cannot end into an error."""

    def __init__(self, net, peers: dict | None = None):
        self.net = net                # the CommNet: its rank, counts, operations in flight and control channel
        here = socket.gethostname()   # peers: rank -> (host, pid); the ones on this machine are watched
        self.neighbours = {r: pid for r, (host, pid) in (peers or {}).items() if host == here and r != net.rank}
        self.ended: dict = {}         # rank -> how its process ended, seen once (confirmed at the next look)
        self.next_peer_look = 0.0
        self.peer_waits: dict = {}    # rank -> _PeerWait
        self.gone: dict = {}          # rank -> (collectives started per group, sends per (dst, tag)) | None
        self.dead: set = set()        # ranks whose process died (the census)
        self.answers: dict = {}       # watchdog token -> {rank: where it is}
        self.tokens = itertools.count()
        self.census: tuple | None = None   # (token, answer by) of a census in progress

    def departed(self) -> set:
        """The ranks that said goodbye or died."""
        return set(self.gone) | self.dead

    # --- control messages -------------------------------------------------------------------------------------------

    def hear(self, message: tuple) -> None:
        """A ``where``, ``here``, ``waiting`` or ``bye`` message from another rank."""
        net = self.net
        kind, sender = message[0], message[1]
        if kind == "where":
            net.tell(sender, ("here", net.rank, message[2], self.where_am_i()))
        elif kind == "here":
            self.answers.setdefault(message[2], {})[sender] = message[3]
        elif kind == "waiting":
            key, where, missing = message[2], message[3], frozenset(message[4])
            old = self.peer_waits.get(sender)
            count = old.count + 1 if old is not None and old.key == key and net.rank in old.missing else 1
            sent = net.sent[(sender, key[2])] if key[0] == "recv" else 0
            self.peer_waits[sender] = _PeerWait(key, where, missing, time.monotonic(), count, sent)
        elif kind == "bye":
            self.gone[sender] = message[2]
            self.peer_waits.pop(sender, None)

    def where_am_i(self) -> str:
        """This rank's answer to "where are you?": what it waits for, and its main thread's line."""
        net = self.net
        waits = [op.what for op in net.active if op.waited]
        state = "waiting for " + "; ".join(waits) if waits else f"running; last collective: {net.last_seen}"
        frame = sys._current_frames().get(threading.main_thread().ident)
        return f"{state}; main thread at {user_line(frame)}"

    # --- the census: who is still alive -------------------------------------------------------------------------------

    def start_census(self, seconds: float) -> None:
        """Ask every rank "where are you?"; the ones that do not answer in ``seconds`` are dead."""
        if self.census is None and self.net.closed is False:
            token = next(self.tokens)
            self.answers[token] = {}
            self.census = (token, time.monotonic() + seconds)
            self.net.tell_all(("where", self.net.rank, token))

    def _check_census(self, now: float) -> None:
        net = self.net
        token, answer_by = self.census
        answered = self.answers[token]
        silent = [r for r in range(net.world_size) if r != net.rank and r not in answered and r not in self.gone]
        if silent and now < answer_by:
            return
        self.census = None
        if silent:
            self.dead.update(silent)
            net.abort_here(silent[0], f"its process died (MPI's process manager reported a failed process, and "
                                      f"rank(s) {silent} did not answer)", broadcast=False)

    # --- the peer watch: the processes of the other ranks on this machine ---------------------------------------------

    def _look_at_peers(self) -> None:
        """A peer whose process ended twice in a row without a goodbye died: abort, naming it and how it ended.
        (Twice: a rank that ends cleanly has said goodbye before, but the control channel may hand it over
        only after this look.)"""
        net = self.net
        for r, pid in self.neighbours.items():
            if r in self.gone or r in self.dead:
                continue
            how = how_it_ended(pid)
            if how is None:
                self.ended.pop(r, None)
                continue
            if r not in self.ended:
                self.ended[r] = how
                continue
            self.dead.add(r)
            if net.aborted is None:
                net.abort_here(r, f"its process died: pid {pid} on {socket.gethostname()} {self.ended[r]}",
                               broadcast=False)

    # --- the checks -------------------------------------------------------------------------------------------------

    def watch(self) -> None:
        """Look at every operation in flight: fail the ones that can never end, or have waited too long."""
        net = self.net
        now = time.monotonic()
        if self.census is not None:
            self._check_census(now)
        if now >= self.next_peer_look:
            self.next_peer_look = now + _PEER_SECONDS
            self._look_at_peers()
        for op in list(net.active):
            if not op.waited or op.finished:
                continue
            missing = op.missing() if op.header_recvs else []
            error = self.never_coming(op, missing) if missing else None
            if error is None and missing and now - op.started > _PROBE_SECONDS:
                if now - op.last_probe >= _PROBE_SECONDS:
                    op.last_probe = now
                    for r in missing:
                        net.tell(r, ("waiting", net.rank, op.key, op.what, missing))
                error = self.deadlock(op, missing, now)
            if error is None and now - op.started > net.timeout:
                error = self._timed_out(op, missing, now)
            if error is not None:
                net.finish(op, error=error)
                net.abort_here(net.rank, f"{type(error).__name__}: {error}", broadcast=True)

    def never_coming(self, op, missing: list):
        """A missing rank said goodbye before reaching this op: it never comes."""
        net = self.net
        for r in missing:
            if r not in self.gone:
                continue
            counts = self.gone[r]
            if counts is None:
                return RankAbortedError(f"rank {r} stopped (after a failure) while rank {net.rank} waited for "
                                        f"{op.what}")
            started, sent = counts
            if op.key[0] == "recv":
                _, src, tag = op.key
                if net.received[(src, tag)] >= sent.get((net.rank, tag), 0):
                    return CollectiveMismatchError(
                        f"rank {net.rank} waits for a message from rank {src} (tag {tag}), which ended its "
                        f"script without sending it")
            elif op.key[1] >= started.get(op.key[0], 0):
                return CollectiveMismatchError(
                    f"rank {net.rank} waits at {op.what}, but rank {r} ended its script after "
                    f"{started.get(op.key[0], 0)} collective(s) of group {list(op.key[0])}: the ranks ran "
                    f"different code")
        return None

    def deadlock(self, op, missing: list, now: float):
        """A missing rank that keeps waiting, in another collective, for this rank is divergent code."""
        rank = self.net.rank
        for r in missing:
            peer = self.peer_waits.get(r)
            if (peer is not None and peer.key != op.key and rank in peer.missing and peer.count >= 2
                    and now - peer.since < 3 * _PROBE_SECONDS and not self._gave_since(r, peer)):
                return CollectiveMismatchError(
                    f"rank {rank} waits at {op.what}, but rank {r} waits at {peer.where}, which needs rank "
                    f"{rank}: the ranks ran different code")
        return None

    def _gave_since(self, r: int, peer: _PeerWait) -> bool:
        """Whether this rank has since given what rank ``r`` said it waits for, so that its word is stale: it
        joined that collective (a peer waiting at #2 of a group, then this rank reached #2, went on and now waits
        at #6 for the peer, is no divergence: the peer's "waiting" is older than this rank's arrival, and its
        next word will say #6; first seen on a loaded 16-core machine, a GPU compile slowing one rank), or sent
        the peer another message of the tag it waits on."""
        if peer.key[0] == "recv":
            return self.net.sent[(r, peer.key[2])] > peer.sent
        group, seq = peer.key
        return self.net.started[group] > seq

    def _timed_out(self, op, missing: list, now: float):
        net = self.net
        if op.asked is None:
            op.asked, op.answer_by = next(self.tokens), now + _ANSWER_SECONDS
            self.answers[op.asked] = {}
            net.tell_all(("where", net.rank, op.asked))
            return None
        answers = self.answers[op.asked]
        if len(answers) < net.world_size - 1 and now < op.answer_by:
            return None
        answers[net.rank] = self.where_am_i()
        table = "\n".join(f"  rank {r}: {answers.get(r, f'no answer in {_ANSWER_SECONDS:g} s')}"
                          for r in range(net.world_size))
        waiting_for = f"rank(s) {missing}" if missing else "the other ranks"
        return CollectiveTimeoutError(
            f"rank {net.rank} waited {net.timeout:g} s (PYFLOW_COLLECTIVE_TIMEOUT) for {waiting_for} at "
            f"{op.what}.\nWhere every rank is:\n{table}")
