"""A Plan's views cost no copy (counts, never times; issue 31).

Properties: a ``view`` task's regst is an alias of its input's (no memory of its own) and its act
issues no VM instruction; a view of a view reads a copy only when the inner view is not contiguous;
the gradient of a permutation or a reshape is a view again (no fill + index_add scatter); the acts
record nothing for autograd (an optimizer update makes no snapshot clone of the parameter); the
zero-cost actor runtime makes a bounded number of Python calls per act.  Values stay bit for bit
those of eager, on the sequential interpreter and on the actor runtime alike.
"""

from __future__ import annotations

import collections
import cProfile
import pstats

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import nn
from pyflow.runtime import Runtime
from pyflow.runtime.pipeline import linear_pipeline_plan
from tests.helpers_training import assert_trains_like_eager


OUTPUT_COPY = 1   # the output task's value for the caller: a fresh tensor, one ``contiguous`` (clone) per call


def _graph(build, executor):
    class G(nn.Graph):
        def build(self, *xs):
            return build(*xs)
    g = G()
    g.executor = executor
    return g


def _instructions(g, *xs) -> collections.Counter:
    """The VM instructions of one call of ``g`` (made on this thread: sequential or deterministic)."""
    with flow.trace() as tracer:
        g(*xs).numpy()
    # (the VM fuses consecutive in-order ops, an act's among them: "fuse[a,b]" counts as a and b)
    return collections.Counter(name for r in tracer.records
                               for name in (r.name[len("fuse["):-1].split(",") if r.name.startswith("fuse[")
                                            else [r.name]))


@pytest.mark.parametrize("executor", ["sequential", "deterministic"])
@settings(max_examples=8, deadline=None)
@given(rows=st.integers(1, 4), cols=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_views_alias_their_input_and_issue_no_instruction(executor, rows, cols, seed):
    rng = np.random.default_rng(seed)
    x = flow.tensor(rng.standard_normal((rows * cols, 2)).astype(np.float32))
    w = flow.tensor(rng.standard_normal((rows, 3)).astype(np.float32))

    def build(x):   # reshape (of the input), transpose (of that view: contiguous, no copy), transpose
        return (x.reshape(rows, cols * 2).t() @ w).t() * 2.0

    g = _graph(build, executor)
    want = build(x).numpy()
    np.testing.assert_array_equal(g(x).numpy(), want)
    plan = g.plan
    views = [t for t in plan.tasks.values() if t.op_type == "view"]
    assert len(views) == 3
    for task in views:
        regst = plan.regsts[task.produced["out_0"]]
        assert regst.mem == "alias" and regst.alias_of == task.consumed["in_0"][0]
    counts = _instructions(g, x)
    assert counts["contiguous"] == OUTPUT_COPY, counts   # no view copies
    np.testing.assert_array_equal(g(x).numpy(), want)


def test_a_view_of_a_transposed_view_reads_a_copy_and_gives_eager_values():
    x = flow.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    g = _graph(lambda x: x.t().reshape(-1) + 1.0, "sequential")
    np.testing.assert_array_equal(g(x).numpy(), (x.t().reshape(-1) + 1.0).numpy())
    assert _instructions(g, x)["contiguous"] == OUTPUT_COPY + 1   # the reshape of the transpose: one copy


def _train_step(executor):
    flow.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = flow.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    class Train(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = loss_fn(self.model(x), y)
            loss.backward()
            return loss
    g = Train()
    g.executor = executor
    return g, model, opt, loss_fn


@pytest.mark.parametrize("executor", ["sequential", "deterministic", None])
def test_a_training_step_copies_no_view_records_no_autograd_and_equals_eager(executor):
    rng = np.random.default_rng(1)
    data = [(flow.tensor(rng.standard_normal((4, 6)).astype(np.float32)),
             flow.tensor(rng.integers(0, 3, size=4).astype(np.int64))) for _ in range(3)]
    g, model, _, _ = _train_step(executor)
    _, eager_model, eager_opt, loss_fn = _train_step("sequential")
    assert_trains_like_eager(g, model, eager_model, eager_opt, loss_fn, data)
    if executor is None:
        return   # (the actor threads' instructions are not this thread's to trace)
    views = [t for t in g.plan.tasks.values() if t.op_type == "view"]
    assert views and all(g.plan.regsts[t.produced["out_0"]].mem == "alias" for t in views)
    counts = _instructions(g, *data[0])
    # before: every view a contiguous copy, each weight's transpose's gradient a fill + index_add (with its
    # copy), each parameter update a snapshot clone for autograd
    # now: the output's copy, the scatter_add's start (a copy of its input), and the two reshapes of a
    # transposed gradient (they copy in eager too), out of 27 view tasks
    assert counts["contiguous"] <= OUTPUT_COPY + 3 < len(views) and counts["index_add"] == 0, counts
    if executor == "sequential":   # (the actor runtime adds its own callbacks: an access per act)
        assert sum(counts.values()) <= 65, counts   # 125 before (each op of a fused run counted since)


def test_a_linear_weights_gradient_is_made_in_the_weights_layout_as_in_eager():
    """Inside build ``w.T`` knows its run-time layout (``LazyTensor.stride``), so matmul's backward makes the
    weight's gradient as eager does (``ops/linalg.py``): a (out, batch) @ (batch, in) product, contiguous like
    ``w``, not its transpose read strided by the optimizer's update."""
    seen = {}

    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 4)
            self.add_optimizer(flow.optim.SGD(self.lin.parameters(), lr=0.1))

        def build(self, x):
            w = self.lin.weight
            seen.update(w=w.stride(), wt=w.T.stride(), wtt=w.T.T.stride(), wt1=w.T.stride(1), wtm1=w.T.stride(-1))
            loss = self.lin(x).sum()
            loss.backward()
            return loss

    g = G()
    g(flow.randn(3, 6))
    assert seen == {"w": (6, 1), "wt": (1, 6), "wtt": (6, 1), "wt1": 6, "wtm1": 6}
    products = [g.job.blobs[op.outputs[0]].shape for op in g.job.ops if op.type == "matmul"]
    assert products == [(3, 4), (4, 6)], products   # the forward x @ w.T, then w's gradient g^T @ x


def test_zero_cost_acts_make_few_python_calls():
    """The actor runtime's own cost per act (zero-cost kernels, every actor on the caller's thread), counted
    by cProfile: each act handles two messages (its input arriving, its output coming back)."""
    def zero_cost(plan, task, ins, outs, j, call):
        return outs
    plan = linear_pipeline_plan([f"stage{i}" for i in range(8)], regst_num=2)
    calls = 50
    with Runtime(plan, deterministic=True, act_fn=zero_cost, max_calls_in_flight=4, timeline=0) as runtime:
        runtime.launch([]).result()
        profile = cProfile.Profile()
        profile.enable()
        handles = [runtime.launch([]) for _ in range(calls)]
        for handle in handles:
            handle.result()
        profile.disable()
    per_act = pstats.Stats(profile).total_calls / (calls * len(plan.tasks))
    assert per_act < 90, per_act   # 118 before issue 31's per-act work
