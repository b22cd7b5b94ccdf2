"""N-D boxing and the chain (seed 004; OneFlow's ``hierarchical_sub_task_graph_builder_impl.cpp``, ``task_graph.cpp``).

OneFlow boxes an edge of 2-D layouts by reducing it to 1-D problems, each
handed to the same 1-D chain:

* **dim_reduce** (``InOutParallelDimReduce``): a 2-D side whose SBP is B on
  every axis is B over its flattened ranks (likewise all-P for the producer);
  if both sides become 1-D the 1-D chain boxes them (``(P, P) -> (B, B)``:
  one all-reduce over four ranks).  A P consumer is never flattened: its
  layout must stay OneFlow's eager one (SEMANTICS §4a).
* **intra_group** (``IntraGroupSubTskGphBuilder``): same hierarchy, axis 0's
  SBP kept, axis 1's changed: each row of the hierarchy boxes the part of the
  tensor axis 0 gave it, as a 1-D problem.
* **inter_group** (``InterGroupSubTskGphBuilder``): axis 1 kept, axis 0
  changed: each column boxes its part, provided axis 0 never splits the
  dimension axis 1 splits (else the parts do not line up: OneFlow's "not all
  the same split" test).

Where a P consumer's layout would differ from OneFlow's eager one (groups on other
ranks), the edge goes on to the naive builder.  ``CHAIN`` is the order every
edge is offered in, first taker wins; ``build_boxing`` runs it and drops nodes
no output needs.
"""

from __future__ import annotations

import numpy as np

from pyflow.distributed.boxing_chain.collective import CollectiveBoxing
from pyflow.distributed.boxing_chain.graph import (BoxingGraph, ChainSubTskGphBuilder, SubTskGphBuilder,
                                                   SubTskGphBuilderCtx, parallel_num)
from pyflow.distributed.boxing_chain.naive import Naive, NaiveB2B, NaiveB2P
from pyflow.distributed.boxing_chain.one_to_one import B21, OneToOne
from pyflow.distributed.boxing_chain.slice_boxing import SliceBoxing
from pyflow.distributed.boxing_steps import Layout
from pyflow.errors import ArgumentTypeError, AxisError
from pyflow.framework.placement import placement as Placement
from pyflow.framework.sbp import piece_slices

__all__ = ["DimReduce", "IntraGroup", "InterGroup", "CHAIN", "build_boxing"]


def _flat(layout, allowed: tuple):
    """``layout`` as 1-D over its flattened ranks if every axis has the same SBP, one of ``allowed``."""
    if len(layout.placement.hierarchy) == 1:
        return layout
    kinds = {s.kind for s in layout.sbp}
    if len(kinds) != 1 or kinds.pop() not in allowed:
        return None
    place = layout.placement
    return Layout(Placement(place.type, list(place.flat_ranks)), (layout.sbp[0],))


class DimReduce(SubTskGphBuilder):
    name = "dim_reduce"

    def __init__(self, chain) -> None:
        self.chain = chain

    def build(self, ctx, in_refs, src, dst, shape):
        if len(src.placement.hierarchy) == 1 and len(dst.placement.hierarchy) == 1:
            return None
        flat_src, flat_dst = _flat(src, ("broadcast", "partial_sum")), _flat(dst, ("broadcast",))
        if flat_src is None or flat_dst is None:
            return None
        name, outs = self.chain.build(ctx, in_refs, flat_src, flat_dst, shape)
        return f"{self.name}({name})", outs


class _Groups(SubTskGphBuilder):
    """Box a 2-D edge group by group along one hierarchy axis (``axis``: the one that changes)."""

    axis = 1

    def __init__(self, chain) -> None:
        self.chain = chain

    def accepts(self, src, dst) -> bool:
        sh, dh = src.placement.hierarchy, dst.placement.hierarchy
        if len(sh) != 2 or sh != dh:
            return False
        keep = 1 - self.axis
        if src.sbp[keep] != dst.sbp[keep] or src.sbp[self.axis] == dst.sbp[self.axis]:
            return False
        return not any(s.is_partial for s in dst.sbp) or src.placement.flat_ranks == dst.placement.flat_ranks

    def build(self, ctx, in_refs, src, dst, shape):
        if not self.accepts(src, dst):
            return None
        rows, cols = src.placement.hierarchy
        keep = 1 - self.axis
        groups = ([[r * cols + c for c in range(cols)] for r in range(rows)] if self.axis == 1 else
                  [[r * cols + c for r in range(rows)] for c in range(cols)])
        outs, names = [None] * parallel_num(dst), []
        for g, members in enumerate(groups):
            part = piece_slices(shape, (src.sbp[keep],), (src.placement.hierarchy[keep],), (g,))
            sub_shape = tuple(s.stop - s.start for s in part)
            sub_src = _sub_layout(src, members, self.axis)
            sub_dst = _sub_layout(dst, members, self.axis)
            name, sub_outs = self.chain.build(ctx, [in_refs[p] for p in members], sub_src, sub_dst, sub_shape)
            names.append(name)
            for p, ref in zip(members, sub_outs):
                outs[p] = ref
        return f"{self.name}({', '.join(dict.fromkeys(names))})", outs


