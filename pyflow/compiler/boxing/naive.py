"""Naive builders, the end of the chain (seed 004; OneFlow's ``naive_b2b_...``, ``naive_b2p_...``).

* **naive_b2b**: whole value -> whole value (producer: one piece or all B;
  consumer: all B): each consumer piece is the nearest producer piece, moved.
* **naive_b2p**: whole value -> P (1-D, more than one consumer): consumer
  parallel_id 0 gets the nearest producer piece, every other one a ``zeros``
  node.  (OneFlow's lazy builder keeps the value on the consumer nearest to a
  producer; pyflow follows its *eager* layout, SEMANTICS §4a, so that lazy and
  eager pieces agree: the first consumer rank keeps the value.)
* **naive**: every pair, N-D hierarchies, uneven and zero-size tensors
  included.  The routes are eager boxing's generic exchange
  (``pyflow.distributed.boxing_steps.Exchange.routes``: written once, used by both):
  ``(sender, receiver, logical region)``.  Each route becomes a ``slice`` on
  the sender and a move; each consumer piece is then its one route, an ``add``
  of whole pieces, an ``assemble`` of regions (overlapping P parts add up), or
  ``zeros`` if nothing is routed to it (a P consumer off the value's ranks).
"""

from __future__ import annotations

from pyflow.compiler.boxing.graph import (SubTskGphBuilder, device_of, parallel_num, region_of, relative,
                                          shape_of_region)
from pyflow.compiler.boxing.one_to_one import all_broadcast
from pyflow.distributed.boxing_steps import Exchange, Layout
from pyflow.framework.sbp import SbpParallel

__all__ = ["NaiveB2B", "NaiveB2P", "Naive"]


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
        routes = [(s, d, tuple((r.start, r.stop) for r in region)) for s, d, region in Exchange(src, dst).routes(shape)]
        as_b = Layout(dst.placement, tuple(SbpParallel("broadcast") if s.is_partial else s for s in dst.sbp))
        outs = []
        for j, rank in enumerate(dst.placement.flat_ranks):
            device, target = device_of(dst, rank), region_of(as_b, j, shape)
            parts = []
            for sender, receiver, region in routes:
                if receiver != rank:
                    continue
                i = src.placement.parallel_id(sender)
                piece = ctx.slice(in_refs[i], relative(region, region_of(src, i, shape)))
                parts.append((relative(region, target), ctx.proxy(piece, rank, device)))
            outs.append(ctx.combine(parts, rank, device, shape_of_region(target)))
        return self.name, outs
