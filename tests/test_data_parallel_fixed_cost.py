"""The per-rank fixed cost of eager data parallel (issue 31): what a training step does once, not every call.

* a boxing plan is built once per edge (source layout, destination layout, shape), however many
  times the ranks box along it;
* ``flow.tensor(data, placement=, sbp=)`` (and the global ``zeros``/``ones`` autograd makes every
  step) waits for no exchange of local shapes: one collective (parallel_id 0's broadcast) per tensor,
  whose descriptor still catches ranks that disagree;
* a data-parallel step sends, boxes and works out SBP signatures no more than it needs (the inference
  of a kind of call is cached), and the constants autograd makes (the seed gradient, missing gradients'
  zeros) are filled on every rank with nothing sent.
Counts only; no times.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.distributed import boxing, global_methods, global_ops, global_tensor
from pyflow.distributed.boxing_steps import Layout
from pyflow.errors import RankError
from pyflow.framework.interpreter import global_interpreter


def test_a_boxing_plan_is_built_once_per_edge_over_many_calls(monkeypatch):
    built = []
    build = boxing.build_boxing
    monkeypatch.setattr(boxing, "build_boxing", lambda *a: built.append(a) or build(*a))
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
    p_to_b = [edge for edge in built if edge[0].sbp == (flow.sbp.partial_sum,)]
    assert len(p_to_b) == 1 and len(built) == len(set(built)), built   # 2 ranks x 4 calls, one plan per edge


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
    # the data's broadcast; the P ones are filled on each rank (``GlobalInterpreter.full``): it was 2
    assert exchanges == [] and c0 == c1 == 1
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


# --- a data-parallel step: what it sends and boxes, counted ------------------------------------------------

# One step of the MLP below on 2 ranks (parameters B, batch S(0)): the 4 gradients' all-reduce as one bucket
# (Optimizer._gradients), the loss's for item(), and the mean's denominator P -> B once (the backward's div
# reuses the forward's boxing of its saved P input: global_ops._boxed).  It was 10: the seed gradient ones (a
# broadcast) boxed P -> S(0), and autograd's zeros (a broadcast), both now filled on every rank
# (GlobalInterpreter.full); then 7: an all-reduce per gradient, and the denominator's again in the backward.
STEP_COLLECTIVES = 3
STEP_BOXINGS = 4      # the 3, and the seed gradient's B -> S(0) (a slice on the rank)
FEATURES, HIDDEN, CLASSES, BATCH = 6, 5, 3, 8


def _mlp():
    flow.manual_seed(0)
    return flow.nn.Sequential(flow.nn.Linear(FEATURES, HIDDEN), flow.nn.ReLU(), flow.nn.Linear(HIDDEN, CLASSES))


def _train(model, x, y, steps: int) -> list:
    """``steps`` SGD steps; per step (the loss, its collectives, its boxings, its signature choices)."""
    optimizer = flow.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rank, report = flow.env.get_rank(), []
    for _ in range(steps):
        boxings, choices = len(_BOXED[rank]), len(_CHOSEN[rank])
        with flow.trace() as tracer:
            optimizer.zero_grad()
            loss = flow.nn.CrossEntropyLoss()(model(x), y)
            loss.backward()
            optimizer.step()
            value = loss.item()
        report.append((value, sum(r.name == "collective" for r in tracer.records), len(_BOXED[rank]) - boxings,
                       len(_CHOSEN[rank]) - choices))
    return report


_BOXED: dict = {0: [], 1: []}      # rank -> what it boxed
_CHOSEN: dict = {0: [], 1: []}     # rank -> the ops whose SBP signature it worked out


def test_a_data_parallel_step_sends_boxes_and_chooses_signatures_no_more_than_it_needs(monkeypatch):
    for kept in (_BOXED, _CHOSEN):
        kept[0].clear(), kept[1].clear()
    box, choose = global_tensor.box, global_ops.choose_signature

    def counted_box(x, dst, what):
        _BOXED[flow.env.get_rank()].append(what)
        return box(x, dst, what)

    def counted_choice(name, *rest):
        _CHOSEN[flow.env.get_rank()].append(name)
        return choose(name, *rest)

    for module in (global_tensor, global_ops, global_methods):
        monkeypatch.setattr(module, "box", counted_box)
    monkeypatch.setattr(global_ops, "choose_signature", counted_choice)
    rng = np.random.default_rng(0)
    data = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    labels = rng.integers(0, CLASSES, size=BATCH)
    alone = [loss for loss, *_ in _train(_mlp(), flow.tensor(data), flow.tensor(labels), 3)]

    def per_rank():
        ranks = flow.placement("cpu", [0, 1])
        model = _mlp()
        model.to_global(ranks, flow.sbp.broadcast)
        x = flow.tensor(data, placement=ranks, sbp=flow.sbp.split(0))
        y = flow.tensor(labels, placement=ranks, sbp=flow.sbp.split(0))
        return _train(model, x, y, 3)

    for report in flow.distributed.run(per_rank, world_size=2, timeout=120):
        np.testing.assert_allclose([loss for loss, *_ in report], alone, rtol=1e-5)
        for _, collectives, boxings, choices in report[1:]:   # the first step works out every signature once
            assert (collectives, boxings, choices) == (STEP_COLLECTIVES, STEP_BOXINGS, 0), report


def test_the_seed_gradient_of_a_global_loss_is_made_with_no_collective():
    values = np.arange(6, dtype=np.float32)

    def per_rank():
        x = flow.tensor(values, placement=flow.placement("cpu", [0, 1]), sbp=flow.sbp.split(0), requires_grad=True)
        loss = (x * x).sum()     # P: each rank sums its rows
        with flow.trace() as tracer:
            loss.backward()      # the seed: B ones, whose S(0) pieces are each rank's own
            flow.sync()
        return sum(r.name == "collective" for r in tracer.records), x.grad.sbp, x.grad.to_local().numpy()

    (sent0, sbp0, grad0), (sent1, sbp1, grad1) = flow.distributed.run(per_rank, world_size=2)
    assert sent0 == sent1 == 0 and sbp0 == sbp1 == (flow.sbp.split(0),)
    np.testing.assert_array_equal(np.concatenate([grad0, grad1]), 2 * values)


@st.composite
def _layouts(draw):
    """(world, the placement's ranks, nested for a 2-D hierarchy, an SBP per axis, a logical shape)."""
    world = draw(st.integers(1, 4))
    ranks = sorted(draw(st.sets(st.integers(0, world - 1), min_size=1)))
    nested = len(ranks) == 4 and draw(st.booleans())
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=2)))
    options = [flow.sbp.broadcast, flow.sbp.partial_sum] + [flow.sbp.split(d) for d in range(len(shape))]
    sbp = tuple(draw(st.sampled_from(options)) for _ in range(2 if nested else 1))
    return world, [ranks[:2], ranks[2:]] if nested else ranks, sbp, shape


