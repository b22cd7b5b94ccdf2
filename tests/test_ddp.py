"""Data parallel over local replicas (``flow.nn.parallel.DistributedDataParallel``) and the hook it stands on
(``Tensor.register_post_accumulate_grad_hook``).

Properties: a hook runs once per backward, after ``.grad`` holds the new sum, and no more once removed;
N ranks training shards of a batch with DDP take the steps one rank takes on the whole batch (to float
rounding), their replicas equal bit for bit; the replicas start from rank 0's values whatever each rank
made; buffers take rank 0's before each forward; a parameter left out of a backward is an error naming it
at the next forward, not a collective that waits.  ``tests/test_mpi.py`` runs ``ddp_numbers`` with every
rank a process and checks it gives these numbers bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import nn
from pyflow.errors import ArgumentTypeError, AutogradError, DistributedError, GraphError

DDP = nn.parallel.DistributedDataParallel


# ---- the hook -----------------------------------------------------------------------------------------------


def test_the_hook_runs_once_per_backward_after_the_gradient_is_summed_in_order_until_removed():
    w = flow.tensor([1.0, 2.0], requires_grad=True)
    seen = []
    first = w.register_post_accumulate_grad_hook(lambda t: seen.append(("first", t.grad.tolist())))
    w.register_post_accumulate_grad_hook(lambda t: seen.append(("second", t.grad.tolist())))
    (w * w).sum().backward()   # w used twice: one accumulation of the summed gradient
    (w * 3).sum().backward()
    first.remove()
    first.remove()   # (a second remove does nothing)
    w.sum().backward()
    assert seen == [("first", [2.0, 4.0]), ("second", [2.0, 4.0]), ("first", [5.0, 7.0]), ("second", [5.0, 7.0]),
                    ("second", [6.0, 8.0])]
    flow.autograd.grad((w * 2).sum(), [w])   # returns gradients, accumulates none: no hook
    assert len(seen) == 5


def test_the_hook_is_for_leaves_that_require_grad():
    w = flow.tensor([1.0], requires_grad=True)
    with pytest.raises(AutogradError, match="computed by an op"):
        (w * 2).register_post_accumulate_grad_hook(print)
    with pytest.raises(AutogradError, match="does not require grad"):
        flow.tensor([1.0]).register_post_accumulate_grad_hook(print)
    with pytest.raises(AutogradError, match="callable"):
        w.register_post_accumulate_grad_hook(3)


# ---- DDP against one rank on the whole batch ------------------------------------------------------------------


def _model(features: int, hidden: int, seed: int) -> nn.Module:
    flow.manual_seed(seed)
    return nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, 2))


def _train(model, batches, momentum: float) -> list:
    optimizer = flow.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = nn.MSELoss()(model(flow.tensor(x)), flow.tensor(y))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _batches(world: int, rows: int, features: int, steps: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((world * rows, features)).astype(np.float32),
             rng.standard_normal((world * rows, 2)).astype(np.float32)) for _ in range(steps)]


def ddp_numbers(world: int = 2, rows: int = 3, features: int = 4, hidden: int = 5, steps: int = 2,
                bucket_size: int = 2, momentum: float = 0.9) -> list:
    """Each rank's (losses, parameters) after ``steps`` DDP steps on its shard of each batch: its own
    initial weights (seed = rank), made equal by DDP."""
    batches = _batches(world, rows, features, steps, seed=7)

    def rank():
        r = flow.env.get_rank()
        model = DDP(_model(features, hidden, seed=r), bucket_size=bucket_size)
        shards = [(x[r * rows:(r + 1) * rows], y[r * rows:(r + 1) * rows]) for x, y in batches]
        losses = _train(model, shards, momentum)
        return losses, [p.numpy() for p in model.parameters()]

    return flow.distributed.run(rank, world)


@settings(max_examples=8, deadline=None)
@given(world=st.integers(2, 3), rows=st.integers(1, 3), hidden=st.integers(1, 6), steps=st.integers(1, 3),
       bucket_size=st.integers(1, 5), momentum=st.sampled_from([0.0, 0.9]))
def test_ranks_training_shards_take_the_steps_of_one_rank_on_the_whole_batch(world, rows, hidden, steps,
                                                                              bucket_size, momentum):
    results = ddp_numbers(world, rows, 4, hidden, steps, bucket_size, momentum)
    alone = _model(4, hidden, seed=0)   # rank 0's initial weights, which DDP gives every rank
    whole_losses = _train(alone, _batches(world, rows, 4, steps, seed=7), momentum)
    for losses, params in results:
        for got, want in zip(params, alone.parameters()):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
        for got, want in zip(params, results[0][1]):   # the replicas: bit for bit
            np.testing.assert_array_equal(got, want)
    mean_shard_loss = np.mean([losses for losses, _ in results], axis=0)
    np.testing.assert_allclose(mean_shard_loss, whole_losses, rtol=1e-5, atol=1e-6)


def test_without_the_all_reduce_the_replicas_drift_apart():
    """The property above would fail if the hooks did nothing: each rank would step on its own shard."""
    def rank():
        model = DDP(_model(4, 5, seed=flow.env.get_rank()))
        for p in model.parameters():
            p._autograd.post_accumulate_hooks.clear()   # (the averaging: gone)
        x = np.full((2, 4), flow.env.get_rank() + 1.0, np.float32)
        _train(model, [(x, np.zeros((2, 2), np.float32))], 0.0)
        return [p.numpy() for p in model.parameters()]

    first, second = flow.distributed.run(rank, 2)
    assert any(not np.array_equal(a, b) for a, b in zip(first, second))


# ---- replicas, buffers, errors --------------------------------------------------------------------------------


def test_buffers_take_rank_0s_values_before_every_forward():
    def rank():
        flow.manual_seed(0)
        model = DDP(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))).eval()   # eval: a forward keeps its stats
        bn = model[1]
        with flow.no_grad():
            bn.running_mean.fill_(float(flow.env.get_rank() + 1))
        before = bn.running_mean.tolist()
        model(flow.ones(2, 3))
        return before, bn.running_mean.tolist()

    (before0, after0), (before1, after1) = flow.distributed.run(rank, 2)
    assert before0 == [1.0] * 3 and before1 == [2.0] * 3 and after0 == after1 == [1.0] * 3


def test_a_parameter_left_out_of_a_backward_is_an_error_naming_it_at_the_next_forward():
    def train_twice():
        flow.manual_seed(0)
        net = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 3)])
        net.forward = lambda x: net[0](x)   # the second layer takes no part
        model = DDP(net, bucket_size=1)
        model(flow.ones(1, 2)).sum().backward()
        with pytest.raises(DistributedError, match=r"no gradient to 2 parameter\(s\).*float32\[3, 2\]"):
            model(flow.ones(1, 2))
        model(flow.ones(1, 2))   # the error reported it once: the next forward goes on
        return True

    assert flow.distributed.run(train_twice, 2) == [True, True]


def test_one_rank_is_left_as_it_is_and_bad_arguments_are_named():
    model = nn.Linear(2, 2)
    forward = model.forward
    assert DDP(model) is model and model.forward == forward
    with pytest.raises(ArgumentTypeError, match="Module"):
        DDP(lambda x: x)
    with pytest.raises(ArgumentTypeError, match="bucket_size"):
        DDP(model, bucket_size=0)
    with pytest.raises(DistributedError, match="global"):
        DDP(nn.Linear(2, 2).to_global(placement=flow.placement("cpu", [0]), sbp=flow.sbp.broadcast))


def test_an_nn_graph_refuses_a_ddp_module_whose_gradients_it_would_never_average():
    def rank():
        model = DDP(nn.Sequential(nn.Linear(2, 2)))

        class Step(nn.Graph):
            def __init__(self):
                super().__init__()
                self.model = model

            def build(self, x):
                return self.model(x)

        with pytest.raises(GraphError, match="DistributedDataParallel.*global tensors"):
            Step()
        return nn.parallel.is_distributed_data_parallel(nn.Sequential(model))

    assert flow.distributed.run(rank, 2) == [True, True]


def test_a_ddp_model_is_freed_when_dropped_without_waiting_for_the_cycle_collector():
    import gc
    import weakref

    def rank():
        model = DDP(nn.Linear(2, 2))
        model(flow.ones(1, 2)).sum().backward()
        gone = weakref.ref(model), weakref.ref(model.weight)
        gc.disable()
        try:
            del model
            return [ref() is None for ref in gone]
        finally:
            gc.enable()

    assert flow.distributed.run(rank, 2) == [[True, True], [True, True]]
