# ---
# jupyter:
#   jupytext:
#     text_representation:
#       format_name: percent
# ---

# %% [markdown]
# # Tutorial 4: a loop, a branch and a recursion in ONE kernel (Cocktailer)
#
# A framework like PyTorch runs a model's Python control flow on the host: a loop
# of 64 RNN steps is 64 x (a few) kernel launches, and every `while` condition or
# `if` on a device value is a device-to-host copy that waits for the GPU.
# Cocktailer (seed 001) moves the control flow onto the GPU:
# 1. every operator is split into **uTasks**, independent pieces one thread block
#    computes (a tile of a matmul, a chunk of an elementwise op);
# 2. the control flow is **replicated in every block**: each block runs the same
#    loop, and takes its share of each operator's uTasks;
# 3. a **grid barrier** (`cuda.cg.this_grid().sync()`) separates operators where
#    a block needs what another block wrote.
#
# The whole program becomes one persistent kernel.  This tutorial traces an RNN,
# runs it both ways, reads the generated kernel, steps through one block of it in
# the simulator, and then does the same for a recursion (a recursive autoencoder
# over a tree), whose call stack lives in shared memory, unrolls that recursion
# onto (nested) groups of blocks, and puts a loop inside a recursive function.

# %%
import os

os.environ.setdefault("PYFLOW_CUDA", "sim")

import sys
import threading

import numpy as np

import pyflow as flow
import pyflow.cocktailer as ck
import pyflow.nn.functional as F
from pyflow.errors import CooperativeLaunchTooLargeError, StackOverflowError

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. An RNN loop, traced
#
# `ck.trace` calls the function with *symbolic* tensors (`flow.Tensor`s that hold
# no values).  The program is written with ordinary flow ops: inside the trace each
# one runs the op's own shape inference at once, then its *uTask lowering* (set on
# the op's `OpDef`, `pyflow/cocktailer/lowerings.py`) appends a uOperator.
# `F.linear(h, w, b)` is `h @ w.T + b`, three ops, lowered to ONE linear uOperator
# (the bias added as each tile is stored).  `ck.for_loop` traces its body once.  `xs[t]`
# is a row view whose offset depends on the loop counter `t`, a value that exists
# only on the device.  `chunk` (elements per elementwise uTask) and `tile` (the
# side of a matmul tile) set the granularity; small values keep the simulator fast.

# %%
batch, hidden, steps = 2, 8, 4


def rnn(h0, xs, w, b):
    def step(t, h):
        return flow.tanh(F.linear(h, w, b) + xs[t])

    return ck.for_loop(xs.shape[0], step, h0)


h0 = rng.standard_normal((batch, hidden)).astype(np.float32)
xs = rng.standard_normal((steps, batch, hidden)).astype(np.float32)
w = (rng.standard_normal((hidden, hidden)) * 0.3).astype(np.float32)
b = rng.standard_normal(hidden).astype(np.float32)

program = ck.trace(rnn, h0, xs, w, b, chunk=4, tile=4)
print(program)

# %% [markdown]
# The listing shows the paper's memory management: `h0` is copied into a state
# buffer before the loop (inputs are never written), each step's result is copied
# back into it, and every intermediate has a fixed place in one arena.
#
# ## 2. Host executor vs compiled executor
#
# The host executor is the PyTorch-style baseline: one launch per uOperator.
# The compiled executor runs the whole program as one kernel.  Both call the same
# uTask device functions with the same block size, so the results are *bitwise*
# equal, and they match numpy.

# %%
host = ck.compile(program, mode="host", threads=4)
compiled = ck.compile(program, mode="compiled", threads=4, blocks=3)
out_host, out_compiled = host(h0, xs, w, b), compiled(h0, xs, w, b)

reference = h0
for t in range(steps):
    reference = np.tanh(reference @ w.T + b + xs[t])

assert np.array_equal(out_host, out_compiled)
np.testing.assert_allclose(out_compiled, reference, rtol=1e-5, atol=1e-6)
print("host:    ", host.last_stats)
print("compiled:", compiled.last_stats)

# %% [markdown]
# One launch instead of 18, and no host syncs.  The cost moved into grid barriers:
# two per step.  Not three or four: the generator puts a barrier only where a
# block reads (or overwrites) what *another* block wrote.  `add`, `tanh` and the
# copy back into the state all work on the same chunks with the same threads, so
# nothing crosses a block between them.  Here is the kernel:

# %%
print(compiled.source)

# %% [markdown]
# Read it top to bottom: the copy of `h0`, then `for i0 in range(4)` run by every
# block, and in it each operator as a *virtual-block loop*
# `for u in range(block, count, blocks)`: uTask `u` runs on block `u % blocks`,
# which is how 4 uTasks share 3 blocks.  The grid size came from the simulated
# GPU's co-resident limit (`max_cooperative_grid_blocks`); asking for more blocks
# than fit is an error, never a hang:

