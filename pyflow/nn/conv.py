"""``Conv2d`` and the pooling layers ``MaxPool2d`` / ``AvgPool2d``, over NCHW tensors.

``Conv2d(in_channels, out_channels, kernel_size, stride=1, padding=0)`` holds
``weight`` (out_channels, in_channels, kH, kW) and ``bias`` (out_channels,),
initialised as PyTorch does: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with
``fan_in = in_channels / groups * kH * kW``.  The op is ``flow.nn.functional.conv2d``
(one kernel, ``kernels/conv.py``); ``dilation`` and ``groups`` are compositions
around it (``nn/conv_compose.py``): weight (out_channels, in_channels / groups, kH, kW).

>>> import pyflow as flow
>>> conv = Conv2d(1, 2, 3, padding=1)
>>> conv
Conv2d(1, 2, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))
>>> conv(flow.ones(1, 1, 4, 4)).shape, MaxPool2d(2)(flow.ones(1, 1, 4, 4)).shape
((1, 2, 4, 4), (1, 1, 2, 2))
"""

from __future__ import annotations

import math

from pyflow.framework.creation import empty
from pyflow.framework.tensor import Tensor
from pyflow.nn import functional as F
from pyflow.nn import init
from pyflow.nn.module import ArgumentValueError, Module
from pyflow.nn.parameter import Parameter

__all__ = ["Conv2d", "MaxPool2d", "AvgPool2d"]


def _pair(value, what: str, layer: str) -> tuple:
    items = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(items) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        raise ArgumentValueError(f"{layer}: {what} must be an int or a pair of ints (h, w), got {value!r}")
    return items


def _padding(padding, kernel_size: tuple, stride: tuple, dilation: tuple) -> tuple:
    """``padding`` as a pair; ``"valid"`` is no padding, ``"same"`` keeps H and W (stride 1, and a dilated
    kernel of odd size ``d (k - 1) + 1``)."""
    if padding == "valid":
        return (0, 0)
    if padding == "same":
        span = tuple(d * (k - 1) + 1 for k, d in zip(kernel_size, dilation))
        if stride != (1, 1) or any(n % 2 == 0 for n in span):
            raise ArgumentValueError(f"Conv2d: padding='same' needs stride 1 and an odd (dilated) kernel here "
                                     f"(pyflow pads both sides equally), got kernel_size={kernel_size}, "
                                     f"dilation={dilation}, stride={stride}")
        return tuple(n // 2 for n in span)
    return _pair(padding, "padding", "Conv2d")


class Conv2d(Module):
    """2-D cross-correlation: (N, in_channels, H, W) -> (N, out_channels, H_out, W_out)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None) -> None:
        super().__init__()
        if padding_mode != "zeros":
            raise ArgumentValueError(f"Conv2d: padding_mode={padding_mode!r} is not supported; only 'zeros'")
        for value, what in ((in_channels, "in_channels"), (out_channels, "out_channels")):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ArgumentValueError(f"Conv2d: {what} must be a positive int, got {value!r}")
        if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0:
            raise ArgumentValueError(f"Conv2d: groups must be a positive int, got {groups!r}")
        if in_channels % groups or out_channels % groups:
            raise ArgumentValueError(f"Conv2d: in_channels ({in_channels}) and out_channels ({out_channels}) must "
                                     f"be divisible by groups ({groups})")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _pair(kernel_size, "kernel_size", "Conv2d")
        self.stride = _pair(stride, "stride", "Conv2d")
        self.dilation = _pair(dilation, "dilation", "Conv2d")
        self.padding = _padding(padding, self.kernel_size, self.stride, self.dilation)
        self.weight = Parameter(empty(out_channels, in_channels // groups, *self.kernel_size, device=device,
                                      dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default: weight and bias uniform in +-1/sqrt(in_channels / groups * kH * kW)."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_channels // self.groups * math.prod(self.kernel_size))
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.conv2d(input, self.weight, self.bias, stride=self.stride, padding=self.padding,
                        dilation=self.dilation, groups=self.groups)

    def extra_repr(self) -> str:
        text = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}")
        if self.padding != (0, 0):
            text += f", padding={self.padding}"
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text + ("" if self.bias is not None else ", bias=False")


class _Pool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding, self.ceil_mode = kernel_size, stride, padding, ceil_mode

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride or self.kernel_size}, padding={self.padding}"
                + (", ceil_mode=True" if self.ceil_mode else ""))


class MaxPool2d(_Pool2d):
    """The maximum of each window (``stride`` defaults to ``kernel_size``); PyTorch's keywords."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
                 ceil_mode: bool = False) -> None:
        super().__init__(kernel_size, stride, padding, ceil_mode)
        self.dilation, self.return_indices = dilation, return_indices

    def forward(self, input: Tensor):  # noqa: A002
        return F.max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices)


class AvgPool2d(_Pool2d):
    """The mean of each window (``stride`` defaults to ``kernel_size``; padding counts as zeros)."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override=None) -> None:
        super().__init__(kernel_size, stride, padding, ceil_mode)
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.avg_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)
