"""Backward kernels of conv2d (NCHW): the gradients of its input and its weight, which autograd needs.

Each writes (overwrites) its first argument, a preallocated gradient::

    conv2d_backward_input(grad_x, grad_y, weight, *, stride=1, padding=0, stream=0)
    conv2d_backward_weight(grad_w, x, grad_y, *, stride=1, padding=0, stream=0)

The forward op and its argument rules are ``kernels/conv.py``'s (PyTorch's: zero
padding, no dilation, no groups); grad_y has the forward output's shape.  With
``r = h + pad_h - oh * stride_h`` (the kernel row that puts input row h under
output row oh; likewise s for columns)::

    grad_x[n, c, h, w]  = sum over k, oh, ow with 0 <= r < kH, 0 <= s < kW of grad_y[n, k, oh, ow] * weight[k, c, r, s]
    grad_w[k, c, r, s]  = sum over n, oh, ow with (oh*stride_h - pad_h + r, ...) inside x of grad_y[n, k, oh, ow] * x[...]

The pooling gradients (``kernels/pool_backward.py``) gather the same way and share
this module's checks, window bounds (``windows_holding``) and CPU summation
(``_sum_under_windows``).

**Gather, not scatter.**  One thread owns one element of the gradient it writes,
adds its contributions in a fixed order (output channel, then oh, then ow; for
grad_w: batch, oh, ow) and writes once.  A scatter (each grad_y element adding
into the inputs it touched, with atomics) would add in whatever order threads
happen to run, so two runs could differ in the last bits, and the CPU twin could
not follow it.  Gathering costs some index arithmetic (``steps_between``,
``windows_holding``), but needs no atomics.  The conv twins use ``einsum`` and
agree with the kernels within rounding.

dtypes: float16, float32, float64, every operand of one call in the same dtype.
Sums are taken in float32 for float16 (rounded once, at the end; on both
targets), else in the dtype itself (``accumulate_dtype``).  (The forward conv
takes float32 and float64 only.)  A faster grad_x would be an implicit-GEMM transposed
convolution, and a faster grad_w a GEMM of grad_y with im2col(x), tiled in shared
memory, as cuDNN does; these kernels favour reading over speed.

>>> import numpy as np
>>> from pyflow.kernels.registry import get_kernel
>>> grad_x = np.empty((1, 1, 2, 2))
>>> get_kernel("conv2d_backward_input", "cpu")(grad_x, np.ones((1, 1, 2, 2)), np.full((1, 1, 1, 1), 3.0))
>>> grad_x.tolist()
[[[[3.0, 3.0], [3.0, 3.0]]]]
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.conv import _pair, _windows, conv2d_output_shape, unravel_nchw
from pyflow.kernels.dtypes import FLOAT_DTYPES, names
from pyflow.kernels.jit import jit
from pyflow.kernels.launch import elementwise_config, launcher, require_device_arrays
from pyflow.kernels.layout import flat
from pyflow.kernels.registry import register

__all__ = ["steps_between", "windows_holding", "make_conv2d_grad_input", "make_conv2d_grad_weight",
           "accumulate_dtype"]


def accumulate_dtype(dtype) -> np.dtype:
    """What the sums are taken in: float32 for float16, else ``dtype`` itself."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


# --- device code ----------------------------------------------------------------


