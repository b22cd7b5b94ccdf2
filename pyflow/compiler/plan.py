"""Seed 004: the Plan: every task (TaskProto), every regst desc, the memory layout; printable and storable.

``make_plan(task_graph)`` does the last compile steps:

1. **Order**: one execution order of the tasks (the Job's topological order), split for
   gradient accumulation into the tasks run once before the micro-batch loop, the
   loop (run k times per call: ``(1, k)`` blobs, and the unpack / acc / pack that
   cross into or out of it) and the tasks run once after it.  A task's position in
   this order is its ``order_in_chain``; memory lifetimes are measured in it.
2. **Memory**: each ``planned`` regst asks for ``size x regst num`` bytes alive from its
   producer's position to its last consumer's + 1.  A regst that crosses the loop's
   border lives through the whole loop (a variable's repeat is read k times; an acc's
   sum is written k times).  A regst with regst num > 1 is not shared (OneFlow reuses
   only regst num 1) and lives through the whole call.  The memory planner
   (``memory.py``) places them in one chunk per (rank, device).
3. **Memory safety** (``mem_guards``): the planner lets two regsts share bytes when
   they are never alive at once *in this order*; actors do not follow it (below).
4. **Ids**: task ids already carry OneFlow's bit layout (``ids.py``).

**Why sharing needs guards, and which.**  Actors act when their messages arrive: with
several calls (or micro-batches) in flight, the op that makes regst r1 for the *next*
piece may run while a reader of r2, which took over r1's bytes, still reads this piece;
and even within one piece two independent branches may act in either order.  OneFlow
(``intra_job_mem_sharing_util.cpp``, ``task_graph.cpp``) shares memory only inside a *mem
chain* (the tasks of one CUDA stream, ordered by ctrl edges between consecutive tasks, so
the stream runs them in the planned order) and adds ``out_ctrl_shared_mem_safe_guard``
ctrl regsts from the chain's first task to its last consumers (regst num 1: the next
piece waits for them).  In pyflow every op on a chunk is ordered by its *issue* (the
chunk is one storage, one VM dependence object), so the chain is the whole (rank,
device) chunk and what must be ordered are the *acts* that issue the ops.  For each pair
of regsts whose bytes overlap, r1 dying before r2 is born (its "touchers": the producer,
every reader, the inplace writers and the readers of its aliases):

* **same piece**: every toucher of r1 acts before r2's producer.  Already true when r2's
  producer is reachable from it; else a ctrl regst toucher -> r2's producer;
* **next piece** (next micro-batch or next call): every toucher of r2 acts before r1's
  producer acts again.  Already true when r1's producer makes a regst of regst num 1 that
  a task reachable from the toucher reads (the producer cannot write it again before it
  came back; not when that reader absorbs several pieces per act, acts input-wise or is
  the sink tick); else a ctrl regst r1's producer -> toucher, whose regst num 1 holds the
  producer back.

The guards are the producer's ``mem_guard`` ctrl regst (``<op>/mem_guard``).  Every guard
goes forward in this order, which therefore stays a valid schedule: no deadlock.

``print(plan)`` is OneFlow's light plan (one record per actor); ``plan.to_dot()`` draws
tasks and regsts; ``plan.memory_report()`` gives ``planned_bytes`` against
``lower_bound_bytes`` per device; ``plan.to_json()`` / ``Plan.from_json`` store and load it.
"""

from __future__ import annotations

import collections
import dataclasses
import json

import numpy as np

from pyflow.compiler.ids import PER_RANK_SHIFT, decode_task_id, per_rank_id
from pyflow.compiler.memory import MemoryPlan, MemRequest, plan_memory
from pyflow.compiler.run_plan import is_input_wise
from pyflow.compiler.task_graph import GUARD_KEY, RegstDesc, TaskNode, pieces_per_call
from pyflow.errors import CompileError

__all__ = ["Plan", "make_plan", "replan_memory", "mem_guards", "GUARD_KEY"]


