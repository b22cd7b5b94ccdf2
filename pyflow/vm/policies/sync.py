"""Seeds 000/002: synchronisation instructions: events, stream waits, barriers.

SoftSyncStream (``pyflow/vm/builder.py``) orders a tensor's users on different
streams with these.  Each one *writes* the tensor's dependence object.  So the
chain producer -> sync instruction(s) -> consumer follows from the ordinary
dependence rules:

* ``StreamWait`` (both streams on one worker thread): on the consumer's stream,
  record an event on the producer's ep stream and make the consumer's ep stream
  wait for it.  The device orders the work and the host never waits.  Its
  in-edge from the producer's stream is satisfied once the producer is
  dispatched, because the worker computes in order (``prescheduleable``).
* ``StreamRecordEvent`` + ``StreamWaitEvent`` (streams on different worker
  threads): the same, split in two; the wait goes once the record is launched.
* ``RecordEvent`` (no stream wait possible, e.g. between the CPU and a GPU):
  record an event when the stream needs soft sync (``need_soft_sync``).  The
  instruction is *done* only when the event completes, so the consumer, which has
  an edge from it, waits on the host.
* ``Barrier`` runs a callback on the scheduler thread once every instruction
  received before it has been released (``flow.sync()`` is one).
"""

from __future__ import annotations

from pyflow.device.stream import need_soft_sync
from pyflow.vm.policies.base import InstructionPolicy

__all__ = ["RecordEvent", "StreamWait", "StreamRecordEvent", "StreamWaitEvent", "Barrier"]


class _WritesDeps(InstructionPolicy):
    def __init__(self, deps):
        self.deps = list(deps)

    def output_dependences(self) -> list:
        return self.deps


class RecordEvent(_WritesDeps):
    """Make "done" mean "the stream's work so far completed" (if the stream needs it)."""

    name = "record_event"
    fuse_type = "tail_only"

    def __init__(self, deps, stream_symbol):
        super().__init__(deps)
        self.records_event = need_soft_sync(stream_symbol.stream_type, stream_symbol.device.device_type)


class StreamWait(_WritesDeps):
    """On the consumer stream: record on ``from_stream``, wait here (same worker thread)."""

    name = "stream_wait"

    def __init__(self, deps, from_stream, to_stream):
        super().__init__(deps)
        self.from_stream = from_stream
        self._sequential = to_stream.schedule_dep

    @property
    def stream_sequential_dependence(self):
        return self._sequential

    def prescheduleable(self, src_stream, dst_stream) -> bool:
        return src_stream.thread_ctx is dst_stream.thread_ctx

    def compute(self, instruction) -> None:
        event = self.from_stream.ep_device.create_event()
        self.from_stream.ep_stream.record_event(event)
        instruction.stream.ep_stream.wait_event(event)


class StreamRecordEvent(_WritesDeps):
    """First half of a cross-thread stream wait: record an event (done once launched)."""

    name = "stream_record_event"

    def __init__(self, deps):
        super().__init__(deps)
        self.event = None

    def compute(self, instruction) -> None:
        self.event = instruction.stream.ep_device.create_event()
        instruction.stream.ep_stream.record_event(self.event)


class StreamWaitEvent(_WritesDeps):
    """Second half: the consumer's ep stream waits for the recorded event."""

    name = "stream_wait_event"

    def __init__(self, deps, record: StreamRecordEvent):
        super().__init__(deps)
        self.record = record

    def compute(self, instruction) -> None:
        instruction.stream.ep_stream.wait_event(self.record.event)


class Barrier(InstructionPolicy):
    """Run ``callback()`` on the scheduler thread after everything received before it."""

    is_barrier = True

    def __init__(self, callback, name: str = "barrier"):
        self.callback, self.name = callback, name

    def compute(self, instruction) -> None:
        self.callback()
