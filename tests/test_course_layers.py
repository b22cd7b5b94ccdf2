"""The layers and losses a course needs (GELU, LeakyReLU, Softplus, LogSigmoid, LayerNorm, one_hot,
L1/SmoothL1/Huber, BCE, BCEWithLogits, KLDiv, cross_entropy's label_smoothing), against numpy
versions of PyTorch's documented formulas, with gradients checked by finite differences.

Each is a composition of pyflow's tensor ops, so these tests also check that the composition
is right where it could go wrong: the gradient at a kink (x = 0), overflow for large logits,
log(0) in BCE and KL, and the weighted mean of label smoothing with ignored targets.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import nn
from pyflow.errors import ArgumentValueError, DTypeError, ShapeError
from pyflow.nn import functional as F

_erf = np.vectorize(math.erf)
FEW = settings(max_examples=8)


def arrays(shape, low=-4.0, high=4.0):
    return st.lists(st.floats(low, high, allow_nan=False), min_size=math.prod(shape),
                    max_size=math.prod(shape)).map(lambda v: np.array(v, dtype=np.float64).reshape(shape))


small_shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)


def numeric_grad(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar function ``f`` (numpy -> float) at ``x``."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        grad[i] = (f(up) - f(down)) / (2 * h)
    return grad


def autograd(f, x: np.ndarray) -> np.ndarray:
    """``d sum(f(x)) / dx`` by pyflow's autograd, in float64."""
    t = flow.tensor(x, dtype=flow.float64, requires_grad=True)
    f(t).sum().backward()
    return t.grad.numpy()


# --- numpy references of PyTorch's formulas ----------------------------------------------------------------

def np_gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def np_softplus(x, beta=1.0, threshold=20.0):
    return np.where(beta * x > threshold, x, np.log1p(np.exp(beta * x)) / beta)


def np_reduce(losses, reduction):
    return {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction](losses)


reductions = st.sampled_from(["mean", "sum", "none"])


# --- activations ----------------------------------------------------------------------------------------------

@FEW
@given(x=small_shapes.flatmap(arrays), approximate=st.sampled_from(["none", "tanh"]))
def test_gelu_matches_the_erf_and_tanh_formulas(x, approximate):
    out = F.gelu(flow.tensor(x, dtype=flow.float64), approximate=approximate).numpy()
    np.testing.assert_allclose(out, np_gelu(x, approximate), atol=3e-7)


def test_gelu_gradient_is_phi_plus_x_times_density_including_zero():
    x = np.array([-3.0, -1.0, -0.2, 0.0, 0.3, 2.5])
    expected = 0.5 * (1 + _erf(x / math.sqrt(2))) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    np.testing.assert_allclose(autograd(F.gelu, x), expected, atol=2e-6)
    np.testing.assert_allclose(autograd(lambda t: F.gelu(t, "tanh"), x),
                               numeric_grad(lambda v: np_gelu(v, "tanh").sum(), x), atol=1e-6)


def test_gelu_in_float32_is_within_float32_rounding_of_the_erf_form():
    x = np.linspace(-6, 6, 49).astype(np.float32)
    out = F.gelu(flow.tensor(x)).numpy()
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np_gelu(x.astype(np.float64)), rtol=2e-6, atol=1e-6)


def test_leaky_relu_inplace_writes_into_the_input():
    x = flow.tensor([-2.0, 3.0])
    assert F.leaky_relu(x, 0.5, inplace=True) is x and x.tolist() == [-1.0, 3.0]


def test_gelu_module_and_bad_approximate():
    assert nn.GELU("tanh")(flow.tensor([1.0])).item() == pytest.approx(np_gelu(np.array([1.0]), "tanh")[0], 1e-6)
    with pytest.raises(ArgumentValueError, match="approximate"):
        nn.GELU("erf")
    with pytest.raises(ArgumentValueError, match="approximate"):
        F.gelu(flow.tensor([1.0]), approximate="fast")


