"""Matrix product (numpy's matmul semantics: vectors, batches, broadcasting; dtypes promoted as in torch)."""

from __future__ import annotations

from pyflow.framework.op_registry import OpDef, TensorMeta, register_op
from pyflow.kernels.matmul import matmul_result_dtype, matmul_shape

__all__ = []


def _infer_matmul(inputs, attrs):
    a, b = inputs
    return [TensorMeta(matmul_shape(a.shape, b.shape), matmul_result_dtype(a.dtype, b.dtype))]


register_op(OpDef("matmul", _infer_matmul, promote_inputs=(0, 1), doc="a @ b"))
