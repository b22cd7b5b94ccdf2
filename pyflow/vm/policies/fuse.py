"""Seed 002: ``Fuse`` (OneFlow's FuseInstructionPolicy): several instructions as one.

The engine fuses consecutive instructions of one vm stream that share the same
(non-null) stream-sequential dependence.  They must run in order on that stream
anyway, so treating them as one instruction saves scheduling work.  An
instruction whose ``fuse_type`` is "tail_only" (a RecordEvent) may only end a
group.

Fusion never changes failure: the VM prepares and computes the ``members()``
one by one, so a member that fails (a bad allocation, a kernel error) fails
alone and names itself, not ``fuse[...]``.
"""

from __future__ import annotations

from pyflow.vm.policies.base import InstructionPolicy

__all__ = ["Fuse"]


class Fuse(InstructionPolicy):
    """Several policies as one instruction; dependences are the union, the members run in turn."""

    fuse_type = "none"

    def __init__(self, policies):
        self.policies = list(policies)
        self.name = "fuse[" + ",".join(p.name for p in self.policies) + "]"
        self.records_event = self.policies[-1].records_event
        # any member's issuer: the VM then reports the group's ep work, member by member (``VmStream.run``)
        self.issuer = next((p.issuer for p in self.policies if p.issuer is not None), None)

    def input_dependences(self) -> list:
        return [d for p in self.policies for d in p.input_dependences()]

    def output_dependences(self) -> list:
        return [d for p in self.policies for d in p.output_dependences()]

    @property
    def stream_sequential_dependence(self):
        return self.policies[0].stream_sequential_dependence

    def members(self) -> list:
        return self.policies
