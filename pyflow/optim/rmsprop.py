"""``RMSprop``: divide each step by a running root-mean-square of the gradient (Hinton's lecture 6e).

PyTorch's update, for a parameter ``p`` with gradient ``g`` (``-g`` when ``maximize``)::

    g = g + weight_decay * p                               # an L2 penalty in the gradient
    v = alpha * v + (1 - alpha) * g * g                    # state["square_avg"]
    avg = sqrt(v) + eps
    if centered:                                           # subtract the mean's square: a variance
        m = alpha * m + (1 - alpha) * g                    # state["grad_avg"]
        avg = sqrt(v - m * m) + eps
    if momentum > 0:
        buf = momentum * buf + g / avg                     # state["momentum_buffer"]
        p = p - lr * buf
    else:
        p = p - lr * g / avg

Unlike Adam there is no bias correction: ``v`` starts at 0, so the first steps are large
(``g / sqrt(1 - alpha)`` = 10x ``g``-sized for alpha = 0.99).  The update is a composition of
in-place tensor ops under ``no_grad`` (no fused op of its own), so it runs on every device.
``state["step"]`` is a 0-d int64 tensor, as Adam's.

>>> import pyflow as flow
>>> w = flow.tensor([1.0], requires_grad=True)
>>> opt = flow.optim.RMSprop([w], lr=0.01, alpha=0.75)
>>> w.grad = flow.tensor([2.0])
>>> opt.step()                      # v = 0.25 * 4 = 1: w -= 0.01 * 2 / 1
>>> round(w.item(), 6), opt.state[w]["square_avg"].tolist()
(0.98, [1.0])
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from pyflow.framework.creation import zeros_like
from pyflow.framework.sbp import SbpParallel
from pyflow.framework.tensor import Tensor, tensor
from pyflow.optim.optimizer import Optimizer, check_range

__all__ = ["RMSprop"]


def advance_step(optimizer: Optimizer, p: Tensor, state: dict) -> Tensor:
    """``state["step"] += 1`` (made as a 0-d int64 tensor on ``p``'s device, or global B, if missing or
    an int from an old checkpoint); returns it (its local piece for a global ``p``): the ``train_step``."""
    step = state.get("step", 0)
    if not isinstance(step, Tensor) or step.dtype != np.int64 or (p.is_global and not step.is_global):
        value = int(step.item() if isinstance(step, Tensor) else step)
        if p.is_global:
            step = tensor(value, dtype=np.int64, placement=p.placement,
                          sbp=(SbpParallel("broadcast"),) * len(p.placement.hierarchy))
        else:
            step = tensor(value, dtype=np.int64, device=p.device)
        state["step"] = step
    local = step.to_local() if step.is_global else step
    local.add_(optimizer._step_constant(local.device, 1))
    return local


def decayed_gradient(p: Tensor, grad: Tensor, group: dict) -> Tensor:
    """``-g`` if ``maximize``, plus ``weight_decay * p`` (the L2 penalty's gradient) if set."""
    g = -grad if group.get("maximize", False) else grad
    return g + p * group["weight_decay"] if group["weight_decay"] != 0 else g


class RMSprop(Optimizer):
    """``RMSprop(params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False, *,
    maximize=False)``."""

    def __init__(self, params: Iterable, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0, momentum: float = 0, centered: bool = False, *,
                 maximize: bool = False) -> None:
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered, maximize=maximize))

    def _check_group(self, group: dict) -> None:
        super()._check_group(group)
        check_range("alpha of RMSprop", group["alpha"], 0.0)
        check_range("eps of RMSprop", group["eps"], 0.0)
        check_range("weight_decay of RMSprop", group["weight_decay"], 0.0)
        check_range("momentum of RMSprop", group["momentum"], 0.0)

    def _prepare(self, p: Tensor, group: dict, state: dict) -> Tensor:
        """Make the averages (zeros) that the group's settings need; ``step += 1``."""
        if "square_avg" not in state:
            state["square_avg"] = zeros_like(p)
        if group["momentum"] > 0 and "momentum_buffer" not in state:
            state["momentum_buffer"] = zeros_like(p)
        if group["centered"] and "grad_avg" not in state:
            state["grad_avg"] = zeros_like(p)
        return advance_step(self, p, state)

    def _update_op(self, p: Tensor, grad: Tensor, group: dict, state: dict, learning_rate: Tensor,
                   train_step: Tensor) -> None:
        """The update above, as in-place tensor ops on ``p`` and ``state`` (see ``Optimizer._update_op``)."""
        alpha, eps, momentum = group["alpha"], group["eps"], group["momentum"]
        g = decayed_gradient(p, grad, group)
        square_avg = state["square_avg"]
        square_avg.mul_(alpha).add_(g * g * (1 - alpha))
        if group["centered"]:
            grad_avg = state["grad_avg"]
            grad_avg.mul_(alpha).add_(g * (1 - alpha))
            avg = (square_avg - grad_avg * grad_avg).sqrt() + eps
        else:
            avg = square_avg.sqrt() + eps
        if momentum > 0:
            buf = state["momentum_buffer"]
            buf.mul_(momentum).add_(g / avg)
            p.sub_(buf * learning_rate)
        else:
            p.sub_(g / avg * learning_rate)
