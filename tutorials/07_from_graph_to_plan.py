# ---
# jupyter:
#   jupytext:
#     text_representation:
#       format_name: percent
# ---

# %% [markdown]
# # Tutorial 7: from nn.Graph to a Plan, on two ranks
#
# Tutorials 2-6 ran every op *eagerly*: one VM instruction per op, decided at
# the call.  OneFlow's other mode compiles a whole training step first
# (seed 004): `nn.Graph.build` is **traced** once into a **Job** (logical ops),
# **passes** add what the user did not write (backward ops, optimizer updates,
# gradient accumulation, pipeline buffers, ticks), the **OpGraph** picks every
# op's **SBP signature**, the **TaskGraph** makes one task per op per rank with
# **regsts** between them and a **boxing** sub-graph on every edge whose layout
# changes, and the **Plan** fixes every regst's place in memory.  Later calls
# only run the Plan.
#
# Everything here runs on **two ranks** (two threads of this process, each
# behaving as a process: tutorial 4).  Every rank traces and compiles the same
# Job into the same Plan, and runs its own tasks of it.
#
# 1. a data-parallel training graph: the SBP signatures the cost model picks,
#    and the boxing of the gradients (an all-reduce);
# 2. a two-stage pipeline (stage 0 on rank 0's cpu, stage 1 on rank 1's GPU)
#    with gradient accumulation: the Job after each pass, the TaskGraph with its
#    boxing nodes (send / recv between the ranks), the light plan, the memory
#    layout of each rank drawn as lifetimes x offsets;
# 3. both give the eager numbers.
#
# The code: `pyflow/graph/graph.py` (nn.Graph), `pyflow/compiler/` (`lazy.py`
# tracing, `passes/`, `op_graph.py`, `task_graph.py`, `boxing/`, `plan.py`,
# `memory.py`, `rank_ticks.py`), `pyflow/runtime/sequential.py` (the sequential
# interpreter).  The pictures need matplotlib
# (`pip install -e '.[trace]'`).

# %%
import os

os.environ.setdefault("PYFLOW_CUDA", "sim")

import tempfile

import numpy as np

import pyflow as flow
from pyflow import nn

print(flow.backend_description())
S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
OUT = tempfile.mkdtemp(prefix="pyflow_plan_")


def say(*args):
    """Print once (from rank 0): every rank runs the same program."""
    if flow.env.get_rank() == 0:
        print(*args)


# %% [markdown]
# ## 1. Data parallel: S(0) data, B weights
#
# The batch is split along dim 0 over both ranks (`S(0)`), the weights are
# whole on each (`B`).  Inside `build` the tensors are lazy, but they still
# have a placement and an SBP: each op's signature is chosen as eager global
# ops choose it (the cost model of SEMANTICS §4), so `x @ w` is
# `(S(0), B) -> S(0)`; `.mean()` has no partial-sum rule, so its S(0) input is
# gathered first (an **all-gather**: the cheapest move the cost model finds).
# The backward of `x @ w` makes the weight's gradient `P` on each rank (each
# rank saw half the batch); the update needs it `B`, so the TaskGraph gives
# that edge a boxing sub-graph: the chain of builders offers it to each in
# turn and `collective_boxing` takes it as one **all-reduce** task per rank.

# %%
rng = np.random.default_rng(0)
X = rng.standard_normal((8, 3)).astype(np.float32)
Y = rng.standard_normal((8, 1)).astype(np.float32)


