"""The runtime's view of a Plan: one rank's tasks, each call started by its source tick and ended by its sink.

Every rank compiles the same Job into one Plan holding the tasks of every rank, and
runs its own tasks of it (OneFlow: one runtime per process).  Regsts never cross ranks
(the compiler cuts those edges into ``send`` / ``recv`` tasks, ``comm_net.py``), and the
compiler's ticks pass already joined most of a rank's tasks to its own source and sink
tick.  Two kinds of task slip through, because the boxing tasks come after that pass:

* a task that **reads nothing** (a ``recv``): nothing would tell it that a call started.
  It gets the source tick's control regst as its input, as the ticks pass does for ops
  that read no blob;
* a task whose outputs **nobody on this rank reads** (a ``send``; any op whose readers
  are all on other ranks): the sink would not wait for it, and the call would count as
  finished before it acted.  It gets a control regst that the sink tick consumes, as the
  ticks pass does for ops nobody reads.

And one setting: every control regst the sink tick reads gets regst num ``calls`` (the
runtime's ``max_calls_in_flight``, the graph's outputs buffer size), so that the tasks that
end a call may run up to that many calls ahead of the sink: with regst num 1 a task could
not act for call n + 1 before the sink acted for call n, and the calls in flight would be
bounded by 2 whatever the buffer.

``rank_plan(plan, rank, calls)`` returns the Plan with those control regsts added (a copy: the
compiler's Plan is left alone) and this rank's tasks in execution order.
"""

from __future__ import annotations

import dataclasses

from pyflow.compiler.task_graph import RegstDesc
from pyflow.errors import GraphError

__all__ = ["rank_plan"]


def _tick(plan, tasks: list, op_type: str, rank: int):
    found = [t for t in tasks if t.op_type == op_type]
    if len(found) != 1:
        raise GraphError(f"plan {plan.job_name} has {len(found)} {op_type} tasks on rank {rank}; the actor runtime "
                         "needs exactly one per rank (the compiler's ticks pass makes it)")
    return found[0]


def rank_plan(plan, rank: int, calls: int = 1) -> tuple:
    """``(plan with this rank's calls closed by its ticks, this rank's tasks in order, source id, sink id)``."""
    mine = [plan.tasks[tid] for tid in plan.order if plan.tasks[tid].rank == rank]
    source, sink = _tick(plan, mine, "source_tick", rank), _tick(plan, mine, "sink_tick", rank)
    tasks, regsts = dict(plan.tasks), dict(plan.regsts)
    next_id = max(regsts, default=0) + 1

    def edit(task_id: int, **fields):
        tasks[task_id] = dataclasses.replace(tasks[task_id], **fields)

    start = source.produced.get("ctrl", source.produced["out_0"])
    for task in mine:
        if task.task_id != source.task_id and not task.consumed:   # reads nothing: started by the source
            regsts[start] = dataclasses.replace(regsts[start], consumers=list(regsts[start].consumers) + [task.task_id])
            edit(task.task_id, consumed={"ctrl": [start]})
    for task in mine:
        current = tasks[task.task_id]
        if task.task_id == sink.task_id or any(regsts[rid].consumers for rid in current.produced.values()):
            continue
        rid = current.produced.get("ctrl")   # nobody here reads it: the sink waits for it
        if rid is None:
            rid, next_id = next_id, next_id + 1
            regsts[rid] = RegstDesc(rid, f"{task.op_name}/ctrl", task.task_id, [], (), "int8", task.device,
                                    task.rank, mem="ctrl")
            edit(task.task_id, produced={**current.produced, "ctrl": rid})
        regsts[rid] = dataclasses.replace(regsts[rid], consumers=[sink.task_id])
        ends = tasks[sink.task_id].consumed
        edit(sink.task_id, consumed={**ends, "ctrl": list(ends.get("ctrl", [])) + [rid]})
    for rid in tasks[sink.task_id].consumed.get("ctrl", []):
        num = max(regsts[rid].max_regst_num, calls)
        regsts[rid] = dataclasses.replace(regsts[rid], min_regst_num=num, max_regst_num=num)
    view = dataclasses.replace(plan, tasks=tasks, regsts=regsts)
    return view, [tasks[t.task_id] for t in mine], source.task_id, sink.task_id
