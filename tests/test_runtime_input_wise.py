"""The InputWise actor (OneFlow's InputWiseActor): a boxing concat / add acts on each input as it arrives.

Its definition, checked on a hand-made Plan (three producers of different speed feeding one
concat, or two feeding an add) and on a compiled two-rank graph: one act per data input per
piece, each act consuming exactly one input, in the order the inputs arrived, each right when
it arrives; the output goes out after the last act only; the values are the concat / sum.
"""

from __future__ import annotations

import collections
import time

import numpy as np
import pytest

import pyflow as flow
from pyflow.compiler.ids import TaskId, encode_task_id, per_rank_id
from pyflow.compiler.memory import MemoryPlan
from pyflow.compiler.plan import Plan, replan_memory
from pyflow.compiler.task_graph import RegstDesc, TaskNode
from pyflow.device import DeviceType
from pyflow.runtime import Runtime
from pyflow.runtime.act import act
from pyflow.runtime.msg import REGST
from pyflow.runtime.sequential import run_plan
from tests.test_runtime import assert_all_regsts_back_and_actors_exited


def merge_plan(kind: str, producers: int) -> Plan:
    """source -> producers p0.. (each on its own thread, a (1, 3) piece each) -> merge (a boxing ``kind``)
    -> output -> sink, memory planned by the compiler."""
    tasks, regsts, order = {}, {}, []

    def task(name, kind_, op_type, stream, index):
        tid = encode_task_id(TaskId(0, DeviceType.cpu, 0, stream, index))
        tasks[tid] = TaskNode(tid, kind_, name, op_type, 0, "cpu:0", "compute" if stream == 0 else name, 0, (1, 1))
        order.append(tid)
        return tasks[tid]

    def regst(producer, key, consumers, shape=(), mem="ctrl", num=1):
        rid = per_rank_id(0, len(regsts))
        regsts[rid] = RegstDesc(rid, f"{producer.op_name}/{key}", producer.task_id, [c.task_id for c in consumers],
                                shape, "float32" if mem != "ctrl" else "int8", "cpu:0", 0, min_regst_num=num,
                                max_regst_num=num, mem=mem)
        producer.produced[key] = rid
        return rid

    source = task("source_tick", "tick", "source_tick", 0, 0)
    makers = [task(f"p{i}", "compute", "fill_piece", i + 1, 0) for i in range(producers)]
    merge = task("merge", "boxing", kind, 0, 1)
    output = task("output_0", "output", "output", 0, 2)
    sink = task("sink_tick", "tick", "sink_tick", 0, 3)
    start = regst(source, "out_0", makers, num=2)
    for i, p in enumerate(makers):
        p.consumed["ctrl"] = [start]
        merge.consumed[f"in_{i}"] = [regst(p, "out_0", [merge], (1, 3), "planned")]
    shape = (producers, 3) if kind == "concat" else (1, 3)
    output.consumed["in_0"] = [regst(merge, "out_0", [output], shape, "planned")]
    regst(output, "out_0", [], shape, "output")
    regst(sink, "out_0", [])
    attrs = {"axis": 0} if kind == "concat" else {}
    op_attrs = {"source_tick": ("source_tick", [], {}), "sink_tick": ("sink_tick", [], {}),
                "merge": (kind, [f"in_{i}" for i in range(producers)], attrs),
                "output_0": ("output", ["merge/out_0"], {"index": 0}),
                **{p.op_name: ("fill_piece", [], {}) for p in makers}}
    return replan_memory(Plan(f"merge_{kind}", tasks, regsts, order, (0, 0), 1, MemoryPlan(()), op_attrs))


def producing_act(costs: dict):
    """p<i>'s act of call n sleeps ``costs[i]`` seconds and fills its piece with 10 n + i."""
    calls = collections.Counter()

    def act_fn(plan, task, ins, outs, j, call):
        if task.op_type != "fill_piece":
            return act(plan, task, ins, outs, j, call)
        i = int(task.op_name[1:])
        time.sleep(costs.get(i, 0.0))
        outs[0].fill_(10.0 * calls[i] + i)
        calls[i] += 1
        return outs
    return act_fn


def _merged(kind: str, n: int, producers: int) -> np.ndarray:
    pieces = [np.full((1, 3), 10.0 * n + i, np.float32) for i in range(producers)]
    return np.concatenate(pieces) if kind == "concat" else sum(pieces)


def _merge_acts(rt, kind: str, producers: int, calls: int) -> list:
    """The merge actor's act records; checks its definition on them and returns them."""
    plan = rt.plan
    (merge,) = plan.task_of("merge")
    data = {merge.consumed[f"in_{i}"][0]: i for i in range(producers)}
    out = merge.produced["out_0"]
    acts = [r for r in rt.timeline() if r.op_name == "merge"]
    assert len(acts) == producers * calls                       # one act per input per piece
    for n in range(calls):
        mine = [r for r in acts if r.piece == (n, 0)]
        used = [data[d] for r in mine for d, _, piece in r.consumed if d in data]
        assert sorted(used) == list(range(producers)) and len(used) == len(mine)   # each act: one input
        assert all(piece == (n, 0) for r in mine for _, _, piece in r.consumed)
        made = [[p for p in r.produced if p[0] == out] for r in mine]
        assert made[:-1] == [[]] * (producers - 1) and made[-1][0][2] == (n, 0)   # output after the last act
    return acts


