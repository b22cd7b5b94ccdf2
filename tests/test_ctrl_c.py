"""Ctrl-C in every mode: it reaches the caller at once, is never lost, and never leaks an internal error.

* a graph call: the interrupt goes up from ``g(x)`` at once, however long a stage takes (before, the
  caller closed the runtime itself and waited for the calls in flight: up to twice the hang timeout
  for a stuck stage); the runtime is closed on a thread of its own, and the graph works again;
* step-through mode: a Ctrl-C that lands where ``threading.Condition.wait`` has let its lock go (the
  simulator's launching thread waits so) made the ``with lock:`` raise ``RuntimeError: release unlocked
  lock`` on the way up; that error became the op's failure and the interrupt was lost;
* exit: a Ctrl-C while exit waits for queued work gives that work up and ends the process with status
  130 (before, exit ran every queued kernel first).

Signals are real (``os.kill``), sent where the code under test is sure to be waiting (from the stuck
stage itself, after the child process said it reached exit).  Time bounds are "within N s", N far above
the expected hundredths of a second.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import pyflow as flow
from pyflow import nn
from pyflow.errors import OpError
from pyflow.framework.interpreter import apply
from pyflow.framework.op_registry import OP_REGISTRY, OpDef, TensorMeta, get_op
from pyflow.runtime.act import act

BOUND = 5.0   # seconds: generous for a loaded 2-core machine (a Ctrl-C is expected within hundredths)


@pytest.fixture(autouse=True)
def fresh_vm():
    flow.vm.shutdown()
    yield
    flow.vm.shutdown()


def _ctrl_c() -> float:
    """Send this process a real SIGINT; returns when."""
    sent = time.monotonic()
    os.kill(os.getpid(), signal.SIGINT)
    return sent


# --- graph calls -------------------------------------------------------------------------------------------


def test_ctrl_c_in_a_graph_call_with_a_stuck_stage_reaches_the_caller_at_once(monkeypatch):
    monkeypatch.setenv("PYFLOW_HANG_TIMEOUT", "30")   # the old code waited up to twice this
    release, sent = threading.Event(), []

    class G(nn.Graph):
        def build(self, x):
            return (x * 2.0).relu() + 1.0

    g = G()
    np.testing.assert_array_equal(g(flow.ones(2, 2)).numpy(), np.full((2, 2), 3.0, np.float32))

    def stuck_relu(plan, task, ins, outs, j, call):
        if plan.op_attrs[task.op_name][0] == "relu" and not release.is_set():
            sent.append(_ctrl_c())   # the call is surely in flight: the caller waits for it
            release.wait(60)         # stuck (until the test lets it go)
        return act(plan, task, ins, outs, j, call)

    g.act_fn = stuck_relu
    g._close_runtime()
    try:
        with pytest.raises(KeyboardInterrupt):
            g(flow.ones(2, 2))
        caught = time.monotonic()
        assert sent and caught - sent[0] < BOUND
        closing = [t for t in threading.enumerate() if t.name.startswith("pyflow-close-")]
        assert g.runtime is None and closing   # closed on a thread of its own
    finally:
        release.set()
    g.act_fn = None
    deadline = time.monotonic() + 60
    while any(t.is_alive() for t in closing) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in closing)
    np.testing.assert_array_equal(g(flow.ones(2, 2)).numpy(), np.full((2, 2), 3.0, np.float32))


# --- step-through mode -------------------------------------------------------------------------------------


def _ctrl_c_in_a_lock_window(kernel, outputs, inputs, attrs, stream):
    """What ``Condition.wait`` does, with the Ctrl-C where it is unlucky: the lock let go, not taken back."""
    lock = threading.Lock()
    with lock:   # its release, on the way out, raises RuntimeError (release unlocked lock) over the interrupt
        lock.release()
        signal.raise_signal(signal.SIGINT)   # (the handler runs before raise_signal returns)
        lock.acquire()


@pytest.fixture
def lock_window_op(monkeypatch):
    get_op("relu")   # load the real ops first
    op = OpDef("ctrl_c_in_a_lock_window", lambda inputs, attrs: [TensorMeta(inputs[0].shape, inputs[0].dtype)],
               kernel="", launch=_ctrl_c_in_a_lock_window)
    monkeypatch.setitem(OP_REGISTRY, op.name, op)
    return op.name


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_ctrl_c_hidden_by_a_lock_error_in_step_through_mode_is_raised_not_kept_as_the_ops_failure(
        lock_window_op, device):
    x = flow.ones(3, device=device)
    with flow.vm.sync_mode():
        with pytest.raises(KeyboardInterrupt) as caught:
            y = apply(lock_window_op, [x])[0]
        assert caught.value.__suppress_context__   # the lock's error is not shown as part of it
        z = x + 1.0
    np.testing.assert_array_equal(z.numpy(), np.full(3, 2.0, np.float32))
    flow.sync()   # nothing pending: the interrupt is no failure anybody has to be told about


def test_an_op_error_raised_while_handling_its_own_exception_is_still_the_ops_failure(monkeypatch):
    """Only an *interrupt* behind an error is raised: an ordinary exception's context stays the op's failure."""
    get_op("relu")

    def nested(kernel, outputs, inputs, attrs, stream):
        try:
            raise KeyError("inner")
        except KeyError:
            raise ValueError("outer") from None

    op = OpDef("nested_error", lambda inputs, attrs: [TensorMeta(inputs[0].shape, inputs[0].dtype)],
               kernel="", launch=nested)
    monkeypatch.setitem(OP_REGISTRY, op.name, op)
    with flow.vm.sync_mode():
        y = apply("nested_error", [flow.ones(2)])[0]
        with pytest.raises(OpError, match="outer"):
            y.numpy()


def test_a_ctrl_c_deferred_in_a_critical_stretch_that_then_fails_goes_up_instead_of_being_dropped():
    from pyflow.vm import interrupts

    flow.ones(1)   # the VM installs the SIGINT handler that defers
    with pytest.raises(KeyboardInterrupt) as caught:
        with interrupts.critical():   # the VM's bookkeeping
            _ctrl_c()                 # deferred: remembered, not raised
            raise ValueError("the stretch fails")
    assert isinstance(caught.value.__context__, ValueError)
    with interrupts.critical():       # nothing left pending
        pass


# --- exit ----------------------------------------------------------------------------------------------------


_QUEUES_SLOW_WORK_UNTIL_CTRL_C = """
    import atexit, sys, time
    import pyflow as flow
    from pyflow.framework.interpreter import apply
    from pyflow.framework.op_registry import BROADCAST_ONLY, NO_BACKWARD, OpDef, TensorMeta, register_op

    def slow(kernel, outputs, inputs, attrs, stream):
        time.sleep(0.05)

    register_op(OpDef("slow_kernel", lambda i, a: [TensorMeta(i[0].shape, i[0].dtype)], kernel="", launch=slow,
                      sbp_signatures=BROADCAST_ONLY, backward=NO_BACKWARD))
    atexit.register(lambda: print("at exit", flush=True))   # runs first: pyflow's exit handlers wait after it
    x = flow.ones(2)
    print("issuing", flush=True)
    while True:   # about 50 s of work queued (back pressure: 1,000 instructions), until the first Ctrl-C
        x = apply("slow_kernel", [x])[0]
