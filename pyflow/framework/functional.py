"""The elementwise user functions (``flow.relu``, ``flow.add``, ``flow.where``...) and tensor operators.

Each is a thin call of the interpreter: ``flow.relu(x)`` is ``apply("relu", [x])``
and ``x + 2`` is ``apply("add", [x, 2])``.  Python scalars and mixed dtypes follow
PyTorch's type promotion (``pyflow/framework/dtypes.py``): ``float32 + int64``
is float32, ``int / int`` is float32, ``int_tensor + 2.5`` is float32.

>>> import pyflow as flow
>>> x = flow.tensor([1, -2, 3])
>>> (x / 2).dtype, flow.clamp(x, min=0).tolist(), (x // 2).tolist(), (x % 2).tolist()
(dtype('float32'), [1, 0, 3], [0, -1, 1], [1, 0, 1])
"""

from __future__ import annotations

import numpy as np

from pyflow.errors import ArgumentTypeError, DTypeError
from pyflow.framework import args
from pyflow.framework.args import describe
from pyflow.framework.dtypes import is_scalar
from pyflow.framework.interpreter import apply
from pyflow.framework.tensor import Tensor, as_tensor_like

__all__ = ["relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "neg", "sin", "cos", "floor", "ceil", "round",
           "sign", "isnan", "isinf", "logical_not", "bitwise_not", "add", "sub", "mul", "div", "pow", "maximum",
           "minimum", "floor_divide", "remainder", "bitwise_and", "bitwise_or", "bitwise_xor", "logical_and",
           "logical_or", "logical_xor", "eq", "ne", "lt", "le", "gt", "ge", "matmul", "where", "clamp", "clip",
           "softmax", "log_softmax", "cast", "is_tensor"]


def _unary(name, doc):
    def op(x: Tensor) -> Tensor:
        return apply(name, [args.tensor(x, name)])[0]
    op.__name__, op.__qualname__, op.__doc__ = name, name, doc
    return op


relu = _unary("relu", "max(x, 0), elementwise.")
sigmoid = _unary("sigmoid", "1 / (1 + exp(-x)); integers compute in float32.")
tanh = _unary("tanh", "Elementwise tanh; integers compute in float32.")
exp = _unary("exp", "Elementwise exp; integers compute in float32.")
log = _unary("log", "Natural logarithm; integers compute in float32.")
sqrt = _unary("sqrt", "Square root; integers compute in float32.")
sin = _unary("sin", "Elementwise sine; integers compute in float32.")
cos = _unary("cos", "Elementwise cosine; integers compute in float32.")
abs = _unary("abs", "Absolute value (same dtype).")   # noqa: A001 - torch's name
neg = _unary("neg", "-x (same dtype).")
floor = _unary("floor", "Round down (an integer tensor is returned as is, in a copy).")
ceil = _unary("ceil", "Round up (an integer tensor is returned as is, in a copy).")
round = _unary("round", "Round half to even, as torch.round.")   # noqa: A001
sign = _unary("sign", "-1, 0 or 1 (same dtype).")
isnan = _unary("isnan", "True where x is NaN.")
isinf = _unary("isinf", "True where x is +-inf.")
logical_not = _unary("logical_not", "True where x is zero (or False).")
bitwise_not = _unary("bitwise_not", "~x for integers; logical not for bool.")


