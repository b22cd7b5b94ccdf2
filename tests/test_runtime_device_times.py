"""The actor timeline says when each act's kernels *ran* on their ep stream, not only when the act issued them
(issue 32).

An act only queues its kernels; on a cuda device (here the simulator's emulated ep stream) they run later,
often while later acts issue theirs.  Each ``ActRecord`` carries the ep tasks its instructions launched and
when they ran (``device``), through the mechanism ``flow.trace()`` uses (the VM's ``TracedWork``): a matmul's
kernel time is the matmul act's.  Checked in logical order (what ran where, what ran after what), never
against wall-clock thresholds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import types

import numpy as np
import pytest

import pyflow as flow
from pyflow import nn
from pyflow.compiler.plan import replan_memory
from pyflow.runtime import Runtime
from pyflow.runtime.pipeline import linear_pipeline_plan
from pyflow.runtime.timeline import to_chrome_trace
from tests.test_runtime_input_wise import merge_plan, producing_act


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


def _on(plan, device: str):
    """``plan`` with every task and regst on ``device``, memory planned again."""
    tasks = {tid: dataclasses.replace(t, device=device, consumed=dict(t.consumed), produced=dict(t.produced))
             for tid, t in plan.tasks.items()}
    regsts = {rid: dataclasses.replace(r, device=device) for rid, r in plan.regsts.items()}
    return replan_memory(dataclasses.replace(plan, tasks=tasks, regsts=regsts))


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_an_input_wise_acts_kernels_are_on_its_own_record(device):
    """An input-wise actor acts without the runtime's ``act_fn``: each of its acts still hears when the copy
    it issued ran, and no other act hears of it."""
    with Runtime(_on(merge_plan("concat", 2), f"{device}:0"), act_fn=producing_act({})) as runtime:
        assert runtime.actor("merge").kind == "input_wise"
        np.testing.assert_array_equal(runtime.launch([]).result()[0].numpy(), [[0.0] * 3, [1.0] * 3])
        records = runtime.timeline()
    merges = [r for r in records if r.op_name == "merge"]
    assert len(merges) == 2
    for merge in merges:   # one act per input: its copy into the output's rows ran on the device, after the act
        assert [(run.task, run.ep_stream) for run in merge.device] == [("contiguous", f"{device}:0/compute")]
        assert merge.start <= merge.device_start <= merge.device_end
    output = next(r for r in records if r.op_name == "output_0")
    assert max(m.device_end for m in merges) <= output.device_start   # one ep stream: in order


class _Owner:
    """A work owner that keeps what it hears."""

    def __init__(self):
        self.runs = []

    def ran(self, ep_stream, task, started, finished):
        self.runs.append((ep_stream, task, started, finished))


@pytest.mark.gpu
def test_a_real_gpu_stream_times_its_work_with_events_only_for_an_owner():
    from pyflow.device import ep
    stream = ep.get_device("cuda:0").create_stream("timed")
    host = np.ones(1 << 20, np.float32)
    device_array = ep.get_device("cuda:0").as_array(ep.get_device("cuda:0").alloc(host.nbytes), 0, host.shape,
                                                    host.dtype)
    stream.memcpy_h2d(device_array, host)   # no owner: no event, no anchor
    stream.sync()
    assert stream._anchor is None and stream._timed == []
    owner, before = _Owner(), time.perf_counter()
    previous = ep.base.set_work_owner(owner)
    try:
        stream.memcpy_h2d(device_array, host)
        stream.launch(lambda: None, name="nothing")
    finally:
        ep.base.set_work_owner(previous)
    stream.sync()
    (copy_stream, copy, started, finished), (_, nothing, later, last) = owner.runs
    assert (copy_stream, copy, nothing) == (stream, "memcpy_h2d", "nothing")
    assert before <= started < finished <= later <= last   # after the launch, in stream order, a positive time


@pytest.mark.gpu
def test_a_real_gpus_matmul_runs_inside_its_act_with_a_positive_duration():
    class Matmul(nn.Graph):
        def build(self, x, w):
            return flow.matmul(x, w).relu()

    g = Matmul()
    x, w = flow.ones(256, 256, device="cuda"), flow.ones(256, 256, device="cuda")
    np.testing.assert_array_equal(g(x, w).numpy(), np.full((256, 256), 256.0, np.float32))
    acts = {r.op_name: r for r in g.runtime.timeline()}
    matmul, relu = acts["matmul_0"], acts["relu_0"]
    (kernel,) = [run for run in matmul.device if run.task == "matmul"]
    assert kernel.ep_stream.startswith("cuda:0/")
    assert matmul.start <= kernel.started < kernel.finished <= relu.device_end


class _FakeCuda:
    """Just enough of numba.cuda for ``CudaStream``'s timing: a GPU clock that advances 1 ms per recorded event,
    events done once ``done_up_to`` reaches their tick (a GPU that runs behind the host)."""

    def __init__(self):
        self.clock, self.done_up_to, self.events = 0, 0, 0
        fake = self

        class Event:
            def __init__(self):
                fake.events += 1
                self.tick = None

            def record(self, stream):
                fake.clock += 1
                self.tick = fake.clock

            def synchronize(self):
                fake.done_up_to = max(fake.done_up_to, self.tick)

            def query(self):
                return self.tick <= fake.done_up_to

            def elapsed_time(self, end):
                return float(end.tick - self.tick)   # ms

        class Stream:
            def synchronize(self):
                fake.done_up_to = fake.clock

        self.event = lambda timing=False: Event()
        self.stream = Stream
        self.gpus = {0: contextlib.nullcontext()}
        self.cudadrv = types.SimpleNamespace(driver=types.SimpleNamespace(CudaAPIError=RuntimeError))


def test_a_gpu_stream_reports_its_timed_work_in_perf_counter_seconds_when_its_events_are_done(monkeypatch):
    """``CudaStream`` (real GPUs only) over a fake numba.cuda: no owner, no event; with one, each task between
    two events, reported when they are done, anchored to the host clock."""
    from pyflow.device import Device, ep
    from pyflow.device.ep import cuda as cuda_ep
    fake = _FakeCuda()
    monkeypatch.setattr(cuda_ep, "cuda", fake)
    stream = cuda_ep.CudaDevice(Device("cuda", 0)).create_stream("compute")
    stream.launch(lambda: None, name="untimed")
    assert fake.events == 0 and stream._anchor is None   # the common case costs no event
    owner, before = _Owner(), time.perf_counter()
    previous = ep.base.set_work_owner(owner)
    try:
        stream.launch(lambda: None, name="first")    # the anchor (tick 1, synchronized), then ticks 2, 3
        stream.launch(lambda: None, name="second")   # ticks 4, 5: "first" is not done yet on this GPU
        assert owner.runs == []
        fake.done_up_to = 3
        stream.launch(lambda: None, name="third")    # a timed launch polls: "first" is done
        assert [task for _, task, _, _ in owner.runs] == ["first"]
    finally:
        ep.base.set_work_owner(previous)
    stream.sync()
    assert [(s, task) for s, task, _, _ in owner.runs] == [(stream, "first"), (stream, "second"), (stream, "third")]
    anchor_host = stream._anchor[1]
    assert before <= anchor_host
    since_anchor = [t - anchor_host for _, _, started, finished in owner.runs for t in (started, finished)]
    assert since_anchor == pytest.approx([0.001, 0.002, 0.003, 0.004, 0.005, 0.006])   # 1 ms per tick
