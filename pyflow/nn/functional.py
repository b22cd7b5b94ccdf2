"""``flow.nn.functional``: convolution and pooling on NCHW tensors, as ``torch.nn.functional``.

Each is one op (``pyflow/ops/nn.py``) whose kernels are in ``kernels/conv.py``;
``relu``, ``softmax`` and ``log_softmax`` are the same functions as ``flow.relu``...

>>> import pyflow as flow
>>> x = flow.arange(16.0).reshape(1, 1, 4, 4)
>>> F = flow.nn.functional
>>> F.max_pool2d(x, 2).flatten().tolist(), F.avg_pool2d(x, 2, stride=2).flatten().tolist()
([5.0, 7.0, 13.0, 15.0], [2.5, 4.5, 10.5, 12.5])
>>> F.conv2d(x, flow.ones(1, 1, 3, 3), padding=1).shape
(1, 1, 4, 4)
"""

from __future__ import annotations

from pyflow.framework.functional import _tensor, log_softmax, relu, softmax
from pyflow.framework.interpreter import apply
from pyflow.framework.tensor import Tensor

__all__ = ["conv2d", "max_pool2d", "avg_pool2d", "relu", "softmax", "log_softmax"]


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0) -> Tensor:  # noqa: A002
    """2-D cross-correlation: input (N, C_in, H, W), weight (C_out, C_in, kH, kW), bias (C_out,)."""
    operands = [_tensor(input, "conv2d"), _tensor(weight, "conv2d")]
    if bias is not None:
        operands.append(_tensor(bias, "conv2d"))
    return apply("conv2d", operands, stride=stride, padding=padding)[0]


def max_pool2d(input: Tensor, kernel_size, stride=None, padding=0) -> Tensor:  # noqa: A002
    """The maximum of each window (``stride`` defaults to ``kernel_size``; padding counts as -inf)."""
    return apply("max_pool2d", [_tensor(input, "max_pool2d")], kernel_size=kernel_size, stride=stride,
                 padding=padding)[0]


def avg_pool2d(input: Tensor, kernel_size, stride=None, padding=0) -> Tensor:  # noqa: A002
    """The mean of each window (``stride`` defaults to ``kernel_size``; padding counts as zeros)."""
    return apply("avg_pool2d", [_tensor(input, "avg_pool2d")], kernel_size=kernel_size, stride=stride,
                 padding=padding)[0]
