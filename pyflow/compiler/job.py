"""Seed 004: the Job: the logical graph an ``nn.Graph``'s ``build`` records (OneFlow's JobConf + OpConfs).

A Job is a list of **logical ops**, each naming the blobs it reads and writes by
**lbn** ("logical blob name", ``op_name/out_0``), in the order ``build`` called
them, plus what the compiler needs to know about every blob (``BlobDesc``: shape,
dtype, where it lives, its SBP hint, its time shape).

Op types, besides every op of the registry (``matmul``, ``add``, ``fill``...):

==================  ==============================================================
``input``           a graph input, fed at each call (``attrs["index"]``)
``variable``        an eager tensor the graph reads: a module's parameter or buffer,
                    or any tensor ``build`` captured (a free variable); at run time
                    the blob *is* that tensor's memory, so it persists across calls
``output``          a graph output, handed back at each call
``view``            ``x.reshape``/``permute``/``x[i]``...: eager views are metadata,
                    a Job's are ops (attrs: shape, strides, offset into the
                    contiguous input), run as a contiguous copy of that view
``to_global``       a change of placement/SBP the user asked for (attrs: placement, sbp)
``tick`` ...        added by the passes (``pyflow/compiler/passes/``)
==================  ==============================================================

An op may **write a variable** in place (an optimizer's update, a BatchNorm running
mean): ``JobOp.writes`` maps such an input index to the variable's lbn.

``str(job)`` prints one op per line, OneFlow's ``job.op`` list in short::

    linear_0 = matmul(input_0/out_0, variable_1/out_0)  -> (4, 8) float32 @ cpu:0   # build.py:12
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["BlobDesc", "JobOp", "Job", "lbn_of"]


def lbn_of(op_name: str, index: int = 0) -> str:
    """The logical blob name of output ``index`` of op ``op_name`` (OneFlow's ``op_name/out_0``)."""
    return f"{op_name}/out_{index}"


@dataclasses.dataclass
class BlobDesc:
    """What the compiler knows about one logical blob."""

    shape: tuple
    dtype: np.dtype
    device: object = None          # a pyflow Device for a local blob
    placement: object = None       # a pyflow placement for a global blob
    sbp: tuple | None = None       # its nd SBP: a hint from the trace, then the OpGraph's choice
    time_shape: tuple = (1, 1)     # (calls, times per call): gradient accumulation makes (1, k)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def where(self) -> str:
        if self.placement is not None:
            return f"{self.placement}, sbp={self.sbp}"
        return str(self.device)


@dataclasses.dataclass
class JobOp:
    """One logical op of a Job (OneFlow's OperatorConf)."""

    name: str
    type: str
    inputs: list                   # lbns, or Python numbers where the op takes a scalar
    outputs: list                  # lbns
    attrs: dict = dataclasses.field(default_factory=dict)
    writes: dict = dataclasses.field(default_factory=dict)      # input index -> variable lbn written in place
    ctrl_inputs: list = dataclasses.field(default_factory=list)  # op names that must run first
    stage: int | None = None       # pipeline stage (set_stage), None: not staged
    line: str = ""                 # the Python line of build() that made it
    backward: bool = False         # made by the autograd pass

    def input_lbns(self) -> list:
        return [x for x in self.inputs if isinstance(x, str)]


class Job:
    """A logical graph: ops in a valid order, blob descs, and the roles of its blobs."""

    def __init__(self, name: str):
        self.name = name
        self.ops: list[JobOp] = []
        self.blobs: dict[str, BlobDesc] = {}
        self.variables: dict[str, object] = {}      # variable op name -> the eager tensor it reads
        self.variable_names: dict[str, str] = {}    # variable op name -> a readable name ("linear.weight")
        self.input_ops: list[str] = []
        self.output_ops: list[str] = []
        self.loss_lbn: str | None = None
        self.optimizers: list = []                  # (optimizer, lr scheduler) from add_optimizer
        self.grad_acc_steps = 1
        self.variable_grads: dict[str, str] = {}    # variable op name -> its gradient's lbn (autograd pass)
        self.feeds: list = []                       # (eager tensor, value function) refilled before each call
        self._counts: dict[str, int] = {}

    # --- building ------------------------------------------------------------------------------

    def new_name(self, prefix: str) -> str:
        n = self._counts.get(prefix, 0)
        self._counts[prefix] = n + 1
        return f"{prefix}_{n}"

    def add_op(self, op: JobOp, descs: list[BlobDesc], at: int | None = None) -> JobOp:
        """Append ``op`` (or insert it at position ``at``) with one desc per output."""
        if len(descs) != len(op.outputs):
            raise ValueError(f"op {op.name}: {len(op.outputs)} outputs but {len(descs)} blob descs")
        for lbn, desc in zip(op.outputs, descs):
            self.blobs[lbn] = desc
        if at is None:
            self.ops.append(op)
        else:
            self.ops.insert(at, op)
        return op

    # --- reading -------------------------------------------------------------------------------

    def op(self, name: str) -> JobOp:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(f"no op {name!r} in job {self.name!r}")

    def producers(self) -> dict[str, JobOp]:
        """lbn -> the op that makes it."""
        return {lbn: op for op in self.ops for lbn in op.outputs}

    def consumers(self) -> dict[str, list[JobOp]]:
        """lbn -> the ops that read it (in job order)."""
        found: dict[str, list] = {}
        for op in self.ops:
            for lbn in op.input_lbns():
                found.setdefault(lbn, []).append(op)
        return found

    def topological_check(self) -> None:
        """Every input and control input of an op is made by an op before it."""
        seen_ops, seen_lbns = set(), set()
        for op in self.ops:
            for lbn in op.input_lbns():
                if lbn not in seen_lbns:
                    raise ValueError(f"job {self.name}: op {op.name} reads {lbn} before it is made")
            for name in op.ctrl_inputs:
                if name not in seen_ops:
                    raise ValueError(f"job {self.name}: op {op.name} waits for {name}, which comes later")
            seen_ops.add(op.name)
            seen_lbns.update(op.outputs)

    def __len__(self) -> int:
        return len(self.ops)

    def format_op(self, op: JobOp) -> str:
        ins = ", ".join(x if isinstance(x, str) else repr(x) for x in op.inputs)
        attrs = {k: v for k, v in op.attrs.items() if k not in ("shape",) or op.type in ("fill", "view")}
        shown = "" if not attrs else " " + ", ".join(f"{k}={_short(v)}" for k, v in attrs.items())
        outs = "; ".join(f"{tuple(self.blobs[o].shape)} {self.blobs[o].dtype} @ {self.blobs[o].where()}"
                         + ("" if self.blobs[o].time_shape == (1, 1) else f" time {self.blobs[o].time_shape}")
                         for o in op.outputs)
        extra = []
        if op.writes:
            extra.append("writes " + ", ".join(op.writes.values()))
        if op.ctrl_inputs:
            extra.append("after " + ", ".join(op.ctrl_inputs))
        if op.stage is not None:
            extra.append(f"stage {op.stage}")
        tail = (" [" + "; ".join(extra) + "]") if extra else ""
        if op.type == "variable" and op.name in self.variable_names:
            extra.append(self.variable_names[op.name])
        where = f"   # {op.line}" if op.line else ""
        return f"{op.name} = {op.type}({ins}{shown}) -> {outs or 'nothing'}{tail}{where}"

    def __str__(self) -> str:
        head = f"Job {self.name!r}: {len(self.ops)} ops"
        if self.loss_lbn:
            head += f", loss {self.loss_lbn}"
        if self.grad_acc_steps > 1:
            head += f", gradient accumulation {self.grad_acc_steps}"
        return "\n".join([head] + ["  " + self.format_op(op) for op in self.ops])


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
