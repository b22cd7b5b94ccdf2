"""Global tensors (seeds 000 §3, 004): a logical tensor on a placement, as pieces on its ranks.

A global tensor is a ``Tensor`` whose ``_global`` is a ``GlobalInfo``
(placement, SBP, logical shape) and whose blob is this rank's piece.  A rank
outside the placement holds an empty piece (shape ``(0,)``) but knows the
logical shape and dtype, and runs nothing for the tensor.

* ``to_global(x, placement, sbp)`` - the eager runner of the op ``to_global``
  (``pyflow/ops/to_global.py``; its inference checks the layout first).  A local tensor becomes
  global (OneFlow's RawLocalToGlobal, SEMANTICS §4a): with S(k) the ranks' tensors are
  the pieces, concatenated in parallel_id order (their sizes must follow the
  balanced split); with B the data of parallel_id 0 is broadcast; with P the
  logical value is the sum.  The ranks first exchange their local shapes and
  dtypes, so mismatched pieces raise on every rank.  A global tensor is
  boxed (``boxing.py``); the same placement and SBP return the tensor itself.
* ``to_local(x)`` - this rank's piece, a local tensor sharing its memory.
* ``numpy(x)`` - the whole logical value on every rank: box to B on
  ``placement.all("cpu")``, then read the piece.  Every rank must call it.
* ``tensor(data, placement, sbp)`` - ``data`` is the logical tensor (the same
  on every rank): parallel_id 0's broadcast (B), then boxed to ``sbp``; no
  blocking exchange first (the broadcast's descriptor checks shape and dtype).

Every collective these issue is checked across ranks (``transport.py``), so a
rank that skips one is reported, never a hang.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from pyflow import env
from pyflow.device import Device
from pyflow.distributed.boxing import plan_for, run_boxing_steps
from pyflow.distributed.boxing_steps import BoxingContext, Layout
from pyflow.distributed.ccl import collective, describe_call, exchange
from pyflow.errors import ArgumentTypeError, DTypeError, ShapeError
from pyflow.framework.op_registry import TensorMeta, get_op
from pyflow.framework.placement import placement as Placement
from pyflow.framework.sbp import SbpParallel, checked_layout, piece_shape
from pyflow.framework.tensor import Tensor

__all__ = ["GlobalInfo", "empty_piece", "make_global", "as_global", "to_global", "to_local", "global_numpy", "global_tensor",
           "layout_of"]


@dataclasses.dataclass(frozen=True)
class GlobalInfo:
    """What makes a tensor global: where its pieces live, how they map to the logical tensor, its shape.

    Its hash and its ``Layout`` are worked out once, when first asked for: every global op's cache key
    hashes its inputs' infos (``global_ops._call_key``), and a boxing plan is looked up by layouts.
    """

    placement: Placement
    sbp: tuple
    shape: tuple
    _hash: int = dataclasses.field(default=None, init=False, repr=False, compare=False)
    _layout: Layout = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash((self.placement, self.sbp, self.shape)))
        return self._hash

    def __reduce__(self):
        """Pickled as its fields: another process works out its own hash (a placement's differs there)."""
        return GlobalInfo, (self.placement, self.sbp, self.shape)

    @property
    def layout(self) -> Layout:
        if self._layout is None:
            object.__setattr__(self, "_layout", Layout(self.placement, self.sbp))
        return self._layout


def layout_of(x: Tensor) -> Layout:
    return x._global.layout


def empty_piece(dtype, placement: Placement):
    """The piece of a rank outside the placement: empty, and made without any instruction."""
    return Tensor._empty(Device("cpu"), (0,), dtype)


def make_global(piece: Tensor | None, placement: Placement, sbp: tuple, shape: tuple, dtype) -> Tensor:
    """Wrap this rank's ``piece`` (None off the placement) as the global tensor it is part of."""
    return as_global(piece, GlobalInfo(placement, tuple(sbp), tuple(shape)), dtype)


def as_global(piece: Tensor | None, info: GlobalInfo, dtype) -> Tensor:
    """``make_global`` with the ``GlobalInfo`` made already (the global interpreter reuses one per kind of call)."""
    if piece is None:
        piece = empty_piece(dtype, info.placement)
    result = Tensor._wrap(piece._blob, piece._handle, piece._versions)
    result._global = info
    return result


def to_local(x: Tensor) -> Tensor:
    """This rank's piece of ``x`` (a local tensor over the same memory); a local ``x`` itself."""
    if x._global is None:
        return x
    return Tensor._wrap(x._blob, x._handle, x._versions)


def to_global(x: Tensor, placement=None, sbp=None) -> Tensor:
    """``x`` as a global tensor on ``placement`` with ``sbp`` (see the module docstring): the eager runner
    of the op ``to_global`` (``pyflow/ops/to_global.py``), whose inference checks the layout first."""
    op = get_op("to_global")
    if x._global is not None:
        info = x._global
        placement = info.placement if placement is None else placement
        sbp = info.sbp if sbp is None else sbp
        (out,) = op.infer([TensorMeta(info.shape, x.dtype)], {"placement": placement, "sbp": sbp})
        src, dst = Layout(info.placement, info.sbp), Layout(out.placement, out.sbp)
        if src == dst:
            return x
        return box(x, dst, f"to_global {src.short()} -> {dst.short()}")
    if placement is None or sbp is None:
        raise ArgumentTypeError("to_global of a local tensor needs both placement= and sbp=")
    (out,) = op.infer([TensorMeta(tuple(x.shape), x.dtype)], {"placement": placement, "sbp": sbp})
    return local_to_global(x, placement, out.sbp)   # the logical shape: from the ranks' local shapes


def box(x: Tensor, dst: Layout, what: str) -> Tensor:
    """Box global ``x`` to layout ``dst`` (the chain picks the plan)."""
    info = x._global
    src = layout_of(x)
    ctx = BoxingContext(env.get_rank(), info.shape, x.dtype, what)
    plan = plan_for(src, dst, tuple(info.shape))
    piece = to_local(x) if src.placement.has(ctx.rank) else None
    return make_global(run_boxing_steps(plan, piece, ctx), dst.placement, dst.sbp, info.shape, x.dtype)


def _logical_shape(shapes: dict, placement: Placement, nd: tuple) -> tuple:
    """The logical shape the ranks' local shapes make (``shapes``: rank -> shape), or ShapeError.

    Along a B axis only coordinate 0's tensor counts (its data is everyone's); the
    pieces along the axes that split dim d partition it.
    """
    def coords(r):
        return placement.coordinates(placement.parallel_id(r))

    b_axes = {a for a, s in enumerate(nd) if s.is_broadcast}
    sources = [r for r in placement.flat_ranks if all(c == 0 for a, c in enumerate(coords(r)) if a in b_axes)]
    listed = [list(shapes[r]) for r in sources]
    if len({len(shapes[r]) for r in sources}) != 1:
        raise ShapeError(f"to_global: the ranks' local tensors {listed} have different numbers of dims")
    first = shapes[sources[0]]
    logical = list(first)
    for d in range(len(first)):
        axes = {a for a, s in enumerate(nd) if s.is_split and s.dim == d}
        if axes:
            logical[d] = sum(shapes[r][d] for r in sources if all(c == 0 for a, c in enumerate(coords(r))
                                                                 if a not in axes))
    for r in sources:
        if tuple(shapes[r]) != piece_shape(tuple(logical), nd, placement.hierarchy, coords(r)):
            dims = sorted({s.dim for s in nd if s.is_split})
            raise ShapeError(f"to_global: the ranks' local shapes {listed} cannot form one logical tensor with sbp "
                             f"{nd}: sizes of tensors in dimension(s) {dims} must be the same or match the balanced "
                             "split distribution, and every other dimension the same")
    for r in placement.flat_ranks:   # along a B axis every rank's tensor must be the same shape (OneFlow's
        want = piece_shape(tuple(logical), nd, placement.hierarchy, coords(r))   # check_meta_consistency)
        if tuple(shapes[r]) != want:
            everyone = {q: list(shapes[q]) for q in placement.flat_ranks}
            raise ShapeError(f"to_global: rank {r}'s local tensor has shape {list(shapes[r])}, but with sbp {nd} "
                             f"its piece must be {list(want)} (every rank's: {everyone}); along a broadcast axis "
                             "the ranks must hold tensors of one shape")
    return tuple(logical)


def local_to_global(x: Tensor, placement: Placement, nd: tuple) -> Tensor:
    """OneFlow's RawLocalToGlobal: this rank's tensor is its piece (B: parallel_id 0's data wins)."""
    rank, world = env.get_rank(), env.get_world_size()
    member = placement.has(rank)
    group = tuple(range(world))
    desc = describe_call(f"to_global (local -> {', '.join(s.short() for s in nd)} on {placement})", (), "", "")
    everyone = exchange(group, desc, (tuple(x.shape), str(x.dtype)) if member else None)
    shapes = {r: tuple(p[0]) for r, p in zip(group, everyone) if p is not None}
    dtypes = {p[1] for p in everyone if p is not None}
    if len(dtypes) != 1:
        raise DTypeError(f"to_global: the ranks' local tensors have different dtypes {sorted(dtypes)}")
    logical = _logical_shape(shapes, placement, nd)
    dtype = np.dtype(dtypes.pop())
    piece = None
    if any(s.is_broadcast for s in nd):
        piece = _broadcast_from_coordinate_zero(x if member else None, placement, nd, logical, dtype)
    elif member:
        piece = x if x.device is placement.device() else x.to(placement.device())
    return make_global(piece, placement, nd, logical, dtype)


def _broadcast_from_coordinate_zero(x, placement: Placement, nd: tuple, logical: tuple, dtype):
    """Along every B axis, the piece of coordinate 0 is everyone's (OneFlow: B takes parallel_id 0's data)."""
    rank = env.get_rank()
    if not placement.has(rank):
        return None
    b_axes = [a for a, s in enumerate(nd) if s.is_broadcast]
    coords = placement.coordinates(placement.parallel_id(rank))

    def source_of(r):
        c = placement.coordinates(placement.parallel_id(r))
        return placement.flat_ranks[_flat_index(tuple(0 if a in b_axes else v for a, v in enumerate(c)),
                                                placement.hierarchy)]

    group = placement.flat_ranks
    me = piece_shape(logical, tuple(s if s.is_split else SbpParallel("broadcast") for s in nd),
                     placement.hierarchy, coords)
    transport = env.current().transport
    seq = transport.next_seq(group)
    desc = describe_call("to_global (local -> B: parallel_id 0's data)", logical, dtype, f"group {list(group)}")
    mine_is_source = source_of(rank) == rank

    def call(*arrays):
        payloads = transport.exchange(group, seq, desc, arrays[0] if arrays else None)
        return np.array(payloads[group.index(source_of(rank))], copy=True).reshape(me)

    result = collective(call, [x] if mine_is_source else [], me, dtype, desc, group, seq)
    return result if result.device is placement.device() else result.to(placement.device())


def _flat_index(coords: tuple, hierarchy: tuple) -> int:
    index = 0
    for c, size in zip(coords, hierarchy):
        index = index * size + c
    return index


def global_numpy(x: Tensor) -> np.ndarray:
    """The whole logical value of global ``x``, on every rank (every rank must call it)."""
    whole = box(x, _everywhere(env.get_world_size()), _numpy_call(x._global, x.dtype))
    return to_local(whole).numpy()


@functools.lru_cache(maxsize=64)
def _everywhere(world_size: int) -> Layout:
    """B on every rank's cpu: where ``numpy()`` boxes a tensor (made once per world size)."""
    return Layout(Placement.all("cpu"), (SbpParallel("broadcast"),))


@functools.lru_cache(maxsize=1024)
def _numpy_call(info: GlobalInfo, dtype) -> str:
    """What ``numpy()`` of a tensor of ``info`` and ``dtype`` calls its boxing (``loss.item()`` every step)."""
    return f"numpy() of {dtype}{list(info.shape)} ({info.layout.short()})"


def global_tensor(data, dtype=None, placement=None, sbp=None) -> Tensor:
    """``flow.tensor(data, placement=, sbp=)``: ``data`` is the logical tensor, the same on every rank."""
    from pyflow.framework.tensor import tensor as local_tensor

    if placement is None or sbp is None:
        raise ArgumentTypeError("tensor(): a global tensor needs both placement= and sbp=")
    rank = env.get_rank()
    if not isinstance(placement, Placement):
        raise ArgumentTypeError(f"tensor(): placement must be a flow.placement, got {type(placement).__name__}")
    local = local_tensor(data, dtype=dtype, device=placement.device() if placement.has(rank) else "cpu")
    nd = checked_layout(local.shape, placement, sbp, "tensor")
    # No exchange of local shapes first (local_to_global's, which waits for the other ranks): every rank
    # holds the whole logical tensor, and the broadcast's descriptor names its shape and dtype, which
    # the transport checks across the ranks, so a rank with other data still fails on every rank.
    all_b = (SbpParallel("broadcast"),) * len(placement.hierarchy)
    piece = _broadcast_from_coordinate_zero(local if placement.has(rank) else None, placement, all_b,
                                            tuple(local.shape), local.dtype)
    return to_global(make_global(piece, placement, all_b, tuple(local.shape), local.dtype), placement, nd)
