# ---
# jupyter:
#   jupytext:
#     text_representation:
#       format_name: percent
# ---

# %% [markdown]
# # Tutorial 6: autograd and training
#
# Tutorials 2-3 showed that every op is a **VM instruction** on a stream.
# Training adds three things on top, none of them a new kind of instruction:
# 1. **the tape**: while ops run on tensors that require grad, each output
#    remembers the op that made it (`t.grad_fn`, a `Node`) and where the
#    gradient of each input must go (`node.edges`);
# 2. **backward**: `loss.backward()` walks that graph from the loss and runs
#    each op's backward rule.  The rules are written with the same public ops,
#    so backward is more VM instructions, on the same streams as the forward;
# 3. **the optimizer**: `optimizer.step()` updates each parameter with one
#    fused op that writes it in place (`momentum_update`, as OneFlow's
#    optimizers do), again a VM instruction.
#
# This tutorial draws the tape of a tiny expression, traces its backward,
# counts the instructions of one training step, and then trains a small
# classifier on a 3-class spiral, with a progress bar and a loss curve.
#
# Run it as a script (`python tutorials/06_autograd_and_training.py`) or open
# it as a notebook with jupytext.  The code is in `pyflow/autograd/`
# (`graph.py`: the tape; `engine.py`: backward), the backward rules next to
# each op in `pyflow/ops/`, and `pyflow/nn/`, `pyflow/optim/`.  The pictures
# and the progress bar need matplotlib and tqdm (`pip install -e '.[trace]'`);
# without them the tutorial prints instead.

# %%
import os

os.environ.setdefault("PYFLOW_CUDA", "sim")

import collections
import tempfile
import time

import numpy as np

import pyflow as flow
from pyflow import nn
from pyflow.autograd.graph import AccumulateGrad

print(flow.backend_description())

try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch
except ImportError:
    Figure = out_dir = None
    print("matplotlib is not installed (pip install 'pyflow[trace]'): the pictures are skipped, "
          "everything else runs")
else:
    out_dir = tempfile.mkdtemp(prefix="pyflow_autograd_")  # a temporary directory, outside the repository

# %% [markdown]
# ## 1. The tape of `y = tanh(w * x + b)`
#
# `w` and `b` are leaves that require grad (parameters); `x` is data.  The
# tensors live on the (simulated) GPU, to show later which stream backward
# runs on.  Each op on a tensor that requires grad gives its output a
# `grad_fn`: a `Node` with the op's name, its saved tensors, and one **edge**
# per input: `(node, output_nr)`, the node that the input's gradient goes to,
# or `None` for an input that needs no gradient (`x`).  A leaf's node is an
# `AccumulateGrad`, which adds the gradient into `leaf.grad`; `node.leaf()`
# returns the leaf (a weak reference: the tape does not keep parameters alive).

# %%
w = flow.tensor(0.5, device="cuda", requires_grad=True)
b = flow.tensor(0.1, device="cuda", requires_grad=True)
x = flow.tensor(2.0, device="cuda")
with flow.trace() as forward_trace:
    y = (w * x + b).tanh()
print("y =", y.item(), "| y.grad_fn =", y.grad_fn, "| w.grad_fn =", w.grad_fn, "(a leaf)")
print("y.grad_fn.edges =", y.grad_fn.edges)

# %% [markdown]
# Walking the edges from `y.grad_fn` gives the whole graph: the order in
# which backward can visit it, and what it will reach.  `label` names a node
# the way PyTorch prints it (`TanhBackward`), and a leaf's `AccumulateGrad`
# by the leaf's variable name.

# %%
NAMES = {id(w): "w", id(b): "b"}


def label(node) -> str:
    if isinstance(node, AccumulateGrad):
        leaf = node.leaf()
        return f"AccumulateGrad ({NAMES.get(id(leaf), 'a leaf')})"
    return node.name()   # PyTorch's name: MulBackward0


