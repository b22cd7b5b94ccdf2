"""A sequential interpreter of a Plan: run every task once per call, in the Plan's order.

This is the smallest thing that executes a Plan, kept for the tests (and used by
``nn.Graph`` until the actor runtime runs Plans): no threads, no messages, no back
pressure; the tasks run in ``plan.order``, the micro-batch loop k times.  What it
does check is the compiler's output: every regst lives where the memory plan put it
(a view into its device's chunk), so a plan that let two live regsts overlap gives
wrong numbers here.

Each task kind, at micro-batch ``j``:

============  ===========================================================================
compute/copy  the op itself: ``apply(op, inputs, out=[its regsts])`` (the eager op, so
              eager and graph share one definition); ``view``: a contiguous copy of the view
variable      binds the eager tensor (parameters persist across calls)
input         binds the call's input
unpack        micro-batch j of its input (rows ``j*b .. (j+1)*b``)
repeat        passes its input on (alias)
acc           j = 0: copies its input; later: adds it (the gradient sum over micro-batches)
pack          writes its input into rows ``j*b ..`` of its output
output        a fresh eager tensor with the value (the user keeps it)
tick          nothing
============  ===========================================================================
"""

from __future__ import annotations

import numpy as np

from pyflow.framework.creation import empty
from pyflow.framework.interpreter import apply
from pyflow.framework.op_registry import get_op
from pyflow.framework.tensor import Tensor, _StorageHandle, _Version
from pyflow.vm.eager_blob_object import EagerBlobObject

__all__ = ["run_plan"]


def _chunks(plan) -> dict:
    """One uint8 eager tensor per (rank, device) chunk, made once per plan."""
    chunks = getattr(plan, "_chunk_tensors", None)
    if chunks is None:
        chunks = {}
        for key, size in plan.memory.block_sizes.items():
            device = key.split("/", 1)[1]
            chunks[key] = empty(max(int(size), 1), dtype="uint8", device=device)
        plan._chunk_tensors = chunks
    return chunks


def _planned_tensor(plan, chunks: dict, regst) -> Tensor:
    chunk = chunks[plan.chunk_key(regst)]
    dtype = np.dtype(regst.dtype)
    offset = plan.memory.offsets[regst.id]
    blob = EagerBlobObject(chunk._blob.storage, regst.shape, dtype, None, offset // dtype.itemsize)
    return Tensor._wrap(blob, chunk._handle, _Version())


def run_plan(plan, inputs: list, job) -> list:
    """Run one call of ``plan``: ``inputs`` are the graph's eager inputs; returns its outputs in order."""
    for tensor, value in job.feeds:   # learning rates, step counts: refreshed per call
        tensor.fill_(value())
    chunks = _chunks(plan)
    values: dict[int, Tensor] = {}   # regst id -> the tensor it is this call
    for regst in plan.regsts.values():
        if regst.mem == "planned":
            values[regst.id] = _planned_tensor(plan, chunks, regst)
    outputs: dict[int, Tensor] = {}
    start, end = plan.loop
    order = plan.order
    for tid in order[:start]:
        _run_task(plan, plan.tasks[tid], values, inputs, job, outputs, 0)
    for j in range(plan.loop_times if end > start else 0):
        for tid in order[start:end]:
            _run_task(plan, plan.tasks[tid], values, inputs, job, outputs, j)
    for tid in order[end:]:
        _run_task(plan, plan.tasks[tid], values, inputs, job, outputs, 0)
    return [outputs[i] for i in sorted(outputs)]


def _run_task(plan, task, values: dict, inputs: list, job, outputs: dict, j: int) -> None:
    op_type, op_inputs, attrs = plan.op_attrs[task.op_name]
    produced = [plan.regsts[task.produced[f"out_{i}"]] for i in range(len(task.produced) - ("ctrl" in task.produced))]
    args = [values[task.consumed[f"in_{i}"][0]] if isinstance(x, str) else x for i, x in enumerate(op_inputs)]
    kind = task.kind
    if kind == "tick":
        return
    if kind == "variable":
        values[produced[0].id] = job.variables[task.op_name]
    elif kind == "input":
        values[produced[0].id] = inputs[attrs["index"]]
    elif kind == "repeat":
        values[produced[0].id] = args[0]
    elif kind == "output":
        outputs[attrs["index"]] = args[0].clone()
    elif kind == "unpack":
        b = produced[0].shape[0]
        apply("contiguous", [args[0].narrow(0, j * b, b)], out=[values[produced[0].id]])
    elif kind == "acc":
        out = values[produced[0].id]
        if j == 0:
            apply("contiguous", [args[0]], out=[out])
        else:
            apply("add", [out, args[0]], out=[out])
    elif kind == "pack":
        out = values[produced[0].id]
        b = args[0].shape[0] if args[0].shape else 1
        piece = out.narrow(0, j * b, b).view(*args[0].shape)
        apply("contiguous", [args[0]], out=[piece])
    elif op_type == "view":
        (x,) = args
        view = x._view(attrs["shape"], attrs["strides"], x._blob.offset + attrs["offset"])   # offset: relative
        apply("contiguous", [view], out=[values[produced[0].id]])
    else:
        into = attrs.get("_out_into", ())
        kwargs = {k: v for k, v in attrs.items() if not k.startswith("_")}
        n_in = len(op_inputs) - len(into)
        outs = [args[n_in + list(into).index(i)] if i in into else values[r.id] for i, r in enumerate(produced)]
        k = get_op(op_type).updates_input
        if k is not None and outs:   # the op writes only parts of input k: it starts as a copy of it
            apply("contiguous", [args[k]], out=[outs[0]])
            args[k] = outs[0]
        results = apply(op_type, args[:n_in], out=outs or None, **kwargs)
        for r, result in zip(produced, results):
            if r.mem == "alias":
                values[r.id] = result
