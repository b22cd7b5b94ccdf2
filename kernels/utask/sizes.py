"""Host-side checks shared by the uTask families: sizes are non-negative ints, granularities positive.

The ``*_utask_count`` functions call these before any arithmetic, so a code
generator that passes a float, a bool or a negative size gets a ``ShapeError``
naming the op instead of a wrong count.

>>> require_sizes("matmul", M=3, N=0)
>>> require_sizes("matmul", M=-1)
Traceback (most recent call last):
...
pyflow.errors.ShapeError: matmul uTasks: M must be an int >= 0, got -1
"""

from __future__ import annotations

import numbers

from pyflow.errors import ShapeError

__all__ = ["require_sizes", "ceil_div"]


def require_sizes(op: str, minimum: int = 0, **sizes) -> None:
    """``ShapeError`` unless every value in ``sizes`` is an int >= ``minimum``."""
    for name, value in sizes.items():
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
            raise ShapeError(f"{op} uTasks: {name} must be an int >= {minimum}, got {value!r}")


def ceil_div(n: int, d: int) -> int:
    """``ceil(n / d)`` for ints (exact, no floats)."""
    return -(-int(n) // int(d))
