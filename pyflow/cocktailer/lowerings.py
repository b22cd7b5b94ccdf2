"""The uTask lowerings of flow ops: how each op runs inside a Cocktailer persistent kernel.

A lowering is ``lowering(trace, inputs, attrs) -> [TracedTensor]``: it appends the op's
``UOperator`` s to the statement ``trace`` is recording and returns the results.  It runs
after the op's own inference accepted the call (``lowering.py``), so it only decides *how*:
which device function of ``kernels/utask/`` and how the work splits into uTasks.  The
lowerings here call the uOperator builders of ``ops.py`` (and ``model_ops.py``, ``conv_ops.py``).
A case an op allows but no uTask does (broadcasting other than a row, a softmax over another
dim than the last) is a ``TraceError`` naming the op.  ``x.clone()`` (the ``contiguous`` op) is a
copy uOperator: a value of its own, e.g. to ``cocktailer.update`` in place.

``flow.nn.functional.linear(x, w, b)`` is ``x.matmul(w.T) + b`` (as in PyTorch), three ops, and
runs as ONE uOperator, ``ops.linear``'s: ``w.T`` of a 2-D tensor is a ``TransposedView``
(not contiguous, so no uTask reads it as a tensor; only matmul's second operand may be one), the
matmul reads it as the tiled matmul's ``transpose_b`` operand (OneFlow's ``matmul`` has that
attr), and an ``add`` of a bias row right after fuses into that uOperator (OneFlow's
``fused_matmul_bias``, what its ``linear`` calls): the bias is added as each tile is stored.
The product before the bias is then stale (its memory holds the sum), as after ``update``.
Likewise ``x * scale`` (a Python number) is a ``ScaledView`` that only ``flow.softmax(.., -1)``
reads (the scaled-softmax uOperator); ``a @ b`` with broadcast batch dims, or ``b`` a batched
transpose, is ``model_ops.batched_matmul``'s uOperator; ``F.conv2d`` (no bias) and the pools
(square windows) are ``conv_ops``'.

Each is set on its OpDef at import (``op_registry.register_lowering``), so ``get_op(name)``
says whether an op can run inside a persistent kernel:

    >>> import pyflow.cocktailer  # noqa: F401  (attaches the lowerings)
    >>> from pyflow.framework.op_registry import get_op
    >>> get_op("relu").utask_lowering is not None, get_op("cumsum").utask_lowering
    (True, None)
"""

from __future__ import annotations

import math
import numbers

import pyflow.ops  # noqa: F401  (registers the ops lowered here)
from pyflow.cocktailer import conv_ops, ops
from pyflow.cocktailer.ir import TensorRef
from pyflow.cocktailer.model_ops import batched_matmul, scaled_softmax_rows
from pyflow.cocktailer.trace import TracedTensor, TraceError
from pyflow.framework.op_registry import OP_REGISTRY, get_op, register_lowering
from pyflow.kernels.layout import contiguous_strides, normalize_axes, normalize_axis

__all__ = ["UNARY", "BINARY", "COMMUTATIVE", "LazyView", "TransposedView", "ScaledView", "LinearProduct"]

UNARY = ("tanh", "sigmoid", "relu", "exp", "neg")
BINARY = {"add": "add", "sub": "sub", "mul": "mul", "max": "maximum"}   # flow op -> ops.BINARY's name
COMMUTATIVE = ("add", "mul", "max")


class LazyView(TracedTensor):
    """A value of ``base`` that no buffer holds (a transpose, a scaled copy): one op reads it as an
    operand of its uTask (the matmul's ``transpose_b``, the softmax's scale); any other use is a
    ``TraceError`` saying which, since no uTask could read it as a tensor."""

    __slots__ = ("base",)
    what = readers = ""   # what it is, which op may read it and how (the error text)

    def __init__(self, base: TracedTensor, ref: TensorRef):
        super().__init__(ref, base.readonly)
        self.base = base

    def _use(self, op: str):
        raise TraceError(f"op {op!r}: reads {self.what}, which no buffer holds; inside a program {self.readers}")


class TransposedView(LazyView):
    """``x.transpose(-1, -2)`` (``w.T``) of a contiguous program tensor: not contiguous, so only matmul
    reads it, as its second operand (the tiled matmul's ``transpose_b``)."""

    __slots__ = ()
    what = "a transpose (w.T)"
    readers = "only matmul's second operand may be one (x @ w.T + b: one linear uOperator)"

    def __init__(self, base: TracedTensor):
        ref = base.ref
        super().__init__(base, TensorRef(ref.buffer, ref.shape[:-2] + ref.shape[:-3:-1], ref.offset, ref.bounds))

    def _use(self, op: str):
        if 1 in self.base.shape[-2:]:   # a dim of one swapped: the same elements in the same order
            self.base._use(op)
            return self.ref
        return super()._use(op)


