# ---
# jupyter:
#   jupytext:
#     text_representation:
#       format_name: percent
# ---

# %% [markdown]
# # Tutorial 1: blocks that talk to each other, with and without a GPU
#
# Cocktailer (seed 001) runs a whole program as one persistent kernel and
# separates its steps with *grid barriers*: `cuda.cg.this_grid().sync()` waits
# until every thread of every block has arrived.  That only works if all blocks
# run at the same time, which is a *cooperative* launch.
#
# pyflow's tests run without a GPU, in Numba's CUDA simulator.  This tutorial
# shows why pyflow needed its own simulator launch, and what it reports when a
# kernel is wrong.
#
# Run it as a script (`python tutorials/01_grid_sync_in_the_simulator.py`) or
# open it as a notebook with jupytext.

# %%
import os

os.environ["PYFLOW_CUDA"] = "sim"  # this tutorial is about the simulator, even on a GPU machine

import numpy as np

from pyflow.errors import DeadlockError, GridSyncExitError
from pyflow.kernels import jit, sim
from pyflow.kernels.backend import cuda, describe
from pyflow.kernels.examples import two_phase_sum

print(describe())

# %% [markdown]
# ## 1. A two-phase reduction
#
# `two_phase_sum` (in `kernels/examples.py`) has each block add up its share of
# `x` into `partial[block]`.  Then it waits at a grid barrier, and block 0 adds
# the partial sums.  Block 0 can only do that after *every* block has written
# its share.

# %%
blocks, threads = 4, 32
x = np.arange(blocks * threads, dtype=np.float64)
total = np.zeros(1)
two_phase_sum[blocks, threads](x, np.zeros(blocks), total)
print("pyflow simulator:", total[0], " numpy:", x.sum())
assert total[0] == x.sum()

# %% [markdown]
# ## 2. The stock simulator gets it wrong
#
# Numba's own simulator runs block 0 to the end before block 1 starts.  Its
# "grid" barrier only waits for block 0's threads.  So block 0 adds partial sums
# that the other blocks have not written yet, and silently returns a wrong total.

# %%
stock_kernel = cuda.jit(two_phase_sum.py_func)  # the same Python function, stock launch
stock_total = np.zeros(1)
stock_kernel[blocks, threads](x, np.zeros(blocks), stock_total)
print("stock simulator:", stock_total[0], " (only block 0's share:", x[:threads].sum(), ")")
assert stock_total[0] != x.sum()

# %% [markdown]
# ## 3. How many blocks may a cooperative grid have?
#
# Every block must be resident at once, so the grid can be no larger than the
# GPU's occupancy limit.  pyflow asks the same question on both backends, with
# the hardware API's signature.  The simulated GPU is small (2 SMs by default)
# and configurable:

# %%
print("co-resident blocks of 32 threads:", two_phase_sum.overloads[None].max_cooperative_grid_blocks(32, 0))
with sim.configure(multiprocessor_count=4):
    print("with 4 simulated SMs:", two_phase_sum.max_cooperative_grid_blocks(32))

# %% [markdown]
# ## 4. Mistakes are reported, not hung on
#
# On a GPU, a thread that returns early before a grid barrier makes the kernel
# hang forever.  In pyflow's simulator it is an error that names the thread:


# %%
@jit
def early_return(out):
    if cuda.blockIdx.x == 1 and cuda.threadIdx.x == 0:
        return  # this thread will never reach the barrier
    cuda.cg.this_grid().sync()
    out[0] = 1.0


try:
    early_return[3, 4](np.zeros(1))
except GridSyncExitError as error:
    print("GridSyncExitError:", error)

# %% [markdown]
# Threads waiting at barriers that can never open are a deadlock.  The error
# lists who waits where:


# %%
@jit
def mixed_barriers(out):
    if cuda.threadIdx.x == 0:
        cuda.cg.this_grid().sync()
    else:
        cuda.syncthreads()


try:
    mixed_barriers[2, 4](np.zeros(1))
except DeadlockError as error:
    print(error)

# %% [markdown]
# ## 5. Stepping into one thread
#
# Simulated kernels are plain Python, so pdb works.  Guard a `breakpoint()`
# with the thread you care about:
#
# ```python
# if cuda.blockIdx.x == 1 and cuda.threadIdx.x == 0:
#     breakpoint()
# ```
#
# The other threads wait at their next barrier.  The simulator's hang watchdog
# sees the debugger and does not fire while you step.

# %% [markdown]
# ## 6. Two tiers: threads to debug, compiled to run
#
# Every CUDA thread a Python thread is what makes pdb, the shuffled thread
# orders and the wait tables above possible, and it costs about 200 us per
# simulated thread.  So the simulator has a second tier for the launches that
# are big enough to be worth a compile: the kernel's own source, split at its
# barriers into loops over the block's threads and compiled by numba (README,
# "The simulator's two tiers").  `explain` says which tiers a kernel can use:

# %%
from pyflow.kernels.examples import prefix_sum

print(sim.explain(prefix_sum))

# %% [markdown]
# The same softmax kernel on both tiers (`PYFLOW_SIM_TIER`, or `sim.configure`,
# picks one; the default, `auto`, compiles big launches).  The threaded tier
# gets a few rows, the compiled one a whole 1024 x 1024 matrix:

# %%
import time

import pyflow as flow

data = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
for tier, rows in (("threads", 4), ("compiled", 1024)):
    x = flow.tensor(data[:rows], device="cuda")
    with sim.configure(tier=tier):
        x.softmax(-1).numpy()  # the compiled tier compiles on the first call (and caches on disk)
        start = time.perf_counter()
        y = x.softmax(-1).numpy()
        seconds = time.perf_counter() - start
    print(f"{tier:>8} tier: {rows:4d} rows of 1024 in {seconds * 1e3:8.1f} ms, "
          f"{seconds / y.size * 1e9:10.1f} ns per element")
np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-5)
