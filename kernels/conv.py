"""2-D convolution and pooling over NCHW tensors: conv2d, max_pool2d, avg_pool2d.

The layers of a ResNet (BlockDrop, SkipNet).  Semantics are PyTorch's
(``torch.nn.functional``, dilation 1, groups 1, ``ceil_mode=False``):

    H_out = (H + 2 * pad_h - kH) // stride_h + 1        (likewise W_out)

* ``conv2d(out, x, weight, bias, *, stride=1, padding=0, stream=0)``: x (N, C_in, H, W),
  weight (C_out, C_in, kH, kW), bias (C_out,) or None; zero padding.
* ``max_pool2d(out, x, *, kernel_size, stride=None, padding=0, stream=0)``: padding
  counts as -inf (it never wins); NaN propagates.  ``stride`` defaults to ``kernel_size``.
* ``avg_pool2d``: the same signature; padding counts as zeros *in the divisor*
  (PyTorch's default ``count_include_pad=True``), so the divisor is always kH * kW.

stride, padding and kernel_size are each an int or a pair (h, w).  Only float32 and
float64 are accepted, every operand of one call in the same dtype.  The shape rules
live in ``conv2d_output_shape`` / ``pool2d_output_shape`` for the framework to reuse.

Kernels (one output element per thread, grid-stride loop): a direct convolution
that reads every operand through its own four element strides (``kernels/layout.py``),
so transposed or sliced views need no copy.  CPU twins are vectorised numpy: pad,
``sliding_window_view``, then ``tensordot`` (conv) or ``max`` / ``mean`` (pooling).

>>> conv2d_output_shape((1, 3, 224, 224), (64, 3, 7, 7), stride=2, padding=3)
(1, 64, 112, 112)
>>> pool2d_output_shape((1, 64, 112, 112), kernel_size=3, stride=2, padding=1)
(1, 64, 56, 56)
"""

from __future__ import annotations

import functools
import math

import numpy as np

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels import scalar_ops
from pyflow.kernels.backend import cuda
from pyflow.kernels.dtypes import FLOAT_DTYPES as _FLOATS
from pyflow.kernels.jit import jit
from pyflow.kernels.launch import elementwise_config, launcher, require_device_arrays
from pyflow.kernels.layout import flat
from pyflow.kernels.registry import register

__all__ = ["conv2d_output_shape", "pool2d_output_shape", "conv2d_window", "conv2d_direct", "make_pool2d",
           "FLOAT_DTYPES"]

FLOAT_DTYPES = tuple(d for d in _FLOATS if d != np.float16)   # of kernels/dtypes.py: float32, float64


# --- device code ----------------------------------------------------------------


@jit(device=True)
def unravel_nchw(i, shape):
    """The (n, c, h, w) index of the ``i``-th element (row-major) of an NCHW ``shape``."""
    w = i % shape[3]
    rest = i // shape[3]
    h = rest % shape[2]
    rest = rest // shape[2]
    return rest // shape[1], rest % shape[1], h, w


@jit(device=True)
def conv2d_window(x, x_strides, x_shape, w, w_strides, w_shape, nb, co, top, left, zero):
    """``zero + sum of x[nb, ci, top + i, left + j] * w[co, ci, i, j]`` over the window at (top, left).

    The conv family's one device function: the library's kernel (below) and
    Cocktailer's conv uTask (``kernels/utask/resnet.py``) compute each output element
    with it.  It adds in the order ci, i, j, in the type of ``zero``, and skips the
    window positions outside x (padding would add 0).  Both operands are flat storage
    read through their own element strides; shapes are NCHW and (C_out, C_in, kH, kW).
    """
    # Code plan: 1. clip the kernel rows/columns to those that land inside x;
    # 2. for each input channel, multiply-accumulate the window with the filter.
    i_start = max(0, -top)
    i_stop = min(w_shape[2], x_shape[2] - top)
    j_start = max(0, -left)
    j_stop = min(w_shape[3], x_shape[3] - left)
    acc = zero
    for ci in range(x_shape[1]):
        x_base = nb * x_strides[0] + ci * x_strides[1]
        w_base = co * w_strides[0] + ci * w_strides[1]
        for ki in range(i_start, i_stop):
            x_row = x_base + (top + ki) * x_strides[2]
            w_row = w_base + ki * w_strides[2]
            for kj in range(j_start, j_stop):
                acc += x[x_row + (left + kj) * x_strides[3]] * w[w_row + kj * w_strides[3]]
    return acc


