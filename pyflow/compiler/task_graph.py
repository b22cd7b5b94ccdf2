"""Seed 004: the TaskGraph: physical tasks (one per op per device) connected by regsts.

Every ``OpNode`` becomes one task per parallel_id, on the thread of its stream: all
compute tasks of one device share that device's compute stream; copies between host
and device get the host2device / device2host streams (so loading overlaps compute);
ticks run on the cpu.  Every blob an op makes becomes a **regst desc** that its task
produces and its readers' tasks consume.  What backs a regst's memory:

=============  ===================================================================
``planned``    a slice of the device's chunk, placed by the memory planner
``variable``   the eager tensor the variable op reads (parameters persist)
``input``      the tensor given to this call
``output``     a fresh eager tensor per call (handed back to the user)
``alias``      another regst's memory: a ``repeat`` passes its input on; an op that
               writes a variable in place (``out=`` a captured tensor) makes no new blob
``ctrl``       nothing: a control edge (``ctrl_inputs``), or a tick
=============  ===================================================================

**Regst num** (how many copies of a regst may be in flight, the actor runtime's back
pressure): 1, except host2device copies and the source tick (2, OneFlow's rule: the
next load overlaps this compute), and the pipeline buffers.

Local blobs only so far; every edge is one-to-one (the boxing builders of
``pyflow/compiler/boxing/`` will build the edges of global blobs).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pyflow.compiler.ids import TaskId, encode_task_id, per_rank_id, thread_id

__all__ = ["TaskNode", "RegstDesc", "TaskGraph", "STREAM_INDEX"]

STREAM_INDEX = {"compute": 0, "host2device": 1, "device2host": 2, "ccl": 3}
_KINDS = {"source_tick": "tick", "sink_tick": "tick", "variable": "variable", "input": "input", "output": "output",
          "unpack": "unpack", "repeat": "repeat", "acc": "acc", "pack": "pack"}


@dataclasses.dataclass
class RegstDesc:
    """A register: the memory one produced blob lives in, who writes it and who reads it."""

    id: int
    lbn: str
    producer: int                       # task id
    consumers: list                     # task ids
    shape: tuple
    dtype: str
    device: str                         # "cuda:0"
    rank: int
    time_shape: tuple = (1, 1)
    min_regst_num: int = 1
    max_regst_num: int = 1
    mem: str = "planned"                # planned | variable | input | output | alias | ctrl
    alias_of: int | None = None         # regst id (mem == "alias")

    @property
    def nbytes(self) -> int:
        if self.mem == "ctrl":
            return 0
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclasses.dataclass
class TaskNode:
    """One actor-to-be: an op on one device, or a tick / copy / grad-acc helper."""

    task_id: int
    kind: str                           # compute | copy_h2d | copy_d2h | tick | variable | input | output |
    op_name: str                        # unpack | repeat | acc | pack
    op_type: str
    rank: int
    device: str
    stream: str
    parallel_id: int
    time_shape: tuple
    consumed: dict = dataclasses.field(default_factory=dict)   # "in_0" -> [regst id], "ctrl" -> [regst ids]
    produced: dict = dataclasses.field(default_factory=dict)   # "out_0" -> regst id, "ctrl" -> regst id

    @property
    def thread_id(self) -> int:
        return thread_id(self.task_id)


class TaskGraph:
    """Tasks and regst descs of an OpGraph (see the module docstring)."""

    def __init__(self, op_graph):
        self.op_graph = op_graph
        job = op_graph.job
        self.tasks: dict[int, TaskNode] = {}
        self.regsts: dict[int, RegstDesc] = {}
        self.task_of_op: dict[str, list[int]] = {}
        self._task_counters: dict[tuple, int] = {}
        self._regst_counters: dict[int, int] = {}
        regst_of_lbn: dict[str, int] = {}
        for node in op_graph.nodes:
            op = node.op
            ids = []
            for parallel_id, (rank, device) in enumerate(node.parallel):
                task = self._new_task(node, rank, device, parallel_id)
                ids.append(task.task_id)
                for i, lbn in enumerate(op.inputs):
                    if isinstance(lbn, str):
                        regst = self.regsts[regst_of_lbn[lbn]]
                        task.consumed[f"in_{i}"] = [regst.id]
                        regst.consumers.append(task.task_id)
                for j, lbn in enumerate(op.outputs):
                    regst = self._new_regst(task, lbn, job.blobs[lbn], op, j, regst_of_lbn)
                    task.produced[f"out_{j}"] = regst.id
                    regst_of_lbn[lbn] = regst.id
            self.task_of_op[op.name] = ids
        for node in op_graph.nodes:   # control edges: a ctrl regst of the producer, consumed
            for name in node.op.ctrl_inputs:
                for producer_id, consumer_id in zip(self.task_of_op[name], self.task_of_op[node.name]):
                    producer = self.tasks[producer_id]
                    if "ctrl" not in producer.produced:
                        regst = self._regst(producer, f"{name}/ctrl", (), "int8", mem="ctrl")
                        producer.produced["ctrl"] = regst.id
                    regst = self.regsts[producer.produced["ctrl"]]
                    regst.consumers.append(consumer_id)
                    self.tasks[consumer_id].consumed.setdefault("ctrl", []).append(regst.id)

    def _new_task(self, node, rank: int, device, parallel_id: int) -> TaskNode:
        stream_index = STREAM_INDEX[node.stream]
        key = (rank, device.device_type, device.index, stream_index)
        index = self._task_counters.get(key, 0)
        self._task_counters[key] = index + 1
        task_id = encode_task_id(TaskId(rank, device.device_type, device.index, stream_index, index))
        kind = _KINDS.get(node.op.type, "compute")
        if node.stream == "host2device":
            kind = "copy_h2d"
        elif node.stream == "device2host":
            kind = "copy_d2h"
        time_shape = max((self.op_graph.job.blobs[x].time_shape for x in node.op.input_lbns() + node.op.outputs),
                         key=lambda s: s[1], default=(1, 1))
        task = TaskNode(task_id, kind, node.name, node.op.type, rank, str(device), node.stream, parallel_id,
                        time_shape)
        self.tasks[task_id] = task
        return task

    def _regst(self, task: TaskNode, lbn: str, shape, dtype, **kw) -> RegstDesc:
        counter = self._regst_counters.get(task.rank, 0)
        self._regst_counters[task.rank] = counter + 1
        regst = RegstDesc(per_rank_id(task.rank, counter), lbn, task.task_id, [], tuple(shape), str(np.dtype(dtype)),
                          task.device, task.rank, **kw)
        self.regsts[regst.id] = regst
        return regst

    def _new_regst(self, task: TaskNode, lbn: str, desc, op, j: int, regst_of_lbn: dict) -> RegstDesc:
        mem, alias_of, num = "planned", None, 1
        if op.type in ("variable", "input", "output"):
            mem = op.type
        elif op.type in ("source_tick", "sink_tick"):
            mem, num = "ctrl", 2 if op.type == "source_tick" else 1
        elif op.type == "repeat":
            mem, alias_of = "alias", regst_of_lbn[op.inputs[0]]
        elif j in op.attrs.get("_out_into", ()):
            written = op.writes[len(op.inputs) - len(op.attrs["_out_into"]) + op.attrs["_out_into"].index(j)]
            mem, alias_of = "alias", regst_of_lbn[written]
        if task.kind == "copy_h2d":
            num = 2
        buffer = op.attrs.get("buffer_size")
        if buffer:
            num = buffer
        return self._regst(task, lbn, desc.shape, desc.dtype, time_shape=desc.time_shape, min_regst_num=num,
                           max_regst_num=num, mem=mem, alias_of=alias_of)

    def __str__(self) -> str:
        lines = [f"TaskGraph: {len(self.tasks)} tasks, {len(self.regsts)} regsts"]
        for task in self.tasks.values():
            ins = ", ".join(f"{k}<-{v}" for k, v in task.consumed.items())
            lines.append(f"  {task.task_id:#x} {task.kind:9s} {task.op_name} on rank {task.rank} {task.device} "
                         f"({task.stream}) {ins}")
        return "\n".join(lines)
