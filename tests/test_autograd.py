"""Autograd's semantics: what is recorded, accumulation, retain_graph, autograd.grad, higher order,
the errors PyTorch gives (each specific), backward as VM instructions in every VM mode, global tensors."""

from __future__ import annotations

import numpy as np
import pytest

import pyflow as flow
from pyflow.device import ep
from pyflow.errors import AutogradError, PyflowError, ShapeError
from pyflow.vm.builder import InstructionsBuilder
from tests.helpers_devices import EMULATED_STREAMS


def leaf(values, **kw):
    return flow.tensor(values, dtype=flow.float64, requires_grad=True, **kw)


# --- what is recorded ---------------------------------------------------------------------------------------


def test_only_ops_on_tensors_that_require_grad_are_recorded():
    x, c = leaf([1.0, 2.0]), flow.tensor([3.0, 4.0], dtype=flow.float64)
    assert x.is_leaf and x.grad_fn is None and not c.requires_grad
    y = x * c
    assert y.requires_grad and not y.is_leaf and y.grad_fn.op_name == "mul"
    assert not (c * 2).requires_grad
    assert not (x > 1).requires_grad   # bool results carry no gradient
    with flow.no_grad():
        assert not (x * c).requires_grad
    assert flow.is_grad_enabled()


def test_requires_grad_keyword_on_every_creation_function():
    made = [flow.zeros(2, requires_grad=True), flow.ones(2, requires_grad=True), flow.rand(2, requires_grad=True),
            flow.randn(2, requires_grad=True), flow.full((2,), 1.5, requires_grad=True),
            flow.arange(3.0, requires_grad=True), flow.linspace(0, 1, 3, requires_grad=True),
            flow.eye(2, requires_grad=True), flow.empty(2, requires_grad=True),
            flow.zeros_like(flow.ones(2), requires_grad=True), flow.tensor([1.0], requires_grad=True)]
    assert all(t.requires_grad and t.is_leaf for t in made)
    with pytest.raises(AutogradError, match="only floating point"):
        flow.tensor([1, 2], requires_grad=True)


def test_detach_shares_memory_without_history():
    x = leaf([1.0, 2.0])
    y = x * 2
    d = y.detach()
    assert not d.requires_grad and d.is_leaf
    with flow.no_grad():
        y.add_(1.0)
    assert d.tolist() == [3.0, 5.0]
    assert not flow.tensor(y).requires_grad   # flow.tensor(t) copies without history, as torch.tensor


def test_gradients_accumulate_across_backward_calls_and_grad_can_be_reset():
    x = leaf([1.0, 2.0])
    (x * x).sum().backward()
    (x * 3.0).sum().backward()
    assert x.grad.tolist() == [5.0, 7.0]
    x.grad = None
    (x * 3.0).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]


def test_a_leaf_used_twice_gets_the_sum_and_its_grad_is_its_own_memory():
    x = leaf([1.0, 2.0])
    y = leaf([1.0, 1.0])
    (x + y).sum().backward()   # add hands the same gradient to both inputs
    x.grad.zero_()
    assert y.grad.tolist() == [1.0, 1.0]
    z = leaf([2.0])
    (z * z * z).sum().backward()
    assert z.grad.tolist() == [12.0]


def test_backward_with_a_gradient_for_a_non_scalar():
    x = leaf([1.0, 2.0, 3.0])
    (x * x).backward(flow.tensor([1.0, 0.0, 2.0], dtype=flow.float64))
    assert x.grad.tolist() == [2.0, 0.0, 12.0]


def test_retain_grad_keeps_a_non_leaf_gradient():
    x = leaf([1.0, 2.0])
    y = x * 3.0
    y.retain_grad()
    (y * y).sum().backward()
    assert y.grad.tolist() == [6.0, 12.0] and x.grad.tolist() == [18.0, 36.0]


def test_retain_graph_allows_a_second_backward():
    x = leaf([1.0, 2.0])
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert x.grad.tolist() == [4.0, 8.0]


def test_autograd_grad_returns_gradients_without_accumulating():
    x, w = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    (gx,) = flow.autograd.grad((x * w).sum(), x)
    assert gx.tolist() == [3.0, 4.0] and x.grad is None and w.grad is None
    unused = leaf([0.0])
    with pytest.raises(AutogradError, match="not used"):
        flow.autograd.grad((x * 2).sum(), [x, unused])
    gx, gu = flow.autograd.grad((x * 2).sum(), [x, unused], allow_unused=True)
    assert gu is None and gx.tolist() == [2.0, 2.0]


def test_create_graph_gives_second_derivatives():
    x = leaf([1.0, 2.0])
    (g,) = flow.autograd.grad((x ** 3).sum(), x, create_graph=True)
    assert g.tolist() == [3.0, 12.0] and g.requires_grad
    g.sum().backward()
    assert x.grad.tolist() == [6.0, 12.0]


