"""Basic indexing ``x[index]`` (ints, slices, None, ...) is the view op ``slice_view`` (issue 30).

Properties, over random basic indices on small shapes:

* the value is numpy's, and a view of ``x``'s storage (a write through it changes ``x``);
* eager autograd and nn.Graph use the op's one backward rule: the gradients equal numpy's
  (``g`` scattered into zeros) bit for bit, and the graph's equal eager's; the graph's backward
  is no fill + ``index_add`` scatter (the compiler's old second rule for a view no op made);
* on two ranks: a split of a dim the index keeps whole stays a split (no boxing to B), any other
  split is made B first; values and gradients are the local ones, for S and B inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.framework.op_registry import get_op

run = flow.distributed.run
S, B = flow.sbp.split, flow.sbp.broadcast


@st.composite
def shapes_and_indices(draw, max_dims=3):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=max_dims)))
    index, dims = [], list(shape)
    ellipsis = draw(st.booleans())
    for n in dims[:draw(st.integers(0, len(dims)))]:
        kind = draw(st.sampled_from(["int", "slice", "whole", "none"]))
        if kind == "none":
            index.append(None)
        if kind == "int":
            index.append(draw(st.integers(-n, n - 1)))
        elif kind == "whole":
            index.append(slice(None))
        else:
            start, stop = draw(st.integers(-n - 1, n + 1)), draw(st.one_of(st.none(), st.integers(-n - 1, n + 1)))
            index.append(slice(start, stop, draw(st.integers(1, 3))))
    if ellipsis:
        index.insert(draw(st.integers(0, len(index))), Ellipsis)
    return shape, tuple(index)


def _weights(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _numpy_grad(shape, index, g):
    want = np.zeros(shape, np.float32)
    want[index] += g
    return want


@settings(max_examples=40, deadline=None)
@given(case=shapes_and_indices(), seed=st.integers(0, 2**16))
def test_basic_index_is_a_view_with_numpy_values_and_the_op_backward(case, seed):
    shape, index = case
    xv = _weights(shape, seed)
    x = flow.tensor(xv).requires_grad_()
    y = x[index]
    np.testing.assert_array_equal(y.numpy(), xv[index])
    assert type(y.grad_fn).__name__ == "SliceViewBackward0"   # the op's node, no wrapper's
    g = _weights(y.shape, seed + 1)
    (y * flow.tensor(g)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), _numpy_grad(shape, index, g))
    base = flow.tensor(xv)
    view = base[index]
    view.fill_(7.0)
    changed = xv.copy()
    changed[index] = 7.0
    np.testing.assert_array_equal(base.numpy(), changed)


@settings(max_examples=12, deadline=None)
@given(case=shapes_and_indices(), seed=st.integers(0, 2**16))
def test_graph_gradients_of_basic_indexing_equal_eager_ones(case, seed):
    shape, index = case
    xv = _weights(shape, seed)
    gv = flow.tensor(_weights(np.empty(shape)[index].shape, seed + 1))

    def make():
        w = flow.tensor(xv).requires_grad_()
        return w, flow.optim.SGD([w], lr=1.0)

    gw, gopt = make()
    ew, eopt = make()

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.add_optimizer(gopt)

        def build(self, g):
            loss = (gw[index] * g).sum()
            loss.backward()
            return loss

    graph = G()
    got = graph(gv).numpy()
    loss = (ew[index] * gv).sum()
    loss.backward()
    eopt.step()
    np.testing.assert_array_equal(got, loss.numpy())
    np.testing.assert_array_equal(gw.numpy(), ew.numpy())
    np.testing.assert_array_equal(gw.numpy(), xv - _numpy_grad(shape, index, gv.numpy()))   # SGD, lr 1
    ops = [op.type for op in graph.job.ops]
    assert "index_add" not in ops, ops   # the op's rule (pads), not a scatter of positions


def test_slice_view_signatures_keep_a_split_dim_the_index_keeps_whole():
    index = (1, None, None, (0, None, 1), (0, 2, 1))   # x[1, None, None, :, :2]
    sigs = get_op("slice_view").sbp_signatures([(4, 6, 3)], [(1, 1, 6, 2)], {"index": index})
    assert [str(s) for s in sigs] == ["(S(1)) -> S(2)", "(P) -> P"]


def _global_case(shape, index, sbp, seed):
    """Value and gradient of x[index] for a global x on two ranks, and the result's SBP."""
    xv, p = _weights(shape, seed), flow.placement("cpu", [0, 1])
    x = flow.tensor(xv, placement=p, sbp=sbp).requires_grad_()
    y = x[index]
    g = _weights(y.shape, seed + 1)
    (y * flow.tensor(g, placement=p, sbp=B)).sum().backward()
    return y.numpy(), y.sbp, x.grad.numpy(), g


