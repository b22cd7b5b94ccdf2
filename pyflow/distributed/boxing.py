"""Eager boxing (seed 004; OneFlow's eager boxing interpreter): one (placement, SBP) to another.

A global tensor's **layout** is its placement and its SBP.  Boxing changes the
layout and keeps the logical value.  As in OneFlow, a *chain* of builders is
asked in order "can you box src -> dst?"; the first that can returns a
**plan**, a list of steps, and every rank runs the plan on its piece (the
steps issue VM instructions: collectives on the ccl stream, slicing and copies
on the compute streams).  The chain, first match wins:

==================  ===========================  ===========================================
builder             when (same placement, 1-D    steps
                    unless said otherwise)
==================  ===========================  ===========================================
identity            nothing changes              none
device copy         only the device type         h2d / d2h copy of each piece
all-reduce          P -> B                       AllReduce
reduce-scatter      P -> S(k)                    ReduceScatter
all-gather          S(k) -> B                    AllGather
all-to-all          S(i) -> S(j)                 AllToAll
local slice         B -> S(k)                    each rank slices its own part, no transfer
local partial       B -> P, S(k) -> P            OneFlow's layout: B keeps the value on
                                                 parallel_id 0, S keeps each slice in
                                                 place; zeros elsewhere; no transfer
copy around         same ranks, another device   box on the source device, then copy
                    type and another SBP
nd dim reduce       2-D, one axis unchanged      the 1-D chain on each row (or column)
generic exchange    anything else                every rank sends each receiver the part
                                                 of its piece that the receiver's piece
                                                 covers; receivers add up what arrives
==================  ===========================  ===========================================

The generic exchange is correct for every pair (different placements, N-D,
uneven sizes, zero-size tensors); the others are cheaper special cases and the
shape of OneFlow's chain.  Where a P result's layout is OneFlow's choice it is
followed: B -> P and 1 -> P keep the value on the placement's first rank; S -> P
across placements sends input parallel_id i's slice to the same rank if it is
in the output placement, else to output parallel_id i % m; P -> P across
placements routes each piece the same way.

>>> from pyflow import env
>>> from pyflow.framework.placement import placement
>>> from pyflow.framework.sbp import sbp
>>> with env.bound(env.RankContext(rank=0, world_size=4)):
...     on4, on2 = placement("cuda", [0, 1, 2, 3]), placement("cuda", [2, 3])
...     print(choose(Layout(on4, (sbp.split(0),)), Layout(on4, (sbp.broadcast,)), (8, 2)).name)
...     print(choose(Layout(on4, (sbp.split(0),)), Layout(on2, (sbp.split(1),)), (8, 2)).name)
all-gather
generic exchange
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pyflow import env
from pyflow.distributed.ccl import collective, describe_call
from pyflow.framework.placement import placement as Placement
from pyflow.framework.sbp import SbpParallel, balanced_split, piece_slices

__all__ = ["Layout", "BoxingContext", "Builder", "CHAIN", "choose", "run_plan"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a global tensor's pieces live: a placement and one SBP per hierarchy axis."""

    placement: Placement
    sbp: tuple

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
    """What every step needs: who runs it, the logical tensor, and what to call the collectives."""

    rank: int
    shape: tuple
    dtype: np.dtype
    what: str           # e.g. "to_global (S(0)) on cuda [0, 1] -> (B) on cuda [0, 1]"

    @property
    def transport(self):
        return env.current().transport

    def desc(self, step: str, group) -> object:
        return describe_call(self.what, self.shape, self.dtype, f"{step} in group {list(group)}")


# --- steps ---------------------------------------------------------------------------------


def _bounds(total: int, parts: int) -> list:
    return balanced_split(total, parts)


def _relative(region: tuple, within: tuple) -> tuple:
    """``region`` (logical slices) as slices of the piece that covers ``within``."""
    return tuple(slice(r.start - w.start, r.stop - w.start) for r, w in zip(region, within))


def _overlap(a: tuple, b: tuple):
    out = tuple(slice(max(x.start, y.start), min(x.stop, y.stop)) for x, y in zip(a, b))
    return out if all(s.stop > s.start for s in out) or not out else None


def _on_device(piece, layout: Layout, rank: int):
    device = layout.placement.device(rank)
    return piece if piece.device is device else piece.to(device)


@dataclasses.dataclass
class Step:
    """One step of a plan: ``run(piece, ctx)`` -> this rank's new piece (None off the layout)."""

    def run(self, piece, ctx: BoxingContext):  # pragma: no cover - every step overrides it
        raise NotImplementedError


