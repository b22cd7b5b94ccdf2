"""Matrix product (numpy's matmul semantics: vectors, batches, broadcasting; dtypes promoted as in torch).

Backward: for ``y = a @ b``, ``grad_a = g @ b^T`` and ``grad_b = a^T @ g`` on the
last two dims, summed over the batch dims broadcasting added; a 1-D operand is
first made a matrix (a row for ``a``, a column for ``b``), as matmul does.
"""

from __future__ import annotations

from pyflow.framework.op_registry import OpDef, TensorMeta, register_op
from pyflow.kernels.matmul import matmul_result_dtype, matmul_shape
from pyflow.ops._grad import sum_to

__all__ = []


def _infer_matmul(inputs, attrs):
    a, b = inputs
    return [TensorMeta(matmul_shape(a.shape, b.shape), matmul_result_dtype(a.dtype, b.dtype))]


def _matmul_rule(ctx, g):
    a, b = ctx.inputs
    a2 = a.unsqueeze(0) if a.ndim == 1 else a          # (..., n, k)
    b2 = b.unsqueeze(-1) if b.ndim == 1 else b         # (..., k, m)
    batch = g.shape[:g.ndim - (a.ndim > 1) - (b.ndim > 1)]
    g2 = g.reshape(*batch, a2.shape[-2], b2.shape[-1])  # (..., n, m)
    grads = [None, None]
    if ctx.needs_grad(0):
        grads[0] = sum_to(g2.matmul(b2.transpose(-1, -2)), a2.shape).reshape(a.shape)
    if ctx.needs_grad(1):
        grads[1] = sum_to(a2.transpose(-1, -2).matmul(g2), b2.shape).reshape(b.shape)
    return grads


register_op(OpDef("matmul", _infer_matmul, promote_inputs=(0, 1), backward=_matmul_rule, doc="a @ b"))
