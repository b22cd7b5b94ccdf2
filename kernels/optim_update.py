"""Fused optimizer updates: ``sgd_update``, ``momentum_update``, ``adam_update`` (OneFlow's model_update kernels).

One kernel per optimizer step of one parameter: it reads the parameter ("model"),
its gradient ("model_diff") and its state, and writes the parameter and the state
**in place**; it has no output.  The learning rate and the step number are
**device arrays** with one element (``learning_rate``: float32 or float64;
``train_step``: an integer, the 1-based number of this step), read by the kernel
itself.  A compiled graph that holds these two tensors stays right when a
scheduler changes the learning rate or the step count grows: nothing about them
is baked into the launch.  The math is PyTorch's ``torch.optim`` (single-tensor
path), written once per kernel below::

    sgd_update(model, model_diff, learning_rate, *, weight_decay=0.0, maximize=False, stream=0)
    momentum_update(model, model_diff, momentum_buf, learning_rate, train_step, *, momentum,
                    dampening=0.0, nesterov=False, weight_decay=0.0, maximize=False, stream=0)
    adam_update(model, model_diff, exp_avg, exp_avg_sq, max_exp_avg_sq, learning_rate, train_step, *,
                beta1, beta2, eps, weight_decay=0.0, amsgrad=False, maximize=False,
                decoupled_weight_decay=False, stream=0)

Every operand but ``learning_rate`` and ``train_step`` has the model's shape and
dtype (float16, float32 or float64), any layout (strided; when all are
C-contiguous the kernel walks them as one flat line).  ``max_exp_avg_sq`` is read
and written only when ``amsgrad``; otherwise any array of the model's shape and
dtype will do (``exp_avg_sq`` itself).

**Arithmetic** is in the model's dtype: float32 for float32, float64 for float64.
float16 models compute in float32 and round once, when each result is stored
(the model, the momentum buffer, the moving averages), as the other kernels do
with float16.  Host-side constants (``1 - dampening``, ``1 - beta1``) are formed in
float64 from the Python attributes and converted to the compute dtype once, as
PyTorch converts a Python scalar.  Adam's bias corrections ``1 - beta ** step``
and the step size ``lr / (1 - beta1 ** step)`` are computed in float64 from
``train_step`` inside the kernel (PyTorch computes them in Python floats), then
converted.  ``train_step`` must be >= 1: step 0 divides by zero (inf/nan).

Kernel rules: one thread per element in a grid-stride loop (``elementwise_config``);
each thread reads each operand's element once and writes each written operand's
element once, so an operand may be passed twice (the same view) safely.
The cpu twins are numpy with the same formulas in the same order: on the
simulator the two targets agree to the last bit.
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels import scalar_ops
from pyflow.kernels.backend import cuda
from pyflow.kernels.dtypes import FLOAT_DTYPES, INTEGER_DTYPES, names
from pyflow.kernels.elementwise import position
from pyflow.kernels.jit import jit
from pyflow.kernels.launch import elementwise_config, launcher, require_device_arrays
from pyflow.kernels.layout import as_kernel_shape, contiguous_strides, kernel_operand
from pyflow.kernels.registry import register

__all__ = ["compute_dtype", "make_sgd_update", "make_momentum_update", "make_adam_update", "LR_DTYPES"]

LR_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def compute_dtype(dtype) -> np.dtype:
    """The dtype the update computes in: float32 for float16 models, else the model's own."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


# --- device code ----------------------------------------------------------------


@functools.cache
def make_sgd_update(acc_dtype):
    """The ``sgd_update`` kernel computing in ``acc_dtype`` (``compute_dtype`` of the model's)."""
    acc = numba.from_dtype(np.dtype(acc_dtype))

    @jit
    def sgd_update_kernel(model, model_strides, shape, diff, diff_strides, learning_rate, weight_decay, maximize,
                          n):
        """Plain SGD, for every element (PyTorch's ``SGD`` with momentum 0)::

            g = -model_diff if maximize else model_diff
            g = g + weight_decay * model              (if weight_decay != 0)
            model = model - lr * g                    (lr = learning_rate[0])
        """
        # Code plan: 1. lr and weight decay in the compute dtype, once per thread; 2. grid-stride over
        # the elements: read model and diff once, write model once.
        lr = acc(learning_rate[0])
        wd = acc(weight_decay)
        i = cuda.grid(1)
        while i < n:
            at = position(i, shape, model_strides)
            p = acc(model[at])
            g = acc(diff[position(i, shape, diff_strides)])
            if maximize:
                g = -g
            if weight_decay != 0:
                g = g + wd * p
            model[at] = p - lr * g
            i += cuda.gridsize(1)

    return sgd_update_kernel


