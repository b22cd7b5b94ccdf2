"""OneFlow's autograd tests, ported (python/oneflow/test/modules/test_autograd.py, test_autograd_mode.py and
exceptions/test_autograd.py): each compared with PyTorch, as OneFlow's ``autotest`` does, on cpu and cuda.

Not ported: ``is_grads_batched`` (vmap-style batched gradients; pyflow has none) and
``inference_mode``; ``check_graph`` (nn.Graph is a later issue).
"""

from __future__ import annotations

import numpy as np
import pytest

import pyflow as flow
from pyflow.errors import AutogradError

torch = pytest.importorskip("torch")

DEVICES = ["cpu", "cuda"]


def pair(values, requires_grad=True, device="cpu"):
    """The same values as a pyflow tensor (on ``device``) and a torch tensor, both leaves."""
    values = np.asarray(values, dtype=np.float64)
    return (flow.tensor(values, device=device, requires_grad=requires_grad),
            torch.tensor(values, requires_grad=requires_grad))


def same(a, b, **kw):
    np.testing.assert_allclose(a.numpy(), b.detach().numpy(), **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4, 5)])
def test_autograd_interface_backward_and_grad(shape, device):
    """OneFlow's _test_autograd_backward / _test_autograd_grad: x * 2 summed, gradient given."""
    rng = np.random.default_rng(0)
    (x, tx), g = pair(rng.standard_normal(shape), device=device), rng.standard_normal(shape)
    (x * 2).backward(flow.tensor(g, device=device))
    (tx * 2).backward(torch.tensor(g))
    same(x.grad, tx.grad)
    (y, ty) = pair(rng.standard_normal(shape), device=device)
    (gy,) = flow.autograd.grad(y * y, y, flow.tensor(g, device=device))
    (tgy,) = torch.autograd.grad(ty * ty, ty, torch.tensor(g))
    same(gy, tgy)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
def test_accumulate_grad_and_0dim(shape, device):
    rng = np.random.default_rng(1)
    (x, tx), (y, ty) = pair(rng.uniform(1, 2, shape), device=device), pair(rng.uniform(1, 2, shape), device=device)
    (x / (x + y)).sum().backward()
    (tx / (tx + ty)).sum().backward()
    same(x.grad, tx.grad)
    same(y.grad, ty.grad)


def test_scalar_leaf_tensor_backward():
    x, tx = pair(3.0)
    x.backward()
    tx.backward()
    same(x.grad, tx.grad)


def test_out_grad_with_different_dtype():
    x, tx = pair(np.ones((2, 3)))
    x.sum().backward(flow.tensor(False))
    tx.sum().backward(torch.tensor(False))
    same(x.grad, tx.grad)
    assert x.grad.dtype == flow.float64


@pytest.mark.parametrize("device", DEVICES)
def test_grad_grad(device):
    x, tx = pair([[0.5, -1.0, 2.0]], device=device)
    (gx,) = flow.autograd.grad(x * x * x, x, flow.ones_like(x), create_graph=True, retain_graph=True)
    (tgx,) = torch.autograd.grad(tx * tx * tx, tx, torch.ones_like(tx), create_graph=True, retain_graph=True)
    (ggx,) = flow.autograd.grad(gx, x, flow.ones_like(gx))
    (tggx,) = torch.autograd.grad(tgx, tx, torch.ones_like(tgx))
    same(ggx, tggx)


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_multiple_times(device):
    """Ten backwards through one z without retain_graph: add and the copy save nothing, so it is allowed
    (as in PyTorch and OneFlow), and the gradients add up."""
    (x, tx), (y, ty) = pair(np.ones((2, 3))), pair(np.full((2, 3), 2.0))
    z, tz = x.to(device) + y.to(device), tx + ty
    for _ in range(10):
        z.sum().backward()
        tz.sum().backward()
    same(x.grad, tx.grad)
    same(y.grad, ty.grad)


def test_set_acc_grad_and_backward():
    rng = np.random.default_rng(2)
    for _ in range(3):
        x, tx = pair(rng.standard_normal((2, 3)))
        init = rng.random((2, 3))
        x.grad, tx.grad = flow.tensor(init), torch.tensor(init)
        x.sum().backward()
        tx.sum().backward()
        same(x.grad, tx.grad)


def test_requires_grad_tensor_inplace_and_backward():
    x, tx = pair(np.ones((2, 2)), requires_grad=False)
    y, ty = pair(np.full((2, 2), 3.0))
    x += y
    tx += ty
    assert x.requires_grad and tx.requires_grad
    (x * x).sum().backward()
    (tx * tx).sum().backward()
    same(y.grad, ty.grad)


