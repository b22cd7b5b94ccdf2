"""Fault injection: pyflow's failure semantics, one regression test per reported fault.

The rules (README "When an op fails", ``pyflow/vm/failure.py``):

* an op's error belongs to the op and its outputs: reading them, or anything
  computed from them, raises that ``OpError`` (naming the op and the user's line)
  on every read; unrelated tensors and other threads never see it;
* ``flow.sync()`` raises every failure the calling thread issued and nobody has
  seen, all at once; at exit, unseen failures are printed and the status is 1;
* fusion never changes failure; running work is never reported as a hang; a VM
  thread's unexpected error is raised at the next call, naming the thread;
* Ctrl-C reaches the user promptly and never leaves the VM wedged or leaking.

Each test starts with a fresh VM.  Failures are injected with throwaway ops whose
kernel raises or sleeps, with a small allocator capacity (out of memory), with
the engine's ``interrupt_hook`` (an exception at a safe point of the schedule
round) and with real SIGINTs (``_thread.interrupt_main``).  The segfault cases run
in a subprocess.  Cocktailer's faults are in ``test_cocktailer_faults.py``.
"""

from __future__ import annotations

import _thread
import gc
import random
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.device import StreamType, ep
from pyflow.errors import OpError, OutOfMemoryError, ShapeError, VMThreadError
from pyflow.framework.interpreter import apply
from pyflow.framework.op_registry import OP_REGISTRY, OpDef, TensorMeta, get_op

KiB = 1024


@pytest.fixture(autouse=True)
def fresh_vm():
    flow.vm.shutdown()
    yield
    vm = flow.vm.get_vm()
    vm.engine.interrupt_hook = None
    flow.vm.shutdown()


def _same_shape(inputs, attrs):
    return [TensorMeta(inputs[0].shape, inputs[0].dtype)]


def _boom(kernel, outputs, inputs, attrs, stream):
    raise ValueError("injected kernel failure")


def _slow(kernel, outputs, inputs, attrs, stream):
    time.sleep(attrs.get("seconds", 0.5))
    outputs[0][...] = inputs[0] if not hasattr(inputs[0], "copy_to_host") else 0


def _interrupt_main_then_spin(kernel, outputs, inputs, attrs, stream):
    _thread.interrupt_main()  # a Ctrl-C arrives while the kernel runs
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:  # the interrupt must stop us long before this
        time.sleep(0.001)


def _source_boom(kernel, outputs, inputs, attrs, stream):
    raise ValueError("injected source failure")


@pytest.fixture(autouse=True)
def fault_ops(monkeypatch):
    get_op("relu")  # load the real ops first
    ops = [OpDef("fault_boom", _same_shape, kernel="", launch=_boom),
           OpDef("fault_slow", _same_shape, kernel="", launch=_slow, kernel_attrs=("seconds",)),
           OpDef("fault_interrupt", _same_shape, kernel="", launch=_interrupt_main_then_spin),
           OpDef("fault_source", lambda inputs, attrs: [TensorMeta(tuple(attrs["shape"]), np.dtype(np.float32))],
                 kernel="", launch=_source_boom)]
    for op in ops:
        monkeypatch.setitem(OP_REGISTRY, op.name, op)


def boom(x):
    return apply("fault_boom", [x])[0]


def compute_allocator(device):
    return flow.vm.get_vm().allocator(flow.device(device), StreamType.compute)


def root_cause(error):
    while error.__cause__ is not None:
        error = error.__cause__
    return error


DEVICES = ["cpu", "cuda"]


# --- a failed op's outputs: raised on every read, and by everything computed from them -------------------


