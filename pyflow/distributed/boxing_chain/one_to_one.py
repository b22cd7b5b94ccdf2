"""One-to-one and B21 (seed 004; OneFlow's ``one_to_one_sub_task_graph_builder.cpp``, ``b21_...``).

The two cheapest links of the chain: no data is cut or summed, each consumer
piece *is* one producer piece, moved if it lives elsewhere (``proxy``: copy
nodes across device types, comm_net across ranks).

* **one-to-one**: both sides hold one piece, or the same number of pieces with
  the same (nd-)SBP and hierarchy: piece ``i`` -> piece ``i``.  With a P
  consumer the pieces must also land where OneFlow's eager boxing puts them
  (SEMANTICS §4a: a P piece stays on its rank if that rank is a consumer, else
  goes to parallel_id ``i % m``); otherwise the edge is left to the naive
  builder, which routes them that way.
* **b21**: the consumer is one device and the producer holds the whole value on
  each of its pieces (one piece, or B on every hierarchy axis): take the
  nearest piece (same rank and device, else same rank, else the first).
"""

from __future__ import annotations

from pyflow.distributed.boxing_chain.graph import SubTskGphBuilder, device_of, parallel_num

__all__ = ["OneToOne", "B21", "keeps_pieces_in_order"]


def keeps_pieces_in_order(src, dst) -> bool:
    """Whether the P routing (``naive.routes``) sends producer piece ``i`` to consumer piece ``i`` (no P: yes)."""
    if not any(s.is_partial for s in dst.sbp):
        return True
    if len(dst.placement.hierarchy) != 1 or len(src.placement.hierarchy) != 1:
        return src.placement.flat_ranks == dst.placement.flat_ranks
    return all(not dst.placement.has(r) or r == d for r, d in zip(src.placement.flat_ranks, dst.placement.flat_ranks))


def all_broadcast(layout) -> bool:
    return all(s.is_broadcast for s in layout.sbp)


class OneToOne(SubTskGphBuilder):
    name = "one_to_one"

    def build(self, ctx, in_refs, src, dst, shape):
        n, m = parallel_num(src), parallel_num(dst)
        same = (n == m and src.placement.hierarchy == dst.placement.hierarchy and src.sbp == dst.sbp
                and keeps_pieces_in_order(src, dst))
        if not (same or n == m == 1):
            return None
        ranks = dst.placement.flat_ranks
        return self.name, [ctx.proxy(in_refs[j], r, device_of(dst, r)) for j, r in enumerate(ranks)]


class B21(SubTskGphBuilder):
    name = "b21"

    def build(self, ctx, in_refs, src, dst, shape):
        if parallel_num(dst) != 1 or not (parallel_num(src) == 1 or all_broadcast(src)):
            return None
        rank = dst.placement.flat_ranks[0]
        device = device_of(dst, rank)
        return self.name, [ctx.proxy(in_refs[ctx.nearest_src(in_refs, rank, device)], rank, device)]
