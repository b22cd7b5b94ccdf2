"""Scalar functions of one or two numbers, as CUDA device functions.

These are the ``fn`` that the elementwise kernel factories (``kernels/elementwise.py``)
apply to every element, MiniTorch-style: ``make_map(relu)``, ``make_zip(add)``.
Each is written once and compiles for any numeric dtype the kernel sees.
``sigmoid`` is stable (it never computes ``exp`` of a large positive number).

Use ``math.x`` (not ``from math import x``) so that the simulator can give IEEE
results (``math.log(0.0) == -inf``) like a GPU does.
"""

import math

from pyflow.kernels.jit import jit


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