@pytest.mark.parametrize("device", DEVICES)
def test_a_failed_ops_outputs_raise_on_every_read_and_never_return_stale_memory(device):
    x = flow.tensor([1.0, -2.0, 3.0], device=device)
    y = boom(x)                                 # line A
    z = flow.relu(y) + 1                        # computed from a failed tensor
    total = (y * 0).sum()
    unrelated = x * 10
    for reader in (y.numpy, y.numpy, z.numpy, total.item, lambda: print(z)):
        with pytest.raises(OpError) as info:
            reader()
        assert info.value.op == "fault_boom"
        assert isinstance(root_cause(info.value), ValueError)
    np.testing.assert_array_equal(unrelated.numpy(), [10.0, -20.0, 30.0])
    churn = [flow.full((3,), 5.0, device=device) for _ in range(20)]  # reuse freed memory
    with pytest.raises(OpError):
        y.numpy()                               # still failed, never the reused bytes
    del churn
    flow.sync()                                 # the failure was seen by the reads: nothing pending


@pytest.mark.parametrize("device", DEVICES)
def test_the_error_names_the_op_and_the_python_line_that_issued_it(device):
    x = flow.ones(2, device=device)
    y = apply("fault_boom", [x])[0]; line = sys._getframe().f_lineno  # noqa: E702 - the line to name
    with pytest.raises(OpError) as info:
        y.numpy()
    message = str(info.value)
    assert f"test_faults.py:{line}" in message and 'y = apply("fault_boom", [x])[0]' in message
    assert "fault_boom" in message and "injected kernel failure" in message


def _write(target, value: float) -> None:
    """An op (cpu) that writes ``value`` into ``target`` and reads nothing."""
    def run(outputs, inputs, native_stream):
        outputs[0][...] = value

    flow.vm.run(lambda b: b.call("write", run, [], [target._blob], flow.device.default_stream(target.device)))


def test_a_full_rewrite_makes_a_failed_tensor_healthy_again_but_a_partial_one_does_not():
    y = boom(flow.ones(4))
    with pytest.raises(OpError):
        y.numpy()
    _write(y[0:2], 1.0)
    with pytest.raises(OpError):
        y.numpy()  # elements 2 and 3 are still the failed op's
    _write(y, 3.0)
    np.testing.assert_array_equal(y.numpy(), [3.0] * 4)
    flow.sync()  # the failure was reported by the first read


# --- fusion never changes failure ------------------------------------------------------------------------


def _issue_fused(*calls):
    """Issue ``calls`` while the scheduler is held, so they reach it in one window (and fuse)."""
    vm = flow.vm.get_vm()
    flow.ones(1).numpy()  # the scheduler thread exists and is idle
    fused_before = vm.engine.fused
    with vm._schedule_lock:
        results = [call() for call in calls]
    vm._notifier.notify()
    vm.wait_until(lambda: not vm.engine._pending, "the scheduler took the calls")
    return results, vm.engine.fused - fused_before


@pytest.mark.parametrize("device", DEVICES)
def test_a_failing_member_of_a_fused_instruction_fails_alone_and_names_itself(device):
    (bad, good), fused = _issue_fused(lambda: apply("fault_source", [], shape=(3,), device=device)[0],
                                      lambda: flow.full((3,), 7.0, device=device))
    assert fused >= 1, "the two source ops did not fuse: the test would prove nothing"
    np.testing.assert_array_equal(good.numpy(), [7.0, 7.0, 7.0])
    with pytest.raises(OpError) as info:
        bad.numpy()
    assert info.value.op == "fault_source" and "fuse[" not in str(info.value)


@pytest.mark.parametrize("device", DEVICES)
def test_an_out_of_memory_member_of_a_fused_instruction_fails_alone(device):
    compute_allocator(device).capacity = 64 * KiB
    (bad, good), fused = _issue_fused(lambda: flow.zeros(64 * KiB, device=device),  # 256 KiB: cannot fit
                                      lambda: flow.full((3,), 7.0, device=device))
    assert fused >= 1
    np.testing.assert_array_equal(good.numpy(), [7.0, 7.0, 7.0])
    with pytest.raises(OpError) as info:
        bad.numpy()
    assert info.value.op == "fill" and isinstance(root_cause(info.value), OutOfMemoryError)


# --- errors never travel -----------------------------------------------------------------------------------


