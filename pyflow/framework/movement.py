"""Joining and picking: ``cat``, ``stack``, ``gather``, ``index_select``, ``repeat``; writing at
indices: ``index_copy_``, ``index_add_``, ``scatter_add_`` (in place) and their out-of-place forms.

``cat``, ``gather`` and ``index_select`` are one op each.  ``stack`` is ``cat`` of
the tensors with a new dim (as PyTorch builds it), and ``repeat`` is an
``expand`` (a stride-0 view) copied into a new contiguous tensor by ``reshape``.
(``split``, ``chunk`` and ``narrow`` are views: ``pyflow/framework/views.py``.)

>>> import pyflow as flow
>>> a, b = flow.tensor([1, 2]), flow.tensor([3, 4])
>>> flow.stack([a, b], dim=1).tolist(), a.repeat(2, 2).tolist()
([[1, 3], [2, 4]], [[1, 2, 1, 2], [1, 2, 1, 2]])
>>> flow.gather(flow.tensor([[1, 2], [3, 4]]), 1, flow.tensor([[1], [0]])).tolist()
[[2], [3]]
>>> flow.zeros(3).index_add_(0, flow.tensor([0, 2, 0]), flow.ones(3)).tolist()
[2.0, 0.0, 1.0]
"""

from __future__ import annotations

from pyflow.errors import ShapeError
from pyflow.framework import args
from pyflow.framework.args import describe
from pyflow.framework.interpreter import apply
from pyflow.framework.tensor import Tensor

__all__ = ["cat", "concat", "stack", "gather", "index_select", "repeat", "index_copy", "index_add", "scatter_add"]


def cat(tensors, dim: int = 0) -> Tensor:
    """Concatenate along ``dim`` (dtypes promote, as in torch)."""
    tensors = args.tensor_list(tensors, "cat")
    if tensors[0].ndim:
        dim = args.dim(dim, tensors[0].ndim, "cat", tensors[0])
    return apply("cat", tensors, axis=dim)[0]


concat = cat


def stack(tensors, dim: int = 0) -> Tensor:
    """Join tensors of one shape along a new dim ``dim``: ``cat`` of each with that dim added."""
    tensors = args.tensor_list(tensors, "stack")
    first = tensors[0]
    for t in tensors[1:]:
        if t.shape != first.shape:
            listed = ", ".join(describe(x) for x in tensors)
            raise ShapeError(f"stack: every tensor must have the same shape, got {listed}")
    dim = args.dim(dim, first.ndim + 1, "stack", first)
    return cat([t.unsqueeze(dim) for t in tensors], dim)


def gather(input: Tensor, dim: int, index: Tensor) -> Tensor:   # noqa: A002 - torch's name
    """``out[i][j] = input[index[i][j]][j]`` for ``dim`` 0 (any rank): torch.gather."""
    x, index = args.tensor(input, "gather"), args.tensor(index, "gather")
    if min(x.ndim, index.ndim) == 0 and max(x.ndim, index.ndim) <= 1:   # PyTorch: a 0-d one counts as 1-d
        args.dim(dim, 1, "gather", x)
        result = apply("dim_gather", [x.reshape(-1) if x.ndim == 0 else x,
                                      index.reshape(-1) if index.ndim == 0 else index], axis=0)[0]
        return result.reshape(()) if index.ndim == 0 else result
    return apply("dim_gather", [x, index], axis=args.dim(dim, x.ndim, "gather", x))[0]


def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:   # noqa: A002
    """The slices ``index`` (a 1-D integer tensor) of ``input`` along ``dim``."""
    x, index = args.tensor(input, "index_select"), args.tensor(index, "index_select")
    return apply("index_select", [x, index], axis=args.dim(dim, x.ndim, "index_select", x))[0]


def repeat(self: Tensor, *repeats) -> Tensor:
    """The tensor tiled ``repeats`` times along each dim (more repeats than dims add leading dims)."""
    repeats = args.sizes(repeats, "repeat")
    if len(repeats) < self.ndim:
        raise ShapeError(f"repeat: {len(repeats)} repeats for {describe(self)}; give at least one per dim")
    shape = (1,) * (len(repeats) - self.ndim) + tuple(self.shape)
    tiled = self.reshape(shape)
    interleaved = [n for pair in zip(repeats, shape) for n in pair]   # (r0, s0, r1, s1, ...)
    spread = tiled.reshape([n for s in shape for n in (1, s)]).expand(interleaved)
    result = spread.reshape([r * s for r, s in zip(repeats, shape)])
    return result.clone() if result._blob.storage is self._blob.storage else result   # always a new tensor


def _write_at(op: str, self: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """One in-place op writing ``source`` into ``self`` at ``index`` along ``dim``; returns ``self``."""
    from pyflow.framework.inplace import _writable

    args.tensor(self, f"{op}_"), args.tensor(index, f"{op}_"), args.tensor(source, f"{op}_")
    _writable(self, f"{op}_")
    apply(op, [self, index, source], out=[self], axis=args.dim(dim, self.ndim, f"{op}_", self))
    return self


def index_copy_(self: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """In place: ``self[..., index[j], ...] = source[..., j, ...]`` along ``dim`` (a 1-D index)."""
    return _write_at("index_copy", self, dim, index, source)


def index_add_(self: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1) -> Tensor:
    """In place: ``self[..., index[j], ...] += alpha * source[..., j, ...]``; repeated indices add up."""
    return _write_at("index_add", self, dim, index, source if alpha == 1 else source * alpha)


def scatter_add_(self: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """In place: ``self[i][index[i][j]] += src[i][j]`` for ``dim`` 1 (any rank): torch's scatter_add_."""
    return _write_at("scatter_add", self, dim, index, src)


def index_copy(input: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:   # noqa: A002
    """``input.clone().index_copy_(dim, index, source)``."""
    return index_copy_(args.tensor(input, "index_copy").clone(), dim, index, source)


def index_add(input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1) -> Tensor:   # noqa: A002
    """``input.clone().index_add_(dim, index, source, alpha=alpha)``."""
    return index_add_(args.tensor(input, "index_add").clone(), dim, index, source, alpha=alpha)


def scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:   # noqa: A002
    """``input.clone().scatter_add_(dim, index, src)``."""
    return scatter_add_(args.tensor(input, "scatter_add").clone(), dim, index, src)
