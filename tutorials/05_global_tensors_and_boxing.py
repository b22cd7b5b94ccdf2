# ---
# jupyter:
#   jupytext:
#     text_representation:
#       format_name: percent
# ---

# %% [markdown]
# # Tutorial 5: global tensors and boxing
#
# A **global tensor** is one logical tensor whose pieces live on several
# ranks.  Two things say how: its **placement** (which ranks, which device
# type) and its **SBP** (split, broadcast or partial sum).  Changing the SBP
# or the placement while keeping the logical value is **boxing**.
#
# This tutorial follows OneFlow's design (seed 004) in pyflow:
# 1. ranks as threads, SPMD style;
# 2. placement and SBP;
# 3. local -> global (OneFlow's **RawLocalToGlobal**);
# 4. the four kinds of conversions and one across placements, drawn as the
#    pieces each rank holds, with the choice of the **boxing builder chain**;
# 5. a data-parallel and a model-parallel matmul, and the **SBP signature**
#    each op runs with;
# 6. the same on a "cuda" placement;
# 7. what pyflow reports when the ranks run different code.
#
# Run it as a script (`python tutorials/05_global_tensors_and_boxing.py`) or
# open it as a notebook with jupytext.  The code is in `pyflow/distributed/`
# (`run.py`, `global_tensor.py`, `boxing.py`, `signatures.py`: the cost model,
# `global_ops.py`), `pyflow/framework/` (`placement.py`, `sbp.py`) and, for
# each op's SBP signatures, beside the op in `pyflow/ops/`.

# %%
import os

os.environ.setdefault("PYFLOW_CUDA", "sim")

import tempfile
import threading

import numpy as np

import pyflow as flow
from pyflow.device.ep import device_count
from pyflow.distributed.boxing import plan_for
from pyflow.distributed.boxing_chain import CHAIN
from pyflow.distributed.boxing_steps import Layout
from pyflow.framework.interpreter import global_interpreter
from pyflow.framework.sbp import balanced_split

S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
print(flow.backend_description())

# %% [markdown]
# ## 1. Ranks as threads
#
# OneFlow runs one process per device, and every process runs the same script
# (SPMD: single program, multiple data); the script branches on
# `flow.env.get_rank()` where the ranks differ.  pyflow runs the ranks as
# threads of one Python process: `flow.distributed.run(fn, world_size=4)` calls
# `fn` once per rank and returns their results, in rank order.
#
# Each rank still behaves as a process: it has its own rank context
# (OneFlow's GlobalProcessCtx) with its own virtual machine, streams and
# devices, and it meets the other ranks only through a transport.  Return plain
# values: a rank's tensors belong to its VM, which stops when `fn` returns.
# (Here each rank returns its stopped VM object too, so that we can compare them.)

# %%
def hello():
    rank = flow.env.get_rank()
    x = flow.tensor([1.0, 2.0]) * (rank + 1)          # a local tensor, on this rank's VM
    return rank, flow.env.get_world_size(), threading.current_thread().name, flow.vm.get_vm(), x.tolist()


results = flow.distributed.run(hello, world_size=4)
for rank, world, thread, vm, value in results:
    print(f"rank {rank} of {world} on thread {thread}: its own VM {id(vm):#x}, computed {value}")
assert len({id(vm) for *_, vm, _ in results}) == 4   # four ranks, four virtual machines

# %% [markdown]
# ## 2. Placement and SBP
#
# `flow.placement(type, ranks)` is OneFlow's ParallelDesc.  The ranks are
# sorted, and a rank's **parallel_id** is its position in that order; a rank
# outside the placement has none.  A nested list makes a 2-D hierarchy.
#
# A placement needs a world to check its ranks against, so we build them
# inside the ranks (here rank 0 reports).

