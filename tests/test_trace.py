"""Specification of ``pyflow.trace``: recording when each VM instruction waited and ran.

A small program (cpu ops, a host2device copy, cuda ops, a device2host copy and
``numpy()``) is traced twice: on the threaded VM with random emulated device
delays, and in step-through mode (``flow.vm.sync_mode()``).  Each property is
checked on both traces:

* every instruction received inside the block is recorded exactly once, with
  received <= dispatched <= started <= launched <= released;
* the Chrome trace is valid JSON for Perfetto: one process "pyflow VM", one
  named track per vm stream used, complete events with dur >= 0, microseconds
  since the first record, no overlapping slices on any track (a stream computes
  one instruction at a time), a waiting slice before each compute;
* the tracer detaches after the block and leaves the block's syncs out.

Then, on their own: waiting for the block's work on exit, fused instructions,
an empty block, a failing op, the PNG (skipped without matplotlib) and the
ImportError that says how to get matplotlib.
"""

from __future__ import annotations

import itertools
import json
import re
import sys

import numpy as np
import pytest

import pyflow as flow
from pyflow.device import Device, StreamType, default_stream, ep
from pyflow.errors import OpError
from pyflow.trace import InstructionRecord, Tracer, trace
from pyflow.trace.chrome import PROCESS_NAME, assign_lanes
from pyflow.vm import EagerBlobObject

EXPECTED = np.array([[0.0, 0.0], [4.0, 0.0]], dtype=np.float32)
PROGRAM_OPS = {"tensor", "relu", "add", "copy", "sub", "mul", "numpy"}
PROGRAM_STREAMS = {"cpu:0/compute", "cuda:0/host2device", "cuda:0/compute", "cuda:0/device2host",
                   "cpu:0/barrier"}  # the barrier stream: the program's own flow.sync()


def small_program() -> np.ndarray:
    """cpu ops, .to("cuda") (host2device + StreamWait), cuda ops, .to("cpu") (device2host), numpy()."""
    x = flow.tensor([[1.0, -2.0], [3.0, -4.0]])
    y = flow.relu(x) + 1
    z = y.to("cuda")
    w = flow.relu(z - 2) * 2
    return w.to("cpu").numpy()


def ns(microseconds: float) -> int:
    return round(microseconds * 1000)


class Traced:
    """A traced run of ``small_program``: the tracer, its Chrome trace, and what the VM counted."""

    def __init__(self, mode: str):
        self.mode = mode
        flow.vm.shutdown()  # fresh ep streams, created inside the emulation block
        with ep.emulation(max_delay=0.002, seed=11):
            if mode == "step_through":
                with flow.vm.sync_mode(), trace() as tracer:
                    self._body(tracer)
            else:
                with trace() as tracer:
                    self._body(tracer)
        flow.vm.shutdown()
        self.tracer = tracer
        self.records = tracer.records
        self.chrome = tracer.to_chrome_trace()
        self.by_serial = {r.serial: r for r in self.records}
        self.track_names = {e["tid"]: e["args"]["name"] for e in self.chrome["traceEvents"]
                            if e["ph"] == "M" and e["name"] == "thread_name"}

    def _body(self, tracer):
        engine = flow.vm.get_vm().engine
        first = engine.received
        self.result = small_program()
        flow.sync()  # the user's own sync is part of the program
        self.received_in_block = engine.received - first

    def slices(self, cat=None) -> list[dict]:
        return [e for e in self.chrome["traceEvents"] if e["ph"] == "X" and (cat is None or e["cat"] == cat)]


@pytest.fixture(scope="module", params=["threaded", "step_through"])
def traced(request) -> Traced:
    return Traced(request.param)  # one run per mode, shared by the tests of this module


@pytest.fixture(autouse=True, scope="module")
def fresh_vm_after():
    yield
    flow.vm.shutdown()


# --- the records --------------------------------------------------------------------------


def test_the_traced_program_computes_the_right_answer(traced):
    np.testing.assert_array_equal(traced.result, EXPECTED)


def test_every_instruction_received_in_the_block_is_recorded_once(traced):
    serials = [r.serial for r in traced.records]
    assert len(serials) == len(set(serials)), "an instruction was recorded twice"
    assert sum(r.count for r in traced.records) == traced.received_in_block
    names = {n for r in traced.records for n in re.split(r"[\[\],]", r.name) if n}
    assert PROGRAM_OPS <= names, f"missing ops: {PROGRAM_OPS - names}"


def test_records_are_plain_dataclasses(traced):
    assert traced.records and all(type(r) is InstructionRecord for r in traced.records)
    assert all(isinstance(r.name, str) and isinstance(r.stream, str) and isinstance(r.serial, int)
               for r in traced.records)


def test_marks_are_ordered_received_dispatched_started_launched_released(traced):
    for r in traced.records:
        assert r.started is not None, r
        assert r.received <= r.dispatched <= r.started <= r.launched <= r.released, r


