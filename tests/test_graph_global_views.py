"""Views of split global tensors inside nn.Graph: the view ops' own SBP signatures, as in eager.

A view op (``pyflow/ops/views.py``) says which splits carry over (``OpDef.sbp_signatures``):
a reshape keeping the split dim, a narrow or an index on another dim, an unsqueeze, a
squeeze or a transpose keep an S(0) / S(1) blob split, so the graph boxes nothing for them (no all-gather
before the view, no B -> S after it) and each rank views its own piece with the op's attrs
(``pyflow/runtime/act.py``), as the global interpreter does eagerly.  The tests: random
chains of such views on 2 ranks give eager's values, SBPs and gradients, and the Plan has
no boxing task at all for a chain that keeps the split; views of a partial sum stay one;
and the one view inside build that no view op makes (``copy_``'s broadcast) still gets its
gradient.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow

run = flow.distributed.run
S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
SHAPE = (4, 6)


@st.composite
def view_chains(draw):
    """(split dim, steps): views that keep the split dim whole, each step drawn for the shape it sees."""
    split = draw(st.sampled_from([0, 1]))
    shape, dim, steps = list(SHAPE), split, []
    for _ in range(draw(st.integers(1, 4))):
        others = [d for d in range(len(shape)) if d != dim]
        kind = draw(st.sampled_from(["reshape", "narrow", "unsqueeze", "squeeze", "index", "transpose"]))
        if kind == "reshape":   # one other dim of a composite size into two, or two adjacent others into one
            halves = [d for d in others if shape[d] in (4, 6)]
            merges = [d for d in others if d + 1 in others]
            if halves and (not merges or draw(st.booleans())):
                d = draw(st.sampled_from(halves))
                new = shape[:d] + [2, shape[d] // 2] + shape[d + 1:]
                dim += dim > d
            elif merges:
                d = draw(st.sampled_from(merges))
                new = shape[:d] + [shape[d] * shape[d + 1]] + shape[d + 2:]
                dim -= dim > d
            else:
                continue
            steps.append(("reshape", tuple(new)))
            shape = new
        elif kind == "narrow":
            cut = [d for d in others if shape[d] > 1]
            if not cut:
                continue
            d = draw(st.sampled_from(cut))
            start = draw(st.integers(0, shape[d] - 1))
            length = draw(st.integers(1, shape[d] - start))
            steps.append(("narrow", (d, start, length)))
            shape[d] = length
        elif kind == "unsqueeze":
            d = draw(st.integers(0, len(shape)))
            steps.append(("unsqueeze", d))
            shape.insert(d, 1)
            dim += dim >= d
        elif kind == "squeeze":
            ones = [d for d in others if shape[d] == 1]
            if not ones:
                continue
            d = draw(st.sampled_from(ones))
            steps.append(("squeeze", d))
            del shape[d]
            dim -= dim > d
        elif kind == "transpose":   # the split moves with its dim; a reshape after it may have to copy
            if len(shape) < 2:
                continue
            a, b = draw(st.permutations(range(len(shape))))[:2]
            steps.append(("transpose", (a, b)))
            shape[a], shape[b] = shape[b], shape[a]
            dim = b if dim == a else a if dim == b else dim
        else:   # x[...]: the split dim whole (:), every other an int or a strided slice, maybe a None first
            index, new = ([None], [1]) if draw(st.booleans()) else ([], [])
            for d, n in enumerate(shape):
                if d == dim:
                    index.append(slice(None))
                    dim_after = len(new)
                    new.append(n)
                elif draw(st.booleans()):
                    index.append(draw(st.integers(0, n - 1)))
                else:
                    start = draw(st.integers(0, n - 1))
                    step = draw(st.integers(1, 2))
                    index.append(slice(start, None, step))
                    new.append(len(range(start, n, step)))
            steps.append(("index", tuple(index)))
            shape, dim = new, dim_after
    return split, steps, dim


def _views(x, steps):
    for kind, arg in steps:
        if kind == "reshape":
            x = x.reshape(*arg)
        elif kind == "narrow":
            x = x.narrow(*arg)
        elif kind == "unsqueeze":
            x = x.unsqueeze(arg)
        elif kind == "squeeze":
            x = x.squeeze(arg)
        elif kind == "transpose":
            x = x.transpose(*arg)
        else:
            x = x[arg]
    return x


def _boxed_views(plan) -> list:
    """The view ops of ``plan`` that read a boxed input (a boxing sub-graph on their edge)."""
    return [b["consumer"] for b in plan.boxings if plan.op_attrs[b["consumer"]][0] == "view"]


@settings(max_examples=30, deadline=None)
@given(view_chains())
def test_random_views_of_split_tensors_keep_the_split_box_nothing_and_give_eager_values_and_gradients(chain):
    split, steps, out_dim = chain
    xv = (np.arange(24, dtype=np.float32).reshape(SHAPE) - 11) / 8

    def body():
        p = flow.placement("cpu", [0, 1])
        x = flow.tensor(xv, placement=p, sbp=S(split))

        class Views(flow.nn.Graph):
            def build(self, x):
                return _views(x, steps)

        views = Views()
        got, want = views(x), _views(x, steps)
        forward = (tuple(got.sbp), got.numpy(), tuple(want.sbp), want.numpy(),
                   [t.op_type for t in views.plan.tasks.values() if t.kind == "boxing"])

        def make():
            w = flow.tensor(xv, placement=p, sbp=S(split)).requires_grad_()
            return w, flow.optim.SGD([w], lr=1.0)

        gw, gopt = make()
        ew, eopt = make()

        class Train(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.add_optimizer(gopt)

            def build(self):
                y = _views(gw, steps)
                loss = (y * y).sum()
                loss.backward()
                return loss

        train = Train()
        loss = train()
        eager_loss = (_views(ew, steps) ** 2).sum()
        eager_loss.backward()
        eopt.step()
        return forward, (loss.numpy(), eager_loss.numpy(), gw.numpy(), ew.numpy(), tuple(gw.sbp),
                         _boxed_views(train.plan))

    for forward, training in run(body, world_size=2):
        got_sbp, got, want_sbp, want, boxing_tasks = forward
        assert got_sbp == want_sbp == (S(out_dim),)   # the split moved with its dim, in the graph as in eager
        np.testing.assert_array_equal(got, want)
        assert boxing_tasks == []                     # no all-gather before a view, no B -> S after it
        loss, eager_loss, gw, ew, w_sbp, boxed_views = training
        np.testing.assert_allclose(loss, eager_loss, rtol=1e-6)
        np.testing.assert_allclose(gw, ew, rtol=1e-6, atol=1e-7)   # w - grad: the gradients agree
        assert w_sbp == (S(split),) and boxed_views == []


def test_views_of_a_partial_sum_stay_partial_and_box_nothing():
    """A view moves no value: the sum of the viewed pieces is the viewed sum (P -> P), in the graph as in eager."""
    xv = np.arange(24, dtype=np.float32).reshape(4, 6) / 8
    wv = np.arange(18, dtype=np.float32).reshape(6, 3) / 4

    def views(x, w):
        return (x @ w).reshape(2, 2, 3)[:, 1, ::2].T.unsqueeze(0).narrow(2, 1, 1)

    def body():
        p = flow.placement("cpu", [0, 1])
        x, w = flow.tensor(xv, placement=p, sbp=S(1)), flow.tensor(wv, placement=p, sbp=S(0))

        class Views(flow.nn.Graph):
            def build(self, x, w):
                return views(x, w)

        g = Views()
        got, want = g(x, w), views(x, w)
        return tuple(got.sbp), got.numpy(), tuple(want.sbp), want.numpy(), g.plan.boxings

    for got_sbp, got, want_sbp, want, boxings in run(body, world_size=2):
        assert got_sbp == want_sbp == (P,) and boxings == []
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("is_global", [False, True])
def test_the_broadcast_of_copy_is_the_expand_op_and_gets_its_gradient(is_global):
    """``y.copy_(v)`` of a smaller ``v`` inside build broadcasts ``v`` with the expand op: its gradient is
    the sum over the broadcast rows (expand's backward, ``sum_to``), locally and on B."""
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)

    def body():
        where = dict(placement=flow.placement("cpu", [0, 1]), sbp=B) if is_global else {}
        w = flow.tensor(np.arange(3, dtype=np.float32), **where).requires_grad_()
        x = flow.tensor(xv, **where)
        opt = flow.optim.SGD([w], lr=1.0)

        class Copy(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.add_optimizer(opt)

            def build(self, x):
                y = x * 1.0
                y.copy_(w * 2)
                loss = (y * x).sum()
                loss.backward()
                return loss

        return Copy()(x).numpy(), w.numpy()

    for loss, w in run(body, world_size=2) if is_global else [body()]:
        assert loss == (2 * np.arange(3) * xv).sum()
        np.testing.assert_array_equal(w, np.arange(3) - 2 * xv.sum(0))   # w - dloss/dw
