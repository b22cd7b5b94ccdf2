"""ResNet layers as uTasks (seed 001, issue 17): direct conv2d, batch norm in eval mode, window pooling.

BlockDrop and SkipNet, the two CNNs of the Cocktailer paper, are ResNets whose
blocks a policy may skip.  Their layers, over NCHW tensors stored flat and
contiguous (the uTask contract, ``__init__.py``), with PyTorch's semantics
(``H_out = (H + 2 * pad - kernel) // stride + 1``; square kernels, strides and
paddings, the only kind a ResNet has):

* ``conv2d_utask(u, out, x, w, batch, c_in, height, width, c_out, kernel, stride, pad,
  h_out, w_out, chunk)``: ``out[n, co, ho, wo] = sum over ci, i, j of
  x[n, ci, ho * stride - pad + i, wo * stride - pad + j] * w[co, ci, i, j]``, zero
  padding, no bias (a ResNet's convs have none; a 1x1 conv with a bias on a 1x1
  map is ``ops.linear``).  The sum runs in the dtype (float32 as cuDNN's default).
* ``batch_norm_utask(u, out, x, mean, var, weight, bias, channels, plane, n, chunk)``:
  ``nn.BatchNorm2d`` in eval mode, from the running statistics:
  ``(x - mean[c]) / sqrt(var[c] + eps) * weight[c] + bias[c]`` for channel
  ``c = (i // plane) % channels`` (``plane = H * W``), then ``relu`` if the factory
  was asked for it.  ``out`` may be ``x``.
* ``pool2d_utask(u, out, x, batch, channels, height, width, out_channels, kernel,
  stride, pad, h_out, w_out, chunk)``: max pooling (padding never wins, NaN does:
  ``kernels/conv.py``'s ``max_nan``) or average pooling (the divisor is always
  ``kernel * kernel``, PyTorch's ``count_include_pad``).  ``out`` has
  ``out_channels >= channels`` channels; those past ``channels`` are zeros, which
  makes BlockDrop's ``DownsampleB`` (an average pool, then ``cat`` with zeros along
  the channels) one op.  A window as large as the map is a global average pool.

Every op is *elementwise over its output*: uTask ``u`` owns elements
``[u * chunk, (u + 1) * chunk)`` of the flat output and the block's threads stride
through them, one output element per thread, written once (``elementwise.py``'s
ownership).  So a conv, the batch norm after it and a residual gate after that,
with one chunk, keep every element on one thread: the barrier plan puts no barrier
between them.  Only an op that reads whole windows of another's output (the next
conv, a pooling) waits at one.  No shared memory, no ``syncthreads``.

The accumulators start at a typed zero (or -inf) of the dtype, a compile-time
constant, so the factories ``make_conv2d_utask(dtype)``,
``make_batch_norm_utask(eps, relu, dtype)`` and ``make_pool2d_utask(kind, dtype)``
build and cache one device function per choice.  The index arithmetic and the conv's
window sum are ``kernels/conv.py``'s (``unravel_nchw``, ``conv2d_window``, reused): its
kernels read strided views through a grid-stride loop, these read flat buffers (their
strides written out), one uTask's chunk at a time.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.conv import conv2d_window, max_nan, unravel_nchw
from pyflow.kernels.jit import jit
from pyflow.kernels.scalar_ops import relu
from pyflow.kernels.utask.sizes import ceil_div, require_sizes

__all__ = ["DTYPES", "POOLS", "resnet_utask_count", "make_conv2d_utask", "make_batch_norm_utask",
           "make_pool2d_utask", "make_conv2d_kernel", "make_batch_norm_kernel", "make_pool2d_kernel"]

DTYPES = (np.dtype("float32"), np.dtype("float64"))
POOLS = ("max", "avg")


def resnet_utask_count(n: int, chunk: int) -> int:
    """uTasks of any op here over an output of ``n`` elements: ``ceil(n / chunk)``.

    >>> resnet_utask_count(2 * 4 * 3 * 3, chunk=32)
    3
    """
    require_sizes("resnet", n=n)
    require_sizes("resnet", minimum=1, chunk=chunk)
    return ceil_div(n, chunk)


def _dtype(op: str, dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in DTYPES:
        raise DTypeError(f"{op} uTasks: unsupported dtype {dtype}; expected float32 or float64")
    return dtype


# --- device code ----------------------------------------------------------------


def make_conv2d_utask(dtype="float32"):
    """``conv2d_utask(u, out, x, w, batch, c_in, height, width, c_out, kernel, stride, pad, h_out, w_out, chunk)``.

    ``x`` (batch, c_in, height, width), ``w`` (c_out, c_in, kernel, kernel), ``out``
    (batch, c_out, h_out, w_out); ``out`` must not overlap ``x`` or ``w``.
    """
    return _conv2d(_dtype("conv2d", dtype))


@functools.cache
def _conv2d(dtype):
    ZERO = dtype.type(0)

    @jit(device=True)
    def conv2d_utask(u, out, x, w, batch, c_in, height, width, c_out, kernel, stride, pad, h_out, w_out, chunk):
        # Code plan (per output element i of the chunk u owns, one thread each):
        # 1. unravel i to (nb, co, ho, wo); the window's top-left corner in x is
        #    (ho * stride - pad, wo * stride - pad);
        # 2. ``conv2d_window`` (the library kernel's) multiply-accumulates it with the
        #    filter, padding skipped; 3. write out[i] once.
        n = batch * c_out * h_out * w_out
        start = u * chunk
        stop = min(n, start + chunk)
        for i in range(start + cuda.threadIdx.x, stop, cuda.blockDim.x):
            nb, co, ho, wo = unravel_nchw(i, (batch, c_out, h_out, w_out))
            out[i] = conv2d_window(x, (c_in * height * width, height * width, width, 1), (batch, c_in, height, width),
                                   w, (c_in * kernel * kernel, kernel * kernel, kernel, 1),
                                   (c_out, c_in, kernel, kernel), nb, co, ho * stride - pad, wo * stride - pad, ZERO)

    return conv2d_utask


def make_batch_norm_utask(eps: float = 1e-5, relu_after: bool = False, dtype="float32"):
    """``batch_norm_utask(u, out, x, mean, var, weight, bias, channels, plane, n, chunk)``: eval-mode BN (+ relu).

    ``x``/``out`` hold ``n`` elements of an NCHW tensor with ``channels`` channels of
    ``plane = H * W`` elements; the four statistics have ``channels`` elements.
    ``eps`` and ``relu_after`` are fixed at build time (generated code passes only ints).
    """
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ShapeError(f"batch_norm uTasks: eps must be a finite number >= 0, got {eps!r}")
    return _batch_norm(float(eps), bool(relu_after), _dtype("batch_norm", dtype))


@functools.cache
def _batch_norm(eps, relu_after, dtype):
    EPS = dtype.type(eps)
    RELU = relu_after

    @jit(device=True)
    def batch_norm_utask(u, out, x, mean, var, weight, bias, channels, plane, n, chunk):
        # Code plan: 1. the chunk [start, stop) u owns; 2. per element, its channel's
        # statistics normalise it (PyTorch's order: subtract, divide, scale, shift);
        # 3. relu (compiled away when not asked for), one write by the thread that read.
        start = u * chunk
        stop = min(n, start + chunk)
        for i in range(start + cuda.threadIdx.x, stop, cuda.blockDim.x):
            c = (i // plane) % channels
            y = (x[i] - mean[c]) / math.sqrt(var[c] + EPS) * weight[c] + bias[c]
            if RELU:
                y = relu(y)
            out[i] = y

    return batch_norm_utask


def make_pool2d_utask(kind: str = "max", dtype="float32"):
    """``pool2d_utask(u, out, x, batch, channels, height, width, out_channels, kernel, stride, pad, h_out, w_out,
    chunk)``.

    ``kind`` is ``"max"`` or ``"avg"``.  ``x`` (batch, channels, height, width), ``out``
    (batch, out_channels, h_out, w_out) with ``out_channels >= channels`` (the extra
    channels are zeros); ``out`` must not overlap ``x``.
    """
    if kind not in POOLS:
        raise ValueError(f"pool2d uTasks: kind must be one of {POOLS}, got {kind!r}")
    return _pool2d(kind, _dtype("pool2d", dtype))


@functools.cache
def _pool2d(kind, dtype):
    IS_MAX = kind == "max"
    START = dtype.type(-np.inf if IS_MAX else 0)
    ZERO = dtype.type(0)

    @jit(device=True)
    def pool2d_utask(u, out, x, batch, channels, height, width, out_channels, kernel, stride, pad, h_out, w_out,
                     chunk):
        # Code plan (per output element, one thread each): 1. unravel it; a channel
        # past x's is a zero (DownsampleB's padding); 2. else combine the window's
        # elements inside x (max: padding never wins; avg: it counts as 0 in the sum)
        # into the running value; 3. max: write it; avg: divide by the whole window.
        n = batch * out_channels * h_out * w_out
        start = u * chunk
        stop = min(n, start + chunk)
        for i in range(start + cuda.threadIdx.x, stop, cuda.blockDim.x):
            nb, c, ho, wo = unravel_nchw(i, (batch, out_channels, h_out, w_out))
            if c >= channels:
                out[i] = ZERO
            else:
                top = ho * stride - pad
                left = wo * stride - pad
                base = (nb * channels + c) * height * width
                acc = START
                for r in range(max(0, top), min(height, top + kernel)):
                    for s in range(max(0, left), min(width, left + kernel)):
                        if IS_MAX:
                            acc = max_nan(acc, x[base + r * width + s])
                        else:
                            acc += x[base + r * width + s]
                if IS_MAX:
                    out[i] = acc
                else:
                    out[i] = acc / (kernel * kernel)

    return pool2d_utask


# --- uOperator kernels: one op's uTasks in the virtual-block loop ----------------


def make_conv2d_kernel(dtype="float32"):
    """Kernel ``(u_begin, u_end, <conv2d_utask's arguments after u>)``."""
    return _conv2d_kernel(_dtype("conv2d", dtype))


@functools.cache
def _conv2d_kernel(dtype):
    utask = _conv2d(dtype)

    @jit
    def conv2d_kernel(u_begin, u_end, out, x, w, batch, c_in, height, width, c_out, kernel, stride, pad, h_out,
                      w_out, chunk):
        for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):
            utask(u, out, x, w, batch, c_in, height, width, c_out, kernel, stride, pad, h_out, w_out, chunk)

    return conv2d_kernel