@jit
def conv2d_direct(out, out_strides, out_shape, x, x_strides, x_shape, w, w_strides, w_shape,
                  b, b_stride, has_bias, stride, padding, zero, n):
    """Direct convolution: ``out[n, co, ho, wo] = sum x[n, ci, h, w] * w[co, ci, i, j] + b[co]``.

    Rules: one thread computes one output element and writes it once; padded
    positions are skipped (they would add 0); the sum is accumulated in the output
    dtype (``zero`` is a 0 of that dtype); the bias is added last.  Every operand is
    flat storage read through its own element strides.  Without a bias, ``b`` is a
    placeholder and ``has_bias`` is False.

    A faster version would not re-read x for every output channel: im2col (or an
    implicit GEMM) turns the conv into a (C_out) x (C_in*kH*kW) by (C_in*kH*kW) x
    (N*H_out*W_out) matmul, computed in shared-memory tiles with each thread
    owning a small block of outputs in registers (as cuDNN does; Winograd for 3x3).
    """
    # Code plan:
    # 1. grid-stride over the linear output index i; unravel it to (nb, co, ho, wo);
    # 2. the window's top-left corner in x is (ho*stride_h - pad_h, wo*stride_w - pad_w);
    #    ``conv2d_window`` multiply-accumulates it with the filter (padding skipped);
    # 3. add the bias, write out once.
    i = cuda.grid(1)
    while i < n:
        nb, co, ho, wo = unravel_nchw(i, out_shape)
        acc = conv2d_window(x, x_strides, x_shape, w, w_strides, w_shape, nb, co,
                            ho * stride[0] - padding[0], wo * stride[1] - padding[1], zero)
        if has_bias:
            acc += b[co * b_stride]
        out[nb * out_strides[0] + co * out_strides[1] + ho * out_strides[2] + wo * out_strides[3]] = acc
        i += cuda.gridsize(1)


@jit(device=True)
def max_nan(acc, value):
    """The larger of two numbers; NaN wins (as in PyTorch's max_pool2d)."""
    if value > acc or math.isnan(value):
        return value
    return acc


@functools.cache
def make_pool2d(combine, finish):
    """The pooling kernel ``out[n, c, ho, wo] = finish(combine over window of x, kH*kW)``.

    Rules: one thread per output element, written once; the running value starts at
    ``start`` (-inf for max, 0 for avg) in the output dtype; padded positions are
    skipped, which is the same as counting them as ``start``; with padding at most
    kernel_size // 2 every window holds at least one element of x.  A faster version
    would stage a block's input tile in shared memory, since neighbouring windows overlap.
    """

    @jit
    def pool2d_direct(out, out_strides, out_shape, x, x_strides, x_shape, window, stride, padding,
                      start, area, n):
        # Code plan:
        # 1. grid-stride over the linear output index i; unravel it to (nb, c, ho, wo);
        # 2. clip the window to the rows/columns that land inside x (skip padding);
        # 3. combine the window's elements into the running value;
        # 4. finish (divide by the area for avg), write out once.
        i = cuda.grid(1)
        while i < n:
            nb, c, ho, wo = unravel_nchw(i, out_shape)
            top = ho * stride[0] - padding[0]
            left = wo * stride[1] - padding[1]
            base = nb * x_strides[0] + c * x_strides[1]
            acc = start
            for h in range(max(0, top), min(x_shape[2], top + window[0])):
                for col in range(max(0, left), min(x_shape[3], left + window[1])):
                    acc = combine(acc, x[base + h * x_strides[2] + col * x_strides[3]])
            out[nb * out_strides[0] + c * out_strides[1] + ho * out_strides[2] + wo * out_strides[3]] = \
                finish(acc, area)
            i += cuda.gridsize(1)

    return pool2d_direct


# Max pooling keeps the running max; average pooling (count_include_pad) divides the
# window's sum by its full area.
_max_pool2d_direct = make_pool2d(max_nan, scalar_ops.keep)
_avg_pool2d_direct = make_pool2d(scalar_ops.add, scalar_ops.divide)


# --- argument rules (PyTorch's) -----------------------------------------------------


def _pair(value, what: str, op: str) -> tuple[int, int]:
    """An int or a pair of ints as ``(h, w)``; ``ShapeError`` naming ``op`` otherwise."""
    items = value if isinstance(value, (tuple, list)) else (value, value)
    if len(items) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                  for v in items):
        raise ShapeError(f"{op}: {what} must be an int or a pair of ints (h, w), got {value!r}")
    return int(items[0]), int(items[1])


