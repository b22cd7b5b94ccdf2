"""Fused optimizer updates: ``sgd_update``, ``momentum_update``, ``adam_update`` (OneFlow's model update ops).

OneFlow's optimizers, eager and ``nn.Graph`` alike, update each parameter with one
op that reads the parameter, its gradient and its state and writes the parameter
and the state in place.  pyflow's do the same (``pyflow/optim``), and so will the
compiler's optimizer pass: the op is defined once, here.  The learning rate and
the step number are **tensor inputs**, not attributes: a graph traced once stays
right when a scheduler changes the lr or Adam's step count grows.

Signatures (inputs in order; attributes by keyword)::

    sgd_update(model, model_diff, learning_rate)
        attrs: weight_decay=0.0, maximize=False
        writes: model
    momentum_update(model, model_diff, momentum_buf, learning_rate, train_step)
        attrs: momentum (required), dampening=0.0, nesterov=False, weight_decay=0.0, maximize=False
        writes: model, momentum_buf
    adam_update(model, model_diff, exp_avg, exp_avg_sq, max_exp_avg_sq, learning_rate, train_step)
        attrs: beta1, beta2, eps (required), weight_decay=0.0, amsgrad=False, maximize=False,
               decoupled_weight_decay=False
        writes: model, exp_avg, exp_avg_sq, and max_exp_avg_sq when amsgrad

* ``model`` is float16, float32 or float64; ``model_diff`` (its gradient) and every
  state tensor have exactly its shape and dtype (no broadcasting, no promotion).
* ``learning_rate``: a 0-d float32 tensor (float64 is accepted too, and is what
  the optimizers pass for float64 models, so that those match PyTorch's float64
  math to the last bits).
* ``train_step``: a 0-d int64 tensor, the 1-based number of this step.
  ``momentum_update`` only asks whether it is 1 (the first step: the buffer
  becomes the gradient, whatever it held); ``adam_update`` computes its bias
  corrections ``1 - beta ** train_step`` from it, inside the kernel.
* ``max_exp_avg_sq`` is read and written only when ``amsgrad``.  Otherwise pass
  any tensor of the model's shape and dtype: ``exp_avg_sq`` itself is the usual
  choice (what ``pyflow.optim.Adam`` does), and is never written twice.
* All inputs are on one device (the interpreter's rule).  The math, and the
  dtype it is done in, are in the kernels' docstrings (``kernels/optim_update.py``):
  PyTorch's ``torch.optim`` formulas, computed in the model's dtype, float16 in
  float32 with one rounding per stored result.

**No outputs.**  As in OneFlow, the ops only write their inputs
(``OpDef.mutable_inputs``): the VM orders each call after every earlier reader
and writer of those tensors and keeps it in stream order.  Returning "the
updated model" would be a second name for the same memory, which a compiled
graph would then have to alias back; an op with no outputs says exactly what
happens.  (``interpreter.apply`` returns ``[]`` for them.)

**Call them through the functions below** (``sgd_update(...)`` etc.), not a
bare ``apply``: the interpreter bumps the version counter only of tensors
written through ``out=``, so these functions bump every tensor the op writes
(autograd's saved-tensor check then sees the write, as after ``p.add_``).  They
also refuse, at the call, what the interpreter cannot see: writing a tensor
that requires grad while grad mode is on (use ``flow.no_grad()``, as the
optimizers do), a written tensor that is a broadcast view or overlaps another
input without being the very same view, and global tensors (pass each global
tensor's local piece, all with one layout, as ``Optimizer.step`` does).  Inside
``nn.Graph.build`` (lazy mode) they only hand the call to ``apply``, which
records it: nothing runs then, so there is nothing to bump or overlap.  Bad
shapes and dtypes raise ``ShapeError`` / ``DTypeError`` naming the op, the
input, its shape and dtype; the op has no gradient (``backward=NO_BACKWARD``).

>>> import pyflow as flow
>>> w = flow.tensor([1.0, 2.0])
>>> lr, step = flow.tensor(0.5), flow.tensor(1, dtype=flow.int64)
>>> buf = flow.zeros(2)
>>> momentum_update(w, flow.tensor([1.0, -1.0]), buf, lr, step, momentum=0.9)
>>> w.tolist(), buf.tolist(), w._version
([0.5, 2.5], [1.0, -1.0], 1)
>>> sgd_update(w, flow.tensor([1.0, 1.0, 1.0]), lr)
Traceback (most recent call last):
...
pyflow.errors.ShapeError: sgd_update: model_diff has shape [3], the model [2]: they must be equal ...
"""

