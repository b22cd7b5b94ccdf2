"""Views inside ``nn.Graph.build``: a ``view`` JobOp, a layout over its input's blob (LazyTracer's ``view``).

A view op (``OpDef.view``: ``permute``, ``reshape``, ``narrow``, ``x[i]``...; ``pyflow/ops/views.py``)
is recorded as a ``view`` JobOp of the layout the op gives over its input, keeping the op's
name and attrs (``_op``, ``_op_attrs``), so the autograd pass calls the op's own backward rule,
the one eager autograd calls, and the OpGraph the op's own SBP signatures (a global view of a
split blob stays split where the op keeps that dim; each rank's task views its piece with the
op's layout rule and attrs, as the global interpreter does).  A view made by no op (a strided
``Tensor._view``) is a ``view`` JobOp without them.  Its task aliases the input's memory
(``compiler/task_graph.py``).
"""

from __future__ import annotations

from pyflow.compiler.job import BlobDesc
from pyflow.framework import interpreter
from pyflow.kernels.layout import contiguous_strides

__all__ = ["record_view", "record_view_op"]


def record_view_op(tracer, op, x, attrs: dict):
    """View op ``op`` of ``x`` over its blob: contiguous, or a captured local tensor's own strides (its
    offset taken as 0: the blob the variable binds at run time is that tensor)."""
    from pyflow.compiler.lazy import user_line

    lazy = tracer.lazy(x)
    interpreter.infer_logical(op, [lazy], attrs, where=lambda: f"op {op.name!r} in nn.Graph build at {user_line()}")
    strides = x._blob.strides if x is not lazy and x._global is None else contiguous_strides(x.shape)
    shape, strides, offset = op.view(tuple(x.shape), tuple(strides), 0, attrs)
    return record_view(tracer, lazy, shape, strides, offset, op=(op.name, dict(attrs)))


def record_view(tracer, x, shape, strides, offset, detach: bool = False, op=None):
    """A ``view`` JobOp: ``x``'s blob seen with ``shape``, ``strides``, ``offset``; ``op``: (name, attrs) of
    the view op that made it, if one did."""
    desc = BlobDesc(tuple(int(n) for n in shape), x.dtype, device=x.device)
    attrs = {"shape": desc.shape, "strides": tuple(int(s) for s in strides), "offset": int(offset)}
    if detach:
        attrs["detach"] = True
    if op is not None:
        attrs["_op"], attrs["_op_attrs"] = op
    source = tracer.job.blobs[x._lbn]
    if source.placement is not None:   # a global view: its signature says how the pieces view
        from pyflow.compiler.op_graph import _permutation, infer_signature

        signature = infer_signature("view", [source], [desc.shape], attrs, source.placement)
        desc = BlobDesc(desc.shape, x.dtype, placement=source.placement, sbp=signature.outputs[0])
        if op is None:   # a view of no op keeps a split only as a permutation of the piece's dims
            perm = _permutation(tuple(source.shape), attrs)
            if perm is not None and signature.inputs[0] == tuple(source.sbp):
                attrs["_perm"] = tuple(perm)
    (result,) = tracer._record("view", [x._lbn], [desc], attrs)
    # its layout at run time, where the trace knows it (LazyTensor.stride): a view op's, over a blob that is
    # no view; None: unknown (every view's output is a key: a view of it has an unknown layout too)
    known = op is not None and source.placement is None and not detach and x._lbn not in tracer.view_strides
    tracer.view_strides[result._lbn] = attrs["strides"] if known else None
    x._has_views = True
    result._is_view = not detach
    return result
