"""The compiled tier runs a launch's blocks on several cores when they never meet.

Properties: blocks that meet (an atomic, a fence, a grid barrier) always run one after
another; independent ones are split into ranges, one per core (``cores``), with the same
values as one core; and a failure names the block a run on one core would have named
(the lowest failing block), whatever the timing, with the error the threaded tier gives.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyflow.errors import DivergentBarrierError, KernelError
from pyflow.kernels.backend import cuda, is_simulator
from pyflow.kernels.jit import jit

pytestmark = pytest.mark.skipif(not is_simulator(), reason="the simulator's tiers exist only without a GPU")

if is_simulator():
    from pyflow.kernels import sim
    from pyflow.kernels.sim.compiled import block_ranges
    from pyflow.kernels.sim.tiers import _compiled

N = 1 << 17   # enough work for two ranges (compiled._MIN_PART_WORK each)


@jit
def block_sums(x, out):
    """out[b] = sum of block b's slice of x, through a shared-memory tree (barriers in a loop)."""
    s = cuda.shared.array(32, np.float64)
    t, b, n = cuda.threadIdx.x, cuda.blockIdx.x, cuda.blockDim.x
    per = x.shape[0] // cuda.gridDim.x
    acc = 0.0
    for i in range(b * per + t, (b + 1) * per, n):
        acc += x[i]
    s[t] = acc
    cuda.syncthreads()
    half = n // 2
    while half > 0:
        if t < half:
            s[t] += s[t + half]
        cuda.syncthreads()
        half //= 2
    if t == 0:
        out[b] = s[0]


@jit
def count_with_an_atomic(x, total):
    i = cuda.grid(1)
    while i < x.shape[0]:
        cuda.atomic.add(total, 0, x[i])
        i += cuda.gridsize(1)


@jit
def write_then_fence(x, flag):
    i = cuda.grid(1)
    while i < x.shape[0]:
        x[i] = 1.0
        i += cuda.gridsize(1)
    cuda.threadfence()
    flag[cuda.blockIdx.x] = 1


@jit
def fail_in_blocks(x, bad):
    """Reads past the end in every block listed in ``bad`` (thread 3 of it)."""
    b = cuda.blockIdx.x
    i = cuda.grid(1)
    while i < x.shape[0]:
        x[i] += 1.0
        i += cuda.gridsize(1)
    for k in range(bad.shape[0]):
        if bad[k] == b and cuda.threadIdx.x == 3:
            x[x.shape[0] + b] = 0.0


@jit
def diverge_in_block(x, which):
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    while i < x.shape[0]:
        x[i] = 2.0
        i += cuda.gridsize(1)
    if cuda.blockIdx.x == which and t < 2:   # two barriers: a block's threads must all reach the same one
        cuda.syncthreads()
    else:
        cuda.syncthreads()


def _launch(kernel, grid, block, *args, cores):
    with sim.configure(tier="compiled", cores=cores):
        kernel[grid, block](*args)
    return _compiled(kernel).last_ranges


def test_block_ranges_cover_the_grid_once_in_order():
    for blocks in (1, 2, 3, 7, 64):
        for cores in (1, 2, 3, 16):
            ranges = block_ranges(blocks, 1 << 24, True, cores)
            assert [b for lo, hi in ranges for b in range(lo, hi)] == list(range(blocks))
            assert len(ranges) == min(blocks, cores)
    assert block_ranges(64, 100, True, 4) == [(0, 64)]   # too little work to pay for a second core


@settings(max_examples=6, deadline=None)
@given(blocks=st.sampled_from([2, 3, 8]), cores=st.sampled_from([2, 3]), seed=st.integers(0, 2**16))
def test_independent_blocks_on_several_cores_give_the_one_core_values(blocks, cores, seed):
    x = np.random.default_rng(seed).standard_normal(N * blocks)
    one, many = np.zeros(blocks), np.zeros(blocks)
    assert _launch(block_sums, blocks, 32, x, one, cores=1) == 1
    assert _launch(block_sums, blocks, 32, x, many, cores=cores) == min(blocks, cores)
    np.testing.assert_array_equal(many, one)   # each block's arithmetic is the same, in the same order
    np.testing.assert_allclose(one, x.reshape(blocks, -1).sum(axis=1))


def test_blocks_that_meet_through_an_atomic_or_a_fence_run_one_after_another():
    x = np.ones(N * 4)
    total = np.zeros(1)
    assert _launch(count_with_an_atomic, 8, 64, x, total, cores=4) == 1
    assert total[0] == x.size   # a plain read-modify-write per thread: right only when nothing overlaps
    flag = np.zeros(8, np.int64)
    assert _launch(write_then_fence, 8, 64, x, flag, cores=4) == 1
    assert flag.tolist() == [1] * 8


@pytest.mark.parametrize("cores", [1, 2, 4])
def test_a_failure_names_the_lowest_failing_block_as_one_core_would(cores):
    """Blocks 6 and 1 fail; one core meets block 1 first, and so must every split into ranges
    (block 6's range may well fail first in time)."""
    x = np.zeros(N * 2)
    with pytest.raises(KernelError, match=r"IndexError") as failed:
        _launch(fail_in_blocks, 8, 32, x, np.array([6, 1]), cores=cores)
    assert tuple(failed.value.block_idx) == (1, 0, 0)
    assert tuple(failed.value.thread_idx) == (3, 0, 0)


@pytest.mark.parametrize("cores", [1, 2])
def test_a_divergent_barrier_in_a_later_range_is_reported_with_its_block(cores):
    x = np.zeros(N * 2)
    with pytest.raises(DivergentBarrierError, match=r"block \(5, 0, 0\)"):
        _launch(diverge_in_block, 8, 32, x, 5, cores=cores)
