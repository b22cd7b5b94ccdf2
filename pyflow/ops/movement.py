"""Ops that move data: ``cat``, ``index_select``, ``dim_gather`` (torch.gather), and the in-place
``index_copy``, ``index_add`` and ``scatter_add`` (torch's ``index_copy_``, ``index_add_``, ``scatter_add_``).

Index tensors must be int32 or int64 (``kernels/dtypes.py``'s index dtypes).  An
index out of range is found by the kernel (``check=True``): the op fails and
reading its result raises ``OpError`` naming the bad index, as PyTorch reports a
device-side assert on CUDA.  Everything else is checked at the call.

Backward rules: ``cat`` hands each input its slice of ``g``; ``index_select``
and ``dim_gather`` add ``g`` back to where they read (``index_add`` /
``scatter_add``: an index read twice gets both); the in-place ops pass ``g`` to
the target (``index_copy``: but not at the overwritten slices) and read the
source's gradient at the indices.

SBP: ``dim_gather`` and ``scatter_add`` run piece by piece on inputs split along
the same dim ``d`` other than their axis, where the index is as long as the input
there (out[i][j] reads and writes only row i along d: each rank's rows stay its
own, as data parallel needs for cross-entropy's gather of the labels' logits);
both are linear in their float inputs, so partial sums stay partial sums
(the index broadcast).  The others are broadcast only so far.
"""

from __future__ import annotations

from pyflow.errors import DTypeError, ShapeError
from pyflow.framework.dtypes import names
from pyflow.framework.interpreter import apply
from pyflow.framework.op_registry import BROADCAST_ONLY, OpDef, TensorMeta, register_op
from pyflow.framework.sbp import B, P, S, Signature
from pyflow.kernels.dtypes import INDEX_DTYPES
from pyflow.kernels.layout import normalize_axis

__all__ = []


