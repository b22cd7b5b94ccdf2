"""``flow.trace()`` records when work runs on an ep stream, attributed to the op that launched it (issue 32).

A cuda matmul's compute only queues its kernel on the (emulated) ep stream; the kernel runs
there later, while the ``numpy()`` that follows waits for it.  Before, the trace showed the
matmul's compute as a fraction of a millisecond and the kernel's whole time on ``numpy``.  Now
every task an instruction launches reports when it ran (``tracer.device_records``, the Chrome
trace's ep-stream tracks).  No timing is asserted: only which record holds the kernel's run.
"""

from __future__ import annotations

import contextlib
import time
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.trace import DeviceWorkRecord
from pyflow.vm.policies import op_call


@contextlib.contextmanager
def timed_kernels():
    """``(op name, started, finished)`` of each op kernel run (perf_counter), as the kernel itself sees it."""
    runs: list = []
    original = op_call.OpCall.__init__

    def init(self, name, run, *args, **kwargs):
        def timed(*run_args):
            started = time.perf_counter()
            try:
                run(*run_args)
            finally:
                runs.append((name, started, time.perf_counter()))
        original(self, name, timed, *args, **kwargs)

    with mock.patch.object(op_call.OpCall, "__init__", init):
        yield runs


@settings(max_examples=6, deadline=None)
@given(st.sampled_from(["threaded", "step_through"]), st.integers(2, 12))
def test_a_cuda_matmuls_kernel_run_is_recorded_on_the_ep_stream_as_the_matmuls(mode, n):
    a = flow.tensor(np.arange(n * n, dtype=np.float32).reshape(n, n) / n, device="cuda")
    flow.sync()
    with timed_kernels() as kernel_runs:
        if mode == "step_through":
            with flow.vm.sync_mode(), flow.trace() as tracer:
                value = (a @ a).numpy()
        else:
            with flow.trace() as tracer:
                value = (a @ a).numpy()
    np.testing.assert_allclose(value, a.numpy() @ a.numpy(), rtol=1e-5)
    (matmul,) = [r for r in tracer.records if r.name == "matmul"]
    (work,) = [d for d in tracer.device_records if d.serial == matmul.serial]
    assert type(work) is DeviceWorkRecord
    assert (work.name, work.task, work.stream, work.ep_stream) == ("matmul", "matmul", "cuda:0/compute",
                                                                   "cuda:0/compute" + ("/inline" if mode ==
                                                                                       "step_through" else ""))
    (kernel,) = [k for k in kernel_runs if k[0] == "matmul"]
    assert work.started <= kernel[1] <= kernel[2] <= work.finished   # the record encloses the kernel's run
    if mode == "threaded":   # queued by compute, run later by the ep stream's worker
        assert matmul.started <= matmul.launched <= work.started
    numpy_work = [d for d in tracer.device_records if d.name == "numpy"]
    assert numpy_work and all(not (d.started <= kernel[1] <= d.finished) for d in numpy_work)
    # the Chrome trace shows it on the ep stream's own track, named by the op
    chrome = tracer.to_chrome_trace()["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in chrome if e["ph"] == "M" and e["name"] == "thread_name"}
    (event,) = [e for e in chrome if e["ph"] == "X" and e["cat"] == "ep" and e["args"]["serial"] == matmul.serial]
    assert event["name"] == "matmul" and tracks[event["tid"]] == f"{work.ep_stream} (ep stream)"
    assert any(line.startswith(f"ep {work.ep_stream}: ") for line in tracer.summary().splitlines())


def test_nothing_is_recorded_on_ep_streams_outside_a_trace():
    a = flow.tensor(np.ones((2, 2), np.float32), device="cuda")
    with flow.trace() as tracer:
        pass
    (a @ a).numpy()
    assert tracer.device_records == []
