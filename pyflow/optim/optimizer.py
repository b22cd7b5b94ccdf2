"""``Optimizer``: the base class of every optimizer (parameter groups, state, ``step``, ``state_dict``).

An optimizer holds *references* to the parameters it updates, never copies:

* ``param_groups`` - a list of dicts.  Each has ``"params"`` (a list of leaf tensors
  that require grad) and one value per hyperparameter (``"lr"``, ``"momentum"``...).
  A group's own values override the optimizer's ``defaults``, so two layers can
  train with two learning rates.  A scheduler (``pyflow/optim/lr_scheduler.py``)
  changes ``group["lr"]`` between steps.
* ``state`` - a dict from parameter to that parameter's own dict (a momentum
  buffer, Adam's moving averages, a step count).  It fills in on the first step.
* ``step()`` - for every parameter whose ``.grad`` is set, in every group, under
  ``flow.no_grad()``: ``_prepare`` makes the missing state and advances the step
  count, then ``_update_op`` issues **one fused update op** (``sgd_update``,
  ``momentum_update`` or ``adam_update``, ``pyflow/ops/optim_update.py``, as
  OneFlow's optimizers do) that changes ``p`` and its state **in place**.  It is
  one VM instruction on the parameter's device and stream, so a trace of a
  training step shows every update, after the backward instructions that made
  the gradients (the VM orders them by the tensors they read and write).
* **The learning rate and the step are tensors.**  The op reads the learning rate
  from a 0-d tensor (float32; float64 for float64 parameters) that the optimizer
  keeps per (param group, device, dtype) and refills, with one ``fill``
  instruction, only when ``group["lr"]`` changed (a scheduler's step); Adam's
  ``state["step"]`` is a 0-d int64 tensor on the parameter's device, as in
  PyTorch >= 1.12.  A compiled graph that traced the step once therefore stays
  right as the lr and the step count change.
* ``_update_op(p, grad, group, state, learning_rate, train_step)`` - **the hook for
  other code** (the compiler's optimizer pass): the fused update of ONE
  parameter, with the lr and step tensors given explicitly (0-d float32/float64
  and int64 on ``p``'s device; ``train_step`` is the 1-based number of this step).
  It issues exactly one op and nothing else: ``state`` must already hold the
  state tensors (``_prepare`` makes them, or the caller's own of the same
  shapes), and for a global parameter every tensor passed is its local piece.
  ``step()`` calls this same method, so eager and compiled updates are one
  definition.
* ``zero_grad()`` - forget the gradients before the next backward (which *adds*
  into ``.grad``).
* ``state_dict()`` / ``load_state_dict()`` - PyTorch's checkpoint format.
  ``"param_groups"`` lists each group's hyperparameters, with its parameters
  replaced by integer ids (0, 1, 2... in group order).  ``"state"`` maps those
  ids to the per-parameter state.

**Global parameters** (``pyflow/distributed``).  OneFlow's convention: the gradient
of a global parameter has the *dual* SBP of the parameter.  A parameter broadcast
on every rank (B) gets a partial-sum gradient (P): each rank holds the gradient
of its own slice of the batch, and the true gradient is their sum.
``_gradient`` boxes it to the parameter's SBP before use,
``g.to_global(placement=p.placement, sbp=p.sbp)``.  P -> B is an all-reduce, the
one collective of data-parallel training; ``step`` runs it once for all such
gradients, on one flat bucket of them (``_gradients``).  The update then runs on every rank's
piece, and the state tensors (``flow.zeros_like(p)``) are global with the
parameter's layout.

>>> import pyflow as flow
>>> w = flow.tensor([1.0, 2.0], requires_grad=True)
>>> b = flow.tensor([0.5], requires_grad=True)
>>> opt = flow.optim.SGD([{"params": [w]}, {"params": [b], "lr": 1.0}], lr=0.1)
>>> w.grad, b.grad = flow.tensor([1.0, -1.0]), flow.tensor([0.25])
>>> opt.step()
>>> w.tolist(), b.tolist()
([0.9, 2.1], [0.25])
>>> opt.state_dict()["param_groups"][1]["params"], opt.param_groups[1]["lr"]
([1], 1.0)
>>> opt.zero_grad()
>>> w.grad is None
True
"""

