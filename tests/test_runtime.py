"""The actor runtime (seed 003): a Plan run by actors gives the sequential interpreter's numbers.

Properties: random programs and training graphs give ``run_plan``'s outputs through the
runtime, threaded and deterministic with random interleavings; every regst goes back to
its producer and every actor exits after eord; Repeat / Unpack / Acc / Pack act as
defined; a producer is never more than regst-num pieces ahead of its consumers; the
watchdog names the actors of a deadlocked plan; the pipeline of seed 003 reaches its
bottleneck's rate.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import nn
from pyflow.compiler.plan import replan_memory
from pyflow.compiler.task_graph import RegstDesc
from pyflow.errors import RuntimeHangError
from pyflow.runtime import Runtime
from pyflow.runtime.pipeline import linear_pipeline_plan, sleeping_act
from pyflow.runtime.regst import RegstMgr, memory_fits
from pyflow.runtime.sequential import run_plan

OPS = ["relu", "tanh", "neg", "matmul", "add_w", "scale", "abs", "sigmoid"]


def _program(ops, move_at, x, w, w_cuda):
    y = x
    for i, name in enumerate(ops):
        if i == move_at:
            y = y.to("cuda")
        here = w_cuda if i >= move_at else w
        if name == "matmul":
            y = y @ here
        elif name == "add_w":
            y = y + here.sum()
        elif name == "scale":
            y = y * 1.5 - 0.25
        else:
            y = getattr(y, name)()
    return y.sum(dim=0), y


def _graph(build, k=1):
    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.config.set_gradient_accumulation_steps(k)

        def build(self, *xs):
            return build(*xs)

    return G()


def _runtime_threads(rt) -> list:
    return [t for t in rt.threads() if t.is_alive()]


def assert_all_regsts_back_and_actors_exited(rt) -> None:
    """After close: every regst is free at its producer, every actor exited, no thread of ours is alive."""
    for actor in rt.actors.values():
        assert actor.exited, actor
        for slot in actor.out_slots.values():
            assert slot.current is None and len(slot.free) == len(slot.regsts), (actor, slot.desc.lbn)
        assert not actor.deferred and not any(s.regsts for s in actor.in_slots.values()), actor
    for regst in rt.regst_mgr.all_regsts():
        assert regst.piece is None and regst.reading_count == 0, regst
    assert not _runtime_threads(rt)


def assert_back_pressure(plan, timeline) -> None:
    """With regst num r, piece i of a regst desc is made only after every consumer finished piece i - r."""
    by_actor = collections.defaultdict(list)
    for record in timeline:
        by_actor[record.actor_id].append(record)
    checked = 0
    for desc in plan.regsts.values():
        made = sorted((rec.start, piece) for rec in by_actor[desc.producer]
                      for d, _, piece in rec.produced if d == desc.id)
        for consumer in set(desc.consumers):
            last_use: dict = {}
            for rec in by_actor[consumer]:
                for d, _, piece in rec.consumed:
                    if d == desc.id:
                        last_use[piece] = max(last_use.get(piece, 0.0), rec.end)
            for i in range(desc.max_regst_num, len(made)):
                earlier = made[i - desc.max_regst_num][1]
                if earlier in last_use:   # (absorbed control pieces have no act of their own)
                    assert made[i][0] >= last_use[earlier], (desc.lbn, made[i][1], earlier)
                    checked += 1
    assert checked > 0


# --- the runtime gives the sequential interpreter's numbers -------------------------------------------


@settings(max_examples=8, deadline=None)
@given(st.lists(st.sampled_from(OPS), min_size=1, max_size=5), st.integers(0, 5), st.integers(1, 3),
       st.sampled_from([None, 0, 1, 2]))
def test_random_programs_match_run_plan(ops, move_at, k, seed):
    """Random programs (some moved to cuda midway, with k micro-batches): the runtime gives run_plan's
    outputs bitwise, threaded (seed None) and deterministic with random interleavings; then every regst
    is back, every actor exited and no runtime thread is left."""
    rng = np.random.default_rng(len(ops) * 10 + move_at)
    x = flow.tensor(rng.standard_normal((2 * k, 3)).astype(np.float32))
    w = flow.tensor(rng.standard_normal((3, 3)).astype(np.float32) * 0.5)
    w_cuda = w.to("cuda")
    g = _graph(lambda x: _program(ops, move_at, x, w, w_cuda), k)
    g.executor = "sequential"
    g(x)
    expected = [t.numpy() for t in run_plan(g.plan, [x], g.job)]
    rt = Runtime(g.plan, g.job, deterministic=seed is not None, seed=seed)
    handles = [rt.launch([x]) for _ in range(3)]   # overlapping calls
    for handle in handles:
        for got, want in zip(handle.result(), expected):
            np.testing.assert_array_equal(got.numpy(), want)
    rt.close()
    assert_all_regsts_back_and_actors_exited(rt)


def _train_graph(k, cuda_stage, momentum=0.9):
    flow.manual_seed(11)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    if cuda_stage:
        model[2].to("cuda")
    opt = flow.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)

    class Train(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)
            self.config.set_gradient_accumulation_steps(k)

        def build(self, x):
            h = model[1](model[0](x))
            out = model[2](h.to("cuda") if cuda_stage else h)
            loss = (out * out).mean()
            loss.backward()
            return loss

    return Train(), model


def two_training_calls_like_run_plan(k, cuda_stage, seed, **runtime_options):
    """Two calls of ``_train_graph(k, cuda_stage)``'s Plan on a Runtime (``seed``: deterministic) give the losses and
    weights of ``run_plan`` on a twin graph, bit for bit, and leave every regst back; returns (the closed runtime, its
    graph)."""
    x = flow.randn(2 * k, 3)
    g_ref, m_ref = _train_graph(k, cuda_stage)
    g_ref.executor = "sequential"
    g_rt, m_rt = _train_graph(k, cuda_stage)
    g_rt.executor = "sequential"
    g_ref(x)
    g_rt(x)   # compiles; one sequential call on each
    rt = Runtime(g_rt.plan, g_rt.job, deterministic=seed is not None, seed=seed, **runtime_options)
    for _ in range(2):
        want = run_plan(g_ref.plan, [x], g_ref.job)
        g_ref._after_call()
        got = rt.launch([x]).result()
        g_rt._after_call()
        np.testing.assert_array_equal(got[0].numpy(), want[0].numpy())
        for p, q in zip(m_rt.parameters(), m_ref.parameters()):
            np.testing.assert_array_equal(p.numpy(), q.numpy())
    rt.close()
    assert_all_regsts_back_and_actors_exited(rt)
    return rt, g_rt


@settings(max_examples=6, deadline=None)
@given(st.integers(1, 4), st.booleans(), st.sampled_from([None, 3, 4]))
def test_training_with_grad_acc_matches_run_plan_and_actors_follow_their_definitions(k, cuda_stage, seed):
    """k micro-batches, optionally a cuda second stage: losses and weights after 2 calls equal run_plan's
    bitwise.  From the timeline, per call: Unpack and Repeat act k times on one input piece and make pieces
    j = 0..k-1 in order; Acc and Pack act k times and make one piece, at their k-th act; the rest act once
    per piece of their time shape."""
    rt, g_rt = two_training_calls_like_run_plan(k, cuda_stage, seed)
    timeline = rt.timeline()
    for task in g_rt.plan.tasks.values():
        acts = [r for r in timeline if r.actor_id == task.task_id]
        per_call = task.time_shape[1]
        assert [r.piece for r in acts] == [(n, j) for n in range(2) for j in range(per_call)], task.op_name
        data_in, data_out = task.consumed.get("in_0", [None])[0], task.produced.get("out_0")
        if task.kind in ("unpack", "repeat"):
            assert per_call == k
            assert [p[2] for r in acts for p in r.consumed if p[0] == data_in] \
                == [(n, 0) for n in range(2) for _ in range(k)]
            assert [p[2] for r in acts for p in r.produced if p[0] == data_out] == \
                [(n, j) for n in range(2) for j in range(k)]
        if task.kind in ("acc", "pack"):
            made = [(r.piece, p[2]) for r in acts for p in r.produced if p[0] == data_out]
            assert made == [((n, k - 1), (n, 0)) for n in range(2)], task.op_name
    if k > 1:
        assert {t.kind for t in g_rt.plan.tasks.values()} >= {"unpack", "repeat", "acc", "pack"}


# --- back pressure --------------------------------------------------------------------------------------


@settings(max_examples=6, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=2, max_size=4), st.lists(st.sampled_from([0.0, 0.001, 0.003]),
                                                                     min_size=4, max_size=4))
def test_no_producer_runs_more_than_regst_num_pieces_ahead(nums, costs):
    """A linear pipeline with a regst num per stage and random stage costs: from the timeline, piece i of
    every regst is made only after every consumer finished piece i - regst num."""
    stages = [f"stage{i}" for i in range(len(nums))]
    plan = linear_pipeline_plan(stages, regst_num=nums)
    with Runtime(plan, act_fn=sleeping_act(dict(zip(stages, costs))), max_calls_in_flight=8) as rt:
        handles = [rt.launch([]) for _ in range(8)]
        for handle in handles:
            handle.result()
        assert_back_pressure(rt.plan, rt.timeline())   # (the Plan it ran, closed for 8 calls in flight)
    assert_all_regsts_back_and_actors_exited(rt)


def test_back_pressure_on_a_compiled_plan_with_more_regsts():
    """The same property on a compiled two-stage plan whose planned regsts get regst num 2 (not inplace: each
    its own memory): the runtime plans its memory (and guards) again, as ``replan_memory`` does; the RegstMgr
    alone refuses such a plan."""
    g = _graph(lambda x: ((x * 2.0).relu().to("cuda") + 1.0).tanh())
    g.executor = "sequential"
    x = flow.randn(2, 3)
    expected = g(x).numpy()
    regsts = {rid: dataclasses.replace(r, max_regst_num=2, inplace_of=None) if r.mem == "planned" else r
              for rid, r in g.plan.regsts.items()}
    edited = dataclasses.replace(g.plan, regsts=regsts)
    assert not memory_fits(edited)
    with pytest.raises(flow.errors.GraphError, match=r"regst .* needs \d+ bytes \(regst num 2\) but the memory plan "
                                                     r"has a request of \d+ bytes.*replan_memory"):
        RegstMgr(edited, list(edited.tasks), 0)
    plan = replan_memory(edited)
    assert memory_fits(plan)
    with Runtime(edited, g.job, max_calls_in_flight=4) as rt:
        mine = {k: v for k, v in plan.memory.block_sizes.items() if k.startswith("rank0/")}
        assert rt.regst_mgr.chunk_bytes() == mine
        handles = [rt.launch([x]) for _ in range(6)]
        for handle in handles:
            np.testing.assert_array_equal(handle.result()[0].numpy(), expected)
        assert_back_pressure(rt.plan, rt.timeline())   # (the Plan it ran, closed for 4 calls in flight)


def test_seed_003_pipeline_overlaps_the_bottleneck_with_regst_num_2_and_not_with_1():
    """loading -> preprocessing -> copy -> training, training twice as slow as the rest.  In logical terms
    (orderings in the timeline, not rates: a rate fails on a loaded machine; ``bench_pipeline.py`` measures
    it): with regst num 1, copy's call n + 1 starts only after training has finished call n (its one regst
    comes back then); with regst num 2 it may start while training works on call n, which is what keeps the
    bottleneck busy, and call n + 2 still waits for training's call n."""
    stages = ["loading", "preprocessing", "copy", "training"]
    costs = {"loading": 0.005, "preprocessing": 0.005, "copy": 0.005, "training": 0.010}
    overlapped = {}
    for num in (1, 2):
        with Runtime(linear_pipeline_plan(stages, regst_num=num), act_fn=sleeping_act(costs),
                     max_calls_in_flight=20) as rt:
            for handle in [rt.launch([]) for _ in range(20)]:
                handle.result()
            timeline = rt.timeline()
        start = {r.call: r.start for r in timeline if r.op_name == "copy"}
        end = {r.call: r.end for r in timeline if r.op_name == "training"}
        assert len(start) == len(end) == 20
        assert all(start[n + num] >= end[n] for n in range(20 - num)), num   # back pressure: never further
        overlapped[num] = sum(start[n + 1] < end[n] for n in range(19))
    assert overlapped[1] == 0
    assert overlapped[2] > 0, overlapped   # over 19 chances, copy ran ahead of the bottleneck at least once


