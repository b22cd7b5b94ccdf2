"""Batch normalisation: ``BatchNorm1d`` ((N, C) or (N, C, L)) and ``BatchNorm2d`` ((N, C, H, W)).

Each channel is normalised to mean 0 and variance 1, then scaled by ``weight`` and
shifted by ``bias`` (``affine=True``: parameters, initialised to ones and zeros).

* **training**: the statistics are the batch's (the *biased* variance, dividing by
  n), and the buffers ``running_mean`` / ``running_var`` move towards them:
  ``running = (1 - momentum) * running + momentum * batch``, with the *unbiased*
  variance (dividing by n - 1) for ``running_var``.  ``num_batches_tracked``
  counts the batches (``momentum=None``: a plain average over them, 1 / count).
* **eval**: the running statistics normalise (no buffer changes).

``track_running_stats=False`` keeps no buffers and always uses the batch's statistics.

>>> import pyflow as flow
>>> bn = BatchNorm2d(2)
>>> bn
BatchNorm2d(2, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)
>>> list(bn.state_dict())
['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked']
>>> x = flow.arange(8.0).reshape(2, 2, 2, 1)      # channel 0 holds 0 1 4 5, channel 1 holds 2 3 6 7
>>> y = bn(x)
>>> bn.running_mean.tolist(), bn.num_batches_tracked.item()
([0.25, 0.45], 1)
"""

from __future__ import annotations

from pyflow.framework.creation import ones, tensor, zeros
from pyflow.framework.tensor import Tensor
from pyflow.nn import functional as F
from pyflow.nn.module import ArgumentValueError, Module
from pyflow.nn.parameter import Parameter

__all__ = ["BatchNorm1d", "BatchNorm2d"]


class _BatchNorm(Module):
    """What BatchNorm1d and BatchNorm2d share; they differ only in the input ranks they accept."""

    _ranks: tuple = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features <= 0:
            raise ArgumentValueError(f"{type(self).__name__}: num_features must be a positive int, "
                                     f"got {num_features!r}")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        if affine:
            self.weight = Parameter(ones(num_features, device=device, dtype=dtype))
            self.bias = Parameter(zeros(num_features, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, device=device, dtype=dtype))
            self.register_buffer("running_var", ones(num_features, device=device, dtype=dtype))
            self.register_buffer("num_batches_tracked", tensor(0, device=device))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)

    def reset_running_stats(self) -> None:
        """Running mean 0, running variance 1, no batches seen."""
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def _check_input(self, x: Tensor) -> None:
        if not isinstance(x, Tensor) or x.ndim not in self._ranks:
            what = f"a {x.ndim}-d input of shape {list(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
            raise ArgumentValueError(f"{type(self).__name__} expects a {' or '.join(map(str, self._ranks))}-d "
                                     f"input, got {what}")
        if x.shape[1] != self.num_features:
            raise ArgumentValueError(f"{type(self).__name__}({self.num_features}) got an input with "
                                     f"{x.shape[1]} channels (dim 1 of shape {list(x.shape)})")

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        self._check_input(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:   # a cumulative average: the n-th batch weighs 1/n
                factor = 1.0 / self.num_batches_tracked.item()
        use_batch_stats = self.training or self.running_mean is None
        keep = not self.training or self.track_running_stats   # which running statistics to read or update
        return F.batch_norm(input, self.running_mean if keep else None, self.running_var if keep else None,
                            self.weight, self.bias, use_batch_stats, factor, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch norm over (N, C) or (N, C, L) inputs: statistics per channel C."""

    _ranks = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch norm over (N, C, H, W) inputs: statistics per channel C, over N, H and W."""

    _ranks = (4,)