@dataclasses.dataclass
class ToDevice(Step):
    """Copy each piece to the destination placement's device (h2d or d2h)."""

    dst: Layout

    def run(self, piece, ctx):
        return None if piece is None else _on_device(piece, self.dst, ctx.rank)


@dataclasses.dataclass
class _Collective(Step):
    """A step that is one transport collective over ``group`` (then back to the layout's device)."""

    layout: Layout

    @property
    def group(self) -> tuple:
        return self.layout.ranks

    def run(self, piece, ctx):
        if ctx.rank not in self.group:
            return None
        transport, group = ctx.transport, self.group
        seq = transport.next_seq(group)
        desc = ctx.desc(type(self).__name__, group)
        shape = self.out_shape(ctx)
        call = self.call(transport, group, seq, desc, ctx)
        return _on_device(collective(call, [piece], shape, ctx.dtype, desc, group, seq), self.layout, ctx.rank)


@dataclasses.dataclass
class AllReduce(_Collective):
    def out_shape(self, ctx):
        return ctx.shape

    def call(self, transport, group, seq, desc, ctx):
        return lambda a: transport.all_reduce(a, group, seq, desc)


@dataclasses.dataclass
class ReduceScatter(_Collective):
    axis: int = 0

    def out_shape(self, ctx):
        return self.layout.piece_shape(ctx.rank, ctx.shape)

    def call(self, transport, group, seq, desc, ctx):
        bounds = _bounds(ctx.shape[self.axis], len(group))
        return lambda a: transport.reduce_scatter(a, group, seq, desc, bounds, axis=self.axis)


@dataclasses.dataclass
class AllGather(_Collective):
    axis: int = 0

    def out_shape(self, ctx):
        return ctx.shape

    def call(self, transport, group, seq, desc, ctx):
        return lambda a: transport.all_gather(a, group, seq, desc, axis=self.axis)


@dataclasses.dataclass
class AllToAll(_Collective):
    """S(src_axis) -> S(dst_axis): cut the piece along dst_axis, swap, glue along src_axis."""

    src_axis: int = 0
    dst_axis: int = 1

    def out_shape(self, ctx):
        return self.layout.piece_shape(ctx.rank, ctx.shape)

    def call(self, transport, group, seq, desc, ctx):
        bounds = _bounds(ctx.shape[self.dst_axis], len(group))
        cut = (slice(None),) * self.dst_axis

        def swap(a):
            pieces = [np.ascontiguousarray(a[cut + (slice(lo, hi),)]) for lo, hi in bounds]
            return np.concatenate(transport.all_to_all(pieces, group, seq, desc), axis=self.src_axis)
        return swap


@dataclasses.dataclass
class LocalSlice(Step):
    """B -> S: every rank keeps its own part of the whole tensor it holds."""

    dst: Layout

    def run(self, piece, ctx):
        if piece is None:
            return None
        return piece[self.dst.region(ctx.rank, ctx.shape)].contiguous()


@dataclasses.dataclass
class LocalPartial(Step):
    """B -> P (parallel_id 0 keeps the value) or S -> P (each keeps its slice in place); zeros elsewhere."""

    src: Layout

    def run(self, piece, ctx):
        from pyflow.framework.creation import zeros

        if piece is None:
            return None
        if self.src.sbp[0].is_broadcast:
            return piece if self.src.placement.parallel_id(ctx.rank) == 0 else zeros(ctx.shape, dtype=ctx.dtype,
                                                                                   device=piece.device)
        whole = zeros(ctx.shape, dtype=ctx.dtype, device=piece.device)
        whole[self.src.region(ctx.rank, ctx.shape)] = piece
        return whole


@dataclasses.dataclass
class OnEachGroup(Step):
    """N-D dim reduce: run a 1-D sub-plan inside each row (or column) of a 2-D hierarchy."""

    src: Layout
    dst: Layout
    axis: int           # the hierarchy axis that changes; the other one keeps its SBP

    def run(self, piece, ctx):
        if ctx.rank not in self.src.ranks:
            return None
        place = self.src.placement
        coords = place.coordinates(place.parallel_id(ctx.rank))
        keep = 1 - self.axis
        group = [r for r in place.flat_ranks if place.coordinates(place.parallel_id(r))[keep] == coords[keep]]
        sub = Placement(place.type, group)
        # the sub-tensor every rank of the group holds a piece of: the kept axis's part of the whole
        kept = piece_slices(ctx.shape, (self.src.sbp[keep],), (place.hierarchy[keep],), (coords[keep],))
        sub_shape = tuple(s.stop - s.start for s in kept)
        sub_src, sub_dst = Layout(sub, (self.src.sbp[self.axis],)), Layout(sub, (self.dst.sbp[self.axis],))
        sub_ctx = BoxingContext(ctx.rank, sub_shape, ctx.dtype, ctx.what)
        return run_plan(choose(sub_src, sub_dst, sub_shape).plan(sub_src, sub_dst, sub_shape), piece, sub_ctx)


