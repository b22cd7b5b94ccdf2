"""Data parallel sends what it needs (issue 31): views and cross-entropy keep the batch split.

A data-parallel step (parameters B, batch S(0)) needs one all-reduce of its gradients (one bucket of
them all) and one for the loss's ``item()``.  ``reshape`` keeps a split of a dim it keeps and a partial sum (``view``'s
signatures, ``pyflow/ops/views.py``), and ``gather`` / ``scatter_add`` keep a split of another dim
than their axis (``pyflow/ops/movement.py``), so the backward no longer gathers the activations or
all-reduces a gradient twice, and cross-entropy runs on each rank's rows.  Counts only; no times.
"""

import numpy as np
import pytest

import pyflow as flow
from pyflow import nn

run = flow.distributed.run
S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
FEATURES, HIDDEN, CLASSES, BATCH = 6, 5, 3, 8

# The collectives one step of the MLP below issues on a rank: the 4 gradients' all-reduce, as one
# bucket (``Optimizer._gradients``), the loss's for item(), and the loss's mean (its denominator,
# boxed once: the backward reuses the forward's boxing).  The seed gradient and the zeros autograd
# makes are filled on each rank with nothing sent (``GlobalInterpreter.full``).  It was 20, 10, then 7.
MOST_COLLECTIVES = 3


def _mlp() -> nn.Module:
    flow.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def _data():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(BATCH, FEATURES)).astype(np.float32),
            rng.integers(0, CLASSES, size=BATCH).astype(np.int64))


def _steps(model, x, y, count: int) -> tuple:
    """``count`` SGD steps; (the losses, the collectives the last one issued)."""
    optimizer = flow.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(count):
        with flow.trace() as tracer:
            optimizer.zero_grad()
            loss = nn.CrossEntropyLoss()(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses, sum(record.name == "collective" for record in tracer.records)


def test_a_data_parallel_step_issues_at_most_the_collectives_it_needs_and_equals_one_rank():
    data, labels = _data()
    alone = _mlp()
    one_rank, _ = _steps(alone, flow.tensor(data), flow.tensor(labels), 3)

    def per_rank():
        ranks = flow.placement("cpu", [0, 1])
        model = _mlp()
        model.to_global(ranks, B)
        x = flow.tensor(data, placement=ranks, sbp=S(0))
        y = flow.tensor(labels, placement=ranks, sbp=S(0))
        losses, collectives = _steps(model, x, y, 3)
        return losses, collectives, [p.to_global(sbp=B).to_local().numpy() for p in model.parameters()]

    for losses, collectives, weights in run(per_rank, world_size=2, timeout=120):
        assert collectives <= MOST_COLLECTIVES, collectives
        np.testing.assert_allclose(losses, one_rank, rtol=1e-5)
        for mine, expected in zip(weights, alone.parameters()):
            np.testing.assert_allclose(mine, expected.numpy(), rtol=1e-5, atol=1e-6)


RESHAPES = [   # (shape, sbp, new shape, the result's sbp, collectives)
    ((8, 1, 2, 3), S(0), (8, 6), S(0), 0),          # flatten of the batch's features: dim 0 kept
    ((2, 2, 6, 5), S(2), (4, 6, 5), S(1), 0),       # the split dim kept, after 4 elements on both sides
    ((3, 4), P, (12,), P, 0),                       # a partial sum stays one
    ((4, 6), S(1), (4, 2, 3), S(0), 1),             # a split dim cut in two: re-split along a kept one first
]


@pytest.mark.parametrize("shape, sbp, new_shape, out_sbp, collectives", RESHAPES,
                         ids=[f"{s}-{sbp}-{n}" for s, sbp, n, _, _ in RESHAPES])
def test_a_global_reshape_keeps_a_split_of_a_kept_dim_and_a_partial_sum(shape, sbp, new_shape, out_sbp,
                                                                        collectives):
    values = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)

    def per_rank():
        x = flow.tensor(values, placement=flow.placement("cpu", [0, 1]), sbp=sbp)
        with flow.trace() as tracer:
            y = x.reshape(new_shape)
            flow.sync()
        sent = sum(record.name == "collective" for record in tracer.records)
        return y.sbp, sent, y.numpy()

    for got_sbp, sent, value in run(per_rank, world_size=2, timeout=60):
        assert got_sbp == (out_sbp,) and sent == collectives
        np.testing.assert_array_equal(value, values.reshape(new_shape))


def test_gather_of_split_rows_and_its_gradient_stay_split_with_no_collective():
    logits = np.arange(24, dtype=np.float32).reshape(8, 3)
    labels = np.array([[0], [2], [1], [1], [0], [2], [2], [0]])

    def per_rank():
        ranks = flow.placement("cpu", [0, 1])
        x = flow.tensor(logits, placement=ranks, sbp=S(0), requires_grad=True)
        index = flow.tensor(labels, placement=ranks, sbp=S(0))
        seed = flow.ones((8, 1), placement=ranks, sbp=S(0))
        with flow.trace() as tracer:
            picked = x.gather(1, index)
            (grad,) = flow.autograd.grad(picked, [x], grad_outputs=[seed])
            flow.sync()
        sent = sum(record.name == "collective" for record in tracer.records)
        return picked.sbp, grad.sbp, sent, picked.numpy(), grad.numpy()

    expected_grad = np.zeros_like(logits)
    np.put_along_axis(expected_grad, labels, 1.0, axis=1)
    for picked_sbp, grad_sbp, sent, picked, grad in run(per_rank, world_size=2, timeout=60):
        assert picked_sbp == grad_sbp == (S(0),)
        assert sent == 0, sent   # the zeros the gradient starts from are filled on each rank: nothing sent
        np.testing.assert_array_equal(picked, np.take_along_axis(logits, labels, axis=1))
        np.testing.assert_array_equal(grad, expected_grad)
