"""PyTorch's pooling keywords (OneFlow's own tests use them): ``MaxPool2d(return_indices=True, ceil_mode=,
dilation=)``, ``AvgPool2d(ceil_mode=, count_include_pad=, divisor_override=)``, against a plain numpy loop of
PyTorch's definitions (``nn/pooling.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.errors import ArgumentValueError
from pyflow.nn import functional as F
from pyflow.nn.pooling import pool_output_size


def numpy_pool(x, k, s, p, d, ceil, kind, count_include_pad=True, divisor=None):
    """PyTorch's loops: values (and the first largest's index row * W + col for max)."""
    n, c, h, w = x.shape
    oh, ow = (pool_output_size(size, k, s, p, d, ceil) for size in (h, w))
    out, idx = np.zeros((n, c, oh, ow)), np.zeros((n, c, oh, ow), np.int64)
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * s - p, j * s - p
            cells = [(r0 + dy * d, c0 + dx * d) for dy in range(k) for dx in range(k)]
            inside = [(r, q) for r, q in cells if 0 <= r < h and 0 <= q < w]
            if kind == "max":
                for a in range(n):
                    for b in range(c):
                        best = max(inside, key=lambda rq: (x[a, b][rq], -inside.index(rq)))
                        out[a, b, i, j], idx[a, b, i, j] = x[a, b][best], best[0] * w + best[1]
            else:
                r1, c1 = min(r0 + k, h + p), min(c0 + k, w + p)
                size = (r1 - r0) * (c1 - c0)
                if not count_include_pad:
                    size = (min(r1, h) - max(r0, 0)) * (min(c1, w) - max(c0, 0))
                total = sum(x[:, :, r, q] for r, q in inside)
                out[:, :, i, j] = total / (divisor or size)
    return out, idx


@settings(max_examples=40, deadline=None)
@given(h=st.integers(2, 7), w=st.integers(2, 7), k=st.integers(1, 3), s=st.integers(1, 3), d=st.integers(1, 2),
       ceil=st.booleans(), data=st.data())
def test_max_pool2d_values_and_indices_equal_pytorchs_loop(h, w, k, s, d, ceil, data):
    p = data.draw(st.integers(0, k // 2))
    if (h + 2 * p - d * (k - 1) - 1) < 0 or (w + 2 * p - d * (k - 1) - 1) < 0:
        return
    x = np.random.default_rng(h * 100 + w).integers(-3, 4, (1, 2, h, w)).astype(np.float32)   # ties, often
    want, want_idx = numpy_pool(x, k, s, p, d, ceil, "max")
    got, idx = F.max_pool2d(flow.tensor(x), k, s, p, d, ceil_mode=ceil, return_indices=True)
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(idx.numpy(), want_idx)
    if d == 1 and not ceil:   # the kernel's path gives the same values
        np.testing.assert_array_equal(F.max_pool2d(flow.tensor(x), k, s, p).numpy(), want)


@settings(max_examples=40, deadline=None)
@given(h=st.integers(2, 7), w=st.integers(2, 7), k=st.integers(1, 3), s=st.integers(1, 3), ceil=st.booleans(),
       count_include_pad=st.booleans(), override=st.sampled_from([None, 2]), data=st.data())
def test_avg_pool2d_divides_as_pytorch(h, w, k, s, ceil, count_include_pad, override, data):
    p = data.draw(st.integers(0, k // 2))
    if h + 2 * p < k or w + 2 * p < k:
        return
    x = np.random.default_rng(h * 10 + w).standard_normal((2, 1, h, w)).astype(np.float32)
    want, _ = numpy_pool(x, k, s, p, 1, ceil, "avg", count_include_pad, override)
    got = flow.nn.AvgPool2d(k, s, p, ceil_mode=ceil, count_include_pad=count_include_pad,
                            divisor_override=override)(flow.tensor(x))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_the_gradient_of_a_max_goes_to_the_returned_index_and_3d_inputs_work():
    x = flow.tensor(np.array([[[1.0, 5.0, 5.0], [2.0, 0.0, 5.0], [1.0, 1.0, 1.0]]], np.float32), requires_grad=True)
    values, indices = flow.nn.MaxPool2d(2, 1, return_indices=True, ceil_mode=True)(x)   # a 3-D (C, H, W) input
    assert values.shape == indices.shape == (1, 2, 2)
    values.sum().backward()
    counts = np.bincount(indices.numpy().ravel(), minlength=9).reshape(1, 3, 3)
    np.testing.assert_array_equal(x.grad.numpy(), counts)   # ties: one element each, the first (as PyTorch)


def test_pooling_on_cuda_and_bad_arguments():
    x = np.arange(25.0, dtype=np.float32).reshape(1, 1, 5, 5)
    got = F.max_pool2d(flow.tensor(x, device="cuda"), 2, ceil_mode=True)
    np.testing.assert_array_equal(got.numpy(), numpy_pool(x, 2, 2, 0, 1, True, "max")[0])
    with pytest.raises(ArgumentValueError, match="half the kernel"):
        F.max_pool2d(flow.tensor(x), 2, padding=2, ceil_mode=True)
    with pytest.raises(ArgumentValueError, match="divisor_override"):
        F.avg_pool2d(flow.tensor(x), 2, divisor_override=0)
    assert math.isfinite(F.avg_pool2d(flow.tensor(x), 2, ceil_mode=True).sum().item())
