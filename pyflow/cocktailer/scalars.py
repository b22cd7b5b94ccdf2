"""Scalar expressions of Cocktailer's IR (seed 001): the ints and conditions that live on the device.

A loop's trip count, a branch's condition, the dynamic part of a tensor's offset and a
recursive call's arguments are ``Scalar`` s: constants (``Const``), loop counters,
function parameters and frame fields (``Var``), one element of a buffer (``Load``: a
device value, ``table[i].item()``), and ``BinOp`` s of them (``t + 1``, ``n < 2``,
``flag.eq(0)``).  They are built by Python operators at trace time and have no value
then (``bool(scalar)`` is an error that says to use ``cond`` / ``while_loop``).  The host
executor evaluates them on the host (``py_op``; a device-to-host read per ``Load``), the
code generator renders them as Python expressions inside the kernel.

    >>> from pyflow.cocktailer.scalars import Var
    >>> t = Var("i0")
    >>> t * 4 + 1, is_int_scalar(t < 3)
    (((i0 * 4) + 1), True)
"""

from __future__ import annotations

import dataclasses
import operator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:   # ir imports this module: the name is for readers and type checkers only
    from .ir import TensorRef

__all__ = ["Scalar", "Const", "Var", "Load", "BinOp", "as_scalar", "is_int_scalar", "scalar_loads", "scalar_vars",
           "py_op"]



class Scalar:
    """A scalar expression evaluated on the device (or, by the host executor, on the host)."""

    def _bin(self, op, other, swap=False):
        other = as_scalar(other)
        return BinOp(op, other, self) if swap else BinOp(op, self, other)

    def __add__(self, o): return self._bin("+", o)
    def __radd__(self, o): return self._bin("+", o, True)
    def __sub__(self, o): return self._bin("-", o)
    def __rsub__(self, o): return self._bin("-", o, True)
    def __mul__(self, o): return self._bin("*", o)
    def __rmul__(self, o): return self._bin("*", o, True)
    def __floordiv__(self, o): return self._bin("//", o)
    def __mod__(self, o): return self._bin("%", o)
    def __lt__(self, o): return self._bin("<", o)
    def __le__(self, o): return self._bin("<=", o)
    def __gt__(self, o): return self._bin(">", o)
    def __ge__(self, o): return self._bin(">=", o)
    def __and__(self, o): return self._bin("and", o)
    def __or__(self, o): return self._bin("or", o)
    def eq(self, o): return self._bin("==", o)
    def ne(self, o): return self._bin("!=", o)

    def __bool__(self):
        raise TypeError("a Scalar is a device value: it has no truth value at trace time; "
                        "use cocktailer.cond / while_loop instead of if / while")

    __hash__ = object.__hash__


@dataclasses.dataclass(eq=False)
class Const(Scalar):
    value: int | float

    def __repr__(self): return repr(self.value)


@dataclasses.dataclass(eq=False)
class Var(Scalar):
    """A loop counter, a function parameter or a frame field; ``name`` is its code name."""

    name: str

    def __repr__(self): return self.name


@dataclasses.dataclass(eq=False)
class Load(Scalar):
    """One element of a buffer (``ref`` is a 0-d or 1-element TensorRef)."""

    ref: "TensorRef"

    def __repr__(self): return f"{self.ref.buffer.name}[{self.ref.offset}]"


_PY_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
           "%": operator.mod, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
           "==": operator.eq, "!=": operator.ne, "and": lambda a, b: bool(a) and bool(b),
           "or": lambda a, b: bool(a) or bool(b)}


@dataclasses.dataclass(eq=False)
class BinOp(Scalar):
    op: str
    a: Scalar
    b: Scalar

    def __post_init__(self):
        if self.op not in _PY_OPS:
            raise ValueError(f"unknown scalar operator {self.op!r}")

    def __repr__(self): return f"({self.a!r} {self.op} {self.b!r})"


def as_scalar(x) -> Scalar:
    """A Python int/float/bool as a ``Const``; a ``Scalar`` as itself."""
    if isinstance(x, Scalar):
        return x
    if isinstance(x, (bool, np.bool_)):
        return Const(int(x))
    if isinstance(x, (int, np.integer)):
        return Const(int(x))
    if isinstance(x, (float, np.floating)):
        return Const(float(x))
    raise TypeError(f"expected a Scalar, an int or a float, got {x!r}")


def is_int_scalar(s: Scalar) -> bool:
    """Does ``s`` always hold an int?  Loop counters, parameters and comparisons do; a float does not."""
    if isinstance(s, Const):
        return not isinstance(s.value, float)
    if isinstance(s, Load):
        return s.ref.dtype.kind in "iub"
    if isinstance(s, BinOp):
        return s.op in ("<", "<=", ">", ">=", "==", "!=", "and", "or") or (is_int_scalar(s.a) and is_int_scalar(s.b))
    return True   # a Var: a loop counter, a function parameter, a frame field


def scalar_loads(s: Scalar):
    """Every ``Load`` inside ``s`` (and inside the offsets it reads at)."""
    if isinstance(s, Load):
        yield s
        yield from scalar_loads(s.ref.offset.dynamic) if s.ref.offset.dynamic is not None else ()
    elif isinstance(s, BinOp):
        yield from scalar_loads(s.a)
        yield from scalar_loads(s.b)


def scalar_vars(s: Scalar | None):
    """Every ``Var`` inside ``s``."""
    if isinstance(s, Var):
        yield s
    elif isinstance(s, BinOp):
        yield from scalar_vars(s.a)
        yield from scalar_vars(s.b)
    elif isinstance(s, Load):
        yield from scalar_vars(s.ref.offset.dynamic)


def py_op(op: str):
    return _PY_OPS[op]
