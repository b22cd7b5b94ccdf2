"""Pooling beyond the kernels: ``ceil_mode``, ``return_indices``, ``dilation``, ``count_include_pad``,
``divisor_override`` (PyTorch's keywords), as compositions of public ops.

The kernels (``max_pool2d``, ``avg_pool2d`` in ``kernels/``) take a window, a stride and a
padding.  The other keywords change which windows there are and what a window's
result is, so they are written here with ops that have gradients already:

* **the windows** (``_windows``): the input padded (with -inf for max, 0 for the
  mean) far enough for the last window, then one strided slice per window offset
  ``(dy, dx)``, stacked: ``(N, C, kH * kW, OH, OW)``;
* **max**: ``argmax`` over the offsets (the first largest, as PyTorch's loop
  keeps it; a NaN wins), the value ``gather``-ed there, so the gradient goes to
  that one element as PyTorch's does; the index is ``row * W + col`` in the input;
* **mean**: the sum over the offsets divided by each window's divisor: the
  window's cells inside the input and its explicit padding
  (``count_include_pad=True``), or inside the input only, or ``divisor_override``.

Output size, as PyTorch: ``floor`` (or ``ceil``) of ``(H + 2p - d (k - 1) - 1) / s``,
plus one; in ceil mode a last window that would start in the right padding is
dropped.

>>> import pyflow as flow
>>> x = flow.arange(16.0).reshape(1, 1, 4, 4)
>>> values, indices = max_pool2d(x, 3, 2, ceil_mode=True, return_indices=True)
>>> values.tolist(), indices.tolist()
([[[[10.0, 11.0], [14.0, 15.0]]]], [[[[10, 11], [14, 15]]]])
>>> avg_pool2d(x, 3, 2, ceil_mode=True).tolist()
[[[[5.0, 6.5], [11.0, 12.5]]]]
"""

from __future__ import annotations

import math

import numpy as np

from pyflow.errors import ArgumentValueError, ShapeError
from pyflow.framework.creation import arange, full
from pyflow.framework.movement import cat, stack
from pyflow.framework.tensor import Tensor, tensor

__all__ = ["max_pool2d", "avg_pool2d", "pool_output_size"]


def _pair(value, name: str) -> tuple:
    pair = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        raise ArgumentValueError(f"pooling: {name} must be an int or a pair of ints, got {value!r}")
    return pair


def pool_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> int:
    """PyTorch's ``pooling_output_shape``.

    >>> pool_output_size(4, 3, 2, 0, 1, False), pool_output_size(4, 3, 2, 0, 1, True)
    (1, 2)
    """
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + padding:   # the last window would start in the padding
        out -= 1
    return out


def _check(x: Tensor, name: str, kernel_size, stride, padding, dilation) -> tuple:
    if not isinstance(x, Tensor) or x.ndim not in (3, 4):
        raise ShapeError(f"{name}: the input must be a 3-D or 4-D tensor (N, C, H, W), got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    k = _pair(kernel_size, "kernel_size")
    s = _pair(stride if stride not in (None, (), []) else kernel_size, "stride")
    p, d = _pair(padding, "padding"), _pair(dilation, "dilation")
    if min(k) < 1 or min(s) < 1 or min(d) < 1 or min(p) < 0:
        raise ArgumentValueError(f"{name}: kernel_size, stride and dilation must be positive and padding "
                                 f"non-negative, got {k}, {s}, {p}, {d}")
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise ArgumentValueError(f"{name}: padding {p} must be at most half the kernel size {k}")
    return k, s, p, d


def _windows(x: Tensor, k, s, p, d, out, fill: float) -> Tensor:
    """``(N, C, kH * kW, OH, OW)``: every window's cells, padded with ``fill`` where outside the input."""
    for axis in (2, 3):
        a = axis - 2
        need = (out[a] - 1) * s[a] + d[a] * (k[a] - 1) + 1          # rows from the top padding on
        after = max(0, need - p[a] - x.shape[axis])
        parts = [x]
        if p[a]:
            parts.insert(0, full(x.shape[:axis] + (p[a],) + x.shape[axis + 1:], fill, dtype=x.dtype,
                                      device=x.device))
        if after:
            parts.append(full(x.shape[:axis] + (after,) + x.shape[axis + 1:], fill, dtype=x.dtype,
                                   device=x.device))
        x = cat(parts, dim=axis) if len(parts) > 1 else x
    cells = [x[:, :, dy * d[0]: dy * d[0] + (out[0] - 1) * s[0] + 1: s[0],
               dx * d[1]: dx * d[1] + (out[1] - 1) * s[1] + 1: s[1]]
             for dy in range(k[0]) for dx in range(k[1])]
    return stack(cells, dim=2)


def max_pool2d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,  # noqa: A002
               return_indices: bool = False):
    """The maximum of each window; with ``return_indices`` also its position ``row * W + col`` in the input
    (what ``MaxUnpool2d`` takes)."""
    batched = input.ndim == 4
    x = input if batched else input.unsqueeze(0)
    k, s, p, d = _check(x, "max_pool2d", kernel_size, stride, padding, dilation)
    H, W = x.shape[2], x.shape[3]
    out = tuple(pool_output_size(n, k[a], s[a], p[a], d[a], ceil_mode) for a, n in enumerate((H, W)))
    windows = _windows(x, k, s, p, d, out, -math.inf)
    which = windows.argmax(dim=2, keepdim=True)                    # the first largest (a NaN wins)
    values = windows.gather(2, which).squeeze(2)
    if not batched:
        values = values.squeeze(0)
    if not return_indices:
        return values
    which = which.squeeze(2)
    rows = arange(out[0], device=x.device).reshape(out[0], 1) * s[0] - p[0] + (which // k[1]) * d[0]
    cols = arange(out[1], device=x.device).reshape(1, out[1]) * s[1] - p[1] + (which % k[1]) * d[1]
    indices = rows * W + cols
    return values, (indices if batched else indices.squeeze(0))


def avg_pool2d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,  # noqa: A002
               count_include_pad: bool = True, divisor_override=None) -> Tensor:
    """The mean of each window, divided as PyTorch divides (see the module docstring)."""
    batched = input.ndim == 4
    x = input if batched else input.unsqueeze(0)
    k, s, p, d = _check(x, "avg_pool2d", kernel_size, stride, padding, 1)
    if divisor_override is not None and (not isinstance(divisor_override, int) or divisor_override <= 0):
        raise ArgumentValueError(f"avg_pool2d: divisor_override must be a positive int, got {divisor_override!r}")
    H, W = x.shape[2], x.shape[3]
    out = tuple(pool_output_size(n, k[a], s[a], p[a], 1, ceil_mode) for a, n in enumerate((H, W)))
    sums = _windows(x, k, s, p, d, out, 0.0).sum(dim=2)
    if divisor_override is not None:
        divisor = np.full(out, float(divisor_override))
    else:
        spans = []
        for a, n in enumerate((H, W)):
            start = np.arange(out[a]) * s[a] - p[a]
            end = np.minimum(start + k[a], n + p[a])                # the explicit padding counts, the rest not
            if not count_include_pad:
                start, end = np.maximum(start, 0), np.minimum(end, n)
            spans.append(end - start)
        divisor = np.outer(spans[0], spans[1]).astype(np.float64)
    result = sums / tensor(divisor.astype(x.dtype), device=x.device)
    return result if batched else result.squeeze(0)
