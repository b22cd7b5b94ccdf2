"""Learning-rate schedulers: ``LRScheduler`` (the base), ``StepLR``, ``MultiStepLR``, ``ExponentialLR``
and ``CosineAnnealingLR``.

A scheduler changes ``group["lr"]`` of every param group of an optimizer,
once per ``scheduler.step()``, usually once per epoch, after ``optimizer.step()``.
The optimizer reads ``group["lr"]`` at each of its steps.  Nothing here touches a
tensor: learning rates are Python floats on the host.

* ``last_epoch`` counts the scheduler's steps.  Creating the scheduler does the
  first one (``last_epoch`` -1 -> 0) and keeps the optimizer's lr.
* ``base_lrs`` are the groups' ``"initial_lr"``, which the scheduler stores in
  each group when it starts from scratch.
* ``get_last_lr()`` gives the lrs the last step set.  ``state_dict()`` is every
  attribute but the optimizer.

As in PyTorch, each schedule is computed *recursively* from the current
``group["lr"]``, so it composes with other changes of the lr.  Its closed form
in terms of ``last_epoch`` is in each class's docstring.

>>> import pyflow as flow
>>> w = flow.tensor([1.0], requires_grad=True)
>>> opt = flow.optim.SGD([w], lr=1.0)
>>> sched = flow.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
>>> lrs = []
>>> for epoch in range(5):
...     lrs.append(sched.get_last_lr()[0])    # train one epoch with this lr: opt.step()...
...     sched.step()
>>> lrs, sched.last_epoch
([1.0, 1.0, 0.5, 0.5, 0.25], 5)
"""

from __future__ import annotations

import collections
import math
import numbers

from pyflow.errors import ArgumentTypeError
from pyflow.optim.optimizer import Optimizer, OptimizerError, check_range

__all__ = ["LRScheduler", "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR"]


class LRScheduler:
    """Base class: subclasses write ``get_lr()``, the lrs for the new ``last_epoch`` (one per group).

    ``last_epoch=-1`` starts a new schedule; a larger value resumes one, and then every group
    must already hold its ``"initial_lr"`` (from the optimizer's ``load_state_dict``).
    """

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        name = type(self).__name__
        if not isinstance(optimizer, Optimizer):
            raise ArgumentTypeError(f"{name}: expected a pyflow optimizer, got {type(optimizer).__name__}")
        if not isinstance(last_epoch, numbers.Integral) or last_epoch < -1:
            raise OptimizerError(f"{name}: last_epoch must be an int >= -1, got {last_epoch!r}")
        self.optimizer = optimizer
        for k, group in enumerate(optimizer.param_groups):
            if last_epoch == -1:
                group.setdefault("initial_lr", group["lr"])
            elif "initial_lr" not in group:
                raise OptimizerError(f"{name}: resuming at last_epoch={last_epoch}, but param group {k} has no "
                                     "'initial_lr'; load the optimizer's state dict first")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._step_count = 0
        self._is_initial = True   # the step below keeps the optimizer's lrs
        self.step()
        self._is_initial = False

    def get_lr(self) -> list:
        """The lr of every param group for epoch ``self.last_epoch`` (already advanced)."""
        raise NotImplementedError(f"{type(self).__name__} does not define get_lr")

    def step(self) -> None:
        """Advance one epoch: ``last_epoch += 1`` and write the new lrs into the param groups."""
        self._step_count += 1
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list:
        """The lrs the last ``step()`` set, one per param group."""
        return list(self._last_lr)

    def state_dict(self) -> dict:
        """Every attribute but the optimizer (``last_epoch``, ``base_lrs``, the schedule's settings...)."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore what ``state_dict()`` returned."""
        self.__dict__.update(state_dict)

    def _current_lrs(self) -> list:
        return [group["lr"] for group in self.optimizer.param_groups]


class StepLR(LRScheduler):
    """Multiply the lr by ``gamma`` every ``step_size`` epochs.

    Closed form: ``lr = base_lr * gamma ** (last_epoch // step_size)``.
    """

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        if not isinstance(step_size, numbers.Integral) or isinstance(step_size, bool) or step_size < 1:
            raise OptimizerError(f"StepLR: step_size must be an int >= 1, got {step_size!r}")
        check_range("gamma of StepLR", gamma, 0.0)
        self.step_size = int(step_size)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._current_lrs()
        return [lr * self.gamma for lr in self._current_lrs()]


class MultiStepLR(LRScheduler):
    """Multiply the lr by ``gamma`` at each epoch listed in ``milestones`` (a milestone listed twice
    multiplies twice, as PyTorch's ``Counter``).

    Closed form: ``lr = base_lr * gamma ** bisect_right(sorted(milestones), last_epoch)``.
    """

    def __init__(self, optimizer: Optimizer, milestones, gamma: float = 0.1, last_epoch: int = -1) -> None:
        try:
            listed = list(milestones)
        except TypeError:
            raise ArgumentTypeError(f"MultiStepLR: milestones must be a list of epochs, got {milestones!r}") from None
        if any(not isinstance(m, numbers.Integral) or isinstance(m, bool) for m in listed):
            raise OptimizerError(f"MultiStepLR: milestones must be ints, got {listed!r}")
        check_range("gamma of MultiStepLR", gamma, 0.0)
        self.milestones = collections.Counter(int(m) for m in listed)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        if self.last_epoch not in self.milestones:
            return self._current_lrs()
        return [lr * self.gamma ** self.milestones[self.last_epoch] for lr in self._current_lrs()]


class ExponentialLR(LRScheduler):
    """Multiply the lr by ``gamma`` every epoch.  Closed form: ``lr = base_lr * gamma ** last_epoch``."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        check_range("gamma of ExponentialLR", gamma, 0.0)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        if self.last_epoch == 0:
            return self._current_lrs()
        return [lr * self.gamma for lr in self._current_lrs()]


class CosineAnnealingLR(LRScheduler):
    """Follow a cosine from ``base_lr`` down to ``eta_min`` over ``T_max`` epochs (and back up after).

    Closed form: ``lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * last_epoch / T_max)) / 2``.
    The step uses PyTorch's recursive form instead, so the lrs equal PyTorch's to the last bit.
    It rescales the distance to ``eta_min`` by the ratio of two consecutive cosine terms.
    At the bottom of the curve that ratio would be 0/0, so the step adds the increment there.
    """

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,  # noqa: N803 - torch's name
                 last_epoch: int = -1) -> None:
        if not isinstance(T_max, numbers.Integral) or isinstance(T_max, bool) or T_max < 1:
            raise OptimizerError(f"CosineAnnealingLR: T_max must be an int >= 1, got {T_max!r}")
        check_range("eta_min of CosineAnnealingLR", eta_min, 0.0)
        self.T_max = int(T_max)
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list:
        epoch, t_max, eta_min = self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return self._current_lrs()
        if (epoch - 1 - t_max) % (2 * t_max) == 0:   # just past the bottom: add the increment
            return [lr + (base - eta_min) * (1 - math.cos(math.pi / t_max)) / 2
                    for base, lr in zip(self.base_lrs, self._current_lrs())]
        return [(1 + math.cos(math.pi * epoch / t_max)) / (1 + math.cos(math.pi * (epoch - 1) / t_max))
                * (lr - eta_min) + eta_min for lr in self._current_lrs()]
