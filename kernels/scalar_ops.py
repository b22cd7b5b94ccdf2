"""Scalar functions of one or two numbers, as CUDA device functions.

These are the ``fn`` that the elementwise kernel factories (``kernels/elementwise.py``)
apply to every element, MiniTorch-style: ``make_map(relu)``, ``make_zip(add)``.
Each is written once and compiles for any numeric dtype the kernel sees.
``sigmoid`` is stable (it never computes ``exp`` of a large positive number).

Use ``math.x`` (not ``from math import x``) so that the simulator can give IEEE
results (``math.log(0.0) == -inf``) like a GPU does.

Some ops need one function per kind of dtype (``kernels/ufuncs.py`` picks it):
* ``floor``, ``ceil``, ``rint`` of a float are written with ``int()``: the
  simulator's ``math.floor`` returns a Python int and raises on inf and NaN, where
  the GPU's returns a float.  NaN, inf and floats of 2**52 or more are already
  integers and come back unchanged; a zero result keeps the sign of ``x``, as in
  IEEE (``ceil(-0.5) == -0.0``).
* ``floor_divide`` / ``remainder`` of floats follow numpy's algorithm (from
  ``fmod``); of integers, Python's floor rules with 0 for a zero divisor (numpy's
  value, never a crash).  float16 computes in float32 and rounds once, as numpy
  does (``*_half``): ``numba.float32(x)`` converts on both backends.  A zero
  result gets its sign from ``copysign`` (numpy's rule), the same everywhere; a
  NaN made here (``inf // 2``, ``x % 0``) gets the hardware's sign bit, which
  IEEE 754 leaves open: set on x86 (numpy, the simulator); a GPU may give its
  canonical NaN, sign clear (float16 did on an H200).
* ``isnan`` / ``isinf`` of an integer or bool is ``never``; ``bitwise_not`` of a
  bool is ``logical_not`` (``~True`` is -2 in Python and Numba).
"""

import math

import numba

from pyflow.kernels.jit import jit

_INTEGRAL = 4503599627370496.0   # 2**52: every float this large is an integer (so is inf)


@jit(device=True)
def identity(x):
    return x


@jit(device=True)
def neg(x):
    return -x


@jit(device=True)
def relu(x):
    # 0 for every non-positive x (also -0.0 and -inf), NaN stays NaN, like numpy's maximum(x, 0)
    return 0 if x <= 0 else x


@jit(device=True)
def sigmoid(x):
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


@jit(device=True)
def tanh(x):
    return math.tanh(x)


@jit(device=True)
def exp(x):
    return math.exp(x)


@jit(device=True)
def log(x):
    return math.log(x)


@jit(device=True)
def sqrt(x):
    return math.sqrt(x)


@jit(device=True)
def absolute(x):
    return abs(x)


@jit(device=True)
def add(x, y):
    return x + y


@jit(device=True)
def sub(x, y):
    return x - y


@jit(device=True)
def mul(x, y):
    return x * y


@jit(device=True)
def div(x, y):
    return x / y


@jit(device=True)
def maximum(x, y):
    # numpy's maximum propagates NaN from either side
    if x != x:
        return x
    return x if x >= y else y


@jit(device=True)
def minimum(x, y):
    if x != x:
        return x
    return x if x <= y else y


@jit(device=True)
def power(x, y):
    return x**y


@jit(device=True)
def sin(x):
    return math.sin(x)


@jit(device=True)
def cos(x):
    return math.cos(x)


@jit(device=True)
def floor_float(x):
    if not abs(x) < _INTEGRAL:  # NaN, inf, or already an integer
        return x
    t = int(x)  # rounds toward zero
    f = t if t <= x else t - 1
    return x * 0 if f == 0 else f  # x * 0: a zero with x's sign (floor(-0.0) == -0.0)


@jit(device=True)
def ceil_float(x):
    if not abs(x) < _INTEGRAL:
        return x
    t = int(x)
    c = t if t >= x else t + 1
    return x * 0 if c == 0 else c


