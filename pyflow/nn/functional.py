"""``flow.nn.functional``: the layers' computations as functions on tensors, as ``torch.nn.functional``.

* ``conv2d``, ``max_pool2d``, ``avg_pool2d`` - one op each (``pyflow/ops/nn.py``, kernels in
  ``kernels/conv.py``; conv2d's ``dilation`` and ``groups`` are compositions around the op,
  ``nn/conv_compose.py``); ``relu``, ``sigmoid``, ``tanh``, ``softmax`` and ``log_softmax`` are
  the same functions as ``flow.relu``...;
* ``linear``, ``embedding``, ``dropout``, ``batch_norm``, ``layer_norm``, ``one_hot``, the
  activations ``gelu``, ``leaky_relu``, ``softplus``, ``logsigmoid`` and every loss (``mse_loss``,
  ``l1_loss``, ``smooth_l1_loss``, ``huber_loss``, ``nll_loss``, ``cross_entropy``,
  ``binary_cross_entropy[_with_logits]``, ``kl_div``) are *compositions* of those public ops
  (matmul, index_select, gather, mean, var, where, exp, log...), written as the formulas
  PyTorch documents.  They need no kernel and no backward rule of their own: autograd
  differentiates the ops they are made of (so cuda and global tensors work too).

>>> import pyflow as flow
>>> x = flow.arange(16.0).reshape(1, 1, 4, 4)
>>> F = flow.nn.functional
>>> F.max_pool2d(x, 2).flatten().tolist(), F.avg_pool2d(x, 2, stride=2).flatten().tolist()
([5.0, 7.0, 13.0, 15.0], [2.5, 4.5, 10.5, 12.5])
>>> F.conv2d(x, flow.ones(1, 1, 3, 3), padding=1).shape
(1, 1, 4, 4)
>>> logits = flow.tensor([[2.0, 0.0], [0.0, 2.0]])
>>> round(F.cross_entropy(logits, flow.tensor([0, 1])).item(), 4)   # -log(e^2 / (e^2 + 1))
0.1269
>>> F.linear(flow.ones(1, 3), flow.ones(2, 3), flow.tensor([0.0, 1.0])).tolist()
[[3.0, 4.0]]
"""

from __future__ import annotations

import math

import numpy as np

from pyflow.errors import DTypeError, ShapeError
from pyflow.framework import args
from pyflow.framework.args import describe
from pyflow.framework.creation import arange, rand_like
from pyflow.framework.functional import log_softmax, relu, sigmoid, softmax, sqrt, tanh, where
from pyflow.framework.interpreter import apply
from pyflow.framework.tensor import Tensor
from pyflow.nn import conv_compose, pooling
from pyflow.nn.module import ArgumentValueError, no_grad

__all__ = ["conv2d", "max_pool2d", "avg_pool2d", "relu", "sigmoid", "tanh", "softmax", "log_softmax", "linear",
           "embedding", "dropout", "batch_norm", "layer_norm", "one_hot", "gelu", "leaky_relu", "softplus",
           "logsigmoid", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "kl_div", "nll_loss", "cross_entropy"]


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,  # noqa: A002
           groups: int = 1) -> Tensor:
    """2-D cross-correlation: input (N, C_in, H, W), weight (C_out, C_in / groups, kH, kW), bias (C_out,).
    ``dilation`` and ``groups``: compositions around the op (``nn/conv_compose.py``)."""
    operands = [args.tensor(input, "conv2d"), args.tensor(weight, "conv2d")]
    if bias is not None:
        operands.append(args.tensor(bias, "conv2d"))
    if dilation not in (1, (1, 1)) or groups != 1:
        return conv_compose.conv2d(*operands, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return apply("conv2d", operands, stride=stride, padding=padding)[0]


def max_pool2d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,  # noqa: A002
               return_indices: bool = False):
    """The maximum of each window (``stride`` defaults to ``kernel_size``; padding counts as -inf).
    ``dilation``, ``ceil_mode`` and ``return_indices``: ``nn/pooling.py``."""
    if dilation not in (1, (1, 1)) or ceil_mode or return_indices:
        return pooling.max_pool2d(args.tensor(input, "max_pool2d"), kernel_size, stride, padding, dilation, ceil_mode,
                                  return_indices)
    return apply("max_pool2d", [args.tensor(input, "max_pool2d")], kernel_size=kernel_size, stride=stride,
                 padding=padding)[0]


