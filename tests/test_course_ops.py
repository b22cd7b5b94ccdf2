"""The everyday tensor functions a course needs around the model (``pyflow/framework/composites.py``,
``composites_sort.py``): flip, roll, logsumexp, amax/amin, mm/bmm/outer, equal, masked_fill,
as_tensor, normal, sort/argsort, nonzero, unique, t, new_*, in-place unary ops, .data, uniform_,
normal_, fill_diagonal_, and sum(dtype=, axis=).

Expected values are numpy versions of PyTorch's documented semantics; gradients of the
differentiable compositions are compared with central differences of those numpy versions
(float64).  Each family has one small CUDA case (the simulator is slower).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.errors import (ArgumentTypeError, ArgumentValueError, AutogradError, AxisError, DTypeError,
                           ShapeError)

FEW = settings(max_examples=15, deadline=None)
shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)


@st.composite
def arrays(draw, shape=None, dtype=np.float32, low=-5, high=5):
    shape = draw(shapes) if shape is None else shape
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.uniform(low, high, shape).astype(dtype)
    return rng.integers(low, high, shape).astype(dtype)


@st.composite
def array_and_dims(draw, dtype=np.float32):
    a = draw(arrays(dtype=dtype))
    dims = draw(st.lists(st.integers(-a.ndim, a.ndim - 1), min_size=1, max_size=a.ndim,
                         unique_by=lambda d: d % a.ndim))
    return a, tuple(dims)


def numeric_grad(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar function ``f`` (numpy -> float) at ``x``."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        grad[i] = (f(up) - f(down)) / (2 * h)
    return grad


def check_grad(flow_f, numpy_f, *inputs: np.ndarray, seed=0):
    """d sum(w * f(inputs)) / d input, by pyflow's autograd and by central differences of ``numpy_f``."""
    out_shape = np.shape(numpy_f(*inputs))
    w = np.random.default_rng(seed).uniform(-1, 1, out_shape)
    leaves = [flow.tensor(a, requires_grad=True) for a in inputs]
    (flow_f(*leaves) * flow.tensor(w)).sum().backward()
    for k, (a, leaf) in enumerate(zip(inputs, leaves)):
        def loss(v, k=k):
            args = list(inputs)
            args[k] = v
            return float(np.sum(w * numpy_f(*args)))
        np.testing.assert_allclose(leaf.grad.numpy(), numeric_grad(loss, a), rtol=1e-5, atol=1e-6)


def f64(shape, seed=0):
    return np.random.default_rng(seed).uniform(-2, 2, shape)


# --- flip and roll -------------------------------------------------------------------------------


@FEW
@given(array_and_dims(), st.sampled_from([np.float32, np.int64]))
def test_flip_matches_numpy(case, dtype):
    a, dims = case
    a = a.astype(dtype)
    np.testing.assert_array_equal(flow.flip(flow.tensor(a), dims).numpy(), np.flip(a, dims))
    np.testing.assert_array_equal(flow.tensor(a).flip(list(dims)).numpy(), np.flip(a, dims))


def test_flip_is_a_copy_and_checks_its_dims():
    x = flow.tensor([1.0, 2.0])
    y = flow.flip(x, ())
    y.add_(1)
    assert x.tolist() == [1.0, 2.0]
    with pytest.raises(AxisError):
        flow.flip(x, 1)
    with pytest.raises(AxisError):
        flow.flip(flow.zeros(2, 2), (0, -2))


@FEW
@given(array_and_dims(), st.data())
def test_roll_matches_numpy(case, data):
    a, dims = case
    shifts = tuple(data.draw(st.integers(-6, 6)) for _ in dims)
    np.testing.assert_array_equal(flow.roll(flow.tensor(a), shifts, dims).numpy(), np.roll(a, shifts, dims))
    one = data.draw(st.integers(-10, 10))
    np.testing.assert_array_equal(flow.tensor(a).roll(one).numpy(), np.roll(a, one))


def test_roll_needs_one_shift_per_dim():
    with pytest.raises(ShapeError):
        flow.roll(flow.zeros(2, 3), (1, 2), 0)
    with pytest.raises(ShapeError):
        flow.roll(flow.zeros(2, 3), (1, 2))
    with pytest.raises(AxisError):
        flow.roll(flow.zeros(2, 3), 1, 2)


