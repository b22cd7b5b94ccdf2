"""Elementwise ops: unary math, binary arithmetic, comparisons, where, cast, fill.

Shapes broadcast and dtypes follow numpy, through the kernel library's own rules
(``kernels/elementwise.py``), so the checks at the call match the kernels'.
"""

from __future__ import annotations

import numpy as np

from pyflow.errors import DTypeError
from pyflow.framework.op_registry import OpDef, TensorMeta, register_op
from pyflow.kernels.elementwise import BINARY, COMPARE, UNARY, binary_result_dtype, unary_result_dtype
from pyflow.kernels.layout import broadcast_shapes

__all__ = ["UNARY_OPS", "BINARY_OPS"]

UNARY_OPS = tuple(sorted(UNARY))
BINARY_OPS = tuple(sorted(BINARY)) + tuple(sorted(COMPARE))


def _unary(name):
    def infer(inputs, attrs):
        (x,) = inputs
        return [TensorMeta(x.shape, unary_result_dtype(name, x.dtype))]
    return infer


def _binary(name):
    def infer(inputs, attrs):
        a, b = inputs
        return [TensorMeta(broadcast_shapes(a.shape, b.shape, op=name), binary_result_dtype(name, a.dtype, b.dtype))]
    return infer


def _infer_where(inputs, attrs):
    cond, a, b = inputs
    if cond.dtype != np.bool_:
        raise DTypeError(f"where: the condition must be bool, got {cond.dtype}")
    return [TensorMeta(broadcast_shapes(cond.shape, a.shape, b.shape, op="where"), np.result_type(a.dtype, b.dtype))]


def _infer_cast(inputs, attrs):
    return [TensorMeta(inputs[0].shape, np.dtype(attrs["dtype"]))]


def _infer_fill(inputs, attrs):
    return [TensorMeta(tuple(attrs["shape"]), np.dtype(attrs["dtype"]))]


def _launch_fill(kernel, outputs, inputs, attrs, stream):
    kernel(outputs[0], attrs["value"], stream=stream)


for _name in UNARY_OPS:
    register_op(OpDef(_name, _unary(_name), doc=f"elementwise {_name}"))
for _name in BINARY_OPS:
    register_op(OpDef(_name, _binary(_name), doc=f"elementwise {_name}, broadcasting"))
register_op(OpDef("where", _infer_where, doc="where(cond, a, b), broadcasting"))
register_op(OpDef("cast", _infer_cast, doc="convert to attrs['dtype']"))
register_op(OpDef("fill", _infer_fill, launch=_launch_fill, kernel_attrs=("value",),
                  doc="a new tensor of attrs shape/dtype filled with attrs['value'] (a source op)"))
