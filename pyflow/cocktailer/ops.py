"""The uOperator builders (seed 001) that the flow ops' uTask lowerings call, and Cocktailer's own ops.

Inside ``cocktailer.trace`` a program is written with flow ops (``flow.relu(x)``, ``x + y``,
``x.sum(-1)``, ``F.linear``); each op's uTask lowering (``lowerings.py``) decides which builder
here makes its ``UOperator``.  A builder allocates its output in the arena (or the current
recursive frame) and appends a ``UOperator`` whose uTasks call a device function from
``kernels/utask/``.  Each ``UOperator`` also lists what its uTasks read and write, and how
(``("elementwise", chunk)``: element ``e`` is touched by uTask ``e // chunk`` on the same thread
every time; ``None``: by any block), which is what the code generator's barrier plan works from.
The op's own inference has checked the call before a builder runs.

Two are ops of their own, since no flow op says what they do inside a persistent kernel:
``lstm_cell`` (the fused LSTM cell) and ``update`` (an in-place row write that makes the old
version stale); they check their shapes here (a ``ShapeError`` names the op and the shapes).
"""

from __future__ import annotations

import math

import numpy as np

from pyflow.cocktailer.ir import TensorRef, UOperator
from pyflow.cocktailer.trace import (FLOAT_DTYPES, TracedTensor, TraceError, _copy_into, _current, _emit_op, _float,
                                     _same_dtype, _tensor)
from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels import scalar_ops
from pyflow.kernels.utask import make_elementwise_utask
from pyflow.kernels.utask.cell import lstm_cell_utask, zero
from pyflow.kernels.utask.matmul import make_matmul_utask
from pyflow.kernels.utask.reduce import make_reduce_row_utask, make_softmax_row_utask
from pyflow.kernels.utask.sizes import ceil_div

__all__ = ["UNARY", "BINARY", "unary", "binary", "copy", "zeros", "linear", "linear_operator", "matmul", "sum_rows",
           "max_rows", "softmax_rows", "lstm_cell", "cat", "update"]


UNARY = {"tanh": scalar_ops.tanh, "sigmoid": scalar_ops.sigmoid, "relu": scalar_ops.relu,
         "exp": scalar_ops.exp, "neg": scalar_ops.neg, "identity": scalar_ops.identity}
BINARY = {"add": scalar_ops.add, "sub": scalar_ops.sub, "mul": scalar_ops.mul, "maximum": scalar_ops.maximum}


def unary(name: str, x) -> TracedTensor:
    """``name(x)`` elementwise (a key of ``UNARY``): one map uOperator, ``chunk`` elements a uTask."""
    t = _current()
    src = _float(_tensor(x, name), name)
    out = t.new_ref(src.shape, src.dtype)
    ew = ("elementwise", t.chunk)
    fn = make_elementwise_utask(UNARY[name]).map
    _emit_op(name, fn, f"{name}_map", ceil_div(src.size, t.chunk), (out, src, src.size, t.chunk),
             [(src, ew)], [(out, ew)], f"{out!r} = {name}({src!r})")
    return TracedTensor(out)


def binary(name: str, a, b) -> TracedTensor:
    """``name(a, b)`` elementwise (a key of ``BINARY``): same shapes, or ``b`` a row of ``a``'s last dim."""
    t = _current()
    a, b = _float(_tensor(a, name), name), _float(_tensor(b, name), name)
    _same_dtype(name, a, b)
    ew = ("elementwise", t.chunk)
    out = t.new_ref(a.shape, a.dtype)
    utasks = make_elementwise_utask(BINARY[name])
    if a.shape == b.shape:
        _emit_op(name, utasks.zip, f"{name}_zip", ceil_div(a.size, t.chunk), (out, a, b, a.size, t.chunk),
                 [(a, ew), (b, ew)], [(out, ew)], f"{out!r} = {name}({a!r}, {b!r})")
    elif len(b.shape) == 1 and a.shape and a.shape[-1] == b.shape[0]:
        _emit_op(name, utasks.zip_rows, f"{name}_zip_rows", ceil_div(a.size, t.chunk),
                 (out, a, b, a.size, b.size, t.chunk), [(a, ew), (b, None)], [(out, ew)],
                 f"{out!r} = {name}({a!r}, rows {b!r})")
    else:
        raise ShapeError(f"{name}: shapes {a.shape} and {b.shape} do not match (nor is the second a "
                         f"row of the first)")
    return TracedTensor(out)


