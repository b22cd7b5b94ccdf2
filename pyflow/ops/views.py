"""View ops: a new layout (shape, strides, offset) over the input's storage; no kernel, no copy.

Each is one ``OpDef`` with ``view`` set (OneFlow's view ops: ``reshape``,
``transpose``, ``expand``, ``narrow``, ``squeeze``, ``unsqueeze``, and ``slice_view``
for basic indexing ``x[1, :, None, ::2]``, with their ``view::`` stride rules and
``GetSbpFn``s):

* ``view(shape, strides, offset, attrs)``: the result's layout as a view of the
  input's.  The interpreter wraps it over the same storage and version counter
  (``x.T.add_(1)`` changes ``x``); nn.Graph records it as a ``view`` JobOp that
  aliases its input's memory; ``infer`` is the same rule on a contiguous input;
* ``backward``: ONE rule, used by eager autograd and by the compiler's autograd
  pass alike (the gradient of a permute is the inverse permute: a view again);
* ``sbp_signatures``: which splits carry over.  The attrs are the same on every
  rank's piece (``expand`` and ``view`` keep a dim as -1, ``narrow`` never cuts a
  split dim, ``slice_view`` keeps it ``WHOLE``), so the global interpreter views each
  piece with them.  A partial sum stays one: a view moves no value, so the sum of the
  viewed parts is the viewed sum.

``slice_update`` (``x[1:, 0] = v``, OneFlow's) is here too: the in-place write through a
``slice_view``, an op with a kernel (``cast`` into the region), whose backward zeroes the
region of ``g`` for the target and takes it (``slice_view``) for the value.

The Tensor methods (``x.permute``, ``x.T``, ``x.flatten``...) are in
``pyflow/framework/views.py``: they check and normalize the arguments and call
these ops; ``transpose``, ``.T``, ``flatten``, ``split``, ``chunk`` and
``expand_as`` are compositions of them.  ``reshape`` is the ``view`` op, of a
contiguous copy when the strides forbid a view (as in PyTorch).  ``x[index]`` with ints,
slices, ``None`` and ``...`` is ``slice_view`` (``pyflow/framework/indexing.py`` normalizes
the index; a tensor or mask in it is an ``index_select`` after the view).

>>> from pyflow.framework.op_registry import get_op
>>> get_op("permute").view((2, 3), (3, 1), 0, {"dims": (1, 0)})
((3, 2), (1, 3), 0)
>>> get_op("narrow").view((4, 3), (3, 1), 0, {"dim": 0, "start": 1, "length": 2})
((2, 3), (3, 1), 3)
>>> get_op("expand").view((1, 3), (3, 1), 0, {"sizes": (2, 4, -1)})
((2, 4, 3), (0, 0, 1), 0)
>>> get_op("view").view((4, 6), (6, 1), 0, {"shape": (-1, 2, 3), "kept": (0,)})   # x.view(4, 2, 3)
((4, 2, 3), (6, 3, 1), 0)
>>> get_op("slice_view").view((4, 6), (6, 1), 0, {"index": (1, None, (0, None, 2))})   # x[1, None, ::2]
((1, 3), (0, 2), 6)
"""

from __future__ import annotations

from pyflow.errors import ShapeError
from pyflow.framework.interpreter import apply
from pyflow.framework.movement import cat
from pyflow.framework.op_registry import OpDef, TensorMeta, register_op
from pyflow.framework.sbp import P, S, Signature
from pyflow.framework.views import WHOLE, view_strides
from pyflow.kernels.layout import contiguous_strides, sliced_view
from pyflow.ops.grad_rules import sum_to

__all__ = ["VIEW_OPS"]


def _permute(shape, strides, offset, attrs):
    dims = attrs["dims"]
    return tuple(shape[d] for d in dims), tuple(strides[d] for d in dims), offset


def _permute_backward(ctx, g):
    dims = ctx.attrs["dims"]
    return [g.permute([dims.index(d) for d in range(len(dims))])]


