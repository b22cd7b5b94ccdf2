"""Specification of the eager VirtualMachine with the framework (seed 002): out of
memory, errors at sync points, hang detection, back pressure, ReleaseTensor,
step-through mode, and threads across shutdown and restart.

Every test starts and ends with ``flow.vm.shutdown()``, so each one gets a fresh VM
(settings such as allocator capacity, ``hang_timeout`` or the water marks never leak
into the next test).  Tensors under "cuda" stay tiny: kernels run in the simulator.
"""

from __future__ import annotations

import gc
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import pyflow as flow
from pyflow.device import StreamType
from pyflow.errors import OpError, OutOfMemoryError, SlowInstructionWarning, VMHangError
from pyflow.framework.interpreter import apply
from pyflow.framework.op_registry import OP_REGISTRY, OpDef, TensorMeta, get_op
from pyflow.vm.stream import VmStream

ROOT = pathlib.Path(__file__).resolve().parents[1]
KiB = 1024


@pytest.fixture(autouse=True)
def fresh_vm():
    flow.vm.shutdown()
    yield
    flow.vm.shutdown()


def compute_allocator(device: str):
    return flow.vm.get_vm().allocator(flow.device(device), StreamType.compute)


def in_use(device: str = "cpu") -> int:
    return compute_allocator(device).stats().in_use


def root_cause(error: BaseException) -> BaseException:
    while error.__cause__ is not None:
        error = error.__cause__
    return error


@pytest.fixture
def custom_op(monkeypatch):
    """register(name, launch): an op with one output shaped like its first input."""
    get_op("relu")  # load the real ops first

    def register(name: str, launch):
        def infer(inputs, attrs):
            return [TensorMeta(inputs[0].shape, inputs[0].dtype)]

        monkeypatch.setitem(OP_REGISTRY, name, OpDef(name, infer, kernel="", launch=launch))
        return lambda *inputs: apply(name, list(inputs))[0]

    return register


# --- out of memory -------------------------------------------------------------------------


