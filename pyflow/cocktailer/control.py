"""Control flow of the front end (seed 001): ``for_loop``, ``while_loop`` and ``cond``.

Each takes Python functions and traces each body once, into a ``Loop`` or a
``Branch`` of the IR (``ir.py``) whose blocks hold the body's statements:

    h = ck.for_loop(xs.shape[0], lambda t, h: flow.tanh(h + xs[t]), h0)
    h = ck.while_loop(lambda h: h.sum().item() > 0, lambda h: h - one, h)
    y = ck.cond(flags[i].item(), lambda h: flow.tanh(h), lambda h: flow.relu(h), h)

Memory (the paper's memory management, see ``trace.py``): loop-carried values live
in state buffers, copied in before the loop and copied back after each iteration
unless updated in place; the two branches of a ``cond`` share scratch space and
each copies its results into the cond's outputs.  A trip count is an int >= 0 or an
int device Scalar; ``max_iters`` an int >= 0 (``checks.py``).
"""

from __future__ import annotations

from pyflow.cocktailer.checks import static_int
from pyflow.cocktailer.ir import Branch, Loop, StmtBlock
from pyflow.cocktailer.scalars import Const, Scalar, Var
from pyflow.cocktailer.trace import (TracedTensor, TraceError, _as_tuple, _copy_into, _current, _float, _int_scalar,
                                     _tensor)
from pyflow.errors import ShapeError

__all__ = ["for_loop", "while_loop", "cond"]


def _unwrap(values: tuple, single: bool):
    return values[0] if single else values


def _loop_state(init: tuple, what: str):
    """State buffers for loop-carried values, initialised by copies (CopyUOperators)."""
    t = _current()
    states = []
    for v in init:
        ref = _float(_tensor(v, what), what)
        state = t.new_ref(ref.shape, ref.dtype)
        _copy_into(state, ref, f"{what}: loop-carried input")
        states.append(TracedTensor(state))
    return states


def _write_back(states, results, what: str) -> None:
    if len(results) != len(states):
        raise TraceError(f"{what}: the body returned {len(results)} values for {len(states)} carried values")
    for s, r in zip(states, results):
        ref = _float(r, what)
        if ref.shape != s.shape or ref.dtype != s.dtype:
            raise ShapeError(f"{what}: a carried value changed from {s.shape} {s.dtype} to "
                             f"{ref.shape} {ref.dtype}")
        if ref.buffer is s.ref.buffer and ref.offset == s.ref.offset or (
                ref.buffer is s.ref.buffer and ref.offset.dynamic is s.ref.offset.dynamic
                and ref.offset.const == s.ref.offset.const):
            continue  # updated in place (or unchanged): nothing to copy
        _copy_into(s.ref, ref, f"{what}: carried value for the next iteration")


def for_loop(trip, body, *init):
    """Run ``body(i, *carried) -> carried`` for ``i`` in ``range(trip)``; returns the final values.

    ``trip`` is an int >= 0 or an int device Scalar (read on the device, every block
    alike; a negative value there runs no iteration, as ``range`` does).
    """
    t = _current()
    if not init:
        raise TraceError("for_loop: needs at least one loop-carried tensor")
    if isinstance(trip, Scalar):
        _int_scalar(trip, "for_loop: the trip count")
    elif isinstance(trip, TracedTensor):
        raise TraceError("for_loop: the trip count is a TracedTensor; use an int, or a device Scalar (n[0].item())")
    else:
        trip = Const(static_int(trip, "for_loop: the trip count"))
    states = _loop_state(init, "for_loop")
    var = Var(t.fresh("i", derived=("{}_trip",)))   # (in a recursive function codegen may keep the trip as i0_trip)
    loop = Loop(var, StmtBlock(), trip=trip)
    t.loop_depth += 1
    try:
        with t.block(loop.body):
            results = _as_tuple(body(var, *states), "for_loop body")
            _write_back(states, results, "for_loop")
    finally:
        t.loop_depth -= 1
    t.emit(loop)
    return _unwrap(tuple(TracedTensor(s.ref) for s in states), len(states) == 1)


def while_loop(cond_fn, body, *init, max_iters: int = 10_000):
    """``while cond_fn(*carried): carried = body(*carried)``; at most ``max_iters`` iterations.

    ``cond_fn`` returns a Scalar (e.g. ``sum_rows(h).item() > 0``); ops inside it
    run before every test.  More than ``max_iters`` iterations raise
    ``IterationLimitError`` when the program runs.
    """
    t = _current()
    if not init:
        raise TraceError("while_loop: needs at least one loop-carried tensor")
    max_iters = static_int(max_iters, "while_loop: max_iters")
    states = _loop_state(init, "while_loop")
    var = Var(t.fresh("w"))
    loop = Loop(var, StmtBlock(), head=StmtBlock(), max_iters=max_iters)
    t.loop_depth += 1
    try:
        with t.block(loop.head):
            predicate = cond_fn(*states)
            if not isinstance(predicate, Scalar):
                raise TraceError(f"while_loop: the condition must be a device Scalar (t.item() > 0), "
                                 f"got {type(predicate).__name__}")
            loop.cond = predicate
        with t.block(loop.body):
            results = _as_tuple(body(*states), "while_loop body")
            _write_back(states, results, "while_loop")
    finally:
        t.loop_depth -= 1
    t.emit(loop)
    return _unwrap(tuple(TracedTensor(s.ref) for s in states), len(states) == 1)


def cond(pred, then_fn, else_fn, *operands):
    """``then_fn(*operands)`` if ``pred`` else ``else_fn(*operands)``; both return alike shapes.

    ``pred`` is a device Scalar (a Python bool traces only the branch it picks).
    """
    t = _current()
    if isinstance(pred, TracedTensor):
        raise TraceError("cond: the predicate is a TracedTensor; use a device Scalar (t.item(), "
                         "sum_rows(h).item() > 0) or a Python bool")
    if not isinstance(pred, Scalar):
        return (then_fn if pred else else_fn)(*operands)
    branch = Branch(pred, StmtBlock(), StmtBlock())
    results_of: dict = {}   # branch block -> the TensorRefs it returned
    shapes = None
    with t.shared_scratch() as restart:
        for k, (fn, block) in enumerate(((then_fn, branch.then), (else_fn, branch.orelse))):
            if k == 1:
                restart()
            with t.block(block):
                results = _as_tuple(fn(*operands), "cond branch")
                refs = [_float(r, "cond") for r in results]
                if shapes is None:
                    shapes = [(r.shape, r.dtype) for r in refs]
                elif [(r.shape, r.dtype) for r in refs] != shapes:
                    raise ShapeError(f"cond: the branches return different shapes: {shapes} and "
                                     f"{[(r.shape, r.dtype) for r in refs]}")
                results_of[id(block)] = refs
    # the outputs live outside the shared scratch; each branch copies its results into them
    outs = [t.new_ref(shape, dtype) for shape, dtype in shapes]
    for block in (branch.then, branch.orelse):
        with t.block(block):
            for o, r in zip(outs, results_of[id(block)]):
                _copy_into(o, r, "cond output")
    t.emit(branch)
    return _unwrap(tuple(TracedTensor(o) for o in outs), len(outs) == 1)