def test_unrelated_reads_never_raise_and_sync_reports_every_failure_of_this_thread_once():
    x = flow.ones(3)
    first, second = boom(x), boom(x * 2)
    healthy = x + 1
    np.testing.assert_array_equal(healthy.numpy(), [2.0] * 3)  # not the failures' business
    with pytest.raises(OpError) as info:
        flow.sync()
    assert len(info.value.others) == 1, "the second failure was dropped"
    assert "and 1 more failed op" in str(info.value)
    flow.sync()  # both were reported: nothing is raised twice
    del first, second


@pytest.mark.parametrize("device", DEVICES)
def test_one_threads_failures_are_never_raised_in_another_thread(device):
    compute_allocator(device).capacity = 256 * KiB
    stop, seen_in_a, raised_in_b = threading.Event(), [], []

    def thread_a():  # healthy work, synced again and again
        while not stop.is_set():
            try:
                t = flow.full((4,), 2.0, device=device)
                assert (t * 3).numpy().tolist() == [6.0] * 4
                flow.sync()
            except Exception as error:  # noqa: BLE001 - collected and asserted below
                seen_in_a.append(error)

    def thread_b():  # failing ops and out-of-memory ops, then its own sync
        for _ in range(5):
            boom(flow.ones(2, device=device))
            flow.zeros(128 * KiB, device=device)  # 512 KiB: out of memory
        try:
            flow.sync()
        except OpError as error:
            raised_in_b.append(error)

    a = threading.Thread(target=thread_a)
    a.start()
    b = threading.Thread(target=thread_b)
    b.start()
    b.join(60)
    stop.set()
    a.join(60)
    assert not seen_in_a, f"thread A saw thread B's errors: {seen_in_a[:2]}"
    assert len(raised_in_b) == 1 and 1 + len(raised_in_b[0].others) == 10


# --- hangs: running work is not a hang; a dead-ended wait is named --------------------------------------------


def test_a_slow_valid_op_is_not_reported_as_a_hang():
    vm = flow.vm.get_vm()
    vm.hang_timeout = 0.2
    x = flow.ones(3)
    y = apply("fault_slow", [x], seconds=1.0)[0]
    with pytest.warns(flow.errors.SlowInstructionWarning, match=r"fault_slow #\d+ has been running"):
        np.testing.assert_array_equal(y.numpy(), [1.0] * 3)


# --- supervised threads --------------------------------------------------------------------------------------


def test_an_exception_in_the_scheduler_thread_is_raised_at_the_next_call_naming_it(monkeypatch):
    vm = flow.vm.get_vm()
    flow.ones(1).numpy()  # the scheduler runs
    engine = vm.engine
    original, calls = engine._handle_pending, []

    def broken_once():
        if not calls:
            calls.append(1)
            raise RuntimeError("injected scheduler bug")
        return original()

    monkeypatch.setattr(engine, "_handle_pending", broken_once)
    x = flow.tensor([1.0, 2.0])
    start = time.monotonic()
    with pytest.raises(VMThreadError) as info:
        for _ in range(100):
            (x + 1).numpy()
    assert time.monotonic() - start < 5.0, "reported only after a hang timeout"
    assert info.value.thread == "pyflow-vm-scheduler" and "injected scheduler bug" in str(info.value)
    np.testing.assert_array_equal((x + 1).numpy(), [2.0, 3.0])  # and it keeps working


def test_an_exception_in_a_worker_thread_is_raised_at_the_next_call_naming_it():
    vm = flow.vm.get_vm()
    flow.ones(1).numpy()
    ctx = next(c for c in vm._thread_ctxs.values() if c.thread is not None)
    original, calls = ctx._on_launched, []

    def broken_once(instruction, wake_scheduler=True):
        if not calls:
            calls.append(1)
            raise RuntimeError("injected worker bug")
        return original(instruction, wake_scheduler)

    ctx._on_launched = broken_once
    with pytest.raises(VMThreadError) as info:
        for _ in range(100):
            flow.ones(2).numpy()
    assert info.value.thread == ctx.thread.name and "injected worker bug" in str(info.value)
    np.testing.assert_array_equal((flow.ones(2) * 4).numpy(), [4.0, 4.0])


