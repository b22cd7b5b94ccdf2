"""Front-end ops for the paper's NASRNN, Attention and Seq2seq (seed 001, issue 17): each emits one UOperator.

Like ``ops.py`` (read it first): each op checks shapes at trace time, allocates
its output and appends a ``UOperator`` whose uTasks call a device function from
``kernels/utask/``, listing what they read and write and how, for the barrier plan.

The models write flow ops where one has these semantics (issue 30), and the lowerings
(``lowerings.py``) call the builders here: ``x @ w`` with broadcast batch dims and
``k @ q.transpose(-1, -2)`` are ``batched_matmul``'s uOperator, ``flow.softmax(x * scale, -1)``
is ``scaled_softmax_rows``'s.  What stays a Cocktailer op has no flow op of its semantics:
the fused cells (``nasrnn_cell``, ``gate_lstm_cell``: one uTask per chunk of the whole gate
math, as OneFlow keeps fused kernels such as ``fused_lstm_cell``), the writes in place
(``batched_matmul(into=)``, ``max_rows_into``: a flow op may not write into a program's
state), and the token ops on float ids (``embedding``, ``argmax_sum_rows``: flow's take and
give int64 indices; here the ids stay float tensors on the device).

* ``batched_matmul(a, b, transpose_b=False, into=None, at=None)``: ``a @ b`` over
  leading batch dims, where the operand with fewer of them is repeated (numpy
  broadcasting; its batch dims must be a suffix of the other's):
  ``batched_matmul(x_t, W_ih)`` with x_t (B, I) and W_ih (8, I, H) is (8, B, H).
  ``into=cache, at=row``: the result's M rows go to rows ``row .. row + M - 1`` of
  each matrix of ``cache`` (a KV cache write; ``row`` may be a device Scalar, e.g.
  the loop counter); ``into=x`` alone overwrites ``x`` (a loop's state, no copy).
  Either way ``into`` is written in place: the op returns its new version and the
  old TracedTensor is stale, as with ``ops.update``.  uTasks: one output tile each
  (``kernels/utask/batched.py``); reads and writes cross blocks (pattern None).
* ``nasrnn_cell(ih, hh, c) -> (c_new, m_new)``: the fused NASRNN cell
  (``kernels/utask/nasrnn.py``); elementwise in ``c`` and its outputs (so a copy of
  them into the loop state needs no barrier), whole rows of the gates.
* ``scaled_softmax_rows(x, scale)``: ``softmax(scale * x)`` over the last axis, one
  uTask per row (``kernels/utask/scaled_softmax.py``).

For Seq2seq (``models/seq2seq.py``), whose tokens never leave the device:

* ``embedding(weight, ids)``: ``weight[ids]``, rows picked by token ids held (as
  floats) in a device tensor (``kernels/utask/embedding.py``); elementwise in its output.
* ``argmax_sum_rows(x, y)``: per row, the first index maximising ``x + y``, as a
  float token id (``kernels/utask/argmax.py``); one uTask per row.
* ``max_rows_into(x, into)``: ``ops.max_rows`` (``kernels/utask/reduce.py``'s row
  uTask) written into a loop's state in place: a while condition computed in the body.
* ``gate_lstm_cell(ih, hh, b_ih, b_hh, c) -> (h_new, c_new)``: the artifact's LSTM
  cell on gate-major gates (4, B, H) with per-gate biases (4, H)
  (``kernels/utask/seq2seq.py``); elementwise in ``c`` and its outputs.
* ``while_loop_counted(cond_fn, body, *carried)``: ``control.while_loop`` whose
  condition and body also get the iteration count ``i``, a device int that can
  index (``std[i]``, ``update(out, i, tok)``) as ``for_loop``'s counter can.
"""

from __future__ import annotations

import math
import numbers

