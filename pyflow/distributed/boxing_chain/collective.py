"""Collective boxing (seed 004; OneFlow's ``collective_boxing_sub_task_graph_builder.cpp``, ``ccl_...``).

When producer and consumer sit on the same devices (same placement, 1-D,
cuda or cpu, more than one piece) the classic conversions are one collective
each, a ``collective`` node per rank of the group (the cases where pyflow's
OneFlow's eager boxing calls its collectives):

==============  =========================  ==========================================
producer        consumer                   collective
==============  =========================  ==========================================
P               B                          all_reduce
P               S(k)                       reduce_scatter (axis k)
S(k)            B                          all_gather (axis k)
S(i)            S(j), i != j               all_to_all (split_axis j, concat_axis i)
P on n          1 device among the n       reduce to that device (root)
1 device        B on n devices incl. it    broadcast from it (root)
==============  =========================  ==========================================

OneFlow asks for sizes divisible by the parallel num (NCCL's equal chunks);
pyflow's transports cut with the balanced splitter, so uneven and zero-size
pieces are accepted here.
"""

from __future__ import annotations

from pyflow.distributed.boxing_chain.graph import (SubTskGphBuilder, device_of, parallel_num, region_of,
                                                   shape_of_region)
from pyflow.framework.sbp import balanced_split

__all__ = ["CollectiveBoxing"]


class CollectiveBoxing(SubTskGphBuilder):
    name = "collective_boxing"

    def build(self, ctx, in_refs, src, dst, shape):
        sp, dp = src.placement, dst.placement
        if len(sp.hierarchy) != 1 or len(dp.hierarchy) != 1 or sp.type != dp.type:
            return None
        if sp == dp and parallel_num(src) > 1:
            return self._same_devices(ctx, in_refs, src, dst, shape)
        if parallel_num(src) > 1 and parallel_num(dst) == 1 and src.sbp[0].is_partial and dp.flat_ranks[0] in \
                sp.flat_ranks:
            root = dp.flat_ranks[0]
            shapes = [shape if r == root else None for r in sp.flat_ranks]
            refs = ctx.collective("reduce", sp.flat_ranks, in_refs, shapes, [ctx.where(r)[1] for r in in_refs],
                                  root=root)
            return f"{self.name}(reduce)", [refs[sp.flat_ranks.index(root)]]
        if parallel_num(src) == 1 and parallel_num(dst) > 1 and dst.sbp[0].is_broadcast and sp.flat_ranks[0] in \
                dp.flat_ranks:
            root = sp.flat_ranks[0]
            inputs = [in_refs[0] if r == root else None for r in dp.flat_ranks]
            refs = ctx.collective("broadcast", dp.flat_ranks, inputs, [shape] * len(inputs),
                                  [device_of(dst, r) for r in dp.flat_ranks], root=root)
            return f"{self.name}(broadcast)", refs
        return None

    def _same_devices(self, ctx, in_refs, src, dst, shape):
        s, d = src.sbp[0], dst.sbp[0]
        group, n = src.placement.flat_ranks, parallel_num(src)
        devices = [ctx.where(r)[1] for r in in_refs]
        out_shapes = [shape_of_region(region_of(dst, j, shape)) for j in range(n)]
        if s.is_partial and d.is_broadcast:
            op, attrs = "all_reduce", {}
        elif s.is_partial and d.is_split:
            op, attrs = "reduce_scatter", {"axis": d.dim, "bounds": tuple(balanced_split(shape[d.dim], n))}
        elif s.is_split and d.is_broadcast:
            op, attrs = "all_gather", {"axis": s.dim}
        elif s.is_split and d.is_split and s.dim != d.dim:
            op, attrs = "all_to_all", {"split_axis": d.dim, "concat_axis": s.dim,
                                       "bounds": tuple(balanced_split(shape[d.dim], n))}
        else:
            return None
        return f"{self.name}({op})", ctx.collective(op, group, in_refs, out_shapes, devices, **attrs)