def _permute_signatures(shapes, out_shapes, attrs):
    dims = attrs["dims"]
    return [Signature((S(d),), (S(dims.index(d)),)) for d in range(len(shapes[0])) if shapes[0][d] > 1] + \
        [Signature((P,), (P,))]


def _view(shape, strides, offset, attrs):
    kept = iter(attrs["kept"])   # a -1 in attrs["shape"]: the size of the input dim kept there
    new_shape = tuple(shape[next(kept)] if n == -1 else n for n in attrs["shape"])
    new_strides = view_strides(shape, strides, new_shape)
    if new_strides is None:
        raise ShapeError(f"view: strides {tuple(strides)} cannot be viewed as {list(new_shape)} (its dims are not "
                         "contiguous with each other); use .reshape(...), which copies when it must")
    return new_shape, new_strides, offset


def _reshape_backward(ctx, g):
    return [g.reshape(ctx.input_shapes[0])]


def _view_signatures(shapes, out_shapes, attrs):
    """A split of a kept dim (``reshape_attrs``: -1 in ``shape``) is a split of the result's dim there."""
    marked = [j for j, n in enumerate(attrs["shape"]) if n == -1]
    return [Signature((S(d),), (S(j),)) for j, d in zip(marked, attrs["kept"])] + [Signature((P,), (P,))]


def _expand(shape, strides, offset, attrs):
    sizes = attrs["sizes"]   # new leading dims, then per input dim: -1 (kept) or the size a size-1 dim becomes
    pad = len(sizes) - len(shape)
    out = list(sizes[:pad]) + [n if want == -1 else want for n, want in zip(shape, sizes[pad:])]
    kept = [s if out[pad + d] == n else 0 for d, (n, s) in enumerate(zip(shape, strides))]
    return tuple(out), (0,) * pad + tuple(kept), offset


def _expand_backward(ctx, g):
    return [sum_to(g, ctx.input_shapes[0])]


def _expand_signatures(shapes, out_shapes, attrs):
    (shape,), pad = shapes, len(attrs["sizes"]) - len(shapes[0])
    return [Signature((S(d),), (S(pad + d),)) for d in range(len(shape))
            if attrs["sizes"][pad + d] == -1 and shape[d] > 1] + [Signature((P,), (P,))]


def _narrow(shape, strides, offset, attrs):
    d, start, length = attrs["dim"], attrs["start"], attrs["length"]
    return shape[:d] + (length,) + shape[d + 1:], tuple(strides), offset + (start * strides[d] if length else 0)


def _narrow_backward(ctx, g):
    """``g`` put back between zeros where the narrow cut the input (no sum: each element was read once)."""
    d, start, length = ctx.attrs["dim"], ctx.attrs["start"], ctx.attrs["length"]
    size = ctx.input_shapes[0][d]
    if length == size:
        return [g]
    zeros = ctx.zeros_like_input(0, g.dtype)
    parts = [zeros.narrow(d, 0, start)] if start else []
    parts += [g] + ([zeros.narrow(d, start + length, size - start - length)] if start + length < size else [])
    return [cat(parts, dim=d)]


def _narrow_signatures(shapes, out_shapes, attrs):
    return [Signature((S(d),), (S(d),)) for d in range(len(shapes[0]))
            if d != attrs["dim"] and shapes[0][d] > 1] + [Signature((P,), (P,))]


def _squeeze(shape, strides, offset, attrs):
    keep = [d for d in range(len(shape)) if d not in attrs["dims"]]
    return tuple(shape[d] for d in keep), tuple(strides[d] for d in keep), offset


def _squeeze_signatures(shapes, out_shapes, attrs):
    dropped = attrs["dims"]
    return [Signature((S(d),), (S(d - sum(k < d for k in dropped)),)) for d in range(len(shapes[0]))
            if d not in dropped and shapes[0][d] > 1] + [Signature((P,), (P,))]


def _unsqueeze(shape, strides, offset, attrs):
    d = attrs["dim"]
    stride = shape[d] * strides[d] if d < len(shape) else 1
    return shape[:d] + (1,) + shape[d:], tuple(strides[:d]) + (stride,) + tuple(strides[d:]), offset


