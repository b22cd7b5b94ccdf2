"""The tape: which op made which tensor, and what it needs for its backward (micrograd's idea, PyTorch's shape).

When an op runs on tensors that require grad (and grad mode is on), its outputs
get a ``Node``: the op's backward rule, the saved inputs and outputs, and one
**edge** per input that requires grad, to that input's own node (or, for a
leaf, to its ``AccumulateGrad``).  Backward walks these edges from the loss.

* ``AutogradMeta`` - what a tensor knows: ``requires_grad``, ``grad``, ``grad_fn``
  (None for a leaf), which output of its node it is, ``retains_grad``;
* ``Node``        - one recorded op; ``saved`` holds detached copies of the
  tensor *handles* (no data is copied) with the version each had, so a backward
  through a tensor changed in place since is a clear error (PyTorch's rule).
  Backward frees them (unless ``retain_graph``); a second backward through the
  node is an error only if its rule reads them (``add``'s does not, as in PyTorch);
* ``AccumulateGrad`` - the node of a leaf: adds the gradient into ``leaf.grad``.

Backward rules are the ops' own (``OpDef.backward``, next to each op in
``pyflow/ops/``): ``rule(ctx, grads) -> input grads``, written with the same
public ops, so backward runs as ordinary VM instructions.
"""

from __future__ import annotations

import functools

import itertools

from pyflow.autograd.mode import is_grad_enabled
from pyflow.errors import AutogradError
from pyflow.framework.grad_mode import requires_grad  # the framework answers it: ops below autograd ask too

__all__ = ["AutogradMeta", "Node", "AccumulateGrad", "Saved", "meta", "requires_grad"]

_serials = itertools.count()


class AutogradMeta:
    """A tensor's autograd state (``Tensor._autograd``)."""

    __slots__ = ("requires_grad", "grad", "grad_fn", "output_nr", "retains_grad", "accumulator", "leaf_base",
                 "base", "post_accumulate_hooks")

    def __init__(self, requires_grad: bool = False, grad_fn=None, output_nr: int = 0):
        self.requires_grad = requires_grad
        self.grad = None
        self.grad_fn = grad_fn
        self.output_nr = output_nr
        self.retains_grad = False
        self.accumulator = None  # a leaf's AccumulateGrad, made once
        self.leaf_base = None    # a view of a leaf that requires grad: that leaf's description (no in-place)
        self.base = None         # a view of a tensor computed from others: its description (no in-place yet)
        self.post_accumulate_hooks = None   # a leaf's hooks run after backward updated its .grad: {key: fn}


def meta(t):
    """``t``'s AutogradMeta, made on first use."""
    if t._autograd is None:
        t._autograd = AutogradMeta()
    return t._autograd


class Saved:
    """A tensor a backward rule needs, and the version it had when it was saved.

    It is kept detached (no history), so the tape holds no cycle; a rule that runs
    under ``create_graph`` (grad mode on) gets it back *with* its history (an
    input's ``AutogradMeta``; an output's is its own node), so the gradient it
    computes can be differentiated again.
    """

    __slots__ = ("tensor", "version", "name", "history")

    def __init__(self, t, name: str, history=None):
        self.tensor = t.detach()
        self.version = t._versions.value
        self.name = name
        self.history = history

    def unpack(self, op: str, history=None):
        if self.tensor._versions.value != self.version:
            raise AutogradError(
                f"one of the tensors needed to compute the gradient of {op!r} ({self.name}, "
                f"{self.tensor.dtype}{list(self.tensor.shape)}) was modified by an in-place operation: it is at "
                f"version {self.tensor._versions.value}, expected version {self.version}. Do the in-place "
                "operation on a .clone(), or after backward")
        history = history or self.history
        if history is None or not is_grad_enabled():
            return self.tensor
        with_history = self.tensor.detach()
        with_history._autograd = history
        return with_history


