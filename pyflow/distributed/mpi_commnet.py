"""CommNet: one process's thread that alone talks to MPI (seed 003's CommNet); its watchdog is ``mpi_watchdog.py``.

OneFlow's CommNet is a per-process service: actors hand it "send this to rank
r" / "tell me when rank r's data is here", and its own threads poll the network.
pyflow does the same on mpi4py.  One thread per process, ``pyflow-commnet-r<rank>``,
makes every MPI call; the VM's ccl worker, the user's thread and (later) actor
threads only hand it *operations* (``call``: and wait for the result, on a plain
lock that the thread releases; ``post``: and go on).  So no VM or actor thread
ever blocks inside MPI, and the thread that does can still answer the watchdog.

**An operation is a coroutine.**  Each transport call is a generator (written
in ``mpi_protocols.py``) that the thread drives: it posts non-blocking requests
(``Isend``/``Irecv``), yields them, and is resumed once they all completed
(``MPI.Request.Testall``), polled in a loop that *sleeps* between polls (``_pace``:
no core, no GIL; a spin with ``sched_yield`` took 4-14 ms of CPU per training step
from the rank's compute and the other rank's).  So each collective reads as straight-line code.

**The control channel** (its own communicator, pickled messages) is served by
the same loop, every millisecond while operations are in flight (not on every
poll: it is not on a collective's critical path).  An ``abort`` message (a rank failed)
ends every wait of every rank with ``RankAbortedError`` naming it; the others (``waiting``,
``bye``, ``where``/``here``) go to the watchdog (``mpi_watchdog.py``: divergent code,
ranks that ended or died, the collective timeout), which the loop also asks to look at the
operations in flight every ``_WATCH_SECONDS``.
"""

from __future__ import annotations

import collections
import pickle
import queue
import sys
import threading
import time
import zlib

import numpy as np

from pyflow.distributed.mpi_watchdog import CollectiveWatchdog
from pyflow.errors import DistributedError, RankAbortedError

__all__ = ["CommNet", "Operation", "mpi", "pack", "unpack"]

_IDLE_SECONDS = 0.02    # the thread's poll period with nothing in flight
_POLL_SECONDS = 0.00002  # right after progress, sleep this long between polls ...
_BACKOFF = 0.25          # ... then this fraction of the time since the last progress ...
_NAP_SECONDS = 0.0005    # ... up to this long (waiting for a slow peer)
_LINGER_SECONDS = 0.002  # with nothing in flight, keep polling this long before blocking on the inbox
_CHORE_SECONDS = 0.001  # while operations are in flight, serve the control channel this often (not every poll)
_WATCH_SECONDS = 0.05   # how often the watchdog looks at the operations in flight


_MPI = None


def mpi():
    """mpi4py's ``MPI`` module (imported on first use: nothing else in pyflow needs it)."""
    global _MPI
    if _MPI is None:
        from mpi4py import MPI

        _MPI = MPI
    return _MPI


def pack(obj, size: int) -> bytes:
    """``obj`` pickled behind its length: a header MPI can receive into a buffer of ``size`` bytes (it may be
    shorter: only the bytes used travel)."""
    blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(blob) + 4 > size:
        raise DistributedError(f"a header of {len(blob)} bytes does not fit in {size}")
    return len(blob).to_bytes(4, "little") + blob


def unpack(buf: np.ndarray):
    """What ``pack`` packed (``buf``: the receive buffer it arrived in)."""
    n = int.from_bytes(buf[:4], "little")
    return pickle.loads(buf[4:4 + n])


def _pickled(error: BaseException | None) -> bytes | None:
    try:
        return pickle.dumps(error)
    except Exception:  # noqa: BLE001 - the text says what happened; the object is a bonus
        return None


def _unpickled(blob: bytes | None) -> BaseException | None:
    try:
        return None if blob is None else pickle.loads(blob)
    except Exception:  # noqa: BLE001 - e.g. an exception class this process cannot import
        return None


def _fine_timer() -> bool:
    """Ask Linux to end this thread's sleeps within 1 us (the default slack, 50 us, makes 20 us sleeps 70)."""
    try:
        import ctypes

        slack, zero = ctypes.c_ulong(1000), ctypes.c_ulong(0)   # 29: PR_SET_TIMERSLACK; the slack in ns
        return sys.platform.startswith("linux") and ctypes.CDLL(None).prctl(29, slack, zero, zero, zero) == 0
    except (OSError, AttributeError):
        return False


# --- one operation in flight -----------------------------------------------------------------------------------------