def _unsqueeze_signatures(shapes, out_shapes, attrs):
    d = attrs["dim"]
    return [Signature((S(k),), (S(k if k < d else k + 1),)) for k in range(len(shapes[0])) if shapes[0][k] > 1] + \
        [Signature((P,), (P,))]


def _slice_view(shape, strides, offset, attrs):
    """Basic indexing (numpy's): per item of ``attrs["index"]``, one input dim in order, or a new dim:
    an int picks one element (the dim goes), ``(start, stop, step)`` keeps every ``step``-th element
    (``stop`` None: to the end; ``WHOLE``: all of it), ``None`` inserts a size-1 dim; later dims stay."""
    out_shape, out_strides, d = [], [], 0
    for item in attrs["index"]:
        if item is None:
            out_shape.append(1)
            out_strides.append(0)
            continue
        size, stride = shape[d], strides[d]
        d += 1
        if isinstance(item, int):
            offset += item * stride
            continue
        start, stop, step = item
        n = len(range(start, size if stop is None else stop, step))
        out_shape.append(n)
        out_strides.append(stride * step)
        offset += start * stride if n else 0
    return tuple(out_shape) + tuple(shape[d:]), tuple(out_strides) + tuple(strides[d:]), offset


def _slice_view_backward(ctx, g):
    """OneFlow's ``slice_grad``: zeros of the input's shape with ``g`` where the index read (each element
    once: no sum).  Written with view ops and ``cat`` (pads of zeros), so a graph records it as any rule:
    ``g`` gets the input's rank (the new dims dropped, an int's dim back with size 1), then each indexed
    dim is padded: ``step - 1`` zeros after every element, ``start`` zeros before, the rest after."""
    shape, index = ctx.input_shapes[0], ctx.attrs["index"]
    items = [item for item in index if item is not None] + [WHOLE] * (len(shape) - sum(i is not None for i in index))
    new_dims = [j for j, item in enumerate(i for i in index if not isinstance(i, int)) if item is None]
    if new_dims:
        g = g.squeeze(tuple(new_dims))
    for d, item in enumerate(items):
        if isinstance(item, int):
            g = g.unsqueeze(d)
    zeros = ctx.zeros_like_input(0, g.dtype)
    for d, item in enumerate(items):
        if item == WHOLE:
            continue
        start, step = (item, 1) if isinstance(item, int) else (item[0], item[2])
        n = g.shape[d]
        if n == 0:
            g = _zeros_like(zeros, g, d, shape[d])
            continue
        if step > 1 and n > 1:   # element k at k * step: each followed by step - 1 zeros (a new dim, merged)
            gaps = _zeros_like(zeros, g, d, n).unsqueeze(d + 1)
            gaps = gaps.expand(*gaps.shape[:d + 1], step - 1, *gaps.shape[d + 2:])
            spread = cat([g.unsqueeze(d + 1), gaps], dim=d + 1)
            g = spread.reshape(*g.shape[:d], n * step, *g.shape[d + 1:]).narrow(d, 0, (n - 1) * step + 1)
        after = shape[d] - start - g.shape[d]
        parts = [_zeros_like(zeros, g, d, start)] if start else []
        parts += [g] + ([_zeros_like(zeros, g, d, after)] if after else [])
        g = cat(parts, dim=d) if len(parts) > 1 else g
    return [g]


def _zeros_like(zeros, g, d: int, n: int):
    """Zeros of ``g``'s shape with ``n`` elements along dim ``d``: ``zeros`` (the input's shape, each dim at
    least as long) narrowed from 0."""
    for k, size in enumerate(tuple(g.shape[:d]) + (n,) + tuple(g.shape[d + 1:])):
        if zeros.shape[k] != size:
            zeros = zeros.narrow(k, 0, size)
    return zeros