def copy(x) -> TracedTensor:
    """A fresh copy of ``x`` (``x.clone()``: a value of its own, e.g. to ``update`` in place)."""
    return unary("identity", x)


def zeros(*shape, dtype="float32") -> TracedTensor:
    """A new tensor of zeros (a fill operator)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    t = _current()
    if np.dtype(dtype) not in FLOAT_DTYPES:
        raise DTypeError(f"zeros: float32 or float64, got {dtype}")
    out = t.new_ref(shape, dtype)
    ew = ("elementwise", t.chunk)
    _emit_op("zeros", make_elementwise_utask(zero).map, "zero_map", ceil_div(out.size, t.chunk),
             (out, out, out.size, t.chunk), [], [(out, ew)], f"{out!r} = 0")
    return TracedTensor(out)


def _rows(ref: TensorRef) -> int:
    return math.prod(ref.shape[:-1])


def linear(x, weight, bias=None) -> TracedTensor:
    """``x @ weight.T (+ bias)``: x (..., K), weight (N, K), bias (N,) -> (..., N), as one ``linear_operator``
    (the lowering of ``x @ w.T``; its bias add, when next, is fused in by ``lowerings.py``)."""
    t = _current()
    x, w = _float(_tensor(x, "linear"), "linear"), _float(_tensor(weight, "linear"), "linear")
    b = _float(_tensor(bias, "linear"), "linear") if bias is not None else None
    out = t.new_ref(x.shape[:-1] + (w.shape[0],), x.dtype)
    t.emit(linear_operator(out, x, w, b))
    return TracedTensor(out)


def linear_operator(out: TensorRef, x: TensorRef, w: TensorRef, b: TensorRef | None) -> UOperator:
    """The one uOperator ``out = x @ w.T (+ b)``: the tiled matmul reading ``w`` transposed, the bias
    added as each output tile is stored (``make_matmul_utask(transpose_b=True, bias=...)``).  Shapes
    already checked; the flow ops' lowering of ``x @ w.T + b`` (``lowerings.py``) builds it too."""
    t = _current()
    M, K, N = _rows(x), x.shape[-1], w.shape[0]
    fn = make_matmul_utask(t.tile, x.dtype, transpose_b=True, bias=b is not None)
    name = f"linear{'_bias' if b is not None else ''}_t{t.tile}_{x.dtype}"
    args = (out, x, w) + ((b,) if b is not None else ()) + (M, N, K, 1)
    reads = [(x, None), (w, None)] + ([(b, None)] if b is not None else [])
    return UOperator("linear", fn, name, ceil_div(M, t.tile) * ceil_div(N, t.tile), tuple(args), tuple(reads),
                     ((out, None),), f"{out!r} = {x!r} @ {w!r}.T" + (f" + {b!r}" if b is not None else ""))


def matmul(a, b) -> TracedTensor:
    """``a @ b``: a (M, K) or (batch, M, K), b (K, N) or (batch, K, N)."""
    t = _current()
    a, b = _float(_tensor(a, "matmul"), "matmul"), _float(_tensor(b, "matmul"), "matmul")
    _same_dtype("matmul", a, b)
    if len(a.shape) not in (2, 3) or len(b.shape) != len(a.shape) or a.shape[-1] != b.shape[-2] \
            or a.shape[:-2] != b.shape[:-2]:
        raise ShapeError(f"matmul: shapes {a.shape} and {b.shape} do not fit ((M, K) @ (K, N), batched alike)")
    batch = a.shape[0] if len(a.shape) == 3 else 1
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    out = t.new_ref(a.shape[:-1] + (N,), a.dtype)
    fn = make_matmul_utask(t.tile, a.dtype, transpose_b=False, bias=False)
    _emit_op("matmul", fn, f"matmul_t{t.tile}_{a.dtype}", batch * ceil_div(M, t.tile) * ceil_div(N, t.tile),
             (out, a, b, M, N, K, batch), [(a, None), (b, None)], [(out, None)], f"{out!r} = {a!r} @ {b!r}")
    return TracedTensor(out)


