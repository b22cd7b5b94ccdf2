"""Seed 002: ``OpCall`` (OneFlow's OpCallInstructionPolicy): run one op's kernel.

* **Reads** its inputs' storages and **writes** its outputs' (and any mutable
  input's, e.g. an in-place update).
* Stays **in stream order** (the stream-sequential dependence) when the op has
  mutable inputs, is a source op with no inputs, or runs on a collective (ccl)
  stream (collectives must run in the order they were issued).  This bounds runaway
  allocation, as in OneFlow.  Consecutive such calls on one stream may be
  *fused* into one instruction.
* **Prepare** (scheduler thread) allocates the outputs from the stream's
  allocator.
* **Compute** (worker thread) makes the arrays and hands the kernel to the ep
  stream: on a GPU it is queued and runs asynchronously; on emulated streams it
  runs on the stream's worker; on the CPU it runs now.
* **Failure** travels with the task: when the task runs (in stream order, so
  every earlier kernel has run and every failure among the inputs is known) it
  first looks at its inputs; if one failed, it skips the kernel and its outputs
  carry the first input's failure (deterministic, whatever the timing); an op
  that owes others something (a collective's peers wait for it) does that
  first (``on_failed_inputs``).  A
  kernel that raises fails this op alone (``vm.fail``).  A success that
  overwrites a whole storage clears an old failure there.

``run(outputs, inputs, native_stream)`` is the op's kernel with its attributes
already bound (the framework builds it); the VM never looks inside.
"""

from __future__ import annotations

from pyflow.device.ep.base import is_interrupt, unmasked
from pyflow.device.stream import StreamType
from pyflow.vm.eager_blob_object import NoMemoryError as _NoMemory
from pyflow.vm.failure import first_failure
from pyflow.vm.policies.base import InstructionPolicy

__all__ = ["OpCall"]


class OpCall(InstructionPolicy):
    """One op's kernel over input and output blobs, on one stream."""

    handles_failed_inputs = True  # checked in stream order, inside the task

    def __init__(self, name: str, run, inputs, outputs, stream, mutable_inputs=(), sequential: bool = False,
                 on_failed_inputs=None):
        self.name = name
        self.run = run
        self.on_failed_inputs = on_failed_inputs  # called with the failure when an input failed
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self._written_blobs = self.outputs + ([b for i, b in enumerate(self.inputs) if i in mutable_inputs]
                                              if mutable_inputs else [])
        # the storages' dependence objects it writes, then those it only reads, each once, in order; and the
        # bytes its outputs still need (plain loops: every op of eager and of an nn.Graph act passes here)
        self._writes, self._reads, self.allocates = [], [], 0
        for blob in self._written_blobs:
            if blob.storage.dep not in self._writes:
                self._writes.append(blob.storage.dep)
        for blob in self.inputs:
            if blob.storage.dep not in self._writes and blob.storage.dep not in self._reads:
                self._reads.append(blob.storage.dep)
        for blob in self.outputs:
            if blob.storage.allocation is None:
                self.allocates += blob.storage.nbytes
        in_order = sequential or mutable_inputs or not self.inputs or stream.stream_type is StreamType.ccl
        self._sequential = stream.schedule_dep if in_order else None
        self.fuse_type = "enable" if self._sequential is not None else "none"

    def input_dependences(self) -> list:
        return self._reads

    def read_blobs(self) -> list:
        return self.inputs

    def written_blobs(self) -> list:
        return self._written_blobs

    def output_dependences(self) -> list:
        return self._writes

    @property
    def stream_sequential_dependence(self):
        return self._sequential

    def prepare(self, instruction) -> None:
        allocator = instruction.stream.allocator
        for blob in self.outputs:
            blob.storage.allocate(allocator)

    def compute(self, instruction) -> None:
        vm, ep_stream = instruction.stream.vm, instruction.stream.ep_stream
        # A blob without memory belongs to an op that failed to prepare: nothing to run then.
        try:
            outputs = [blob.array() for blob in self.outputs]
            inputs = [blob.array() for blob in self.inputs]
            runnable = True
        except _NoMemory:
            outputs = inputs = None
            runnable = False

        def task():  # runs in stream order: every kernel this one depends on has run
            upstream = first_failure(self.inputs) or (None if runnable else first_failure(self.outputs))
            if upstream is not None:
                if self.on_failed_inputs is not None:
                    try:
                        self.on_failed_inputs(upstream)  # e.g. a collective releases its peers
                    except Exception:  # noqa: BLE001 - the op fails with its input's failure anyway
                        pass
                vm.propagate(self, upstream)
                return
            try:
                self.run(outputs, inputs, ep_stream.native)
            except BaseException as error:  # noqa: BLE001 - the op fails, nothing else; but an interrupt
                error = unmasked(error)       # (step-through mode: Ctrl-C, pdb's quit, or a lock's error
                vm.fail(self, error)          # that hides one) goes up after that
                if is_interrupt(error):
                    raise error
                return
            for blob in self.outputs:
                if blob.storage.failure is not None and blob.covers_storage():
                    blob.storage.failure = None  # fully rewritten: healthy again

        ep_stream.launch(task, name=self.name)
