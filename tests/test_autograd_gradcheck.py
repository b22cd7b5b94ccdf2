"""Every differentiable op's backward rule against numerical gradients (float64, central differences).

For a function ``f`` of some leaves and a random weight ``w`` of ``f``'s shape, the
loss is ``L = sum(f(leaves) * w)``; autograd's ``leaf.grad`` must equal

    (L(leaf + eps * e_i) - L(leaf - eps * e_i)) / (2 eps)   for every element i    (on cpu)

and on cuda (the simulator: every forward is many kernel launches) the cheaper
directional form, ``<grad, v> == (L(x + eps v) - L(x - eps v)) / (2 eps)`` for
random directions ``v`` (PyTorch's "fast" gradcheck).

hypothesis draws the shapes (broadcasting pairs included), the values (kept away
from kinks: ``abs``/``relu`` at 0, ties of ``max``, the bounds of ``clamp``), and
how each operand is made from its leaf: the leaf itself, a transposed view, or a
slice of a larger leaf, so the view rules are checked along the way.  A second
property chains random ops into small programs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow

F = flow.nn.functional
EPS = 1e-6


# --- the check --------------------------------------------------------------------------------------------


def _loss(f, arrays, views, w, device):
    with flow.no_grad():
        leaves = [flow.tensor(a, device=device) for a in arrays]
        out = f(*[view(x) for view, x in zip(views, leaves)])
        return float((out * flow.tensor(w, device=device)).sum().item())


def _analytic(f, arrays, views, w, device):
    leaves = [flow.tensor(a, device=device, requires_grad=True) for a in arrays]
    out = f(*[view(x) for view, x in zip(views, leaves)])
    assert out.requires_grad, "the result does not require grad"
    (out * flow.tensor(w, device=device)).sum().backward()
    return [x.grad.numpy() if x.grad is not None else np.zeros_like(a) for x, a in zip(leaves, arrays)]


def check_gradients(f, arrays, views=None, device="cpu", seed=0, rtol=1e-6, atol=1e-7):
    """autograd's gradients of ``sum(f(*leaves) * w)`` equal central differences."""
    views = views or [lambda x: x] * len(arrays)
    rng = np.random.default_rng(seed)
    with flow.no_grad():
        shape = f(*[view(flow.tensor(a, device=device)) for view, a in zip(views, arrays)]).shape
    w = rng.standard_normal(shape)
    grads = _analytic(f, arrays, views, w, device)
    for k, (a, g) in enumerate(zip(arrays, grads)):
        assert g.shape == a.shape and g.dtype == a.dtype, f"input {k}: grad {g.dtype}{g.shape} for {a.dtype}{a.shape}"
        if device == "cpu":
            numeric = np.zeros_like(a)
            for i in np.ndindex(a.shape):
                plus, minus = [x.copy() for x in arrays], [x.copy() for x in arrays]
                plus[k][i] += EPS
                minus[k][i] -= EPS
                numeric[i] = (_loss(f, plus, views, w, device) - _loss(f, minus, views, w, device)) / (2 * EPS)
            np.testing.assert_allclose(g, numeric, rtol=rtol, atol=atol, err_msg=f"gradient of input {k}")
        else:
            v = rng.standard_normal(a.shape)
            plus, minus = [x.copy() for x in arrays], [x.copy() for x in arrays]
            plus[k] += EPS * v
            minus[k] -= EPS * v
            numeric = (_loss(f, plus, views, w, device) - _loss(f, minus, views, w, device)) / (2 * EPS)
            assert math.isclose(float((g * v).sum()), numeric, rel_tol=rtol * 10, abs_tol=atol * 10), (
                f"input {k}: <grad, v> = {(g * v).sum()}, numerically {numeric}")


# --- how an operand is made from its leaf: itself, a transposed view, a slice ---------------------------------


def leaf_for(draw, shape):
    """(leaf shape, view: leaf -> operand of ``shape``)."""
    kind = draw(st.sampled_from(["leaf", "transposed", "sliced"])) if shape else "leaf"
    if kind == "transposed" and len(shape) >= 2:
        return shape[::-1], lambda x: x.permute(*reversed(range(x.ndim)))
    if kind == "sliced":
        return shape[:-1] + (shape[-1] + 2,), lambda x: x[..., 1:1 + shape[-1]]
    return shape, lambda x: x


side = st.integers(1, 3)
small_shapes = st.lists(side, min_size=0, max_size=3).map(tuple)
nonempty_shapes = st.lists(side, min_size=1, max_size=3).map(tuple)


