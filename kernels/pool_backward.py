"""Backward kernels of max_pool2d and avg_pool2d (NCHW): the gradients autograd needs.

Each writes (overwrites) its first argument, a preallocated gradient::

    max_pool2d_backward(grad_x, x, grad_y, *, kernel_size, stride=None, padding=0, stream=0)
    avg_pool2d_backward(grad_x, grad_y, *, kernel_size, stride=None, padding=0, stream=0)

The forward ops and their argument rules are ``kernels/conv.py``'s (PyTorch's: zero
padding, no dilation, ``ceil_mode=False``); grad_y has the forward output's shape::

    max:  grad_x[n, c, h, w] = sum of grad_y[n, c, oh, ow] over the windows whose selected element is (h, w)
    avg:  grad_x[n, c, h, w] = (sum of grad_y[n, c, oh, ow] over the windows holding (h, w)) / (kH * kW)

The element a max window selects is the one whose value the forward returned,
found by replaying the forward's scan (row by row, left to right, padding
skipped; the running value is replaced when ``value > running or value is NaN``):
the first maximum; with NaNs, the *last* NaN; a window of only -inf, its first
element (PyTorch's choices too).  avg divides by the whole window, padding
included (the forward's ``count_include_pad=True``).  Input rows the windows
never reach (``ceil_mode=False`` drops them) get a gradient of 0.

They gather, as the conv2d gradients do (``kernels/conv_backward.py``, whose checks,
window bounds and CPU summation they share): one thread owns one element of grad_x,
visits the windows holding it (``windows_holding``) in (oh, ow) order and writes once;
for max pooling it recomputes each window's choice instead of keeping an argmax array.
The CPU twins add the same terms in the same order, so cpu and cuda agree bit for bit.
dtypes: float16, float32, float64, every operand of one call in the same dtype; sums
are taken in float32 for float16 (rounded once, at the end), else in the dtype itself.

>>> import numpy as np
>>> from pyflow.kernels.registry import get_kernel
>>> grad_x = np.empty((1, 1, 2, 2))
>>> get_kernel("avg_pool2d_backward", "cpu")(grad_x, np.full((1, 1, 1, 1), 4.0), kernel_size=2)
>>> grad_x.tolist()
[[[[1.0, 1.0], [1.0, 1.0]]]]
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from pyflow.kernels.backend import cuda
from pyflow.kernels.conv import _pair, _windows, pool2d_output_shape, unravel_nchw
from pyflow.kernels.conv_backward import (_check_dtypes, _check_shape, _check_written, _launch, _sum_under_windows,
                                          accumulate_dtype, windows_holding)
from pyflow.kernels.jit import jit
from pyflow.kernels.launch import require_device_arrays
from pyflow.kernels.layout import flat
from pyflow.kernels.registry import register

__all__ = ["make_max_pool2d_grad", "make_avg_pool2d_grad"]


# --- device code ----------------------------------------------------------------


@functools.cache
def make_max_pool2d_grad(acc_dtype):
    """The max_pool2d grad_x kernel, summing in ``acc_dtype`` (float32 or float64)."""
    acc_type = numba.from_dtype(np.dtype(acc_dtype))
    lowest = np.dtype(acc_dtype).type(-np.inf)

    @jit
    def max_pool2d_grad(gx, gx_strides, gx_shape, x, x_strides, gy, gy_strides, gy_shape, window, stride,
                        padding, n):
        """``grad_x[n, c, h, w]``: the grad_y of every window that selects (h, w), in window order.

        Rules: one thread per element of grad_x, written once; each window holding
        (h, w) is scanned exactly as the forward kernel scans it (values compared in
        ``acc_dtype``, which holds every value of x exactly).
        """
        # Code plan:
        # 1. grid-stride over grad_x's linear index i; unravel it to (nb, c, h, col);
        # 2. for each window (oh, ow) holding (h, col), replay the forward's scan over its
        #    in-bounds part: the winner starts at its first element, and moves to every
        #    element with value > best or value NaN;
        # 3. if the winner is (h, col), add grad_y[nb, c, oh, ow]; 4. write the sum once.
        i = cuda.grid(1)
        while i < n:
            nb, c, h, col = unravel_nchw(i, gx_shape)
            oh_lo, oh_hi = windows_holding(h, padding[0], window[0], stride[0], gy_shape[2])
            ow_lo, ow_hi = windows_holding(col, padding[1], window[1], stride[1], gy_shape[3])
            x_base = nb * x_strides[0] + c * x_strides[1]
            gy_base = nb * gy_strides[0] + c * gy_strides[1]
            acc = acc_type(0)
            for oh in range(oh_lo, oh_hi):
                top = oh * stride[0] - padding[0]
                row_start, row_stop = max(0, top), min(gx_shape[2], top + window[0])
                for ow in range(ow_lo, ow_hi):
                    left = ow * stride[1] - padding[1]
                    col_start, col_stop = max(0, left), min(gx_shape[3], left + window[1])
                    best, best_row, best_col = lowest, row_start, col_start
                    for row in range(row_start, row_stop):
                        for cc in range(col_start, col_stop):
                            value = acc_type(x[x_base + row * x_strides[2] + cc * x_strides[3]])
                            if value > best or value != value:
                                best, best_row, best_col = value, row, cc
                    if best_row == h and best_col == col:
                        acc += acc_type(gy[gy_base + oh * gy_strides[2] + ow * gy_strides[3]])
            gx[nb * gx_strides[0] + c * gx_strides[1] + h * gx_strides[2] + col * gx_strides[3]] = acc
            i += cuda.gridsize(1)

    return max_pool2d_grad


@functools.cache
def make_avg_pool2d_grad(acc_dtype):
    """The avg_pool2d grad_x kernel, summing in ``acc_dtype`` (float32 or float64)."""
    acc_type = numba.from_dtype(np.dtype(acc_dtype))

    @jit
    def avg_pool2d_grad(gx, gx_strides, gx_shape, gy, gy_strides, gy_shape, window, stride, padding, area, n):
        """``grad_x[n, c, h, w] = (sum of grad_y over the windows holding (h, w)) / area``; written once."""
        # Code plan: 1. grid-stride over grad_x, unravel to (nb, c, h, col); 2. add grad_y
        # over the windows [oh_lo, oh_hi) x [ow_lo, ow_hi) holding (h, col); 3. divide once, write once.
        i = cuda.grid(1)
        while i < n:
            nb, c, h, col = unravel_nchw(i, gx_shape)
            oh_lo, oh_hi = windows_holding(h, padding[0], window[0], stride[0], gy_shape[2])
            ow_lo, ow_hi = windows_holding(col, padding[1], window[1], stride[1], gy_shape[3])
            gy_base = nb * gy_strides[0] + c * gy_strides[1]
            acc = acc_type(0)
            for oh in range(oh_lo, oh_hi):
                for ow in range(ow_lo, ow_hi):
                    acc += acc_type(gy[gy_base + oh * gy_strides[2] + ow * gy_strides[3]])
            gx[nb * gx_strides[0] + c * gx_strides[1] + h * gx_strides[2] + col * gx_strides[3]] = acc / area
            i += cuda.gridsize(1)

    return avg_pool2d_grad


# --- checks (host) ------------------------------------------------------------------


def _plan_pool(op, grad_x, grad_y, x, kernel_size, stride, padding):
    """Every check of a pooling backward; returns the (window, stride, padding) pairs."""
    _check_dtypes(op, grad_x=grad_x, grad_y=grad_y, **({} if x is None else {"x": x}))
    if x is not None:
        _check_shape(op, "x", x, grad_x.shape, "grad_x's shape: x is the forward's input")
    expected = pool2d_output_shape(grad_x.shape, kernel_size, stride, padding, op=op)
    _check_shape(op, "grad_y", grad_y, expected, f"the pooling output for input {tuple(grad_x.shape)}, "
                 f"kernel_size {kernel_size}, stride {stride}, padding {padding}")
    _check_written(op, "grad_x", grad_x)
    window = _pair(kernel_size, "kernel_size", op)
    return window, window if stride is None else _pair(stride, "stride", op), _pair(padding, "padding", op)


# --- CPU twins: vectorised numpy, summing in accumulate_dtype -------------------------


def _max_pool2d_backward_cpu(grad_x, x, grad_y, *, kernel_size, stride=None, padding=0, stream=0):
    window, stride, padding = _plan_pool("max_pool2d_backward", grad_x, grad_y, x, kernel_size, stride, padding)
    if not grad_x.size:
        return
    # The element each window selects, as its position r * kW + s in the window (the forward's rule):
    # the first maximum among the in-bounds elements, or the last NaN.
    size = window[0] * window[1]
    values = _windows(x, window, stride, padding, -np.inf).reshape(*grad_y.shape, size)
    inside = _windows(np.ones((1, 1, *x.shape[2:]), bool), window, stride, padding, False)
    inside = inside.reshape(1, 1, *grad_y.shape[2:], size)
    first_max = np.argmax(inside & (values == values.max(axis=-1, keepdims=True)), axis=-1)
    is_nan = np.isnan(values)
    last_nan = size - 1 - np.argmax(is_nan[..., ::-1], axis=-1)
    chosen = np.where(is_nan.any(axis=-1), last_nan, first_max)
    gy = grad_y.astype(accumulate_dtype(grad_x.dtype), copy=False)
    _sum_under_windows(grad_x, gy.shape[2:], lambda r, s: np.where(chosen == r * window[1] + s, gy, 0),
                       window, stride, padding)


def _avg_pool2d_backward_cpu(grad_x, grad_y, *, kernel_size, stride=None, padding=0, stream=0):
    window, stride, padding = _plan_pool("avg_pool2d_backward", grad_x, grad_y, None, kernel_size, stride, padding)
    gy = grad_y.astype(accumulate_dtype(grad_x.dtype), copy=False)
    with np.errstate(all="ignore"):
        _sum_under_windows(grad_x, gy.shape[2:], lambda r, s: gy, window, stride, padding,
                           divide_by=window[0] * window[1])


# --- launching on a GPU or in the simulator ----------------------------------------


def _max_pool2d_backward_cuda(grad_x, x, grad_y, *, kernel_size, stride=None, padding=0, stream=0):
    op = "max_pool2d_backward"
    require_device_arrays(op, grad_x, x, grad_y)
    window, stride, padding = _plan_pool(op, grad_x, grad_y, x, kernel_size, stride, padding)
    (gx, gx_strides), (xs, x_strides), (gy, gy_strides) = flat(grad_x), flat(x), flat(grad_y)
    kernel = make_max_pool2d_grad(accumulate_dtype(grad_x.dtype))
    _launch(kernel, grad_x, gx, gx_strides, tuple(grad_x.shape), xs, x_strides, gy, gy_strides,
            tuple(grad_y.shape), window, stride, padding, stream=stream)


def _avg_pool2d_backward_cuda(grad_x, grad_y, *, kernel_size, stride=None, padding=0, stream=0):
    op = "avg_pool2d_backward"
    require_device_arrays(op, grad_x, grad_y)
    window, stride, padding = _plan_pool(op, grad_x, grad_y, None, kernel_size, stride, padding)
    (gx, gx_strides), (gy, gy_strides) = flat(grad_x), flat(grad_y)
    acc = accumulate_dtype(grad_x.dtype)
    _launch(make_avg_pool2d_grad(acc), grad_x, gx, gx_strides, tuple(grad_x.shape), gy, gy_strides,
            tuple(grad_y.shape), window, stride, padding, acc.type(window[0] * window[1]), stream=stream)


register("max_pool2d_backward", "cpu", _max_pool2d_backward_cpu)
register("max_pool2d_backward", "cuda", _max_pool2d_backward_cuda)
register("avg_pool2d_backward", "cpu", _avg_pool2d_backward_cpu)
register("avg_pool2d_backward", "cuda", _avg_pool2d_backward_cuda)


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check: every data dtype."""
    from numba import types

    from pyflow.kernels.compile_check import array, tuple_of

    i64, t2, t4 = types.int64, tuple_of(2), tuple_of(4)
    cases = []
    for dtype in ("float16", "float32", "float64"):
        a, acc = array(dtype), accumulate_dtype(dtype)
        cases += [
            (f"max_pool2d_grad[{dtype}]", make_max_pool2d_grad(acc).py_func,
             (a, t4, t4, a, t4, a, t4, t4, t2, t2, t2, i64), False),
            (f"avg_pool2d_grad[{dtype}]", make_avg_pool2d_grad(acc).py_func,
             (a, t4, t4, a, t4, t4, t2, t2, t2, numba.from_dtype(acc), i64), False)]
    return cases
