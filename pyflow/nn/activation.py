"""Activation layers: ``ReLU``, ``Tanh``, ``Sigmoid``, ``Softmax``, ``LogSoftmax``, ``GELU``, ``LeakyReLU``,
``Softplus``, ``LogSigmoid``.

Each is a module with no parameters whose ``forward`` is one elementwise op
(``flow.relu``...) or the function of ``flow.nn.functional`` of the same name (a
composition of ops); they exist so that a ``Sequential`` can hold them.

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
from pyflow.nn.module import ArgumentValueError, Module

__all__ = ["ReLU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "GELU", "LeakyReLU", "Softplus", "LogSigmoid"]


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

    def __init__(self, dim: int | None = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.softmax(input, _implicit_dim(self.dim, input, "Softmax"))

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


def _implicit_dim(dim, input: Tensor, name: str) -> int:
    """``dim=None``: PyTorch's legacy choice (0 for 0-, 1- and 3-D inputs, else 1), with its warning."""
    if dim is not None:
        return dim
    import warnings

    warnings.warn(f"Implicit dimension choice for {name.lower()} has been deprecated. Change the call to include "
                  "dim=X as an argument.", UserWarning, stacklevel=3)
    return 0 if input.ndim in (0, 1, 3) else 1


class LogSoftmax(Softmax):
    """``log(softmax(x))`` along ``dim``, computed stably."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.log_softmax(input, _implicit_dim(self.dim, input, "LogSoftmax"))


class GELU(Module):
    """``x * Phi(x)`` (Phi: the standard normal CDF); ``approximate='tanh'`` uses the tanh formula."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ArgumentValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class LeakyReLU(Module):
    """``x`` for ``x > 0``, else ``negative_slope * x`` (a small gradient keeps negative units alive)."""

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class Softplus(Module):
    """``log(1 + exp(beta * x)) / beta``, linear above ``threshold``: a smooth ReLU."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class LogSigmoid(Module):
    """``log(sigmoid(x))``, computed stably."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.logsigmoid(input)
