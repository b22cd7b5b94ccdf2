"""``conv2d``'s ``dilation`` and ``groups`` (PyTorch's keywords), as compositions around the ``conv2d`` op.

The kernels (``kernels/conv.py``, ``kernels/conv_backward.py``) take a stride and a padding.  The two
other keywords are written here with ops that have gradients already, so forward and backward follow:

* **dilation** ``(dh, dw)``: a filter whose taps are ``dh`` rows and ``dw`` columns apart is the same as a
  dense filter of size ``dh (kH - 1) + 1`` by ``dw (kW - 1) + 1`` with zeros between the taps: ``dh - 1``
  zero rows are concatenated after each row of the weight, then the trailing ones cut off (``cat``,
  ``reshape``, ``narrow``).  The kernel then multiplies the zeros too: ``dh * dw`` times the work of a
  dilated kernel, the price of keeping one kernel;
* **groups** ``g``: the input channels and the filters are cut into ``g`` equal parts, each part of the
  input convolved with its own filters, and the results concatenated along the channels (as
  ``torch.nn.Conv2d`` documents it: "at groups=2, the operation becomes equivalent to having two conv
  layers side by side").

>>> import pyflow as flow
>>> x = flow.arange(25.0).reshape(1, 1, 5, 5)
>>> conv2d(x, flow.ones(1, 1, 2, 2), dilation=2).tolist()   # x[i, j] + x[i, j+2] + x[i+2, j] + x[i+2, j+2]
[[[[24.0, 28.0, 32.0], [44.0, 48.0, 52.0], [64.0, 68.0, 72.0]]]]
>>> conv2d(flow.ones(1, 4, 3, 3), flow.ones(2, 2, 1, 1), groups=2).shape
(1, 2, 3, 3)
"""

from __future__ import annotations

from pyflow.errors import ArgumentValueError, ShapeError
from pyflow.framework import creation
from pyflow.framework.args import describe
from pyflow.framework.composites import place_of
from pyflow.framework.interpreter import apply
from pyflow.framework.movement import cat
from pyflow.framework.tensor import Tensor

__all__ = ["conv2d", "dilate_weight"]


def _positive_pair(value, what: str) -> tuple:
    items = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(items) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in items):
        raise ArgumentValueError(f"conv2d: {what} must be a positive int or a pair of them (h, w), got {value!r}")
    return items


def dilate_weight(weight: Tensor, dilation) -> Tensor:
    """``weight`` (C_out, C_in, kH, kW) with ``dh - 1`` zero rows between its rows and ``dw - 1`` zero
    columns between its columns: the dense filter of the dilated one."""
    for dim, d in zip((2, 3), _positive_pair(dilation, "dilation")):
        if d == 1:
            continue
        k = weight.shape[dim]
        gap = list(weight.shape[:dim + 1]) + [d - 1] + list(weight.shape[dim + 1:])
        spread = cat([weight.unsqueeze(dim + 1), creation.zeros(*gap, dtype=weight.dtype, **place_of(weight))],
                     dim=dim + 1)
        shape = list(weight.shape)
        shape[dim] = k * d
        weight = spread.reshape(shape).narrow(dim, 0, d * (k - 1) + 1)
    return weight


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,  # noqa: A002
           groups: int = 1) -> Tensor:
    """``torch.nn.functional.conv2d`` with ``dilation`` and ``groups``: weight (C_out, C_in / groups, kH, kW)."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0:
        raise ArgumentValueError(f"conv2d: groups must be a positive int, got {groups!r}")
    if input.ndim != 4 or weight.ndim != 4:
        raise ShapeError(f"conv2d: expects a 4-D input and a 4-D weight, got {describe(input)} and {describe(weight)}")
    channels, filters = input.shape[1], weight.shape[0]
    if filters % groups or weight.shape[1] * groups != channels:
        raise ShapeError(f"conv2d: given groups={groups}, weight of size {list(weight.shape)}, expected the input "
                         f"{describe(input)} to have {weight.shape[1] * groups} channels and the weight's "
                         f"{filters} filters to be divisible by {groups}")
    weight = dilate_weight(weight, dilation)
    if groups == 1:
        return apply("conv2d", [input, weight] + ([bias] if bias is not None else []), stride=stride,
                     padding=padding)[0]
    part, per_group = channels // groups, filters // groups
    outputs = []
    for k in range(groups):
        operands = [input.narrow(1, k * part, part), weight.narrow(0, k * per_group, per_group)]
        if bias is not None:
            operands.append(bias.narrow(0, k * per_group, per_group))
        outputs.append(apply("conv2d", operands, stride=stride, padding=padding)[0])
    return cat(outputs, dim=1)