@FEW
@given(x=small_shapes.flatmap(arrays), slope=st.sampled_from([0.01, 0.2, 1.5]))
def test_leaky_relu_matches_and_its_gradient_at_zero_is_the_slope(x, slope):
    x = np.concatenate([x.ravel(), [0.0]])
    np.testing.assert_allclose(nn.LeakyReLU(slope)(flow.tensor(x, dtype=flow.float64)).numpy(),
                               np.where(x > 0, x, slope * x))
    np.testing.assert_allclose(autograd(lambda t: F.leaky_relu(t, slope), x), np.where(x > 0, 1.0, slope))


@FEW
@given(x=small_shapes.flatmap(lambda s: arrays(s, -30, 30)), beta=st.sampled_from([1.0, 2.0, 0.5]))
def test_softplus_and_logsigmoid_match_and_do_not_overflow(x, beta):
    t = flow.tensor(x, dtype=flow.float64)
    np.testing.assert_allclose(nn.Softplus(beta)(t).numpy(), np_softplus(x, beta), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(nn.LogSigmoid()(t).numpy(), -np.log1p(np.exp(-x)), rtol=1e-12, atol=1e-300)
    big = F.logsigmoid(flow.tensor([-200.0, 200.0])).tolist()
    assert big == [pytest.approx(-200.0), pytest.approx(0.0, abs=1e-12)]


def test_softplus_keeps_relative_accuracy_for_tiny_results_in_float32():
    x = np.array([-30.0, -20.0, -10.0, 0.0, 10.0], dtype=np.float32)
    expected = np.log1p(np.exp(x.astype(np.float64)))
    np.testing.assert_allclose(F.softplus(flow.tensor(x)).numpy(), expected, rtol=3e-6)
    logits, target = flow.tensor([20.0, -20.0]), flow.tensor([1.0, 0.0])
    loss = F.binary_cross_entropy_with_logits(logits, target, reduction="none").numpy()
    np.testing.assert_allclose(loss, np.log1p(np.exp(-20.0)), rtol=3e-6)


def test_softplus_and_logsigmoid_gradients_are_sigmoids_including_zero():
    x = np.array([-25.0, -2.0, 0.0, 0.7, 25.0])
    sig = 1 / (1 + np.exp(-x))
    np.testing.assert_allclose(autograd(F.softplus, x), sig, atol=1e-12)
    np.testing.assert_allclose(autograd(F.logsigmoid, x), 1 - sig, atol=1e-12)


# --- layer_norm, one_hot --------------------------------------------------------------------------------------

@FEW
@given(shape=st.tuples(st.integers(1, 3), st.integers(2, 4), st.integers(2, 4)), last=st.sampled_from([1, 2]),
       data=st.data())
def test_layer_norm_matches_the_formula_over_the_last_dims(shape, last, data):
    x = data.draw(arrays(shape))
    normalized = shape[-last:]
    w, b = data.draw(arrays(normalized)), data.draw(arrays(normalized))
    axes = tuple(range(len(shape) - last, len(shape)))
    expected = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + 1e-5) * w + b
    out = F.layer_norm(flow.tensor(x, dtype=flow.float64), normalized, flow.tensor(w, dtype=flow.float64),
                       flow.tensor(b, dtype=flow.float64))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-9, atol=1e-9)


def test_layer_norm_gradient_matches_finite_differences():
    x = np.random.default_rng(0).normal(size=(2, 3))
    g = np.random.default_rng(1).normal(size=(2, 3))

    def ref(v):
        return (((v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + 1e-5)) * g).sum()

    gt = flow.tensor(g, dtype=flow.float64)
    np.testing.assert_allclose(autograd(lambda t: F.layer_norm(t, 3) * gt, x), numeric_grad(ref, x), atol=1e-6)