def test_retain_grad_for_leaf_tensor_changes_nothing():
    x, tx = pair([1.0, 2.0])
    x.retain_grad()
    tx.retain_grad()
    (x * 2).sum().backward()
    (tx * 2).sum().backward()
    same(x.grad, tx.grad)


def test_run_backward_and_grad_for_the_same_tensor():
    x, tx = pair([1.0, -2.0, 3.0])
    (x ** 2).sum().backward()
    (tx ** 2).sum().backward()
    same(x.grad, tx.grad)
    (gx,) = flow.autograd.grad((x ** 2).sum(), x)
    same(gx, tx.grad)
    same(x.grad, tx.grad)   # autograd.grad accumulated nothing


def test_no_grad_domain_call_backward():
    with flow.no_grad():
        x = flow.rand(2, 3).requires_grad_()
        with flow.enable_grad():
            y = x * 2
        flow.autograd.backward(y, flow.ones_like(y))
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 2.0, np.float32))


def test_accumulating_updates_grad_in_place():
    x, y = flow.rand(2, 3).requires_grad_(), flow.rand(2, 3).requires_grad_()
    (x / (x + y)).sum().backward()
    ids = id(x.grad), id(y.grad)
    (x / (x + y)).sum().backward()
    assert ids == (id(x.grad), id(y.grad))


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_grad_allow_unused_to_third_order(device):
    rng = np.random.default_rng(3)
    (x, tx), (z, tz) = pair(rng.standard_normal((2, 4)), device=device), pair(rng.standard_normal((2, 4)))
    y, ty = x * x, tx * tx
    init = rng.random((2, 4))
    g, tg = flow.tensor(init, device=device, requires_grad=True), torch.tensor(init, requires_grad=True)
    dx, dz = flow.autograd.grad(y, [x, z], g, retain_graph=True, create_graph=True, allow_unused=True)
    tdx, tdz = torch.autograd.grad(ty, [tx, tz], tg, retain_graph=True, create_graph=True, allow_unused=True)
    same(dx, tdx)
    assert dz is None and tdz is None
    init2 = rng.random((2, 4))
    (ddx,) = flow.autograd.grad(dx, x, flow.tensor(init2, device=device), retain_graph=True, create_graph=True,
                                allow_unused=True)
    (tddx,) = torch.autograd.grad(tdx, tx, torch.tensor(init2), retain_graph=True, create_graph=True,
                                  allow_unused=True)
    same(ddx, tddx)
    (dddx,) = flow.autograd.grad(ddx, x, flow.ones_like(ddx), retain_graph=True, allow_unused=True)
    (tdddx,) = torch.autograd.grad(tddx, tx, torch.ones_like(tddx), retain_graph=True, allow_unused=True)
    assert dddx is None and tdddx is None


def test_autograd_grad_with_a_none_list_for_scalar_outputs():
    x, y = flow.randn(4, 4, requires_grad=True), flow.randn(4, 4, requires_grad=True)
    s_x, s_y = flow.split(flow.cat([x, y], dim=0), 4, dim=0)
    grad_x, grad_y = flow.autograd.grad((s_x.sum(), s_y.sum()), (x, y), (None, None))
    np.testing.assert_array_equal(grad_x.numpy(), np.ones((4, 4), np.float32))
    np.testing.assert_array_equal(grad_y.numpy(), np.ones((4, 4), np.float32))


# --- test_autograd_mode.py -------------------------------------------------------------------------------


def test_grad_modes_nest_and_decorate():
    assert flow.is_grad_enabled()
    with flow.no_grad():
        assert not flow.is_grad_enabled()
        with flow.enable_grad():
            assert flow.is_grad_enabled()
        assert not flow.is_grad_enabled()
    with flow.set_grad_enabled(False):
        assert not flow.is_grad_enabled()

    @flow.no_grad()
    def inside():
        return flow.is_grad_enabled()

    assert inside() is False and flow.is_grad_enabled()


# --- exceptions/test_autograd.py -----------------------------------------------------------------------------


def test_non_requires_grad_tensor_backward_names_the_output():
    with pytest.raises(AutogradError, match=r"output 0 .* does not require grad and has no grad_fn"):
        flow.ones(4, 4).sum().backward()


def test_allow_unused_is_suggested():
    x, y = flow.ones(4, 4).requires_grad_(), flow.ones(4, 4).requires_grad_()
    z = x * x
    with pytest.raises(AutogradError, match="allow_unused=True"):
        flow.autograd.grad(z, [x, y], flow.ones_like(z))
