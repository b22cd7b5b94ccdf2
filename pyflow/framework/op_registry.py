"""Seed 002: the op registry: each op defined once (OneFlow's user op definition + kernel registry).

An ``OpDef`` says everything the interpreter needs to run an op eagerly:

* ``infer(input_metas, attrs) -> output_metas`` - shapes and dtypes.  It runs at the
  call, so bad input raises there, before any instruction exists;
* ``kernel`` - the name in ``pyflow.kernels.registry`` (per device target; a tuple
  of names gives ``launch`` a tuple of kernels; ``""``: none), and
  ``launch(kernel, outputs, inputs, attrs, stream)``, how to call it (default:
  ``kernel(*outputs, *inputs, **attrs, stream=stream)``);
* ``promote_inputs`` - the inputs that take part in PyTorch's type promotion
  (``pyflow/framework/dtypes.py``): the interpreter casts them (and Python
  scalars given in their place) to the common dtype before the kernel;
  ``floating``: an integer or bool common dtype becomes float32 (true
  division, ``sin`` of an int);
* ``same_view_in_place`` - an output may be the very view an input reads
  (elementwise ops): ``x.add_(y)`` needs no copy of ``x``;
* ``infer_device_and_stream(inputs, attrs) -> (device, stream)`` - only for ops
  that choose their own (copies between devices); others use the default rules;
* ``mutable_inputs`` - inputs the op writes;
* ``on_failed_inputs(attrs, failure)`` - what the op still owes others when an
  input failed and it cannot run (a collective tells its peers, so they do not
  wait for it); by default nothing;
* ``sbp_signatures(shapes, out_shapes, attrs) -> [Signature]`` - the layouts the
  op can run on piece by piece (OneFlow's ``GetSbpFn``; ``pyflow/framework/sbp.py``):
  1-D candidates, ``shapes`` the inputs' logical shapes (None for Python
  scalars); the all-broadcast one is implied.  ``BROADCAST_ONLY``: none but that.
  ``SETS_LAYOUT``: the op is itself a change of layout (``to_global``), its attrs name its
  output's placement and SBP, whatever its input's, so no signature is chosen for it.
  The eager global interpreter and the lazy compiler both pick among them by
  the cost model of ``pyflow/distributed/signatures.py``;
* ``updates_input`` - the op writes only parts of its input ``k`` (``index_copy``,
  ``index_add``...): called with ``out=[input k]`` it changes it in place; called
  without ``out=``, it works on a copy of input ``k`` (the global interpreter
  runs ops that way, piece by piece);
* ``backward(ctx, grads) -> input grads`` - the op's gradient, written with the
  public ops (``ctx.inputs``, ``ctx.outputs``, ``ctx.attrs``, ``ctx.needs_grad(i)``;
  see ``pyflow/autograd/``); ``NO_BACKWARD``: no gradient flows through the op;
* ``view(shape, strides, offset, attrs) -> (shape, strides, offset)`` - only for view ops
  (``permute``, ``reshape``, ``narrow``...; ``pyflow/ops/views.py``): the result is this
  new layout over the input's storage, made with no kernel and no copy, sharing the input's
  version counter (OneFlow's view ops, ``oneflow/core/framework/tensor_methods.cpp``);
* ``utask_lowering(trace, inputs, attrs) -> outputs`` - how the op runs inside a Cocktailer
  persistent kernel: it appends the op's ``UOperator`` s (uTasks over a device function of
  ``kernels/utask/``) to the program ``trace`` records (``pyflow/cocktailer/lowerings.py``).
  ``None``: the op cannot run there, and ``cocktailer.trace`` says so, naming it.

Every op must declare the last two (``register_op`` refuses one left out), so
adding an op means deciding how it splits and how it differentiates, and a
forgotten entry is an error at import, not a silently broadcast-only or
non-differentiable op.

>>> get_op("add").name, "matmul" in OP_REGISTRY
('add', True)
>>> get_op("argmax").differentiable, get_op("cumsum").sbp_signatures
(False, BROADCAST_ONLY)
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

__all__ = ["TensorMeta", "OpDef", "OP_REGISTRY", "register_op", "register_lowering", "get_op", "default_launch",
           "BROADCAST_ONLY", "SETS_LAYOUT", "NO_BACKWARD", "UNDECLARED"]


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    """What shape inference sees of a tensor."""

    shape: tuple
    dtype: np.dtype


def default_launch(kernel, outputs, inputs, attrs, stream) -> None:
    kernel(*outputs, *inputs, **attrs, stream=stream)


class _Marker:
    """A named value an OpDef field takes instead of a function (its repr is its name)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


