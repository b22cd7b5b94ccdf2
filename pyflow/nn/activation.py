"""Activation layers: ``ReLU``, ``Tanh``, ``Sigmoid``, ``Softmax``, ``LogSoftmax``.

Each is a module with no parameters whose ``forward`` is one elementwise op
(``flow.relu``...); they exist so that a ``Sequential`` can hold them.

>>> import pyflow as flow
>>> x = flow.tensor([-1.0, 0.0, 2.0])
>>> ReLU()(x).tolist(), Sigmoid()(x)[1].item(), Tanh()(x)[1].item()
([0.0, 0.0, 2.0], 0.5, 0.0)
>>> ReLU(inplace=True)
ReLU(inplace=True)
"""

from __future__ import annotations

from pyflow.framework.tensor import Tensor
from pyflow.nn import functional as F
from pyflow.nn.module import Module

__all__ = ["ReLU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax"]


class ReLU(Module):
    """``max(x, 0)``; ``inplace=True`` writes the result into the input (``clamp_(min=0)``)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.clamp_(min=0) if self.inplace else F.relu(input)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Tanh(Module):
    """Elementwise ``tanh``."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.tanh(input)


class Sigmoid(Module):
    """Elementwise ``1 / (1 + exp(-x))``."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.sigmoid(input)


class Softmax(Module):
    """``exp(x) / sum(exp(x))`` along ``dim``."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.softmax(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    """``log(softmax(x))`` along ``dim``, computed stably."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.log_softmax(input, self.dim)