def test_calls_in_flight_are_bounded_by_max_calls_in_flight():
    """With max_calls_in_flight=2 the source tick starts call n + 2 only after the sink finished call n."""
    stages = ["a", "b"]
    with Runtime(linear_pipeline_plan(stages, regst_num=3), act_fn=sleeping_act({"b": 0.002}),
                 max_calls_in_flight=2) as rt:
        for handle in [rt.launch([]) for _ in range(6)]:
            handle.result()
        timeline = rt.timeline()
    source = {r.call: r.start for r in timeline if r.op_name == "source_tick"}
    sink = {r.call: r.end for r in timeline if r.op_name == "sink_tick"}
    assert all(source[n + 2] >= sink[n] for n in range(4))


# --- hangs and faults -------------------------------------------------------------------------------------


def _chain():
    g = _graph(lambda x: (x * 2.0).relu() + 1.0)
    g.executor = "sequential"
    g(flow.randn(2, 3))
    return g


def test_watchdog_names_the_actor_whose_regst_num_is_zero():
    g = _chain()
    (mul,) = g.plan.task_of("mul_0")
    rid = mul.produced["out_0"]
    regsts = dict(g.plan.regsts)
    regsts[rid] = dataclasses.replace(regsts[rid], max_regst_num=0)
    rt = Runtime(dataclasses.replace(g.plan, regsts=regsts), g.job, hang_timeout=0.3)
    start = time.monotonic()
    with pytest.raises(RuntimeHangError, match=r"(?s)'mul_0'.*not write-ready.*mul_0/out_0.*regst num 0"):
        rt.launch([flow.randn(2, 3)]).result()
    assert time.monotonic() - start < 10
    rt.close()
    assert not _runtime_threads(rt)