from __future__ import annotations

import numbers

import numpy as np

from pyflow.errors import ArgumentTypeError, AutogradError, DeviceError, DTypeError, ShapeError
from pyflow.framework.args import describe
from pyflow.framework.op_registry import BROADCAST_ONLY, NO_BACKWARD, OpDef, register_op

__all__ = ["sgd_update", "momentum_update", "adam_update", "UPDATE_OPS"]

_FLOAT = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_LR = (np.dtype(np.float32), np.dtype(np.float64))
_STEP = np.dtype(np.int64)


class _Spec:
    """One update op: its inputs' names, which are state (model-shaped), which it writes, its attrs."""

    def __init__(self, name, inputs, written, required=(), optional=(), step=True):
        self.name, self.inputs, self.written = name, inputs, written
        self.required, self.optional, self.step = required, dict(optional), step
        self.model_like = inputs[:inputs.index("learning_rate")]   # model, model_diff, the state

    def infer(self, inputs, attrs) -> list:
        name = self.name
        if len(inputs) != len(self.inputs):
            raise ArgumentTypeError(f"{name}: takes {len(self.inputs)} tensors ({', '.join(self.inputs)}), "
                                    f"got {len(inputs)}")
        missing = [a for a in self.required if a not in attrs]
        unknown = sorted(set(attrs) - set(self.required) - set(self.optional))
        if missing or unknown:
            raise ArgumentTypeError(f"{name}: attributes {', '.join(self.required + tuple(self.optional))}; "
                                    + (f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(unknown)}"))
        for key, value in attrs.items():
            boolean = isinstance(self.optional.get(key), bool)
            if boolean and not isinstance(value, (bool, np.bool_)):
                raise ArgumentTypeError(f"{name}: attribute {key} must be a bool, got {value!r}")
            if not boolean and (not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_))):
                raise ArgumentTypeError(f"{name}: attribute {key} must be a real number, got {value!r}")
        model = inputs[0]
        if model.dtype not in _FLOAT:
            raise DTypeError(f"{name}: the model must be a floating-point tensor (float16, float32, float64), "
                             f"got {model.dtype}{list(model.shape)}")
        for what, meta in zip(self.model_like[1:], inputs[1:]):
            if tuple(meta.shape) != tuple(model.shape):
                raise ShapeError(f"{name}: {what} has shape {list(meta.shape)}, the model {list(model.shape)}: "
                                 "they must be equal (no broadcasting)")
            if meta.dtype != model.dtype:
                raise DTypeError(f"{name}: {what} is {meta.dtype}, the model {model.dtype}: they must be equal "
                                 "(no promotion)")
        lr = inputs[len(self.model_like)]
        if tuple(lr.shape) != () or lr.dtype not in _LR:
            raise DTypeError(f"{name}: learning_rate must be a 0-d float32 (or float64) tensor, got "
                             f"{lr.dtype}{list(lr.shape)}")
        if self.step:
            step = inputs[len(self.model_like) + 1]
            if tuple(step.shape) != () or step.dtype != _STEP:
                raise DTypeError(f"{name}: train_step must be a 0-d int64 tensor (the 1-based step number), got "
                                 f"{step.dtype}{list(step.shape)}")
        return []


SGD = _Spec("sgd_update", ("model", "model_diff", "learning_rate"), written=("model",),
            optional={"weight_decay": 0.0, "maximize": False}, step=False)
MOMENTUM = _Spec("momentum_update", ("model", "model_diff", "momentum_buf", "learning_rate", "train_step"),
                 written=("model", "momentum_buf"), required=("momentum",),
                 optional={"dampening": 0.0, "nesterov": False, "weight_decay": 0.0, "maximize": False})
ADAM = _Spec("adam_update", ("model", "model_diff", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "learning_rate",
                             "train_step"),
             written=("model", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), required=("beta1", "beta2", "eps"),
             optional={"weight_decay": 0.0, "amsgrad": False, "maximize": False, "decoupled_weight_decay": False})
UPDATE_OPS = {spec.name: spec for spec in (SGD, MOMENTUM, ADAM)}

for _spec in UPDATE_OPS.values():
    register_op(OpDef(_spec.name, _spec.infer, mutable_inputs=tuple(_spec.inputs.index(w) for w in _spec.written),
                      kernel_attrs=_spec.required + tuple(_spec.optional), sbp_signatures=BROADCAST_ONLY,
                      backward=NO_BACKWARD,
                      doc=f"fused optimizer update, in place, no outputs: {', '.join(_spec.written)} written"))


# --- the functions to call --------------------------------------------------------------------------