@dataclasses.dataclass
class Plan:
    """Tasks, regsts, order and memory of one compiled Job."""

    job_name: str
    tasks: dict          # task id -> TaskNode
    regsts: dict         # regst id -> RegstDesc
    order: list          # task ids in execution order
    loop: tuple          # (start, end) positions of the micro-batch loop in ``order``
    loop_times: int      # k (gradient accumulation steps)
    memory: MemoryPlan
    op_attrs: dict = dataclasses.field(default_factory=dict)   # op name -> (op type, inputs, attrs)
    boxings: list = dataclasses.field(default_factory=list)    # per boxed edge: lbn, consumer, builder, nodes

    # --- reading ------------------------------------------------------------------------------

    def task_of(self, op_name: str) -> list:
        return [t for t in self.tasks.values() if t.op_name == op_name]

    def memory_report(self) -> list[dict]:
        """One dict per (rank, device) chunk: ``planned_bytes``, ``lower_bound_bytes``, ``ratio``, ..."""
        return self.memory.report()

    def chunk_key(self, regst: RegstDesc) -> str:
        return f"rank{regst.rank}/{regst.device}"

    def memory_root(self, regst: RegstDesc) -> RegstDesc:
        """The regst whose planned memory ``regst`` uses: itself, or the input an inplace output overwrites."""
        while regst.inplace_of is not None:
            regst = self.regsts[regst.inplace_of]
        return regst

    def __str__(self) -> str:
        """OneFlow's light plan: one record per actor, its consumed and produced regsts."""
        lines = []
        position = {tid: i for i, tid in enumerate(self.order)}
        for tid in self.order:
            task = self.tasks[tid]
            decoded = decode_task_id(tid)
            lines.append(f"actor id : {tid} thrd : {task.thread_id} name : {task.op_name}")
            lines.append(f"  chain_id : {task.rank}/{task.device} order_in_chain : {position[tid]} device_type : "
                         f"{decoded.device_type.name} stream_index : {decoded.stream_index} kind : {task.kind}")
            for key, ids in task.consumed.items():
                for rid in ids:
                    r = self.regsts[rid]
                    producer = self.tasks[r.producer]
                    lines.append(f"  consume : {key} : <- [ {producer.op_name}/{r.lbn.split('/')[-1]} ] ( actor_id: "
                                 f"{r.producer}, regst: {self._regst_text(r)} )")
            for key, rid in task.produced.items():
                r = self.regsts[rid]
                to = ", ".join(f"{self.tasks[c].op_name} ( actor_id: {c} )" for c in r.consumers) or "nobody"
                lines.append(f"  produce : {key} regst: {self._regst_text(r)} {{ -> [ {to} ] }}")
        return "\n".join(lines)

    @staticmethod
    def _regst_text(r: RegstDesc) -> str:
        inplace = "" if r.inplace_of is None else f", inplace_of: {r.inplace_of}"
        return (f"{{regst_num: {r.max_regst_num}, device: {r.device}, time_shape: {tuple(r.time_shape)}, shape: "
                f"{tuple(r.shape)}, dtype: {r.dtype}, mem: {r.mem}{inplace}}}")

    def to_dot(self) -> str:
        """Graphviz text: a box per task (coloured by kind), an edge per regst consumer."""
        colours = {"compute": "lightblue", "tick": "grey90", "variable": "khaki", "input": "palegreen",
                   "output": "palegreen", "copy_h2d": "orange", "copy_d2h": "orange", "repeat": "plum",
                   "unpack": "plum", "acc": "plum", "pack": "plum", "boxing": "salmon"}
        lines = [f'digraph "{self.job_name}" {{', "  rankdir=TB; node [shape=box, style=filled];"]
        for tid in self.order:
            t = self.tasks[tid]
            lines.append(f'  t{tid} [label="{t.op_name}\\n{t.op_type} @ rank{t.rank} {t.device}", '
                         f'fillcolor={colours.get(t.kind, "white")}];')
        for r in self.regsts.values():
            style = ' [style=dashed]' if r.mem == "ctrl" else f' [label="{tuple(r.shape)}"]'
            for c in r.consumers:
                lines.append(f"  t{r.producer} -> t{c}{style};")
        lines.append("}")
        return "\n".join(lines)

    # --- storing ------------------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps({
            "job_name": self.job_name,
            "tasks": [dataclasses.asdict(t) for t in self.tasks.values()],
            "regsts": [dataclasses.asdict(r) for r in self.regsts.values()],
            "order": self.order, "loop": list(self.loop), "loop_times": self.loop_times,
            "memory": self.memory.to_dict(),
            "op_attrs": {k: [v[0], v[1], _jsonable(v[2])] for k, v in self.op_attrs.items()},
            "boxings": self.boxings,
        })

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        d = json.loads(text)
        tasks = {t["task_id"]: TaskNode(**{**t, "time_shape": tuple(t["time_shape"])}) for t in d["tasks"]}
        regsts = {r["id"]: RegstDesc(**{**r, "shape": tuple(r["shape"]), "time_shape": tuple(r["time_shape"])})
                  for r in d["regsts"]}
        return cls(d["job_name"], tasks, regsts, d["order"], tuple(d["loop"]), d["loop_times"],
                   MemoryPlan.from_dict(d["memory"]), {k: tuple(v) for k, v in d["op_attrs"].items()},
                   d.get("boxings", []))


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)   # devices, dtypes: their names


