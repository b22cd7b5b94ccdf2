"""The simulator's two tiers: threads (every CUDA thread a Python thread) and compiled (njit loops).

Properties: the compiled tier gives the threaded tier's values (the library's kernels, Cocktailer's
programs); a barrier it splits the code at is a real one (drop it and the answer goes wrong); it
raises the threaded tier's errors (divergent barrier, grid barrier after an exit, an index out of
range naming block, thread and line, a hang); it stops on Ctrl-C; and the tier is chosen as
``tiers.py`` says (``auto``, ``threads``, ``compiled``, ``breakpoint()`` and ``debug`` run threaded).
"""

from __future__ import annotations

import _thread
import re
import subprocess
import sys
import threading

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyflow.errors import DeadlockError, DivergentBarrierError, GridSyncExitError, KernelError, KernelHangError
from pyflow.kernels.backend import cuda, is_simulator
from pyflow.kernels.jit import jit

pytestmark = [pytest.mark.skipif(not is_simulator(), reason="the simulator's tiers exist only without a GPU"),
              pytest.mark.hot_launches]   # the tier rule as users get it (conftest.py)

if is_simulator():
    import importlib

    from pyflow.kernels import sim
    from pyflow.kernels.sim import tiers

    sim_settings = importlib.import_module("pyflow.kernels.sim.settings")   # the package exports settings()

TIERS = ("threads", "compiled")


@jit
def rotate_through_shared(x, out):
    """out[t] = 2 * x[t + 1]: each thread reads what its neighbour wrote, after the barrier."""
    s = cuda.shared.array(64, np.float64)
    t = cuda.threadIdx.x
    s[t] = x[t] * 2
    cuda.syncthreads()
    out[t] = s[(t + 1) % cuda.blockDim.x]


@jit
def rotate_without_barrier(x, out):
    s = cuda.shared.array(64, np.float64)
    t = cuda.threadIdx.x
    s[t] = x[t] * 2
    out[t] = s[(t + 1) % cuda.blockDim.x]


@jit
def tree_sum_in_a_loop(x, out, rounds):
    """Per round, a shared-memory tree sum whose loop holds barriers; the block's total per round."""
    s = cuda.shared.array(64, np.float64)
    t = cuda.threadIdx.x
    for r in range(rounds):
        s[t] = x[r * cuda.blockDim.x + t] if t < cuda.blockDim.x else 0.0
        cuda.syncthreads()
        half = cuda.blockDim.x // 2
        while half > 0:
            if t < half:
                s[t] += s[t + half]
            cuda.syncthreads()
            half //= 2
        if t == 0:
            out[cuda.blockIdx.x * rounds + r] = s[0]
        cuda.syncthreads()


@jit
def barriers_in_both_branches(x):
    t = cuda.threadIdx.x
    if t < 2:
        cuda.syncthreads()
    else:
        cuda.syncthreads()
    x[t] = t


@jit
def some_threads_leave_before_the_barrier(x, out):
    s = cuda.shared.array(64, np.float64)
    t = cuda.threadIdx.x
    if t >= x.shape[0]:
        return
    s[t] = x[t]
    cuda.syncthreads()
    out[t] = s[x.shape[0] - 1 - t]


@jit
def sync_after_return(x):
    if cuda.blockIdx.x == 1 and cuda.threadIdx.x == 0:
        return
    cuda.cg.this_grid().sync()
    x[cuda.threadIdx.x] = 1


@jit
def store_past_the_end(x, n):
    i = cuda.grid(1)
    if i < n + 3:
        x[i] = 1.0


@jit
def spin_until_set(flag):
    count = 0
    while flag[0] == 0:
        count += 1


@jit
def maybe_stop(x):
    if x[0] < 0:
        breakpoint()
    x[cuda.grid(1)] += 1


@jit(debug=True)
def debug_add_one(x):
    x[cuda.grid(1)] += 1


@jit
def add_one(x):
    i = cuda.grid(1)
    if i < x.shape[0]:
        x[i] += 1