def test_flip_and_roll_gradients_match_numerical_gradients():
    check_grad(lambda x: flow.flip(x, (0, 2)), lambda x: np.flip(x, (0, 2)), f64((2, 3, 2)))
    check_grad(lambda x: flow.roll(x, (1, -2), (1, 0)), lambda x: np.roll(x, (1, -2), (1, 0)), f64((3, 4)))
    check_grad(lambda x: flow.roll(x, 5), lambda x: np.roll(x, 5), f64((2, 3)))


def test_flip_and_roll_on_cuda():
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    x = flow.tensor(a, device="cuda")
    assert flow.flip(x, 1).is_cuda
    np.testing.assert_array_equal(flow.flip(x, (0, 1)).numpy(), np.flip(a, (0, 1)))
    np.testing.assert_array_equal(flow.roll(x, 1, 1).numpy(), np.roll(a, 1, 1))


# --- logsumexp, amax, amin ------------------------------------------------------------------------


def np_logsumexp(a, dims, keepdim=False):
    m = np.max(a, axis=dims, keepdims=True)
    m = np.where(np.isinf(m), 0, m)
    out = np.log(np.sum(np.exp(a - m), axis=dims, keepdims=True)) + m
    return out if keepdim else np.squeeze(out, axis=dims)


@FEW
@given(array_and_dims(), st.booleans())
def test_logsumexp_matches_numpy(case, keepdim):
    a, dims = case
    got = flow.logsumexp(flow.tensor(a), dims, keepdim).numpy()
    np.testing.assert_allclose(got, np_logsumexp(a.astype(np.float64), dims, keepdim), rtol=1e-5, atol=1e-5)


def test_logsumexp_is_stable_and_gives_minus_inf_for_minus_inf_rows():
    x = flow.tensor([[1000.0, 1000.0], [-math.inf, -math.inf], [-math.inf, 0.0]])
    got = x.logsumexp(1).tolist()
    assert got[0] == pytest.approx(1000.0 + math.log(2))
    assert got[1] == -math.inf and got[2] == 0.0
    assert flow.logsumexp(flow.tensor([1, 2]), 0).dtype == flow.float32   # integers compute in float32
    with pytest.raises(AxisError):
        flow.logsumexp(x, 2)


def test_logsumexp_gradient_is_softmax():
    check_grad(lambda x: flow.logsumexp(x, 1), lambda x: np_logsumexp(x, 1), f64((3, 4)))
    check_grad(lambda x: flow.logsumexp(x, (0, 2), keepdim=True), lambda x: np_logsumexp(x, (0, 2), True),
               f64((2, 3, 2)))


@FEW
@given(array_and_dims(), st.booleans())
def test_amax_and_amin_over_several_dims_match_numpy(case, keepdim):
    a, dims = case
    x = flow.tensor(a)
    np.testing.assert_array_equal(flow.amax(x, dims, keepdim).numpy(), np.amax(a, dims, keepdims=keepdim))
    np.testing.assert_array_equal(x.amin(dims, keepdim).numpy(), np.amin(a, dims, keepdims=keepdim))
    assert flow.amax(x).item() == a.max() and flow.amin(x, axis=dims).shape == np.amin(a, dims).shape


@FEW
@given(array_and_dims(np.int64))
def test_amax_of_integers_matches_numpy(case):
    a, dims = case
    np.testing.assert_array_equal(flow.amax(flow.tensor(a), dims).numpy(), np.amax(a, dims))


def test_amax_gradient_and_errors():
    check_grad(lambda x: flow.amax(x, (0, 1)), lambda x: np.amax(x, (0, 1)), f64((2, 3, 2)))
    check_grad(lambda x: flow.amin(x, 1, keepdim=True), lambda x: np.amin(x, 1, keepdims=True), f64((3, 4)))
    x = flow.tensor([1.0, 3.0, 3.0], requires_grad=True)
    flow.amax(x).backward()
    assert x.grad.tolist() == [0.0, 0.5, 0.5]   # ties share the gradient, as torch.amax
    with pytest.raises(AxisError):
        flow.amax(flow.zeros(2, 2), (0, 0))
    with pytest.raises(ShapeError):
        flow.amax(flow.zeros(0, 2), 0)
    with pytest.raises(ArgumentTypeError):
        flow.amax(flow.zeros(2), 0, axis=0)