# %%
def placements():
    shuffled = flow.placement("cpu", [3, 1, 2, 0])
    half = flow.placement("cuda", [2, 3])
    grid = flow.placement("cpu", [[0, 1], [2, 3]])
    if flow.env.get_rank() != 0:
        return None
    return [f"{shuffled}: parallel_id of rank 2 = {shuffled.parallel_id(2)}",
            f"{half}: parallel_id of rank 3 = {half.parallel_id(3)}, of rank 0 = {half.parallel_id(0)}",
            f"{grid}: hierarchy {grid.hierarchy}, rank 2 is parallel_id {grid.parallel_id(2)} "
            f"at coordinates {grid.coordinates(grid.parallel_id(2))}"]


print("\n".join(flow.distributed.run(placements, world_size=4)[0]))

# %% [markdown]
# One SBP per hierarchy axis says how the logical tensor maps to the pieces:
# - `flow.sbp.split(d)`, **S(d)**: consecutive slices along dim `d`;
# - `flow.sbp.broadcast`, **B**: every rank holds the whole tensor;
# - `flow.sbp.partial_sum`, **P**: every rank holds a whole-shaped tensor, and
#   the logical value is their sum.
#
# Slices come from the **balanced splitter**: n parts of `total // n`, the first
# `total % n` one longer.  10 rows on 4 ranks are 3, 3, 2, 2:

# %%
print(S(0), B, P, "| short:", S(0).short(), B.short(), P.short())
print("balanced_split(10, 4) =", balanced_split(10, 4))


def uneven():
    on4 = flow.placement("cpu", [0, 1, 2, 3])
    x = flow.tensor(np.arange(20.0).reshape(10, 2), placement=on4, sbp=S(0))   # the logical 10x2 tensor
    grid = flow.placement("cpu", [[0, 1], [2, 3]])
    y = flow.tensor(np.arange(16.0).reshape(4, 4), placement=grid, sbp=(S(0), S(1)))
    return tuple(x.to_local().shape), y.to_local().numpy().tolist()


for rank, (rows, block) in enumerate(flow.distributed.run(uneven, world_size=4)):
    print(f"rank {rank}: its piece of the 10x2 S(0) tensor has shape {rows}; "
          f"of the 4x4 (S(0), S(1)) tensor on [[0, 1], [2, 3]]: {block}")

# %% [markdown]
# ## 3. Local -> global
#
# `x.to_global(placement, sbp)` of a *local* tensor is OneFlow's
# RawLocalToGlobal: each rank's local tensor becomes its piece, and the SBP says
# what logical tensor the pieces make:
# - **S(0)**: the pieces concatenated along dim 0, in parallel_id order;
# - **B**: the data of parallel_id 0 (the others' data is ignored);
# - **P**: the elementwise sum of the pieces.
#
# `numpy()` of a global tensor is the whole logical value.  It is a collective
# (every rank must call it).  `to_local()` is this rank's piece, with no
# communication.

# %%
def local_to_global():
    rank = flow.env.get_rank()
    mine = flow.tensor([[10.0 * rank, 10.0 * rank + 1]])           # rank r holds [[10r, 10r + 1]]
    on4 = flow.placement("cpu", [0, 1, 2, 3])
    out = {}
    for sbp in (S(0), B, P):
        g = mine.to_global(placement=on4, sbp=sbp)
        out[sbp.short()] = (tuple(g.shape), g.numpy(), g.to_local().numpy())
    return out


per_rank = flow.distributed.run(local_to_global, world_size=4)
for name, (shape, logical, _) in per_rank[0].items():
    print(f"{name:4}: logical shape {shape}, numpy() = {logical.tolist()}")
    print("      to_local() per rank:", [r[name][2].tolist() for r in per_rank])
locals_ = np.array([[10.0 * r, 10.0 * r + 1] for r in range(4)], dtype=np.float32)
assert (per_rank[0]["S(0)"][1] == locals_).all()
assert (per_rank[0]["B"][1] == locals_[:1]).all()
assert (per_rank[0]["P"][1] == locals_.sum(axis=0, keepdims=True)).all()