from __future__ import annotations

import collections
import copy
import math
import numbers
from collections.abc import Callable, Iterable

import numpy as np

from pyflow import env
from pyflow.autograd import enable_grad, no_grad
from pyflow.distributed.global_tensor import make_global, to_local
from pyflow.errors import ArgumentTypeError, OptimizerError
from pyflow.framework.movement import cat
from pyflow.framework.sbp import SbpParallel
from pyflow.framework.tensor import Tensor, tensor

__all__ = ["Optimizer", "OptimizerError"]


def _describe(p: Tensor) -> str:
    where = f"global on {p.placement} with sbp {p.sbp}" if p.is_global else f"on {p.device}"
    return f"{p.dtype}{list(p.shape)} {where}"


def check_range(name: str, value, low: float, high: float | None = None, *, high_open: bool = True) -> None:
    """Raise ``OptimizerError`` unless ``low <= value`` (and ``value < high``, or ``<=`` if not ``high_open``)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        upper = "" if high is None else f" and {'<' if high_open else '<='} {high}"
        raise OptimizerError(f"invalid {name}: {value!r} (it must be a number >= {low}{upper})")


class Optimizer:
    """Base class: holds ``param_groups`` and ``state``; subclasses write ``_update`` (and
    ``_check_group`` for their hyperparameters).

    ``params``: an iterable of tensors (one group), or of dicts, each with ``"params"``
    and any hyperparameters that differ from ``defaults`` for that group.
    """

    def __init__(self, params: Iterable, defaults: dict) -> None:
        if isinstance(params, Tensor) or isinstance(params, dict):
            raise ArgumentTypeError(f"{type(self).__name__}: params must be an iterable of tensors or of dicts "
                                    f"(param groups), got a single {type(params).__name__}; wrap it in a list")
        if isinstance(params, (set, frozenset)):
            raise ArgumentTypeError(f"{type(self).__name__}: params must be an ordered iterable (a list), not a set: "
                                    "state_dict() refers to parameters by their position")
        self.defaults = dict(defaults)
        self.param_groups: list[dict] = []
        self.state: dict = collections.defaultdict(dict)   # parameter -> its state dict
        self._lr_tensors: dict = {}    # (id(group), device, dtype) -> [group, lr value, 0-d lr tensor]
        self._step_constants: dict = {}   # (device, value) -> a 0-d int64 tensor holding value
        groups = list(params)
        if not groups:
            raise OptimizerError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    # --- parameter groups ----------------------------------------------------------------

    def add_param_group(self, param_group: dict) -> None:
        """Add a group (``{"params": [...], "lr": ...}``); missing hyperparameters take the defaults.

        Every parameter must be a leaf tensor that requires grad, and belong to one group only.
        """
        name = type(self).__name__
        if not isinstance(param_group, dict):
            raise ArgumentTypeError(f"{name}: a param group must be a dict, got {type(param_group).__name__}")
        if "params" not in param_group:
            raise OptimizerError(f"{name}: a param group needs a 'params' entry, got keys {sorted(param_group)}")
        group = dict(param_group)
        params = group["params"]
        if isinstance(params, (set, frozenset)):
            raise ArgumentTypeError(f"{name}: a group's params must be ordered (a list), not a set")
        group["params"] = params = [params] if isinstance(params, Tensor) else list(params)
        for i, p in enumerate(params):
            self._check_param(p, i)
        seen = {id(q) for other in self.param_groups for q in other["params"]}
        for i, p in enumerate(params):
            if id(p) in seen:
                raise OptimizerError(f"{name}: parameter {i} of the new group ({_describe(p)}) is listed twice "
                                     "(in this group or in an earlier one); each parameter belongs to one group")
            seen.add(id(p))
        for key, default in self.defaults.items():
            group.setdefault(key, default)
        self._check_group(group)
        self.param_groups.append(group)

    def _check_param(self, p, index: int) -> None:
        name = type(self).__name__
        if not isinstance(p, Tensor):
            raise ArgumentTypeError(f"{name}: parameter {index} is a {type(p).__name__}, not a tensor")
        if not p.is_leaf:
            op = getattr(p.grad_fn, "name", p.grad_fn)
            raise OptimizerError(f"{name}: parameter {index} ({_describe(p)}) is not a leaf tensor (it was computed "
                                 f"by op {op!r}); optimize the tensor it was computed from, or a "
                                 ".detach().requires_grad_() copy")
        if not p.requires_grad:
            raise OptimizerError(f"{name}: parameter {index} ({_describe(p)}) does not require grad: backward "
                                 "would never give it a gradient; call .requires_grad_() on it first")

    def _check_group(self, group: dict) -> None:
        """Validate one group's hyperparameters (subclasses extend this); the base checks ``lr``."""
        check_range(f"learning rate (lr) of {type(self).__name__}", group.get("lr"), 0.0)

    # --- gradients and the step --------------------------------------------------------------

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget every parameter's gradient: ``p.grad = None`` (the default, which frees the memory), or,
        with ``set_to_none=False``, fill the existing gradients with zeros in place."""
        for group in self.param_groups:
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if grad.grad_fn is not None:   # a gradient recorded with create_graph: cut it loose
                        grad = p.grad = grad.detach()
                    with no_grad():
                        grad.zero_()

    def step(self, closure: Callable | None = None):
        """One update of every parameter that has a gradient; returns ``closure()``'s loss, if given.

        ``closure`` (re-evaluates the model and returns the loss) runs first, with grad mode on.
        """
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            todo = [(p, group) for group in self.param_groups for p in group["params"] if p.grad is not None]
            grads = self._gradients(todo)   # every all-reduce first: see _step_parameter
            for (p, group), grad in zip(todo, grads):
                self._step_parameter(p, group, grad)
        return loss

    def _step_parameter(self, p: Tensor, group: dict, grad: Tensor) -> None:
        """One parameter's update with its (boxed) gradient: its state made and advanced, the fused op.

        ``step`` boxes every gradient before the first update, as OneFlow's data parallel all-reduces
        the gradients before the optimizer runs: the updates then follow one another on the compute
        stream, which the VM may fuse into one instruction as it does for local parameters, instead of
        each waiting for its own all-reduce between two collectives.
        """
        if p.is_global and any(s.is_partial for s in p.sbp):
            raise OptimizerError(f"{type(self).__name__}: parameter {_describe(p)} is a partial sum; the "
                                 "update is not linear in it: box it to broadcast or split first")
        state = self.state[p]
        train_step = self._prepare(p, group, state)   # on every rank: making global state talks to all of them
        if p.is_global and not p.placement.has(env.get_rank()):
            return   # this rank holds no piece of p
        piece = _local(p)
        learning_rate = self._learning_rate(group, piece.device, piece.dtype)
        local_state = {key: _local(value) for key, value in state.items()} if p.is_global else state
        self._update_op(piece, _local(grad), group, local_state, learning_rate, train_step)

    def _gradients(self, todo: list) -> list:
        """The gradients of ``todo``'s ``(p, group)`` pairs, each boxed to its parameter's SBP (``_gradient``).

        The partial-sum gradients of broadcast parameters (data parallel's) are all-reduced together,
        as one flat bucket per placement and dtype (``_all_reduced_together``): one collective for the
        whole model instead of one per parameter, as OneFlow's ``DistributedDataParallel`` buckets its
        gradients.  A sum is elementwise, so the values are those of one all-reduce per gradient.
        """
        grads = [p.grad for p, _ in todo]
        buckets: dict = collections.defaultdict(list)   # (placement, SBPs, dtype) -> indices into todo
        for i, (p, group) in enumerate(todo):
            g = grads[i]
            if _bucketable(p, g):
                buckets[(p.placement, tuple(g.sbp), tuple(p.sbp), g.dtype)].append(i)
            else:
                grads[i] = self._gradient(p, group)
        for (_, _, sbp, _), members in buckets.items():
            if len(members) == 1:
                grads[members[0]] = self._gradient(*todo[members[0]])
                continue
            for i, reduced in zip(members, _all_reduced_together([grads[i] for i in members], sbp)):
                grads[i] = reduced
        return grads

    def _gradient(self, p: Tensor, group: dict) -> Tensor:
        """``p.grad``, boxed to ``p``'s SBP when ``p`` is global (``maximize`` is the update op's attribute)."""
        grad = p.grad
        if p.is_global and grad.is_global and (grad.placement != p.placement or tuple(grad.sbp) != tuple(p.sbp)):
            grad = grad.to_global(placement=p.placement, sbp=p.sbp)   # B's gradient is P: an all-reduce
        return grad

    def _prepare(self, p: Tensor, group: dict, state: dict) -> Tensor | None:
        """Before ``p``'s update: make the state it lacks and advance its step count; returns the
        ``train_step`` tensor for ``_update_op`` (0-d int64 on ``p``'s device, or its local piece's), or
        None if the update needs none.  Subclasses define it."""
        raise NotImplementedError(f"{type(self).__name__} does not define _prepare (its state)")

    def _update_op(self, p: Tensor, grad: Tensor, group: dict, state: dict, learning_rate: Tensor,
                   train_step: Tensor | None) -> None:
        """Issue the fused update of ONE parameter ``p`` (one op, in place on ``p`` and ``state``'s tensors).

        ``learning_rate``: a 0-d float32 (or float64) tensor; ``train_step``: a 0-d int64 tensor,
        the 1-based number of this step; both on ``p``'s device, as every other tensor given.
        ``state`` must hold the tensors the op updates (``_prepare`` makes them).  Nothing is
        read from ``group["lr"]`` or from ``state["step"]``: the caller's tensors are used, so a
        graph traced with this call follows whatever those tensors hold later.  Subclasses
        define it; ``step()`` calls it for every parameter with a gradient.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define _update_op (the update rule)")

    def _learning_rate(self, group: dict, device, dtype) -> Tensor:
        """``group["lr"]`` as a 0-d tensor on ``device``: float64 for float64 parameters, else float32.

        Made once per (group, device, dtype) and refilled in place (one ``fill``) only when
        ``group["lr"]`` changed, so the same tensor serves every step.
        """
        lr_dtype = np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)
        key = (id(group), device, lr_dtype)
        value = group["lr"]
        cached = self._lr_tensors.get(key)
        if cached is None or cached[0] is not group:   # a new group (or a dead one's id reused)
            cached = self._lr_tensors[key] = [group, value, tensor(value, dtype=lr_dtype, device=device)]
        elif cached[1] != value:
            cached[2].fill_(value)
            cached[1] = value
        return cached[2]

    def _step_constant(self, device, value: int) -> Tensor:
        """A 0-d int64 tensor holding ``value`` on ``device``, made once (read-only: a fixed train_step, or
        the 1 that advances a step count)."""
        key = (device, value)
        found = self._step_constants.get(key)
        if found is None:
            found = self._step_constants[key] = tensor(value, dtype=np.int64, device=device)
        return found

    # --- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """``{"state": {id: {...}}, "param_groups": [{..., "params": [ids]}]}`` (PyTorch's format).

        A snapshot: the state tensors are cloned, so later steps do not change it (PyTorch
        returns references instead).
        """
        ids: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {key: copy.deepcopy(value) for key, value in group.items() if key != "params"}
            packed["params"] = [ids.setdefault(id(p), len(ids)) for p in group["params"]]
            groups.append(packed)
        state = {ids[id(p)]: {key: _copied(value) for key, value in per_param.items()}
                 for p, per_param in self.state.items() if per_param and id(p) in ids}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Take hyperparameters and state from ``state_dict`` (made by ``state_dict()`` of an optimizer
        of the same kind with groups of the same sizes); the parameters stay this optimizer's own.

        State tensors are copied onto each parameter's device (and layout, for a global one)
        and, when floating point, cast to its dtype.
        """
        name = type(self).__name__
        if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= set(state_dict):
            raise OptimizerError(f"{name}.load_state_dict: expected a dict with 'state' and 'param_groups' "
                                 f"(from state_dict()), got {type(state_dict).__name__}")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise OptimizerError(f"{name}.load_state_dict: the state dict has {len(saved_groups)} param groups, "
                                 f"this optimizer {len(self.param_groups)}")
        by_id = {}
        for k, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if len(group["params"]) != len(saved["params"]):
                raise OptimizerError(f"{name}.load_state_dict: param group {k} has {len(saved['params'])} "
                                     f"parameters in the state dict, {len(group['params'])} here")
            by_id.update(zip(saved["params"], group["params"]))
        state = collections.defaultdict(dict)
        for key, per_param in state_dict["state"].items():
            if key not in by_id:
                raise OptimizerError(f"{name}.load_state_dict: state for parameter id {key!r}, which no param "
                                     f"group lists (ids: {sorted(by_id)})")
            p = by_id[key]
            state[p] = {entry: _onto(value, p, entry) for entry, value in per_param.items()}
        groups = []
        for group, saved in zip(self.param_groups, saved_groups):
            loaded = {key: copy.deepcopy(value) for key, value in saved.items() if key != "params"}
            loaded["params"] = group["params"]
            self._check_group(loaded)
            groups.append(loaded)
        self.param_groups, self.state = groups, state
        self._lr_tensors.clear()   # those of the replaced groups; the new groups make their own at the next step

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for k, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {k}")
            lines += [f"    {key}: {group[key]}" for key in sorted(group) if key != "params"]
        return "\n".join(lines + [")"])