@functools.cache
def make_momentum_update(acc_dtype):
    """The ``momentum_update`` kernel computing in ``acc_dtype``."""
    acc = numba.from_dtype(np.dtype(acc_dtype))

    @jit
    def momentum_update_kernel(model, model_strides, shape, diff, diff_strides, buf, buf_strides, learning_rate,
                               train_step, momentum, dampening, nesterov, weight_decay, maximize, n):
        """SGD with momentum, for every element (PyTorch's ``SGD`` with momentum != 0)::

            g = -model_diff if maximize else model_diff
            g = g + weight_decay * model                          (if weight_decay != 0)
            buf = g                                               (train_step[0] == 1: the first step)
            buf = momentum * buf + (1 - dampening) * g            (any later step)
            g = g + momentum * buf   if nesterov   else   buf
            model = model - lr * g
        """
        # Code plan: 1. the constants in the compute dtype and "first step?" once per thread;
        # 2. grid-stride: read model, diff (and buf after the first step) once, write buf and model once.
        lr = acc(learning_rate[0])
        mu = acc(momentum)
        keep = acc(1.0 - dampening)
        wd = acc(weight_decay)
        first = train_step[0] == 1
        i = cuda.grid(1)
        while i < n:
            at = position(i, shape, model_strides)
            b_at = position(i, shape, buf_strides)
            p = acc(model[at])
            g = acc(diff[position(i, shape, diff_strides)])
            if maximize:
                g = -g
            if weight_decay != 0:
                g = g + wd * p
            if first:
                b = g
            else:
                b = acc(buf[b_at]) * mu + keep * g
            buf[b_at] = b
            if nesterov:
                g = g + mu * b
            else:
                g = b
            model[at] = p - lr * g
            i += cuda.gridsize(1)

    return momentum_update_kernel


@functools.cache
def make_adam_update(acc_dtype):
    """The ``adam_update`` kernel computing in ``acc_dtype``."""
    acc = numba.from_dtype(np.dtype(acc_dtype))

    @jit
    def adam_update_kernel(model, model_strides, shape, diff, diff_strides, m_arr, m_strides, v_arr, v_strides,
                           vmax_arr, vmax_strides, learning_rate, train_step, beta1, beta2, eps, weight_decay,
                           amsgrad, maximize, decoupled_weight_decay, n):
        """Adam / AdamW, for every element (PyTorch's ``Adam``; ``decoupled_weight_decay``: ``AdamW``)::

            t = train_step[0]                                         (1-based)
            g = -model_diff if maximize else model_diff
            model = model * (1 - lr * weight_decay)                   (AdamW, if weight_decay != 0)
            g = g + weight_decay * model                              (Adam, if weight_decay != 0)
            exp_avg = lerp(exp_avg, g, 1 - beta1)                     (= beta1 * exp_avg + (1 - beta1) * g)
            exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * g * g
            max_exp_avg_sq = maximum(max_exp_avg_sq, exp_avg_sq)      (amsgrad; then used for exp_avg_sq below)
            denom = sqrt(exp_avg_sq) / sqrt(1 - beta2 ** t) + eps
            model = model - lr / (1 - beta1 ** t) * exp_avg / denom

        ``lerp(a, b, w)`` is PyTorch's: ``a + w * (b - a)`` for ``w < 0.5``, else
        ``b - (b - a) * (1 - w)``.  The bias corrections and the step size are float64.
        """
        # Code plan: 1. per thread: lr, t, the bias corrections and step size (float64, then the compute
        # dtype), the constants; 2. grid-stride: read model, diff, m, v (vmax) once; write m, v (vmax), model once.
        lr = numba.float64(learning_rate[0])
        t = numba.float64(train_step[0])
        bias_correction1 = 1.0 - math.pow(beta1, t)
        bias_correction2 = 1.0 - math.pow(beta2, t)
        step_size = acc(lr / bias_correction1)
        bias_correction2_sqrt = acc(math.sqrt(bias_correction2))
        w1 = acc(1.0 - beta1)
        rest1 = acc(1.0) - w1
        low = w1 < acc(0.5)
        b2 = acc(beta2)
        w2 = acc(1.0 - beta2)
        e = acc(eps)
        wd = acc(weight_decay)
        decay = acc(1.0 - lr * weight_decay)
        i = cuda.grid(1)
        while i < n:
            at = position(i, shape, model_strides)
            m_at = position(i, shape, m_strides)
            v_at = position(i, shape, v_strides)
            p = acc(model[at])
            g = acc(diff[position(i, shape, diff_strides)])
            if maximize:
                g = -g
            if weight_decay != 0:
                if decoupled_weight_decay:
                    p = p * decay
                else:
                    g = g + wd * p
            m = acc(m_arr[m_at])
            if low:
                m = m + w1 * (g - m)
            else:
                m = g - (g - m) * rest1
            v = acc(v_arr[v_at]) * b2 + w2 * g * g
            m_arr[m_at] = m
            v_arr[v_at] = v
            if amsgrad:
                vmax_at = position(i, shape, vmax_strides)
                v = scalar_ops.maximum(acc(vmax_arr[vmax_at]), v)
                vmax_arr[vmax_at] = v
            denom = acc(math.sqrt(v)) / bias_correction2_sqrt + e
            model[at] = p - step_size * m / denom
            i += cuda.gridsize(1)

    return adam_update_kernel