from pyflow.cocktailer.checks import static_int
from pyflow.cocktailer.control import _loop_state, _unwrap, _write_back
from pyflow.cocktailer.ir import Loop, StmtBlock, TensorRef
from pyflow.cocktailer.scalars import Const, Scalar, Var
from pyflow.cocktailer.trace import (TracedTensor, TraceError, _as_tuple, _current, _emit_op, _float, _int_argument,
                                     _same_dtype, _tensor)
from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels import scalar_ops
from pyflow.kernels.utask.argmax import make_argmax_sum_row_utask
from pyflow.kernels.utask.batched import check_periods, make_broadcast_matmul_utask
from pyflow.kernels.utask.embedding import embedding_utask
from pyflow.kernels.utask.nasrnn import GATES, nasrnn_cell_utask
from pyflow.kernels.utask.reduce import make_reduce_row_utask
from pyflow.kernels.utask.scaled_softmax import make_scaled_softmax_row_utask
from pyflow.kernels.utask.seq2seq import GATES as LSTM_GATES
from pyflow.kernels.utask.seq2seq import gate_lstm_cell_utask
from pyflow.kernels.utask.sizes import ceil_div

__all__ = ["batched_matmul", "nasrnn_cell", "scaled_softmax_rows", "embedding", "argmax_sum_rows",
           "max_rows_into", "gate_lstm_cell", "while_loop_counted"]


def _batch_shape(op: str, a: tuple, b: tuple) -> tuple:
    """The output's batch dims: the longer of ``a``/``b``, the other must be its suffix."""
    longer, shorter = (a, b) if len(a) >= len(b) else (b, a)
    if longer[len(longer) - len(shorter):] != shorter:
        raise ShapeError(f"{op}: batch dims {a} and {b} do not broadcast (the shorter must be a suffix of "
                         "the longer)")
    return longer


def _overlaps(x: TensorRef, y: TensorRef) -> bool:
    if x.buffer is not y.buffer:
        return False
    rx, ry = x.region, y.region
    return rx is None or ry is None or (rx[0] < ry[1] and ry[0] < rx[1])