@st.composite
def broadcast_pair(draw):
    """Two shapes that broadcast together (dims dropped from the front, or set to 1)."""
    a = draw(small_shapes)
    b = list(a[draw(st.integers(0, len(a))):])
    for d in range(len(b)):
        if draw(st.booleans()):
            b[d] = 1
    return (a, tuple(b)) if draw(st.booleans()) else (tuple(b), a)


def values(draw, shape, low=-2.0, high=2.0, away_from=(), gap=0.05, kind="uniform"):
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    x = rng.uniform(low, high, shape)
    for point in away_from:   # push values within ``gap`` of a kink away from it
        near = np.abs(x - point) < gap
        x[near] = point + np.where(x[near] >= point, gap, -gap)
    if kind == "fractional":   # piecewise constant ops: stay inside (n + 0.1, n + 0.4)
        x = np.floor(x) + rng.uniform(0.1, 0.4, shape)
    return np.asarray(x, dtype=np.float64)


def operands(draw, shapes, **kw):
    made = [leaf_for(draw, s) for s in shapes]
    arrays = []
    for (leaf_shape, view), shape in zip(made, shapes):
        arrays.append(values(draw, leaf_shape, **kw))
    return arrays, [view for _, view in made]


# --- every op, one case each --------------------------------------------------------------------------------