def print_tape(node, prefix: str = "", last: bool = True, root: bool = True) -> None:
    """The graph as a tree of text, root first (a node reached twice is printed twice)."""
    print(label(node) if root else f"{prefix}{'└── ' if last else '├── '}{label(node)}")
    child_prefix = "" if root else prefix + ("    " if last else "│   ")
    for i, edge in enumerate(node.edges):
        is_last = i == len(node.edges) - 1
        if edge is None:
            print(f"{child_prefix}{'└── ' if is_last else '├── '}None (input {i} needs no gradient)")
        else:
            print_tape(edge[0], child_prefix, is_last, root=False)


print_tape(y.grad_fn)


# %% [markdown]
# The same graph drawn: one column per distance from `y`, boxes for nodes,
# arrows along the edges, the way backward walks (and the gradient flows).
# The arrows point from the loss to the leaves: the forward ran the other way.

# %%
def tape_layout(root):
    """Every node, and each None edge, at (column, row): column = the longest distance from the root."""
    depth, order = {root: 0}, [root]
    for node in order:                                     # breadth first; in a DAG keep the longest path
        for edge in node.edges:
            if edge is not None:
                child = edge[0]
                if child not in depth:
                    order.append(child)
                depth[child] = max(depth.get(child, 0), depth[node] + 1)
    columns = [[root]]
    while True:                                            # a column: the next column's items, in edge order
        items = []
        for item in columns[-1]:
            for i, edge in enumerate(() if isinstance(item, tuple) else item.edges):
                if edge is None:
                    items.append(("none", item, i))
                elif depth[edge[0]] == len(columns) and edge[0] not in items:
                    items.append(edge[0])
        if not items:
            break
        columns.append(items)
    return {item: (column, row - (len(items) - 1) / 2)
            for column, items in enumerate(columns) for row, item in enumerate(items)}


def draw_tape(root, path: str, title: str) -> None:
    positions = tape_layout(root)
    fig = Figure(figsize=(2.6 * (1 + max(c for c, _ in positions.values())), 3.2), layout="constrained")
    canvas = FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.set_axis_off()
    boxes = {}
    for item, (column, row) in positions.items():
        if isinstance(item, tuple):                        # an edge that is None
            text, style = f"None\n(input {item[2]}: no grad)", dict(boxstyle="round", fc="white", ec="0.6", ls="--")
        elif isinstance(item, AccumulateGrad):
            text, style = label(item), dict(boxstyle="round", fc="#cfe8cf", ec="green")
        else:
            text, style = label(item), dict(boxstyle="round", fc="#d6e4f5", ec="tab:blue")
        boxes[item] = ax.text(column, -row, text, ha="center", va="center", fontsize=10, bbox=style)
    ax.set_xlim(-0.6, max(c for c, _ in positions.values()) + 0.6)
    ax.set_ylim(-max(abs(r) for _, r in positions.values()) - 0.6, max(abs(r) for _, r in positions.values()) + 0.6)
    canvas.draw()                                          # place the boxes, so the arrows can end at their edges
    for item in positions:
        if isinstance(item, tuple):
            continue
        for i, edge in enumerate(item.edges):
            target = ("none", item, i) if edge is None else edge[0]
            start, end = boxes[item], boxes[target]
            ax.add_patch(FancyArrowPatch(start.get_position(), end.get_position(), arrowstyle="-|>",
                                         mutation_scale=14, color="0.3", patchA=start.get_bbox_patch(),
                                         patchB=end.get_bbox_patch(), shrinkA=2, shrinkB=2))
    ax.set_title(title, fontsize=10)
    fig.savefig(path, dpi=90)
    print("tape drawn to", path)


if Figure is not None:
    draw_tape(y.grad_fn, os.path.join(out_dir, "1_tape.png"),
              "y = tanh(w * x + b): y.grad_fn and its edges (the way backward walks)")

