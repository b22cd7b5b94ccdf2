"""``MPITransport``: the transport of ranks that are MPI processes (seed 003's CommNet, seed 004's collectives).

Every call becomes an operation of this process's comm-net thread
(``mpi_commnet.py``): the call's protocol, a generator that posts non-blocking
MPI requests and yields them until they completed.  The protocols are in
``mpi_protocols.py``, with the rounds of each collective (round 1 carries the
headers, the cross-rank descriptor check, with the first data; later rounds
are data only) and the fixed cost of a call.  This module says, for each
collective, what a rank sends to whom in each round, where what it receives
goes, and what it returns.  Outputs and receive buffers come from a caching
pool of host arrays (``host_pool.py``), so a large buffer is not page-faulted
anew on every call.
"""

from __future__ import annotations

import itertools
import pickle

import numpy as np

from pyflow.distributed.host_pool import HostPool
from pyflow.distributed.mpi_commnet import CommNet
from pyflow.distributed.mpi_protocols import (_Abandoned, _c, _same_layout, _sum_into, data_round, recv_protocol,
                                              round_one, send_protocol)
from pyflow.distributed.transport import CollectiveDesc, FailedPiece, Transport
from pyflow.errors import DistributedError
from pyflow.framework.sbp import balanced_split

__all__ = ["MPITransport"]


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
        net, where = self.net, desc.described()

        def protocol(op):
            try:
                heads, got, pending = yield from round_one(net, op, group, seq, kind, desc, meta, sends(group), into,
                                                           failure, meanwhile, where, round_two is not None)
            except _Abandoned:
                return None
            if round_two is not None:
                yield from round_two(group, got, pending)
            return finish(group, heads, got)

        return net.call(lambda: f"collective #{seq} of group {list(group)}: {where}", protocol, key=(group, seq))

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
        bounds = balanced_split(flat.size, len(group))
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