@jit
def store_past_the_end_or_return(x, n):
    i = cuda.grid(1)
    if i >= n + 3:
        return
    x[i] = 1.0


@jit
def add_many_times(x, times):
    i = cuda.grid(1)
    for _ in range(times):
        x[i] += 1.0


def run(tier: str, kernel, config, *args, **setting):
    with sim.configure(tier=tier, **setting):
        kernel[config](*args)
    return kernel.last_tier


# ---- barriers are real ----------------------------------------------------------------------


@pytest.mark.parametrize("tier", TIERS)
def test_threads_exchange_through_shared_memory_after_the_barrier(tier):
    x, out = np.arange(32.0), np.zeros(32)
    assert run(tier, rotate_through_shared, (1, 32), x, out) == tier
    np.testing.assert_array_equal(out, np.roll(x * 2, -1))


def test_without_the_barrier_the_compiled_tier_reads_before_the_neighbour_wrote():
    x, out = np.arange(32.0), np.zeros(32)
    run("compiled", rotate_without_barrier, (1, 32), x, out)
    assert not np.array_equal(out, np.roll(x * 2, -1))


@settings(max_examples=15, deadline=None)
@given(blocks=st.integers(1, 3), log_threads=st.integers(0, 5), rounds=st.integers(0, 3), seed=st.integers(0, 99))
def test_barriers_inside_loops_give_the_threaded_tiers_values(blocks, log_threads, rounds, seed):
    threads = 1 << log_threads
    x = np.random.default_rng(seed).normal(size=max(1, rounds * threads))
    results = {}
    for tier in TIERS:
        out = np.zeros(blocks * rounds)
        run(tier, tree_sum_in_a_loop, (blocks, threads), x, out, rounds)
        results[tier] = out
    np.testing.assert_array_equal(results["compiled"], results["threads"])
    want = [x[r * threads:(r + 1) * threads].sum() for r in range(rounds)] * blocks
    np.testing.assert_allclose(results["compiled"], want, rtol=1e-12, atol=1e-12)


# ---- the same errors as the threaded tier ---------------------------------------------------


@pytest.mark.parametrize("tier", TIERS)
def test_threads_of_a_block_at_different_barriers_raise_divergent_barrier_error(tier):
    with pytest.raises(DivergentBarrierError):
        run(tier, barriers_in_both_branches, (1, 4), np.zeros(4), hang_timeout=5)


@pytest.mark.parametrize("tier", TIERS)
def test_threads_that_returned_do_not_hold_up_a_barrier(tier):
    x, out = np.arange(5.0), np.zeros(5)
    run(tier, some_threads_leave_before_the_barrier, (1, 8), x, out, hang_timeout=5)
    np.testing.assert_array_equal(out, x[::-1])


@pytest.mark.parametrize("tier", TIERS)
def test_a_grid_barrier_after_an_early_return_raises_grid_sync_exit_error(tier):
    with pytest.raises(GridSyncExitError):
        run(tier, sync_after_return, (2, 4), np.zeros(4), hang_timeout=5)


def test_an_index_out_of_range_names_block_thread_and_line():
    with pytest.raises(KernelError) as caught:
        run("compiled", store_past_the_end, (3, 4), np.zeros(8), 8)
    message = str(caught.value)
    assert caught.value.block_idx == (2, 0, 0)
    assert "IndexError" in message and "test_sim_tiers.py:" in message
    assert "compiled tier" in message or "compiled tier" in str(caught.value.__cause__)