# --- checks (host) ------------------------------------------------------------------


def _check(op, model, others, learning_rate, train_step=None) -> None:
    """The shared checks: ``others`` ((name, array) pairs) have model's shape and dtype; the model is
    float; lr is one float32/float64 element; train_step one integer; no written array is a broadcast view."""
    if np.dtype(model.dtype) not in FLOAT_DTYPES:
        raise DTypeError(f"{op}: the model must be floating point ({names(FLOAT_DTYPES)}), got {model.dtype}")
    for name, array in others:
        if tuple(array.shape) != tuple(model.shape):
            raise ShapeError(f"{op}: {name} has shape {tuple(array.shape)}, the model {tuple(model.shape)}")
        if np.dtype(array.dtype) != np.dtype(model.dtype):
            raise DTypeError(f"{op}: {name} is {array.dtype}, the model {model.dtype}")
    if np.dtype(learning_rate.dtype) not in LR_DTYPES or learning_rate.size != 1:
        raise DTypeError(f"{op}: learning_rate must be one float32 or float64 element, got "
                         f"{learning_rate.dtype}{tuple(learning_rate.shape)}")
    if train_step is not None and (np.dtype(train_step.dtype) not in INTEGER_DTYPES or train_step.size != 1):
        raise DTypeError(f"{op}: train_step must be one integer element, got {train_step.dtype}"
                         f"{tuple(train_step.shape)}")


def _check_written(op, arrays) -> None:
    for name, array in arrays:
        if array.size > 1 and any(s == 0 and k > 1 for s, k in zip(array.strides, array.shape)):
            raise ShapeError(f"{op}: {name} is a broadcast view (stride 0): threads would race")


def _plan(model, operands):
    """(kernel shape, [(storage, strides)] per operand, n): one flat line when every operand is dense."""
    shape, n = as_kernel_shape(model.shape), model.size
    flats = [kernel_operand(x, shape) for x in operands]
    dense = contiguous_strides(shape)
    if all(strides == dense for _, strides in flats):
        return (n,), [(storage, (1,)) for storage, _ in flats], n
    return shape, flats, n


def _scalar_storage(x):
    """The one element of ``x`` as a 1-element device array (its storage)."""
    return kernel_operand(x, (1,))[0]


# --- cuda -------------------------------------------------------------------------------


def _sgd_update_cuda(model, model_diff, learning_rate, *, weight_decay=0.0, maximize=False, stream=0):
    op = "sgd_update"
    require_device_arrays(op, model, model_diff, learning_rate)
    _check(op, model, [("model_diff", model_diff)], learning_rate)
    _check_written(op, [("model", model)])
    if model.size == 0:
        return
    shape, ((p, ps), (g, gs)), n = _plan(model, [model, model_diff])
    grid, block = elementwise_config(n, [model.dtype])
    launcher(make_sgd_update(compute_dtype(model.dtype)), grid, block, stream)(
        p, ps, shape, g, gs, _scalar_storage(learning_rate), float(weight_decay), bool(maximize), n)