def avg_pool2d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,  # noqa: A002
               count_include_pad: bool = True, divisor_override=None) -> Tensor:
    """The mean of each window (``stride`` defaults to ``kernel_size``; padding counts as zeros).
    ``ceil_mode``, ``count_include_pad=False`` and ``divisor_override``: ``nn/pooling.py``."""
    if ceil_mode or not count_include_pad or divisor_override is not None:
        return pooling.avg_pool2d(args.tensor(input, "avg_pool2d"), kernel_size, stride, padding, ceil_mode,
                                  count_include_pad, divisor_override)
    return apply("avg_pool2d", [args.tensor(input, "avg_pool2d")], kernel_size=kernel_size, stride=stride,
                 padding=padding)[0]


# --- compositions of public ops (autograd goes through them) ------------------------------------------------


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:  # noqa: A002
    """``input @ weight.T + bias``: input (*, in_features), weight (out_features, in_features), bias (out,)."""
    x, w = args.tensor(input, "linear"), args.tensor(weight, "linear")
    if w.ndim != 2 or x.ndim == 0 or x.shape[-1] != w.shape[1]:
        raise ShapeError(f"linear: input {describe(x)} does not fit weight {describe(w)}: the input's last dim "
                         "must be the weight's in_features (its dim 1)")
    out = x.matmul(w.T)
    return out if bias is None else out + bias


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None) -> Tensor:  # noqa: A002
    """Row ``input[i]`` of ``weight`` for every index: shape ``input.shape + (embedding_dim,)``.

    ``padding_idx``: those positions give their row as it is, but no gradient flows into it
    (``where(keep, rows, rows.detach())``), as PyTorch's padding row gets none.
    """
    index, w = args.tensor(input, "embedding"), args.tensor(weight, "embedding")
    if index.dtype.kind not in "iu":
        raise DTypeError(f"embedding: the indices must be integers, got {describe(index)}")
    if w.ndim != 2:
        raise ShapeError(f"embedding: the weight must be 2-D (num_embeddings, embedding_dim), got {describe(w)}")
    rows = w.index_select(0, index.reshape(-1)).reshape(*index.shape, w.shape[1])
    if padding_idx is None:
        return rows
    padding_idx = _padding_index(padding_idx, w.shape[0])
    keep = (index != padding_idx).unsqueeze(-1)
    return where(keep, rows, rows.detach())