def test_layer_norm_module_parameters_and_checks():
    ln = nn.LayerNorm((2, 3))
    assert [tuple(p.shape) for p in ln.parameters()] == [(2, 3), (2, 3)]
    assert ln.weight.tolist() == [[1.0] * 3] * 2 and ln.bias.tolist() == [[0.0] * 3] * 2
    assert list(nn.LayerNorm(3, elementwise_affine=False).parameters()) == []
    with pytest.raises(ShapeError, match="normalized_shape"):
        ln(flow.zeros(2, 4))
    with pytest.raises(ArgumentValueError, match="normalized_shape"):
        nn.LayerNorm(0)


def test_one_hot_is_int64_and_infers_the_class_count():
    out = F.one_hot(flow.tensor([[0, 2], [1, 2]]))
    assert out.dtype == flow.int64 and tuple(out.shape) == (2, 2, 3)
    np.testing.assert_array_equal(out.numpy(), np.eye(3, dtype=np.int64)[[[0, 2], [1, 2]]])
    assert F.one_hot(flow.tensor([1]), num_classes=4).tolist() == [[0, 1, 0, 0]]
    with pytest.raises(ArgumentValueError, match="out of range"):
        F.one_hot(flow.tensor([3]), num_classes=3)
    with pytest.raises(ArgumentValueError, match="non-negative"):
        F.one_hot(flow.tensor([-1]))
    with pytest.raises(DTypeError, match="integers"):
        F.one_hot(flow.tensor([1.0]))


# --- losses ----------------------------------------------------------------------------------------------------

pairs = small_shapes.flatmap(lambda s: st.tuples(arrays(s), arrays(s)))


@FEW
@given(xy=pairs, reduction=reductions, beta=st.sampled_from([0.0, 0.5, 1.0, 2.0]))
def test_l1_smooth_l1_and_huber_match_their_formulas(xy, reduction, beta):
    x, y = xy
    d = x - y
    tx, ty = flow.tensor(x, dtype=flow.float64), flow.tensor(y, dtype=flow.float64)
    np.testing.assert_allclose(nn.L1Loss(reduction)(tx, ty).numpy(), np_reduce(np.abs(d), reduction))
    smooth = np.abs(d) if beta == 0 else np.where(np.abs(d) < beta, 0.5 * d * d / max(beta, 1e-300),
                                                  np.abs(d) - 0.5 * beta)
    np.testing.assert_allclose(nn.SmoothL1Loss(reduction, beta)(tx, ty).numpy(), np_reduce(smooth, reduction),
                               rtol=1e-12)
    delta = beta or 1.0
    huber = np.where(np.abs(d) < delta, 0.5 * d * d, delta * (np.abs(d) - 0.5 * delta))
    np.testing.assert_allclose(nn.HuberLoss(reduction, delta)(tx, ty).numpy(), np_reduce(huber, reduction),
                               rtol=1e-12)


def np_bce(p, y, w=None):
    losses = -(y * np.maximum(np.log(p), -100) + (1 - y) * np.maximum(np.log(1 - p), -100))
    return losses if w is None else losses * w


@FEW
@given(shape=small_shapes, reduction=reductions, weighted=st.booleans(), data=st.data())
def test_bce_matches_the_clamped_formula_including_probabilities_0_and_1(shape, reduction, weighted, data):
    p = data.draw(arrays(shape, 0.0, 1.0))
    p.ravel()[0] = 0.0
    p.ravel()[-1] = 1.0
    y = data.draw(arrays(shape, 0.0, 1.0))
    w = data.draw(arrays(shape, 0.0, 2.0)) if weighted else None
    with np.errstate(divide="ignore"):
        expected = np_reduce(np_bce(p, y, w), reduction)
    f64 = dict(dtype=flow.float64)
    out = nn.BCELoss(None if w is None else flow.tensor(w, **f64), reduction)(flow.tensor(p, **f64),
                                                                             flow.tensor(y, **f64))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-10)


