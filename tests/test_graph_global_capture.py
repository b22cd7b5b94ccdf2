"""Eager tensors made global inside ``nn.Graph.build``: recorded, with eager's values.

* ``w.to_global(placement, sbp)`` of an eager *local* tensor (a captured tensor, a buffer) is a
  ``to_global`` op of the graph, not an eager call whose result the graph would see as a constant; with
  B axes the piece of coordinate 0 is everyone's, as eagerly, even when the ranks' data differ;
* a local *parameter* made global inside build cannot get its gradient in a graph yet: the compiler
  says so (make it global before the call), instead of training nothing;
* ``flow.tensor(data, placement=, sbp=)`` inside build is made eagerly and read by the graph as a
  variable, as a local ``flow.tensor(data)`` there is.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyflow as flow
from pyflow.errors import CompileError

run = flow.distributed.run
S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum

LAYOUTS = [(1, (B,)), (2, (B,)), (2, (S(0),)), (2, (S(1),)), (2, (P,)),
           (4, (B, S(0))), (4, (S(1), B)), (4, (B, B)), (4, (P, B))]


def _ranks(world):
    return [[0, 1], [2, 3]] if world == 4 else list(range(world))


@pytest.mark.parametrize("world, sbp", LAYOUTS, ids=[f"{w}-{''.join(map(str, s))}" for w, s in LAYOUTS])
def test_a_local_tensor_made_global_inside_build_is_recorded_and_gives_the_eager_value(world, sbp):
    def body():
        rank = flow.env.get_rank()
        p = flow.placement("cpu", _ranks(world))
        w = flow.tensor(np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * rank)   # the ranks' data differ
        x = flow.ones(2, 3, placement=p, sbp=(B,) * len(sbp))

        class Scale(flow.nn.Graph):
            def build(self, x):
                return w.to_global(p, sbp) * 2 + x.sum()

        g = Scale()
        y = g(x)
        eager = w.to_global(p, sbp) * 2 + x.sum()
        recorded = [op.type for op in g.job.ops if op.type == "to_global"]
        pieces = y.to_local().numpy(), eager.to_local().numpy()   # numpy() alone reads one B piece
        return y.numpy(), eager.numpy(), tuple(y.sbp), tuple(eager.sbp), recorded, pieces

    for got, want, got_sbp, want_sbp, recorded, (piece, eager_piece) in run(body, world_size=world):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(piece, eager_piece)
        assert got_sbp == want_sbp
        assert recorded   # an op of the graph, not an eager call seen as a constant


@pytest.mark.parametrize("world, sbp", [(2, (B,)), (4, (B, P))])
def test_a_0d_local_tensor_made_global_inside_build_gives_the_eager_value(world, sbp):
    def body():
        p = flow.placement("cpu", _ranks(world))
        w = flow.tensor(1.5 + flow.env.get_rank())

        class Scalar(flow.nn.Graph):
            def build(self):
                return w.to_global(p, sbp) * 2

        y, eager = Scalar()(), w.to_global(p, sbp) * 2
        return y.to_local().numpy(), eager.to_local().numpy(), y.numpy(), eager.numpy()

    for piece, eager_piece, got, want in run(body, world_size=world):
        np.testing.assert_array_equal(piece, eager_piece)
        np.testing.assert_array_equal(got, want)


def test_a_local_buffer_made_global_inside_build_trains_as_eagerly_and_a_local_parameter_is_a_compile_error():
    rng = np.random.default_rng(5)
    xv = rng.standard_normal((4, 3)).astype(np.float32)

    def body():
        p = flow.placement("cpu", [0, 1])
        x = flow.tensor(xv, placement=p, sbp=S(0))
        scale = flow.tensor(np.array([1.0, -2.0, 0.5], np.float32))   # a local buffer: needs no gradient

        def make():
            flow.manual_seed(3)
            model = flow.nn.Linear(3, 2).to_global(placement=p, sbp=B)
            return model, flow.optim.SGD(model.parameters(), lr=0.1)

        graph_model, graph_optim = make()
        eager_model, eager_optim = make()

        class Train(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.model = graph_model
                self.add_optimizer(graph_optim)

            def build(self, x):
                loss = (self.model(x * scale.to_global(p, B)) ** 2).mean()
                loss.backward()
                return loss

        g = Train()
        graph_losses = [g(x).numpy() for _ in range(2)]
        eager_losses = []
        for _ in range(2):
            loss = (eager_model(x * scale.to_global(p, B)) ** 2).mean()
            loss.backward()
            eager_optim.step()
            eager_optim.zero_grad()
            eager_losses.append(loss.numpy())

        local = flow.nn.Linear(3, 2)

        class LocalParameter(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.local = local
                self.add_optimizer(flow.optim.SGD(local.parameters(), lr=0.1))

            def build(self, x):
                loss = (x @ self.local.weight.to_global(p, B).T).sum()
                loss.backward()
                return loss

        with pytest.raises(CompileError, match="local tensor made global cannot get a gradient"):
            LocalParameter()(x)
        return graph_losses, eager_losses, graph_model.weight.numpy(), eager_model.weight.numpy()

    for graph_losses, eager_losses, graph_w, eager_w in run(body, world_size=2):
        np.testing.assert_allclose(graph_losses, eager_losses, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(graph_w, eager_w, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("world, sbp", [(1, B), (2, B), (2, S(0)), (2, S(1)), (2, P)])
def test_a_global_tensor_made_from_data_inside_build_is_a_variable_with_the_eager_value(world, sbp):
    data = np.arange(8, dtype=np.float32).reshape(2, 4) - 3

    def body():
        p = flow.placement("cpu", list(range(world)))
        w = flow.tensor(np.full((2, 4), 0.5, np.float32), placement=p, sbp=B)

        class Made(flow.nn.Graph):
            def build(self, w):
                c = flow.tensor(data, placement=p, sbp=sbp)
                return c * w, c

        y, c = Made()(w)
        eager = flow.tensor(data, placement=p, sbp=sbp) * w
        return y.numpy(), eager.numpy(), c.numpy(), tuple(c.sbp)

    for got, want, made, made_sbp in run(body, world_size=world):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(made, data)
        assert made_sbp == (sbp,)
