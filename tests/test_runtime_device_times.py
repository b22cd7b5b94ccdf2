"""The actor timeline says when each act's kernels *ran* on their ep stream, not only when the act issued them
(issue 32).

An act only queues its kernels; on a cuda device (here the simulator's emulated ep stream) they run later,
often while later acts issue theirs.  Each ``ActRecord`` carries the ep tasks its instructions launched and
when they ran (``device``), through the mechanism ``flow.trace()`` uses (the VM's ``TracedWork``): a matmul's
kernel time is the matmul act's.  Checked in logical order (what ran where, what ran after what), never
against wall-clock thresholds.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import pyflow as flow
from pyflow import nn
from pyflow.runtime import Runtime
from pyflow.runtime.pipeline import linear_pipeline_plan
from pyflow.runtime.timeline import to_chrome_trace


class _MatmulRelu(nn.Graph):
    def build(self, x, w):
        return flow.matmul(x, w).relu()


def _timeline(device: str):
    g = _MatmulRelu()
    x, w = flow.ones(4, 4, device=device), flow.ones(4, 4, device=device)
    np.testing.assert_array_equal(g(x, w).numpy(), np.full((4, 4), 4.0, np.float32))
    records = g.runtime.timeline()
    return g, {r.op_name: r for r in records}, records


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_matmuls_kernel_time_is_the_matmul_acts_not_a_later_acts(device):
    g, acts, records = _timeline(device)
    matmul, relu = acts["matmul_0"], acts["relu_0"]
    kernels = [run for run in matmul.device if run.task == "matmul"]
    assert len(kernels) == 1 and kernels[0].ep_stream.startswith(f"{device}:0/"), matmul.device
    assert not any(run.task == "matmul" for r in records if r is not matmul for run in r.device)
    # it ran after the act issued it, and before the relu that reads it (one ep stream: in order)
    assert matmul.start <= matmul.device_start <= matmul.device_end
    assert matmul.device_end <= relu.device_start
    # the acts that move no data ran nothing on a device
    assert acts["source_tick"].device == () and acts["source_tick"].device_start is None
    # the Chrome trace shows the device runs on a lane of their ep stream, named by the op
    trace = json.loads(json.dumps(to_chrome_trace(records)))
    lanes = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert any(lane.startswith(f"ep {device}:0/") for lane in lanes), lanes
    assert any(e.get("cat") == "device" and e["name"] == "matmul_0" for e in trace["traceEvents"])


def test_without_a_timeline_no_act_is_timed():
    def zero_cost(plan, task, ins, outs, j, call):
        return outs
    with Runtime(linear_pipeline_plan(["a"]), act_fn=zero_cost, timeline=0, deterministic=True) as runtime:
        assert runtime.act_fn is zero_cost   # no issuer is set per act: nothing is paid for
        runtime.set_timeline_limit(10)
        assert runtime.act_fn is not zero_cost
        runtime.launch([]).result()
        assert [r.device for r in runtime.timeline()] == [()] * 3