def _sub_layout(layout, members: list, axis: int):
    place = layout.placement
    return Layout(Placement(place.type, [place.flat_ranks[p] for p in members]), (layout.sbp[axis],))


class IntraGroup(_Groups):
    name, axis = "intra_group", 1


class InterGroup(_Groups):
    name, axis = "inter_group", 0

    def accepts(self, src, dst) -> bool:
        if not super().accepts(src, dst):
            return False
        inner = src.sbp[1]
        return not inner.is_split or not any(s.is_split and s.dim == inner.dim for s in (src.sbp[0], dst.sbp[0]))


def _make_chain() -> ChainSubTskGphBuilder:
    chain = ChainSubTskGphBuilder([])
    chain.builders = [OneToOne(), B21(), CollectiveBoxing(), SliceBoxing(), DimReduce(chain), IntraGroup(chain),
                      InterGroup(chain), NaiveB2B(), NaiveB2P(), Naive()]
    return chain


CHAIN = _make_chain()


def build_boxing(src, dst, shape: tuple, dtype=None) -> BoxingGraph:
    """The boxing sub-graph of one logical edge: ``src`` layout -> ``dst`` layout of a ``shape``/``dtype`` tensor.

    Call it where the placements were made (a rank context whose world holds their ranks): the 2-D
    builders make sub-placements, and devices are the placements' (``placement.device(rank)``).
    The nodes do not depend on the dtype: the compiler passes it (its regsts need it), eager
    boxing leaves it None and builds one plan per edge for every dtype.
    """
    shape, dtype = tuple(int(n) for n in shape), None if dtype is None else np.dtype(dtype)
    _check(src, dst, shape)
    ctx = SubTskGphBuilderCtx(src, shape, dtype)
    name, outs = CHAIN.build(ctx, [("in", i) for i in range(parallel_num(src))], src, dst, shape)
    nodes, outs = _without_dead_nodes(ctx.nodes, outs)
    return BoxingGraph(src, dst, shape, dtype, name, nodes, outs)


def _check(src, dst, shape) -> None:
    if not isinstance(src, Layout) or not isinstance(dst, Layout):
        raise ArgumentTypeError(f"build_boxing: src and dst must be pyflow.distributed.boxing.Layout, got "
                                f"{type(src).__name__} and {type(dst).__name__}")
    for layout in (src, dst):
        for s in layout.sbp:
            if s.is_split and s.dim >= len(shape):
                raise AxisError(f"build_boxing {src.short()} -> {dst.short()}: {s.short()} on a tensor of shape "
                                f"{shape} (rank {len(shape)}); split a dimension < {len(shape)}")


def _without_dead_nodes(nodes: list, outputs: list) -> tuple:
    """Keep the nodes some output needs (a collective: all its members, or none); renumber them."""
    live = {ref[1] for ref in outputs if ref[0] == "node"}
    members: dict = {}
    for i, node in enumerate(nodes):
        if node.kind == "collective":
            members.setdefault(node.attrs["collective_id"], []).append(i)
    changed = True
    while changed:
        changed = False
        for i in sorted(live, reverse=True):
            needed = {ref[1] for ref in nodes[i].inputs if ref[0] == "node"}
            if nodes[i].kind == "collective":
                needed |= set(members[nodes[i].attrs["collective_id"]])
            if not needed <= live:
                live |= needed
                changed = True
    order = sorted(live)
    new_index = {old: new for new, old in enumerate(order)}

    def renumber(ref):
        return ref if ref[0] == "in" else ("node", new_index[ref[1]])

    kept = []
    for old in order:
        node = nodes[old]
        node.inputs = [renumber(r) for r in node.inputs]
        kept.append(node)
    return kept, [renumber(r) for r in outputs]

