"""``Adagrad``: a per-element learning rate that shrinks with the gradients seen so far (Duchi et al.).

PyTorch's update, for a parameter ``p`` with gradient ``g`` (``-g`` when ``maximize``)::

    step += 1                                        # state["step"], a 0-d int64 tensor
    g = g + weight_decay * p
    clr = lr / (1 + (step - 1) * lr_decay)           # an optional global decay of the lr
    s = s + g * g                                    # state["sum"], starts at initial_accumulator_value
    p = p - clr * g / (sqrt(s) + eps)

Elements with large or frequent gradients get small steps, rare ones large steps (good for
sparse features); since ``s`` only grows, the steps shrink forever, which RMSprop and Adam
fix with a moving average.  As PyTorch, the state is made when the optimizer is (so
``state_dict()`` has it before the first step).  The update is a composition of in-place
tensor ops under ``no_grad`` (no fused op of its own).

>>> import pyflow as flow
>>> w = flow.tensor([1.0], requires_grad=True)
>>> opt = flow.optim.Adagrad([w], lr=0.5)
>>> w.grad = flow.tensor([3.0])
>>> opt.step()                      # s = 9: w -= 0.5 * 3 / 3
>>> round(w.item(), 6), opt.state[w]["sum"].tolist()
(0.5, [9.0])
"""

from __future__ import annotations

from collections.abc import Iterable

from pyflow.framework.creation import full_like
from pyflow.framework.tensor import Tensor
from pyflow.optim.optimizer import Optimizer, check_range
from pyflow.optim.rmsprop import advance_step, decayed_gradient

__all__ = ["Adagrad"]


class Adagrad(Optimizer):
    """``Adagrad(params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10, *,
    maximize=False)``."""

    def __init__(self, params: Iterable, lr: float = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
                 initial_accumulator_value: float = 0, eps: float = 1e-10, *, maximize: bool = False) -> None:
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay, eps=eps,
                                      initial_accumulator_value=initial_accumulator_value, maximize=maximize))
        for group in self.param_groups:
            for p in group["params"]:
                self._make_state(p, group, self.state[p])

    def _check_group(self, group: dict) -> None:
        super()._check_group(group)
        for key in ("lr_decay", "weight_decay", "initial_accumulator_value", "eps"):
            check_range(f"{key} of Adagrad", group[key], 0.0)

    @staticmethod
    def _make_state(p: Tensor, group: dict, state: dict) -> None:
        if "sum" not in state:
            state["sum"] = full_like(p, group["initial_accumulator_value"])

    def _prepare(self, p: Tensor, group: dict, state: dict) -> Tensor:
        """The sum (for a group added later, or a state dict without it); ``step += 1``."""
        self._make_state(p, group, state)
        return advance_step(self, p, state)

    def _update_op(self, p: Tensor, grad: Tensor, group: dict, state: dict, learning_rate: Tensor,
                   train_step: Tensor) -> None:
        """The update above, as in-place tensor ops on ``p`` and ``state["sum"]``."""
        g = decayed_gradient(p, grad, group)
        clr = learning_rate / ((train_step - 1).to(dtype=learning_rate.dtype) * group["lr_decay"] + 1.0)
        total = state["sum"]
        total.add_(g * g)
        p.sub_(g / (total.sqrt() + group["eps"]) * clr)
