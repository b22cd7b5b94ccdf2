"""flow.nn against torch.nn: the same weights (loaded through state dicts with the same keys) give the same
outputs, input gradients and parameter gradients, in float64; default initialisations follow the same
distributions.

Every comparison: build both modules, ``.double()`` them, load torch's state dict into pyflow's
(``load_state_dict`` is strict, so the key names are checked too), run both on the same inputs, and
backward the same weighted sum of the outputs (a random weight per element, so every gradient
entry is tested, not just their sum).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import nn
from pyflow.nn import functional as F

torch = pytest.importorskip("torch")

RTOL, ATOL = 1e-9, 1e-11


def _flat(output) -> list:
    """The tensors of an output: a tensor, or nested tuples of them (LSTM: output, (h_n, c_n))."""
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _flat(item)]
    return [output]


def _assert_close(ours, theirs, what: str) -> None:
    assert theirs is not None, f"torch has no {what}"
    assert ours is not None, f"pyflow has no {what} (torch has one)"
    np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=RTOL, atol=ATOL, err_msg=what)


def load_torch_weights(ours, theirs) -> None:
    """pyflow module ``ours`` takes the values of torch module ``theirs`` (same keys, strict)."""
    ours.load_state_dict({k: flow.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()})


def compare(ours, theirs, *arrays, train: bool = True, seed: int = 0) -> None:
    """Same forward, same input and parameter gradients, same state after the forward."""
    ours.double().train(train)
    theirs.double().train(train)
    load_torch_weights(ours, theirs)
    floats = [a.dtype.kind == "f" for a in arrays]
    flow_in = [flow.tensor(a, requires_grad=f) for a, f in zip(arrays, floats)]
    torch_in = [torch.tensor(a, requires_grad=f) for a, f in zip(arrays, floats)]
    ours_out, theirs_out = _flat(ours(*flow_in)), _flat(theirs(*torch_in))
    assert len(ours_out) == len(theirs_out)
    rng = np.random.default_rng(seed)
    flow_loss, torch_loss = 0.0, 0.0
    for i, (o, t) in enumerate(zip(ours_out, theirs_out)):
        assert tuple(o.shape) == tuple(t.shape), f"output {i}: shape {o.shape} vs torch's {tuple(t.shape)}"
        _assert_close(o, t, f"output {i}")
        weights = rng.standard_normal(tuple(t.shape))
        flow_loss = flow_loss + (o * flow.tensor(weights)).sum()
        torch_loss = torch_loss + (t * torch.tensor(weights)).sum()
    flow_loss.backward()
    torch_loss.backward()
    for i, (x, t) in enumerate(zip(flow_in, torch_in)):
        if t.requires_grad:
            _assert_close(x.grad, t.grad, f"gradient of input {i}")
    theirs_params = dict(theirs.named_parameters())
    assert [name for name, _ in ours.named_parameters()] == list(theirs_params)
    for name, p in ours.named_parameters():
        _assert_close(p.grad, theirs_params[name].grad, f"gradient of {name}")
    theirs_state = theirs.state_dict()
    for name, value in ours.state_dict().items():   # running statistics after the forward
        np.testing.assert_allclose(value.numpy(), theirs_state[name].numpy(), rtol=RTOL, atol=ATOL, err_msg=name)


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# --- layers --------------------------------------------------------------------------------------------------


@settings(max_examples=8)
@given(lead=st.lists(st.integers(1, 3), max_size=2), n_in=st.integers(1, 4), n_out=st.integers(1, 4),
       bias=st.booleans())
def test_linear_matches_torch(lead, n_in, n_out, bias):
    compare(nn.Linear(n_in, n_out, bias=bias), torch.nn.Linear(n_in, n_out, bias=bias), randn(*lead, n_in))


@settings(max_examples=6)
@given(c_in=st.integers(1, 2), c_out=st.integers(1, 3), side=st.integers(3, 5), kernel=st.integers(1, 3),
       stride=st.integers(1, 2), padding=st.integers(0, 1), bias=st.booleans())
def test_conv2d_matches_torch(c_in, c_out, side, kernel, stride, padding, bias):
    args = (c_in, c_out, kernel)
    kwargs = {"stride": stride, "padding": padding, "bias": bias}
    compare(nn.Conv2d(*args, **kwargs), torch.nn.Conv2d(*args, **kwargs), randn(2, c_in, side, side + 1))


@settings(max_examples=6)
@given(n=st.integers(2, 3), c=st.integers(1, 3), side=st.integers(1, 3), affine=st.booleans(),
       momentum=st.sampled_from([0.1, 0.5, None]))
def test_batchnorm2d_training_matches_torch(n, c, side, affine, momentum):
    compare(nn.BatchNorm2d(c, momentum=momentum, affine=affine),
            torch.nn.BatchNorm2d(c, momentum=momentum, affine=affine), randn(n, c, side, side))


def test_batchnorm2d_eval_matches_torch():
    ours, theirs = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        theirs.running_mean.copy_(torch.tensor([0.5, -1.0, 2.0]))
        theirs.running_var.copy_(torch.tensor([1.5, 0.3, 4.0]))
        theirs.weight.copy_(torch.tensor([2.0, 0.5, -1.0]))
    compare(ours, theirs, randn(2, 3, 2, 2), train=False)


def test_batchnorm1d_without_running_stats_matches_torch():
    compare(nn.BatchNorm1d(2, track_running_stats=False), torch.nn.BatchNorm1d(2, track_running_stats=False),
            randn(4, 2, 3))


@pytest.mark.parametrize("name", ["ReLU", "Tanh", "Sigmoid"])
def test_activations_match_torch(name):
    compare(getattr(nn, name)(), getattr(torch.nn, name)(), randn(3, 4))


def test_sequential_matches_torch_with_the_same_keys():
    ours = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.BatchNorm1d(4), nn.Linear(4, 2), nn.Tanh())
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.BatchNorm1d(4),
                                 torch.nn.Linear(4, 2), torch.nn.Tanh())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    compare(ours, theirs, randn(5, 3))


@settings(max_examples=6)
@given(rows=st.integers(2, 5), dim=st.integers(1, 3), padding=st.sampled_from([None, 0, 1]))
def test_embedding_matches_torch(rows, dim, padding):
    indices = np.random.default_rng(rows).integers(0, rows, size=(2, 3))
    compare(nn.Embedding(rows, dim, padding_idx=padding), torch.nn.Embedding(rows, dim, padding_idx=padding),
            indices)


def test_lstm_cell_matches_torch():
    ours, theirs = nn.LSTMCell(3, 2), torch.nn.LSTMCell(3, 2)
    ours.double()
    theirs.double()
    load_torch_weights(ours, theirs)
    x, h, c = randn(4, 3), randn(4, 2, seed=1), randn(4, 2, seed=2)
    fx, fh, fc = (flow.tensor(a, requires_grad=True) for a in (x, h, c))
    tx, th, tc = (torch.tensor(a, requires_grad=True) for a in (x, h, c))
    (h1, c1), (th1, tc1) = ours(fx, (fh, fc)), theirs(tx, (th, tc))
    _assert_close(h1, th1, "h'")
    _assert_close(c1, tc1, "c'")
    w = randn(4, 2, seed=3)
    (h1 * flow.tensor(w) + c1 * c1).sum().backward()
    (th1 * torch.tensor(w) + tc1 * tc1).sum().backward()
    for ours_t, theirs_t, what in ((fx, tx, "x"), (fh, th, "h"), (fc, tc, "c")):
        _assert_close(ours_t.grad, theirs_t.grad, f"gradient of {what}")
    theirs_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        _assert_close(p.grad, theirs_params[name].grad, f"gradient of {name}")


def test_lstm_cell_without_state_or_bias_matches_torch():
    compare(nn.LSTMCell(2, 3, bias=False), torch.nn.LSTMCell(2, 3, bias=False), randn(2, 2))


@settings(max_examples=5)
@given(layers=st.integers(1, 2), batch_first=st.booleans(), bidirectional=st.booleans(), bias=st.booleans())
def test_lstm_matches_torch(layers, batch_first, bidirectional, bias):
    kwargs = {"num_layers": layers, "batch_first": batch_first, "bidirectional": bidirectional, "bias": bias}
    compare(nn.LSTM(2, 3, **kwargs), torch.nn.LSTM(2, 3, **kwargs), randn(3, 2, 2))


def test_lstm_with_an_initial_state_matches_torch():
    ours, theirs = nn.LSTM(2, 3, num_layers=2), torch.nn.LSTM(2, 3, num_layers=2)
    ours.double()
    theirs.double()
    load_torch_weights(ours, theirs)
    x, h0, c0 = randn(4, 2, 2), randn(2, 2, 3, seed=1), randn(2, 2, 3, seed=2)
    out, (h, c) = ours(flow.tensor(x), (flow.tensor(h0), flow.tensor(c0)))
    t_out, (t_h, t_c) = theirs(torch.tensor(x), (torch.tensor(h0), torch.tensor(c0)))
    for a, b, what in ((out, t_out, "output"), (h, t_h, "h_n"), (c, t_c, "c_n")):
        _assert_close(a, b, what)


def test_unbatched_lstm_matches_torch():
    compare(nn.LSTM(2, 3), torch.nn.LSTM(2, 3), randn(4, 2))


def test_dropout_in_eval_matches_torch():
    compare(nn.Dropout(0.4), torch.nn.Dropout(0.4), randn(3, 3), train=False)


# --- losses ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_matches_torch(reduction):
    compare(nn.MSELoss(reduction=reduction), torch.nn.MSELoss(reduction=reduction), randn(3, 2),
            randn(3, 2, seed=1))


@settings(max_examples=8)
@given(n=st.integers(1, 4), classes=st.integers(2, 4), extra=st.lists(st.integers(1, 2), max_size=1),
       reduction=st.sampled_from(["mean", "sum", "none"]), weighted=st.booleans(), ignore=st.booleans())
def test_cross_entropy_matches_torch(n, classes, extra, reduction, weighted, ignore):
    rng = np.random.default_rng(n * 10 + classes)
    target = rng.integers(0, classes, size=(n, *extra))
    if ignore:
        target.flat[0] = -100
        if target.size == 1:
            target.flat[0] = 0   # an all-ignored mean is 0/0 in both; not worth comparing NaNs
    weight = rng.uniform(0.5, 2.0, size=classes) if weighted else None
    ours = nn.CrossEntropyLoss(weight=None if weight is None else flow.tensor(weight), reduction=reduction)
    theirs = torch.nn.CrossEntropyLoss(weight=None if weight is None else torch.tensor(weight), reduction=reduction)
    compare(ours, theirs, randn(n, classes, *extra), target)


def test_cross_entropy_with_probability_targets_matches_torch():
    probs = np.random.default_rng(0).dirichlet(np.ones(3), size=4)
    compare(nn.CrossEntropyLoss(), torch.nn.CrossEntropyLoss(), randn(4, 3), probs)


def test_nll_loss_matches_torch():
    log_probs = np.log(np.random.default_rng(0).dirichlet(np.ones(3), size=5))
    compare(nn.NLLLoss(ignore_index=2), torch.nn.NLLLoss(ignore_index=2), log_probs, np.array([0, 1, 2, 1, 0]))


def test_functional_forms_match_torch():
    x, w, b = randn(3, 4), randn(2, 4, seed=1), randn(2, seed=2)
    _assert_close(F.linear(flow.tensor(x), flow.tensor(w), flow.tensor(b)),
                  torch.nn.functional.linear(torch.tensor(x), torch.tensor(w), torch.tensor(b)), "linear")
    _assert_close(F.sigmoid(flow.tensor(x)), torch.sigmoid(torch.tensor(x)), "sigmoid")
    _assert_close(F.tanh(flow.tensor(x)), torch.tanh(torch.tensor(x)), "tanh")
    mean, var = np.array([0.1, 0.2, 0.3, 0.4]), np.array([1.0, 2.0, 0.5, 1.5])
    _assert_close(F.batch_norm(flow.tensor(x), flow.tensor(mean), flow.tensor(var), eps=1e-3),
                  torch.nn.functional.batch_norm(torch.tensor(x), torch.tensor(mean), torch.tensor(var), eps=1e-3),
                  "batch_norm")


# --- default initialisations -------------------------------------------------------------------------------------


def _uniform_bound_matches(ours: flow.Tensor, theirs, bound: float) -> None:
    """Both within +-bound, both filling it (max near the bound), both with U(-b, b)'s std b/sqrt(3)."""
    a, b = ours.numpy(), theirs.detach().numpy()
    for values, who in ((a, "pyflow"), (b, "torch")):
        assert np.abs(values).max() <= bound * (1 + 1e-6), f"{who} exceeds the bound {bound}"
        assert np.abs(values).max() > 0.95 * bound, f"{who} does not fill +-{bound}"
        assert abs(values.std() - bound / math.sqrt(3)) < 0.1 * bound, f"{who}'s std is not U(-b, b)'s"


