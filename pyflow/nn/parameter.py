"""``Parameter``: a tensor that a ``Module`` owns and trains (``torch.nn.Parameter``).

A parameter *is* a tensor (a subclass of ``Tensor``) over the same storage as
the data it was made from: no copy.  It is always a **leaf** that requires grad
(unless told otherwise), whatever history the data had, so ``loss.backward()``
leaves its gradient in ``p.grad``.  The only other thing a parameter does is be
recognised: assigning one to a module attribute (``self.weight = Parameter(w)``)
registers it (``pyflow/nn/module.py``).

Ops on a parameter return plain tensors (``p * 2`` is a ``Tensor``).

>>> import pyflow as flow
>>> w = flow.zeros(2, 3)
>>> p = Parameter(w)
>>> isinstance(p, flow.Tensor), p.requires_grad, p.is_leaf, p.shape
(True, True, True, (2, 3))
>>> with flow.no_grad():
...     _ = p.add_(1)
>>> w.tolist()        # p and w share their storage
[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]

``Module.to()`` keeps the parameter objects and points them at the moved data
(``param.data = moved``), as PyTorch does, so an optimizer built before ``.to()``
still updates the module's parameters.
"""

from __future__ import annotations

from pyflow.errors import ArgumentTypeError
from pyflow.framework.tensor import Tensor

__all__ = ["Parameter"]


class Parameter(Tensor):
    """A leaf tensor that a module trains: ``Parameter(data, requires_grad=True)``, sharing ``data``'s storage."""

    __slots__ = ()   # a Tensor's slots only: a parameter is nothing more than a marked tensor

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = True):
        if data is None:
            from pyflow.framework.creation import empty

            data = empty(0)
        if not isinstance(data, Tensor):
            raise ArgumentTypeError(f"Parameter: data must be a pyflow tensor, got {type(data).__name__} "
                                    "(make one with flow.tensor(...))")
        param = cls._wrap(data._blob, data._handle, data._versions)   # the same memory, no history
        param._global = data._global
        if requires_grad:
            param.requires_grad_(True)
        return param

    def __init__(self, data: Tensor | None = None, requires_grad: bool = True):
        pass   # __new__ did everything (Tensor.__init__ would allocate a new tensor)

    def __repr__(self) -> str:   # as PyTorch: the values (waits for them)
        return "Parameter containing:\n" + Tensor.__repr__(self)

    def __str__(self) -> str:    # print(p): the values (of a global one: every rank must print it)
        return "Parameter containing:\n" + Tensor.__str__(self)

    def __deepcopy__(self, memo) -> "Parameter":
        """A parameter over a copy of the values (``copy.deepcopy(module)`` copies its weights)."""
        from pyflow.nn.module import no_grad

        with no_grad():
            copy = Parameter(self.detach().clone(), self.requires_grad)
        memo[id(self)] = copy
        return copy

    def __reduce_ex__(self, protocol):
        raise TypeError("a pyflow Parameter cannot be pickled (its memory belongs to the VM); save "
                        "{name: p.numpy()} from module.state_dict() instead")

