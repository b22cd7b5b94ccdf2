"""``MPITransport``: the transport of ranks that are MPI processes (seed 003's CommNet, seed 004's collectives).

Every call becomes an operation of this process's comm-net thread
(``mpi_commnet.py``): a generator that posts non-blocking MPI requests and
yields them until they completed.  This module holds those generators: the
protocol of each collective and of send / recv.

**Round 1 carries the check and the first data together.**  To every other
member, a rank sends a small header (the ``CollectiveDesc``'s key and the
user's Python line; a failure reason if its input failed; its piece's dtype
and shape; how many bytes of data it sends to whom in this round) and, at
once, that data: contiguous pieces go as they are, without a copy.  A receiver
posts its data receives as soon as the headers are in, each exactly as large
as its sender declared (no probe, and no message can be cut short), and uses
the data only after every header is in and they agree.  If they do not, every
rank raises the same error (different descriptors -> ``CollectiveMismatchError``
listing each rank's op and line; a failed member -> ``RankAbortedError`` naming
it) after receiving what was sent to it (into scratch buffers when it does not
fit where it was wanted), so nothing stays in flight and the ranks may go on.
So the cross-rank check costs no extra round trip.

==============  ====================================================================  ==========================
collective      round 1 (with the headers)                                            round 2
==============  ====================================================================  ==========================
all_reduce      chunk i of the input to group[i], which sums the chunks in group      its summed chunk to all,
                order (a reduce-scatter; the in-process transport's exact numbers)    straight into the output
reduce_scatter  slice ``bounds[i]`` to group[i], summed in group order                -
all_gather      the piece to all (along axis 0: straight into the output's rows)     -
all_to_all      ``pieces[i]`` to group[i]                                             -
broadcast       root's array to all                                                   -
reduce          each array to the root, summed in group order                         -
exchange        the pickled payload to all                                            -
barrier         headers only                                                          -
==============  ====================================================================  ==========================

Messages are matched by tag (``CommNet.tag``: group, sequence number, round),
never by the order ranks post them, so ranks may run their collectives in any
order, as with the in-process transport.  Point to point: ``send`` copies the
array (so it returns at once, like MPI's buffered send), then posts a header
(dtype, shape) and the data; the recvs of one (source, tag) pair up in order.

**The fixed cost of a call** (issue 16's benchmark: a call of pyflow's cost
0.1-0.2 ms more than MPI's own, which moves 1 MB in about 0.2 ms) is kept
small: a header is a tuple of builtins (pickled in under 1 us, a dataclass
took 4); the data receives need no probe; the all-reduce's round 1 ends once
this rank's chunks are in (its own sends are waited for with round 2's
requests), and it adds the first two chunks in one pass straight into its
output; the all-gather copies its own piece into its output while the peers
take theirs.
"""

from __future__ import annotations

import itertools
import math
import pickle
import threading
import typing
import weakref

import numpy as np

from pyflow.distributed.mpi_commnet import CommNet, Operation, mpi, pack, unpack
from pyflow.distributed.transport import CollectiveDesc, FailedPiece, Transport
from pyflow.errors import CollectiveMismatchError, DistributedError, RankAbortedError

__all__ = ["MPITransport"]

HEADER_BYTES = 4096     # a collective's header: the descriptor, a failure, its piece's shape
P2P_HEADER_BYTES = 512  # a send's header: dtype and shape


class _Header(typing.NamedTuple):
    """A rank's header of a collective.  It travels as a plain tuple of builtins: pickling one takes about
    0.6 us, a dataclass holding the ``CollectiveDesc`` about 4 us (each way, on every call)."""

    group: tuple
    seq: int
    kind: str               # the transport method: all_reduce, exchange...
    key: tuple              # desc.key(): what the ranks must agree on
    where: str              # desc.describe() on the issuing rank (its own source line)
    failure: str | None     # why this rank cannot take part (FailedPiece), or None
    meta: object            # (dtype, shape) of its piece, or what the collective needs
    sizes: tuple            # ((rank, bytes), ...): the round-1 data it sends, to whom and how much


class _Abandoned(Exception):
    """This rank took part with a failure (``abandon``): the others know; nothing to return."""


class _Block(np.ndarray):
    """A pooled block of host memory (its own type, so that numpy's views stop at the lease below)."""


