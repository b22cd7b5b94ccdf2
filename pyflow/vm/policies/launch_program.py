"""Seed 001 on seed 002: ``LaunchProgram``: one call of a compiled program (Cocktailer) as ONE instruction.

OneFlow runs a whole static-graph call as one instruction (``LaunchLazyJob``) whose
operands are the call's inputs and outputs.  A Cocktailer program is the same idea one
level down: its loops, branches and recursion run inside one persistent kernel (or,
in host mode, as a walk of launches), so to the VM the whole call is one op:

* it **reads** the input tensors' storages and **writes** the output tensors' (and
  its scratch arena's), so the ordinary dependence rules order it among eager ops:
  it starts after the ops that write its inputs, and an eager op issued later that
  reads or overwrites an output waits for it (RAW, WAW);
* SoftSyncStream (``InstructionsBuilder.launch_program``) adds the cross-stream
  waits, as for any op on the program's stream (the device's compute stream);
* **prepare** allocates the outputs *and the scratch arena* (the program's
  intermediates, loop state, recursion stacks and status word) from the stream's
  caching allocator;
* **compute** queues ``run(out_arrays + scratch_arrays, in_arrays, native_stream)``
  on the ep stream (exactly as ``OpCall`` does: failures, stream order) and then
  gives the arena back at once.  That is safe for the reason ReleaseTensor is
  safe: the next user of those bytes is served by the same allocator and runs on
  this stream, or waits for it, so it runs after the program.

The VM knows nothing of Cocktailer: ``run`` is a callable the caller built
(``pyflow/cocktailer/launch.py``), as ``LaunchLazyJob``'s ``launch`` is.

``declare_outputs_written`` is for tests only: set it to False and the outputs are no
longer declared as written, so nothing orders later users of the outputs after
the program (``tests/test_cocktailer_tensors.py`` shows the results then go wrong).
"""

from __future__ import annotations

from pyflow.vm.policies.op_call import OpCall

__all__ = ["LaunchProgram"]


class LaunchProgram(OpCall):
    """A compiled program's call: read ``inputs``, write ``outputs`` and a ``scratch`` arena, on one stream."""

    declare_outputs_written = True   # tests switch it off to show that the property can fail

    def __init__(self, name: str, run, inputs, outputs, scratch, stream):
        super().__init__(name, run, inputs, list(outputs) + list(scratch), stream)
        self.scratch = list(scratch)
        if not self.declare_outputs_written:   # the broken variant: later users are not ordered after it
            unordered = {id(b.dep) for b in outputs}
            self._writes = [d for d in self._writes if id(d) not in unordered]

    def prepare(self, instruction) -> None:
        """Allocate the outputs and the arena; if that fails, give back what was taken (it may be retried)."""
        try:
            super().prepare(instruction)
        except BaseException:
            self._free_scratch()
            raise

    def compute(self, instruction) -> None:
        try:
            super().compute(instruction)   # queues the program on the ep stream
        finally:
            self._free_scratch()           # stream-ordered reuse, as ReleaseTensor

    def _free_scratch(self) -> None:
        for storage in {id(b.storage): b.storage for b in self.scratch}.values():
            storage.free()