def data_parallel():
    place = flow.placement("cpu", [0, 1])
    x, y = flow.tensor(X, placement=place, sbp=S(0)), flow.tensor(Y, placement=place, sbp=S(0))

    def make():
        flow.manual_seed(0)
        model = nn.Linear(3, 1).to_global(placement=place, sbp=B)
        return model, flow.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    model, optimizer = make()
    eager_model, eager_optimizer = make()

    class DataParallel(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(optimizer)

        def build(self, x, y):
            loss = ((self.model(x) - y) ** 2).mean()
            loss.backward()
            return loss

    graph = DataParallel()
    loss = graph(x, y)
    from pyflow.compiler.op_graph import OpGraph

    say(f"loss: {loss.numpy():.5f}, sbp {loss.sbp}")
    op_graph = OpGraph(graph.job)
    say("signatures chosen (forward ops; '-' is a Python number):")
    for op in graph.job.ops:
        if not op.backward and op.type in ("matmul", "add", "sub", "pow", "reduce_mean"):
            say(f"  {op.name:14s} {op_graph.by_name[op.name].signature}")
    say("signatures chosen (the weight's gradient):", op_graph.by_name["matmul_1"].signature)
    for boxing in graph.plan.boxings:
        say(f"boxed edge {boxing['lbn']} -> {boxing['consumer']}: {boxing['builder']}")
    say(next(b["text"] for b in graph.plan.boxings if "all_reduce" in b["builder"]))

    losses = [loss.numpy()] + [graph(x, y).numpy() for _ in range(2)]
    eager = []
    for _ in range(3):
        eager_loss = ((eager_model(x) - y) ** 2).mean()
        eager_loss.backward()
        eager_optimizer.step()
        eager_optimizer.zero_grad()
        eager.append(eager_loss.numpy())
    assert np.allclose(losses, eager, rtol=1e-6), (losses, eager)
    say("graph losses", np.array(losses), "== eager", np.array(eager))


flow.distributed.run(data_parallel, world_size=2)

# %% [markdown]
# ## 2. Two pipeline stages on two ranks, with gradient accumulation
#
# `set_stage(stage, placement)` puts a module in a pipeline stage and moves
# its inputs to the stage's placement (a `to_global` op in the Job: without
# it, the link between stages would be a compile error).  Stage 0 runs on rank
# 0's cpu, stage 1 on rank 1's GPU; each call is two micro-batches
# (`set_gradient_accumulation_steps(2)`).
#
# The passes:
# * `grad_acc` gives every blob a **time shape**: `(1, 2)` blobs are made
#   twice per call; `repeat` feeds once-per-call blobs (the weights) to every
#   micro-batch; `pack` puts the two losses together;
# * `autograd` appends the backward ops, calling each op's own backward rule
#   (the ones eager autograd uses) on lazy tensors; a `to_global`'s gradient
#   goes back to where its input was; weight gradients are `acc`'ed;
# * `optimizer` appends one fused `momentum_update` per parameter;
# * `variable_order` adds control edges (an update waits for every reader of
#   the weight); `checks` looks for links between stages that skip a move;
# * `pipeline_buffer` gives the regsts between stages the regst nums OneFlow
#   gives them (stage 0's activations wait for their gradients while the next
#   micro-batch passes); `ticks` adds one source and one sink.


# %%
def pipeline():
    rank = flow.env.get_rank()
    stage0, stage1 = flow.placement("cpu", [0]), flow.placement("cuda", [1])

    class TwoLayers(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Linear(3, 4).to_global(placement=stage0, sbp=B)
            self.second = nn.Linear(4, 1).to_global(placement=stage1, sbp=B)

    def make():
        flow.manual_seed(0)
        model = TwoLayers()
        return model, flow.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    model, optimizer = make()
    eager_model, eager_optimizer = make()

    class TrainGraph(nn.Graph):
        def __init__(self):
            super().__init__()
            self.first, self.second = model.first, model.second
            self.first.to(nn.graph.GraphModule).set_stage(0, stage0)
            self.second.to(nn.graph.GraphModule).set_stage(1, stage1)
            self.add_optimizer(optimizer)
            self.config.set_gradient_accumulation_steps(2)

        def build(self, x, y):
            prediction = self.second(self.first(x).tanh())
            loss = ((prediction - y) ** 2).mean()
            loss.backward()
            return loss

    graph = TrainGraph()
    if rank == 0:
        graph.debug(1)          # print each compile step and its time (rank 0's)
    x = flow.tensor(X[:4], placement=stage0, sbp=B)
    y = flow.tensor(Y[:4], placement=stage1, sbp=B)
    losses = graph(x, y)        # the first call traces, compiles and runs
    say("losses of the 2 micro-batches:", losses.numpy())

    say("\n--- the Job as traced ---")
    say(graph._traced_job_text)
    for name, text in graph.job.pass_log.items():
        say(f"after pass {name:15s}: {len(text.splitlines()) - 1} ops")
    buffers = {op.name: op.attrs["_buffer_size"] for op in graph.job.ops if "_buffer_size" in op.attrs}
    say("pipeline buffers (op -> regst num):", buffers)

    # ## the TaskGraph: tasks of both ranks, and the boxing between them
    plan = graph.plan
    kinds = {}
    for task in plan.tasks.values():
        key = f"rank {task.rank} {task.kind}" + (f"/{task.op_type}" if task.kind == "boxing" else "")
        kinds[key] = kinds.get(key, 0) + 1
    say("\n--- tasks by rank and kind ---")
    for key in sorted(kinds):
        say(f"  {key}: {kinds[key]}")
    for boxing in plan.boxings:   # the edges that move data (on one rank, B -> S(0) moves nothing)
        if "\n  n" in boxing["text"]:
            say(boxing["text"])
    with open(os.path.join(OUT, f"plan_rank{rank}.dot"), "w") as f:
        f.write(plan.to_dot())   # boxing tasks are the salmon boxes; `dot -Tpng` draws it
    say(f"task graph (graphviz) written to {OUT}/plan_rank0.dot ({len(plan.to_dot().splitlines())} lines)")

    # ## the light plan: one record per actor; here the send of stage 0's activation to rank 1.
    # Nothing on rank 0 reads what a send makes, so the Plan's last compile step (`rank_ticks.py`)
    # gave it a ctrl regst that rank 0's sink tick reads: the call ends only after the send acted.
    # Its regst num is the outputs buffer size (2 calls in flight); a recv, reading nothing, got the
    # source tick's ctrl regst.  The runtime runs this Plan as it is.
    records = str(plan).split("actor id : ")
    send = next(r for r in records if "-send\n" in r.split(" name : ")[-1].split("  chain_id")[0] + "\n"
                and " chain_id : 0/" in r)
    say("\n--- light plan, the record of rank 0's send actor ---")
    say("actor id : " + send)

    # ## memory: each rank's chunk, lifetimes x offsets
    say("\n--- memory per rank and device ---")
    for row in plan.memory_report():
        say(f"  {row['device']:14s} planned {row['planned_bytes']:6d} B, lower bound {row['lower_bound_bytes']:6d} B, "
            f"ratio {row['ratio']:.3f} ({row['regst_num']} regsts, {row['algorithm']})")
    plan.memory.check()   # raises if two live regsts overlapped
    if rank == 0:
        _draw_memory(plan)

    # ## the graph gives the eager numbers
    def eager_step():
        found = []
        for j in range(2):
            xj = flow.tensor(X[2 * j:2 * j + 2], placement=stage0, sbp=B)
            yj = flow.tensor(Y[2 * j:2 * j + 2], placement=stage1, sbp=B)
            hidden = eager_model.first(xj).tanh().to_global(placement=stage1)
            loss = ((eager_model.second(hidden) - yj) ** 2).mean()
            (loss / 2).backward()
            found.append(loss.numpy())
        eager_optimizer.step()
        eager_optimizer.zero_grad()
        return np.array(found)

    eager = [eager_step()]
    graph_losses = [losses.numpy()]
    for _ in range(2):
        graph_losses.append(graph(x, y).numpy())
        eager.append(eager_step())
    assert np.allclose(graph_losses, eager, rtol=1e-6), (graph_losses, eager)
    say("\ngraph:", np.array(graph_losses).round(5).tolist(), "\neager:", np.array(eager).round(5).tolist())
    say("the graph and the eager loop agree after", len(eager), "steps")


def _draw_memory(plan):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print("matplotlib is not installed (pip install 'pyflow[trace]'): the picture is skipped")
        return
    from pyflow.compiler.memory import draw

    devices = [row["device"] for row in plan.memory_report()]
    fig = Figure(figsize=(6 * len(devices), 3.5))
    FigureCanvasAgg(fig)
    for i, device in enumerate(devices):
        draw(plan.memory, plan.memory.requests, device, fig.add_subplot(1, len(devices), i + 1))
    path = os.path.join(OUT, "memory_layout.png")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    print("memory layout of both ranks drawn to", path)


flow.distributed.run(pipeline, world_size=2)
