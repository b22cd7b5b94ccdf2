"""Reductions (sum, prod, mean, max, min, argmax, argmin over axes), cumsum, topk, softmax / log_softmax.

Inference reuses the kernel library's own planning (``kernels/reduce.py``), so
axes, keepdims, result dtypes (PyTorch's: the sum or product of bools and integers
is int64) and empty-reduction errors are checked at the call.  ``reduce_mean``,
like ``torch.mean``, needs a floating input.

Backward rules (below): a reduction's gradient is ``g`` put back on the reduced
axes (kept as size 1) and expanded to the input's shape, times the product of the
other elements for ``prod`` (written to be right with zeros); ``max``/``min`` give it
to the elements equal to the result, shared evenly at ties (``torch.amax``'s
choice); softmax and log_softmax use their outputs; ``topk`` scatters ``g`` to
the indices it chose; ``argmax``/``argmin`` (integer results) have none.

SBP: a reduction keeps a split of a kept dim (renumbered without the reduced
ones unless ``keepdims``); ``reduce_sum`` of a dim split gives partial sums,
and ``reduce_sum``/``reduce_mean`` keep P (they are linear).  ``softmax`` and
``log_softmax`` keep a split of any dim but their axis.  ``cumsum`` and
``topk``: broadcast only.
"""

from __future__ import annotations

import math
import types

import numpy as np

from pyflow.errors import DTypeError, ShapeError
from pyflow.framework.functional import where
from pyflow.framework.interpreter import apply
from pyflow.framework.op_registry import BROADCAST_ONLY, NO_BACKWARD, OpDef, TensorMeta, register_op
from pyflow.framework.sbp import P, S, Signature
from pyflow.kernels.layout import normalize_axes, normalize_axis
from pyflow.kernels.reduce import plan_reduce
from pyflow.kernels.scan import cumsum_result_dtype
from pyflow.ops.grad_rules import keepdims_shape

__all__ = ["REDUCE_OPS"]

REDUCE_OPS = ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min", "reduce_mean", "argmax", "argmin")


def _meta_array(meta):
    return types.SimpleNamespace(shape=meta.shape, ndim=len(meta.shape), dtype=meta.dtype)


def _reduction(name):
    def infer(inputs, attrs):
        (x,) = inputs
        if name == "reduce_mean" and x.dtype.kind != "f":
            raise DTypeError(f"mean: needs a floating input, got {x.dtype} (as torch.mean); use .float() first")
        plan = plan_reduce(name, _meta_array(x), attrs.get("axis"), attrs.get("keepdims", False))
        return [TensorMeta(plan.out_shape, plan.out_dtype)]
    return infer


def _infer_softmax(name):
    def infer(inputs, attrs):
        (x,) = inputs
        if x.dtype.kind != "f":
            raise DTypeError(f"{name}: needs a float32 or float64 tensor, got {x.dtype}")
        normalize_axis(attrs.get("axis", -1), len(x.shape), name)
        return [TensorMeta(x.shape, x.dtype)]
    return infer


def _infer_cumsum(inputs, attrs):
    (x,) = inputs
    normalize_axis(attrs["axis"], len(x.shape), "cumsum")
    return [TensorMeta(x.shape, cumsum_result_dtype(x.dtype))]   # torch's too: integers add up in int64


def _infer_topk(inputs, attrs):
    (x,) = inputs
    axis = normalize_axis(attrs["axis"], len(x.shape), "topk")
    k, size = attrs["k"], x.shape[axis]
    if not 0 <= k <= size:
        raise ShapeError(f"topk: k={k} is out of range for dim {axis} of size {size} (valid: 0 to {size})")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [TensorMeta(shape, x.dtype), TensorMeta(shape, np.dtype(np.int64))]


# --- SBP signatures -------------------------------------------------------------------------------


def _reduction_signatures(name):
    def signatures(shapes, out_shapes, attrs) -> list:
        (shape,) = shapes
        if shape is None:
            return []
        axes = normalize_axes(attrs.get("axis"), len(shape), name)
        keep = attrs.get("keepdims", False)
        found = []
        for d in range(len(shape)):
            if d in axes:
                if name == "reduce_sum":
                    found.append(Signature((S(d),), (P,)))
            else:
                out_d = d if keep else d - sum(1 for a in axes if a < d)
                found.append(Signature((S(d),), (S(out_d),)))
        if name in ("reduce_sum", "reduce_mean"):
            found.append(Signature((P,), (P,)))
        return found
    return signatures


def _softmax_signatures(shapes, out_shapes, attrs) -> list:
    (shape,) = shapes
    axis = attrs.get("axis", -1) % max(len(shape), 1)
    return [Signature((S(d),), (S(d),)) for d in range(len(shape)) if d != axis]


