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

The layouts, the context and the steps a plan is made of (all but ``OnEachGroup``,
which recurses into the chain) live in ``pyflow/distributed/boxing_steps.py``; this
module re-exports them.

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
import functools

from pyflow.distributed.boxing_steps import (AllGather, AllReduce, AllToAll, BoxingContext, Exchange, Layout,
                                             LocalPartial, LocalSlice, ReduceScatter, Step, ToDevice)
from pyflow.framework.placement import placement as Placement
from pyflow.framework.sbp import piece_slices

__all__ = ["Layout", "BoxingContext", "Builder", "CHAIN", "choose", "plan_for", "run_boxing_steps"]


# --- steps ---------------------------------------------------------------------------------


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
        return run_boxing_steps(plan_for(sub_src, sub_dst, sub_shape), piece, sub_ctx)




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


class IdentityBuilder(Builder):
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


CHAIN = (IdentityBuilder(), DeviceCopy(), AllReduceBuilder(), ReduceScatterBuilder(), AllGatherBuilder(),
         AllToAllBuilder(), LocalSliceBuilder(), LocalPartialBuilder(), CopyAround(), NdDimReduce(), Generic())


def choose(src: Layout, dst: Layout, shape: tuple) -> Builder:
    """The first builder of the chain that can box ``src`` -> ``dst``."""
    return next(b for b in CHAIN if b.can(src, dst, shape))


@functools.lru_cache(maxsize=4096)
def plan_for(src: Layout, dst: Layout, shape: tuple) -> tuple:
    """The plan (steps) that boxes ``src`` -> ``dst`` for a logical ``shape``, built once per edge.

    A training loop boxes the same tensors the same way every step (its gradients P -> B, its loss
    P -> B for ``item()``), so the plan of an edge (source layout, destination layout, shape) is
    worked out once, as OneFlow's eager boxing caches its boxing interpreters, and reused.  A plan
    names no rank (every rank runs the same steps on its own piece), so the ranks of a process share it.
    """
    return tuple(choose(src, dst, shape).plan(src, dst, shape))


def run_boxing_steps(steps, piece, ctx: BoxingContext):
    """Run ``steps`` on this rank's ``piece``; its piece of the result (None off the destination)."""
    for step in steps:
        piece = step.run(piece, ctx)
    return piece