def batched_matmul(a, b, *, transpose_b: bool = False, into=None, at=None) -> TracedTensor:
    """``a @ b`` (``b.T`` per matrix with ``transpose_b``) over broadcast batch dims; see the module doc.

    a (*A, M, K), b (*B, K, N) (or (*B, N, K)) -> (*batch, M, N) with batch the longer
    of A and B.  ``into`` (*batch, R, N), R >= M: write the result into rows
    ``at .. at + M - 1`` of each of its matrices instead (``at`` an int, a device
    Scalar, or None for 0 with R == M); returns ``into``'s new version.
    """
    op = "batched_matmul"
    t = _current()
    a, b = _float(_tensor(a, op), op), _float(_tensor(b, op), op)
    _same_dtype(op, a, b)
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ShapeError(f"{op}: needs matrices (..., M, K) and (..., K, N), got {a.shape} and {b.shape}")
    M, K = a.shape[-2:]
    N, Kb = (b.shape[-2], b.shape[-1]) if transpose_b else (b.shape[-1], b.shape[-2])
    if K != Kb:
        layout = "(..., N, K)" if transpose_b else "(..., K, N)"
        raise ShapeError(f"{op}: {a.shape} @ {b.shape}{'.T' if transpose_b else ''}: K differs (a is (..., M, K), "
                         f"b is {layout})")
    batch_shape = _batch_shape(op, a.shape[:-2], b.shape[:-2])
    batch, a_period, b_period = math.prod(batch_shape), math.prod(a.shape[:-2]), math.prod(b.shape[:-2])
    if into is None:
        if at is not None:
            raise TraceError(f"{op}: at= needs into= (the tensor whose rows it names)")
        out = t.new_ref(batch_shape + (M, N), a.dtype)
        view, out_stride, result = out, M * N, out
    else:
        target = _tensor(into, op)
        if target.readonly:
            raise TraceError(f"{op}: program inputs are read-only; write into a copy (x.clone())")
        out = _float(target, op)
        _same_dtype(op, a, out)
        if len(out.shape) < 2 or out.shape[:-2] != batch_shape or out.shape[-1] != N or out.shape[-2] < M:
            raise ShapeError(f"{op}: the result {batch_shape + (M, N)} does not fit into {out.shape} (need "
                             f"{batch_shape} + (R >= {M}, {N}))")
        R = out.shape[-2]
        if at is None:
            if R != M:
                raise ShapeError(f"{op}: into {out.shape} has {R} rows per matrix, the result {M}: say at= which")
            at = 0
        row = _int_argument(at, f"{op}: at")
        span = (batch - 1) * R * N + M * N if batch else 0
        if isinstance(row, Const):  # the rows are known now
            if not 0 <= row.value <= R - M:
                raise ShapeError(f"{op}: at={row.value} puts {M} rows outside the {R} of {out.shape}")
            start = out.offset + row.value * N
        else:  # a device value: the view starts at run time, checked against into's range
            start = out.offset + row * N
        view = TensorRef(out.buffer, (span,), start, out.region if start.dynamic is not None else None)
        out_stride, result = R * N, out
        for operand in (a, b):
            if _overlaps(view, operand):
                raise ShapeError(f"{op}: into= overlaps an operand ({operand!r}); matmul outputs may not")
    check_periods(batch, max(a_period, 1), max(b_period, 1), out_stride, M, N)
    tile = t.tile
    fn = make_broadcast_matmul_utask(tile, a.dtype, transpose_b)
    name = f"bmm{'_bt' if transpose_b else ''}_t{tile}_{a.dtype}"
    shown = f"{b!r}{'.T' if transpose_b else ''}"
    if into is None:
        note = f"{view!r} = {a!r} @ {shown}"
    elif R == M and isinstance(row, Const):
        note = f"{out!r} = {a!r} @ {shown}  # in place"
    else:
        note = f"{out!r}[..., {row!r}:+{M}, :] = {a!r} @ {shown}  # rows of each matrix"
    _emit_op("matmul", fn, name, batch * ceil_div(M, tile) * ceil_div(N, tile),
             (view, a, b, max(a_period, 1), max(b_period, 1), out_stride, M, N, K, batch),
             [(a, None), (b, None)], [(view, None)], note)
    if into is not None:
        target._use(op)
        target._stale_by = f"{op}(into=...)"
    return TracedTensor(result)


def nasrnn_cell(ih, hh, c):
    """The fused NASRNN cell: gates ``ih``, ``hh`` (8, B, H), cell ``c`` (B, H) -> ``(c_new, m_new)``."""
    op = "nasrnn_cell"
    t = _current()
    ih, hh, c = (_float(_tensor(v, op), op) for v in (ih, hh, c))
    _same_dtype(op, ih, hh, c)
    if len(c.shape) != 2 or ih.shape != (GATES,) + c.shape or hh.shape != ih.shape:
        raise ShapeError(f"{op}: gates {ih.shape} and {hh.shape} do not fit cell {c.shape} "
                         f"(need ({GATES}, B, H), ({GATES}, B, H), (B, H))")
    n = c.size
    c_out, m_out = t.new_ref(c.shape, c.dtype), t.new_ref(c.shape, c.dtype)
    ew = ("elementwise", t.chunk)
    _emit_op(op, nasrnn_cell_utask, "nasrnn_cell_utask", ceil_div(n, t.chunk), (c_out, m_out, ih, hh, c, n, t.chunk),
             [(ih, None), (hh, None), (c, ew)], [(c_out, ew), (m_out, ew)],
             f"{c_out!r}, {m_out!r} = nasrnn_cell({ih!r}, {hh!r}, {c!r})")
    return TracedTensor(c_out), TracedTensor(m_out)


