"""``Linear`` (``y = x W^T + b``), and the two shape helpers that usually surround it: ``Flatten``, ``Identity``.

``Linear(in_features, out_features)`` holds ``weight`` (out_features, in_features)
and ``bias`` (out_features,), initialised as PyTorch does: ``kaiming_uniform_``
with ``a = sqrt(5)`` for the weight, which is U(-1/sqrt(in), 1/sqrt(in)), and the
same bound for the bias.

>>> import pyflow as flow
>>> layer = Linear(3, 2)
>>> layer
Linear(in_features=3, out_features=2, bias=True)
>>> [(name, p.shape) for name, p in layer.named_parameters()]
[('weight', (2, 3)), ('bias', (2,))]
>>> layer(flow.ones(5, 3)).shape, Flatten()(flow.ones(5, 2, 3)).shape
((5, 2), (5, 6))
"""

from __future__ import annotations

import math

from pyflow.framework.creation import empty
from pyflow.framework.tensor import Tensor
from pyflow.nn import functional as F
from pyflow.nn import init
from pyflow.nn.module import ArgumentValueError, Module
from pyflow.nn.parameter import Parameter

__all__ = ["Identity", "Linear", "Flatten"]


def _positive(value, what: str, layer: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ArgumentValueError(f"{layer}: {what} must be a positive int, got {value!r}")
    return value


class Identity(Module):
    """Returns its input (a placeholder where a layer is optional)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input


class Linear(Module):
    """``y = x @ weight.T + bias`` on the last dim: (*, in_features) -> (*, out_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.in_features = _positive(in_features, "in_features", "Linear")
        self.out_features = _positive(out_features, "out_features", "Linear")
        self.weight = Parameter(empty(out_features, in_features, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)   # bias=False: the name exists, holding None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default: weight and bias uniform in +-1/sqrt(in_features)."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Flatten(Module):
    """Dims ``start_dim`` to ``end_dim`` merged into one (default: all but the batch dim)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return input.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"
