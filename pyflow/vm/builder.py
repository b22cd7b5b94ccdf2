"""Seeds 000/002: ``InstructionsBuilder``, ``PhysicalRun`` and ``SoftSyncStream``.

``physical_run(build)`` makes a builder, lets ``build(builder)`` append instructions
and hands the list to the VM.  It holds the VM's build lock while it does so,
which keeps the list and the tensors' stream bookkeeping consistent when several
user threads issue ops.  The builder's methods are OneFlow's:

* ``call(...)`` - an op (OpCall).  If the stream does not own its allocator (a
  host2device copy) the outputs are first allocated on the allocator stream.
  Then outputs and inputs are soft-synced to the op's stream;
* ``launch_program(...)`` - a whole compiled Cocktailer program as one instruction;
* ``release_tensors(storages)`` (one ReleaseTensor per producer stream for a batch),
  ``access_blob_by_callback(...)``,
  ``global_sync(callback)`` / ``barrier(callback)``;
* ``soft_sync_stream(blobs, stream)`` - for each blob last used on another
  stream L: ``StreamWait`` when L and S are on one CUDA device and both support
  stream wait (one instruction if they share a worker, else a record/wait pair),
  otherwise ``RecordEvent`` on L.  Then every blob's ``last_used_stream`` is S.

Every instruction remembers the user's line and thread that issued it
(``policy.site`` / ``policy.thread``): a failure names that line and is
pending for that thread.  It also carries the thread's *issuer* (``set_issuer``),
if one is set: whoever wants to hear when its ep-stream work runs.  Back pressure waits *before* anything is built, and
building + receiving is a critical stretch (``interrupts.critical``): a Ctrl-C
never leaves a tensor's stream history pointing at an instruction the VM did not
receive.
"""

from __future__ import annotations

import contextlib
import threading

from pyflow.device import Device
from pyflow.device.device import DeviceType
from pyflow.device.stream import Stream as StreamSymbol
from pyflow.device.stream import StreamType, allocator_stream_type, default_stream
from pyflow.errors import DistributedError
from pyflow.vm import interrupts
from pyflow.vm.failure import issue_site
from pyflow.vm.instruction import Instruction
from pyflow.vm.policies import (AccessBlobByCallback, AllocateTensors, Barrier, LaunchLazyJob, LaunchProgram, OpCall,
                                RecordEvent, ReleaseTensor, StreamRecordEvent, StreamWait, StreamWaitEvent)

__all__ = ["InstructionsBuilder", "physical_run", "supports_stream_wait_between", "no_instructions", "set_issuer"]

_forbidden = threading.local()  # .reason: why this thread may not issue instructions now
_issuing = threading.local()    # .issuer: what the instructions this thread builds carry (``set_issuer``)


def set_issuer(issuer):
    """Instructions this thread builds from now on carry ``issuer`` (None: nobody); returns the previous one, to
    set back.

    When an ep stream runs a task one of them launched, the VM tells the issuer as it tells ``flow.trace()``'s
    tracers (``stream.TracedWork``): ``issuer.on_device_work(work, ep_stream, task, started, finished)``, on the
    thread that ran it.  The actor runtime sets one per act, so its timeline says when each act's kernels ran,
    not only when the act queued them.
    """
    previous = getattr(_issuing, "issuer", None)
    _issuing.issuer = issuer
    return previous


@contextlib.contextmanager
def no_instructions(reason: str):
    """Inside the block, issuing an instruction on this thread raises (metadata-only work)."""
    previous = getattr(_forbidden, "reason", None)
    _forbidden.reason = reason
    try:
        yield
    finally:
        _forbidden.reason = previous


def supports_stream_wait_between(from_stream, to_stream) -> bool:
    """OneFlow's SupportingStreamWait: device-side waiting is possible between the two."""
    return (from_stream.device is to_stream.device
            and from_stream.device.device_type is DeviceType.cuda
            and from_stream.support_wait_event and to_stream.support_wait_event
            and not from_stream.on_independent_thread and not to_stream.on_independent_thread)


