"""Seed 004: SBP - how a global tensor's logical value maps to the pieces on its ranks.

One SBP per hierarchy axis of the placement (a tuple, OneFlow's ``NdSbp``):

* ``split(dim)`` (S) - the ranks hold consecutive slices along ``dim``, sized
  by the **balanced splitter**: ``n`` parts of ``total // n``, the first
  ``total % n`` one bigger;
* ``broadcast`` (B) - every rank holds the whole tensor;
* ``partial_sum`` (P) - every rank holds a tensor of the whole shape, and the
  logical value is their elementwise sum.

On a 2-D hierarchy the axes apply in order, each splitting what the previous
left: 13 rows as ``(split(0), split(0))`` on ``[[0, 1], [2, 3]]`` give rows 0-3,
4-6, 7-9, 10-12.

A **signature** says which SBPs an op's inputs may have and which its outputs
then get (OneFlow's ``SbpSignature``): ``Signature((S(0), B), (S(0),))`` is a
matmul split by rows.  Each op declares its own (``OpDef.sbp_signatures``, next
to the op in ``pyflow/ops/``); ``S(d)``, ``B`` and ``P`` are the seeds' notation.

>>> sbp.split(1), sbp.broadcast, sbp.partial_sum
(sbp.split(dim=1), sbp.broadcast, sbp.partial_sum)
>>> balanced_split(13, 4)
[(0, 4), (4, 7), (7, 10), (10, 13)]
>>> piece_slices((13, 2), (sbp.split(0), sbp.split(0)), (2, 2), (1, 0))
(slice(7, 10, None), slice(0, 2, None))
>>> print(Signature((S(1), S(0)), (P,)))
(S(1), S(0)) -> P
"""

from __future__ import annotations

import dataclasses
import numbers
import types

from pyflow.errors import ArgumentTypeError, AxisError, ShapeError
from pyflow.framework.placement import placement as Placement

__all__ = ["SbpParallel", "sbp", "S", "B", "P", "Signature", "balanced_split", "piece_slices", "piece_shape",
           "as_nd_sbp", "checked_layout"]


@dataclasses.dataclass(frozen=True)
class SbpParallel:
    """One axis's SBP: ``kind`` is "split", "broadcast" or "partial_sum"; ``dim`` for split."""

    kind: str
    dim: int | None = None

    def __call__(self) -> "SbpParallel":
        """``flow.sbp.broadcast()`` is ``flow.sbp.broadcast`` (both spellings work, as in OneFlow)."""
        return self

    @property
    def is_split(self) -> bool:
        return self.kind == "split"

    @property
    def is_broadcast(self) -> bool:
        return self.kind == "broadcast"

    @property
    def is_partial(self) -> bool:
        return self.kind == "partial_sum"

    def short(self) -> str:
        """S(0), B, P: the notation of the seeds and OneFlow's docs."""
        return f"S({self.dim})" if self.is_split else ("B" if self.is_broadcast else "P")

    def __repr__(self) -> str:
        return f"sbp.split(dim={self.dim})" if self.is_split else f"sbp.{self.kind}"


def _split(dim: int) -> SbpParallel:
    """``S(dim)``: consecutive balanced slices along ``dim``."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise AxisError(f"sbp.split: dim must be an int, got {type(dim).__name__} {dim!r}")
    if dim < 0:
        raise AxisError(f"sbp.split: dim must be >= 0 (OneFlow's rule), got {dim}")
    return SbpParallel("split", int(dim))


# ``flow.sbp``: a namespace, as OneFlow's module
sbp = types.SimpleNamespace(split=_split, broadcast=SbpParallel("broadcast"), partial_sum=SbpParallel("partial_sum"),
                            sbp=SbpParallel)


# The seeds' notation, for writing signatures: S(d), B, P
S = _split
B = sbp.broadcast
P = sbp.partial_sum


@dataclasses.dataclass(frozen=True)
class Signature:
    """One SBP per input (None for a Python scalar) and one per output, on one hierarchy axis
    (or, for an N-D hierarchy, a tuple of those per input and output)."""

    inputs: tuple
    outputs: tuple

    def __str__(self) -> str:
        def text(s):
            if s is None:
                return "-"
            if isinstance(s, SbpParallel):
                return s.short()
            return s[0].short() if len(s) == 1 else "(" + ", ".join(x.short() for x in s) + ")"
        outs = ", ".join(text(s) for s in self.outputs)
        return f"({', '.join(text(s) for s in self.inputs)}) -> {outs if len(self.outputs) == 1 else f'({outs})'}"


def as_nd_sbp(value, hierarchy: tuple, what: str = "sbp") -> tuple:
    """``value`` (one SbpParallel or a sequence of them) as a tuple with one per hierarchy axis."""
    items = (value,) if isinstance(value, SbpParallel) else tuple(value) if isinstance(value, (list, tuple)) else None
    if items is None or not all(isinstance(s, SbpParallel) for s in items):
        raise ShapeError(f"{what}: expected flow.sbp.split(d) / broadcast / partial_sum or a tuple of them, "
                         f"got {value!r}")
    if len(items) != len(hierarchy):
        raise ShapeError(f"{what}: {len(items)} sbp value(s) {items} for a placement hierarchy of "
                         f"{len(hierarchy)} axis/axes {hierarchy}: give one per axis")
    return items


def checked_layout(shape: tuple, placement, sbp, what: str) -> tuple:
    """``sbp`` as ``as_nd_sbp`` gives it, checked for a global tensor of logical ``shape`` on ``placement``
    (a ``flow.placement``; each split names one of its dims): eager ``to_global`` and nn.Graph's share it."""
    if not isinstance(placement, Placement):
        raise ArgumentTypeError(f"{what}: placement must be a flow.placement, got {type(placement).__name__}")
    nd = as_nd_sbp(sbp, placement.hierarchy, what)
    for s in nd:
        if s.is_split and s.dim >= max(len(shape), 1):
            raise ShapeError(f"{what}: {s!r} splits dim {s.dim}, but the tensor has {len(shape)} dim(s) "
                             f"(shape {list(shape)})")
        if s.is_split and not shape:
            raise ShapeError(f"{what}: a 0-d tensor cannot be split ({s!r})")
    return nd


def balanced_split(total: int, parts: int) -> list:
    """``parts`` (start, stop) ranges covering ``range(total)``: the first ``total % parts`` one longer."""
    base, extra = divmod(total, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def piece_slices(shape: tuple, nd_sbp: tuple, hierarchy: tuple, coords: tuple) -> tuple:
    """The slice of the logical tensor that the rank at hierarchy ``coords`` holds."""
    bounds = [(0, n) for n in shape]
    for axis_sbp, size, index in zip(nd_sbp, hierarchy, coords):
        if axis_sbp.is_split:
            d = axis_sbp.dim
            if d >= len(shape):
                raise AxisError(f"{axis_sbp!r} on a tensor of shape {tuple(shape)} (rank {len(shape)})")
            start, stop = bounds[d]
            lo, hi = balanced_split(stop - start, size)[index]
            bounds[d] = (start + lo, start + hi)
    return tuple(slice(a, b) for a, b in bounds)


def piece_shape(shape: tuple, nd_sbp: tuple, hierarchy: tuple, coords: tuple) -> tuple:
    """The shape of the piece at ``coords`` (B and P pieces have the whole shape)."""
    return tuple(s.stop - s.start for s in piece_slices(shape, nd_sbp, hierarchy, coords))