def _momentum_update_cuda(model, model_diff, momentum_buf, learning_rate, train_step, *, momentum, dampening=0.0,
                          nesterov=False, weight_decay=0.0, maximize=False, stream=0):
    op = "momentum_update"
    require_device_arrays(op, model, model_diff, momentum_buf, learning_rate, train_step)
    _check(op, model, [("model_diff", model_diff), ("momentum_buf", momentum_buf)], learning_rate, train_step)
    _check_written(op, [("model", model), ("momentum_buf", momentum_buf)])
    if model.size == 0:
        return
    shape, ((p, ps), (g, gs), (b, bs)), n = _plan(model, [model, model_diff, momentum_buf])
    grid, block = elementwise_config(n, [model.dtype])
    launcher(make_momentum_update(compute_dtype(model.dtype)), grid, block, stream)(
        p, ps, shape, g, gs, b, bs, _scalar_storage(learning_rate), _scalar_storage(train_step), float(momentum),
        float(dampening), bool(nesterov), float(weight_decay), bool(maximize), n)


def _adam_update_cuda(model, model_diff, exp_avg, exp_avg_sq, max_exp_avg_sq, learning_rate, train_step, *, beta1,
                      beta2, eps, weight_decay=0.0, amsgrad=False, maximize=False, decoupled_weight_decay=False,
                      stream=0):
    op = "adam_update"
    require_device_arrays(op, model, model_diff, exp_avg, exp_avg_sq, max_exp_avg_sq, learning_rate, train_step)
    _check(op, model, [("model_diff", model_diff), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq),
                       ("max_exp_avg_sq", max_exp_avg_sq)], learning_rate, train_step)
    _check_written(op, [("model", model), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)]
                   + ([("max_exp_avg_sq", max_exp_avg_sq)] if amsgrad else []))
    if model.size == 0:
        return
    shape, ((p, ps), (g, gs), (m, ms), (v, vs), (vmax, vmaxs)), n = _plan(
        model, [model, model_diff, exp_avg, exp_avg_sq, max_exp_avg_sq])
    grid, block = elementwise_config(n, [model.dtype])
    launcher(make_adam_update(compute_dtype(model.dtype)), grid, block, stream)(
        p, ps, shape, g, gs, m, ms, v, vs, vmax, vmaxs, _scalar_storage(learning_rate), _scalar_storage(train_step),
        float(beta1), float(beta2), float(eps), float(weight_decay), bool(amsgrad), bool(maximize),
        bool(decoupled_weight_decay), n)


# --- cpu twins (numpy, the same formulas in the same order) --------------------------------
# ``astype(dtype, copy=False)``: an operand already in the compute dtype is read in place (every
# write below assigns a new array's values), not copied: 12 copies of a 784-256-10 MLP's step.


def _one(x):
    return x.reshape(-1)[0] if x.ndim else x[()]


def _gradient(model_diff, dtype, maximize):
    """The gradient in the compute dtype, negated when maximizing."""
    g = model_diff.astype(dtype, copy=False)
    return -g if maximize else g


def _sgd_update_cpu(model, model_diff, learning_rate, *, weight_decay=0.0, maximize=False, stream=0):
    op = "sgd_update"
    _check(op, model, [("model_diff", model_diff)], learning_rate)
    _check_written(op, [("model", model)])
    dtype = compute_dtype(model.dtype)
    acc = dtype.type
    lr, wd = acc(_one(learning_rate)), acc(weight_decay)
    with np.errstate(all="ignore"):
        p, g = model.astype(dtype, copy=False), _gradient(model_diff, dtype, maximize)
        if weight_decay != 0:
            g = g + wd * p
        model[...] = p - lr * g


def _momentum_update_cpu(model, model_diff, momentum_buf, learning_rate, train_step, *, momentum, dampening=0.0,
                         nesterov=False, weight_decay=0.0, maximize=False, stream=0):
    op = "momentum_update"
    _check(op, model, [("model_diff", model_diff), ("momentum_buf", momentum_buf)], learning_rate, train_step)
    _check_written(op, [("model", model), ("momentum_buf", momentum_buf)])
    dtype = compute_dtype(model.dtype)
    acc = dtype.type
    lr, mu, keep, wd = acc(_one(learning_rate)), acc(momentum), acc(1.0 - dampening), acc(weight_decay)
    with np.errstate(all="ignore"):
        p, g = model.astype(dtype, copy=False), _gradient(model_diff, dtype, maximize)
        if weight_decay != 0:
            g = g + wd * p
        b = g if _one(train_step) == 1 else momentum_buf.astype(dtype, copy=False) * mu + keep * g
        momentum_buf[...] = b
        g = g + mu * b if nesterov else b
        model[...] = p - lr * g


