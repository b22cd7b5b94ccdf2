"""Training end to end against PyTorch: 5 steps of a small MLP and a small CNN, with SGD (momentum,
nesterov, weight decay) and Adam / AdamW, from the same initial weights on the same data: the losses
of every step and the final state dicts agree (float64), on cpu; one short run on cuda (the simulator)."""

from __future__ import annotations

import numpy as np
import pytest

import pyflow as flow

torch = pytest.importorskip("torch")

STEPS = 5


def mlp(lib):
    nn = lib.nn
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))


def cnn(lib):
    nn = lib.nn
    return nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(3, 2, 2), nn.Flatten(), nn.Linear(2, 3))


def optimizer(lib, name, params):
    optim = lib.optim
    if name == "sgd":
        return optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
    if name == "nesterov":
        return optim.SGD(params, lr=0.05, momentum=0.8, nesterov=True)
    if name == "adam":
        return optim.Adam(params, lr=0.01, betas=(0.8, 0.99))
    return optim.AdamW(params, lr=0.01, weight_decay=0.1)


def data(model_name, seed):
    rng = np.random.default_rng(seed)
    shape = (6, 4) if model_name == "mlp" else (4, 1, 5, 5)
    return rng.standard_normal(shape), rng.integers(0, 3, shape[0])


def train(lib, model_name, opt_name, x, y, state, device="cpu"):
    """``STEPS`` steps from ``state``; the losses and the final state dict (numpy)."""
    model = (mlp if model_name == "mlp" else cnn)(lib).double()
    if lib is torch:
        model.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
        inputs, targets = torch.tensor(x), torch.tensor(y)
    else:
        model.load_state_dict({k: flow.tensor(v) for k, v in state.items()})
        model.to(device)
        inputs, targets = flow.tensor(x, device=device), flow.tensor(y, device=device)
    opt = optimizer(lib, opt_name, model.parameters())
    losses = []
    for _ in range(STEPS):
        loss = lib.nn.functional.cross_entropy(model(inputs), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    final = {k: (v.detach().numpy() if lib is torch else v.numpy()) for k, v in model.state_dict().items()}
    return losses, final


def initial_state(model_name):
    torch.manual_seed(0)
    model = (mlp if model_name == "mlp" else cnn)(torch).double()
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("opt_name", ["sgd", "nesterov", "adam", "adamw"])
@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
def test_five_training_steps_match_pytorch(model_name, opt_name):
    state = initial_state(model_name)
    x, y = data(model_name, seed=len(opt_name))
    expected_losses, expected_state = train(torch, model_name, opt_name, x, y, state)
    losses, final = train(flow, model_name, opt_name, x, y, state)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-10)
    assert final.keys() == expected_state.keys()
    # The CNN's first conv bias feeds a BatchNorm, which cancels it: its true gradient is 0, and both
    # frameworks compute rounding noise (~1e-17) there. Adam divides that noise by its own size, so
    # the bias moves by up to lr per step in a direction set by the last bits: compared loosely.
    atol = 1e-8 if (model_name, opt_name) in (("cnn", "adam"), ("cnn", "adamw")) else 1e-12
    for key in final:
        np.testing.assert_allclose(final[key], expected_state[key], rtol=1e-9, atol=atol, err_msg=key)
    assert losses[-1] < losses[0]


def test_training_on_cuda_matches_pytorch():
    state = initial_state("mlp")
    x, y = data("mlp", seed=1)
    expected_losses, expected_state = train(torch, "mlp", "adam", x, y, state)
    losses, final = train(flow, "mlp", "adam", x, y, state, device="cuda")
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-10)
    for key in final:
        np.testing.assert_allclose(final[key], expected_state[key], rtol=1e-9, atol=1e-12, err_msg=key)