def scaled_softmax_rows(x, scale: float) -> TracedTensor:
    """``softmax(scale * x)`` over the last axis (``scale`` a Python number, fixed at trace time)."""
    op = "scaled_softmax_rows"
    t = _current()
    src = _float(_tensor(x, op), op)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise DTypeError(f"{op}: scale must be a finite number, got {scale!r}")
    if not src.shape or src.shape[-1] == 0:
        raise ShapeError(f"{op}: needs rows of at least one element, got shape {src.shape}")
    rows, width = math.prod(src.shape[:-1]), src.shape[-1]
    out = t.new_ref(src.shape, src.dtype)
    fn = make_scaled_softmax_row_utask(float(scale), src.dtype)
    _emit_op("softmax_rows", fn, f"scaled_softmax_row_{src.dtype}", rows, (out, src, rows, width),
             [(src, None)], [(out, None)], f"{out!r} = softmax({float(scale)!r} * {src!r})")
    return TracedTensor(out)


# ---- Seq2seq ------------------------------------------------------------------------------


def embedding(weight, ids) -> TracedTensor:
    """``weight[ids]``: weight (V, D), ids (R,) token ids held as floats on the device -> (R, D).

    An id outside ``[0, V)`` gives a row of NaN (the uTask never reads outside ``weight``).
    """
    op = "embedding"
    t = _current()
    w, tok = _float(_tensor(weight, op), op), _float(_tensor(ids, op), op)
    _same_dtype(op, w, tok)
    if len(w.shape) != 2 or len(tok.shape) != 1:
        raise ShapeError(f"{op}: needs a table (V, D) and ids (R,), got {w.shape} and {tok.shape}")
    (rows,), (vocab, dim) = tok.shape, w.shape
    out = t.new_ref((rows, dim), w.dtype)
    ew = ("elementwise", t.chunk)
    _emit_op(op, embedding_utask, "embedding_utask", ceil_div(rows * dim, t.chunk),
             (out, w, tok, rows, dim, vocab, t.chunk), [(w, None), (tok, None)], [(out, ew)],
             f"{out!r} = {w!r}[{tok!r}]")
    return TracedTensor(out)


def argmax_sum_rows(x, y) -> TracedTensor:
    """Per row of ``x + y`` (same shapes, (..., W)), the first index of the maximum, as a float: (...)."""
    op = "argmax_sum_rows"
    t = _current()
    a, b = _float(_tensor(x, op), op), _float(_tensor(y, op), op)
    _same_dtype(op, a, b)
    if a.shape != b.shape or not a.shape or a.shape[-1] == 0:
        raise ShapeError(f"{op}: needs two tensors of one shape (..., W) with W >= 1, got {a.shape} and {b.shape}")
    rows, width = math.prod(a.shape[:-1]), a.shape[-1]
    out = t.new_ref(a.shape[:-1], a.dtype)
    _emit_op(op, make_argmax_sum_row_utask(a.dtype), f"argmax_sum_row_{a.dtype}", rows, (out, a, b, rows, width),
             [(a, None), (b, None)], [(out, None)], f"{out!r} = argmax({a!r} + {b!r})")
    return TracedTensor(out)


def max_rows_into(x, into) -> TracedTensor:
    """``ops.max_rows(x)`` written into ``into`` in place (a loop's state: no copy); returns its new version.

    x (..., W) with W >= 1, into (...): a while loop's condition computed at the end
    of the body, where its one uTask's write is covered by the barrier the body
    already has, instead of being copied into the state (which would need one more).
    The old ``into`` TracedTensor is stale afterwards, as with ``ops.update``.
    """
    op = "max_rows_into"
    _current()   # (raises outside a trace)
    src, target = _float(_tensor(x, op), op), _tensor(into, op)
    if target.readonly:
        raise TraceError(f"{op}: program inputs are read-only; write into a copy (x.clone())")
    out = _float(target, op)
    _same_dtype(op, src, out)
    if not src.shape or src.shape[-1] == 0 or out.shape != src.shape[:-1]:
        raise ShapeError(f"{op}: the maxima of {src.shape} (need rows of at least one element) do not fit into "
                         f"{out.shape}")
    if _overlaps(out, src):
        raise ShapeError(f"{op}: into= overlaps the rows it reduces")
    rows, width = math.prod(src.shape[:-1]), src.shape[-1]
    _emit_op("max_rows", make_reduce_row_utask(scalar_ops.maximum, src.dtype), f"max_row_{src.dtype}", rows,
             (out, src, rows, width), [(src, None)], [(out, None)], f"{out!r} = max_rows({src!r})  # in place")
    target._stale_by = f"{op}(into=...)"
    return TracedTensor(out)


