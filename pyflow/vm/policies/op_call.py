"""Seed 002: ``OpCall`` (OneFlow's OpCallInstructionPolicy): run one op's kernel.

* **Reads** its inputs' storages and **writes** its outputs' (and any mutable
  input's, e.g. an in-place update).
* Stays **in stream order** (the stream-sequential dependence) when the op has
  mutable inputs or is a source op with no inputs.  This bounds runaway
  allocation, as in OneFlow.  Consecutive such calls on one stream may be
  *fused* into one instruction.
* **Prepare** (scheduler thread) allocates the outputs from the stream's
  allocator.
* **Compute** (worker thread) makes the arrays and hands the kernel to the ep
  stream: on a GPU it is queued and runs asynchronously; on emulated streams it
  runs on the stream's worker; on the CPU it runs now.

``run(outputs, inputs, native_stream)`` is the op's kernel with its attributes
already bound (the framework builds it); the VM never looks inside.
"""

from __future__ import annotations

from pyflow.vm.policies.base import InstructionPolicy

__all__ = ["OpCall"]


def _unique(deps):
    seen, result = set(), []
    for dep in deps:
        if id(dep) not in seen:
            seen.add(id(dep))
            result.append(dep)
    return result


class OpCall(InstructionPolicy):
    """One op's kernel over input and output blobs, on one stream."""

    def __init__(self, name: str, run, inputs, outputs, stream, mutable_inputs=(), sequential: bool = False):
        self.name = name
        self.run = run
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        mutable = set(mutable_inputs)
        written = [b.dep for b in self.outputs] + [b.dep for i, b in enumerate(self.inputs) if i in mutable]
        self._writes = _unique(written)
        self._reads = [d for d in _unique(b.dep for b in self.inputs) if all(d is not w for w in self._writes)]
        self._sequential = stream.schedule_dep if (sequential or mutable or not self.inputs) else None
        self.fuse_type = "enable" if self._sequential is not None else "none"

    def input_dependences(self) -> list:
        return self._reads

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
        for position, blob in enumerate(self.inputs):
            if not blob.storage.allocated:
                raise RuntimeError(f"{self.name}: input {position} ({blob!r}) holds no data; the op "
                                   "that should have produced it failed")
        ep_stream = instruction.stream.ep_stream
        outputs = [blob.array() for blob in self.outputs]
        inputs = [blob.array() for blob in self.inputs]
        ep_stream.launch(self.run, outputs, inputs, ep_stream.native, name=self.name)