def test_bce_rejects_values_outside_0_1_and_shape_mismatch():
    with pytest.raises(ArgumentValueError, match=r"\[0, 1\]"):
        F.binary_cross_entropy(flow.tensor([1.5]), flow.tensor([1.0]))
    with pytest.raises(ShapeError, match="same shape"):
        F.binary_cross_entropy(flow.tensor([0.5, 0.5]), flow.tensor([[1.0, 0.0]]))


@FEW
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 4)), reduction=reductions, data=st.data())
def test_bce_with_logits_matches_log_sigmoid_form_with_pos_weight(shape, reduction, data):
    x = data.draw(arrays(shape, -50.0, 50.0))
    y = data.draw(arrays(shape, 0.0, 1.0))
    pw = data.draw(arrays(shape[-1:], 0.1, 3.0))
    w = data.draw(arrays(shape, 0.0, 2.0))
    log_sig, log_one_minus = -np.logaddexp(0, -x), -np.logaddexp(0, x)
    expected = -w * (pw * y * log_sig + (1 - y) * log_one_minus)
    f64 = dict(dtype=flow.float64)
    loss = nn.BCEWithLogitsLoss(flow.tensor(w, **f64), reduction, pos_weight=flow.tensor(pw, **f64))
    out = loss(flow.tensor(x, **f64), flow.tensor(y, **f64))
    np.testing.assert_allclose(out.numpy(), np_reduce(expected, reduction), rtol=1e-9, atol=1e-12)


def test_bce_with_logits_gradient_is_sigmoid_minus_target_even_at_zero():
    x, y = np.array([-30.0, -1.0, 0.0, 0.0, 2.0, 30.0]), np.array([1.0, 0.0, 1.0, 0.3, 0.5, 0.0])
    ty = flow.tensor(y, dtype=flow.float64)
    got = autograd(lambda t: F.binary_cross_entropy_with_logits(t, ty, reduction="none"), x)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-x)) - y, atol=1e-12)


@FEW
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 4)), log_target=st.booleans(),
       reduction=st.sampled_from(["mean", "batchmean", "sum", "none"]), data=st.data())
def test_kl_div_matches_the_formula_with_zero_targets(shape, log_target, reduction, data):
    x = data.draw(arrays(shape, -5.0, 0.0))
    t = data.draw(arrays(shape, 0.0, 1.0))
    t.ravel()[0] = 0.0
    if log_target:
        t = np.log(t + 0.1)
        losses = np.exp(t) * (t - x)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            losses = np.where(t > 0, t * np.log(t), 0.0) - t * x
    expected = losses.sum() / shape[0] if reduction == "batchmean" else np_reduce(losses, reduction)
    f64 = dict(dtype=flow.float64)
    out = nn.KLDivLoss(reduction, log_target)(flow.tensor(x, **f64), flow.tensor(t, **f64))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-10, atol=1e-12)
    with pytest.raises(ArgumentValueError, match="batchmean"):
        F.kl_div(flow.tensor(x), flow.tensor(t), reduction="avg")


def np_log_softmax(x):
    m = x.max(1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(1, keepdims=True))


def np_label_smoothed_ce(x, target, eps, weight, ignore_index, reduction):
    """PyTorch's (1 - eps) * nll + eps / C * smooth, with its weighted mean."""
    n, c = x.shape
    logp = np_log_softmax(x)
    w = np.ones(c) if weight is None else weight
    valid = target != ignore_index
    safe = np.where(valid, target, 0)
    wt = np.where(valid, w[safe], 0.0)
    nll = -logp[np.arange(n), safe] * wt
    smooth = np.where(valid, -(logp * w).sum(1), 0.0)
    if reduction == "mean":
        return (1 - eps) * nll.sum() / wt.sum() + eps / c * smooth.sum() / wt.sum()
    return (1 - eps) * np_reduce(nll, reduction) + eps / c * np_reduce(smooth, reduction)