@jit(device=True)
def rint_float(x):
    """The nearest integer, ties to the even one (numpy's rint and round, PyTorch's round)."""
    if not abs(x) < _INTEGRAL:
        return x
    f = int(x)
    if f > x:
        f -= 1
    rest = x - f  # in [0, 1), exact
    if rest > 0.5 or (rest == 0.5 and f % 2 != 0):
        f += 1
    return x * 0 if f == 0 else f


@jit(device=True)
def sign(x):
    # numpy's sign: -1, 0 (also for -0.0) or 1; NaN stays NaN
    if x > 0:
        return 1
    if x < 0:
        return -1
    if x != x:
        return x
    return 0


@jit(device=True)
def isnan(x):
    return x != x


@jit(device=True)
def isinf(x):
    return x == math.inf or x == -math.inf


@jit(device=True)
def never(x):
    """isnan and isinf of an integer or bool."""
    return False


@jit(device=True)
def nonzero(x):
    """A number as a bool (casting to bool): NaN is True, as in numpy."""
    return x != 0


@jit(device=True)
def through_float32(x):
    """A float16 widened to float32 before it is stored into an integer: numba-cuda 0.30's own float16 ->
    integer conversion rounds to nearest (2.738 -> 3 on an H200, 2026-11-28), where C and numpy truncate
    toward zero (2); float32 -> integer truncates, and the widening is exact."""
    return numba.float32(x)


@jit(device=True)
def logical_not(x):
    return x == 0


@jit(device=True)
def invert(x):
    return ~x


@jit(device=True)
def logical_and(x, y):
    return x != 0 and y != 0


@jit(device=True)
def logical_or(x, y):
    return x != 0 or y != 0


@jit(device=True)
def logical_xor(x, y):
    return (x != 0) != (y != 0)


@jit(device=True)
def bitwise_and(x, y):
    return x & y


@jit(device=True)
def bitwise_or(x, y):
    return x | y


@jit(device=True)
def bitwise_xor(x, y):
    return x ^ y


@jit(device=True)
def floor_divide_int(x, y):
    # floor(x / y) (Python's // on both backends); numpy's 0 for a zero divisor
    if y == 0:
        return 0
    return x // y


@jit(device=True)
def remainder_int(x, y):
    # x - y * floor(x / y): the sign of the divisor (Python's %); 0 for a zero divisor
    if y == 0:
        return 0
    return x % y


@jit(device=True)
def floor_divide_float(x, y):
    """numpy's floor_divide: q with x == q * y + r, r from fmod, q snapped to an integer."""
    if y == 0:
        return x / y  # IEEE: inf with the sign of x / y, NaN for 0 / 0
    r = math.fmod(x, y)
    q = (x - r) / y  # very nearly an integer
    if r != 0 and (y < 0) != (r < 0):
        q -= 1
    if q == 0:
        return math.copysign(0.0, x / y)
    f = floor_float(q)
    if q - f > 0.5:
        f += 1
    return f


@jit(device=True)
def remainder_float(x, y):
    """numpy's remainder: fmod moved into the divisor's sign; NaN for a zero divisor."""
    r = math.fmod(x, y)
    if y == 0:
        return r
    if r != 0:
        if (y < 0) != (r < 0):
            r += y
    else:
        r = math.copysign(0.0, y)
    return r


@jit(device=True)
def floor_divide_half(x, y):
    return floor_divide_float(numba.float32(x), numba.float32(y))


@jit(device=True)
def remainder_half(x, y):
    return remainder_float(numba.float32(x), numba.float32(y))


@jit(device=True)
def keep(total, count):
    """A reduction's last step when the combined value is the result (sum, max, min)."""
    return total


@jit(device=True)
def divide(total, count):
    """A reduction's last step for a mean: total / count (in the caller's dtype)."""
    return total / count


@jit(device=True)
def eq(x, y):
    return x == y


@jit(device=True)
def ne(x, y):
    return x != y


@jit(device=True)
def lt(x, y):
    return x < y


@jit(device=True)
def le(x, y):
    return x <= y


@jit(device=True)
def gt(x, y):
    return x > y


@jit(device=True)
def ge(x, y):
    return x >= y
