"""Convolution and pooling over NCHW tensors (``kernels/conv.py``): ``conv2d``, ``max_pool2d``, ``avg_pool2d``.

Shapes, strides and padding are checked at the call with the kernels' own rules;
the operands must be float32 or float64 and share one dtype (as in PyTorch, which
does not promote a convolution's operands).
"""

from __future__ import annotations

from pyflow.errors import DTypeError, ShapeError
from pyflow.framework.op_registry import OpDef, TensorMeta, register_op
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


register_op(OpDef("conv2d", _infer_conv2d, launch=_launch_conv2d, kernel_attrs=("stride", "padding"),
                  doc="2-D convolution (cross-correlation), NCHW, weight (C_out, C_in, kH, kW), optional bias"))
for _name in ("max_pool2d", "avg_pool2d"):
    register_op(OpDef(_name, _infer_pool(_name), kernel_attrs=("kernel_size", "stride", "padding"),
                      doc=f"{_name} over NCHW windows"))
