"""The per-rank fixed cost of eager data parallel (issue 31): what a training step does once, not every call.

* a boxing plan is built once per edge (source layout, destination layout, shape), however many
  times the ranks box along it;
* ``flow.tensor(data, placement=, sbp=)`` (and the global ``zeros``/``ones`` autograd makes every
  step) waits for no exchange of local shapes: one collective (parallel_id 0's broadcast) per tensor,
  whose descriptor still catches ranks that disagree.
Counts only; no times.
"""

import numpy as np
import pytest

import pyflow as flow
from pyflow.distributed import boxing, global_tensor
from pyflow.distributed.boxing_steps import Layout
from pyflow.errors import RankError


def test_a_boxing_plan_is_built_once_per_edge_over_many_calls(monkeypatch):
    built = []
    plan = boxing.AllReduceBuilder.plan
    monkeypatch.setattr(boxing.AllReduceBuilder, "plan", lambda self, *a: built.append(a) or plan(self, *a))
    boxing.plan_for.cache_clear()

    def per_rank():
        ranks = flow.placement("cpu", [0, 1])
        sums = []
        for step in range(4):   # a P -> B all-reduce of the same shape every step, as a gradient's
            partial = flow.tensor(np.full((3, 2), step, np.float32), placement=ranks, sbp=flow.sbp.partial_sum)
            sums.append(partial.to_global(sbp=flow.sbp.broadcast).to_local().numpy())
        return sums

    for sums in flow.distributed.run(per_rank, world_size=2):
        for step, total in enumerate(sums):
            np.testing.assert_array_equal(total, np.full((3, 2), step, np.float32))
    assert len(built) == 1, built   # 2 ranks x 4 calls, one plan


def test_another_shape_is_another_edge_with_its_own_plan():
    boxing.plan_for.cache_clear()
    with flow.env.bound(flow.env.RankContext(rank=0, world_size=2)):
        on2 = flow.placement("cpu", [0, 1])
        p, b = Layout(on2, (flow.sbp.partial_sum,)), Layout(on2, (flow.sbp.broadcast,))
        first = boxing.plan_for(p, b, (3, 2))
        assert boxing.plan_for(p, b, (3, 2)) is first
        boxing.plan_for(p, b, (4, 2))
    assert boxing.plan_for.cache_info().misses == 2 and boxing.plan_for.cache_info().hits == 1


def test_a_global_tensor_from_data_issues_one_collective_and_no_blocking_exchange(monkeypatch):
    exchanges = []
    monkeypatch.setattr(global_tensor, "exchange", lambda *a: exchanges.append(a) or pytest.fail("exchanged"))

    def per_rank():
        ranks = flow.placement("cpu", [0, 1])
        with flow.trace() as tracer:
            x = flow.tensor(np.arange(6.0).reshape(3, 2), placement=ranks, sbp=flow.sbp.split(0))
            ones = flow.ones(4, placement=ranks, sbp=flow.sbp.partial_sum)
        collectives = sum(r.name == "collective" for r in tracer.records)
        return collectives, x.to_local().numpy(), ones.to_global(sbp=flow.sbp.broadcast).to_local().numpy()

    (c0, x0, ones0), (c1, x1, ones1) = flow.distributed.run(per_rank, world_size=2)
    assert exchanges == [] and c0 == c1 == 2
    np.testing.assert_array_equal(x0, [[0.0, 1.0], [2.0, 3.0]])
    np.testing.assert_array_equal(x1, [[4.0, 5.0]])
    np.testing.assert_array_equal(ones0, np.ones(4))
    np.testing.assert_array_equal(ones1, np.ones(4))


def test_ranks_giving_tensor_data_of_different_shapes_still_fail_on_every_rank():
    def per_rank():
        ranks = flow.placement("cpu", [0, 1])
        x = flow.tensor(np.zeros(2 + flow.env.get_rank()), placement=ranks, sbp=flow.sbp.broadcast)
        return x.to_local().numpy()

    with pytest.raises(RankError, match="float64\\[2\\]|float64\\[3\\]"):
        flow.distributed.run(per_rank, world_size=2, timeout=20)