def test_logsumexp_and_amax_on_cuda():
    a = np.array([[1.0, 2.0, 3.0], [-1.0, 5.0, 0.0]], np.float32)
    x = flow.tensor(a, device="cuda")
    np.testing.assert_allclose(flow.logsumexp(x, 1).numpy(), np_logsumexp(a, 1), rtol=1e-5)
    np.testing.assert_array_equal(flow.amax(x, (0, 1)).numpy(), a.max())


# --- mm, bmm, outer -------------------------------------------------------------------------------


@FEW
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2**31))
def test_mm_bmm_outer_match_numpy(n, m, p, b, seed):
    rng = np.random.default_rng(seed)
    a, c = rng.standard_normal((n, m)).astype(np.float32), rng.standard_normal((m, p)).astype(np.float32)
    np.testing.assert_allclose(flow.mm(flow.tensor(a), flow.tensor(c)).numpy(), a @ c, rtol=1e-5, atol=1e-5)
    ba, bc = rng.standard_normal((b, n, m)), rng.standard_normal((b, m, p))
    np.testing.assert_allclose(flow.tensor(ba).bmm(flow.tensor(bc)).numpy(), ba @ bc, rtol=1e-10)
    u, v = rng.integers(-5, 5, n), rng.integers(-5, 5, p)
    np.testing.assert_array_equal(flow.outer(flow.tensor(u), flow.tensor(v)).numpy(), np.outer(u, v))


def test_mm_bmm_outer_check_shapes():
    with pytest.raises(ShapeError):
        flow.mm(flow.zeros(2, 3), flow.zeros(2, 3))
    with pytest.raises(ShapeError):
        flow.mm(flow.zeros(2, 3, 1), flow.zeros(1, 3))
    with pytest.raises(ShapeError):
        flow.bmm(flow.zeros(2, 3, 4), flow.zeros(3, 4, 5))
    with pytest.raises(ShapeError):
        flow.bmm(flow.zeros(3, 4), flow.zeros(4, 5))
    with pytest.raises(ShapeError):
        flow.outer(flow.zeros(2, 1), flow.zeros(3))


def test_mm_bmm_outer_gradients():
    check_grad(flow.mm, np.matmul, f64((2, 3)), f64((3, 4), 1))
    check_grad(flow.bmm, np.matmul, f64((2, 2, 3)), f64((2, 3, 2), 1))
    check_grad(flow.outer, np.outer, f64((3,)), f64((4,), 1))


def test_mm_and_outer_on_cuda():
    a, b = np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)
    assert flow.mm(flow.tensor(a, device="cuda"), flow.tensor(b.reshape(3, 1), device="cuda")).tolist() == [[3.0],
                                                                                                               [3.0]]
    np.testing.assert_array_equal(flow.outer(flow.tensor(b, device="cuda"), flow.tensor(b, device="cuda")).numpy(),
                                  np.outer(b, b))


# --- equal, masked_fill, as_tensor, is_floating_point ----------------------------------------------


def test_equal_is_same_shape_and_all_equal():
    x = flow.tensor([1.0, 2.0])
    assert flow.equal(x, flow.tensor([1.0, 2.0])) is True
    assert x.equal(flow.tensor([1.0, 3.0])) is False
    assert flow.equal(x, flow.tensor([[1.0, 2.0]])) is False
    assert flow.equal(flow.tensor([math.nan]), flow.tensor([math.nan])) is False
    assert flow.equal(flow.zeros(0), flow.zeros(0)) is True
    assert flow.equal(x.cuda(), flow.tensor([1.0, 2.0], device="cuda")) is True


@FEW
@given(arrays(), st.sampled_from([np.float32, np.int64]), st.integers(0, 2**31))
def test_masked_fill_matches_numpy(a, dtype, seed):
    a = a.astype(dtype)
    mask = np.random.default_rng(seed).random(a.shape[-1:]) < 0.5   # broadcasts over the leading dims
    expected = np.where(mask, dtype(7), a)
    got = flow.masked_fill(flow.tensor(a), flow.tensor(mask), 7)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.numpy(), expected)
    x = flow.tensor(a)
    before = x._version
    assert x.masked_fill_(flow.tensor(mask), flow.tensor(7)) is x and x._version == before + 1
    np.testing.assert_array_equal(x.numpy(), expected)


