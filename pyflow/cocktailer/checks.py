"""The static integers a user hands Cocktailer (seed 001), checked where they are handed over.

A trip count, ``max_iters``, a tensor size, an index, ``threads``, ``blocks``,
``stack_depth``, ``chunk``, ``tile``: each is baked into the traced program or the
generated kernel, so a wrong one must fail *at the call* with the argument's
name, not later in a kernel (``range(2.5)``) or quietly (``int(2.5)`` is 2,
``True`` is 1).  The rule everywhere:

* not an int (``numbers.Integral``: Python and numpy ints; ``bool`` is not one)
  -> ``DTypeError``;
* an int out of its range -> the ``ValueError`` the caller names: ``ShapeError``
  for sizes and counts of the program, ``LaunchConfigError`` for how it runs.

>>> static_int(np.int64(3), "for_loop: the trip count")
3
>>> static_int(2.5, "for_loop: the trip count")
Traceback (most recent call last):
...
pyflow.errors.DTypeError: for_loop: the trip count must be an int, got 2.5 (float)
>>> static_int(-1, "for_loop: the trip count")
Traceback (most recent call last):
...
pyflow.errors.ShapeError: for_loop: the trip count must be an int >= 0, got -1
"""

from __future__ import annotations

import numbers

import numpy as np

from pyflow.errors import DTypeError, ShapeError

__all__ = ["is_int", "static_int"]


def is_int(value) -> bool:
    """A Python or numpy integer, and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def static_int(value, what: str, low: int | None = 0, high: int | None = None, error=ShapeError) -> int:
    """``value`` as an ``int`` if it is one in ``low..high`` (None: no bound); else ``DTypeError`` or ``error``.

    The message names ``what`` and the value.
    """
    if not is_int(value):
        raise DTypeError(f"{what} must be an int, got {value!r} ({type(value).__name__})")
    if (low is not None and value < low) or (high is not None and value > high):
        wanted = f"an int in {low}..{high}" if high is not None else f"an int >= {low}"
        raise error(f"{what} must be {wanted}, got {value!r}")
    return int(value)