"""


def test_a_second_ctrl_c_at_exit_abandons_the_queued_work_and_exits_130():
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_QUEUES_SLOW_WORK_UNTIL_CTRL_C)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "issuing"
        time.sleep(0.5)
        child.send_signal(signal.SIGINT)   # the first: the script stops; exit waits for the queued work
        assert child.stdout.readline().strip() == "at exit"
        time.sleep(0.5)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)   # the second: give the queued work up
        status = child.wait(timeout=30)    # (the old code went on for the ~50 s of queued work)
        ended = time.monotonic()
        stderr = child.stderr.read()
    finally:
        child.kill()
        child.wait()
    assert status == 130, stderr
    assert ended - sent < 20   # far above the expected fraction of a second
    assert "KeyboardInterrupt" in stderr and "abandoned" in stderr


def test_ctrl_c_that_the_os_gives_another_thread_still_reaches_a_waiting_graph_caller(monkeypatch):
    """The OS may deliver a process's SIGINT to any thread that does not block it; then CPython only sets a flag
    that the main thread reads when it runs again.  The main thread here blocks SIGINT, so an actor thread gets
    it: the caller, waiting for its call, still raises within the bound (it used to sleep out the hang timeout)."""
    monkeypatch.setenv("PYFLOW_HANG_TIMEOUT", "30")
    armed, release, sent = threading.Event(), threading.Event(), []

    class G(nn.Graph):
        def build(self, x):
            return (x * 2.0).relu() + 1.0

    def stuck_relu(plan, task, ins, outs, j, call):
        if plan.op_attrs[task.op_name][0] == "relu" and armed.is_set() and not release.is_set():
            sent.append(_ctrl_c())
            release.wait(60)
        return act(plan, task, ins, outs, j, call)

    g = G()
    g.act_fn = stuck_relu
    np.testing.assert_array_equal(g(flow.ones(2, 2)).numpy(), np.full((2, 2), 3.0, np.float32))   # threads made
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})   # (threads made from now on would block it too)
    try:
        armed.set()
        with pytest.raises(KeyboardInterrupt):
            g(flow.ones(2, 2))
        assert sent and time.monotonic() - sent[0] < BOUND
    finally:
        release.set()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    g.act_fn = None
