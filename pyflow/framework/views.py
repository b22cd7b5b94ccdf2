"""Views: new shapes and strides over the same storage, never a copy (except ``reshape`` when it must).

A view shares its base's storage, dependence object and version counter, so
the VM orders reads and writes through any view of a storage together, and an
in-place write through a view changes the base (``x.T.add_(1)``).

* ``permute``, ``transpose``, ``.T``, ``unsqueeze``, ``squeeze``, ``narrow``,
  ``split``, ``chunk``, ``expand`` (stride 0 on the expanded dims), ``detach``.
* ``view(*shape)`` follows PyTorch's rule (``view_strides``): the old dims fall
  into *chunks* of dims that are contiguous with each other, and every chunk
  must be made of whole new dims.  When they are not, ``view`` raises a
  ``ShapeError`` and ``reshape`` copies (``x.T.view(-1)`` fails,
  ``x.T.reshape(-1)`` copies); ``flatten`` is a ``reshape``.

>>> view_strides((2, 3), (3, 1), (3, 2))         # contiguous: any shape of 6 elements
(2, 1)
>>> view_strides((3, 2), (1, 3), (6,)) is None   # a transpose cannot be flattened in place
True
>>> view_strides((3, 2), (1, 3), (3, 1, 2))      # ...but it can take a size-1 dim
(1, 6, 3)
"""

from __future__ import annotations

import math

from pyflow.errors import ArgumentTypeError, IndexOutOfRangeError, ShapeError
from pyflow.framework import args
from pyflow.framework.args import describe
from pyflow.framework.interpreter import apply
from pyflow.framework.tensor import Tensor
from pyflow.kernels.layout import contiguous_strides

__all__ = ["view_strides", "reshape_attrs", "resolve_shape", "FUNCTIONS", "WHOLE"]

WHOLE = (0, None, 1)
"""A ``slice_view`` index item that keeps a dim whole (the ``:`` of ``x[:, 0]``): (start, stop, step) with no
stop, so it means the same on every rank's piece of a split dim (``pyflow/ops/views.py``)."""


def view_strides(shape, strides, new_shape):
    """Strides for viewing (shape, strides) as ``new_shape`` in the same element order, or None."""
    if math.prod(shape) == 0:
        return tuple(strides) if tuple(shape) == tuple(new_shape) else contiguous_strides(new_shape)
    chunks = []  # [elements, stride of its innermost dim], innermost chunk first
    for n, s in zip(reversed(shape), reversed(strides)):
        if n == 1:
            continue  # a size-1 dim never separates two dims
        if chunks and s == chunks[-1][1] * chunks[-1][0]:
            chunks[-1][0] *= n
        else:
            chunks.append([n, s])
    if not chunks:
        return contiguous_strides(new_shape)
    result, d = [0] * len(new_shape), len(new_shape) - 1
    for elements, base in chunks:
        run = 1
        while d >= 0 and (run < elements or new_shape[d] == 1):
            result[d] = base * run
            run *= new_shape[d]
            d -= 1
        if run != elements:
            return None
    return tuple(result) if d < 0 else None


def reshape_attrs(shape, new_shape) -> dict:
    """The ``view`` op's attrs for viewing ``shape`` as ``new_shape``, valid on every rank's piece.

    A dim of the result *keeps* a dim of the input when both have the same size (> 1) after the
    same number of elements: the elements before it, it, and those after it are the same blocks on
    both sides, so a split of that input dim is a split of that result dim (S(d) -> S(d')).  Each
    kept dim is -1 in ``shape`` and ``kept`` names, in order, the input dim it takes its size from;
    so a piece split along a kept dim views itself with the same attrs (as ``expand`` marks kept
    dims with -1; OneFlow's reshape infers each piece's shape from the logical one instead).

    >>> reshape_attrs((8, 1, 28, 28), (8, 784))
    {'shape': (-1, 784), 'kept': (0,)}
    >>> reshape_attrs((2, 2, 6, 5), (4, 6, 5))
    {'shape': (4, -1, -1), 'kept': (2, 3)}
    >>> reshape_attrs((6,), (2, 3))
    {'shape': (2, 3), 'kept': ()}
    """
    starts, before = {}, 1   # (elements before the dim, its size) -> input dim
    for d, n in enumerate(shape):
        if n > 1:
            starts[(before, n)] = d
        before *= n
    if before == 0:   # no elements: no dim is split, and the sizes say nothing of where dims start
        return {"shape": tuple(new_shape), "kept": ()}
    marked, kept, before = [], [], 1
    for n in new_shape:
        d = starts.get((before, n))
        marked.append(n if d is None else -1)
        if d is not None:
            kept.append(d)
        before *= n
    return {"shape": tuple(marked), "kept": tuple(kept)}


