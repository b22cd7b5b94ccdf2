"""Instruction records as a Chrome trace (the JSON that ui.perfetto.dev and chrome://tracing open).

Layout, in one process "pyflow VM":

* one track (a "thread", named by an ``M`` ``thread_name`` event) per vm stream.
  It holds one complete (``X``) event per instruction, from *started* to *launched*
  (its compute).  A stream runs one instruction at a time, so these never overlap;
* under each stream's track, its **waiting lanes** ("<stream> waiting").  Many
  instructions of one stream wait at the same time, and the slices of one track
  must not overlap, so each instruction's waits go on the first free lane:
  "waiting for dependences" (received -> dispatched), "queued on worker"
  (dispatched -> started) and, when it recorded an ep event, "waiting for the
  device" (launched -> released).  A lane slice ends where its compute begins.

* one track per **ep stream** ("<ep stream> (ep stream)"), category ``ep``: each task an
  instruction launched there, from when the stream began running it to when it finished,
  named by that instruction (a cuda matmul's kernel is a ``matmul`` slice here, though the
  matmul's compute slice above is only its queueing).  A stream runs one task at a time.

Timestamps are microseconds since the first record was received, rounded to the
nanosecond (so touching slices touch exactly).  Every event's ``args`` name its
instruction (``"relu #42"``).
"""

from __future__ import annotations

__all__ = ["PROCESS_NAME", "assign_lanes", "phases", "to_chrome_trace"]

PROCESS_NAME = "pyflow VM"
PID = 1

# (phase name, category, chrome://tracing colour); perfetto colours slices by name.
WAIT_DEPENDENCES = ("waiting for dependences", "wait", "thread_state_sleeping")
QUEUED = ("queued on worker", "queue", "thread_state_runnable")
DEVICE = ("waiting for the device", "device", "thread_state_iowait")


def phases(record) -> list:
    """The waiting phases of ``record`` as ``(phase, start, end)`` (perf_counter seconds)."""
    started = record.started if record.started is not None else record.launched
    result = [(WAIT_DEPENDENCES, record.received, record.dispatched), (QUEUED, record.dispatched, started)]
    if record.recorded_event:
        result.append((DEVICE, record.launched, record.released))
    return result


def assign_lanes(intervals) -> list[int]:
    """First-fit lane for each ``(start, end)`` so that one lane's intervals do not overlap."""
    order = sorted(range(len(intervals)), key=lambda i: intervals[i])
    lane_ends: list = []
    lanes = [0] * len(intervals)
    for i in order:
        start, end = intervals[i]
        for lane, lane_end in enumerate(lane_ends):
            if lane_end <= start:
                break
        else:
            lane = len(lane_ends)
            lane_ends.append(None)
        lane_ends[lane] = end
        lanes[i] = lane
    return lanes


def to_chrome_trace(records, device_records=()) -> dict:
    """The Chrome trace event format for ``records`` (of ``InstructionRecord``) and ``device_records``
    (of ``DeviceWorkRecord``)."""
    records = sorted(records, key=lambda r: (r.received, r.serial))
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "ts": 0,
                           "args": {"name": PROCESS_NAME}}]
    if not records:
        return {"traceEvents": events, "displayTimeUnit": "ms"}
    origin = min(r.received for r in records)

    def ns(t: float) -> int:
        return round((t - origin) * 1e9)

    def slice_event(name, cat, tid, start, end, args, cname=None) -> dict:
        event = {"ph": "X", "name": name, "cat": cat, "pid": PID, "tid": tid,
                 "ts": ns(start) / 1000, "dur": (ns(end) - ns(start)) / 1000, "args": args}
        if cname:
            event["cname"] = cname
        return event

    def thread_name(tid, name, sort_index) -> None:
        events.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": tid, "ts": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": tid, "ts": 0,
                       "args": {"sort_index": sort_index}})

    streams = sorted({(r.stream_id, r.stream) for r in records})
    tid = 0
    for _, stream in streams:
        tid += 1
        stream_tid = tid
        thread_name(stream_tid, stream, stream_tid)
        mine = [r for r in records if r.stream == stream]
        for r in mine:
            started = r.started if r.started is not None else r.launched
            args = {"instruction": f"{r.name} #{r.serial}", "serial": r.serial, "stream": stream,
                    "fused": r.count, "failed": r.failed,
                    "waited for dependences (us)": (ns(r.dispatched) - ns(r.received)) / 1000,
                    "queued on worker (us)": (ns(started) - ns(r.dispatched)) / 1000,
                    "released at (us)": ns(r.released) / 1000}
            events.append(slice_event(r.name, "compute", stream_tid, started, r.launched, args,
                                      "terrible" if r.failed else "thread_state_running"))
        waits = [(r, phases(r)) for r in mine]
        lanes = assign_lanes([(p[0][1], p[-1][2]) for _, p in waits])
        for lane in range(max(lanes) + 1 if lanes else 0):
            thread_name(stream_tid + 1 + lane, f"{stream} waiting" + (f" ({lane + 1})" if lane else ""),
                        stream_tid + 1 + lane)
        for (r, record_phases), lane in zip(waits, lanes):
            for (name, cat, cname), start, end in record_phases:
                events.append(slice_event(name, cat, stream_tid + 1 + lane, start, end,
                                          {"instruction": f"{r.name} #{r.serial}", "serial": r.serial,
                                           "stream": stream}, cname))
        tid = stream_tid + (max(lanes) + 1 if lanes else 0)
    for ep_stream in sorted({d.ep_stream for d in device_records}):
        tid += 1
        thread_name(tid, f"{ep_stream} (ep stream)", tid)
        for d in device_records:
            if d.ep_stream == ep_stream:
                events.append(slice_event(d.name, "ep", tid, d.started, d.finished,
                                          {"instruction": f"{d.name} #{d.serial}", "serial": d.serial,
                                           "task": d.task, "launched from": d.stream}))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"clock": "time.perf_counter(), microseconds since the first instruction was received",
                          "instructions": len(records), "streams": [s for _, s in streams]}}
