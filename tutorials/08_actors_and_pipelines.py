# ---
# jupyter:
#   jupytext:
#     text_representation:
#       format_name: percent
# ---

# %% [markdown]
# # Tutorial 8: actors, regsts and pipelines (seed 003)
#
# Tutorial 7 compiled an `nn.Graph` into a **Plan**: tasks, regst descs, thread
# ids, memory.  This one runs it.  OneFlow's runtime has no scheduler: every
# task becomes an **actor** on the thread of its stream, and actors only send
# each other **messages**.  A message carries a **regst** (memory plus the
# **piece id** `(call, micro-batch)` it holds): a producer sends a filled regst
# to its consumers, each consumer sends it back when done.  An actor acts when
# every input it needs has arrived (`is_read_ready`) and it has a free output
# regst (`is_write_ready`), and keeps acting until one of the two fails
# (`act_until_fail`).  A producer with regst num r is never more than r pieces
# ahead of its consumers: that is all the flow control there is (**back
# pressure**).
#
# 1. seed 003's own example: loading -> preprocessing -> copy -> training, with
#    regst num 1 and 2, drawn side by side;
# 2. the two-stage training graph of tutorial 7 on its actors, both ranks, with
#    its timeline;
# 3. deterministic mode: every actor on one thread, one message at a time, and
#    one actor's `act_until_fail` by hand;
# 4. what a deadlock looks like (the hang report), and the acts inside
#    `flow.trace()`;
# 5. memory: the runtime's regsts live where the compiler's memory plan put
#    them, sharing bytes, and the `mem_guard` control regsts that make that
#    safe however the actors interleave;
# 6. successive calls of a graph in flight at once.
#
# The code: `pyflow/runtime/` (read `__init__.py` first: it maps the package),
# `pyflow/graph/graph.py` (how a graph call becomes a `LaunchLazyJob`
# instruction and a call of the runtime).  The pictures need matplotlib
# (`pip install -e '.[trace]'`); they go to a temporary directory, or to
# `$PYFLOW_TUTORIAL_OUT`.

# %%
import os

os.environ.setdefault("PYFLOW_CUDA", "sim")

import tempfile

import numpy as np

import pyflow as flow
from pyflow import nn
from pyflow.errors import RuntimeHangError
from pyflow.runtime import Runtime
from pyflow.runtime.pipeline import linear_pipeline_plan, sleeping_act
from pyflow.runtime.timeline import plot_many

print(flow.backend_description())
try:
    import matplotlib  # noqa: F401
except ImportError:
    DRAW = False
    print("matplotlib is not installed (pip install 'pyflow[trace]'): the pictures are skipped")
else:
    DRAW = True
OUT = os.environ.get("PYFLOW_TUTORIAL_OUT") or tempfile.mkdtemp(prefix="pyflow_actors_")
os.makedirs(OUT, exist_ok=True)

# %% [markdown]
# ## 1. Back pressure: seed 003's four-stage pipeline
#
# `linear_pipeline_plan` builds a Plan by hand: a source tick, one task per
# stage, a sink tick, joined by control regsts (pieces and back pressure, no
# memory), each stage on a thread of its own.  `sleeping_act` makes each act
# sleep its stage's cost (`time.sleep` lets the other threads run, as a kernel
# on a device would).  Training is the slowest stage (8 ms, the others 4 ms).
#
# With **regst num 1** a stage may start piece i + 1 only once the next stage
# has finished piece i and returned the regst, so two neighbours never work
# at the same time: a call every 8 + 4 ms.  With **regst num 2** the fast
# stages fill the second regst ahead and then wait; the pipeline runs at the
# bottleneck's pace, a call every 8 ms (seed 003's figure: "the costs of
# loading, preprocessing and copying are hidden in the training time").