class _Lease(np.ndarray):
    """One loan of a block: every array handed out is a view of it, so it lives exactly as long as they do."""


class HostPool:
    """A caching allocator for the transport's host arrays (outputs and receive buffers of 64 KB and more).

    A fresh large numpy array is fresh memory from the OS: the first write of
    each page faults (here about 4 ms for 16 MB, more than the copy itself), which
    MPI writing into a buffer it was given never pays.  Like pyflow's device
    allocator, the pool keeps blocks (sizes rounded up to a power of two) and
    lends them again.  An array it hands out is a view of a ``_Lease`` of a
    block; numpy's views of it (slices, reshapes, transposes) keep the lease
    alive, so the block comes back (``weakref.finalize``) exactly when the last
    array that sees it is gone.  At most ``limit`` bytes of free blocks are kept.
    """

    SMALL = 64 << 10

    def __init__(self, limit: int = 256 << 20):
        self.limit = limit
        self._free: dict = {}     # size -> [blocks]
        self._free_bytes = 0
        self._lock = threading.RLock()   # a lease may die (and come back) on any thread, inside empty() too

    def empty(self, shape, dtype) -> np.ndarray:
        """An uninitialized C-contiguous array, on a free block when there is one."""
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        nbytes = math.prod(shape) * dtype.itemsize   # (np.prod: 3 us of the 7 this call took)
        if nbytes < self.SMALL:
            return np.empty(shape, dtype)
        size = 1 << (nbytes - 1).bit_length()
        with self._lock:
            blocks = self._free.get(size)
            if blocks:
                block = blocks.pop()
                self._free_bytes -= size
            else:
                block = np.empty(size, np.uint8).view(_Block)
        lease = block[:nbytes].view(_Lease)
        weakref.finalize(lease, self._give_back, size, block)
        return lease.view(np.ndarray).view(dtype).reshape(shape)

    def copy(self, array) -> np.ndarray:
        """A C-contiguous copy of ``array``, on a pooled block."""
        array = np.asarray(array)
        out = self.empty(array.shape, array.dtype)
        out[...] = array
        return out

    def _give_back(self, size: int, block: np.ndarray) -> None:
        with self._lock:
            if self._free_bytes + size <= self.limit:
                self._free.setdefault(size, []).append(block)
                self._free_bytes += size


def _c(a) -> np.ndarray:
    """``a`` as a C-contiguous array (no copy if it is one; 0-d stays 0-d, unlike ``np.ascontiguousarray``)."""
    return np.asarray(a, order="C")


def _raw(a: np.ndarray):
    """``a``'s memory as an MPI byte buffer (no copy: ``a`` is C-contiguous)."""
    if a.dtype.hasobject:
        raise DistributedError(f"the transport moves numeric arrays, not dtype {a.dtype}")
    return [a.reshape(-1).view(np.uint8), mpi().BYTE]


