"""Recording: what the interpreter tells autograd about each op (installed into ``framework/interpreter.py``).

The interpreter calls four functions of this module's ``Recorder`` for every op
(local or global):

* ``active(tensors, out)`` - record this op at all?  Only in grad mode, and only
  if an input (or an in-place output) requires grad;
* ``check_inplace(name, out)`` - *before* anything is issued: an in-place op on
  a leaf that requires grad is an error (its gradient would be lost), as in
  PyTorch;
* ``before(name, inputs, out)`` - an input that the op overwrites in place is
  snapshotted (a clone) if it requires grad, so the backward rule sees the
  value the op read;
* ``after(op, inputs, results, attrs)`` - make the Node and give each floating
  result its ``grad_fn``.  An in-place result is *rebased*: the tensor object stays,
  its history now ends with this op.

Ops whose outputs are integers or bools (argmax, comparisons) give no gradient:
their outputs do not require grad.
"""

from __future__ import annotations

from pyflow.autograd.graph import AutogradMeta, Node, meta, requires_grad
from pyflow.autograd.mode import is_grad_enabled, no_grad
from pyflow.errors import AutogradError
from pyflow.framework.op_registry import get_op

__all__ = ["Recorder"]


def _differentiable(dtype) -> bool:
    return dtype.kind == "f"


class Recorder:
    """The interpreter's autograd hook."""

    def active(self, tensors, out) -> bool:
        if not is_grad_enabled():
            return False
        return any(requires_grad(t) for t in tensors) or any(requires_grad(o) for o in out or ())

    def check_inplace(self, name: str, out) -> None:
        """Before anything is issued: an in-place write into a leaf that requires grad, or into a view of
        one (``x[1:].mul_(2)``, ``x.T.zero_()``: the leaf's values would change under its gradient), is an
        error, as in PyTorch."""
        for o in out or ():
            info = o._autograd
            if info is not None and info.requires_grad and info.grad_fn is None:
                raise AutogradError(f"op {name!r} writes in place into a leaf tensor that requires grad "
                                    f"({o.dtype}{list(o.shape)}): its gradient would be lost. Do it under "
                                    "flow.no_grad() (an optimizer's update), or on a .clone()")
            if info is not None and info.leaf_base is not None:
                raise AutogradError(f"op {name!r} writes in place into {o.dtype}{list(o.shape)}, a view of "
                                    f"{info.leaf_base}, a leaf tensor that requires grad: the leaf would change "
                                    "under its gradient (PyTorch: 'a view of a leaf Variable that requires grad "
                                    "is being used in an in-place operation'). Do it under flow.no_grad(), or "
                                    "on a .clone()")
            if info is not None and info.base is not None and is_grad_enabled():
                raise AutogradError(f"op {name!r} writes in place into {o.dtype}{list(o.shape)}, a view of "
                                    f"{info.base}, which was computed from tensors that require grad: pyflow "
                                    "does not yet carry such a write into the base's history (PyTorch's "
                                    "CopySlices), and the base's gradient would silently be wrong. Write "
                                    "into the base with base[index] = value (recorded), or use an "
                                    "out-of-place op")

    def before(self, name: str, inputs: list, out) -> list:
        """The inputs to save for backward: a snapshot of any the op overwrites in place."""
        if not out:
            return list(inputs)
        saved = []
        for x in inputs:
            if hasattr(x, "_blob") and requires_grad(x) and any(x._blob.storage is o._blob.storage for o in out):
                with no_grad():
                    snapshot = x.clone()
                snapshot._autograd = x._autograd  # the same history: gradients flow to x's past
                saved.append(snapshot)
            else:
                saved.append(x)
        return saved

    def after(self, name: str, rule, inputs: list, results: list, attrs: dict) -> None:
        floating = [r for r in results if _differentiable(r.dtype)]
        if not floating:
            return
        node = Node(name, rule, inputs, results, attrs)
        for k, result in enumerate(results):
            if _differentiable(result.dtype):
                previous = result._autograd
                result._autograd = AutogradMeta(requires_grad=True, grad_fn=node, output_nr=k)
                if previous is not None and previous.retains_grad:  # an in-place result keeps asking
                    result._autograd.retains_grad = True
        if get_op(name).view is not None:   # a view op: its result writes through to the input's storage
            _mark_view(inputs[0], results[0])


def record_unary_view(name: str, rule, x, result, attrs=None):
    """Record a call the interpreter does not run (``x[...]``, ``to_local``, and ``to_global``: an op whose
    runner is the boxing chain): ``result``'s node."""
    if is_grad_enabled() and requires_grad(x):
        node = Node(name, rule, [x], [result], attrs or {})
        result._autograd = AutogradMeta(requires_grad=True, grad_fn=node, output_nr=0)
        _mark_view(x, result)
    return result


def _mark_view(x, result) -> None:
    """If ``result`` is a view of ``x``'s storage, remember the base it writes through to (a leaf, or a
    tensor with a history), for ``check_inplace``."""
    if getattr(result, "_blob", None) is not None and result._blob.storage is x._blob.storage:
        base = x._autograd
        if base.grad_fn is None:
            result._autograd.leaf_base = f"{x.dtype}{list(x.shape)}"
        else:
            result._autograd.leaf_base = base.leaf_base
            result._autograd.base = base.base or f"{x.dtype}{list(x.shape)}"


def set_requires_grad(t, flag: bool):
    """``t.requires_grad_(flag)``: only leaves may change it; only floating tensors may require grad."""
    info = t._autograd
    if info is not None and info.grad_fn is not None:
        if not flag:
            raise AutogradError("requires_grad=False on a tensor computed from others: use .detach() instead")
        return t
    if flag and not _differentiable(t.dtype):
        raise AutogradError(f"only floating point tensors can require gradients, not {t.dtype}{list(t.shape)}")
    meta(t).requires_grad = bool(flag)
    return t