def _order(task_graph) -> tuple[list, tuple]:
    """Tasks in Job order, grouped: once before the loop, the loop, once after (see the docstring)."""
    job = task_graph.op_graph.job
    k = job.grad_acc_steps
    in_loop, after = set(), set()
    for node in task_graph.op_graph.nodes:
        op = node.op
        ins = [job.blobs[x].time_shape for x in op.input_lbns()]
        outs = [job.blobs[x].time_shape for x in op.outputs]
        if k > 1 and any(s[1] == k for s in ins + outs):
            in_loop.add(op.name)
        elif any(x.split("/")[0] in in_loop | after for x in op.input_lbns()) or \
                any(c in in_loop | after for c in op.ctrl_inputs):
            after.add(op.name)
    before = [n for n in task_graph.op_graph.nodes if n.name not in in_loop and n.name not in after]
    loop = [n for n in task_graph.op_graph.nodes if n.name in in_loop]
    for node in loop:   # a loop op must not need anything made after the loop
        needs = [x.split("/")[0] for x in node.op.input_lbns()] + node.op.ctrl_inputs
        late = [x for x in needs if x in after]
        if late:
            raise CompileError(f"op {node.name} (at {node.op.line}) runs once per micro-batch but needs {late[0]}, "
                               "which is made once per call after the micro-batch loop")
    order_nodes = before + loop + [n for n in task_graph.op_graph.nodes if n.name in after]
    order = [tid for n in order_nodes for tid in task_graph.tasks_in_order(n.name)]
    start = sum(len(task_graph.tasks_in_order(n.name)) for n in before)
    return order, (start, start + sum(len(task_graph.tasks_in_order(n.name)) for n in loop))


def _readers(regsts) -> dict:
    """regst id -> every task that reads its memory: its consumers and those of the aliases of it."""
    readers = {rid: list(r.consumers) for rid, r in regsts.items()}
    for r in regsts.values():   # an alias's (an inplace output's) readers read the regst it stands for
        source = r
        while source.inplace_of is not None or (source.mem == "alias" and source.alias_of is not None):
            source = regsts[source.inplace_of if source.inplace_of is not None else source.alias_of]
            readers[source.id].extend(r.consumers)
    return readers


def _requests(regsts, order: list, loop: tuple) -> list[MemRequest]:
    position = {tid: i for i, tid in enumerate(order)}
    total = len(order)
    readers = _readers(regsts)
    requests = []
    for r in regsts.values():
        if r.mem != "planned" or r.inplace_of is not None:   # an inplace output lives in its input's request
            continue
        start = position[r.producer]
        end = max([position[c] for c in readers[r.id]] + [start]) + 1
        if loop[0] <= start < loop[1] and r.time_shape[1] == 1:
            start = loop[0]                      # written over the whole loop (acc, pack)
        if start < loop[0] and any(loop[0] <= position[c] < loop[1] for c in readers[r.id]):
            end = max(end, loop[1])              # read by every micro-batch
        if r.max_regst_num > 1:
            start, end = 0, total                # several copies in flight: not shared
        requests.append(MemRequest(r.id, f"rank{r.rank}/{r.device}", r.nbytes * r.max_regst_num, start, end))
    return requests


