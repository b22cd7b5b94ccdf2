"""Reductions and scans: ``sum``, ``prod``, ``mean``, ``max``/``min`` (with ``dim``: values and indices),
``argmax``, ``argmin``, ``var``, ``std``, ``norm``, ``cumsum``, ``topk``, ``all``, ``any``, ``allclose``.

``sum``, ``prod``, ``mean``, ``max``, ``min``, ``argmax``, ``argmin``, ``cumsum`` and
``topk`` are one op each.  ``var``, ``std``, ``norm`` and ``allclose`` are compositions of
those ops, as PyTorch defines them: the variance is the mean of squared
deviations, corrected by ``correction`` (Bessel's correction by default).

>>> import pyflow as flow
>>> x = flow.tensor([[1.0, 5.0, 3.0], [4.0, 2.0, 6.0]])
>>> x.min(dim=1)
min(values=tensor([1., 2.]), indices=tensor([0, 1]))
>>> x.min(dim=1).indices.tolist(), x.topk(2).values.tolist(), x.var(dim=1).tolist()
([0, 1], [[5.0, 3.0], [6.0, 4.0]], [4.0, 4.0])
>>> (x > 2).sum().item(), flow.allclose(x, x + 1e-7)
(4, True)
"""

from __future__ import annotations

import collections
import math

from pyflow.errors import ArgumentTypeError, DTypeError, ShapeError
from pyflow.framework import args
from pyflow.framework.args import describe
from pyflow.framework.dtypes import BOOL
from pyflow.framework.functional import abs, logical_and, mul, sqrt
from pyflow.framework.interpreter import apply
from pyflow.framework.tensor import Tensor
from pyflow.kernels.sort import MAX_TOPK

__all__ = ["sum", "prod", "mean", "max", "min", "argmax", "argmin", "var", "std", "norm", "cumsum", "topk", "all",
           "any", "allclose", "return_types"]


class return_types:   # noqa: N801 - torch.return_types
    """The named tuples of reductions that give values and indices, as ``torch.return_types``."""

    max = collections.namedtuple("max", ["values", "indices"])
    min = collections.namedtuple("min", ["values", "indices"])
    topk = collections.namedtuple("topk", ["values", "indices"])


def _reduce(name, op, x, dim, keepdim):
    x = args.tensor(x, op)
    return apply(name, [x], axis=args.dims(dim, x.ndim, op, x), keepdims=_keepdim(keepdim, op))[0]


def _keepdim(keepdim, op):
    if not isinstance(keepdim, bool):
        raise ArgumentTypeError(f"{op}: keepdim must be a bool, got {keepdim!r}")
    return keepdim


def _axis(dim, axis, op):
    """numpy's ``axis=``, which PyTorch accepts as an alias of ``dim=`` (not both)."""
    if axis is not None and dim is not None:
        raise ArgumentTypeError(f"{op}: give dim or axis (its numpy alias), not both")
    return dim if axis is None else axis


def sum(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None, axis=None) -> Tensor:   # noqa: A001,A002
    """The sum over ``dim`` (an int, a tuple, or None: all); bools and integers sum in int64.
    ``dtype``: ``input`` is cast to it first, as in torch."""
    x = args.tensor(input, "sum")
    return _reduce("reduce_sum", "sum", x if dtype is None else x.to(dtype=dtype), _axis(dim, axis, "sum"), keepdim)


