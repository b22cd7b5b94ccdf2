"""``SGD``: stochastic gradient descent, with momentum, dampening, Nesterov and weight decay.

PyTorch's update, for a parameter ``p`` with gradient ``g`` (``-g`` when ``maximize``)::

    g = g + weight_decay * p                          # L2 penalty, if weight_decay != 0
    if momentum != 0:
        buf = g                                       # first step: the buffer starts as the gradient
        buf = momentum * buf + (1 - dampening) * g    # later steps
        g = g + momentum * buf   if nesterov   else buf
    p = p - lr * g

The buffer is ``state["momentum_buffer"]``, a tensor on the parameter's device.
The whole update of one parameter is **one fused op**, OneFlow's: ``sgd_update``
(momentum 0) or ``momentum_update`` (``pyflow/ops/optim_update.py``), one VM
instruction per parameter.  The op reads the learning rate from a 0-d tensor the
optimizer keeps (refilled only when ``group["lr"]`` changes), and
``momentum_update`` reads a 0-d int64 ``train_step``: 1 on the step that creates
the buffer (it then becomes the gradient), a fixed 2 afterwards (SGD keeps no
step count, as PyTorch's; only "first step or not" matters to the op).

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
>>> [r.name for r in tracer.records if r.name != "release_tensor"]   # buf and w: one kernel
['momentum_update']
"""

from __future__ import annotations

from collections.abc import Iterable

from pyflow.framework.creation import zeros_like
from pyflow.framework.tensor import Tensor
from pyflow.ops.optim_update import momentum_update, sgd_update
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

    def _prepare(self, p: Tensor, group: dict, state: dict) -> Tensor | None:
        """Momentum: make the buffer on the first step (zeros: the op overwrites it with the gradient);
        the train_step is 1 then, 2 on every later step.  Plain SGD needs neither."""
        if group["momentum"] == 0:
            return None
        device = p.to_local().device if p.is_global else p.device
        if state.get("momentum_buffer") is None:   # the first step (or a state saved before it)
            state["momentum_buffer"] = zeros_like(p)
            self._step_constant(device, 2)   # made now, so that the second step is already a steady one
            return self._step_constant(device, 1)
        return self._step_constant(device, 2)

    def _update_op(self, p: Tensor, grad: Tensor, group: dict, state: dict, learning_rate: Tensor,
                   train_step: Tensor | None) -> None:
        """``sgd_update`` (momentum 0) or ``momentum_update`` of ``p`` (see ``Optimizer._update_op``)."""
        if group["momentum"] == 0:
            sgd_update(p, grad, learning_rate, weight_decay=group["weight_decay"], maximize=group["maximize"])
            return
        momentum_update(p, grad, state["momentum_buffer"], learning_rate, train_step, momentum=group["momentum"],
                        dampening=group["dampening"], nesterov=group["nesterov"],
                        weight_decay=group["weight_decay"], maximize=group["maximize"])
