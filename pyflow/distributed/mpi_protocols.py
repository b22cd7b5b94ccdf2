"""The MPI transport's wire protocols: rounds of messages (seed 003's CommNet, seed 004's collectives).

A *protocol* is a generator that this process's comm-net thread
(``mpi_commnet.py``) drives: it posts non-blocking MPI requests, yields the
list of them, is resumed once they all completed, and returns its result.
``MPITransport`` (``mpi_transport.py``) hands the thread one protocol per call:
a collective's round 1 (``round_one``) carries the headers, the cross-rank
check of the ``CollectiveDesc``, together with the first data; later rounds
(``data_round``) are data only.  ``send_protocol`` / ``recv_protocol`` move
one array point to point.

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

**The fixed cost of a call** is Python, not the wire.  Measured for a 1 MB
all-gather on 2 processes (2-core machine): these same messages, sent from
plain Python on one thread, take as long as mpi4py's ``Allgather`` (about
0.16 ms against 0.17-0.18); handing them to a second thread and back adds
about 0.01 ms.  In ``benchmarks/bench_collectives.py``'s table, mpi4py takes
0.19 ms, pyflow 0.27-0.28 ms, and ``benchmarks/collective_floor.py`` (the
leanest transport of this design: a comm thread, a header round compared as
bytes, nothing else on the path) 0.22-0.23 ms.  So of pyflow's 0.08-0.09 ms
about 0.035 is the design's own and 0.05 this module's and the transport's
failure semantics and generality (building and checking the headers,
placing the output, the call around it).  It is kept small where that is
cheap: a descriptor's text is made once per distinct descriptor
(``CollectiveDesc.described``), an operation's text only when an error or
the watchdog needs it; a header is a tuple of builtins (pickled in under
1 us, a dataclass took 4); the data receives need no probe; the all-reduce's
round 1 ends once this rank's chunks are in (its own sends are waited for
with round 2's requests), and it adds the first two chunks in one pass
straight into its output; the all-gather copies its own piece into its
output while the peers take theirs.
"""

from __future__ import annotations

import typing

import numpy as np

from pyflow.distributed.host_pool import HostPool
from pyflow.distributed.mpi_commnet import CommNet, Operation, mpi, pack, unpack
from pyflow.distributed.transport import CollectiveDesc
from pyflow.errors import CollectiveMismatchError, DistributedError, RankAbortedError

__all__ = ["HEADER_BYTES", "P2P_HEADER_BYTES", "round_one", "data_round", "send_protocol", "recv_protocol"]

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


def _c(a) -> np.ndarray:
    """``a`` as a C-contiguous array (no copy if it is one; 0-d stays 0-d, unlike ``np.ascontiguousarray``)."""
    return np.asarray(a, order="C")


def _raw(a: np.ndarray):
    """``a``'s memory as an MPI byte buffer (no copy: ``a`` is C-contiguous)."""
    if a.dtype.hasobject:
        raise DistributedError(f"the transport moves numeric arrays, not dtype {a.dtype}")
    return [a, mpi().BYTE]


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
    mine = _Header(group, seq, kind, desc.key(), desc.described() if where is None else where, failure, meta,
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