# %% [markdown]
# The other way in: `flow.tensor(data, placement=, sbp=)`, where `data` is the
# logical tensor, the same on every rank.  Section 4 uses it.
#
# ## 4. Boxing, drawn: the pieces on each rank
#
# `y = x.to_global(placement=..., sbp=...)` of a global `x` keeps the logical
# value and changes the layout, `Layout(placement, sbp_tuple)` in
# `pyflow/distributed/boxing_steps.py`.  As in OneFlow, a **chain of builders**
# (`pyflow/distributed/boxing_chain/`) is asked in order "can you box
# src -> dst?".  The first that can returns a **plan**, a small graph of boxing
# nodes (slice, concat, add, zeros, copy, comm_net, collective...), each on a
# rank; every rank runs its own nodes.  nn.Graph makes the same nodes tasks:

# %%
print(" -> ".join(builder.name for builder in CHAIN.builders))

# %% [markdown]
# `convert` below runs one conversion on 4 ranks.  Each rank returns its piece
# before and after, and rank 0 returns the chain's choice:
# `plan_for(src, dst, shape)`, whose `builder` names the builder that took it.
# `draw` then shows a 4x4 grid per rank: the cells its piece covers, with
# their values (grey: not in the piece).  The logical tensor is 0..15.

# %%
LOGICAL = np.arange(16, dtype=np.float32).reshape(4, 4)


def snapshot(x):
    """This rank's piece of global ``x`` and the logical region it covers (None off the placement)."""
    if not x.placement.has(flow.env.get_rank()):
        return None
    region = Layout(x.placement, x.sbp).region(flow.env.get_rank(), tuple(x.shape))
    return x.to_local().numpy(), region


def short_plan(plan):
    """A plan's nodes, one a line: ``n0 = collective(in0; op=all_gather, ...) -> (4, 4) @ rank 0 cpu:0``."""
    return "\n".join(str(plan).splitlines()[1:])


def convert(src_ranks, src_sbp, dst_ranks, dst_sbp, make=None):
    """Box the 4x4 LOGICAL tensor from one layout to another on 4 ranks; print the chain's choice."""
    def per_rank():
        src = flow.placement("cpu", src_ranks)
        dst = flow.placement("cpu", dst_ranks)
        x = make(src) if make else flow.tensor(LOGICAL, placement=src, sbp=src_sbp)
        y = x.to_global(placement=dst, sbp=dst_sbp)
        assert (y.numpy() == LOGICAL).all()                  # boxing keeps the logical value
        src_layout, dst_layout = Layout(src, (src_sbp,)), Layout(dst, (dst_sbp,))
        plan = plan_for(src_layout, dst_layout, (4, 4))
        return snapshot(x), snapshot(y), src_layout.short(), dst_layout.short(), plan.builder, plan

    results = flow.distributed.run(per_rank, world_size=4)
    _, _, src_text, dst_text, name, plan = results[0]
    print(f"{src_text} -> {dst_text}: builder {name!r}")
    print(short_plan(plan))
    return [r[0] for r in results], [r[1] for r in results], f"{src_text} -> {dst_text} ({name})"


try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
except ImportError:
    Figure = out_dir = None
    print("matplotlib is not installed (pip install 'pyflow[trace]'): the pictures are skipped, "
          "everything else runs")
else:
    out_dir = tempfile.mkdtemp(prefix="pyflow_boxing_")  # a temporary directory, outside the repository