def test_the_syncs_of_the_block_itself_are_left_out_but_the_users_sync_is_kept(traced):
    assert [r.name for r in traced.records].count("global_sync") == 1


def test_compute_of_one_stream_never_overlaps_in_the_records(traced):
    for stream in {r.stream for r in traced.records}:
        mine = sorted((r for r in traced.records if r.stream == stream), key=lambda r: r.started)
        for before, after in itertools.pairwise(mine):
            assert before.launched <= after.started, f"{before} overlaps {after} on {stream}"


@pytest.mark.parametrize("traced", ["step_through"], indirect=True)
def test_in_step_through_mode_all_compute_is_sequential(traced):
    ordered = sorted(traced.records, key=lambda r: r.started)
    for before, after in itertools.pairwise(ordered):
        assert before.launched <= after.started, f"{before} overlaps {after}"


# --- the Chrome trace ---------------------------------------------------------------------


def test_the_chrome_trace_survives_a_json_round_trip_through_save(traced, tmp_path):
    path = traced.tracer.save(tmp_path / "trace.json")
    with open(path, encoding="utf-8") as file:
        loaded = json.load(file)
    assert loaded == json.loads(json.dumps(traced.tracer.to_chrome_trace()))
    assert isinstance(loaded["traceEvents"], list) and loaded["traceEvents"]


def test_every_event_has_the_required_keys_and_complete_events_a_duration(traced):
    for event in traced.chrome["traceEvents"]:
        assert {"ph", "ts", "pid", "tid", "name"} <= set(event), event
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int), event
        if event["ph"] == "X":
            assert event["dur"] >= 0, event


def test_one_process_named_pyflow_vm(traced):
    assert {e["pid"] for e in traced.chrome["traceEvents"]} == {1}
    names = [e["args"]["name"] for e in traced.chrome["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"]
    assert names == [PROCESS_NAME] == ["pyflow VM"]


def test_one_named_track_per_stream_holds_that_streams_compute(traced):
    used = {r.stream for r in traced.records}
    assert used == PROGRAM_STREAMS
    compute_tracks = {e["tid"] for e in traced.slices("compute")}
    assert sorted(traced.track_names[tid] for tid in compute_tracks) == sorted(used)
    for event in traced.slices("compute"):
        record = traced.by_serial[event["args"]["serial"]]
        assert traced.track_names[event["tid"]] == record.stream and event["name"] == record.name
    assert len(traced.slices("compute")) == len(traced.records)


def test_timestamps_are_microseconds_since_the_first_record(traced):
    origin = min(r.received for r in traced.records)
    assert min(e["ts"] for e in traced.slices()) == 0
    for event in traced.slices("compute"):
        record = traced.by_serial[event["args"]["serial"]]
        assert event["ts"] == pytest.approx((record.started - origin) * 1e6, abs=2e-3)
        assert event["dur"] == pytest.approx((record.launched - record.started) * 1e6, abs=2e-3)


def test_no_two_slices_of_one_track_overlap(traced):
    """Perfetto needs this; for a stream's own track it says: one instruction at a time."""
    tracks: dict = {}
    for event in traced.slices():
        tracks.setdefault(event["tid"], []).append((ns(event["ts"]), ns(event["ts"]) + ns(event["dur"]), event))
    for tid, spans in tracks.items():
        spans.sort(key=lambda s: (s[0], s[1]))
        for (_, end, before), (start, _, after) in itertools.pairwise(spans):
            assert end <= start, f"on {traced.track_names[tid]}: {before} overlaps {after}"


def test_each_instruction_waits_on_a_lane_of_its_stream_until_its_compute_starts(traced):
    waits: dict = {}
    for event in traced.slices():
        if event["cat"] in ("wait", "queue"):
            waits.setdefault(event["args"]["serial"], {})[event["name"]] = event
    for event in traced.slices("compute"):
        record = traced.by_serial[event["args"]["serial"]]
        phases = waits[record.serial]
        deps, queued = phases["waiting for dependences"], phases["queued on worker"]
        assert traced.track_names[deps["tid"]].startswith(record.stream + " waiting")
        assert deps["tid"] == queued["tid"]
        assert ns(deps["ts"]) + ns(deps["dur"]) == ns(queued["ts"])
        assert ns(queued["ts"]) + ns(queued["dur"]) == ns(event["ts"])
        assert deps["dur"] == pytest.approx(record.dependence_wait * 1e6, abs=2e-3)


def test_instructions_that_recorded_an_event_show_the_wait_for_the_device(traced):
    device_waits = {e["args"]["serial"] for e in traced.slices("device")}
    assert device_waits == {r.serial for r in traced.records if r.recorded_event}
    assert any(r.stream == "cuda:0/device2host" for r in traced.records if r.recorded_event)


def test_waiting_lanes_are_first_fit_and_never_overlap():
    intervals = [(0, 5), (1, 2), (2, 3), (5, 6), (0, 1), (3, 9)]
    lanes = assign_lanes(intervals)
    assert lanes == [1, 0, 0, 1, 0, 0]  # by start: (0,1)->0 (0,5)->1 (1,2)->0 (2,3)->0 (3,9)->0 (5,6)->1
    for lane in set(lanes):
        mine = sorted(iv for iv, la in zip(intervals, lanes) if la == lane)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(mine))