def test_a_ctrl_cycle_is_reported_at_once_in_deterministic_mode():
    """relu_0 waits for mul_0's output, mul_0 for a control regst of relu_0: both are named."""
    g = _chain()
    plan = g.plan
    (mul,), (relu,) = plan.task_of("mul_0"), plan.task_of("relu_0")
    rid = max(plan.regsts) + 1
    regsts = dict(plan.regsts)
    regsts[rid] = RegstDesc(rid, "relu_0/ctrl", relu.task_id, [mul.task_id], (), "int8", relu.device, relu.rank,
                            mem="ctrl")
    tasks = dict(plan.tasks)
    tasks[relu.task_id] = dataclasses.replace(relu, produced={**relu.produced, "ctrl": rid})
    tasks[mul.task_id] = dataclasses.replace(mul, consumed={**mul.consumed, "ctrl": [rid]})
    rt = Runtime(dataclasses.replace(plan, tasks=tasks, regsts=regsts), g.job, deterministic=True)
    with pytest.raises(RuntimeHangError, match=r"(?s)'mul_0'.*not read-ready.*relu_0/ctrl.*'relu_0'"):
        rt.launch([flow.randn(2, 3)]).result()


def test_hang_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("PYFLOW_HANG_TIMEOUT", "7.5")
    with Runtime(linear_pipeline_plan(["a"]), deterministic=True) as rt:
        assert rt.hang_timeout == 7.5