def draw(before, after, title, filename):
    """A row of 4 ranks before, a row after; each panel is the 4x4 logical grid with this rank's cells."""
    if Figure is None:
        return
    fig = Figure(figsize=(9, 5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 4)
    for row, (when, pieces) in enumerate((("before", before), ("after", after))):
        for rank, piece in enumerate(pieces):
            ax = axes[row][rank]
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"rank {rank} {when}", fontsize=9)
            grid = np.full((4, 4), np.nan)
            if piece is None:
                ax.text(1.5, 1.5, "no piece", ha="center", va="center", fontsize=9)
            else:
                values, region = piece
                grid[region] = values
            ax.imshow(grid, cmap="viridis", vmin=0, vmax=15)
            ax.set_facecolor("0.85")
            for (i, j), v in np.ndenumerate(grid):
                if not np.isnan(v):
                    ax.text(j, i, f"{v:g}", ha="center", va="center", fontsize=8,
                            color="white" if v < 8 else "black")
    fig.suptitle(title)
    path = os.path.join(out_dir, filename)
    fig.savefig(path, dpi=80)
    print("  drawn to", path)


ALL = [0, 1, 2, 3]

# %% [markdown]
# **S(0) -> B: all-gather.**  Each rank holds one row; afterwards every rank
# holds all four.

# %%
before, after, title = convert(ALL, S(0), ALL, B)
draw(before, after, title, "1_s0_to_b_all_gather.png")
assert all((piece[0] == LOGICAL).all() for piece in after)

# %% [markdown]
# **P -> B: all-reduce.**  To get a P tensor with interesting pieces, each rank
# makes a local tensor holding every fourth diagonal stripe of 0..15 (zeros
# elsewhere) and calls `to_global(sbp=P)`: the pieces sum to 0..15.  The
# all-reduce sums them on every rank.

# %%
def striped(src):
    rank = flow.env.get_rank()
    i, j = np.indices((4, 4))
    mine = np.where((i + j) % 4 == rank, LOGICAL, 0).astype(np.float32)
    return flow.tensor(mine).to_global(placement=src, sbp=P)


before, after, title = convert(ALL, P, ALL, B, make=striped)
draw(before, after, title, "2_p_to_b_all_reduce.png")
assert (sum(piece[0] for piece in before) == LOGICAL).all()

# %% [markdown]
# **S(0) -> S(1): all-to-all.**  Each rank cuts its row into 4 parts, sends
# part j to rank j, and glues what it receives into a column.

# %%
before, after, title = convert(ALL, S(0), ALL, S(1))
draw(before, after, title, "3_s0_to_s1_all_to_all.png")
assert all((piece[0] == LOGICAL[:, [rank]]).all() for rank, piece in enumerate(after))

# %% [markdown]
# **B -> P: OneFlow's layout, no transfer.**  Any pieces that sum to the value
# would do.  OneFlow (and pyflow) let parallel_id 0 keep the whole value and give
# the others zeros.

# %%
before, after, title = convert(ALL, B, ALL, P)
draw(before, after, title, "4_b_to_p_local.png")
assert (after[0][0] == LOGICAL).all() and all((piece[0] == 0).all() for piece in after[1:])

# %% [markdown]
# **Across placements: S(0) on [0, 1] -> S(1) on [2, 3].**  No collective
# fits, so slice boxing (S2S) takes it: each sender slices out the part of its
# piece that a receiver's piece covers and sends it (comm_net); each receiver
# concatenates what arrives.  Ranks outside a placement hold no piece.

# %%
before, after, title = convert([0, 1], S(0), [2, 3], S(1))
draw(before, after, title, "5_across_placements.png")
assert before[2] is None and after[0] is None

# %% [markdown]
# ## 5. SBP signatures: data- and model-parallel matmuls
#
# An op on global tensors runs piece by piece on every rank.  That is right
# only for some combinations of input and output SBPs, the op's **SBP
# signatures** (seed 004), declared with the op (matmul's `sbp_signatures`
# in `pyflow/ops/linalg.py`).  For `y = x @ w`:
# `(S(0), B) -> S(0)`, `(B, S(1)) -> S(1)`, `(S(1), S(0)) -> P`,
# `(P, B) -> P`, `(B, P) -> P`, `(B, B) -> B`.  The global interpreter
# (OneFlow's EagerGlobalInterpreter) takes the signature that is cheapest for
# the inputs' current SBPs, boxes the inputs to it, and runs the local op.
#
# **Data parallelism:** the batch `x` split by rows, S(0), and the weight `w`
# broadcast.  `(S(0), B) -> S(0)` costs nothing, so no collective runs: the
# trace of the matmul holds none.  Summing over the batch (dim 0) gives each
# rank a partial sum, P, and an all-reduce turns it into B.  Gradients in data
# parallelism take the same path.

