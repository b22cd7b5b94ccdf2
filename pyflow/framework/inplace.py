"""In-place ops: ``add_ sub_ mul_ div_ pow_ clamp_ copy_ fill_ zero_`` and ``+= -= *= /= //= %= **= &= |= ^=``.

Each is the out-of-place op with ``out=[self]`` (see ``pyflow/framework/interpreter.py``): a
real VM instruction that *writes* ``self``'s storage, so the VM orders it after
every instruction that read or wrote that storage before (WAR, WAW), and every
later reader after it (RAW), on any stream.  PyTorch's rules hold at the call:
the result must keep ``self``'s shape and be castable to its dtype
(``int_tensor.add_(1.5)`` is a ``DTypeError``); an operand that overlaps ``self``
without being the same view is copied first (``x[1:].add_(x[:-1])`` reads the old
values).  Every in-place op returns ``self`` and bumps ``self._version``.

>>> import pyflow as flow
>>> x = flow.zeros(3)
>>> x.add_(1).mul_(2)[1:] += x[:2]
>>> x.tolist(), x._version
([2.0, 4.0, 4.0], 3)
"""

from __future__ import annotations

from pyflow.errors import ArgumentTypeError, ShapeError
from pyflow.framework import args
from pyflow.framework.args import describe
from pyflow.framework.dtypes import to_scalar
from pyflow.framework.functional import _bounds, _operands, times_alpha
from pyflow.framework.interpreter import apply, has_internal_overlap, same_view
from pyflow.framework.tensor import Tensor

__all__ = ["copy_", "fill_", "zero_", "clamp_"]


def inplace_method(kernel, name):
    """The in-place method ``name`` (``mul_``) of op ``kernel``: the op with ``out=[self]``."""
    def method(self: Tensor, other) -> Tensor:
        apply(kernel, _operands(self, other, name), out=[self])
        return self
    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"In place: ``self = self {kernel} other`` (returns self)."
    return method


def add_(self: Tensor, other, *, alpha=1) -> Tensor:
    """In place: ``self += alpha * other`` (returns self)."""
    apply("add", _operands(self, times_alpha(other, alpha), "add_"), out=[self])
    return self


def sub_(self: Tensor, other, *, alpha=1) -> Tensor:
    """In place: ``self -= alpha * other`` (returns self)."""
    apply("sub", _operands(self, times_alpha(other, alpha), "sub_"), out=[self])
    return self


def _writable(self: Tensor, op: str) -> None:
    if has_internal_overlap(self):
        raise ShapeError(f"{op}: several elements of {describe(self)} share one memory location "
                         "(an expanded view); write to a .clone() instead")


def copy_(self: Tensor, src: Tensor) -> Tensor:
    """Copy ``src``'s values into ``self`` (broadcast to ``self``'s shape, cast to its dtype, moved from
    any device); returns self."""
    if not isinstance(src, Tensor):
        raise ArgumentTypeError(f"copy_: the source must be a tensor, got {type(src).__name__} (use fill_)")
    if not args.broadcasts_to(src.shape, self.shape):
        raise ShapeError(f"copy_: the source {describe(src)} does not broadcast to {describe(self)}")
    if self._global is not None or src._global is not None:
        return _global_copy(self, src)
    _writable(self, "copy_")
    if same_view(src._blob, self._blob):
        return self   # copying a view onto itself changes nothing
    if src.device is not self.device:
        src = src.to(self.device)
    if tuple(src.shape) != tuple(self.shape):   # the expand op: autograd and nn.Graph see the broadcast
        src = src.expand(*self.shape)
    apply("cast", [src], dtype=self.dtype, out=[self])
    return self


def fill_(self: Tensor, value) -> Tensor:
    """Write ``value`` (a number, or a one-element tensor) into every element; returns self."""
    if isinstance(value, Tensor):
        if value.ndim:
            raise ShapeError(f"fill_ of {describe(self)}: the value must be a number or a 0-d tensor, "
                             f"got {describe(value)}")
        return copy_(self, value)
    _writable(self, "fill_")
    value = to_scalar(value, self.dtype, f"fill_ of {describe(self)}")
    if self._global is not None:
        from pyflow.framework.creation import full

        return _global_copy(self, full(self.shape, value, dtype=self.dtype, placement=self.placement, sbp=self.sbp))
    apply("fill", [], out=[self], shape=self.shape, dtype=self.dtype, value=value, device=self.device)
    return self


def _global_copy(self: Tensor, src: Tensor) -> Tensor:
    """``copy_`` / ``fill_`` of a global tensor: the source, a global tensor too, is boxed to ``self``'s
    placement and SBP, and each rank writes its piece into ``self``'s piece (so a partial-sum tensor gets
    pieces that sum to the value, as OneFlow's global in-place ops do)."""
    if self._global is None or src._global is None:
        local, other = (src, self) if self._global is not None else (self, src)
        raise ArgumentTypeError(f"copy_ between a global and a local tensor ({describe(other)} and "
                                f"{describe(local)}): make the local one global first (.to_global(placement, sbp))")
    if tuple(src.shape) != tuple(self.shape):
        src = src.expand(*self.shape)
    boxed = src.to_global(self.placement, self.sbp)
    self.to_local().copy_(boxed.to_local())
    return self


def zero_(self: Tensor) -> Tensor:
    """Write zeros; returns self."""
    return fill_(self, 0)


def clamp_(self: Tensor, min=None, max=None) -> Tensor:   # noqa: A002 - torch's names
    """In place ``clamp`` (the bounds must not turn the result into another category: an integer
    tensor clamped by 0.5 is a ``DTypeError``); returns self."""
    kinds, bounds = _bounds(self, min, max)
    apply("clamp", [self, *bounds], out=[self], bounds=kinds)
    return self
