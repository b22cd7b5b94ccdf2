"""The last missing ops of issue 33: ``bool + bool`` / ``bool * bool``, ``prod``, ``einsum``,
``conv2d(dilation=, groups=)``, ``nn.GRU`` and ``unique(dim=)``.

Expected values are numpy versions of PyTorch's definitions (PyTorch itself is not installed here;
``tests/test_nn_torch.py`` compares against it where the ``torch`` extra is); gradients are compared with
central differences of those numpy versions (float64) or with a closed form.  Each family has a small CUDA
case (the simulator is slow).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.errors import DTypeError
from pyflow.framework.einsum import einsum
from pyflow.framework.reductions import prod

FEW = settings(max_examples=15, deadline=None)
TARGETS = ["cpu", "cuda"]


def numeric_grad(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar function ``f`` (numpy -> float) at ``x``."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        grad[i] = (f(up) - f(down)) / (2 * h)
    return grad


def check_grad(flow_f, numpy_f, *inputs: np.ndarray, device="cpu", seed=0, rtol=1e-5, atol=1e-6):
    """d sum(w * f(inputs)) / d input, by pyflow's autograd and by central differences of ``numpy_f``."""
    w = np.random.default_rng(seed).uniform(-1, 1, np.shape(numpy_f(*inputs)))
    leaves = [flow.tensor(a, device=device, requires_grad=True) for a in inputs]
    (flow_f(*leaves) * flow.tensor(w, device=device)).sum().backward()
    for k, (a, leaf) in enumerate(zip(inputs, leaves)):
        def loss(v, k=k):
            args = list(inputs)
            args[k] = v
            return float(np.sum(w * numpy_f(*args)))
        np.testing.assert_allclose(leaf.grad.numpy(), numeric_grad(loss, a), rtol=rtol, atol=atol)


# --- bool + bool, bool * bool, bool - bool -------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@FEW
@given(a=st.lists(st.booleans(), min_size=1, max_size=6), seed=st.integers(0, 2**31 - 1))
def test_bool_add_is_or_and_mul_is_and(target, a, seed):
    a = np.array(a)
    b = np.random.default_rng(seed).integers(0, 2, a.shape).astype(bool)
    x, y = flow.tensor(a, device=target), flow.tensor(b, device=target)
    for got, expected in ((x + y, a | b), (x * y, a & b), (flow.add(x, y), a | b), (flow.mul(x, y), a & b)):
        assert got.dtype == flow.bool
        np.testing.assert_array_equal(got.numpy(), expected)
    z = x.clone()
    z += y
    np.testing.assert_array_equal(z.numpy(), a | b)


def test_bool_mixed_with_numbers_promotes_as_pytorch():
    a = flow.tensor([True, False])
    assert (a + flow.tensor([1, 2])).tolist() == [2, 2]
    assert (a + True).dtype == flow.bool and (a * 2.5).dtype == flow.float32


@pytest.mark.parametrize("target", TARGETS)
def test_bool_subtraction_is_refused_as_pytorch(target):
    a, i = flow.tensor([True, False], device=target), flow.tensor([1, 2], device=target)
    with pytest.raises(DTypeError, match="with two bool tensors is not supported"):
        a - a
    with pytest.raises(DTypeError, match="with two bool tensors is not supported"):
        a.sub_(True)
    for call in (lambda: a - i, lambda: i - a, lambda: flow.sub(a, 1), lambda: 1 - a):
        with pytest.raises(DTypeError, match="with a bool tensor is not supported"):
            call()


# --- prod ----------------------------------------------------------------------------------------------


def prod_grad_reference(x: np.ndarray, axis) -> np.ndarray:
    """d prod / d x_i = the product of the other elements, by its definition (no division)."""
    grad = np.empty_like(x)
    moved = np.moveaxis(x, axis, -1) if axis is not None else x.reshape(1, -1)
    out = np.empty_like(moved)
    for row in np.ndindex(moved.shape[:-1]):
        values = moved[row]
        for i in range(values.shape[0]):
            out[row + (i,)] = np.prod(np.delete(values, i))
    grad[...] = np.moveaxis(out, -1, axis) if axis is not None else out.reshape(x.shape)
    return grad


@FEW
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), seed=st.integers(0, 2**31 - 1),
       data=st.data())