def test_masked_fill_checks_and_gradient():
    with pytest.raises(DTypeError):
        flow.masked_fill(flow.zeros(2), flow.tensor([1, 0]), 1.0)
    with pytest.raises(ShapeError):
        flow.zeros(2).masked_fill_(flow.tensor([[True, False]] * 2), 1.0)
    with pytest.raises(ShapeError):
        flow.zeros(2).masked_fill(flow.tensor([True, False]), flow.zeros(2))
    mask = np.array([[True, False, True], [False, False, True]])
    check_grad(lambda x: flow.masked_fill(x, flow.tensor(mask), 0.5), lambda x: np.where(mask, 0.5, x), f64((2, 3)))
    leaf = flow.zeros(2, requires_grad=True)
    with pytest.raises(AutogradError):
        leaf.masked_fill_(flow.tensor([True, False]), 1.0)
    on_cuda = flow.masked_fill(flow.ones(3, device="cuda"), flow.tensor([True, False, True], device="cuda"), -1.0)
    assert on_cuda.is_cuda and on_cuda.tolist() == [-1.0, 1.0, -1.0]


def test_as_tensor_does_not_copy_a_tensor_that_already_fits():
    x = flow.tensor([1.0, 2.0])
    assert flow.as_tensor(x) is x and flow.as_tensor(x, dtype=flow.float32, device="cpu") is x
    y = flow.as_tensor(x, dtype=flow.float64)
    assert y.dtype == flow.float64 and y.tolist() == [1.0, 2.0]
    assert flow.as_tensor([1, 2]).dtype == flow.int64
    assert flow.as_tensor(np.zeros(2, np.float16)).dtype == flow.float16
    assert flow.as_tensor(x, device="cuda").is_cuda


def test_is_floating_point():
    assert flow.is_floating_point(flow.zeros(1)) and flow.zeros(1, dtype=flow.float16).is_floating_point()
    assert not flow.is_floating_point(flow.tensor([1])) and not flow.tensor([True]).is_floating_point()


# --- normal, uniform_, normal_ ---------------------------------------------------------------------


def test_normal_is_mean_plus_std_times_randn_of_the_seeded_generator():
    flow.manual_seed(3)
    expected = flow.randn(2, 3).numpy() * 2.0 + 1.0
    flow.manual_seed(3)
    np.testing.assert_allclose(flow.normal(1.0, 2.0, size=(2, 3)).numpy(), expected, rtol=1e-6)
    mean, std = flow.tensor([0.0, 10.0, 20.0]), flow.tensor([[1.0, 0.0, 2.0]] * 2)
    flow.manual_seed(4)
    noise = flow.randn(2, 3).numpy()
    flow.manual_seed(4)
    np.testing.assert_allclose(flow.normal(mean, std).numpy(), noise * std.numpy() + mean.numpy(), rtol=1e-6)
    assert flow.normal(mean).shape == (3,) and flow.normal(0.0, std).shape == (2, 3)
    assert flow.normal(mean.cuda(), 1.0).is_cuda


def test_normal_checks_its_arguments():
    with pytest.raises(ArgumentTypeError):
        flow.normal(0.0, 1.0)
    with pytest.raises(ArgumentValueError):
        flow.normal(0.0, -1.0, size=(2,))
    with pytest.raises(ArgumentTypeError):
        flow.normal(flow.zeros(2), 1.0, size=(2,))
    with pytest.raises(DTypeError):
        flow.normal(flow.tensor([1, 2]))


def test_uniform_and_normal_fill_in_place():
    x = flow.zeros(1000)
    assert x.uniform_(-2, 3) is x and x._version == 1
    values = x.numpy()
    assert values.min() >= -2 and values.max() < 3 and abs(values.mean() - 0.5) < 0.3
    x.normal_(5.0, 0.5)
    assert abs(x.numpy().mean() - 5.0) < 0.1 and abs(x.numpy().std() - 0.5) < 0.1
    with pytest.raises(DTypeError):
        flow.zeros(2, dtype=flow.int64).uniform_()
    with pytest.raises(ArgumentValueError):
        flow.zeros(2).uniform_(1, 0)
    with pytest.raises(ArgumentValueError):
        flow.zeros(2).normal_(0, -1)
    with pytest.raises(AutogradError):
        flow.zeros(2, requires_grad=True).uniform_()
    w = flow.zeros(2, requires_grad=True)
    with flow.no_grad():
        w.normal_()
    assert w.requires_grad and w.is_leaf
    assert flow.zeros(4, device="cuda").uniform_().is_cuda