def _run(spec: _Spec, inputs: list, attrs: dict) -> None:
    """Check what the interpreter cannot, issue the op, bump the versions of the tensors it wrote."""
    from pyflow.framework import interpreter
    from pyflow.framework.grad_mode import is_grad_enabled, requires_grad
    from pyflow.framework.interpreter import apply, has_internal_overlap, may_overlap, same_view
    from pyflow.framework.tensor import Tensor

    name = spec.name
    lazy = getattr(interpreter, "_lazy_tracer", None)
    if lazy is not None and lazy.active():   # inside nn.Graph.build: recorded, not run (no memory, no versions)
        apply(name, inputs, **attrs)
        return
    for what, x in zip(spec.inputs, inputs):
        if not isinstance(x, Tensor):
            raise ArgumentTypeError(f"{name}: {what} must be a tensor, got {type(x).__name__}: {x!r:.60}")
        if x._global is not None:
            raise DeviceError(f"{name}: {what} is global ({describe(x)}); the update runs on local tensors: pass "
                              "each global tensor's local piece (.to_local()), all of one layout, as "
                              "Optimizer.step does")
    written = [k for k, what in enumerate(spec.inputs) if what in spec.written
               and (what != "max_exp_avg_sq" or attrs.get("amsgrad", False))]
    for k in written:
        x = inputs[k]
        if is_grad_enabled() and requires_grad(x):
            raise AutogradError(f"{name} writes {spec.inputs[k]} ({describe(x)}) in place, and it requires grad: "
                                "its gradient would be lost. Do it under flow.no_grad() (an optimizer's update)")
        if has_internal_overlap(x):
            raise ShapeError(f"{name}: several elements of {spec.inputs[k]} ({describe(x)}) share one memory "
                             "location (an expanded view); update a .clone() instead")
        for j, y in enumerate(inputs):
            if j != k and may_overlap(x._blob, y._blob) and not same_view(x._blob, y._blob):
                raise ShapeError(f"{name}: {spec.inputs[k]} ({describe(x)}) overlaps {spec.inputs[j]} "
                                 f"({describe(y)}) without being the same view; pass a .clone()")
    apply(name, inputs, **attrs)
    bumped = set()
    for k in written:
        versions = inputs[k]._versions
        if id(versions) not in bumped:   # a tensor passed twice (max_exp_avg_sq = exp_avg_sq) is one write
            bumped.add(id(versions))
            inputs[k]._bump_version()


def sgd_update(model, model_diff, learning_rate, *, weight_decay: float = 0.0, maximize: bool = False) -> None:
    """``model -= lr * (g + weight_decay * model)`` in place, ``g`` = ``model_diff`` (negated if ``maximize``).

    ``learning_rate``: a 0-d float32 (or float64) tensor on the model's device.
    """
    _run(SGD, [model, model_diff, learning_rate], dict(weight_decay=weight_decay, maximize=maximize))


def momentum_update(model, model_diff, momentum_buf, learning_rate, train_step, *, momentum: float,
                    dampening: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0,
                    maximize: bool = False) -> None:
    """PyTorch's SGD with momentum, in place on ``model`` and ``momentum_buf``.

    ``train_step`` (0-d int64): 1 on the first step, when the buffer becomes the
    (weight-decayed) gradient; later, ``buf = momentum * buf + (1 - dampening) * g``.
    The model moves by ``-lr * buf`` (``-lr * (g + momentum * buf)`` with ``nesterov``).
    """
    _run(MOMENTUM, [model, model_diff, momentum_buf, learning_rate, train_step],
         dict(momentum=momentum, dampening=dampening, nesterov=nesterov, weight_decay=weight_decay,
              maximize=maximize))


def adam_update(model, model_diff, exp_avg, exp_avg_sq, max_exp_avg_sq, learning_rate, train_step, *,
                beta1: float, beta2: float, eps: float, weight_decay: float = 0.0, amsgrad: bool = False,
                maximize: bool = False, decoupled_weight_decay: bool = False) -> None:
    """PyTorch's Adam (AdamW with ``decoupled_weight_decay``), in place on ``model`` and the moments.

    ``train_step`` (0-d int64) is the 1-based number of this step (the bias
    corrections).  ``max_exp_avg_sq`` is used only with ``amsgrad``; otherwise pass
    ``exp_avg_sq`` (or any tensor of the model's shape and dtype).
    """
    _run(ADAM, [model, model_diff, exp_avg, exp_avg_sq, max_exp_avg_sq, learning_rate, train_step],
         dict(beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
              decoupled_weight_decay=decoupled_weight_decay))
