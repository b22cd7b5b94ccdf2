"""What the simulator reports instead of hanging or lying: each case raises within a bound.

On a GPU these kernels hang, crash or silently corrupt memory; in pyflow's
simulator each one raises a specific error naming the kernel, the threads and
the source lines, and leaves no simulated thread behind.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyflow.errors import (
    CooperativeLaunchTooLargeError,
    DeadlockError,
    DivergentBarrierError,
    GridSyncExitError,
    KernelError,
    KernelHangError,
    LaunchConfigError,
)
from pyflow.kernels import jit
from pyflow.kernels.backend import cuda, is_simulator
from pyflow.kernels.examples import two_phase_sum

pytestmark = pytest.mark.skipif(not is_simulator(), reason="simulator diagnostics")

BOUND_SECONDS = 5.0


@pytest.fixture(autouse=True)
def no_simulated_thread_survives():
    yield
    deadline = time.monotonic() + BOUND_SECONDS
    while time.monotonic() < deadline:
        left = [t.name for t in threading.enumerate() if t.name.startswith("pyflow-sim:")]
        if not left:
            return
        time.sleep(0.01)
    pytest.fail(f"simulated threads still alive: {left[:3]}")


@pytest.fixture(autouse=True)
def threaded_tier():
    """These are the threaded tier's reports (who waits at which barrier, the failing line, pdb): every launch
    here runs threaded, however often its kernel ran before (``auto`` compiles a kernel launched again and
    again, ``kernels/sim/tiers.py``); the compiled tier's errors are checked in ``tests/test_sim_tiers.py``."""
    from pyflow.kernels import sim

    with sim.configure(tier="threads"):
        yield


def raises_within_bound(error_type, launch, *args):
    start = time.monotonic()
    with pytest.raises(error_type) as info:
        launch(*args)
    assert time.monotonic() - start < BOUND_SECONDS
    return info.value


@jit
def out_of_bounds(a):
    i = cuda.grid(1)
    cuda.syncthreads()
    if i == 5:
        a[i + 100] = 1.0


def test_kernel_exception_names_thread_and_block_and_keeps_the_cause():
    error = raises_within_bound(KernelError, out_of_bounds[2, 4], np.zeros(8))
    assert error.thread_idx == (1, 0, 0) and error.block_idx == (1, 0, 0)
    assert isinstance(error.__cause__, IndexError)
    assert "out_of_bounds" in str(error) and "threadIdx=(1, 0, 0)" in str(error)
    assert "test_sim_errors.py" in str(error)  # the kernel line


@jit
def divergent(a):
    if cuda.threadIdx.x % 2 == 0:
        cuda.syncthreads()
    else:
        cuda.syncthreads()


def test_divergent_block_barriers_are_reported():
    error = raises_within_bound(DivergentBarrierError, divergent[1, 4], np.zeros(1))
    assert "divergent syncthreads" in str(error)


@jit
def grid_and_block_barrier_mixed(a):
    if cuda.threadIdx.x == 0:
        cuda.cg.this_grid().sync()
    else:
        cuda.syncthreads()


@given(blocks=st.integers(1, 4), threads=st.integers(2, 8))
def test_missing_barrier_is_a_deadlock_with_a_table_of_who_waits_where(blocks, threads):
    error = raises_within_bound(DeadlockError, grid_and_block_barrier_mixed[blocks, threads], np.zeros(1))
    assert "deadlocked" in str(error)
    assert "grid.sync at test_sim_errors.py" in str(error)
    assert "syncthreads at test_sim_errors.py" in str(error)


@jit
def early_return(a):
    if cuda.blockIdx.x == 1 and cuda.threadIdx.x == 0:
        return
    cuda.cg.this_grid().sync()
    a[0] = 1.0


def test_thread_exiting_while_others_wait_at_grid_sync_is_reported():
    error = raises_within_bound(GridSyncExitError, early_return[3, 4], np.zeros(1))
    assert "block (1, 0, 0) thread (0, 0, 0)" in str(error)


@jit
def early_return_then_block_barrier(a):
    if cuda.threadIdx.x == 0:
        return
    cuda.syncthreads()
    a[cuda.threadIdx.x] = 1.0


