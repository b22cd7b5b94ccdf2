"""Pass ``ticks``: one source and one sink, so a call has one start and one end (OneFlow's tick ops).

* ``source_tick``: the first op; every op that reads no blob (inputs, variables,
  constants) waits for it (a control edge), so nothing of call n+1 starts before the
  call is launched;
* ``sink_tick``: the last op; it waits for every op whose results nobody reads
  (outputs, optimizer updates, variable writes), so when it has run the call is done.

The actor runtime starts a call at the source tick and learns that it ended at the sink.
"""

from __future__ import annotations

from pyflow.compiler.job import BlobDesc, JobOp, lbn_of

__all__ = ["run"]


def _tick_desc() -> BlobDesc:
    import numpy as np

    from pyflow.device import Device

    return BlobDesc((1,), np.dtype("int8"), device=Device("cpu"))


def run(job, tracer) -> None:
    if any(op.type == "source_tick" for op in job.ops):
        return
    read = {lbn for op in job.ops for lbn in op.input_lbns()}
    waited = {name for op in job.ops for name in op.ctrl_inputs}
    source = JobOp("source_tick", "source_tick", [], [lbn_of("source_tick")], line="ticks pass")
    ends = [op.name for op in job.ops if not any(lbn in read for lbn in op.outputs) and op.name not in waited]
    for op in job.ops:
        if not op.input_lbns() and not op.ctrl_inputs:
            op.ctrl_inputs.append("source_tick")
    job.add_op(source, [_tick_desc()], at=0)
    job.add_op(JobOp("sink_tick", "sink_tick", [], [lbn_of("sink_tick")], ctrl_inputs=ends, line="ticks pass"),
               [_tick_desc()])
