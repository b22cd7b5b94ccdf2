"""Reductions (sum, mean, max, min, argmax over axes) and softmax / log_softmax.

Inference reuses the kernel library's own planning (``kernels/reduce.py``), so
axes, keepdims, result dtypes and empty-reduction errors follow numpy at the call.
"""

from __future__ import annotations

import types

from pyflow.errors import DTypeError
from pyflow.framework.op_registry import OpDef, TensorMeta, register_op
from pyflow.kernels.layout import normalize_axis
from pyflow.kernels.reduce import REDUCTIONS, plan_reduce

__all__ = []


def _meta_array(meta):
    return types.SimpleNamespace(shape=meta.shape, ndim=len(meta.shape), dtype=meta.dtype)


def _reduction(name):
    def infer(inputs, attrs):
        plan = plan_reduce(name, _meta_array(inputs[0]), attrs.get("axis"), attrs.get("keepdims", False))
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


for _name in REDUCTIONS:
    register_op(OpDef(_name, _reduction(_name), kernel_attrs=("axis", "keepdims"),
                      doc=f"{_name} over attrs['axis'] (None: all), keepdims"))
for _name in ("softmax", "log_softmax"):
    register_op(OpDef(_name, _infer_softmax(_name), kernel_attrs=("axis",), doc=f"{_name} along attrs['axis']"))
