"""The floor of a collective on pyflow's MPI design: the design's path with nothing on it but the path itself.

``bench_collectives.py`` compares pyflow's MPI transport with mpi4py called
directly.  This module answers the question a reader of that ratio asks next:
how close could *any* Python transport built on this design come?  The
design is (``pyflow/distributed/mpi_commnet.py``, ``mpi_protocols.py``):

* one thread per process makes every MPI call; a caller hands it a protocol
  (a generator that posts non-blocking requests and yields them) and sleeps
  on a lock until the thread has driven it to the end;
* round 1 of every collective carries a header, so the ranks check across
  the group that they reached the same collective, together with the first data;
* outputs come from a pool of host blocks (``HostPool``: no page faults).

This is the leanest such transport we could write.  Its header is the byte
count of the data it comes with, a sequence number and the descriptor
(pickled once per distinct descriptor), checked by comparing bytes, so a
different collective or a piece of the wrong size is caught and the data of
a mismatch is still received whole.  The all-gather receives straight into
the rows of its output; the all-reduce is a reduce-scatter into the output's
own chunk and an all-gather of the summed chunks, as pyflow's.  What it
leaves out, on purpose, is what pyflow's transport must also do: no
descriptor table on a mismatch (only "they differ"), no failed pieces, no
watchdog, no control channel, no goodbyes, one caller at a time, pieces of
one shape.  So its time per call is about the least pyflow's could be, not a
target pyflow could reach by tuning.  (Not strictly: pyflow's all-reduce
receives the first peer's chunk straight into its output, one buffer fewer,
and beats it on large arrays.)

    floor = FloorTransport(MPI.COMM_WORLD)
    out = floor.all_gather(piece, ("bench", piece.shape, "float32"))
    floor.close()
"""

from __future__ import annotations

import os
import pickle
import queue
import threading
import time

import numpy as np
from mpi4py import MPI

from pyflow.distributed.host_pool import HostPool
from pyflow.framework.sbp import balanced_split

__all__ = ["FloorTransport", "MismatchError"]

HEADER_BYTES = 1024
LINGER_SECONDS = 0.002   # after a call, the thread polls its inbox this long before it sleeps (pyflow's too)


class MismatchError(RuntimeError):
    """The ranks' headers differ: they reached different collectives (raised on every rank)."""


class _Call:
    __slots__ = ("protocol", "requests", "done", "result", "error")

    def __init__(self, protocol):
        self.protocol, self.requests, self.result, self.error = protocol, [], None, None
        self.done = threading.Lock()
        self.done.acquire()   # released by the comm thread when the protocol has ended


