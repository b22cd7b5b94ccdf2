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
``alias``      another regst's memory: a ``repeat`` passes its input on, a ``view`` (reshape,
               permute, expand...) looks at it with other strides; an op that writes a
               variable in place (``out=`` a captured tensor) makes no new blob
``ctrl``       nothing: a control edge (``ctrl_inputs``), or a tick
=============  ===================================================================

**Inplace**: an op that may overwrite its input (relu, add: ``same_view_in_place``) writes
its output into its input's regst when no other task reads that input (``inplace_of``);
the two share one memory request, alive until the output's last reader.

**Regst num** (how many copies of a regst may be in flight, the actor runtime's back
pressure): 1, except host2device copies and the source tick (2, OneFlow's rule: the
next load overlaps this compute), and the pipeline buffers (``passes/pipeline_buffer.py``).

**Edges.**  A local edge, and a global edge whose producer already has the layout
(placement and SBP) the consumer's signature asks for, is one-to-one: parallel_id p
reads parallel_id p's regst.  Any other global edge is offered to the boxing chain
(``pyflow/distributed/boxing_chain/``, OneFlow's SubTskGphBuilder chain), built once per
(blob, layout) and shared by the readers; each node of the sub-graph it returns
becomes a ``boxing`` task on its rank (``op_type`` = the node kind; ``copy`` nodes on
the h2d / d2h streams, ``collective`` nodes on the ccl stream), a ``comm_net`` node
becomes a ``send`` task on the sender's rank and a ``recv`` task on the receiver's,
so no task reads another rank's memory.  ``boxing_of_op`` keeps an op's boxing
tasks (they run just before it) and ``boxings`` every edge's sub-graph.

**Ranks.**  Every rank compiles the same Job into the same Plan, tasks of every rank
included; a global op has a task per rank of its placement, a local op one on the
compiling rank (its twins on the other ranks are in their own Plans), a tick one per
rank (control edges join tasks of one rank).  A global blob's regst holds one piece.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from pyflow import env
from pyflow.compiler.boxing import build_boxing
from pyflow.compiler.ids import PER_RANK_SHIFT, TaskId, encode_task_id, per_rank_id, thread_id
from pyflow.compiler.op_graph import layout_of_blob, placement_of
from pyflow.device import Device
from pyflow.distributed.boxing_chain.graph import region_of, shape_of_region
from pyflow.distributed.boxing_steps import Layout
from pyflow.framework.op_registry import OP_REGISTRY

__all__ = ["TaskNode", "RegstDesc", "TaskGraph", "STREAM_INDEX", "GUARD_KEY", "add_mem_guards", "pieces_per_call"]

STREAM_INDEX = {"compute": 0, "host2device": 1, "device2host": 2, "ccl": 3, "comm_net": 4}
HOST_DEVICE = "cpu"
GUARD_KEY = "mem_guard"   # the produced key (and lbn suffix) of a task's memory-safety ctrl regst (plan.py)
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
    inplace_of: int | None = None       # an accepted inplace proposal: written into this regst's memory

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


def pieces_per_call(task, key: str = "out_0") -> int:
    """How many pieces of its produced regst ``key`` ``task`` makes per call: one per act (``time_shape[1]``
    acts), except Acc and Pack, which fill their outputs (and send their ctrl) once over their k acts; their
    ``mem_guard`` still goes out after every act, as each act writes the memory it guards."""
    if task.kind in ("acc", "pack") and key != GUARD_KEY:
        return 1
    return task.time_shape[1]


def add_mem_guards(tasks: dict, regsts: dict, edges) -> None:
    """The memory guards ``edges`` (``mem_guards.mem_guards``) put in: each source's ctrl regst ``<op>/mem_guard``
    (made once, regst num 1; kept if it has one) gets its destinations as consumers, read under "ctrl".
    A changed task or regst becomes a new TaskNode / RegstDesc in ``tasks`` / ``regsts`` (one per task or regst,
    not one per edge): the objects are never edited in place, so the Plan they came from keeps its own."""
    by_src = collections.defaultdict(list)
    for src, dst in edges:
        by_src[src].append(dst)
    counters, low_bits = collections.Counter(), (1 << PER_RANK_SHIFT) - 1   # rank -> its next free regst counter
    for rid in regsts:
        counters[rid >> PER_RANK_SHIFT] = max(counters[rid >> PER_RANK_SHIFT], (rid & low_bits) + 1)
    guards_of = collections.defaultdict(list)   # consumer -> the guard regsts it reads
    for src, dsts in by_src.items():
        producer = tasks[src]
        rid = producer.produced.get(GUARD_KEY)
        if rid is None:
            rid = per_rank_id(producer.rank, counters[producer.rank])
            counters[producer.rank] += 1
            regsts[rid] = RegstDesc(rid, f"{producer.op_name}/{GUARD_KEY}", src, [], (), "int8", producer.device,
                                    producer.rank, mem="ctrl")
            tasks[src] = dataclasses.replace(producer, produced={**producer.produced, GUARD_KEY: rid})
        fresh = [d for d in dict.fromkeys(dsts) if d not in regsts[rid].consumers]
        regsts[rid] = dataclasses.replace(regsts[rid], consumers=[*regsts[rid].consumers, *fresh])
        for dst in fresh:
            guards_of[dst].append(rid)
    for dst, rids in guards_of.items():
        consumer = tasks[dst]
        tasks[dst] = dataclasses.replace(consumer, consumed={**consumer.consumed,
                                                             "ctrl": [*consumer.consumed.get("ctrl", []), *rids]})


class TaskGraph:
    """Tasks and regst descs of an OpGraph (see the module docstring)."""

    def __init__(self, op_graph):
        self.op_graph = op_graph
        job = op_graph.job
        self.tasks: dict[int, TaskNode] = {}
        self.regsts: dict[int, RegstDesc] = {}
        self.task_of_op: dict[str, list[int]] = {}
        self.boxing_of_op: dict[str, list[int]] = {}     # op name -> the boxing tasks of its inputs' edges
        self.boxings: list = []                          # (lbn, consumer op, BoxingGraph), in build order
        self.op_attrs: dict = {}                         # boxing task name -> (op type, inputs, attrs)
        self._task_counters: dict[tuple, int] = {}
        self._regst_counters: dict[int, int] = {}
        self._boxing_memo: dict = {}
        self._regsts_of_lbn: dict[str, list] = {}        # lbn -> regst id per parallel_id (None: not here)
        for node in op_graph.nodes:
            op = node.op
            ids = []
            for parallel_id, (rank, device) in enumerate(node.parallel):
                task = self._new_task(node, rank, device, parallel_id)
                ids.append(task.task_id)
                for i, lbn in enumerate(op.inputs):
                    if not isinstance(lbn, str):
                        continue
                    regst_id = self._input_regst(node, i, lbn, parallel_id, rank)
                    if regst_id is None:
                        continue   # another rank's local blob: that rank's own plan has the edge
                    task.consumed[f"in_{i}"] = [regst_id]
                    self.regsts[regst_id].consumers.append(task.task_id)
                for j, lbn in enumerate(op.outputs):
                    regst = self._new_regst(task, lbn, job.blobs[lbn], op, j, node, parallel_id)
                    task.produced[f"out_{j}"] = regst.id
                    self._regsts_of_lbn.setdefault(lbn, [None] * len(node.parallel))[parallel_id] = regst.id
            self.task_of_op[op.name] = ids
        for node in op_graph.nodes:   # control edges: a ctrl regst of the producer on the same rank
            for name in node.op.ctrl_inputs:
                for consumer_id in self.task_of_op[node.name]:
                    consumer = self.tasks[consumer_id]
                    for producer_id in self.task_of_op[name]:
                        producer = self.tasks[producer_id]
                        if producer.rank != consumer.rank:
                            continue
                        if "ctrl" not in producer.produced:
                            regst = self._regst(producer, f"{name}/ctrl", (), "int8", mem="ctrl")
                            producer.produced["ctrl"] = regst.id
                        regst = self.regsts[producer.produced["ctrl"]]
                        regst.consumers.append(consumer_id)
                        consumer.consumed.setdefault("ctrl", []).append(regst.id)
        self._accept_inplace()

    def _accept_inplace(self) -> None:
        """Inplace proposals: an op that may write its output over its input (``same_view_in_place``,
        e.g. relu, add) gets its input's memory when nothing else reads that input (OneFlow's rule), the
        two regsts alike in shape, dtype, device, time shape and regst num 1."""
        for task in self.tasks.values():
            opdef = OP_REGISTRY.get(task.op_type)
            if task.kind != "compute" or opdef is None or not opdef.same_view_in_place or \
                    opdef.updates_input is not None or "in_0" not in task.consumed or "out_0" not in task.produced:
                continue
            src, out = self.regsts[task.consumed["in_0"][0]], self.regsts[task.produced["out_0"]]
            if src.mem == out.mem == "planned" and src.consumers == [task.task_id] and \
                    src.max_regst_num == out.max_regst_num == 1 and \
                    (src.rank, src.device, tuple(src.shape), src.dtype, tuple(src.time_shape)) == \
                    (out.rank, out.device, tuple(out.shape), out.dtype, tuple(out.time_shape)):
                out.inplace_of = src.id

    def tasks_in_order(self, op_name: str) -> list:
        """The tasks of one op in execution order: its input edges' boxing tasks, then its own."""
        return self.boxing_of_op.get(op_name, []) + self.task_of_op[op_name]

    # --- edges ----------------------------------------------------------------------------------

    def _input_regst(self, node, i: int, lbn: str, parallel_id: int, rank: int):
        """The regst task ``parallel_id`` of ``node`` reads as input ``i``: the producer's piece when the
        layouts agree (one-to-one), else the boxing sub-graph's piece for it."""
        producers = self._regsts_of_lbn[lbn]
        src = layout_of_blob(self.op_graph.job.blobs[lbn])
        if node.signature is None or src is None:   # local -> local, or local -> global (its own piece)
            return producers[0] if rank == env.get_rank() else None
        dst = Layout(placement_of(self.op_graph.job, node.op), tuple(node.signature.inputs[i]))
        if src == dst:
            return producers[parallel_id]
        return self._boxing(node, lbn, src, dst)[parallel_id]

    def _boxing(self, node, lbn: str, src, dst) -> list:
        """The boxing sub-graph of edge ``lbn`` -> ``dst`` (built once, shared by its readers): a task per
        boxing node (a comm_net node: a send task and a recv task); the regst of each dst piece."""
        key = (lbn, dst)
        if key in self._boxing_memo:
            return self._boxing_memo[key]
        desc = self.op_graph.job.blobs[lbn]
        graph = build_boxing(src, dst, tuple(desc.shape), desc.dtype)
        self.boxings.append((lbn, node.name, graph))
        edge = len(self.boxings) - 1
        producers = self._regsts_of_lbn[lbn]
        made: list = []    # regst id per boxing node (None: it makes nothing)
        tasks = self.boxing_of_op.setdefault(node.name, [])

        def regst_of(ref):
            return producers[ref[1]] if ref[0] == "in" else made[ref[1]]

        for k, bnode in enumerate(graph.nodes):
            name = f"{lbn.split('/')[0]}-boxing{edge}-n{k}"
            inputs = [regst_of(ref) for ref in bnode.inputs]
            if bnode.kind == "comm_net":   # OneFlow's comm_net: the sender's half and the receiver's
                src_rank = bnode.attrs["src_rank"]
                send = self._boxing_task(f"{name}-send", "send", src_rank, HOST_DEVICE, "comm_net", inputs,
                                         desc, dst_rank=bnode.rank, tag=self._tag(edge, k))
                tasks.append(send.task_id)
                recv = self._boxing_task(f"{name}-recv", "recv", bnode.rank, HOST_DEVICE, "comm_net", [],
                                         desc, src_rank=src_rank, tag=self._tag(edge, k))
                tasks.append(recv.task_id)
                made.append(self._boxing_regst(recv, lbn, bnode, desc).id)
                continue
            stream, device = "compute", bnode.device
            if bnode.kind == "copy":
                stream = "host2device" if bnode.attrs["direction"] == "h2d" else "device2host"
                if stream == "device2host":
                    device = self.tasks[self.regsts[inputs[0]].producer].device   # on the cuda device's stream
            attrs = dict(bnode.attrs)
            if bnode.kind == "collective":
                stream, attrs["logical_shape"] = "ccl", tuple(desc.shape)   # what every member agrees on
            task = self._boxing_task(name, bnode.kind, bnode.rank, device, stream, inputs, desc, **attrs)
            tasks.append(task.task_id)
            made.append(None if bnode.shape is None else self._boxing_regst(task, lbn, bnode, desc).id)
        result = [regst_of(ref) for ref in graph.outputs]
        self._boxing_memo[key] = result
        return result

    @staticmethod
    def _tag(edge: int, k: int) -> int:
        """The message tag of one comm_net node: the same on every rank (every rank compiles the same job)."""
        return (edge * 64 + k) % 32767 + 1

    def _boxing_task(self, name, kind, rank, device, stream, inputs, desc, **attrs) -> TaskNode:
        device = Device(device) if isinstance(device, str) else device
        key = (rank, device.device_type, device.index, STREAM_INDEX[stream])
        index = self._task_counters.get(key, 0)
        self._task_counters[key] = index + 1
        task_id = encode_task_id(TaskId(rank, device.device_type, device.index, STREAM_INDEX[stream], index))
        task = TaskNode(task_id, "boxing", name, kind, rank, str(device), stream, 0, tuple(desc.time_shape))
        for i, regst_id in enumerate(inputs):
            task.consumed[f"in_{i}"] = [regst_id]
            self.regsts[regst_id].consumers.append(task_id)
        self.tasks[task_id] = task
        self.op_attrs[name] = (kind, [f"in_{i}" for i in range(len(inputs))], dict(attrs))
        return task

    def _boxing_regst(self, task: TaskNode, lbn: str, bnode, desc) -> RegstDesc:
        regst = self._regst(task, lbn, bnode.shape, bnode.dtype, time_shape=desc.time_shape)
        if task.device != bnode.device and task.op_type == "copy":
            regst.device = bnode.device   # a d2h copy runs on the cuda stream, writes host memory
        task.produced["out_0"] = regst.id
        return regst

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

    def _new_regst(self, task: TaskNode, lbn: str, desc, op, j: int, node, parallel_id: int) -> RegstDesc:
        mem, alias_of, num = "planned", None, 1
        if op.type in ("variable", "input", "output"):
            mem = op.type
        elif op.type in ("source_tick", "sink_tick"):
            mem, num = "ctrl", 2 if op.type == "source_tick" else 1
        elif op.type in ("repeat", "to_global", "view"):   # the same memory, passed on (a view: other strides)
            mem = "alias"
            alias_of = task.consumed["in_0"][0] if "in_0" in task.consumed else None
        elif j in op.attrs.get("_out_into", ()):
            written = len(op.inputs) - len(op.attrs["_out_into"]) + op.attrs["_out_into"].index(j)
            mem, alias_of = "alias", task.consumed[f"in_{written}"][0]
        if task.kind == "copy_h2d":
            num = 2
        buffer = op.attrs.get("_buffer_size")   # the pipeline_buffer pass
        if buffer:
            num = max(num, buffer)
        shape = desc.shape
        if desc.placement is not None:   # a global blob's regst holds this parallel_id's piece
            shape = shape_of_region(region_of(layout_of_blob(desc), parallel_id, tuple(desc.shape)))
        return self._regst(task, lbn, shape, desc.dtype, time_shape=desc.time_shape, min_regst_num=num,
                           max_regst_num=num, mem=mem, alias_of=alias_of)

    def __str__(self) -> str:
        lines = [f"TaskGraph: {len(self.tasks)} tasks, {len(self.regsts)} regsts"]
        for task in self.tasks.values():
            ins = ", ".join(f"{k}<-{v}" for k, v in task.consumed.items())
            lines.append(f"  {task.task_id:#x} {task.kind:9s} {task.op_name} on rank {task.rank} {task.device} "
                         f"({task.stream}) {ins}")
        return "\n".join(lines)