def _bucketable(p: Tensor, grad: Tensor) -> bool:
    """Is ``grad`` a partial sum that boxes to its broadcast parameter ``p`` by an all-reduce, on this rank?

    Then flattening it changes nothing (every element is summed on its own).  A rank outside the
    placement holds no piece, runs no collective of it and skips the update: nothing to bucket.
    """
    return (p.is_global and grad.is_global and grad.placement == p.placement and p.placement.has(env.get_rank())
            and all(s.is_partial for s in grad.sbp) and all(s.is_broadcast for s in p.sbp))


def _all_reduced_together(grads: list, sbp: tuple) -> list:
    """Partial-sum ``grads`` (one placement and dtype) boxed to broadcast ``sbp`` by ONE collective.

    Each rank concatenates its pieces, flattened, into one 1-D partial sum, boxes it (an all-reduce)
    and hands out views of the result, of the gradients' shapes.
    """
    placement, dtype = grads[0].placement, grads[0].dtype
    flat = cat([to_local(g).reshape(-1) for g in grads])
    summed = to_local(make_global(flat, placement, grads[0].sbp, tuple(flat.shape), dtype).to_global(sbp=sbp))
    reduced, offset = [], 0
    for g in grads:
        size = math.prod(g.shape)
        piece = summed.narrow(0, offset, size).reshape(tuple(g.shape))
        reduced.append(make_global(piece, placement, sbp, tuple(g.shape), dtype))
        offset += size
    return reduced


def _local(value):
    """A global tensor's local piece (same memory); anything else as it is."""
    return value.to_local() if isinstance(value, Tensor) and value.is_global else value


def _copied(value):
    """A state entry for a state dict: tensors cloned, anything else deep-copied."""
    if isinstance(value, Tensor):
        with no_grad():
            return value.clone()
    return copy.deepcopy(value)


def _onto(value, p: Tensor, entry: str):
    """A loaded state entry, as a new tensor with ``p``'s device (or placement and SBP) and float dtype."""
    if not isinstance(value, Tensor):
        return copy.deepcopy(value)
    with no_grad():
        if value.dtype.kind == "f" and p.dtype.kind == "f" and entry != "step":
            value = value.to(dtype=p.dtype)
        if p.is_global:
            if not value.is_global:
                raise OptimizerError(f"load_state_dict: state {entry!r} of global parameter {_describe(p)} is a "
                                     "local tensor; save it from an optimizer of global parameters")
            sbp = p.sbp if value.ndim else (SbpParallel("broadcast"),) * len(p.placement.hierarchy)   # 0-d: B
            return value.to_global(placement=p.placement, sbp=sbp).clone()
        return value.to(device=p.device, copy=True)