def test_an_exception_in_an_act_stops_the_runtime_and_names_the_op():
    g = _chain()

    def act_fn(plan, task, ins, outs, j, call):
        if task.op_name == "relu_0":
            raise ValueError("boom")
        from pyflow.runtime.act import act
        return act(plan, task, ins, outs, j, call)

    rt = Runtime(g.plan, g.job, act_fn=act_fn, hang_timeout=5)
    with pytest.raises(flow.errors.OpError, match=r"actor \d+ \(normal actor of op 'relu_0'.*piece \(0, 0\).*boom"):
        rt.launch([flow.randn(2, 3)]).result()
    rt.close()
    assert not _runtime_threads(rt)
    with pytest.raises(RuntimeError, match="stopped after an error"):
        rt.launch([flow.randn(2, 3)])


# --- deterministic mode, stepping, timeline ------------------------------------------------------------


def test_same_seed_same_interleaving_and_stepping_one_actor():
    g = _chain()
    x = flow.randn(2, 3)
    orders = []
    for seed in (5, 5, 6):
        with Runtime(g.plan, g.job, deterministic=True, seed=seed) as rt:
            for handle in [rt.launch([x]) for _ in range(3)]:
                handle.result()
            orders.append([(r.op_name, r.piece) for r in rt.timeline()])
    assert orders[0] == orders[1]
    assert sorted(orders[0]) == sorted(orders[2])

    rt = Runtime(g.plan, g.job, deterministic=True)
    handle = rt.launch([x])
    relu = rt.actor("relu_0")
    while not relu.is_read_ready():
        msg = rt.pending()[0]
        rt.step(act=msg.dst != relu.actor_id)   # the message for relu_0 is only taken in
    assert relu.acts == 0 and relu.is_write_ready()
    assert relu.act_until_fail() == 1 and relu.acts == 1
    np.testing.assert_array_equal(handle.result()[0].numpy(), ((x * 2.0).relu() + 1.0).numpy())
    rt.close()
    assert all(a.exited for a in rt.actors.values())