@settings(max_examples=6, deadline=None)
@given(case=shapes_and_indices(), seed=st.integers(0, 2**16), split=st.booleans())
def test_global_basic_indexing_gives_the_local_values_and_gradients(case, seed, split):
    shape, index = case
    sbp = S(0) if split and shape[0] >= 2 else B

    def body():
        return _global_case(shape, index, sbp, seed)

    xv = _weights(shape, seed)
    for value, _, grad, g in run(body, world_size=2):
        np.testing.assert_array_equal(value, xv[index])
        np.testing.assert_array_equal(grad, _numpy_grad(shape, index, g))


def test_a_split_the_index_keeps_whole_stays_split_and_others_become_broadcast():
    def body():
        kept = _global_case((4, 3), (slice(None), 1), S(0), 0)[1]
        cut = _global_case((4, 3), (slice(1, 3), 1), S(0), 0)[1]
        moved = _global_case((4, 3), (None, Ellipsis, slice(None, None, 2)), S(0), 0)[1]
        return kept, cut, moved

    for kept, cut, moved in run(body, world_size=2):
        assert kept == (S(0),) and cut == (B,) and moved == (S(1),)


@pytest.mark.parametrize("sbp", ["S0", "B"])
def test_graph_gradients_of_global_basic_indexing_equal_eager_ones(sbp):
    wv = _weights((4, 3), 3)

    def body():
        p = flow.placement("cpu", [0, 1])
        layout = S(0) if sbp == "S0" else B

        def make():
            w = flow.tensor(wv, placement=p, sbp=layout).requires_grad_()
            return w, flow.optim.SGD([w], lr=1.0)

        gw, gopt = make()
        ew, eopt = make()

        def loss_of(w):
            return (w[1:, None, ::2] * w[:3, None, 0:3:2]).sum() + w[:, 1].sum()

        class G(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.add_optimizer(gopt)

            def build(self):
                loss = loss_of(gw)
                loss.backward()
                return loss

        got = G()().numpy()
        loss = loss_of(ew)
        loss.backward()
        eopt.step()
        return got, loss.numpy(), gw.numpy(), ew.numpy()

    for got, want, gw, ew in run(body, world_size=2):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(gw, ew)


# --- x[index] = value: the slice_update op ------------------------------------------------------------------------


@st.composite
def writes(draw):
    shape, index = draw(shapes_and_indices())
    region = np.empty(shape)[index].shape
    value_shape = region[draw(st.integers(0, len(region))):]   # a trailing part: it broadcasts
    value_shape = tuple(1 if draw(st.booleans()) else n for n in value_shape)
    return shape, index, value_shape


def _numpy_write_grads(shape, index, value_shape, g):
    kept = g.copy()
    kept[index] = 0.0
    region = np.broadcast_to(g[index], np.empty(shape)[index].shape)
    lead = region.ndim - len(value_shape)
    summed = region.sum(axis=tuple(range(lead)))
    return kept, summed.sum(axis=tuple(d for d, n in enumerate(value_shape) if n == 1), keepdims=True)


@settings(max_examples=40, deadline=None)
@given(case=writes(), seed=st.integers(0, 2**16))
def test_a_basic_write_is_the_slice_update_op_with_numpy_values_and_gradients(case, seed):
    shape, index, value_shape = case
    xv, vv, g = _weights(shape, seed), _weights(value_shape, seed + 1), _weights(shape, seed + 2)
    x = flow.tensor(xv).requires_grad_()
    v = flow.tensor(vv).requires_grad_()
    y = x * 1.0
    y[index] = v
    assert type(y.grad_fn).__name__ == "SliceUpdateBackward0"   # the op's node, no wrapper's
    want = xv.copy()
    want[index] = vv
    np.testing.assert_array_equal(y.numpy(), want)
    (y * flow.tensor(g)).sum().backward()
    kept, summed = _numpy_write_grads(shape, index, value_shape, g)
    np.testing.assert_array_equal(x.grad.numpy(), kept)
    np.testing.assert_allclose(v.grad.numpy(), summed.reshape(value_shape), rtol=1e-5, atol=1e-6)
    scalar = flow.tensor(xv)
    scalar[index] = 2.5
    want[index] = 2.5
    np.testing.assert_array_equal(scalar.numpy(), want)


def test_a_write_from_an_overlapping_part_of_itself_reads_the_old_values():
    x = flow.tensor(np.arange(5, dtype=np.float32))
    x[1:] = x[:-1]
    assert x.tolist() == [0.0, 0.0, 1.0, 2.0, 3.0]


def test_a_write_inside_a_graph_is_the_op_and_equals_eager():
    xv, vv = _weights((4, 3), 5), _weights((3,), 6)

    def step(x, v):
        y = x * 2.0
        y[1:3, None] = v
        y[0, ::2] = -1.0
        return y

    class G(flow.nn.Graph):
        def build(self, x, v):
            return step(x, v)

    x, v = flow.tensor(xv), flow.tensor(vv)
    graph = G()
    np.testing.assert_array_equal(graph(x, v).numpy(), step(x, v).numpy())
    assert [op.type for op in graph.job.ops].count("slice_update") == 2


def _global_write(shape, index, value_shape, sbp, seed):
    p = flow.placement("cpu", [0, 1])
    x = flow.tensor(_weights(shape, seed), placement=p, sbp=sbp)
    x[index] = flow.tensor(_weights(value_shape, seed + 1))   # a local value: rank 0's, made B
    name, signature = flow.framework.interpreter.global_interpreter().last_signature
    return x.numpy(), x.sbp, str(signature)


@settings(max_examples=6, deadline=None)
@given(case=writes(), seed=st.integers(0, 2**16), split=st.booleans())
def test_global_basic_writes_give_the_local_values_and_keep_the_layout(case, seed, split):
    shape, index, value_shape = case
    sbp = S(0) if split and shape[0] >= 2 else B
    want = _weights(shape, seed)
    want[index] = _weights(value_shape, seed + 1)
    for value, layout, _ in run(lambda: _global_write(shape, index, value_shape, sbp, seed), world_size=2):
        np.testing.assert_array_equal(value, want)
        assert layout == (sbp,)


def test_a_global_write_keeps_a_split_of_a_dim_the_index_keeps_whole():
    def body():
        return _global_write((4, 3), (slice(None), 1), (1,), S(0), 0)[2], \
            _global_write((4, 3), (1, slice(None)), (3,), S(0), 0)[2], \
            _global_write((4, 1), (1, slice(None)), (1,), S(0), 0)[2]

    for kept, other, cut in run(body, world_size=2):   # (the result is boxed back into x's S(0) after)
        assert (kept, other, cut) == ("(S(0), S(0)) -> S(0)", "(S(1), S(1)) -> S(1)", "(B, B) -> B")


def test_graph_gradients_through_a_write_equal_eager_ones():
    def make():
        w = flow.tensor(_weights((4, 3), 7)).requires_grad_()
        v = flow.tensor(_weights((2,), 8)).requires_grad_()
        return w, v, flow.optim.SGD([w, v], lr=1.0)

    g = flow.tensor(_weights((4, 3), 9))

    def loss_of(w, v):
        y = w * 1.0
        y[1:3, 0] = v * 2.0
        y[None, 3, ::2] = 0.5
        return (y * g).sum()

    gw, gv, gopt = make()
    ew, ev, eopt = make()

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.add_optimizer(gopt)

        def build(self):
            loss = loss_of(gw, gv)
            loss.backward()
            return loss

    got = G()().numpy()
    loss = loss_of(ew, ev)
    loss.backward()
    eopt.step()
    np.testing.assert_array_equal(got, loss.numpy())
    np.testing.assert_array_equal(gw.numpy(), ew.numpy())
    np.testing.assert_array_equal(gv.numpy(), ev.numpy())


def test_global_writes_take_numbers_lists_and_arrays():
    def body():
        x = flow.tensor(np.zeros((4, 2), np.float32), placement=flow.placement("cpu", [0, 1]), sbp=S(0))
        x[1] = [1.0, 2.0]
        x[2:, 1] = np.array([5.0, 6.0])
        x[0, 0] = 3
        return x.numpy(), x.sbp

    for value, layout in run(body, world_size=2):
        assert value.tolist() == [[3.0, 0.0], [1.0, 2.0], [0.0, 5.0], [0.0, 6.0]] and layout == (S(0),)


def test_a_list_read_as_a_tuple_of_basic_items_is_the_op_too():
    x = flow.tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).requires_grad_()
    y = x[[slice(0, 2), 1]]   # PyTorch reads it as x[0:2, 1]
    assert type(y.grad_fn).__name__ == "SliceViewBackward0" and y.tolist() == [1.0, 4.0]
    z = x * 1.0
    z[[0, slice(None)]] = 0.0
    assert type(z.grad_fn).__name__ == "SliceUpdateBackward0" and z.tolist() == [[0.0, 0.0, 0.0], [3.0, 4.0, 5.0]]
