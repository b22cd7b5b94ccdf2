"""A leaf's first gradient becomes its ``.grad`` with no copy when the autograd engine alone holds it
(``pyflow/autograd/engine.py``: ``_owned``, ``accumulate``), as PyTorch's AccumulateGrad steals a gradient
nobody else holds; every other gradient is copied, so that no two ``.grad`` tensors, a retained gradient or
the caller's ``gradient=`` ever share memory."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
import pyflow.autograd.engine as engine
from pyflow.trace import trace

SHAPE = (2, 3)

# unary steps of a random program: each keeps the shape (2, 3) or says how it gets back to it
UNARY = {
    "mul2": lambda x: x * 2.0,
    "neg": lambda x: -x,
    "relu": lambda x: x.relu(),
    "transpose2": lambda x: x.t().t(),              # a view's rule hands on a view of what arrived
    "reshape": lambda x: x.reshape(3, 2).reshape(2, 3),
    "contiguous_t": lambda x: x.t().contiguous().t(),
    "add0": lambda x: x + 0.0,
    "sum_expand": lambda x: x.sum(0, keepdim=True).expand(2, 3),   # sum's rule: an expanded view
    "matmul": lambda x: x @ flow.ones(3, 3),
}
BINARY = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "sub": lambda a, b: a - b}


@st.composite
def programs(draw):
    """(steps, retain, user_gradient): each step ("u", name, operand) or ("b", name, i, j) over values so far
    (the leaves are values 0 and 1); ``retain``: the index of a value that calls ``retain_grad`` (or None)."""
    steps, count = [], 2
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            steps.append(("u", draw(st.sampled_from(sorted(UNARY))), draw(st.integers(0, count - 1))))
        else:
            steps.append(("b", draw(st.sampled_from(sorted(BINARY))), draw(st.integers(0, count - 1)),
                          draw(st.integers(0, count - 1))))
        count += 1
    retain = draw(st.one_of(st.none(), st.integers(2, count - 1)))
    return steps, retain, draw(st.booleans())


def _run(program, a0, b0, g0):
    steps, retain, user_gradient = program
    a = flow.tensor(a0, requires_grad=True)
    b = flow.tensor(b0, requires_grad=True)
    values = [a, b]
    for step in steps:
        if step[0] == "u":
            values.append(UNARY[step[1]](values[step[2]]))
        else:
            values.append(BINARY[step[1]](values[step[2]], values[step[3]]))
    kept = values[retain] if retain is not None and values[retain].requires_grad else None
    if kept is not None:
        kept.retain_grad()
    out = values[-1]
    if not out.requires_grad:
        return None
    gradient = flow.tensor(g0) if user_gradient else None
    if gradient is not None:
        out.backward(gradient)
    else:
        out.sum().backward()
    return a, b, kept, gradient


def _memory(t):
    return t._blob.storage.id


@settings(max_examples=60, deadline=None)
@given(program=programs())
def test_no_two_gradients_share_memory_and_the_values_are_those_of_copying_every_gradient(program):
    rng = np.random.default_rng(0)
    a0, b0, g0 = (rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3))
    got = _run(program, a0, b0, g0)
    if got is None:
        return
    a, b, kept, gradient = got
    holders = [t for t in (a.grad, b.grad, kept.grad if kept is not None else None, gradient) if t is not None]
    assert len({_memory(t) for t in holders}) == len(holders)

    copied = pytest.MonkeyPatch()   # the engine as it was: every first gradient copied
    copied.setattr(engine, "_owned", lambda grads, mark, handed: [False] * len(grads))
    try:
        a2, b2, kept2, _ = _run(program, a0, b0, g0)
    finally:
        copied.undo()
    kept_grads = (kept.grad, kept2.grad) if kept is not None else (None, None)
    for mine, theirs in ((a.grad, a2.grad), (b.grad, b2.grad), kept_grads):
        assert (mine is None) == (theirs is None)
        if mine is not None:
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy())

    for written in (t for t in (a.grad, b.grad) if t is not None):   # writing a .grad changes nothing else
        before = [t.numpy().copy() for t in holders]
        written.add_(1000.0)
        for t, was in zip(holders, before):
            if t is not written:
                np.testing.assert_array_equal(t.numpy(), was)


def _backward_ops(fn):
    w = flow.tensor(np.arange(12.0, dtype=np.float32).reshape(4, 3), requires_grad=True)
    bias = flow.tensor(np.ones(4, np.float32), requires_grad=True)
    x = flow.tensor(np.ones((5, 3), np.float32))
    loss = fn(x, w, bias)
    with trace() as tracer:
        loss.backward()
    return [r.name for r in tracer.records], w, bias


def test_a_linear_layers_gradients_become_grad_with_no_copy():
    names, w, bias = _backward_ops(lambda x, w, bias: flow.nn.functional.linear(x, w, bias).sum())
    assert "contiguous" not in names, names
    np.testing.assert_array_equal(w.grad.numpy(), np.full((4, 3), 5.0, np.float32))
    np.testing.assert_array_equal(bias.grad.numpy(), np.full(4, 5.0, np.float32))


def test_a_gradient_the_caller_gave_is_copied_into_grad():
    w = flow.tensor(np.ones((2, 2), np.float32), requires_grad=True)
    gradient = flow.tensor(np.full((2, 2), 3.0, np.float32))
    w.reshape(4).reshape(2, 2).backward(gradient)   # views' rules hand on views of the caller's tensor
    assert _memory(w.grad) != _memory(gradient)
    gradient.add_(1.0)
    np.testing.assert_array_equal(w.grad.numpy(), np.full((2, 2), 3.0, np.float32))


def test_a_second_backward_adds_into_the_taken_gradient_in_place():
    w = flow.tensor(np.ones(3, np.float32), requires_grad=True)
    (w * 2.0).sum().backward()
    first = w.grad
    (w * 2.0).sum().backward()
    assert w.grad is first
    np.testing.assert_array_equal(w.grad.numpy(), np.full(3, 4.0, np.float32))