@FEW
@given(n=st.integers(2, 5), c=st.integers(2, 4), eps=st.sampled_from([0.0, 0.1, 0.5, 1.0]), reduction=reductions,
       weighted=st.booleans(), data=st.data())
def test_cross_entropy_label_smoothing_with_weight_and_ignore_index(n, c, eps, reduction, weighted, data):
    x = data.draw(arrays((n, c)))
    target = np.array(data.draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)))
    target[0] = -100 if n > 2 else target[0]
    w = data.draw(arrays((c,), 0.5, 2.0)) if weighted else None
    f64 = dict(dtype=flow.float64)
    loss = nn.CrossEntropyLoss(None if w is None else flow.tensor(w, **f64), reduction=reduction,
                               label_smoothing=eps)
    out = loss(flow.tensor(x, **f64), flow.tensor(target))
    np.testing.assert_allclose(out.numpy(), np_label_smoothed_ce(x, target, eps, w, -100, reduction), rtol=1e-10)


def test_cross_entropy_label_smoothing_with_probability_targets_and_its_gradient():
    x = np.random.default_rng(2).normal(size=(3, 4))
    p = np.random.default_rng(3).dirichlet(np.ones(4), size=3)
    smoothed = p * 0.8 + 0.2 / 4

    def ref(v):
        return -(smoothed * np_log_softmax(v)).sum(1).mean()

    tp = flow.tensor(p, dtype=flow.float64)
    out = F.cross_entropy(flow.tensor(x, dtype=flow.float64), tp, label_smoothing=0.2)
    assert out.item() == pytest.approx(ref(x), rel=1e-12)
    np.testing.assert_allclose(autograd(lambda t: F.cross_entropy(t, tp, label_smoothing=0.2), x),
                               numeric_grad(ref, x), atol=1e-7)
    with pytest.raises(ArgumentValueError, match="label_smoothing"):
        nn.CrossEntropyLoss(label_smoothing=1.5)


# --- one small cuda case per family (the simulator is slow) ----------------------------------------------------

def test_on_cuda_activations_norm_and_losses_match_cpu_and_backprop():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 3)).astype(np.float32)
    y = rng.uniform(size=(2, 3)).astype(np.float32)
    results = {}
    for device in ("cpu", "cuda"):
        t = flow.tensor(x, device=device, requires_grad=True)
        ty = flow.tensor(y, device=device)
        ln = nn.LayerNorm(3).to(device)
        h = ln(F.leaky_relu(F.gelu(t), 0.1))
        loss = (F.binary_cross_entropy_with_logits(h, ty) + F.smooth_l1_loss(h, ty)
                + F.kl_div(F.logsigmoid(h), ty, reduction="batchmean")
                + F.cross_entropy(h, flow.tensor([0, 2], device=device), label_smoothing=0.1))
        loss.backward()
        assert t.grad.device == flow.device(device)
        results[device] = (loss.item(), t.grad.numpy(), F.one_hot(flow.tensor([1, 0], device=device), 3).numpy())
    assert results["cuda"][0] == pytest.approx(results["cpu"][0], rel=1e-5)
    np.testing.assert_allclose(results["cuda"][1], results["cpu"][1], rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(results["cuda"][2], results["cpu"][2])


@pytest.mark.parametrize("ndim, dim", [(1, 0), (2, 1), (3, 0), (4, 1)])
def test_softmax_with_dim_none_takes_pytorchs_legacy_dim_and_warns(ndim, dim):
    x = np.random.default_rng(ndim).standard_normal((2, 3, 2, 2)[:ndim]).astype(np.float32)
    layers = ((flow.nn.Softmax(dim=None), flow.softmax), (flow.nn.LogSoftmax(dim=None), flow.log_softmax))
    for layer, reference in layers:
        with pytest.warns(UserWarning, match="Implicit dimension"):
            got = layer(flow.tensor(x))
        np.testing.assert_allclose(got.numpy(), reference(flow.tensor(x), dim).numpy(), rtol=1e-6)
