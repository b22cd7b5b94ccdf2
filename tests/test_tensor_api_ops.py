"""The math, reduction, creation and ``flow.nn.functional`` API against numpy, on "cpu" and "cuda".

One property per test: each function gives numpy's values (computed on the
operands cast to PyTorch's dtype) with PyTorch's result dtype and shape.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pyflow as flow
from tests.strategies import TARGETS, assert_close, shapes, values


@pytest.fixture(params=TARGETS)
def device(request) -> str:
    return request.param


MATRIX = np.array([[1.5, -2.0, 3.25], [-0.5, 0.0, 2.0]], dtype=np.float32)


# --- elementwise -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, reference", [
    ("sin", np.sin), ("cos", np.cos), ("floor", np.floor), ("ceil", np.ceil), ("round", np.round),
    ("sign", np.sign), ("abs", np.abs), ("neg", np.negative), ("exp", np.exp), ("tanh", np.tanh),
])
def test_unary_functions_match_numpy(device, name, reference):
    x = flow.tensor(MATRIX * 1.7, device=device)
    for result in (getattr(flow, name)(x), getattr(x, name)()):
        assert result.dtype == np.float32 and result.shape == MATRIX.shape
        assert_close(result.numpy(), reference(MATRIX * 1.7), what=name)


def test_round_is_half_to_even_and_isnan_isinf_find_special_values(device):
    x = flow.tensor([0.5, 1.5, 2.5, -0.5, np.nan, np.inf, -np.inf], device=device)
    np.testing.assert_array_equal(flow.round(x[:4]).numpy(), [0.0, 2.0, 2.0, -0.0])
    np.testing.assert_array_equal(flow.isnan(x).numpy(), [False] * 4 + [True, False, False])
    np.testing.assert_array_equal(x.isinf().numpy(), [False] * 5 + [True, True])
    assert flow.isnan(flow.tensor([1, 2], device=device)).dtype == np.bool_


def test_floor_divide_and_remainder_follow_python_signs(device):
    a, b = np.array([7, -7, 7, -7]), np.array([2, 2, -2, -2])
    ta, tb = flow.tensor(a, device=device), flow.tensor(b, device=device)
    np.testing.assert_array_equal((ta // tb).numpy(), a // b)
    np.testing.assert_array_equal((ta % tb).numpy(), a % b)
    np.testing.assert_array_equal(flow.floor_divide(ta, 2).numpy(), a // 2)
    np.testing.assert_array_equal(flow.remainder(ta.float(), 2.5).numpy(), np.remainder(a.astype(np.float32), 2.5))
    np.testing.assert_array_equal((7 // ta).numpy(), 7 // a)


def test_bitwise_and_logical_ops(device):
    a, b = np.array([12, 10, -3], dtype=np.int32), np.array([10, 6, 5], dtype=np.int32)
    ta, tb = flow.tensor(a, device=device), flow.tensor(b, device=device)
    np.testing.assert_array_equal((ta & tb).numpy(), a & b)
    np.testing.assert_array_equal((ta | tb).numpy(), a | b)
    np.testing.assert_array_equal((ta ^ tb).numpy(), a ^ b)
    np.testing.assert_array_equal((~ta).numpy(), ~a)
    p, q = ta > 0, tb > 5
    np.testing.assert_array_equal((~p).numpy(), ~(a > 0))
    np.testing.assert_array_equal((p & q).numpy(), (a > 0) & (b > 5))
    x, y = flow.tensor([0.0, 1.5, 0.0], device=device), flow.tensor([2, 0, 0], device=device)
    for name, reference in (("logical_and", np.logical_and), ("logical_or", np.logical_or),
                            ("logical_xor", np.logical_xor)):
        result = getattr(flow, name)(x, y)
        assert result.dtype == np.bool_
        np.testing.assert_array_equal(result.numpy(), reference([0.0, 1.5, 0.0], [2, 0, 0]), err_msg=name)
    np.testing.assert_array_equal(flow.logical_not(x).numpy(), [True, False, True])


@given(low=st.none() | st.floats(-2, 2, width=32), high=st.none() | st.floats(-2, 2, width=32),
       device=st.sampled_from(TARGETS))
def test_clamp_matches_numpy_clip_with_either_bound_missing(low, high, device):
    if low is None and high is None:
        return
    x = flow.tensor(MATRIX, device=device)
    expected = MATRIX
    if low is not None:
        expected = np.maximum(expected, np.float32(low))
    if high is not None:
        expected = np.minimum(expected, np.float32(high))
    np.testing.assert_array_equal(flow.clamp(x, min=low, max=high).numpy(), expected)
    np.testing.assert_array_equal(x.clamp(low, high).numpy(), expected)
    np.testing.assert_array_equal(flow.clip(x, low, high).numpy(), expected)


def test_clamp_takes_tensor_bounds(device):
    x = flow.tensor(MATRIX, device=device)
    low = flow.tensor([0.0, -1.0, 1.0], device=device)
    np.testing.assert_array_equal(flow.clamp(x, min=low, max=2.0).numpy(),
                                  np.minimum(np.maximum(MATRIX, [0.0, -1.0, 1.0]), 2.0))


def test_max_and_min_dispatch_on_their_second_argument(device):
    """Regression: ``flow.max(x, y)`` with a tensor y raised AxisError; min(dim) gave only values."""
    x, y = flow.tensor(MATRIX, device=device), flow.tensor(-MATRIX, device=device)
    np.testing.assert_array_equal(flow.max(x, y).numpy(), np.maximum(MATRIX, -MATRIX))
    np.testing.assert_array_equal(flow.min(x, y).numpy(), np.minimum(MATRIX, -MATRIX))
    for fn, values, indices in ((flow.max, np.max, np.argmax), (flow.min, np.min, np.argmin)):
        for dim in (0, 1, -1):
            for keepdim in (False, True):
                result = fn(x, dim, keepdim=keepdim)
                assert result._fields == ("values", "indices") and type(result).__name__ == fn.__name__
                np.testing.assert_array_equal(result.values.numpy(), values(MATRIX, dim, keepdims=keepdim))
                np.testing.assert_array_equal(result.indices.numpy(), indices(MATRIX, dim, keepdims=keepdim))
        value, index = getattr(x, fn.__name__)(dim=1)
        np.testing.assert_array_equal(index.numpy(), indices(MATRIX, 1))
        assert fn(x).shape == () and fn(x).item() == values(MATRIX)


# --- reductions --------------------------------------------------------------------------------------------------


@st.composite
def reduction_cases(draw):
    shape = draw(shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    dim = draw(st.none() | st.integers(-len(shape), len(shape) - 1)
               | st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape), unique=True).map(tuple))
    return shape, dim, draw(st.booleans()), draw(st.integers(0, 2**16))


@given(case=reduction_cases(), device=st.sampled_from(TARGETS))
def test_var_std_and_norm_match_numpy(case, device):
    shape, dim, keepdim, seed = case
    a = values(shape, np.float64, -3, 3, seed)
    x = flow.tensor(a, device=device)
    n = a.size if dim is None else math.prod(np.array(a.shape)[list(np.atleast_1d(dim))])
    with np.errstate(all="ignore"):
        for correction in (0, 1):
            if n <= correction:
                continue
            assert_close(x.var(dim, keepdim=keepdim, correction=correction).numpy(),
                         a.var(axis=dim, keepdims=keepdim, ddof=correction), what=f"var ddof={correction}")
        if n > 1:
            assert_close(flow.std(x, dim, keepdim=keepdim).numpy(), a.std(axis=dim, keepdims=keepdim, ddof=1))
            assert_close(x.var(dim, False, keepdim).numpy(), a.var(axis=dim, keepdims=keepdim))
    for p, reference in ((2, lambda v: np.sqrt((v * v).sum(axis=dim, keepdims=keepdim))),
                         (1, lambda v: np.abs(v).sum(axis=dim, keepdims=keepdim)),
                         (math.inf, lambda v: np.abs(v).max(axis=dim, keepdims=keepdim)),
                         (3, lambda v: (np.abs(v) ** 3).sum(axis=dim, keepdims=keepdim) ** (1 / 3))):
        assert_close(x.norm(p, dim, keepdim).numpy(), reference(a), what=f"norm p={p}")


@given(shape=shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), data=st.data(),
       dtype=st.sampled_from(["float32", "int32", "bool", "uint8"]), device=st.sampled_from(TARGETS))
def test_sum_cumsum_argmin_of_every_dtype_follow_torch(shape, data, dtype, device):
    a = values(shape, dtype, 0 if dtype == "uint8" else -5, 5, data.draw(st.integers(0, 2**16)))
    x = flow.tensor(a, device=device)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    total = x.sum()
    assert total.dtype == (np.float32 if dtype == "float32" else np.int64), "bools and integers sum in int64"
    assert_close(total.numpy(), a.sum(dtype=total.dtype), what="sum")
    running = x.cumsum(dim)
    assert running.dtype == total.dtype
    assert_close(running.numpy(), np.cumsum(a, axis=dim, dtype=total.dtype), what="cumsum")
    np.testing.assert_array_equal(flow.argmin(x, dim).numpy(), np.argmin(a, axis=dim))
    np.testing.assert_array_equal(x.argmin().numpy(), np.argmin(a))


def test_regression_sum_of_a_bool_tensor_counts_the_trues(device):
    x = flow.tensor(MATRIX, device=device)
    assert (x > 0).sum().item() == 3 and (x > 0).sum().dtype == np.int64
    np.testing.assert_array_equal((x > 0).sum(dim=1).numpy(), [2, 1])
    assert flow.any(x > 4).item() is False and flow.all(x > -3).item() is True
    assert (x > 0).any(dim=0).tolist() == [True, False, True]


@given(shape=shapes(min_dims=1, max_dims=3, min_side=1, max_side=5), data=st.data(),
       device=st.sampled_from(TARGETS))
def test_topk_gives_the_sorted_k_largest_or_smallest_and_their_indices(shape, data, device):
    a = values(shape, np.float32, -9, 9, data.draw(st.integers(0, 2**16))).round()   # ties on purpose
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(0, shape[dim]))
    largest = data.draw(st.booleans())
    values_, indices = flow.topk(flow.tensor(a, device=device), k, dim=dim, largest=largest)
    order = np.argsort(-a if largest else a, axis=dim, kind="stable")
    expected_indices = np.take(order, range(k), axis=dim)
    np.testing.assert_array_equal(indices.numpy(), expected_indices)
    np.testing.assert_array_equal(values_.numpy(), np.take_along_axis(a, expected_indices, axis=dim))


def test_allclose_is_a_python_bool_with_torchs_tolerances(device):
    x = flow.tensor([1.0, np.inf, np.nan], device=device)
    y = flow.tensor([1.0 + 1e-6, np.inf, np.nan], device=device)
    assert flow.allclose(x[:2], y[:2]) is True
    assert flow.allclose(x, y) is False and flow.allclose(x, y, equal_nan=True) is True
    assert x[:2].allclose(x[:2] + 1e-3, atol=1e-2) is True and flow.allclose(x[:1], x[:1] + 1e-3) is False


# --- gather, index_select --------------------------------------------------------------------------------------


@given(shape=shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), data=st.data(),
       device=st.sampled_from(TARGETS))
def test_gather_and_index_select_match_numpy(shape, data, device):
    a = values(shape, np.float32, -9, 9, data.draw(st.integers(0, 2**16)))
    dim = data.draw(st.integers(0, len(shape) - 1))
    index_shape = tuple(data.draw(st.integers(1, n)) if d != dim else data.draw(st.integers(0, 3))
                        for d, n in enumerate(shape))
    index = values(index_shape, np.int64, 0, shape[dim] - 1, data.draw(st.integers(0, 2**16)))
    x = flow.tensor(a, device=device)
    np.testing.assert_array_equal(flow.gather(x, dim, flow.tensor(index, device=device)).numpy(),
                                  np.take_along_axis(_cut(a, index_shape, dim), index, axis=dim))
    picks = index.reshape(-1)[:3]
    np.testing.assert_array_equal(x.index_select(dim, flow.tensor(picks, device=device)).numpy(),
                                  np.take(a, picks, axis=dim))


def _cut(a, index_shape, dim):
    """torch.gather reads ``a`` only where the index reaches: off ``dim``, the first ``index_shape[d]``."""
    return a[tuple(slice(None) if d == dim else slice(0, n) for d, n in enumerate(index_shape))]


# --- creation ------------------------------------------------------------------------------------------------


def test_creation_functions_match_numpy_and_torch_dtypes(device):
    cases = {
        "arange(5)": (flow.arange(5, device=device), np.arange(5)),
        "arange(1, 3, 0.5)": (flow.arange(1, 3, 0.5, device=device), np.arange(1, 3, 0.5, dtype=np.float32)),
        "arange(5, 0, -2)": (flow.arange(5, 0, -2, device=device), np.arange(5, 0, -2)),
        "linspace": (flow.linspace(-1, 1, 5, device=device), np.linspace(-1, 1, 5, dtype=np.float32)),
        "eye(3)": (flow.eye(3, device=device), np.eye(3, dtype=np.float32)),
        "eye(2, 4, int)": (flow.eye(2, 4, dtype=flow.int64, device=device), np.eye(2, 4, dtype=np.int64)),
        "full int": (flow.full((2,), 7, device=device), np.full(2, 7)),
        "full bool": (flow.full((2,), True, device=device), np.full(2, True)),
        "full float": (flow.full([1, 2], 2.5, device=device), np.full((1, 2), 2.5, np.float32)),
        "zeros_like": (flow.zeros_like(flow.ones(2, dtype=flow.int8, device=device)), np.zeros(2, np.int8)),
        "ones_like": (flow.ones_like(flow.zeros(2, 1, device=device)), np.ones((2, 1), np.float32)),
        "full_like": (flow.full_like(flow.zeros(3, device=device), -2), np.full(3, -2, np.float32)),
        "from_numpy": (flow.from_numpy(np.arange(3, dtype=np.int16)), np.arange(3, dtype=np.int16)),
    }
    for what, (actual, expected) in cases.items():
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
        assert_close(actual.numpy(), expected, what=what)
    assert flow.arange(5, device=device).device == flow.device(device)
    for empty in (flow.empty(2, 3, device=device), flow.empty_like(flow.zeros(2, 3, device=device))):
        assert empty.shape == (2, 3) and empty.dtype == np.float32
        empty.fill_(1)
        np.testing.assert_array_equal(empty.numpy(), np.ones((2, 3)))


def test_random_tensors_are_reproducible_and_in_range(device):
    flow.manual_seed(5)
    first = [flow.randint(-3, 4, (50,), device=device).numpy(),
             flow.rand_like(flow.zeros(2, 3, device=device)).numpy(),
             flow.randn_like(flow.zeros(4, dtype=flow.float64, device=device)).numpy()]
    flow.manual_seed(5)
    second = [flow.randint(-3, 4, (50,), device=device).numpy(),
              flow.rand_like(flow.zeros(2, 3, device=device)).numpy(),
              flow.randn_like(flow.zeros(4, dtype=flow.float64, device=device)).numpy()]
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    assert first[0].dtype == np.int64 and first[0].min() >= -3 and first[0].max() <= 3
    assert len(set(first[0].tolist())) > 3
    assert first[1].dtype == np.float32 and ((0 <= first[1]) & (first[1] < 1)).all()
    assert first[2].dtype == np.float64
    assert flow.randint(10, (2, 2)).shape == (2, 2)


def test_from_numpy_copies_and_keeps_the_dtype():
    array = np.array([1.5, 2.5], dtype=np.float64)
    t = flow.from_numpy(array)
    array[0] = 0.0
    assert t.dtype == np.float64 and t.tolist() == [1.5, 2.5]


# --- nn.functional -----------------------------------------------------------------------------------------------


def _windows(a, k, stride, padding, fill):
    padded = np.pad(a, ((0, 0), (0, 0), (padding, padding), (padding, padding)), constant_values=fill)
    return np.lib.stride_tricks.sliding_window_view(padded, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]


@given(data=st.data(), device=st.sampled_from(TARGETS))
def test_conv2d_and_pooling_match_numpy(data, device):
    n, c, h, w = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)), data.draw(st.integers(3, 5)),
                  data.draw(st.integers(3, 5)))
    k, stride, padding = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2)), data.draw(st.integers(0, 1))
    seed = data.draw(st.integers(0, 2**16))
    a = values((n, c, h, w), np.float64, -2, 2, seed)
    weight = values((2, c, k, k), np.float64, -2, 2, seed + 1)
    bias = values((2,), np.float64, -2, 2, seed + 2)
    F = flow.nn.functional
    x = flow.tensor(a, device=device)
    expected = np.einsum("nchwij,ocij->nohw", _windows(a, k, stride, padding, 0), weight) + bias[:, None, None]
    actual = F.conv2d(x, flow.tensor(weight, device=device), flow.tensor(bias, device=device), stride, padding)
    assert_close(actual.numpy(), expected, what="conv2d")
    padding = min(padding, k // 2)
    assert_close(F.max_pool2d(x, k, stride, padding).numpy(),
                 _windows(a, k, stride, padding, -np.inf).max(axis=(4, 5)), what="max_pool2d")
    assert_close(F.avg_pool2d(x, k, padding=padding).numpy(),
                 _windows(a, k, k, padding, 0).mean(axis=(4, 5)), what="avg_pool2d")
