"""Pass ``optimizer``: the update ops of every ``add_optimizer`` (OneFlow's optimizer job pass).

For each parameter with a gradient (``job.variable_grads``, made by the autograd
pass) the pass records the optimizer's fused update op (``sgd_update``,
``momentum_update``, ``adam_update``: the very ops the eager ``step()`` issues,
``Optimizer._update_op``), which writes the parameter and the optimizer state in
place.  Three things are *tensors* the graph reads at every call, so that a graph
traced once stays right:

* the optimizer state (momentum buffers, Adam's averages): eager tensors made here,
  before the first call, shared with the eager optimizer (``optimizer.state``);
* the learning rate of each param group: a 0-d float32 tensor, refilled before every
  call from ``group["lr"]`` (an lr scheduler changes it between calls);
* the step count (Adam's bias correction, SGD's first momentum step): a 0-d int64
  tensor, refilled before every call.

Those refills are ``job.feeds``: ``(tensor, function giving its value)``; the values are
taken when a call is launched (the runtime's ``call_context``) and written by that tensor's
``variable`` task when it acts for that call, so pipelined calls each see their own.  Gradients were already scaled by ``1 / k`` (the
autograd pass) and Acc'ed over the micro-batches, so the update runs once per call.
"""

from __future__ import annotations

from pyflow.compiler.lazy import paused
from pyflow.framework import creation
from pyflow.framework.placement import placement as Placement
from pyflow.framework.sbp import SbpParallel

__all__ = ["run"]


def run(job, tracer) -> None:
    if not job.optimizers:
        return
    grads = job.variable_grads
    stages = {op.name: op.stage for op in job.ops}
    by_tensor = {id(t): name for name, t in job.variables.items()}
    for optim, _ in job.optimizers:
        if not hasattr(optim, "_graph_steps"):
            with paused():
                optim._graph_steps = _steps_taken(optim)
        steps: dict = {}
        for group in optim.param_groups:
            lrs: dict = {}
            for p in group["params"]:
                name = by_tensor.get(id(p))
                if name is None or name not in grads:
                    continue   # not used by build, or no gradient reaches it
                device = p.placement if p.is_global else p.device   # a global parameter's: B on its placement
                with paused():
                    if device not in lrs:
                        lrs[device] = _scalar("float32", device)
                        job.feeds.append((lrs[device], lambda group=group: float(group["lr"])))
                    if device not in steps:
                        steps[device] = _scalar("int64", device)
                        job.feeds.append((steps[device], lambda optim=optim: optim._graph_steps + 1))
                    state = optim.state[p]
                    _make_state(optim, p, group, state)
                tracer.stage, tracer.line = stages[name], f"update of {job.variable_names.get(name, name)}"
                grad = tracer.lazy_of(grads[name])
                optim._update_op(p, grad, group, state, lrs[device], steps[device])
    tracer.stage = tracer.line = None


def _scalar(dtype: str, where):
    """A 0-d zero on a device, or global and B on a placement (every rank holds the same value)."""
    if isinstance(where, Placement):
        return creation.tensor(0, dtype=dtype, placement=where, sbp=(SbpParallel("broadcast"),) * len(where.hierarchy))
    return creation.zeros((), dtype=dtype, device=where)


def _steps_taken(optim) -> int:
    """How many steps the optimizer took eagerly before the graph (its state's step counts)."""
    taken = 0
    for state in optim.state.values():
        if "step" in state:
            step = state["step"]
            taken = max(taken, int(step.item() if hasattr(step, "item") else step))
        elif state:
            taken = max(taken, 1)
    return taken


def _make_state(optim, p, group, state: dict) -> None:
    """The state tensors the update op writes (momentum buffer, Adam's averages), made by the optimizer's
    own ``_prepare`` into a scratch dict, so the eager step count is left as it was."""
    scratch: dict = {}
    optim._prepare(p, group, scratch)
    for key, value in scratch.items():
        if key != "step":
            state.setdefault(key, value)