def gate_lstm_cell(ih, hh, b_ih, b_hh, c):
    """The artifact's LSTM cell: gates ``ih``, ``hh`` (4, B, H), biases (4, H), cell ``c`` (B, H) -> ``(h, c_new)``."""
    op = "gate_lstm_cell"
    t = _current()
    ih, hh, b_ih, b_hh, c = (_float(_tensor(v, op), op) for v in (ih, hh, b_ih, b_hh, c))
    _same_dtype(op, ih, hh, b_ih, b_hh, c)
    if (len(c.shape) != 2 or ih.shape != (LSTM_GATES,) + c.shape or hh.shape != ih.shape
            or b_ih.shape != (LSTM_GATES, c.shape[1]) or b_hh.shape != b_ih.shape):
        raise ShapeError(f"{op}: gates {ih.shape}, {hh.shape} and biases {b_ih.shape}, {b_hh.shape} do not fit cell "
                         f"{c.shape} (need ({LSTM_GATES}, B, H) twice, ({LSTM_GATES}, H) twice, (B, H))")
    batch, hidden = c.shape
    h_out, c_out = t.new_ref(c.shape, c.dtype), t.new_ref(c.shape, c.dtype)
    ew = ("elementwise", t.chunk)
    _emit_op(op, gate_lstm_cell_utask, "gate_lstm_cell_utask", ceil_div(batch * hidden, t.chunk),
             (h_out, c_out, ih, hh, b_ih, b_hh, c, batch, hidden, t.chunk),
             [(ih, None), (hh, None), (b_ih, None), (b_hh, None), (c, ew)], [(h_out, ew), (c_out, ew)],
             f"{h_out!r}, {c_out!r} = gate_lstm_cell({ih!r}, {hh!r}, {b_ih!r}, {b_hh!r}, {c!r})")
    return TracedTensor(h_out), TracedTensor(c_out)


def while_loop_counted(cond_fn, body, *init, max_iters: int = 10_000):
    """``while cond_fn(i, *carried): carried = body(i, *carried)``, ``i`` the iterations done so far.

    ``control.while_loop`` with the loop's own counter (``Loop.var``, which every while
    loop keeps for ``max_iters``) handed to ``cond_fn`` and ``body`` as their first
    argument, as ``for_loop`` hands its ``i``: ``i`` is 0 at the first test and in the
    first body, and goes up by one after each body.  It is a device int, so it can
    index a tensor (``std[i]``) or name a row (``update(out, i, tok)``), which a
    counter carried as a float tensor cannot.  The rest is ``while_loop``'s.
    """
    what = "while_loop_counted"
    t = _current()
    if not init:
        raise TraceError(f"{what}: needs at least one loop-carried tensor")
    max_iters = static_int(max_iters, f"{what}: max_iters")
    states = _loop_state(init, what)
    var = Var(t.fresh("i"))
    loop = Loop(var, StmtBlock(), head=StmtBlock(), max_iters=max_iters)
    t.loop_depth += 1
    try:
        with t.block(loop.head):
            predicate = cond_fn(var, *states)
            if not isinstance(predicate, Scalar):
                raise TraceError(f"{what}: the condition must be a device Scalar (t.item() > 0, i < n), "
                                 f"got {type(predicate).__name__}")
            loop.cond = predicate
        with t.block(loop.body):
            results = _as_tuple(body(var, *states), f"{what} body")
            _write_back(states, results, what)
    finally:
        t.loop_depth -= 1
    t.emit(loop)
    return _unwrap(tuple(TracedTensor(s.ref) for s in states), len(states) == 1)
