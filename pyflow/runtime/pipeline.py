"""Seed 003 (5.5.5): a hand-made linear pipeline Plan, to watch back pressure without a model.

Seed 003 explains flow control with four actors in a row: data loading ->
preprocessing -> copy to the device -> training, each regst num 2.  Whichever stage is
slowest sets the pace; the faster ones wait for a free regst (back pressure) and never
run more than regst-num pieces ahead.

``linear_pipeline_plan(["loading", "preprocessing", "copy", "training"], regst_num=2)``
builds that Plan directly (no Job, no compiler passes): a source tick, one task per
stage, a sink tick, joined by control regsts (no memory: only pieces and back
pressure).  Every stage gets a thread of its own.  The tasks are of kind ``tick``, so
``act`` (``act.py``) does nothing for them; ``sleeping_act(costs)`` makes an ``act_fn``
for ``Runtime(plan, act_fn=...)`` that spends ``costs[stage]`` seconds in each act
(``time.sleep`` releases the GIL, like a kernel on a device or I/O).

>>> from pyflow.runtime import Runtime
>>> plan = linear_pipeline_plan(["load", "train"], regst_num=2)
>>> [plan.tasks[t].op_name for t in plan.order]
['source_tick', 'load', 'train', 'sink_tick']
>>> with Runtime(plan, act_fn=sleeping_act({"train": 0.001}), max_calls_in_flight=4) as rt:
...     handles = [rt.launch([]) for _ in range(4)]
...     [h.result() for h in handles]
[[], [], [], []]
"""

from __future__ import annotations

import time

from pyflow.compiler.ids import TaskId, encode_task_id, per_rank_id
from pyflow.compiler.memory import MemoryPlan
from pyflow.compiler.plan import Plan
from pyflow.compiler.task_graph import RegstDesc, TaskNode
from pyflow.device import DeviceType

__all__ = ["linear_pipeline_plan", "sleeping_act"]


def linear_pipeline_plan(stages: list[str], regst_num=2, name: str = "pipeline") -> Plan:
    """source -> stages[0] -> ... -> stages[-1] -> sink; ``regst_num``: one int, or one per stage's output."""
    nums = list(regst_num) if isinstance(regst_num, (list, tuple)) else [regst_num] * len(stages)
    if len(nums) != len(stages):
        raise ValueError(f"{len(stages)} stages need {len(stages)} regst nums, got {nums}")
    names = ["source_tick", *stages, "sink_tick"]
    streams = [0, *range(1, len(stages) + 1), 0]   # every stage on a thread of its own; ticks share one
    tasks, regsts, counter = {}, {}, 0
    for index, (op, stream) in enumerate(zip(names, streams)):
        task_id = encode_task_id(TaskId(0, DeviceType.cpu, 0, stream, index))
        op_type = op if op in ("source_tick", "sink_tick") else "tick"
        thread = op if stream else "ticks"   # names the thread: pyflow-actor-rank0-cpu:0-<stage>
        tasks[task_id] = TaskNode(task_id, "tick", op, op_type, 0, "cpu:0", thread, 0, (1, 1))
    order = list(tasks)
    for index, (producer, consumer) in enumerate(zip(order, order[1:])):
        rid = per_rank_id(0, counter)
        counter += 1
        num = 2 if index == 0 else nums[index - 1]   # the source tick's regst num is 2, as the compiler's
        regsts[rid] = RegstDesc(rid, f"{names[index]}/out_0", producer, [consumer], (), "int8", "cpu:0", 0,
                                min_regst_num=num, max_regst_num=num, mem="ctrl")
        tasks[producer].produced["out_0"] = rid
        tasks[consumer].consumed["ctrl"] = [rid]
    rid = per_rank_id(0, counter)   # the sink tick's own output: nobody reads it
    regsts[rid] = RegstDesc(rid, "sink_tick/out_0", order[-1], [], (), "int8", "cpu:0", 0, mem="ctrl")
    tasks[order[-1]].produced["out_0"] = rid
    op_attrs = {op: ("tick" if op in stages else op, [], {}) for op in names}
    return Plan(name, tasks, regsts, order, (0, 0), 1, MemoryPlan(()), op_attrs)


def sleeping_act(costs: dict):
    """An ``act_fn`` whose act of stage ``s`` sleeps ``costs.get(s, 0)`` seconds (nothing else)."""
    def act(plan, task, ins, outs, j, call):
        cost = costs.get(task.op_name, 0.0)
        if cost:
            time.sleep(cost)
        return list(outs)
    return act