# %%
try:
    ck.compile(program, mode="compiled", threads=4, blocks=1000)(h0, xs, w, b)
except CooperativeLaunchTooLargeError as error:
    print(type(error).__name__, ":", str(error)[:150], "...")

# %% [markdown]
# ### Should it be one kernel?  The schedule decision
#
# One kernel is not always best: its grid is capped at the co-resident limit, and
# every grid barrier costs about as much as a small kernel.  `mode="auto"` runs
# Cocktailer's Algorithm 1: bottom-up over the program, a loop or branch moves
# into a uProgram (one kernel) when its body is already on the device and the
# profiler says it pays.  On a GPU the profiler can time the candidates; in the
# simulator it uses a documented cost model (launches, host syncs, barriers, work
# per block).  It also tries the optimizations (inline, loop unroll, branch
# reclustering) and keeps those that lower the estimate.  The decision prints
# with its reasons:

# %%
auto = ck.compile(program, mode="auto", threads=4)
print(auto.schedule)
assert np.array_equal(auto(h0, xs, w, b), out_host)

# %% [markdown]
# ## 3. Stepping into one block's loop
#
# In the simulator every CUDA thread is a Python thread running the generated
# source, which is registered with `linecache`: a `breakpoint()` inside it, or
# `pdb`, shows and steps through these lines (the simulator's hang watchdog stays
# quiet while a debugger is attached).  A script cannot type into pdb, so here we
# do what pdb's `step` does, with `sys.settrace`: record the lines that thread 0
# of block 1 executes in the first iteration of the loop.

# %%
kernel_file = compiled.kernels[0].kernel.py_func.__code__.co_filename
source_lines = compiled.source.splitlines()
seen = []


def tracer(frame, event, arg):
    if frame.f_code.co_filename != kernel_file:
        return None

    def local(frame, event, arg):
        cuda = frame.f_globals["cuda"]   # the simulator's per-launch cuda module
        if (event == "line" and frame.f_locals.get("block") == 1 and cuda.threadIdx.x == 0
                and frame.f_locals.get("i0", 0) == 0):
            seen.append(frame.f_lineno)
        return local

    return local


threading.settrace(tracer)
try:
    compiled(h0, xs, w, b)
finally:
    threading.settrace(None)

for lineno in dict.fromkeys(seen):   # each line once, in the order first reached
    print(f"{lineno:3d}  {source_lines[lineno - 1]}")

# %% [markdown]
# Block 1 ran uTask `u = 1` of every operator (4 uTasks over 3 blocks: block 0
# also runs `u = 3`), and waited at the grid barriers with everyone else.
#
# ## 4. Recursion: a recursive autoencoder over a tree
#
# `@ck.function(returns=...)` declares a function that may call itself.  Its
# arguments are device ints (a node id).  RAE: a leaf returns its input vector,
# an inner node `tanh(W @ cat(rae(left), rae(right)) + b)`.

# %%
dim = 4
# a tree of 4 leaves, (1, (3, (5, 6))) by node id, as index tables
left = np.array([1, 0, 3, 0, 5, 0, 0], np.int64)
right = np.array([2, 0, 4, 0, 6, 0, 0], np.int64)
is_leaf = np.array([0, 1, 0, 1, 0, 1, 1], np.int64)
inp = rng.standard_normal((7, dim)).astype(np.float32)
W = (rng.standard_normal((dim, 2 * dim)) * 0.5).astype(np.float32)
bias = rng.standard_normal(dim).astype(np.float32)


def rae_program(left, right, is_leaf, inp, w, b):
    @ck.function(returns=ck.spec(dim))
    def rae(node):
        def inner():
            children = flow.cat([rae(left[node].item()), rae(right[node].item())])
            return flow.tanh(F.linear(children, w, b))

        return ck.cond(is_leaf[node].item(), lambda: inp[node].clone(), inner)

    return rae(0)


tree = ck.trace(rae_program, left, right, is_leaf, inp, W, bias, chunk=4, tile=4)


def rae_numpy(node):
    if is_leaf[node]:
        return inp[node]
    return np.tanh(W @ np.concatenate([rae_numpy(left[node]), rae_numpy(right[node])]) + bias)


tree_host = ck.compile(tree, mode="host", threads=4)
tree_compiled = ck.compile(tree, mode="compiled", threads=4, blocks=2)
got = tree_compiled(left, right, is_leaf, inp, W, bias)
assert np.array_equal(got, tree_host(left, right, is_leaf, inp, W, bias))
np.testing.assert_allclose(got, rae_numpy(0), rtol=1e-5, atol=1e-6)
print("host:    ", tree_host.last_stats, " <- one host sync per is_leaf / child id read")
print("compiled:", tree_compiled.last_stats)

