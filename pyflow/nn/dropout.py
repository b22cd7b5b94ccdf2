"""``Dropout``: in training, zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``.

The scaling keeps each element's expectation, so evaluation needs no correction:
in eval mode (``model.eval()``) the layer returns its input unchanged.  The mask
comes from ``flow.rand_like`` (pyflow's generator: ``flow.manual_seed`` repeats it).

>>> import pyflow as flow
>>> drop = Dropout(0.5)
>>> x = flow.ones(1000)
>>> y = drop(x)
>>> sorted(set(y.tolist()))                   # each element dropped (0) or scaled by 1 / (1 - p)
[0.0, 2.0]
>>> drop.eval()(x) is x
True
"""

from __future__ import annotations

from pyflow.framework.tensor import Tensor
from pyflow.nn import functional as F
from pyflow.nn.module import ArgumentValueError, Module

__all__ = ["Dropout"]


class Dropout(Module):
    """Randomly zeroes elements in training (probability ``p``), identity in eval."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ArgumentValueError(f"Dropout: p is a probability and must be in [0, 1], got {p!r}")
        self.p, self.inplace = float(p), inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.dropout(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"