class ScaledView(LazyView):
    """``x * scale`` (``scale`` a Python number): a uTask has no scalar operand, so only softmax reads
    it, scaling as it loads (``softmax(x * scale, -1)``: one scaled-softmax uOperator, as attention's)."""

    __slots__ = ("scale",)
    what = "x * a Python number"
    readers = "only softmax(x * scale, -1) may read one (make the number a tensor input otherwise)"

    def __init__(self, base: TracedTensor, scale: float):
        super().__init__(base, base.ref)
        self.scale = scale


class LinearProduct(TracedTensor):
    """``x @ w.T`` as the linear uOperator ``operator`` made it, without a bias yet: an ``add`` of a
    bias row emitted right after it fuses into it (``_fuse_bias``)."""

    __slots__ = ("operator", "x", "w")

    def __init__(self, ref: TensorRef, operator, x: TensorRef, w: TensorRef):
        super().__init__(ref)
        self.operator, self.x, self.w = operator, x, w


def _tensors(name: str, inputs, lazy_ok: dict | None = None) -> list:
    """The operands, checked: tensors of this trace, not stale; a ``LazyView`` only where ``lazy_ok``
    (position -> class) allows one (the lowerings that read ``x.ref`` directly rely on this)."""
    for k, x in enumerate(inputs):
        if not isinstance(x, TracedTensor):
            raise TraceError(f"op {name!r}: a Python number as an operand has no uTask lowering; make it a "
                             f"tensor input of the program (got {x!r})")
        allowed = (lazy_ok or {}).get(k)
        (x.base if allowed is not None and isinstance(x, allowed) else x)._use(name)
    return list(inputs)


def _unary(name: str):
    def lower(trace, inputs, attrs):
        return [ops.unary(name, *_tensors(name, inputs))]
    return lower


def _is_row(row: TracedTensor, of: TracedTensor) -> bool:
    return len(row.shape) == 1 and len(of.shape) >= 1 and of.shape[-1] == row.shape[0]


def _overlaps(x: TensorRef, y: TensorRef) -> bool:
    rx, ry = x.region, y.region
    return x.buffer is y.buffer and (rx is None or ry is None or (rx[0] < ry[1] and ry[0] < rx[1]))


def _fuse_bias(trace, product, bias):
    """``product + bias`` as the bias of the linear uOperator that made ``product``, when that is the
    statement just emitted and ``bias`` a separate row of ``product``'s dtype; else None."""
    items = trace.blocks[-1].items
    if not (isinstance(product, LinearProduct) and items and items[-1] is product.operator
            and _is_row(bias, product) and bias.dtype == product.dtype and not _overlaps(bias.ref, product.ref)):
        return None
    items[-1] = ops.linear_operator(product.ref, product.x, product.w, bias.ref)
    product._stale_by = "its bias add, fused into the matmul that made it (x @ w.T + b: one linear uOperator)"
    return TracedTensor(product.ref)


def _scaled(inputs):
    """``x * scale`` or ``scale * x`` with a Python number: a ``ScaledView`` (no uOperator yet), else None."""
    tensors = [x for x in inputs if isinstance(x, TracedTensor)]
    numbers_ = [x for x in inputs if isinstance(x, numbers.Real) and not isinstance(x, bool)]
    if len(tensors) == 1 and len(numbers_) == 1 and type(tensors[0]) in (TracedTensor, LinearProduct):
        tensors[0]._use("mul")
        return ScaledView(tensors[0], float(numbers_[0]))
    return None


def _binary(name: str):
    def lower(trace, inputs, attrs):
        scaled = _scaled(inputs) if name == "mul" else None
        if scaled is not None:
            return [scaled]
        a, b = _tensors(name, inputs)
        if name == "add":
            for product, bias in ((a, b), (b, a)):
                fused = _fuse_bias(trace, product, bias)
                if fused is not None:
                    return [fused]
        if a.shape != b.shape and _is_row(a, b) and name in COMMUTATIVE:
            a, b = b, a   # the uTask broadcasts its second operand
        if a.shape != b.shape and not _is_row(b, a):
            raise TraceError(f"op {name!r}: broadcasting {list(a.shape)} with {list(b.shape)} has no uTask "
                             "lowering (same shapes, or a row of the last dim)")
        return [ops.binary(BINARY[name], a, b)]
    return lower


