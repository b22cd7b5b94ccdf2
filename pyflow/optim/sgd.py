"""``SGD``: stochastic gradient descent, with momentum, dampening, Nesterov and weight decay.

PyTorch's update, for a parameter ``p`` with gradient ``g`` (``-g`` when ``maximize``)::

    g = g + weight_decay * p                          # L2 penalty, if weight_decay != 0
    if momentum != 0:
        buf = g                                       # first step: the buffer starts as the gradient
        buf = momentum * buf + (1 - dampening) * g    # later steps
        g = g + momentum * buf   if nesterov   else buf
    p = p - lr * g

The buffer is ``state["momentum_buffer"]``, a tensor on the parameter's device.
Every line is an in-place tensor op, so one step of SGD with momentum is a few
VM instructions per parameter:

>>> import pyflow as flow
>>> w = flow.tensor([1.0, 2.0], requires_grad=True)
>>> opt = flow.optim.SGD([w], lr=0.5, momentum=0.9)
>>> for _ in range(2):
...     w.grad = flow.tensor([1.0, 1.0])
...     opt.step()
>>> w.tolist(), opt.state[w]["momentum_buffer"].tolist()    # buf: 1, then 0.9 * 1 + 1
([-0.45, 0.55], [1.9, 1.9])
>>> w.grad = flow.tensor([1.0, 1.0])
>>> with flow.trace() as tracer:
...     opt.step()
>>> sorted({r.name for r in tracer.records} & {"add", "mul"})   # buf.mul_(0.9).add_(g); p.add_(buf, alpha=-lr)
['add', 'mul']
"""

from __future__ import annotations

from collections.abc import Iterable

from pyflow.framework.tensor import Tensor
from pyflow.optim.optimizer import Optimizer, OptimizerError, check_range

__all__ = ["SGD"]


class SGD(Optimizer):
    """``SGD(params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, maximize=False)``."""

    def __init__(self, params: Iterable, lr: float = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, maximize: bool = False) -> None:
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))

    def _check_group(self, group: dict) -> None:
        super()._check_group(group)
        check_range("momentum of SGD", group["momentum"], 0.0)
        check_range("dampening of SGD", group["dampening"], float("-inf"))
        check_range("weight_decay of SGD", group["weight_decay"], 0.0)
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise OptimizerError(f"SGD: Nesterov momentum needs momentum > 0 and dampening 0, got momentum "
                                 f"{group['momentum']} and dampening {group['dampening']}")

    def _update(self, p: Tensor, grad: Tensor, group: dict, state: dict) -> None:
        if group["weight_decay"] != 0:
            grad = grad.add(p, alpha=group["weight_decay"])
        momentum = group["momentum"]
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.clone()
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
            grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
        p.add_(grad, alpha=-group["lr"])
