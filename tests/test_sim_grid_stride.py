"""The compiled tier's collapsed grid-stride loops and constant-shape shared memory (kernels/sim/blockwise.py).

A kernel that is one grid-stride loop whose turns share nothing runs, on a 1-D launch, element
after element (``cu_stride_K``) instead of thread after thread: the same values as the threaded
tier, bit for bit; a loop whose turns carry a thread's state, or a 2-D launch, keeps the thread
loop; an index out of range still names the thread whose turn the element was.  Shared memory is
seen with its declared shape as constants (``cpu_runtime.fixed_shape``), its indexes still checked.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyflow.errors import KernelError
from pyflow.kernels.backend import cuda, is_simulator
from pyflow.kernels.jit import jit

pytestmark = pytest.mark.skipif(not is_simulator(), reason="the simulator's tiers exist only without a GPU")

if is_simulator():
    from pyflow.kernels import sim
    from pyflow.kernels.sim import tiers


@jit
def scale_and_shift(out, x, a, n):
    """out[i] = x[i] * a + 1, a grid-stride loop: the turns share nothing."""
    b = a * 0.5
    i = cuda.grid(1)
    while i < n:
        y = x[i] * a
        out[i] = y + b + 1.0
        i += cuda.gridsize(1)


@jit
def running_total(out, x, n):
    """out[i] = the sum of this thread's elements so far: a turn reads what the thread's last one left."""
    total = 0.0
    i = cuda.grid(1)
    while i < n:
        total += x[i]
        out[i] = total
        i += cuda.gridsize(1)


@jit
def write_one_past(out, x, n):
    i = cuda.grid(1)
    while i < n:
        out[i + 1] = x[i]
        i += cuda.gridsize(1)


@jit
def shared_past_its_end(out):
    s = cuda.shared.array(8, np.float64)
    t = cuda.threadIdx.x
    s[t] = t
    cuda.syncthreads()
    out[t] = s[t]


def run(tier: str, kernel, config, *args):
    with sim.configure(tier=tier, cores=1):
        kernel[config](*args)
    return kernel.last_tier


def module_text(kernel) -> str:
    return open(sim.explain(kernel).split("compiled (")[1].split(")")[0]).read()


@settings(max_examples=15, deadline=None)
@given(n=st.integers(0, 300), blocks=st.integers(1, 5), threads=st.sampled_from([1, 3, 32]),
       seed=st.integers(0, 2**16))
def test_a_collapsed_grid_stride_loop_gives_the_threaded_tiers_values(n, blocks, threads, seed):
    x = np.random.default_rng(seed).standard_normal(n)
    results = []
    for tier in ("threads", "compiled"):
        out = np.full(n, -7.0)
        assert run(tier, scale_and_shift, (blocks, threads), out, x, 1.5, n) == tier
        results.append(out)
    np.testing.assert_array_equal(results[1], results[0])
    assert "def cu_stride_0(" in module_text(scale_and_shift)


@pytest.mark.parametrize("config", [(2, 4), ((2, 1), (2, 3))])
def test_a_thread_state_carried_across_turns_or_a_2d_launch_keeps_the_thread_loop(config):
    """``running_total`` is never collapsed; ``scale_and_shift`` on a 2-D block runs thread by thread
    (threads of one ``ty`` share ``cuda.grid(1)``'s values), with the threaded tier's values."""
    x = np.arange(1.0, 20.0)
    for kernel, args in ((running_total, (x,)), (scale_and_shift, (x, 2.0))):
        results = []
        for tier in ("threads", "compiled"):
            out = np.zeros(19)
            run(tier, kernel, config, out, *args, 19)
            results.append(out)
        np.testing.assert_array_equal(results[1], results[0])
    assert "cu_stride" not in module_text(running_total)


def test_an_index_out_of_range_in_a_collapsed_loop_names_the_thread_whose_turn_it_was():
    """The last element, 10, writes past ``out``: on a grid of 2 x 4 threads it is thread 2's turn
    (10 mod 8) in block 0; the compiled tier's own error (the cause of the threaded re-run's) says so."""
    with pytest.raises(KernelError) as caught:
        run("compiled", write_one_past, (2, 4), np.zeros(11), np.zeros(11), 11)
    compiled = caught.value.__cause__
    assert "compiled tier" in str(compiled) and "IndexError" in str(compiled)
    assert compiled.block_idx == (0, 0, 0) and compiled.thread_idx == (2, 0, 0)
    assert "def cu_stride_0(" in module_text(write_one_past)


def test_shared_memory_has_its_declared_shape_and_checked_indexes():
    out = np.zeros(8)
    run("compiled", shared_past_its_end, (1, 8), out)
    np.testing.assert_array_equal(out, np.arange(8.0))
    assert "cu_rt.fixed_shape(cu_sh0[cu_sb], (8,))" in module_text(shared_past_its_end)
    with pytest.raises(KernelError) as caught:
        run("compiled", shared_past_its_end, (1, 9), np.zeros(9))
    assert "IndexError" in str(caught.value.__cause__) and caught.value.__cause__.thread_idx == (8, 0, 0)
    assert tiers._compiled(shared_past_its_end)._prepared[(numba.typeof(np.zeros(9)),)].independent


@jit
def strided_add(out, o_strides, a, a_strides, b, b_strides, n):
    """out[i * s] = a[i * s] + b[i * s], each operand with its own stride (a tuple, as the library passes it)."""
    i = cuda.grid(1)
    while i < n:
        out[i * o_strides[0]] = a[i * a_strides[0]] + b[i * b_strides[0]]
        i += cuda.gridsize(1)


@settings(max_examples=20, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3), st.integers(0, 3)), min_size=1, max_size=4),
       n=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_strides_of_0s_and_1s_are_constants_of_their_own_module_and_other_strides_are_not(steps, n, seed):
    """A launch whose stride tuples hold only 0s and 1s runs a module that holds them as constants
    (``compiled.constant_tuples``, which lets LLVM vectorize); the same kernel launched after it with other
    strides, of the same numba types, must not run that module: every launch gives numpy's values."""
    rng = np.random.default_rng(seed)
    for a_step, o_step, b_step in steps:
        a, b = rng.standard_normal(n * a_step + 1), rng.standard_normal(n * b_step + 1)
        out = np.full(n * o_step + 1, -7.0)
        run("compiled", strided_add, (2, 8), out, (o_step,), a, (a_step,), b, (b_step,), n)
        expected = np.full_like(out, -7.0)
        idx = np.arange(n)
        expected[idx * o_step] = a[idx * a_step] + b[idx * b_step]
        np.testing.assert_array_equal(out, expected)
    if any(step == (1, 1, 1) for step in steps):
        prepared = tiers._compiled(strided_add)._prepared
        fixed = [p for key, p in prepared.items() if "constants" in key and not isinstance(p, Exception)]
        assert any("cu_const_o_strides = (1,)" in open(p.source_path).read() for p in fixed)