@dataclasses.dataclass
class Exchange(Step):
    """The generic route: each sender sends every receiver the part of its piece the receiver covers."""

    src: Layout
    dst: Layout

    def routes(self, shape) -> list:
        """``(sender, receiver, logical region)`` triples, the same on every rank."""
        src, dst = self.src, self.dst
        senders = [r for r in src.ranks if all(  # one sender per B group: coordinate 0 on every B axis
            c == 0 for c, s in zip(src.placement.coordinates(src.placement.parallel_id(r)), src.sbp)
            if s.is_broadcast)]
        as_b = Layout(dst.placement, tuple(SbpParallel("broadcast") if s.is_partial else s for s in dst.sbp))
        partial_axes = [a for a, s in enumerate(dst.sbp) if s.is_partial]
        if dst.one_d and partial_axes:  # OneFlow's choice of which rank keeps what
            if all(s.is_broadcast for s in src.sbp) or len(src.ranks) == 1:
                return [(senders[0], dst.ranks[0], src.region(senders[0], shape))]
            m = len(dst.ranks)
            return [(s, s if dst.placement.has(s) else dst.ranks[src.placement.parallel_id(s) % m],
                     src.region(s, shape)) for s in senders]
        receivers = [r for r in dst.ranks if all(  # a P axis: only coordinate 0 holds the value
            dst.placement.coordinates(dst.placement.parallel_id(r))[a] == 0 for a in partial_axes)]
        routes = []
        for s in senders:
            for d in receivers:
                common = _overlap(src.region(s, shape), as_b.region(d, shape))
                if common is not None:
                    routes.append((s, d, common))
        return routes

    def run(self, piece, ctx):
        src, dst, rank = self.src, self.dst, ctx.rank
        union = tuple(sorted(set(src.ranks) | set(dst.ranks)))
        if rank not in union:
            return None
        transport, shape, dtype = ctx.transport, ctx.shape, ctx.dtype
        seq, desc = transport.next_seq(union), ctx.desc("Exchange", union)
        routes = self.routes(shape)
        mine = src.region(rank, shape) if src.placement.has(rank) else None
        as_b = Layout(dst.placement, tuple(SbpParallel("broadcast") if s.is_partial else s for s in dst.sbp))
        target = as_b.region(rank, shape) if dst.placement.has(rank) else None
        out_shape = tuple(s.stop - s.start for s in target) if target is not None else (0,)
        sends = [(d, region) for s, d, region in routes if s == rank]

        def call(*arrays):
            payload = {}
            for d, region in sends:
                part = np.array(arrays[0][_relative(region, mine)], copy=True)   # 0-d stays 0-d (not ascontiguousarray)
                payload.setdefault(d, []).append((region, part))
            everyone = transport.exchange(union, seq, desc, payload)
            out = np.zeros(out_shape, dtype)
            if target is not None:
                for received in everyone:
                    for region, block in received.get(rank, ()):
                        out[_relative(region, target)] += block
            return out

        inputs = [piece] if (piece is not None and mine is not None and sends) else []
        result = collective(call, inputs, out_shape, dtype, desc, union, seq)
        return _on_device(result, dst, rank) if target is not None else None


# --- builders --------------------------------------------------------------------------------


class Builder:
    """One link of the chain: ``can(src, dst, shape)``? then ``plan(src, dst, shape)``."""

    name = "builder"

    def can(self, src: Layout, dst: Layout, shape: tuple) -> bool:
        raise NotImplementedError

    def plan(self, src: Layout, dst: Layout, shape: tuple) -> list:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<boxing builder {self.name!r}>"


def _same_1d(src: Layout, dst: Layout) -> bool:
    return src.placement == dst.placement and src.one_d


class Identity(Builder):
    name = "identity"

    def can(self, src, dst, shape):
        return src == dst

    def plan(self, src, dst, shape):
        return []


