"""Loss layers: ``MSELoss``, ``L1Loss``, ``SmoothL1Loss``, ``HuberLoss``, ``CrossEntropyLoss``, ``NLLLoss``,
``BCELoss``, ``BCEWithLogitsLoss``, ``KLDivLoss`` (``loss(prediction, target)``).

Each holds its settings and calls the function of ``flow.nn.functional`` of the same
name; ``reduction`` is ``"mean"`` (the default), ``"sum"`` or ``"none"`` (one loss
per element / sample).

* ``CrossEntropyLoss``: logits (N, C) or (N, C, d1, ...) against class indices (N, ...):
  ``-log_softmax(x)[target]``.  ``weight`` rescales each class; targets equal to
  ``ignore_index`` (default -100) count for nothing, and the mean divides by the
  summed weights of the others.
  ``label_smoothing`` mixes the target with the uniform distribution.
* ``MSELoss``, ``L1Loss``, ``SmoothL1Loss``, ``HuberLoss``: ``(x - y)^2``, ``|x - y|`` and their
  blends for two tensors of the same shape.
* ``BCELoss`` on probabilities, ``BCEWithLogitsLoss`` on logits (stabler: prefer it).
* ``KLDivLoss``: ``input`` log-probabilities, ``target`` probabilities; ``reduction='batchmean'``
  is the mathematically right KL divergence per sample.

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

__all__ = ["MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "CrossEntropyLoss", "NLLLoss", "BCELoss",
           "BCEWithLogitsLoss", "KLDivLoss"]

_REDUCTIONS = ("mean", "sum", "none")


class _Loss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in _REDUCTIONS + (("batchmean",) if isinstance(self, KLDivLoss) else ()):
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
    """``nll_loss(log_softmax(input, dim=1), target)``: logits (N, C, *) against class indices (N, *)
    (or class probabilities of the input's shape); ``label_smoothing`` in [0, 1]."""

    def __init__(self, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0) -> None:
        super().__init__(weight, ignore_index, reduction)
        if not 0.0 <= label_smoothing <= 1.0:
            raise ArgumentValueError(f"CrossEntropyLoss: label_smoothing must be in [0, 1], got {label_smoothing}")
        self.label_smoothing = label_smoothing

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing)


class L1Loss(_Loss):
    """Mean absolute error: ``mean(|input - target|)``."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    """Quadratic for ``|d| < beta``, linear beyond (see ``F.smooth_l1_loss``)."""

    def __init__(self, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(reduction)
        self.beta = beta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """``0.5 d^2`` for ``|d| < delta``, ``delta * (|d| - delta / 2)`` beyond (see ``F.huber_loss``)."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction)
        self.delta = delta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class BCELoss(_Loss):
    """Binary cross-entropy of probabilities in [0, 1]; ``weight`` (a buffer) rescales each element."""

    def __init__(self, weight: Tensor | None = None, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.register_buffer("weight", weight)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.binary_cross_entropy(input, target, self.weight, self.reduction)


class BCEWithLogitsLoss(_Loss):
    """``BCELoss(sigmoid(x))`` computed stably from logits; ``pos_weight`` weighs the positives per class."""

    def __init__(self, weight: Tensor | None = None, reduction: str = "mean", pos_weight: Tensor | None = None) -> None:
        super().__init__(reduction)
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.binary_cross_entropy_with_logits(input, target, self.weight, self.reduction, self.pos_weight)


class KLDivLoss(_Loss):
    """``target * (log(target) - input)`` for log-probabilities ``input``; reductions include ``'batchmean'``."""

    def __init__(self, reduction: str = "mean", log_target: bool = False) -> None:
        super().__init__(reduction)
        self.log_target = log_target

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)