UNARY = {
    "neg": (lambda x: -x, {}), "abs": (flow.abs, {"away_from": (0.0,)}),
    "relu": (flow.relu, {"away_from": (0.0,)}), "sigmoid": (flow.sigmoid, {}), "tanh": (flow.tanh, {}),
    "exp": (flow.exp, {}), "log": (flow.log, {"low": 0.2}), "sqrt": (flow.sqrt, {"low": 0.2}),
    "sin": (flow.sin, {}), "cos": (flow.cos, {}),
    "floor": (flow.floor, {"kind": "fractional"}), "ceil": (flow.ceil, {"kind": "fractional"}),
    "round": (flow.round, {"kind": "fractional"}), "sign": (flow.sign, {"away_from": (0.0,)}),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@settings(max_examples=6)
@given(data=st.data())
def test_unary_op_gradients_match_numerical_gradients(name, data):
    f, kw = UNARY[name]
    shape = data.draw(small_shapes)
    arrays, views = operands(data.draw, [shape], **kw)
    check_gradients(f, arrays, views)


BINARY = {
    "add": (lambda a, b: a + b, {}), "sub": (lambda a, b: a - b, {}), "mul": (lambda a, b: a * b, {}),
    "div": (lambda a, b: a / b, {"low": 0.5}),
    "pow": (lambda a, b: a ** b, {"low": 0.5}),
    "maximum": (flow.maximum, {}), "minimum": (flow.minimum, {}),
    "remainder": (lambda a, b: a % b, {"low": 0.5}),
    "floor_divide": (lambda a, b: a // b, {"low": 0.5}),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@settings(max_examples=8)
@given(data=st.data())
def test_binary_op_gradients_with_broadcasting_match_numerical_gradients(name, data):
    f, kw = BINARY[name]
    shapes = data.draw(broadcast_pair())
    arrays, views = operands(data.draw, list(shapes), **kw)
    if name in ("maximum", "minimum"):   # no ties (the gradient is split there, not differentiable)
        arrays[1] = np.asarray(arrays[1] + 0.01 * np.sign(arrays[1] - arrays[0].mean()))
    if name in ("remainder", "floor_divide"):   # a / b away from integers (where % and // jump)
        a_view, b_view = views
        with flow.no_grad():
            quotient = (a_view(flow.tensor(arrays[0])) / b_view(flow.tensor(arrays[1]))).numpy()
        if np.any(np.abs(quotient - np.round(quotient)) < 0.01):
            return
    check_gradients(f, arrays, views)


@settings(max_examples=8)
@given(data=st.data())
def test_where_gradients_reach_both_branches(data):
    (a_shape, b_shape) = data.draw(broadcast_pair())
    cond_shape = data.draw(st.sampled_from([a_shape, b_shape]))
    condition = flow.tensor(values(data.draw, cond_shape) > 0)
    arrays, views = operands(data.draw, [a_shape, b_shape])
    check_gradients(lambda a, b: flow.where(condition, a, b), arrays, views)


@settings(max_examples=8)
@given(data=st.data(), which=st.sampled_from(["min", "max", "both"]), tensor_bounds=st.booleans())
def test_clamp_gradients_with_number_and_tensor_bounds(data, which, tensor_bounds):
    shape = data.draw(nonempty_shapes)
    arrays, views = operands(data.draw, [shape, shape, shape], away_from=(-0.5, 0.5), gap=0.05)
    arrays[1] = np.full(arrays[1].shape, -0.5) if not tensor_bounds else arrays[1] - 3.0   # low (below x)
    arrays[2] = np.full(arrays[2].shape, 0.5) if not tensor_bounds else arrays[2] + 3.0    # high (above x)
    if tensor_bounds:   # every third element: low decides, then high, then x
        arrays[1].flat[::3] += 4.0
        arrays[2].flat[1::3] -= 4.0

    def f(x, low, high):
        lo = low if tensor_bounds else -0.5
        hi = high if tensor_bounds else 0.5
        if which == "min":
            return flow.clamp(x, min=lo) + 0 * (low + high)
        if which == "max":
            return flow.clamp(x, max=hi) + 0 * (low + high)
        return flow.clamp(x, min=lo, max=hi)
    check_gradients(f, arrays, views)


REDUCTIONS = {
    "sum": lambda x, d: x.sum(dim=d), "mean": lambda x, d: x.mean(dim=d),
    "sum_keepdim": lambda x, d: x.sum(dim=d, keepdim=True),
    "max": lambda x, d: x.max() if d is None else x.max(dim=d).values,
    "min": lambda x, d: x.min() if d is None else x.min(dim=d).values,
    "softmax": lambda x, d: flow.softmax(x, dim=0 if d is None else d),
    "log_softmax": lambda x, d: flow.log_softmax(x, dim=-1 if d is None else d),
    "cumsum": lambda x, d: x.cumsum(0 if d is None else d),
    "var": lambda x, d: x.var(dim=d), "std": lambda x, d: x.std(dim=d),
    "norm": lambda x, d: x.norm(dim=d),
    "topk": lambda x, d: x.topk(min(2, x.shape[-1 if d is None else d]), dim=-1 if d is None else d).values,
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@settings(max_examples=6)
@given(data=st.data())
def test_reduction_gradients_match_numerical_gradients(name, data):
    shape = data.draw(nonempty_shapes.filter(lambda s: math.prod(s) >= 2))
    dim = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    if name in ("var", "std") and dim is not None and shape[dim] < 2:
        dim = None   # the unbiased variance of one element is NaN
    arrays, views = operands(data.draw, [shape])
    arrays[0] = arrays[0] + np.arange(arrays[0].size).reshape(arrays[0].shape) * 1e-2   # no ties
    check_gradients(lambda x: REDUCTIONS[name](x, dim), arrays, views, rtol=1e-5, atol=1e-6)


MATMUL_SHAPES = [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 2)), ((2, 3), (3, 2)), ((2, 2, 3), (3, 2)),
                 ((2, 3), (2, 3, 1)), ((2, 1, 2, 3), (2, 3, 2)), ((3,), (2, 3, 2))]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
@settings(max_examples=3)
@given(data=st.data())
def test_matmul_gradients_for_vectors_matrices_and_broadcast_batches(shapes, data):
    arrays, views = operands(data.draw, list(shapes))
    check_gradients(flow.matmul, arrays, views)


@settings(max_examples=8)
@given(m=st.integers(2, 5), k=st.integers(2, 5), n=st.integers(2, 5), batch=st.sampled_from([(), (2,)]),
       a_t=st.booleans(), b_t=st.booleans(), seed=st.integers(0, 2**16))
def test_a_column_major_matrix_gets_a_column_major_gradient_of_the_same_values(m, k, n, batch, a_t, b_t, seed):
    """As PyTorch's mm backward: the gradient of a transposed matrix (``linear``'s ``w.T``) is laid out as it is,
    so that the one reaching ``w`` is contiguous; the values are ``g @ b^T`` and ``a^T @ g`` either way."""
    rng = np.random.default_rng(seed)
    a_np = rng.standard_normal(batch + (m, k)) if not a_t or batch else rng.standard_normal((k, m)).T
    b_np = rng.standard_normal((n, k)).T if b_t else rng.standard_normal((k, n))
    g_np = rng.standard_normal(batch + (m, n))
    a_leaf = flow.tensor(a_np.T.copy() if a_t and not batch else a_np, dtype=flow.float64, requires_grad=True)
    b_leaf = flow.tensor(b_np.T.copy() if b_t else b_np, dtype=flow.float64, requires_grad=True)
    a = a_leaf.T if a_t and not batch else a_leaf
    b = b_leaf.T if b_t else b_leaf
    grad_a, grad_b = flow.autograd.grad(a.matmul(b), [a, b], flow.tensor(g_np))
    np.testing.assert_allclose(grad_a.numpy(), g_np @ b_np.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad_b.numpy(), (np.swapaxes(a_np, -1, -2) @ g_np).reshape(-1, k, n).sum(0),
                               rtol=1e-12, atol=1e-12)
    assert grad_a.stride() == a.stride()   # column-major (the transpose) or row-major, as the operand
    assert grad_b.stride() == b.stride()


def test_a_global_matrix_keeps_the_one_gradient_formula_on_every_rank():
    """Each rank would judge its own piece's layout: a global operand takes ``a^T @ g`` whatever its strides,
    so that every rank records the same ops."""
    from pyflow.ops.linalg import _column_major

    w = flow.randn(3, 4).to_global(placement=flow.placement("cpu", ranks=[0]), sbp=flow.sbp.broadcast)
    assert not _column_major(w.T) and _column_major(w.to_local().T)


@settings(max_examples=10)
@given(data=st.data())
def test_movement_and_indexing_gradients(data):
    shape = data.draw(st.lists(side, min_size=2, max_size=3).map(tuple))
    dim = data.draw(st.integers(0, len(shape) - 1))
    n = shape[dim]
    picks = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4))   # repeats allowed
    index = flow.tensor(picks)
    gather_index = flow.tensor(np.random.default_rng(len(picks)).integers(0, n, shape))
    other_shape = shape[:dim] + (2,) + shape[dim + 1:]
    source_shape = shape[:dim] + (len(picks),) + shape[dim + 1:]
    case = data.draw(st.sampled_from(["cat", "stack", "index_select", "gather", "index_add", "scatter_add",
                                      "index_copy", "getitem", "setitem", "narrow", "expand", "repeat"]))
    arrays, views = operands(data.draw, [shape, other_shape, source_shape, shape])
    fs = {
        "cat": lambda x, y, s, z: flow.cat([x, y, x], dim=dim),
        "stack": lambda x, y, s, z: flow.stack([x, z * 2], dim=dim),
        "index_select": lambda x, y, s, z: x.index_select(dim, index),
        "gather": lambda x, y, s, z: x.gather(dim, gather_index),
        "index_add": lambda x, y, s, z: x.index_add(dim, index, s),
        "scatter_add": lambda x, y, s, z: x.scatter_add(dim, gather_index, z),
        "index_copy": lambda x, y, s, z: x.index_copy(dim, flow.tensor(sorted(set(picks)))[:n],
                                                      s.narrow(dim, 0, len(set(picks)))),
        "getitem": lambda x, y, s, z: x[index] * x[..., 0:1] + x[-1],
        "setitem": _setitem_case(index),
        "narrow": lambda x, y, s, z: x.narrow(dim, n - 1, 1) * 3 + x.narrow(dim, 0, 1),
        "expand": lambda x, y, s, z: x.unsqueeze(0).expand(2, *shape) * z,
        "repeat": lambda x, y, s, z: x.repeat(*([2] + [1] * (len(shape) - 1))),
    }
    check_gradients(fs[case], arrays, views)


