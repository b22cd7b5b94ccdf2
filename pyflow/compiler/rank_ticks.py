"""The Plan's last step: each rank's calls start at its source tick and end at its sink tick.

Every rank compiles the same Job into one Plan holding the tasks of every rank, and runs
its own tasks of it (OneFlow: one runtime per process).  Regsts never cross ranks (the
TaskGraph cuts those edges into ``send`` / ``recv`` tasks), and the ticks pass
(``passes/ticks.py``) already joined the ops to their rank's source and sink tick.  Two
kinds of task slip through, because the boxing tasks are made after that pass:

* a task that **reads nothing** (a ``recv``): nothing would tell it that a call started.
  It gets the source tick's control regst as its input, as the ticks pass does for ops
  that read no blob;
* a task whose outputs **nobody on its rank reads** (a ``send``; any task whose readers
  are all on other ranks): the sink would not wait for it, and the call would count as
  finished before it acted.  It gets a control regst that the sink tick consumes, as the
  ticks pass does for ops nobody reads.

And one number: every control regst the sink tick reads gets regst num ``calls_in_flight``,
so that the tasks that end a call may run up to that many calls ahead of the sink: with
regst num 1 a task could not act for call n + 1 before the sink acted for call n, and the
calls in flight would be bounded by 2 whatever the graph's outputs buffer.

**Where the number comes from.**  How many calls may be in flight is the graph's setting
(``nn.Graph.config.outputs_buffer_size``, OneFlow's outputs buffer), known when it compiles:
``compile_job`` passes it here and the Plan records it (``plan.calls_in_flight``).  The actor
runtime admits at most its own ``max_calls_in_flight`` calls at the source tick, and a regst
num is only a bound, so a Plan closed for n calls serves any runtime that admits n or fewer.
A runtime asked for more (a Plan compiled for fewer; a hand-made Plan, closed for none) runs
this step again for its number and runs the new Plan it returns, as it runs ``replan_memory``
on a Plan whose regst nums were edited by hand: the runtime never edits a Plan.

``close_calls(plan, calls_in_flight)`` returns the closed Plan (a new one; closing a closed
Plan again changes at most the number); ``rank_tasks(plan, rank)`` reads one rank's tasks in
order and its two ticks.
"""

from __future__ import annotations

import collections
import dataclasses

from pyflow.compiler.ids import PER_RANK_SHIFT, per_rank_id
from pyflow.compiler.task_graph import RegstDesc
from pyflow.errors import GraphError

__all__ = ["close_calls", "rank_tasks"]


def rank_tasks(plan, rank: int) -> tuple:
    """``(rank``'s tasks in the Plan's order, its source tick's id, its sink tick's id)``."""
    mine = [plan.tasks[tid] for tid in plan.order if plan.tasks[tid].rank == rank]
    ticks = []
    for op_type in ("source_tick", "sink_tick"):
        found = [t for t in mine if t.op_type == op_type]
        if len(found) != 1:
            raise GraphError(f"plan {plan.job_name} has {len(found)} {op_type} tasks on rank {rank}; the actor "
                             "runtime needs exactly one per rank (the compiler's ticks pass makes it)")
        ticks.append(found[0].task_id)
    return mine, *ticks


def close_calls(plan, calls_in_flight: int):
    """``plan`` with every rank's calls closed by its ticks, for ``calls_in_flight`` calls at once (see the
    module docstring); a new Plan: ``plan``, its tasks and regst descs are left alone."""
    tasks, regsts = dict(plan.tasks), dict(plan.regsts)
    counters, low_bits = collections.Counter(), (1 << PER_RANK_SHIFT) - 1   # rank -> its next free regst counter
    for rid in regsts:
        counters[rid >> PER_RANK_SHIFT] = max(counters[rid >> PER_RANK_SHIFT], (rid & low_bits) + 1)

    def edit(task_id: int, **fields):
        tasks[task_id] = dataclasses.replace(tasks[task_id], **fields)

    for rank in sorted({task.rank for task in plan.tasks.values()}):
        mine, source_id, sink_id = rank_tasks(plan, rank)
        source = tasks[source_id]
        start = source.produced.get("ctrl", source.produced["out_0"])
        for task in mine:
            if task.task_id != source_id and not task.consumed:   # reads nothing: started by the source
                regsts[start] = dataclasses.replace(regsts[start], consumers=[*regsts[start].consumers, task.task_id])
                edit(task.task_id, consumed={"ctrl": [start]})
        for task in mine:
            current = tasks[task.task_id]
            if task.task_id == sink_id or any(regsts[rid].consumers for rid in current.produced.values()):
                continue
            rid = current.produced.get("ctrl")   # nobody here reads it: the sink waits for it
            if rid is None:
                rid = per_rank_id(rank, counters[rank])
                counters[rank] += 1
                regsts[rid] = RegstDesc(rid, f"{task.op_name}/ctrl", task.task_id, [], (), "int8", task.device,
                                        rank, mem="ctrl")
                edit(task.task_id, produced={**current.produced, "ctrl": rid})
            regsts[rid] = dataclasses.replace(regsts[rid], consumers=[sink_id])
            ends = tasks[sink_id].consumed
            edit(sink_id, consumed={**ends, "ctrl": [*ends.get("ctrl", []), rid]})
        for rid in tasks[sink_id].consumed.get("ctrl", []):
            num = max(regsts[rid].max_regst_num, calls_in_flight)
            regsts[rid] = dataclasses.replace(regsts[rid], min_regst_num=num, max_regst_num=num)
    return dataclasses.replace(plan, tasks=tasks, regsts=regsts,
                               calls_in_flight=max(plan.calls_in_flight, calls_in_flight))
