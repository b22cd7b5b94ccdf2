"""Global tensors inside ``nn.Graph.build``: each op's SBP signature chosen as it is recorded (LazyTracer's).

A global op in build is checked as the eager global interpreter checks it (one placement, no
local tensor mixed in), its shapes inferred by the op's own inference, and its SBP signature
chosen now from the SBPs its inputs have (``op_graph.infer_signature``, the cost model eager
global ops use), so a lazy tensor knows its ``sbp`` at once, as an eager one does; the OpGraph
repeats the same inference over the whole Job.  ``x.to_global(placement, sbp)`` is a
``to_global`` JobOp of the requested layout, inferred by the op's own inference
(``pyflow/ops/to_global.py``): the TaskGraph gives its edge the boxing sub-graph
(OneFlow: the boxing is the edge's, not an op's).  Of a local tensor (an input, or an eager one the
graph captures: ``Tensor.to_global`` records it too), each rank's blob is its piece, and along a B
axis coordinate 0's piece is everyone's, as eagerly.
"""

from __future__ import annotations

import numpy as np

from pyflow.compiler.job import BlobDesc
from pyflow.errors import ArgumentTypeError, CompileError, DeviceError
from pyflow.framework import interpreter
from pyflow.framework.op_registry import TensorMeta, get_op
from pyflow.framework.sbp import SbpParallel
from pyflow.framework.tensor import Tensor

__all__ = ["record_global_op", "record_to_global"]

_S0 = SbpParallel("split", 0)


def record_global_op(tracer, name, op, inputs, out, attrs) -> list:
    """Global op ``name`` on the lazy ``inputs``: the eager global interpreter's checks and inference,
    its SBP signature chosen now from the inputs' SBPs."""
    from pyflow.compiler.lazy import user_line
    from pyflow.compiler.op_graph import infer_signature

    descs_in = [tracer.job.blobs[x._lbn] if isinstance(x, Tensor) else None for x in inputs]
    local = [t for t, d in zip(inputs, descs_in) if d is not None and d.placement is None]
    if local:
        raise DeviceError(f"op {name!r} at {user_line()}: global and local tensors mixed ({local[0]!r} is "
                          "local); make it global with .to_global(placement, sbp) first")
    placements = {d.placement for d in descs_in if d is not None}
    if len(placements) > 1:
        raise DeviceError(f"op {name!r} at {user_line()}: inputs on different placements "
                          f"({', '.join(str(p) for p in placements)}); box them onto one with "
                          ".to_global(placement=...) first")
    (placement,) = placements
    _, metas = interpreter.infer_logical(op, inputs, attrs,
                                         where=lambda: f"op {name!r} in nn.Graph build at {user_line()}")
    writes = {i: inputs[i]._lbn for i in op.mutable_inputs if i < len(inputs) and isinstance(inputs[i], Tensor)}
    try:
        signature = infer_signature(name, descs_in, [m.shape for m in metas], attrs, placement, writes)
    except CompileError as error:
        raise CompileError(f"{error} [at {user_line()}]") from None
    descs = [BlobDesc(tuple(m.shape), m.dtype, placement=placement, sbp=tuple(nd))
             for m, nd in zip(metas, signature.outputs)]
    if out is not None:
        return tracer._write(name, op, inputs, list(out), descs, attrs, writes)
    return tracer._record(name, [x._lbn if isinstance(x, Tensor) else x for x in inputs], descs, attrs,
                          writes=writes)


def record_to_global(tracer, x, placement=None, sbp=None):
    """``x.to_global(placement, sbp)`` inside build: a ``to_global`` op with the requested layout (``x``
    itself if it has that layout already)."""
    from pyflow.framework.placement import placement as Placement

    x = tracer.lazy(x)
    desc = tracer.job.blobs[x._lbn]
    if desc.placement is not None:
        placement = desc.placement if placement is None else placement
        sbp = desc.sbp if sbp is None else sbp
    elif placement is None or sbp is None:
        raise ArgumentTypeError("to_global of a local tensor needs both placement= and sbp=")
    if not isinstance(placement, Placement):
        raise ArgumentTypeError(f"to_global: placement must be a flow.placement, got {placement!r}")
    shape = tuple(desc.shape)
    if desc.placement is None:   # each rank's blob is its piece: the logical shape grows along splits
        sbp = sbp if isinstance(sbp, (tuple, list)) else (sbp,)
        shape = list(shape)
        for axis, s in enumerate(sbp):
            if s.is_split:
                shape[s.dim] *= placement.hierarchy[axis]
        shape = tuple(shape)
    (meta,) = get_op("to_global").infer([TensorMeta(shape, desc.dtype)], {"placement": placement, "sbp": sbp})
    if desc.placement is not None and desc.placement == placement and tuple(desc.sbp) == meta.sbp:
        return x
    if desc.placement is None and any(s.is_broadcast for s in meta.sbp):
        return _broadcast_coordinate_0(tracer, x, placement, meta.sbp)
    out = BlobDesc(shape, desc.dtype, placement=placement, sbp=meta.sbp, time_shape=desc.time_shape)
    (result,) = tracer._record("to_global", [x._lbn], [out], {"placement": placement, "sbp": meta.sbp})
    return result


def _broadcast_coordinate_0(tracer, x, placement, sbp):
    """A local ``x`` made global with B axes, as eagerly: along every B axis the piece of coordinate 0 is
    everyone's (OneFlow's RawLocalToGlobal broadcasts parallel_id 0's data; the ranks' data may differ).

    ``x`` is made global split along dim 0 on the B axes too (the pieces concatenated, no data moved),
    that dim 0 viewed as (one dim per axis splitting it..., x's rows), index 0 taken on the B axes' dims,
    and the result boxed to ``sbp``: ops the graph already has, so the TaskGraph's boxing moves the
    data, and ``x`` stays the local input of the graph's ``to_global`` (the autograd pass names it).
    """
    shape = tuple(x.shape)
    rows = x if shape else x.reshape(1)
    gathered_sbp = tuple(_S0 if s.is_broadcast else s for s in sbp)
    gathered = record_to_global(tracer, rows, placement, gathered_sbp)
    axes = [a for a, s in enumerate(gathered_sbp) if s.is_split and s.dim == 0]   # in order, row-major
    kept = [placement.hierarchy[a] for a in axes if not sbp[a].is_broadcast]
    n, rest = rows.shape[0], gathered.shape[1:]   # (the other dims as the other axes' splits made them)
    split_rows = gathered.reshape(*[placement.hierarchy[a] for a in axes], n, *rest)
    picked = split_rows[tuple(0 if sbp[a].is_broadcast else slice(None) for a in axes)]
    logical = picked.reshape(int(np.prod(kept, dtype=np.int64)) * n, *rest)
    return record_to_global(tracer, logical if shape else logical.reshape(()), placement, sbp)
