"""What ``Tensor``'s methods ask autograd (``install_autograd`` in ``framework/tensor_methods.py``, where
``requires_grad``, ``grad``, ``grad_fn``, ``is_leaf``, ``requires_grad_()``, ``retain_grad()`` and
``backward()`` are defined); and ``flow.autograd.backward`` / ``flow.autograd.grad``.

* ``set_requires_grad``, ``set_grad``, ``retain_grad``, ``register_post_accumulate_grad_hook``, ``backward``:
  changing a tensor's autograd state;
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

import itertools
import weakref

from pyflow.autograd.engine import run_backward
from pyflow.autograd.graph import meta
from pyflow.autograd.record import set_requires_grad
from pyflow.autograd.views import check_write, record_call, record_write
from pyflow.errors import AutogradError, ShapeError
from pyflow.framework.tensor import Tensor

__all__ = ["set_requires_grad", "set_grad", "retain_grad", "register_post_accumulate_grad_hook", "HookHandle",
           "backward", "grad", "record_call", "check_write", "record_write"]


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


class HookHandle:
    """What registering a hook returns: ``remove()`` unregisters it (PyTorch's ``RemovableHandle``)."""

    _keys = itertools.count()

    def __init__(self, hooks: dict):
        self.hooks, self.key = hooks, next(HookHandle._keys)   # (the tensor's table of hooks, not the tensor)

    def remove(self) -> None:
        self.hooks.pop(self.key, None)


def register_post_accumulate_grad_hook(self, hook) -> HookHandle:
    """``x.register_post_accumulate_grad_hook(hook)``: call ``hook(x)`` whenever a backward has added a gradient
    into this leaf's ``.grad`` (PyTorch's hook of that name), in the order registered; the handle removes it.

    >>> import pyflow as flow
    >>> w = flow.tensor([1.0, 2.0], requires_grad=True)
    >>> handle = w.register_post_accumulate_grad_hook(lambda t: print("grad now", t.grad.tolist()))
    >>> (w * 3).sum().backward()
    grad now [3.0, 3.0]
    >>> handle.remove(); (w * 3).sum().backward(); w.grad.tolist()
    [6.0, 6.0]
    """
    if not callable(hook):
        raise AutogradError(f"register_post_accumulate_grad_hook: hook must be callable, got {type(hook).__name__}")
    info = meta(self)
    if not info.requires_grad or info.grad_fn is not None:
        raise AutogradError("register_post_accumulate_grad_hook: only a leaf tensor that requires grad accumulates "
                            "a gradient (this one " + ("is computed by an op" if info.grad_fn is not None
                                                       else "does not require grad") + ")")
    if info.post_accumulate_hooks is None:
        info.post_accumulate_hooks = {}
    handle = HookHandle(info.post_accumulate_hooks)
    info.post_accumulate_hooks[handle.key] = hook
    return handle


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
