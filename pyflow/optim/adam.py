"""``Adam`` and ``AdamW``: steps scaled by running averages of the gradient and of its square.

PyTorch's update, for a parameter ``p`` with gradient ``g`` (``-g`` when ``maximize``)::

    step += 1                                           # state["step"], a 0-d int64 tensor
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
>>> w.tolist(), int(opt.state[w]["step"])
([0.9, 2.1], 1)

Weight decay differs between the two classes.  Adam adds ``weight_decay * p`` to
the gradient, where the ``v`` normalisation then rescales it.  AdamW (decoupled
weight decay, Loshchilov & Hutter) shrinks ``p`` directly, by the factor
``1 - lr * weight_decay``.  ``m``, ``v`` and ``v_max`` are tensors on the
parameter's device; so is ``state["step"]`` (0-d int64, as PyTorch >= 1.12 keeps
it; a state dict saved with a Python int step still loads).  A step of one
parameter is two VM instructions: ``step += 1`` (an ``add`` of a cached 1) and
one fused ``adam_update`` (``pyflow/ops/optim_update.py``), which reads the
learning rate and the step from their tensors and computes the bias corrections
itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from pyflow.framework.creation import zeros_like
from pyflow.framework.sbp import SbpParallel
from pyflow.framework.tensor import Tensor, tensor
from pyflow.ops.optim_update import adam_update
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

    def _prepare(self, p: Tensor, group: dict, state: dict) -> Tensor:
        """Make the averages (zeros) and the step (0) on the first step; ``step += 1``; returns the step's
        tensor (its local piece for a global ``p``), the op's ``train_step``."""
        if "exp_avg" not in state:   # the first step: the averages start at zero
            state["exp_avg"] = zeros_like(p)
            state["exp_avg_sq"] = zeros_like(p)
        if group["amsgrad"] and "max_exp_avg_sq" not in state:   # (amsgrad may be switched on later)
            state["max_exp_avg_sq"] = zeros_like(p)
        step = state.get("step", 0)
        if not isinstance(step, Tensor) or step.dtype != np.int64 or (p.is_global and not step.is_global):
            state["step"] = step = self._step_tensor(p, step)   # new, or an int (a state saved before 1.12)
        local = step.to_local() if step.is_global else step
        local.add_(self._step_constant(local.device, 1))
        return local

    @staticmethod
    def _step_tensor(p: Tensor, value) -> Tensor:
        """A 0-d int64 step tensor holding ``value`` where ``p`` lives (global B for a global ``p``)."""
        value = int(value.item() if isinstance(value, Tensor) else value)
        if p.is_global:
            return tensor(value, dtype=np.int64, placement=p.placement,
                          sbp=(SbpParallel("broadcast"),) * len(p.placement.hierarchy))
        return tensor(value, dtype=np.int64, device=p.device)

    def _update_op(self, p: Tensor, grad: Tensor, group: dict, state: dict, learning_rate: Tensor,
                   train_step: Tensor) -> None:
        """One ``adam_update`` of ``p`` (see ``Optimizer._update_op``); without amsgrad, ``exp_avg_sq`` also
        stands in for the unused ``max_exp_avg_sq``."""
        beta1, beta2 = group["betas"]
        exp_avg_sq = state["exp_avg_sq"]
        adam_update(p, grad, state["exp_avg"], exp_avg_sq, state["max_exp_avg_sq"] if group["amsgrad"] else exp_avg_sq,
                    learning_rate, train_step, beta1=beta1, beta2=beta2, eps=group["eps"],
                    weight_decay=group["weight_decay"], amsgrad=group["amsgrad"], maximize=group["maximize"],
                    decoupled_weight_decay=group["decoupled_weight_decay"])


class AdamW(Adam):
    """``AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
    maximize=False)``: Adam with decoupled weight decay (``p *= 1 - lr * weight_decay``)."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         maximize=maximize, decoupled_weight_decay=True)