def test_gradients_flow_through_in_place_ops_on_non_leaves():
    x = leaf([1.0, -2.0, 3.0])
    y = x * 2.0
    y.clamp_(min=0.0)
    y.mul_(x)
    y.sum().backward()
    # y = relu(2x) * x: d/dx = 4x where x > 0, else 0
    assert x.grad.tolist() == [4.0, 0.0, 12.0]


def test_setitem_gives_the_overwritten_part_no_gradient_and_the_value_its_share():
    x, v = leaf([1.0, 2.0, 3.0]), leaf([5.0])
    y = x * 1.0
    y[1] = v[0] * 2.0
    (y * flow.tensor([1.0, 10.0, 100.0], dtype=flow.float64)).sum().backward()
    assert x.grad.tolist() == [1.0, 0.0, 100.0] and v.grad.tolist() == [20.0]


# --- the errors ----------------------------------------------------------------------------------------------


def test_backward_through_a_tensor_that_does_not_require_grad_is_an_error():
    with pytest.raises(AutogradError, match="does not require grad"):
        flow.tensor([1.0]).sum().backward()


def test_backward_of_a_non_scalar_without_a_gradient_is_an_error():
    with pytest.raises(AutogradError, match="not a scalar"):
        (leaf([1.0, 2.0]) * 2).backward()
    with pytest.raises(ShapeError, match="shape"):
        (leaf([1.0, 2.0]) * 2).backward(flow.ones(3, dtype=flow.float64))


def test_a_second_backward_without_retain_graph_is_an_error_that_says_so():
    x = leaf([1.0, 2.0])
    y = (x * x).sum()
    y.backward()
    with pytest.raises(AutogradError, match="retain_graph=True"):
        y.backward()


def test_changing_a_saved_tensor_in_place_is_an_error_naming_the_op():
    x = leaf([1.0, 2.0])
    y = x * 2.0
    z = y * y     # saves y
    with flow.no_grad():
        y.add_(1.0)
    with pytest.raises(AutogradError, match=r"gradient of 'mul'.*modified by an in-place operation.*version"):
        z.sum().backward()


def test_only_the_saved_tensors_a_rule_reads_are_checked():
    """relu's rule reads its output, not its input (PyTorch saves only that): changing the input is fine."""
    x = leaf([1.0, -2.0])
    h = x * 1.0
    y = h.relu()
    with flow.no_grad():
        h.mul_(10.0)
    y.sum().backward()
    assert x.grad.tolist() == [1.0, 0.0]


def test_a_second_backward_through_ops_that_saved_nothing_is_allowed():
    x = leaf([1.0, 2.0])
    z = x + 1.0
    z.sum().backward()
    z.sum().backward()   # add needs no saved tensor (PyTorch allows this too)
    assert x.grad.tolist() == [2.0, 2.0]


def test_an_in_place_op_on_a_leaf_that_requires_grad_is_an_error():
    x = leaf([1.0, 2.0])
    with pytest.raises(AutogradError, match="leaf"):
        x.add_(1.0)
    with pytest.raises(AutogradError, match="leaf"):
        x[0] = 3.0
    with flow.no_grad():   # an optimizer's update
        x.add_(1.0)
    assert x.tolist() == [2.0, 3.0]


def test_requires_grad_false_on_a_non_leaf_is_an_error():
    y = leaf([1.0]) * 2
    with pytest.raises(AutogradError, match="detach"):
        y.requires_grad_(False)


def test_an_op_without_a_backward_rule_says_so():
    x = leaf([[1.0, 2.0]])
    y = flow.nn.functional.max_pool2d(x.reshape(1, 1, 1, 2), (1, 2))
    (g,) = flow.autograd.grad(y.sum(), x, create_graph=True)   # the pooling backward op has no rule
    with pytest.raises(AutogradError, match="no backward rule"):
        g.sum().backward()


# --- backward is VM instructions: every VM mode gives the same bits -------------------------------------------


def _train_step_gradients(device):
    rng = np.random.default_rng(0)
    w1 = flow.tensor(rng.standard_normal((3, 4)), device=device, requires_grad=True)
    w2 = flow.tensor(rng.standard_normal((4, 2)), device=device, requires_grad=True)
    x = flow.tensor(rng.standard_normal((5, 3)), device=device)
    target = flow.tensor([0, 1, 1, 0, 1], device=device)
    logits = (x @ w1).tanh() @ w2
    loss = -flow.log_softmax(logits, dim=1).gather(1, target.unsqueeze(1)).mean()
    loss.backward()
    return [w1.grad.numpy(), w2.grad.numpy(), loss.numpy()]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_backward_in_step_through_mode_equals_threaded_mode_bitwise(device):
    with flow.vm.sync_mode(False):
        threaded = _train_step_gradients(device)
    with flow.vm.sync_mode():
        stepped = _train_step_gradients(device)
    for a, b in zip(threaded, stepped):
        np.testing.assert_array_equal(a, b)