@pytest.mark.parametrize("sync_point", ["numpy", "sync"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_op_whose_output_cannot_fit_raises_op_error_caused_by_out_of_memory(device, sync_point) -> None:
    compute_allocator(device).capacity = 4 * KiB
    a, b = flow.ones(40, 1, device=device), flow.ones(1, 40, device=device)
    c = flow.matmul(a, b)  # 6,400 bytes: cannot fit in 4 KiB
    with pytest.raises(OpError) as info:
        c.numpy() if sync_point == "numpy" else flow.sync()
    error = info.value
    assert error.op == "matmul" and "matmul" in str(error)
    assert isinstance(error.__cause__, OutOfMemoryError)
    assert error.__cause__.request == 40 * 40 * 4
    assert error.__cause__.stats is not None and "capacity" in str(error)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_vm_works_again_after_out_of_memory(device) -> None:
    vm = flow.vm.get_vm()
    compute_allocator(device).capacity = 4 * KiB
    a, b = flow.ones(40, 1, device=device), flow.ones(1, 40, device=device)
    with pytest.raises(OpError):
        flow.matmul(a, b).numpy()
    x = flow.tensor([1.0, -2.0, 3.0], device=device)
    assert (flow.relu(x) + 1).numpy().tolist() == [2.0, 1.0, 4.0]  # ops that fit still work
    assert flow.matmul(a[:2], b[:, :3] * 3).numpy().tolist() == [[3.0] * 3] * 2
    flow.sync()  # nothing left over to report
    assert flow.vm.get_vm() is vm  # the same VM kept working (it was not replaced)


def test_op_that_failed_for_memory_succeeds_once_the_capacity_allows_it() -> None:
    allocator = compute_allocator("cpu")
    allocator.capacity = 4 * KiB
    a, b = flow.ones(40, 1), flow.ones(1, 40)
    with pytest.raises(OpError):
        flow.matmul(a, b).numpy()
    allocator.capacity = None
    np.testing.assert_array_equal(flow.matmul(a, b).numpy(), np.ones((40, 40), np.float32))


def test_cached_blocks_are_returned_when_only_the_cache_is_in_the_way() -> None:
    allocator = compute_allocator("cpu")
    allocator.capacity = 256 * KiB
    parts = [flow.ones(16 * KiB) for _ in range(3)]  # 3 x 64 KiB, one block each under the cap
    flow.sync()
    del parts
    gc.collect()
    flow.sync()
    before = allocator.stats()
    assert before.in_use < 8 * KiB and before.cached >= 3 * 64 * KiB  # all of it is cache now
    big = flow.full((50 * KiB,), 2.0)  # 200 KiB: fits only once the cached blocks are gone
    np.testing.assert_array_equal(big.numpy(), np.full(50 * KiB, 2.0, np.float32))
    after = allocator.stats()
    assert after.num_backing_frees > before.num_backing_frees  # a cached block was released
    assert after.reserved <= 256 * KiB


def test_out_of_memory_waits_for_running_releases_then_retries() -> None:
    # The memory a new op needs is held by a tensor whose ReleaseTensor is queued on the
    # worker behind a slow instruction.  Preparing the op runs out of memory; the VM's
    # handler must wait for the device's running instructions (the release among them),
    # return the cached block and retry, and the op then succeeds.
    allocator = compute_allocator("cpu")
    allocator.capacity = 128 * KiB
    small = flow.ones(4)
    big = flow.ones(25_000)  # 100,000 bytes
    flow.sync()
    frees_before = allocator.stats().num_backing_frees
    flow.vm.run(lambda b: b.access_blob_by_callback(small._blob, lambda stream, blob: time.sleep(0.3), "const",
                                                    name="slow_callback"))
    del big
    gc.collect()  # its storage is queued; the next op issues its ReleaseTensor first
    fresh = flow.zeros(27_500)  # 110,000 bytes: fits only once big's block went back
    np.testing.assert_array_equal(fresh.numpy(), np.zeros(27_500, np.float32))
    assert allocator.stats().num_backing_frees > frees_before


# --- errors -------------------------------------------------------------------------------------


def _boom(kernel, outputs, inputs, attrs, stream):
    raise ValueError("boom")


def test_failing_op_does_not_raise_at_the_call(custom_op) -> None:
    fail = custom_op("vm_test_fail", _boom)
    fail(flow.ones(3))  # asynchronous: the kernel has not even run necessarily
    with pytest.raises(OpError):
        flow.sync()


@pytest.mark.parametrize("sync_point", ["sync", "numpy_of_output", "numpy_of_a_result_computed_from_it"])
def test_failing_op_error_surfaces_where_its_output_is_read_or_at_sync_naming_the_op(custom_op, sync_point) -> None:
    fail = custom_op("vm_test_fail", _boom)
    x = flow.ones(3)
    y = fail(x)
    z = flow.relu(y) * 2
    with pytest.raises(OpError) as info:
        {"sync": flow.sync, "numpy_of_output": y.numpy, "numpy_of_a_result_computed_from_it": z.numpy}[sync_point]()
    assert info.value.op == "vm_test_fail" and "vm_test_fail" in str(info.value)
    cause = root_cause(info.value)
    assert isinstance(cause, ValueError) and str(cause) == "boom"


def test_reading_an_unrelated_tensor_does_not_raise_another_ops_error(custom_op) -> None:
    fail = custom_op("vm_test_fail", _boom)
    x = flow.ones(3)
    other = x + 1
    fail(x)
    np.testing.assert_array_equal(other.numpy(), [2.0, 2.0, 2.0])
    with pytest.raises(OpError, match="vm_test_fail"):  # still pending for this thread: sync reports it
        flow.sync()


def test_failing_op_error_is_raised_once(custom_op) -> None:
    fail = custom_op("vm_test_fail", _boom)
    fail(flow.ones(3))
    with pytest.raises(OpError):
        flow.sync()
    flow.sync()  # already reported
    assert flow.ones(2).numpy().tolist() == [1.0, 1.0]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_ops_after_a_failure_still_give_right_answers(custom_op, device) -> None:
    fail = custom_op("vm_test_fail", _boom)
    vm = flow.vm.get_vm()
    x = flow.tensor([1.0, -2.0, 3.0], device=device)
    fail(x)
    issued_before_the_sync = x * 2
    with pytest.raises(OpError):
        flow.sync()
    assert issued_before_the_sync.numpy().tolist() == [2.0, -4.0, 6.0]
    assert (flow.relu(x) * 2 + 1).numpy().tolist() == [3.0, 1.0, 7.0]
    assert (x * x).sum().item() == 14.0
    assert flow.vm.get_vm() is vm  # the same VM kept working (it was not replaced)


# --- hang detection -------------------------------------------------------------------------------


def _block_cpu_worker(release: threading.Event):
    """Issue an instruction whose callback waits for ``release`` (at most 30 s): it is running."""
    t = flow.ones(3)
    flow.vm.run(lambda b: b.access_blob_by_callback(t._blob, lambda stream, blob: release.wait(30), "const",
                                                    name="blocked_callback"))
    return t


class _EventThatNeverCompletes:
    """An ep event whose device work never finishes, while no stream is doing anything: a real hang."""

    def __init__(self):
        self.completed = False

    def query_done(self) -> bool:
        return self.completed

    def sync(self) -> None:
        while not self.completed:
            time.sleep(0.01)


def _issue_stuck_instruction(event) -> None:
    from pyflow.vm.policies import InstructionPolicy

    class Stuck(InstructionPolicy):
        name = "stuck_on_its_event"

        def compute(self, instruction):
            instruction.event = event  # launched, but "done" waits for an event nothing will record

    stream = flow.device("cpu")
    flow.vm.run(lambda b: b._append(flow.Stream.new(stream, StreamType.compute), Stuck()))


def test_work_that_is_running_is_never_reported_as_a_hang() -> None:
    vm = flow.vm.get_vm()
    vm.hang_timeout = 0.3
    release = threading.Event()
    timer = threading.Timer(1.5, release.set)  # a slow instruction: five hang timeouts long
    try:
        _block_cpu_worker(release)
        timer.start()
        with pytest.warns(SlowInstructionWarning, match=r"blocked_callback #\d+ has been running on worker "
                                                         r"pyflow-vm-worker-cpu-0 for \d+ s"):
            flow.sync()  # returns: it waited, warned once, and never raised VMHangError
        assert release.is_set()
    finally:
        release.set()
        timer.cancel()


def test_hang_detector_names_the_blocked_instruction_and_for_how_long() -> None:
    vm = flow.vm.get_vm()
    vm.hang_timeout = 0.5
    event = _EventThatNeverCompletes()
    try:
        _issue_stuck_instruction(event)
        start = time.monotonic()
        with pytest.raises(VMHangError) as info:
            flow.sync()
        assert time.monotonic() - start < 5.0
        message = str(info.value)
        assert "nothing is running" in message
        assert re.search(r"stuck_on_its_event #\d+ on cpu:0/compute: launched, waiting for its device event.*"
                         r"\(for \d+\.\d s\)", message), message
        assert re.search(r"global_sync #\d+ .*waiting for every earlier .*the oldest is <stuck_on_its_event", message), message
    finally:
        event.completed = True


def test_vm_recovers_after_a_hang_once_the_blocked_instruction_finishes() -> None:
    vm = flow.vm.get_vm()
    timeout, vm.hang_timeout = vm.hang_timeout, 0.5
    event = _EventThatNeverCompletes()
    try:
        t = flow.ones(3)
        _issue_stuck_instruction(event)
        with pytest.raises(VMHangError):
            flow.sync()
    finally:
        event.completed = True
        vm.hang_timeout = timeout
    flow.sync()
    assert (t * 3).numpy().tolist() == [3.0, 3.0, 3.0]
    flow.sync()
    assert flow.vm.get_vm() is vm  # the same VM recovered (it was not replaced)


def test_a_wait_on_a_vm_thread_is_refused_at_once_instead_of_hanging() -> None:
    t = flow.ones(3)
    box = {}

    def callback(stream, blob):
        try:
            flow.ones(2).numpy()  # waits for the VM from inside one of its instructions
        except VMHangError as error:
            box["error"] = error

    flow.vm.run(lambda b: b.access_blob_by_callback(t._blob, callback, "const", name="reentrant_read"))
    flow.sync()
    assert "VM's own thread" in str(box["error"]) and "pyflow-vm-worker" in str(box["error"])


# --- back pressure --------------------------------------------------------------------------------


def test_back_pressure_bounds_instructions_in_flight(monkeypatch) -> None:
    vm = flow.vm.get_vm()
    vm.high_water, vm.low_water = 20, 10
    engine = vm.engine
    after_receive, batch_sizes, before_release = [], [], []
    receive = engine.receive

    def observed_receive(instructions):  # the peak is right after a receive
        instructions = list(instructions)
        receive(instructions)
        batch_sizes.append(len(instructions))
        after_receive.append(engine.in_flight())

    class Tracer:
        def on_release(self, instruction):
            before_release.append(engine.in_flight() + instruction.count)

    monkeypatch.setattr(engine, "receive", observed_receive)
    vm.tracers.append(Tracer())
    x = flow.zeros(4)
    gate = threading.Event()  # hold the worker so the caller runs ahead
    flow.vm.run(lambda b: b.access_blob_by_callback(x._blob, lambda stream, blob: gate.wait(10), "const",
                                                    name="gate"))
    timer = threading.Timer(0.3, gate.set)
    timer.start()
    try:
        for _ in range(150):
            x = x + 1
        assert x.numpy().tolist() == [150.0] * 4  # everything completes
    finally:
        gate.set()
        timer.cancel()
    bound = vm.high_water + max(batch_sizes)
    assert max(after_receive) <= bound, f"{max(after_receive)} instructions in flight (bound {bound})"
    assert max(before_release) <= bound


def test_caller_blocked_by_back_pressure_resumes_when_in_flight_drops() -> None:
    # With water marks 20/10 a chain of 200 small ops blocks the caller ~40 times.
    # Woken by the releases, the chain takes a few tens of milliseconds; woken only
    # by the scheduler's 50 ms idle poll, it takes about 2 s.  1 s leaves ample slack.
    vm = flow.vm.get_vm()
    vm.high_water, vm.low_water = 20, 10
    x = flow.zeros(4)
    flow.sync()
    start = time.perf_counter()
    for _ in range(200):
        x = x + 1
    assert x.numpy().tolist() == [200.0] * 4
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"200 ops under back pressure took {elapsed:.2f} s"


# --- ReleaseTensor -------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_deleting_tensors_returns_their_memory(device) -> None:
    flow.sync()
    baseline = in_use(device)
    x = flow.ones(1000, device=device)
    y = flow.relu(x) + 1
    flow.sync()
    assert in_use(device) >= baseline + 2 * 4000
    del x, y
    gc.collect()
    flow.sync()
    assert in_use(device) == baseline


def peek(t) -> np.ndarray:
    """t's values, read by a callback that holds no reference to ``t`` (unlike ``numpy()``:
    see test_tensor_read_by_numpy_is_freed_once_deleted)."""
    box, done = {}, threading.Event()

    def read(stream, blob):
        box["value"] = np.array(blob.array(), copy=True)
        done.set()

    flow.vm.run(lambda b: b.access_blob_by_callback(t._blob, read, "const", name="peek"))
    flow.vm.get_vm().wait_until(done.is_set, "peek")
    return box["value"]


def test_views_keep_memory_until_the_last_view_dies() -> None:
    flow.sync()
    baseline = in_use()
    x = flow.tensor(np.arange(1000, dtype=np.float32).reshape(100, 10))
    row_block, transposed = x[10:20], x.T
    flow.sync()
    held = in_use()
    assert held >= baseline + 4000
    del x
    gc.collect()
    flow.sync()
    assert in_use() == held
    np.testing.assert_array_equal(peek(row_block), np.arange(100, 200, dtype=np.float32).reshape(10, 10))
    del row_block
    gc.collect()
    flow.sync()
    assert in_use() == held
    assert transposed.shape == (10, 100) and peek(transposed)[3, 7] == 73.0
    del transposed
    gc.collect()
    flow.sync()
    assert in_use() == baseline


def test_tensor_read_by_numpy_is_freed_once_deleted() -> None:
    flow.sync()
    baseline = in_use()
    x = flow.ones(1000)
    assert x.numpy().sum() == 1000.0
    del x
    gc.collect()
    flow.sync()
    assert in_use() == baseline, "the tensor's memory is still held after it was deleted and synced"


# --- step-through mode ----------------------------------------------------------------------------------


def _times_three(kernel, outputs, inputs, attrs, stream):
    """A custom op's launch: out = 3 * in (numpy on the CPU, a simulated device array on cuda)."""
    if isinstance(outputs[0], np.ndarray):
        outputs[0][...] = inputs[0] * 3
    else:
        outputs[0].copy_to_device(inputs[0].copy_to_host() * 3)


def _workload(device: str, scale):
    x = flow.tensor(np.linspace(-2.0, 2.0, 12, dtype=np.float32).reshape(3, 4), device=device)
    y = flow.softmax(flow.matmul(x, x.T) * 0.5, dim=1) + flow.relu(x).sum()
    return scale(y).numpy()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_step_through_mode_runs_every_instruction_on_the_callers_thread(custom_op, monkeypatch, device) -> None:
    seen = []
    run = VmStream.run

    def recording_run(stream, instruction):
        seen.append((instruction.name, threading.current_thread()))
        run(stream, instruction)

    def scale_launch(*args):
        seen.append(("scale kernel", threading.current_thread()))
        _times_three(*args)

    scale = custom_op("vm_test_scale", scale_launch)
    flow.sync()
    monkeypatch.setattr(VmStream, "run", recording_run)
    with flow.vm.sync_mode():
        seen.clear()
        _workload(device, scale)
        flow.sync()
    names = {name for name, _ in seen}
    assert "scale kernel" in names and "matmul" in names and "numpy" in names
    assert {thread for _, thread in seen} == {threading.current_thread()}, seen


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_step_through_mode_gives_the_same_results_as_threaded_mode(custom_op, device) -> None:
    scale = custom_op("vm_test_scale", _times_three)
    threaded = _workload(device, scale)
    with flow.vm.sync_mode():
        stepped = _workload(device, scale)
    np.testing.assert_array_equal(stepped, threaded)


# --- waiting ----------------------------------------------------------------------------------------------


def test_numpy_returns_as_soon_as_its_value_is_ready() -> None:
    # A caller waiting for its callback must be woken when the instruction finishes,
    # not by the 50 ms idle poll.  100 reads of a ready 4-element tensor take well
    # under a millisecond each when they are woken; 0.5 s leaves ample slack.
    x = flow.ones(4)
    flow.sync()
    start = time.perf_counter()
    for _ in range(100):
        x.numpy()
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5, f"100 numpy() calls took {elapsed:.2f} s"


# --- threads across shutdown and restart (in a subprocess) ---------------------------------------------------


def _run_script(source: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYFLOW_VM_SYNC", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_no_thread_outlives_shutdown_and_restart() -> None:
    result = _run_script("""
        import threading
        import pyflow as flow

        def others():
            return sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())

        x = flow.tensor([1.0, -2.0, 3.0])
        assert (flow.relu(x) + 1).numpy().tolist() == [2.0, 1.0, 4.0]
        c = flow.tensor([1.0, 2.0], device="cuda")
        assert (c * 2).numpy().tolist() == [2.0, 4.0]
        first = flow.vm.get_vm()
        print("running:", others())
        flow.vm.shutdown()
        print("after shutdown 1:", others())
        y = flow.tensor([5.0, 6.0])
        assert (y - 1).numpy().tolist() == [4.0, 5.0]
        assert (flow.tensor([3.0], device="cuda") + 1).numpy().tolist() == [4.0]
        assert flow.vm.get_vm() is not first
        print("running again:", others())
        flow.vm.shutdown()
        print("after shutdown 2:", others())
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "after shutdown 1: []" in lines and "after shutdown 2: []" in lines, result.stdout
    running = [line for line in lines if line.startswith("running")]
    assert len(running) == 2 and all("pyflow-vm-scheduler" in line for line in running), result.stdout


def test_interpreter_exits_cleanly_without_explicit_shutdown() -> None:
    # An atexit handler registered before pyflow's runs after it (LIFO): by then no
    # thread but the main one may be left, and the work still in flight has run.
    result = _run_script("""
        import atexit, threading, time

        def report():
            others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
            print("threads at exit:", others, flush=True)

        atexit.register(report)
        import pyflow as flow

        x = flow.tensor([1.0, 2.0])
        assert (x + 1).numpy().tolist() == [2.0, 3.0]
        c = flow.tensor([1.0], device="cuda") * 2
        def late(stream, blob):
            time.sleep(0.2)
            print("in-flight callback ran", flush=True)
        flow.vm.run(lambda b: b.access_blob_by_callback(x._blob, late, "const"))
        print("leaving", flush=True)
    """, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "Exception" not in result.stderr, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "leaving" and "in-flight callback ran" in lines, result.stdout
    assert lines[-1] == "threads at exit: []", result.stdout