class Node:
    """One recorded op: its backward rule, what the rule needs, and the edges to its inputs' nodes."""

    def __new__(cls, name: str, *args, **kwargs):
        """A node of op ``mul`` is a ``MulBackward0`` (a subclass made once per op), so that
        ``type(y.grad_fn).__name__`` reads as PyTorch's does."""
        if cls is Node:
            cls = _backward_class(name)
        return super().__new__(cls)

    def __init__(self, name: str, rule, inputs, outputs, attrs: dict):
        self.serial = next(_serials)
        self.op_name = name
        self.rule = rule
        self.attrs = attrs
        self.n_outputs = len(outputs)
        self.output_shapes = [tuple(o.shape) for o in outputs]
        self.output_dtypes = [o.dtype for o in outputs]
        self.output_places = [_layout(o) or o.device for o in outputs]   # for zeros of an unused output
        # per input: its edge (node, output_nr) if it requires grad, else None; Python scalars: None
        self.edges = [edge_of(x) if requires_grad(x) else None for x in inputs]
        self.input_shapes = [tuple(x.shape) if hasattr(x, "shape") else None for x in inputs]
        self.input_dtypes = [x.dtype if hasattr(x, "dtype") else None for x in inputs]
        self.input_layouts = [_layout(x) for x in inputs]
        self.input_places = [_layout(x) or x.device if hasattr(x, "_blob") else None for x in inputs]
        self.saved_inputs = [Saved(x, f"input {i}", x._autograd) if hasattr(x, "_blob") else x
                             for i, x in enumerate(inputs)]
        self.saved_outputs = [Saved(o, f"output {i}") for i, o in enumerate(outputs)]
        self.retained: dict = {}  # output_nr -> weakref of an output that called retain_grad()
        self.freed = False

    # --- what a rule sees (ctx) -------------------------------------------------------------------

    @property
    def inputs(self) -> "_Unpacked":
        """The op's inputs, each checked (its version) when the rule reads it: ``ctx.inputs[1]``
        checks only input 1, so an input the rule does not need may have changed since (as in PyTorch,
        which saves only what a formula needs)."""
        self._check_not_freed()
        return _Unpacked(self.saved_inputs, self)

    @property
    def outputs(self) -> "_Unpacked":
        self._check_not_freed()
        return _Unpacked(self.saved_outputs, self, outputs=True)

    def zeros_like_input(self, i: int, dtype=None):
        """Zeros of input ``i``'s shape where it was (its device, or its placement, broadcast)."""
        return zeros_at(self.input_shapes[i], dtype or self.input_dtypes[i], self.input_places[i])

    def needs_grad(self, i: int) -> bool:
        """Does input ``i`` want a gradient (a rule may skip computing the others)?"""
        return self.edges[i] is not None

    def _check_not_freed(self) -> None:
        if self.freed:
            raise AutogradError(f"backward through {self.op_name!r} a second time: its saved tensors were freed by the "
                                "first backward; pass retain_graph=True to the first backward() to keep them")

    def free(self) -> None:
        self.saved_inputs = self.saved_outputs = None
        self.freed = True

    def __repr__(self) -> str:
        return f"<{type(self).__name__} #{self.serial}>"   # PyTorch's name; the serial tells nodes apart

    def name(self) -> str:
        """PyTorch's name of this node: ``MulBackward0``."""
        return type(self).__name__

    @property
    def next_functions(self) -> tuple:
        """``((node, output_nr), ...)`` per input, as PyTorch's: where each input's gradient goes (a leaf's
        ``AccumulateGrad``), ``(None, 0)`` for an input that needs none."""
        return tuple(edge if edge is not None else (None, 0) for edge in self.edges)


class _Unpacked:
    """A read-only list of saved values, unpacked (version-checked) one by one as they are read."""

    def __init__(self, saved: list, node, outputs: bool = False):
        self._saved, self._node, self._outputs = saved, node, outputs

    def _history(self, i):
        """An output's history is its own node's (made when asked: the node holds no cycle)."""
        return AutogradMeta(requires_grad=True, grad_fn=self._node, output_nr=i) if self._outputs else None

    def __getitem__(self, i):
        s = self._saved[i]
        if not isinstance(s, Saved):
            return s
        return s.unpack(self._node.op_name, self._history(i))

    def __len__(self) -> int:
        return len(self._saved)

    def __iter__(self):
        return (self[i] for i in range(len(self._saved)))


@functools.lru_cache(maxsize=None)
def _backward_class(op_name: str) -> type:
    """``Node``'s subclass for one op: ``mul`` -> ``MulBackward0``, ``reduce_sum`` -> ``SumBackward0`` (no
    behaviour of its own: a name)."""
    short = op_name[len("reduce_"):] if op_name.startswith("reduce_") else op_name
    camel = "".join(part[:1].upper() + part[1:] for part in short.split("_")) or "Op"
    return type(f"{camel}Backward0", (Node,), {"__module__": __name__})


class AccumulateGrad:
    """A leaf's node: backward adds the incoming gradient into ``leaf.grad``."""

    op_name = "AccumulateGrad"
    next_functions = ()

    def name(self) -> str:
        return "AccumulateGrad"

    def __init__(self, leaf):
        import weakref

        self.leaf = weakref.ref(leaf)
        self.serial = next(_serials)
        self.edges = []

    def __repr__(self) -> str:
        return f"<AccumulateGrad #{self.serial}>"


def zeros_at(shape, dtype, place):
    """Zeros of ``shape`` at ``place``: a device, or a global tensor's (placement, sbp) (split where it is
    split, else broadcast: the split's consumers get their rows with no slicing, B and P take B's zeros)."""
    from pyflow.framework.creation import zeros
    from pyflow.framework.interpreter import global_interpreter

    if isinstance(place, tuple):   # filled on every rank, nothing sent (flow.zeros broadcasts parallel_id 0's)
        placement, sbp = place
        return global_interpreter().full(shape, 0, dtype, placement,
                                         tuple(s if s.is_split else type(s)("broadcast") for s in sbp))
    return zeros(shape, dtype=dtype, device=place)


def edge_of(t) -> tuple:
    """(node, output_nr) where the gradient for ``t`` goes."""
    info = meta(t)
    if info.grad_fn is not None:
        return info.grad_fn, info.output_nr
    if info.accumulator is None:
        info.accumulator = AccumulateGrad(t)
    return info.accumulator, 0


def _layout(x):
    info = getattr(x, "_global", None)
    return None if info is None else (info.placement, info.sbp)
