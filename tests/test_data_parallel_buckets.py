"""Data parallel's collectives, fewer (issue 31): gradients all-reduced as one bucket, an input boxed once.

* ``Optimizer.step`` all-reduces the partial-sum gradients of broadcast parameters together, as one
  flat bucket per placement and dtype (``Optimizer._gradients``), and updates after every gradient is
  in: the values are those of one all-reduce per gradient;
* the global interpreter keeps the latest boxing of an op input while the input's storage lives
  (``global_ops._boxed``): a backward rule that reads a saved P input (the mean's denominator) does not
  all-reduce it again; an in-place write to the input boxes it anew.
Counts and values only; no times.
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow

B, P, S = flow.sbp.broadcast, flow.sbp.partial_sum, flow.sbp.split
OPTIMIZERS = {
    "sgd": lambda params: flow.optim.SGD(params, lr=0.1),
    "momentum": lambda params: flow.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True),
    "adam": lambda params: flow.optim.Adam(params, lr=0.01, weight_decay=0.1),
}


def _collectives(tracer) -> int:
    return sum(record.name == "collective" for record in tracer.records)


@st.composite
def _parameters(draw):
    """Parameters as (shape, SBP of the parameter, SBP of its gradient): mostly data parallel's (B, P)."""
    count = draw(st.integers(1, 4))
    layouts = st.sampled_from([(B, P), (B, P), (B, P), (S(0), S(0)), (B, B)])
    return [(tuple(draw(st.lists(st.integers(2, 4), min_size=1, max_size=2))), *draw(layouts))
            for _ in range(count)]


@settings(max_examples=10, deadline=None)
@given(params=_parameters(), kind=st.sampled_from(sorted(OPTIMIZERS)), seed=st.integers(0, 2**16))
def test_gradients_all_reduced_as_one_bucket_update_as_one_all_reduce_per_gradient(params, kind, seed):
    rng = np.random.default_rng(seed)
    values = [rng.normal(size=shape).astype(np.float32) for shape, _, _ in params]
    grads = [[rng.normal(size=shape).astype(np.float32) for shape, _, _ in params] for _ in range(3)]
    alone = [flow.tensor(v, requires_grad=True) for v in values]
    optimizer = OPTIMIZERS[kind](alone)
    for step in grads:
        for p, g in zip(alone, step):
            p.grad = flow.tensor(g)
        optimizer.step()
    bucketed = sum(p_sbp == B and g_sbp == P for _, p_sbp, g_sbp in params)
    others = sum(p_sbp != g_sbp for _, p_sbp, g_sbp in params if not (p_sbp == B and g_sbp == P))

    def per_rank():
        ranks = flow.placement("cpu", [0, 1])
        model = [flow.tensor(v, placement=ranks, sbp=p_sbp, requires_grad=True)
                 for v, (_, p_sbp, _) in zip(values, params)]
        optimizer = OPTIMIZERS[kind](model)
        sent = []
        for step in grads:
            for p, g, (_, _, g_sbp) in zip(model, step, params):
                p.grad = flow.tensor(g, placement=ranks, sbp=g_sbp)   # the logical gradient is g
            with flow.trace() as tracer:
                optimizer.step()
                flow.sync()
            sent.append(_collectives(tracer))
        return sent, [p.numpy() for p in model]

    for sent, weights in flow.distributed.run(per_rank, world_size=2, timeout=60):
        assert sent[1:] == [min(bucketed, 1) + others] * (len(grads) - 1), (sent, params)   # 1st: Adam makes state
        for mine, expected in zip(weights, alone):
            np.testing.assert_allclose(mine, expected.numpy(), rtol=1e-6, atol=1e-7)


def test_a_saved_partial_input_is_all_reduced_once_for_the_forward_and_the_backward():
    numbers = np.arange(1, 7, dtype=np.float32)

    def per_rank():
        ranks = flow.placement("cpu", [0, 1])
        a = flow.tensor(numbers, placement=ranks, sbp=B, requires_grad=True)
        count = flow.tensor(np.float32(4), placement=ranks, sbp=P)   # a sum of the ranks' counts, as a mean's
        with flow.trace() as tracer:
            quotient = a / count          # div (B, P): the count boxed P -> B, an all-reduce
            quotient.sum().backward()     # the gradient 1 / count: the same boxing of the same count
            flow.sync()
        return _collectives(tracer), quotient.numpy(), a.grad.numpy()

    for sent, quotient, grad in flow.distributed.run(per_rank, world_size=2, timeout=60):
        assert sent == 1, sent
        np.testing.assert_allclose(quotient, numbers / 4)
        np.testing.assert_allclose(grad, np.full(6, 0.25, np.float32))


def test_an_input_written_in_place_is_boxed_anew():
    numbers = np.arange(1, 7, dtype=np.float32)

    def per_rank():
        ranks = flow.placement("cpu", [0, 1])
        a = flow.tensor(numbers, placement=ranks, sbp=B)
        count = flow.tensor(np.float32(4), placement=ranks, sbp=P)
        first = (a / count).numpy()
        count.to_local().mul_(2)          # every rank's piece doubled: the logical count is 8
        with flow.trace() as tracer:
            second = a / count
            flow.sync()
        return first, second.numpy(), _collectives(tracer)

    for first, second, sent in flow.distributed.run(per_rank, world_size=2, timeout=60):
        np.testing.assert_allclose(first, numbers / 4)
        np.testing.assert_allclose(second, numbers / 8)
        assert sent == 1, sent