class Operation:
    """One transport call on the comm-net thread: a protocol (generator) and the requests it waits for.

    Its caller waits on a plain lock that the comm-net thread releases when the
    operation ends: a hand-off there and back measured 4-8 us this way, 8-13 us
    with a ``threading.Event`` (a condition variable and a second lock per wait).
    """

    __slots__ = ("_what", "protocol", "key", "waited", "requests", "header_recvs", "started", "last_probe", "asked",
                 "answer_by", "finished", "result", "error", "_signal")

    def __init__(self, what, key=None, waited: bool = True):
        self._what = what           # its text, or a function that makes it (see ``what``)
        self.protocol = None        # a generator: yields lists of MPI requests, returns the result
        self.key = key              # (group, seq) of a collective, ("recv", src, tag) of a recv
        self.waited = waited        # does a caller wait for it (a send: no)
        self.requests: list = []
        self.header_recvs: dict = {}   # rank -> the request for its header (who is still missing)
        self.started = time.monotonic()
        self.last_probe = 0.0
        self.asked = None           # the watchdog's "where are you?" token, once asked
        self.answer_by = 0.0
        self.finished = False       # set (once) by the comm-net thread, then the caller is woken
        self.result = None
        self.error: BaseException | None = None
        self._signal = threading.Lock()
        self._signal.acquire()      # released when the operation ends

    @property
    def what(self) -> str:
        """What the operation is, for errors and the watchdog: "collective #3 of group [0, 1]: all_reduce
        float32[4] (at t.py:9)".  A collective passes a function that makes the text, called only when it
        is needed: most calls never need it, and making it costs a few microseconds on every call."""
        if not isinstance(self._what, str):
            self._what = self._what()
        return self._what

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the operation to end (the caller's side); True once it has."""
        if self._signal.acquire(True, timeout):
            self._signal.release()   # it stays "ended" for any later look
            return True
        return False

    def end(self, result=None, error: BaseException | None = None) -> bool:
        """Record the outcome and wake the caller (the comm-net thread's side); False if it had ended already."""
        if self.finished:
            return False
        self.result, self.error, self.finished = result, error, True
        self._signal.release()
        return True

    def missing(self) -> list:
        """The ranks whose header has not arrived yet."""
        return [r for r, req in self.header_recvs.items() if not req.Test()]


# --- the comm-net thread --------------------------------------------------------------------------------------


class CommNet:
    """One process's connection to the others: three communicators and the thread that polls them.

    ``coll`` carries collectives, ``p2p`` sends and recvs, ``ctl`` the control
    messages; all three are duplicates of ``comm`` (made here, on the caller's
    thread, before the comm-net thread starts).  ``peers``: rank -> (host, pid), for the watchdog's peer watch.
    """

    def __init__(self, comm, timeout: float, peers: dict | None = None):
        MPI = mpi()
        self.rank, self.world_size = comm.Get_rank(), comm.Get_size()
        self.timeout = timeout
        self.coll, self.p2p, self.ctl = comm.Dup(), comm.Dup(), comm.Dup()
        bits = int(comm.Get_attr(MPI.TAG_UB)).bit_length()
        self._gid_bits = min(16, bits - 2 - 8)
        self._seq_bits = bits - 2 - self._gid_bits
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.active: list = []
        self._ctl_sends: list = []
        self._ctl_recvs: list = []
        self.lock = threading.Lock()
        self.aborted: tuple | None = None    # (rank, text) of the first failure this rank heard of
        self.aborted_error: BaseException | None = None   # that rank's exception, when it could be pickled
        self._told_abort = False
        self.death: BaseException | None = None
        self.closed = False
        self._stopping = False
        self.watchdog = CollectiveWatchdog(self, peers)   # the others' word; the checks that end a wait
        self._gids: dict = {}                # group -> its bits of the message tags
        self.last_seen = "none"
        # counts the protocols keep (mpi_protocols.py): for goodbyes, and to pair up the recvs of one (src, tag)
        self.started = collections.Counter()        # group -> collectives this rank started in it
        self.sent = collections.Counter()           # (dst, tag) -> messages sent
        self.received = collections.Counter()       # (src, tag) -> messages received
        self.recv_tickets = collections.Counter()   # (src, tag) -> recvs started
        self.data_posted = collections.Counter()    # (src, tag) -> recvs that posted their data receive
        self._thread = threading.Thread(target=self._main, name=f"pyflow-commnet-r{self.rank}", daemon=True)
        self._thread.start()

    # --- the caller's side (any thread) -----------------------------------------------------------------------------

    def call(self, what, protocol_of, key=None):
        """Run the generator ``protocol_of(op)`` on the comm-net thread; wait for its result (or its error).

        ``what``: the operation's text, or a function that makes it (``Operation.what``)."""
        op = Operation(what, key)
        op.protocol = protocol_of(op)
        self._submit(op)
        while not op.wait(0.25):
            if not self._thread.is_alive():
                raise DistributedError(f"rank {self.rank}: the comm-net thread stopped "
                                       f"({self.death!r}) while waiting for {op.what}")
        if op.error is not None:
            raise op.error
        return op.result

    def post(self, what: str, protocol) -> None:
        """Run the generator ``protocol`` on the comm-net thread without waiting for it (a send)."""
        op = Operation(what, waited=False)
        op.protocol = protocol
        self._submit(op)

    def _submit(self, op: Operation) -> None:
        if self.aborted is not None:
            raise self._aborted_error(op.what)
        if self._stopping or not self._thread.is_alive():
            raise DistributedError(f"rank {self.rank}: the transport is closed ({op.what})")
        self._inbox.put(op)

    def abort(self, text: str, error: BaseException | None = None) -> None:
        """This rank failed (``text``; ``error`` goes along if it pickles): tell every rank; every wait here
        and there ends naming this rank."""
        with self.lock:
            if self.aborted is not None:
                return
            self.aborted = (self.rank, text)
            self.aborted_error = error
        self._inbox.put(lambda: self.abort_here(self.rank, text, broadcast=True))

    def census(self, seconds: float) -> None:
        """Ask every rank "where are you?"; the ones that do not answer in ``seconds`` are dead (any thread)."""
        self._inbox.put(lambda: self.watchdog.start_census(seconds))

    def close(self, grace: float) -> bool:
        """Say goodbye to every rank, wait for theirs, stop the thread; True if MPI may be finalized.

        A clean goodbye tells each rank how many collectives and sends this rank
        made (so a rank still waiting for more fails at once); then this rank
        waits, like ``MPI_Finalize``, until every rank said goodbye.  After an
        abort it waits at most ``grace`` s, so that the others print their errors
        before the first process exit makes MPI's process manager end the job.
        """
        clean = self.aborted is None
        if self._thread.is_alive():
            self._inbox.put(lambda: self._say_bye(clean))
            deadline = None if clean else time.monotonic() + grace
            while len(self.watchdog.departed()) < self.world_size - 1 and self._thread.is_alive():
                if deadline is None and self.aborted is not None:
                    deadline = time.monotonic() + grace
                if deadline is not None and time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            self._stopping = True
            self._inbox.put(lambda: None)
            self._thread.join(grace if self.aborted is not None else self.timeout)
        self.closed = True
        return self.aborted is None and not self._thread.is_alive() and not self.active

    def _aborted_error(self, what: str) -> RankAbortedError:
        rank, text = self.aborted
        if rank == self.rank:
            return RankAbortedError(f"rank {rank} (this rank) failed earlier ({text}); {what} cannot run")
        return RankAbortedError(f"rank {rank} failed ({text}) while rank {self.rank} waited for {what}")

    # --- the thread ---------------------------------------------------------------------------------------------

    def _main(self) -> None:
        """Admit new operations, advance those whose requests completed, serve control messages, watch.

        One poll is lean: the inbox, then ``Testall`` on each operation in
        flight.  The control channel and the watchdog are looked at every
        ``_CHORE_SECONDS`` (1 ms) while operations are in flight, not on every
        poll: they are not on a collective's critical path.
        """
        MPI = mpi()
        testall = MPI.Request.Testall
        _fine_timer()
        now = last_progress = next_chores = next_watch = time.monotonic()
        try:
            while True:
                idle = not self.active and not self._ctl_sends
                admitted = self._admit(block=idle and now - last_progress > _LINGER_SECONDS)
                progressed = self._advance(testall)
                now = time.monotonic()
                if progressed or admitted:
                    last_progress = now
                if now >= next_chores:
                    self._serve_control(MPI)
                    next_chores = now + _CHORE_SECONDS
                    if now >= next_watch:
                        self.watchdog.watch()
                        next_watch = now + _WATCH_SECONDS
                if self._stopping and not self.active and not self._ctl_sends and self._inbox.empty():
                    return
                self._pace(now - last_progress)
        except BaseException as error:  # noqa: BLE001 - every wait here fails, naming this rank and the cause
            self.death = error
            text = f"the comm-net thread of rank {self.rank} failed: {type(error).__name__}: {error}"
            print(f"pyflow: {text}", file=sys.stderr, flush=True)
            self.abort_here(self.rank, text, broadcast=False)

    @staticmethod
    def _pace(since_progress: float) -> None:
        """Between polls: sleep (no core, no GIL), 20 us after progress, then a quarter of the time since, up to
        0.5 ms: a message waits for the next poll at most a quarter of the time already waited (MPI has no wait
        with a timeout; a blocking ``Waitall`` would stop admitting operations and serving control messages)."""
        time.sleep(min(_NAP_SECONDS, max(_POLL_SECONDS, since_progress * _BACKOFF)))

    def _admit(self, block: bool) -> bool:
        """Start the operations handed in since the last look (and run control actions); any?"""
        if not block and self._inbox.empty():
            return False
        try:
            item = self._inbox.get(timeout=_IDLE_SECONDS) if block else self._inbox.get_nowait()
        except queue.Empty:
            return False
        while True:
            if isinstance(item, Operation):
                if self.aborted is not None:
                    self.finish(item, error=self._aborted_error(item.what))
                else:
                    self.active.append(item)
                    self._resume(item)
            else:
                item()   # a control action from another thread (abort, bye)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _advance(self, testall) -> bool:
        """Resume every operation whose requests all completed (``MPI.Request.Testall``); any?"""
        active = self.active
        if not active:
            return False
        progressed = False
        for op in list(active):   # in submission order: recvs of one (src, tag) pair up in order
            if op.finished or (op.requests and not testall(op.requests)):
                continue   # finished meanwhile (an abort), or still waiting
            progressed = True
            self._resume(op)
            while not op.finished and op.requests and testall(op.requests):   # done at once (an eager message
                self._resume(op)                                                # was in): no poll round between
        return progressed

    def _resume(self, op: Operation) -> None:
        try:
            op.requests = op.protocol.send(None)
        except StopIteration as stop:
            self.finish(op, result=stop.value)
        except BaseException as error:  # noqa: BLE001 - the op's error, raised in its caller
            self.finish(op, error=error)

    def finish(self, op: Operation, result=None, error: BaseException | None = None) -> None:
        """End ``op`` (the comm-net thread's side); a failed send nobody waits for aborts the job."""
        if op in self.active:
            self.active.remove(op)
        if not op.end(result, error):
            return
        if error is not None and not op.waited and self.aborted is None:   # nobody waits to hear it
            self.abort_here(self.rank, f"{op.what} failed: {type(error).__name__}: {error}", broadcast=True)

    # --- control messages -------------------------------------------------------------------------------------------

    def tell(self, rank: int, message: tuple) -> None:
        """Send a control message to ``rank`` (not waited for: the loop drops the send once it completed)."""
        self._ctl_sends.append(self.ctl.isend(message, rank, 0))

    def tell_all(self, message: tuple) -> None:
        """Send a control message to every other rank."""
        for r in range(self.world_size):
            if r != self.rank:
                self.tell(r, message)

    def _serve_control(self, MPI) -> None:
        self._ctl_sends = [req for req in self._ctl_sends if not req.Test()]
        while True:
            message = self.ctl.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG)
            if message is None:
                break
            self._ctl_recvs.append(message.irecv())
        still = []
        for req in self._ctl_recvs:
            arrived, obj = req.test()
            if arrived:
                self._on_control(obj)
            else:
                still.append(req)
        self._ctl_recvs = still

    def _on_control(self, message: tuple) -> None:
        if message[0] == "abort":
            self.abort_here(message[1], message[2], broadcast=False, error_blob=message[3])
        else:
            self.watchdog.hear(message)

    def abort_here(self, rank: int, text: str, broadcast: bool, error_blob: bytes | None = None) -> None:
        """Record the first failure, tell the others if it is this rank's, fail every operation in flight."""
        with self.lock:
            first = self.aborted is None
            if first:
                self.aborted = (rank, text)
                self.aborted_error = _unpickled(error_blob)
        if broadcast and self.aborted[0] == self.rank and not self._told_abort:
            self._told_abort = True
            self.tell_all(("abort", self.rank, self.aborted[1], _pickled(self.aborted_error)))
        if first and rank != self.rank:
            summary = text.splitlines()[0] if text else ""
            print(f"pyflow: rank {self.rank} stops: rank {rank} failed: {summary}", file=sys.stderr, flush=True)
        for op in list(self.active):
            if op.waited:
                self.finish(op, error=self._aborted_error(op.what))
            else:
                self.active.remove(op)

    def _say_bye(self, clean: bool) -> None:
        with self.lock:
            counts = (dict(self.started), dict(self.sent)) if clean else None
        self.tell_all(("bye", self.rank, counts))

    # --- message tags ---------------------------------------------------------------------------------------------

    def tag(self, group: tuple, seq: int, round_: int) -> int:
        """A collective's message tag: its group, its sequence number (mod 2**seq_bits) and the round."""
        gid = self._gids.get(group)
        if gid is None:
            if self.world_size <= self._gid_bits:
                gid = sum(1 << r for r in group)                  # exact: one bit per rank
            else:
                gid = zlib.crc32(repr(group).encode()) % (1 << self._gid_bits)   # checked in the header
            self._gids[group] = gid
        return (((gid << self._seq_bits) | (seq % (1 << self._seq_bits))) << 2) | round_