def _padding_index(padding_idx: int, num_embeddings: int) -> int:
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise ArgumentValueError(f"embedding: padding_idx {padding_idx} is outside the {num_embeddings} embeddings")
    return padding_idx % num_embeddings


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:  # noqa: A002
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)`` (so the
    expectation is unchanged); the input itself when not ``training``.  The mask is drawn with
    ``flow.rand_like`` (``flow.manual_seed`` repeats it)."""
    x = args.tensor(input, "dropout")
    if not 0.0 <= p <= 1.0:
        raise ArgumentValueError(f"dropout: p is a probability and must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    mask = (rand_like(x) < 1.0 - p).to(dtype=x.dtype) * scale
    return x.mul_(mask) if inplace else x * mask


# --- activations and encodings ---------------------------------------------------------------------------

_ERF_P, _ERF_A = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf(x: Tensor) -> Tensor:
    """``erf(x)`` by Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7, below float32's epsilon):
    ``sign(x) * (1 - poly(t) * exp(-x^2))`` with ``t = 1 / (1 + p|x|)``.  pyflow has no erf op and this
    file may not add one, so it is composed; its gradient is the polynomial's (relative error ~1e-6),
    and is 0 at exactly x = 0 (sign(0) = 0): private, for ``gelu``, whose gradient does not use it there."""
    t = 1.0 / (1.0 + _ERF_P * x.abs())
    poly = t * (_ERF_A[0] + t * (_ERF_A[1] + t * (_ERF_A[2] + t * (_ERF_A[3] + t * _ERF_A[4]))))
    return x.sign() * (1.0 - poly * (-(x * x)).exp())


def gelu(input: Tensor, approximate: str = "none") -> Tensor:  # noqa: A002
    """``x * Phi(x)``, Phi the standard normal CDF: ``0.5 * x * (1 + erf(x / sqrt(2)))`` (``'none'``,
    erf composed as in ``_erf``), or ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))`` (``'tanh'``)."""
    x = args.tensor(input, "gelu")
    if approximate == "tanh":
        return 0.5 * x * (1.0 + tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))
    if approximate != "none":
        raise ArgumentValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return 0.5 * x * (1.0 + _erf(x * (1.0 / math.sqrt(2.0))))


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:  # noqa: A002
    """``x`` where ``x > 0``, else ``negative_slope * x`` (the gradient at 0 is ``negative_slope``, as PyTorch's)."""
    x = args.tensor(input, "leaky_relu")
    out = where(x > 0, x, x * negative_slope)
    return x.copy_(out) if inplace else out


def _log1p(u: Tensor) -> Tensor:
    """``log(1 + u)`` accurate for tiny ``u`` (there is no log1p op): Goldberg's trick
    ``u * log(w) / (w - 1)`` with ``w = 1 + u`` cancels the rounding of ``1 + u``; ``u`` itself
    where ``w`` rounds to 1.  The denominator is kept away from 0 so that no branch makes a nan."""
    w = 1.0 + u
    rounds_to_one = w == 1.0
    return where(rounds_to_one, u, u * w.log() / where(rounds_to_one, 1.0, w - 1.0))


def _softplus1(z: Tensor) -> Tensor:
    """``log(1 + exp(z))`` without overflow: ``max(z, 0) + log1p(exp(-|z|))``.  Both parts are written
    with ``where`` (not ``abs``/``clamp``) so that the gradient at ``z = 0`` is ``sigmoid(0) = 0.5``."""
    positive = z > 0
    return where(positive, z, 0.0) + _log1p(where(positive, -z, z).exp())


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:  # noqa: A002
    """``log(1 + exp(beta * x)) / beta``, and ``x`` itself where ``beta * x > threshold`` (PyTorch's cut)."""
    x = args.tensor(input, "softplus")
    z = x * beta
    return where(z > threshold, x, _softplus1(z) / beta)


def logsigmoid(input: Tensor) -> Tensor:  # noqa: A002
    """``log(sigmoid(x)) = -softplus(-x)``, stable for large ``|x|`` (no ``log(0)``)."""
    return -_softplus1(-args.tensor(input, "logsigmoid"))


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """``out[..., c] = 1 if tensor[...] == c else 0``: int64, shape ``tensor.shape + (num_classes,)``.

    ``num_classes=-1`` means ``tensor.max() + 1``.  Like PyTorch, the values are checked (a sync).
    """
    index = args.tensor(tensor, "one_hot")
    if index.dtype.kind not in "iu":
        raise DTypeError(f"one_hot: expects a tensor of class indices (integers), got {describe(index)}")
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < -1:
        raise ArgumentValueError(f"one_hot: num_classes must be -1 (infer) or a count >= 0, got {num_classes!r}")
    if index.numel() == 0:
        if num_classes == -1:
            raise ArgumentValueError("one_hot: cannot infer the number of classes from an empty tensor")
    else:
        low, high = int(index.min().item()), int(index.max().item())
        if low < 0:
            raise ArgumentValueError(f"one_hot: class values must be non-negative, got {low} in {describe(index)}")
        if num_classes == -1:
            num_classes = high + 1
        elif high >= num_classes:
            raise ArgumentValueError(f"one_hot: class value {high} is out of range for num_classes={num_classes}")
    classes = arange(num_classes, dtype=np.int64, device=index.device)
    return (index.unsqueeze(-1) == classes).to(dtype=np.int64)


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,  # noqa: A002
               weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalise each channel (dim 1) of ``input`` (N, C, *) to mean 0 and variance 1, then scale by
    ``weight`` and shift by ``bias``.

    ``training``: with the batch's mean and *biased* variance, and (if given) the running
    statistics updated in place: ``running = (1 - momentum) * running + momentum * batch``, with
    the *unbiased* variance for ``running_var``.  Otherwise: with ``running_mean`` / ``running_var``.
    """
    x = args.tensor(input, "batch_norm")
    if x.ndim < 2:
        raise ShapeError(f"batch_norm: the input needs a batch and a channel dim (N, C, *), got {describe(x)}")
    channels = x.shape[1]
    dims = (0, *range(2, x.ndim))
    per_channel = (1, channels) + (1,) * (x.ndim - 2)
    if training:
        count = x.numel() // max(channels, 1)
        if count <= 1:
            raise ArgumentValueError(f"batch_norm: training needs more than 1 value per channel, got {describe(x)}")
        mean, var = x.mean(dims), x.var(dims, unbiased=False)
        if running_mean is not None and running_var is not None:
            with no_grad():
                running_mean.mul_(1 - momentum).add_(mean.detach() * momentum)
                running_var.mul_(1 - momentum).add_(var.detach() * (momentum * count / (count - 1)))
    else:
        if running_mean is None or running_var is None:
            raise ArgumentValueError("batch_norm: evaluation (training=False) needs running_mean and running_var")
        mean, var = running_mean, running_var
    out = (x - mean.reshape(per_channel)) / sqrt(var.reshape(per_channel) + eps)
    if weight is not None:
        out = out * weight.reshape(per_channel)
    return out if bias is None else out + bias.reshape(per_channel)


def _reduce(losses: Tensor, reduction: str, op: str) -> Tensor:
    if reduction == "mean":
        return losses.mean()
    if reduction == "sum":
        return losses.sum()
    if reduction == "none":
        return losses
    valid = "'mean', 'batchmean', 'sum' or 'none'" if op == "kl_div" else "'mean', 'sum' or 'none'"
    raise ArgumentValueError(f"{op}: reduction must be {valid}, got {reduction!r}")


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:  # noqa: A002
    """``(input - target)^2``, averaged (or summed, or kept elementwise).

    The two must have the same shape: PyTorch broadcasts them with a warning, which is almost
    always a bug (a (N, 1) prediction against a (N,) target gives an N x N loss); here it is an error.
    """
    x, y = _pair(input, target, "mse_loss")
    diff = x - y
    return _reduce(diff * diff, reduction, "mse_loss")


def _pair(input: Tensor, target: Tensor, op: str) -> tuple[Tensor, Tensor]:  # noqa: A002
    """The two tensors of an elementwise loss, which must have the same shape (see ``mse_loss``)."""
    x, y = args.tensor(input, op), args.tensor(target, op)
    if tuple(x.shape) != tuple(y.shape):
        raise ShapeError(f"{op}: input {describe(x)} and target {describe(y)} must have the same shape "
                         "(reshape one of them)")
    return x, y


def l1_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:  # noqa: A002
    """``|input - target|``, averaged (or summed, or kept elementwise)."""
    x, y = _pair(input, target, "l1_loss")
    return _reduce((x - y).abs(), reduction, "l1_loss")


def smooth_l1_loss(input: Tensor, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:  # noqa: A002
    """``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta`` (``d = input - target``): quadratic
    near 0 (smooth gradient), linear far away (outliers pull no harder than L1).  ``beta=0`` is L1."""
    x, y = _pair(input, target, "smooth_l1_loss")
    if beta < 0:
        raise ArgumentValueError(f"smooth_l1_loss: beta must be >= 0, got {beta}")
    d = x - y
    if beta == 0:
        return _reduce(d.abs(), reduction, "smooth_l1_loss")
    size = d.abs()
    return _reduce(where(size < beta, 0.5 * d * d / beta, size - 0.5 * beta), reduction, "smooth_l1_loss")


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:  # noqa: A002
    """``0.5 d^2`` where ``|d| < delta``, else ``delta * (|d| - 0.5 delta)``: ``delta * smooth_l1(beta=delta)``."""
    x, y = _pair(input, target, "huber_loss")
    if delta <= 0:
        raise ArgumentValueError(f"huber_loss: delta must be > 0, got {delta}")
    d = x - y
    size = d.abs()
    return _reduce(where(size < delta, 0.5 * d * d, delta * (size - 0.5 * delta)), reduction, "huber_loss")


def _clamped_log(x: Tensor) -> Tensor:
    """``max(log(x), -100)``, PyTorch's guard against ``log(0) = -inf`` in BCE.  ``x <= 0`` reads a
    harmless 1 inside (``where``), so neither the value nor the gradient (0 there) is inf or nan."""
    positive = x > 0
    return where(positive, where(positive, x, 1.0).log().clamp(min=-100.0), -100.0)


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,  # noqa: A002
                         reduction: str = "mean") -> Tensor:
    """``-weight * (y log(x) + (1 - y) log(1 - x))`` for probabilities ``x`` in [0, 1], each log clamped
    at -100 as PyTorch does.  The range of ``x`` is checked (one sync), as PyTorch does."""
    x, y = _pair(input, target, "binary_cross_entropy")
    if x.numel() and bool(((x < 0) | (x > 1)).any().item()):
        raise ArgumentValueError(f"binary_cross_entropy: every input must be a probability in [0, 1] "
                                 f"(apply sigmoid, or use binary_cross_entropy_with_logits), got {describe(x)}")
    losses = -(y * _clamped_log(x) + (1.0 - y) * _clamped_log(1.0 - x))
    if weight is not None:
        losses = losses * weight
    return _reduce(losses, reduction, "binary_cross_entropy")


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,  # noqa: A002
                                     reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
    """``binary_cross_entropy(sigmoid(x), y)`` computed stably from the logits ``x``:
    ``pos_weight * y * softplus(-x) + (1 - y) * softplus(x)``, since ``-log sigmoid(x) = softplus(-x)``
    and ``-log(1 - sigmoid(x)) = softplus(x)``.  (PyTorch computes the same value as
    ``(1 - y) x + (1 + (pos_weight - 1) y) softplus(-x)``, which rounds a tiny loss to 0 in float32.)
    ``pos_weight`` (broadcast along the last dim, one per class) weighs the positive term."""
    x, y = _pair(input, target, "binary_cross_entropy_with_logits")
    positive = y if pos_weight is None else pos_weight * y
    losses = positive * _softplus1(-x) + (1.0 - y) * _softplus1(x)
    if weight is not None:
        losses = losses * weight
    return _reduce(losses, reduction, "binary_cross_entropy_with_logits")


def kl_div(input: Tensor, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:  # noqa: A002
    """``target * (log(target) - input)``: ``input`` holds log-probabilities, ``target`` probabilities
    (log-probabilities if ``log_target``: then ``exp(t) * (t - input)``); ``0 log 0 = 0``.
    ``'batchmean'`` divides the sum by ``input.shape[0]`` (the true KL divergence per sample);
    ``'mean'`` divides by the number of elements, as PyTorch (which warns about it)."""
    x, y = _pair(input, target, "kl_div")
    if log_target:
        losses = y.exp() * (y - x)
    else:
        positive = y > 0
        losses = where(positive, y * where(positive, y, 1.0).log(), 0.0) - y * x
    if reduction == "batchmean":
        return losses.sum() / x.shape[0] if x.ndim else losses.sum()
    return _reduce(losses, reduction, "kl_div")


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,  # noqa: A002
             reduction: str = "mean") -> Tensor:
    """``-input[n, target[n]]`` (times ``weight[target[n]]``): the loss of log-probabilities ``input``
    (N, C, *) for class indices ``target`` (N, *).  Targets equal to ``ignore_index`` add nothing,
    and ``mean`` divides by the summed weights of the others (PyTorch's weighted mean)."""
    x, classes = args.tensor(input, "nll_loss"), args.tensor(target, "nll_loss")
    if classes.dtype.kind not in "iu":
        raise DTypeError(f"nll_loss: the target must hold class indices (integers), got {describe(classes)}")
    unbatched = x.ndim == 1
    if unbatched:
        x, classes = x.unsqueeze(0), classes.unsqueeze(0)
    if x.ndim < 2 or tuple(classes.shape) != (x.shape[0], *x.shape[2:]):
        raise ShapeError(f"nll_loss: input {describe(x)} (N, C, *) needs a target of shape (N, *) = "
                         f"{[x.shape[0], *x.shape[2:]] if x.ndim >= 2 else '?'}, got {describe(classes)}")
    valid = classes != ignore_index
    safe = where(valid, classes, 0)   # an ignored index may be out of range: gather row 0 instead
    picked = x.gather(1, safe.unsqueeze(1)).squeeze(1)
    weights = valid.to(dtype=x.dtype)
    if weight is not None:
        weights = weights * weight.index_select(0, safe.reshape(-1)).reshape(safe.shape)
    losses = -(picked * weights)
    if reduction == "mean":
        return losses.sum() / weights.sum()
    losses = _reduce(losses, reduction, "nll_loss")
    return losses.squeeze(0) if unbatched and reduction == "none" else losses


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,  # noqa: A002
                  ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """``nll_loss(log_softmax(input, dim=1), target)``: logits (N, C, *) against class indices (N, *).

    A floating ``target`` of the input's shape holds class probabilities instead:
    the loss is ``-sum_c weight[c] * target[n, c] * log_softmax(input)[n, c]``.

    ``label_smoothing`` = e mixes the target with the uniform distribution over the C classes:
    ``(1 - e) * target + e / C``.  For class indices that is PyTorch's
    ``(1 - e) * nll + e / C * smooth`` with ``smooth[n] = -sum_c weight[c] * log_p[n, c]`` (0 for
    ignored targets); ``mean`` divides ``smooth``'s sum by the same summed weights as ``nll``.
    """
    x, y = args.tensor(input, "cross_entropy"), args.tensor(target, "cross_entropy")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ArgumentValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    class_dim = 0 if x.ndim == 1 else 1
    log_probs = log_softmax(x, dim=class_dim)
    per_class = (-1,) + (1,) * (x.ndim - class_dim - 1)
    num_classes = x.shape[class_dim] if x.ndim else 1
    if y.dtype.kind != "f":
        nll = nll_loss(log_probs, y, weight, ignore_index, reduction)
        if label_smoothing == 0.0:
            return nll
        weighted = log_probs if weight is None else log_probs * weight.reshape(per_class)
        valid = y != ignore_index
        smooth = where(valid, -weighted.sum(class_dim), 0.0)
        if reduction == "mean":
            counted = valid.to(dtype=x.dtype)
            if weight is not None:
                safe = where(valid, y, 0)
                counted = counted * weight.index_select(0, safe.reshape(-1)).reshape(safe.shape)
            smooth = smooth.sum() / counted.sum()
        else:
            smooth = _reduce(smooth, reduction, "cross_entropy")
        return (1.0 - label_smoothing) * nll + smooth * (label_smoothing / num_classes)
    if tuple(y.shape) != tuple(x.shape):
        raise ShapeError(f"cross_entropy: probability targets must have the input's shape {list(x.shape)}, "
                         f"got {describe(y)}")
    if label_smoothing > 0.0:
        y = y * (1.0 - label_smoothing) + label_smoothing / num_classes
    if weight is not None:
        log_probs = log_probs * weight.reshape(per_class)
    losses = -(y * log_probs).sum(class_dim)
    return _reduce(losses, reduction, "cross_entropy")


from pyflow.nn.normalization import layer_norm  # noqa: E402 - defined beside LayerNorm, re-exported here
