"""Pass ``pipeline_buffer``: regst counts that let pipeline stages work on different micro-batches at once.

With ``set_stage``, each stage runs on its own devices; with gradient accumulation,
stage 0 can start micro-batch j+1 while stage 1 still works on micro-batch j - but
only if the regsts between them can hold more than one piece (the actor runtime's
back pressure: a producer waits for a free regst).  OneFlow's
``pipeline_buffer_pass.cpp`` sizes them; pyflow gives the same numbers to the op
whose output regst is the buffer (``attrs["_buffer_size"]``, read by the TaskGraph
as that regst's regst num).  With ``total = max stage + 1``:

==============================================  =========================================
edge                                            regst num
==============================================  =========================================
forward, stage s -> stage d > s                 1 on the source side (the default), d - s
                                                on the destination side (the move op)
backward, to a lower stage                      1 and 1 (the defaults)
a forward output read by a backward op, in a    2 x total (the activation waits for its
stage before the last                           gradient while later micro-batches pass)
a cpu -> cuda copy from stage 0 into the last   2 x total (labels read by the loss)
stage
==============================================  =========================================

A larger regst num is never shared by the memory planner (it lives through the whole
call), so buffers cost memory exactly as they do in OneFlow.
"""

from __future__ import annotations

from pyflow.compiler.passes.checks import MOVES

__all__ = ["run"]


def _raise(op, size: int) -> None:
    op.attrs["_buffer_size"] = max(op.attrs.get("_buffer_size", 1), size)


def run(job, tracer) -> None:
    stages = [op.stage for op in job.ops if op.stage is not None]
    if not stages or max(stages) == 0:
        return
    total = max(stages) + 1
    last = max(stages)
    producers = job.producers()
    for op in job.ops:
        if op.backward:
            for lbn in op.input_lbns():
                src = producers[lbn]
                stage = _source_stage(src, producers)
                if not src.backward and stage is not None and stage < last and src.type != "variable":
                    _raise(src, 2 * total)   # an activation kept for its gradient
            continue
        if op.type not in MOVES:
            continue
        for lbn in op.input_lbns():
            src = producers[lbn]
            src_stage = _source_stage(src, producers)
            if src_stage is None or op.stage is None or op.stage <= src_stage:
                continue
            _raise(op, op.stage - src_stage)
            if src_stage == 0 and op.stage == last and _host_to_device(job, lbn, op):
                _raise(op, 2 * total)


def _source_stage(op, producers):
    """The stage a blob comes from: its producer's; an op called outside every staged module (``x.relu()``
    in build) is in the stage of what it reads, a graph input in stage 0."""
    seen = op
    while seen.stage is None and seen.input_lbns():
        seen = producers[seen.input_lbns()[0]]
    return 0 if seen.stage is None and seen.type in ("input", "unpack") else seen.stage


def _host_to_device(job, lbn: str, op) -> bool:
    src, dst = job.blobs[lbn], job.blobs[op.outputs[0]]
    def kind(desc):
        return desc.placement.type if desc.placement is not None else desc.device.type
    return kind(src) == "cpu" and kind(dst) != "cpu"