def test_prod_values_and_gradient_with_zeros(shape, seed, data):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, shape)
    x[rng.random(shape) < 0.3] = 0.0   # zeros: none, one or several per slice
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)), label="axis")
    keepdim = data.draw(st.booleans(), label="keepdim") and axis is not None
    leaf = flow.tensor(x, requires_grad=True)
    y = prod(leaf) if axis is None else leaf.prod(axis, keepdim=keepdim)
    np.testing.assert_allclose(y.numpy(), np.prod(x, axis=axis, keepdims=keepdim), rtol=1e-12)
    y.sum().backward()
    np.testing.assert_allclose(leaf.grad.numpy(), prod_grad_reference(x, axis), rtol=1e-12, atol=1e-12)


def test_prod_gradient_at_exactly_one_zero_is_the_product_of_the_others():
    x = flow.tensor([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.0, 2.0, 4.0]], requires_grad=True)
    x.prod(1).sum().backward()
    assert x.grad.tolist() == [[0.0, 6.0, 0.0], [0.0, 0.0, 0.0], [8.0, 4.0, 2.0]]


@pytest.mark.parametrize("target", TARGETS)
def test_prod_dtypes_and_cuda(target):
    assert flow.tensor([1, 2, 3], device=target).prod().dtype == flow.int64
    assert flow.tensor([True, True], device=target).prod().item() == 1
    assert flow.tensor([1, 2], dtype=flow.int8, device=target).prod(dtype=flow.float32).dtype == flow.float32
    assert flow.ones(0, 3, device=target).prod(0).tolist() == [1.0, 1.0, 1.0]
    x = np.array([[2.0, 0.0, 3.0], [1.0, 2.0, 3.0]], np.float32)
    check_grad(lambda t: t.prod(-1), lambda a: np.prod(a, -1), x.astype(np.float64), device=target)
    np.testing.assert_allclose(prod(flow.tensor(x, device=target)).numpy(), 0.0)


# --- einsum --------------------------------------------------------------------------------------------


@st.composite
def einsum_cases(draw):
    """A random equation over letters a-d (repeats in a term allowed: diagonals), its operands' shapes,
    and an implicit or explicit output."""
    sizes = {c: draw(st.integers(1, 3), label=f"size {c}") for c in "abcd"}
    terms = draw(st.lists(st.text("abcd", max_size=3), min_size=1, max_size=3), label="terms")
    used = sorted(set("".join(terms)))
    explicit = draw(st.booleans(), label="explicit")
    output = draw(st.permutations(used), label="output")[:draw(st.integers(0, len(used)), label="kept")]
    equation = ",".join(terms) + ("->" + "".join(output) if explicit else "")
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    return equation, [rng.uniform(-1, 1, [sizes[c] for c in term]) for term in terms]


@FEW
@given(einsum_cases())
def test_einsum_matches_numpy(case):
    equation, operands = case
    got = einsum(equation, *[flow.tensor(a) for a in operands])
    np.testing.assert_allclose(got.numpy(), np.einsum(equation, *operands), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("equation, shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)]), ("ii->i", [(3, 3)]),
    ("...ij,...jk", [(2, 1, 2, 3), (3, 3, 2)]), ("i,j,k->jk", [(2,), (3,), (2,)]), ("ba", [(2, 3)])])
def test_einsum_gradient(equation, shapes):
    rng = np.random.default_rng(1)
    operands = [rng.uniform(-1, 1, s) for s in shapes]
    check_grad(lambda *t: einsum(equation, *t), lambda *a: np.einsum(equation, *a), *operands)


def test_einsum_ellipsis_left_out_of_an_explicit_output_is_summed_as_in_pytorch():
    a = np.arange(24.0).reshape(2, 3, 4)
    got = einsum("...ij->ij", flow.tensor(a))
    np.testing.assert_allclose(got.numpy(), a.sum(0))
    assert einsum("i,i", [flow.tensor([1.0, 2.0]), flow.tensor([3.0, 4.0])]).item() == 11.0   # a list too


def test_einsum_cuda():
    a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    x, y = flow.tensor(a, device="cuda", requires_grad=True), flow.tensor(b, device="cuda")
    out = einsum("ij,jk->ik", x, y)
    np.testing.assert_allclose(out.numpy(), a @ b)
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.ones((2, 4)) @ b.T)
    assert einsum("ii", flow.tensor(np.eye(3), device="cuda")).item() == 3.0