# --- sort, argsort, nonzero, unique ------------------------------------------------------------------


def np_stable_sort(a, axis, descending):
    if descending:
        n = a.shape[axis]
        order = n - 1 - np.flip(np.argsort(np.flip(a, axis), axis=axis, kind="stable"), axis)
    else:
        order = np.argsort(a, axis=axis, kind="stable")
    return np.take_along_axis(a, order, axis), order


@FEW
@given(arrays(dtype=np.int64, low=-3, high=3), st.sampled_from([np.float32, np.int64]), st.booleans(),
       st.data())
def test_sort_matches_a_stable_numpy_sort_with_ties(a, dtype, descending, data):
    a = a.astype(dtype)   # few distinct values: many ties
    dim = data.draw(st.integers(-a.ndim, a.ndim - 1))
    values, indices = flow.sort(flow.tensor(a), dim, descending=descending)
    expected_values, expected_order = np_stable_sort(a, dim % a.ndim, descending)
    np.testing.assert_array_equal(values.numpy(), expected_values)
    np.testing.assert_array_equal(indices.numpy(), expected_order)
    assert indices.dtype == flow.int64 and values.dtype == dtype
    np.testing.assert_array_equal(flow.tensor(a).argsort(dim, descending).numpy(), expected_order)


def test_sort_puts_nan_last_ascending_and_first_descending():
    x = flow.tensor([2.0, math.nan, 1.0, 2.0])
    assert x.sort().indices.tolist() == [2, 0, 3, 1]
    assert x.sort(descending=True).indices.tolist() == [1, 0, 3, 2]
    assert flow.sort(flow.tensor(5.0)).values.item() == 5.0 and flow.sort(flow.tensor(5.0)).indices.item() == 0


def test_sort_values_gradient():
    check_grad(lambda x: flow.sort(x, 1).values, lambda x: np.sort(x, 1), f64((3, 4)))
    check_grad(lambda x: flow.sort(x, 0, descending=True).values, lambda x: -np.sort(-x, 0), f64((3, 2)))


def test_sort_on_cuda_short_dims_and_long_dims_through_the_host():
    rng = np.random.default_rng(0)
    short = rng.integers(0, 3, (2, 5)).astype(np.float32)
    values, indices = flow.sort(flow.tensor(short, device="cuda"), 1, descending=True)
    assert values.is_cuda and indices.is_cuda
    np.testing.assert_array_equal(indices.numpy(), np_stable_sort(short, 1, True)[1])
    long = rng.integers(0, 5, 70).astype(np.float32)   # longer than topk's CUDA limit of 64
    x = flow.tensor(long, device="cuda", requires_grad=True)
    values, indices = flow.sort(x)
    np.testing.assert_array_equal(indices.numpy(), np_stable_sort(long, 0, False)[1])
    np.testing.assert_array_equal(values.numpy(), np.sort(long))
    values.sum().backward()
    assert x.grad.numpy().tolist() == [1.0] * 70


def test_sort_checks_arguments():
    with pytest.raises(AxisError):
        flow.sort(flow.zeros(2), 1)
    with pytest.raises(ArgumentTypeError):
        flow.sort(flow.zeros(2), descending="yes")
    with pytest.raises(ArgumentTypeError):
        flow.argsort([1, 2])


@FEW
@given(arrays(dtype=np.int64, low=-1, high=2), st.sampled_from([np.float32, np.int64, np.bool_]))
def test_nonzero_matches_numpy(a, dtype):
    a = a.astype(dtype)
    x = flow.tensor(a)
    got = flow.nonzero(x)
    assert got.dtype == flow.int64
    np.testing.assert_array_equal(got.numpy(), np.argwhere(a))
    for got_dim, expected in zip(x.nonzero(as_tuple=True), np.nonzero(a)):
        np.testing.assert_array_equal(got_dim.numpy(), expected)


