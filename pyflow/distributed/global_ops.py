"""The global interpreter (OneFlow's EagerGlobalInterpreter): one op call on global tensors.

``pyflow.framework.interpreter.apply`` hands an op here when an input is global.
On every rank, in the same order:

1. **checks**: no local tensor mixed in, every input on one placement;
2. **logical inference**: type promotion and the op's own inference on the
   logical shapes and dtypes (``interpreter.infer_logical``, the prologue every
   interpreter shares), so every rank knows the result's shape;
3. **SBP signature**: the cheapest of the op's candidates for the inputs' current
   SBPs (``signatures.py``; ``last_signature`` keeps the choice for tests and
   tutorials);
4. **boxing**: every input is boxed to the signature's SBP (``boxing.py``); the
   latest boxing of an input is kept while the input lives, and reused (``_boxed``);
5. **the op, piece by piece**: the local interpreter runs it on this rank's
   pieces (``interpreter.apply_local``: the call was routed and recorded
   already); a rank outside the placement runs nothing;
6. the outputs are global, with the signature's output SBPs.  With ``out=``
   (in-place ops), each result is boxed to its output's layout and copied into
   its piece.

**Once per kind of call.**  Steps 1-3 depend only on the op, each input's layout, logical
shape and dtype, and the attributes: a training step makes the same calls every step, on
every rank.  So they run once per such key and their outcome is kept (a ``_Call``, as
OneFlow's GlobalTensorInferCache): the signature, which inputs to box to which layout, each
output's ``GlobalInfo`` (one object, reused by every call: its hash is worked out once, and
the next call's key compares it by identity) and the placement's ranks.  A repeated call
hashes its key (a ``GlobalInfo`` per input), boxes the inputs the key says, wraps the pieces
and runs them: about ten Python calls besides the local op (``tests/test_global_call_cache.py``
counts them), against about forty when every call was checked, inferred and wrapped anew.
"""

from __future__ import annotations

import functools
import threading
import weakref

import numpy as np

from pyflow import env
from pyflow.distributed.boxing_steps import Layout
from pyflow.distributed.global_tensor import (GlobalInfo, as_global, box, global_numpy, global_tensor, layout_of,
                                              make_global, to_global, to_local)
from pyflow.distributed.signatures import choose_signature
from pyflow.errors import DeviceError, ShapeError
from pyflow.framework import interpreter
from pyflow.framework.args import describe
from pyflow.framework.dtypes import to_scalar
from pyflow.framework.op_registry import get_op
from pyflow.framework.sbp import SbpParallel
from pyflow.framework.tensor import Tensor

__all__ = ["GlobalInterpreter"]


_calls: dict = {}         # call key -> _Call, shared by the ranks of a process
_CACHE_LIMIT = 4096       # keys kept (cleared when full: a cache, not a leak)
cache_stats = {"hits": 0, "misses": 0}   # lookups of _calls (tests count them: a repeated step only hits)
_boxed_inputs = weakref.WeakKeyDictionary()   # a source's storage handle -> _BoxedInput, the latest boxing of it
_latest = threading.local()   # the calling thread's latest call: (its rank context, weakly; op name; Signature)


class _BoxedInput:
    """An op input as it was boxed, kept while its source's storage lives (``_boxed``)."""

    __slots__ = ("blob", "info", "version", "dst", "result", "result_version")

    def __init__(self, x: Tensor, dst: Layout, result: Tensor):
        self.blob, self.info, self.version = x._blob, x._global, x._versions.value
        self.dst, self.result, self.result_version = dst, result, result._versions.value

    def holds(self, x: Tensor, dst: Layout) -> bool:
        """Is this ``x`` (the same piece, layout and contents) boxed to ``dst``, and the result untouched?"""
        return (self.blob is x._blob and (self.info is x._global or self.info == x._global)
                and self.version == x._versions.value and self.dst == dst
                and self.result_version == self.result._versions.value)


def _boxed(x: Tensor, dst: Layout, name: str) -> Tensor:
    """Op input ``x`` boxed to ``dst``; the same tensor as last time if ``x`` was boxed so before, unchanged.

    A backward rule reads the inputs its forward saved, unboxed, and boxes them again: the mean of a
    data-parallel loss divides by the all-reduced count of its samples (a partial sum boxed to B)
    in the forward and again in the backward, a second collective for the same value.  Boxing is a
    function of the source's contents and layouts, so the latest boxing of each source is kept
    while its storage lives (keyed by its storage handle; a view is another blob, a write bumps the
    version) and reused, at the cost of the boxed copy's memory while the source lives.  Every rank
    runs the same ops on the same tensors, so every rank finds the same entries and skips the same
    collectives.
    """
    handle = x._handle
    found = _boxed_inputs.get(handle) if handle is not None else None
    if found is not None and found.holds(x, dst):
        return found.result
    result = box(x, dst, f"op {name!r}: input {describe(x)} -> {dst.sbp}")
    if handle is not None and result._handle is not handle:   # a result over x's own memory would keep it alive
        _boxed_inputs[handle] = _BoxedInput(x, dst, result)
    return result


