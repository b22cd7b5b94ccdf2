"""Pass ``autograd``: the backward ops of a Job, made by the ops' own backward rules (seed 004).

``loss.backward()`` inside ``build`` only marks the loss.  This pass walks the Job's
ops from the loss back to the variables, in reverse order, and calls each op's
``OpDef.backward`` (the very rule eager autograd calls) with a ``JobCtx`` whose
inputs and outputs are lazy tensors; the rule's ops are recorded into the Job by
the tracer.  It is the eager engine's walk, done once at compile time:

1. ``wants``: the blobs that lead to a variable that requires grad (only those need
   a gradient; ``x.detach()`` and integer results stop it);
2. the loss's gradient is ``1 / k`` (gradient accumulation: OneFlow's
   ScaleModelDiffByLossInstanceNum; eager: ``(loss / k).backward()``), Repeated k
   times: a gradient is made once per micro-batch, like the blob it belongs to;
3. for each op in reverse order with a gradient for an output: run its rule, add the
   results into its inputs' gradients (``+``, recorded too);
4. a variable's gradient: with gradient accumulation the forward read it through a
   ``repeat``, so the gradient of the repeat's output is ``acc``'ed over the k
   micro-batches: ``job.variable_grads[variable op] = lbn``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pyflow.compiler.job import JobOp, lbn_of
from pyflow.compiler.lazy import LazyTensor
from pyflow.compiler.passes.grad_acc import assign_time_shapes, insert_repeats
from pyflow.errors import CompileError
from pyflow.framework import creation
from pyflow.framework.op_registry import get_op
from pyflow.framework.sbp import SbpParallel

__all__ = ["run", "JobCtx"]


class JobCtx:
    """What a backward rule sees (the eager ``Node``'s interface), for one Job op."""

    def __init__(self, job, tracer, op: JobOp, wants: set):
        self.name, self._job, self._tracer, self._op = op.type, job, tracer, op
        self.attrs = {k: v for k, v in op.attrs.items() if not k.startswith("_")}
        self.inputs = [self._lazy(x) for x in op.inputs]
        if any(not isinstance(x, str) for x in op.inputs):   # Python numbers: tensors, as eager saves them
            from pyflow.framework import interpreter

            dtypes = interpreter.infer_logical(get_op(op.type), self.inputs, self.attrs).dtypes
            like = job.blobs[op.outputs[0]]
            self.inputs = [x if isinstance(x, LazyTensor) else constant(x, d, like)
                           for x, d in zip(self.inputs, dtypes)]
        self.outputs = [self._lazy(x) for x in op.outputs]
        descs = [job.blobs[x] if isinstance(x, str) else None for x in op.inputs]
        self.input_shapes = [d.shape if d else None for d in descs]
        self.input_dtypes = [d.dtype if d else None for d in descs]
        self.input_places = [d.device if d else None for d in descs]
        self.input_layouts = [(d.placement, tuple(d.sbp)) if d and d.placement is not None else None for d in descs]
        self.output_shapes = [job.blobs[x].shape for x in op.outputs]
        self._needs = [isinstance(x, str) and x in wants for x in op.inputs]

    def _lazy(self, x):
        return LazyTensor._make(self._tracer, x, self._job.blobs[x]) if isinstance(x, str) else x

    def needs_grad(self, i: int) -> bool:
        return self._needs[i]

    def zeros_like_input(self, i: int, dtype=None):
        desc = self._job.blobs[self._op.inputs[i]]
        return zeros(desc, dtype or desc.dtype)


def zeros(desc, dtype):
    """Zeros like blob ``desc``, as a blob of the job (rules may write into it in place)."""
    if desc.placement is None:
        return creation.zeros(*desc.shape, dtype=dtype, device=desc.device)
    return constant(np.zeros(desc.shape), dtype, desc).clone()


def constant(value, dtype, like):
    """An eager tensor of ``value`` where blob desc ``like`` lives (on its device, or global and B on its
    placement), made outside the trace: the graph reads it as a variable."""
    from pyflow.compiler.lazy import paused
    from pyflow.framework.tensor import tensor

    with paused():
        if like.placement is None:
            return tensor(value, dtype=dtype, device=like.device)
        whole = (SbpParallel("broadcast"),) * len(like.placement.hierarchy)
        return tensor(value, dtype=dtype, placement=like.placement, sbp=whole)


def _check_no_local_gradient_of_global(job, op: JobOp, wants: set) -> None:
    """A local input of an op with a global output (a local tensor made global) would get its piece of a
    global gradient, and inside nn.Graph a global blob has no ``to_local``: an error naming the op."""
    local = [x for x in op.inputs if isinstance(x, str) and x in wants and job.blobs[x].placement is None]
    if local and any(job.blobs[lbn].placement is not None for lbn in op.outputs):
        raise CompileError(f"the gradient of {op.name} ({op.type} of the local blob {local[0]}, at {op.line}): "
                           "inside nn.Graph a local tensor made global cannot get a gradient yet; make it global "
                           "before the call")


def _wants(job, trainable: set) -> set:
    """The lbns from which a trainable variable can be reached backwards (floating blobs only)."""
    wants = set()
    for op in job.ops:
        if op.type == "variable":
            if op.name in trainable:
                wants.update(op.outputs)
            continue
        if op.type == "view" and op.attrs.get("detach") or op.writes:
            continue
        if any(x in wants for x in op.input_lbns()):
            wants.update(lbn for lbn in op.outputs if job.blobs[lbn].dtype.kind == "f")
    return wants


def run(job, tracer) -> None:
    if job.loss_lbn is None:
        return
    trainable = {name for name, t in job.variables.items() if getattr(t, "requires_grad", False)}
    wants = _wants(job, trainable)
    if job.loss_lbn not in wants:
        raise CompileError(f"loss.backward() in nn.Graph {job.name!r}: the loss {job.loss_lbn} does not depend on "
                           "any parameter that requires grad")
    forward = list(job.ops)
    k = job.grad_acc_steps
    loss = job.blobs[job.loss_lbn]
    seed = creation.full((), 1.0 / k, dtype=loss.dtype, device=loss.device) if loss.placement is None else \
        tracer.lazy(constant(np.array(1.0 / k), loss.dtype, loss))
    if loss.time_shape != (1, 1):   # one seed per micro-batch: every gradient is made k times, then acc'ed
        seed = _repeat(job, seed)
    grads: dict[str, LazyTensor] = {job.loss_lbn: seed}

    def add(lbn: str, grad) -> None:
        grads[lbn] = grad if lbn not in grads else grads[lbn] + grad

    job.variable_grads = {}
    for op in reversed(forward):
        out_grads = [grads.pop(lbn, None) for lbn in op.outputs]
        if all(g is None for g in out_grads) or op.type in ("output", "input", "unpack"):
            continue
        if op.type == "variable":
            if op.name in trainable:
                job.variable_grads[op.name] = out_grads[0]._lbn
            continue
        tracer.stage, tracer.line = op.stage, f"backward of {op.line}"
        if op.type == "repeat":   # the gradients of the k micro-batches add up: acc
            acc = _acc(job, op, out_grads[0])
            add(op.inputs[0], acc)
            continue
        if op.type == "view" and "_op" not in op.attrs:   # only detach() makes one, and it stops the gradient
            raise CompileError(f"the gradient of {op.name} (a view made by no view op, at {op.line}): such a view "
                               "has no backward rule; make it with a view op (expand, reshape, narrow, x[i]...)")
        definition = get_op(op.attrs.get("_op", op.type))   # a view op's JobOp is a ``view``: its own rule
        if not definition.differentiable:
            raise CompileError(f"op {op.name} ({op.type}, at {op.line}) has no backward rule, but the loss needs "
                               "a gradient through it")
        _check_no_local_gradient_of_global(job, op, wants)
        ctx = JobCtx(job, tracer, op, wants)
        ctx.attrs = op.attrs.get("_op_attrs", ctx.attrs)
        out_grads = [g if g is not None else zeros(job.blobs[lbn], job.blobs[lbn].dtype)
                     for g, lbn in zip(out_grads, op.outputs)]
        result = definition.backward(ctx, out_grads if len(out_grads) > 1 else out_grads[0])
        result = list(result) if isinstance(result, (list, tuple)) else [result]
        for x, g in zip(op.inputs, result):
            if g is not None and isinstance(x, str) and x in wants:
                add(x, g)
    tracer.stage = tracer.line = None
    for op in job.ops[len(forward):]:
        op.backward = True
    assign_time_shapes(job)
    insert_repeats(job)
    assign_time_shapes(job)


def _repeat(job, x: LazyTensor) -> LazyTensor:
    name = job.new_name("repeat")
    desc = dataclasses.replace(job.blobs[x._lbn], shape=(), time_shape=(1, job.grad_acc_steps))
    job.add_op(JobOp(name, "repeat", [x._lbn], [lbn_of(name)], {"repeat_num": job.grad_acc_steps},
                     line="loss gradient", backward=True), [desc])
    return LazyTensor._make(x._trace, lbn_of(name), desc)


def _acc(job, repeat: JobOp, grad: LazyTensor) -> LazyTensor:
    """An ``acc`` op: the sum of a ``(1, k)`` gradient over the k micro-batches, made once per call."""
    name = job.new_name("acc")
    desc = dataclasses.replace(job.blobs[grad._lbn], time_shape=(1, 1))
    job.add_op(JobOp(name, "acc", [grad._lbn], [lbn_of(name)], {"acc_num": job.grad_acc_steps},
                     stage=repeat.stage, line=repeat.line, backward=True), [desc])
    return LazyTensor._make(grad._trace, lbn_of(name), desc)