def _setitem_case(index):
    def f(x, y, s, z):
        out = x * 1.0
        out[index] = z[0] * 2.0 if z[0].ndim == out[index].ndim - 1 else z[0].sum() * 2.0
        out[0] = out[0] * 3.0
        return out
    return f


@settings(max_examples=6)
@given(data=st.data(), stride=st.integers(1, 2), padding=st.integers(0, 1), bias=st.booleans())
def test_conv2d_gradients_for_input_weight_and_bias(data, stride, padding, bias):
    n, c_in, c_out = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    h, w, k = data.draw(st.integers(2, 4)), data.draw(st.integers(2, 4)), data.draw(st.integers(1, 2))
    arrays, views = operands(data.draw, [(n, c_in, h, w), (c_out, c_in, k, k), (c_out,)])
    if bias:
        f = lambda x, weight, b: F.conv2d(x, weight, b, stride=stride, padding=padding)   # noqa: E731
    else:
        f = lambda x, weight, b: F.conv2d(x, weight, stride=stride, padding=padding) + 0 * b.sum()   # noqa: E731
    check_gradients(f, arrays, views)


@pytest.mark.parametrize("pool", ["max_pool2d", "avg_pool2d"])
@settings(max_examples=6)
@given(data=st.data(), kernel=st.integers(1, 2), stride=st.integers(1, 2), padding=st.integers(0, 1))
def test_pooling_gradients(pool, data, kernel, stride, padding):
    padding = min(padding, kernel // 2)
    shape = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)), data.draw(st.integers(2, 4)),
             data.draw(st.integers(2, 4)))
    arrays, views = operands(data.draw, [shape])
    arrays[0] = arrays[0] + np.arange(arrays[0].size).reshape(arrays[0].shape) * 1e-2   # no ties in a window
    check_gradients(lambda x: getattr(F, pool)(x, kernel, stride=stride, padding=padding), arrays, views)


