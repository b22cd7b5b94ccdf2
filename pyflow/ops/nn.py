"""Convolution and pooling over NCHW tensors (``kernels/conv.py``): ``conv2d``, ``max_pool2d``, ``avg_pool2d``.

Shapes, strides and padding are checked at the call with the kernels' own rules;
the operands must be float32 or float64 and share one dtype (as in PyTorch, which
does not promote a convolution's operands).

Their gradients are ops too (``kernels/conv_backward.py``, ``kernels/pool_backward.py``): ``conv2d_backward_input``
(a transposed convolution of ``g`` with the weight), ``conv2d_backward_weight``
(``g`` correlated with the input), ``max_pool2d_backward`` (``g`` to the element
each window chose) and ``avg_pool2d_backward`` (``g`` spread over each window).
The gradient's shape is an attr (``input_size`` / ``weight_size``): a strided
forward drops rows, so it cannot be told from ``g``'s shape.  The backward ops
have no backward of their own (no second derivatives of conv and pooling).

SBP: broadcast only (no split rules are declared for them yet).
"""

from __future__ import annotations

from pyflow.errors import DTypeError, ShapeError
from pyflow.framework.interpreter import apply
from pyflow.framework.op_registry import BROADCAST_ONLY, NO_BACKWARD, OpDef, TensorMeta, register_op
from pyflow.kernels.conv import conv2d_output_shape, pool2d_output_shape
from pyflow.kernels.dtypes import FLOAT_DTYPES

__all__ = []
_CONV_DTYPES = tuple(d for d in FLOAT_DTYPES if d.itemsize >= 4)


def _check_dtypes(op, inputs):
    dtypes = [t.dtype for t in inputs]
    if any(d not in _CONV_DTYPES for d in dtypes) or len(set(dtypes)) > 1:
        listed = ", ".join(map(str, dtypes))
        raise DTypeError(f"{op}: operands must share one dtype, float32 or float64; got {listed}")


def _infer_conv2d(inputs, attrs):
    _check_dtypes("conv2d", inputs)
    x, weight, *bias = inputs
    shape = conv2d_output_shape(x.shape, weight.shape, attrs["stride"], attrs["padding"])
    if bias and tuple(bias[0].shape) != (weight.shape[0],):
        raise ShapeError(f"conv2d: bias has shape {list(bias[0].shape)}, expected [{weight.shape[0]}]")
    return [TensorMeta(shape, x.dtype)]


def _launch_conv2d(kernel, outputs, inputs, attrs, stream):
    x, weight, *bias = inputs
    kernel(outputs[0], x, weight, bias[0] if bias else None, **attrs, stream=stream)


def _infer_pool(op):
    def infer(inputs, attrs):
        _check_dtypes(op, inputs)
        shape = pool2d_output_shape(inputs[0].shape, attrs["kernel_size"], attrs["stride"], attrs["padding"], op=op)
        return [TensorMeta(shape, inputs[0].dtype)]
    return infer


def _infer_given_size(op, size_attr):
    """A backward op: its result has the forward operand's shape (attrs[size_attr]) and g's dtype."""
    def infer(inputs, attrs):
        _check_dtypes(op, inputs)
        return [TensorMeta(tuple(attrs[size_attr]), inputs[0].dtype)]
    return infer


def _conv2d_rule(ctx, g):
    stride, padding = ctx.attrs["stride"], ctx.attrs["padding"]
    grads = [None] * len(ctx.inputs)
    if ctx.needs_grad(0):   # reads the weight only
        grads[0] = apply("conv2d_backward_input", [g, ctx.inputs[1]], stride=stride, padding=padding,
                         input_size=ctx.input_shapes[0])[0]
    if ctx.needs_grad(1):   # reads the input only
        grads[1] = apply("conv2d_backward_weight", [ctx.inputs[0], g], stride=stride, padding=padding,
                         weight_size=ctx.input_shapes[1])[0]
    if len(ctx.inputs) > 2 and ctx.needs_grad(2):
        grads[2] = g.sum(dim=(0, 2, 3))
    return grads


def _max_pool2d_rule(ctx, g):
    (x,), attrs = ctx.inputs, ctx.attrs
    return [apply("max_pool2d_backward", [x, g], kernel_size=attrs["kernel_size"], stride=attrs["stride"],
                  padding=attrs["padding"], input_size=tuple(x.shape))[0]]


def _avg_pool2d_rule(ctx, g):
    attrs = ctx.attrs
    return [apply("avg_pool2d_backward", [g], kernel_size=attrs["kernel_size"], stride=attrs["stride"],
                  padding=attrs["padding"], input_size=tuple(ctx.input_shapes[0]))[0]]


register_op(OpDef("conv2d", _infer_conv2d, launch=_launch_conv2d, kernel_attrs=("stride", "padding"),
                  sbp_signatures=BROADCAST_ONLY, backward=_conv2d_rule,
                  doc="2-D convolution (cross-correlation), NCHW, weight (C_out, C_in, kH, kW), optional bias"))
for _name, _rule in (("max_pool2d", _max_pool2d_rule), ("avg_pool2d", _avg_pool2d_rule)):
    register_op(OpDef(_name, _infer_pool(_name), kernel_attrs=("kernel_size", "stride", "padding"),
                      sbp_signatures=BROADCAST_ONLY, backward=_rule, doc=f"{_name} over NCHW windows"))
register_op(OpDef("conv2d_backward_input", _infer_given_size("conv2d_backward_input", "input_size"),
                  kernel_attrs=("stride", "padding"), sbp_signatures=BROADCAST_ONLY, backward=NO_BACKWARD,
                  doc="conv2d's input gradient from (g, weight)"))
register_op(OpDef("conv2d_backward_weight", _infer_given_size("conv2d_backward_weight", "weight_size"),
                  kernel_attrs=("stride", "padding"), sbp_signatures=BROADCAST_ONLY, backward=NO_BACKWARD,
                  doc="conv2d's weight gradient from (x, g)"))
register_op(OpDef("max_pool2d_backward", _infer_given_size("max_pool2d_backward", "input_size"),
                  kernel_attrs=("kernel_size", "stride", "padding"), sbp_signatures=BROADCAST_ONLY,
                  backward=NO_BACKWARD, doc="max_pool2d's input gradient from (x, g)"))
register_op(OpDef("avg_pool2d_backward", _infer_given_size("avg_pool2d_backward", "input_size"),
                  kernel_attrs=("kernel_size", "stride", "padding"), sbp_signatures=BROADCAST_ONLY,
                  backward=NO_BACKWARD, doc="avg_pool2d's input gradient from g"))
