"""The eager path of a view op (``OpDef.view``: ``permute``, ``reshape``, ``narrow``...; ``pyflow/ops/views.py``).

A view op issues no instruction: its result is the layout the op gives, wrapped over
the input's storage, dependence object and version counter, so the VM orders every
read and write through either together and ``x.T.add_(1)`` changes ``x``.  The
interpreter sends a local view op here (a global one goes through the global
interpreter, which views each rank's piece here); autograd records it as any op.
"""

from __future__ import annotations

from pyflow.framework.op_registry import TensorMeta

__all__ = ["apply_view"]


def apply_view(op, x, attrs: dict, recorder=None):
    """View op ``op`` of local tensor ``x``, checked by the op's inference; ``recorder``: autograd's, to record it."""
    op.infer([TensorMeta(tuple(x.shape), x.dtype)], attrs)
    result = x._view(*op.view(x._blob.shape, x._blob.strides, x._blob.offset, attrs))
    if recorder is not None:
        recorder.after(op.name, op.backward, [x], [result], attrs)
    return result
