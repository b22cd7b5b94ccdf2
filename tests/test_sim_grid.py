"""The concurrent-grid launch: blocks that meet at grid barriers compute what numpy does.

These run on both backends where the property is about results (prefix sum,
reduction, per-block shared memory), and only in the simulator where it is about
the simulator itself (the stock simulator's bug, deadlock reports, settings).
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyflow.kernels import jit, max_cooperative_grid_blocks
from pyflow.kernels.backend import cuda, is_simulator
from pyflow.kernels.examples import prefix_sum, two_phase_sum

sim_only = pytest.mark.skipif(not is_simulator(), reason="checks the simulator itself")

grids = st.integers(1, 6)
block_sizes = st.integers(1, 64)


@given(blocks=grids, threads=block_sizes, data=st.data())
def test_cross_block_prefix_sum_equals_numpy(blocks, threads, data):
    n = data.draw(st.integers(1, blocks * threads), label="n")
    x = data.draw(st.lists(st.floats(-100, 100), min_size=n, max_size=n).map(np.array), label="x")
    out = np.full(n, np.nan)
    prefix_sum[blocks, threads](x, out, np.zeros(blocks))
    np.testing.assert_allclose(out, np.cumsum(x), rtol=1e-9, atol=1e-9)


@given(blocks=grids, threads=block_sizes, n=st.integers(0, 300), seed=st.integers(0, 2**32 - 1))
def test_two_phase_reduction_equals_numpy(blocks, threads, n, seed):
    x = np.random.default_rng(seed).normal(size=n)
    total = np.full(1, np.nan)
    two_phase_sum[blocks, threads](x, np.zeros(blocks), total)
    np.testing.assert_allclose(total[0], x.sum(), rtol=1e-9, atol=1e-9)


@sim_only
@pytest.mark.parametrize("blocks", [2, 3, 5])
def test_stock_simulator_gets_cross_block_reduction_wrong(blocks):
    """Why pyflow has its own launch: numba's simulator runs block 0 before the others
    exist, so block 0 adds partial sums nobody has written yet."""
    x = np.ones(blocks * 8)
    stock = cuda.jit(two_phase_sum.py_func)
    total = np.zeros(1)
    stock[blocks, 8](x, np.zeros(blocks), total)
    assert total[0] == 8.0  # only block 0's own partial sum
    two_phase_sum[blocks, 8](x, np.zeros(blocks), total)
    assert total[0] == x.size


@jit
def publish_block_id(out):
    mine = cuda.shared.array(1, dtype=np.int64)
    if cuda.threadIdx.x == 0:
        mine[0] = cuda.blockIdx.x
    cuda.cg.this_grid().sync()  # every block has written its shared slot by now
    out[cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x] = mine[0]


@given(blocks=grids, threads=st.integers(1, 16))
def test_each_block_has_its_own_shared_memory(blocks, threads):
    out = np.full(blocks * threads, -1)
    publish_block_id[blocks, threads](out)
    np.testing.assert_array_equal(out, np.repeat(np.arange(blocks), threads))


@jit
def two_arrays_one_line(out):
    a, b = cuda.shared.array(1, dtype=np.int32), cuda.shared.array(1, dtype=np.int32)
    a[0], b[0] = 1, 2
    out[0], out[1] = a[0], b[0]


@sim_only
def test_two_shared_arrays_on_one_line_do_not_alias():
    out = np.zeros(2, dtype=np.int32)
    two_arrays_one_line[1, 1](out)
    assert list(out) == [1, 2]


@jit
def dynamic_shared_roundtrip(out):
    buf = cuda.shared.array(0, dtype=np.float32)
    t = cuda.threadIdx.x
    buf[t] = cuda.blockIdx.x * 100 + t
    cuda.syncthreads()
    out[cuda.blockIdx.x * cuda.blockDim.x + t] = buf[cuda.blockDim.x - 1 - t]


@given(blocks=grids, threads=st.integers(1, 32))
def test_dynamic_shared_memory_is_per_block(blocks, threads):
    out = np.zeros(blocks * threads, dtype=np.float32)
    dynamic_shared_roundtrip[blocks, threads, 0, threads * 4](out)
    expected = [b * 100 + (threads - 1 - t) for b in range(blocks) for t in range(threads)]
    np.testing.assert_array_equal(out, expected)


@jit
def votes(pred, out):
    t = cuda.threadIdx.x
    out[0] = cuda.syncthreads_count(pred[t])
    out[1] = cuda.syncthreads_and(pred[t])
    out[2] = cuda.syncthreads_or(pred[t])


@given(st.lists(st.booleans(), min_size=1, max_size=32))
def test_syncthreads_count_and_or(pred):
    p = np.array(pred, dtype=np.int32)
    out = np.zeros(3, dtype=np.int32)
    votes[1, len(pred)](p, out)
    assert list(out) == [sum(pred), int(all(pred)), int(any(pred))]


@jit
def count_resident(live, peak, out):
    now = cuda.atomic.add(live, 0, 1) + 1
    cuda.atomic.max(peak, 0, now)
    cuda.syncthreads()
    i = cuda.grid(1)
    out[i] = i * 2
    cuda.syncthreads()
    cuda.atomic.sub(live, 0, 1)


@sim_only
def test_large_grid_without_grid_sync_runs_in_waves_of_coresident_blocks():
    from pyflow.kernels import sim

    with sim.configure(multiprocessor_count=1, max_blocks_per_multiprocessor=3, tier="threads"):   # threads' waves
        assert count_resident.max_cooperative_grid_blocks(4) == 3
        live, peak, out = np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(40)
        count_resident[10, 4](live, peak, out)
    np.testing.assert_array_equal(out, np.arange(40) * 2)
    assert 4 <= peak[0] <= 3 * 4  # never more than 3 blocks of 4 threads at once


@jit
def blocked_until_flag(started, flag):
    if cuda.threadIdx.x == 0:
        started[0] = 1
        while flag[0] == 0:
            cuda.nanosleep(1000)


@sim_only
def test_module_globals_keep_real_cuda_while_a_kernel_runs():
    """Host code next to a running kernel must still see numba.cuda, not the fake module (the threaded tier's)."""
    from pyflow.kernels import sim

    started, flag = np.zeros(1), np.zeros(1)

    def launch():
        with sim.configure(tier="threads"):
            blocked_until_flag[1, 2](started, flag)

    runner = threading.Thread(target=launch, name="test-launcher")
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while started[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert started[0] == 1
        assert globals()["cuda"] is cuda
        assert blocked_until_flag.py_func.__globals__["cuda"] is cuda
    finally:
        flag[0] = 1
        runner.join(10)
    assert not runner.is_alive()


@jit(device=True)
def fact(n):
    if n <= 1:
        return 1
    return n * fact(n - 1)


@jit(device=True)
def my_block():
    return cuda.blockIdx.x


@jit
def uses_device_functions(out):
    i = cuda.grid(1)
    out[i] = fact(i + 1) + 1000 * my_block()


def test_device_functions_see_the_launch_and_may_recurse():
    out = np.zeros(6, dtype=np.int64)
    uses_device_functions[2, 3](out)
    np.testing.assert_array_equal(out, [1, 2, 6, 1024, 1120, 1720])


@jit
def read_uninitialised(out):
    s = cuda.shared.array(2, dtype=np.uint32)
    out[0] = s[1]


@sim_only
def test_uninitialised_shared_memory_is_garbage_not_zero():
    from pyflow.kernels import sim

    out = np.zeros(1, dtype=np.uint32)
    with sim.configure(tier="threads"):   # the threaded tier fills shared memory with 0xCD bytes
        read_uninitialised[1, 1](out)
    assert out[0] == 0xCDCDCDCD


def test_device_arrays_are_updated_in_place():
    d = cuda.to_device(np.arange(8, dtype=np.float64))
    prefix_sum[2, 4](d, d, cuda.to_device(np.zeros(2)))
    np.testing.assert_allclose(d.copy_to_host(), np.cumsum(np.arange(8)))


def test_max_cooperative_grid_blocks_has_the_hardware_signature():
    limit = two_phase_sum.overloads[None].max_cooperative_grid_blocks(32, 0) if is_simulator() else None
    x = np.ones(64)
    two_phase_sum[1, 32](x, np.zeros(1), np.zeros(1))  # compiles on a GPU
    got = max_cooperative_grid_blocks(two_phase_sum, 32, 0)
    assert got >= 1
    if limit is not None:
        assert got == limit


@jit
def ieee_math(x, logs, roots):
    i = cuda.grid(1)
    logs[i] = math.log(x[i])
    roots[i] = math.sqrt(x[i] - 1.0)


@sim_only
def test_math_in_kernels_gives_ieee_results_like_a_gpu():
    """Python's math.log(0) raises; a GPU (and the simulator) returns -inf."""
    x = np.array([0.0, 0.5, 2.0])
    logs, roots = np.zeros(3), np.zeros(3)
    ieee_math[1, 3](x, logs, roots)
    assert logs[0] == -np.inf and logs[2] == pytest.approx(np.log(2.0))
    assert np.isnan(roots[0]) and np.isnan(roots[1]) and roots[2] == 1.0


@sim_only
def test_debug_kernels_raise_on_invalid_float_operations():
    from pyflow.errors import KernelError

    debug_kernel = jit(debug=True)(ieee_math.py_func)
    with pytest.raises(KernelError) as info:
        debug_kernel[1, 3](np.array([0.0, 0.5, 2.0]), np.zeros(3), np.zeros(3))
    assert isinstance(info.value.__cause__, FloatingPointError)