# --- backward rules --------------------------------------------------------------------------------


def _spread(ctx, g):
    """``g`` with the reduced axes back (size 1), expanded to the input's shape."""
    shape = ctx.input_shapes[0]
    kept = g.reshape(keepdims_shape(shape, ctx.attrs.get("axis")))
    return kept.expand(shape)


def _sum_rule(ctx, g):
    return [_spread(ctx, g)]


def _prod_rule(ctx, g):
    """d prod / d x_i = the product of the other elements.  Dividing the product by ``x_i`` is wrong at a
    zero, so, as PyTorch does, count the zeros of each reduced slice: none, ``prod / x``; exactly one, the
    product of the nonzero others at that zero and 0 elsewhere; two or more, 0 everywhere."""
    (x,), axes = ctx.inputs, _axes(ctx)
    kept = keepdims_shape(ctx.input_shapes[0], ctx.attrs.get("axis"))
    zero = x == 0
    zeros = zero.sum(dim=axes, keepdim=True)
    nonzero = where(zero, 1.0, x)
    others = apply("reduce_prod", [nonzero], axis=axes, keepdims=True)[0]   # of the nonzero elements
    grad = where(zeros == 0, others / nonzero, where(zero.logical_and(zeros == 1), others, 0.0))
    return [g.reshape(kept).expand(x.shape) * grad]


def _mean_rule(ctx, g):
    count = math.prod(ctx.input_shapes[0]) // max(1, math.prod(ctx.output_shapes[0]))
    return [_spread(ctx, g) / float(count)]


def _extremum_rule(ctx, g):
    (x,), (y,) = ctx.inputs, ctx.outputs
    kept = keepdims_shape(ctx.input_shapes[0], ctx.attrs.get("axis"))
    chosen = x == y.reshape(kept)
    ties = chosen.sum(dim=_axes(ctx), keepdim=True).to(dtype=g.dtype)
    return [where(chosen, (g.reshape(kept) / ties).expand(x.shape), 0.0)]


def _axes(ctx):
    axis, ndim = ctx.attrs.get("axis"), len(ctx.input_shapes[0])
    return tuple(range(ndim)) if axis is None else axis


def _softmax_rule(ctx, g):
    (y,), axis = ctx.outputs, ctx.attrs.get("axis", -1)
    return [y * (g - (g * y).sum(dim=axis, keepdim=True))]


def _log_softmax_rule(ctx, g):
    (y,), axis = ctx.outputs, ctx.attrs.get("axis", -1)
    return [g - y.exp() * g.sum(dim=axis, keepdim=True)]


def _cumsum_rule(ctx, g):
    """x[i] feeds y[j] for every j >= i: its gradient is the sum of g from i on (a reversed cumsum)."""
    axis = ctx.attrs["axis"]
    return [g.sum(dim=axis, keepdim=True) - g.cumsum(axis) + g]


def _topk_rule(ctx, grads):
    g, _ = grads
    indices, axis = ctx.outputs[1], ctx.attrs["axis"]
    return [ctx.zeros_like_input(0, g.dtype).scatter_add_(axis, indices, g)]


_RULES = {"reduce_sum": _sum_rule, "reduce_prod": _prod_rule, "reduce_mean": _mean_rule, "reduce_max": _extremum_rule,
          "reduce_min": _extremum_rule, "argmax": NO_BACKWARD, "argmin": NO_BACKWARD,
          "softmax": _softmax_rule, "log_softmax": _log_softmax_rule}


for _name in REDUCE_OPS:
    register_op(OpDef(_name, _reduction(_name), kernel_attrs=("axis", "keepdims"),
                      sbp_signatures=_reduction_signatures(_name), backward=_RULES[_name],
                      doc=f"{_name} over attrs['axis'] (None: all), keepdims"))
for _name in ("softmax", "log_softmax"):
    register_op(OpDef(_name, _infer_softmax(_name), kernel_attrs=("axis",), sbp_signatures=_softmax_signatures,
                      backward=_RULES[_name], doc=f"{_name} along attrs['axis']"))
register_op(OpDef("cumsum", _infer_cumsum, kernel_attrs=("axis",), sbp_signatures=BROADCAST_ONLY,
                  backward=_cumsum_rule, doc="running sum along attrs['axis'] (integers sum in int64)"))
register_op(OpDef("topk", _infer_topk, kernel_attrs=("k", "axis", "largest"), sbp_signatures=BROADCAST_ONLY,
                  backward=_topk_rule,
                  doc="the k largest (or smallest) elements along attrs['axis'], sorted, and their indices"))
