"""View ops: a new layout (shape, strides, offset) over the input's storage; no kernel, no copy.

Each is one ``OpDef`` with ``view`` set (OneFlow's view ops: ``reshape``,
``transpose``, ``expand``, ``narrow``, ``squeeze``, ``unsqueeze`` with their
``view::`` stride rules and ``GetSbpFn``s):

* ``view(shape, strides, offset, attrs)``: the result's layout as a view of the
  input's.  The interpreter wraps it over the same storage and version counter
  (``x.T.add_(1)`` changes ``x``); nn.Graph records it as a ``view`` JobOp that
  aliases its input's memory; ``infer`` is the same rule on a contiguous input;
* ``backward``: ONE rule, used by eager autograd and by the compiler's autograd
  pass alike (the gradient of a permute is the inverse permute: a view again);
* ``sbp_signatures``: which splits carry over.  The attrs are the same on every
  rank's piece (``expand`` and ``view`` keep a dim as -1, ``narrow`` never cuts a
  split dim), so the global interpreter views each piece with them.  A partial sum stays
  one: a view moves no value, so the sum of the viewed parts is the viewed sum.

The Tensor methods (``x.permute``, ``x.T``, ``x.flatten``...) are in
``pyflow/framework/views.py``: they check and normalize the arguments and call
these ops; ``transpose``, ``.T``, ``flatten``, ``split``, ``chunk`` and
``expand_as`` are compositions of them.  ``reshape`` is the ``view`` op, of a
contiguous copy when the strides forbid a view (as in PyTorch).

>>> from pyflow.framework.op_registry import get_op
>>> get_op("permute").view((2, 3), (3, 1), 0, {"dims": (1, 0)})
((3, 2), (1, 3), 0)
>>> get_op("narrow").view((4, 3), (3, 1), 0, {"dim": 0, "start": 1, "length": 2})
((2, 3), (3, 1), 3)
>>> get_op("expand").view((1, 3), (3, 1), 0, {"sizes": (2, 4, -1)})
((2, 4, 3), (0, 0, 1), 0)
>>> get_op("view").view((4, 6), (6, 1), 0, {"shape": (-1, 2, 3), "kept": (0,)})   # x.view(4, 2, 3)
((4, 2, 3), (6, 3, 1), 0)
"""

from __future__ import annotations

from pyflow.errors import ShapeError
from pyflow.framework.movement import cat
from pyflow.framework.op_registry import OpDef, TensorMeta, register_op
from pyflow.framework.sbp import P, S, Signature
from pyflow.framework.views import view_strides
from pyflow.kernels.layout import contiguous_strides
from pyflow.ops._grad import sum_to

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


def _view_op(name: str, layout, backward, sbp_signatures) -> OpDef:
    """An OpDef whose result is ``layout`` of its input; its inference is the same rule on a contiguous input."""
    def infer(inputs, attrs):
        (x,) = inputs
        shape = layout(tuple(x.shape), contiguous_strides(x.shape), 0, attrs)[0]
        return [TensorMeta(tuple(shape), x.dtype)]
    return register_op(OpDef(name, infer, kernel="", view=layout, backward=backward, sbp_signatures=sbp_signatures,
                             doc=f"the view op {name}"))


VIEW_OPS = {op.name: op for op in (
    _view_op("permute", _permute, _permute_backward, _permute_signatures),
    _view_op("view", _view, _reshape_backward, _view_signatures),
    _view_op("expand", _expand, _expand_backward, _expand_signatures),
    _view_op("narrow", _narrow, _narrow_backward, _narrow_signatures),
    _view_op("squeeze", _squeeze, _reshape_backward, _squeeze_signatures),
    _view_op("unsqueeze", _unsqueeze, _reshape_backward, _unsqueeze_signatures),
)}
