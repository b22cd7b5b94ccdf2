"""The boxing sub-graph and its builder context (seed 004; OneFlow's ``SubTskGphBuilderCtx``, ``GetProxyNode``).

A logical edge whose layout changes becomes a small graph of **boxing nodes**
(OneFlow: boxing task nodes) between the producer's pieces and the consumer's.
The graph is the boxing plan both execution paths read (issue 30: boxing
written once): nn.Graph's TaskGraph makes a task of each node
(``pyflow/compiler/task_graph.py``), eager boxing runs the nodes of its own
rank (``pyflow/distributed/boxing.py``).  This module holds the data
(``BoxingNode``, ``BoxingGraph``) and what every builder shares
(``SubTskGphBuilderCtx``):

* ``proxy(ref, rank, device)`` - OneFlow's ``GetProxyNode``: the same piece
  where it is needed.  Same rank, other device type: one ``copy`` (h2d/d2h).
  Another rank: to the host (d2h if on cuda), ``comm_net`` to the other
  rank's host, then h2d if the consumer is on cuda.  Every hop is memoised,
  so a piece sent twice to one rank crosses the network once.
* ``slice(ref, region)`` - a ``slice`` node where the piece is (slicing
  before sending moves fewer bytes: OneFlow's ``GetSliceCopyNode``).
* ``nearest_src(...)`` - ``FindNearestSrcParallelId``: the source piece on the
  same rank and device, else the same rank, else the first.

A **region** is a tuple of ``(start, stop)`` per dimension.  A **Ref** is
``("in", src_parallel_id)`` (the producer's piece) or ``("node", index)``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pyflow.device import Device
from pyflow.framework.sbp import piece_slices

__all__ = ["BoxingNode", "BoxingGraph", "SubTskGphBuilder", "ChainSubTskGphBuilder", "SubTskGphBuilderCtx",
           "HOST", "region_of", "shape_of_region", "relative", "intersect", "device_of", "parallel_num"]

HOST = str(Device("cpu"))          # "cpu:0": every rank's host memory


# --- regions and layouts -----------------------------------------------------------------------


def region_of(layout, parallel_id: int, shape: tuple) -> tuple:
    """The logical region ``((start, stop), ...)`` that ``layout``'s piece ``parallel_id`` covers."""
    place = layout.placement
    slices = piece_slices(tuple(shape), layout.sbp, place.hierarchy, place.coordinates(parallel_id))
    return tuple((s.start, s.stop) for s in slices)


def shape_of_region(region: tuple) -> tuple:
    return tuple(stop - start for start, stop in region)


def relative(region: tuple, within: tuple) -> tuple:
    """``region`` (logical) as a region of the piece that covers ``within``."""
    return tuple((a - w, b - w) for (a, b), (w, _) in zip(region, within))


def intersect(a: tuple, b: tuple) -> tuple:
    return tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))


def device_of(layout, rank: int) -> str:
    """The device ``rank`` uses for ``layout``'s placement, as pyflow's placement maps it ("cuda:1", "cpu:0")."""
    return str(layout.placement.device(rank))


def parallel_num(layout) -> int:
    return layout.placement.parallel_num


# --- the graph -------------------------------------------------------------------------------------


@dataclasses.dataclass
class BoxingNode:
    """One boxing task: ``kind`` run on ``rank``'s ``device`` over ``inputs``; its output has ``shape``."""

    kind: str
    rank: int
    device: str
    inputs: list
    attrs: dict
    shape: tuple | None          # None: the node produces nothing (a non-root member of a reduce)
    dtype: np.dtype | None      # None in an eager plan (built once per edge, for any dtype)

    def __str__(self) -> str:
        attrs = ", ".join(f"{k}={v}" for k, v in self.attrs.items())
        ins = ", ".join(_ref_str(r) for r in self.inputs)
        sep = "; " if ins and attrs else ""
        return f"{self.kind}({ins}{sep}{attrs}) -> {self.shape} @ rank {self.rank} {self.device}"


def _ref_str(ref) -> str:
    return f"in{ref[1]}" if ref[0] == "in" else f"n{ref[1]}"


class _Pieces:
    """Where a Ref's piece is and its shape: from the producer's layout (``src``) or the node."""

    src: object
    shape: tuple
    nodes: list

    def where(self, ref) -> tuple:
        """``(rank, device)`` of the piece ``ref`` names."""
        if ref[0] == "in":
            rank = self.src.placement.flat_ranks[ref[1]]
            return rank, device_of(self.src, rank)
        node = self.nodes[ref[1]]
        return node.rank, node.device

    def shape_of(self, ref) -> tuple | None:
        if ref[0] == "in":
            return shape_of_region(region_of(self.src, ref[1], self.shape))
        return self.nodes[ref[1]].shape


@dataclasses.dataclass
class BoxingGraph(_Pieces):
    """The sub-graph one logical edge gets: ``nodes`` in execution order, ``outputs[dst_parallel_id]``: a Ref."""

    src: object                  # pyflow.distributed.boxing_steps.Layout
    dst: object
    shape: tuple
    dtype: np.dtype | None
    builder: str
    nodes: list
    outputs: list

    def __str__(self) -> str:
        dtype = "" if self.dtype is None else np.dtype(self.dtype)
        lines = [f"boxing {self.src.short()} -> {self.dst.short()}, {dtype}{list(self.shape)}: "
                 f"{self.builder}"]
        lines += [f"  n{i} = {node}" for i, node in enumerate(self.nodes)]
        lines += [f"  out{j} = {_ref_str(ref)}" for j, ref in enumerate(self.outputs)]
        return "\n".join(lines)