def _infer_cat(inputs, attrs):
    if not inputs:
        raise ShapeError("cat: needs at least one tensor")
    first = inputs[0]
    if not first.shape:
        raise ShapeError("cat: zero-dimensional tensors cannot be concatenated")
    axis = normalize_axis(attrs.get("axis", 0), len(first.shape), "cat")
    for other in inputs[1:]:
        if len(other.shape) != len(first.shape) or any(
                a != b for d, (a, b) in enumerate(zip(other.shape, first.shape)) if d != axis):
            shapes = ", ".join(str(t.shape) for t in inputs)
            raise ShapeError(f"cat: shapes {shapes} must match except along axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in inputs)
    return [TensorMeta(tuple(shape), first.dtype)]


def _launch_cat(kernel, outputs, inputs, attrs, stream):
    kernel(outputs[0], inputs, axis=attrs["axis"], stream=stream)


def _check_index(op, index):
    if index.dtype not in INDEX_DTYPES:
        raise DTypeError(f"{op}: the index must be {names(INDEX_DTYPES)}, got {index.dtype}")


def _infer_index_select(inputs, attrs):
    x, index = inputs
    axis = normalize_axis(attrs["axis"], len(x.shape), "index_select")
    _check_index("index_select", index)
    if len(index.shape) != 1:
        raise ShapeError(f"index_select: the index must be 1-D, got shape {list(index.shape)}")
    return [TensorMeta(x.shape[:axis] + index.shape + x.shape[axis + 1:], x.dtype)]


def _infer_dim_gather(inputs, attrs):
    x, index = inputs
    axis = normalize_axis(attrs["axis"], len(x.shape), "gather")
    _check_index("gather", index)
    if len(index.shape) != len(x.shape) or any(i > n for d, (i, n) in enumerate(zip(index.shape, x.shape))
                                              if d != axis):
        raise ShapeError(f"gather: the index of shape {list(index.shape)} must have the rank of the input "
                         f"{list(x.shape)} and no larger size except along dim {axis}")
    return [TensorMeta(index.shape, x.dtype)]


def _dim_gather_signatures(shapes, out_shapes, attrs):
    """(S(d), S(d)) -> S(d) for a dim d of the index's length besides the axis; (P, B) -> P."""
    x, index = shapes
    return [Signature((S(d), S(d)), (S(d),)) for d in range(len(x))
            if d != attrs["axis"] and index[d] == x[d] > 1] + [Signature((P, B), (P,))]


def _infer_index_write(op):
    """index_copy / index_add: ``target[..., index[j], ...]`` gets ``source[..., j, ...]``."""
    def infer(inputs, attrs):
        target, index, source = inputs
        axis = normalize_axis(attrs["axis"], len(target.shape), op)
        _check_index(op, index)
        if len(index.shape) != 1:
            raise ShapeError(f"{op}: the index must be 1-D, got shape {list(index.shape)}")
        expected = target.shape[:axis] + index.shape + target.shape[axis + 1:]
        if source.shape != expected:
            raise ShapeError(f"{op}: the source has shape {list(source.shape)}, expected {list(expected)}")
        if source.dtype != target.dtype:
            raise DTypeError(f"{op}: the source is {source.dtype}, the target {target.dtype}")
        return [TensorMeta(target.shape, target.dtype)]
    return infer


_infer_index_copy, _infer_index_add = _infer_index_write("index_copy"), _infer_index_write("index_add")


def _infer_scatter_add(inputs, attrs):
    target, index, source = inputs
    axis = normalize_axis(attrs["axis"], len(target.shape), "scatter_add")
    _check_index("scatter_add", index)
    if len(index.shape) != len(target.shape) or any(
            i > n for d, (i, n) in enumerate(zip(index.shape, target.shape)) if d != axis):
        raise ShapeError(f"scatter_add: the index of shape {list(index.shape)} must have the rank of the target "
                         f"{list(target.shape)} and no larger size except along dim {axis}")
    if source.shape != index.shape:
        raise ShapeError(f"scatter_add: the source has shape {list(source.shape)}, expected the index's "
                         f"{list(index.shape)}")
    if source.dtype != target.dtype:
        raise DTypeError(f"scatter_add: the source is {source.dtype}, the target {target.dtype}")
    return [TensorMeta(target.shape, target.dtype)]


def _scatter_add_signatures(shapes, out_shapes, attrs):
    """(S(d), S(d), S(d)) -> S(d) for a dim d of the index's length besides the axis; (P, B, P) -> P."""
    target, index, _ = shapes
    return [Signature((S(d), S(d), S(d)), (S(d),)) for d in range(len(target))
            if d != attrs["axis"] and index[d] == target[d] > 1] + [Signature((P, B, P), (P,))]


def _launch_index_copy(kernel, outputs, inputs, attrs, stream):
    """inputs[0] is the target itself (so a failure upstream of it propagates); the kernel writes it."""
    kernel(outputs[0], inputs[1], inputs[2], axis=attrs["axis"], stream=stream)


# --- backward rules --------------------------------------------------------------------------------


def _cat_rule(ctx, g):
    axis, start, grads = ctx.attrs["axis"] % g.ndim, 0, []
    for i, shape in enumerate(ctx.input_shapes):
        grads.append(g.narrow(axis, start, shape[axis]) if ctx.needs_grad(i) else None)
        start += shape[axis]
    return grads


def _index_select_rule(ctx, g):
    index, axis = ctx.inputs[1], ctx.attrs["axis"]
    return [ctx.zeros_like_input(0, g.dtype).index_add_(axis, index, g), None]


def _dim_gather_rule(ctx, g):
    """``scatter_add`` of ``g`` into zeros, out of place: its result keeps the split it runs on (written into
    the broadcast zeros in place, a split result would be gathered to every rank first)."""
    index, axis = ctx.inputs[1], ctx.attrs["axis"]
    return [apply("scatter_add", [ctx.zeros_like_input(0, g.dtype), index, g], axis=axis)[0], None]


def _index_copy_rule(ctx, g):
    index, axis = ctx.inputs[1], ctx.attrs["axis"]
    target = g.clone().index_copy_(axis, index, ctx.zeros_like_input(2, g.dtype)) if ctx.needs_grad(0) else None
    return [target, None, g.index_select(axis, index) if ctx.needs_grad(2) else None]


def _index_add_rule(ctx, g):
    index, axis = ctx.inputs[1], ctx.attrs["axis"]
    return [g, None, g.index_select(axis, index) if ctx.needs_grad(2) else None]


def _scatter_add_rule(ctx, g):
    index, axis = ctx.inputs[1], ctx.attrs["axis"]
    return [g, None, g.gather(axis, index) if ctx.needs_grad(2) else None]


register_op(OpDef("cat", _infer_cat, kernel="concat", launch=_launch_cat, kernel_attrs=("axis",),
                  promote_inputs="all", sbp_signatures=BROADCAST_ONLY, backward=_cat_rule,
                  doc="concatenate along attrs['axis'] (dtypes promoted)"))
register_op(OpDef("index_select", _infer_index_select, kernel_attrs=("axis",), sbp_signatures=BROADCAST_ONLY,
                  backward=_index_select_rule, doc="x[..., index, ...] along attrs['axis'] (a 1-D index)"))
register_op(OpDef("dim_gather", _infer_dim_gather, kernel_attrs=("axis",), sbp_signatures=_dim_gather_signatures,
                  backward=_dim_gather_rule, doc="torch.gather: out[i][j] = x[index[i][j]][j] along attrs['axis']"))
register_op(OpDef("index_copy", _infer_index_copy, launch=_launch_index_copy, kernel_attrs=("axis",),
                  same_view_in_place=True, updates_input=0, sbp_signatures=BROADCAST_ONLY, backward=_index_copy_rule,
                  doc="in place, with out=[target]: target[..., index[j], ...] = source[..., j, ...]"))
register_op(OpDef("index_add", _infer_index_add, launch=_launch_index_copy, kernel_attrs=("axis",),
                  same_view_in_place=True, updates_input=0, sbp_signatures=BROADCAST_ONLY, backward=_index_add_rule,
                  doc="in place, with out=[target]: target[..., index[j], ...] += source[..., j, ...]"))
register_op(OpDef("scatter_add", _infer_scatter_add, launch=_launch_index_copy, kernel_attrs=("axis",),
                  same_view_in_place=True, updates_input=0, sbp_signatures=_scatter_add_signatures,
                  backward=_scatter_add_rule,
                  doc="in place, with out=[target]: target[i][index[i][j]] += source[i][j] along attrs['axis']"))
