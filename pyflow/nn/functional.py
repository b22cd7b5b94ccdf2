"""``flow.nn.functional``: the layers' computations as functions on tensors, as ``torch.nn.functional``.

* ``conv2d``, ``max_pool2d``, ``avg_pool2d`` - one op each (``pyflow/ops/nn.py``, kernels in
  ``kernels/conv.py``); ``relu``, ``sigmoid``, ``tanh``, ``softmax`` and ``log_softmax`` are
  the same functions as ``flow.relu``...;
* ``linear``, ``embedding``, ``dropout``, ``batch_norm``, ``mse_loss``, ``nll_loss`` and
  ``cross_entropy`` are *compositions* of those public ops (matmul, index_select, gather,
  mean, var, where...), written as the formulas PyTorch documents.  They need no kernel
  and no backward rule of their own: autograd differentiates the ops they are made of.

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

from pyflow.errors import DTypeError, ShapeError
from pyflow.framework.args import describe
from pyflow.framework.creation import rand_like
from pyflow.framework.functional import _tensor, log_softmax, relu, sigmoid, softmax, sqrt, tanh, where
from pyflow.framework.interpreter import apply
from pyflow.framework.tensor import Tensor
from pyflow.nn.module import ArgumentValueError, no_grad

__all__ = ["conv2d", "max_pool2d", "avg_pool2d", "relu", "sigmoid", "tanh", "softmax", "log_softmax", "linear",
           "embedding", "dropout", "batch_norm", "mse_loss", "nll_loss", "cross_entropy"]


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


# --- compositions of public ops (autograd goes through them) ------------------------------------------------


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:  # noqa: A002
    """``input @ weight.T + bias``: input (*, in_features), weight (out_features, in_features), bias (out,)."""
    x, w = _tensor(input, "linear"), _tensor(weight, "linear")
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
    index, w = _tensor(input, "embedding"), _tensor(weight, "embedding")
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
    x = _tensor(input, "dropout")
    if not 0.0 <= p <= 1.0:
        raise ArgumentValueError(f"dropout: p is a probability and must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    mask = (rand_like(x) < 1.0 - p).to(dtype=x.dtype) * scale
    return x.mul_(mask) if inplace else x * mask


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,  # noqa: A002
               weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalise each channel (dim 1) of ``input`` (N, C, *) to mean 0 and variance 1, then scale by
    ``weight`` and shift by ``bias``.

    ``training``: with the batch's mean and *biased* variance, and (if given) the running
    statistics updated in place: ``running = (1 - momentum) * running + momentum * batch``, with
    the *unbiased* variance for ``running_var``.  Otherwise: with ``running_mean`` / ``running_var``.
    """
    x = _tensor(input, "batch_norm")
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
    raise ArgumentValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:  # noqa: A002
    """``(input - target)^2``, averaged (or summed, or kept elementwise).

    The two must have the same shape: PyTorch broadcasts them with a warning, which is almost
    always a bug (a (N, 1) prediction against a (N,) target gives an N x N loss); here it is an error.
    """
    x, y = _tensor(input, "mse_loss"), _tensor(target, "mse_loss")
    if tuple(x.shape) != tuple(y.shape):
        raise ShapeError(f"mse_loss: input {describe(x)} and target {describe(y)} must have the same shape "
                         "(reshape one of them)")
    diff = x - y
    return _reduce(diff * diff, reduction, "mse_loss")


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,  # noqa: A002
             reduction: str = "mean") -> Tensor:
    """``-input[n, target[n]]`` (times ``weight[target[n]]``): the loss of log-probabilities ``input``
    (N, C, *) for class indices ``target`` (N, *).  Targets equal to ``ignore_index`` add nothing,
    and ``mean`` divides by the summed weights of the others (PyTorch's weighted mean)."""
    x, classes = _tensor(input, "nll_loss"), _tensor(target, "nll_loss")
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
                  ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """``nll_loss(log_softmax(input, dim=1), target)``: logits (N, C, *) against class indices (N, *).

    A floating ``target`` of the input's shape holds class probabilities instead:
    the loss is ``-sum_c weight[c] * target[n, c] * log_softmax(input)[n, c]``.
    """
    x, y = _tensor(input, "cross_entropy"), _tensor(target, "cross_entropy")
    class_dim = 0 if x.ndim == 1 else 1
    log_probs = log_softmax(x, dim=class_dim)
    if y.dtype.kind != "f":
        return nll_loss(log_probs, y, weight, ignore_index, reduction)
    if tuple(y.shape) != tuple(x.shape):
        raise ShapeError(f"cross_entropy: probability targets must have the input's shape {list(x.shape)}, "
                         f"got {describe(y)}")
    if weight is not None:
        per_class = (-1,) + (1,) * (x.ndim - class_dim - 1)
        log_probs = log_probs * weight.reshape(per_class)
    losses = -(y * log_probs).sum(class_dim)
    return _reduce(losses, reduction, "cross_entropy")

