"""The actor timeline: one record per act, as a Chrome/Perfetto trace, a PNG, and inside ``flow.trace``.

Every act of every actor leaves an ``ActRecord``: who acted (actor id, op, kind), on
which thread, when (``time.perf_counter()`` at the start and end of issuing its work),
for which piece ``(call, j)``, and which regsts it read and wrote (``(desc id, copy,
piece)``).  ``Runtime.timeline()`` returns them; with them one can *see* pipelining
(seed 003's figures: each thread a row, the calls in alternating colours) and check
back pressure: with regst num r a producer is never more than r pieces ahead.

Issuing is not running: an act only queues its kernels, and an ep stream (a GPU's, or the
simulator's emulated one) runs them later, often while a later act issues its own.  So each
act's instructions carry an ``ActDeviceWork`` as their VM issuer (``issuing_acts``; ``issuing_act`` for an
input-wise actor's acts; the mechanism ``flow.trace()`` uses, ``pyflow/vm/stream.py``'s ``TracedWork``), and
the record's ``device`` lists when each ep task they launched *ran* (``DeviceRun``): a matmul's
kernel time is the matmul act's, not that of the act that waits for it.

* ``to_chrome_trace(records)`` - the Chrome trace event format (open the JSON in
  ui.perfetto.dev), one track per actor thread (acts of one thread never overlap);
* ``plot(records, path)`` / ``plot_many({label: records}, path)`` - PNGs with matplotlib;
* ``report_to_tracers(vm, record)`` - while ``flow.trace()`` records, each act also
  reaches the VM's tracers, as an instruction on a stream named "actor <thread>", so
  one trace shows the actors above the VM streams their ops ran on.
"""

from __future__ import annotations

import dataclasses
import itertools
import types

from pyflow.vm import set_issuer

__all__ = ["ActRecord", "DeviceRun", "ActDeviceWork", "issuing_acts", "issuing_act", "act_record",
           "with_device_runs", "to_chrome_trace", "save_chrome_trace", "plot", "plot_many", "report_to_tracers"]


@dataclasses.dataclass(frozen=True)
class DeviceRun:
    """One ep-stream task an act's instructions launched, and when it ran there (perf_counter seconds)."""

    instruction: str   # the VM instruction that launched it: "matmul", "fuse[fill,fill]"...
    ep_stream: str     # where it ran, e.g. "cuda:0/compute"
    task: str          # what ran: the op's kernel ("matmul"), "memcpy_d2h", "record_event"...
    started: float
    finished: float


class ActDeviceWork:
    """The VM issuer (``pyflow.vm.set_issuer``) of one act's instructions: per ep task they launched, the
    fields of its ``DeviceRun``, added by the ep stream's thread when the task ran (a plain tuple there: the
    ``DeviceRun`` is made when the timeline is read, ``with_device_runs``, off the stream's path)."""

    __slots__ = ("runs",)

    def __init__(self):
        self.runs: list = []

    def on_device_work(self, work, ep_stream: str, task: str, started: float, finished: float) -> None:
        self.runs.append((work.name, ep_stream, task, started, finished))


def issuing_acts(act_fn, pending: dict):
    """``act_fn`` with a fresh ``ActDeviceWork`` as the issuer of the instructions each act builds, left in
    ``pending[task id]`` for the act's record (``Runtime.record_act``, on the same thread, right after)."""
    def act(plan, task, ins, outs, j, call):
        work = pending[task.task_id] = ActDeviceWork()
        previous = set_issuer(work)
        try:
            return act_fn(plan, task, ins, outs, j, call)
        finally:
            set_issuer(previous)
    return act


def issuing_act(pending: dict, task_id: int, fn, args: tuple):
    """``fn(*args)``, one act of task ``task_id`` that is no ``act_fn``'s (an input-wise actor's), with a fresh
    ``ActDeviceWork`` as the issuer of the instructions it builds, left in ``pending[task_id]`` as
    ``issuing_acts`` leaves it."""
    work = pending[task_id] = ActDeviceWork()
    previous = set_issuer(work)
    try:
        return fn(*args)
    finally:
        set_issuer(previous)


