"""Loss layers: ``MSELoss``, ``CrossEntropyLoss``, ``NLLLoss`` (``loss(prediction, target)``).

Each holds its settings and calls the function of ``flow.nn.functional`` of the same
name; ``reduction`` is ``"mean"`` (the default), ``"sum"`` or ``"none"`` (one loss
per element / sample).

* ``CrossEntropyLoss``: logits (N, C) or (N, C, d1, ...) against class indices (N, ...):
  ``-log_softmax(x)[target]``.  ``weight`` rescales each class; targets equal to
  ``ignore_index`` (default -100) count for nothing, and the mean divides by the
  summed weights of the others.
* ``MSELoss``: ``(x - y)^2`` for two tensors of the same shape.

>>> import pyflow as flow
>>> loss = CrossEntropyLoss()
>>> round(loss(flow.zeros(4, 3), flow.tensor([0, 1, 2, 0])).item(), 4)   # uniform over 3 classes: log 3
1.0986
>>> MSELoss(reduction="sum")(flow.tensor([1.0, 2.0]), flow.tensor([0.0, 0.0])).item()
5.0
"""

from __future__ import annotations

from pyflow.framework.tensor import Tensor
from pyflow.nn import functional as F
from pyflow.nn.module import ArgumentValueError, Module

__all__ = ["MSELoss", "CrossEntropyLoss", "NLLLoss"]

_REDUCTIONS = ("mean", "sum", "none")


class _Loss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ArgumentValueError(f"{type(self).__name__}: reduction must be 'mean', 'sum' or 'none', "
                                     f"got {reduction!r}")
        self.reduction = reduction


class MSELoss(_Loss):
    """Mean squared error: ``mean((input - target)^2)``."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.mse_loss(input, target, reduction=self.reduction)


class _WeightedLoss(_Loss):
    """A loss with per-class weights (a buffer, so ``.to()`` moves it) and an ignored target index."""

    def __init__(self, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index


class NLLLoss(_WeightedLoss):
    """Negative log-likelihood of log-probabilities (N, C, *) for class indices (N, *)."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.nll_loss(input, target, self.weight, self.ignore_index, self.reduction)


class CrossEntropyLoss(_WeightedLoss):
    """``nll_loss(log_softmax(input, dim=1), target)``: logits (N, C, *) against class indices (N, *)."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction)