class DeviceCopy(Builder):
    name = "device copy"

    def can(self, src, dst, shape):
        return (src.ranks == dst.ranks and src.placement.hierarchy == dst.placement.hierarchy
                and src.sbp == dst.sbp and src.placement.type != dst.placement.type)

    def plan(self, src, dst, shape):
        return [ToDevice(dst)]


class _OneD(Builder):
    """Same placement, 1-D, one SBP kind to another."""

    kinds = ("", "")

    def can(self, src, dst, shape):
        return _same_1d(src, dst) and (src.sbp[0].kind, dst.sbp[0].kind) == self.kinds


class AllReduceBuilder(_OneD):
    name, kinds = "all-reduce", ("partial_sum", "broadcast")

    def plan(self, src, dst, shape):
        return [AllReduce(dst)]


class ReduceScatterBuilder(_OneD):
    name, kinds = "reduce-scatter", ("partial_sum", "split")

    def plan(self, src, dst, shape):
        return [ReduceScatter(dst, dst.sbp[0].dim)]


class AllGatherBuilder(_OneD):
    name, kinds = "all-gather", ("split", "broadcast")

    def plan(self, src, dst, shape):
        return [AllGather(dst, src.sbp[0].dim)]


class AllToAllBuilder(_OneD):
    name, kinds = "all-to-all", ("split", "split")

    def can(self, src, dst, shape):
        return super().can(src, dst, shape) and src.sbp[0].dim != dst.sbp[0].dim

    def plan(self, src, dst, shape):
        return [AllToAll(dst, src.sbp[0].dim, dst.sbp[0].dim)]


class LocalSliceBuilder(_OneD):
    name, kinds = "local slice", ("broadcast", "split")

    def plan(self, src, dst, shape):
        return [LocalSlice(dst)]


class LocalPartialBuilder(Builder):
    name = "local partial"

    def can(self, src, dst, shape):
        return _same_1d(src, dst) and dst.sbp[0].is_partial and not src.sbp[0].is_partial

    def plan(self, src, dst, shape):
        return [LocalPartial(src)]


class CopyAround(Builder):
    """Same ranks and hierarchy, another device type and another SBP: box where it is, then copy."""

    name = "copy around"

    def can(self, src, dst, shape):
        return (src.ranks == dst.ranks and src.placement.hierarchy == dst.placement.hierarchy
                and src.placement.type != dst.placement.type)

    def plan(self, src, dst, shape):
        middle = Layout(src.placement, dst.sbp)
        return choose(src, middle, shape).plan(src, middle, shape) + [ToDevice(dst)]


class NdDimReduce(Builder):
    """A 2-D hierarchy where one axis keeps its SBP: the 1-D chain inside each group of the other axis."""

    name = "nd dim reduce"

    def can(self, src, dst, shape):
        if src.placement != dst.placement or len(src.placement.hierarchy) != 2:
            return False
        changed = [a for a in (0, 1) if src.sbp[a] != dst.sbp[a]]
        if len(changed) != 1:
            return False
        if changed == [1]:
            return True  # the outer axis keeps its part; the inner axis splits inside it
        inner = src.sbp[1]  # the outer axis changes under a kept inner axis: only if they split different dims
        return not inner.is_split or all(not (s.is_split and s.dim == inner.dim) for s in (src.sbp[0], dst.sbp[0]))

    def plan(self, src, dst, shape):
        axis = 0 if src.sbp[0] != dst.sbp[0] else 1
        return [OnEachGroup(src, dst, axis)]


class Generic(Builder):
    name = "generic exchange"

    def can(self, src, dst, shape):
        return True

    def plan(self, src, dst, shape):
        return [Exchange(src, dst)]


CHAIN = (Identity(), DeviceCopy(), AllReduceBuilder(), ReduceScatterBuilder(), AllGatherBuilder(), AllToAllBuilder(),
         LocalSliceBuilder(), LocalPartialBuilder(), CopyAround(), NdDimReduce(), Generic())


def choose(src: Layout, dst: Layout, shape: tuple) -> Builder:
    """The first builder of the chain that can box ``src`` -> ``dst``."""
    return next(b for b in CHAIN if b.can(src, dst, shape))


def run_plan(steps: list, piece, ctx: BoxingContext):
    """Run ``steps`` on this rank's ``piece``; its piece of the result (None off the destination)."""
    for step in steps:
        piece = step.run(piece, ctx)
    return piece