def make_batch_norm_kernel(eps: float = 1e-5, relu_after: bool = False, dtype="float32"):
    """Kernel ``(u_begin, u_end, <batch_norm_utask's arguments after u>)``."""
    make_batch_norm_utask(eps, relu_after, dtype)   # the checks
    return _batch_norm_kernel(float(eps), bool(relu_after), np.dtype(dtype))


@functools.cache
def _batch_norm_kernel(eps, relu_after, dtype):
    utask = _batch_norm(eps, relu_after, dtype)

    @jit
    def batch_norm_kernel(u_begin, u_end, out, x, mean, var, weight, bias, channels, plane, n, chunk):
        for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):
            utask(u, out, x, mean, var, weight, bias, channels, plane, n, chunk)

    return batch_norm_kernel


def make_pool2d_kernel(kind: str = "max", dtype="float32"):
    """Kernel ``(u_begin, u_end, <pool2d_utask's arguments after u>)``."""
    make_pool2d_utask(kind, dtype)   # the checks
    return _pool2d_kernel(kind, np.dtype(dtype))


@functools.cache
def _pool2d_kernel(kind, dtype):
    utask = _pool2d(kind, dtype)

    @jit
    def pool2d_kernel(u_begin, u_end, out, x, batch, channels, height, width, out_channels, kernel, stride, pad,
                      h_out, w_out, chunk):
        for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):
            utask(u, out, x, batch, channels, height, width, out_channels, kernel, stride, pad, h_out, w_out, chunk)

    return pool2d_kernel


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array

    i64 = types.int64
    cases = []
    for dtype in ("float32", "float64"):
        x = array(dtype)
        cases.append((f"conv2d_utask[{dtype}]", make_conv2d_utask(dtype).py_func, (i64, x, x, x) + (i64,) * 11, True))
        cases.append((f"conv2d_kernel[{dtype}]", make_conv2d_kernel(dtype).py_func, (i64, i64, x, x, x) + (i64,) * 11,
                      False))
        for relu_after in (False, True):
            label = f"batch_norm{'_relu' if relu_after else ''}"
            cases.append((f"{label}_utask[{dtype}]", make_batch_norm_utask(1e-5, relu_after, dtype).py_func,
                          (i64,) + (x,) * 6 + (i64,) * 4, True))
            cases.append((f"{label}_kernel[{dtype}]", make_batch_norm_kernel(1e-5, relu_after, dtype).py_func,
                          (i64, i64) + (x,) * 6 + (i64,) * 4, False))
        for kind in POOLS:
            cases.append((f"{kind}_pool2d_utask[{dtype}]", make_pool2d_utask(kind, dtype).py_func,
                          (i64, x, x) + (i64,) * 11, True))
            cases.append((f"{kind}_pool2d_kernel[{dtype}]", make_pool2d_kernel(kind, dtype).py_func,
                          (i64, i64, x, x) + (i64,) * 11, False))
    return cases