@jit(device=True)
def steps_between(low, high, stride, count):
    """``(first, stop)``: the outputs ``o`` in ``[0, count)`` with ``low <= o * stride <= high``.

    For the windows holding padded position p: ``low = p - k + 1``, ``high = p``.
    Negative bounds are clipped before dividing, so only non-negative ints are divided.
    """
    if high < 0:
        return 0, 0
    first = (max(low, 0) + stride - 1) // stride
    return first, min(count, high // stride + 1)


@jit(device=True)
def windows_holding(position, pad, window, stride, count):
    """``(first, stop)``: the outputs (of ``count``) whose window of size ``window`` holds input ``position``
    along one dim (the grad_x kernels' loop bounds)."""
    return steps_between(position + pad - window + 1, position + pad, stride, count)


@functools.cache
def make_conv2d_grad_input(acc_dtype):
    """The grad_x kernel, summing in ``acc_dtype`` (float32 or float64)."""
    acc_type = numba.from_dtype(np.dtype(acc_dtype))

    @jit
    def conv2d_grad_input(gx, gx_strides, gx_shape, gy, gy_strides, gy_shape, w, w_strides, w_shape,
                          stride, padding, n):
        """``grad_x[n, c, h, w]``: one thread per element, written once (see the module docstring).

        Rules: only the (oh, ow) whose window holds (h, w) are visited (no test per
        kernel position); every operand is read through its own four strides.
        """
        # Code plan:
        # 1. grid-stride over grad_x's linear index i; unravel it to (nb, c, h, col);
        # 2. the output rows whose window holds row h + pad_h: [oh_lo, oh_hi); likewise columns;
        # 3. for each output channel k and each such (oh, ow), add grad_y * the weight at
        #    kernel position (r, s) = (h + pad_h - oh*stride_h, col + pad_w - ow*stride_w);
        # 4. write the sum once.
        i = cuda.grid(1)
        while i < n:
            nb, c, h, col = unravel_nchw(i, gx_shape)
            oh_lo, oh_hi = windows_holding(h, padding[0], w_shape[2], stride[0], gy_shape[2])
            ow_lo, ow_hi = windows_holding(col, padding[1], w_shape[3], stride[1], gy_shape[3])
            acc = acc_type(0)
            for k in range(gy_shape[1]):
                gy_base = nb * gy_strides[0] + k * gy_strides[1]
                w_base = k * w_strides[0] + c * w_strides[1]
                for oh in range(oh_lo, oh_hi):
                    gy_row = gy_base + oh * gy_strides[2]
                    w_row = w_base + (h + padding[0] - oh * stride[0]) * w_strides[2]
                    for ow in range(ow_lo, ow_hi):
                        s = col + padding[1] - ow * stride[1]
                        acc += acc_type(gy[gy_row + ow * gy_strides[3]]) * acc_type(w[w_row + s * w_strides[3]])
            gx[nb * gx_strides[0] + c * gx_strides[1] + h * gx_strides[2] + col * gx_strides[3]] = acc
            i += cuda.gridsize(1)

    return conv2d_grad_input


@functools.cache
def make_conv2d_grad_weight(acc_dtype):
    """The grad_w kernel, summing in ``acc_dtype`` (float32 or float64)."""
    acc_type = numba.from_dtype(np.dtype(acc_dtype))

    @jit
    def conv2d_grad_weight(gw, gw_strides, gw_shape, x, x_strides, x_shape, gy, gy_strides, gy_shape,
                           stride, padding, n):
        """``grad_w[k, c, r, s]``: one thread per weight, written once; padded positions skipped."""
        # Code plan:
        # 1. grid-stride over grad_w's linear index i; unravel it to (k, c, r, s);
        # 2. the output rows oh whose input row oh*stride_h - pad_h + r lies inside x; likewise columns;
        # 3. for each batch element and each such (oh, ow), add grad_y * x at that position;
        # 4. write the sum once.
        i = cuda.grid(1)
        while i < n:
            k, c, r, s = unravel_nchw(i, gw_shape)
            oh_lo, oh_hi = steps_between(padding[0] - r, x_shape[2] - 1 + padding[0] - r, stride[0], gy_shape[2])
            ow_lo, ow_hi = steps_between(padding[1] - s, x_shape[3] - 1 + padding[1] - s, stride[1], gy_shape[3])
            acc = acc_type(0)
            for nb in range(x_shape[0]):
                x_base = nb * x_strides[0] + c * x_strides[1]
                gy_base = nb * gy_strides[0] + k * gy_strides[1]
                for oh in range(oh_lo, oh_hi):
                    x_row = x_base + (oh * stride[0] - padding[0] + r) * x_strides[2]
                    gy_row = gy_base + oh * gy_strides[2]
                    for ow in range(ow_lo, ow_hi):
                        x_col = (ow * stride[1] - padding[1] + s) * x_strides[3]
                        acc += acc_type(gy[gy_row + ow * gy_strides[3]]) * acc_type(x[x_row + x_col])
            gw[k * gw_strides[0] + c * gw_strides[1] + r * gw_strides[2] + s * gw_strides[3]] = acc
            i += cuda.gridsize(1)

    return conv2d_grad_weight


# --- checks (host) ------------------------------------------------------------------


def _check_dtypes(op: str, **arrays) -> np.dtype:
    """The one float dtype shared by every operand; ``DTypeError`` naming ``op`` otherwise."""
    given = {name: np.dtype(a.dtype) for name, a in arrays.items()}
    for name, dtype in given.items():
        if dtype not in FLOAT_DTYPES:
            raise DTypeError(f"{op}: unsupported dtype {dtype} for {name}; expected one of {names(FLOAT_DTYPES)}")
    if len(set(given.values())) > 1:
        listed = ", ".join(f"{name} {dtype}" for name, dtype in given.items())
        raise DTypeError(f"{op}: operands must share one dtype, got {listed}")
    return next(iter(given.values()))


def _check_shape(op: str, what: str, array, shape, forward: str) -> None:
    if tuple(array.shape) != tuple(shape):
        raise ShapeError(f"{op}: {what} has shape {tuple(array.shape)}, expected {tuple(shape)} ({forward})")


def _check_written(op: str, what: str, grad) -> None:
    """The gradient a kernel writes is no broadcast view (its threads would race)."""
    if math.prod(grad.shape) and any(s == 0 and m > 1 for s, m in zip(grad.strides, grad.shape)):
        raise ShapeError(f"{op}: {what} is a broadcast view (stride 0): threads would race")


def _plan_conv(op, written, x_shape, w_shape, stride, padding, **operands):
    """Every check of a conv backward (``operands`` by name; ``written`` names the gradient it
    writes); returns the (stride, padding) pairs."""
    _check_dtypes(op, **operands)
    expected = conv2d_output_shape(x_shape, w_shape, stride, padding, op=op)
    _check_shape(op, "grad_y", operands["grad_y"], expected, f"the conv2d output for input {tuple(x_shape)}, weight "
                 f"{tuple(w_shape)}, stride {stride}, padding {padding}")
    _check_written(op, written, operands[written])
    return _pair(stride, "stride", op), _pair(padding, "padding", op)


# --- CPU twins: vectorised numpy, summing in accumulate_dtype -------------------------


def _sum_under_windows(grad_x, out_hw, terms, window, stride, padding, divide_by=None) -> None:
    """grad_x = the sum over window positions (r, s) of ``terms(r, s)``, an (N, C, OH, OW) array
    whose element (oh, ow) lands under position (r, s) of window (oh, ow); padding is dropped.

    r and s are visited descending, so each element of grad_x gets its windows' terms
    in (oh, ow) ascending order, the order the kernels add them in.
    """
    n, c, h, w = grad_x.shape
    acc = accumulate_dtype(grad_x.dtype)
    padded = np.zeros((n, c, h + 2 * padding[0], w + 2 * padding[1]), acc)
    for r in reversed(range(window[0])):
        for s in reversed(range(window[1])):
            rows = slice(r, r + stride[0] * (out_hw[0] - 1) + 1, stride[0])
            cols = slice(s, s + stride[1] * (out_hw[1] - 1) + 1, stride[1])
            padded[:, :, rows, cols] += terms(r, s)
    inside = padded[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + w]
    np.copyto(grad_x, inside if divide_by is None else inside / acc.type(divide_by), casting="same_kind")


def _conv2d_backward_input_cpu(grad_x, grad_y, weight, *, stride=1, padding=0, stream=0):
    stride, padding = _plan_conv("conv2d_backward_input", "grad_x", grad_x.shape, weight.shape, stride,
                                 padding, grad_x=grad_x, grad_y=grad_y, weight=weight)
    acc = accumulate_dtype(grad_x.dtype)
    gy, w = grad_y.astype(acc, copy=False), weight.astype(acc, copy=False)
    with np.errstate(all="ignore"):
        _sum_under_windows(grad_x, gy.shape[2:], lambda r, s: np.einsum("nkhw,kc->nchw", gy, w[:, :, r, s]),
                           weight.shape[2:], stride, padding)


def _conv2d_backward_weight_cpu(grad_w, x, grad_y, *, stride=1, padding=0, stream=0):
    stride, padding = _plan_conv("conv2d_backward_weight", "grad_w", x.shape, grad_w.shape, stride,
                                 padding, grad_w=grad_w, x=x, grad_y=grad_y)
    acc = accumulate_dtype(grad_w.dtype)
    windows = _windows(x.astype(acc, copy=False), grad_w.shape[2:], stride, padding, 0)
    with np.errstate(all="ignore"):
        result = np.einsum("nchwij,nkhw->kcij", windows, grad_y.astype(acc, copy=False), optimize=True)
    np.copyto(grad_w, result, casting="same_kind")


# --- launching on a GPU or in the simulator ----------------------------------------


def _launch(kernel, out, *args, stream):
    """One thread per element of ``out`` (grid-stride); nothing for an empty ``out``."""
    n = math.prod(out.shape)
    if n:
        grid, block = elementwise_config(n)
        launcher(kernel, grid, block, stream)(*args, n)


def _conv2d_backward_input_cuda(grad_x, grad_y, weight, *, stride=1, padding=0, stream=0):
    op = "conv2d_backward_input"
    require_device_arrays(op, grad_x, grad_y, weight)
    stride, padding = _plan_conv(op, "grad_x", grad_x.shape, weight.shape, stride, padding,
                                 grad_x=grad_x, grad_y=grad_y, weight=weight)
    (gx, gx_strides), (gy, gy_strides), (w, w_strides) = flat(grad_x), flat(grad_y), flat(weight)
    kernel = make_conv2d_grad_input(accumulate_dtype(grad_x.dtype))
    _launch(kernel, grad_x, gx, gx_strides, tuple(grad_x.shape), gy, gy_strides, tuple(grad_y.shape),
            w, w_strides, tuple(weight.shape), stride, padding, stream=stream)


def _conv2d_backward_weight_cuda(grad_w, x, grad_y, *, stride=1, padding=0, stream=0):
    op = "conv2d_backward_weight"
    require_device_arrays(op, grad_w, x, grad_y)
    stride, padding = _plan_conv(op, "grad_w", x.shape, grad_w.shape, stride, padding,
                                 grad_w=grad_w, x=x, grad_y=grad_y)
    (gw, gw_strides), (xs, x_strides), (gy, gy_strides) = flat(grad_w), flat(x), flat(grad_y)
    kernel = make_conv2d_grad_weight(accumulate_dtype(grad_w.dtype))
    _launch(kernel, grad_w, gw, gw_strides, tuple(grad_w.shape), xs, x_strides, tuple(x.shape),
            gy, gy_strides, tuple(grad_y.shape), stride, padding, stream=stream)


register("conv2d_backward_input", "cpu", _conv2d_backward_input_cpu)
register("conv2d_backward_input", "cuda", _conv2d_backward_input_cuda)
register("conv2d_backward_weight", "cpu", _conv2d_backward_weight_cpu)
register("conv2d_backward_weight", "cuda", _conv2d_backward_weight_cuda)


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check: every data dtype."""
    from numba import types

    from pyflow.kernels.compile_check import array, tuple_of

    i64, t2, t4 = types.int64, tuple_of(2), tuple_of(4)
    cases = [("steps_between", steps_between.py_func, (i64, i64, i64, i64), True),
             ("windows_holding", windows_holding.py_func, (i64, i64, i64, i64, i64), True)]
    for dtype in ("float16", "float32", "float64"):
        a, acc = array(dtype), accumulate_dtype(dtype)
        cases += [
            (f"conv2d_grad_input[{dtype}]", make_conv2d_grad_input(acc).py_func,
             (a, t4, t4, a, t4, t4, a, t4, t4, t2, t2, i64), False),
            (f"conv2d_grad_weight[{dtype}]", make_conv2d_grad_weight(acc).py_func,
             (a, t4, t4, a, t4, t4, a, t4, t4, t2, t2, i64), False)]
    return cases
