"""What a boxing plan is written against, and its node kinds run on one rank (seed 004; OneFlow's boxing).

A **Layout** is a placement and its SBP; a **BoxingContext** is what a rank
needs to run a plan (the rank, the logical shape and dtype, a name for the
collectives).  The plan itself is a graph of boxing nodes made by the one
boxing chain (``pyflow/distributed/boxing_chain/``); nn.Graph makes each node
a task, eager boxing runs the nodes of its rank, each with ``run_node``:

==========  =====================================================================
slice       the part ``region`` (per dim ``(start, stop)``) of the input piece
concat      the inputs concatenated along ``axis``
add         the elementwise sum of the inputs, in input order
assemble    zeros, then input k added into ``regions[k]`` (P parts sum where they meet)
zeros       zeros (a P piece that holds nothing)
copy        the input on the node's device (h2d / d2h)
comm_net    the sender's piece on the receiver's host (``exchange_round``: the
            comm_nets that do not wait for one another go as one exchange on the
            ccl stream)
collective  one transport collective (``op``: all_reduce, reduce_scatter, all_gather,
            all_to_all, reduce, broadcast) on the ccl stream
==========  =====================================================================

``write_piece`` (the on-rank kinds, writing a given output) and
``collective_call`` (what each collective op computes from the transport) are
shared with nn.Graph's boxing tasks (``pyflow/compiler/boxing_tasks.py``), so a
node kind is written once for both paths.

>>> from pyflow import env
>>> from pyflow.framework.placement import placement
>>> from pyflow.framework.sbp import sbp
>>> with env.bound(env.RankContext(rank=0, world_size=2)):
...     s0 = Layout(placement("cpu", [0, 1]), (sbp.split(0),))
...     print(s0.short(), s0.piece_shape(1, (5, 2)))
(S(0)) on cpu [0, 1] (2, 2)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pyflow import env
from pyflow.device import Device
from pyflow.distributed.ccl import collective, describe_call
from pyflow.framework.creation import empty
from pyflow.framework.interpreter import apply
from pyflow.framework.placement import placement as Placement
from pyflow.framework.sbp import piece_slices

__all__ = ["Layout", "BoxingContext", "run_node", "exchange_round", "write_piece", "collective_call", "LOCAL_KINDS"]

LOCAL_KINDS = ("slice", "concat", "add", "assemble", "zeros", "copy")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a global tensor's pieces live: a placement and one SBP per hierarchy axis."""

    placement: Placement
    sbp: tuple
    _hash: int = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        """Worked out once (a boxing plan and a boxed input are looked up by layouts every step)."""
        if self._hash is None:
            object.__setattr__(self, "_hash", hash((self.placement, self.sbp)))
        return self._hash

    def __reduce__(self):
        """Pickled as its fields: another process works out its own hash (a placement's differs there)."""
        return Layout, (self.placement, self.sbp)

    @property
    def ranks(self) -> tuple:
        return self.placement.flat_ranks

    @property
    def one_d(self) -> bool:
        return len(self.placement.hierarchy) == 1

    def region(self, rank: int, shape: tuple) -> tuple:
        """The slice of the logical tensor that ``rank``'s piece covers (the whole of it for B and P)."""
        coords = self.placement.coordinates(self.placement.parallel_id(rank))
        return piece_slices(shape, self.sbp, self.placement.hierarchy, coords)

    def piece_shape(self, rank: int, shape: tuple) -> tuple:
        return tuple(s.stop - s.start for s in self.region(rank, shape))

    def short(self) -> str:
        return f"({', '.join(s.short() for s in self.sbp)}) on {self.placement.type} {list(self.ranks)}"


@dataclasses.dataclass
class BoxingContext:
    """What a rank needs to run a plan's nodes: who it is, the logical tensor, and what to call the collectives."""

    rank: int
    shape: tuple
    dtype: np.dtype
    what: str           # e.g. "to_global (S(0)) on cuda [0, 1] -> (B) on cuda [0, 1]"

    @property
    def transport(self):
        return env.current().transport

    def desc(self, step: str, group) -> object:
        return describe_call(self.what, self.shape, self.dtype, f"{step} in group {list(group)}")


# --- the node kinds on a rank ------------------------------------------------------------------


def _region(x, region):
    for d, (start, stop) in enumerate(region):
        x = x.narrow(d, start, stop - start)
    return x


def write_piece(kind: str, args: list, out, attrs: dict):
    """Write ``out`` (the node's piece, allocated by the caller) from ``args``: a kind of ``LOCAL_KINDS``."""
    if kind == "slice":
        apply("contiguous", [_region(args[0], attrs["region"])], out=[out])
    elif kind == "concat":
        apply("cat", list(args), out=[out], axis=attrs["axis"])
    elif kind == "add":
        apply("contiguous", [args[0]], out=[out])
        for x in args[1:]:
            apply("add", [out, x], out=[out])
    elif kind == "assemble":
        out.zero_()
        for x, region in zip(args, attrs["regions"]):
            part = _region(out, region)
            apply("add", [part, x], out=[part])
    elif kind == "zeros":
        out.zero_()
    elif kind == "copy":
        out.copy_(args[0])
    else:
        raise ValueError(f"unknown boxing node kind {kind!r}")
    return out