@dataclasses.dataclass(frozen=True)
class ActRecord:
    """One act: who, where, when (perf_counter seconds), which piece, which regsts, when its device work ran."""

    actor_id: int
    op_name: str
    kind: str          # the actor kind: normal, source_tick, repeat, acc...
    thread: str        # the actor thread's name
    start: float
    end: float
    piece: tuple       # (call, j)
    consumed: tuple    # ((regst desc id, copy index, piece), ...) read by this act
    produced: tuple    # ((regst desc id, copy index, piece), ...) sent by this act
    device: tuple = ()   # a DeviceRun per ep task its instructions launched, in the order they ran

    @property
    def call(self) -> int:
        return self.piece[0]

    @property
    def device_start(self) -> float | None:
        """When the first ep task of this act started running (None: it launched none)."""
        return min((run.started for run in self.device), default=None)

    @property
    def device_end(self) -> float | None:
        """When the last ep task of this act finished running (None: it launched none)."""
        return max((run.finished for run in self.device), default=None)


def act_record(actor, piece: tuple, start: float, end: float, consumed, produced) -> ActRecord:
    """The ``ActRecord`` of one act of ``actor`` (what ``Runtime.record_act`` keeps, as a tuple, per act)."""
    return ActRecord(actor.actor_id, actor.op_name, actor.kind, actor.thread.name, start, end, piece,
                     tuple(consumed), tuple(produced))


def with_device_runs(record: ActRecord, work: ActDeviceWork | None) -> ActRecord:
    """``record`` with the ep tasks ``work`` saw run so far."""
    if work is None or not work.runs:
        return record
    return dataclasses.replace(record, device=tuple(DeviceRun(*run) for run in list(work.runs)))


def to_chrome_trace(records) -> dict:
    """The Chrome trace event format: process "pyflow actors", one track per actor thread, then one per ep stream
    (each act's device runs, named by its op)."""
    records = sorted(records, key=lambda r: r.start)
    events = [{"ph": "M", "name": "process_name", "pid": 2, "tid": 0, "ts": 0, "args": {"name": "pyflow actors"}}]
    if not records:
        return {"traceEvents": events, "displayTimeUnit": "ms"}
    origin = records[0].start
    threads = sorted({r.thread for r in records})
    lanes = sorted({run.ep_stream for r in records for run in r.device})
    for tid, name in enumerate(threads + [f"ep {lane}" for lane in lanes], start=1):
        events.append({"ph": "M", "name": "thread_name", "pid": 2, "tid": tid, "ts": 0, "args": {"name": name}})
    for r in records:
        events.append({"ph": "X", "name": r.op_name, "cat": r.kind, "pid": 2, "tid": threads.index(r.thread) + 1,
                       "ts": round((r.start - origin) * 1e6, 3), "dur": round((r.end - r.start) * 1e6, 3),
                       "args": {"actor": r.actor_id, "piece": list(r.piece),
                                "consumed": [list(map(_plain, c)) for c in r.consumed],
                                "produced": [list(map(_plain, p)) for p in r.produced]}})
        for run in r.device:
            events.append({"ph": "X", "name": r.op_name, "cat": "device", "pid": 2,
                           "tid": len(threads) + lanes.index(run.ep_stream) + 1,
                           "ts": round((run.started - origin) * 1e6, 3),
                           "dur": round((run.finished - run.started) * 1e6, 3),
                           "args": {"actor": r.actor_id, "piece": list(r.piece), "task": run.task,
                                    "instruction": run.instruction}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"clock": "time.perf_counter(), microseconds since the first act", "acts": len(records)}}


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def save_chrome_trace(records, path) -> str:
    import json
    path = str(path)
    with open(path, "w", encoding="utf-8") as file:
        json.dump(to_chrome_trace(records), file)
    return path