# %%
STAGES = ["loading", "preprocessing", "copy", "training"]
COSTS = {"loading": 0.004, "preprocessing": 0.004, "copy": 0.004, "training": 0.008}
timelines = {}
for num in (1, 2):
    plan = linear_pipeline_plan(STAGES, regst_num=num)
    with Runtime(plan, act_fn=sleeping_act(COSTS), max_calls_in_flight=12, name=f"r{num}") as rt:
        for handle in [rt.launch([]) for _ in range(12)]:   # 12 calls in flight at once
            handle.result()
        records = rt.timeline()
    ends = sorted(r.end for r in records if r.op_name == "sink_tick")[5:]
    period = (ends[-1] - ends[0]) / (len(ends) - 1)
    timelines[f"regst num {num}: a call every {period * 1e3:.1f} ms (bound 8 ms)"] = records
    print(f"regst num {num}: a call every {period * 1e3:5.1f} ms; throughput / bottleneck bound = "
          f"{COSTS['training'] / period:.2f}")
    trained = sorted((r.start, r.call) for r in records if r.op_name == "training")
    ahead = max(r.call - max([c for t, c in trained if t <= r.start], default=-1)
                for r in records if r.op_name == "loading")
    print(f"  loading started a piece at most {ahead} calls ahead of the call in training")
if DRAW:
    print("timelines drawn to", plot_many(timelines, os.path.join(OUT, "pipeline_regst_num_1_vs_2.png"),
                                           title="seed 003's pipeline: regst num 1 (top) vs 2 (bottom)"))

# %% [markdown]
# ## 2. A training graph on its actors: two stages on two ranks
#
# The graph of tutorial 7: `first` on rank 0's cpu, `second` on rank 1's GPU,
# two micro-batches per call.  A graph call is a `LaunchLazyJob` instruction
# in the eager VM (reading the inputs) that hands the call to the rank's
# **Runtime**, made at the first call and kept, plus one *output critical
# section* per output (writing it once the call made it); `g(x)` returns once
# the rank's part of the call that touches the caller's memory, talks to other
# ranks or makes the outputs has been issued (section 6).  Every rank runs its own
# tasks of the one Plan on its own runtime; activations cross to rank 1 and
# gradients back as `send` / `recv` tasks, which act in the Plan's order on
# each rank (`pyflow/runtime/comm_net.py`), so neither rank waits in a recv for
# something the other sends only later.
#
# Inside a call the actors of gradient accumulation appear: `unpack` (one input,
# k micro-batches), `repeat` (one weight, read k times), `acc` (k gradients, one
# sum) and `pack` (k losses, one tensor); everything between them acts k times.
# (Two more kinds exist: `output`, which hands each call's value over to the
# caller, and `input_wise`, a boxing concat or add that acts on each piece as it
# arrives from another rank instead of waiting for all of them.)

# %%
rng = np.random.default_rng(0)
X = rng.standard_normal((4, 3)).astype(np.float32)
Y = rng.standard_normal((4, 1)).astype(np.float32)
B = flow.sbp.broadcast


def two_stages():
    stage0, stage1 = flow.placement("cpu", [0]), flow.placement("cuda", [1])
    flow.manual_seed(0)
    first = nn.Linear(3, 4).to_global(placement=stage0, sbp=B)
    second = nn.Linear(4, 1).to_global(placement=stage1, sbp=B)
    optimizer = flow.optim.SGD(list(first.parameters()) + list(second.parameters()), lr=0.05, momentum=0.9)

    class TrainGraph(nn.Graph):
        def __init__(self):
            super().__init__()
            self.first, self.second = first, second
            self.first.to(nn.graph.GraphModule).set_stage(0, stage0)
            self.second.to(nn.graph.GraphModule).set_stage(1, stage1)
            self.add_optimizer(optimizer)
            self.config.set_gradient_accumulation_steps(2)

        def build(self, x, y):
            loss = ((self.second(self.first(x).tanh()) - y) ** 2).mean()
            loss.backward()
            return loss

    graph = TrainGraph()
    x = flow.tensor(X, placement=stage0, sbp=B)
    y = flow.tensor(Y, placement=stage1, sbp=B)
    losses = [graph(x, y).numpy() for _ in range(3)]
    runtime = graph.runtime
    kinds = {}
    for actor in runtime.actors.values():
        kinds[actor.kind] = kinds.get(actor.kind, 0) + 1
    threads = sorted({a.thread.name for a in runtime.actors.values()})
    return flow.env.get_rank(), losses, kinds, threads, runtime.timeline()