def test_timeline_exports_to_chrome_json_and_png(tmp_path):
    pytest.importorskip("matplotlib")
    import json
    g = _chain()
    with Runtime(g.plan, g.job) as rt:
        rt.launch([flow.randn(2, 3)]).result()
        trace = json.loads(open(rt.save_timeline(tmp_path / "acts.json")).read())
        png = rt.plot_timeline(tmp_path / "acts.png")
    acts = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "device"]
    ran = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "device"]   # the ep streams' lanes
    assert sorted(e["name"] for e in acts) == sorted(t.op_name for t in g.plan.tasks.values())
    assert ran and {e["name"] for e in ran} <= {e["name"] for e in acts}   # each kernel run is an act's
    assert all(e["args"]["piece"] == [0, 0] for e in acts)
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_acts_appear_in_flow_trace():
    g = _chain()
    with Runtime(g.plan, g.job) as rt, flow.trace() as tracer:
        rt.launch([flow.randn(2, 3)]).result()
    acts = [r for r in tracer.records if r.stream.startswith("actor ")]
    assert {r.name.split()[1] for r in acts} == {t.op_name for t in g.plan.tasks.values()}
    assert any(r.name == "relu" for r in tracer.records)   # the op an act issued, on its VM stream


def test_no_runtime_thread_survives_close():
    before = set(threading.enumerate())
    g = _chain()
    rt = Runtime(g.plan, g.job, name="leakcheck")
    names = {t.name for t in rt.threads()}
    assert any(n.startswith("pyflow-actor-leakcheck") for n in names) and "pyflow-actor-watchdog-leakcheck" in names
    rt.launch([flow.randn(2, 3)]).result()
    rt.close()
    assert not [t for t in threading.enumerate() if t not in before and t.name.startswith("pyflow-actor")]
