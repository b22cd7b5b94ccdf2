"""Ops that move data: ``cat`` (concatenate along an axis)."""

from __future__ import annotations

from pyflow.errors import DTypeError, ShapeError
from pyflow.framework.op_registry import OpDef, TensorMeta, register_op
from pyflow.kernels.layout import normalize_axis

__all__ = []


def _infer_cat(inputs, attrs):
    if not inputs:
        raise ShapeError("cat: needs at least one tensor")
    first = inputs[0]
    if not first.shape:
        raise ShapeError("cat: zero-dimensional tensors cannot be concatenated")
    axis = normalize_axis(attrs.get("axis", 0), len(first.shape), "cat")
    for other in inputs[1:]:
        if other.dtype != first.dtype:
            raise DTypeError(f"cat: dtypes differ ({first.dtype} and {other.dtype}); cast first")
        if len(other.shape) != len(first.shape) or any(
                a != b for d, (a, b) in enumerate(zip(other.shape, first.shape)) if d != axis):
            shapes = ", ".join(str(t.shape) for t in inputs)
            raise ShapeError(f"cat: shapes {shapes} must match except along axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in inputs)
    return [TensorMeta(tuple(shape), first.dtype)]


def _launch_cat(kernel, outputs, inputs, attrs, stream):
    kernel(outputs[0], inputs, axis=attrs["axis"], stream=stream)


register_op(OpDef("cat", _infer_cat, kernel="concat", launch=_launch_cat, kernel_attrs=("axis",),
                  doc="concatenate along attrs['axis']"))