@settings(max_examples=20)
@given(layout=_layouts(), value=st.sampled_from([0.0, 1.0, -2.5]))
def test_a_global_constant_is_filled_on_every_rank_with_nothing_sent(layout, value):
    world, ranks, sbp, shape = layout

    def per_rank():
        with flow.trace() as tracer:
            filled = global_interpreter().full(shape, value, np.float32, flow.placement("cpu", ranks), sbp)
            flow.sync()
        sent = sum(r.name == "collective" for r in tracer.records)
        return sent, filled.sbp, filled.numpy()

    for sent, got_sbp, whole in flow.distributed.run(per_rank, world_size=world, timeout=60):
        assert sent == 0 and got_sbp == sbp
        np.testing.assert_array_equal(whole, np.full(shape, value, np.float32))


def test_the_cached_global_inference_tells_a_python_int_from_a_float():
    def per_rank():
        x = flow.tensor(np.arange(4), placement=flow.placement("cpu", [0, 1]), sbp=flow.sbp.split(0))
        return [(x + 1).dtype, (x + 1.0).dtype, (x + 1).dtype, (x + True).dtype]

    for dtypes in flow.distributed.run(per_rank, world_size=2):
        assert [str(d) for d in dtypes] == ["int64", "float32", "int64", "int64"]


def test_collectives_stay_out_of_the_interpreters_inference_cache():
    """Each collective call is its own (its transport call): cached, it would add a key per call that no
    later call meets, until the cache is full and cleared for every op."""
    from pyflow.framework import interpreter

    rng = np.random.default_rng(1)
    data, labels = rng.normal(size=(BATCH, FEATURES)).astype(np.float32), rng.integers(0, CLASSES, size=BATCH)

    def per_rank():
        ranks = flow.placement("cpu", [0, 1])
        model = _mlp()
        model.to_global(ranks, flow.sbp.broadcast)
        x = flow.tensor(data, placement=ranks, sbp=flow.sbp.split(0))
        y = flow.tensor(labels, placement=ranks, sbp=flow.sbp.split(0))
        _train(model, x, y, 2)
        kept = len(interpreter._inferred)
        report = _train(model, x, y, 3)
        return kept, len(interpreter._inferred), sum(collectives for _, collectives, *_ in report)

    for kept, after, collectives in flow.distributed.run(per_rank, world_size=2, timeout=120):
        assert collectives >= 3 * STEP_COLLECTIVES and after <= kept, (kept, after)