def _span(records) -> float:
    return max((r.end for r in records), default=0.0) - min((r.start for r in records), default=0.0)


def _draw(axes, records, title: str, span: float) -> None:
    """One row per actor thread; each act a bar (call n: blue if even, grey if odd), labelled if wide enough."""
    records = sorted(records, key=lambda r: r.start)
    threads = sorted({r.thread for r in records})
    origin = records[0].start if records else 0.0
    colours = ("tab:blue", "0.6")   # even calls blue, odd calls grey, as in seed 003's figures
    for r in records:
        row = threads.index(r.thread)
        left, width = (r.start - origin) * 1e3, max((r.end - r.start) * 1e3, 1e-4)
        axes.broken_barh([(left, width)], (row + 0.1, 0.8), facecolors=colours[r.call % 2],
                         edgecolors="white", linewidth=0.3)
        share = (r.end - r.start) / span if span > 0 else 0.0
        label = f"{r.op_name} {r.piece[0]}.{r.piece[1]}" if share > 0.07 else f"{r.piece[0]}" if share > 0.012 else ""
        if label:
            axes.text(left + width / 2, row + 0.5, label, ha="center", va="center", fontsize=6, color="white",
                      clip_on=True)
    axes.set_yticks([i + 0.5 for i in range(len(threads))], [t.replace("pyflow-actor-", "") for t in threads],
                    fontsize=7)
    axes.set_ylim(max(len(threads), 1), 0)
    axes.set_xlim(0, max(span * 1e3, 1e-3))
    axes.set_xlabel("ms since the first act")
    axes.set_title(title, fontsize=9)
    axes.grid(axis="x", alpha=0.3)


def plot_many(timelines: dict, path, title: str = "actor timelines (blue: even calls, grey: odd calls)") -> str:
    """One panel per ``{label: records}`` entry, stacked on one time scale, to a PNG at ``path``."""
    from pyflow.trace.plot import matplotlib_classes
    Figure, FigureCanvasAgg, _ = matplotlib_classes("timeline.plot_many()",
                                                    "save_chrome_trace(records, path) writes the trace JSON without it")
    rows = [len({r.thread for r in records}) for records in timelines.values()]
    figure = Figure(figsize=(12, 1.2 + sum(0.45 * max(n, 1) + 0.8 for n in rows)), dpi=100)
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(len(timelines), 1, height_ratios=[max(n, 1) + 1 for n in rows])
    span = max((_span(records) for records in timelines.values()), default=0.0)   # one time scale for all
    for i, (label, records) in enumerate(timelines.items()):
        _draw(figure.add_subplot(grid[i]), list(records), f"{label}: {len(records)} acts", span)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(str(path), format="png")
    return str(path)


def plot(records, path, title: str = "actor timeline") -> str:
    """The acts of ``records`` as a PNG at ``path``: one row per actor thread."""
    return plot_many({title: records}, path, title="blue: even calls, grey: odd calls")


_stream_ids: dict = {}
_serials = itertools.count(1 << 40)


def report_to_tracers(vm, record: ActRecord) -> None:
    """Hand ``record`` to the VM's tracers (``flow.trace()``) as if it were an instruction."""
    tracers = list(vm.tracers)
    if not tracers:
        return
    name = f"actor {record.thread.replace('pyflow-actor-', '')}"
    stream_id = _stream_ids.setdefault(name, 1_000_000 + len(_stream_ids))
    times = {"received": record.start, "dispatched": record.start, "started": record.start,
             "launched": record.end, "released": record.end}
    act = types.SimpleNamespace(name=f"act {record.op_name} {record.piece}", times=times, serial=next(_serials),
                                stream=types.SimpleNamespace(name=name,
                                                             symbol=types.SimpleNamespace(unique_stream_id=stream_id)),
                                count=1, event=None, failed=False)
    for tracer in tracers:
        tracer.on_release(act)
