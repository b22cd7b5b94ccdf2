"""Seeds 000/002: instructions about a tensor's memory itself.

* ``AllocateTensors`` - allocate blobs on their *allocator stream*.  A host2device
  copy allocates its output on the compute stream (which owns the allocator) and
  then waits for it.  This way a block another stream just freed is not reused
  before that stream is done with it.
* ``ReleaseTensor``   - give storages' memory back, on the stream that produced
  them, after every earlier user (it writes their dependence objects).  The
  builder first syncs the last user's stream to the producer's, and batches: the
  storages whose tensors died since the last PhysicalRun are freed by one
  ReleaseTensor per producer stream.
* ``AccessBlobByCallback`` - run a Python callback with the ep stream and a blob,
  e.g. ``.numpy()`` copies the blob to the host and waits.  The modifier "const"
  reads the blob; "mut" writes it (filling a tensor from numpy).  A "const"
  callback runs even when the blob failed: it is how a reader learns of the
  failure (``blob.storage.failure``).
"""

from __future__ import annotations

from pyflow.vm.policies.base import InstructionPolicy

__all__ = ["AllocateTensors", "ReleaseTensor", "AccessBlobByCallback"]


class AllocateTensors(InstructionPolicy):
    """Allocate output blobs from this stream's allocator (no compute)."""

    name = "allocate_tensors"

    def __init__(self, blobs):
        self.blobs = list(blobs)

    def output_dependences(self) -> list:
        return [b.dep for b in self.blobs]

    def written_blobs(self) -> list:
        return self.blobs

    def prepare(self, instruction) -> None:
        for blob in self.blobs:
            blob.storage.allocate(instruction.stream.allocator)


class ReleaseTensor(InstructionPolicy):
    """Return storages' memory to their allocator (one or a batch, all produced on this stream)."""

    name = "release_tensor"

    def __init__(self, storages):
        self.storages = list(storages)
        self._deps = [s.dep for s in self.storages]

    def output_dependences(self) -> list:
        return self._deps

    def compute(self, instruction) -> None:
        errors = []
        for storage in self.storages:   # every one, even if one of them fails to free
            try:
                storage.free()
            except Exception as error:  # noqa: BLE001 - raised below, after the others are freed
                errors.append(error)
        if errors:
            raise errors[0]


class AccessBlobByCallback(InstructionPolicy):
    """``callback(ep_stream, blob)`` in stream order (``modifier``: "const" or "mut")."""

    handles_failed_inputs = True

    def __init__(self, blob, callback, modifier: str = "const", name: str = "access_blob"):
        if modifier not in ("const", "mut"):
            raise ValueError(f"modifier must be 'const' or 'mut', got {modifier!r}")
        self.blob, self.callback, self.modifier, self.name = blob, callback, modifier, name

    def read_blobs(self) -> tuple:
        return (self.blob,) if self.modifier == "const" else ()

    def written_blobs(self) -> tuple:
        return (self.blob,) if self.modifier == "mut" else ()

    def input_dependences(self) -> list:
        return [self.blob.dep] if self.modifier == "const" else []

    def output_dependences(self) -> list:
        return [self.blob.dep] if self.modifier == "mut" else []

    def prepare(self, instruction) -> None:
        if self.modifier == "mut":  # writing a fresh tensor: it needs memory
            self.blob.storage.allocate(instruction.stream.allocator)

    def compute(self, instruction) -> None:
        self.callback(instruction.stream.ep_stream, self.blob)