def test_nonzero_of_0d_and_on_cuda():
    assert flow.nonzero(flow.tensor(3.0)).shape == (1, 0)
    assert flow.nonzero(flow.tensor(0.0)).shape == (0, 0)
    assert [t.tolist() for t in flow.nonzero(flow.tensor(3.0), as_tuple=True)] == [[0]]
    got = flow.nonzero(flow.tensor([[0, 1], [2, 0]], device="cuda"))
    assert got.is_cuda and got.tolist() == [[0, 1], [1, 0]]


@FEW
@given(arrays(dtype=np.int64, low=-3, high=3), st.sampled_from([np.float32, np.int64]))
def test_unique_matches_numpy(a, dtype):
    a = a.astype(dtype)
    values, inverse, counts = np.unique(a, return_inverse=True, return_counts=True)
    got_values, got_inverse, got_counts = flow.unique(flow.tensor(a), return_inverse=True, return_counts=True)
    np.testing.assert_array_equal(got_values.numpy(), values)
    np.testing.assert_array_equal(got_inverse.numpy(), inverse.reshape(a.shape))
    np.testing.assert_array_equal(got_counts.numpy(), counts)
    assert got_values.dtype == dtype and got_inverse.dtype == flow.int64 and got_counts.dtype == flow.int64
    np.testing.assert_array_equal(flow.tensor(a).unique().numpy(), values)


def test_unique_on_cuda_and_its_errors():
    values, counts = flow.unique(flow.tensor([3, 1, 3], device="cuda"), return_counts=True)
    assert values.is_cuda and values.tolist() == [1, 3] and counts.tolist() == [1, 2]


# --- t, new_*, .data --------------------------------------------------------------------------------


def test_t_transposes_2d_and_returns_lower_ranks_as_they_are():
    a = np.arange(6).reshape(2, 3)
    assert flow.tensor(a).t().tolist() == a.T.tolist() and flow.t(flow.tensor(a)).shape == (3, 2)
    assert flow.tensor([1, 2]).t().tolist() == [1, 2] and flow.tensor(5).t().item() == 5
    with pytest.raises(ShapeError):
        flow.zeros(1, 2, 3).t()
    check_grad(lambda x: x.t(), lambda x: x.T, f64((2, 3)))


def test_new_functions_take_self_dtype_and_device_by_default():
    x = flow.zeros(1, dtype=flow.float64, device="cuda")
    for made in (x.new_zeros(2, 3), x.new_ones((2, 3)), x.new_full((2, 3), 7), x.new_empty(2, 3)):
        assert made.shape == (2, 3) and made.dtype == flow.float64 and made.is_cuda
    assert x.new_full((2,), 7).tolist() == [7.0, 7.0] and x.new_ones(2).tolist() == [1.0, 1.0]
    y = flow.tensor([1, 2]).new_tensor([3.0, 4.5])
    assert y.dtype == flow.int64 and y.tolist() == [3, 4] and not y.is_cuda
    z = flow.zeros(1).new_zeros(2, dtype=flow.int32, requires_grad=False)
    assert z.dtype == flow.int32
    assert flow.zeros(1).new_ones(2, requires_grad=True).requires_grad


def test_data_shares_storage_without_history_and_can_be_set():
    x = flow.ones(2, requires_grad=True)
    d = x.data
    assert not d.requires_grad
    d.mul_(3)   # allowed: outside autograd
    assert x.tolist() == [3.0, 3.0]
    x.data = flow.tensor([5.0, 6.0])
    assert x.tolist() == [5.0, 6.0] and x.requires_grad and x.is_leaf


# --- in-place unary ops ------------------------------------------------------------------------------


UNARY_NUMPY = {"relu": lambda a: np.maximum(a, 0), "sigmoid": lambda a: 1 / (1 + np.exp(-a)), "tanh": np.tanh,
               "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "abs": np.abs, "neg": np.negative, "sin": np.sin,
               "cos": np.cos, "floor": np.floor, "ceil": np.ceil, "round": np.round, "sign": np.sign}


@pytest.mark.parametrize("name", sorted(UNARY_NUMPY))
def test_inplace_unary_ops_match_numpy_bump_the_version_and_return_self(name):
    a = np.random.default_rng(0).uniform(0.1, 3, (2, 3)).astype(np.float32) * np.array([1, -1, 1], np.float32)
    if name in ("log", "sqrt"):
        a = np.abs(a)
    x = flow.tensor(a)
    view = x[:, 1:]   # a non-contiguous view: the write goes through to x
    assert getattr(view, f"{name}_")() is view and x._version == 1
    expected = a.copy()
    expected[:, 1:] = UNARY_NUMPY[name](a[:, 1:])
    np.testing.assert_allclose(x.numpy(), expected, rtol=1e-6, atol=1e-7)


