"""The user-facing functions (``flow.relu``, ``flow.matmul``, ``flow.zeros``...) and tensor methods.

Each is a thin call of the interpreter: ``flow.relu(x)`` is ``apply("relu", [x])``.
Scalars become tensors on the other operand's device with numpy's weak-scalar
dtype rule (``float32_tensor + 1`` stays float32).
"""

from __future__ import annotations

import collections
import threading

import numpy as np

from pyflow.framework.interpreter import apply
from pyflow.framework.tensor import Tensor, as_tensor_like, tensor

__all__ = ["relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "neg", "add", "sub", "mul", "div",
           "pow", "maximum", "minimum", "matmul", "where", "softmax", "log_softmax", "cat", "sum", "mean",
           "max", "min", "argmax", "zeros", "ones", "full", "randn", "rand", "manual_seed", "cast"]

MaxResult = collections.namedtuple("MaxResult", ["values", "indices"])


def _unary(name):
    def op(x: Tensor) -> Tensor:
        return apply(name, [x])[0]
    op.__name__ = name
    op.__doc__ = f"Elementwise {name}."
    return op


relu, sigmoid, tanh, exp, log, sqrt, abs, neg = (_unary(n) for n in
                                                 ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "neg"))


def _binary(name, kernel_name):
    def op(a, b) -> Tensor:
        if not isinstance(a, Tensor):
            a = as_tensor_like(a, b)
        return apply(kernel_name, [a, as_tensor_like(b, a)])[0]
    op.__name__ = name
    op.__doc__ = f"Elementwise {name}, broadcasting like numpy."
    return op


add, sub, mul, div, pow, maximum, minimum = (_binary(n, k) for n, k in (
    ("add", "add"), ("sub", "sub"), ("mul", "mul"), ("div", "div"), ("pow", "pow"), ("maximum", "max"),
    ("minimum", "min")))


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product with numpy's matmul semantics."""
    return apply("matmul", [a, as_tensor_like(b, a)])[0]


def where(condition: Tensor, a, b) -> Tensor:
    """``a`` where ``condition`` else ``b`` (broadcasting)."""
    like = a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else condition
    return apply("where", [condition, as_tensor_like(a, like), as_tensor_like(b, like)])[0]


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    return apply("softmax", [x], axis=dim)[0]


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    return apply("log_softmax", [x], axis=dim)[0]


def cat(tensors, dim: int = 0) -> Tensor:
    """Concatenate along ``dim``."""
    return apply("cat", list(tensors), axis=dim)[0]


def cast(x: Tensor, dtype) -> Tensor:
    return apply("cast", [x], dtype=np.dtype(dtype))[0]


def sum(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001 - torch's name
    return apply("reduce_sum", [x], axis=dim, keepdims=keepdim)[0]


def mean(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return apply("reduce_mean", [x], axis=dim, keepdims=keepdim)[0]


def max(x: Tensor, dim=None, keepdim: bool = False):  # noqa: A001
    """The maximum; with ``dim``, a (values, indices) pair as in torch."""
    values = apply("reduce_max", [x], axis=dim, keepdims=keepdim)[0]
    if dim is None:
        return values
    return MaxResult(values, apply("argmax", [x], axis=dim, keepdims=keepdim)[0])


def min(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    return apply("reduce_min", [x], axis=dim, keepdims=keepdim)[0]


def argmax(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return apply("argmax", [x], axis=dim, keepdims=keepdim)[0]


def _shape(shape) -> tuple:
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)


def full(shape, value, dtype=np.float32, device="cpu") -> Tensor:
    return apply("fill", [], shape=tuple(shape), dtype=np.dtype(dtype), value=value, device=device)[0]


def zeros(*shape, dtype=np.float32, device="cpu") -> Tensor:
    return full(_shape(shape), 0, dtype, device)


def ones(*shape, dtype=np.float32, device="cpu") -> Tensor:
    return full(_shape(shape), 1, dtype, device)


_rng = np.random.default_rng()
_rng_lock = threading.Lock()


def manual_seed(seed: int) -> None:
    """Seed ``randn`` / ``rand``."""
    global _rng
    with _rng_lock:
        _rng = np.random.default_rng(seed)


def randn(*shape, dtype=np.float32, device="cpu") -> Tensor:
    """Standard normal samples (drawn on the host, then copied to ``device``)."""
    with _rng_lock:
        values = _rng.standard_normal(_shape(shape))
    return tensor(values.astype(dtype), device=device)


def rand(*shape, dtype=np.float32, device="cpu") -> Tensor:
    with _rng_lock:
        values = _rng.random(_shape(shape))
    return tensor(values.astype(dtype), device=device)


# --- the same as tensor methods ------------------------------------------------------------

for _name in ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "softmax", "log_softmax", "sum", "mean",
              "max", "min", "argmax", "matmul"):
    setattr(Tensor, _name, globals()[_name])
Tensor.float = lambda self: cast(self, np.float32)
Tensor.double = lambda self: cast(self, np.float64)
Tensor.long = lambda self: cast(self, np.int64)
Tensor.int = lambda self: cast(self, np.int32)
