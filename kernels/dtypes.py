"""The dtypes pyflow's kernels know: the one list, and the groups the op families accept.

Every family imports its dtypes from here (and so does the framework above), so a
dtype is added or removed in one place:

========  ========================================================  =====================================
group     dtypes                                                    accepted by
========  ========================================================  =====================================
all       bool uint8 int8 int16 int32 int64 float16 float32 float64  copy cast fill where, comparisons,
                                                                    logical ops, isnan isinf, reductions,
                                                                    cumsum, topk, movement, indexing
numeric   the same without bool                                     arithmetic and math (add, exp, floor)
integer   uint8 int8 int16 int32 int64                              bitwise ops (with bool)
float     float16 float32 float64
index     int32 int64                                               the indices of gather, index_select,
                                                                    dim_gather, index_copy
========  ========================================================  =====================================

(matmul: float32 float64 int32 int64; conv, pooling and softmax: float32 float64.)

Anything else (``object``, strings, complex, big-endian numbers) is refused with a
``DTypeError`` naming the op and the dtype, before any launch: such an array never
reaches a kernel.

>>> check_dtype("exp", "float16", NUMERIC_DTYPES)
dtype('float16')
>>> check_dtype("exp", object, NUMERIC_DTYPES)
Traceback (most recent call last):
...
pyflow.errors.DTypeError: exp: unsupported dtype object; expected one of uint8, int8, int16, ...
"""

from __future__ import annotations

import numpy as np

from pyflow.errors import DTypeError

__all__ = ["SUPPORTED_DTYPES", "BOOL", "INTEGER_DTYPES", "FLOAT_DTYPES", "NUMERIC_DTYPES", "INDEX_DTYPES",
           "check_dtype", "names", "kernel_constant"]

SUPPORTED_DTYPES = tuple(np.dtype(t) for t in ("bool", "uint8", "int8", "int16", "int32", "int64",
                                               "float16", "float32", "float64"))
BOOL = np.dtype(np.bool_)
INTEGER_DTYPES = tuple(d for d in SUPPORTED_DTYPES if d.kind in "iu")
FLOAT_DTYPES = tuple(d for d in SUPPORTED_DTYPES if d.kind == "f")
NUMERIC_DTYPES = INTEGER_DTYPES + FLOAT_DTYPES
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def names(dtypes) -> str:
    """``"float32, float64"``: dtypes as a readable list for error messages."""
    return ", ".join(str(d) for d in dtypes)


def kernel_constant(dtype, value):
    """``value`` as a constant a kernel can close over; the kernel converts it to ``dtype``.

    numba-cuda 0.30 emits IR that NVVM rejects for a float16 constant (the PTX check
    finds it), so a float16 constant is kept as float32 and a kernel writes
    ``value_type(constant)``, which converts on both backends.
    """
    dtype = np.dtype(dtype)
    return np.float32(value) if dtype == np.float16 else dtype.type(value)


def check_dtype(op: str, dtype, accepted=SUPPORTED_DTYPES, what: str = "dtype") -> np.dtype:
    """``dtype`` as a numpy dtype if ``op`` accepts it, else ``DTypeError`` naming op and dtype."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise DTypeError(f"{op}: {dtype!r} is not a dtype") from None
    if dtype not in accepted:
        raise DTypeError(f"{op}: unsupported {what} {dtype}; expected one of {names(accepted)}")
    return dtype
