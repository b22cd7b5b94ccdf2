"""The actor timeline: one record per act, as a Chrome/Perfetto trace, a PNG, and inside ``flow.trace``.

Every act of every actor leaves an ``ActRecord``: who acted (actor id, op, kind), on
which thread, when (``time.perf_counter()`` at the start and end of issuing its work),
for which piece ``(call, j)``, and which regsts it read and wrote (``(desc id, copy,
piece)``).  ``Runtime.timeline()`` returns them; with them one can *see* pipelining
(seed 003's figures: each thread a row, the calls in alternating colours) and check
back pressure: with regst num r a producer is never more than r pieces ahead.

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

__all__ = ["ActRecord", "to_chrome_trace", "save_chrome_trace", "plot", "plot_many", "report_to_tracers"]


@dataclasses.dataclass(frozen=True)
class ActRecord:
    """One act: who, where, when (perf_counter seconds), which piece, which regsts."""

    actor_id: int
    op_name: str
    kind: str          # the actor kind: normal, source_tick, repeat, acc...
    thread: str        # the actor thread's name
    start: float
    end: float
    piece: tuple       # (call, j)
    consumed: tuple    # ((regst desc id, copy index, piece), ...) read by this act
    produced: tuple    # ((regst desc id, copy index, piece), ...) sent by this act

    @property
    def call(self) -> int:
        return self.piece[0]


def to_chrome_trace(records) -> dict:
    """The Chrome trace event format: process "pyflow actors", one track per actor thread."""
    records = sorted(records, key=lambda r: r.start)
    events = [{"ph": "M", "name": "process_name", "pid": 2, "tid": 0, "ts": 0, "args": {"name": "pyflow actors"}}]
    if not records:
        return {"traceEvents": events, "displayTimeUnit": "ms"}
    origin = records[0].start
    threads = sorted({r.thread for r in records})
    for tid, name in enumerate(threads, start=1):
        events.append({"ph": "M", "name": "thread_name", "pid": 2, "tid": tid, "ts": 0, "args": {"name": name}})
    for r in records:
        events.append({"ph": "X", "name": r.op_name, "cat": r.kind, "pid": 2, "tid": threads.index(r.thread) + 1,
                       "ts": round((r.start - origin) * 1e6, 3), "dur": round((r.end - r.start) * 1e6, 3),
                       "args": {"actor": r.actor_id, "piece": list(r.piece),
                                "consumed": [list(map(_plain, c)) for c in r.consumed],
                                "produced": [list(map(_plain, p)) for p in r.produced]}})
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
