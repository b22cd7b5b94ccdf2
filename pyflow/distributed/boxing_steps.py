"""The pieces a boxing plan is made of (seed 004; OneFlow's eager boxing): layouts, the context, the steps.

``pyflow/distributed/boxing.py`` holds the chain of builders that choose a plan;
this module holds what a plan is written in.  A **Layout** is a placement and
its SBP; a **BoxingContext** is what every step needs (the rank, the logical
shape and dtype, a name for the collectives); a **Step** turns this rank's
piece into its new piece.  The steps: ``ToDevice`` (h2d / d2h), the
collectives ``AllReduce``, ``ReduceScatter``, ``AllGather`` and ``AllToAll``
(on the ccl stream), ``LocalSlice`` and ``LocalPartial`` (no transfer), and
``Exchange``, the generic route every pair of layouts can take.  The one step
that recurses into the chain, ``OnEachGroup`` (N-D dim reduce), stays in
``boxing.py`` beside ``choose`` and ``run_boxing_steps``.

>>> from pyflow import env
>>> from pyflow.framework.placement import placement
>>> from pyflow.framework.sbp import sbp
>>> with env.bound(env.RankContext(rank=0, world_size=2)):
...     s0 = Layout(placement("cpu", [0, 1]), (sbp.split(0),))
...     print(s0.short(), s0.piece_shape(1, (5, 2)))
...     b = Layout(placement("cpu", [0, 1]), (sbp.broadcast,))
...     print([(s, d, r[0]) for s, d, r in Exchange(s0, b).routes((5, 2))])
(S(0)) on cpu [0, 1] (2, 2)
[(0, 0, slice(0, 3, None)), (0, 1, slice(0, 3, None)), (1, 0, slice(3, 5, None)), (1, 1, slice(3, 5, None))]
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pyflow import env
from pyflow.distributed.ccl import collective, describe_call
from pyflow.framework.placement import placement as Placement
from pyflow.framework.sbp import SbpParallel, balanced_split, piece_slices

__all__ = ["Layout", "BoxingContext", "Step", "ToDevice", "AllReduce", "ReduceScatter", "AllGather", "AllToAll",
           "LocalSlice", "LocalPartial", "Exchange"]


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