# %% [markdown]
# ## 2. Backward is VM instructions, on the forward's stream
#
# `y.backward()` seeds the gradient dy/dy = 1 and visits the nodes in
# dependency order (`pyflow/autograd/engine.py`).  Each rule is PyTorch's
# formula written with public ops: tanh's is `grad * (1 - y * y)`, mul's is
# `grad * x` for `w`, add's passes `grad` through.  So a trace of `backward()`
# is a list of ordinary instructions (in the order they were issued, by serial
# number):

# %%
with flow.trace() as backward_trace:
    y.backward()


def show(tracer, heading: str) -> None:
    print(heading)
    for r in sorted(tracer.records, key=lambda r: r.serial):
        print(f"  #{r.serial:<4} {r.name:15} on {r.stream}")


show(forward_trace, "forward:")
show(backward_trace, "backward:")
assert {r.stream for r in forward_trace.records} == {r.stream for r in backward_trace.records} == {"cuda:0/compute"}

# %% [markdown]
# Reading the backward list:
# - `fill`: the seed, `ones_like(y)`;
# - `mul`, `tensor`, `sub`, `mul`: tanh's rule, `grad * (1.0 - y * y)`; the
#   Python float `1.0` becomes a small `tensor` instruction on the device;
# - add's rule needs no instruction: its gradient is the incoming one;
# - `mul`: mul's rule for `w`, `grad * x` (none for `x`: its edge is None);
# - `release_tensor`: intermediates that died free their memory on the stream,
#   after their last reader (OneFlow's ReleaseTensor);
# - `contiguous`: `AccumulateGrad` stores a copy (`grad.clone()`) as the
#   first `leaf.grad`: a rule may hand one tensor to several inputs (add's
#   does), and `.grad` must be the leaf's own memory.
#
# Everything runs on `cuda:0/compute`, in order after the forward: backward
# needs no synchronisation of its own.  The gradients match the formulas,
# d/dw tanh(wx + b) = (1 - y^2) x and d/db = 1 - y^2:

# %%
dy = 1 - y.item() ** 2
print(f"w.grad = {w.grad.item():.6f} (formula {dy * 2.0:.6f}), b.grad = {b.grad.item():.6f} (formula {dy:.6f})")
assert np.isclose(w.grad.item(), dy * 2.0, rtol=1e-5) and np.isclose(b.grad.item(), dy, rtol=1e-5)

# %% [markdown]
# `flow.autograd.grad(outputs, inputs)` runs the same engine but returns the
# gradients instead of adding them into `.grad`.  A second backward through the
# same graph is an error, because the first one freed the saved tensors; here
# we build the graph again.  `flow.no_grad()` turns the recording off (the
# optimizer's updates run under it).

# %%
(dw,) = flow.autograd.grad((w * x + b).tanh(), [w])
with flow.no_grad():
    untaped = (w * x + b).tanh()
print("autograd.grad:", dw.item(), "| under no_grad: requires_grad =", untaped.requires_grad,
      ", grad_fn =", untaped.grad_fn)
assert np.isclose(dw.item(), w.grad.item()) and untaped.grad_fn is None

# %% [markdown]
# ## 3. A classifier, and the instructions of one training step
#
# The data: three interleaved spiral arms in the plane, 100 points each
# (class c's arm turns through angles 4c to 4c + 4, with noise).  A straight
# line cannot separate them; a small MLP can.

# %%
def spiral(points_per_class: int = 100, classes: int = 3, noise: float = 0.2, seed: int = 0):
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for c in range(classes):
        radius = np.linspace(0.0, 1.0, points_per_class)
        angle = np.linspace(4.0 * c, 4.0 * (c + 1), points_per_class) + rng.normal(0, noise, points_per_class)
        xs.append(np.stack([radius * np.sin(angle), radius * np.cos(angle)], axis=1))
        ys.append(np.full(points_per_class, c))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.int64)


points, labels = spiral()
X, Y = flow.tensor(points), flow.tensor(labels)              # on cpu: see "cost" below

flow.manual_seed(0)
model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 3))
loss_fn = nn.CrossEntropyLoss()
optimizer = flow.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
print(model)
print("parameters:", [(name, tuple(p.shape)) for name, p in model.named_parameters()])