@pytest.mark.parametrize("kind, producers", [("concat", 3), ("add", 2)])
def test_threaded_input_wise_acts_in_arrival_order_while_the_slow_inputs_are_still_being_made(kind, producers):
    """p0 is slow, the others fast: the merge acts on the fast inputs first, before p0 is done, and on p0's
    last; the outputs are the concat / sum of the pieces; everything is back after close."""
    costs = {0: 0.15, 1: 0.05, 2: 0.0}
    plan = merge_plan(kind, producers)
    with Runtime(plan, act_fn=producing_act(costs), max_calls_in_flight=2) as rt:
        assert type(rt.actor("merge")).__name__ == "InputWiseActor"
        handles = [rt.launch([]) for _ in range(3)]
        outs = [h.result()[0].numpy() for h in handles]
    for n, got in enumerate(outs):
        np.testing.assert_array_equal(got, _merged(kind, n, producers))
    acts = _merge_acts(rt, kind, producers, 3)
    (merge,) = plan.task_of("merge")
    key = {merge.consumed[f"in_{i}"][0]: i for i in range(producers)}
    timeline = rt.timeline()
    for n in range(3):
        order = [key[d] for r in acts if r.piece == (n, 0) for d, _, _ in r.consumed if d in key]
        assert order == list(range(producers))[::-1]            # the fastest first
        slow_end = next(r.end for r in timeline if r.op_name == "p0" and r.piece == (n, 0))
        first_act = min(r.start for r in acts if r.piece == (n, 0))
        assert first_act < slow_end                              # it did not wait for the slow input
    assert_all_regsts_back_and_actors_exited(rt)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_deterministic_input_wise_acts_on_each_input_the_moment_it_is_delivered(seed):
    """Messages delivered one at a time in a random order: every time a data input of the piece in progress
    reaches the merge (its ctrl there, an output regst available) it acts exactly once, on that input; the
    order of its acts is the order of the deliveries; the values are the definition's."""
    producers = 3
    plan = merge_plan("concat", producers)
    rt = Runtime(plan, act_fn=producing_act({}), deterministic=True, max_calls_in_flight=2)
    merge = rt.actor("merge")
    handles = [rt.launch([]) for _ in range(2)]
    delivered = []
    rng = np.random.default_rng(seed)
    while not handles[-1].done():
        pending = rt.pending()
        assert pending, rt.hang_report(0, "stepping")
        index = int(rng.integers(len(pending)))   # a random interleaving, one message at a time
        msg = pending[index]
        arriving = msg.kind == REGST and msg.dst == merge.actor_id and msg.regst.producer != merge.actor_id
        before = merge.input_acts
        can_act = arriving and msg.piece == merge.piece() and merge.is_write_ready() and all(
            s.ready(merge.acts, merge.acts_per_call) for s in merge.in_slots.values() if s.key == "ctrl")
        rt.step(index)
        if arriving:
            delivered.append((msg.piece, msg.regst.desc.id))
        if can_act:
            assert merge.input_acts == before + 1, msg
    outs = [h.result()[0].numpy() for h in handles]
    rt.close()
    for n, got in enumerate(outs):
        np.testing.assert_array_equal(got, _merged("concat", n, producers))
    acts = _merge_acts(rt, "concat", producers, 2)
    data = set(merge.inputs)
    acted = [(r.piece, d) for r in acts for d, _, _ in r.consumed if d in data]
    assert acted == sorted(delivered, key=lambda pd: pd[0])   # per piece: in delivery order
    assert_all_regsts_back_and_actors_exited(rt)


def test_three_input_add_keeps_the_normal_actor():
    """A sum of three or more pieces is not input-wise (their order would change its rounding)."""
    with Runtime(merge_plan("add", 3), act_fn=producing_act({})) as rt:
        assert rt.actor("merge").kind == "normal"
        np.testing.assert_array_equal(rt.launch([]).result()[0].numpy(), _merged("add", 0, 3))


def test_a_two_rank_graph_gathers_its_split_pieces_input_wise_with_run_plans_numbers():
    """S(0) on ranks 0 and 1 -> B on rank 0: rank 0 concatenates its own piece and the one received from
    rank 1 with an InputWise actor; threaded and deterministic (random interleavings), three calls in
    flight, the outputs are the sequential interpreter's."""
    S, B = flow.sbp.split, flow.sbp.broadcast

    def body(seed):
        both, p0 = flow.placement("cpu", [0, 1]), flow.placement("cpu", [0])
        xs = [flow.tensor(np.arange(12, dtype=np.float32).reshape(4, 3) + 100 * i, placement=both, sbp=S(0))
              for i in range(3)]

        class G(flow.nn.Graph):
            def build(self, x):
                return ((x * 2.0).to_global(placement=p0, sbp=B) + 1.0).tanh()

        g = G()
        g.executor = "sequential"
        g(xs[0])
        want = [run_plan(g.plan, [x], g.job)[0] for x in xs]
        rank = flow.env.get_rank()
        rt = Runtime(g.plan, g.job, deterministic=seed is not None, seed=None if seed is None else seed + rank,
                     max_calls_in_flight=3)
        handles = [rt.launch([x]) for x in xs]
        got = [h.result()[0] for h in handles]
        rt.close()
        kinds = sorted(a.kind for a in rt.actors.values())
        pairs = [(a.numpy(), b.numpy()) for a, b in zip(got, want)]   # numpy() of a global tensor: every rank
        acts = [r for r in rt.timeline() if r.kind == "input_wise"]
        return rank, kinds, pairs, len(acts)

    for seed in (None, 1, 2):
        for rank, kinds, pairs, acts in flow.distributed.run(lambda: body(seed), world_size=2):
            for got, want in pairs:
                np.testing.assert_array_equal(got, want)
            assert (kinds.count("input_wise"), acts) == ((1, 6) if rank == 0 else (0, 0))
