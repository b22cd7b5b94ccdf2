"""``LayerNorm`` and ``layer_norm``: normalise each sample over its last dims (the transformer's norm).

Where ``BatchNorm`` averages one channel over the batch, ``LayerNorm`` averages one sample
over its trailing ``normalized_shape`` dims, so it behaves the same in training and
evaluation, needs no running statistics and works for a batch of one::

    y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias     # mean, biased var over the last dims

It is a composition of ``mean``, ``sub``, ``mul``, ``sqrt`` and ``div``: autograd differentiates it.

>>> import pyflow as flow
>>> ln = LayerNorm(4)
>>> y = ln(flow.tensor([[1.0, 2.0, 3.0, 4.0]]))
>>> [round(v, 4) for v in y[0].tolist()]
[-1.3416, -0.4472, 0.4472, 1.3416]
"""

from __future__ import annotations

import numbers

from pyflow.errors import ShapeError
from pyflow.framework import args
from pyflow.framework.args import describe
from pyflow.framework.creation import ones, zeros
from pyflow.framework.functional import sqrt
from pyflow.framework.tensor import Tensor
from pyflow.nn.module import ArgumentValueError, Module
from pyflow.nn.parameter import Parameter

__all__ = ["layer_norm", "LayerNorm"]


def _as_shape(normalized_shape, op: str) -> tuple[int, ...]:
    shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else tuple(normalized_shape)
    if not shape or any(isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1 for n in shape):
        raise ArgumentValueError(f"{op}: normalized_shape must be a positive int or a non-empty sequence of them, "
                                 f"got {normalized_shape!r}")
    return tuple(int(n) for n in shape)


def layer_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,  # noqa: A002
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalise ``input`` over its last ``len(normalized_shape)`` dims, which must equal
    ``normalized_shape``; then ``* weight + bias`` (each of shape ``normalized_shape``) if given."""
    x = args.tensor(input, "layer_norm")
    shape = _as_shape(normalized_shape, "layer_norm")
    if tuple(x.shape[x.ndim - len(shape):]) != shape or x.ndim < len(shape):
        raise ShapeError(f"layer_norm: input {describe(x)} must end with normalized_shape {list(shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != shape:
            raise ShapeError(f"layer_norm: {name} {describe(t)} must have normalized_shape {list(shape)}")
    dims = tuple(range(x.ndim - len(shape), x.ndim))
    centred = x - x.mean(dims, keepdim=True)
    var = (centred * centred).mean(dims, keepdim=True)   # biased, as PyTorch
    out = centred / sqrt(var + eps)
    if weight is not None:
        out = out * weight
    return out if bias is None else out + bias


class LayerNorm(Module):
    """``LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True, bias=True)``: ``weight`` starts
    at ones and ``bias`` at zeros (so it starts as a pure normalisation)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.normalized_shape = _as_shape(normalized_shape, "LayerNorm")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(ones(*self.normalized_shape, device=device, dtype=dtype))
            if bias:
                self.bias = Parameter(zeros(*self.normalized_shape, device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
