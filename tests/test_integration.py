"""The layers together: allocator memory on ep devices, kernels on ep streams, the demo."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyflow.device import CachingAllocator, ep
from pyflow.kernels.backend import is_simulator
from pyflow.kernels.examples import prefix_sum, two_phase_sum

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fresh_ep_devices():
    ep.shutdown()
    yield
    ep.shutdown()


@given(device=st.sampled_from(["cpu:0", "cuda:0", "mock:0"]),
       sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=12),
       frees=st.lists(st.integers(0, 11), max_size=6))
def test_allocations_on_every_provider_hold_their_own_data(device, sizes, frees):
    """Write a distinct pattern into every live allocation, read all back: no overlap."""
    ep_device = ep.get_device(device)
    allocator = CachingAllocator(ep_device, device=device)
    stream = ep_device.create_stream()
    live = {}
    for i, n in enumerate(sizes):
        piece = allocator.allocate(n * 4)
        live[i] = (piece, ep_device.as_array(piece.raw, piece.offset, (n,), np.int32))
        if i in frees and i - 1 in live:  # free some earlier ones as we go
            allocator.deallocate(live.pop(i - 1)[0].ptr)
    for i, (_, view) in live.items():
        stream.memcpy_h2d(view, np.full(view.shape, i, dtype=np.int32))
    readback = {i: np.empty(view.shape, dtype=np.int32) for i, (_, view) in live.items()}
    for i, (_, view) in live.items():
        stream.memcpy_d2h(readback[i], view)
    stream.sync()
    for i, values in readback.items():
        assert (values == i).all(), f"allocation {i} was overwritten"
    ep_device.destroy_stream(stream)


@pytest.mark.skipif(not is_simulator(), reason="emulated streams")
@given(seed=st.integers(0, 1000), blocks=st.integers(1, 4))
def test_grid_sync_kernels_on_two_emulated_streams_with_an_event(seed, blocks):
    """Producer kernel on one stream, consumer kernel on another, ordered by an event."""
    threads = 8
    n = blocks * threads
    x = np.random.default_rng(seed).normal(size=n)
    with ep.emulation(max_delay=0.002, seed=seed):
        cuda0 = ep.get_device("cuda:0")
        producer, consumer = cuda0.create_stream("producer"), cuda0.create_stream("consumer")
    allocator = CachingAllocator(cuda0, device="cuda:0")

    def array(count):
        piece = allocator.allocate(count * 8)
        return cuda0.as_array(piece.raw, piece.offset, (count,), np.float64)

    xd, scan, block_sums, partial, total = array(n), array(n), array(blocks), array(blocks), array(1)
    done = cuda0.create_event()
    producer.memcpy_h2d(xd, x)
    producer.launch(prefix_sum[blocks, threads], xd, scan, block_sums)
    producer.record_event(done)
    consumer.wait_event(done)
    consumer.launch(two_phase_sum[blocks, threads], scan, partial, total)
    out = np.empty(1)
    consumer.memcpy_d2h(out, total)
    consumer.sync()
    producer.sync()
    np.testing.assert_allclose(out[0], np.cumsum(x).sum(), rtol=1e-9, atol=1e-9)


def _run(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_python_m_pyflow_demo_reports_the_backend_and_checks_against_numpy():
    result = _run("-m", "pyflow")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "backend:" in result.stdout
    assert result.stdout.count(" OK") == 2


@pytest.mark.parametrize("tutorial", sorted(p.name for p in (ROOT / "tutorials").glob("*.py")))
def test_tutorial_runs_top_to_bottom(tutorial):
    result = _run(str(ROOT / "tutorials" / tutorial))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