class FloorTransport:
    """All-gather and all-reduce over ``comm``'s ranks, on a comm thread of its own."""

    def __init__(self, comm):
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.peers = [r for r in range(self.size) if r != self.rank]
        self.pool = HostPool()
        self._blobs: dict = {}   # descriptor -> its pickle
        self._seq = 0
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._drive, name=f"floor-comm-r{self.rank}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._inbox.put(None)
        self._thread.join()
        self.comm.Free()

    # --- the comm thread --------------------------------------------------------------------------------------------

    def _next_call(self):
        """The next call: polled for a moment (a loop calls again at once: no wake-up to pay), then waited for."""
        until = time.monotonic() + LINGER_SECONDS
        while time.monotonic() < until:
            try:
                return self._inbox.get_nowait()
            except queue.Empty:
                os.sched_yield()
        return self._inbox.get()

    def _drive(self) -> None:
        """Wait for a call, then poll its requests, resuming the protocol whenever they all completed."""
        while True:
            call = self._next_call()
            if call is None:
                return
            try:
                call.requests = call.protocol.send(None)
                while True:
                    if MPI.Request.Testall(call.requests):
                        call.requests = call.protocol.send(None)
                    else:
                        os.sched_yield()   # a peer process may need this core
            except StopIteration as stop:
                call.result = stop.value
            except BaseException as error:  # noqa: BLE001 - raised in the caller
                call.error = error
            call.done.release()

    def _call(self, protocol):
        call = _Call(protocol)
        self._inbox.put(call)
        call.done.acquire()
        if call.error is not None:
            raise call.error
        return call.result

    # --- round 1: the header, checked as bytes ---------------------------------------------------------------------

    def _header(self, desc) -> bytes:
        """The part of a header every rank must send alike: sequence number, descriptor (pickled once)."""
        self._seq += 1
        blob = self._blobs.get(desc)
        if blob is None:
            blob = self._blobs[desc] = pickle.dumps(desc, protocol=pickle.HIGHEST_PROTOCOL)
        return self._seq.to_bytes(8, "little") + len(blob).to_bytes(4, "little") + blob

    def _tag(self, round_: int) -> int:
        return (self._seq % 4096) * 4 + round_

    def _round_one(self, desc, sends: dict, expected: int):
        """Post a header and ``sends[r]`` to each peer r; yield until the peers' headers are in; check them.

        A header is the byte count of the data it comes with, then ``_header``.
        Every peer's must equal this rank's, and announce ``expected`` bytes.
        If one does not, this rank takes the data sent to it (into scratch) and
        waits for its own sends before it raises: nothing stays in flight.
        """
        mine = self._header(desc)
        bufs = {r: np.empty(HEADER_BYTES, np.uint8) for r in self.peers}
        heads = [self.comm.Irecv([bufs[r], MPI.BYTE], r, self._tag(0)) for r in self.peers]
        posted = [self.comm.Isend([a.nbytes.to_bytes(8, "little") + mine, MPI.BYTE], r, self._tag(0))
                  for r, a in sends.items()]
        posted += [self.comm.Isend([a, MPI.BYTE], r, self._tag(1)) for r, a in sends.items()]
        yield heads
        count = {r: int.from_bytes(bufs[r][:8], "little") for r in self.peers}
        wrong = [r for r in self.peers if count[r] != expected or bufs[r][8:8 + len(mine)].tobytes() != mine]
        if wrong:
            yield posted + [self.comm.Irecv([np.empty(count[r], np.uint8), MPI.BYTE], r, self._tag(1))
                            for r in self.peers]
            raise MismatchError(f"rank {self.rank}: the headers of rank(s) {wrong} differ from this rank's "
                                f"({desc!r}, {expected} bytes)")
        return posted

    # --- the collectives ------------------------------------------------------------------------------------------

    def all_gather(self, piece: np.ndarray, desc) -> np.ndarray:
        """Every rank's ``piece`` (all the same shape), concatenated along axis 0 in rank order."""
        piece = np.ascontiguousarray(piece)
        rows = piece.shape[0]

        def protocol():
            posted = yield from self._round_one(desc, {r: piece for r in self.peers}, piece.nbytes)
            out = self.pool.empty((self.size * rows,) + piece.shape[1:], piece.dtype)
            recvs = [self.comm.Irecv([out[r * rows:(r + 1) * rows], MPI.BYTE], r, self._tag(1)) for r in self.peers]
            out[self.rank * rows:(self.rank + 1) * rows] = piece
            yield recvs + posted
            return out

        return self._call(protocol())

    def all_reduce(self, array: np.ndarray, desc) -> np.ndarray:
        """The sum over the ranks, chunk i summed on rank i in rank order (a reduce-scatter, then an all-gather)."""
        flat = np.ascontiguousarray(array).reshape(-1)
        chunk = [slice(lo, hi) for lo, hi in balanced_split(flat.size, self.size)]

        def protocol():
            posted = yield from self._round_one(desc, {r: flat[chunk[r]] for r in self.peers},
                                                flat[chunk[self.rank]].nbytes)
            out = self.pool.empty(flat.shape, flat.dtype)
            mine = out[chunk[self.rank]]
            parts = {r: self.pool.empty(mine.shape, flat.dtype) for r in self.peers}
            yield [self.comm.Irecv([parts[r], MPI.BYTE], r, self._tag(1)) for r in self.peers]
            pieces = [flat[chunk[r]] if r == self.rank else parts[r] for r in range(self.size)]
            if self.size == 1:
                mine[...] = flat
            else:   # in rank order, the first two in one pass (pyflow's order, bit for bit)
                np.add(pieces[0], pieces[1], out=mine)
                for p in pieces[2:]:
                    mine += p
            yield ([self.comm.Irecv([out[chunk[r]], MPI.BYTE], r, self._tag(2)) for r in self.peers]
                   + [self.comm.Isend([mine, MPI.BYTE], r, self._tag(2)) for r in self.peers] + posted)
            return out.reshape(np.shape(array))

        return self._call(protocol())