def _window_output(op, x_shape, window, stride, padding) -> tuple[int, int]:
    """(H_out, W_out) of a window sliding over the last two dims of ``x_shape``."""
    if min(stride) < 1:
        raise ShapeError(f"{op}: stride must be positive, got {stride}")
    if min(padding) < 0:
        raise ShapeError(f"{op}: padding must be non-negative, got {padding}")
    sides = tuple((x_shape[d + 2] + 2 * padding[d] - window[d]) // stride[d] + 1 for d in (0, 1))
    if min(sides) < 1:
        padded = tuple(x_shape[d + 2] + 2 * padding[d] for d in (0, 1))
        raise ShapeError(f"{op}: kernel {window} is larger than the padded input {padded} "
                         f"(input {tuple(x_shape)}, padding {padding}); output would be {sides}")
    return sides


def _require_4d(op: str, what: str, shape) -> tuple:
    shape = tuple(int(s) for s in shape)
    if len(shape) != 4:
        raise ShapeError(f"{op}: {what} must be 4-D (NCHW), got shape {shape}")
    return shape


def conv2d_output_shape(x_shape, w_shape, stride=1, padding=0, op: str = "conv2d") -> tuple:
    """(N, C_out, H_out, W_out) of ``conv2d``; ``ShapeError`` (naming ``op``) for inputs it refuses."""
    x_shape, w_shape = _require_4d(op, "input", x_shape), _require_4d(op, "weight", w_shape)
    if x_shape[1] != w_shape[1]:
        raise ShapeError(f"{op}: input {x_shape} has {x_shape[1]} channels but weight {w_shape} "
                         f"expects {w_shape[1]} (weight is C_out, C_in, kH, kW)")
    if min(w_shape[2:]) < 1:
        raise ShapeError(f"{op}: kernel size {w_shape[2:]} must be positive (weight {w_shape})")
    stride, padding = _pair(stride, "stride", op), _pair(padding, "padding", op)
    return (x_shape[0], w_shape[0], *_window_output(op, x_shape, w_shape[2:], stride, padding))


def pool2d_output_shape(x_shape, kernel_size, stride=None, padding=0, op: str = "pool2d") -> tuple:
    """(N, C, H_out, W_out) of max/avg pooling; ``stride=None`` means ``kernel_size``."""
    x_shape = _require_4d(op, "input", x_shape)
    window = _pair(kernel_size, "kernel_size", op)
    if min(window) < 1:
        raise ShapeError(f"{op}: kernel_size must be positive, got {window}")
    stride = window if stride is None else _pair(stride, "stride", op)
    padding = _pair(padding, "padding", op)
    if any(p > k // 2 for p, k in zip(padding, window)):
        raise ShapeError(f"{op}: padding {padding} must be at most half the kernel size {window}")
    return (x_shape[0], x_shape[1], *_window_output(op, x_shape, window, stride, padding))


def _check_dtypes(op: str, **arrays) -> np.dtype:
    """The one float dtype shared by every given array; ``DTypeError`` otherwise."""
    given = {name: np.dtype(a.dtype) for name, a in arrays.items() if a is not None}
    for name, dtype in given.items():
        if dtype not in FLOAT_DTYPES:
            raise DTypeError(f"{op}: unsupported dtype {dtype} for {name}; expected float32 or float64")
    if len(set(given.values())) > 1:
        listed = ", ".join(f"{name} {dtype}" for name, dtype in given.items())
        raise DTypeError(f"{op}: operands must share one dtype, got {listed}")
    return next(iter(given.values()))


def _check_out(op: str, out, shape) -> None:
    if tuple(out.shape) != tuple(shape):
        raise ShapeError(f"{op}: output has shape {tuple(out.shape)}, expected {tuple(shape)}")
    if math.prod(out.shape) and any(s == 0 and n > 1 for s, n in zip(out.strides, out.shape)):
        raise ShapeError(f"{op}: the output is a broadcast view (stride 0): threads would race")


def _plan_conv(out, x, weight, bias, stride, padding):
    """Every check of conv2d; returns (out shape, stride pair, padding pair)."""
    _check_dtypes("conv2d", out=out, x=x, weight=weight, bias=bias)
    shape = conv2d_output_shape(x.shape, weight.shape, stride, padding)
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ShapeError(f"conv2d: bias has shape {tuple(bias.shape)}, expected ({weight.shape[0]},)")
    _check_out("conv2d", out, shape)
    return shape, _pair(stride, "stride", "conv2d"), _pair(padding, "padding", "conv2d")


def _plan_pool(op, out, x, kernel_size, stride, padding):
    """Every check of a pooling op; returns (out shape, window, stride, padding) pairs."""
    _check_dtypes(op, out=out, x=x)
    shape = pool2d_output_shape(x.shape, kernel_size, stride, padding, op=op)
    _check_out(op, out, shape)
    window = _pair(kernel_size, "kernel_size", op)
    stride = window if stride is None else _pair(stride, "stride", op)
    return shape, window, stride, _pair(padding, "padding", op)


# --- CPU twins: vectorised numpy ------------------------------------------------------


def _windows(x, window, stride, padding, fill):
    """View (N, C, H_out, W_out, kH, kW) of the windows of ``x`` padded with ``fill``."""
    pads = ((0, 0), (0, 0), (padding[0], padding[0]), (padding[1], padding[1]))
    padded = np.pad(x, pads, constant_values=fill)
    views = np.lib.stride_tricks.sliding_window_view(padded, window, axis=(2, 3))
    return views[:, :, ::stride[0], ::stride[1]]


def _conv2d_cpu(out, x, weight, bias, *, stride=1, padding=0, stream=0):
    _, stride, padding = _plan_conv(out, x, weight, bias, stride, padding)
    windows = _windows(x, weight.shape[2:], stride, padding, 0)
    with np.errstate(all="ignore"):
        # contract (C_in, kH, kW) straight into the NCHW output
        np.einsum("nchwij,ocij->nohw", windows, weight, out=out, optimize=True)
        if bias is not None:
            out += bias[:, None, None]


def _max_pool2d_cpu(out, x, *, kernel_size, stride=None, padding=0, stream=0):
    _, window, stride, padding = _plan_pool("max_pool2d", out, x, kernel_size, stride, padding)
    np.max(_windows(x, window, stride, padding, -np.inf), axis=(4, 5), out=out)


def _avg_pool2d_cpu(out, x, *, kernel_size, stride=None, padding=0, stream=0):
    _, window, stride, padding = _plan_pool("avg_pool2d", out, x, kernel_size, stride, padding)
    with np.errstate(all="ignore"):
        np.mean(_windows(x, window, stride, padding, 0), axis=(4, 5), out=out)


# --- launching on a GPU or in the simulator ----------------------------------------


def _conv2d_cuda(out, x, weight, bias, *, stride=1, padding=0, stream=0):
    require_device_arrays("conv2d", *[a for a in (out, x, weight, bias) if a is not None])
    shape, stride, padding = _plan_conv(out, x, weight, bias, stride, padding)
    n = math.prod(shape)
    if n == 0:
        return
    (out_storage, out_strides), (x_storage, x_strides), (w_storage, w_strides) = \
        flat(out), flat(x), flat(weight)
    if bias is None:
        b_storage, b_stride = w_storage, 0   # a placeholder the kernel never reads
    else:
        b_storage, (b_stride,) = flat(bias)
    grid, block = elementwise_config(n)
    launcher(conv2d_direct, grid, block, stream)(
        out_storage, out_strides, shape, x_storage, x_strides, tuple(x.shape),
        w_storage, w_strides, tuple(weight.shape), b_storage, b_stride, bias is not None,
        stride, padding, out.dtype.type(0), n)


def _pool2d_cuda(op, kernel, start):
    def run(out, x, *, kernel_size, stride=None, padding=0, stream=0):
        require_device_arrays(op, out, x)
        shape, window, stride, padding = _plan_pool(op, out, x, kernel_size, stride, padding)
        n = math.prod(shape)
        if n == 0:
            return
        (out_storage, out_strides), (x_storage, x_strides) = flat(out), flat(x)
        grid, block = elementwise_config(n)
        launcher(kernel, grid, block, stream)(
            out_storage, out_strides, shape, x_storage, x_strides, tuple(x.shape), window, stride,
            padding, out.dtype.type(start), out.dtype.type(window[0] * window[1]), n)
    return run


register("conv2d", "cuda", _conv2d_cuda)
register("conv2d", "cpu", _conv2d_cpu)
register("max_pool2d", "cuda", _pool2d_cuda("max_pool2d", _max_pool2d_direct, -np.inf))
register("max_pool2d", "cpu", _max_pool2d_cpu)
register("avg_pool2d", "cuda", _pool2d_cuda("avg_pool2d", _avg_pool2d_direct, 0))
register("avg_pool2d", "cpu", _avg_pool2d_cpu)


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array, tuple_of

    i64, t2, t4 = types.int64, tuple_of(2), tuple_of(4)
    cases = [("unravel_nchw", unravel_nchw.py_func, (i64, t4), True)]
    for dtype in ("float32", "float64"):
        a, scalar = array(dtype), getattr(types, dtype)
        cases.append((f"conv2d_window[{dtype}]", conv2d_window.py_func,
                      (a, t4, t4, a, t4, t4, i64, i64, i64, i64, scalar), True))
        cases.append((f"conv2d[{dtype}]", conv2d_direct.py_func,
                      (a, t4, t4, a, t4, t4, a, t4, t4, a, i64, types.boolean, t2, t2, scalar, i64), False))
        for label, kernel in (("max_pool2d", _max_pool2d_direct), ("avg_pool2d", _avg_pool2d_direct)):
            cases.append((f"{label}[{dtype}]", kernel.py_func,
                          (a, t4, t4, a, t4, t4, t2, t2, t2, scalar, scalar, i64), False))
        cases += [(f"{fn.py_func.__name__}[{dtype}]", fn.py_func, (scalar, scalar), True)
                  for fn in (max_nan, scalar_ops.add, scalar_ops.keep, scalar_ops.divide)]
    return cases