def test_cast_and_copy_gradients_come_back_in_the_input_dtype_and_device():
    x = flow.tensor([1.0, 2.0], dtype=flow.float64, requires_grad=True)
    (x.float() * 3).sum().backward()
    assert x.grad.dtype == flow.float64 and x.grad.tolist() == [3.0, 3.0]
    y = flow.tensor([1.0, 2.0], requires_grad=True)
    (y.to("cuda") * flow.tensor([2.0, 5.0], device="cuda")).sum().backward()
    assert y.grad.device == y.device and y.grad.tolist() == [2.0, 5.0]


# --- random programs ------------------------------------------------------------------------------------------

PROGRAM_OPS = {
    "add": (2, lambda a, b: a + b), "mul": (2, lambda a, b: a * b), "sub": (2, lambda a, b: a - b),
    "div": (2, lambda a, b: a / (b * b + 1.0)), "maximum": (2, flow.maximum),
    "tanh": (1, flow.tanh), "sigmoid": (1, flow.sigmoid), "exp": (1, lambda a: (a * 0.3).exp()),
    "sin": (1, flow.sin), "square": (1, lambda a: a * a), "softmax": (1, lambda a: flow.softmax(a, dim=-1)),
    "sum_keep": (1, lambda a: a.sum(dim=-1, keepdim=True)), "mean0": (1, lambda a: a.mean(dim=0, keepdim=True)),
    "transpose": (1, lambda a: a.T.contiguous().T), "roll": (1, lambda a: flow.cat([a[1:], a[:1]], 0)),
    "matmul": (2, lambda a, b: a @ b.T / 3.0), "cat_narrow": (2, lambda a, b: flow.cat([a, b], 0).narrow(0, 1, 2)),
    "where": (2, lambda a, b: flow.where(a > b, a, b * 2.0)),
}


@settings(max_examples=12)
@given(data=st.data())
def test_random_programs_of_differentiable_ops_match_numerical_gradients(data):
    """A chain of random ops over a pool of (2, 2) values, all reused freely: the gradient of the whole."""
    steps = data.draw(st.lists(st.tuples(st.sampled_from(sorted(PROGRAM_OPS)), st.integers(0, 10),
                                         st.integers(0, 10)), min_size=1, max_size=6))
    arrays, views = operands(data.draw, [(2, 2), (2, 2), (2, 2)])

    def program(*xs):
        pool = list(xs)
        for name, i, j in steps:
            arity, op = PROGRAM_OPS[name]
            args = [pool[i % len(pool)], pool[j % len(pool)]][:arity]
            pool.append(op(*args))
        return pool[-1] + pool[0]
    check_gradients(program, arrays, views, rtol=1e-5, atol=1e-6)


# --- cuda (the simulator): the same rules, checked along random directions --------------------------------------


@settings(max_examples=4)
@given(data=st.data())
def test_gradients_on_cuda_match_directional_numerical_gradients(data):
    case = data.draw(st.sampled_from(["elementwise", "reduce", "matmul", "index", "conv"]))
    if case == "elementwise":
        shapes = list(data.draw(broadcast_pair()))
        f = lambda a, b: (a * b).tanh() + flow.maximum(a, b) / (b * b + 1.0)   # noqa: E731
    elif case == "reduce":
        shapes = [(2, 3), (1, 3)]
        f = lambda a, b: flow.log_softmax(a + b, dim=1).sum(dim=0) * a.max(dim=0).values   # noqa: E731
    elif case == "matmul":
        shapes = [(2, 3), (3, 2)]
        f = lambda a, b: (a @ b).relu() + 0.5 * (a @ b)   # noqa: E731
    elif case == "index":
        shapes = [(3, 2), (2, 2)]
        index = flow.tensor([2, 0, 2], device="cuda")
        f = lambda a, b: a.index_select(0, index) * 2.0 + flow.cat([a, b], 0)[1:4]   # noqa: E731
    else:
        shapes = [(1, 1, 3, 3), (1, 1, 2, 2)]
        f = lambda x, w: F.max_pool2d(F.conv2d(x, w, padding=1), 2)   # noqa: E731
    arrays, views = operands(data.draw, shapes)
    if case == "conv":
        arrays[0] = arrays[0] + np.arange(9).reshape(1, 1, 3, 3) * 0.1
    check_gradients(f, arrays, views, device="cuda", seed=data.draw(st.integers(0, 99)))
