"""The uTask lowerings of flow ops: how each op runs inside a Cocktailer persistent kernel.

A lowering is ``lowering(trace, inputs, attrs) -> [TracedTensor]``: it appends the op's
``UOperator`` s to the statement ``trace`` is recording and returns the results.  It runs
after the op's own inference accepted the call (``lowering.py``), so it only decides *how*:
which device function of ``kernels/utask/`` and how the work splits into uTasks.  The
lowerings here call the builders of ``ops.py`` (the same uOperators ``cocktailer.relu`` and
friends emit), so a program written with flow ops is the very program written with
``cocktailer`` ops.  A case an op allows but no uTask does (broadcasting other than a row,
a softmax over another dim than the last) is a ``TraceError`` naming the op.

Each is set on its OpDef at import (``op_registry.register_lowering``), so ``get_op(name)``
says whether an op can run inside a persistent kernel:

    >>> import pyflow.cocktailer  # noqa: F401  (attaches the lowerings)
    >>> from pyflow.framework.op_registry import get_op
    >>> get_op("relu").utask_lowering is not None, get_op("cumsum").utask_lowering
    (True, None)
"""

from __future__ import annotations

import math

import pyflow.ops  # noqa: F401  (registers the ops lowered here)
from pyflow.cocktailer import ops
from pyflow.cocktailer.ir import TensorRef
from pyflow.cocktailer.trace import TracedTensor, TraceError
from pyflow.framework.op_registry import OP_REGISTRY, get_op, register_lowering
from pyflow.kernels.layout import contiguous_strides, normalize_axes, normalize_axis

__all__ = ["UNARY", "BINARY", "COMMUTATIVE"]

UNARY = ("tanh", "sigmoid", "relu", "exp", "neg")
BINARY = {"add": "add", "sub": "sub", "mul": "mul", "max": "maximum"}   # flow op -> ops.py's name
COMMUTATIVE = ("add", "mul", "max")


def _tensors(name: str, inputs) -> list:
    for x in inputs:
        if not isinstance(x, TracedTensor):
            raise TraceError(f"op {name!r}: a Python number as an operand has no uTask lowering; make it a "
                             f"tensor input of the program (got {x!r})")
    return list(inputs)


def _unary(name: str):
    def lower(trace, inputs, attrs):
        return [ops._unary(name, *_tensors(name, inputs))]
    return lower


def _is_row(row: TracedTensor, of: TracedTensor) -> bool:
    return len(row.shape) == 1 and len(of.shape) >= 1 and of.shape[-1] == row.shape[0]


def _binary(name: str):
    def lower(trace, inputs, attrs):
        a, b = _tensors(name, inputs)
        if a.shape != b.shape and _is_row(a, b) and name in COMMUTATIVE:
            a, b = b, a   # the uTask broadcasts its second operand
        if a.shape != b.shape and not _is_row(b, a):
            raise TraceError(f"op {name!r}: broadcasting {list(a.shape)} with {list(b.shape)} has no uTask "
                             "lowering (same shapes, or a row of the last dim)")
        return [ops._binary(BINARY[name], a, b)]
    return lower


def _matmul(trace, inputs, attrs):
    a, b = _tensors("matmul", inputs)
    if len(a.shape) not in (2, 3) or len(b.shape) != len(a.shape) or a.shape[:-2] != b.shape[:-2]:
        raise TraceError(f"op 'matmul': {list(a.shape)} @ {list(b.shape)} has no uTask lowering ((M, K) @ (K, N), "
                         "or both batched alike)")
    return [ops.matmul(a, b)]


def _trailing(name: str, x: TracedTensor, axes: tuple) -> TracedTensor:
    """``x`` viewed as rows whose width is the product of ``axes``, which must be its last dims."""
    ndim = len(x.shape)
    if not axes or axes != tuple(range(ndim - len(axes), ndim)):
        raise TraceError(f"op {name!r}: reducing dims {list(axes)} of {list(x.shape)} has no uTask lowering "
                         "(only the last dims)")
    rows = x.shape[:ndim - len(axes)]
    return TracedTensor(x.ref.reshaped(rows + (math.prod(x.shape[ndim - len(axes):]),)), x.readonly)


def _row_reduction(name: str, row_op):
    def lower(trace, inputs, attrs):
        (x,) = _tensors(name, inputs)
        return [row_op(_trailing(name, x, normalize_axes(attrs.get("axis"), len(x.shape), name)))]
    return lower


def _softmax(trace, inputs, attrs):
    (x,) = _tensors("softmax", inputs)
    if normalize_axis(attrs.get("axis", -1), len(x.shape), "softmax") != len(x.shape) - 1:
        raise TraceError(f"op 'softmax': over dim {attrs.get('axis')} of {list(x.shape)} has no uTask lowering "
                         "(only the last dim)")
    return [ops.softmax_rows(x)]


def _cat(trace, inputs, attrs):
    tensors = _tensors("cat", inputs)
    if tensors[0].shape and attrs.get("axis", 0) != 0:
        raise TraceError(f"op 'cat': along dim {attrs.get('axis')} has no uTask lowering (only dim 0)")
    return [ops.cat(tensors)]


def _fill(trace, inputs, attrs):
    if attrs["value"] != 0:
        raise TraceError(f"op 'fill': filling with {attrs['value']!r} has no uTask lowering (only zeros)")
    return [ops.zeros(attrs["shape"], dtype=attrs["dtype"])]


def _view(name: str):
    """A view op inside a program: the op's own layout rule (``OpDef.view``) on the input's contiguous
    layout; the result must be contiguous again (a uTask reads a contiguous run of elements)."""
    layout = get_op(name).view

    def lower(trace, inputs, attrs):
        (x,) = _tensors(name, inputs)
        shape, strides, offset = layout(x.shape, contiguous_strides(x.shape), 0, attrs)
        if any(n > 1 and s != c for n, s, c in zip(shape, strides, contiguous_strides(shape))):
            raise TraceError(f"op {name!r}: its result over {list(x.shape)} is not contiguous; a view inside a "
                             "program must be (reshape, narrow of dim 0, squeeze, unsqueeze)")
        ref = x.ref
        return [TracedTensor(TensorRef(ref.buffer, tuple(shape), ref.offset + offset, ref.bounds), x.readonly)]
    return lower


def _register() -> None:
    for name in UNARY:
        register_lowering(name, _unary(name))
    for name in BINARY:
        register_lowering(name, _binary(name))
    register_lowering("matmul", _matmul)
    register_lowering("reduce_sum", _row_reduction("reduce_sum", ops.sum_rows))
    register_lowering("reduce_max", _row_reduction("reduce_max", ops.max_rows))
    register_lowering("softmax", _softmax)
    register_lowering("cat", _cat)
    register_lowering("fill", _fill)
    for name in [n for n, op in OP_REGISTRY.items() if op.view is not None]:
        register_lowering(name, _view(name))


_register()
