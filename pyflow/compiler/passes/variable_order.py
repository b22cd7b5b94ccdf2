"""Pass ``variable_order``: control edges so that writes to a variable keep the program's order.

A variable's blob is the eager tensor's memory, so an op that writes it in place
(an optimizer update, a BatchNorm running mean) must not overtake an op that reads
the old value, nor a later reader overtake the write.  Walking the ops in trace
order, for each variable:

* a **reader** waits for the last writer (read after write);
* a **writer** waits for every reader since the last write, and for that writer
  (write after read, write after write).

Reading a ``repeat`` of the variable (gradient accumulation) or a ``view`` of it (a transposed
weight: its regst is the variable's memory, no copy) counts as reading it.
These are OneFlow's ``ctrl_in_op_name``: edges that carry no data.
"""

from __future__ import annotations

__all__ = ["run"]

_ALIASES = ("repeat", "view")   # ops whose output is their input's memory


def run(job, tracer) -> None:
    alias = {}   # lbn -> the variable lbn it stands for (a repeat or a view of a variable)
    for op in job.ops:
        if op.type == "variable":
            alias[op.outputs[0]] = op.outputs[0]
        elif op.type in _ALIASES and op.inputs[0] in alias:
            alias[op.outputs[0]] = alias[op.inputs[0]]
    last_writer: dict[str, str] = {}
    readers: dict[str, list] = {}
    for op in job.ops:
        if op.type in _ALIASES:
            continue   # it reads nothing itself: its readers read the variable
        written = {alias[lbn] for lbn in op.writes.values() if lbn in alias}
        for lbn in op.input_lbns():
            var = alias.get(lbn)
            if var is None:
                continue
            wait = [last_writer[var]] if var in last_writer else []
            if var in written:
                wait += readers.get(var, [])
            for name in wait:
                if name != op.name and name not in op.ctrl_inputs:
                    op.ctrl_inputs.append(name)
        for var in {alias[lbn] for lbn in op.input_lbns() if lbn in alias}:
            if var in written:
                last_writer[var] = op.name
                readers[var] = []
            else:
                readers.setdefault(var, []).append(op.name)