# %% [markdown]
# One step is `zero_grad`, forward and loss, backward, `optimizer.step()`.
# Tracing each phase separately shows what it issues.  (`zero_grad` sets every
# `p.grad` to None: no instruction, but the old gradients' `release_tensor`s
# come with the next phase's ops: a dead tensor's finalizer queues its
# storage, and the next op issues the release.  The first step also creates
# SGD's momentum buffers, so we trace the second.)  A third step, traced
# whole, is drawn as a timeline.

# %%
def train_step():
    optimizer.zero_grad()
    loss = loss_fn(model(X), Y)
    loss.backward()
    optimizer.step()
    return loss


train_step()
phases = {}
with flow.trace() as phases["zero_grad"]:
    optimizer.zero_grad()
with flow.trace() as phases["forward + loss"]:
    loss = loss_fn(model(X), Y)
with flow.trace() as phases["backward"]:
    loss.backward()
with flow.trace() as phases["optimizer.step"]:
    optimizer.step()
for name, tracer in phases.items():
    counts = collections.Counter(r.name for r in tracer.records)
    listed = ", ".join(f"{op} {n}" for op, n in counts.most_common()) or "(none)"
    print(f"{name:15} {len(tracer.records):3} instructions: {listed}")
step_instructions = sum(len(t.records) for t in phases.values())
streams = sorted({r.stream for t in phases.values() for r in t.records})
print("one step:", step_instructions, "instructions, on", streams)
with flow.trace() as step_trace:
    train_step()
print(step_trace.summary())
if Figure is not None:
    print("timeline of the step drawn to", step_trace.plot(os.path.join(out_dir, "2_train_step_timeline.png")))

# %% [markdown]
# **Reading the timeline.**  The whole step counts a few more instructions
# than the phases' sum: a `release_tensor` comes when Python drops a tensor,
# here those the step before left behind.  All of them run on one stream, in
# issue order.  The grey lane is long: the worker starts computing only after
# Python has issued (almost) the whole step.  The VM's scheduler and worker
# are Python threads; while this thread issues ops it holds the GIL, and
# CPython hands the GIL to another thread only every
# `sys.getswitchinterval()` = 5 ms.  Issue and compute overlap little on cpu,
# where a small kernel is a numpy call of a few microseconds: the Python of
# each op is the cost.
#
# **Cost.** In eager mode each instruction costs the Python of the op (about
# 100-200 us here, `benchmarks/bench_eager_ops.py`), whatever its size, so a
# step costs about (instructions x that): 10-20 ms for this model, whether the
# batch has 3 points or 300.  That is why the whole data set is one batch, and
# why the data is on cpu here.  On "cuda" without a GPU (the simulator) the
# step is the same after a start-up: the default tier, `auto`, runs a small
# kernel's first 31 launches thread by thread (0.4-1 s a step), then compiles
# it (about 40 s for a step's kernels on a fresh machine) and runs it at 10-15
# ms a step; a later run loads what the first compiled, and is fast from its
# third step (`kernels/sim/tiers.py`; `benchmarks/bench_sim_tiers.py --sections
# first` measures both runs).  `benchmarks/bench_train_step.py` compares a cpu
# step with PyTorch's.

# %% [markdown]
# ## 4. Training, with a progress bar
#
# 300 full-batch steps.  `loss.item()` reads the loss back, which waits for
# the step's instructions; the bar shows it.  (Reading it every step keeps the
# VM at most one step ahead of Python; it costs little here.)

# %%
try:
    from tqdm.auto import tqdm
except ImportError:
    tqdm = None
    print("tqdm is not installed (pip install 'pyflow[trace]'): printing the loss every 50 steps instead of a "
          "progress bar")

STEPS = 300
losses = []
start = time.perf_counter()
bar = tqdm(range(STEPS), desc="training", unit="step") if tqdm else range(STEPS)
for step in bar:
    losses.append(train_step().item())
    if tqdm:
        bar.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
    elif step % 50 == 0 or step == STEPS - 1:
        print(f"  step {step:3}: loss {losses[-1]:.4f}")