def _row_op(op: str, x, keep_width: bool) -> TracedTensor:
    t = _current()
    src = _float(_tensor(x, op), op)
    if not src.shape or src.shape[-1] == 0:
        raise ShapeError(f"{op}: needs rows of at least one element, got shape {src.shape}")
    rows, width = _rows(src), src.shape[-1]
    out = t.new_ref(src.shape if keep_width else src.shape[:-1], src.dtype)
    if op == "softmax_rows":
        fn, fn_name = make_softmax_row_utask(src.dtype), f"softmax_row_{src.dtype}"
    else:
        combine = scalar_ops.add if op == "sum_rows" else scalar_ops.maximum
        fn, fn_name = make_reduce_row_utask(combine, src.dtype), f"{op[:-5]}_row_{src.dtype}"
    _emit_op(op, fn, fn_name, rows, (out, src, rows, width), [(src, None)], [(out, None)],
             f"{out!r} = {op}({src!r})")
    return TracedTensor(out)


def sum_rows(x) -> TracedTensor:
    """The sum of each row (last axis): (..., W) -> (...)."""
    return _row_op("sum_rows", x, False)


def max_rows(x) -> TracedTensor:
    """The max of each row (last axis)."""
    return _row_op("max_rows", x, False)


def softmax_rows(x) -> TracedTensor:
    """Stable softmax of each row (last axis)."""
    return _row_op("softmax_rows", x, True)


def lstm_cell(gx, gh, c):
    """The fused LSTM cell: gates ``gx + gh`` (B, 4H), cell ``c`` (B, H) -> ``(h, c_new)``."""
    t = _current()
    gx, gh, c = (_float(_tensor(v, "lstm_cell"), "lstm_cell") for v in (gx, gh, c))
    _same_dtype("lstm_cell", gx, gh, c)
    if len(c.shape) != 2 or gx.shape != (c.shape[0], 4 * c.shape[1]) or gh.shape != gx.shape:
        raise ShapeError(f"lstm_cell: gates {gx.shape} and {gh.shape} do not fit cell {c.shape} "
                         "(need (B, 4H), (B, 4H), (B, H))")
    B, H = c.shape
    h_out, c_out = t.new_ref(c.shape, c.dtype), t.new_ref(c.shape, c.dtype)
    ew = ("elementwise", t.chunk)
    _emit_op("lstm_cell", lstm_cell_utask, "lstm_cell_utask", ceil_div(B * H, t.chunk),
             (h_out, c_out, gx, gh, c, B, H, t.chunk), [(gx, None), (gh, None), (c, ew)],
             [(h_out, ew), (c_out, ew)], f"{h_out!r}, {c_out!r} = lstm_cell({gx!r}, {gh!r}, {c!r})")
    return TracedTensor(h_out), TracedTensor(c_out)


def cat(tensors) -> TracedTensor:
    """Concatenate along the first axis.  Adjacent views of one buffer are joined without a copy."""
    t = _current()
    refs = [_float(_tensor(x, "cat"), "cat") for x in tensors]
    if not refs:
        raise ShapeError("cat: needs at least one tensor")
    _same_dtype("cat", *refs)
    if any(not r.shape or r.shape[1:] != refs[0].shape[1:] for r in refs):
        raise ShapeError(f"cat: shapes {[r.shape for r in refs]} differ beyond the first axis")
    shape = (sum(r.shape[0] for r in refs),) + refs[0].shape[1:]
    first = refs[0]
    adjacent = all(r.buffer is first.buffer and r.offset.dynamic is first.offset.dynamic
                   and r.offset.const == first.offset.const + sum(q.size for q in refs[:k])
                   for k, r in enumerate(refs))
    if adjacent:
        return TracedTensor(TensorRef(first.buffer, shape, first.offset))
    out = t.new_ref(shape, first.dtype)
    position = 0
    for r in refs:
        _copy_into(TensorRef(out.buffer, r.shape, out.offset + position), r, "cat")
        position += r.size
    return TracedTensor(out)


def update(x, index, value) -> TracedTensor:
    """``x`` with row ``index`` replaced by ``value``, written in place; returns the new version."""
    x = _tensor(x, "update")
    if x.readonly:
        raise TraceError("update: program inputs are read-only; update a copy (x.clone())")
    row = x[index]
    v = _float(_tensor(value, "update"), "update")
    if v.shape != row.shape:
        raise ShapeError(f"update: a row of {x.shape} is {row.shape}, the value is {v.shape}")
    _copy_into(row.ref, v, "update")
    x._use("update")
    x._stale_by = "update"
    return TracedTensor(x.ref)