results = flow.distributed.run(two_stages, world_size=2)
for rank, losses, kinds, threads, records in results:
    print(f"rank {rank}: {sum(kinds.values())} actors {kinds}")
    print(f"  threads: {', '.join(t.replace('pyflow-actor-TrainGraph-', '') for t in threads)}")
    per_call = {}
    for r in records:
        per_call[(r.op_name, r.kind)] = per_call.get((r.op_name, r.kind), 0) + 1
    grad_acc = sorted({(kind, n // 3) for (_, kind), n in per_call.items() if kind in ("unpack", "repeat", "acc",
                                                                                       "pack")})
    print(f"  acts per call of the grad-acc actors: {grad_acc}")
print("losses per call (2 micro-batches each):", np.round(results[0][1], 5).tolist())
if DRAW:   # calls 1 and 2 (call 0 also compiled the kernels); a recv's act lasts until its data arrives
    both = [r for result in results for r in result[4] if r.call >= 1]
    print("actor timeline of both ranks drawn to",
          plot_many({"two stages on two ranks, calls 1 and 2": both}, os.path.join(OUT, "two_stage_actors.png"),
                    title="every act of both ranks (blue: even calls, grey: odd calls)"))

# %% [markdown]
# ## 3. Deterministic mode: one message at a time
#
# `Runtime(plan, deterministic=True)` starts no thread: every actor lives on the
# caller's thread and every pending message sits in one pool.  `step()`
# delivers the oldest (with `seed=`, a random one: replayable interleavings, which
# the tests use by the hundred).  Below, the messages of one call are delivered
# one by one until the `relu_0` actor has its input; that message is only
# *taken in* (`step(act=False)`), so we can look at the actor before it acts and
# then call `act_until_fail()` ourselves: under pdb, this is where to step into
# `act()` and down to the kernel.

# %%
class Small(nn.Graph):
    def build(self, x):
        return ((x * 2.0).relu().to("cuda") + 1.0)


small = Small()
x = flow.tensor([[1.0, -2.0, 3.0]])
small(x)   # compiles (and runs once on the graph's own runtime)
rt = Runtime(small.plan, small.job, deterministic=True)
handle = rt.launch([x])
relu = rt.actor("relu_0")
while not relu.is_read_ready():
    msg = rt.pending()[0]
    print("deliver", msg)
    rt.step(act=msg.dst != relu.actor_id)
print(f"relu_0: read-ready {relu.is_read_ready()}, write-ready {relu.is_write_ready()}, acts {relu.acts}")
print("relu_0.act_until_fail() ->", relu.act_until_fail(), "act(s); now", relu)
print("the rest of the call:", handle.result()[0].numpy(), "(messages left:", len(rt.pending()), ")")
rt.close()
orders = set()
for seed in range(4):
    with Runtime(small.plan, small.job, deterministic=True, seed=seed) as seeded:
        for h in [seeded.launch([x]) for _ in range(2)]:
            assert np.array_equal(h.result()[0].numpy(), [[3.0, 1.0, 7.0]])
        orders.add(tuple(r.op_name for r in seeded.timeline()))
print(f"4 seeds, {len(orders)} different act orders, the same numbers")

# %% [markdown]
# ## 4. When nothing moves: the hang report
#
# Give one regst desc regst num 0 and its producer can never write: the call
# cannot finish.  A threaded runtime's watchdog notices when no actor acted for
# `hang_timeout` seconds (`PYFLOW_HANG_TIMEOUT`, 60 by default) while calls are in
# flight and no device work is pending; a deterministic runtime sees at once that
# no message is left.  Either way the error names every waiting actor and the
# regst desc it waits for.

# %%
import dataclasses

(mul,) = small.plan.task_of("mul_0")
regsts = dict(small.plan.regsts)
rid = mul.produced["out_0"]
regsts[rid] = dataclasses.replace(regsts[rid], max_regst_num=0)
broken = Runtime(dataclasses.replace(small.plan, regsts=regsts), small.job, deterministic=True)
try:
    broken.launch([x]).result()
except RuntimeHangError as error:
    print(error)

# %% [markdown]
# While `flow.trace()` records, every act also appears in the VM's trace, on a
# track per actor thread, above the VM streams its ops ran on.

# %%
with flow.trace() as tracer:
    small(x)
print(tracer.summary())
if DRAW:
    print("trace drawn to", tracer.plot(os.path.join(OUT, "acts_in_flow_trace.png")))

