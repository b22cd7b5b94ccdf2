"""Seed 002: ``LaunchLazyJob`` and the output critical section: one call of a compiled graph in the eager VM.

OneFlow runs a static graph's call through the eager VM too: ``nn.Graph.__call__`` issues a
LaunchLazyJob instruction on the *lazy job launcher* stream (there its own worker thread), and
critical-section instructions that hand the call its inputs and take its outputs, so the
ordinary dependence rules place the call among eager ops.  pyflow's two instructions
(``InstructionsBuilder.launch_lazy_job`` issues them):

* ``LaunchLazyJob`` reads the call's inputs: it starts only after the eager ops that write
  them.  Its ``compute`` hands the call to the actor runtime (a callback ``launch()``, so
  the VM knows nothing of actors) and returns.  It runs even when an input failed
  (``handles_failed_inputs``): the call goes ahead and its outputs carry the failure.
  ``launch()`` must not wait: it runs on the VM scheduler's thread (``VmStream.on_scheduler_thread``;
  OneFlow's launcher has a thread of its own because its instruction lasts as long as the call).
* ``OutputCriticalSection``, one per output tensor the caller holds, on the critical-section
  stream of the tensor's device: it *writes* that tensor, so every eager op issued later
  that reads it (``numpy()``, ``y + 1``) comes after it.  Its ``compute`` waits until the
  call's output actor has handed over the output's value (``fetch()``, which raises the
  call's error if it failed), copies it in, and only then is the instruction done.

Why two, and why the copy.  pyflow's actors issue the call's own ops into this same VM,
*after* these instructions.  An instruction that stayed running until the call is over
would wait for ops ordered after it: OneFlow's actors launch kernels directly, outside the
VM, pyflow's cannot.  So LaunchLazyJob returns at once, and the output actors never write
the caller's tensors (an op of theirs writing one would be ordered after the critical
section that waits for it): they write a fresh tensor, and the critical section, the one
writer of the caller's tensor, copies it over.  The critical section blocks only its own
worker thread (the critical-section stream's), never a stream the actors' ops run on.
What else ``nn.Graph`` waits for before it returns (the ops touching the caller's inputs and
parameters): ``pyflow/graph/graph.py``.
"""

from __future__ import annotations

from pyflow.vm.policies.base import InstructionPolicy

__all__ = ["LaunchLazyJob", "OutputCriticalSection"]


class LaunchLazyJob(InstructionPolicy):
    """Read ``inputs`` (blobs) and call ``launch()`` on the launcher stream."""

    handles_failed_inputs = True

    def __init__(self, job_name: str, launch, inputs):
        self.name = f"launch_lazy_job[{job_name}]"
        self.launch = launch
        self.inputs = list(inputs)
        self._reads = list({id(b.dep): b.dep for b in self.inputs}.values())

    def read_blobs(self) -> list:
        return self.inputs

    def input_dependences(self) -> list:
        return self._reads

    def compute(self, instruction) -> None:
        self.launch()


class OutputCriticalSection(InstructionPolicy):
    """Write ``blob`` (an output the caller holds) with ``fetch()``'s tensor, once the call produced it."""

    def __init__(self, job_name: str, index: int, blob, fetch):
        self.name = f"output_critical_section[{job_name}][{index}]"
        self.blob, self.fetch = blob, fetch

    def written_blobs(self) -> list:
        return [self.blob]

    def output_dependences(self) -> list:
        return [self.blob.dep]

    def compute(self, instruction) -> None:
        value = self.fetch()   # waits for the call's output actor; raises what stopped the call
        stream = instruction.stream.ep_stream
        stream.memcpy_d2d(self.blob.array(), value._blob.array())
        stream.sync()   # (done means copied: the blob's later users need no sync with this stream, ``builder.py``)