# --- interrupts ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_ctrl_c_during_a_kernel_in_step_through_mode_reaches_the_user_at_once(device):
    baseline = compute_allocator(device).stats().in_use
    with flow.vm.sync_mode():
        x = flow.ones(3, device=device)
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            y = apply("fault_interrupt", [x])[0]
        assert time.monotonic() - start < 2.0, "the interrupt was held back"
        np.testing.assert_array_equal((x + 1).numpy(), [2.0] * 3)  # the next op works
    flow.sync()  # the interrupted op's failure was the interrupt itself: nothing else pending
    del x
    gc.collect()
    flow.sync()
    assert compute_allocator(device).stats().in_use == baseline
    assert "y" not in locals()


def test_ctrl_c_while_waiting_in_threaded_mode_reaches_the_user_and_the_value_is_intact():
    x = flow.ones(3)
    y = apply("fault_slow", [x], seconds=1.5)[0]
    timer = threading.Timer(0.2, _thread.interrupt_main)
    timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        y.numpy()
    assert time.monotonic() - start < 1.2
    np.testing.assert_array_equal(y.numpy(), [1.0] * 3)  # the op itself ran to the end
    flow.sync()


@settings(max_examples=15)
@given(step_through=st.booleans(), seed=st.integers(0, 2**16), where=st.integers(0, 60))
def test_exceptions_injected_at_any_safe_point_of_the_schedule_round_never_wedge_the_vm(step_through, seed,
                                                                                       where):
    flow.vm.shutdown()
    vm = flow.vm.get_vm()
    vm.hang_timeout = 10.0
    rng = random.Random(seed)
    points = []

    def hook(point):
        points.append(point)
        if len(points) == where:
            raise KeyboardInterrupt if step_through else RuntimeError("injected at " + point)

    with flow.vm.sync_mode(step_through):
        baseline = compute_allocator("cpu").stats().in_use
        values = {"a": np.arange(4, dtype=np.float32)}
        pool = {"a": flow.tensor(values["a"])}
        vm.engine.interrupt_hook = hook
        for step in range(12):
            name, src = f"t{step}", rng.choice(sorted(values))
            scale = rng.choice([2.0, -1.0, 0.5])
            try:
                pool[name] = pool[src] * scale
            except (KeyboardInterrupt, VMThreadError):
                continue  # the op was issued or not; either way its result is unknown to us
            values[name] = values[src] * scale
            if rng.random() < 0.3:
                try:
                    np.testing.assert_array_equal(pool[name].numpy(), values[name])
                except (KeyboardInterrupt, VMThreadError):
                    pass
        vm.engine.interrupt_hook = None
        for _ in range(2):  # a VMThreadError may still be waiting to be raised
            try:
                flow.sync()
                break
            except VMThreadError:
                continue
        for name in pool:
            np.testing.assert_array_equal(pool[name].numpy(), values[name])
        pool.clear()
        gc.collect()
        flow.sync()
        assert compute_allocator("cpu").stats().in_use == baseline, "memory leaked"
    assert points, "the engine never reached a safe point"


def test_real_ctrl_c_at_random_moments_never_wedges_the_vm_nor_leaks_memory():
    vm = flow.vm.get_vm()
    vm.hang_timeout = 10.0
    baseline = compute_allocator("cpu").stats().in_use
    rng = random.Random(7)
    interrupted = 0
    for trial in range(40):
        timer = threading.Timer(rng.uniform(0.0, 0.004), _thread.interrupt_main)
        keep = None
        try:
            timer.start()
            keep = [flow.full((16,), float(trial)) for _ in range(4)]
            for _ in range(6):
                keep.append(flow.relu(keep[-1]) + 1)
                keep.pop(0)  # tensors die constantly: release hooks run all the time
            keep[-1].numpy()
            timer.join()
            for _ in range(50):  # the interrupt lands by now if it has not yet
                time.sleep(0.001)
        except KeyboardInterrupt:
            interrupted += 1
            timer.join()
        keep = None
    assert interrupted >= 5, f"only {interrupted} of 40 trials were interrupted: the test proves little"
    gc.collect()
    flow.sync()
    np.testing.assert_array_equal((flow.ones(2) + 1).numpy(), [2.0, 2.0])
    gc.collect()
    flow.sync()
    assert compute_allocator("cpu").stats().in_use == baseline


