"""Containers: ``Sequential`` (children called in order) and ``ModuleList`` (children held in a list).

Both keep their children in ``_modules`` under the names ``"0"``, ``"1"``..., so a
state dict has PyTorch's keys (``0.weight``, ``2.bias``) and ``model[0]`` is the
first child.  A plain Python list of layers would hide them from
``parameters()``; a ``ModuleList`` registers them.

>>> import pyflow as flow
>>> from pyflow import nn
>>> model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
>>> len(model), list(model.state_dict())
(3, ['0.weight', '0.bias', '2.weight', '2.bias'])
>>> model(flow.ones(2, 3)).shape, type(model[1]).__name__, len(model[:2])
((2, 1), 'ReLU', 2)
"""

from __future__ import annotations

import collections
import operator
from typing import Iterable, Iterator

from pyflow.errors import ArgumentTypeError
from pyflow.nn.module import Module

__all__ = ["Sequential", "ModuleList"]


class _IndexedModules(Module):
    """Children named "0", "1", ... : what ``Sequential`` and ``ModuleList`` share."""

    def _index(self, idx) -> int:
        """``idx`` (possibly negative) as a position in ``[0, len)``; IndexError naming the length."""
        try:
            idx = operator.index(idx)
        except TypeError:
            raise ArgumentTypeError(f"{type(self).__name__} indices must be ints or slices, not "
                                    f"{type(idx).__name__}") from None
        size = len(self)
        if not -size <= idx < size:
            raise IndexError(f"index {idx} is out of range for a {type(self).__name__} of {size} modules")
        return idx % size

    def _of(self, modules: list) -> "_IndexedModules":
        """A container of the same kind holding ``modules`` (what a slice returns)."""
        raise NotImplementedError

    def _renumber(self, modules: Iterable[Module]) -> None:
        self._modules.clear()
        for i, module in enumerate(modules):
            self.add_module(str(i), module)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return self._of(list(self._modules.values())[idx])
        return list(self._modules.values())[self._index(idx)]

    def __setitem__(self, idx, module: Module) -> None:
        self.add_module(list(self._modules)[self._index(idx)], module)

    def __delitem__(self, idx) -> None:
        modules = list(self._modules.values())
        del modules[idx if isinstance(idx, slice) else self._index(idx)]
        self._renumber(modules)

    def append(self, module: Module):
        """Add ``module`` at the end; returns self."""
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]):
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._renumber(modules)

    def __dir__(self):
        return [name for name in super().__dir__() if not name.isdigit()]


class Sequential(_IndexedModules):
    """Calls its children in order, each on the previous one's output: ``Sequential(a, b)(x) = b(a(x))``.

    ``Sequential(OrderedDict(name=module, ...))`` names the children instead of numbering them.
    """

    def __init__(self, *modules) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], collections.OrderedDict):
            for name, module in modules[0].items():
                self.add_module(name, module)
        else:
            for i, module in enumerate(modules):
                self.add_module(str(i), module)

    def _of(self, modules: list) -> "Sequential":
        return Sequential(*modules)

    def forward(self, input):  # noqa: A002
        for module in self:
            input = module(input)
        return input


class ModuleList(_IndexedModules):
    """A list of modules whose parameters the parent module sees; it has no ``forward``: index it."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _of(self, modules: list) -> "ModuleList":
        return ModuleList(modules)

    def __iadd__(self, modules: Iterable[Module]) -> "ModuleList":
        return self.extend(modules)