def test_linear_default_init_is_torchs():
    ours, theirs = nn.Linear(30, 40), torch.nn.Linear(30, 40)
    _uniform_bound_matches(ours.weight, theirs.weight, 1 / math.sqrt(30))
    bias_bound = 1 / math.sqrt(30)
    assert np.abs(ours.bias.numpy()).max() <= bias_bound and np.abs(theirs.bias.detach().numpy()).max() <= bias_bound


def test_conv2d_default_init_is_torchs():
    ours, theirs = nn.Conv2d(4, 20, 3), torch.nn.Conv2d(4, 20, 3)
    _uniform_bound_matches(ours.weight, theirs.weight, 1 / math.sqrt(4 * 9))


def test_lstm_default_init_is_torchs():
    ours, theirs = nn.LSTM(10, 25), torch.nn.LSTM(10, 25)
    _uniform_bound_matches(ours.weight_hh_l0, theirs.weight_hh_l0, 1 / math.sqrt(25))
    _uniform_bound_matches(ours.weight_ih_l0, theirs.weight_ih_l0, 1 / math.sqrt(25))


def test_embedding_and_batchnorm_default_init_are_torchs():
    flow.manual_seed(0)
    weight = nn.Embedding(100, 50).weight.numpy()
    assert abs(weight.mean()) < 0.05 and abs(weight.std() - 1) < 0.05   # N(0, 1), as torch's
    ours, theirs = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    for name, value in ours.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), theirs.state_dict()[name].numpy(), err_msg=name)


def test_xavier_and_kaiming_match_torchs_bounds():
    for fn, kwargs in ((nn.init.xavier_uniform_, {"gain": 1.5}), (nn.init.kaiming_uniform_, {"a": 0.2})):
        ours = fn(flow.empty(30, 20, 2), **kwargs)
        theirs = getattr(torch.nn.init, fn.__name__)(torch.empty(30, 20, 2), **kwargs)
        fan_in, fan_out = 40, 60
        bound = (1.5 * math.sqrt(6 / (fan_in + fan_out)) if fn is nn.init.xavier_uniform_
                 else math.sqrt(3) * torch.nn.init.calculate_gain("leaky_relu", 0.2) / math.sqrt(fan_in))
        _uniform_bound_matches(ours, theirs, bound)
    for name in ("linear", "sigmoid", "tanh", "relu", "selu"):
        assert nn.init.calculate_gain(name) == torch.nn.init.calculate_gain(name)
    assert nn.init.calculate_gain("leaky_relu", 0.3) == torch.nn.init.calculate_gain("leaky_relu", 0.3)