def test_inplace_unary_ops_refuse_a_leaf_that_requires_grad_and_a_dtype_they_cannot_keep():
    with pytest.raises(AutogradError):
        flow.ones(2, requires_grad=True).exp_()
    with pytest.raises(DTypeError):
        flow.tensor([1, 2]).sqrt_()
    y = flow.tensor([1.0, -2.0], requires_grad=True) * 1
    y.abs_().sum().backward()   # in place on a non-leaf is recorded
    x = flow.tensor([True, False])
    assert x.logical_not_().tolist() == [False, True] and flow.tensor([1, 2]).bitwise_not_().tolist() == [-2, -3]
    on_cuda = flow.tensor([-1.0, 2.0], device="cuda")
    assert on_cuda.relu_().tolist() == [0.0, 2.0]


def test_inplace_unary_ops_write_a_non_contiguous_cuda_view():
    a = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    x = flow.tensor(a, device="cuda")
    x.t().exp_()   # the elementwise kernel reads element i, then writes it: safe in place
    np.testing.assert_allclose(x.numpy(), np.exp(a), rtol=1e-6)


def test_inplace_unary_gradient_through_a_non_leaf():
    x = flow.tensor(f64((2, 3)), requires_grad=True)
    y = x * 2
    y.tanh_().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * (1 - np.tanh(2 * x.numpy()) ** 2), rtol=1e-10)


# --- fill_diagonal_ ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,wrap", [((3, 3), False), ((2, 4), False), ((5, 2), False), ((7, 3), True),
                                        ((7, 3), False), ((3, 3, 3), False)])
def test_fill_diagonal_matches_numpy(shape, wrap):
    a = np.zeros(shape, np.float32)
    np.fill_diagonal(a, 2.0, wrap=wrap)
    x = flow.zeros(*shape)
    assert x.fill_diagonal_(2.0, wrap=wrap) is x
    np.testing.assert_array_equal(x.numpy(), a)


def test_fill_diagonal_checks_the_shape():
    with pytest.raises(ShapeError):
        flow.zeros(3).fill_diagonal_(1)
    with pytest.raises(ShapeError):
        flow.zeros(2, 3, 3).fill_diagonal_(1)
    with pytest.raises(AutogradError):
        flow.zeros(2, 2, requires_grad=True).fill_diagonal_(1)
    assert flow.zeros(2, 2, device="cuda").fill_diagonal_(1).tolist() == [[1.0, 0.0], [0.0, 1.0]]


# --- sum(dtype=, axis=) and the axis alias ------------------------------------------------------------