def collective_call(op: str, attrs: dict, transport, group: tuple, seq: int, desc, dtype):
    """``call(*input arrays) -> output array`` of a ``collective`` node's ``op`` (an empty array where the
    member gets nothing: a reduce's non-root)."""
    if op == "all_reduce":
        return lambda a: transport.all_reduce(a, group, seq, desc)
    if op == "reduce_scatter":
        return lambda a: transport.reduce_scatter(a, group, seq, desc, attrs["bounds"], axis=attrs["axis"])
    if op == "all_gather":
        return lambda a: transport.all_gather(a, group, seq, desc, axis=attrs["axis"])
    if op == "all_to_all":
        cut = (slice(None),) * attrs["split_axis"]

        def swap(a):
            parts = [np.ascontiguousarray(a[cut + (slice(lo, hi),)]) for lo, hi in attrs["bounds"]]
            return np.concatenate(transport.all_to_all(parts, group, seq, desc), axis=attrs["concat_axis"])
        return swap
    if op == "reduce":
        def reduce(a):
            total = transport.reduce(a, attrs["root"], group, seq, desc)
            return np.zeros(0, dtype=np.dtype(dtype)) if total is None else total
        return reduce
    if op == "broadcast":
        return lambda *a: transport.broadcast(a[0] if a else None, attrs["root"], group, seq, desc)
    raise ValueError(f"unknown collective {op!r}")


def _on(piece, device: str):
    device = Device(device)
    return piece if piece.device is device else piece.to(device)


def run_node(node, args: list, ctx: BoxingContext):
    """Run a plan node of this rank (any kind but ``comm_net``): its piece, or None (a reduce's non-root).

    Every rank calls this in plan order, so the sequence numbers of the collectives agree across ranks.
    """
    transport, kind, attrs = ctx.transport, node.kind, node.attrs
    if kind == "slice" and args[0].device is Device(node.device):   # one instruction: no empty output first
        return apply("contiguous", [_region(args[0], attrs["region"])])[0]
    if kind in LOCAL_KINDS:
        out = empty(*node.shape, dtype=ctx.dtype, device=Device(node.device))
        return write_piece(kind, args, out, attrs)
    if kind == "collective":
        group = tuple(attrs["group"])
        seq = transport.next_seq(group)
        desc = ctx.desc(attrs["op"], group)
        call = collective_call(attrs["op"], attrs, transport, group, seq, desc, ctx.dtype)
        shape = (0,) if node.shape is None else node.shape
        result = collective(call, args, shape, ctx.dtype, desc, group, seq)
        return None if node.shape is None else _on(result, node.device)
    raise ValueError(f"unknown boxing node kind {kind!r}")


def exchange_round(moves: list, sends: dict, ctx: BoxingContext) -> dict:
    """Run ``comm_net`` nodes as one exchange of the ranks they join: this rank's received pieces.

    ``moves`` is ``[(index, node), ...]`` (the same on every rank), ``sends`` this rank's piece for
    each node it sends.  One collective instruction on the ccl stream carries every piece (OneFlow
    runs each comm_net as its own actor; one round per batch of independent moves costs one
    rendezvous instead of one per move); what arrives comes back as one flat host tensor, cut into
    the received pieces.
    """
    rank, transport = ctx.rank, ctx.transport
    group = tuple(sorted({n.attrs["src_rank"] for _, n in moves} | {n.rank for _, n in moves}))
    if rank not in group:
        return {}
    seq = transport.next_seq(group)
    desc = ctx.desc(f"comm_net n{moves[0][0]}..n{moves[-1][0]}", group)
    mine = [index for index, _ in moves if index in sends]
    wanted = [(index, node) for index, node in moves if node.rank == rank]
    sizes = [int(np.prod(node.shape, dtype=np.int64)) for _, node in wanted]

    def call(*arrays):
        payload = {index: np.array(a, copy=True) for index, a in zip(mine, arrays)}   # 0-d stays 0-d
        everyone = transport.exchange(group, seq, desc, payload)
        got = [everyone[group.index(node.attrs["src_rank"])][index].reshape(-1) for index, node in wanted]
        return np.concatenate(got) if got else np.zeros(0, dtype=np.dtype(ctx.dtype))

    flat = collective(call, [sends[index] for index in mine], (sum(sizes),), ctx.dtype, desc, group, seq)
    received, offset = {}, 0
    for (index, node), size in zip(wanted, sizes):
        received[index] = flat.narrow(0, offset, size).reshape(node.shape)
        offset += size
    return received
