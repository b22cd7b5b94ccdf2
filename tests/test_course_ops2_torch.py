"""The ops of ``tests/test_course_ops2.py`` against PyTorch itself (the ``torch`` extra; skipped without it):
``bool + bool``, ``prod`` (gradient with zeros), ``einsum``, ``conv2d(dilation=, groups=)``, ``nn.GRU`` (its
state dict loads as it is) and ``unique(dim=)``, in float64."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import nn
from pyflow.framework.einsum import einsum
from pyflow.framework.reductions import prod
from tests.test_nn_torch import compare, randn

torch = pytest.importorskip("torch")


def test_bool_add_and_mul_match_torch():
    a, b = np.array([True, True, False, False]), np.array([True, False, True, False])
    for op in ("__add__", "__mul__"):
        ours = getattr(flow.tensor(a), op)(flow.tensor(b))
        theirs = getattr(torch.tensor(a), op)(torch.tensor(b))
        assert str(theirs.dtype) == "torch.bool" and ours.dtype == flow.bool
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@pytest.mark.parametrize("dim", [None, 0, 1])
def test_prod_and_its_gradient_with_zeros_match_torch(dim):
    x = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.0, 2.0, 4.0]])
    ours, theirs = flow.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    (prod(ours) if dim is None else ours.prod(dim)).sum().backward()
    (theirs.prod() if dim is None else theirs.prod(dim)).sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy())


@pytest.mark.parametrize("equation, shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]), ("bij,bjk", [(2, 2, 3), (2, 3, 2)]), ("ii->i", [(3, 3)]), ("ii", [(3, 3)]),
    ("...ij->...ji", [(2, 3, 4)]), ("...ij->ij", [(2, 3, 4)]), ("i,j,k->jk", [(2,), (3,), (2,)]),
    ("ba", [(2, 3)]), ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)])])
def test_einsum_matches_torch(equation, shapes):
    arrays = [randn(*s, seed=k) for k, s in enumerate(shapes)]
    ours = [flow.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, t_out = einsum(equation, *ours), torch.einsum(equation, *theirs)
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), rtol=1e-12, atol=1e-12)
    weights = randn(*t_out.shape, seed=9)
    (out * flow.tensor(weights)).sum().backward()
    (t_out * torch.tensor(weights)).sum().backward()
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-12)


@settings(max_examples=5, deadline=None)
@given(groups=st.sampled_from([1, 2]), dilation=st.sampled_from([1, 2, (2, 1)]), stride=st.sampled_from([1, 2]),
       padding=st.sampled_from([0, 1]))
def test_conv2d_with_dilation_and_groups_matches_torch(groups, dilation, stride, padding):
    kwargs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    compare(nn.Conv2d(4, 6, 3, **kwargs), torch.nn.Conv2d(4, 6, 3, **kwargs), randn(2, 4, 7, 7))


@settings(max_examples=5, deadline=None)
@given(layers=st.integers(1, 2), batch_first=st.booleans(), bidirectional=st.booleans(), bias=st.booleans())
def test_gru_matches_torch(layers, batch_first, bidirectional, bias):
    kwargs = {"num_layers": layers, "batch_first": batch_first, "bidirectional": bidirectional, "bias": bias}
    compare(nn.GRU(2, 3, **kwargs), torch.nn.GRU(2, 3, **kwargs), randn(3, 2, 2))


def test_unique_dim_matches_torch():
    a = np.array([[1, 2, 1], [0, 5, 0], [1, 2, 1], [0, 1, 0]])
    for dim in (0, 1):
        ours = flow.unique(flow.tensor(a), dim=dim, return_inverse=True, return_counts=True)
        theirs = torch.unique(torch.tensor(a), dim=dim, return_inverse=True, return_counts=True)
        for o, t in zip(ours, theirs):
            np.testing.assert_array_equal(o.numpy(), t.numpy())
