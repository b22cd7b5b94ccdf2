"""What a compiled call costs beyond its ops, in counts (never times; issue 31).

Properties: a view of a view is laid out by the view op's own rule over the first view's strides, as in
eager (a permute of a permute copies nothing; a reshape that cannot view still copies), with values bit for
bit those of eager; a training step of an MLP then issues no ``release_tensor`` and no copy of a transposed
weight per call; a launch checks its inputs and makes its context from what the Runtime derived once (no walk
of the Plan per call); the deterministic delivery loop hands a message to its actor without a call of its
own (no ``handle``, no ``done`` per message), and an act's messages to its own thread are queued without
``dispatch``.
"""

from __future__ import annotations

import collections
import cProfile
import gc
import itertools
import pstats

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import nn
from pyflow.runtime import Runtime
from pyflow.runtime.pipeline import linear_pipeline_plan


def _graph(build):
    class G(nn.Graph):
        def build(self, *xs):
            return build(*xs)
    g = G()
    g.executor = "deterministic"   # the actor runtime, its instructions issued on this thread
    return g


def _instructions(g, *xs) -> collections.Counter:
    """The VM instructions of one call ``g(*xs)`` and the reads of its outputs, and nothing else: the tensors that
    died before it (some only when the cycle collector finds them) are released first, and the collector waits."""
    gc.collect()
    flow.zeros(1).numpy()   # (an op issues the releases of tensors that died before it)
    gc.disable()
    try:
        with flow.trace() as tracer:
            out = g(*xs)
            for y in out if isinstance(out, (list, tuple)) else [out]:
                y.numpy()
    finally:
        gc.enable()
    # (the VM fuses consecutive in-order ops, an act's among them: "fuse[a,b]" counts as a and b)
    return collections.Counter(name for r in tracer.records
                               for name in (r.name[len("fuse["):-1].split(",") if r.name.startswith("fuse[")
                                            else [r.name]))


PERMS = st.sampled_from(list(itertools.permutations(range(3))))


@settings(max_examples=10, deadline=None)
@given(p=PERMS, q=PERMS, seed=st.integers(0, 2**16))
def test_a_permute_of_a_permute_copies_nothing_and_equals_eager(p, q, seed):
    x = flow.tensor(np.random.default_rng(seed).standard_normal((2, 3, 4)).astype(np.float32))

    def build(x):
        return x.permute(*p).permute(*q) * 2.0
    g = _graph(build)
    want = build(x)
    for _ in range(2):
        got = g(x)
        assert tuple(got.shape) == tuple(want.shape)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    counts = _instructions(g, x)
    assert counts["contiguous"] <= 1, counts   # the output's own copy (handed to the caller); no view's copy
    assert counts["release_tensor"] == 0, counts


def test_a_reshape_that_cannot_view_its_strided_input_still_copies_as_eager_does():
    x = flow.randn(3, 4)

    def build(x):
        return x.t().reshape(-1) + 1.0, x.t().expand(2, 4, 3).sum(dim=0)
    g = _graph(build)
    want = build(x)
    for _ in range(2):
        for got, expected in zip(g(x), want):
            np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_a_training_step_copies_no_transposed_weight_and_releases_nothing_per_call():
    flow.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    eager = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    eager.load_state_dict(model.state_dict())
    opt = flow.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    eager_opt = flow.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
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
    g.executor = "deterministic"
    rng = np.random.default_rng(5)
    data = [(flow.tensor(rng.standard_normal((4, 6)).astype(np.float32)),
             flow.tensor(rng.integers(0, 3, size=4).astype(np.int64))) for _ in range(3)]

    def eager_step(x, y):
        eager_opt.zero_grad()
        loss = loss_fn(eager(x), y)
        loss.backward()
        eager_opt.step()
        return loss
    for x, y in data[:2]:
        np.testing.assert_array_equal(g(x, y).numpy(), eager_step(x, y).numpy())
    counts = _instructions(g, *data[2])
    eager_step(*data[2])
    assert counts["release_tensor"] == 0, counts      # before: the copies of transposed weights' gradients
    assert counts["contiguous"] <= 2, counts          # 4 before
    for p, q in zip(model.parameters(), eager.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


# --- the runtime's own work per call and per message -----------------------------------------------------------

def _profile(stages: int, calls: int = 20) -> tuple[pstats.Stats, int, int]:
    """cProfile of ``calls`` calls of a ``stages``-stage zero-cost pipeline, on one thread; (stats, acts,
    messages delivered)."""
    def zero_cost(plan, task, ins, outs, j, call):
        return outs
    plan = linear_pipeline_plan([f"stage{i}" for i in range(stages)], regst_num=2)
    with Runtime(plan, deterministic=True, act_fn=zero_cost, max_calls_in_flight=4, timeline=0) as runtime:
        runtime.launch([]).result()
        before = runtime.home.enqueued
        profile = cProfile.Profile()
        profile.enable()
        handles = [runtime.launch([]) for _ in range(calls)]
        for handle in handles:
            handle.result()
        profile.disable()
        messages = runtime.home.enqueued - before
    return pstats.Stats(profile), calls * len(plan.tasks), messages


def _calls_of(stats: pstats.Stats, file_end: str, name: str) -> int:
    return sum(entry[1] for (file, _, function), entry in stats.stats.items()
               if file.endswith(file_end) and function == name)


def test_a_launch_does_not_walk_the_plan():
    for stages in (4, 32):
        stats, _, _ = _profile(stages)
        assert _calls_of(stats, "call.py", "<genexpr>") == 0   # 2 per task per call before (counting inputs...)
        assert _calls_of(stats, "call.py", "check") == 20 and _calls_of(stats, "call.py", "context") == 20


def test_a_delivered_message_reaches_its_actor_without_a_call_of_the_loops_own():
    stats, acts, messages = _profile(16)
    assert messages > 2 * 20 * 16
    assert _calls_of(stats, "thread.py", "handle") == 0     # inlined in deliver_until (no construct here)
    assert _calls_of(stats, "call.py", "done") == 0         # the wait's predicate is the Event's own is_set
    assert _calls_of(stats, "thread.py", "_call_of") <= 2 * 20   # commands only (a launch, a call_done per call):
    #                                                               a regst message's call is read inline
    assert _calls_of(stats, "base.py", "on_returned") == 0 and _calls_of(stats, "base.py", "dispatch") == 0
    assert _calls_of(stats, "~", "<method 'get' of 'dict' objects>") <= acts   # (one per act: its call's context)
    assert stats.total_calls / acts < 45, stats.total_calls / acts   # 54 before