# --- exit, dtypes, mock device (in subprocesses where a crash would take pytest down) ----------------------------


def _run_script(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120)


def test_failures_nobody_saw_are_printed_at_exit_and_the_exit_status_is_1():
    result = _run_script("""
        import pyflow as flow
        from pyflow.framework.interpreter import apply
        from pyflow.framework.op_registry import BROADCAST_ONLY, NO_BACKWARD, OpDef, TensorMeta, register_op

        def launch(kernel, outputs, inputs, attrs, stream):
            raise ValueError("nobody reads me")

        register_op(OpDef("never_read", lambda i, a: [TensorMeta(i[0].shape, i[0].dtype)], kernel="", launch=launch,
                          sbp_signatures=BROADCAST_ONLY, backward=NO_BACKWARD))
        y = apply("never_read", [flow.ones(2)])[0]
        print("script done")
    """)
    assert result.returncode == 1, result.stderr
    assert "script done" in result.stdout
    assert "never_read" in result.stderr and "nobody reads me" in result.stderr
    assert "never reported" in result.stderr


def test_a_script_whose_failures_were_all_seen_exits_with_status_0():
    result = _run_script("""
        import pyflow as flow
        try:
            flow.zeros(4, device="cuda")[None].to("cpu").numpy()
            flow.sync()
        except Exception as error:
            raise SystemExit(f"unexpected: {error}")
        print("ok")
    """)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


@pytest.mark.parametrize("construct", [
    "flow.tensor(np.array([1.5, 'x', None], dtype=object))",
    "flow.zeros(4, dtype=object)",
    "flow.cast(flow.ones(3), object)",
    "flow.ones(3).to(object)",
    "flow.tensor(np.array(['a', 'b']))",
], ids=["tensor", "zeros", "cast", "to", "strings"])
def test_object_dtypes_are_refused_at_the_call_instead_of_crashing(construct):
    result = _run_script(f"""
        import numpy as np
        import pyflow as flow
        from pyflow.errors import DTypeError
        for attempt in range(20):
            try:
                {construct}
            except DTypeError:
                pass
            else:
                raise SystemExit("accepted an object dtype")
            churn = [flow.full((64,), 1.0) + 1 for _ in range(8)]  # the allocator reuses memory
            assert float(churn[-1].sum().item()) == 128.0
        print("refused")
    """)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"
    assert "refused" in result.stdout


def test_the_mock_device_computes_the_right_values_under_random_delays():
    with ep.emulation(max_delay=0.002, seed=3):
        flow.vm.shutdown()
        for _ in range(20):
            np.testing.assert_array_equal((flow.tensor([1.0, 2.0], device="mock") * 2).numpy(), [2.0, 4.0])
    flow.vm.shutdown()


# --- the property: random programs in which random ops fail ------------------------------------------------------


class Plan:
    """A random program: each step makes a new tensor from earlier ones; some steps fail on purpose."""

    def __init__(self, seed: int, device: str, steps: int = 10):
        rng = random.Random(seed)
        self.device, self.lines = device, []
        names = ["x0", "x1"]
        for k in range(steps):
            out = f"x{k + 2}"
            kind = rng.choice(["unary", "binary", "binary", "boom", "oom", "bad_call", "read"])
            a, b = rng.choice(names), rng.choice(names)
            self.lines.append((kind, out, a, b, rng.choice([0.5, 2.0, -1.0])))
            if kind not in ("bad_call", "read"):
                names.append(out)

    def __repr__(self):
        return f"Plan({self.device}: {self.lines})"


