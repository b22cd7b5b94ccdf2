# ---
# jupyter:
#   jupytext:
#     text_representation:
#       format_name: percent
# ---

# %% [markdown]
# # Tutorial 7: from nn.Graph to a Plan
#
# Tutorials 2-6 ran every op *eagerly*: one VM instruction per op, decided at
# the call.  OneFlow's other mode compiles a whole training step first
# (seed 004): `nn.Graph.build` is **traced** once into a **Job** (logical ops),
# **passes** add what the user did not write (backward ops, optimizer updates,
# gradient accumulation, ticks), the **OpGraph** fixes where each op runs, the
# **TaskGraph** makes one task per op per device with **regsts** between them,
# and the **Plan** fixes every regst's place in memory.  Later calls only run
# the Plan.
#
# This tutorial compiles a tiny training graph with **gradient accumulation**
# (k = 2 micro-batches per call) and **two pipeline stages** (stage 0 on the
# cpu, stage 1 on the - simulated - GPU), and shows the Job after every pass,
# the tasks and regsts, OneFlow's "light plan", and the memory layout drawn
# as lifetimes x offsets.  It then checks that the graph gives the eager
# numbers.
#
# The code: `pyflow/graph/graph.py` (nn.Graph), `pyflow/compiler/` (`lazy.py`
# tracing, `passes/`, `op_graph.py`, `task_graph.py`, `plan.py`, `memory.py`,
# `run_plan.py`).  Global tensors (placements of several ranks, SBP, boxing
# tasks) are not compiled yet: the two stages here are two devices of one rank.
# The picture needs matplotlib (`pip install -e '.[trace]'`).

# %%
import os

os.environ.setdefault("PYFLOW_CUDA", "sim")

import tempfile

import numpy as np

import pyflow as flow
from pyflow import nn

print(flow.backend_description())

# %% [markdown]
# ## 1. A training graph
#
# Modules become graph members; `set_stage(stage, device)` puts a module in a
# pipeline stage and moves its inputs to that stage's device (a `copy` op in
# the Job: without it, the link between stages would be a compile error).
# `loss.backward()` inside `build` only marks the loss.

# %%
flow.manual_seed(0)


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(3, 4)
        self.second = nn.Linear(4, 1)


model = TwoLayers()
eager_model = TwoLayers()
eager_model.load_state_dict(model.state_dict())
model.second.to("cuda")
eager_model.second.to("cuda")
optimizer = flow.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


class TrainGraph(nn.Graph):
    def __init__(self):
        super().__init__()
        self.first, self.second = model.first, model.second
        self.first.to(nn.graph.GraphModule).set_stage(0, "cpu")
        self.second.to(nn.graph.GraphModule).set_stage(1, "cuda")
        self.add_optimizer(optimizer)
        self.config.set_gradient_accumulation_steps(2)

    def build(self, x, y):
        prediction = self.second(self.first(x).tanh())
        loss = ((prediction - y) ** 2).mean()
        loss.backward()
        return loss


graph = TrainGraph()
graph.debug(1)          # print each compile step and its time
x = flow.randn(4, 3)
y = flow.randn(4, 1, device="cuda")
losses = graph(x, y)    # the first call traces, compiles and runs
print("losses of the 2 micro-batches:", losses.numpy())

# %% [markdown]
# ## 2. The Job, as traced and after each pass
#
# Traced: `build` saw one micro-batch (`unpack` splits the input), every
# parameter is a `variable` op, `tanh`/`matmul` are Job ops, and each line
# names the Python line that made it.  Then the passes:
# * `grad_acc` gives every blob a **time shape**: `(1, 2)` blobs are made
#   twice per call; `repeat` feeds once-per-call blobs (the weights) to every
#   micro-batch; `pack` puts the two losses together;
# * `autograd` appends the backward ops, calling each op's own backward rule
#   (the ones eager autograd uses) on lazy tensors; weight gradients are
#   `acc`'ed over the micro-batches;
# * `optimizer` appends one fused `momentum_update` per parameter (the op the
#   eager `step()` issues), reading the learning rate and the step count from
#   tensors refilled before every call;
# * `variable_order` adds control edges (an update waits for every reader of
#   the weight); `ticks` adds one source and one sink.

