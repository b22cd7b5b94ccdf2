"""Pass ``grad_acc``: gradient accumulation by time shapes (OneFlow's GradAcc* in lazy_op_interpreter.cpp).

With ``config.set_gradient_accumulation_steps(k)`` one call runs the forward and
backward ops k times, on k micro-batches, and the optimizer once.  A blob's
**time shape** says how often it is made per call: ``(1, 1)`` once, ``(1, k)`` k times.

* each graph input is **Unpacked** along dim 0 into k micro-batches: ``(1, 1) -> (1, k)``
  (the tracer does it as ``build`` starts, so ``build`` sees one micro-batch's shape);
* an op runs as often as its most frequent input (``(1, k)`` if any input is);
* a ``(1, 1)`` blob read by a ``(1, k)`` op (a variable, a constant) is **Repeated**
  k times, so every micro-batch sees it;
* a ``(1, k)`` graph output is **Packed** along dim 0 (a scalar loss comes back as ``(k,)``);
* gradients of variables are **Acc**'ed over the k micro-batches (the autograd pass adds
  those: ``acc``), so the optimizer's inputs are ``(1, 1)`` again.

The helpers ``assign_time_shapes`` and ``insert_repeats`` run again after the passes
that add ops (autograd, optimizer).

Equivalent eager loop (what the tests compare with): for each micro-batch
``(loss_i / k).backward()``, then one ``optimizer.step()``.
"""

from __future__ import annotations

import dataclasses

from pyflow.compiler.job import JobOp, lbn_of

__all__ = ["run", "assign_time_shapes", "insert_repeats", "insert_before"]

ONCE = (1, 1)


def insert_before(job, anchor: str, op: JobOp, descs: list) -> JobOp:
    """Add ``op`` just before op ``anchor`` in the job's order."""
    at = next(i for i, o in enumerate(job.ops) if o.name == anchor)
    return job.add_op(op, descs, at=at)


def assign_time_shapes(job) -> None:
    """Each op's outputs get the time shape of its most frequent input (rules above)."""
    k = job.grad_acc_steps
    for op in job.ops:
        if op.type in ("input", "variable", "acc", "pack") or not op.input_lbns():
            shape = ONCE
        elif op.type in ("unpack", "repeat"):
            shape = (1, k)
        else:
            shape = max((job.blobs[x].time_shape for x in op.input_lbns()), key=lambda s: s[1])
        for lbn in op.outputs:
            job.blobs[lbn].time_shape = shape


def insert_repeats(job) -> None:
    """A ``(1, 1)`` blob read by a ``(1, k)`` op goes through one ``repeat`` op (shared by its readers)."""
    k = job.grad_acc_steps
    if k == 1:
        return
    repeated: dict[str, str] = {}
    ops, job.ops = job.ops, []   # rebuilt in one pass: each repeat goes just before its first reader
    for op in ops:
        if op.outputs and job.blobs[op.outputs[0]].time_shape != ONCE and op.type not in ("repeat", "unpack"):
            for i, lbn in enumerate(op.inputs):
                if not isinstance(lbn, str) or job.blobs[lbn].time_shape != ONCE or i in op.writes:
                    continue
                if lbn not in repeated:
                    name = job.new_name("repeat")
                    desc = dataclasses.replace(job.blobs[lbn], time_shape=(1, k))
                    job.add_op(JobOp(name, "repeat", [lbn], [lbn_of(name)], {"repeat_num": k}, stage=op.stage,
                                     line=op.line), [desc])
                    repeated[lbn] = lbn_of(name)
                op.inputs[i] = repeated[lbn]
        job.ops.append(op)


def run(job, tracer) -> None:
    k = job.grad_acc_steps
    if k == 1:
        return
    assign_time_shapes(job)
    for name in list(job.output_ops):
        op = job.op(name)
        (lbn,) = op.input_lbns()
        desc = job.blobs[lbn]
        if desc.time_shape == ONCE:
            continue
        pack = job.new_name("pack")
        whole = dataclasses.replace(desc, shape=(desc.shape[0] * k,) + tuple(desc.shape[1:]) if desc.shape else (k,),
                                    time_shape=ONCE)
        insert_before(job, name, JobOp(pack, "pack", [lbn], [lbn_of(pack)], {"pack_num": k}, stage=op.stage,
                                       line=op.line), [whole])
        op.inputs = [lbn_of(pack)]
        job.blobs[op.outputs[0]] = dataclasses.replace(whole)
    insert_repeats(job)
    assign_time_shapes(job)