def run_plan(plan: Plan) -> list:
    """Run ``plan``, checking every read as it goes; return the ops whose failures are still unseen.

    The reference keeps, per tensor, either its numpy value or the failure it carries:
    ``"op#k"``, the k-th failure the program injected (what is computed from a failed
    tensor carries the same failure, and reading any of them reports it).
    """
    device = plan.device
    values = {"x0": np.arange(3, dtype=np.float32), "x1": np.full(3, 2.0, np.float32)}
    tensors = {n: flow.tensor(v, device=device) for n, v in values.items()}
    unseen = set()

    def check_read(name):
        expected = values[name]
        if isinstance(expected, str):
            with pytest.raises(OpError) as info:
                tensors[name].numpy()
            assert info.value.op == expected.split("#")[0], f"{name} raised {info.value.op}, expected {expected}"
            unseen.discard(expected)
        else:
            np.testing.assert_allclose(tensors[name].numpy(), expected, rtol=1e-6)

    for k, (kind, out, a, b, scale) in enumerate(plan.lines):
        va, vb = values[a], values[b]
        failed = next((v for v in (va, vb) if isinstance(v, str)), None)
        if kind == "unary":
            tensors[out] = flow.relu(tensors[a]) * scale
            values[out] = va if isinstance(va, str) else np.maximum(va, 0) * np.float32(scale)
        elif kind == "binary":
            tensors[out] = tensors[a] + tensors[b]
            values[out] = failed or (va + vb)
        elif kind == "boom":
            tensors[out] = boom(tensors[a])
            values[out] = va if isinstance(va, str) else f"fault_boom#{k}"
        elif kind == "oom":
            tensors[out] = flow.zeros(64 * KiB, device=device)[:3]  # 256 KiB under a 128 KiB capacity
            values[out] = f"fill#{k}"
        elif kind == "bad_call":
            with pytest.raises(ShapeError):
                tensors[a] + flow.ones(4, device=device)  # refused at the call: nothing issued
        elif kind == "read":
            check_read(a)
        if kind in ("boom", "oom") and values[out].endswith(f"#{k}"):
            unseen.add(values[out])
    for name in list(tensors)[::2]:  # read half of them at the end; sync must report the rest
        check_read(name)
    return sorted(f.split("#")[0] for f in unseen)


@pytest.mark.parametrize("mode", ["threaded", "step-through", "delayed"])
@settings(max_examples=8)
@given(seed=st.integers(0, 2**20), device=st.sampled_from(DEVICES))
def test_random_programs_with_failing_ops_fail_exactly_where_they_should(mode, seed, device):
    flow.vm.shutdown()
    plan = Plan(seed, device)
    delays = ep.emulation(max_delay=0.002, seed=seed) if mode == "delayed" else ep.emulation()
    with delays, flow.vm.sync_mode(mode == "step-through"):
        compute_allocator(device).capacity = 128 * KiB
        unseen = run_plan(plan)
        if unseen:
            with pytest.raises(OpError) as info:
                flow.sync()
            reported = [info.value.op] + [f.op for f in info.value.others]
            assert sorted(reported) == unseen, plan
        flow.sync()  # nothing left, nothing raised twice
        np.testing.assert_array_equal((flow.ones(2, device=device) * 3).numpy(), [3.0, 3.0])
    flow.vm.shutdown()


def test_two_threads_running_failing_programs_see_only_their_own_failures():
    results = {}

    def worker(seed):
        try:
            unseen = run_plan(Plan(seed, "cpu", steps=14))
            try:
                flow.sync()
                results[seed] = ([], unseen)
            except OpError as error:
                results[seed] = ([error.op] + [f.op for f in error.others], unseen)
        except BaseException as error:  # noqa: BLE001 - asserted below
            results[seed] = error

    compute_allocator("cpu").capacity = 128 * KiB
    threads = [threading.Thread(target=worker, args=(seed,)) for seed in (11, 12, 13)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for seed, result in results.items():
        assert not isinstance(result, BaseException), f"seed {seed}: {result!r}"
        reported, unseen = result
        assert sorted(reported) == unseen, f"seed {seed}: reported {reported}, expected {unseen}"
    assert len(results) == 3
