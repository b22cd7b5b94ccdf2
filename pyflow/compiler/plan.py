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
   they are never alive at once *in this order*; actors do not follow it (``mem_guards.py``
   says why, and which ctrl edges it adds).
4. **Ids**: task ids already carry OneFlow's bit layout (``ids.py``).

``print(plan)`` is OneFlow's light plan (one record per actor); ``plan.to_dot()`` draws
tasks and regsts; ``plan.memory_report()`` gives ``planned_bytes`` against
``lower_bound_bytes`` per device; ``plan.to_json()`` / ``Plan.from_json`` store and load it.
"""

from __future__ import annotations

import dataclasses
import json

from pyflow.compiler.ids import decode_task_id
from pyflow.compiler.mem_guards import mem_guards, memory_readers
from pyflow.compiler.memory import MemoryPlan, MemRequest, plan_memory
from pyflow.compiler.task_graph import GUARD_KEY, RegstDesc, TaskNode, add_mem_guards
from pyflow.errors import CompileError

__all__ = ["Plan", "make_plan", "replan_memory", "GUARD_KEY"]


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
    calls_in_flight: int = 0   # each rank's calls closed by its ticks for this many at once (rank_ticks.py; 0: not)

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
            "boxings": self.boxings, "calls_in_flight": self.calls_in_flight,
        })

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        d = json.loads(text)
        tasks = {t["task_id"]: TaskNode(**{**t, "time_shape": tuple(t["time_shape"])}) for t in d["tasks"]}
        regsts = {r["id"]: RegstDesc(**{**r, "shape": tuple(r["shape"]), "time_shape": tuple(r["time_shape"])})
                  for r in d["regsts"]}
        return cls(d["job_name"], tasks, regsts, d["order"], tuple(d["loop"]), d["loop_times"],
                   MemoryPlan.from_dict(d["memory"]), {k: tuple(v) for k, v in d["op_attrs"].items()},
                   d.get("boxings", []), d.get("calls_in_flight", 0))


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
        needs = [x.split("/")[0] for x in op.input_lbns()] + op.ctrl_inputs
        if k > 1 and any(s[1] == k for s in ins + outs):
            in_loop.add(op.name)
        elif any(name in in_loop or name in after for name in needs):   # (not in_loop | after: a set per input)
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


def _requests(regsts, order: list, loop: tuple) -> list[MemRequest]:
    position = {tid: i for i, tid in enumerate(order)}
    total = len(order)
    readers = memory_readers(regsts)
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
    add_mem_guards(tasks, regsts, mem_guards(tasks, regsts, plan.order, memory))
    return dataclasses.replace(plan, tasks=tasks, regsts=regsts, memory=memory)
