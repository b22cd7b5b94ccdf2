"""``to_global`` is one op (``pyflow/ops/to_global.py``): one inference, one backward rule for eager autograd and
nn.Graph's autograd pass.

* the registry holds it, its SBP declared as ``SETS_LAYOUT`` and its backward a rule; ``apply`` refuses it
  before issuing anything (its eager runner is the boxing chain, which ``x.to_global`` calls);
* both autograds call the registry's rule: a spy put in its place sees the eager backward and the
  compiler's autograd pass call it, and neither module has a rule of its own for ``to_global``;
* the gradient through ``to_global`` (P -> B, S -> B, B -> S, S -> S) inside nn.Graph equals eager's: a step
  of SGD on the parameter leaves the same numbers in both;
* local -> global: each rank's local tensor gets its share of the gradient (B: parallel_id 0's gets it all).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import pyflow as flow
from pyflow.autograd import views as eager_views
from pyflow.compiler.passes import autograd as graph_autograd
from pyflow.errors import ArgumentTypeError, ShapeError
from pyflow.framework.interpreter import apply
from pyflow.framework.op_registry import SETS_LAYOUT, TensorMeta, get_op

run = flow.distributed.run
S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum


def test_to_global_is_an_op_that_sets_its_layout_and_has_a_backward_rule():
    op = get_op("to_global")
    assert op.sbp_signatures is SETS_LAYOUT and op.differentiable and callable(op.backward)
    (meta,) = op.infer([TensorMeta((4, 3), np.dtype(np.float32))],
                       {"placement": flow.placement("cpu", [0]), "sbp": S(1)})
    assert (meta.shape, meta.dtype, meta.sbp) == ((4, 3), np.float32, (S(1),))
    with pytest.raises(ShapeError, match=r"to_global: sbp.split\(dim=2\) splits dim 2, but the tensor has 2 dim"):
        op.infer([TensorMeta((4, 3), np.dtype(np.float32))], {"placement": flow.placement("cpu", [0]), "sbp": S(2)})


def test_apply_refuses_to_global_before_issuing_anything():
    x = flow.tensor(np.ones(3, np.float32))
    with pytest.raises(ArgumentTypeError, match="not run by interpreter.apply.*call x.to_global"):
        apply("to_global", [x], placement=flow.placement("cpu", [0]), sbp=B)


def test_neither_autograd_has_a_to_global_rule_of_its_own():
    assert "to_global" not in eager_views._RULES
    assert "to_global" not in inspect.getsource(graph_autograd)


class _Spy:
    """The registry's rule, counting its calls by the kind of tensor it got (eager or lazy)."""

    def __init__(self, rule):
        self.rule, self.calls = rule, []

    def __call__(self, ctx, g):
        self.calls.append(type(g).__name__)
        return self.rule(ctx, g)


def _train(src, dst, in_graph: bool, spy=None):
    """One SGD step on a parameter ``w`` of layout ``src``: loss = sum(c * y * y), y = w.to_global(dst); P: w is
    S(0) and the tensor boxed is the partial product ``x @ w`` (x S(1)).  Returns w after the step."""

    def body():
        p = flow.placement("cpu", [0, 1])
        wv = np.arange(8, dtype=np.float32).reshape(4, 2) / 8 - 0.3
        w = flow.tensor(wv, placement=p, sbp=S(0) if src == "P" else src).requires_grad_()
        opt = flow.optim.SGD([w], lr=0.1)
        x = flow.tensor(np.arange(12, dtype=np.float32).reshape(3, 4) / 12, placement=p, sbp=S(1))
        rows = 3 if src == "P" else 4
        c = flow.tensor(np.arange(1, 1 + rows * 2, dtype=np.float32).reshape(rows, 2), placement=p, sbp=B)

        def loss_of(w):
            y = (x @ w if src == "P" else w).to_global(sbp=dst)
            return (c * y * y).sum()

        if in_graph:
            class G(flow.nn.Graph):
                def __init__(self):
                    super().__init__()
                    self.add_optimizer(opt)

                def build(self):
                    loss = loss_of(w)
                    loss.backward()
                    return loss

            G()()
        else:
            loss_of(w).backward()
            opt.step()
        return w.numpy()

    op = get_op("to_global")
    rule, op.backward = op.backward, spy or op.backward
    try:
        return run(body, world_size=2)
    finally:
        op.backward = rule


@pytest.mark.parametrize("src, dst", [("P", B), (S(0), B), (B, S(1)), (S(0), S(1))],
                         ids=["P-B", "S0-B", "B-S1", "S0-S1"])
def test_the_graph_gradient_through_to_global_is_eager_s_and_both_call_the_op_s_rule(src, dst):
    eager_spy, graph_spy = _Spy(get_op("to_global").backward), _Spy(get_op("to_global").backward)
    eager = _train(src, dst, in_graph=False, spy=eager_spy)
    graph = _train(src, dst, in_graph=True, spy=graph_spy)
    assert eager_spy.calls and set(eager_spy.calls) == {"Tensor"}
    assert graph_spy.calls and set(graph_spy.calls) == {"LazyTensor"}
    for e, g in zip(eager, graph):
        np.testing.assert_allclose(g, e, rtol=1e-6)
    assert not np.allclose(eager[0], np.arange(8, dtype=np.float32).reshape(4, 2) / 8 - 0.3)   # it moved


@pytest.mark.parametrize("sbp, shares", [(B, lambda g, r: g if r == 0 else 0 * g),
                                         (S(0), lambda g, r: g[4 * r:4 * r + 4])])
def test_local_to_global_gives_each_rank_its_share_of_the_gradient(sbp, shares):
    def body():
        rank = flow.env.get_rank()
        x = flow.tensor(np.arange(4, dtype=np.float32) + 10 * rank, requires_grad=True)
        y = x.to_global(flow.placement("cpu", [0, 1]), sbp)
        (y * y).sum().backward()
        return y.numpy(), x.grad.numpy()

    for rank, (whole, grad) in enumerate(run(body, world_size=2)):
        np.testing.assert_array_equal(grad, shares(2 * whole, rank))


def test_inside_nn_graph_a_local_tensor_made_global_cannot_get_a_gradient_and_the_error_says_so():
    def body():
        w = flow.nn.Parameter(flow.tensor(np.ones((4, 2), np.float32)))
        opt = flow.optim.SGD([w], lr=0.1)

        class G(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.add_optimizer(opt)

            def build(self):
                loss = ((w * 1).to_global(flow.placement("cpu", [0, 1]), B) * 2).sum()
                loss.backward()
                return loss

        with pytest.raises(flow.errors.CompileError, match=r"the gradient of to_global_\d+ \(to_global of the local "
                           r"blob mul_\d+/out_0, at .*\): inside nn.Graph a local tensor made global cannot get a "
                           "gradient yet; make it global before the call"):
            G()()

    run(body, world_size=2)


def test_apply_refuses_to_global_on_a_global_tensor_too():
    """On a global tensor, apply reaches the signature choice: a clear refusal there, not a TypeError."""
    x = flow.tensor([1.0, 2.0], placement=flow.placement("cpu", [0]), sbp=flow.sbp.broadcast)
    with pytest.raises(ArgumentTypeError, match="x.to_global"):
        apply("to_global", [x], placement=x.placement, sbp=(flow.sbp.split(0),))
