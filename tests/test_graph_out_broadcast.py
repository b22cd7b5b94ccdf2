"""An ``out=`` result of another shape inside ``nn.Graph.build`` is broadcast by the ``expand`` view op.

``LazyTracer._write`` records ``result.expand(*out.shape)`` (then a cast into ``out``), so the ``view``
JobOp it makes is a view op's: the autograd pass calls expand's own backward rule (``sum_to``), the one
eager autograd calls.  Its gradients equal eager's (of the broadcast spelled out with ``expand``) and
the hand computation, locally and on a broadcast (B) placement.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.framework.interpreter import apply

run = flow.distributed.run
B = flow.sbp.broadcast


def _out_of_another_shape(x, w):
    """``y = x * 1``, then ``2 * w`` (a row) written into all of y (``out=``), then ``(y * x).sum()``."""
    y = x * 1.0
    apply("mul", [w, 2.0], out=[y])
    return (y * x).sum()


def _step(xv, wv, where):
    """(loss, w after one SGD step of lr 1, the broadcast view JobOps of the graph's Job)."""
    w = flow.tensor(wv, **where).requires_grad_()
    x = flow.tensor(xv, **where)
    optimizer = flow.optim.SGD([w], lr=1.0)

    class Step(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.add_optimizer(optimizer)

        def build(self, x):
            loss = _out_of_another_shape(x, w)
            loss.backward()
            return loss

    g = Step()
    loss = g(x).numpy()
    views = [op.attrs.get("_op") for op in g.job.ops if op.type == "view" and not op.backward]
    return loss, w.numpy(), views


@settings(max_examples=6, deadline=None)
@given(rows=st.integers(1, 3), cols=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_an_out_result_of_another_shape_is_expanded_and_gets_eager_gradients(rows, cols, seed):
    rng = np.random.default_rng(seed)
    xv = rng.standard_normal((rows, cols)).astype(np.float32)
    wv = rng.standard_normal(cols).astype(np.float32)
    loss, w_after, views = _step(xv, wv, {})
    assert views == ["expand"]   # made by the view op, not by a strided _view of no op

    w, x = flow.tensor(wv).requires_grad_(), flow.tensor(xv)
    want = ((w * 2.0).expand(*x.shape) * x).sum()   # eager, the broadcast spelled out
    want.backward()
    np.testing.assert_allclose(loss, want.numpy(), rtol=1e-6)
    np.testing.assert_allclose(wv - w_after, w.grad.numpy(), rtol=1e-6)   # lr 1: w moved by its gradient
    np.testing.assert_allclose(w.grad.numpy(), 2 * xv.sum(0), rtol=1e-6)  # by hand: sum over the rows


def test_an_out_result_of_another_shape_on_a_broadcast_placement_gets_its_gradient():
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    wv = np.arange(3, dtype=np.float32)

    def body():
        return _step(xv, wv, dict(placement=flow.placement("cpu", [0, 1]), sbp=B))

    for loss, w_after, views in run(body, world_size=2):
        assert views == ["expand"]
        assert loss == (2 * wv * xv).sum()
        np.testing.assert_array_equal(w_after, wv - 2 * xv.sum(0))


@pytest.mark.parametrize("shape", [(2, 3), (3,)])
def test_an_out_result_that_does_not_broadcast_is_refused_at_the_call(shape):
    class Bad(flow.nn.Graph):
        def build(self, x):
            y = x * 1.0
            apply("mul", [flow.ones(*shape), 2.0], out=[y])
            return y

    with pytest.raises(flow.errors.ShapeError):
        Bad()(flow.ones(4, 2))


@pytest.mark.parametrize("in_graph", [False, True])
def test_copy_of_a_broadcast_source_gets_its_gradient_eagerly_and_in_a_graph(in_graph):
    """``y.copy_(w * 2)`` of a row ``w``: copy_ broadcasts with the expand op, so w's gradient is the sum
    over the rows, as in PyTorch (eager autograd once dropped it: the broadcast was a strided _view)."""
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    w, x = flow.tensor(np.arange(3, dtype=np.float32)).requires_grad_(), flow.tensor(xv)

    def loss_of(x):
        y = x * 1.0
        y.copy_(w * 2)
        return (y * x).sum()

    if in_graph:
        optimizer = flow.optim.SGD([w], lr=1.0)

        class Copy(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.add_optimizer(optimizer)

            def build(self, x):
                loss = loss_of(x)
                loss.backward()
                return loss

        graph = Copy()
        graph(x)
        assert [op.attrs.get("_op") for op in graph.job.ops if op.type == "view" and not op.backward] == ["expand"]
        np.testing.assert_array_equal(w.numpy(), np.arange(3) - 2 * xv.sum(0))
    else:
        loss_of(x).backward()
        np.testing.assert_array_equal(w.grad.numpy(), 2 * xv.sum(0))


def test_a_view_made_by_no_view_op_that_needs_a_gradient_is_a_compile_error():
    w = flow.tensor(np.arange(3, dtype=np.float32)).requires_grad_()
    optimizer = flow.optim.SGD([w], lr=1.0)

    class Strided(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.add_optimizer(optimizer)

        def build(self, x):
            loss = (w._view((2, 3), (0, 1), 0) * x).sum()   # a raw strided view: no op, no backward rule
            loss.backward()
            return loss

    with pytest.raises(flow.errors.CompileError, match="a view made by no view op"):
        Strided()(flow.ones(2, 3))