if tqdm:
    bar.close()
elapsed = time.perf_counter() - start
print(f"{STEPS} steps in {elapsed:.1f} s ({elapsed / STEPS * 1e3:.1f} ms per step): "
      f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
assert losses[-1] < 0.5 * losses[0], "the loss did not go down"

# %% [markdown]
# Accuracy on the training points, with recording off (no tape is needed to
# predict):

# %%
with flow.no_grad():
    predicted = model(X).argmax(dim=1)
    accuracy = (predicted == Y).float().mean().item()
print(f"accuracy: {accuracy:.1%}")
assert accuracy > 0.9, f"accuracy {accuracy:.1%} is too low"

# %% [markdown]
# The loss curve, and the regions the model assigns to each class (its
# prediction on a 150 x 150 grid, one more forward under `no_grad`):

# %%
if Figure is not None:
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    curve, regions = fig.subplots(1, 2)
    curve.plot(losses)
    curve.set_yscale("log")
    curve.set_xlabel("step")
    curve.set_ylabel("cross-entropy loss")
    curve.set_title(f"SGD(lr=0.2, momentum=0.9), {STEPS} full-batch steps")
    grid = np.linspace(-1.1, 1.1, 150, dtype=np.float32)
    gx, gy = np.meshgrid(grid, grid)
    with flow.no_grad():
        grid_classes = model(flow.tensor(np.stack([gx.ravel(), gy.ravel()], axis=1))).argmax(dim=1).numpy()
    colours = np.array(["tab:red", "tab:blue", "tab:green"])
    regions.contourf(gx, gy, grid_classes.reshape(gx.shape), levels=[-0.5, 0.5, 1.5, 2.5], colors=colours, alpha=0.2)
    regions.scatter(points[:, 0], points[:, 1], c=colours[labels], s=10)
    regions.set_title(f"the classes on the plane: accuracy {accuracy:.1%}")
    regions.set_aspect("equal")
    path = os.path.join(out_dir, "3_training.png")
    fig.savefig(path, dpi=80)
    print("loss curve and decision regions drawn to", path)

# %% [markdown]
# ## 5. Mini-batches, a checkpoint, and printing
#
# A course trains on shuffled mini-batches: `flow.utils.data` has PyTorch's
# `TensorDataset` and `DataLoader` (`shuffle=True` draws each epoch's order
# from the generator `flow.manual_seed` seeds).  Two epochs of batches of 32
# go on from the trained model; then `flow.save` writes its `state_dict` (a zip
# of `.npy` arrays: loading runs no code) and a fresh model of the same shape
# loads it and predicts the same.  A tensor prints as PyTorch prints it.

# %%
from pyflow.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True)
print(f"{len(loader)} batches per epoch")
for epoch in range(2):
    for xb, yb in loader:
        optimizer.zero_grad()
        batch_loss = loss_fn(model(xb), yb)
        batch_loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: last batch's loss {batch_loss:.4f}")   # f-string formats a 0-d tensor

checkpoint = os.path.join(tempfile.mkdtemp(prefix="pyflow_ckpt_"), "spiral.pf")
flow.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint)
restored = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 3))
restored.load_state_dict(flow.load(checkpoint)["model"])
with flow.no_grad():
    same = bool((restored(X).argmax(dim=1) == model(X).argmax(dim=1)).all())
print("the reloaded model predicts the same:", same)
assert same
print(restored[2].bias)

# %% [markdown]
# Where to read more: `pyflow/autograd/engine.py` is the whole backward in a
# page; `pyflow/ops/grad_rules.py` says what a backward rule is, and every op file
# in `pyflow/ops/` ends with its rules; `pyflow/optim/sgd.py` is SGD, one fused
# update op per parameter (`pyflow/ops/optim_update.py`).  In OneFlow the same split holds: the autograd engine issues the
# backward ops to the same eager VM as the forward ones.

# %%
print("pictures in", out_dir or "(none: matplotlib is missing)")
