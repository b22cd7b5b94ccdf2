"""Seed 002: instruction policies, one module per family (see ``base.py`` for the interface)."""

from pyflow.vm.policies.base import InstructionPolicy
from pyflow.vm.policies.fuse import Fuse
from pyflow.vm.policies.launch_lazy_job import LaunchLazyJob
from pyflow.vm.policies.launch_program import LaunchProgram
from pyflow.vm.policies.op_call import OpCall
from pyflow.vm.policies.sync import Barrier, RecordEvent, StreamRecordEvent, StreamWait, StreamWaitEvent
from pyflow.vm.policies.tensor import AccessBlobByCallback, AllocateTensors, ReleaseTensor

__all__ = ["InstructionPolicy", "OpCall", "LaunchLazyJob", "LaunchProgram", "AllocateTensors", "ReleaseTensor",
           "AccessBlobByCallback", "RecordEvent", "StreamWait", "StreamRecordEvent", "StreamWaitEvent", "Barrier",
           "Fuse"]