def make_plan(task_graph, algorithm: str = "best") -> Plan:
    """The Plan of a TaskGraph: order, memory layout and its guards, and the ops' attributes for the executors."""
    order, loop = _order(task_graph)
    job = task_graph.op_graph.job
    op_attrs = {op.name: (op.type, list(op.inputs), dict(op.attrs)) for op in job.ops}
    op_attrs.update(task_graph.op_attrs)   # the boxing tasks
    boxings = [{"lbn": lbn, "consumer": consumer, "builder": g.builder, "text": str(g)}
               for lbn, consumer, g in task_graph.boxings]
    plan = Plan(job.name, dict(task_graph.tasks), dict(task_graph.regsts), order, loop, job.grad_acc_steps,
                MemoryPlan(()), op_attrs, boxings)
    return replan_memory(plan, algorithm)


def replan_memory(plan: Plan, algorithm: str = "best") -> Plan:
    """``plan`` with its memory planned again for its regsts (e.g. after editing regst nums), and the guards
    that layout needs (``mem_guards``); a new Plan, ``plan`` is left alone.

    The guards ``plan`` had stay: an extra ordering, forward in the order like every guard, never a deadlock.
    """
    memory = plan_memory(_requests(plan.regsts, plan.order, plan.loop), algorithm=algorithm)
    tasks, regsts = dict(plan.tasks), dict(plan.regsts)
    for src, dst in mem_guards(tasks, regsts, plan.order, memory):
        _add_guard(tasks, regsts, src, dst)
    return dataclasses.replace(plan, tasks=tasks, regsts=regsts, memory=memory)


# --- memory safety under the actor runtime (the module docstring's "Why sharing needs guards") -------------


class _Reach:
    """Who reaches whom along regsts (data and ctrl): one bitset per task, kept up to date as edges are added."""

    def __init__(self, tasks, regsts, order):
        self.bit = {tid: 1 << i for i, tid in enumerate(order)}
        successors = collections.defaultdict(set)
        for r in regsts.values():
            successors[r.producer].update(r.consumers)
        self.reach = {}
        for tid in reversed(_topological(tasks, successors)):
            bits = self.bit[tid]
            for c in successors[tid]:
                bits |= self.reach[c]
            self.reach[tid] = bits

    def __call__(self, src: int, dst: int) -> bool:
        """Does ``src`` reach ``dst`` (or is it ``dst``)?"""
        return bool(self.reach[src] & self.bit[dst])

    def add_edge(self, src: int, dst: int) -> None:
        gained, mark = self.reach[dst], self.bit[src]
        for tid, bits in self.reach.items():
            if bits & mark:
                self.reach[tid] = bits | gained

    def maximal(self, tids) -> list:
        """The tasks of ``tids`` that reach no other of them: acting after those is acting after all."""
        tids = sorted(set(tids), key=self.bit.get)
        return [t for t in tids if not any(u != t and self(t, u) for u in tids)]


def _topological(tasks, successors) -> list:
    """Kahn's order of ``tasks`` along ``successors`` (ties: task order)."""
    indegree = dict.fromkeys(tasks, 0)
    for src, dsts in successors.items():
        for d in dsts:
            indegree[d] += 1
    ready = collections.deque(t for t, n in indegree.items() if n == 0)
    found = []
    while ready:
        tid = ready.popleft()
        found.append(tid)
        for d in successors.get(tid, ()):
            indegree[d] -= 1
            if indegree[d] == 0:
                ready.append(d)
    if len(found) != len(tasks):
        raise CompileError("the task graph has a cycle of regsts: no order can run it")
    return found


