"""Specification of ``pyflow.device.ep``: the registry, CPU and emulated providers (and,
with ``-m gpu`` on a GPU, the numba provider)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyflow.device import ep
from pyflow.device.device import Device
from pyflow.device.ep.base import RawBuffer
from pyflow.device.ep.cpu import CpuDevice
from pyflow.device.ep.emulated import EmulatedDevice, emulation, emulation_settings
from pyflow.kernels.backend import _probe_driver
from pyflow.errors import (
    AllocationError,
    DeviceError,
    DoubleFreeError,
    InvalidFreeError,
    StreamExecutionError,
)
from pyflow.kernels.backend import is_gpu, is_simulator

MEMORY_DEVICES = ["cpu", "mock:0", "cuda:0"]  # cuda: emulated (sim) or a real GPU
# cuda:0 in the simulator: its emulated CUDA streams, on a device every machine has (the simulator offers
# PYFLOW_SIM_DEVICES of them, maybe 1); on a GPU the cuda streams are real, checked by the gpu tests below
ASYNC_DEVICES = ["mock:0", "cuda:0"] if not is_gpu() else ["mock:0"]


@pytest.fixture(autouse=True)
def fresh_registry():
    """Each test starts from an empty registry and leaves no stream behind."""
    ep.shutdown()
    yield
    ep.shutdown()


def to_numpy(array) -> np.ndarray:
    """A host copy of a numpy / FakeCUDAArray / DeviceNDArray."""
    return array.copy_to_host() if hasattr(array, "copy_to_host") else np.array(array)


def ep_thread_names() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("pyflow-ep-")]


# --- registry -------------------------------------------------------------------------------


def test_get_device_is_cached_per_device() -> None:
    d = ep.get_device("mock:1")
    assert ep.get_device(Device("mock", 1)) is d and ep.get_device("mock:1") is d
    assert ep.get_device("mock:0") is not d
    assert (d.device, d.device_type, d.device_index) == (Device("mock:1"), Device("mock:1").device_type, 1)


def test_get_device_is_thread_safe() -> None:
    # cuda:0, not cuda:1: a machine with one GPU has no cuda:1 (the simulator has 8)
    n_threads = 16
    barrier = threading.Barrier(n_threads)
    got, errors = [], []

    def get() -> None:
        barrier.wait()
        try:
            got.append(ep.get_device("cuda:0"))
        except Exception as error:  # a thread's error must fail the test, not vanish with the thread
            errors.append(error)

    threads = [threading.Thread(target=get) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"get_device raised in {len(errors)} of {n_threads} threads: {errors[0]!r}"
    assert len(got) == n_threads and len({id(d) for d in got}) == 1


@pytest.mark.skipif(is_gpu(), reason="checks the simulator's providers")
def test_providers_follow_the_device_type() -> None:
    assert type(ep.get_device("cpu")) is CpuDevice
    cuda0, mock0 = ep.get_device("cuda"), ep.get_device("mock")
    assert type(cuda0) is EmulatedDevice and cuda0.fake_cuda_arrays
    assert type(mock0) is EmulatedDevice and not mock0.fake_cuda_arrays


def test_device_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ep.device_count("cpu") == 1
    if not is_gpu():
        monkeypatch.delenv("PYFLOW_SIM_DEVICES", raising=False)
        assert ep.device_count("cuda") == 8
        monkeypatch.setenv("PYFLOW_SIM_DEVICES", "3")
        assert ep.device_count("cuda") == 3
        assert ep.get_device("cuda:2").device_index == 2
    monkeypatch.setenv("PYFLOW_MOCK_DEVICES", "1")
    assert ep.device_count("mock") == 1


@pytest.mark.skipif(is_gpu(), reason="message of the simulated device count")
def test_out_of_range_index_names_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYFLOW_SIM_DEVICES", raising=False)
    with pytest.raises(DeviceError, match=r"cuda:9 does not exist: 8 cuda devices \(simulated"):
        ep.get_device("cuda:9")
    with pytest.raises(DeviceError, match="cpu:1 does not exist: 1 cpu device"):
        ep.get_device("cpu:1")
    with pytest.raises(DeviceError, match="unknown device type"):
        ep.get_device("gpu:0")


@pytest.mark.skipif(_probe_driver()[0], reason="checks the no-GPU path; a GPU is visible here")
def test_gpu_backend_without_a_gpu_raises_backend_error() -> None:
    code = (
        "from pyflow.device import ep\nfrom pyflow.errors import BackendError\n"
        "try:\n    ep.get_device('cuda')\nexcept BackendError as e:\n    print('BackendError:', e)\n"
    )
    env = dict(os.environ, PYFLOW_CUDA="gpu")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "BackendError: the GPU backend is selected but CUDA is unusable" in out.stdout, out.stderr


def test_shutdown_empties_the_cache() -> None:
    d = ep.get_device("mock:0")
    ep.shutdown()
    assert ep.get_device("mock:0") is not d


# --- memory ----------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", MEMORY_DEVICES)
def test_alloc_gives_an_aligned_zeroed_buffer(spec: str) -> None:
    d = ep.get_device(spec)
    raw = d.alloc(1000)
    assert isinstance(raw, RawBuffer) and raw.nbytes == 1000 and raw.device is Device(spec)
    assert raw.ptr % 256 == 0
    if not is_gpu() or spec == "cpu":
        assert raw.ptr % 512 == 0 and not to_numpy(d.as_array(raw, 0, (1000,), np.uint8)).any()
    d.free(raw)


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(MEMORY_DEVICES),
    st.sampled_from([np.uint8, np.int16, np.int32, np.float32, np.float64, np.complex64]),
    st.integers(0, 40),
    st.integers(0, 30),
)
def test_as_array_writes_show_through_another_view(spec, dtype, slot, count) -> None:
    d = ep.get_device(spec)
    itemsize = np.dtype(dtype).itemsize
    raw = d.alloc(1024)
    # zeroed here: a GPU's alloc is cudaMalloc, whose bytes are whatever the last user of that
    # memory left (often the previous example's values, as numba hands freed memory back)
    d.as_array(raw, 0, (raw.nbytes,), np.uint8)[:] = np.zeros(raw.nbytes, np.uint8)
    offset = slot * itemsize
    values = (np.arange(count) * 3 + 1).astype(dtype)
    if offset + values.nbytes > raw.nbytes:
        with pytest.raises(ValueError, match="reaches past the end"):
            d.as_array(raw, offset, (count,), dtype)
    else:
        view = d.as_array(raw, offset, (count,), dtype)
        assert tuple(view.shape) == (count,) and np.dtype(view.dtype) == np.dtype(dtype)
        view[:] = values
        whole = to_numpy(d.as_array(raw, 0, (raw.nbytes,), np.uint8))
        assert whole[offset : offset + values.nbytes].tobytes() == values.tobytes()
        assert not whole[:offset].any() and not whole[offset + values.nbytes :].any()
    d.free(raw)


@pytest.mark.parametrize("spec", MEMORY_DEVICES)
def test_as_array_honours_strides(spec: str) -> None:
    d = ep.get_device(spec)
    raw = d.alloc(6 * 4)
    d.as_array(raw, 0, (6,), np.float32)[:] = np.arange(6, dtype=np.float32)
    transposed = d.as_array(raw, 0, (3, 2), np.float32, strides=(4, 12))  # column-major view of 2x3
    assert np.array_equal(to_numpy(transposed), np.arange(6, dtype=np.float32).reshape(2, 3).T)
    with pytest.raises(ValueError, match="reaches past the end"):
        d.as_array(raw, 4, (3, 2), np.float32, strides=(4, 12))
    with pytest.raises(ValueError):
        d.as_array(raw, -4, (1,), np.float32)
    d.free(raw)


@pytest.mark.parametrize("spec", MEMORY_DEVICES)
def test_free_rejects_double_and_foreign_frees(spec: str) -> None:
    d = ep.get_device(spec)
    raw = d.alloc(64)
    d.free(raw)
    with pytest.raises(DoubleFreeError):
        d.free(raw)
    with pytest.raises(ValueError, match="freed|not a live buffer"):
        d.as_array(raw, 0, (1,), np.uint8)
    foreign = [ep.get_device("mock:1").alloc(64), RawBuffer(ptr=12345, nbytes=64, handle=None, device=Device(spec))]
    for raw in foreign:
        with pytest.raises(InvalidFreeError, match="was not allocated by") as info:
            d.free(raw)
        assert not isinstance(info.value, DoubleFreeError)


@pytest.mark.parametrize("nbytes", [-1, 1.5, True, "8"], ids=repr)
def test_alloc_rejects_sizes_that_are_not_byte_counts(nbytes) -> None:
    with pytest.raises(AllocationError):
        ep.get_device("mock:0").alloc(nbytes)


def test_memory_limit_raises_a_plain_memory_error_and_recovers() -> None:
    d = EmulatedDevice(Device("mock:1"), memory_limit=1000)
    first = d.alloc(600)
    with pytest.raises(MemoryError, match="out of memory: asked for 600 bytes, 600 of 1000"):
        d.alloc(600)
    d.free(first)
    assert d.alloc(600).nbytes == 600 and d.memory.bytes_in_use == 600


@pytest.mark.parametrize("spec", MEMORY_DEVICES)
def test_alloc_pinned_gives_host_bytes(spec: str) -> None:
    pinned = ep.get_device(spec).alloc_pinned(100)
    assert isinstance(pinned, np.ndarray) and pinned.dtype == np.uint8 and pinned.shape == (100,)


@pytest.mark.skipif(not is_simulator(), reason="simulator array type")
def test_simulated_cuda_arrays_are_fake_cuda_arrays() -> None:
    from pyflow.kernels.backend import cuda

    d = ep.get_device("cuda:0")
    assert isinstance(d.as_array(d.alloc(8), 0, (2,), np.float32), cuda.cudadrv.devicearray.FakeCUDAArray)
    assert type(ep.get_device("mock:0").as_array(ep.get_device("mock:0").alloc(8), 0, (2,), np.float32)) is np.ndarray


# --- streams and events ------------------------------------------------------------------------


def make_streams(spec: str, *names: str, max_delay: float = 0.0, seed: int = 0) -> list:
    with emulation(max_delay=max_delay, seed=seed):
        return [ep.get_device(spec).create_stream(name) for name in names]


@pytest.mark.parametrize("spec", ASYNC_DEVICES)
def test_emulated_stream_runs_tasks_in_fifo_order(spec: str) -> None:
    (stream,) = make_streams(spec, "compute", max_delay=0.0003, seed=7)
    seen: list[int] = []
    for i in range(40):
        stream.launch(seen.append, i)
    stream.sync()
    assert seen == list(range(40))


@pytest.mark.parametrize("spec", ASYNC_DEVICES)
def test_emulated_launch_returns_before_the_task_runs(spec: str) -> None:
    (stream,) = make_streams(spec, "compute")
    gate, ran = threading.Event(), []
    stream.launch(lambda: ran.append(gate.wait(timeout=10)), name="gated")
    assert ran == []  # launch came back while the task is still blocked
    gate.set()
    stream.sync()
    assert ran == [True]


@pytest.mark.parametrize("spec", ASYNC_DEVICES)
def test_emulated_stream_is_a_named_worker_thread(spec: str) -> None:
    (stream,) = make_streams(spec, "h2d")
    where: list[str] = []
    stream.launch(lambda: where.append(threading.current_thread().name))
    stream.sync()
    assert where == [f"pyflow-ep-{Device(spec)}-h2d"] and where[0] in ep_thread_names()


def test_cpu_stream_runs_work_inline() -> None:
    stream = ep.get_device("cpu").create_stream()
    where: list[str] = []
    stream.launch(lambda: where.append(threading.current_thread().name))
    assert where == [threading.current_thread().name]
    assert ep.get_device("cpu").create_event().query_done()


@pytest.mark.parametrize("spec", ["cpu", *ASYNC_DEVICES])
def test_a_never_recorded_event_is_done(spec: str) -> None:
    event = ep.get_device(spec).create_event()
    assert event.query_done()
    event.sync()  # returns at once


@pytest.mark.parametrize("spec", ASYNC_DEVICES)
def test_event_is_done_only_after_the_recorded_work(spec: str) -> None:
    (stream,) = make_streams(spec, "compute")
    event, gate = ep.get_device(spec).create_event(), threading.Event()
    stream.launch(gate.wait, 10)
    stream.record_event(event)
    time.sleep(0.01)
    assert not event.query_done()
    gate.set()
    event.sync()
    assert event.query_done()


def test_a_stream_whose_worker_is_gone_says_so_and_an_event_names_its_stream() -> None:
    """Hang reports read ``busy()``: a worker that left with tasks queued (never expected) is named, not "idle";
    an event remembers the stream it was last recorded on."""
    (stream,) = make_streams("mock:0", "gone")
    event = ep.get_device("mock:0").create_event()
    assert stream.busy() is None and event.recorded_on is None
    stream._queue.put(None)   # the worker's stop sentinel, without the stream being closed: the worker leaves
    stream.thread.join(10)
    stream.record_event(event)
    assert event.recorded_on is stream and not event.query_done()
    name, _ = stream.busy()
    assert "worker thread is gone, 1 task(s) still queued" in name
    stream.destroyed = True   # (so the test's cleanup does not wait for it)


@pytest.mark.parametrize("spec", ASYNC_DEVICES)
def test_recording_again_replaces_what_the_event_stands_for(spec: str) -> None:
    fast, slow = make_streams(spec, "fast", "slow")
    event, gate = ep.get_device(spec).create_event(), threading.Event()
    fast.record_event(event)
    event.sync()
    assert event.query_done()
    slow.launch(gate.wait, 10)
    slow.record_event(event)
    assert not event.query_done()
    gate.set()
    event.sync()
    assert event.query_done()


@pytest.mark.parametrize("spec", ASYNC_DEVICES)
def test_wait_event_waits_for_the_record_seen_when_it_was_called(spec: str) -> None:
    producer, other, consumer = make_streams(spec, "producer", "other", "consumer")
    event, gate, order = ep.get_device(spec).create_event(), threading.Event(), []
    producer.launch(gate.wait, 10)
    producer.launch(order.append, "produced")
    producer.record_event(event)
    started = time.perf_counter()
    consumer.wait_event(event)
    assert time.perf_counter() - started < 1.0  # the host did not block
    other.record_event(event)  # a later record must not release the earlier wait
    consumer.launch(order.append, "consumed")
    other.sync()
    time.sleep(0.02)
    assert order == []
    gate.set()
    consumer.sync()
    assert order == ["produced", "consumed"]


def producer_consumer(spec: str, seed: int, max_delay: float, wait: bool) -> bool:
    """Producer: some work, then write 7s; consumer: copy the array out. Right answer?"""
    producer, consumer = make_streams(spec, "producer", "consumer", max_delay=max_delay, seed=seed)
    device = ep.get_device(spec)
    raw = device.alloc(64 * 8)
    data = device.as_array(raw, 0, (64,), np.float64)
    out = np.full(64, -1.0)
    producer.launch(lambda: np.sort(np.random.default_rng(seed).random(2000)), name="work")
    producer.launch(data.__setitem__, slice(None), 7.0, name="write")
    written = device.create_event()
    producer.record_event(written)
    if wait:
        consumer.wait_event(written)
    consumer.memcpy_d2h(out, data)
    consumer.sync()
    producer.sync()
    device.destroy_stream(producer)
    device.destroy_stream(consumer)
    device.free(raw)
    return bool((out == 7.0).all())


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(ASYNC_DEVICES), st.integers(0, 2**32 - 1), st.sampled_from([0.0, 0.0005, 0.002, 0.004]))
def test_producer_consumer_with_stream_wait_is_always_right(spec, seed, max_delay) -> None:
    assert producer_consumer(spec, seed, max_delay, wait=True)


@pytest.mark.parametrize("spec", ASYNC_DEVICES)
def test_producer_consumer_without_stream_wait_goes_wrong(spec: str) -> None:
    results = [producer_consumer(spec, seed, 0.003, wait=False) for seed in range(20)]
    assert not all(results), "the emulation never exposed the missing wait_event"


@pytest.mark.parametrize("spec", ["cpu", *MEMORY_DEVICES[1:]])
def test_memcpy_round_trip(spec: str) -> None:
    device = ep.get_device(spec)
    (stream,) = [device.create_stream("copy")] if spec == "cpu" else make_streams(spec, "copy", max_delay=0.0005)
    a_raw, b_raw = device.alloc(80), device.alloc(80)
    a, b = device.as_array(a_raw, 0, (4, 5), np.float32), device.as_array(b_raw, 0, (4, 5), np.float32)
    host_in, host_out = np.arange(20, dtype=np.float32).reshape(4, 5), np.zeros((4, 5), np.float32)
    stream.memcpy_h2d(a, host_in)
    stream.memcpy_d2d(b, a)
    stream.memcpy_d2h(host_out, b)
    stream.sync()
    assert np.array_equal(host_out, host_in)
    with pytest.raises(ValueError, match="shapes and dtypes must match"):
        stream.memcpy_h2d(a, np.zeros((5, 4), np.float32))
    with pytest.raises(ValueError, match="shapes and dtypes must match"):
        stream.memcpy_d2h(np.zeros((4, 5), np.float64), b)


@pytest.mark.parametrize("spec", ["cpu", *ASYNC_DEVICES])
def test_task_errors_surface_at_sync_with_names_and_the_stream_keeps_working(spec: str) -> None:
    device = ep.get_device(spec)
    stream = device.create_stream("compute")
    seen: list[int] = []
    stream.launch(lambda: 1 / 0, name="divide")
    stream.launch(seen.append, 1)
    with pytest.raises(StreamExecutionError) as info:
        stream.sync()
    message = str(info.value)
    assert "'divide'" in message and f"'{Device(spec)}/compute'" in message and "ZeroDivisionError" in message
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert seen == [1]  # the task after the failure still ran
    stream.sync()  # the error was cleared
    stream.launch(seen.append, 2)
    stream.sync()
    assert seen == [1, 2]


@pytest.mark.parametrize("spec", ASYNC_DEVICES)
def test_several_failures_report_the_first_and_count_the_rest(spec: str) -> None:
    (stream,) = make_streams(spec, "compute")
    for name in ("first", "second", "third"):
        stream.launch(lambda: [][0], name=name)
    with pytest.raises(StreamExecutionError, match=r"'first'.*IndexError.*and 2 later failed task") as info:
        stream.sync()
    assert isinstance(info.value.__cause__, IndexError)


@pytest.mark.parametrize("spec", ASYNC_DEVICES)
def test_sync_from_inside_a_task_of_the_same_stream_is_an_error_not_a_hang(spec: str) -> None:
    (stream,) = make_streams(spec, "compute")
    stream.launch(stream.sync, name="inner_sync")
    with pytest.raises(StreamExecutionError, match="'inner_sync'") as info:
        stream.sync()
    assert "deadlock" in str(info.value.__cause__)


@pytest.mark.parametrize("spec", ["cpu", *ASYNC_DEVICES])
def test_destroy_stream_finishes_queued_work_then_refuses_more(spec: str) -> None:
    device = ep.get_device(spec)
    (stream,) = [device.create_stream("s")] if spec == "cpu" else make_streams(spec, "s", max_delay=0.0005)
    seen: list[int] = []
    for i in range(10):
        stream.launch(seen.append, i)
    device.destroy_stream(stream)
    assert seen == list(range(10))
    if spec != "cpu":
        assert not stream.thread.is_alive()
    with pytest.raises(StreamExecutionError, match="was destroyed"):
        stream.launch(seen.append, 99)


@pytest.mark.parametrize("spec", ["cpu", *ASYNC_DEVICES])
def test_destroy_stream_raises_the_pending_error(spec: str) -> None:
    device = ep.get_device(spec)
    stream = device.create_stream("s")
    stream.launch(lambda: 1 / 0, name="divide")
    with pytest.raises(StreamExecutionError, match="'divide'"):
        device.destroy_stream(stream)


def test_shutdown_joins_every_worker_thread() -> None:
    for spec in ("mock:0", "mock:1", "cuda:0") if not is_gpu() else ("mock:0", "mock:1"):
        for name in ("compute", "h2d", "d2h"):
            ep.get_device(spec).create_stream(name).launch(time.sleep, 0.005)
    stray = EmulatedDevice(Device("mock:1")).create_stream("unregistered")  # not in the registry
    assert len(ep_thread_names()) >= 7
    ep.shutdown()
    assert ep_thread_names() == []
    assert not stray.thread.is_alive()


def test_shutdown_reports_errors_after_closing_everything() -> None:
    failing, fine = make_streams("mock:0", "failing", "fine")
    failing.launch(lambda: 1 / 0, name="divide")
    fine.launch(time.sleep, 0.01)
    with pytest.raises(StreamExecutionError, match="'divide'"):
        ep.shutdown()
    assert ep_thread_names() == []


def test_emulation_settings_apply_inside_the_block_only() -> None:
    before = emulation_settings()
    with emulation(max_delay=0.001, seed=5) as inside:
        assert emulation_settings() == inside and (inside.max_delay, inside.seed) == (0.001, 5)
        stream = ep.get_device("mock:0").create_stream()
        with emulation(seed=6):
            assert (emulation_settings().max_delay, emulation_settings().seed) == (0.001, 6)
        assert emulation_settings().seed == 5
    assert emulation_settings() == before
    assert (stream.settings.max_delay, stream.settings.seed) == (0.001, 5)
    for bad in (-1.0, float("inf"), "1"):
        with pytest.raises(ValueError, match="max_delay"):
            with emulation(max_delay=bad):
                pass


# --- the real GPU provider (pytest -m gpu, PYFLOW_CUDA=gpu) ---------------------------------------


@pytest.mark.gpu
def test_gpu_memory_views_and_copies() -> None:
    device = ep.get_device("cuda:0")
    stream = device.create_stream("compute")
    raw = device.alloc(4096)
    view = device.as_array(raw, 512, (16,), np.float64)
    host = np.arange(16, dtype=np.float64)
    stream.memcpy_h2d(view, host)
    whole, out = device.as_array(raw, 0, (4096,), np.uint8), np.zeros(4096, np.uint8)
    stream.memcpy_d2h(out, whole)
    stream.sync()
    assert out[512 : 512 + 128].tobytes() == host.tobytes()
    device.free(raw)
    with pytest.raises(DoubleFreeError):
        device.free(raw)


@pytest.mark.gpu
def test_gpu_out_of_memory_is_a_memory_error() -> None:
    with pytest.raises(MemoryError):
        ep.get_device("cuda:0").alloc(1 << 50)


@pytest.mark.gpu
def test_gpu_events_follow_cuda_semantics() -> None:
    device = ep.get_device("cuda:0")
    producer, consumer = device.create_stream("producer"), device.create_stream("consumer")
    event = device.create_event()
    assert event.query_done()
    producer.record_event(event)
    consumer.wait_event(event)
    consumer.sync()
    assert event.query_done()


@pytest.mark.gpu
def test_gpu_task_errors_surface_at_sync() -> None:
    stream = ep.get_device("cuda:0").create_stream("compute")
    stream.launch(lambda: 1 / 0, name="divide")
    with pytest.raises(StreamExecutionError, match="'divide'"):
        stream.sync()


def test_inline_emulated_stream_runs_work_on_the_caller_and_keeps_errors_for_sync():
    device = ep.get_device("mock:0")
    stream = device.create_stream("inline", inline=True)
    ran_on = []
    stream.launch(lambda: ran_on.append(threading.current_thread()))
    assert ran_on == [threading.current_thread()]
    assert not any(t.name.endswith("-inline") for t in threading.enumerate())
    event = device.create_event()
    stream.record_event(event)
    assert event.query_done()
    stream.launch(lambda: 1 / 0, name="divide")
    with pytest.raises(StreamExecutionError, match="divide"):
        stream.sync()
    stream.sync()  # the error was reported once
    device.destroy_stream(stream)


def test_emulation_blocks_overlapping_on_threads_take_away_only_their_own_settings():
    """Ranks of one process may each open an ``emulation`` block: closed in the order they were opened, the
    last used to bring back the first one's delay for the rest of the process."""
    base = emulation_settings()
    delays = [0.001, 0.002, 0.003]
    entered = [threading.Event() for _ in delays]
    leave = [threading.Event() for _ in delays]

    def block(i):
        with emulation(max_delay=delays[i], seed=i):
            entered[i].set()
            leave[i].wait(10)

    threads = [threading.Thread(target=block, args=(i,), name=f"test-emulation-{i}") for i in range(len(delays))]
    for thread, event in zip(threads, entered):
        thread.start()
        assert event.wait(10)
    assert emulation_settings().max_delay == delays[-1] and emulation_settings().seed == 2
    leave[0].set()
    threads[0].join(10)
    assert emulation_settings().max_delay == delays[-1]
    for thread, event in zip(threads[1:], leave[1:]):
        event.set()
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    assert emulation_settings() == base
    with emulation(seed=5):   # a block that sets only the seed keeps the delay in force
        assert emulation_settings() == type(base)(max_delay=base.max_delay, seed=5)
