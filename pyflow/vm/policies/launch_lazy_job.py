"""Seed 002: ``LaunchLazyJob``: one call of a compiled graph, as one instruction of the eager VM.

OneFlow runs a static graph's call through the eager VM too: ``nn.Graph.__call__``
issues a LaunchLazyJob instruction on the *lazy job launcher* stream (its own worker
thread).  Its operands are the call's inputs (read) and outputs (written), so the
ordinary dependence rules place the call among eager ops: it starts only after the ops
that write its inputs are done, and an eager op issued later that touches an output
waits for it.

Here the instruction's ``compute`` hands the call to the actor runtime (a callback
``launch()``, so the VM knows nothing of actors) and returns: the actors then issue the
call's own ops into this same VM, after the instruction, and the caller waits for the
call's sink tick (``pyflow/graph/graph.py``); ``InstructionsBuilder.launch_lazy_job`` issues it.  Unlike OneFlow's, the instruction does
not stay running until the call is over: OneFlow's actors launch kernels directly,
outside the VM, but pyflow's issue eager ops, which would wait for the instruction
that waits for them.

It runs even when an input failed (``handles_failed_inputs``): the call goes ahead and
its outputs carry the failure, as every eager op's would.
"""

from __future__ import annotations

from pyflow.vm.policies.base import InstructionPolicy

__all__ = ["LaunchLazyJob"]


class LaunchLazyJob(InstructionPolicy):
    """Read ``inputs``, write ``outputs`` (blobs), and call ``launch()`` on the launcher stream."""

    handles_failed_inputs = True

    def __init__(self, job_name: str, launch, inputs, outputs):
        self.name = f"launch_lazy_job[{job_name}]"
        self.launch = launch
        self.inputs, self.outputs = list(inputs), list(outputs)
        written = {id(b.dep) for b in self.outputs}
        self._reads = list({id(b.dep): b.dep for b in self.inputs if id(b.dep) not in written}.values())
        self._writes = list({id(b.dep): b.dep for b in self.outputs}.values())

    def read_blobs(self) -> list:
        return self.inputs

    def written_blobs(self) -> list:
        return self.outputs

    def input_dependences(self) -> list:
        return self._reads

    def output_dependences(self) -> list:
        return self._writes

    def compute(self, instruction) -> None:
        self.launch()