def _typed(value: tuple) -> tuple:
    """A tuple attribute as part of a key, with its items' types (``1`` and ``1.0`` infer different dtypes):
    ``(types, value)``, the types taken by ``map`` (no Python call per item); a nested tuple recursively."""
    types = tuple(map(type, value))
    if tuple not in types:
        return types, value
    return tuple(_typed(v) if type(v) is tuple else (type(v), v) for v in value)


def _call_key(name: str, inputs: list, attrs: dict) -> tuple:
    """What steps 1-3 depend on: the op, each tensor input's layout and logical shape (its ``GlobalInfo``,
    whose hash is worked out once; None for a local tensor, which fails the checks, and a call that fails
    is never kept) and dtype, each Python number's type, and the attributes with their types.  Plain
    loops: it runs on every global op call, and a generator is a Python call of its own."""
    key = [name]
    for x in inputs:
        key.append((x._global, x._blob.dtype) if isinstance(x, Tensor) else type(x))
    for k, v in attrs.items():
        key.append((k, _typed(v)) if type(v) is tuple else (k, type(v), v))
    return tuple(key)


class _Call:
    """What steps 1-3 decided for one kind of call, and what step 4-6 need of it, worked out once.

    ``signature``: the SBP signature; ``boxings``: ``(input index, Layout)`` for each input whose SBP is
    not the signature's (the key holds the inputs' SBPs, so which inputs to box is part of the kind of
    call); ``outputs``: each output's ``GlobalInfo`` and dtype (the same objects every call: their hash
    is computed once, and the next op's key compares them by identity); ``members``: the placement's ranks.
    """

    __slots__ = ("op", "placement", "signature", "boxings", "outputs", "members", "tensors")

    def __init__(self, op, placement, inputs: list, metas: list, signature):
        self.op, self.placement, self.signature = op, placement, signature
        self.members, self.tensors = frozenset(placement.flat_ranks), sum(isinstance(x, Tensor) for x in inputs)
        self.boxings = tuple((i, Layout(placement, nd)) for i, (x, nd) in enumerate(zip(inputs, signature.inputs))
                             if isinstance(x, Tensor) and x._global.sbp != nd)
        self.outputs = tuple((GlobalInfo(placement, tuple(nd), tuple(m.shape)), np.dtype(m.dtype))
                             for nd, m in zip(signature.outputs, metas))


def _check(name: str, inputs: list, out) -> None:
    """Step 1: every tensor global (outputs too), every input on one placement."""
    tensors = [x for x in inputs if isinstance(x, Tensor)]
    local = [t for t in tensors + list(out or ()) if t._global is None]
    if local:
        listed = "; ".join(describe(t) for t in inputs if isinstance(t, Tensor))
        raise DeviceError(f"op {name!r}: global and local tensors mixed ({listed}); "
                          "make the local ones global with .to_global(placement, sbp)")
    placement = tensors[0]._global.placement
    if any(t._global.placement is not placement and t._global.placement != placement for t in tensors):
        listed = "; ".join(describe(t) for t in tensors)
        raise DeviceError(f"op {name!r}: inputs on different placements ({listed}); box them onto one with "
                          ".to_global(placement=...) first")


def _plan(name: str, inputs: list, attrs: dict) -> _Call:
    """Steps 1-3 for a call not seen before: the checks, logical inference, the SBP signature."""
    _check(name, inputs, None)
    placement = next(x._global.placement for x in inputs if isinstance(x, Tensor))
    op = get_op(name)
    dtypes, metas = interpreter.infer_logical(op, inputs, attrs)
    shapes = [tuple(x.shape) if isinstance(x, Tensor) else None for x in inputs]
    current = [x._global.sbp if isinstance(x, Tensor) else None for x in inputs]
    signature = choose_signature(name, shapes, [np.dtype(d) for d in dtypes], [m.shape for m in metas], attrs,
                                 current, placement.hierarchy)
    return _Call(op, placement, inputs, metas, signature)


def _call(name: str, inputs: list, attrs: dict) -> _Call:
    """Steps 1-3, once per call key (OneFlow's GlobalTensorInferCache).

    A training step calls the same ops on the same logical shapes and SBPs every step, and every rank
    makes the same choice, so the checks and the cost model run once per kind of call, not per rank per
    step: a call whose key was seen passed the same checks, and is decided.
    """
    key = _call_key(name, inputs, attrs)
    try:
        found = _calls.get(key)
    except TypeError:                # an attribute that is not hashable: decided every time
        key = found = None
    if found is not None:
        cache_stats["hits"] += 1
        return found
    cache_stats["misses"] += 1
    found = _plan(name, inputs, attrs)
    if key is not None:
        if len(_calls) >= _CACHE_LIMIT:
            _calls.clear()
        _calls[key] = found
    return found