@pytest.mark.parametrize("equation, shapes, error, match", [
    ("ij,jk", [(2, 3), (4, 2)], "ShapeError", "subscript 'j' has sizes 3 and 4"),
    ("ij", [(2, 3, 4)], "ShapeError", "name 2 dims"),
    ("ij,jk", [(2, 3)], "ArgumentValueError", "2 operand term"),
    ("ij->k", [(2, 3)], "ArgumentValueError", "output subscript 'k'"),
    ("i1", [(2, 3)], "ArgumentValueError", "invalid subscript '1'"),
    ("ii", [(1, 3)], "ShapeError", "a diagonal needs equal sizes"),
])
def test_einsum_errors_are_clear(equation, shapes, error, match):
    with pytest.raises(getattr(flow.errors, error), match=match):
        einsum(equation, *[flow.ones(*s) for s in shapes])


# --- conv2d(dilation=, groups=) ------------------------------------------------------------------------


def conv2d_reference(x, w, b, stride, padding, dilation, groups):
    """PyTorch's definition, as a loop: out[n, o, i, j] = b[o] + sum over the group's channels c and taps
    (p, q) of x_padded[n, g * C/groups + c, i * sh + p * dh, j * sw + q * dw] * w[o, c, p, q]."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    n, channels, height, width = x.shape
    filters, part, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, filters, oh, ow))
    per_group = filters // groups
    for o in range(filters):
        first = (o // per_group) * part
        for i in range(oh):
            for j in range(ow):
                window = xp[:, first:first + part, i * sh:i * sh + dh * (kh - 1) + 1:dh,
                            j * sw:j * sw + dw * (kw - 1) + 1:dw]
                out[:, o, i, j] = np.sum(window * w[o], axis=(1, 2, 3)) + (b[o] if b is not None else 0.0)
    return out


@st.composite
def conv_cases(draw):
    groups = draw(st.integers(1, 3), label="groups")
    part, per_group = draw(st.integers(1, 2), label="part"), draw(st.integers(1, 2), label="per_group")
    kh, kw = draw(st.integers(1, 3), label="kh"), draw(st.integers(1, 3), label="kw")
    dilation = (draw(st.integers(1, 3), label="dh"), draw(st.integers(1, 3), label="dw"))
    stride = (draw(st.integers(1, 2), label="sh"), draw(st.integers(1, 2), label="sw"))
    padding = (draw(st.integers(0, 2), label="ph"), draw(st.integers(0, 2), label="pw"))
    low_h, low_w = (max(1, d * (k - 1) + 1 - 2 * p) for d, k, p in zip(dilation, (kh, kw), padding))
    height = draw(st.integers(low_h, low_h + 3), label="H")   # at least one output row and column
    width = draw(st.integers(low_w, low_w + 3), label="W")
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    x = rng.uniform(-1, 1, (2, groups * part, height, width))
    w = rng.uniform(-1, 1, (groups * per_group, part, kh, kw))
    b = rng.uniform(-1, 1, groups * per_group) if draw(st.booleans(), label="bias") else None
    return x, w, b, stride, padding, dilation, groups


@FEW
@given(conv_cases())
def test_conv2d_dilation_groups_values_and_gradients(case):
    x, w, b, stride, padding, dilation, groups = case
    F = flow.nn.functional

    def ours(*t):
        return F.conv2d(t[0], t[1], t[2] if len(t) > 2 else None, stride, padding, dilation, groups)

    def theirs(*a):
        return conv2d_reference(a[0], a[1], a[2] if len(a) > 2 else None, stride, padding, dilation, groups)

    operands = [x, w] + ([b] if b is not None else [])
    np.testing.assert_allclose(ours(*[flow.tensor(a) for a in operands]).numpy(), theirs(*operands), rtol=1e-10,
                               atol=1e-12)
    check_grad(ours, theirs, *operands, rtol=1e-5, atol=1e-7)


def test_conv2d_module_with_groups_and_dilation_on_cuda():
    conv = flow.nn.Conv2d(4, 6, 3, padding="same", dilation=2, groups=2, device="cuda")
    assert tuple(conv.weight.shape) == (6, 2, 3, 3)
    assert repr(conv) == "Conv2d(4, 6, kernel_size=(3, 3), stride=(1, 1), padding=(2, 2), dilation=(2, 2), groups=2)"
    x = np.random.default_rng(0).uniform(-1, 1, (1, 4, 5, 5)).astype(np.float32)
    leaf = flow.tensor(x, device="cuda", requires_grad=True)
    out = conv(leaf)
    w, b = conv.weight.detach().numpy().astype(np.float64), conv.bias.detach().numpy().astype(np.float64)
    np.testing.assert_allclose(out.numpy(), conv2d_reference(x, w, b, (1, 1), (2, 2), (2, 2), 2), rtol=1e-5,
                               atol=1e-5)
    out.sum().backward()
    assert leaf.grad.shape == leaf.shape and conv.weight.grad.shape == conv.weight.shape
    bound = 1 / np.sqrt(2 * 9)   # fan_in = in_channels / groups * kH * kW
    assert np.abs(conv.bias.detach().numpy()).max() <= bound


def test_conv2d_groups_errors():
    with pytest.raises(flow.errors.ArgumentValueError, match="divisible by groups"):
        flow.nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(flow.errors.ShapeError, match="given groups=2"):
        flow.nn.functional.conv2d(flow.ones(1, 3, 4, 4), flow.ones(4, 2, 1, 1), groups=2)
    with pytest.raises(flow.errors.ArgumentValueError, match="dilation must be a positive"):
        flow.nn.functional.conv2d(flow.ones(1, 2, 4, 4), flow.ones(4, 2, 1, 1), dilation=0)


# --- nn.GRU --------------------------------------------------------------------------------------------


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def gru_reference(x, h0, params, num_layers, bidirectional):
    """PyTorch's GRU equations over (L, N, I), from its parameters by name; returns (output, h_n)."""
    directions = 2 if bidirectional else 1
    layer_input, finals = x, []
    for layer in range(num_layers):
        outputs = []
        for d in range(directions):
            suffix = f"_l{layer}" + ("_reverse" if d else "")
            w_ih, w_hh = params["weight_ih" + suffix], params["weight_hh" + suffix]
            b_ih = params.get("bias_ih" + suffix, np.zeros(w_ih.shape[0]))
            b_hh = params.get("bias_hh" + suffix, np.zeros(w_hh.shape[0]))
            h = h0[layer * directions + d]
            out = [None] * len(layer_input)
            for t in (reversed(range(len(layer_input))) if d else range(len(layer_input))):
                gi, gh = layer_input[t] @ w_ih.T + b_ih, h @ w_hh.T + b_hh
                i_r, i_z, i_n = np.split(gi, 3, axis=-1)
                h_r, h_z, h_n = np.split(gh, 3, axis=-1)
                r, z = _sigmoid(i_r + h_r), _sigmoid(i_z + h_z)
                n = np.tanh(i_n + r * h_n)
                h = (1 - z) * n + z * h
                out[t] = h
            outputs.append(np.stack(out))
            finals.append(h)
        layer_input = np.concatenate(outputs, axis=-1)
    return layer_input, np.stack(finals)


