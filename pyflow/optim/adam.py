"""``Adam`` and ``AdamW``: steps scaled by running averages of the gradient and of its square.

PyTorch's update, for a parameter ``p`` with gradient ``g`` (``-g`` when ``maximize``)::

    step += 1                                           # state["step"], a Python int
    g = g + weight_decay * p                            # Adam: an L2 penalty in the gradient
    p = p * (1 - lr * weight_decay)                     # AdamW instead: decay the parameter itself
    m = beta1 * m + (1 - beta1) * g                     # state["exp_avg"]
    v = beta2 * v + (1 - beta2) * g * g                 # state["exp_avg_sq"]
    v_max = maximum(v_max, v); use v_max for v          # amsgrad only: state["max_exp_avg_sq"]
    p = p - lr / (1 - beta1**step) * m / (sqrt(v) / sqrt(1 - beta2**step) + eps)

``m`` and ``v`` start at zero, so early on they underestimate the averages.
Dividing by ``1 - beta**step`` (the **bias correction**) undoes that.  Hence the
first step moves every element by about ``lr``, whatever the gradient's scale:

>>> import pyflow as flow
>>> w = flow.tensor([1.0, 2.0], requires_grad=True)
>>> opt = flow.optim.Adam([w], lr=0.1)
>>> w.grad = flow.tensor([0.5, -3.0])
>>> opt.step()
>>> w.tolist(), opt.state[w]["step"]
([0.9, 2.1], 1)

Weight decay differs between the two classes.  Adam adds ``weight_decay * p`` to
the gradient, where the ``v`` normalisation then rescales it.  AdamW (decoupled
weight decay, Loshchilov & Hutter) shrinks ``p`` directly, by the factor
``1 - lr * weight_decay``.  ``m``, ``v`` and ``v_max`` are tensors on the
parameter's device.  Each line above is one or two in-place tensor ops.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyflow.framework.creation import zeros_like
from pyflow.framework.functional import maximum
from pyflow.framework.tensor import Tensor
from pyflow.optim.optimizer import Optimizer, OptimizerError, check_range

__all__ = ["Adam", "AdamW"]


class Adam(Optimizer):
    """``Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *, maximize=False,
    decoupled_weight_decay=False)`` (``decoupled_weight_decay=True`` is AdamW)."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *, maximize: bool = False,
                 decoupled_weight_decay: bool = False) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize, decoupled_weight_decay=decoupled_weight_decay))

    def _check_group(self, group: dict) -> None:
        super()._check_group(group)
        name = type(self).__name__
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise OptimizerError(f"{name}: betas must be a pair (beta1, beta2), got {betas!r}")
        group["betas"] = tuple(betas)
        for i, beta in enumerate(betas):
            check_range(f"beta{i + 1} (betas[{i}]) of {name}", beta, 0.0, 1.0)
        check_range(f"eps of {name}", group["eps"], 0.0)
        check_range(f"weight_decay of {name}", group["weight_decay"], 0.0)

    def _update(self, p: Tensor, grad: Tensor, group: dict, state: dict) -> None:
        lr, (beta1, beta2), weight_decay = group["lr"], group["betas"], group["weight_decay"]
        if not state:   # the first step: the averages start at zero
            state["step"] = 0
            state["exp_avg"] = zeros_like(p)
            state["exp_avg_sq"] = zeros_like(p)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = zeros_like(p)
        state["step"] += 1
        step, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]

        if weight_decay != 0:
            if group["decoupled_weight_decay"]:
                p.mul_(1 - lr * weight_decay)
            else:
                grad = grad.add(p, alpha=weight_decay)
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).add_(grad * grad, alpha=1 - beta2)
        if group["amsgrad"]:
            if "max_exp_avg_sq" not in state:   # amsgrad switched on after the first step
                state["max_exp_avg_sq"] = zeros_like(p)
            max_exp_avg_sq = state["max_exp_avg_sq"]
            second_moment = max_exp_avg_sq.copy_(maximum(max_exp_avg_sq, exp_avg_sq))
        else:
            second_moment = exp_avg_sq

        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        step_size = lr / bias_correction1
        denom = (second_moment.sqrt() / bias_correction2 ** 0.5).add_(group["eps"])
        p.add_(exp_avg / denom, alpha=-step_size)


class AdamW(Adam):
    """``AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
    maximize=False)``: Adam with decoupled weight decay (``p *= 1 - lr * weight_decay``)."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         maximize=maximize, decoupled_weight_decay=True)
