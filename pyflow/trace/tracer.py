"""``Tracer`` and ``trace()``: what each VM instruction did, and when, per stream.

The VM marks every instruction's life with ``time.perf_counter()`` in
``instruction.times``, and calls ``tracer.on_release(instruction)`` for every
object in ``vm.tracers`` when it releases one.  A ``Tracer`` turns each release
into an ``InstructionRecord``:

    received   -> dispatched : waiting for dependences (its in-edges, SEMANTICS 3)
    dispatched -> started    : queued on the stream's worker thread
    started    -> launched   : compute (on a GPU: the kernel is queued, not finished)
    launched   -> released   : done-waiting (an ep event, e.g. device2host), then release

Queued is not run: a cuda matmul's compute only queues its kernel on the ep stream, which runs
it later, often after the matmul was released, while the next ``numpy()`` waits for it.  So
each task an instruction launches on an ep stream also reports when it ran there (the VM's
``TracedWork``, ``pyflow/vm/stream.py``): a ``DeviceWorkRecord``, attributed to the
instruction that launched it (``tracer.device_records``; its own lanes in the Chrome trace).

``with trace() as tracer:`` (``flow.trace()``, ``flow.trace.trace()``) records exactly the instructions
received inside the block, on the current VM, and waits for them on exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import time

from pyflow import vm as _vm

__all__ = ["InstructionRecord", "DeviceWorkRecord", "Tracer", "trace"]


@dataclasses.dataclass(frozen=True)
class InstructionRecord:
    """One released instruction: where it ran and its ``time.perf_counter()`` marks (seconds)."""

    name: str                  # the policy's name: "relu", "copy", "stream_wait", "fuse[fill,fill]"...
    stream: str                # the vm stream's name, e.g. "cuda:0/compute"
    stream_id: int             # the stream symbol's unique_stream_id (orders the tracks)
    serial: int                # the instruction's serial number (creation order)
    count: int                 # received instructions it stands for (>1 when fused)
    received: float
    dispatched: float
    started: float | None      # None: compute never began (prepare failed, e.g. out of memory)
    launched: float
    released: float
    recorded_event: bool       # "done" waited for an ep event after launch
    failed: bool               # the instruction's prepare or compute raised

    @property
    def dependence_wait(self) -> float:
        """Seconds from received to dispatched (waiting for its in-edges)."""
        return self.dispatched - self.received

    @property
    def queue_wait(self) -> float:
        """Seconds from dispatched to started (queued behind earlier work on the worker)."""
        return (self.started if self.started is not None else self.launched) - self.dispatched

    @property
    def compute_time(self) -> float:
        """Seconds from started to launched (0 if compute never began)."""
        return 0.0 if self.started is None else self.launched - self.started


@dataclasses.dataclass(frozen=True)
class DeviceWorkRecord:
    """One task an instruction launched on an ep stream, and when it *ran* there (perf_counter seconds)."""

    name: str                  # the instruction's name: "matmul", "fuse[fill,fill]"...
    serial: int                # the instruction's serial (that of its InstructionRecord)
    stream: str                # the vm stream whose instruction launched it
    ep_stream: str             # where it ran, e.g. "cuda:0/compute"
    task: str                  # what ran: the op's kernel ("matmul"), "memcpy_d2h", "record_event"...
    started: float
    finished: float

    @property
    def run_time(self) -> float:
        """Seconds the ep stream spent on the task."""
        return self.finished - self.started


class Tracer:
    """Collects an ``InstructionRecord`` per released instruction (attach to ``vm.tracers``).

    ``since`` / ``until`` (perf_counter seconds) keep only instructions *received*
    in that window; ``close()`` stops recording for good.  ``on_release`` runs on
    the VM's scheduler thread (or the caller's, in step-through mode): it copies
    a few fields and appends under a lock.
    """

    def __init__(self, since: float = -math.inf, until: float = math.inf):
        self.since, self.until = since, until
        self.closed = False
        self._records: list[InstructionRecord] = []
        self._device_records: list[DeviceWorkRecord] = []
        self._lock = threading.Lock()

    def on_release(self, instruction) -> None:
        """The VM's hook: record ``instruction`` (just released) if it falls in the window."""
        times = instruction.times
        received = times.get("received")
        if self.closed or received is None or not self.since <= received < self.until:
            return
        stream = instruction.stream
        record = InstructionRecord(
            name=instruction.name, stream=stream.name, stream_id=stream.symbol.unique_stream_id,
            serial=instruction.serial, count=instruction.count, received=received,
            dispatched=times.get("dispatched", received), started=times.get("started"),
            launched=times.get("launched", received), released=times.get("released", received),
            recorded_event=instruction.event is not None, failed=instruction.failed)
        with self._lock:
            if not self.closed:
                self._records.append(record)

    def on_device_work(self, work, ep_stream: str, task: str, started: float, finished: float) -> None:
        """The VM's hook (``TracedWork.ran``, on the thread that ran the task): ``work``'s instruction's task
        ran on ``ep_stream`` from ``started`` to ``finished``; recorded if the instruction falls in the window."""
        if self.closed or work.received is None or not self.since <= work.received < self.until:
            return
        record = DeviceWorkRecord(name=work.name, serial=work.serial, stream=work.stream, ep_stream=ep_stream,
                                  task=task, started=started, finished=finished)
        with self._lock:
            if not self.closed:
                self._device_records.append(record)

    def close(self) -> None:
        """Record nothing more."""
        with self._lock:
            self.closed = True

    @property
    def records(self) -> list[InstructionRecord]:
        """A copy of the records so far, in release order."""
        with self._lock:
            return list(self._records)

    @property
    def device_records(self) -> list[DeviceWorkRecord]:
        """A copy of the ep-stream task records so far, in the order they finished (per ep stream)."""
        with self._lock:
            return list(self._device_records)

    def streams(self) -> list[str]:
        """The streams the records ran on, by unique_stream_id."""
        return [name for _, name in sorted({(r.stream_id, r.stream) for r in self.records})]

    # --- reports ----------------------------------------------------------------------

    def summary(self) -> str:
        """A small table per stream: instructions, total compute and waiting times."""
        records = self.records
        if not records:
            return "no instructions were traced"
        width = max(len("stream"), *(len(r.stream) for r in records)) + 2
        header = (f"{'stream':<{width}}{'instructions':>13}{'compute ms':>12}"
                  f"{'waited for deps ms':>20}{'queued ms':>11}")
        lines = [header, "-" * len(header)]
        for stream in self.streams():
            mine = [r for r in records if r.stream == stream]
            lines.append(f"{stream:<{width}}{len(mine):>13}"
                         f"{sum(r.compute_time for r in mine) * 1e3:>12.3f}"
                         f"{sum(r.dependence_wait for r in mine) * 1e3:>20.3f}"
                         f"{sum(r.queue_wait for r in mine) * 1e3:>11.3f}")
        device = self.device_records
        for ep_stream in sorted({d.ep_stream for d in device}):
            mine = [d for d in device if d.ep_stream == ep_stream]
            lines.append(f"ep {ep_stream}: {len(mine)} tasks ran for {sum(d.run_time for d in mine) * 1e3:.3f} ms "
                         "(when the ep stream ran them: a kernel's time is its op's)")
        span = max(r.released for r in records) - min(r.received for r in records)
        lines.append(f"{len(records)} instructions on {len(self.streams())} streams in {span * 1e3:.3f} ms "
                     "(waits are summed: instructions wait at the same time)")
        return "\n".join(lines)

    def to_chrome_trace(self) -> dict:
        """The Chrome trace event format dict (open the saved JSON in ui.perfetto.dev)."""
        from pyflow.trace.chrome import to_chrome_trace
        return to_chrome_trace(self.records, self.device_records)

    def save(self, path) -> str:
        """Write ``to_chrome_trace()`` as JSON to ``path``; returns the path as a string."""
        import json
        path = str(path)
        with open(path, "w", encoding="utf-8") as file:
            json.dump(self.to_chrome_trace(), file)
        return path

    def plot(self, path) -> str:
        """Draw the timeline to a PNG at ``path`` (needs matplotlib: ``pip install matplotlib``)."""
        from pyflow.trace.plot import plot
        return plot(self.records, path)

    def __repr__(self) -> str:
        return f"<Tracer: {len(self.records)} instructions{', closed' if self.closed else ''}>"


@contextlib.contextmanager
def trace():
    """Record every VM instruction received inside the block (``flow.trace()``).

    On entry, waits for earlier work (``flow.sync()``) so the trace starts clean;
    on exit, waits for the block's work (``flow.sync()``; the nn.Graph calls made in
    the block are part of it, their last acts included), then detaches.  The
    syncs' own barriers are left out of the trace.

    >>> import pyflow as flow
    >>> from pyflow.trace import trace
    >>> with trace() as tracer:
    ...     y = flow.relu(flow.tensor([1.0, -1.0]))
    >>> sorted({r.name for r in tracer.records})
    ['relu', 'tensor']
    """
    _vm.sync()
    machine = _vm.get_vm()
    tracer = Tracer(since=time.perf_counter())
    machine.tracers.append(tracer)
    try:
        yield tracer
    finally:
        try:   # nn.Graph calls made in the block issue their last instructions and acts inside it
            _vm.wait_for_issuers()
        finally:
            tracer.until = time.perf_counter()
        try:
            _vm.sync()
        finally:
            tracer.close()
            with contextlib.suppress(ValueError):
                machine.tracers.remove(tracer)