# %%
X = np.arange(24, dtype=np.float32).reshape(8, 3) / 8      # a batch of 8 rows: 2 per rank
W = np.arange(12, dtype=np.float32).reshape(3, 4) - 6


def last_op():
    name, signature = global_interpreter().last_signature
    return f"{name}: {signature}"


def data_parallel():
    on4 = flow.placement("cpu", [0, 1, 2, 3])
    x = flow.tensor(X, placement=on4, sbp=S(0))
    w = flow.tensor(W, placement=on4, sbp=B)
    with flow.trace() as tracer:                      # this rank's VM instructions
        y = x @ w
    matmul = last_op()                                # read it before the next collective: the rank
                                                      # threads share one global interpreter
    collectives = sum(r.name == "collective" for r in tracer.records)
    y_value = y.numpy()                               # a collective: every rank waits here
    total = y.sum(dim=0)                              # each rank sums its own rows: a partial sum
    reduction = last_op()
    partial = total.to_local().numpy()
    total_b = total.to_global(sbp=B)                  # P -> B
    chain = plan_for(Layout(on4, (P,)), Layout(on4, (B,)), tuple(total.shape)).builder
    return matmul, collectives, y.sbp, y_value, reduction, total.sbp, partial, chain, total_b.to_local().numpy()


results = flow.distributed.run(data_parallel, world_size=4)
matmul, collectives, y_sbp, y_value, reduction, total_sbp, _, chain, total = results[0]
print(f"{matmul}  -> y.sbp = {y_sbp}, collectives in the matmul's trace: {collectives}")
print(f"{reduction}  -> total.sbp = {total_sbp}")
print("partial sums per rank:", [r[6].tolist() for r in results])
print(f"to B by {chain!r}: every rank holds", total.tolist())
assert all(r[0] == "matmul: (S(0), B) -> S(0)" and r[1] == 0 and r[4] == "reduce_sum: (S(0)) -> P" for r in results)
np.testing.assert_allclose(y_value, X @ W, rtol=1e-6)
np.testing.assert_allclose(sum(r[6] for r in results), (X @ W).sum(axis=0), rtol=1e-6)
for r in results:
    np.testing.assert_allclose(r[8], (X @ W).sum(axis=0), rtol=1e-6)

# %% [markdown]
# **Model parallelism:** every rank sees the whole batch (B) and holds a slice
# of the weight's columns, S(1).  The cheapest signature is now
# `(B, S(1)) -> S(1)`: each rank computes its own output columns.

# %%
def model_parallel():
    on4 = flow.placement("cpu", [0, 1, 2, 3])
    x = flow.tensor(X, placement=on4, sbp=B)
    w = flow.tensor(W, placement=on4, sbp=S(1))      # 4 columns: one per rank
    y = x @ w
    matmul = last_op()
    return matmul, y.sbp, w.to_local().numpy(), y.to_local().numpy(), y.numpy()


results = flow.distributed.run(model_parallel, world_size=4)
print(f"{results[0][0]}  -> y.sbp = {results[0][1]}")
assert all(r[0] == "matmul: (B, S(1)) -> S(1)" for r in results)
for rank, (_, _, w_piece, y_piece, _) in enumerate(results):
    print(f"rank {rank}: w piece {w_piece.shape}, y piece {y_piece.shape}")
    np.testing.assert_allclose(y_piece, (X @ W)[:, [rank]], rtol=1e-6)