def _shared_pairs(memory: MemoryPlan) -> list:
    """(r1, r2) regst ids whose bytes overlap, r1 dying before r2 is born, per device; r2 by birth."""
    pairs = []
    for rs in memory.by_device().values():
        rs = [r for r in rs if r.size > 0]
        if len(rs) < 2:
            continue
        low = np.array([memory.offsets[r.regst_id] for r in rs])
        high = low + np.array([memory.size_of(r) for r in rs])
        end = np.array([r.end for r in rs])
        for k in sorted(range(len(rs)), key=lambda i: rs[i].start):
            before = np.flatnonzero((end <= rs[k].start) & (low < high[k]) & (low[k] < high))
            for i in sorted(before.tolist(), key=lambda i: -end[i]):   # the latest to die first
                pairs.append((rs[i].regst_id, rs[k].regst_id))
    return pairs


def mem_guards(tasks, regsts, order, memory: MemoryPlan) -> list[tuple[int, int]]:
    """The ctrl edges (producer task, consumer task) that make ``memory``'s sharing safe for the actors.

    See the module docstring: per pair of regsts sharing bytes, a *same piece* and a *next piece* rule,
    each edge added only where the graph (and the edges added so far) does not already imply it.
    """
    reach = _Reach(tasks, regsts, order)
    readers = _readers(regsts)
    touchers = {rid: {regsts[rid].producer, *readers[rid]} for rid in memory.offsets}
    guarded = collections.defaultdict(set)   # producer -> consumers of its guard so far
    edges = []

    def add(src: int, dst: int) -> None:
        edges.append((src, dst))
        guarded[src].add(dst)
        reach.add_edge(src, dst)

    def holds_back(producer: int, toucher: int) -> bool:
        """Can ``producer`` not act again before ``toucher`` acted?  True if a regst num 1 regst it makes is
        read by a task reachable from ``toucher`` that returns it only after acting on it: not one that
        absorbs several pieces per act (unless ``toucher`` acts once per call), not an input-wise task (it
        returns each input after its own act, maybe before what ``toucher`` sends it arrived), not the sink
        tick (the runtime lets the tasks before it run ahead, ``pyflow/runtime/rank_plan.py``)."""
        task = tasks[producer]
        readers_of = [(regsts[rid].max_regst_num, pieces_per_call(task, key), c)
                      for key, rid in task.produced.items() for c in regsts[rid].consumers]
        readers_of += [(1, pieces_per_call(task, GUARD_KEY), c) for c in guarded[producer]]
        return any(num == 1 and reach(toucher, c) and tasks[c].op_type != "sink_tick" and
                   not is_input_wise(tasks[c]) and
                   (made <= tasks[c].time_shape[1] or tasks[toucher].time_shape[1] == 1)
                   for num, made, c in readers_of)

    for r1, r2 in _shared_pairs(memory):
        w1, w2 = regsts[r1].producer, regsts[r2].producer
        for t in reach.maximal(touchers[r1]):      # same piece: r1's last touchers before r2 is written
            if not reach(t, w2):
                add(t, w2)
        for t in reach.maximal(touchers[r2]):      # next piece: r2's last touchers before r1 is written again
            if not holds_back(w1, t):
                add(w1, t)
    return edges


def _add_guard(tasks: dict, regsts: dict, src: int, dst: int) -> None:
    """The ctrl regst ``src/mem_guard`` (made once, regst num 1) gets consumer ``dst`` (in copies of both tasks)."""
    producer = tasks[src]
    rid = producer.produced.get(GUARD_KEY)
    if rid is None:
        counter = max((i & ((1 << PER_RANK_SHIFT) - 1) for i in regsts if i >> PER_RANK_SHIFT == producer.rank),
                      default=-1) + 1
        rid = per_rank_id(producer.rank, counter)
        regsts[rid] = RegstDesc(rid, f"{producer.op_name}/{GUARD_KEY}", src, [], (), "int8", producer.device,
                                producer.rank, mem="ctrl")
        tasks[src] = dataclasses.replace(producer, produced={**producer.produced, GUARD_KEY: rid})
    regst = regsts[rid]
    if dst not in regst.consumers:
        regsts[rid] = dataclasses.replace(regst, consumers=[*regst.consumers, dst])
        consumer = tasks[dst]
        ctrl = list(consumer.consumed.get("ctrl", []))
        tasks[dst] = dataclasses.replace(consumer, consumed={**consumer.consumed, "ctrl": [*ctrl, rid]})