@FEW
@given(layers=st.integers(1, 2), bidirectional=st.booleans(), batch_first=st.booleans(), bias=st.booleans(),
       given_h0=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_gru_matches_pytorchs_equations(layers, bidirectional, batch_first, bias, given_h0, seed):
    rng = np.random.default_rng(seed)
    gru = flow.nn.GRU(3, 2, num_layers=layers, bias=bias, batch_first=batch_first, bidirectional=bidirectional,
                      dtype=flow.float64)
    params = {name: p.detach().numpy() for name, p in gru.named_parameters()}
    suffix = "_l0"
    assert params["weight_ih" + suffix].shape == (6, 3) and params["weight_hh" + suffix].shape == (6, 2)
    directions = 2 if bidirectional else 1
    x = rng.uniform(-1, 1, (4, 2, 3))   # (L, N, I)
    h0 = rng.uniform(-1, 1, (layers * directions, 2, 2)) if given_h0 else np.zeros((layers * directions, 2, 2))
    expected_out, expected_h = gru_reference(x, h0, params, layers, bidirectional)
    leaf = flow.tensor(x.transpose(1, 0, 2) if batch_first else x, requires_grad=True)
    out, h_n = gru(leaf, flow.tensor(h0) if given_h0 else None)
    got = out.numpy().transpose(1, 0, 2) if batch_first else out.numpy()
    np.testing.assert_allclose(got, expected_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(h_n.numpy(), expected_h, rtol=1e-10, atol=1e-12)
    (out.sum() + h_n.sum()).backward()
    assert leaf.grad.shape == leaf.shape and all(p.grad is not None for p in gru.parameters())


def test_gru_gradient_and_unbatched_input():
    gru = flow.nn.GRU(2, 2, dtype=flow.float64)
    params = {name: p.detach().numpy() for name, p in gru.named_parameters()}
    x = np.random.default_rng(2).uniform(-1, 1, (3, 2))   # unbatched (L, I)

    def numpy_f(a):
        out, _ = gru_reference(a[:, None], np.zeros((1, 1, 2)), params, 1, False)
        return out[:, 0]
    check_grad(lambda t: gru(t)[0], numpy_f, x)
    out, h_n = gru(flow.tensor(x))
    assert out.shape == (3, 2) and h_n.shape == (1, 2)
    assert repr(flow.nn.GRU(3, 4, num_layers=2, batch_first=True)) == "GRU(3, 4, num_layers=2, batch_first=True)"
    with pytest.raises(flow.errors.ShapeError, match="h_0 must have shape"):
        gru(flow.ones(3, 1, 2, dtype=flow.float64), flow.ones(2, 1, 2, dtype=flow.float64))


def test_gru_on_cuda():
    gru = flow.nn.GRU(2, 3, device="cuda")
    params = {name: p.detach().numpy().astype(np.float64) for name, p in gru.named_parameters()}
    x = np.random.default_rng(3).uniform(-1, 1, (2, 1, 2)).astype(np.float32)
    out, h_n = gru(flow.tensor(x, device="cuda"))
    expected_out, expected_h = gru_reference(x.astype(np.float64), np.zeros((1, 1, 3)), params, 1, False)
    np.testing.assert_allclose(out.numpy(), expected_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_n.numpy(), expected_h, rtol=1e-5, atol=1e-6)


# --- unique(dim=) --------------------------------------------------------------------------------------


def unique_dim_reference(a: np.ndarray, dim: int):
    """PyTorch's definition: the distinct slices along ``dim`` in lexicographic order, each slice's index
    among them, and each distinct slice's count (by tuples, without numpy's unique)."""
    slices = [tuple(np.take(a, i, axis=dim).reshape(-1).tolist()) for i in range(a.shape[dim])]
    distinct = sorted(set(slices))
    inverse = np.array([distinct.index(s) for s in slices], np.int64)
    counts = np.array([slices.count(s) for s in distinct], np.int64)
    values = np.stack([np.take(a, slices.index(s), axis=dim) for s in distinct], axis=dim)
    return values, inverse, counts


@FEW
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), seed=st.integers(0, 2**31 - 1),
       dtype=st.sampled_from([np.int64, np.float32]), data=st.data())