# --- what every builder shares ------------------------------------------------------------------------


class SubTskGphBuilderCtx(_Pieces):
    """The nodes built so far, and the helpers that add them where they must run."""

    def __init__(self, src, shape: tuple, dtype) -> None:
        self.src, self.shape, self.dtype = src, tuple(shape), dtype
        self.nodes: list = []
        self._memo: dict = {}
        self._collectives = 0

    def add(self, kind: str, rank: int, device: str, inputs: list, shape, **attrs):
        self.nodes.append(BoxingNode(kind, rank, device, list(inputs), attrs,
                                     None if shape is None else tuple(shape), self.dtype))
        return ("node", len(self.nodes) - 1)

    def _memoised(self, key, make):
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def proxy(self, ref, rank: int, device: str):
        """``ref``'s piece on ``rank``'s ``device`` (OneFlow's GetProxyNode): copy, comm_net, copy."""
        at_rank, at_device = self.where(ref)
        if (at_rank, at_device) == (rank, device):
            return ref
        shape = self.shape_of(ref)
        if at_rank == rank:
            direction = "h2d" if at_device.startswith("cpu") else "d2h"
            return self._memoised((ref, rank, device),
                                  lambda: self.add("copy", rank, device, [ref], shape, direction=direction))
        if not at_device.startswith("cpu"):
            return self.proxy(self.proxy(ref, at_rank, HOST), rank, device)
        arrived = self._memoised((ref, rank, HOST),
                                 lambda: self.add("comm_net", rank, HOST, [ref], shape, src_rank=at_rank))
        return self.proxy(arrived, rank, device)

    def slice(self, ref, region: tuple):
        """The part ``region`` (relative to the piece) of ``ref``, sliced where the piece is."""
        shape = self.shape_of(ref)
        if tuple(region) == tuple((0, n) for n in shape):
            return ref
        rank, device = self.where(ref)
        return self._memoised(("slice", ref, tuple(region)),
                              lambda: self.add("slice", rank, device, [ref], shape_of_region(region),
                                               region=tuple(region)))

    def zeros(self, rank: int, device: str, shape: tuple):
        return self.add("zeros", rank, device, [], shape)

    def concat(self, refs: list, axis: int):
        if len(refs) == 1:
            return refs[0]
        rank, device = self.where(refs[0])
        shapes = [self.shape_of(r) for r in refs]
        out = list(shapes[0])
        out[axis] = sum(s[axis] for s in shapes)
        return self.add("concat", rank, device, refs, out, axis=axis)

    def add_all(self, refs: list):
        if len(refs) == 1:
            return refs[0]
        rank, device = self.where(refs[0])
        return self.add("add", rank, device, refs, self.shape_of(refs[0]))

    def combine(self, parts: list, rank: int, device: str, shape: tuple):
        """One piece of ``shape`` from ``(region, ref)`` parts already on ``rank``/``device``: zeros where
        none, the parts added in (a single whole part is itself; whole parts only: an ``add``)."""
        whole = tuple((0, n) for n in shape)
        if not parts:
            return self.zeros(rank, device, shape)
        if all(region == whole for region, _ in parts):
            return self.add_all([ref for _, ref in parts])
        return self.add("assemble", rank, device, [ref for _, ref in parts], shape,
                        regions=[region for region, _ in parts])

    def collective(self, op: str, group: tuple, inputs: list, shapes: list, devices: list, **attrs) -> list:
        """One collective: a node per member ``group[i]`` on ``devices[i]``, input ``inputs[i]`` (or None)."""
        cid, self._collectives = self._collectives, self._collectives + 1
        return [self.add("collective", rank, device, [] if ref is None else [ref], shape,
                         op=op, group=tuple(group), collective_id=cid, **attrs)
                for rank, ref, shape, device in zip(group, inputs, shapes, devices)]

    def nearest_src(self, in_refs: list, rank: int, device: str) -> int:
        """The index in ``in_refs`` of the piece nearest to ``rank``/``device`` (FindNearestSrcParallelId)."""
        def distance(i):
            at_rank, at_device = self.where(in_refs[i])
            return (0 if (at_rank, at_device) == (rank, device) else 1 if at_rank == rank else 2), i
        return min(range(len(in_refs)), key=distance)


# --- builders and the chain ---------------------------------------------------------------------------


class SubTskGphBuilder:
    """One link of the chain: ``build(ctx, in_refs, src, dst, shape)`` -> ``(name, out_refs)`` or None.

    ``in_refs[i]`` is where ``src``'s piece ``i`` is; ``out_refs[j]`` must be ``dst``'s piece ``j`` on
    ``dst``'s rank ``j`` and its device.  None: "boxing not supported" (OneFlow's
    BoxingNotSupportedError), the chain asks the next builder.
    """

    name = "builder"

    def build(self, ctx: SubTskGphBuilderCtx, in_refs: list, src, dst, shape: tuple):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class ChainSubTskGphBuilder(SubTskGphBuilder):
    """OneFlow's ChainSubTskGphBuilder: the first builder that accepts the edge builds it."""

    name = "chain"

    def __init__(self, builders: list) -> None:
        self.builders = list(builders)

    def build(self, ctx, in_refs, src, dst, shape):
        for builder in self.builders:
            done = builder.build(ctx, in_refs, src, dst, shape)
            if done is not None:
                return done
        return None
