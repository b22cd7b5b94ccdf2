"""Naive builders, the end of the chain (seed 004; OneFlow's ``naive_b2b_...``, ``naive_b2p_...``).

* **naive_b2b**: whole value -> whole value (producer: one piece or all B;
  consumer: all B): each consumer piece is the nearest producer piece, moved.
* **naive_b2p**: whole value -> P (1-D, more than one consumer): consumer
  parallel_id 0 gets the nearest producer piece, every other one a ``zeros``
  node.  (OneFlow's lazy builder keeps the value on the consumer nearest to a
  producer; pyflow follows its *eager* layout, SEMANTICS §4a, so that lazy and
  eager pieces agree: the first consumer rank keeps the value.)
* **naive**: every pair, N-D hierarchies, uneven and zero-size tensors
  included.  ``routes`` says which sender sends which receiver what:
  ``(sender, receiver, logical region)``.  Each route becomes a ``slice`` on
  the sender and a move; each consumer piece is then its one route, an ``add``
  of whole pieces, an ``assemble`` of regions (overlapping P parts add up), or
  ``zeros`` if nothing is routed to it (a P consumer off the value's ranks).
"""

from __future__ import annotations

from pyflow.distributed.boxing_chain.graph import (SubTskGphBuilder, device_of, intersect, parallel_num, region_of,
                                                   relative, shape_of_region)
from pyflow.distributed.boxing_chain.one_to_one import all_broadcast
from pyflow.distributed.boxing_steps import Layout
from pyflow.framework.sbp import SbpParallel

__all__ = ["NaiveB2B", "NaiveB2P", "Naive", "routes"]


def _as_broadcast(layout):
    """``layout`` with its P axes read as B: the region a P piece's value covers."""
    return Layout(layout.placement, tuple(SbpParallel("broadcast") if s.is_partial else s for s in layout.sbp))


def routes(src, dst, shape: tuple) -> list:
    """``(sender, receiver, logical region)`` triples: what each sender rank sends each receiver rank.

    One sender per B group (coordinate 0 on every B axis).  A 1-D P consumer gets OneFlow's eager
    layout (SEMANTICS §4a): a whole value (all B, or one piece) goes to the consumer's first rank;
    sender piece ``i`` stays on its rank if that rank is a consumer, else goes to consumer ``i % m``.
    Otherwise each receiver gets the overlap of its region with every sender's (on a P axis only
    coordinate 0 receives).
    """
    sp, dp = src.placement, dst.placement
    senders = [i for i in range(sp.parallel_num)
               if all(c == 0 for c, s in zip(sp.coordinates(i), src.sbp) if s.is_broadcast)]
    partial_axes = [a for a, s in enumerate(dst.sbp) if s.is_partial]
    if len(dp.hierarchy) == 1 and partial_axes:
        if all(s.is_broadcast for s in src.sbp) or sp.parallel_num == 1:
            return [(sp.flat_ranks[senders[0]], dp.flat_ranks[0], region_of(src, senders[0], shape))]
        m = dp.parallel_num
        return [(sp.flat_ranks[i], sp.flat_ranks[i] if dp.has(sp.flat_ranks[i]) else dp.flat_ranks[i % m],
                 region_of(src, i, shape)) for i in senders]
    as_b = _as_broadcast(dst)
    receivers = [j for j in range(dp.parallel_num) if all(dp.coordinates(j)[a] == 0 for a in partial_axes)]
    found = []
    for i in senders:
        for j in receivers:
            common = intersect(region_of(src, i, shape), region_of(as_b, j, shape))
            if all(stop > start for start, stop in common):
                found.append((sp.flat_ranks[i], dp.flat_ranks[j], common))
    return found


class NaiveB2B(SubTskGphBuilder):
    name = "naive_b2b"

    def build(self, ctx, in_refs, src, dst, shape):
        if not (parallel_num(src) == 1 or all_broadcast(src)) or not (parallel_num(dst) == 1 or all_broadcast(dst)):
            return None
        outs = []
        for rank in dst.placement.flat_ranks:
            device = device_of(dst, rank)
            outs.append(ctx.proxy(in_refs[ctx.nearest_src(in_refs, rank, device)], rank, device))
        return self.name, outs


class NaiveB2P(SubTskGphBuilder):
    name = "naive_b2p"

    def build(self, ctx, in_refs, src, dst, shape):
        if not (parallel_num(src) == 1 or all_broadcast(src)) or len(dst.placement.hierarchy) != 1 \
                or parallel_num(dst) == 1 or not dst.sbp[0].is_partial:
            return None
        outs = []
        for j, rank in enumerate(dst.placement.flat_ranks):
            device = device_of(dst, rank)
            if j == 0:
                outs.append(ctx.proxy(in_refs[ctx.nearest_src(in_refs, rank, device)], rank, device))
            else:
                outs.append(ctx.zeros(rank, device, shape))
        return self.name, outs


class Naive(SubTskGphBuilder):
    name = "naive"

    def build(self, ctx, in_refs, src, dst, shape):
        moves, as_b = routes(src, dst, shape), _as_broadcast(dst)
        outs = []
        for j, rank in enumerate(dst.placement.flat_ranks):
            device, target = device_of(dst, rank), region_of(as_b, j, shape)
            parts = []
            for sender, receiver, region in moves:
                if receiver != rank:
                    continue
                i = src.placement.parallel_id(sender)
                piece = ctx.slice(in_refs[i], relative(region, region_of(src, i, shape)))
                parts.append((relative(region, target), ctx.proxy(piece, rank, device)))
            outs.append(ctx.combine(parts, rank, device, shape_of_region(target)))
        return self.name, outs
