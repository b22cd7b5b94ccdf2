"""The autograd side of ``Tensor`` (installed on the class): ``requires_grad``, ``grad``, ``grad_fn``,
``is_leaf``, ``requires_grad_()``, ``retain_grad()``, ``backward()``; and ``flow.autograd.grad``.

>>> import pyflow as flow
>>> x = flow.tensor([1.0, 2.0, 3.0], requires_grad=True)
>>> y = (x * x).sum()
>>> y.backward()
>>> x.grad.tolist(), x.is_leaf, y.is_leaf
([2.0, 4.0, 6.0], True, False)
"""

from __future__ import annotations

import weakref

from pyflow.autograd.engine import run_backward
from pyflow.autograd.graph import meta
from pyflow.autograd.record import set_requires_grad
from pyflow.errors import AutogradError, ShapeError
from pyflow.framework.tensor import Tensor

__all__ = ["install", "backward", "grad"]


def _get_requires_grad(self) -> bool:
    info = self._autograd
    return info is not None and info.requires_grad


def _get_grad(self):
    info = self._autograd
    return None if info is None else info.grad


def _set_grad(self, value) -> None:
    if value is not None:
        if not isinstance(value, Tensor):
            raise AutogradError(f"grad must be a tensor or None, got {type(value).__name__}")
        if tuple(value.shape) != tuple(self.shape):
            raise ShapeError(f"grad of shape {list(value.shape)} for a tensor of shape {list(self.shape)}")
    meta(self).grad = value


def _grad_fn(self):
    info = self._autograd
    return None if info is None else info.grad_fn


def _is_leaf(self) -> bool:
    return _grad_fn(self) is None


def _requires_grad_(self, requires_grad: bool = True) -> Tensor:
    """Make this leaf record (or stop recording) the ops that use it; returns it."""
    return set_requires_grad(self, requires_grad)


def _retain_grad(self) -> None:
    """Keep this non-leaf tensor's gradient in ``.grad`` after backward (leaves always keep theirs)."""
    info = meta(self)
    if not info.requires_grad:
        raise AutogradError("retain_grad() on a tensor that does not require grad")
    if info.grad_fn is not None:
        info.retains_grad = True
        info.grad_fn.retained[info.output_nr] = weakref.ref(self)


def _backward(self, gradient=None, retain_graph=None, create_graph: bool = False) -> None:
    """Accumulate d(self)/d(leaf) into every leaf's ``.grad`` (``gradient``: d(loss)/d(self), needed
    unless ``self`` has one element)."""
    backward([self], [gradient], retain_graph, create_graph)


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph: bool = False) -> None:
    """``flow.autograd.backward``: backward from several outputs at once."""
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    grads = [None] * len(tensors) if grad_tensors is None else (
        [grad_tensors] if isinstance(grad_tensors, Tensor) else list(grad_tensors))
    run_backward(tensors, grads, create_graph if retain_graph is None else retain_graph, create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph: bool = False,
         allow_unused: bool = False) -> tuple:
    """``flow.autograd.grad``: d(outputs)/d(inputs), returned (nothing is accumulated into ``.grad``)."""
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    grads = [None] * len(outputs) if grad_outputs is None else (
        [grad_outputs] if isinstance(grad_outputs, Tensor) else list(grad_outputs))
    found = run_backward(outputs, grads, create_graph if retain_graph is None else retain_graph, create_graph,
                         wanted=inputs)
    for i, g in enumerate(found):
        if g is None and not allow_unused:
            raise AutogradError(f"input {i} of autograd.grad was not used to compute the outputs (pass "
                                "allow_unused=True to get None for it)")
    return tuple(found)


def install() -> None:
    Tensor.requires_grad = property(_get_requires_grad, lambda self, flag: set_requires_grad(self, flag))
    Tensor.grad = property(_get_grad, _set_grad)
    Tensor.grad_fn = property(_grad_fn)
    Tensor.is_leaf = property(_is_leaf)
    Tensor.requires_grad_ = _requires_grad_
    Tensor.retain_grad = _retain_grad
    Tensor.backward = _backward