# %%
print(graph._traced_job_text)
for name, text in graph.job.pass_log.items():
    new = len(text.splitlines()) - 1
    print(f"after pass {name:15s}: {new} ops")
print()
print("\n".join(line for line in str(graph.job).splitlines() if "update" in line or " acc(" in line))

# %% [markdown]
# ## 3. Tasks, regsts and the light plan
#
# One task per op (one device each here).  Its id carries OneFlow's bit layout
# (rank | device type | device index | stream index | task index); its thread
# is `task_id >> 21`.  The cpu -> cuda copy runs on the host2device stream and
# its regst has **regst num 2**, so the next micro-batch can load while this
# one computes.  Every record below is one actor of OneFlow's light plan.

# %%
plan = graph.plan
kinds = {}
for task in plan.tasks.values():
    kinds[task.kind] = kinds.get(task.kind, 0) + 1
print("tasks by kind:", kinds)
text = str(plan)
copy_record = text[text.index("kind : copy_h2d") - 200:]
print(text[:1200])
print("...")
print(copy_record[copy_record.index("actor id"):][:700])

# %% [markdown]
# ## 4. Memory: lifetimes x offsets
#
# Each planned regst lives from its producer's position in the order to its
# last consumer's (+1); regsts that cross the micro-batch loop live through the
# whole loop.  The planner gives every regst an offset in its device's chunk
# so that regsts alive at the same time never overlap, and comes close to the
# lower bound, the most bytes ever alive at once.

# %%
for row in plan.memory_report():
    print(f"{row['device']:14s} planned {row['planned_bytes']:6d} B, lower bound {row['lower_bound_bytes']:6d} B, "
          f"ratio {row['ratio']:.3f} ({row['regst_num']} regsts, {row['algorithm']})")
plan.memory.check()   # raises if two live regsts overlapped

try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
except ImportError:
    print("matplotlib is not installed (pip install 'pyflow[trace]'): the picture is skipped")
else:
    from pyflow.compiler.memory import draw

    devices = [row["device"] for row in plan.memory_report()]
    fig = Figure(figsize=(6 * len(devices), 3.5))
    FigureCanvasAgg(fig)
    for i, device in enumerate(devices):
        draw(plan.memory, plan.memory.requests, device, fig.add_subplot(1, len(devices), i + 1))
    path = os.path.join(tempfile.mkdtemp(prefix="pyflow_plan_"), "memory_layout.png")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    print("memory layout drawn to", path)
with open(os.path.join(tempfile.mkdtemp(prefix="pyflow_plan_"), "plan.dot"), "w") as f:
    f.write(plan.to_dot())
print("task graph written as graphviz text to", f.name, f"({len(plan.to_dot().splitlines())} lines)")

# %% [markdown]
# ## 5. The graph gives the eager numbers
#
# The eager loop that the graph is: for each micro-batch, `(loss / k).backward()`;
# then one `step()`.  Three more calls of the graph against three eager steps.

# %%
eager_optimizer = flow.optim.SGD(eager_model.parameters(), lr=0.05, momentum=0.9)


def eager_step():
    found = []
    for j in range(2):
        hidden = eager_model.first(x[2 * j:2 * j + 2]).tanh().to("cuda")
        loss = ((eager_model.second(hidden) - y[2 * j:2 * j + 2]) ** 2).mean()
        (loss / 2).backward()
        found.append(loss.item())
    eager_optimizer.step()
    eager_optimizer.zero_grad()
    return found


eager_losses = [eager_step()]
for _ in range(3):
    graph_losses = graph(x, y).numpy()
    eager_losses.append(eager_step())
    print("graph:", graph_losses, " eager:", np.array(eager_losses[-1], dtype=np.float32))
    assert np.allclose(graph_losses, eager_losses[-1], rtol=1e-6)
assert np.allclose(model.first.weight.numpy(), eager_model.first.weight.numpy(), rtol=1e-6, atol=1e-7)
print("the graph and the eager loop agree after", len(eager_losses), "steps")
