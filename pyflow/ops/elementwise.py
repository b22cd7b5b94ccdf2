"""Elementwise ops: unary math, binary arithmetic, comparisons, logical and bitwise ops, where,
clamp, cast, fill, empty.

Dtypes follow PyTorch: the interpreter casts the inputs named in
``promote_inputs`` to their common dtype (``pyflow/framework/dtypes.py``) before
the kernel runs, so a kernel only ever sees equal dtypes, and the kernel
library's own rules (``kernels/ufuncs.py``) then give the result dtype of that one
dtype.  ``floating`` ops (true division, ``sin``...) compute integers in float32.
Every elementwise op may write the very view it reads (``x.add_(y)``).
"""

from __future__ import annotations

from pyflow.errors import DTypeError, ShapeError
from pyflow.framework import args
from pyflow.framework.dtypes import BOOL, as_dtype, to_scalar
from pyflow.framework.op_registry import OpDef, TensorMeta, register_op
from pyflow.kernels.elementwise import binary_result_dtype, unary_result_dtype
from pyflow.kernels.layout import broadcast_shapes

__all__ = ["FLOAT_UNARY", "UNARY_OPS", "BINARY_OPS", "COMPARISONS", "LOGICAL_OPS"]

FLOAT_UNARY = ("sigmoid", "tanh", "exp", "log", "sqrt", "sin", "cos")      # integers compute in float32
UNARY_OPS = FLOAT_UNARY + ("neg", "abs", "relu", "floor", "ceil", "round", "sign", "isnan", "isinf",
                           "logical_not", "bitwise_not")
BINARY_OPS = ("add", "sub", "mul", "div", "max", "min", "pow", "floor_divide", "remainder",
              "bitwise_and", "bitwise_or", "bitwise_xor")
COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")
LOGICAL_OPS = ("logical_and", "logical_or", "logical_xor")   # any dtypes, no promotion (as torch)


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
    if cond.dtype != BOOL:
        raise DTypeError(f"where: the condition must be bool, got {cond.dtype}")
    return [TensorMeta(broadcast_shapes(cond.shape, a.shape, b.shape, op="where"), a.dtype)]


def _infer_clamp(inputs, attrs):
    x, *bounds = inputs
    for bound in bounds:
        if not args.broadcasts_to(bound.shape, x.shape):
            raise ShapeError(f"clamp: a bound of shape {list(bound.shape)} does not broadcast to the input's "
                             f"shape {list(x.shape)}")
    for kind in attrs["bounds"]:   # "min" runs the max kernel and "max" the min kernel: both check the dtype
        binary_result_dtype("max" if kind == "min" else "min", x.dtype, x.dtype)
    return [TensorMeta(x.shape, x.dtype)]


def _launch_clamp(kernels, outputs, inputs, attrs, stream):
    """``out = min(max(x, low), high)``, two kernels in one instruction (the second reads ``out``)."""
    maximum, minimum = kernels
    (out,), (source, *bounds) = outputs, inputs
    for kind, bound in zip(attrs["bounds"], bounds):
        (maximum if kind == "min" else minimum)(out, source, bound, stream=stream)
        source = out


def _infer_cast(inputs, attrs):
    return [TensorMeta(inputs[0].shape, as_dtype(attrs["dtype"], "cast"))]


def _infer_source(name):
    """``fill`` / ``empty``: a new tensor of attrs shape and dtype (and for fill a value that converts)."""
    def infer(inputs, attrs):
        shape, dtype = args.sizes((attrs["shape"],), name), as_dtype(attrs["dtype"], name)
        if name == "fill":
            to_scalar(attrs["value"], dtype, name)
        return [TensorMeta(shape, dtype)]
    return infer


def _launch_fill(kernel, outputs, inputs, attrs, stream):
    kernel(outputs[0], attrs["value"], stream=stream)


def _launch_nothing(kernel, outputs, inputs, attrs, stream):
    """``empty``: the OpCall allocates the output when it is prepared; nothing is written."""


for _name in UNARY_OPS:
    register_op(OpDef(_name, _unary(_name), promote_inputs=(0,), floating=_name in FLOAT_UNARY,
                      same_view_in_place=True, doc=f"elementwise {_name}"))
for _name in BINARY_OPS + COMPARISONS:
    register_op(OpDef(_name, _binary(_name), promote_inputs=(0, 1), floating=_name == "div",
                      same_view_in_place=True, doc=f"elementwise {_name}, broadcasting, promoting"))
for _name in LOGICAL_OPS:
    register_op(OpDef(_name, _binary(_name), same_view_in_place=True, doc=f"elementwise {_name} (bool result)"))
register_op(OpDef("where", _infer_where, promote_inputs=(1, 2), same_view_in_place=True,
                  doc="where(cond, a, b), broadcasting"))
register_op(OpDef("clamp", _infer_clamp, kernel=("max", "min"), launch=_launch_clamp, kernel_attrs=("bounds",),
                  promote_inputs="all", same_view_in_place=True,
                  doc="min(max(x, low), high); attrs['bounds'] names the bounds given ('min', 'max')"))
register_op(OpDef("cast", _infer_cast, same_view_in_place=True, doc="convert to attrs['dtype']"))
register_op(OpDef("fill", _infer_source("fill"), launch=_launch_fill, kernel_attrs=("value",),
                  doc="a new tensor of attrs shape/dtype filled with attrs['value'] (a source op)"))
register_op(OpDef("empty", _infer_source("empty"), kernel="", launch=_launch_nothing,
                  doc="a new, uninitialised tensor of attrs shape/dtype (a source op)"))
