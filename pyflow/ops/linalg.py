"""Matrix product (numpy's matmul semantics: vectors, batches, broadcasting; dtypes promoted as in torch).

Backward: for ``y = a @ b``, ``grad_a = g @ b^T`` and ``grad_b = a^T @ g`` on the
last two dims, summed over the batch dims broadcasting added; a 1-D operand is
first made a matrix (a row for ``a``, a column for ``b``), as matmul does.  A
2-D operand laid out column-major (a transposed matrix, as ``linear``'s
``w.T``) gets its gradient column-major too, as PyTorch's ``mm_mat2_backward``
does: ``grad_b = (g^T @ a)^T``, the same products summed in the same order, so
that the gradient reaching ``w`` is contiguous and accumulating it copies no
transposed matrix.  Inside ``nn.Graph.build`` a view knows its run-time layout
(``LazyTensor.stride``), so a compiled step makes the same products.

SBP (2-D): (S0, B) -> S0 (rows), (B, S1) -> S1 (columns), (S1, S0) -> P (the
inner dim: each rank's product is one term of the sum), (P, B) -> P and
(B, P) -> P (linear in each); batched: a batch dim split alike on both
inputs (one broadcast along it stays B).  A 1-D operand: broadcast only.
"""

from __future__ import annotations

from pyflow.framework.op_registry import OpDef, TensorMeta, register_op
from pyflow.framework.sbp import B, P, S, Signature
from pyflow.kernels.matmul import matmul_result_dtype, matmul_shape
from pyflow.ops.grad_rules import sum_to

__all__ = []


def _infer_matmul(inputs, attrs):
    a, b = inputs
    return [TensorMeta(matmul_shape(a.shape, b.shape), matmul_result_dtype(a.dtype, b.dtype))]


def _matmul_signatures(shapes, out_shapes, attrs) -> list:
    a, b = shapes
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return []
    if len(a) == 2 and len(b) == 2:
        return [Signature((S(0), B), (S(0),)), Signature((B, S(1)), (S(1),)), Signature((S(1), S(0)), (P,)),
                Signature((P, B), (P,)), Signature((B, P), (P,))]
    (out,) = out_shapes
    found = []
    for d in range(len(out) - 2):  # batch dims split alike on both
        ka, kb = d - (len(out) - len(a)), d - (len(out) - len(b))
        sa = S(ka) if ka >= 0 and a[ka] == out[d] and out[d] != 1 else B
        sb = S(kb) if kb >= 0 and b[kb] == out[d] and out[d] != 1 else B
        if sa.is_split or sb.is_split:
            found.append(Signature((sa, sb), (S(d),)))
    return found


def _column_major(t) -> bool:
    """Is ``t`` a 2-D local matrix laid out column-major (the transpose of a contiguous one), rows > 1?

    A global tensor never is: its pieces may differ in layout from rank to rank, and every rank must
    record the same ops.

    >>> import pyflow as flow
    >>> w = flow.zeros(3, 4)
    >>> _column_major(w), _column_major(w.T), _column_major(w.T.contiguous())
    (False, True, False)
    """
    if t.ndim != 2 or t.shape[0] < 2 or t.shape[1] < 2 or t.is_global:
        return False
    strides = t.stride()
    return strides[0] == 1 and strides[1] == t.shape[0]


def _matmul_rule(ctx, g):
    a, b = ctx.inputs
    a2 = a.unsqueeze(0) if a.ndim == 1 else a          # (..., n, k)
    b2 = b.unsqueeze(-1) if b.ndim == 1 else b         # (..., k, m)
    batch = g.shape[:g.ndim - (a.ndim > 1) - (b.ndim > 1)]
    g2 = g.reshape(*batch, a2.shape[-2], b2.shape[-1])  # (..., n, m)
    grads = [None, None]
    if ctx.needs_grad(0):
        if _column_major(a):   # (b @ g^T)^T: a column-major gradient for a column-major a
            grads[0] = sum_to(b2.matmul(g2.transpose(-1, -2)), a.shape[::-1]).transpose(0, 1)
        else:
            grads[0] = sum_to(g2.matmul(b2.transpose(-1, -2)), a2.shape).reshape(a.shape)
    if ctx.needs_grad(1):
        if _column_major(b):   # (g^T @ a)^T: a column-major gradient for a column-major b
            grads[1] = sum_to(g2.transpose(-1, -2).matmul(a2), b.shape[::-1]).transpose(0, 1)
        else:
            grads[1] = sum_to(a2.transpose(-1, -2).matmul(g2), b2.shape).reshape(b.shape)
    return grads


register_op(OpDef("matmul", _infer_matmul, promote_inputs=(0, 1), sbp_signatures=_matmul_signatures,
                  backward=_matmul_rule, doc="a @ b"))