@pytest.mark.parametrize("kernel", [store_past_the_end, store_past_the_end_or_return])
def test_a_kernel_without_barriers_names_the_failing_thread_in_either_thread_loop(kernel):
    """Without ``return`` the region's code runs inside the loop over threads (``cu_threads_K``); with
    one, a node per thread.  The compiled tier's own error (the cause of the threaded re-run's) names
    the thread either way."""
    with pytest.raises(KernelError) as caught:
        run("compiled", kernel, (3, 4), np.zeros(8), 8)
    compiled = caught.value.__cause__
    assert "compiled tier" in str(compiled) and "IndexError" in str(compiled)
    assert compiled.block_idx == (2, 0, 0) and compiled.thread_idx == (0, 0, 0)
    module = open(tiers._compiled(kernel)._prepared[(numba.typeof(np.zeros(8)), numba.int64)].source_path).read()
    assert ("def cu_threads_0(" in module) == (kernel is store_past_the_end)


def test_a_long_launch_of_a_kernel_without_barriers_shows_progress_to_the_hang_watch():
    """About half a second of work in 64 blocks against a hang timeout of 0.3 s: every block, and
    every thread, is progress (``cu_threads_K`` keeps the per-thread mark the watch reads)."""
    x = np.zeros(64 * 32)
    run("compiled", add_many_times, (64, 32), x, 40_000, hang_timeout=0.3, cores=1)
    assert (x == 40_000).all()


def test_boundscheck_off_compiles_an_unchecked_module_with_the_same_values():
    x, checked, unchecked = np.arange(32.0), np.zeros(32), np.zeros(32)
    run("compiled", rotate_through_shared, (1, 32), x, checked)
    run("compiled", rotate_through_shared, (1, 32), x, unchecked, boundscheck=False)
    np.testing.assert_array_equal(unchecked, checked)
    paths = [p.source_path for p in tiers._compiled(rotate_through_shared)._prepared.values()
             if not isinstance(p, Exception)]
    headers = [open(path).read() for path in paths]
    assert any("indexes unchecked" in h and "@cu_rt.BARE_UNCHECKED" in h for h in headers)
    assert any("indexes unchecked" not in h and "_UNCHECKED" not in h for h in headers)


def test_a_kernel_that_never_finishes_is_reported_as_hung():
    with pytest.raises(KernelHangError, match="spin_until_set"):
        run("compiled", spin_until_set, (1, 2), np.zeros(1), hang_timeout=1)


def test_ctrl_c_stops_a_compiled_launch():
    # compiled first, with the flag already set (it returns at once): on a fresh machine the compile takes seconds,
    # and the Ctrl-C must reach the launch, not the compile (this test alone, -k compiled, failed that way once)
    assert run("compiled", spin_until_set, (1, 2), np.ones(1)) == "compiled"
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run("compiled", spin_until_set, (1, 2), np.zeros(1), hang_timeout=30)   # never hangs the suite
    finally:
        timer.cancel()


# ---- which tier runs ------------------------------------------------------------------------


def test_breakpoint_and_debug_kernels_run_threaded_even_when_compiled_is_asked_for():
    x = np.zeros(4)
    assert run("compiled", maybe_stop, (1, 4), x) == "threads"
    assert run("compiled", debug_add_one, (1, 4), x) == "threads"
    np.testing.assert_array_equal(x, 2.0)
    assert "breakpoint()" in sim.explain(maybe_stop)
    assert "debug" in sim.explain(debug_add_one)


def test_auto_compiles_a_big_launch_at_once_and_a_small_kernel_once_its_work_adds_up(monkeypatch):
    big = np.zeros(tiers.BIG_WORK)
    assert run("auto", add_one, (4, 32), big) == "compiled"

    @jit
    def add_two(x):
        i = cuda.grid(1)
        if i < x.shape[0]:
            x[i] += 2

    small = np.zeros(64)
    monkeypatch.setattr(tiers, "HOT_WORK", 4 * small.size)   # four launches' work
    ran = [run("auto", add_two, (2, 32), small) for _ in range(5)]
    assert ran == ["threads"] * 3 + ["compiled"] * 2
    np.testing.assert_array_equal(small, 2.0 * 5)