def test_exited_threads_count_as_arrived_at_block_barriers():
    """As on the hardware (and in the stock simulator): no deadlock."""
    a = np.zeros(4)
    early_return_then_block_barrier[1, 4](a)
    assert list(a) == [0, 1, 1, 1]


def test_oversize_cooperative_grid_is_rejected_before_running():
    limit = two_phase_sum.max_cooperative_grid_blocks(32)
    x = np.ones(10)
    error = raises_within_bound(CooperativeLaunchTooLargeError, two_phase_sum[limit + 1, 32],
                                x, np.zeros(limit + 1), np.zeros(1))
    assert str(limit) in str(error)
    two_phase_sum[limit, 32](x, np.zeros(limit), np.zeros(1))  # the limit itself is fine


def test_coresident_limit_follows_the_occupancy_model():
    from pyflow.kernels import sim

    with sim.configure(multiprocessor_count=3, max_threads_per_multiprocessor=256,
                       max_blocks_per_multiprocessor=4, shared_memory_per_multiprocessor=4096):
        k = two_phase_sum.overloads["any"]
        assert k.max_cooperative_grid_blocks(32) == 3 * 4         # blocks per SM bound
        assert k.max_cooperative_grid_blocks(128) == 3 * 2        # threads per SM bound
        assert k.max_cooperative_grid_blocks(32, 2048) == 3 * 2   # shared memory bound
        assert k.max_cooperative_grid_blocks((16, 4)) == 3 * 4    # a 2-D block counts its threads


@jit
def spin_forever(a):
    if cuda.blockIdx.x == 0:
        while a[0] == 0:
            pass


def test_a_spinning_kernel_is_stopped_by_the_watchdog():
    from pyflow.kernels import sim

    with sim.configure(hang_timeout=0.5):
        error = raises_within_bound(KernelHangError, spin_forever[2, 2], np.zeros(1))
    assert "no progress" in str(error) and "running at test_sim_errors.py" in str(error)


invalid_configs = st.one_of(
    st.tuples(st.just(0), st.integers(1, 32)),
    st.tuples(st.integers(1, 4), st.integers(1025, 5000)),
    st.tuples(st.integers(1, 4), st.tuples(st.integers(33, 64), st.integers(33, 64))),
    st.tuples(st.integers(1, 4), st.tuples(st.just(1), st.just(1), st.integers(65, 128))),
    st.tuples(st.tuples(st.integers(1, 2), st.just(0)), st.integers(1, 32)),
    st.tuples(st.just(2.0), st.integers(1, 32)),
    st.tuples(st.integers(1, 4), st.just((1, 2, 3, 4))),
    st.tuples(st.integers(1, 4), st.just(True)),
)


@given(invalid_configs)
def test_invalid_launch_configurations_raise_before_running(config):
    with pytest.raises(LaunchConfigError):
        two_phase_sum[config]


def test_launch_needs_a_configuration():
    with pytest.raises(LaunchConfigError, match="needs a launch configuration"):
        two_phase_sum(np.zeros(1), np.zeros(1), np.zeros(1))


def test_too_much_dynamic_shared_memory_is_rejected():
    with pytest.raises(LaunchConfigError, match="shared memory"):
        two_phase_sum[1, 32, 0, 1 << 20]


def _tracer(frame, event, arg):
    return _tracer


@jit
def traced_wait(flag):
    if cuda.threadIdx.x == 0:
        # What pdb.set_trace() does to the frames of the thread it stops in.
        sys.settrace(_tracer)
        sys._getframe().f_trace = _tracer
        while flag[0] == 0:
            cuda.nanosleep(1000)
        sys.settrace(None)


def test_the_watchdog_does_not_fire_while_a_debugger_steps_a_thread():
    from pyflow.kernels import sim

    flag = np.zeros(1)
    releaser = threading.Timer(1.0, lambda: flag.__setitem__(0, 1))
    releaser.start()
    try:
        with sim.configure(hang_timeout=0.3):
            traced_wait[1, 2](flag)  # would raise KernelHangError after 0.3 s otherwise
    finally:
        releaser.cancel()
    assert flag[0] == 1
