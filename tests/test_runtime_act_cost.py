"""What one act and one message of the actor runtime cost, in counts (never times; issue 31).

Properties: with zero-cost kernels and every actor on the caller's thread, an act makes a bounded number
of Python calls; the deterministic delivery loop makes no call of its own for a message at the queue's head
(``take`` only where it cannot take the head: an empty queue, a parked message), not ``take`` + ``deliver`` + a
lock; recording an act never asks for the thread's rank context
(``env.current()``, ``current_vm()``); and a compiled call turns the Python numbers of its ops into
tensors once per task, not at every act (no ``tensor`` instruction per call), with values bit for bit
those of eager, whatever the numbers' types and the tensors' dtypes.
"""

from __future__ import annotations

import collections
import cProfile
import pstats

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import nn
from pyflow.runtime import Runtime
from pyflow.runtime.pipeline import linear_pipeline_plan

STAGES, CALLS = 16, 40


def _zero_cost_profile() -> tuple[pstats.Stats, int, int]:
    """cProfile of ``CALLS`` calls of a ``STAGES``-stage zero-cost pipeline (bench_train_step.py's), on one
    thread; returns (stats, acts, messages delivered)."""
    def zero_cost(plan, task, ins, outs, j, call):
        return outs
    plan = linear_pipeline_plan([f"stage{i}" for i in range(STAGES)], regst_num=2)
    with Runtime(plan, deterministic=True, act_fn=zero_cost, max_calls_in_flight=4, timeline=0) as runtime:
        runtime.launch([]).result()
        before = runtime.home.enqueued
        profile = cProfile.Profile()
        profile.enable()
        handles = [runtime.launch([]) for _ in range(CALLS)]
        for handle in handles:
            handle.result()
        profile.disable()
        messages = runtime.home.enqueued - before
    return pstats.Stats(profile), CALLS * len(plan.tasks), messages


def _calls_of(stats: pstats.Stats, file_end: str, name: str) -> int:
    return sum(entry[1] for (file, _, function), entry in stats.stats.items()
               if file.endswith(file_end) and function == name)


def test_a_zero_cost_act_makes_few_python_calls():
    stats, acts, _ = _zero_cost_profile()
    assert stats.total_calls / acts < 60, stats.total_calls / acts   # 76 before


def test_the_delivery_loop_makes_no_call_of_its_own_per_message():
    stats, _, messages = _zero_cost_profile()
    assert messages > 2 * CALLS * STAGES
    assert _calls_of(stats, "deterministic.py", "deliver") == 0   # inlined in deliver_until's loop
    assert _calls_of(stats, "thread.py", "take") <= CALLS   # (once per call: the queue ran empty when it was done)
    locks = _calls_of(stats, "~", "<method '__exit__' of '_thread.lock' objects>")
    assert locks < messages, (locks, messages)   # a take reads the queue's head without the lock; an act's
    #                                              messages are enqueued under one lock


def test_recording_an_act_never_asks_for_the_rank_context():
    stats, acts, _ = _zero_cost_profile()
    assert _calls_of(stats, "env.py", "current") == 0
    assert _calls_of(stats, "runtime.py", "record_act") == acts


# --- Python numbers made into tensors once per task ------------------------------------------------------------

def _instructions(g, *xs) -> collections.Counter:
    with flow.trace() as tracer:
        g(*xs).numpy()
    # (the VM fuses consecutive in-order ops, an act's among them: "fuse[a,b]" counts as a and b)
    return collections.Counter(name for r in tracer.records
                               for name in (r.name[len("fuse["):-1].split(",") if r.name.startswith("fuse[")
                                            else [r.name]))


def _graph(build):
    class G(nn.Graph):
        def build(self, *xs):
            return build(*xs)
    g = G()
    g.executor = "deterministic"   # the actor runtime, its instructions issued on this thread
    return g


NUMBERS = st.one_of(st.booleans(), st.integers(-3, 3), st.floats(-2.0, 2.0, allow_nan=False, width=32))


@settings(max_examples=12, deadline=None)
@given(dtype=st.sampled_from(["float32", "int64", "bool"]), a=NUMBERS, b=NUMBERS, seed=st.integers(0, 2**16))
def test_an_ops_numbers_become_tensors_once_with_eagers_promotion_and_values(dtype, a, b, seed):
    rng = np.random.default_rng(seed)
    x = flow.tensor((rng.standard_normal((2, 3)) * 3).astype(dtype))

    def build(x):   # a number on either side, and one whose dtype the tensor decides (where)
        return flow.where(x > 0, x * a, b) + a
    g = _graph(build)
    want = build(x)
    for _ in range(3):
        got = g(x)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert _instructions(g, x)["tensor"] == 0


def test_a_training_step_turns_no_number_into_a_tensor_per_call():
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
    rng = np.random.default_rng(3)
    data = [(flow.tensor(rng.standard_normal((4, 6)).astype(np.float32)),
             flow.tensor(rng.integers(0, 3, size=4).astype(np.int64))) for _ in range(3)]
    for x, y in data[:2]:
        got = g(x, y).numpy()
        eager_opt.zero_grad()
        loss = loss_fn(eager(x), y)
        loss.backward()
        eager_opt.step()
        np.testing.assert_array_equal(got, loss.numpy())
    counts = _instructions(g, *data[2])
    assert counts["tensor"] == 0, counts   # 6 before: the ReLUs' gradients' 0s, the loss's numbers...
    eager_opt.zero_grad()
    loss_fn(eager(data[2][0]), data[2][1]).backward()
    eager_opt.step()
    for p, q in zip(model.parameters(), eager.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