# --- the summary and the picture ----------------------------------------------------------


def test_the_summary_has_a_line_per_stream_with_its_count_and_compute_time(traced):
    lines = traced.tracer.summary().splitlines()
    for stream in PROGRAM_STREAMS:
        mine = [r for r in traced.records if r.stream == stream]
        (line,) = [ln for ln in lines if ln.split()[0] == stream]
        fields = line.split()
        assert int(fields[1]) == len(mine)
        assert float(fields[2]) == pytest.approx(sum(r.compute_time for r in mine) * 1e3, abs=1.5e-3)


def test_plot_writes_a_png(traced, tmp_path):
    pytest.importorskip("matplotlib", reason="tracer.plot() needs matplotlib (pip install matplotlib)")
    path = tmp_path / "trace.png"
    assert traced.tracer.plot(path) == str(path)
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(b"\x89PNG\r\n\x1a\n")


def test_plot_without_matplotlib_says_pip_install_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    with pytest.raises(ImportError, match="pip install matplotlib"):
        Tracer().plot(tmp_path / "trace.png")
    assert not (tmp_path / "trace.png").exists()


# --- attaching and detaching ----------------------------------------------------------------


def test_the_tracer_is_attached_inside_the_block_only_and_records_nothing_after():
    machine = flow.vm.get_vm()
    with trace() as tracer:
        assert tracer in machine.tracers
        flow.relu(flow.tensor([1.0, -1.0])).numpy()
    assert tracer not in flow.vm.get_vm().tracers
    count = len(tracer.records)
    assert count > 0
    flow.relu(flow.tensor([2.0, -2.0])).numpy()
    flow.sync()
    assert len(tracer.records) == count


def test_on_exit_the_block_waits_for_its_work_so_every_instruction_is_recorded():
    flow.vm.shutdown()
    try:
        with ep.emulation(max_delay=0.005, seed=1), trace() as tracer:  # the device lags behind the host
            engine = flow.vm.get_vm().engine
            first = engine.received
            x = flow.ones(4, device="cuda")
            for _ in range(4):
                x = flow.relu(x) * 2  # nothing reads x inside the block
            issued = engine.received - first
        assert sum(r.count for r in tracer.records) == issued
    finally:
        flow.vm.shutdown()


@pytest.mark.parametrize("step_through", [False, True], ids=["threaded", "step_through"])
def test_a_fused_instruction_is_one_record_that_counts_what_it_fused(step_through):
    """Source ops received together on one stream share its sequential dependence: they fuse."""
    stream = default_stream(Device("cpu"))
    blobs = [EagerBlobObject.empty(Device("cpu"), (2,), np.float32) for _ in range(3)]

    def fill(out_arrays, in_arrays, native_stream):
        out_arrays[0][...] = 1.0

    with flow.vm.sync_mode(step_through), trace() as tracer:
        flow.vm.run(lambda builder: [builder.call("fill", fill, [], [blob], stream) for blob in blobs])
    (record,) = tracer.records
    assert (record.name, record.count) == ("fuse[fill,fill,fill]", 3)
    (event,) = [e for e in tracer.to_chrome_trace()["traceEvents"] if e["ph"] == "X" and e["cat"] == "compute"]
    assert event["args"]["fused"] == 3


def test_an_empty_block_gives_an_empty_but_valid_trace():
    with trace() as tracer:
        pass
    assert tracer.records == []
    chrome = json.loads(json.dumps(tracer.to_chrome_trace()))
    assert [e["name"] for e in chrome["traceEvents"]] == ["process_name"]
    assert "no instructions" in tracer.summary()


def test_a_failing_op_is_traced_and_the_tracer_still_detaches():
    """Out of memory while preparing: the record says failed and has no compute start."""
    flow.vm.shutdown()
    machine = flow.vm.get_vm()
    machine.allocator(Device("cpu"), StreamType.compute).capacity = 4096
    try:
        with pytest.raises(OpError), trace() as tracer:
            flow.zeros(64, 64)  # 16 KiB > 4 KiB
        assert tracer not in machine.tracers
        (failed,) = [r for r in tracer.records if r.failed]
        assert failed.name == "fill" and failed.started is None and failed.compute_time == 0.0
        (event,) = [e for e in tracer.to_chrome_trace()["traceEvents"]
                    if e["ph"] == "X" and e["cat"] == "compute" and e["args"]["failed"]]
        assert event["dur"] == 0
    finally:
        flow.vm.shutdown()