@FEW
@given(array_and_dims())
def test_axis_is_an_alias_of_dim(case):
    a, dims = case
    x = flow.tensor(a)
    np.testing.assert_allclose(x.sum(axis=dims).numpy(), a.sum(dims), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(flow.mean(x, axis=dims).numpy(), a.mean(dims), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(x.max(axis=dims[0]).values.numpy(), a.max(dims[0]))
    np.testing.assert_array_equal(flow.min(x, axis=dims[0]).indices.numpy(), a.argmin(dims[0]))
    np.testing.assert_array_equal(x.amax(axis=dims).numpy(), a.max(dims))


def test_sum_dtype_casts_before_reducing():
    x = flow.tensor([[1.5, 2.5], [3.5, 4.0]])
    assert x.sum(dtype=flow.float64).dtype == flow.float64
    assert flow.sum(x, 1, dtype=flow.int64).tolist() == [3, 7]   # 1 + 2 and 3 + 4, as torch
    assert flow.tensor([1, 2], dtype=flow.int32).sum(dtype=flow.float32).dtype == flow.float32
    with pytest.raises(ArgumentTypeError):
        x.sum(0, axis=0)
    with pytest.raises(DTypeError):
        x.sum(dtype="complex")


def test_fill_diagonal_of_a_tensor_that_requires_grad_only_under_no_grad():
    w = flow.zeros(2, 2, requires_grad=True)
    with pytest.raises(AutogradError):
        (w * 1).fill_diagonal_(1)
    with flow.no_grad():
        w.fill_diagonal_(3)
    assert w.tolist() == [[3.0, 0.0], [0.0, 3.0]] and w.requires_grad


# --- global tensors: the compositions run on them as their ops do --------------------------------------


def test_compositions_work_on_global_tensors():
    a = np.arange(12, dtype=np.float32).reshape(4, 3) - 5

    def body():
        x = flow.tensor(a, placement=flow.placement("cpu", [0, 1]), sbp=flow.sbp.split(0))
        return {"flip": flow.flip(x, (0, 1)).numpy(), "roll": flow.roll(x, 1, 0).numpy(),
                "logsumexp": flow.logsumexp(x, 1).numpy(), "amax": flow.amax(x, (0, 1)).numpy(),
                "mm": flow.mm(x, x.t()).numpy(), "masked_fill": flow.masked_fill(x, x > 0, 0.0).numpy(),
                "sort": flow.sort(x, 0, descending=True).values.numpy()}

    expected = {"flip": np.flip(a, (0, 1)), "roll": np.roll(a, 1, 0), "logsumexp": np_logsumexp(a, 1),
                "amax": a.max(), "mm": a @ a.T, "masked_fill": np.where(a > 0, 0.0, a), "sort": -np.sort(-a, 0)}
    for result in flow.distributed.run(body, world_size=2):
        for name, value in expected.items():
            np.testing.assert_allclose(result[name], value, rtol=1e-5, err_msg=name)


def test_edge_cases_of_0d_empty_and_infinite_inputs():
    assert flow.roll(flow.tensor(3.0), 1).item() == 3.0 and flow.flip(flow.tensor(3.0), ()).item() == 3.0
    assert flow.sort(flow.zeros(2, 0), 1).values.shape == (2, 0)
    assert flow.logsumexp(flow.tensor([math.inf, 1.0]), 0).item() == math.inf
    assert flow.logsumexp(flow.zeros(0), 0).item() == -math.inf
    assert flow.logsumexp(flow.zeros(2, 3), ()).item() == pytest.approx(math.log(6))
    assert np.isnan(flow.unique(flow.tensor([math.nan, math.nan, 1.0])).numpy()[1:]).all()   # NaNs stay apart
    value = flow.tensor(2.0, requires_grad=True)
    flow.masked_fill(flow.zeros(3), flow.tensor([True, False, True]), value).sum().backward()
    assert value.grad.item() == 2.0   # a 0-d tensor value gets the gradient of every filled element


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_all_and_any_of_empty_tensors_are_true_and_false(device):
    """numpy's and PyTorch's identities: all() of nothing is True, any() of nothing is False (all() failed in
    its min reduction: no identity)."""
    empty = flow.zeros(0, device=device) > 0
    assert flow.all(empty).item() is True and flow.any(empty).item() is False
    assert flow.all(flow.ones(2, 0, device=device), dim=1).tolist() == [True, True]
    x = np.array([[0.0, 1.0], [2.0, 3.0]], np.float32)
    for dim in (None, 0, 1):
        assert flow.all(flow.tensor(x, device=device), dim=dim).tolist() == np.all(x, axis=dim).tolist()
        assert flow.any(flow.tensor(x, device=device), dim=dim).tolist() == np.any(x, axis=dim).tolist()


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_gradient_of_max_and_min_along_a_dim_goes_to_the_returned_index_at_ties(op, device):
    """PyTorch routes it to the index it returns; the full reduction x.max() shares it among ties."""
    a = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]], np.float32)
    for keepdim in (False, True):
        x = flow.tensor(a, device=device, requires_grad=True)
        values, indices = getattr(x, op)(dim=1, keepdim=keepdim)
        values.sum().backward()
        want = np.zeros_like(a)
        want[np.arange(2), indices.numpy().reshape(-1)] = 1.0
        np.testing.assert_array_equal(x.grad.numpy(), want)
        np.testing.assert_array_equal(values.numpy().reshape(-1), getattr(a, op)(axis=1))
    x = flow.tensor(a, device=device, requires_grad=True)
    getattr(x, op)().backward()
    ties = (a == getattr(a, op)()).astype(np.float32)
    np.testing.assert_allclose(x.grad.numpy(), ties / ties.sum())
