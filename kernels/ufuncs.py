"""The elementwise ops as data: the dtypes each takes, the dtype it gives, its device function, its twin.

``kernels/elementwise.py`` turns every entry into a CUDA kernel (``make_map`` /
``make_zip`` of the entry's scalar device function) and a CPU twin (the entry's
numpy function writing into ``out``).  The framework asks the same table for
result dtypes at the call, without arrays: ``unary_result_dtype(op, dtype)`` and
``binary_result_dtype(op, a, b)``.

Result dtypes (the ``result`` rule of an entry):
* ``"numpy"`` - numpy's own (``ufunc.resolve_dtypes``): ``int32 / int32`` is
  float64, ``sin(int8)`` float16, ``uint8 + int8`` int16;
* ``"same"`` - the input's dtype: floor, ceil, round and sign of an integer are
  integers (PyTorch's rule; numpy before 2.3 gave floats for floor and ceil);
* ``"bool"`` - comparisons, logical ops, isnan, isinf.

Accepted dtypes (``kernels/dtypes.py``): arithmetic and math take numbers, not
bool, except ``add`` and ``mul``, which on two bools are logical or and logical and
(numpy's and PyTorch's rule: ``bool + bool`` is bool); comparisons, logical ops, isnan
and isinf take every dtype; the bitwise ops take integers and bool (a float is a
``DTypeError``).  Integer ``floor_divide`` and ``remainder`` by zero give 0 on both
targets (numpy's value).

The device function may depend on the dtype (``DEVICE_KIND`` names the kinds):
``floor`` of an integer is the identity, ``isnan`` of an integer is ``never``.
Unary ops choose by the input's dtype.  A binary op first converts both inputs to
the dtype numpy's loop computes in (``compute_dtype``: ``uint8 % int8`` computes
in int16, ``float32 < int64`` in float64) and chooses by that one.

>>> unary_result_dtype("floor", "int16"), unary_result_dtype("sin", "int8")
(dtype('int16'), dtype('float16'))
>>> binary_result_dtype("logical_and", "float32", "int8"), binary_result_dtype("add", "uint8", "int8")
(dtype('bool'), dtype('int16'))
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import numpy as np

from pyflow.errors import DTypeError
from pyflow.kernels import scalar_ops as ops
from pyflow.kernels.dtypes import BOOL, INTEGER_DTYPES, NUMERIC_DTYPES, SUPPORTED_DTYPES, check_dtype

__all__ = ["UFunc", "UNARY", "BINARY", "COMPARE", "unary_result_dtype", "binary_result_dtype", "compute_dtype",
           "device_function", "lookup", "DEVICE_KIND"]


@dataclasses.dataclass(frozen=True)
class UFunc:
    """One elementwise op: what it accepts and gives, and how each target computes it."""

    name: str
    accepts: tuple            # every input's dtype must be one of these
    result: str               # "numpy", "same" or "bool" (see the module docstring)
    device: dict              # kind of dtype ("bool", "int", "half", "float", "*") -> scalar device function
    twin: Callable            # numpy: twin(*inputs, out=out)
    numpy: np.ufunc           # the ufunc whose dtype rules "numpy" follows (and the reference in tests)


def _relu_cpu(x, out):
    np.maximum(x, np.zeros((), x.dtype), out=out)


def _sigmoid_cpu(x, out):
    # exp(-log(1 + exp(-x))): stable for every x, no overflow warnings
    np.exp(-np.logaddexp(0, -x), out=out)


def _ints_unchanged(ufunc):
    """A rounding twin: integers are already whole (numpy before 2.3 would give floats)."""
    def twin(x, out):
        if np.dtype(x.dtype).kind == "f":
            ufunc(x, out=out)
        else:
            np.copyto(out, x)
    return twin


def _unary(name, fn, ufunc, accepts=NUMERIC_DTYPES, result="numpy", twin=None):
    device = fn if isinstance(fn, dict) else {"*": fn}
    return UFunc(name, accepts, result, device, twin or (lambda x, out: ufunc(x, out=out)), ufunc)


def _binary(name, fn, ufunc, accepts=NUMERIC_DTYPES, result="numpy"):
    device = fn if isinstance(fn, dict) else {"*": fn}
    return UFunc(name, accepts, result, device, ufunc, ufunc)


_ANY = SUPPORTED_DTYPES
_BITS = (BOOL,) + INTEGER_DTYPES
_FLOOR_DIVIDE = {"int": ops.floor_divide_int, "half": ops.floor_divide_half, "float": ops.floor_divide_float}
_REMAINDER = {"int": ops.remainder_int, "half": ops.remainder_half, "float": ops.remainder_float}

UNARY = {u.name: u for u in (
    _unary("neg", ops.neg, np.negative),
    _unary("relu", ops.relu, np.positive, twin=_relu_cpu),
    _unary("sigmoid", ops.sigmoid, np.exp, twin=_sigmoid_cpu),
    _unary("tanh", ops.tanh, np.tanh),
    _unary("exp", ops.exp, np.exp),
    _unary("log", ops.log, np.log),
    _unary("sqrt", ops.sqrt, np.sqrt),
    _unary("abs", ops.absolute, np.absolute),
    _unary("sin", ops.sin, np.sin),
    _unary("cos", ops.cos, np.cos),
    _unary("floor", {"int": ops.identity, "float": ops.floor_float}, np.floor, result="same",
           twin=_ints_unchanged(np.floor)),
    _unary("ceil", {"int": ops.identity, "float": ops.ceil_float}, np.ceil, result="same",
           twin=_ints_unchanged(np.ceil)),
    _unary("round", {"int": ops.identity, "float": ops.rint_float}, np.rint, result="same",
           twin=_ints_unchanged(np.rint)),
    _unary("sign", ops.sign, np.sign, result="same"),
    _unary("isnan", {"int": ops.never, "float": ops.isnan}, np.isnan, accepts=_ANY, result="bool"),
    _unary("isinf", {"int": ops.never, "float": ops.isinf}, np.isinf, accepts=_ANY, result="bool"),
    _unary("logical_not", ops.logical_not, np.logical_not, accepts=_ANY, result="bool"),
    _unary("bitwise_not", {"bool": ops.logical_not, "int": ops.invert}, np.invert, accepts=_BITS),
)}
BINARY = {b.name: b for b in (
    _binary("add", {"bool": ops.logical_or, "*": ops.add}, np.add, accepts=_ANY),
    _binary("sub", ops.sub, np.subtract),
    _binary("mul", {"bool": ops.logical_and, "*": ops.mul}, np.multiply, accepts=_ANY),
    _binary("div", ops.div, np.true_divide),
    _binary("max", ops.maximum, np.maximum),
    _binary("min", ops.minimum, np.minimum),
    _binary("pow", ops.power, np.power),
    _binary("floor_divide", _FLOOR_DIVIDE, np.floor_divide),
    _binary("remainder", _REMAINDER, np.remainder),
    _binary("bitwise_and", ops.bitwise_and, np.bitwise_and, accepts=_BITS),
    _binary("bitwise_or", ops.bitwise_or, np.bitwise_or, accepts=_BITS),
    _binary("bitwise_xor", ops.bitwise_xor, np.bitwise_xor, accepts=_BITS),
    _binary("logical_and", ops.logical_and, np.logical_and, accepts=_ANY, result="bool"),
    _binary("logical_or", ops.logical_or, np.logical_or, accepts=_ANY, result="bool"),
    _binary("logical_xor", ops.logical_xor, np.logical_xor, accepts=_ANY, result="bool"),
)}
COMPARE = {c.name: c for c in (
    _binary("eq", ops.eq, np.equal, accepts=_ANY, result="bool"),
    _binary("ne", ops.ne, np.not_equal, accepts=_ANY, result="bool"),
    _binary("lt", ops.lt, np.less, accepts=_ANY, result="bool"),
    _binary("le", ops.le, np.less_equal, accepts=_ANY, result="bool"),
    _binary("gt", ops.gt, np.greater, accepts=_ANY, result="bool"),
    _binary("ge", ops.ge, np.greater_equal, accepts=_ANY, result="bool"),
)}

# A dtype's kind for choosing a device function; a kind missing from an entry falls back.
DEVICE_KIND = {"b": "bool", "i": "int", "u": "int", "f": "float"}
_FALLBACK = {"bool": "int", "half": "float", "int": "*", "float": "*"}


def lookup(op: str) -> UFunc:
    """The table entry of ``op``; ``KeyError`` listing the elementwise ops."""
    found = UNARY.get(op) or BINARY.get(op) or COMPARE.get(op)
    if found is None:
        raise KeyError(f"no elementwise op {op!r}; known: {', '.join(sorted({**UNARY, **BINARY, **COMPARE}))}")
    return found


def device_function(op: str, dtype):
    """The scalar device function computing ``op`` for ``dtype`` (the input's, or a binary op's result)."""
    dtype = np.dtype(dtype)
    kind = "half" if dtype == np.float16 else DEVICE_KIND[dtype.kind]
    table = lookup(op).device
    while kind not in table:
        kind = _FALLBACK[kind]
    return table[kind]


@functools.lru_cache(maxsize=None)
def unary_result_dtype(op: str, dtype) -> np.dtype:
    """The dtype ``op`` gives on ``dtype``; ``DTypeError`` (naming op and dtype) if it takes no such input."""
    u = lookup(op)
    dtype = check_dtype(op, dtype, u.accepts)
    if u.result == "same":
        return dtype
    if u.result == "bool":
        return BOOL
    return u.numpy.resolve_dtypes((dtype, None))[1]


@functools.lru_cache(maxsize=None)
def binary_result_dtype(op: str, a, b) -> np.dtype:
    """The dtype ``op`` gives on ``a`` and ``b`` (numpy's promotion; comparisons and logical ops: bool)."""
    u = lookup(op)
    if u.name in UNARY:
        raise DTypeError(f"{op}: is a unary op; use unary_result_dtype")
    a = check_dtype(op, a, u.accepts)
    b = check_dtype(op, b, u.accepts)
    if u.result == "bool":
        return BOOL
    return u.numpy.resolve_dtypes((a, b, None))[2]


@functools.lru_cache(maxsize=None)
def compute_dtype(op: str, a, b) -> np.dtype:
    """The dtype a binary op converts both inputs to before computing: numpy's loop dtype."""
    binary_result_dtype(op, a, b)  # the checks
    return lookup(op).numpy.resolve_dtypes((np.dtype(a), np.dtype(b), None))[0]