def _chunks(total: int, parts: int) -> list:
    """``parts`` near-equal ``(start, stop)`` chunks of ``range(total)``, the first ones one longer."""
    q, r = divmod(total, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + q + (1 if i < r else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _sum_into(out: np.ndarray, pieces: list) -> np.ndarray:
    """``pieces`` summed in order into ``out``: ``((p0 + p1) + p2) + ...``, the in-process sum bit for bit.

    The first two are added in one pass (``np.add(p0, p1, out=out)``: no copy
    of ``p0`` first); ``out`` may be ``p0`` or ``p1`` itself (an all-reduce
    receives a peer's chunk straight into its output).
    """
    if len(pieces) == 1:
        out[...] = pieces[0]
        return out
    np.add(pieces[0], pieces[1], out=out)
    for piece in pieces[2:]:
        out += piece
    return out


def _same_layout(heads: dict, group: tuple, what: str):
    """The (dtype, shape) every member must share (an all-reduce's input...), else the same error on every rank."""
    metas = {r: heads[r].meta for r in group}
    if len(set(metas.values())) > 1:
        listed = ", ".join(f"rank {r}: {np.dtype(m[0])}{list(m[1])}" for r, m in metas.items())
        raise DistributedError(f"{what}: the ranks' pieces differ ({listed})")
    dtype, shape = metas[group[0]]
    return np.dtype(dtype), tuple(shape)


def _disagreement(heads: dict, group: tuple, seq: int, me: int):
    """The error every member raises when the headers of a collective do not agree, or None."""
    mine = heads[me]
    if mine.failure is None and all(h[:4] == mine[:4] and h.failure is None for h in heads.values()):
        return None   # the common case: one comparison per header (group, seq, kind, descriptor)
    for r, h in heads.items():
        if (h.group, h.seq) != (group, seq):
            return DistributedError(f"rank {me}: collective #{seq} of group {list(group)} got rank {r}'s header of "
                                    f"#{h.seq} of group {list(h.group)} (a tag collision)")
    if len({h.key for h in heads.values()}) > 1:
        table = "\n".join(f"  rank {r}: {heads[r].where}" for r in group)
        return CollectiveMismatchError(f"the ranks of group {list(group)} reached different collectives (#{seq}); "
                                       f"each rank was doing:\n{table}")
    failed = [r for r in group if heads[r].failure is not None and r != me]
    if failed:
        return RankAbortedError(f"rank {failed[0]} could not take part in collective #{seq} of group {list(group)} "
                                f"({heads[me].where}): {heads[failed[0]].failure}")
    if heads[me].failure is not None:
        return _Abandoned()
    if len({h.kind for h in heads.values()}) > 1:
        return DistributedError(f"collective #{seq} of group {list(group)}: the ranks called different transport "
                                f"methods {[heads[r].kind for r in group]} with one descriptor")
    return None


# --- the protocols (generators the comm-net thread drives) ---------------------------------------------------------


def _sent_to(head: _Header, rank: int):
    """How many bytes ``head``'s rank sends to ``rank`` in round 1 (its header says), or None."""
    for to, nbytes in head.sizes:
        if to == rank:
            return nbytes
    return None


def round_one(net: CommNet, op: Operation, group: tuple, seq: int, kind: str, desc: CollectiveDesc, meta,
              sends: dict, into, failure: str | None = None, meanwhile=None, where: str | None = None,
              later: bool = False):
    """Headers and the first data together.  Returns ``({rank: _Header}, {peer: its data}, pending)``.

    ``sends``: ``{peer: array}`` sent at once; ``into(headers) -> {peer: array}``:
    where the peers' data goes once the headers agree (it may raise: the same
    on every rank); ``meanwhile()``: local work done, once the headers agree,
    while the data moves (an all-gather copies its own piece into its output
    while the peers take theirs: as fast as doing it while the headers travel
    on 2 processes, 10-30% faster on 4, where two ranks share a core).  Each
    header says how many bytes its rank sends to whom, so the data receives are
    posted as soon as the headers are in, each exactly that size (no probe, and
    no message can be cut short): a peer's data that does not fit where
    ``into`` wanted it (or comes with headers that disagree) lands whole in a
    scratch buffer, and the error is raised after.

    ``later``: a later round follows, so round 1 ends once this rank's receives
    are in; its own sends (``pending``: the peers must have taken them) are
    waited for together with the last round's requests, not before this rank
    may go on.  Otherwise, and whenever it raises, round 1 waits for them too:
    nothing stays in flight.
    """
    MPI = mpi()
    coll, me = net.coll, net.rank
    peers = [r for r in group if r != me]
    mine = _Header(group, seq, kind, desc.key(), desc.describe() if where is None else where, failure, meta,
                   tuple((r, a.nbytes) for r, a in sends.items()))
    net.last_seen = mine.where
    net.started[group] += 1
    head_tag, data_tag = net.tag(group, seq, 0), net.tag(group, seq, 1)
    mine_packed = pack(tuple(mine), HEADER_BYTES)
    bufs = {r: np.empty(HEADER_BYTES, np.uint8) for r in peers}
    op.header_recvs = {r: coll.Irecv([bufs[r], MPI.BYTE], r, head_tag) for r in peers}
    posted = [coll.Isend([mine_packed, MPI.BYTE], r, head_tag) for r in peers]
    posted += [coll.Isend(_raw(a), r, data_tag) for r, a in sends.items()]
    yield list(op.header_recvs.values())
    op.header_recvs = {}
    heads = {r: _Header(*unpack(b)) for r, b in bufs.items()}
    heads[me] = mine
    problem = _disagreement(heads, group, seq, me)
    targets = {}
    if problem is None:
        try:
            targets = into(heads)
        except Exception as error:  # noqa: BLE001 - raised after the data is in, on every rank alike
            problem = error
    got, recvs = {}, []
    for r in peers:
        nbytes = _sent_to(heads[r], me)
        if nbytes is None:
            continue   # r sends nothing here in this round
        target = targets.get(r)
        if target is None or target.nbytes != nbytes:
            if target is not None and problem is None:
                problem = DistributedError(f"{mine.where}: rank {r} sends {nbytes} bytes, {target.nbytes} expected")
            target = np.empty(nbytes, np.uint8)
        got[r] = target
        recvs.append(coll.Irecv(_raw(target), r, data_tag))
    if meanwhile is not None and problem is None:
        try:
            meanwhile()
        except Exception as error:  # noqa: BLE001 - raised once what the peers send here is in
            problem = error
    if later and problem is None:
        yield recvs
        return heads, got, posted
    yield recvs + posted
    if problem is not None:
        raise problem
    return heads, got, []


def data_round(net: CommNet, tag: int, sends: dict, recvs: dict, pending: list = ()):
    """A later round between ranks that agreed: ``sends[r]`` to r, ``recvs[r]`` (sized arrays) filled from r;
    it also waits for ``pending`` (an earlier round's sends)."""
    yield ([net.coll.Irecv(_raw(buf), r, tag) for r, buf in recvs.items()]
           + [net.coll.Isend(_raw(buf), r, tag) for r, buf in sends.items()] + list(pending))


def send_protocol(net: CommNet, array: np.ndarray, dst: int, tag: int):
    head = pack((array.dtype.str, array.shape), P2P_HEADER_BYTES)
    yield [net.p2p.Isend([head, mpi().BYTE], dst, 2 * tag), net.p2p.Isend(_raw(array), dst, 2 * tag + 1)]


def recv_protocol(net: CommNet, op: Operation, src: int, tag: int, pool: HostPool):
    key = (src, tag)
    ticket = net.recv_tickets[key]
    net.recv_tickets[key] += 1
    head = np.empty(P2P_HEADER_BYTES, np.uint8)
    op.header_recvs = {src: net.p2p.Irecv([head, mpi().BYTE], src, 2 * tag)}
    yield list(op.header_recvs.values())
    op.header_recvs = {}
    while net.data_posted[key] != ticket:   # an earlier recv of this pair posts its data receive first
        yield []
    dtype, shape = unpack(head)
    out = pool.empty(shape, dtype)
    net.data_posted[key] += 1
    yield [net.p2p.Irecv(_raw(out), src, 2 * tag + 1)]
    net.received[key] += 1
    return out


# --- the transport ------------------------------------------------------------------------------------------------


class MPITransport(Transport):
    """This process's end of the MPI world: every call becomes an operation of the comm-net thread."""

    spans_processes = True

    def __init__(self, net: CommNet):
        super().__init__()
        self.net, self.rank, self.world_size = net, net.rank, net.world_size
        self.pool = HostPool()   # outputs and receive buffers

    @property
    def timeout(self) -> float:
        """Seconds a call may wait before the watchdog reports (``PYFLOW_COLLECTIVE_TIMEOUT``)."""
        return self.net.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self.net.timeout = seconds

    def _collective(self, kind: str, group, seq: int, desc: CollectiveDesc, meta, sends, into, finish,
                    failure: str | None = None, round_two=None, meanwhile=None):
        """Round 1 (``sends(group)``, ``into``, ``meanwhile``), ``round_two(group, got, pending)`` if any (it
        waits for ``pending``, round 1's sends, with its own requests), then ``finish``."""
        group = tuple(group)
        if self.rank not in group:
            raise DistributedError(f"rank {self.rank} called {kind} for group {list(group)}, which it is not in")
        net, where = self.net, desc.describe()

        def protocol(op):
            try:
                heads, got, pending = yield from round_one(net, op, group, seq, kind, desc, meta, sends(group), into,
                                                           failure, meanwhile, where, round_two is not None)
            except _Abandoned:
                return None
            if round_two is not None:
                yield from round_two(group, got, pending)
            return finish(group, heads, got)

        return net.call(f"collective #{seq} of group {list(group)}: {where}", protocol, key=(group, seq))

    def _peers(self, group) -> list:
        return [r for r in group if r != self.rank]

    # --- exchange, the primitive -----------------------------------------------------------------------------------

    def exchange(self, group, seq, desc, payload) -> list:
        failure, error, blob = None, None, b""
        if isinstance(payload, FailedPiece):
            failure = payload.reason
        else:
            try:
                blob = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # noqa: BLE001 - still take part, so the others fail naming this rank
                error, failure = exc, f"its payload cannot be pickled ({type(exc).__name__}: {exc})"
        mine = np.frombuffer(bytearray(blob), np.uint8)

        def finish(group, heads, got):
            return [pickle.loads(blob if r == self.rank else got[r].tobytes()) for r in group]

        payloads = self._collective("exchange", group, seq, desc, len(blob),
                                    lambda g: {} if failure else {r: mine for r in self._peers(g)},
                                    lambda heads: {}, finish, failure)
        if error is not None:
            raise DistributedError(f"rank {self.rank}: exchange {desc.describe()}: the payload cannot be "
                                   f"pickled") from error
        return payloads

    # --- collectives on the wire ---------------------------------------------------------------------------------

    def all_reduce(self, array, group, seq, desc) -> np.ndarray:
        a = _c(array)
        flat, out = a.reshape(-1), self.pool.empty(a.shape, a.dtype)
        group = tuple(group)
        bounds = _chunks(flat.size, len(group))
        me = group.index(self.rank) if self.rank in group else 0
        lo, hi = bounds[me]
        mine = out.reshape(-1)[lo:hi]   # this rank's chunk of the output: it sums into it
        first = next((r for r in group[:2] if r != self.rank), None)

        def into(heads):   # the first peer of group[0], group[1] sends straight into ``mine`` (added to in place)
            _same_layout(heads, group, "all_reduce")
            return {r: mine if r == first else self.pool.empty((hi - lo,), a.dtype) for r in self._peers(group)}

        def round_two(group, parts, pending):   # the all-gather of the summed chunks, straight into the output
            _sum_into(mine, [flat[lo:hi] if r == self.rank else parts[r] for r in group])
            flat_out = out.reshape(-1)
            yield from data_round(self.net, self.net.tag(group, seq, 2), {r: mine for r in self._peers(group)},
                                  {r: flat_out[slice(*bounds[i])] for i, r in enumerate(group) if r != self.rank},
                                  pending)

        return self._collective("all_reduce", group, seq, desc, (a.dtype.str, a.shape),
                                lambda g: {r: flat[slice(*bounds[i])] for i, r in enumerate(g) if r != self.rank},
                                into, lambda group, heads, parts: out, round_two=round_two)

    def all_gather(self, piece, group, seq, desc, axis: int = 0) -> np.ndarray:
        p = _c(piece)
        placed = {}

        def into(heads):
            group = heads[self.rank].group
            shapes = {r: tuple(heads[r].meta[1]) for r in group}
            if (len({heads[r].meta[0] for r in group}) > 1 or p.ndim == 0 or not 0 <= axis < p.ndim
                    or len({s[:axis] + s[axis + 1:] for s in shapes.values()}) > 1):
                raise DistributedError(f"all_gather along axis {axis}: pieces {shapes} do not fit together")
            if axis != 0:
                return {r: self.pool.empty(shapes[r], p.dtype) for r in self._peers(group)}
            offsets = list(itertools.accumulate([shapes[r][0] for r in group], initial=0))   # straight into rows
            placed["out"] = out = self.pool.empty((offsets[-1],) + p.shape[1:], p.dtype)
            rows = {r: out[offsets[i]:offsets[i + 1]] for i, r in enumerate(group)}
            placed["mine"] = rows[self.rank]
            return {r: rows[r] for r in self._peers(group)}

        def meanwhile():   # this rank's piece into its rows, while the peers take it and their pieces come
            if "mine" in placed:
                placed["mine"][...] = p

        def finish(group, heads, got):
            if axis == 0:
                return placed["out"]
            return np.concatenate([p if r == self.rank else got[r] for r in group], axis=axis)

        return self._collective("all_gather", group, seq, desc, (p.dtype.str, p.shape),
                                lambda g: {r: p for r in self._peers(g)}, into, finish, meanwhile=meanwhile)

    def reduce_scatter(self, array, group, seq, desc, bounds, axis: int = 0) -> np.ndarray:
        a = np.asarray(array)
        group = tuple(group)

        def cut(lo, hi):
            return _c(a[(slice(None),) * axis + (slice(lo, hi),)])

        mine = cut(*bounds[group.index(self.rank)]) if self.rank in group else None

        def into(heads):
            _same_layout(heads, group, "reduce_scatter")
            return {r: self.pool.empty(mine.shape, mine.dtype) for r in self._peers(group)}

        def finish(group, heads, parts):
            return _sum_into(self.pool.empty(mine.shape, mine.dtype), [mine if r == self.rank else parts[r]
                                                                        for r in group])

        return self._collective("reduce_scatter", group, seq, desc, (a.dtype.str, a.shape),
                                lambda g: {r: cut(*bounds[i]) for i, r in enumerate(g) if r != self.rank},
                                into, finish)

    def all_to_all(self, pieces: list, group, seq, desc) -> list:
        ps = [_c(p) for p in pieces]

        def into(heads):
            group = heads[self.rank].group
            if any(len(heads[r].meta) != len(group) for r in group):
                raise DistributedError(f"all_to_all in group {list(group)}: every rank must give one piece per "
                                       f"rank, got {[len(heads[r].meta) for r in group]}")
            me = group.index(self.rank)
            return {r: self.pool.empty(heads[r].meta[me][1], heads[r].meta[me][0]) for r in self._peers(group)}

        def finish(group, heads, got):
            me = group.index(self.rank)
            return [self.pool.copy(ps[me]) if r == self.rank else got[r] for r in group]

        return self._collective("all_to_all", group, seq, desc, tuple((p.dtype.str, p.shape) for p in ps),
                                lambda g: {r: ps[i] for i, r in enumerate(g) if r != self.rank and i < len(ps)},
                                into, finish)

    def broadcast(self, array, root: int, group, seq, desc) -> np.ndarray:
        if root not in tuple(group):
            raise DistributedError(f"broadcast: root {root} is not in group {list(group)}")
        a = _c(array) if self.rank == root else None

        def into(heads):
            dtype, shape = heads[root].meta
            return {} if self.rank == root else {root: self.pool.empty(shape, dtype)}

        def finish(group, heads, got):
            return self.pool.copy(a) if self.rank == root else got[root]

        return self._collective("broadcast", group, seq, desc, (a.dtype.str, a.shape) if a is not None else None,
                                lambda g: {r: a for r in self._peers(g)} if self.rank == root else {}, into, finish)

    def reduce(self, array, root: int, group, seq, desc):
        a = _c(array)

        def into(heads):
            _same_layout(heads, heads[self.rank].group, "reduce")
            return {r: self.pool.empty(a.shape, a.dtype) for r in self._peers(heads[self.rank].group)} \
                if self.rank == root else {}

        def finish(group, heads, parts):
            if self.rank != root:
                return None
            return _sum_into(self.pool.empty(a.shape, a.dtype), [a if r == self.rank else parts[r] for r in group])

        return self._collective("reduce", group, seq, desc, (a.dtype.str, a.shape),
                                lambda g: {} if self.rank == root else {root: a}, into, finish)

    def barrier(self, group, seq, desc) -> None:
        def finish(group, heads, got):
            return None

        return self._collective("barrier", group, seq, desc, None, lambda g: {}, lambda heads: {}, finish)

    # --- point to point -----------------------------------------------------------------------------------------------

    def send(self, array, dst: int, tag: int) -> None:
        a = self.pool.copy(array)   # the copy lets send return at once (MPI's buffered send)
        with self.net.lock:
            self.net.sent[(dst, tag)] += 1
        self.net.post(f"a send to rank {dst} (tag {tag})", send_protocol(self.net, a, dst, tag))

    def recv(self, src: int, tag: int):
        return self.net.call(f"a message from rank {src} (tag {tag})",
                             lambda op: recv_protocol(self.net, op, src, tag, self.pool), key=("recv", src, tag))