# %% [markdown]
# ## 5. Memory: one chunk per device, shared bytes, and the guards
#
# The compiler plans memory in the Plan's order: two regsts never alive at the
# same time in that order may share bytes (`g.plan.memory`), and the runtime
# allocates exactly that: one chunk per device of `plan.memory.block_sizes`
# bytes.  But actors do not follow the Plan's order.  Below, `a = x * 2` is read
# by a sum and `b = x * 3`, on another branch, takes `a`'s bytes once the sum has
# read them; nothing in the data orders the two branches.  So the compiler adds
# a control regst, `reduce_sum_0/mem_guard -> mul_1`: the op that makes `b` waits
# for the last reader of `a` (and, across calls, the op that makes `a` again
# waits for the readers of `b`).  OneFlow does the same with its
# `out_ctrl_shared_mem_safe_guard` regsts.  Take the guards away and some
# interleavings give a wrong sum.

# %%
import dataclasses


class Branches(nn.Graph):
    def build(self, x):
        return (x * 2.0).sum(dim=0), (x * 3.0).tanh()


branches = Branches()
branches.executor = "sequential"
xb = flow.tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
want = branches(xb)[0].numpy()
plan = branches.plan
offset = {t.op_name: plan.memory.offsets.get(t.produced.get("out_0")) for t in plan.tasks.values()}
print("mul_0 and mul_1 at offsets", offset["mul_0"], offset["mul_1"], "of a", plan.memory.block_sizes, "chunk")
for task in plan.tasks.values():
    if "mem_guard" in task.produced:
        readers = [plan.tasks[c].op_name for c in plan.regsts[task.produced["mem_guard"]].consumers]
        print(f"  guard: {task.op_name} -> {readers}")


def without_guards(plan):
    guards = {t.produced["mem_guard"] for t in plan.tasks.values() if "mem_guard" in t.produced}
    tasks = {tid: dataclasses.replace(t, produced={k: v for k, v in t.produced.items() if k != "mem_guard"},
                                      consumed={k: [r for r in ids if r not in guards]
                                                for k, ids in t.consumed.items()})
             for tid, t in plan.tasks.items()}
    return dataclasses.replace(plan, tasks=tasks, regsts={r: d for r, d in plan.regsts.items() if r not in guards})


for name, p in (("with the guards", plan), ("without them", without_guards(plan))):
    wrong = 0
    for seed in range(12):
        with Runtime(p, branches.job, deterministic=True, seed=seed) as rt:
            wrong += not np.array_equal(rt.launch([xb]).result()[0].numpy(), want)
            chunks = rt.regst_mgr.chunk_bytes()
    print(f"{name}: {wrong} of 12 interleavings give a wrong sum (the runtime's chunks: {chunks})")

# %% [markdown]
# ## 6. Successive calls in flight
#
# `g(x)` does not wait for its call to end: it returns once the call's
# *frontier* has acted (every op that reads or writes the caller's inputs and
# parameters, talks to other ranks, or makes an output is issued), having
# issued one output critical section per output: an instruction that writes
# the tensor it returns, done once the call's output actor handed the value
# over.  So the next call starts while this one runs, at most
# `config.outputs_buffer_size` of them at once, and `y.numpy()` waits for `y`'s
# call only.  Here a side branch the outputs do not need is slow (its acts
# sleep 20 ms): the calls pile up to the buffer size, and the outputs come out
# right in any order.

# %%
import time

from pyflow.runtime.act import act

w = flow.tensor(np.eye(3, dtype=np.float32))


class WithSlowSide(nn.Graph):
    def __init__(self):
        super().__init__()
        self.config.set_outputs_buffer_size(3)

    def build(self, x):
        (x * 3.0).to("cuda").exp()   # returned nowhere: the call goes on after its output is made
        return (x @ w).relu() + 1.0


def slow_side(plan, task, ins, outs, j, call):
    if task.op_name == "exp_0":
        time.sleep(0.02)
    return act(plan, task, ins, outs, j, call)


g = WithSlowSide()
g.act_fn = slow_side
xs = [flow.tensor(np.full((2, 3), float(i), np.float32)) for i in range(6)]
g(xs[0]).numpy()
ys, in_flight = [], []
for xi in xs:
    ys.append(g(xi))
    in_flight.append(len(g.runtime.calls_in_flight()))
print("calls in flight after each g(x) returned:", in_flight, "(outputs_buffer_size 3)")
print("outputs, read newest first:", [float(y.numpy()[0, 0]) for y in reversed(ys)])
