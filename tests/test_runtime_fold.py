"""The Runtime runs view tasks inside their readers' acts (``pyflow/runtime/fold.py``; issue 31).

* The folded Plan is a Plan: every regst a task reads lists it as a consumer and comes from a task that is
  there; no folded view is left, and no reader reads one root twice.
* A training step, and random chains of views of inputs, variables and planned regsts, give eager's values bit
  for bit, on the threaded and the deterministic runtime, as with ``fold=False``; with gradient accumulation
  (views acting k times a call) and a cuda stage, the sequential interpreter's, every regst back at the end.
* It pays in messages (counted, never timed): a call of a folded runtime delivers fewer messages than the same
  Plan with every view an actor, by two per folded view at least.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import nn
from pyflow.runtime import Runtime
from pyflow.runtime.fold import fold_views
from tests.helpers_training import assert_trains_like_eager
from tests.test_runtime import two_training_calls_like_run_plan
from tests.test_runtime_step_speed import _mlp, _Train


def _links_hold(plan) -> None:
    """Every link of ``plan`` goes both ways, between tasks and regsts it has."""
    for tid, task in plan.tasks.items():
        for key, ids in task.consumed.items():
            for rid in ids:
                assert rid in plan.regsts, (task.op_name, key, rid)
                assert tid in plan.regsts[rid].consumers, (task.op_name, plan.regsts[rid].lbn)
        reads = [rid for ids in task.consumed.values() for rid in ids]
        assert len(reads) == len(set(reads)), f"{task.op_name} reads a regst twice"
        for rid in task.produced.values():
            assert plan.regsts[rid].producer == tid
    for rid, regst in plan.regsts.items():
        assert regst.producer in plan.tasks, regst.lbn
        for consumer in regst.consumers:
            assert rid in [r for ids in plan.tasks[consumer].consumed.values() for r in ids], regst.lbn
    assert sorted(plan.order) == sorted(plan.tasks)


def test_a_training_steps_views_all_fold_and_the_plan_stays_whole():
    model, opt, loss_fn = _mlp([6, 8, 3], 0)
    g = _Train(model, opt, loss_fn)
    g(flow.ones(4, 6), flow.tensor(np.array([0, 1, 2, 0], np.int64))).numpy()
    views = {tid for tid, t in g.plan.tasks.items() if t.op_type == "view"}
    assert len(views) >= 6   # the weights' transposes, autograd's reshapes
    folded, chains = fold_views(g.plan)
    _links_hold(folded)
    assert not views & set(folded.tasks)   # all of them folded
    assert {v for chain in chains.values() for _, views_ in chain for v in views_} == views
    assert len(folded.order) == len(g.plan.order) - len(views)
    assert folded.memory is g.plan.memory   # no memory of their own: the layout is the compiler's
    assert g.runtime.plan.tasks.keys() == folded.tasks.keys()   # what nn.Graph's runtime runs
    assert not any(r.op_name.startswith("view") for r in g.runtime.timeline())


@settings(max_examples=6, deadline=None)
@given(widths=st.lists(st.integers(1, 6), min_size=3, max_size=4), seed=st.integers(0, 50),
       executor=st.sampled_from([None, "deterministic"]))
def test_a_folded_training_step_trains_as_eager_does(widths, seed, executor):
    rng = np.random.default_rng(seed)
    data = [(flow.tensor(rng.standard_normal((3, widths[0])).astype(np.float32)),
             flow.tensor(rng.integers(0, widths[-1], size=3).astype(np.int64))) for _ in range(3)]
    model, opt, loss_fn = _mlp(widths, seed)
    g = _Train(model, opt, loss_fn)
    g.executor = executor
    eager_model, eager_opt, _ = _mlp(widths, seed)
    assert_trains_like_eager(g, model, eager_model, eager_opt, loss_fn, data)


_VIEWS = {
    "t": lambda x: x.t() if x.dim() == 2 else x,
    "reshape": lambda x: x.reshape(-1),
    "unsqueeze": lambda x: x.unsqueeze(0),
    "narrow": lambda x: x.narrow(0, 0, max(1, x.shape[0] - 1)) if x.dim() and x.shape[0] else x,
    "permute": lambda x: x.permute(*reversed(range(x.dim()))),
    "flatten": lambda x: x.flatten(),
}


@settings(max_examples=25, deadline=None)
@given(first=st.lists(st.sampled_from(sorted(_VIEWS)), max_size=4),
       second=st.lists(st.sampled_from(sorted(_VIEWS)), max_size=3),
       root=st.sampled_from(["input", "variable", "planned"]), twice=st.booleans(),
       executor=st.sampled_from([None, "deterministic"]), shape=st.sampled_from([(2, 3), (3, 3), (4, 1)]))
def test_chains_of_views_of_any_root_give_eagers_values_folded_or_not(first, second, root, twice, executor, shape):
    """Views of an input, a parameter or an op's output, one reader or two, read through a chain or beside the
    root itself (``twice``: a reader that would read one root twice keeps its view an actor)."""
    w = nn.Parameter(flow.tensor(np.arange(np.prod(shape), dtype=np.float32).reshape(shape)))

    def program(x):
        base = {"input": x, "variable": w, "planned": x * 3}[root]
        a = base
        for name in first:
            a = _VIEWS[name](a)
        b = a
        for name in second:
            b = _VIEWS[name](b)
        out = [a * 2, b.sum()]
        if twice:
            out.append(base * a.flatten()[0])   # one op reading the root and a view of it
        return out

    class Views(nn.Graph):
        def __init__(self):
            super().__init__()
            self.w = w

        def build(self, x):
            return program(x)

    x = flow.tensor(np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape))
    expected = [t.numpy() for t in program(x)]
    g = Views()
    g.executor = executor
    for _ in range(2):   # the second call reuses what the first made (kept views)
        for got, want in zip(g(x), expected):
            np.testing.assert_array_equal(got.numpy(), want)
    folded, _ = fold_views(g.plan)
    _links_hold(folded)
    with Runtime(g.plan, g.job, deterministic=True, fold=False) as unfolded:
        for got, want in zip(unfolded.launch([x]).result(), expected):
            np.testing.assert_array_equal(got.numpy(), want)


def _messages_per_call(g, x, fold: bool) -> tuple:
    with Runtime(g.plan, g.job, deterministic=True, fold=fold) as rt:
        rt.launch([x]).result()
        before = rt.home.enqueued
        rt.launch([x]).result()
        return rt.home.enqueued - before, len(rt.plan.tasks)


@pytest.mark.parametrize("views", [1, 3])
def test_each_folded_view_saves_its_actors_messages(views):
    class Chain(nn.Graph):
        def build(self, x):
            for _ in range(views):
                x = x.t()
            return x * 2

    g = Chain()
    x = flow.ones(2, 3)
    g(x).numpy()
    folded, with_actors = _messages_per_call(g, x, True), _messages_per_call(g, x, False)
    assert with_actors[1] - folded[1] == views   # tasks
    assert with_actors[0] - folded[0] >= 2 * views   # the view's input in and back, at least


@settings(max_examples=4, deadline=None)
@given(k=st.integers(1, 3), cuda_stage=st.booleans(), seed=st.sampled_from([None, 5]))
def test_a_folded_runtime_with_gradient_accumulation_matches_the_sequential_interpreter(k, cuda_stage, seed):
    """k micro-batches (views inside the loop act k times a call), optionally a cuda stage: two calls of a folded
    runtime, threaded or deterministic, give run_plan's losses and weights bit for bit, and every regst comes back."""
    rt, g_rt = two_training_calls_like_run_plan(k, cuda_stage, seed, fold=True)
    assert len(rt.plan.tasks) < len(g_rt.plan.tasks)   # a Linear's weight.T at least
