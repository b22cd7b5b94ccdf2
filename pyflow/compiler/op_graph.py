"""Seed 004: the OpGraph: the Job as a graph of logical ops, with where each runs and how it is split.

For every op, in topological order (the Job's order), the OpGraph fixes:

* its **parallel desc**: the (rank, device) pairs it runs on, one per parallel_id.  A
  global op runs on its placement's ranks (``placement.device(rank)`` each); a local op
  on this rank's device of its output (a ``copy`` on its destination, as eager's
  InferDeviceAndStream picks); a tick on every rank the job uses, on the cpu;
* its **stream**: compute, or host2device / device2host for copies between devices;
* its **SBP signature** (``infer_signature``): for a global op, the SBP each input must
  have and the SBP of each output, the cheapest of the op's candidates for the SBPs its
  inputs have now (the cost model of ``pyflow.distributed.signatures``, the one eager
  global ops use, SEMANTICS §4); an input whose SBP differs gets a boxing sub-graph in
  the TaskGraph.  Local blobs are whole: ``None``;
* every blob's **logical desc** (shape, dtype, time shape, SBP) in the Job.

The SBP rules of the ops the compiler itself makes:

==========================  ===============================================================
``variable``, ``input``     the eager tensor's SBP
``to_global``               input and output: the requested layout (the boxing is the edge's);
                            from a local blob: each rank's blob is its piece (OneFlow's
                            local -> global: a B needs the same value everywhere)
``unpack`` ``repeat``       the input's SBP, kept: they act on each rank's piece (an S(0)
``acc`` ``pack`` output     input's micro-batch j is rows j of every piece, as in OneFlow)
``view`` made by a view op  the op's own signatures (``OpDef.sbp_signatures``: a split of a
(``_op``: permute, reshape, dim the view keeps whole moves with it, P stays P), chosen by the
narrow, ``x[i]``...)        cost model as for any op; each rank views its piece with the op's
                            attrs, as the global interpreter does
``view`` made by no op      (``detach``): a permutation of dims moves the splits with it;
                            any other view needs the whole blob: (B) -> (B)
fused optimizer updates     every tensor of the model's shape takes the model's SBP (the
                            update writes it in place, so it cannot move), 0-d ones B
==========================  ===============================================================
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pyflow import env
from pyflow.device import Device, DeviceType
from pyflow.distributed.boxing_steps import Layout
from pyflow.distributed.signatures import choose_signature
from pyflow.errors import CompileError
from pyflow.framework.op_registry import OP_REGISTRY, SETS_LAYOUT
from pyflow.framework.sbp import SbpParallel, Signature

__all__ = ["OpNode", "OpGraph", "infer_signature", "layout_of_blob", "placement_of", "UPDATE_OPS"]

B = SbpParallel("broadcast")
UPDATE_OPS = ("sgd_update", "momentum_update", "adam_update")
_KEEP = ("unpack", "repeat", "acc", "pack", "output")


@dataclasses.dataclass
class OpNode:
    """One logical op and where it runs."""

    op: object                 # the JobOp
    parallel: list             # [(rank, Device)], one per parallel_id
    stream: str                # "compute" | "host2device" | "device2host"
    signature: object = None   # a Signature of nd SBPs (None: a local op)

    @property
    def name(self) -> str:
        return self.op.name



def placement_of(job, op):
    """A global op's placement: its outputs' (or, making none, its inputs'); None for a local op."""
    for lbn in op.outputs + op.input_lbns():
        if job.blobs[lbn].placement is not None:
            return job.blobs[lbn].placement
    return None


def layout_of_blob(desc):
    """The eager-boxing Layout (placement, nd sbp) of a global blob desc; None for a local one."""
    if desc.placement is None:
        return None
    return Layout(desc.placement, tuple(desc.sbp))


def _permutation(shape_in: tuple, attrs: dict):
    """The dims a view permutes (``out dim d`` is ``in dim perm[d]``), or None if it is not a permutation."""
    strides_in = [int(np.prod(shape_in[d + 1:], dtype=np.int64)) for d in range(len(shape_in))]
    shape, strides = tuple(attrs["shape"]), tuple(attrs["strides"])
    if attrs["offset"] != 0 or len(shape) != len(shape_in) or sorted(shape) != sorted(shape_in):
        return None
    perm = []
    for n, s in zip(shape, strides):
        found = [d for d in range(len(shape_in)) if strides_in[d] == s and shape_in[d] == n and d not in perm]
        if not found:
            return None
        perm.append(found[0])
    return perm


def _view_signature(desc_in, attrs) -> Signature:
    perm = _permutation(tuple(desc_in.shape), attrs)
    if perm is not None and not any(s.is_partial for s in desc_in.sbp):
        inverse = {d_in: d_out for d_out, d_in in enumerate(perm)}
        out = tuple(SbpParallel("split", inverse[s.dim]) if s.is_split else s for s in desc_in.sbp)
        return Signature((tuple(desc_in.sbp),), (out,))
    whole = (B,) * len(desc_in.sbp)
    return Signature((whole,), (whole,))


def infer_signature(op_type: str, in_descs: list, out_shapes: list, attrs: dict, placement, writes=()) -> Signature:
    """The SBP signature of one global op (the table in the module docstring; else the cost model).

    ``in_descs``: a BlobDesc per input (None for a Python number), with the SBP it has now.
    """
    hierarchy = placement.hierarchy
    current = [tuple(d.sbp) if d is not None else None for d in in_descs]
    if op_type in ("variable", "input"):
        return Signature((), (tuple(attrs["sbp"]),))
    if op_type in OP_REGISTRY and OP_REGISTRY[op_type].sbp_signatures is SETS_LAYOUT:   # to_global
        target = tuple(attrs["sbp"])
        return Signature((target,), (target,))
    if op_type in _KEEP:
        return Signature((current[0],), tuple(current[0] for _ in out_shapes))
    if op_type == "view" and "_op" not in attrs:
        return _view_signature(in_descs[0], attrs)
    if op_type == "view":   # a view op's JobOp: the op's signatures, with the op's attrs
        op_type, attrs = attrs["_op"], attrs["_op_attrs"]
    if op_type in UPDATE_OPS:
        model = in_descs[0]
        if any(s.is_partial for s in model.sbp):
            raise CompileError(f"{op_type}: the model is a partial sum ({model.where()}); the update is not "
                               "linear in it: box it to broadcast or split first")
        whole = (B,) * len(hierarchy)
        ins = tuple(None if d is None else (tuple(model.sbp) if tuple(d.shape) == tuple(model.shape) else whole)
                    for d in in_descs)
        return Signature(ins, ())
    if writes:
        raise CompileError(f"op {op_type!r} writes a global variable in place: only the optimizers' fused "
                           "updates may do that inside a global nn.Graph so far")
    shapes = [tuple(d.shape) if d is not None else None for d in in_descs]
    dtypes = [np.dtype(d.dtype) if d is not None else None for d in in_descs]
    return choose_signature(op_type, shapes, dtypes, list(out_shapes), attrs, current, hierarchy)


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


def _job_ranks(job) -> list:
    """Every rank the job runs something on: this rank (local ops) and the ranks of every placement."""
    ranks = {env.get_rank()}
    for op in job.ops:
        placement = placement_of(job, op)
        if placement is not None:
            ranks.update(placement.flat_ranks)
    return sorted(ranks)


class OpGraph:
    """The logical graph of a Job, one ``OpNode`` per op, in the Job's (topological) order."""

    def __init__(self, job):
        self.job = job
        rank = env.get_rank()
        ticks = [(r, Device("cpu")) for r in _job_ranks(job)]
        self.nodes: list[OpNode] = []
        for op in job.ops:
            if op.type in ("source_tick", "sink_tick"):
                self.nodes.append(OpNode(op, ticks, "compute"))
            elif placement_of(job, op) is not None:
                self.nodes.append(self._global_node(job, op))
            else:
                self._check_local(job, op)
                device = _device_of(job, op)
                self.nodes.append(OpNode(op, [(rank, device)], _stream_of(job, op, device)))
        self.by_name = {node.name: node for node in self.nodes}

    @staticmethod
    def _check_local(job, op) -> None:
        for lbn in op.input_lbns():
            if job.blobs[lbn].placement is not None:
                raise CompileError(f"op {op.name} ({op.type}, at {op.line}) mixes the global blob {lbn} "
                                   f"({job.blobs[lbn].where()}) into a local op; use .to_local() or make the "
                                   "other inputs global")

    @staticmethod
    def _global_node(job, op) -> OpNode:
        """Infer the op's signature from its inputs' SBPs now; its outputs' descs take the result."""
        placement = placement_of(job, op)
        in_descs = [job.blobs[x] if isinstance(x, str) else None for x in op.inputs]
        for x, d in zip(op.inputs, in_descs):
            if op.type != "to_global" and d is not None and d.placement is not None and d.placement != placement:
                raise CompileError(f"op {op.name} ({op.type}, at {op.line}) runs on {placement} but reads {x} on "
                                   f"{d.placement}: box it with .to_global(placement=...) first")
        if op.type == "to_global" and in_descs[0].placement is None:
            in_descs = [None]   # local -> global: each rank's blob is its piece
        attrs = dict(op.attrs)
        if op.type in ("variable", "input"):
            attrs["sbp"] = job.blobs[op.outputs[0]].sbp
        signature = infer_signature(op.type, in_descs, [job.blobs[x].shape for x in op.outputs], attrs, placement,
                                    op.writes)
        for lbn, sbp in zip(op.outputs, signature.outputs):
            job.blobs[lbn].sbp = tuple(sbp)
        parallel = [(r, placement.device(r)) for r in placement.flat_ranks]
        return OpNode(op, parallel, "compute", signature)

    def __len__(self) -> int:
        return len(self.nodes)

    def __str__(self) -> str:
        lines = [f"OpGraph of {self.job.name!r}: {len(self.nodes)} ops"]
        for node in self.nodes:
            where = ", ".join(f"rank {r} {d}" for r, d in node.parallel)
            sig = f", sbp {node.signature}" if node.signature is not None else ""
            lines.append(f"  {node.name}: {node.op.type} on [{where}] ({node.stream}){sig}")
        return "\n".join(lines)
