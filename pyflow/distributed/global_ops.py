"""The global interpreter (OneFlow's EagerGlobalInterpreter): one op call on global tensors.

``pyflow.framework.interpreter.apply`` hands an op here when an input is global.
On every rank, in the same order:

1. **checks**: no local tensor mixed in, every input on one placement;
2. **logical inference**: type promotion and the op's own inference on the
   logical shapes and dtypes (``interpreter.infer_logical``, the prologue every
   interpreter shares), so every rank knows the result's shape;
3. **SBP signature**: the cheapest of the op's candidates for the inputs' current
   SBPs (``signatures.py``; ``last_signature`` keeps the choice for tests and
   tutorials).  Steps 2 and 3 run once per kind of call (op, logical shapes, dtypes, SBPs, attributes,
   placement) and are then looked up, as OneFlow's GlobalTensorInferCache;
4. **boxing**: every input is boxed to the signature's SBP (``boxing.py``); the
   latest boxing of an input is kept while the input lives, and reused (``_boxed``);
5. **the op, piece by piece**: the local interpreter runs it on this rank's
   pieces; a rank outside the placement runs nothing;
6. the outputs are global, with the signature's output SBPs.  With ``out=``
   (in-place ops), each result is boxed to its output's layout and copied into
   its piece.
"""

from __future__ import annotations

import weakref

import numpy as np

from pyflow import env
from pyflow.distributed.boxing_steps import Layout
from pyflow.distributed.global_tensor import (box, global_numpy, global_tensor, layout_of, make_global, to_global,
                                              to_local)
from pyflow.distributed.signatures import choose_signature
from pyflow.errors import DeviceError, ShapeError
from pyflow.framework import interpreter
from pyflow.framework.args import describe
from pyflow.framework.dtypes import to_scalar
from pyflow.framework.op_registry import get_op
from pyflow.framework.sbp import SbpParallel
from pyflow.framework.tensor import Tensor

__all__ = ["GlobalInterpreter"]


_inferred: dict = {}      # call key -> (dtypes, metas, Signature), shared by the ranks of a process
_CACHE_LIMIT = 4096       # keys kept (cleared when full: a cache, not a leak)
_boxed_inputs = weakref.WeakKeyDictionary()   # a source's storage handle -> _BoxedInput, the latest boxing of it


class _BoxedInput:
    """An op input as it was boxed, kept while its source's storage lives (``_boxed``)."""

    __slots__ = ("blob", "info", "version", "dst", "result", "result_version")

    def __init__(self, x: Tensor, dst: Layout, result: Tensor):
        self.blob, self.info, self.version = x._blob, x._global, x._versions.value
        self.dst, self.result, self.result_version = dst, result, result._versions.value

    def holds(self, x: Tensor, dst: Layout) -> bool:
        """Is this ``x`` (the same piece, layout and contents) boxed to ``dst``, and the result untouched?"""
        return (self.blob is x._blob and self.info == x._global and self.version == x._versions.value
                and self.dst == dst and self.result_version == self.result._versions.value)


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


def _typed(value):
    """An attribute as part of a key, with its type (``1`` and ``1.0`` infer different dtypes)."""
    return tuple(_typed(v) for v in value) if type(value) is tuple else (type(value), value)


def _call_key(name: str, inputs: list, attrs: dict, placement) -> tuple:
    """What steps 2-3 depend on: the op, each input's logical shape, dtype and SBP (a Python number's
    type), the attributes and the placement (unhashable if an attribute is: then not cached)."""
    return (name, placement,
            tuple((x._global.shape, x.dtype, x._global.sbp) if isinstance(x, Tensor) else type(x) for x in inputs),
            tuple((k, _typed(v)) for k, v in attrs.items()))


def _infer(op, inputs: list, attrs: dict, placement) -> tuple:
    """Steps 2-3 (logical inference, SBP signature), once per call key (OneFlow's GlobalTensorInferCache).

    A training step calls the same ops on the same logical shapes and SBPs every step, and every rank
    makes the same choice, so the cost model runs once per kind of call, not per rank per step.
    """
    key = _call_key(op.name, inputs, attrs, placement)
    try:
        found = _inferred.get(key)   # hashed once: the key holds placements and SBPs, hashed field by field
    except TypeError:                # an attribute that is not hashable: inferred every time
        key = found = None
    if found is not None:
        return found
    dtypes, metas = interpreter.infer_logical(op, inputs, attrs)
    shapes = [tuple(x.shape) if isinstance(x, Tensor) else None for x in inputs]
    current = [x._global.sbp if isinstance(x, Tensor) else None for x in inputs]
    signature = choose_signature(op.name, shapes, [np.dtype(d) for d in dtypes], [m.shape for m in metas], attrs,
                                 current, placement.hierarchy)
    found = (dtypes, metas, signature)
    if key is not None:
        if len(_inferred) >= _CACHE_LIMIT:
            _inferred.clear()
        _inferred[key] = found
    return found


class GlobalInterpreter:
    """Runs ops on global tensors; installed into ``pyflow.framework.interpreter``."""

    def __init__(self):
        self._last = weakref.WeakKeyDictionary()  # rank context -> (op name, Signature)

    @property
    def last_signature(self):
        """(op name, Signature) of the calling rank's latest global op (for tutorials and tests)."""
        return self._last.get(env.current())

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
        made = sbp if value == 0 else tuple(SbpParallel("broadcast") if s.is_partial else s for s in sbp)
        piece = None
        if placement.has(rank):
            piece = interpreter.apply("fill", [], shape=Layout(placement, made).piece_shape(rank, shape), dtype=dtype,
                                      value=to_scalar(value, dtype, "full"), device=placement.device(rank))[0]
        filled = make_global(piece, placement, made, shape, dtype)
        return filled if made == sbp else to_global(filled, placement, sbp)

    def apply(self, name: str, inputs, out, attrs) -> list:
        op = get_op(name)
        inputs = list(inputs)
        tensors = [x for x in inputs if isinstance(x, Tensor)]
        local = [t for t in tensors + list(out or ()) if t._global is None]
        if local:
            raise DeviceError(f"op {name!r}: global and local tensors mixed ({'; '.join(describe(t) for t in inputs if isinstance(t, Tensor))}); "
                              "make the local ones global with .to_global(placement, sbp)")
        placement = tensors[0]._global.placement
        if any(t._global.placement is not placement and t._global.placement != placement for t in tensors):
            listed = "; ".join(describe(t) for t in tensors)
            raise DeviceError(f"op {name!r}: inputs on different placements ({listed}); box them onto one with "
                              ".to_global(placement=...) first")
        dtypes, metas, signature = _infer(op, inputs, attrs, placement)
        self._last[env.current()] = (name, signature)
        boxed = []
        for x, nd in zip(inputs, signature.inputs):
            if isinstance(x, Tensor) and x._global.sbp != nd:
                x = _boxed(x, Layout(placement, nd), name)
            boxed.append(x)
        if placement.has(env.get_rank()):
            pieces = interpreter.apply(name, [to_local(x) if isinstance(x, Tensor) else x for x in boxed], **attrs)
        else:
            pieces = [None] * len(metas)
        results = [make_global(p, placement, nd, m.shape, m.dtype)
                   for p, nd, m in zip(pieces, signature.outputs, metas)]
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
