"""Seeds 000/002: ``VmStream`` (OneFlow's ``vm::Stream``) and its ``StreamPolicy``: where an instruction runs.

One vm stream exists per ``Stream`` symbol (device, stream type, thread uid).  It
knows:

* its **worker**: the ``ThreadCtx`` shared by every stream of one device type
  and thread uid (OneFlow: one ThreadCtx per device type), or the scheduler
  thread itself for barrier streams and the lazy-job launcher's (``on_scheduler_thread``);
* its **ep stream**, created lazily on first use (OneFlow's
  ``GetOrCreateEpStream``): an asynchronous one normally, an inline one in the
  VM's step-through mode;
* its **allocator** (shared with the other streams that allocate like it:
  compute and host2device use the device's compute allocator; device2host uses
  pinned host memory);
* its **running list**: dispatched instructions not yet released, in order;
* ``ahead`` / ``held``: the engine's throttle on memory allocated for work the
  worker has not started (see ``engine.py``);
* whether it is **event-recorded** (host2device and device2host: an instruction is
  done only when the device finished it, not when it was queued);
* its **stream-sequential dependence** (``schedule_dep``).

``run(instruction)`` is ``StreamPolicy::Run``: activate the device, compute, and
record an ep event when "done" must wait for the device (device2host streams,
RecordEvent instructions).  While ``flow.trace()`` records, or for an instruction with an
issuer (``builder.set_issuer``: an actor's act), the ep work it launches reports when it *runs*
(``TracedWork``): on an asynchronous ep stream that is later than the compute that queued it,
often after the instruction was released.
"""

from __future__ import annotations

import collections
import time
import weakref

from pyflow.device import ep
from pyflow.device.stream import StreamType, allocator_stream_type
from pyflow.vm.dependence import LocalDepObject

__all__ = ["VmStream", "TracedWork"]


_where: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # ep stream -> "device/stream", for ``ran``


class TracedWork:
    """The work owner (``pyflow.device.ep.base.set_work_owner``) of one instruction (one member of a fused one)
    while the VM's tracers record, or while its policy has an issuer: each ep task it launched tells them, and
    the issuer, when it ran.  Holds the instruction's name and marks only (the instruction itself, and its
    tensors, may be gone by then)."""

    __slots__ = ("vm", "name", "serial", "stream", "received", "issuer")

    def __init__(self, vm, instruction, stream_name: str, issuer=None):
        self.vm, self.name, self.serial, self.stream = vm, instruction.policy.name, instruction.serial, stream_name
        self.received = instruction.received_at   # (``instruction.times["received"]``, without building the dict)
        self.issuer = issuer

    def ran(self, ep_stream, task: str, started: float, finished: float) -> None:
        where = _where.get(ep_stream)   # (one name per ep stream, made once: every traced task asks)
        if where is None:
            where = _where[ep_stream] = f"{ep_stream.device.device}/{ep_stream.name}"
        for tracer in list(self.vm.tracers):
            tracer.on_device_work(self, where, task, started, finished)
        if self.issuer is not None:
            self.issuer.on_device_work(self, where, task, started, finished)


class VmStream:
    """The VM's side of one stream symbol (OneFlow ``vm::Stream``)."""

    def __init__(self, vm, symbol, thread_ctx):
        self.vm = vm
        self.symbol = symbol
        self.device = symbol.device
        self.stream_type = symbol.stream_type
        self.name = f"{self.device}/{self.stream_type.name}" + (f"/t{symbol.thread_uid}" if symbol.thread_uid else "")
        self.thread_ctx = thread_ctx
        # A barrier runs where the scheduler stands.  So does ``LaunchLazyJob`` (an nn.Graph call handed to the
        # actor runtime, ``policies/launch_lazy_job.py``): OneFlow gives it a thread of its own because there it
        # lasts as long as the call; pyflow's only sends the source tick a message and returns, so a worker
        # thread of its own would only add a thread hand-off per graph call (caller -> scheduler -> launcher ->
        # actor: the scheduler sends the message itself).
        self.on_scheduler_thread = self.stream_type in (StreamType.barrier, StreamType.lazy_job_launcher)
        # Every instruction of a copy stream records an event, so the host knows when
        # the copy is over: device2host (the data has landed) and host2device (the
        # host source may be freed or read again).  OneFlow's event-recorded policy.
        self.event_recorded = self.stream_type in (StreamType.device2host, StreamType.host2device)
        self.running: collections.deque = collections.deque()
        # Memory planned ahead (the engine's throttle): dispatched instructions that allocate a lot
        # and have not been launched yet, and ready ones held back until those are launched.
        self.ahead: collections.deque = collections.deque()
        self.held: collections.deque = collections.deque()
        self.schedule_dep = LocalDepObject(f"stream {self.name}")
        self._ep_streams: dict[bool, object] = {}
        self._allocator = False

    # --- lazily created ep objects --------------------------------------------------

    @property
    def ep_device(self):
        return ep.get_device(self.device)

    @property
    def ep_stream(self):
        """The ep stream for the VM's current mode (inline in step-through mode)."""
        inline = self.vm.sync_mode
        stream = self._ep_streams.get(inline)
        if stream is None or stream.destroyed:  # (pyflow.device.ep.shutdown() destroys every ep stream)
            local_name = self.name.split("/", 1)[1]  # the ep device already names the device
            stream = self.ep_device.create_stream(local_name + ("/inline" if inline else ""), inline=inline)
            self._ep_streams[inline] = stream
        return stream

    def ep_streams(self) -> list:
        """Every ep stream created so far (both modes)."""
        return list(self._ep_streams.values())

    @property
    def allocator(self):
        """The caching allocator this stream's outputs come from (None: it allocates nothing)."""
        if self._allocator is False:   # looked up once: the VM keeps its allocators for good
            kind = allocator_stream_type(self.stream_type)
            self._allocator = None if kind is None else self.vm.allocator(self.device, kind)
        return self._allocator

    # --- StreamPolicy::Run ---------------------------------------------------------------

    def run(self, instruction) -> None:
        """Compute ``instruction`` here; record an event if "done" must wait for the device.

        Each member policy (one, or a fused group's) runs on its own through
        ``vm.compute_member``, so a failing member fails alone.  If something else
        goes wrong (an interrupt), the members that did not finish fail with it.
        """
        policy = instruction.policy
        members = policy.members()
        finished = 0
        traced = bool(self.vm.tracers) or policy.issuer is not None
        previous = ep.base.work_owner() if traced else None
        try:
            for member in members:   # (a traced op that failed in prepare never starts)
                if member.failure is None:
                    instruction.started_at = time.perf_counter()
                    break
            self.ep_device.set_as_active()
            compute_member = self.vm.compute_member
            for member in members:
                if traced:   # one owner per member: a fused group's members may be different acts'
                    ep.base.set_work_owner(TracedWork(self.vm, instruction, self.name, member.issuer))
                compute_member(member, instruction)
                finished += 1
            if self.event_recorded or policy.records_event:
                event = self.ep_device.create_event()
                self.ep_stream.record_event(event)
                instruction.event = event
        except BaseException as error:
            for policy in members[finished:]:
                if policy.failure is None:
                    self.vm.fail(policy, error)
            raise
        finally:
            if traced:
                ep.base.set_work_owner(previous)

    def __repr__(self) -> str:
        return f"<VmStream {self.name}>"
