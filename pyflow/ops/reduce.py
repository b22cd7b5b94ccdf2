"""Reductions (sum, mean, max, min, argmax, argmin over axes), cumsum, topk, softmax / log_softmax.

Inference reuses the kernel library's own planning (``kernels/reduce.py``), so
axes, keepdims, result dtypes (PyTorch's: the sum of bools and integers is
int64) and empty-reduction errors are checked at the call.  ``reduce_mean``,
like ``torch.mean``, needs a floating input.
"""

from __future__ import annotations

import types

import numpy as np

from pyflow.errors import DTypeError, ShapeError
from pyflow.framework.op_registry import OpDef, TensorMeta, register_op
from pyflow.kernels.layout import normalize_axis
from pyflow.kernels.reduce import plan_reduce
from pyflow.kernels.scan import cumsum_result_dtype

__all__ = ["REDUCE_OPS"]

REDUCE_OPS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_mean", "argmax", "argmin")


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


for _name in REDUCE_OPS:
    register_op(OpDef(_name, _reduction(_name), kernel_attrs=("axis", "keepdims"),
                      doc=f"{_name} over attrs['axis'] (None: all), keepdims"))
for _name in ("softmax", "log_softmax"):
    register_op(OpDef(_name, _infer_softmax(_name), kernel_attrs=("axis",), doc=f"{_name} along attrs['axis']"))
register_op(OpDef("cumsum", _infer_cumsum, kernel_attrs=("axis",),
                  doc="running sum along attrs['axis'] (integers sum in int64)"))
register_op(OpDef("topk", _infer_topk, kernel_attrs=("k", "axis", "largest"),
                  doc="the k largest (or smallest) elements along attrs['axis'], sorted, and their indices"))