def _slice_view_signatures(shapes, out_shapes, attrs):
    """A split of a dim the index keeps ``WHOLE`` stays a split (of that dim in the result); any other dim
    is cut by the index at logical positions, so it needs the whole dim (B)."""
    (shape,), index = shapes, attrs["index"]
    index = tuple(index) + (WHOLE,) * (len(shape) - sum(item is not None for item in index))
    signatures, d, j = [], 0, 0   # d: the input's dim, j: the result's
    for item in index:
        if item is not None:
            if item == WHOLE and shape[d] > 1:
                signatures.append(Signature((S(d),), (S(j),)))
            d += 1
        j += 0 if isinstance(item, int) else 1
    return signatures + [Signature((P,), (P,))]


def _view_op(name: str, layout, backward, sbp_signatures) -> OpDef:
    """An OpDef whose result is ``layout`` of its input; its inference is the same rule on a contiguous input."""
    def infer(inputs, attrs):
        (x,) = inputs
        shape = layout(tuple(x.shape), contiguous_strides(x.shape), 0, attrs)[0]
        return [TensorMeta(tuple(shape), x.dtype)]
    return register_op(OpDef(name, infer, kernel="", view=layout, backward=backward, sbp_signatures=sbp_signatures,
                             doc=f"the view op {name}"))


# --- slice_update: the write through a slice (``x[index] = value``; OneFlow's ``slice_update``) ---------------


def _infer_slice_update(inputs, attrs):
    """The target's shape and dtype; the value has the shape of the region (an int of the index is a
    length-1 slice there, OneFlow's rule) and is cast to the target's dtype by the kernel."""
    target, value = inputs
    region = _slice_view(tuple(target.shape), contiguous_strides(target.shape), 0, attrs)[0]
    if tuple(value.shape) != region:
        raise ShapeError(f"slice_update: the value's shape {list(value.shape)} is not the region's {list(region)}")
    return [TensorMeta(tuple(target.shape), target.dtype)]


def _launch_slice_update(kernel, outputs, inputs, attrs, stream):
    """inputs[0] is the target itself (a failure upstream of it propagates); the ``cast`` kernel copies the
    value into the target's region, a strided view of it."""
    region = sliced_view(outputs[0], tuple(slice(*item) for item in attrs["index"]))
    if region.size:
        kernel(region, inputs[1], stream=stream)


def _slice_update_backward(ctx, g):
    """The target's old values in the region were overwritten: ``g`` with zeros there; the value: ``g``'s
    region (the ``slice_view`` of it)."""
    index = ctx.attrs["index"]
    target = apply("slice_update", [g, ctx.zeros_like_input(1, g.dtype)], index=index)[0] \
        if ctx.needs_grad(0) else None
    return [target, apply("slice_view", [g], index=index)[0] if ctx.needs_grad(1) else None]


def _slice_update_signatures(shapes, out_shapes, attrs):
    """Target and value split along a dim the index keeps ``WHOLE``: each rank writes its own rows; a sum of
    partial targets with a sum of partial values written in is the written sum."""
    target, index = shapes[0], attrs["index"]
    return [Signature((S(d), S(d)), (S(d),)) for d, item in enumerate(index) if item == WHOLE and target[d] > 1] + \
        [Signature((P, P), (P,))]


register_op(OpDef("slice_update", _infer_slice_update, kernel="cast", launch=_launch_slice_update,
                  kernel_attrs=("index",), same_view_in_place=True, updates_input=0,
                  sbp_signatures=_slice_update_signatures, backward=_slice_update_backward,
                  doc="x[index] = value for a basic index (attrs['index']: (start, stop, step) per dim)"))


VIEW_OPS = {op.name: op for op in (
    _view_op("permute", _permute, _permute_backward, _permute_signatures),
    _view_op("view", _view, _reshape_backward, _view_signatures),
    _view_op("expand", _expand, _expand_backward, _expand_signatures),
    _view_op("narrow", _narrow, _narrow_backward, _narrow_signatures),
    _view_op("squeeze", _squeeze, _reshape_backward, _squeeze_signatures),
    _view_op("unsqueeze", _unsqueeze, _reshape_backward, _unsqueeze_signatures),
    _view_op("slice_view", _slice_view, _slice_view_backward, _slice_view_signatures),
)}
