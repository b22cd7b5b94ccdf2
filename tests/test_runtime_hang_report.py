"""A graph call that never completes ends in a ``RuntimeHangError`` report, never in a silent wait (issue 35).

The actor runtime takes device work in progress for no hang (a long kernel): but work the VM never
gets to is no work in progress.  The stuck call here is made so on purpose: the output task's act
blocks its stream's VM worker until the test lets it go (as an output critical section waiting for
this very call did, issue 35's 1-D -> 2-D graph), so the output's hand-over is queued behind it
for ever.  ``g(x)`` returns (the call's frontier acted); ``flow.sync()``, which waits for the
graph calls in flight, must then report within the runtime's hang timeout, naming the call and
the actor whose work never came back: whether the output critical section started waiting for the
hand-over before the worker blocked or not (both orders forced with events; the second one used to
wait silently, so the test failed at times).

And a graph garbage-collected on a thread its calls in flight need (a VM worker, another rank's
thread) does not close its runtime *there*: the close runs on a thread of its own.
"""

from __future__ import annotations

import threading
import time

import pytest

import pyflow as flow
from pyflow import nn, vm
from pyflow.device.stream import Stream
from pyflow.errors import OpError, RuntimeHangError
from pyflow.runtime.act import act
from pyflow.runtime.call import CallHandle

BOUND = 60.0   # seconds: generous; the hang timeout below is 0.5 s


class _AddOne(nn.Graph):
    def build(self, x):
        return (x * 2.0) + 1.0


def _blocking_output_act(graph, order: str, section_waits: threading.Event):
    """An act that does the output task's work, then blocks its value's stream worker (in a callback) until
    ``graph``'s runtime stopped, as the critical section did, which waited for this very call.  ``order``
    forces which comes first (``section_waits`` is set once the output critical section waits):

    * "worker first": the act returns only once the worker blocked, so the critical section (issued when
      ``g(x)`` returns) is queued behind it and never starts its wait;
    * "section first": the blocking callback writes the value after a reader of it on another worker (a cpu
      stream's own, thread uid 3) that returns only once the critical section waits for the hand-over.
    """
    def act_fn(plan, task, ins, outs, j, call):
        results = act(plan, task, ins, outs, j, call)
        if task.kind == "output":
            runtime, blocking = graph.runtime, threading.Event()

            def block(ep_stream, blob):   # on the VM worker: nothing queued behind it runs
                blocking.set()
                deadline = time.monotonic() + BOUND
                while runtime.error is None and time.monotonic() < deadline:
                    time.sleep(0.01)
            blob = results[0]._blob
            if order == "section first":
                gate = lambda outs, ins, native: section_waits.wait(BOUND)   # noqa: E731
                vm.run(lambda builder: builder.call("gate", gate, [blob], [], Stream.new("cpu", thread_uid=3)))
            vm.run(lambda builder: builder.access_blob_by_callback(blob, block, "mut", name="stuck"))
            if order == "worker first":
                assert blocking.wait(BOUND)
        return results
    return act_fn


@pytest.mark.parametrize("order", ["worker first", "section first"])
def test_a_call_whose_device_work_never_comes_back_is_reported_by_flow_sync(monkeypatch, order):
    """Reported whichever comes first: the output critical section waiting for the hand-over, or the VM worker
    blocking before it (then the section, queued behind the worker, never starts its wait: the watchdog reports
    the pending hand-over, and the section then fails with the report)."""
    monkeypatch.setenv("PYFLOW_HANG_TIMEOUT", "0.5")
    section_waits = threading.Event()
    fetch = CallHandle.output

    def output(handle, index):
        section_waits.set()
        return fetch(handle, index)
    monkeypatch.setattr(CallHandle, "output", output)
    g = _AddOne()
    g.act_fn = _blocking_output_act(g, order, section_waits)
    try:
        start = time.monotonic()
        y = g(flow.ones(3))   # the frontier (the output task) acted: the call is handed back
        report = r"(?s)RuntimeHangError.*output 0 of call 0 to be handed over.*'output_0'.*never came back from the VM"
        with pytest.raises(OpError, match=report) as info:   # the output critical section failed with it
            flow.sync()
        assert isinstance(info.value.__cause__, RuntimeHangError)
        assert time.monotonic() - start < BOUND
        with pytest.raises(OpError, match=report):   # the output the caller holds carries the report too
            y.numpy()
    finally:
        g.act_fn = None   # the runtime stopped after the report: the next call makes a new one, and runs
    assert g(flow.ones(3)).numpy().tolist() == [3.0, 3.0, 3.0]


def test_a_graph_collected_on_a_thread_its_call_needs_does_not_close_its_runtime_there(monkeypatch):
    """The finalizer runs while an act waits for the finalizing thread: it must return (old code: it waited
    for the call, the call for it)."""
    monkeypatch.setenv("PYFLOW_HANG_TIMEOUT", "10")
    go_on = threading.Event()

    def act_fn(plan, task, ins, outs, j, call):
        if task.kind == "output":
            go_on.wait(BOUND)   # the call needs the thread below to go on
        return act(plan, task, ins, outs, j, call)

    g = _AddOne()
    g.act_fn = act_fn
    go_on.set()
    g(flow.ones(3))   # compiled, and its runtime made
    flow.sync()
    go_on.clear()
    runtime = g.runtime
    handle = runtime.launch([flow.ones(3)])
    threads = runtime.threads()
    g._runtime_closer()   # what the collection of ``g`` runs, on whichever thread it interrupts
    go_on.set()
    assert [v.numpy().tolist() for v in handle.result(BOUND)] == [[3.0, 3.0, 3.0]]
    for t in threads:
        t.join(BOUND)
    assert not any(t.is_alive() for t in threads) and runtime.closed
