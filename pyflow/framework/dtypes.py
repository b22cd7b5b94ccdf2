"""PyTorch's dtypes and type promotion, written once for the whole eager API.

**Dtypes.**  Exactly the kernels' list (``pyflow.kernels.dtypes``): bool, uint8,
int8, int16, int32, int64, float16, float32, float64.  Anything else (``object``,
strings, complex, datetimes) is a ``DTypeError`` at the call, so such data never
reaches a kernel.

**Promotion** (``torch.result_type``).  Dtypes fall in three *categories*,
bool < integer < floating.  The operands of an op fall in three *priority
classes*: tensors with dimensions, zero-dim tensors, Python scalars.  Each class
promotes within itself (``promote_types``); then a lower class counts only if it
is of a higher category than the classes above it.  A Python float counts as the
default float32, a Python int as int64, a bool as bool:

>>> import numpy as np
>>> from pyflow.framework.op_registry import TensorMeta as T
>>> f32, f64, i64 = (np.dtype(t) for t in ("float32", "float64", "int64"))
>>> result_type(T((2,), f32), T((), f64))        # a 0-d tensor does not widen a float tensor
dtype('float32')
>>> result_type(T((2,), i64), 2.5), result_type(T((2,), np.dtype("uint8")), T((2,), np.dtype("int8")))
(dtype('float32'), dtype('int16'))

The interpreter casts every operand to the computed dtype before the kernel
runs (``OpDef.promote_inputs``), so kernels only ever see equal dtypes.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from pyflow.errors import ArgumentTypeError, DTypeError
from pyflow.kernels.dtypes import SUPPORTED_DTYPES

__all__ = ["SUPPORTED_DTYPES", "DEFAULT_FLOAT", "DEFAULT_INT", "BOOL", "as_dtype", "category", "is_scalar",
           "promote_types", "result_type", "can_cast", "scalar_dtype", "to_scalar", "names"]

DEFAULT_FLOAT = np.dtype(np.float32)   # torch.get_default_dtype()
DEFAULT_INT = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)
_BOOL, _INTEGER, _FLOATING = 0, 1, 2   # the categories, in order


def names(dtypes=SUPPORTED_DTYPES) -> str:
    return ", ".join(str(d) for d in dtypes)


def as_dtype(dtype, op: str) -> np.dtype:
    """``dtype`` (a numpy dtype, type or name) as a supported numpy dtype; ``DTypeError`` naming ``op``."""
    try:
        found = np.dtype(dtype)
    except TypeError:
        raise DTypeError(f"{op}: {dtype!r} is not a dtype; supported: {names()}") from None
    if found not in SUPPORTED_DTYPES:
        raise DTypeError(f"{op}: unsupported dtype {found}; supported: {names()}")
    return found


def category(dtype) -> int:
    """0 for bool, 1 for the integers, 2 for the floats."""
    kind = np.dtype(dtype).kind
    return _BOOL if kind == "b" else _FLOATING if kind == "f" else _INTEGER


def is_scalar(value) -> bool:
    """A Python or numpy number (what torch calls a wrapped number); not a tensor or an array."""
    return isinstance(value, (numbers.Number, np.bool_)) and not isinstance(value, np.ndarray)


def scalar_dtype(value) -> np.dtype:
    """The dtype a Python scalar counts as in promotion: bool, int64, or the default float32."""
    if isinstance(value, (bool, np.bool_)):
        return BOOL
    if isinstance(value, numbers.Integral):
        return DEFAULT_INT
    if isinstance(value, numbers.Real):
        return DEFAULT_FLOAT
    raise DTypeError(f"{type(value).__name__} values are not supported; supported dtypes: {names()}")


def promote_types(a, b) -> np.dtype:
    """``torch.promote_types``: the smallest dtype both convert to (across categories: the higher one)."""
    a, b = np.dtype(a), np.dtype(b)
    if a == b:
        return a
    ca, cb = category(a), category(b)
    if ca != cb:
        return a if ca > cb else b
    return np.promote_types(a, b)   # same category: numpy agrees with torch (uint8 + int8 -> int16)


def _combine(higher, lower):
    """Let a lower priority class's dtype count only if it is of a higher category."""
    if higher is None:
        return lower
    if lower is None or category(higher) == _FLOATING:
        return higher
    if higher == BOOL or category(lower) == _FLOATING:
        return promote_types(higher, lower)
    return higher


def result_type(*operands) -> np.dtype:
    """``torch.result_type`` over tensors (anything with ``shape`` and ``dtype``) and Python scalars."""
    classes = [None, None, None]   # dimensioned tensors, zero-dim tensors, scalars
    for x in operands:
        if is_scalar(x):
            k, dtype = 2, scalar_dtype(x)
        else:
            k, dtype = (0 if len(x.shape) else 1), np.dtype(x.dtype)
        classes[k] = dtype if classes[k] is None else promote_types(classes[k], dtype)
    found = _combine(classes[0], _combine(classes[1], classes[2]))
    if found is None:
        raise ArgumentTypeError("result_type: needs at least one operand")
    return found


def can_cast(source, target) -> bool:
    """``torch.can_cast``: an op's result may be written to a tensor of ``target`` (no lower category)."""
    return category(source) <= category(target)


def to_scalar(value, dtype, op: str):
    """``value`` as a numpy scalar of ``dtype``, refusing what would be silent nonsense.

    ``None``, strings and other objects are an ``ArgumentTypeError``; complex values,
    NaN or infinity into an integer, and values out of the dtype's range are a
    ``DTypeError``.  A float into an integer truncates toward zero, as in torch.
    """
    dtype = np.dtype(dtype)
    if not is_scalar(value):
        raise ArgumentTypeError(f"{op}: the value must be a number (bool, int or float), "
                                f"got {value!r} of type {type(value).__name__}")
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
        raise DTypeError(f"{op}: complex value {value!r}; supported dtypes: {names()}")
    if dtype == BOOL:
        return np.bool_(bool(value))
    if dtype.kind in "iu":
        if isinstance(value, numbers.Integral):
            number = int(value)
        elif not math.isfinite(float(value)):
            raise DTypeError(f"{op}: cannot convert {value!r} to {dtype}")
        else:
            number = math.trunc(float(value))
        info = np.iinfo(dtype)
        if not info.min <= number <= info.max:
            raise DTypeError(f"{op}: value {value!r} is out of range for {dtype} ({info.min} to {info.max})")
        return dtype.type(number)
    with np.errstate(over="ignore"):
        converted = dtype.type(value)
    if math.isfinite(float(value)) and not np.isfinite(converted):
        raise DTypeError(f"{op}: value {value!r} overflows {dtype} (largest {np.finfo(dtype).max})")
    return converted
