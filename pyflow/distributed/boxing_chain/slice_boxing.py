"""Slice boxing (seed 004; OneFlow's ``slice_boxing_sub_task_graph_builder.cpp``).

Any two 1-D layouts, on any placements and device types, built from the
small nodes: ``slice`` on the producer's side (send only what is needed),
moves (``proxy``: copy / comm_net), then ``concat`` or ``add`` on the
consumer's side.  One mode per SBP pair:

====  ======================================================================
S2B   each consumer concatenates every producer piece (moved), along the
      producer's split axis
S2S   each consumer: the overlap of its slice with every producer slice
      (sliced where it is, moved), concatenated along the producer's axis
P2S   each consumer: its slice of every producer piece, moved, added
P2B   each consumer: every producer piece, moved, added
B2S   each consumer: its slice, cut from the nearest producer piece, moved
S2P   pyflow's addition for OneFlow's eager layout (SEMANTICS §4a): producer
      piece ``i`` goes to its own rank if that is a consumer, else to
      consumer ``i % m``; a consumer concatenates what it got with zeros for
      the rest (ranks that get nothing hold zeros)
====  ======================================================================

As in OneFlow, a layout that would give some piece an empty slice (a split
axis shorter than the parallel num) is left to the naive builder; so is S2P
from a single piece (OneFlow's eager layout keeps it on the consumer's first rank:
``naive_b2p``).
"""

from __future__ import annotations

from pyflow.distributed.boxing_chain.graph import (SubTskGphBuilder, device_of, intersect, parallel_num,
                                                   region_of, relative, shape_of_region)

__all__ = ["SliceBoxing"]


def _has_empty_slice(layout, shape) -> bool:
    s = layout.sbp[0]
    return s.is_split and shape[s.dim] < parallel_num(layout)


def _mode(s, d) -> str | None:
    kind = {"split": "S", "broadcast": "B", "partial_sum": "P"}
    mode = kind[s.kind] + "2" + kind[d.kind]
    return mode if mode in ("S2B", "S2S", "P2S", "P2B", "B2S", "S2P") else None


class SliceBoxing(SubTskGphBuilder):
    name = "slice_boxing"

    def build(self, ctx, in_refs, src, dst, shape):
        if len(src.placement.hierarchy) != 1 or len(dst.placement.hierarchy) != 1:
            return None
        if _has_empty_slice(src, shape) or _has_empty_slice(dst, shape):
            return None
        mode = _mode(src.sbp[0], dst.sbp[0])
        if mode is None or (mode == "S2P" and parallel_num(src) == 1):
            return None
        outs = []
        for j, rank in enumerate(dst.placement.flat_ranks):
            device = device_of(dst, rank)
            outs.append(getattr(self, mode.lower())(ctx, in_refs, src, dst, shape, j, rank, device))
        return f"{self.name}({mode})", outs

    @staticmethod
    def s2b(ctx, in_refs, src, dst, shape, j, rank, device):
        return ctx.concat([ctx.proxy(ref, rank, device) for ref in in_refs], src.sbp[0].dim)

    @staticmethod
    def s2s(ctx, in_refs, src, dst, shape, j, rank, device):
        mine, axes = region_of(dst, j, shape), (src.sbp[0].dim, dst.sbp[0].dim)
        parts = []
        for i, ref in enumerate(in_refs):
            theirs = region_of(src, i, shape)
            common = intersect(mine, theirs)
            if any(common[a][1] <= common[a][0] for a in axes):
                continue
            parts.append(ctx.proxy(ctx.slice(ref, relative(common, theirs)), rank, device))
        return ctx.concat(parts, src.sbp[0].dim)

    @staticmethod
    def p2s(ctx, in_refs, src, dst, shape, j, rank, device):
        mine = region_of(dst, j, shape)
        return ctx.add_all([ctx.proxy(ctx.slice(ref, mine), rank, device) for ref in in_refs])

    @staticmethod
    def p2b(ctx, in_refs, src, dst, shape, j, rank, device):
        return ctx.add_all([ctx.proxy(ref, rank, device) for ref in in_refs])

    @staticmethod
    def b2s(ctx, in_refs, src, dst, shape, j, rank, device):
        nearest = ctx.nearest_src(in_refs, rank, device)
        return ctx.proxy(ctx.slice(in_refs[nearest], region_of(dst, j, shape)), rank, device)

    @staticmethod
    def s2p(ctx, in_refs, src, dst, shape, j, rank, device):
        axis, consumers, m = src.sbp[0].dim, dst.placement.flat_ranks, parallel_num(dst)
        blocks, zeros_from = [], None     # zeros_from: where the current run of zeros started
        for i, (r, ref) in enumerate(zip(src.placement.flat_ranks, in_refs)):
            target = r if dst.placement.has(r) else consumers[i % m]
            start, stop = region_of(src, i, shape)[axis]
            if target != rank:
                zeros_from = start if zeros_from is None else zeros_from
                continue
            if zeros_from is not None:
                blocks.append(_zeros_block(ctx, rank, device, shape, axis, zeros_from, start))
                zeros_from = None
            blocks.append(ctx.proxy(ref, rank, device))
        if zeros_from is not None:
            blocks.append(_zeros_block(ctx, rank, device, shape, axis, zeros_from, shape[axis]))
        return ctx.concat(blocks, axis)


def _zeros_block(ctx, rank, device, shape, axis, start, stop):
    block = tuple((start, stop) if a == axis else (0, n) for a, n in enumerate(shape))
    return ctx.zeros(rank, device, shape_of_region(block))
