"""``flow.nn.utils``: gradient clipping, ``clip_grad_norm_`` and ``clip_grad_value_``, as PyTorch's.

Clipping runs between ``loss.backward()`` and ``optimizer.step()``: it rescales the
``.grad`` of the parameters in place, so one bad batch (an exploding RNN gradient) cannot
throw the weights far away.  ``clip_grad_norm_`` keeps the gradients' direction and only
shortens the whole vector (all parameters together) to ``max_norm``::

    total = || (||g_1||, ||g_2||, ...) ||          # the norm of every gradient as one vector
    g_i *= min(1, max_norm / (total + 1e-6))        # the 1e-6 guards a zero norm

Both are tensor ops under ``no_grad`` (the norm stays a 0-d tensor on the gradients'
device: reading it is the only sync, and it is the caller's choice).

>>> import pyflow as flow
>>> w = flow.tensor([0.0, 0.0], requires_grad=True)
>>> w.grad = flow.tensor([3.0, 4.0])
>>> clip_grad_norm_([w], max_norm=1.0).item()    # the norm before clipping
5.0
>>> [round(v, 4) for v in w.grad.tolist()]
[0.6, 0.8]
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pyflow.autograd import no_grad
from pyflow.errors import ArgumentTypeError, ArgumentValueError
from pyflow.framework.creation import zeros
from pyflow.framework.movement import stack
from pyflow.framework.tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _gradients(parameters, op: str) -> list[Tensor]:
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise ArgumentTypeError(f"{op}: parameter {i} is a {type(p).__name__}, not a tensor")
    return [p.grad for p in params if p.grad is not None]


def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> Tensor:
    """Scale the gradients of ``parameters`` so that their total ``norm_type``-norm is at most
    ``max_norm``; returns the total norm *before* clipping (a 0-d tensor).

    ``norm_type`` may be ``inf`` (the largest absolute entry).  ``error_if_nonfinite``: raise if the
    norm is nan or inf (one sync) instead of scaling the gradients by nan.
    """
    grads = _gradients(parameters, "clip_grad_norm_")
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not (norm_type > 0 or math.isinf(norm_type)):
        raise ArgumentValueError(f"clip_grad_norm_: norm_type must be > 0 or inf, got {norm_type}")
    if not grads:
        return zeros(())
    with no_grad():
        device = grads[0].device
        norms = [g.detach().norm(norm_type).to(device=device) for g in grads]
        total = stack(norms).norm(norm_type)
        if error_if_nonfinite and not math.isfinite(total.item()):
            raise ArgumentValueError(f"clip_grad_norm_: the total {norm_type}-norm of the gradients is "
                                     f"{total.item()}; pass error_if_nonfinite=False to scale anyway")
        scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale.to(device=g.device, dtype=g.dtype))
    return total


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float) -> None:
    """Clamp every gradient entry of ``parameters`` into ``[-clip_value, clip_value]``, in place."""
    clip_value = float(clip_value)
    with no_grad():
        for g in _gradients(parameters, "clip_grad_value_"):
            g.clamp_(min=-clip_value, max=clip_value)