def _matmul(trace, inputs, attrs):
    """``x @ w.T`` (w 2-D): the linear uOperator; ``a @ b`` of matrices (batched alike, 3-D): the tiled
    matmul; with broadcast batch dims (``(B, I) @ (8, I, H)``) or a batched transpose: the bmm."""
    a, b = _tensors("matmul", inputs, {1: TransposedView})
    if len(a.shape) < 1 + (len(b.shape) > 2) or len(b.shape) < 2:
        raise TraceError(f"op 'matmul': {list(a.shape)} @ {list(b.shape)} has no uTask lowering (a 1-D operand "
                         "only as x in x @ w.T)")
    if isinstance(b, TransposedView) and len(b.shape) == 2:   # x (..., K), w (N, K)
        product = ops.linear(a, b.base)   # emits the linear uOperator: the last item of the statement list
        return [LinearProduct(product.ref, trace.blocks[-1].items[-1], a.ref, b.base.ref)]
    if isinstance(b, TransposedView):
        return [batched_matmul(a, b.base, transpose_b=True)]
    if len(a.shape) == len(b.shape) <= 3 and a.shape[:-2] == b.shape[:-2]:
        return [ops.matmul(a, b)]
    return [batched_matmul(a, b)]


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
    (x,) = _tensors("softmax", inputs, {0: ScaledView})
    if normalize_axis(attrs.get("axis", -1), len(x.shape), "softmax") != len(x.shape) - 1:
        raise TraceError(f"op 'softmax': over dim {attrs.get('axis')} of {list(x.shape)} has no uTask lowering "
                         "(only the last dim)")
    return [scaled_softmax_rows(x.base, x.scale) if isinstance(x, ScaledView) else ops.softmax_rows(x)]


def _cat(trace, inputs, attrs):
    tensors = _tensors("cat", inputs)
    if tensors[0].shape and attrs.get("axis", 0) != 0:
        raise TraceError(f"op 'cat': along dim {attrs.get('axis')} has no uTask lowering (only dim 0)")
    return [ops.cat(tensors)]


def _fill(trace, inputs, attrs):
    if attrs["value"] != 0:
        raise TraceError(f"op 'fill': filling with {attrs['value']!r} has no uTask lowering (only zeros)")
    return [ops.zeros(attrs["shape"], dtype=attrs["dtype"])]


def _clone(trace, inputs, attrs):
    """``x.clone()``: a copy uOperator (a tensor of its own, as eager's clone)."""
    (x,) = _tensors("contiguous", inputs)
    return [ops.copy(x)]


def _view(name: str):
    """A view op inside a program: the op's own layout rule (``OpDef.view``) on the input's contiguous
    layout; the result must be contiguous again (a uTask reads a contiguous run of elements)."""
    layout = get_op(name).view

    def lower(trace, inputs, attrs):
        (x,) = _tensors(name, inputs)
        shape, strides, offset = layout(x.shape, contiguous_strides(x.shape), 0, attrs)
        n = len(x.shape)
        if name == "permute" and n >= 2 and tuple(attrs["dims"]) == tuple(range(n - 2)) + (n - 1, n - 2):
            return [TransposedView(x)]   # w.T: read by matmul as its transposed second operand
        if any(n > 1 and s != c for n, s, c in zip(shape, strides, contiguous_strides(shape))):
            raise TraceError(f"op {name!r}: its result over {list(x.shape)} is not contiguous; a view inside a "
                             "program must be (reshape, narrow of dim 0, squeeze, unsqueeze)")
        ref = x.ref
        return [TracedTensor(TensorRef(ref.buffer, tuple(shape), ref.offset + offset, ref.bounds), x.readonly)]
    return lower


def _square(name: str, value, what: str):
    """An int, or a pair of equal ints, as one int (the conv/pool uTasks take square windows); None as is."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or value[0] != value[1]:
            raise TraceError(f"op {name!r}: {what} {tuple(value)} has no uTask lowering (only square: one int)")
        value = value[0]
    return value


def _conv2d(trace, inputs, attrs):
    if len(inputs) == 3:
        raise TraceError("op 'conv2d': a bias has no uTask lowering (add it after, or fold it into a batch norm)")
    x, w = _tensors("conv2d", inputs)
    return [conv_ops.conv2d(x, w, stride=_square("conv2d", attrs["stride"], "stride"),
                            padding=_square("conv2d", attrs["padding"], "padding"))]


def _pool(name: str):
    def lower(trace, inputs, attrs):
        (x,) = _tensors(name, inputs)
        kernel, stride, padding = (_square(name, attrs[a], a) for a in ("kernel_size", "stride", "padding"))
        if name == "avg_pool2d":
            if padding != 0:
                raise TraceError(f"op 'avg_pool2d': padding {padding} has no uTask lowering (only 0)")
            return [conv_ops.avg_pool2d(x, kernel, stride)]
        return [conv_ops.max_pool2d(x, kernel, stride, padding)]
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
    register_lowering("contiguous", _clone)
    register_lowering("conv2d", _conv2d)
    for name in ("max_pool2d", "avg_pool2d"):
        register_lowering(name, _pool(name))
    for name in [n for n, op in OP_REGISTRY.items() if op.view is not None]:
        register_lowering(name, _view(name))


_register()