def _cross_device_gradients():
    """Forward hops cpu -> cuda -> cpu -> cuda, so backward's copies run on the transfer streams."""
    rng = np.random.default_rng(1)
    x = flow.tensor(rng.standard_normal((2, 3)), requires_grad=True)
    y = (x.to("cuda") * 2.0).tanh()
    z = (y.to("cpu") * x).exp()
    out = (z.to("cuda") * y).sum()
    out.backward()
    return x.grad.numpy()


def _expected_cross_device_gradient():
    x = np.random.default_rng(1).standard_normal((2, 3))
    y = np.tanh(2 * x)
    z = np.exp(y * x)
    dy = z + z * y * x          # out = sum(z * y), z = exp(y * x)
    dx = z * y * y + dy * (1 - y * y) * 2
    return dx


DELAY_SEEDS = range(12)


def _run_with_delays(seed):
    flow.vm.shutdown()
    try:
        with ep.emulation(max_delay=0.002, seed=seed):
            return _cross_device_gradients()
    finally:
        flow.vm.shutdown()


def test_backward_across_devices_under_random_stream_delays_is_correct():
    expected = _expected_cross_device_gradient()
    for seed in DELAY_SEEDS:
        np.testing.assert_allclose(_run_with_delays(seed), expected, rtol=1e-12, err_msg=f"seed {seed}")


@EMULATED_STREAMS   # a mutation check: only emulated streams take the delays that expose it
def test_without_soft_sync_stream_waits_backward_across_devices_goes_wrong():
    """Mutation check for the test above: drop SoftSyncStream's cross-stream waits; backward must notice."""
    expected = _expected_cross_device_gradient()
    wrong = 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(InstructionsBuilder, "_soft_sync_between", lambda self, deps, from_stream, to_stream: None)
        for seed in DELAY_SEEDS:
            try:
                got = _run_with_delays(seed)
            except PyflowError:
                wrong += 1
                continue
            wrong += not np.allclose(got, expected, rtol=1e-12)
    flow.vm.shutdown()
    assert wrong, "no seed gave a wrong gradient with the cross-stream waits removed"


# --- global tensors: the dual SBP --------------------------------------------------------------------------


def test_data_parallel_gradient_of_a_broadcast_parameter_is_a_partial_sum_that_all_reduces():
    rng = np.random.default_rng(2)
    x_all, w_all = rng.standard_normal((4, 3)), rng.standard_normal((3, 2))

    def per_rank():
        ranks = flow.placement("cpu", [0, 1])
        w = flow.tensor(w_all, placement=ranks, sbp=flow.sbp.broadcast, requires_grad=True)
        x = flow.tensor(x_all, placement=ranks, sbp=flow.sbp.split(0))
        ((x @ w).tanh()).sum().backward()
        reduced = w.grad.to_global(placement=ranks, sbp=flow.sbp.broadcast)
        return w.grad.sbp, reduced.to_local().numpy()

    expected = x_all.T @ (1 - np.tanh(x_all @ w_all) ** 2)
    for sbp, grad in flow.distributed.run(per_rank, world_size=2):
        assert sbp == (flow.sbp.partial_sum,)
        np.testing.assert_allclose(grad, expected, rtol=1e-12)


def test_data_parallel_training_on_two_ranks_equals_training_on_one():
    """A model made global (parameters B, batch S(0)), three SGD steps: the same parameters as one rank
    training on the whole batch. The partial-sum gradients are all-reduced by the optimizer."""
    rng = np.random.default_rng(3)
    x_all, y_all = rng.standard_normal((8, 3)), rng.integers(0, 2, 8)

    def model_and_optimizer():
        flow.manual_seed(0)
        model = flow.nn.Sequential(flow.nn.Linear(3, 4), flow.nn.Tanh(), flow.nn.Linear(4, 2)).double()
        return model, flow.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)

    def train(model, opt, x, y):
        for _ in range(3):
            loss = flow.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

    model, opt = model_and_optimizer()
    train(model, opt, flow.tensor(x_all), flow.tensor(y_all))
    expected = {k: v.numpy() for k, v in model.state_dict().items()}

    def per_rank():
        ranks = flow.placement("cpu", [0, 1])
        model, opt = model_and_optimizer()
        model.to_global(ranks, flow.sbp.broadcast)
        x = flow.tensor(x_all, placement=ranks, sbp=flow.sbp.split(0))
        y = flow.tensor(y_all, placement=ranks, sbp=flow.sbp.split(0))
        train(model, opt, x, y)
        grad_sbp = next(iter(model.parameters())).grad.sbp
        return grad_sbp, {k: v.numpy() for k, v in model.state_dict().items()}

    for grad_sbp, state in flow.distributed.run(per_rank, world_size=2):
        assert grad_sbp == (flow.sbp.partial_sum,)
        for key, value in state.items():
            np.testing.assert_allclose(value, expected[key], rtol=1e-12, err_msg=key)