def test_unique_dim_matches_pytorchs_definition(shape, seed, dtype, data):
    a = np.random.default_rng(seed).integers(0, 2, shape).astype(dtype)   # few values: repeated slices
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    values, inverse, counts = unique_dim_reference(a, dim % a.ndim)
    got = flow.unique(flow.tensor(a), dim=dim, return_inverse=True, return_counts=True)
    for g, expected in zip(got, (values, inverse, counts)):
        np.testing.assert_array_equal(g.numpy(), expected)
    assert got[0].dtype == dtype and got[1].dtype == flow.int64 and got[2].dtype == flow.int64
    np.testing.assert_array_equal(flow.tensor(a).unique(dim=dim).numpy(), values)


def test_unique_dim_on_cuda_and_its_errors():
    x = flow.tensor([[1, 2], [0, 5], [1, 2]], device="cuda")
    values, inverse = flow.unique(x, dim=0, return_inverse=True)
    assert values.is_cuda and values.tolist() == [[0, 5], [1, 2]] and inverse.tolist() == [1, 0, 1]
    with pytest.raises(flow.errors.ShapeError, match="0-d tensor"):
        flow.unique(flow.tensor(1.0), dim=0)
    with pytest.raises(flow.errors.AxisError):
        flow.unique(flow.zeros(2, 2), dim=2)