# %% [markdown]
# The two calls `rae(left)` and `rae(right)` got adjacent result slots in the
# caller's frame, so `cat` joined them without a copy.  numba has no `goto`, so
# the generated kernel turns the function into a state machine: the body is cut at
# each call into labelled segments, and a `while top > 0` loop dispatches on the
# label of the frame on top of a stack in shared memory.  A call writes the
# resume label into the caller's frame and pushes `[label 0, result offset, node]`:

# %%
text = tree_compiled.source
start = text.index("# recursion")
print(text[start:start + 1500], "\n...")

# %% [markdown]
# The stack has `stack_depth` frames (64 by default; the artifact fixes 32).
# A deeper recursion stops every block together and raises, on both executors:

# %%
try:
    ck.compile(tree, mode="compiled", threads=4, blocks=2, stack_depth=2)(left, right, is_leaf, inp, W, bias)
except StackOverflowError as error:
    print(type(error).__name__, ":", error)

# %% [markdown]
# ## 5. Recursion unroll: both subtrees at once
#
# Every block above walks the whole tree, one node after another.  But
# `rae(left)` and `rae(right)` share nothing they write, so they could run at the
# same time (Fig. 8 of the paper).  `unroll_recursion` inlines the root's body
# once and turns the two calls into a `CallGroup`; each calls its own copy of the
# function, with its own stack:

# %%
from pyflow.cocktailer.optimize_recursion import unroll_recursion  # noqa: E402

unrolled = unroll_recursion(tree).program
print(unrolled.listing().split("body:")[1])

# %% [markdown]
# The kernel splits the grid into two groups of blocks.  Inside a group,
# operators spread over the group's blocks and the barriers are
# `group_barrier(status, gslot1, gblocks1)`, a barrier of just those blocks
# (`kernels/utask/groups.py`: two atomic counters); a grid barrier joins the
# groups.  Block 0 now walks only the left subtree, so it waits at fewer barriers:

# %%
fast_tree = ck.compile(unrolled, mode="compiled", threads=4, blocks=2)
assert np.array_equal(fast_tree(left, right, is_leaf, inp, W, bias), got)
print("unrolled:", fast_tree.last_stats, " (barriers: block 0's)")
text = fast_tree.source
start = text.index("# recursion unroll")
print(text[start:start + 700], "\n...")

# %% [markdown]
# Unrolled deeper (`unroll_recursion(tree, 2)`), a lane is not a call any more but
# the call's body inlined again, whose own two calls split *its* group of blocks
# (`gblock2` of `gblocks2`), joined by that group's barrier: nested block groups.
# Both lanes hold that code; on this lopsided tree only the right one has
# children to split when it runs (block 0, in the left lane, walks a leaf):

# %%
deeper = ck.compile(unroll_recursion(tree, 2).program, mode="compiled", threads=4, blocks=4)
assert np.array_equal(deeper(left, right, is_leaf, inp, W, bias), got)
print("two levels:", deeper.last_stats)
print([line.strip() for line in deeper.source.splitlines() if line.strip().startswith("groups")])

# %% [markdown]
# ## 6. Loops inside a recursive function
#
# A recursive function may hold loops, even loops that call it (the artifact
# compiles neither).  Here a node of a tree of any arity sums its children with a
# `for_loop` over its child count, read on the device.  A call inside the loop
# needs a resume point inside an iteration, so the loop becomes segments of the
# state machine too, its counter and trip count kept in the frame:

# %%
nkids = np.array([3, 0, 2, 0, 0, 0], np.int64)      # 0 -> 1, 2, 3; 2 -> 4, 5
kids = np.array([1, 2, 3, 0, 0, 0, 4, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], np.int64)
values = rng.standard_normal((6, dim)).astype(np.float32)


def sum_tree(kids, nkids, values):
    @ck.function(returns=ck.spec(dim))
    def total(node):
        def inner():
            return ck.for_loop(nkids[node].item(),
                               lambda i, acc: acc + total(kids[node * 3 + i].item()), flow.zeros(dim))

        return ck.cond(nkids[node].item().eq(0), lambda: values[node].clone(), inner)

    return total(0)


looped = ck.trace(sum_tree, kids, nkids, values, chunk=4, tile=4)
summed = ck.compile(looped, mode="compiled", threads=4, blocks=2)
np.testing.assert_allclose(summed(kids, nkids, values), values[[1, 3, 4, 5]].sum(axis=0), rtol=1e-6)
print("a loop holding the call:", summed.last_stats)

print("tutorial 4 done", file=sys.stderr)