@functools.lru_cache(maxsize=1024)
def _constant_layout(shape: tuple, placement, sbp: tuple, zero: bool, rank: int) -> tuple:
    """What ``GlobalInterpreter.full`` fills on ``rank``: (the SBP it fills, its piece's shape or None off the
    placement), worked out once per kind of constant (autograd makes the same ones every step)."""
    made = sbp if zero else tuple(SbpParallel("broadcast") if s.is_partial else s for s in sbp)
    return made, Layout(placement, made).piece_shape(rank, shape) if placement.has(rank) else None


class GlobalInterpreter:
    """Runs ops on global tensors; installed into ``pyflow.framework.interpreter``."""

    @property
    def last_signature(self):
        """(op name, Signature) of the calling rank's latest global op on this thread (tutorials and tests)."""
        latest = getattr(_latest, "call", None)
        return latest[1:] if latest is not None and latest[0]() is env.current() else None

    def numpy(self, x: Tensor) -> np.ndarray:
        return global_numpy(x)

    def tensor(self, values: np.ndarray, dtype, placement, sbp) -> Tensor:
        """A global tensor whose logical value is ``values`` (the same on every rank)."""
        return global_tensor(values, dtype, placement, sbp)

    def scalar(self, value, dtype, placement) -> Tensor:
        """A Python number as a 0-d global B tensor (every rank knows it: no communication)."""
        piece = Tensor._empty(placement.device(env.get_rank()), (), np.dtype(dtype)) \
            if placement.has(env.get_rank()) else None
        if piece is not None:
            piece.fill_(value)
        return make_global(piece, placement, (SbpParallel("broadcast"),) * len(placement.hierarchy), (), dtype)

    def full(self, shape: tuple, value, dtype, placement, sbp) -> Tensor:
        """A global tensor of ``shape`` filled with ``value``, each rank filling its own piece: nothing sent.

        Every rank knows a constant, so no rank needs parallel_id 0's data (``tensor`` above broadcasts
        it, since there the ranks' data may differ): as OneFlow's global constant op, each rank fills
        its piece, of its piece's shape for B and S(k).  A P axis of a nonzero value is filled B (split
        axes kept split: (B, B) -> (P, S) would send), then boxed on the rank (every piece but those at
        coordinate 0 of the P axis zeroed).  Autograd's seed gradients and missing gradients' zeros
        are made this way every step.
        """
        rank, dtype, shape, sbp = env.get_rank(), np.dtype(dtype), tuple(shape), tuple(sbp)
        made, piece_shape = _constant_layout(shape, placement, sbp, value == 0, rank)
        piece = None
        if piece_shape is not None:
            piece = interpreter.apply("fill", [], shape=piece_shape, dtype=dtype, value=to_scalar(value, dtype, "full"),
                                      device=placement.device(rank))[0]
        filled = make_global(piece, placement, made, shape, dtype)
        return filled if made == sbp else to_global(filled, placement, sbp)

    def apply(self, name: str, inputs, out, attrs) -> list:
        inputs = list(inputs)
        call = _call(name, inputs, attrs)   # steps 1-3, decided once per kind of call
        if out:
            _check(name, inputs, out)
        ctx = env.current()
        _latest.call = (weakref.ref(ctx), name, call.signature)
        for i, dst in call.boxings:
            inputs[i] = _boxed(inputs[i], dst, name)
        if ctx.rank in call.members:
            pieces = interpreter.apply_local(call.op, [to_local(x) if isinstance(x, Tensor) else x for x in inputs],
                                             call.tensors, None, dict(attrs))
        else:
            pieces = [None] * len(call.outputs)
        results = [as_global(piece, info, dtype) for piece, (info, dtype) in zip(pieces, call.outputs)]
        if out is None:
            return results
        return [self._write(o, r) for o, r in zip(out, results)]

    def _write(self, target: Tensor, result: Tensor) -> Tensor:
        """In place on a global tensor: the result, boxed to ``target``'s layout, into its piece."""
        if tuple(result.shape) != tuple(target.shape):
            raise ShapeError(f"in place: the result {describe(result)} does not have the shape of {describe(target)}")
        if layout_of(result) != layout_of(target):
            result = box(result, layout_of(target), f"in place into {describe(target)}")
        if target._global.placement.has(env.get_rank()):
            to_local(target).copy_(to_local(result))
        return target