def _adam_update_cpu(model, model_diff, exp_avg, exp_avg_sq, max_exp_avg_sq, learning_rate, train_step, *, beta1,
                     beta2, eps, weight_decay=0.0, amsgrad=False, maximize=False, decoupled_weight_decay=False,
                     stream=0):
    op = "adam_update"
    _check(op, model, [("model_diff", model_diff), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq),
                       ("max_exp_avg_sq", max_exp_avg_sq)], learning_rate, train_step)
    _check_written(op, [("model", model), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)]
                   + ([("max_exp_avg_sq", max_exp_avg_sq)] if amsgrad else []))
    dtype = compute_dtype(model.dtype)
    acc = dtype.type
    lr, t = np.float64(_one(learning_rate)), np.float64(_one(train_step))
    with np.errstate(all="ignore"):
        bias_correction1 = 1.0 - math.pow(beta1, t)
        bias_correction2 = 1.0 - math.pow(beta2, t)
        step_size = acc(lr / np.float64(bias_correction1))
        bias_correction2_sqrt = acc(math.sqrt(bias_correction2))
        w1 = acc(1.0 - beta1)
        rest1 = acc(1.0) - w1
        b2, w2, e, wd = acc(beta2), acc(1.0 - beta2), acc(eps), acc(weight_decay)
        decay = acc(1.0 - lr * weight_decay)
        p, g = model.astype(dtype, copy=False), _gradient(model_diff, dtype, maximize)
        if weight_decay != 0:
            if decoupled_weight_decay:
                p = p * decay
            else:
                g = g + wd * p
        m = exp_avg.astype(dtype, copy=False)
        m = m + w1 * (g - m) if w1 < acc(0.5) else g - (g - m) * rest1
        v = exp_avg_sq.astype(dtype, copy=False) * b2 + w2 * g * g
        exp_avg[...] = m
        exp_avg_sq[...] = v
        if amsgrad:
            v = np.maximum(max_exp_avg_sq.astype(dtype, copy=False), v)
            max_exp_avg_sq[...] = v
        denom = np.sqrt(v) / bias_correction2_sqrt + e
        model[...] = p - step_size * m / denom


register("sgd_update", "cuda", _sgd_update_cuda)
register("sgd_update", "cpu", _sgd_update_cpu)
register("momentum_update", "cuda", _momentum_update_cuda)
register("momentum_update", "cpu", _momentum_update_cpu)
register("adam_update", "cuda", _adam_update_cuda)
register("adam_update", "cpu", _adam_update_cpu)


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check: each kernel for each model
    dtype (float16, float32, float64) with a float32 learning rate (and float64 for float64), flat
    (rank 1) and strided rank 2."""
    from numba import types

    from pyflow.kernels.compile_check import array, tuple_of

    i64, f64, flag = types.int64, types.float64, types.boolean
    step = array("int64")
    cases = []
    for dtype in ("float16", "float32", "float64"):
        acc = compute_dtype(dtype)
        for lr_dtype in ("float32",) + (("float64",) if dtype == "float64" else ()):
            for rank in (1, 2):
                a, t, lr = array(dtype), tuple_of(rank), array(lr_dtype)
                label = f"[{dtype},lr={lr_dtype},rank {rank}]"
                cases.append((f"sgd_update{label}", make_sgd_update(acc).py_func,
                              (a, t, t, a, t, lr, f64, flag, i64), False))
                cases.append((f"momentum_update{label}", make_momentum_update(acc).py_func,
                              (a, t, t, a, t, a, t, lr, step, f64, f64, flag, f64, flag, i64), False))
                cases.append((f"adam_update{label}", make_adam_update(acc).py_func,
                              (a, t, t, a, t, a, t, a, t, a, t, lr, step, f64, f64, f64, f64, flag, flag, flag, i64),
                              False))
    return cases