def test_forget_counts_makes_a_hot_kernel_small_again_and_keeps_its_compiled_code(monkeypatch):
    """What the test suite does before each test (conftest.py): counts start afresh, as in a new process."""
    @jit
    def add_four(x):
        i = cuda.grid(1)
        if i < x.shape[0]:
            x[i] += 4

    small, other = np.zeros(64), np.zeros(64, np.float32)   # two argument types
    monkeypatch.setattr(tiers, "HOT_WORK", 2 * small.size)
    assert [run("auto", add_four, (2, 32), small) for _ in range(2)] == ["threads", "compiled"]
    tiers.forget_counts()
    assert run("auto", add_four, (2, 32), other) == "threads"    # its work so far is this launch's only
    assert run("auto", add_four, (2, 32), small) == "compiled"   # compiled code made before is still used
    assert run("auto", add_four, (2, 32), other) == "compiled"   # two launches' work again: hot
    np.testing.assert_array_equal(small, 12.0)
    np.testing.assert_array_equal(other, 8.0)


def test_auto_compiles_a_launch_of_many_threads_at_once():
    @jit
    def add_three(x):
        i = cuda.grid(1)
        if i < x.shape[0]:
            x[i] += 3

    x = np.zeros(64)   # little work, but as many Python threads as BIG_THREADS in the threaded tier
    assert run("auto", add_three, (tiers.BIG_THREADS // 32 - 1, 32), x) == "threads"
    assert run("auto", add_three, (tiers.BIG_THREADS // 32, 32), x) == "compiled"
    assert run("auto", add_three, (2, 32), x) == "compiled"   # its compiled code is ready: small launches use it
    np.testing.assert_array_equal(x, 9.0)


@jit
def add_four(x):
    i = cuda.grid(1)
    if i < x.shape[0]:
        x[i] += 4


def test_auto_compiles_a_small_kernel_at_its_nth_launch_with_the_same_argument_types(monkeypatch):
    monkeypatch.setattr(tiers, "HOT_LAUNCHES", 4)   # the rule, with fewer threaded launches to wait for
    x, counts = np.zeros(64), np.zeros(64, np.int32)
    ran = [run("auto", add_four, (2, 32), x) for _ in range(tiers.HOT_LAUNCHES + 1)]
    assert ran == ["threads"] * (tiers.HOT_LAUNCHES - 1) + ["compiled"] * 2
    np.testing.assert_array_equal(x, 4.0 * (tiers.HOT_LAUNCHES + 1))
    assert run("auto", add_four, (2, 32), counts) == "threads"   # other argument types: counted on their own
    assert run("threads", add_four, (2, 32), x) == "threads"      # compiled code ready, but threads asked for


def _reverse_in_block():
    """A new kernel object of the same source at every call: what a new process makes of the kernel."""
    @jit
    def reverse_in_block(x, out):
        tile = cuda.shared.array(32, numba.float64)
        t = cuda.threadIdx.x
        i = cuda.grid(1)
        mine = x[i]
        tile[t] = mine
        cuda.syncthreads()
        out[i] = tile[31 - t] + mine   # ``mine`` lives across the barrier: its type is remembered on disk
    return reverse_in_block


def test_auto_compiles_from_its_third_launch_what_an_earlier_run_left_compiled_in_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("PYFLOW_SIM_CACHE", str(tmp_path))   # an empty cache directory: nothing compiled before
    monkeypatch.setattr(tiers, "CACHED_READY", True)        # (conftest.py turns it off for the suite)
    x, out = np.arange(64.0), np.zeros(64)
    expected = x.reshape(2, 32)[:, ::-1].ravel() + x
    first = _reverse_in_block()
    assert run("auto", first, (2, 32), x, out) == "threads"     # a small launch, nothing on disk
    assert not tiers._compiled(first).compiled_before([x, out])
    assert run("compiled", first, (2, 32), x, out) == "compiled"   # leaves its module and machine code
    assert list(tmp_path.glob("pyflow_sim_reverse_in_block_types_*.txt"))
    again = _reverse_in_block()   # a new kernel object: nothing compiled for it in this process
    assert tiers._compiled(again).compiled_before([x, out])
    ran = [run("auto", again, (2, 32), x, out) for _ in range(tiers.CACHED_LAUNCHES)]
    assert ran == ["threads"] * (tiers.CACHED_LAUNCHES - 1) + ["compiled"]   # a load costs 2-3 small launches
    np.testing.assert_array_equal(out, expected)
    other = _reverse_in_block()
    assert {run("auto", other, (2, 32), x, out.astype(np.float32)) for _ in range(4)} == {"threads"}   # other types
    for index in (tmp_path / "__pycache__").glob("*reverse_in_block*cu_launch*.nbi"):
        index.unlink()   # numba's machine code gone: a compile would start from nothing
    assert not tiers._compiled(_reverse_in_block()).compiled_before([x, out])
    monkeypatch.setattr(tiers, "CACHED_READY", False)
    later = _reverse_in_block()
    assert {run("auto", later, (2, 32), x, out) for _ in range(4)} == {"threads"}
    script = "from pyflow.kernels.sim import tiers; print(tiers.CACHED_READY)"   # the suite's subprocesses: off
    assert subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


@jit(debug=True)
def debug_add_five(x):
    x[cuda.grid(1)] += 5


def test_debug_kernels_stay_threaded_however_often_they_are_launched(monkeypatch):
    monkeypatch.setattr(tiers, "HOT_LAUNCHES", 4)
    x = np.zeros(64)
    assert {run("auto", debug_add_five, (2, 32), x) for _ in range(tiers.HOT_LAUNCHES + 2)} == {"threads"}
    np.testing.assert_array_equal(x, 5.0 * (tiers.HOT_LAUNCHES + 2))


def test_the_threads_setting_keeps_every_launch_threaded(monkeypatch):
    assert run("threads", add_one, (4, 32), np.zeros(tiers.BIG_WORK)) == "threads"
    monkeypatch.setattr(tiers, "HOT_LAUNCHES", 4)
    x = np.zeros(64)
    assert {run("threads", add_one, (2, 32), x) for _ in range(tiers.HOT_LAUNCHES + 2)} == {"threads"}
    monkeypatch.setenv("PYFLOW_SIM_TIER", "threads")
    assert sim_settings._from_environment().tier == "threads"
    monkeypatch.setenv("PYFLOW_SIM_TIER", "fast")
    with pytest.raises(Exception, match="PYFLOW_SIM_TIER"):
        sim_settings._from_environment()


def test_explain_names_what_keeps_a_kernel_threaded():
    text = sim.explain(rotate_through_shared)
    assert "compiled tier: yes" in text and "block barrier" in text


def test_a_big_reductions_small_final_pass_runs_on_the_tier_of_its_first_pass(monkeypatch):
    """x.sum() of a long row is two launches: partial sums over the row (big), then one block over the
    partials (64 numbers).  They are one operation (launch.one_operation): both compiled, not the second
    threaded (a Python thread per simulated thread, ~10 ms, after a compiled first pass of ~2 ms)."""
    import pyflow as flow
    from pyflow.kernels.sim import kernel as sim_kernel

    seen = []
    decide = sim_kernel.compiled_for

    def recording(kernel, threads, args, settings, work):
        chosen = decide(kernel, threads, args, settings, work)
        seen.append((kernel.__name__, "threads" if chosen is None else "compiled"))
        return chosen

    monkeypatch.setattr(sim_kernel, "compiled_for", recording)
    x = np.random.default_rng(0).standard_normal(tiers.BIG_WORK * 2).astype(np.float32)
    with sim.configure(tier="auto"):
        got = flow.tensor(x, device="cuda").sum().numpy()
    assert [tier for _, tier in seen] == ["compiled", "compiled"], seen
    np.testing.assert_allclose(got, x.sum(dtype=np.float64), rtol=1e-5)


@pytest.mark.parametrize("read_first", [False, True], ids=["first launch at exit", "pool made before"])
def test_launches_left_for_the_exit_drain_run_on_the_compiled_tier(tmp_path, read_first):
    """A script's last ops, never read (an optimizer's step), run when pyflow drains its streams at exit.
    Python's executors refuse new work by then; a compiled launch must still run, not fail."""
    import os
    import subprocess
    import sys

    script = tmp_path / "last_step.py"
    script.write_text(
        "import numpy as np\nimport pyflow as flow\n"
        "x = flow.tensor(np.ones((64, 64), np.float32), device='cuda')\n"
        + ("assert (x * 2).numpy().sum() == 8192\n" if read_first else "")
        + "y = x + 1\ny.add_(1)\n")
    env = {**os.environ, "PYFLOW_SIM_TIER": "compiled"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and "failed" not in done.stderr, done.stderr


@jit
def local_arrays_across_barriers(x, out, rounds, stop_at):
    """Per thread, three running values in a local array that outlives every barrier, and a local
    array passed whole to a loop's arithmetic; rounds end early (break) for a block-uniform ``stop_at``."""
    acc = cuda.local.array(3, np.float64)
    scratch = cuda.local.array((2, 2), np.float64)
    s = cuda.shared.array(16, np.float64)
    t = cuda.threadIdx.x
    for i in range(3):
        acc[i] = x[t] + i
    for r in range(rounds):
        if r == stop_at:
            break
        s[t] = acc[r % 3]
        cuda.syncthreads()
        scratch[0, 0] = s[(t + 1) % cuda.blockDim.x]
        scratch[1, 1] = acc[(r + 1) % 3]
        acc[(r + 1) % 3] = scratch[0, 0] * 0.5 + scratch[1, 1]
        cuda.syncthreads()
    out[t] = acc[0] * 100 + acc[1] * 10 + acc[2]


@given(x=st.lists(st.integers(-5, 5), min_size=8, max_size=8), rounds=st.integers(0, 5),
       stop_at=st.integers(-1, 5))
@settings(max_examples=15, deadline=None)
def test_local_arrays_worked_on_from_the_stack_keep_their_values_across_barriers(x, rounds, stop_at):
    """The compiled tier copies a small local array to the node's stack within a region and back at
    each way out (the end, a block-level break): the same values as the threaded tier."""
    results = []
    for tier in TIERS:
        out = cuda.device_array(8, np.float64)
        run(tier, local_arrays_across_barriers, (1, 8), cuda.to_device(np.array(x, np.float64)), out, rounds,
            stop_at)
        results.append(out.copy_to_host())
    np.testing.assert_array_equal(results[1], results[0])


@pytest.mark.slow   # a cold compile of the tiled matmul of its own (~10 s on a fresh machine): CI's slow stage
def test_a_register_tiled_matmul_keeps_its_accumulators_on_the_stack():
    """The matmul's per-thread tiles are worked on as stack arrays (where LLVM keeps them in registers)."""
    from pyflow.kernels.matmul import make_matmul_kernel

    kernel = make_matmul_kernel(4, np.dtype(np.float32), 2)
    a, b = np.arange(35, dtype=np.float32).reshape(5, 7), np.ones((7, 6), np.float32)
    out = cuda.device_array((5, 6), np.float32)
    shape = (0, 7, 1), (0, 6, 1)
    run("compiled", kernel, ((1, 1, 1), (4, 4, 1)), out.reshape(-1), shape[1], cuda.to_device(a.reshape(-1)),
        shape[0], cuda.to_device(b.reshape(-1)), shape[1], np.ones(1, np.int64), 5, 6, 7, 1)
    np.testing.assert_array_equal(out.copy_to_host(), a @ b)
    source = open(sim.explain(kernel).split("compiled (")[1].split(")")[0]).read()
    # the tile's sums, declared in the inlined device function make_matmul_tile (its names get a prefix)
    assert re.search(r"(\w*acc) = (cu_lo\d+)_on_stack\(\); cu_rt.copy_array\(\1, \2\[cu_g\]\)", source)
