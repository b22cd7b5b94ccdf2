"""RMSprop, Adagrad, MultiStepLR, ExponentialLR, clip_grad_norm_ / clip_grad_value_ and flow.cuda,
against numpy versions of PyTorch's documented update rules and formulas.

The optimizers are compared step by step (several steps, so that the state's recursion is
exercised: momentum, centered averages, lr_decay); their state dicts must round-trip so
that a resumed run continues exactly as an uninterrupted one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.errors import ArgumentValueError, DeviceError, OptimizerError
from pyflow.nn.utils import clip_grad_norm_, clip_grad_value_
from pyflow.optim.lr_scheduler import ExponentialLR, MultiStepLR

FEW = settings(max_examples=8)


def grads_for(steps: int, size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=size) for _ in range(steps)]


def np_rmsprop(p, grads, lr, alpha, eps, weight_decay, momentum, centered):
    """PyTorch's RMSprop (torch.optim.RMSprop documentation's algorithm)."""
    v, m, buf = np.zeros_like(p), np.zeros_like(p), np.zeros_like(p)
    for g in grads:
        g = g + weight_decay * p
        v = alpha * v + (1 - alpha) * g * g
        if centered:
            m = alpha * m + (1 - alpha) * g
            avg = np.sqrt(v - m * m) + eps
        else:
            avg = np.sqrt(v) + eps
        if momentum > 0:
            buf = momentum * buf + g / avg
            p = p - lr * buf
        else:
            p = p - lr * g / avg
    return p


def np_adagrad(p, grads, lr, lr_decay, weight_decay, init, eps):
    """PyTorch's Adagrad (torch.optim.Adagrad documentation's algorithm)."""
    s = np.full_like(p, init)
    for step, g in enumerate(grads, start=1):
        g = g + weight_decay * p
        clr = lr / (1 + (step - 1) * lr_decay)
        s = s + g * g
        p = p - clr * g / (np.sqrt(s) + eps)
    return p


def run(opt_class, p0, grads, device="cpu", **kwargs):
    w = flow.tensor(p0, dtype=flow.float64, device=device, requires_grad=True)
    opt = opt_class([w], **kwargs)
    for g in grads:
        w.grad = flow.tensor(g, dtype=flow.float64, device=device)
        opt.step()
    return w, opt


@FEW
@given(lr=st.sampled_from([0.01, 0.1]), alpha=st.sampled_from([0.9, 0.99]), weight_decay=st.sampled_from([0, 0.1]),
       momentum=st.sampled_from([0, 0.9]), centered=st.booleans(), seed=st.integers(0, 100))
def test_rmsprop_follows_pytorchs_update_step_by_step(lr, alpha, weight_decay, momentum, centered, seed):
    grads = grads_for(4, 3, seed)
    p0 = np.random.default_rng(seed + 1).normal(size=3)
    w, _ = run(flow.optim.RMSprop, p0, grads, lr=lr, alpha=alpha, weight_decay=weight_decay, momentum=momentum,
               centered=centered)
    expected = np_rmsprop(p0, grads, lr, alpha, 1e-8, weight_decay, momentum, centered)
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-10, atol=1e-12)


@FEW
@given(lr=st.sampled_from([0.01, 0.5]), lr_decay=st.sampled_from([0, 0.3]), weight_decay=st.sampled_from([0, 0.1]),
       init=st.sampled_from([0.0, 0.1]), seed=st.integers(0, 100))
def test_adagrad_follows_pytorchs_update_step_by_step(lr, lr_decay, weight_decay, init, seed):
    grads = grads_for(4, 3, seed)
    p0 = np.random.default_rng(seed + 1).normal(size=3)
    w, opt = run(flow.optim.Adagrad, p0, grads, lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                 initial_accumulator_value=init)
    np.testing.assert_allclose(w.numpy(), np_adagrad(p0, grads, lr, lr_decay, weight_decay, init, 1e-10),
                               rtol=1e-10, atol=1e-12)
    assert int(opt.state[w]["step"].item()) == 4


def test_maximize_ascends():
    for cls in (flow.optim.RMSprop, flow.optim.Adagrad):
        w, _ = run(cls, np.array([0.0]), [np.array([1.0])], maximize=True, lr=0.1)
        assert w.item() > 0


@pytest.mark.parametrize("make", [
    lambda ps: flow.optim.RMSprop(ps, lr=0.05, momentum=0.9, centered=True, weight_decay=0.01),
    lambda ps: flow.optim.Adagrad(ps, lr=0.3, lr_decay=0.1, initial_accumulator_value=0.2),
], ids=["RMSprop", "Adagrad"])
def test_state_dict_round_trip_resumes_exactly(make):
    grads = grads_for(6, 3, 7)
    straight = flow.tensor(np.ones(3), dtype=flow.float64, requires_grad=True)
    opt = make([straight])
    for g in grads:
        straight.grad = flow.tensor(g, dtype=flow.float64)
        opt.step()
    first = flow.tensor(np.ones(3), dtype=flow.float64, requires_grad=True)
    opt1 = make([first])
    for g in grads[:3]:
        first.grad = flow.tensor(g, dtype=flow.float64)
        opt1.step()
    saved = opt1.state_dict()
    resumed = flow.tensor(first.numpy(), dtype=flow.float64, requires_grad=True)
    opt2 = make([resumed])
    opt2.load_state_dict(saved)
    for g in grads[3:]:
        resumed.grad = flow.tensor(g, dtype=flow.float64)
        opt2.step()
    np.testing.assert_allclose(resumed.numpy(), straight.numpy(), rtol=1e-12)
    assert sorted(saved["state"][0]) == sorted(opt.state[straight])


def test_adagrad_makes_its_state_at_construction_as_pytorch():
    w = flow.tensor([1.0, 2.0], requires_grad=True)
    opt = flow.optim.Adagrad([w], initial_accumulator_value=0.5)
    assert opt.state_dict()["state"][0]["sum"].tolist() == [0.5, 0.5]


def test_bad_hyperparameters_are_named():
    w = flow.tensor([1.0], requires_grad=True)
    with pytest.raises(OptimizerError, match="alpha of RMSprop"):
        flow.optim.RMSprop([w], alpha=-0.1)
    with pytest.raises(OptimizerError, match="momentum of RMSprop"):
        flow.optim.RMSprop([w], momentum=-1)
    with pytest.raises(OptimizerError, match="lr_decay of Adagrad"):
        flow.optim.Adagrad([w], lr_decay=-1)
    with pytest.raises(OptimizerError, match="initial_accumulator_value of Adagrad"):
        flow.optim.Adagrad([w], initial_accumulator_value=-1)


def test_optimizers_step_on_cuda_like_on_cpu():
    grads = grads_for(3, 4, 11)
    p0 = np.linspace(-1, 1, 4)
    for cls, kwargs in ((flow.optim.RMSprop, dict(momentum=0.5, centered=True)), (flow.optim.Adagrad,
                                                                                   dict(lr_decay=0.1))):
        cpu, _ = run(cls, p0, grads, **kwargs)
        cuda, opt = run(cls, p0, grads, device="cuda", **kwargs)
        assert all(t.device == flow.device("cuda") for t in opt.state[cuda].values())
        np.testing.assert_allclose(cuda.numpy(), cpu.numpy(), rtol=1e-12)


# --- schedulers ----------------------------------------------------------------------------------------------

def lrs_of(scheduler, epochs):
    out = []
    for _ in range(epochs):
        out.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return out


@FEW
@given(milestones=st.lists(st.integers(0, 8), max_size=4), gamma=st.sampled_from([0.1, 0.5]))
def test_multistep_lr_follows_the_closed_form(milestones, gamma):
    opt = flow.optim.SGD([flow.tensor([1.0], requires_grad=True)], lr=1.0)
    got = lrs_of(MultiStepLR(opt, milestones, gamma), 10)
    expected = [gamma ** sum(m <= epoch for m in milestones) for epoch in range(10)]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_exponential_lr_follows_the_closed_form_and_state_dict_round_trips():
    opt = flow.optim.SGD([flow.tensor([1.0], requires_grad=True)], lr=0.5)
    sched = ExponentialLR(opt, gamma=0.9)
    np.testing.assert_allclose(lrs_of(sched, 5), [0.5 * 0.9 ** e for e in range(5)], rtol=1e-12)
    saved = sched.state_dict()
    assert saved["last_epoch"] == 5 and "optimizer" not in saved
    with pytest.raises(OptimizerError, match="milestones"):
        MultiStepLR(opt, [1.5])


# --- gradient clipping -----------------------------------------------------------------------------------------

@FEW
@given(norm_type=st.sampled_from([1.0, 2.0, 3.0, math.inf]), max_norm=st.sampled_from([0.1, 1.0, 100.0]),
       seed=st.integers(0, 50))
def test_clip_grad_norm_returns_the_pre_clip_norm_and_scales_as_pytorch(norm_type, max_norm, seed):
    rng = np.random.default_rng(seed)
    gs = [rng.normal(size=(2, 3)), rng.normal(size=4)]
    params = [flow.tensor(np.zeros_like(g), dtype=flow.float64, requires_grad=True) for g in gs]
    for p, g in zip(params, gs):
        p.grad = flow.tensor(g, dtype=flow.float64)
    flat = np.concatenate([g.ravel() for g in gs])
    total = np.abs(flat).max() if math.isinf(norm_type) else (np.abs(flat) ** norm_type).sum() ** (1 / norm_type)
    got = clip_grad_norm_(params, max_norm, norm_type)
    assert got.item() == pytest.approx(total, rel=1e-10)
    scale = min(1.0, max_norm / (total + 1e-6))
    for p, g in zip(params, gs):
        np.testing.assert_allclose(p.grad.numpy(), g * scale, rtol=1e-10)


def test_clip_grad_norm_edge_cases_and_clip_grad_value():
    w = flow.tensor([0.0, 0.0], requires_grad=True)
    assert clip_grad_norm_([w], 1.0).item() == 0.0            # no gradients: norm 0
    w.grad = flow.tensor([float("nan"), 1.0])
    with pytest.raises(ArgumentValueError, match="nan"):
        clip_grad_norm_(w, 1.0, error_if_nonfinite=True)
    w.grad = flow.tensor([-3.0, 0.5], device="cpu")
    clip_grad_value_([w], 1.0)
    assert w.grad.tolist() == [-1.0, 0.5]
    v = flow.tensor([0.0, 0.0], device="cuda", requires_grad=True)
    v.grad = flow.tensor([3.0, 4.0], device="cuda")
    assert flow.nn.utils.clip_grad_norm_([v], 1.0).item() == pytest.approx(5.0)
    np.testing.assert_allclose(v.grad.numpy(), [0.6, 0.8], rtol=1e-5)


# --- flow.cuda ----------------------------------------------------------------------------------------------------

def test_flow_cuda_reports_the_cuda_device_pyflow_has():
    assert flow.cuda.is_available() is (flow.cuda.device_count() > 0)
    assert flow.cuda.device_count() == flow.device.ep.device_count("cuda")
    assert 0 <= flow.cuda.current_device() < flow.cuda.device_count()
    x = flow.ones(3, device="cuda") * 2
    flow.cuda.synchronize()
    flow.cuda.synchronize(0)
    assert x.sum().item() == 6.0
    with pytest.raises(DeviceError):
        flow.cuda.synchronize("cpu")
    flow.cuda.manual_seed(3)
    a = flow.rand(3).tolist()
    flow.cuda.manual_seed_all(3)
    assert flow.rand(3).tolist() == a
