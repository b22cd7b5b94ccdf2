"""What ``Tensor``'s methods ask autograd (``install_autograd`` in ``framework/tensor_methods.py``, where
``requires_grad``, ``grad``, ``grad_fn``, ``is_leaf``, ``requires_grad_()``, ``retain_grad()`` and
``backward()`` are defined); and ``flow.autograd.backward`` / ``flow.autograd.grad``.

* ``set_requires_grad``, ``set_grad``, ``retain_grad``, ``backward``: changing a tensor's autograd state;
* ``record_call``, ``check_write``, ``record_write`` (``views.py``): recording the calls the interpreter
  does not run (``x[index]`` and ``x[index] = v`` with a tensor in the index, ``to_local``, and
  ``to_global``, an op whose runner is the boxing chain).

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
from pyflow.autograd.views import check_write, record_call, record_write
from pyflow.errors import AutogradError, ShapeError
from pyflow.framework.tensor import Tensor

__all__ = ["set_requires_grad", "set_grad", "retain_grad", "backward", "grad", "record_call", "check_write",
           "record_write"]


def set_grad(self, value) -> None:
    """``x.grad = value``: a tensor of ``x``'s shape, or None."""
    if value is not None:
        if not isinstance(value, Tensor):
            raise AutogradError(f"grad must be a tensor or None, got {type(value).__name__}")
        if tuple(value.shape) != tuple(self.shape):
            raise ShapeError(f"grad of shape {list(value.shape)} for a tensor of shape {list(self.shape)}")
    meta(self).grad = value


def retain_grad(self) -> None:
    """``x.retain_grad()``: keep this non-leaf tensor's gradient in ``.grad`` after backward."""
    info = meta(self)
    if not info.requires_grad:
        raise AutogradError("retain_grad() on a tensor that does not require grad")
    if info.grad_fn is not None:
        info.retains_grad = True
        info.grad_fn.retained[info.output_nr] = weakref.ref(self)


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