def resolve_shape(shape_args, numel: int, op: str, t) -> tuple:
    """The shape asked of ``view`` / ``reshape`` (one -1 is inferred), checked against ``numel``."""
    try:
        shape = list(args.sizes(shape_args, op, allow_minus_one=True))
    except (ShapeError, ArgumentTypeError) as error:
        raise type(error)(f"{error} (for {describe(t)})") from None
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        if known == 0 or numel % known:
            raise ShapeError(f"{op}: cannot infer -1 in {tuple(shape)} for the {numel} elements of {describe(t)}")
        shape[shape.index(-1)] = numel // known
    if math.prod(shape) != numel:
        raise ShapeError(f"{op}: shape {tuple(shape)} does not hold the {numel} elements of {describe(t)}")
    return tuple(shape)


def view(self: Tensor, *shape) -> Tensor:
    """The same elements with another shape, sharing the storage; ``ShapeError`` if the strides forbid it."""
    shape = resolve_shape(shape, self.numel(), "view", self)
    if self._global is None and view_strides(self.shape, self._blob.strides, shape) is None:
        raise ShapeError(f"view: {describe(self)} with strides {self._blob.strides} cannot be viewed as "
                         f"{list(shape)} (its dims are not contiguous with each other); use .reshape(...), "
                         "which copies when it must")
    return apply("view", [self], **reshape_attrs(self.shape, shape))[0]


def reshape(self: Tensor, *shape, **kwargs) -> Tensor:
    """A view when the strides allow it (see ``view``), else a contiguous copy (``shape=`` as a keyword too)."""
    if "shape" in kwargs and not shape:
        shape = (kwargs.pop("shape"),)
    if kwargs:
        raise TypeError(f"reshape() got an unexpected keyword argument {next(iter(kwargs))!r}")
    shape = resolve_shape(shape, self.numel(), "reshape", self)
    blob = self._blob   # a global tensor's: this rank's piece, whose layout a broadcast piece keeps
    viewable = view_strides(self.shape, blob.strides, shape) is not None if self._global is None else \
        tuple(blob.strides) == contiguous_strides(blob.shape)
    return apply("view", [self if viewable else self.clone()], **reshape_attrs(self.shape, shape))[0]


def flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Dims ``start_dim..end_dim`` merged into one (a ``reshape``: a view when possible)."""
    if self.ndim == 0:
        return self.reshape(1)
    start, end = args.dim(start_dim, self.ndim, "flatten", self), args.dim(end_dim, self.ndim, "flatten", self)
    if start > end:
        raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for {describe(self)}")
    shape = self.shape
    return self.reshape(shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:])


def permute(self: Tensor, *dims) -> Tensor:
    dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    perm = tuple(args.dim(d, self.ndim, "permute", self) for d in dims)
    if sorted(perm) != list(range(self.ndim)):
        raise ShapeError(f"permute: {dims} is not a permutation of the {self.ndim} dims of {describe(self)}")
    return apply("permute", [self], dims=perm)[0]


def transpose(self: Tensor, dim0: int, dim1: int) -> Tensor:
    perm = list(range(self.ndim))
    a, b = args.dim(dim0, self.ndim, "transpose", self), args.dim(dim1, self.ndim, "transpose", self)
    perm[a], perm[b] = perm[b], perm[a]
    return apply("permute", [self], dims=tuple(perm))[0]


def unsqueeze(self: Tensor, dim: int) -> Tensor:
    """A new size-1 dim at ``dim`` (in ``[-ndim - 1, ndim]``)."""
    d = args.dim(dim, self.ndim + 1, "unsqueeze", self)
    shape, strides = list(self.shape), list(self._blob.strides)
    return apply("unsqueeze", [self], dim=d)[0]


def squeeze(self: Tensor, dim=None) -> Tensor:
    """Without size-1 dims (all of them, or those of ``dim`` that have size 1)."""
    chosen = args.dims(dim, self.ndim, "squeeze", self) if self.ndim else None
    chosen = range(self.ndim) if chosen is None else (chosen,) if isinstance(chosen, int) else chosen
    return apply("squeeze", [self], dims=tuple(d for d in range(self.ndim) if d in chosen and self.shape[d] == 1))[0]


def expand(self: Tensor, *sizes) -> Tensor:
    """A view with size-1 dims repeated (stride 0) and new leading dims; -1 keeps a size."""
    target = list(args.sizes(sizes, "expand", allow_minus_one=True)) if sizes else []
    if any(n == -1 for n in target[:len(target) - self.ndim]) or len(target) < self.ndim:
        raise ShapeError(f"expand: cannot expand {describe(self)} to {tuple(target)}")
    pad = len(target) - self.ndim
    for d, n in enumerate(self.shape):
        want = target[pad + d]
        if want not in (-1, n) and n != 1:
            raise ShapeError(f"expand: dim {d} of {describe(self)} has size {n}, which cannot become {want} "
                             f"(only size-1 dims expand); asked for {tuple(sizes)}")
        target[pad + d] = -1 if want in (-1, n) else want   # kept: -1, the same on every rank's piece
    return apply("expand", [self], sizes=tuple(target))[0]


def expand_as(self: Tensor, other: Tensor) -> Tensor:
    return self.expand(other.shape)


def narrow(self: Tensor, dim: int, start: int, length: int) -> Tensor:
    """Elements ``start .. start + length`` of ``dim``: a view."""
    d = args.dim(dim, self.ndim, "narrow", self)
    size = self.shape[d]
    start, length = args.as_int(start, "narrow", "start"), args.as_int(length, "narrow", "length")
    if start < 0:
        start += size
    if not 0 <= start <= size or length < 0 or start + length > size:
        raise IndexOutOfRangeError(f"narrow: start {start} and length {length} do not fit dim {d} "
                                   f"of size {size} of {describe(self)}")
    return apply("narrow", [self], dim=d, start=start, length=length)[0]


def split(self: Tensor, split_size_or_sections, dim: int = 0) -> tuple:
    """Views of ``split_size`` elements along ``dim`` (the last may be smaller), or of the given sizes."""
    d = args.dim(dim, self.ndim, "split", self)
    size = self.shape[d]
    if isinstance(split_size_or_sections, (list, tuple)):
        sections = [args.as_int(n, "split", "a section size") for n in split_size_or_sections]
        if sum(sections) != size or any(n < 0 for n in sections):
            raise ShapeError(f"split: sections {sections} do not add up to dim {d} of {describe(self)} ({size})")
    else:
        step = args.as_int(split_size_or_sections, "split", "split_size")
        if step <= 0 and size:
            raise ShapeError(f"split: split_size must be positive, got {step} for {describe(self)}")
        sections = [min(step, size - at) for at in range(0, size, step)] if size else [0]
    starts = [sum(sections[:i]) for i in range(len(sections))]
    return tuple(self.narrow(d, at, n) for at, n in zip(starts, sections))


def chunk(self: Tensor, chunks: int, dim: int = 0) -> tuple:
    """At most ``chunks`` views of equal size along ``dim`` (torch's: the last may be smaller)."""
    chunks = args.as_int(chunks, "chunk", "chunks")
    if chunks <= 0:
        raise ShapeError(f"chunk: chunks must be positive, got {chunks} for {describe(self)}")
    d = args.dim(dim, self.ndim, "chunk", self)
    return self.split(max(1, -(-self.shape[d] // chunks)), d)


def reversed_dims(self: Tensor) -> Tensor:
    """``x.T``: the dims in reverse order (a ``permute``)."""
    return apply("permute", [self], dims=tuple(reversed(range(self.ndim))))[0]


def _function(method):
    """``flow.reshape(x, ...)`` for the method ``x.reshape(...)`` (called as a method: a subclass's own wins)."""
    name = method.__name__

    def function(input: Tensor, *args, **kwargs):   # noqa: A002 - torch's name
        if not isinstance(input, Tensor):
            raise ArgumentTypeError(f"{name}: expects a tensor, got {type(input).__name__}")
        return getattr(input, name)(*args, **kwargs)
    function.__name__ = function.__qualname__ = method.__name__
    function.__doc__ = method.__doc__
    return function


# The function forms torch also has (``flow.reshape(x, 6)``), exported by pyflow/__init__.py.
FUNCTIONS = {m.__name__: _function(m) for m in (reshape, flatten, permute, transpose, unsqueeze, squeeze, narrow,
                                                split, chunk, Tensor.clone)}