class InstructionsBuilder:
    """Collects instructions for one PhysicalRun."""

    def __init__(self, vm, site=None):
        self.vm = vm
        self.instructions: list[Instruction] = []
        self.site = site if site is not None else issue_site()   # the user's line that issued this PhysicalRun
        self.thread = threading.get_ident()
        self.issuer = getattr(_issuing, "issuer", None)

    def _append(self, stream_symbol, policy, vm_stream=None) -> Instruction:
        policy.site, policy.thread, policy.issuer = self.site, self.thread, self.issuer
        instruction = Instruction(vm_stream or self.vm.get_vm_stream(stream_symbol), policy)
        self.instructions.append(instruction)
        return instruction

    # --- ops ---------------------------------------------------------------------------

    def call(self, name: str, run, inputs, outputs, stream, mutable_inputs=(), sequential=False,
             on_failed_inputs=None) -> None:
        """An op on ``stream``: ``run(out_arrays, in_arrays, native_stream)`` computes it."""
        allocator_type = allocator_stream_type(stream.stream_type)
        if allocator_type is not None and allocator_type is not stream.stream_type:
            self.allocate_tensors(outputs, StreamSymbol.new(stream.device, allocator_type))
        self.soft_sync_stream(outputs, stream)
        self.soft_sync_stream(inputs, stream)
        for blob in outputs:
            if blob.storage.producer_stream is None:
                blob.storage.producer_stream = stream
        vm_stream = self.vm.get_vm_stream(stream)
        self._append(stream, OpCall(name, run, inputs, outputs, vm_stream, mutable_inputs, sequential,
                                    on_failed_inputs), vm_stream)

    def allocate_tensors(self, blobs, stream) -> None:
        self.soft_sync_stream(blobs, stream)
        self._append(stream, AllocateTensors(blobs))
        for blob in blobs:
            if blob.storage.producer_stream is None:
                blob.storage.producer_stream = stream

    # --- memory ----------------------------------------------------------------------------

    def release_tensor(self, storage) -> None:
        """Free a storage on its producer stream, after its last user (OneFlow's ReleaseTensor)."""
        self.release_tensors([storage])

    def release_tensors(self, storages) -> None:
        """Free storages, each on its producer stream after its last user: ONE ReleaseTensor per
        producer stream for the whole batch (the storages whose tensors died since the last PhysicalRun).

        A storage last used on another stream first has that stream synced to the producer
        (one sync per pair of streams, for all the storages that need it).
        """
        by_producer: dict = {}
        syncs: dict = {}
        for storage in storages:
            producer, last_used = storage.producer_stream, storage.last_used_stream
            if producer is None:
                continue  # never used by any instruction: no memory was ever allocated
            if last_used is not None and last_used is not producer:
                syncs.setdefault((last_used, producer), []).append(storage.dep)
                storage.last_used_stream = producer
            by_producer.setdefault(producer, []).append(storage)
        for (last_used, producer), deps in syncs.items():
            if last_used.device is producer.device and supports_stream_wait_between(last_used, producer):
                self._soft_sync_between(deps, last_used, producer)
            else:
                self._append(last_used, RecordEvent(deps, last_used))
        for producer, group in by_producer.items():
            self._append(producer, ReleaseTensor(group))

    def drain_releases(self) -> None:
        """Turn storages whose tensors died (queued by finalizers) into ReleaseTensor instructions."""
        releases = self.vm.release_queue
        if releases.empty():
            return
        storages = []
        while not releases.empty():
            storage = releases.get_nowait()
            self.vm.unwatch(storage)
            storages.append(storage)
        self.release_tensors(storages)

    def access_blob_by_callback(self, blob, callback, modifier: str = "const", name: str = "access_blob") -> None:
        """``callback(ep_stream, blob)`` on the blob device's default compute stream."""
        stream = default_stream(blob.device)
        self.soft_sync_stream([blob], stream)
        if blob.storage.producer_stream is None:
            blob.storage.producer_stream = stream
        self._append(stream, AccessBlobByCallback(blob, callback, modifier, name))

    def launch_lazy_job(self, job_name: str, launch, inputs, outputs=()) -> None:
        """One call of a compiled graph (``pyflow/vm/policies/launch_lazy_job.py``): LaunchLazyJob, whose
        ``launch()`` hands it to the actor runtime, on the lazy-job-launcher stream, reading ``inputs``
        (EagerBlobObjects); ``launch`` None: none.  Then, per ``(index, blob, fetch)`` of ``outputs``, an
        output critical section on the blob's device's critical-section stream, writing the blob with
        ``fetch()``'s tensor (it waits for the call to make it).  Each such blob must be fresh, made for this call
        and never touched by device work (nn.Graph's output tensors: ``empty``, which launches nothing), so the
        section needs no sync with its stream.  Neither instruction leaves work on its stream that a later user
        of the blobs must be synced with (the launch touches no memory; a section syncs its ep stream before it is
        done), so neither is any blob's ``last_used_stream``: no record_event per call on any stream for them."""
        from pyflow.vm.policies.launch_lazy_job import OutputCriticalSection

        if launch is not None:   # (no soft sync: the launch touches no input's memory, it only comes after the
            #                       inputs' writers; the acts' ops that read them sync with their streams themselves)
            stream = StreamSymbol.new(Device("cpu"), StreamType.lazy_job_launcher)
            self._append(stream, LaunchLazyJob(job_name, launch, inputs))
        for index, blob, fetch in outputs:
            # (no soft sync either way: a fresh blob has no device work to wait for, and the section syncs its ep
            # stream before it is done; a record_event on the blob's stream would be queued behind every kernel
            # issued so far, one on the critical-section stream would cost its worker two more hand-offs)
            stream = StreamSymbol.new(blob.device, StreamType.critical_section)
            self._append(stream, OutputCriticalSection(job_name, index, blob, fetch))

    def launch_program(self, name: str, run, inputs, outputs, scratch, stream) -> None:
        """One call of a compiled Cocktailer program as ONE instruction on ``stream`` (``LaunchProgram``).

        It reads ``inputs`` and writes ``outputs`` and ``scratch`` (the program's arena,
        given back by the instruction itself once the program is queued), soft-synced
        like any op; ``run(out_and_scratch_arrays, in_arrays, native_stream)`` runs it.
        """
        outputs, scratch = list(outputs), list(scratch)
        self.soft_sync_stream(outputs + scratch, stream)
        self.soft_sync_stream(inputs, stream)
        for blob in outputs + scratch:
            if blob.storage.producer_stream is None:
                blob.storage.producer_stream = stream
        self._append(stream, LaunchProgram(name, run, inputs, outputs, scratch, self.vm.get_vm_stream(stream)))

    # --- barriers ------------------------------------------------------------------------------

    def barrier(self, callback, name: str = "barrier") -> None:
        self._append(StreamSymbol.new(Device("cpu"), StreamType.barrier), Barrier(callback, name))

    def global_sync(self, callback) -> None:
        """Barrier that also waits for every ep stream (device work), then calls ``callback``."""
        vm = self.vm

        def sync_everything():
            try:
                errors = []
                for ep_stream in vm.ep_streams():
                    try:
                        ep_stream.sync()
                    except Exception as error:  # noqa: BLE001 - reported below, after every stream
                        errors.append(error)
                if errors:
                    raise errors[0]  # the barrier fails: pending for the thread that called sync
            finally:
                callback()

        self.barrier(sync_everything, name="global_sync")

    # --- SoftSyncStream ----------------------------------------------------------------------------

    def soft_sync_stream(self, blobs, stream) -> None:
        """Order ``blobs``' earlier users on other streams before ``stream`` uses them."""
        by_stream = None
        for blob in blobs:
            storage = blob.storage
            last = storage.last_used_stream
            if last is not stream:
                if last is not None:   # used on another stream before: that stream must come first
                    by_stream = by_stream if by_stream is not None else {}
                    deps = by_stream.setdefault(last, [])
                    if storage.dep not in deps:
                        deps.append(storage.dep)
                storage.last_used_stream = stream
        if by_stream:
            for last, deps in by_stream.items():
                self._soft_sync_between(deps, last, stream)

    def _soft_sync_between(self, deps, from_stream, to_stream) -> None:
        if supports_stream_wait_between(from_stream, to_stream):
            vm_from, vm_to = self.vm.get_vm_stream(from_stream), self.vm.get_vm_stream(to_stream)
            if vm_from.thread_ctx is vm_to.thread_ctx:
                self._append(to_stream, StreamWait(deps, vm_from, vm_to))
            else:
                record = StreamRecordEvent(deps)
                self._append(from_stream, record)
                self._append(to_stream, StreamWaitEvent(deps, record))
        else:
            self._append(from_stream, RecordEvent(deps, from_stream))


def physical_run(build, vm, site=None) -> None:
    """Build instructions with ``build(builder)`` and hand them to ``vm`` (OneFlow's PhysicalRun).

    ``site``: the ``(filename, lineno)`` failures of these instructions name, where the issuer knows it
    already (an nn.Graph act: its task); None: ``issue_site()`` finds the user's line on the stack.
    In step-through mode the caller then runs the schedule rounds itself.
    """
    reason = getattr(_forbidden, "reason", None)
    if reason is not None:
        raise DistributedError(f"{reason}: this needs data, which only the placement's ranks have")
    vm.check()                 # a VM thread's unexpected error is raised here, at the next call
    vm.apply_back_pressure()   # may wait: before anything is built
    with interrupts.critical(), vm.build_lock:
        builder = InstructionsBuilder(vm, site)
        builder.drain_releases()
        build(builder)
        vm.receive(builder.instructions)
    if vm.sync_mode:
        vm.drive()
