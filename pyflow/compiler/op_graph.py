"""Seed 004: the OpGraph: the Job as a graph of logical ops, with where each runs and how it is split.

For every op, in topological order (the Job's order), the OpGraph fixes:

* its **parallel desc**: the (rank, device) pairs it runs on.  A local op runs on
  this rank's device of its output (a ``copy`` on its destination, as eager's
  InferDeviceAndStream picks); a tick on the cpu;
* its **stream**: compute, or host2device / device2host for copies between devices;
* its **SBP signature**: for local ops every blob is whole (broadcast on one device);
* every blob's **logical desc** (shape, dtype, time shape) comes from the Job.

Global tensors (placements of several ranks) need SBP signature inference by the
cost model (SEMANTICS.md §4) and boxing in the TaskGraph; they are not compiled yet
and are a clear ``CompileError`` here.
"""

from __future__ import annotations

import dataclasses

from pyflow import env
from pyflow.device import Device, DeviceType
from pyflow.errors import CompileError

__all__ = ["OpNode", "OpGraph"]


@dataclasses.dataclass
class OpNode:
    """One logical op and where it runs."""

    op: object                 # the JobOp
    parallel: list             # [(rank, Device)], one per parallel_id
    stream: str                # "compute" | "host2device" | "device2host"
    sbp: dict                  # lbn -> nd sbp of the blobs it reads and writes ("B" for local)

    @property
    def name(self) -> str:
        return self.op.name


def _device_of(job, op) -> Device:
    if op.type in ("source_tick", "sink_tick"):
        return Device("cpu")
    if op.outputs:
        return job.blobs[op.outputs[0]].device
    return job.blobs[op.input_lbns()[0]].device if op.input_lbns() else Device("cpu")


def _stream_of(job, op, device: Device) -> str:
    if op.type != "copy":
        return "compute"
    src = job.blobs[op.input_lbns()[0]].device
    if src.device_type is DeviceType.cpu and device.device_type is not DeviceType.cpu:
        return "host2device"
    if src.device_type is not DeviceType.cpu and device.device_type is DeviceType.cpu:
        return "device2host"
    return "compute"


class OpGraph:
    """The logical graph of a Job, one ``OpNode`` per op, in the Job's (topological) order."""

    def __init__(self, job):
        self.job = job
        rank = env.get_rank()
        self.nodes: list[OpNode] = []
        for op in job.ops:
            for lbn in op.input_lbns() + op.outputs:
                if job.blobs[lbn].placement is not None:
                    raise CompileError(f"op {op.name} ({op.type}, at {op.line}) uses the global blob {lbn} "
                                       f"({job.blobs[lbn].where()}): nn.Graph compiles local tensors only so far "
                                       "(SBP inference and boxing tasks for global tensors are not built yet)")
            device = _device_of(job, op)
            self.nodes.append(OpNode(op, [(rank, device)], _stream_of(job, op, device),
                                     {lbn: ("B",) for lbn in op.input_lbns() + op.outputs}))
        self.by_name = {node.name: node for node in self.nodes}

    def __len__(self) -> int:
        return len(self.nodes)

    def __str__(self) -> str:
        lines = [f"OpGraph of {self.job.name!r}: {len(self.nodes)} ops"]
        for node in self.nodes:
            where = ", ".join(f"rank {r} {d}" for r, d in node.parallel)
            lines.append(f"  {node.name}: {node.op.type} on [{where}] ({node.stream}), sbp "
                         + (", ".join(f"{k}: {''.join(v)}" for k, v in node.sbp.items()) or "-"))
        return "\n".join(lines)
