"""Global tensors in OneFlow's own tests: ``copy_``, ``fill_``, ``zero_``, ``is_cuda``, ``flow.empty(placement=,
sbp=)``, and ``optimizer.zero_grad(set_to_none=False)`` on global parameters (they raised "a global tensor has no
device").  A global in-place write boxes the value to the tensor's own placement and SBP and writes each rank's
piece, so every SBP keeps its meaning (a partial-sum tensor's pieces sum to the value)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.distributed import run
from pyflow.errors import ArgumentTypeError, AutogradError

S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
SBPS = {"S(0)": S(0), "S(1)": S(1), "B": B, "P": P}


@settings(max_examples=8, deadline=None)
@given(own=st.sampled_from(sorted(SBPS)), src=st.sampled_from(sorted(SBPS)), value=st.integers(-3, 3),
       seed=st.integers(0, 99))
def test_copy_fill_and_zero_on_global_tensors_give_the_logical_values(own, src, value, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((4, 2)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)

    def body():
        where = flow.placement("cpu", [0, 1])
        x = flow.tensor(a, placement=where, sbp=SBPS[own])
        y = flow.tensor(b, placement=where, sbp=SBPS[src])
        copied = x.clone().copy_(y)
        row = x.clone().copy_(flow.tensor(b[:1], placement=where, sbp=B))   # broadcast from one row
        filled, zeroed = x.clone().fill_(value), x.clone().zero_()
        return [(t.sbp, t.numpy()) for t in (copied, row, filled, zeroed)]

    for results in run(body, world_size=2):
        wants = [b, np.broadcast_to(b[:1], (4, 2)), np.full((4, 2), value, np.float32), np.zeros((4, 2))]
        for (sbp, got), want in zip(results, wants):
            assert sbp == (SBPS[own],)    # the tensor keeps its own layout
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_is_cuda_and_empty_of_a_global_tensor_and_a_local_source_is_a_clear_error():
    def body():
        on_cuda = flow.empty(2, 3, placement=flow.placement("cuda", [0, 1]), sbp=S(0))
        on_cpu = flow.empty(2, 3, placement=flow.placement("cpu", [0, 1]), sbp=B)
        with pytest.raises(ArgumentTypeError, match="make the local one global"):
            on_cpu.copy_(flow.ones(2, 3))
        with pytest.raises(ArgumentTypeError, match="no device but a placement"):
            on_cpu.device   # noqa: B018 - OneFlow: "Only local tensors have 'device'"
        return on_cuda.is_cuda, on_cpu.is_cuda, on_cuda.shape, on_cuda.sbp

    for result in run(body, world_size=2):
        assert result == (True, False, (2, 3), (S(0),))


def test_zero_grad_without_set_to_none_zeros_global_gradients_and_a_global_leaf_refuses_in_place():
    def body():
        w = flow.nn.Parameter(flow.ones(2, 3, placement=flow.placement("cpu", [0, 1]), sbp=B))
        opt = flow.optim.SGD([w], lr=0.1)
        (w * w).sum().backward()
        before = w.grad.numpy()
        opt.zero_grad(set_to_none=False)
        with pytest.raises(AutogradError):
            w.fill_(3.0)    # a leaf that requires grad: only under no_grad
        with flow.no_grad():
            w.fill_(3.0)
        return before, w.grad.numpy(), w.numpy()

    for before, after, w in run(body, world_size=2):
        np.testing.assert_array_equal(before, np.full((2, 3), 2.0))
        np.testing.assert_array_equal(after, np.zeros((2, 3)))
        np.testing.assert_array_equal(w, np.full((2, 3), 3.0))


@pytest.mark.parametrize("where_to", ["cuda", "cpu"])
def test_in_a_graph_a_global_tensor_moves_devices_and_a_global_made_in_build_is_a_variable(where_to):
    """OneFlow's graph tests: ``x.to("cuda")`` of a global tensor inside ``build`` is a ``to_global`` onto the
    same ranks' cuda devices (it failed: 'the output on cpu:0 is not on the op's device cuda:0'), and a global
    ``flow.ones(placement=, sbp=)`` made inside ``build`` is made eagerly and read as a variable (it failed in
    the matmul's actor: 'NoneType' object has no attribute 'device'); and both at once (an eager global made
    in build, moved there: its .to ran the eager boxing under the tracer, a variable of lazy pieces)."""
    a = np.arange(12, dtype=np.float32).reshape(4, 3)

    def body():
        cpu = flow.placement("cpu", [0, 1])

        class Moved(flow.nn.Graph):
            def build(self, x):
                return (x.to(where_to) * 2).to(flow.float64)

        class MadeInBuild(flow.nn.Graph):
            def build(self, x):
                return x @ flow.ones(3, 2, placement=cpu, sbp=B)

        class Both(flow.nn.Graph):
            def build(self, x):
                return x.to(where_to) @ flow.ones(3, 2, placement=cpu, sbp=B).to(where_to)

        x = flow.tensor(a, placement=cpu, sbp=S(0))
        moved, made, both = Moved()(x), MadeInBuild()(x), Both()(x)
        return moved.placement.type, moved.dtype, moved.numpy(), made.numpy(), both.placement.type, both.numpy()

    for kind, dtype, moved, made, both_kind, both in run(body, world_size=2):
        assert kind == both_kind == where_to and dtype == np.float64
        np.testing.assert_array_equal(moved, a * 2)
        np.testing.assert_allclose(made, a @ np.ones((3, 2)), rtol=1e-6)
        np.testing.assert_allclose(both, a @ np.ones((3, 2)), rtol=1e-6)

