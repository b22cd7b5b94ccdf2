"""Eager boxing (seed 004; OneFlow's eager boxing interpreter): one (placement, SBP) to another.

A global tensor's **layout** is its placement and its SBP.  Boxing changes the
layout and keeps the logical value.  The plan is the one boxing chain's
(``pyflow/distributed/boxing_chain/``, OneFlow's SubTskGphBuilder chain: one
to one, b21, collective, slice boxing, the 2-D builders, naive): a graph of
boxing nodes, each on the rank where it runs.  nn.Graph makes each node a task
of its Plan; eager boxing runs it at once: every rank walks the nodes in plan
order and runs those of its rank (``boxing_steps.py``: collectives and the
comm_net moves on the ccl stream, slicing, concatenation, sums and copies on
the compute and copy streams), so both paths box an edge the same way, P
layouts included (SEMANTICS §4a).

>>> from pyflow import env
>>> from pyflow.framework.placement import placement
>>> from pyflow.framework.sbp import sbp
>>> with env.bound(env.RankContext(rank=0, world_size=4)):
...     on4, on2 = placement("cuda", [0, 1, 2, 3]), placement("cuda", [2, 3])
...     print(plan_for(Layout(on4, (sbp.split(0),)), Layout(on4, (sbp.broadcast,)), (8, 2)).builder)
...     print(plan_for(Layout(on4, (sbp.split(0),)), Layout(on2, (sbp.split(1),)), (8, 2)).builder)
collective_boxing(all_gather)
slice_boxing(S2S)
"""

from __future__ import annotations

import functools

from pyflow.distributed.boxing_chain import BoxingGraph, build_boxing
from pyflow.distributed.boxing_steps import BoxingContext, Layout, exchange_round, run_node

__all__ = ["plan_for", "run_boxing_steps"]


@functools.lru_cache(maxsize=4096)
def plan_for(src: Layout, dst: Layout, shape: tuple) -> BoxingGraph:
    """The plan (a boxing graph) that boxes ``src`` -> ``dst`` for a logical ``shape``, built once per edge.

    A training loop boxes the same tensors the same way every step (its gradients P -> B, its loss
    P -> B for ``item()``), so the plan of an edge (source layout, destination layout, shape) is
    worked out once, as OneFlow's eager boxing caches its boxing interpreters, and reused.  A plan
    is the same on every rank (each runs its own nodes) and for every dtype, so the ranks of a
    process share it.
    """
    return build_boxing(src, dst, shape)


def run_boxing_steps(plan: BoxingGraph, piece, ctx: BoxingContext):
    """Run this rank's nodes of ``plan`` on its ``piece``; its piece of the result (None off the destination).

    The nodes run in stages: a node's stage is the number of ``comm_net`` hops behind it.  Each stage
    runs its nodes in plan order, then all the ``comm_net`` moves into the next stage as one round
    (``exchange_round``): one rendezvous per hop, not one per move.  The stages depend on the plan
    only, so every rank runs the same rounds and collectives in the same order.
    """
    rank, src, dst = ctx.rank, plan.src, plan.dst
    values = {("in", src.placement.parallel_id(rank)): piece} if src.placement.has(rank) else {}
    for stage in _stages(plan):
        moves = [(index, node) for index, node in stage if node.kind == "comm_net"]
        if moves:
            sends = {index: values[node.inputs[0]] for index, node in moves if node.attrs["src_rank"] == rank}
            values.update({("node", index): got for index, got in exchange_round(moves, sends, ctx).items()})
        for index, node in stage:
            if node.kind != "comm_net" and node.rank == rank:
                values[("node", index)] = run_node(node, [values[ref] for ref in node.inputs], ctx)
    return values[plan.outputs[dst.placement.parallel_id(rank)]] if dst.placement.has(rank) else None


def _stages(plan: BoxingGraph) -> list:
    """The plan's ``(index, node)`` pairs grouped by the number of ``comm_net`` hops behind each, in plan order."""
    hops: list = []
    for node in plan.nodes:
        behind = max((hops[ref[1]] for ref in node.inputs if ref[0] == "node"), default=0)
        hops.append(behind + (node.kind == "comm_net"))
    stages = [[] for _ in range(max(hops, default=0) + 1)]
    for index, node in enumerate(plan.nodes):
        stages[hops[index]].append((index, node))
    return stages