def prod(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:   # noqa: A002
    """The product over ``dim`` (one dim, or None: all elements); bools and integers multiply in int64.
    ``dtype``: ``input`` is cast to it first, as in torch.  Its gradient is right with zeros in the input."""
    x = args.tensor(input, "prod")
    x = x if dtype is None else x.to(dtype=dtype)
    axis = None if dim is None else args.dim(dim, x.ndim, "prod", x)
    return apply("reduce_prod", [x], axis=axis, keepdims=_keepdim(keepdim, "prod"))[0]


def mean(input: Tensor, dim=None, keepdim: bool = False, *, axis=None) -> Tensor:   # noqa: A002
    """The mean over ``dim``; needs a floating tensor, as ``torch.mean``."""
    return _reduce("reduce_mean", "mean", input, _axis(dim, axis, "mean"), keepdim)


def _with_indices(op, values_op, index_op, x, dim, keepdim):
    """``(values, indices)`` along ``dim``.  Where the values need a gradient they are read at the indices
    (``gather``), so the gradient goes to the returned index at ties, as PyTorch's does; the full reduction
    (``x.max()``) shares it among ties, as PyTorch's does too."""
    x = args.tensor(x, op)
    axis, keepdim = args.dim(dim, x.ndim, op, x), _keepdim(keepdim, op)
    indices = apply(index_op, [x], axis=axis, keepdims=keepdim)[0]
    if x.requires_grad and x.ndim:
        from pyflow.framework.movement import gather

        values = gather(x, axis, indices if keepdim else indices.unsqueeze(axis))
        values = values if keepdim else values.squeeze(axis)
    else:
        values = apply(values_op, [x], axis=axis, keepdims=keepdim)[0]
    return getattr(return_types, op)(values, indices)


def max(input: Tensor, dim=None, keepdim: bool = False, *, axis=None):   # noqa: A001,A002
    """The maximum; ``max(x, dim)``: ``(values, indices)``; ``max(x, other_tensor)``: ``maximum``."""
    dim = _axis(dim, axis, "max")
    if isinstance(dim, Tensor):
        return apply("max", [args.tensor(input, "max"), dim])[0]
    if dim is None:
        return _reduce("reduce_max", "max", input, None, keepdim)
    return _with_indices("max", "reduce_max", "argmax", input, dim, keepdim)


def min(input: Tensor, dim=None, keepdim: bool = False, *, axis=None):   # noqa: A001,A002
    """The minimum; ``min(x, dim)``: ``(values, indices)``; ``min(x, other_tensor)``: ``minimum``."""
    dim = _axis(dim, axis, "min")
    if isinstance(dim, Tensor):
        return apply("min", [args.tensor(input, "min"), dim])[0]
    if dim is None:
        return _reduce("reduce_min", "min", input, None, keepdim)
    return _with_indices("min", "reduce_min", "argmin", input, dim, keepdim)


def argmax(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:   # noqa: A002
    """The index of the largest element (the first one; over everything when ``dim`` is None)."""
    x = args.tensor(input, "argmax")
    return apply("argmax", [x], axis=None if dim is None else args.dim(dim, x.ndim, "argmax", x),
                 keepdims=_keepdim(keepdim, "argmax"))[0]


def argmin(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:   # noqa: A002
    """The index of the smallest element (the first one; over everything when ``dim`` is None)."""
    x = args.tensor(input, "argmin")
    return apply("argmin", [x], axis=None if dim is None else args.dim(dim, x.ndim, "argmin", x),
                 keepdims=_keepdim(keepdim, "argmin"))[0]


def _float_only(op, x):
    x = args.tensor(x, op)
    if x.dtype.kind != "f":
        raise DTypeError(f"{op}: needs a floating tensor, got {describe(x)} (use .float() first)")
    return x


def var(input: Tensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *,
        correction=None) -> Tensor:   # noqa: A002
    """``sum((x - mean)**2) / (N - correction)`` over ``dim``; ``correction`` is 1 (``unbiased=True``,
    the default) or 0 (``unbiased=False``).  Composed of mean, sub, mul, sum and div, as torch defines it."""
    x = _float_only("var", input)
    dims = args.dims(dim, x.ndim, "var", x)
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    elif unbiased is not None:
        raise ArgumentTypeError("var: give unbiased or correction, not both")
    axes = range(x.ndim) if dims is None else (dims,) if isinstance(dims, int) else dims
    count = math.prod(x.shape[d] for d in axes)
    deviation = x - mean(x, dims, keepdim=True)
    squares = sum(deviation * deviation, dims, keepdim=_keepdim(keepdim, "var"))
    return squares / (count - correction if count > correction else 0)


def std(input: Tensor, dim=None, unbiased: bool | None = None, keepdim: bool = False, *,
        correction=None) -> Tensor:   # noqa: A002
    """The square root of ``var`` (same arguments)."""
    return sqrt(var(input, dim, unbiased, keepdim, correction=correction))


def norm(input: Tensor, p=2, dim=None, keepdim: bool = False) -> Tensor:   # noqa: A002
    """The vector p-norm over ``dim`` (None: all elements): p=2 (default), 1, ``inf``, ``-inf``,
    ``"fro"`` (2), or any p > 0.  Composed of abs, mul, pow, sum, max and min, as torch defines it."""
    x = _float_only("norm", input)
    dims = args.dims(dim, x.ndim, "norm", x)
    keepdim = _keepdim(keepdim, "norm")
    if p == "fro":
        p = 2
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not (p > 0 or math.isinf(p)):
        raise ArgumentTypeError(f"norm: p must be a positive number, inf or -inf, got {p!r} (for {describe(x)})")
    magnitude = abs(x)
    if math.isinf(p):
        return _reduce("reduce_max" if p > 0 else "reduce_min", "norm", magnitude, dims, keepdim)
    if p == 1:
        return sum(magnitude, dims, keepdim)
    if p == 2:
        return sqrt(sum(mul(magnitude, magnitude), dims, keepdim))
    return sum(magnitude ** p, dims, keepdim) ** (1.0 / p)


def cumsum(input: Tensor, dim: int) -> Tensor:   # noqa: A002
    """Running sums along ``dim``; bools and integers add up in int64."""
    x = args.tensor(input, "cumsum")
    return apply("cumsum", [x], axis=args.dim(dim, x.ndim, "cumsum", x))[0]


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):   # noqa: A002
    """The ``k`` largest (``largest=False``: smallest) elements along ``dim`` and their indices,
    sorted (``sorted=False`` is accepted: sorted order is one valid order)."""
    x = args.tensor(input, "topk")
    axis = args.dim(dim, x.ndim, "topk", x)
    k = args.as_int(k, "topk", "k")
    on_cuda = x.placement.type == "cuda" if x.is_global else x.is_cuda
    if on_cuda and k > MAX_TOPK:
        raise ShapeError(f"topk: k={k} is more than the CUDA kernel's limit {MAX_TOPK} for {describe(x)}; "
                         "move the tensor to the cpu for a larger k")
    values, indices = apply("topk", [x], k=k, axis=axis, largest=bool(largest))
    return return_types.topk(values, indices)


def all(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:   # noqa: A001,A002
    """True where every element (over ``dim``) is nonzero: no zero counted, so an empty one is True (a min
    over no element has no identity; a count has one)."""
    x = args.tensor(input, "all")
    zeros = (x if x.dtype == BOOL else x.to(dtype=BOOL)) == False   # noqa: E712 - elementwise, not identity
    return _reduce("reduce_sum", "all", zeros, dim, keepdim) == 0


def any(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:   # noqa: A001,A002
    """True where some element (over ``dim``) is nonzero (a count: an empty one is False)."""
    x = args.tensor(input, "any")
    return _reduce("reduce_sum", "any", x if x.dtype == BOOL else x.to(dtype=BOOL), dim, keepdim) > 0


def allclose(input: Tensor, other: Tensor, rtol: float = 1e-05, atol: float = 1e-08,
             equal_nan: bool = False) -> bool:   # noqa: A002
    """``|input - other| <= atol + rtol * |other|`` everywhere (equal infinities count as close), as a
    Python bool: this reads the result, so it waits."""
    a, b = args.tensor(input, "allclose"), args.tensor(other, "allclose")
    close = (a == b) | (abs(a - b) <= atol + rtol * abs(b))
    if equal_nan:
        close = close | logical_and(a != a, b != b)
    return bool(all(close).item())
