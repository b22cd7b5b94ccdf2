"""The fused optimizer update ops (``pyflow/ops/optim_update.py``, ``kernels/optim_update.py``) as a specification.

* ``sgd_update``, ``momentum_update`` and ``adam_update``, called directly with a
  0-d float32 learning-rate tensor and a 0-d int64 train_step, on cpu and on cuda
  (the simulator), give torch.optim's float32 parameters and state after every step
  (momentum, dampening, Nesterov, weight decay, maximize; Adam, AdamW, amsgrad),
  also when the learning rate changes between steps (the same tensor, refilled).
* SGD momentum's first step: the buffer becomes the gradient whatever it held.
* cpu and cuda agree to the last bit (float32 and float16; float16 computes in float32).
* Every written tensor's version is bumped, so autograd sees the write.
* Bad input is a ShapeError / DTypeError / ArgumentTypeError naming the op.
* The optimizers: one fused op per parameter, the lr tensor cached and refilled only
  when ``group["lr"]`` changes, ``state["step"]`` a 0-d int64 tensor (and an old
  int step still loads), and ``_update_op`` is the one-parameter hook.

Tensors are tiny and examples few: the simulator runs every CUDA thread as Python.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.errors import ArgumentTypeError, AutogradError, DeviceError, DTypeError, ShapeError
from pyflow.framework.interpreter import apply
from pyflow.kernels.backend import is_gpu
from pyflow.ops.optim_update import adam_update, momentum_update, sgd_update

RTOL, ATOL = 2e-5, 1e-6   # float32, a few steps
small_shapes = st.sampled_from([(), (1,), (3,), (2, 3)])


def _torch():
    return pytest.importorskip("torch")


def _gradients(shape, steps, seed):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=shape) * rng.choice([0.0, 1.0, 5.0])).astype(np.float32) for _ in range(steps)]


def _lrs(lr, steps, change):
    """The lr of each step: it changes (as a scheduler would) from step 3 on when ``change``."""
    return [lr * (0.5 if change and k >= 2 else 1.0) for k in range(steps)]


def _run_flow(make_state, update, start, grads, lrs, device):
    """Feed ``grads`` to the fused op on ``device``; returns the model and state after every step."""
    model = flow.tensor(start, device=device)
    state = make_state(model)
    lr = flow.tensor(lrs[0], dtype=flow.float32, device=device)
    step = flow.tensor(0, dtype=flow.int64, device=device)
    history = []
    for k, g in enumerate(grads):
        if k and lrs[k] != lrs[k - 1]:
            lr.fill_(lrs[k])                       # the same tensor, refilled: what a traced graph keeps
        step.fill_(k + 1)
        update(model, flow.tensor(g, device=device), state, lr, step)
        history.append([model.numpy().copy()] + [t.numpy().copy() for t in state])
    return history


def _run_torch(torch, make_opt, state_keys, start, grads, lrs):
    p = torch.tensor(start, requires_grad=True)
    opt = make_opt(torch, [p])
    history = []
    for k, g in enumerate(grads):
        opt.param_groups[0]["lr"] = lrs[k]
        p.grad = torch.tensor(g)
        opt.step()
        history.append([p.detach().numpy().copy()] + [opt.state[p][key].numpy().copy() for key in state_keys])
    return history


def _assert_histories(ours, theirs, names):
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        for name, x, y in zip(names, a, b, strict=True):
            np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL, err_msg=f"{name} after step {k + 1}")


def _names(tracer):
    """The ops a trace ran, in order (the VM fuses consecutive in-order calls: "fuse[a,b]" is a, b)."""
    names = []
    for r in tracer.records:
        names += r.name[len("fuse["):-1].split(",") if r.name.startswith("fuse[") else [r.name]
    return [name for name in names if name != "release_tensor"]


# --- against torch.optim -------------------------------------------------------------------------


@st.composite
def sgd_settings(draw):
    momentum = draw(st.sampled_from([0.0, 0.5, 0.9]))
    nesterov = momentum > 0 and draw(st.booleans())
    return dict(lr=draw(st.sampled_from([0.01, 0.1, 0.5])), momentum=momentum,
                dampening=0.0 if nesterov else draw(st.sampled_from([0.0, 0.3])), nesterov=nesterov,
                weight_decay=draw(st.sampled_from([0.0, 0.1])), maximize=draw(st.booleans()))


@settings(max_examples=8)
@given(sgd_settings(), small_shapes, st.integers(2, 4), st.booleans(), st.integers(0, 2**16),
       st.sampled_from(["cpu", "cuda"]))
def test_sgd_and_momentum_update_match_torch(kwargs, shape, steps, change_lr, seed, device):
    torch = _torch()
    start = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    grads, lrs = _gradients(shape, steps, seed), _lrs(kwargs["lr"], steps, change_lr)
    attrs = dict(weight_decay=kwargs["weight_decay"], maximize=kwargs["maximize"])
    if kwargs["momentum"] == 0:
        def update(model, g, state, lr, step):
            sgd_update(model, g, lr, **attrs)
        make_state, keys = (lambda model: []), ()
    else:
        def update(model, g, state, lr, step):
            momentum_update(model, g, state[0], lr, step, momentum=kwargs["momentum"],
                            dampening=kwargs["dampening"], nesterov=kwargs["nesterov"], **attrs)
        make_state, keys = (lambda model: [flow.zeros_like(model)]), ("momentum_buffer",)
    ours = _run_flow(make_state, update, start, grads, lrs, device)
    theirs = _run_torch(torch, lambda t, ps: t.optim.SGD(ps, foreach=False, **kwargs), keys, start, grads, lrs)
    _assert_histories(ours, theirs, ("model",) + keys)


@st.composite
def adam_settings(draw):
    return dict(lr=draw(st.sampled_from([1e-3, 0.05, 0.3])),
                betas=(draw(st.sampled_from([0.0, 0.5, 0.9])), draw(st.sampled_from([0.0, 0.9, 0.999]))),
                eps=draw(st.sampled_from([1e-8, 1e-3])), weight_decay=draw(st.sampled_from([0.0, 0.1])),
                amsgrad=draw(st.booleans()), maximize=draw(st.booleans()))


@settings(max_examples=8)
@given(adam_settings(), st.booleans(), small_shapes, st.integers(2, 4), st.booleans(), st.integers(0, 2**16),
       st.sampled_from(["cpu", "cuda"]))
def test_adam_update_matches_torch_adam_and_adamw(kwargs, decoupled, shape, steps, change_lr, seed, device):
    torch = _torch()
    start = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    grads, lrs = _gradients(shape, steps, seed), _lrs(kwargs["lr"], steps, change_lr)
    amsgrad = kwargs["amsgrad"]

    def make_state(model):
        return [flow.zeros_like(model) for _ in range(3 if amsgrad else 2)]

    def update(model, g, state, lr, step):
        m, v = state[0], state[1]
        adam_update(model, g, m, v, state[2] if amsgrad else v, lr, step, beta1=kwargs["betas"][0],
                    beta2=kwargs["betas"][1], eps=kwargs["eps"], weight_decay=kwargs["weight_decay"],
                    amsgrad=amsgrad, maximize=kwargs["maximize"], decoupled_weight_decay=decoupled)

    keys = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if amsgrad else ())
    ours = _run_flow(make_state, update, start, grads, lrs, device)
    name = "AdamW" if decoupled else "Adam"
    theirs = _run_torch(torch, lambda t, ps: getattr(t.optim, name)(ps, foreach=False, **kwargs), keys, start,
                        grads, lrs)
    _assert_histories(ours, theirs, ("model",) + keys)


# --- semantics ------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_momentums_first_step_makes_the_buffer_the_gradient_whatever_it_held(device):
    w = flow.tensor([1.0, 2.0], device=device)
    buf = flow.tensor([123.0, float("nan")], device=device)   # garbage: step 1 never reads it
    lr, g = flow.tensor(0.5, device=device), flow.tensor([1.0, -2.0], device=device)
    momentum_update(w, g, buf, lr, flow.tensor(1, device=device), momentum=0.9, dampening=0.5, weight_decay=0.5)
    assert buf.tolist() == [1.5, -1.0] and w.tolist() == [0.25, 2.5]     # g + 0.5 * w, no dampening on step 1
    momentum_update(w, g, buf, lr, flow.tensor(2, device=device), momentum=0.9, dampening=0.5, nesterov=False)
    np.testing.assert_allclose(buf.numpy(), [0.9 * 1.5 + 0.5 * 1.0, 0.9 * -1.0 + 0.5 * -2.0], rtol=1e-6)


def test_nesterov_and_maximize_by_hand():
    w, buf = flow.tensor([1.0]), flow.tensor([2.0])
    momentum_update(w, flow.tensor([1.0]), buf, flow.tensor(0.1), flow.tensor(5), momentum=0.5, nesterov=True,
                    maximize=True)
    # g = -1; buf = 0.5 * 2 + -1 = 0; step g + 0.5 * buf = -1; w = 1 - 0.1 * -1
    assert buf.tolist() == [0.0] and w.tolist() == pytest.approx([1.1])


@pytest.mark.parametrize("dtype", [flow.float32, flow.float16])
def test_cpu_and_cuda_agree_to_the_last_bit(dtype):
    """Bit for bit in the simulator, whose arithmetic is the host's.  A GPU's compiler fuses ``a * b + c`` into
    one fused multiply-add, rounded once (NVVM's default, as nvcc's --fmad=true): there the two agree to 4 units
    in the last place (float32 after three steps: 2 seen on an H200, 2026-11-28)."""
    rng = np.random.default_rng(0)
    start, grads = rng.normal(size=(2, 3)), [rng.normal(size=(2, 3)) for _ in range(3)]
    results = {}
    for device in ("cpu", "cuda"):
        w_sgd, w_adam = (flow.tensor(start, dtype=dtype, device=device) for _ in range(2))
        buf, m, v, vmax = (flow.zeros_like(w_sgd) for _ in range(4))
        lr = flow.tensor(0.05, device=device)
        for k, g in enumerate(grads):
            g, step = flow.tensor(g, dtype=dtype, device=device), flow.tensor(k + 1, device=device)
            momentum_update(w_sgd, g, buf, lr, step, momentum=0.9, dampening=0.1, weight_decay=0.01)
            adam_update(w_adam, g, m, v, vmax, lr, step, beta1=0.9, beta2=0.99, eps=1e-6, weight_decay=0.1,
                        amsgrad=True, decoupled_weight_decay=k == 1)
        results[device] = [t.numpy() for t in (w_sgd, buf, w_adam, m, v, vmax)]
    for cpu, cuda in zip(results["cpu"], results["cuda"], strict=True):
        assert cpu.dtype == cuda.dtype == dtype
        if is_gpu():
            np.testing.assert_array_max_ulp(cpu, cuda, maxulp=4)
        else:
            np.testing.assert_array_equal(cpu, cuda)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_float16_computes_in_float32_and_rounds_once(device):
    rng = np.random.default_rng(1)
    p, g = rng.normal(size=8).astype(np.float16), rng.normal(size=8).astype(np.float16)
    w = flow.tensor(p, device=device)
    sgd_update(w, flow.tensor(g, device=device), flow.tensor(0.01, device=device), weight_decay=0.3)
    f32 = np.float32
    expected = (p.astype(f32) - f32(0.01) * (g.astype(f32) + f32(0.3) * p.astype(f32))).astype(np.float16)
    np.testing.assert_array_equal(w.numpy(), expected)


def test_written_tensors_get_their_versions_bumped_and_autograd_sees_it():
    w = flow.tensor([1.0, 2.0], requires_grad=True)
    m, v = flow.zeros(2), flow.zeros(2)
    before = (w._version, m._version, v._version)
    loss = (w * w).sum()          # saves w for backward
    with flow.no_grad():
        adam_update(w, flow.tensor([1.0, 1.0]), m, v, v, flow.tensor(0.1), flow.tensor(1), beta1=0.9, beta2=0.999,
                    eps=1e-8)
    assert (w._version, m._version, v._version) == (before[0] + 1, before[1] + 1, before[2] + 1)
    with pytest.raises(AutogradError, match="modified by an in-place operation"):
        loss.backward()


def test_the_ops_have_no_outputs_and_one_instruction():
    w, g, lr = flow.zeros(3), flow.ones(3), flow.tensor(1.0)
    flow.sync()
    with flow.trace() as tracer:
        assert apply("sgd_update", [w, g, lr]) == []
    assert _names(tracer) == ["sgd_update"]
    assert w.tolist() == [-1.0, -1.0, -1.0]


# --- bad input ------------------------------------------------------------------------------------


def _bad(kind):
    w, g, lr, step, base = flow.zeros(2), flow.ones(2), flow.tensor(0.1), flow.tensor(1), flow.zeros(4)
    cases = {
        "diff shape": lambda: sgd_update(w, flow.ones(3), lr),
        "state shape": lambda: momentum_update(w, g, flow.zeros(2, 1), lr, step, momentum=0.9),
        "int model": lambda: sgd_update(flow.zeros(2, dtype=flow.int64), flow.ones(2, dtype=flow.int64), lr),
        "diff dtype": lambda: sgd_update(w, flow.ones(2, dtype=flow.float64), lr),
        "lr not 0-d": lambda: sgd_update(w, g, flow.tensor([0.1])),
        "lr an int tensor": lambda: sgd_update(w, g, flow.tensor(1)),
        "lr a float": lambda: sgd_update(w, g, 0.1),
        "step float": lambda: adam_update(w, g, w.clone(), w.clone(), w.clone(), lr, flow.tensor(1.0), beta1=0.9,
                                          beta2=0.9, eps=1e-8),
        "no momentum": lambda: apply("momentum_update", [w, g, w.clone(), lr, step]),
        "unknown attr": lambda: apply("sgd_update", [w, g, lr], momentun=0.9),
        "requires grad": lambda: sgd_update(flow.zeros(2, requires_grad=True), g, lr),
        "expanded": lambda: sgd_update(flow.zeros(1).expand(2), g, lr),
        "overlap": lambda: momentum_update(base[:2], g, base[1:3], lr, step, momentum=0.9),
    }
    return cases[kind]


BAD = {
    "diff shape": (ShapeError, r"sgd_update: model_diff has shape \[3\], the model \[2\]"),
    "state shape": (ShapeError, r"momentum_update: momentum_buf has shape \[2, 1\], the model \[2\]"),
    "int model": (DTypeError, r"sgd_update: the model must be a floating-point tensor .* got int64"),
    "diff dtype": (DTypeError, r"sgd_update: model_diff is float64, the model float32"),
    "lr not 0-d": (DTypeError, r"sgd_update: learning_rate must be a 0-d float32 .* got float32\[1\]"),
    "lr an int tensor": (DTypeError, r"learning_rate must be a 0-d float32 .* got int64\[\]"),
    "lr a float": (ArgumentTypeError, r"sgd_update: learning_rate must be a tensor"),
    "step float": (DTypeError, r"adam_update: train_step must be a 0-d int64 tensor .* got float32\[\]"),
    "no momentum": (ArgumentTypeError, r"momentum_update: .*missing momentum"),
    "unknown attr": (ArgumentTypeError, r"sgd_update: .*unknown momentun"),
    "requires grad": (AutogradError, r"sgd_update writes model .* requires grad"),
    "expanded": (ShapeError, r"sgd_update: several elements of model"),
    "overlap": (ShapeError, r"momentum_update: model .* overlaps momentum_buf"),
}


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_input_is_a_specific_error_naming_the_op(kind):
    error, words = BAD[kind]
    with pytest.raises(error, match=words):
        _bad(kind)()


def test_global_tensors_are_refused_with_the_way_out():
    def per_rank():
        ranks = flow.placement("cpu", [0, 1])
        w = flow.tensor([1.0, 2.0], placement=ranks, sbp=flow.sbp.broadcast)
        lr = flow.tensor(0.1, placement=ranks, sbp=flow.sbp.broadcast)
        with pytest.raises(DeviceError, match="local piece"):
            sgd_update(w, w.clone(), lr)
        return True

    assert flow.distributed.run(per_rank, world_size=2) == [True, True]


# --- the optimizers ---------------------------------------------------------------------------------




@pytest.mark.parametrize("make, per_param", [
    (lambda ps: flow.optim.SGD(ps, lr=0.1), ["sgd_update"]),
    (lambda ps: flow.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True), ["momentum_update"]),
    (lambda ps: flow.optim.Adam(ps, lr=0.1, amsgrad=True), ["add", "adam_update"]),
    (lambda ps: flow.optim.AdamW(ps, lr=0.1), ["add", "adam_update"]),
], ids=["sgd", "momentum", "adam", "adamw"])
def test_a_steady_step_is_one_fused_op_per_parameter_and_the_lr_is_refilled_only_when_it_changes(make, per_param):
    ps = [flow.tensor([1.0, 2.0], requires_grad=True), flow.tensor([[3.0]], requires_grad=True)]
    opt = make(ps)
    sched = flow.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    names = []
    for _ in range(5):
        for p in ps:
            p.grad = flow.ones_like(p)
        flow.sync()
        with flow.trace() as tracer:
            opt.step()
        names.append(sorted(_names(tracer)))   # (the trace lists instructions as they run, not as issued)
        sched.step()
    # step 1 makes the state, the lr tensor and the step constants; step 4 follows StepLR's new lr
    assert names[1] == names[2] == names[4] == sorted(per_param * 2)
    assert names[3] == sorted(["fill"] + per_param * 2)
    assert len(opt._lr_tensors) == 1
    (_, value, lr), = opt._lr_tensors.values()
    assert value == 0.05 and lr.item() == pytest.approx(0.05) and lr.shape == () and lr.dtype == flow.float32


def test_adams_step_is_an_int64_tensor_saved_and_loaded_and_an_old_int_step_still_loads():
    def make(p):
        return flow.optim.Adam([p], lr=0.1, betas=(0.5, 0.9))

    p, q, r = (flow.tensor([1.0, -1.0], requires_grad=True) for _ in range(3))
    first = make(p)
    for _ in range(2):
        p.grad = flow.tensor([0.5, 2.0])
        first.step()
    step = first.state[p]["step"]
    assert step.shape == () and step.dtype == flow.int64 and step.device == p.device and int(step) == 2
    saved = first.state_dict()
    assert saved["state"][0]["step"] is not step and int(saved["state"][0]["step"]) == 2
    old = {**saved, "state": {0: {**saved["state"][0], "step": 2}}}   # a state dict from before 1.12: an int
    for target, state_dict in ((q, saved), (r, old)):
        with flow.no_grad():
            target.copy_(p)
        resumed = make(target)
        resumed.load_state_dict(state_dict)
        target.grad = flow.tensor([0.5, 2.0])
        resumed.step()
        assert int(resumed.state[target]["step"]) == 3 and resumed.state[target]["step"].dtype == flow.int64
    p.grad = flow.tensor([0.5, 2.0])
    first.step()
    np.testing.assert_array_equal(q.numpy(), p.numpy())
    np.testing.assert_array_equal(r.numpy(), p.numpy())


def test_update_op_is_the_one_parameter_hook_with_the_callers_lr_and_step():
    """What the compiler's optimizer pass calls: the same op, with its own lr and step tensors."""
    ps = [flow.tensor([1.0, 2.0], requires_grad=True) for _ in range(2)]
    eager, hooked = flow.optim.Adam([ps[0]], lr=0.1), flow.optim.Adam([ps[1]], lr=123.0)
    lr, step = flow.tensor(0.1), flow.tensor(0)
    hooked._prepare(ps[1], hooked.param_groups[0], hooked.state[ps[1]])   # makes the state
    for k in range(3):
        for p in ps:
            p.grad = flow.tensor([1.0, -1.0]) * (k + 1)
        eager.step()
        step.fill_(k + 1)
        with flow.no_grad(), flow.trace() as tracer:
            hooked._update_op(ps[1], ps[1].grad, hooked.param_groups[0], hooked.state[ps[1]], lr, step)
        assert _names(tracer) == ["adam_update"]
    np.testing.assert_array_equal(ps[1].numpy(), ps[0].numpy())