UNDECLARED = _Marker("UNDECLARED")          # the default of the fields every op must declare
BROADCAST_ONLY = _Marker("BROADCAST_ONLY")  # sbp_signatures: only the all-broadcast signature
SETS_LAYOUT = _Marker("SETS_LAYOUT")        # sbp_signatures: the attrs set the output's placement and SBP
NO_BACKWARD = _Marker("NO_BACKWARD")        # backward: no gradient flows through the op


@dataclasses.dataclass
class OpDef:
    """One op: shape/dtype inference, its kernel, and how the interpreter places it."""

    name: str
    infer: Callable
    kernel: str | None = None
    launch: Callable = default_launch
    infer_device_and_stream: Callable | None = None
    mutable_inputs: tuple = ()
    on_failed_inputs: Callable | None = None
    backward: Callable | _Marker = UNDECLARED
    updates_input: int | None = None
    promote_inputs: tuple = ()
    floating: bool = False
    same_view_in_place: bool = False
    sbp_signatures: Callable | _Marker = UNDECLARED
    kernel_attrs: tuple = ()  # the attrs passed on to the kernel (others only steer inference)
    view: Callable | None = None  # a view op: its result's layout over the input's storage
    utask_lowering: Callable | None = None  # set by pyflow.cocktailer (register_lowering)
    doc: str = ""

    def __post_init__(self):
        if self.kernel is None:
            self.kernel = self.name

    @property
    def differentiable(self) -> bool:
        """Does a gradient flow through the op (has it a backward rule)?"""
        return self.backward is not NO_BACKWARD


OP_REGISTRY: dict[str, OpDef] = {}


_MUST_DECLARE = {   # field -> (the markers it may be instead of a function, what to give)
    "sbp_signatures": ((BROADCAST_ONLY, SETS_LAYOUT), "a function (shapes, out_shapes, attrs) -> [Signature]"),
    "backward": ((NO_BACKWARD,), "a rule (ctx, grads) -> input grads"),
}


def register_op(op: OpDef) -> OpDef:
    """Add ``op`` to the registry (names are unique; ``sbp_signatures`` and ``backward`` declared)."""
    if op.name in OP_REGISTRY:
        raise ValueError(f"op {op.name!r} is registered twice")
    for field, (markers, what) in _MUST_DECLARE.items():
        value = getattr(op, field)
        if all(value is not m for m in markers) and (value is UNDECLARED or not callable(value)):
            raise ValueError(f"op {op.name!r}: {field} is {value!r}; declare it: {what}, or "
                             f"{' or '.join(map(repr, markers))}")
    OP_REGISTRY[op.name] = op
    return op


def register_lowering(name: str, lowering: Callable) -> OpDef:
    """Give op ``name`` its uTask lowering (``OpDef.utask_lowering``); an unknown op or a second lowering
    is an error, as ``register_op`` refuses a second op of one name.

    The lowering is *set on the OpDef* rather than kept in a table of Cocktailer's keyed by op name, so
    that ``get_op("relu")`` stays the one place that says what relu is, including whether it can run
    inside a persistent kernel (a table beside the registry would be a second list of op names, kept in
    step by hand, as the SBP table was).  It is *written* in ``pyflow/cocktailer/`` because it builds
    Cocktailer's IR, a layer above this one: Cocktailer calls this at import (the framework never imports
    it), and its tracer, the only reader of the field, runs only once Cocktailer is imported.
    """
    op = get_op(name)
    if op.utask_lowering is not None:
        raise ValueError(f"op {name!r} already has a uTask lowering")
    op.utask_lowering = lowering
    return op


def get_op(name: str) -> OpDef:
    """The op called ``name``; ``KeyError`` listing the registered ops.

    The registry holds what was registered: the definitions in ``pyflow/ops/`` register
    themselves when imported, which ``import pyflow`` does (this layer sits below them).
    """
    try:
        return OP_REGISTRY[name]
    except KeyError:
        raise KeyError(f"no op {name!r}; registered ops: {', '.join(sorted(OP_REGISTRY))}") from None
