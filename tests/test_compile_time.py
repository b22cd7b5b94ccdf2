"""Compiling an nn.Graph takes time linear in its size, and the memory guards still keep sharing safe.

The ``mem_guard`` ctrl regsts (``pyflow/compiler/mem_guards.py``) used to be found pair by pair: for every two
regsts sharing bytes, reachability sets walked over every task per added edge.  Pairs, guards and work all
grew with the square of the graph (the 1,014-op training graph of benchmarks/bench_memory_plan.py: 20,499
pairs, 23,359 guards, 4.3-4.6 s to plan).  These
tests are the specification of the replacement:

* **the guarantee**: on random task DAGs (micro-batch loops, Acc / Pack, inplace and alias regsts,
  input-wise boxing tasks, a sink tick, two chunks) with random memory plans, every pair of regsts sharing
  bytes is ordered as mem_guards.py's two rules demand (``guard_violations``: a slow, plain checker of every
  pair).  The old pairwise algorithm, kept here as the reference, passes the same checker, so the checker
  asks what the old code guaranteed (the new guards are not a subset of the old: each is decided against
  a different graph; on a random DAG there may be one more, on a training graph there are 9x fewer);
* **the checker can fail**: the new code adds no guard exactly when the plan without guards passes it;
* **the same Plan but for the guards**: compiled random programs get the old order, tasks, regsts and
  memory offsets;
* **linear, counted not timed**: the sweep's reachability tests per task stay flat as an MLP grows.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import nn
from pyflow.compiler.ids import TaskId, encode_task_id, per_rank_id
from pyflow.compiler.memory import plan_memory
from pyflow.compiler.op_graph import OpGraph
from pyflow.compiler.mem_guards import _GuardPlanner, is_input_wise, mem_guards, memory_readers
from pyflow.compiler.plan import Plan, _requests, make_plan, replan_memory
from pyflow.compiler.task_graph import GUARD_KEY, RegstDesc, TaskGraph, TaskNode, pieces_per_call
from pyflow.device import DeviceType
from pyflow.errors import CompileError

# --- the reference: mem_guards.py's guards before the linear sweep (slow, pairwise; docstrings cut, edges once) ----


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
        return bool(self.reach[src] & self.bit[dst])

    def add_edge(self, src: int, dst: int) -> None:
        gained, mark = self.reach[dst], self.bit[src]
        for tid, bits in self.reach.items():
            if bits & mark:
                self.reach[tid] = bits | gained

    def maximal(self, tids) -> list:
        tids = sorted(set(tids), key=self.bit.get)
        return [t for t in tids if not any(u != t and self(t, u) for u in tids)]


def _topological(tasks, successors) -> list:
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


def _shared_pairs(memory) -> list:
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
            for i in sorted(before.tolist(), key=lambda i: -end[i]):
                pairs.append((rs[i].regst_id, rs[k].regst_id))
    return pairs


def reference_mem_guards(tasks, regsts, order, memory) -> list:
    """mem_guards as it was (commit 9bfbcfa): per pair, each rule, an edge unless already implied."""
    reach = _Reach(tasks, regsts, order)
    readers = memory_readers(regsts)
    touchers = {rid: {regsts[rid].producer, *readers[rid]} for rid in memory.offsets}
    guarded = collections.defaultdict(set)
    edges = []

    def add(src, dst):
        edges.append((src, dst))
        guarded[src].add(dst)
        reach.add_edge(src, dst)

    def holds_back(producer, toucher):
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
        for t in reach.maximal(touchers[r1]):
            if not reach(t, w2):
                add(t, w2)
        for t in reach.maximal(touchers[r2]):
            if not holds_back(w1, t):
                add(w1, t)
    return list(dict.fromkeys(edges))


def reference_order(task_graph) -> tuple:
    """plan._order as it was (it built a set union per input of every op)."""
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
    nodes = task_graph.op_graph.nodes
    before = [n for n in nodes if n.name not in in_loop and n.name not in after]
    loop = [n for n in nodes if n.name in in_loop]
    order_nodes = before + loop + [n for n in nodes if n.name in after]
    order = [tid for n in order_nodes for tid in task_graph.tasks_in_order(n.name)]
    start = sum(len(task_graph.tasks_in_order(n.name)) for n in before)
    return order, (start, start + sum(len(task_graph.tasks_in_order(n.name)) for n in loop))


# --- the checker: every pair of regsts sharing bytes, plainly ---------------------------------------------


def _touchers(regsts, rid) -> set:
    """The producer of ``rid`` and every task reading its bytes: its consumers and those of every regst whose
    inplace / alias chain passes through it."""
    found = {regsts[rid].producer}
    for r in regsts.values():
        source = r
        while True:
            if source.id == rid:
                found.update(r.consumers)
                break
            nxt = source.inplace_of if source.inplace_of is not None else \
                source.alias_of if source.mem == "alias" else None
            if nxt is None:
                break
            source = regsts[nxt]
    return found


def guard_violations(tasks, regsts, order, memory, edges) -> list[str]:
    """What ``edges`` (added to the plan's regsts, guards it has included) leave unordered, for every pair
    r1, r2 of regsts sharing bytes, r1 dead before r2 is born (mem_guards.py's module docstring):

    * same piece: every toucher of r1 reaches r2's producer w2;
    * next piece: every toucher t of r2 that reaches no other toucher of r2 has a guard w1 -> t, or w1 is held
      back: a task c reading a regst num 1 regst of w1 (its guard included) is reachable from t, is not the
      sink tick nor input-wise, and acts once per piece w1 makes (or t acts once per call);

    and every guard goes forward in ``order``.  Reachability is a depth-first search per task."""
    position = {t: i for i, t in enumerate(order)}
    successors = collections.defaultdict(set)
    guard_of = collections.defaultdict(set)
    for r in regsts.values():
        successors[r.producer].update(r.consumers)
        if r.lbn.endswith("/" + GUARD_KEY):
            guard_of[r.producer].update(r.consumers)
    for src, dst in edges:
        successors[src].add(dst)
        guard_of[src].add(dst)
    reach = {}
    for tid in tasks:
        seen, todo = {tid}, [tid]
        while todo:
            for nxt in successors[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[tid] = seen
    problems = [f"guard {s} -> {d} goes backwards" for s, ds in guard_of.items() for d in ds
                if position[d] <= position[s]]

    def held_back(w1: int, t: int) -> bool:
        task = tasks[w1]
        readers = [(regsts[rid].max_regst_num, pieces_per_call(task, key), c)
                   for key, rid in task.produced.items() for c in regsts[rid].consumers]
        readers += [(1, pieces_per_call(task, GUARD_KEY), c) for c in guard_of[w1]]
        return any(num == 1 and c in reach[t] and tasks[c].op_type != "sink_tick" and not is_input_wise(tasks[c])
                   and (made <= tasks[c].time_shape[1] or tasks[t].time_shape[1] == 1) for num, made, c in readers)

    requests = [r for r in memory.requests if r.size > 0]
    touchers = {r.regst_id: _touchers(regsts, r.regst_id) for r in requests}
    for r1 in requests:
        for r2 in requests:
            low1, low2 = memory.offsets[r1.regst_id], memory.offsets[r2.regst_id]
            if r1.device != r2.device or r1.end > r2.start or \
                    not (low1 < low2 + memory.size_of(r2) and low2 < low1 + memory.size_of(r1)):
                continue
            w1, w2 = regsts[r1.regst_id].producer, regsts[r2.regst_id].producer
            for t in touchers[r1.regst_id]:
                if w2 not in reach[t]:
                    problems.append(f"same piece: {tasks[t].op_name} (touches regst {r1.regst_id}) may act after "
                                    f"{tasks[w2].op_name} writes regst {r2.regst_id} into the same bytes")
            mine = touchers[r2.regst_id]
            for t in mine:
                if any(u != t and u in reach[t] for u in mine) or t in guard_of[w1] or held_back(w1, t):
                    continue
                problems.append(f"next piece: {tasks[w1].op_name} may write regst {r1.regst_id} again before "
                                f"{tasks[t].op_name} is done with regst {r2.regst_id} in the same bytes")
    return problems


# --- random task DAGs ---------------------------------------------------------------------------------------


@st.composite
def task_dags(draw):
    """``(tasks, regsts, order, loop)``: a random task DAG in its order, in the shapes TaskGraph makes.

    Tasks in ``[loop)`` act k times per call (time shape (1, k)), one in eight of them once (a boxing task of
    a once-per-call blob); Acc / Pack there make a once-per-call regst.  A task reads 0-3 earlier regsts
    (data) and maybe an earlier task's ctrl regst; makes 0-2 regsts on one of two chunks: planned (sizes
    0-2,048 bytes, one in ten with regst num 2), inplace over or an alias of one it reads.  Boxing concat /
    add tasks with two inputs act input-wise; the last task may be a sink tick reading ctrl regsts."""
    n = draw(st.integers(3, 22))
    k = draw(st.sampled_from([1, 2, 3]))
    if k > 1:
        a = draw(st.integers(0, n - 1))
        loop = (a, draw(st.integers(a + 1, n)))
    else:
        loop = (n, n)
    tasks, regsts, order = {}, {}, []
    data, ctrl = [], []                   # regst ids a later task may read
    for i in range(n):
        in_loop = loop[0] <= i < loop[1]
        kinds = ["compute"] * 5 + ["concat", "add", "alias"] + (["acc", "pack"] if in_loop else [])
        kind = "sink_tick" if i == n - 1 and ctrl and draw(st.booleans()) else draw(st.sampled_from(kinds))
        acts = k if in_loop and not draw(st.integers(0, 7)) == 0 else 1
        tid = encode_task_id(TaskId(0, DeviceType.cpu, 0, 0, i))
        task_kind = {"concat": "boxing", "add": "boxing", "sink_tick": "tick", "acc": "acc", "pack": "pack",
                     "alias": "repeat"}.get(kind, "compute")
        task = TaskNode(tid, task_kind, f"t{i}", kind if kind != "alias" else "repeat", 0, "cpu:0", "compute", 0,
                        (1, acts))
        tasks[tid] = task
        order.append(tid)
        if kind == "sink_tick":
            reads = draw(st.lists(st.sampled_from(ctrl), min_size=1, max_size=3, unique=True))
            task.consumed["ctrl"] = reads
        else:
            most = 2 if kind in ("concat", "add") else 3
            least = 2 if kind in ("concat", "add") and len(data) >= 2 else 0
            reads = draw(st.lists(st.sampled_from(data), min_size=least, max_size=most, unique=True)) if data else []
            for j, rid in enumerate(reads):
                task.consumed[f"in_{j}"] = [rid]
            if ctrl and draw(st.integers(0, 3)) == 0:
                task.consumed["ctrl"] = [draw(st.sampled_from(ctrl))]
        for rids in task.consumed.values():
            for rid in rids:
                regsts[rid].consumers.append(tid)
        outs = 0 if kind == "sink_tick" else draw(st.integers(0 if kind == "compute" else 1, 2))
        for j in range(outs):
            rid = per_rank_id(0, len(regsts))
            once = kind in ("acc", "pack") or not in_loop
            num = 2 if draw(st.integers(0, 9)) == 0 else 1
            size = draw(st.sampled_from([0, 64, 128, 256, 512]))
            regst = RegstDesc(rid, f"t{i}/out_{j}", tid, [], (size,), "float32",
                              draw(st.sampled_from(["cpu:0", "cuda:0"])), 0, (1, 1) if once else (1, k),
                              num, num)
            planned_reads = [r for r in reads if regsts[r].mem == "planned" and regsts[r].max_regst_num == 1]
            if kind == "alias" and j == 0 and reads:
                regst.mem, regst.alias_of = "alias", reads[0]
            elif planned_reads and num == 1 and draw(st.integers(0, 3)) == 0:
                regst.inplace_of = draw(st.sampled_from(planned_reads))
                regst.device = regsts[regst.inplace_of].device
            regsts[rid] = regst
            task.produced[f"out_{j}"] = rid
            data.append(rid)
        if kind != "sink_tick" and draw(st.integers(0, 4)) == 0:
            rid = per_rank_id(0, len(regsts))
            regsts[rid] = RegstDesc(rid, f"t{i}/ctrl", tid, [], (), "int8", "cpu:0", 0, mem="ctrl")
            task.produced["ctrl"] = rid
            ctrl.append(rid)
    return tasks, regsts, order, loop


def _memory(algorithm, regsts, order, loop):
    return plan_memory(_requests(regsts, order, loop), algorithm=algorithm)


ALGORITHMS = st.sampled_from(["mem_size_first", "lifetime_first", "time_line", "bottom_up", "best"])


@settings(max_examples=300, deadline=None)
@given(task_dags(), ALGORITHMS)
def test_random_dags_every_pair_of_regsts_sharing_bytes_is_ordered(dag, algorithm):
    """Random task DAGs and memory plans: the guards leave no pair sharing bytes unordered (the checker), each
    guard once; the old pairwise guards pass the same checker (it asks what they guaranteed)."""
    tasks, regsts, order, loop = dag
    memory = _memory(algorithm, regsts, order, loop)
    memory.check()
    edges = mem_guards(tasks, regsts, order, memory)
    assert guard_violations(tasks, regsts, order, memory, edges) == []
    old = reference_mem_guards(tasks, regsts, order, memory)
    assert guard_violations(tasks, regsts, order, memory, old) == []
    assert len(set(edges)) == len(edges)


@settings(max_examples=150, deadline=None)
@given(task_dags(), ALGORITHMS)
def test_no_guard_is_added_exactly_when_the_plan_without_guards_passes_the_checker(dag, algorithm):
    """The checker can fail: where the plan's own edges leave a pair unordered it says so, and only there
    does mem_guards add anything."""
    tasks, regsts, order, loop = dag
    memory = _memory(algorithm, regsts, order, loop)
    bare = guard_violations(tasks, regsts, order, memory, [])
    assert (mem_guards(tasks, regsts, order, memory) == []) == (bare == [])


@settings(max_examples=100, deadline=None)
@given(task_dags())
def test_replanning_keeps_the_guards_and_adds_none_where_they_suffice(dag):
    """replan_memory puts the guards in the plan (one mem_guard ctrl regst per source, each consumer reading
    it under "ctrl"); planning again finds nothing to add, and the plan passes the checker on its own."""
    tasks, regsts, order, loop = dag
    plan = Plan("random", tasks, regsts, order, loop, 2, plan_memory(()))
    once = replan_memory(plan, "mem_size_first")
    edges = mem_guards(tasks, regsts, order, once.memory)
    guards = {(t.task_id, c) for t in once.tasks.values() if GUARD_KEY in t.produced
              for c in once.regsts[t.produced[GUARD_KEY]].consumers}
    assert guards == set(edges)
    for t in once.tasks.values():
        if GUARD_KEY in t.produced:
            rid = t.produced[GUARD_KEY]
            assert all(rid in once.tasks[c].consumed["ctrl"] for c in once.regsts[rid].consumers)
    twice = replan_memory(once, "mem_size_first")
    assert twice.regsts == once.regsts and twice.tasks == once.tasks
    assert guard_violations(once.tasks, once.regsts, order, once.memory, []) == []


def _chain(specs, loop):
    """A hand-made DAG: ``specs[i] = (acts per call, size of its planned output or None, its readers,
    the tasks reading its ctrl regst)``, task i at position i, every regst on one chunk."""
    tids = [encode_task_id(TaskId(0, DeviceType.cpu, 0, 0, i)) for i in range(len(specs))]
    tasks = {tid: TaskNode(tid, "compute", f"t{i}", "relu", 0, "cpu:0", "compute", 0, (1, spec[0]))
             for i, (tid, spec) in enumerate(zip(tids, specs))}
    regsts = {}
    for i, (acts, size, readers, ctrl_readers) in enumerate(specs):
        for key, shape, consumers, mem in (("out_0", (size,), readers, "planned"), ("ctrl", (), ctrl_readers, "ctrl")):
            if (size if key == "out_0" else consumers) is None or (key == "ctrl" and not consumers):
                continue
            rid = per_rank_id(0, len(regsts))
            regsts[rid] = RegstDesc(rid, f"t{i}/{key}", tids[i], [tids[c] for c in consumers], shape, "float32",
                                    "cpu:0", 0, (1, acts), mem=mem)
            tasks[tids[i]].produced[key] = rid
            for c in consumers:
                tasks[tids[c]].consumed.setdefault("in_0" if key == "out_0" else "ctrl", []).append(rid)
    return tasks, regsts, tids, loop


def test_a_looping_producer_waits_for_looping_readers_below_a_holder_read_only_once_per_call():
    """t0 (in the k = 2 loop) makes r1; X1 (t2, read by t3) and X2 (t4, read by t5, which acts once per call)
    take r1's bytes in turn.  t4 reaches t6, which reads t0's ctrl once per call: that holds t0 back after
    t5 (acting once per call) but not after t3 (acting per micro-batch), so the walk down the holders of r1's
    bytes must not stop at X2: t0 -> t3 is a guard."""
    specs = [(2, 128, [1], [6]), (2, None, [], []), (2, 128, [3], []), (2, None, [], []), (2, 128, [5], []),
             (1, None, [], [6]), (1, None, [], [])]
    tasks, regsts, tids, loop = _chain(specs, (0, 6))
    memory = plan_memory(_requests(regsts, tids, loop), algorithm="mem_size_first")
    assert len(set(memory.offsets.values())) == 1    # r1, X1 and X2 share their bytes
    edges = mem_guards(tasks, regsts, tids, memory)
    assert (tids[0], tids[3]) in edges
    assert guard_violations(tasks, regsts, tids, memory, edges) == []
    assert guard_violations(tasks, regsts, tids, memory, [e for e in edges if e != (tids[0], tids[3])]) != []


# --- compiled programs: the old Plan but for the guards ----------------------------------------------------


def _strip_guards(tasks, regsts):
    guards = {t.produced[GUARD_KEY] for t in tasks.values() if GUARD_KEY in t.produced}
    bare_tasks = {}
    for tid, t in tasks.items():
        consumed = {k: [r for r in ids if r not in guards] for k, ids in t.consumed.items()}
        bare_tasks[tid] = dataclasses.replace(t, produced={k: v for k, v in t.produced.items() if k != GUARD_KEY},
                                              consumed={k: v for k, v in consumed.items() if v})
    return bare_tasks, {rid: r for rid, r in regsts.items() if rid not in guards}


UNARY = ["relu", "tanh", "neg", "matmul", "rowsum"]
BINARY = ["add", "mul", "sub"]


def _program(steps, w):
    def build(x):
        values = [x]
        for kind, name, i, j, move in steps:
            a = values[i % len(values)]
            if move:
                a = a.to("cuda" if a.device.type == "cpu" else "cpu")
            if kind == "unary":
                if name == "matmul":
                    y = a @ (w if a.device.type == "cpu" else w.to("cuda"))
                elif name == "rowsum":
                    y = a.sum(dim=1, keepdim=True) * a
                else:
                    y = getattr(a, name)()
            else:
                b = values[j % len(values)]
                y = getattr(a, name)(b if b.device == a.device else b.to(a.device))
            values.append(y)
        return values[-1], values[len(values) // 2]
    return build


def _steps():
    unary = st.tuples(st.just("unary"), st.sampled_from(UNARY), st.integers(0, 30), st.just(0), st.booleans())
    binary = st.tuples(st.just("binary"), st.sampled_from(BINARY), st.integers(0, 30), st.integers(0, 30),
                       st.booleans())
    return st.lists(st.one_of(unary, binary), min_size=2, max_size=14)


def _compiled(build, k: int, x):
    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.config.set_gradient_accumulation_steps(k)

        def build(self, *xs):
            return build(*xs)

    g = G()
    g.executor = "sequential"
    g(x)
    return g


@settings(max_examples=12, deadline=None)
@given(_steps(), st.integers(1, 3))
def test_compiled_programs_get_the_old_plan_but_for_the_guards(steps, k):
    """Random branchy programs (values moved between cpu and cuda, k micro-batches): the TaskGraph's plan has
    the old order, tasks, regsts and memory offsets, guards aside; both guard sets pass the checker."""
    rng = np.random.default_rng(len(steps) + k)
    w = flow.tensor(rng.standard_normal((3, 3)).astype(np.float32))
    g = _compiled(_program(steps, w), k, flow.tensor(rng.standard_normal((2 * k, 3)).astype(np.float32)))
    task_graph = TaskGraph(OpGraph(g.job))
    plan = make_plan(task_graph)
    order, loop = reference_order(task_graph)
    assert (plan.order, plan.loop) == (order, loop)
    memory = plan_memory(_requests(task_graph.regsts, order, loop))
    assert (plan.memory.offsets, plan.memory.block_sizes) == (memory.offsets, memory.block_sizes)
    assert _strip_guards(plan.tasks, plan.regsts) == (task_graph.tasks, task_graph.regsts)
    assert guard_violations(plan.tasks, plan.regsts, order, memory, []) == []
    old = reference_mem_guards(task_graph.tasks, task_graph.regsts, order, memory)
    assert guard_violations(task_graph.tasks, task_graph.regsts, order, memory, old) == []


# --- linear, counted -----------------------------------------------------------------------------------------


def _training_plan(depth: int):
    """benchmarks/bench_memory_plan.py's graph: an MLP of ``depth`` Linear + ReLU, SGD momentum, grad acc 2."""
    flow.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(16, 16), nn.ReLU()]
    model = nn.Sequential(*layers)
    optimizer = flow.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    class Train(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(optimizer)
            self.config.set_gradient_accumulation_steps(2)

        def build(self, x):
            loss = (self.model(x) ** 2).mean()
            loss.backward()
            return loss

    g = Train()
    g.executor = "sequential"
    g(flow.randn(8, 16))
    return g.plan


def test_guard_work_and_guards_per_task_stay_flat_as_a_training_graph_grows():
    """MLP training graphs of depth 4 to 32 (146 to 1,014 tasks): the sweep's reachability tests and the
    guards per task grow by at most 1.3x (2.5 -> 2.8 tests, 0.62 -> 0.70 guards; the pairwise code's guards
    per task grew from 6.0 to 23.0 between depth 8 and 32); at depth 8 the plan passes the checker with at
    most a quarter of the old guards (178 against 1,615)."""
    per_task = {}
    for depth in (4, 8, 32):
        plan = _training_plan(depth)
        tasks, regsts = _strip_guards(plan.tasks, plan.regsts)
        sweep = _GuardPlanner(tasks, regsts, plan.order, plan.memory)
        per_task[depth] = (sweep.visits / len(tasks), len(sweep.edges) / len(tasks))
        if depth == 8:
            assert guard_violations(plan.tasks, plan.regsts, plan.order, plan.memory, []) == []
            assert 4 * len(sweep.edges) <= len(reference_mem_guards(tasks, regsts, plan.order, plan.memory))
    for depth in (8, 32):
        assert per_task[depth][0] <= 1.3 * per_task[4][0], per_task
        assert per_task[depth][1] <= 1.3 * per_task[4][1], per_task
