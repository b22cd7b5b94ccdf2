"""pyflow.optim as a specification: PyTorch's optimizers and schedulers, step for step.

* SGD (momentum, dampening, Nesterov, weight decay, maximize), Adam and AdamW
  (betas, eps, weight decay, amsgrad, maximize): the same gradients fed to pyflow
  and to torch give the same float64 parameters after every step (rtol 1e-10).
* Param groups with their own lrs; parameters without a gradient are skipped;
  ``zero_grad`` with and without ``set_to_none``; ``step(closure)``.
* ``state_dict`` is PyTorch's format, and save / load into a new optimizer /
  continue equals an uninterrupted run.
* ``StepLR`` and ``CosineAnnealingLR`` give torch's lr sequences (1e-12 over 50 steps).
* Each bad input is its own error, one that names what is wrong.
* Updates are in-place ops: on "cuda" (the simulator) they equal cpu, and they run
  as VM instructions on the parameter's stream; a global broadcast parameter's
  partial-sum gradient is all-reduced before use.

Gradients are set by hand (``p.grad = ...``), the way a test feeds torch the same ones.
Tests that compare with torch skip without it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.errors import ArgumentTypeError, PyflowError
from pyflow.optim import OptimizerError
from pyflow.optim.lr_scheduler import CosineAnnealingLR, StepLR

RTOL, ATOL = 1e-10, 1e-12
tiny_shapes = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=2).map(tuple), min_size=1, max_size=2)


def _torch():
    return pytest.importorskip("torch")


def _params(shapes, seed, device="cpu"):
    """float64 pyflow parameters with random values, and their values as numpy arrays."""
    rng = np.random.default_rng(seed)
    values = [rng.normal(size=shape) for shape in shapes]
    return [flow.tensor(v, dtype=flow.float64, device=device, requires_grad=True) for v in values], values


def _gradients(shapes, steps, seed):
    """``steps`` lists of one random gradient per parameter (some with zeros, as real gradients have)."""
    rng = np.random.default_rng(seed + 1)
    return [[rng.normal(size=shape) * rng.choice([0.0, 1.0, 1.0, 10.0]) for shape in shapes] for _ in range(steps)]


def _compare_with_torch(make_flow, make_torch, shapes, steps, seed):
    """Feed the same gradients to both optimizers; the parameters agree after every step."""
    torch = _torch()
    flow_params, values = _params(shapes, seed)
    torch_params = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in values]
    flow_opt, torch_opt = make_flow(flow_params), make_torch(torch, torch_params)
    for k, grads in enumerate(_gradients(shapes, steps, seed)):
        for fp, tp, g in zip(flow_params, torch_params, grads):
            fp.grad, tp.grad = flow.tensor(g, dtype=flow.float64), torch.tensor(g, dtype=torch.float64)
        flow_opt.step()
        torch_opt.step()
        for i, (fp, tp) in enumerate(zip(flow_params, torch_params)):
            np.testing.assert_allclose(fp.numpy(), tp.detach().numpy(), rtol=RTOL, atol=ATOL,
                                       err_msg=f"parameter {i} after step {k + 1}")
    return flow_opt, torch_opt


# --- SGD, Adam, AdamW against torch ---------------------------------------------------------


@st.composite
def sgd_settings(draw):
    nesterov = draw(st.booleans())
    momentum = draw(st.sampled_from([0.0, 0.5, 0.9]) | st.floats(0.0, 0.99))
    if nesterov:
        momentum = max(momentum, 0.1)
    return dict(lr=draw(st.floats(0.0, 1.0)), momentum=momentum,
                dampening=0.0 if nesterov else draw(st.sampled_from([0.0, 0.1, 0.5])),
                weight_decay=draw(st.sampled_from([0.0, 1e-2, 0.3])), nesterov=nesterov,
                maximize=draw(st.booleans()))


@settings(max_examples=15)
@given(sgd_settings(), tiny_shapes, st.integers(3, 5), st.integers(0, 2**16))
def test_sgd_matches_torch_after_every_step(kwargs, shapes, steps, seed):
    _compare_with_torch(lambda ps: flow.optim.SGD(ps, **kwargs),
                        lambda torch, ps: torch.optim.SGD(ps, foreach=False, **kwargs), shapes, steps, seed)


@st.composite
def adam_settings(draw):
    return dict(lr=draw(st.floats(1e-4, 0.5)), betas=(draw(st.sampled_from([0.0, 0.5, 0.9])),
                                                      draw(st.sampled_from([0.0, 0.9, 0.999]))),
                eps=draw(st.sampled_from([1e-8, 1e-3, 0.1])), weight_decay=draw(st.sampled_from([0.0, 1e-2, 0.3])),
                amsgrad=draw(st.booleans()), maximize=draw(st.booleans()))


@settings(max_examples=15)
@given(adam_settings(), st.booleans(), tiny_shapes, st.integers(3, 5), st.integers(0, 2**16))
def test_adam_and_adamw_match_torch_after_every_step(kwargs, decoupled, shapes, steps, seed):
    name = "AdamW" if decoupled else "Adam"
    flow_opt, torch_opt = _compare_with_torch(lambda ps: getattr(flow.optim, name)(ps, **kwargs),
                                              lambda torch, ps: getattr(torch.optim, name)(ps, foreach=False, **kwargs),
                                              shapes, steps, seed)
    for p, torch_state in zip(flow_opt.param_groups[0]["params"], torch_opt.state.values()):
        assert flow_opt.state[p]["step"] == int(torch_state["step"]) == steps
        for key in ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if kwargs["amsgrad"] else ()):
            np.testing.assert_allclose(flow_opt.state[p][key].numpy(), torch_state[key].numpy(), rtol=RTOL,
                                       atol=ATOL, err_msg=key)


def test_defaults_are_torchs():
    torch = _torch()
    for name in ("SGD", "Adam", "AdamW"):
        ours = getattr(flow.optim, name)([flow.zeros(1, requires_grad=True)]).defaults
        theirs = getattr(torch.optim, name)([torch.zeros(1, requires_grad=True)]).defaults
        assert set(ours) <= set(theirs), name
        assert ours == {k: theirs[k] for k in ours}, name


def test_param_groups_with_their_own_lrs_match_torch():
    shapes = [(2,), (3,), (1, 2)]

    def groups(ps):
        return [{"params": ps[:1]}, {"params": ps[1:2], "lr": 0.5, "momentum": 0.0}, {"params": ps[2:], "lr": 0.01}]

    flow_opt, _ = _compare_with_torch(lambda ps: flow.optim.SGD(groups(ps), lr=0.1, momentum=0.9),
                                      lambda torch, ps: torch.optim.SGD(groups(ps), lr=0.1, momentum=0.9,
                                                                        foreach=False), shapes, 3, seed=7)
    assert [g["lr"] for g in flow_opt.param_groups] == [0.1, 0.5, 0.01]
    assert [g["momentum"] for g in flow_opt.param_groups] == [0.9, 0.0, 0.9]
    _compare_with_torch(lambda ps: flow.optim.Adam(groups(ps)[::2], lr=0.1),
                        lambda torch, ps: torch.optim.Adam(groups(ps)[::2], lr=0.1, foreach=False), shapes, 3, 8)


def test_add_param_group_takes_the_defaults():
    a, b = flow.zeros(2, requires_grad=True), flow.zeros(3, requires_grad=True)
    opt = flow.optim.Adam([a], lr=0.1, betas=(0.5, 0.6))
    opt.add_param_group({"params": b, "lr": 0.2})
    assert opt.param_groups[1]["params"] == [b]
    assert (opt.param_groups[1]["lr"], opt.param_groups[1]["betas"]) == (0.2, (0.5, 0.6))


# --- what a step touches -------------------------------------------------------------------


def test_parameters_without_a_gradient_are_skipped():
    a, b = flow.tensor([1.0], requires_grad=True), flow.tensor([2.0], requires_grad=True)
    opt = flow.optim.Adam([a, b], lr=0.1)
    a.grad = flow.tensor([1.0])
    opt.step()
    assert b.tolist() == [2.0] and b not in opt.state and opt.state[a]["step"] == 1


def test_step_changes_the_parameter_in_place():
    w = flow.tensor([1.0, 2.0], requires_grad=True)
    storage, version = w._blob, w._version
    w.grad = flow.tensor([1.0, 1.0])
    flow.optim.SGD([w], lr=1.0).step()
    assert w._blob is storage and w._version > version and w.tolist() == [0.0, 1.0]
    assert w.requires_grad and w.is_leaf and w.grad_fn is None


def test_zero_grad_sets_to_none_by_default():
    w = flow.tensor([1.0], requires_grad=True)
    w.grad = flow.tensor([3.0])
    flow.optim.SGD([w]).zero_grad()
    assert w.grad is None


def test_zero_grad_without_set_to_none_zeros_the_same_tensor():
    w, v = flow.tensor([1.0, 2.0], requires_grad=True), flow.tensor([1.0], requires_grad=True)
    grad = w.grad = flow.tensor([3.0, 4.0])
    flow.optim.SGD([w, v]).zero_grad(set_to_none=False)
    assert w.grad is grad and grad.tolist() == [0.0, 0.0] and v.grad is None


def test_step_returns_the_closures_loss_computed_with_grad_enabled():
    w = flow.tensor([1.0], requires_grad=True)
    opt = flow.optim.SGD([w], lr=0.5)

    def closure():
        assert flow.is_grad_enabled()
        w.grad = flow.tensor([2.0])
        return 42.0

    with flow.no_grad():
        assert opt.step(closure) == 42.0
    assert w.tolist() == [0.0]


def test_a_training_step_with_backward():
    w = flow.tensor([3.0, -1.0], requires_grad=True)
    opt = flow.optim.SGD([w], lr=0.25)
    for _ in range(2):
        opt.zero_grad()
        (w * w).sum().backward()
        opt.step()
    assert w.tolist() == [0.75, -0.25]


# --- state_dict ------------------------------------------------------------------------------


def test_state_dict_has_torchs_format():
    flow_opt, torch_opt = _compare_with_torch(
        lambda ps: flow.optim.Adam([{"params": ps[:1]}, {"params": ps[1:], "lr": 0.5}], amsgrad=True),
        lambda torch, ps: torch.optim.Adam([{"params": ps[:1]}, {"params": ps[1:], "lr": 0.5}], amsgrad=True,
                                           foreach=False), [(2,), (3,), (1,)], 2, seed=3)
    ours, theirs = flow_opt.state_dict(), torch_opt.state_dict()
    assert set(ours) == set(theirs) == {"state", "param_groups"}
    assert [g["params"] for g in ours["param_groups"]] == [g["params"] for g in theirs["param_groups"]] == [[0],
                                                                                                           [1, 2]]
    for ours_group, theirs_group in zip(ours["param_groups"], theirs["param_groups"]):
        assert all(ours_group[k] == theirs_group[k] for k in ("lr", "betas", "eps", "weight_decay", "amsgrad"))
    assert set(ours["state"]) == set(theirs["state"]) == {0, 1, 2}
    for i in range(3):
        assert set(ours["state"][i]) == set(theirs["state"][i])
        np.testing.assert_allclose(ours["state"][i]["exp_avg"].numpy(), theirs["state"][i]["exp_avg"].numpy(),
                                   rtol=RTOL, atol=ATOL)


def test_state_dict_of_plain_sgd_has_no_state_as_torchs():
    flow_opt, torch_opt = _compare_with_torch(lambda ps: flow.optim.SGD(ps, lr=0.1),
                                              lambda torch, ps: torch.optim.SGD(ps, lr=0.1, foreach=False),
                                              [(2,)], 1, seed=4)
    assert flow_opt.state_dict()["state"] == torch_opt.state_dict()["state"] == {}


def test_state_dict_is_a_snapshot():
    w = flow.tensor([1.0], requires_grad=True)
    opt = flow.optim.SGD([w], lr=0.1, momentum=0.9)
    w.grad = flow.tensor([1.0])
    opt.step()
    saved = opt.state_dict()
    opt.step()
    assert saved["state"][0]["momentum_buffer"].tolist() == [1.0]
    assert opt.state[w]["momentum_buffer"].tolist() == pytest.approx([1.9])


OPTIMIZERS = [
    lambda ps: flow.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    lambda ps: flow.optim.SGD(ps, lr=0.1, momentum=0.5, dampening=0.3),
    lambda ps: flow.optim.Adam(ps, lr=0.05, amsgrad=True, weight_decay=0.1),
    lambda ps: flow.optim.AdamW(ps, lr=0.05, betas=(0.8, 0.9)),
]


@pytest.mark.parametrize("make", OPTIMIZERS, ids=["sgd-nesterov", "sgd-dampening", "adam-amsgrad", "adamw"])
def test_save_load_continue_equals_an_uninterrupted_run(make):
    shapes = [(2, 2), (3,)]
    grads = _gradients(shapes, 5, seed=11)
    straight, _ = _params(shapes, seed=5)
    first = make(straight)
    for k, step_grads in enumerate(grads):
        for p, g in zip(straight, step_grads):
            p.grad = flow.tensor(g, dtype=flow.float64)
        first.step()
        if k == 1:
            saved = first.state_dict()
            resumed_values = [p.numpy().copy() for p in straight]
    resumed = [flow.tensor(v, dtype=flow.float64, requires_grad=True) for v in resumed_values]
    second = make(resumed)
    second.load_state_dict(saved)
    for step_grads in grads[2:]:
        for p, g in zip(resumed, step_grads):
            p.grad = flow.tensor(g, dtype=flow.float64)
        second.step()
    for a, b in zip(straight, resumed):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_load_state_dict_takes_the_saved_hyperparameters_and_copies_the_state():
    w = flow.tensor([1.0, 2.0], requires_grad=True)
    opt = flow.optim.SGD([w], lr=0.1, momentum=0.9)
    w.grad = flow.tensor([1.0, 1.0])
    opt.step()
    saved = opt.state_dict()
    v = flow.tensor([0.0, 0.0], dtype=flow.float64, requires_grad=True)
    other = flow.optim.SGD([v], lr=0.7)
    other.load_state_dict(saved)
    assert other.param_groups[0]["lr"] == 0.1 and other.param_groups[0]["params"] == [v]
    buf = other.state[v]["momentum_buffer"]
    assert buf.dtype == flow.float64 and buf.tolist() == [1.0, 1.0] and buf is not saved["state"][0]["momentum_buffer"]


# --- schedulers ------------------------------------------------------------------------------


def _lr_sequences(make_flow, make_torch, lrs=(0.1, 1.0), steps=50):
    torch = _torch()
    flow_opt = flow.optim.SGD([{"params": [flow.zeros(1, requires_grad=True)], "lr": lr} for lr in lrs])
    torch_opt = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in lrs])
    ours, theirs = make_flow(flow_opt), make_torch(torch, torch_opt)
    got, want = [ours.get_last_lr()], [theirs.get_last_lr()]
    for _ in range(steps):
        flow_opt.step()
        torch_opt.step()
        ours.step()
        theirs.step()
        got.append(ours.get_last_lr())
        want.append(theirs.get_last_lr())
        assert [g["lr"] for g in flow_opt.param_groups] == got[-1]
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-12, atol=1e-15)
    assert ours.last_epoch == theirs.last_epoch == steps
    return ours, np.array(got)


@settings(max_examples=10)
@given(st.integers(1, 12), st.sampled_from([0.1, 0.5, 0.9, 1.0]))
def test_step_lr_matches_torch(step_size, gamma):
    ours, got = _lr_sequences(lambda opt: StepLR(opt, step_size, gamma),
                              lambda torch, opt: torch.optim.lr_scheduler.StepLR(opt, step_size, gamma))
    closed = [[base * gamma ** (epoch // step_size) for base in (0.1, 1.0)] for epoch in range(51)]
    np.testing.assert_allclose(got, closed, rtol=1e-12)


@settings(max_examples=10)
@given(st.integers(1, 20), st.sampled_from([0.0, 1e-3, 0.05]))
def test_cosine_annealing_lr_matches_torch(t_max, eta_min):
    ours, got = _lr_sequences(lambda opt: CosineAnnealingLR(opt, t_max, eta_min),
                              lambda torch, opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, t_max, eta_min))
    closed = [[eta_min + (base - eta_min) * (1 + math.cos(math.pi * epoch / t_max)) / 2 for base in (0.1, 1.0)]
              for epoch in range(51)]
    np.testing.assert_allclose(got, closed, rtol=1e-9, atol=1e-12)   # the recursion drifts from it by rounding


def test_scheduler_state_dict_resumes_the_schedule():
    def make(lr=1.0):
        return flow.optim.SGD([flow.zeros(1, requires_grad=True)], lr=lr)

    opt = make()
    sched = CosineAnnealingLR(opt, T_max=10, eta_min=0.01)
    for _ in range(4):
        sched.step()
    saved_sched, saved_opt = sched.state_dict(), opt.state_dict()
    assert "optimizer" not in saved_sched and saved_sched["last_epoch"] == 4
    for _ in range(3):
        sched.step()
    opt2 = make(lr=123.0)
    opt2.load_state_dict(saved_opt)
    sched2 = CosineAnnealingLR(opt2, T_max=10, eta_min=0.01, last_epoch=saved_sched["last_epoch"] - 1)
    sched2.load_state_dict(saved_sched)
    for _ in range(3):
        sched2.step()
    assert sched2.get_last_lr() == sched.get_last_lr() and sched2.last_epoch == 7


# --- bad inputs ------------------------------------------------------------------------------


def _leaf(*shape):
    return flow.zeros(*(shape or (2,)), requires_grad=True)


BAD = {
    "a single tensor": (lambda: flow.optim.SGD(_leaf()), ArgumentTypeError, "iterable"),
    "a set": (lambda: flow.optim.SGD({_leaf()}), ArgumentTypeError, "set"),
    "an empty list": (lambda: flow.optim.SGD([]), OptimizerError, "empty parameter list"),
    "not a tensor": (lambda: flow.optim.SGD([_leaf(), 3.0]), ArgumentTypeError, "parameter 1 is a float"),
    "not a leaf": (lambda: flow.optim.SGD([_leaf() * 2]), OptimizerError, "not a leaf"),
    "no requires_grad": (lambda: flow.optim.SGD([flow.zeros(2)]), OptimizerError, "does not require grad"),
    "twice in a group": (lambda: (lambda p: flow.optim.SGD([p, p]))(_leaf()), OptimizerError, "listed twice"),
    "in two groups": (lambda: (lambda p: flow.optim.SGD([{"params": [p]}, {"params": p}]))(_leaf()),
                      OptimizerError, "listed twice"),
    "a group without params": (lambda: flow.optim.SGD([{"lr": 0.1}]), OptimizerError, "'params'"),
    "negative lr": (lambda: flow.optim.SGD([_leaf()], lr=-0.1), OptimizerError, "learning rate"),
    "negative lr in a group": (lambda: flow.optim.Adam([{"params": [_leaf()], "lr": -1.0}]), OptimizerError,
                               "learning rate"),
    "lr not a number": (lambda: flow.optim.SGD([_leaf()], lr="0.1"), OptimizerError, "learning rate"),
    "negative momentum": (lambda: flow.optim.SGD([_leaf()], momentum=-0.5), OptimizerError, "momentum"),
    "negative weight decay": (lambda: flow.optim.SGD([_leaf()], weight_decay=-1), OptimizerError, "weight_decay"),
    "nesterov without momentum": (lambda: flow.optim.SGD([_leaf()], nesterov=True), OptimizerError, "Nesterov"),
    "nesterov with dampening": (lambda: flow.optim.SGD([_leaf()], momentum=0.9, dampening=0.1, nesterov=True),
                                OptimizerError, "dampening 0"),
    "beta1 of 1": (lambda: flow.optim.Adam([_leaf()], betas=(1.0, 0.9)), OptimizerError, "beta1"),
    "negative beta2": (lambda: flow.optim.AdamW([_leaf()], betas=(0.9, -0.1)), OptimizerError, "beta2"),
    "one beta": (lambda: flow.optim.Adam([_leaf()], betas=(0.9,)), OptimizerError, "pair"),
    "negative eps": (lambda: flow.optim.Adam([_leaf()], eps=-1e-8), OptimizerError, "eps"),
    "step_size 0": (lambda: StepLR(flow.optim.SGD([_leaf()]), step_size=0), OptimizerError, "step_size"),
    "T_max 0": (lambda: CosineAnnealingLR(flow.optim.SGD([_leaf()]), T_max=0), OptimizerError, "T_max"),
    "a scheduler of no optimizer": (lambda: StepLR([_leaf()], step_size=1), ArgumentTypeError, "optimizer"),
    "resuming without initial_lr": (lambda: StepLR(flow.optim.SGD([_leaf()]), 2, last_epoch=3), OptimizerError,
                                    "initial_lr"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_a_specific_error(case):
    make, error, words = BAD[case]
    with pytest.raises(error, match=words) as info:
        make()
    assert isinstance(info.value, PyflowError)


def test_a_negative_lr_is_a_value_error():
    with pytest.raises(ValueError):
        flow.optim.SGD([_leaf()], lr=-1)


@pytest.mark.parametrize("mangle, words", [
    (lambda sd: {"state": sd["state"]}, "'state' and 'param_groups'"),
    (lambda sd: {**sd, "param_groups": sd["param_groups"] * 2}, "2 param groups"),
    (lambda sd: {**sd, "param_groups": [{**sd["param_groups"][0], "params": [0]}]}, "1 parameters in the state"),
    (lambda sd: {**sd, "state": {7: {"momentum_buffer": None}}}, "parameter id 7"),
])
def test_a_state_dict_that_does_not_fit_is_an_error(mangle, words):
    opt = flow.optim.SGD([_leaf(), _leaf()], momentum=0.9)
    with pytest.raises(OptimizerError, match=words):
        opt.load_state_dict(mangle(opt.state_dict()))


def test_an_update_outside_no_grad_would_be_an_autograd_error():
    """Why the step runs under no_grad: an in-place op on a parameter is an error anywhere else."""
    w = _leaf()
    with pytest.raises(flow.errors.AutogradError, match="no_grad"):
        w.add_(1.0)


# --- devices and global tensors -----------------------------------------------------------------


def test_updates_on_cuda_equal_cpu_and_run_on_the_parameters_stream():
    results = {}
    for device in ("cpu", "cuda"):
        sgd_param = flow.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=flow.float64, device=device, requires_grad=True)
        adam_param = flow.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=flow.float64, device=device, requires_grad=True)
        sgd = flow.optim.SGD([sgd_param], lr=0.1, momentum=0.9, weight_decay=0.01)
        adam = flow.optim.Adam([adam_param], lr=0.1, amsgrad=True)
        for k in range(2):
            for p in (sgd_param, adam_param):
                p.grad = flow.tensor([[0.3, -1.0], [2.0, 0.0]], dtype=flow.float64, device=device) * (k + 1)
            with flow.trace() as tracer:
                sgd.step()
                adam.step()
            flow.sync()
        assert adam.state[adam_param]["exp_avg"].device == adam_param.device
        assert sgd.state[sgd_param]["momentum_buffer"].device == sgd_param.device
        updates = [r for r in tracer.records if r.name in ("add", "mul", "div", "sqrt", "maximum")]
        assert updates and {r.stream for r in updates} == {f"{device}:0/compute"}
        results[device] = (sgd_param.numpy(), adam_param.numpy())
    for cpu, cuda in zip(results["cpu"], results["cuda"]):
        np.testing.assert_allclose(cuda, cpu, rtol=1e-12)


def test_a_broadcast_parameters_partial_sum_gradient_is_all_reduced():
    """Data parallelism on 2 ranks: each rank's gradient is a piece of a P gradient of a B parameter."""
    def per_rank():
        rank = flow.env.get_rank()
        ranks = flow.placement("cpu", [0, 1])
        w = flow.tensor([1.0, 2.0], dtype=flow.float64, placement=ranks, sbp=flow.sbp.broadcast,
                        requires_grad=True)
        opt = flow.optim.SGD([w], lr=0.1, momentum=0.9)
        for _ in range(2):
            local = flow.tensor([1.0, -1.0], dtype=flow.float64) * (rank + 1)     # ranks: [1, -1], [2, -2]
            w.grad = local.to_global(placement=ranks, sbp=flow.sbp.partial_sum)  # logical gradient [3, -3]
            opt.step()
        buf = opt.state[w]["momentum_buffer"]
        return w.to_local().numpy(), w.sbp, buf.sbp, buf.to_local().numpy()

    expected = np.array([1.0, 2.0]) - 0.1 * np.array([3.0, -3.0]) - 0.1 * 1.9 * np.array([3.0, -3.0])
    for piece, sbp, buf_sbp, buf in flow.distributed.run(per_rank, world_size=2):
        np.testing.assert_allclose(piece, expected, rtol=1e-12)
        assert sbp == buf_sbp == (flow.sbp.broadcast,)
        np.testing.assert_allclose(buf, [5.7, -5.7], rtol=1e-12)


def test_momentum_on_parameters_of_disjoint_placements_makes_their_state_on_every_rank_in_order():
    """Each rank once made only its own parameters' momentum buffers, so the ranks' collectives diverged."""
    def body():
        p0, p1 = flow.placement("cpu", [0]), flow.placement("cpu", [1])
        a = flow.tensor([1.0, 2.0], placement=p0, sbp=flow.sbp.broadcast).requires_grad_()
        b = flow.tensor([3.0], placement=p1, sbp=flow.sbp.broadcast).requires_grad_()
        opt = flow.optim.SGD([a, b], lr=0.5, momentum=0.9)
        for _ in range(2):
            (a.sum() + b.to_global(placement=p0).sum()).backward()
            opt.step()
            opt.zero_grad()
        return a.numpy(), b.numpy()

    for a, b in flow.distributed.run(body, world_size=2):
        np.testing.assert_allclose(a, [1.0 - 0.5 - 0.5 * 1.9, 2.0 - 0.5 - 0.5 * 1.9])
        np.testing.assert_allclose(b, [3.0 - 0.5 - 0.5 * 1.9])