np.testing.assert_allclose(results[0][4], X @ W, rtol=1e-6)

# %% [markdown]
# ## 6. On a "cuda" placement
#
# On `flow.placement("cuda", [0, 1])` rank r's piece lives on
# `cuda:<local rank % GPUs>`: its own GPU `cuda:r` when the machine has a GPU
# per rank, a shared one when it has fewer (on a one-GPU machine both pieces
# live on `cuda:0`; the simulator offers 8 GPUs, `PYFLOW_SIM_DEVICES`).  The
# ops run as kernels on each rank's device.  The transport
# moves host arrays, so a collective copies to the host and back, as OneFlow's
# CPU collectives do.  `numpy()` boxes to B on every rank's cpu, which is a
# different device type *and* SBP: the chain's **slice boxing (S2B)** copies
# each GPU piece to its host (d2h), sends it to the other ranks (comm_net) and
# concatenates the pieces on every host.

# %%
def on_gpus():
    gpus = flow.placement("cuda", [0, 1])
    x = flow.tensor(LOGICAL - 6, placement=gpus, sbp=S(0))
    y = flow.relu(x)
    signature = last_op()
    src, dst = Layout(gpus, (S(0),)), Layout(flow.placement("cpu", [0, 1]), (B,))
    plan = plan_for(src, dst, (4, 4))
    return (str(y.to_local().device), flow.env.get_local_rank(), signature, plan.builder, plan,
            y.numpy())


gpus = device_count("cuda")
print(f"cuda devices on this machine: {gpus}")
for rank, (device, local_rank, signature, name, plan, value) in enumerate(
        flow.distributed.run(on_gpus, world_size=2)):
    print(f"rank {rank}: piece on {device} (local rank {local_rank} % {gpus} cuda device(s)), {signature}")
    assert device == f"cuda:{local_rank % gpus}" and signature == "relu: (S(0)) -> S(0)"
    np.testing.assert_allclose(value, np.maximum(LOGICAL - 6, 0))
print(f"numpy(): builder {name!r}, plan:\n{short_plan(plan)}")

# %% [markdown]
# ## 7. Divergent code: an error, not a hang
#
# Every collective is checked across its ranks.  With MPI or NCCL, a rank that
# skips a collective leaves the others waiting forever.  pyflow's transport
# sees that a rank returned (or waits somewhere else) and raises on the waiting
# ranks; a watchdog (`PYFLOW_COLLECTIVE_TIMEOUT`) reports any other wait that
# lasts too long.  `run` then raises `RankError`; its `__cause__` is the
# `CollectiveMismatchError` listing each rank's state and Python line.

# %%
def rank_2_skips():
    on4 = flow.placement("cpu", [0, 1, 2, 3])
    x = flow.ones(1, 2)
    if flow.env.get_rank() != 2:                      # a bug: rank 2 never makes x global
        x = x.to_global(placement=on4, sbp=S(0))
    return tuple(x.shape)


try:
    flow.distributed.run(rank_2_skips, world_size=4)
except flow.errors.RankError as error:
    print(f"RankError (cause: {type(error.__cause__).__name__}):")
    print(error)
    assert isinstance(error.__cause__, flow.errors.CollectiveMismatchError)
    assert "rank 2 returned from its function" in str(error)
else:
    raise AssertionError("the divergent ranks were not reported")

# %% [markdown]
# Where to read more: `pyflow/distributed/boxing_chain/` has the chain table,
# each op's definition in `pyflow/ops/` its signatures (`sbp_signatures`),
# `pyflow/distributed/signatures.py` the cost model, and the project's design
# notes (SEMANTICS §4 and §4a) the rules, checked against OneFlow.  Seed 004
# describes the same three ideas for the lazy compiler: SBP signatures, boxing
# between them, and the builder chain.

# %%
print("pictures in", out_dir or "(none: matplotlib is missing)")