def _operands(a, b, op: str) -> list:
    """Two operands, at least one a tensor; lists and arrays become tensors on the tensor's device."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise ArgumentTypeError(f"{op}: needs at least one tensor, got {type(a).__name__} and {type(b).__name__}")
    like = a if isinstance(a, Tensor) else b
    operands = [x if isinstance(x, Tensor) or is_scalar(x) else as_tensor_like(x, like) for x in (a, b)]
    if op in ("sub", "sub_"):
        _refuse_bool_subtraction(operands)
    return operands


def _refuse_bool_subtraction(operands) -> None:
    """PyTorch refuses ``-`` on bools (promotion would silently make ``True - True`` an integer 0)."""
    bools = [isinstance(x, bool) or (isinstance(x, Tensor) and x.dtype == np.bool_) for x in operands]
    if all(bools):
        raise DTypeError("Subtraction, the `-` operator, with two bool tensors is not supported. "
                         "Use the `^` or `logical_xor()` operator instead.")
    if any(bools):
        raise DTypeError("Subtraction, the `-` operator, with a bool tensor is not supported. "
                         "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.")


def _binary(name, kernel, doc):
    def op(input, other) -> Tensor:   # noqa: A002 - torch's argument name
        return apply(kernel, _operands(input, other, name))[0]
    op.__name__, op.__qualname__, op.__doc__ = name, name, doc
    return op


mul = _binary("mul", "mul", "input * other, broadcasting, with PyTorch's type promotion.")
div = _binary("div", "div", "True division: integers give float32.")
pow = _binary("pow", "pow", "input ** other.")   # noqa: A001
maximum = _binary("maximum", "max", "The larger of the two, elementwise (NaN propagates).")
minimum = _binary("minimum", "min", "The smaller of the two, elementwise (NaN propagates).")
floor_divide = _binary("floor_divide", "floor_divide", "input // other (rounded toward -inf, as Python).")
remainder = _binary("remainder", "remainder", "input % other, with the sign of other (as Python).")
bitwise_and = _binary("bitwise_and", "bitwise_and", "input & other (integers and bool).")
bitwise_or = _binary("bitwise_or", "bitwise_or", "input | other (integers and bool).")
bitwise_xor = _binary("bitwise_xor", "bitwise_xor", "input ^ other (integers and bool).")
eq, ne, lt, le, gt, ge = (_binary(n, n, f"Elementwise comparison {n} (a bool tensor).")
                          for n in ("eq", "ne", "lt", "le", "gt", "ge"))


def _logical(name):
    def op(input: Tensor, other: Tensor) -> Tensor:   # noqa: A002
        return apply(name, [args.tensor(input, name), args.tensor(other, name)])[0]
    op.__name__, op.__qualname__, op.__doc__ = name, name, f"Elementwise {name} of truth values (a bool tensor)."
    return op


logical_and, logical_or, logical_xor = (_logical(n) for n in ("logical_and", "logical_or", "logical_xor"))


def times_alpha(other, alpha):
    """``alpha * other`` for ``add``/``sub`` and their in-place twins: a number stays a number
    (``flow.add(x, 2, alpha=3)`` adds 6, as PyTorch), a tensor is multiplied (one more op)."""
    if alpha == 1:
        return other
    return other * alpha if is_scalar(other) else mul(other, alpha)


def add(input, other, *, alpha=1) -> Tensor:   # noqa: A002
    """input + alpha * other."""
    return apply("add", _operands(input, times_alpha(other, alpha), "add"))[0]


def sub(input, other, *, alpha=1) -> Tensor:   # noqa: A002
    """input - alpha * other."""
    return apply("sub", _operands(input, times_alpha(other, alpha), "sub"))[0]


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product with numpy's matmul semantics."""
    return apply("matmul", [args.tensor(a, "matmul"), as_tensor_like(b, a)])[0]


def where(condition: Tensor, input, other) -> Tensor:   # noqa: A002
    """``input`` where ``condition`` else ``other`` (broadcasting; the two promote to one dtype)."""
    like = input if isinstance(input, Tensor) else other if isinstance(other, Tensor) else condition
    values = [x if isinstance(x, Tensor) or is_scalar(x) else as_tensor_like(x, like) for x in (input, other)]
    return apply("where", [args.tensor(condition, "where"), *values])[0]


def _bounds(x, min, max):   # noqa: A002
    given = [(kind, b) for kind, b in (("min", min), ("max", max)) if b is not None]
    if not given:
        raise ArgumentTypeError(f"clamp: at least one of min and max must be given (for {describe(x)})")
    return tuple(kind for kind, _ in given), [b for _, b in given]


def clamp(input: Tensor, min=None, max=None) -> Tensor:   # noqa: A002
    """Elementwise ``min(max(input, min), max)``; either bound may be None, a number or a tensor.

    The result promotes like ``input + bound``: ``clamp(int_tensor, min=0.5)`` is float32.
    """
    kinds, bounds = _bounds(args.tensor(input, "clamp"), min, max)
    return apply("clamp", [input, *bounds], bounds=kinds)[0]


clip = clamp


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    return apply("softmax", [args.tensor(x, "softmax")], axis=dim)[0]


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    return apply("log_softmax", [args.tensor(x, "log_softmax")], axis=dim)[0]


def cast(x: Tensor, dtype) -> Tensor:
    """A copy of ``x`` converted to ``dtype``."""
    return apply("cast", [args.tensor(x, "cast")], dtype=dtype)[0]   # the op checks the dtype


def is_tensor(obj) -> bool:
    """Is ``obj`` a pyflow tensor?"""
    return isinstance(obj, Tensor)


# --- operators (``x + y``, ``2 * x``, ``x == y``): tensor_methods.py sets them on Tensor ---------------------


def binary_method(kernel, reverse=False):
    """The operator method of op ``kernel`` (``reverse``: the reflected one, ``2 - x`` is ``x.__rsub__(2)``)."""
    def op(self, other):
        if not (isinstance(other, Tensor) or is_scalar(other) or isinstance(other, (list, tuple, np.ndarray))):
            if kernel in ("eq", "ne"):
                return NotImplemented   # x == None is False, as for any other object
            raise ArgumentTypeError(f"{kernel}: cannot combine {describe(self)} with {type(other).__name__} "
                                    f"{other!r:.40}")
        operands = _operands(self, other, kernel)
        return apply(kernel, operands[::-1] if reverse else operands)[0]
    return op
