"""conv2d / max_pool2d / avg_pool2d backward kernels (``kernels/conv_backward.py``, ``pool_backward.py``), both targets.

* The CPU twins equal PyTorch's autograd (``F.conv2d(...).backward(grad_y)`` and the
  pooling ops, ``count_include_pad=True``), computed in float64 from the same values:
  within 1e-10 (relative to the sum of |terms|) in float64, within a float32 rounding
  bound in float32.  Max pooling's choices (ties: the first maximum; NaNs: the last
  NaN; a window of -inf: its first element) are PyTorch's.
* cuda (the simulator) equals the CPU twin: bit for bit for pooling (the docstring's
  promise), within rounding for conv.
* float16 sums in float32 and rounds once: the float16 result is the float32 result
  of the same values, rounded to float16.
* Inputs and the written gradient come in random layouts (permuted, sliced with a
  step, broadcast inputs); gradients start as garbage, so every cell must be written.
* Bad shapes, arguments and dtypes raise ShapeError / DTypeError naming the op.

Shapes are tiny (N, C <= 2, H, W <= 5, kernel <= 3): the simulator is slow.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow.kernels.conv_backward  # noqa: F401  (registers the backward kernels)
import pyflow.kernels.pool_backward  # noqa: F401
from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.conv import conv2d_output_shape, pool2d_output_shape
from pyflow.kernels.layout import broadcast_view, permuted_view, sliced_view
from pyflow.kernels.registry import get_kernel
from tests.strategies import TARGETS, Operand, empty_on, operands, to_host

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
ALL_FLOATS = st.sampled_from([F16, F32, F64])


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


# --- the input space ------------------------------------------------------------------


@st.composite
def pairs(draw, values):
    """An int or an (h, w) pair, both spellings of the same argument."""
    h, w = draw(values), draw(values)
    return h if h == w and draw(st.booleans()) else (h, w)


@st.composite
def conv_problems(draw, max_side=5):
    """(x shape, weight shape, stride, padding): N, C <= 2, H, W <= max_side, kernel <= 3, output >= 1 x 1."""
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    padding = draw(pairs(st.integers(0, 1)))
    ph, pw = _pair(padding)
    h = draw(st.integers(max(1, kh - 2 * ph), max_side))
    w = draw(st.integers(max(1, kw - 2 * pw), max_side))
    c_in = draw(st.integers(1, 2))
    x_shape = (draw(st.integers(1, 2)), c_in, h, w)
    return x_shape, (draw(st.integers(1, 2)), c_in, kh, kw), draw(pairs(st.integers(1, 2))), padding


@st.composite
def pool_problems(draw, max_side=5):
    """(x shape, kernel_size, stride or None, padding <= kernel_size // 2)."""
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kernel_size = kh if kh == kw and draw(st.booleans()) else (kh, kw)
    ph, pw = draw(st.integers(0, kh // 2)), draw(st.integers(0, kw // 2))
    padding = ph if ph == pw and draw(st.booleans()) else (ph, pw)
    stride = draw(st.one_of(st.none(), pairs(st.integers(1, 2))))
    x_shape = (draw(st.integers(1, 2)), draw(st.integers(1, 2)),
               draw(st.integers(max(1, kh - 2 * ph), max_side)), draw(st.integers(max(1, kw - 2 * pw), max_side)))
    return x_shape, kernel_size, stride, padding


# What a max-pool input holds: distinct values, or many ties, or the special values.
PALETTES = {
    "distinct": None,
    "ties": [0.0, 1.0, 2.0],
    "all equal": [3.0],
    "all -inf": [-np.inf],
    "specials": [-np.inf, -1.0, 0.0, 1.0, np.inf, np.nan],
    "nans": [np.nan, 0.0, 1.0],
}


def palette_values(shape, dtype, palette, seed):
    rng = np.random.default_rng(seed)
    if PALETTES[palette] is None:
        return rng.uniform(-10, 10, shape).astype(dtype)
    return rng.choice(np.array(PALETTES[palette], dtype), shape)


@st.composite
def laid_out(draw, array):
    """An ``Operand`` holding ``array``'s values in a random layout: contiguous, permuted, or sliced
    with a step out of a larger array whose other cells are NaN (a kernel that reads them shows it)."""
    layout = draw(st.sampled_from(["contiguous", "permuted", "sliced"]))
    if layout == "permuted":
        perm = tuple(draw(st.permutations(range(array.ndim))))
        inverse = tuple(int(i) for i in np.argsort(perm))
        return Operand(np.ascontiguousarray(array.transpose(perm)), f"permuted {perm}",
                       lambda a: permuted_view(a, inverse))
    if layout == "sliced":
        base = np.full(tuple(2 * n + 1 for n in array.shape), np.nan, array.dtype)
        index = tuple(slice(1, 1 + 2 * n, 2) for n in array.shape)
        base[index] = array
        return Operand(base, "sliced", lambda a: sliced_view(a, index))
    return Operand(array.copy(), "contiguous", lambda a: a)


def gradient_views(shape, dtype):
    """Where a kernel writes a gradient: contiguous, permuted or a sliced view (``place`` fills it with garbage)."""
    return operands(shape, dtype, allow_broadcast=False)


def place(target, grad: Operand):
    """(view, storage) of ``grad`` on ``target``, its storage filled with garbage (0xCD bytes)."""
    base = grad.base.copy()
    base.reshape(-1).view(np.uint8).fill(0xCD)
    storage = base if target == "cpu" else cuda.to_device(base)
    return grad.view(storage), storage, base


# --- references: PyTorch autograd, float64 -------------------------------------------------


def _torch():
    return pytest.importorskip("torch", reason="the autograd references need torch (pip install -e '.[torch]')")


def torch_conv_grads(x, w, gy, stride, padding):
    """(grad_x, grad_w) of ``F.conv2d(x, w)`` for the upstream ``gy``, all in float64."""
    torch = _torch()
    xt = torch.tensor(np.asarray(x, np.float64), requires_grad=True)
    wt = torch.tensor(np.asarray(w, np.float64), requires_grad=True)
    torch.nn.functional.conv2d(xt, wt, stride=stride, padding=padding).backward(
        torch.tensor(np.asarray(gy, np.float64)))
    return xt.grad.numpy(), wt.grad.numpy()


def torch_pool_grad(mode, x, gy, kernel_size, stride, padding):
    """grad_x of max_pool2d / avg_pool2d (count_include_pad=True) for the upstream ``gy``, in float64."""
    torch = _torch()
    xt = torch.tensor(np.asarray(x, np.float64), requires_grad=True)
    F = torch.nn.functional
    if mode == "max":
        y = F.max_pool2d(xt, kernel_size, stride, padding)
    else:
        y = F.avg_pool2d(xt, kernel_size, stride, padding, count_include_pad=True)
    y.backward(torch.tensor(np.asarray(gy, np.float64)))
    return xt.grad.numpy()


# --- magnitudes (sums of |terms|, for rounding bounds), from the CPU twins in float64 ------


def conv_magnitudes(x, w, gy, stride, padding):
    """(sum of |terms| of grad_x, of grad_w), each element's: the backward of |x|, |w|, |gy|."""
    x, w, gy = (np.abs(np.asarray(a, np.float64)) for a in (x, w, gy))
    mx, mw = np.empty(x.shape), np.empty(w.shape)
    with np.errstate(all="ignore"):
        get_kernel("conv2d_backward_input", "cpu")(mx, gy, w, stride=stride, padding=padding)
        get_kernel("conv2d_backward_weight", "cpu")(mw, x, gy, stride=stride, padding=padding)
    return mx, mw


def pool_magnitude(x_shape, gy, kernel_size, stride, padding):
    """The sum of |grad_y| over the windows holding each element of x (bounds max and avg alike)."""
    m = np.empty(x_shape)
    get_kernel("avg_pool2d_backward", "cpu")(m, np.abs(np.asarray(gy, np.float64)), kernel_size=kernel_size,
                                             stride=stride, padding=padding)
    return m * math.prod(_pair(kernel_size))


def assert_within(actual, expected, magnitude, bound_per_magnitude, what, extra=None):
    """|actual - expected| <= bound_per_magnitude * magnitude (+ ``extra``, elementwise); NaN where expected is."""
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    bound = bound_per_magnitude * magnitude + np.finfo(np.float64).tiny
    if extra is not None:
        bound = bound + extra
    error = np.abs(actual.astype(np.float64) - expected)
    bad = ~((error <= bound) | (np.isnan(actual) & np.isnan(expected)) | (actual == expected))
    if bad.any():
        first = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {actual.size} values differ; first at {list(first)}: "
                             f"{actual[first]!r} vs {expected[first]!r} (allowed {bound[first]:g})")


def rounding_bound(dtype, terms):
    """Per unit of sum-of-|terms|: float64 to 1e-10, float32 to a few eps per term."""
    return 1e-10 if np.dtype(dtype) == F64 else 4 * (terms + 2) * np.finfo(dtype).eps


def assert_bit_equal(actual, expected, what):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, \
        f"{what}: {actual.shape} {actual.dtype} vs {expected.shape} {expected.dtype}"
    bits = np.dtype(f"u{actual.dtype.itemsize}")
    a, e = actual.view(bits), expected.view(bits)
    # NaN payloads may differ; every NaN counts as the same NaN
    same = (a == e) | (np.isnan(actual) & np.isnan(expected))
    if not same.all():
        first = tuple(np.argwhere(~same)[0])
        raise AssertionError(f"{what}: {int((~same).sum())} of {actual.size} values differ in their bits; first "
                             f"at {list(first)}: {actual[first]!r} vs {expected[first]!r}")


def conv_backward(target, x, w, gy, stride, padding, dtype, gx_op=None, gw_op=None):
    """(grad_x, grad_w) from the kernels on ``target`` (operands as Operands, gradients garbage-filled)."""
    run_x, run_w = get_kernel("conv2d_backward_input", target), get_kernel("conv2d_backward_weight", target)
    x_shape, w_shape = x.numpy().shape, w.numpy().shape
    if gx_op is None:
        gx = empty_on(target, x_shape, dtype)
    else:
        gx, _, _ = place(target, gx_op)
    if gw_op is None:
        gw = empty_on(target, w_shape, dtype)
    else:
        gw, _, _ = place(target, gw_op)
    run_x(gx, gy.on(target), w.on(target), stride=stride, padding=padding)
    run_w(gw, x.on(target), gy.on(target), stride=stride, padding=padding)
    return to_host(gx), to_host(gw)


def pool_backward(target, mode, x, gy, kernel_size, stride, padding, dtype, gx_op=None):
    if gx_op is None:
        gx = empty_on(target, x.numpy().shape, dtype)
    else:
        gx, _, _ = place(target, gx_op)
    if mode == "max":
        get_kernel("max_pool2d_backward", target)(gx, x.on(target), gy.on(target), kernel_size=kernel_size,
                                                  stride=stride, padding=padding)
    else:
        get_kernel("avg_pool2d_backward", target)(gx, gy.on(target), kernel_size=kernel_size, stride=stride,
                                                  padding=padding)
    return to_host(gx)


# --- CPU twins vs PyTorch autograd -----------------------------------------------------------


@settings(max_examples=25)
@given(data=st.data(), problem=conv_problems(), dtype=st.sampled_from([F32, F64]))
def test_conv2d_backward_cpu_equals_torch_autograd(data, problem, dtype):
    x_shape, w_shape, stride, padding = problem
    y_shape = conv2d_output_shape(x_shape, w_shape, stride, padding)
    x = data.draw(operands(x_shape, dtype), label="x")
    w = data.draw(operands(w_shape, dtype), label="weight")
    gy = data.draw(operands(y_shape, dtype), label="grad_y")
    gx_op = data.draw(gradient_views(x_shape, dtype), label="grad_x")
    gw_op = data.draw(gradient_views(w_shape, dtype), label="grad_w")
    gx, gw = conv_backward("cpu", x, w, gy, stride, padding, dtype, gx_op, gw_op)
    ex, ew = torch_conv_grads(x.numpy(), w.numpy(), gy.numpy(), stride, padding)
    mx, mw = conv_magnitudes(x.numpy(), w.numpy(), gy.numpy(), stride, padding)
    what = (f"{dtype} x{x_shape} {x.layout} w{w_shape} {w.layout} grad_y {gy.layout} stride={stride} "
            f"padding={padding}")
    assert gx.dtype == dtype and gw.dtype == dtype
    assert_within(gx, ex, mx, rounding_bound(dtype, w_shape[0] * math.prod(w_shape[2:])), f"grad_x {what}")
    assert_within(gw, ew, mw, rounding_bound(dtype, x_shape[0] * math.prod(y_shape[2:])), f"grad_w {what}")


@settings(max_examples=40)
@given(data=st.data(), problem=pool_problems(), dtype=st.sampled_from([F32, F64]),
       mode=st.sampled_from(["max", "avg"]), palette=st.sampled_from(sorted(PALETTES)))
def test_pool2d_backward_cpu_equals_torch_autograd(data, problem, dtype, mode, palette):
    """Max pooling over ties, -inf windows and NaNs picks the element PyTorch picks."""
    x_shape, kernel_size, stride, padding = problem
    y_shape = pool2d_output_shape(x_shape, kernel_size, stride, padding)
    x = data.draw(laid_out(palette_values(x_shape, dtype, palette, data.draw(st.integers(0, 2**32 - 1)))),
                  label="x")
    gy = data.draw(operands(y_shape, dtype), label="grad_y")
    gx_op = data.draw(gradient_views(x_shape, dtype), label="grad_x")
    got = pool_backward("cpu", mode, x, gy, kernel_size, stride, padding, dtype, gx_op)
    expected = torch_pool_grad(mode, x.numpy(), gy.numpy(), kernel_size, stride, padding)
    magnitude = pool_magnitude(x_shape, gy.numpy(), kernel_size, stride, padding)
    what = (f"{mode}_pool2d_backward {dtype} {palette} x{x_shape} {x.layout} k={kernel_size} s={stride} "
            f"p={padding} grad_x {gx_op.layout}")
    assert got.dtype == dtype
    assert_within(got, expected, magnitude, rounding_bound(dtype, math.prod(_pair(kernel_size))), what)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", [
    # (name, x (1, 1, H, W), kernel_size, stride, padding)
    ("all equal, overlapping windows", np.ones((4, 4)), 3, 1, 1),
    ("all -inf: each window's first in-bounds element", np.full((4, 5), -np.inf), 3, 2, 1),
    ("-inf beside padding", np.array([[-np.inf, -np.inf], [-np.inf, 5.0]]), 3, 1, 1),
    ("two NaNs in a window: the last", np.array([[np.nan, 1.0, np.nan], [2.0, np.nan, 0.0]]), (2, 3), 1, 0),
    ("NaN beats +inf", np.array([[np.inf, np.nan], [np.inf, 1.0]]), 2, 1, 1),
    ("first of equal maxima, row by row", np.array([[0.0, 7.0, 7.0], [7.0, 7.0, 1.0]]), 2, 1, 0),
    ("rows and columns no window reaches get 0", np.arange(25.0).reshape(5, 5), 2, 2, 0),
])
def test_max_pool2d_backward_picks_what_torch_picks(target, case):
    """Exactly: every value is exact in float16, and grad_y holds small integers, so every sum is too."""
    name, x, kernel_size, stride, padding = case
    for dtype in (F16, F32, F64):
        xs = x.astype(dtype)[None, None]
        y_shape = pool2d_output_shape(xs.shape, kernel_size, stride, padding)
        gy = (np.arange(math.prod(y_shape)).reshape(y_shape) + 1).astype(dtype)
        got = pool_backward(target, "max", Operand(xs, "contiguous", lambda a: a),
                            Operand(gy, "contiguous", lambda a: a), kernel_size, stride, padding, dtype)
        expected = torch_pool_grad("max", xs, gy, kernel_size, stride, padding)
        np.testing.assert_array_equal(got, expected.astype(dtype), err_msg=f"{name} ({dtype}) on {target}")


def test_max_pool2d_backward_sends_each_window_to_one_element():
    """The gradients of grad_x add up to those of grad_y, NaNs and ties included (no window counted twice)."""
    x = np.array([[[[1.0, 1.0, np.nan, np.nan], [1.0, 1.0, 2.0, -np.inf], [-np.inf, -np.inf, 0.0, 0.0]]]])
    gy = np.ones(pool2d_output_shape(x.shape, 2, 1, 1))
    gx = np.empty_like(x)
    get_kernel("max_pool2d_backward", "cpu")(gx, x, gy, kernel_size=2, stride=1, padding=1)
    assert gx.sum() == gy.size and (gx >= 0).all()


# --- cuda (simulator) vs the CPU twins -------------------------------------------------------


@settings(max_examples=25)
@given(data=st.data(), problem=conv_problems(max_side=4), dtype=ALL_FLOATS)
def test_conv2d_backward_cuda_equals_the_cpu_twin(data, problem, dtype):
    x_shape, w_shape, stride, padding = problem
    y_shape = conv2d_output_shape(x_shape, w_shape, stride, padding)
    x = data.draw(operands(x_shape, dtype), label="x")
    w = data.draw(operands(w_shape, dtype), label="weight")
    gy = data.draw(operands(y_shape, dtype), label="grad_y")
    gx_op = data.draw(gradient_views(x_shape, dtype), label="grad_x")
    gw_op = data.draw(gradient_views(w_shape, dtype), label="grad_w")
    cx, cw = conv_backward("cpu", x, w, gy, stride, padding, dtype)
    gx, gw = conv_backward("cuda", x, w, gy, stride, padding, dtype, gx_op, gw_op)
    mx, mw = conv_magnitudes(x.numpy(), w.numpy(), gy.numpy(), stride, padding)
    acc = F32 if dtype == F16 else dtype
    what = f"{dtype} x{x_shape} {x.layout} w{w_shape} {w.layout} grad_y {gy.layout} s={stride} p={padding}"
    for got, twin, magnitude, terms, name in ((gx, cx, mx, w_shape[0] * math.prod(w_shape[2:]), "grad_x"),
                                              (gw, cw, mw, x_shape[0] * math.prod(y_shape[2:]), "grad_w")):
        assert got.dtype == dtype
        # float16: both round a float32 sum once, so they may differ by one float16 step
        step = np.spacing(np.abs(twin)).astype(np.float64) if dtype == F16 else None
        assert_within(got, twin.astype(np.float64), magnitude, 4 * (terms + 2) * np.finfo(acc).eps,
                      f"{name} {what} (cuda vs cpu)", extra=step)


@settings(max_examples=40)
@given(data=st.data(), problem=pool_problems(max_side=4), dtype=ALL_FLOATS, mode=st.sampled_from(["max", "avg"]),
       palette=st.sampled_from(sorted(PALETTES)))
def test_pool2d_backward_cuda_equals_the_cpu_twin_bit_for_bit(data, problem, dtype, mode, palette):
    x_shape, kernel_size, stride, padding = problem
    y_shape = pool2d_output_shape(x_shape, kernel_size, stride, padding)
    x = data.draw(laid_out(palette_values(x_shape, dtype, palette, data.draw(st.integers(0, 2**32 - 1)))),
                  label="x")
    gy = data.draw(operands(y_shape, dtype), label="grad_y")
    gx_op = data.draw(gradient_views(x_shape, dtype), label="grad_x")
    twin = pool_backward("cpu", mode, x, gy, kernel_size, stride, padding, dtype)
    got = pool_backward("cuda", mode, x, gy, kernel_size, stride, padding, dtype, gx_op)
    assert_bit_equal(got, twin, f"{mode}_pool2d_backward {dtype} {palette} x{x_shape} {x.layout} k={kernel_size} "
                                f"s={stride} p={padding} grad_x {gx_op.layout} (cuda vs cpu)")


@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=8)
@given(data=st.data(), problem=conv_problems(max_side=4))
def test_gradients_write_exactly_the_cells_of_a_strided_view(target, data, problem):
    x_shape, w_shape, stride, padding = problem
    dtype = F64
    y_shape = conv2d_output_shape(x_shape, w_shape, stride, padding)
    x, w = data.draw(operands(x_shape, dtype), label="x"), data.draw(operands(w_shape, dtype), label="weight")
    gy = data.draw(operands(y_shape, dtype), label="grad_y")
    ex, ew = conv_backward("cpu", x, w, gy, stride, padding, dtype)
    runs = {
        "grad_x": (x_shape, ex, lambda g: get_kernel("conv2d_backward_input", target)(
            g, gy.on(target), w.on(target), stride=stride, padding=padding)),
        "grad_w": (w_shape, ew, lambda g: get_kernel("conv2d_backward_weight", target)(
            g, x.on(target), gy.on(target), stride=stride, padding=padding)),
        "avg grad_x": (x_shape, None, lambda g: get_kernel("avg_pool2d_backward", target)(
            g, cuda.to_device(np.ones((x_shape[0], x_shape[1], 1, 1))) if target == "cuda"
            else np.ones((x_shape[0], x_shape[1], 1, 1)), kernel_size=x_shape[2:])),
    }
    for name, (shape, expected, run) in runs.items():
        grad = data.draw(operands(shape, dtype, allow_broadcast=False), label=name)
        view, storage, before = place(target, grad)
        run(view)
        if expected is None:
            expected = np.full(shape, 1 / math.prod(x_shape[2:]))
        np.testing.assert_allclose(to_host(view), expected, rtol=1e-12, atol=1e-12,
                                   err_msg=f"{name} into a {grad.layout} view on {target}")
        inside = np.zeros(before.shape, bool)
        grad.view(inside)[...] = True
        assert_bit_equal(to_host(storage)[~inside], before[~inside], f"{name}: cells outside the view changed")


# --- float16: sums in float32, rounded once ------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=8)
@given(data=st.data(), conv=conv_problems(max_side=4), pool=pool_problems(max_side=4))
def test_float16_is_the_float32_result_rounded_once(target, data, conv, pool):
    """Every backward on float16 operands equals the float32 backward on the same values, rounded to float16.

    On the CPU the conv twins' einsum is only reproducible for one layout, so the operands are contiguous
    there; cuda reads any layout the same way."""
    any_layout = target == "cuda"

    def draw(shape, label, palette="distinct"):
        values = palette_values(shape, F16, palette, data.draw(st.integers(0, 2**32 - 1), label=f"{label} seed"))
        return data.draw(laid_out(values), label=label) if any_layout else Operand(values, "contiguous",
                                                                                   lambda a: a)

    def widened(op: Operand) -> Operand:
        return Operand(op.base.astype(F32), op.layout, op.view)

    x_shape, w_shape, stride, padding = conv
    x, w = draw(x_shape, "x"), draw(w_shape, "weight")
    gy = draw(conv2d_output_shape(x_shape, w_shape, stride, padding), "grad_y")
    got = conv_backward(target, x, w, gy, stride, padding, F16)
    wide = conv_backward(target, widened(x), widened(w), widened(gy), stride, padding, F32)
    for name, g, e in zip(("grad_x", "grad_w"), got, wide):
        assert_bit_equal(g, e.astype(F16), f"conv2d {name} float16 x{x_shape} w{w_shape} s={stride} p={padding}")

    x_shape, kernel_size, stride, padding = pool
    x = draw(x_shape, "pool x", palette=data.draw(st.sampled_from(sorted(PALETTES)), label="palette"))
    gy = draw(pool2d_output_shape(x_shape, kernel_size, stride, padding), "pool grad_y")
    for mode in ("max", "avg"):
        got = pool_backward(target, mode, x, gy, kernel_size, stride, padding, F16)
        wide = pool_backward(target, mode, widened(x), widened(gy), kernel_size, stride, padding, F32)
        assert_bit_equal(got, wide.astype(F16), f"{mode}_pool2d float16 x{x_shape} k={kernel_size}")


@pytest.mark.parametrize("target", TARGETS)
def test_float16_sums_are_not_rounded_term_by_term(target):
    """2048 + 1 + 1 + 1: float16 steps are 2 there, so adding in float16 stays at 2048; float32 gives 2051,
    which rounds to 2052 (and 2051 / 4 = 512.75 to 513)."""
    on = (lambda a: a) if target == "cpu" else cuda.to_device
    gy = np.array([[[[2048, 1], [1, 1]]]], np.float16)

    grad_w = empty_on(target, (1, 1, 1, 1), np.float16)
    get_kernel("conv2d_backward_weight", target)(grad_w, on(np.ones((1, 1, 2, 2), np.float16)), on(gy))
    assert to_host(grad_w).item() == 2052

    grad_x = empty_on(target, (1, 1, 2, 2), np.float16)  # one output channel per weight: k=4 over 1x1 kernels
    get_kernel("conv2d_backward_input", target)(grad_x, on(gy.reshape(1, 4, 1, 1)),
                                                on(np.ones((4, 1, 2, 2), np.float16)))
    assert (to_host(grad_x) == 2052).all()

    grad_x = empty_on(target, (1, 1, 3, 3), np.float16)  # the centre is in all four 2x2 windows
    get_kernel("avg_pool2d_backward", target)(grad_x, on(gy), kernel_size=2, stride=1)
    assert to_host(grad_x)[0, 0, 1, 1] == 513

    grad_x = empty_on(target, (1, 1, 3, 3), np.float16)
    x = np.zeros((1, 1, 3, 3), np.float16)
    x[0, 0, 1, 1] = 1  # every window picks the centre
    get_kernel("max_pool2d_backward", target)(grad_x, on(x), on(gy), kernel_size=2, stride=1)
    assert to_host(grad_x)[0, 0, 1, 1] == 2052


# --- edge shapes ----------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_empty_batch_gives_a_zero_weight_gradient(target):
    """No batch elements: grad_x is empty and grad_w is all zeros (written, not left as garbage)."""
    on = (lambda a: a) if target == "cpu" else cuda.to_device
    x, gy = np.zeros((0, 2, 4, 4), np.float32), np.zeros((0, 3, 4, 4), np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    grad_w = empty_on(target, w.shape, np.float32)
    get_kernel("conv2d_backward_weight", target)(grad_w, on(x), on(gy), padding=1)
    assert (to_host(grad_w) == 0).all()
    grad_x = empty_on(target, x.shape, np.float32)
    get_kernel("conv2d_backward_input", target)(grad_x, on(gy), on(w), padding=1)
    get_kernel("max_pool2d_backward", target)(grad_x, on(x), on(np.zeros((0, 2, 2, 2), np.float32)), kernel_size=2)
    get_kernel("avg_pool2d_backward", target)(grad_x, on(np.zeros((0, 2, 2, 2), np.float32)), kernel_size=2)
    assert to_host(grad_x).shape == (0, 2, 4, 4)


@pytest.mark.parametrize("target", TARGETS)
def test_no_output_channels_give_a_zero_input_gradient(target):
    on = (lambda a: a) if target == "cpu" else cuda.to_device
    grad_x = empty_on(target, (1, 2, 3, 3), np.float64)
    get_kernel("conv2d_backward_input", target)(grad_x, on(np.zeros((1, 0, 3, 3))), on(np.zeros((0, 2, 1, 1))))
    assert (to_host(grad_x) == 0).all()


# --- bad input: a clear error, on both targets ---------------------------------------------


def _arrays(target, *shapes_and_dtypes):
    return [empty_on(target, shape, dtype) for shape, dtype in shapes_and_dtypes]


@pytest.mark.parametrize("target", TARGETS)
def test_conv2d_backward_refuses_bad_shapes_and_arguments(target):
    gin, gw = get_kernel("conv2d_backward_input", target), get_kernel("conv2d_backward_weight", target)
    f32 = np.float32

    def inp(gx_shape, gy_shape, w_shape, **kwargs):
        gin(*_arrays(target, (gx_shape, f32), (gy_shape, f32), (w_shape, f32)), **kwargs)

    def wgt(gw_shape, x_shape, gy_shape, **kwargs):
        gw(*_arrays(target, (gw_shape, f32), (x_shape, f32), (gy_shape, f32)), **kwargs)

    with pytest.raises(ShapeError, match=r"conv2d_backward_input: grad_y has shape \(1, 2, 4, 4\), "
                                         r"expected \(1, 2, 3, 3\)"):
        inp((1, 3, 5, 5), (1, 2, 4, 4), (2, 3, 3, 3))
    with pytest.raises(ShapeError, match=r"conv2d_backward_input: input \(1, 3, 5, 5\) has 3 channels but weight"):
        inp((1, 3, 5, 5), (1, 2, 3, 3), (2, 4, 3, 3))
    with pytest.raises(ShapeError, match=r"conv2d_backward_weight: grad_y has shape \(1, 3, 3, 3\), "
                                         r"expected \(1, 2, 3, 3\)"):
        wgt((2, 3, 3, 3), (1, 3, 5, 5), (1, 3, 3, 3))
    with pytest.raises(ShapeError, match=r"conv2d_backward_weight: input \(1, 2, 5, 5\) has 2 channels"):
        wgt((2, 3, 3, 3), (1, 2, 5, 5), (1, 2, 3, 3))
    with pytest.raises(ShapeError, match="conv2d_backward_weight: grad_y has shape .* stride 2, padding 1"):
        wgt((2, 3, 3, 3), (1, 3, 5, 5), (1, 2, 5, 5), stride=2, padding=1)
    with pytest.raises(ShapeError, match="conv2d_backward_input: input must be 4-D"):
        inp((3, 5, 5), (1, 2, 3, 3), (2, 3, 3, 3))
    with pytest.raises(ShapeError, match="conv2d_backward_weight: weight must be 4-D"):
        wgt((2, 3, 3), (1, 3, 5, 5), (1, 2, 3, 3))
    with pytest.raises(ShapeError, match="conv2d_backward_input: kernel .* larger than the padded input"):
        inp((1, 1, 2, 2), (1, 1, 1, 1), (1, 1, 5, 1))
    with pytest.raises(ShapeError, match="conv2d_backward_input: stride must be positive"):
        inp((1, 1, 5, 5), (1, 1, 3, 3), (1, 1, 3, 3), stride=(1, 0))
    with pytest.raises(ShapeError, match="conv2d_backward_weight: padding must be non-negative"):
        wgt((1, 1, 3, 3), (1, 1, 5, 5), (1, 1, 3, 3), padding=-1)
    with pytest.raises(ShapeError, match="conv2d_backward_input: stride must be an int or a pair"):
        inp((1, 1, 5, 5), (1, 1, 3, 3), (1, 1, 3, 3), stride=(1, 1, 1))
    w, gy = _arrays(target, ((2, 3, 3, 3), f32), ((1, 2, 3, 3), f32))
    with pytest.raises(ShapeError, match="conv2d_backward_input: grad_x is a broadcast view"):
        gin(broadcast_view(empty_on(target, (1, 1, 5, 5), f32), (1, 3, 5, 5)), gy, w)
    with pytest.raises(ShapeError, match="conv2d_backward_weight: grad_w is a broadcast view"):
        gw(broadcast_view(empty_on(target, (2, 3, 3, 1), f32), (2, 3, 3, 3)), empty_on(target, (1, 3, 5, 5), f32), gy)


@pytest.mark.parametrize("target", TARGETS)
def test_conv2d_backward_refuses_mixed_or_unsupported_dtypes(target):
    gin, gw = get_kernel("conv2d_backward_input", target), get_kernel("conv2d_backward_weight", target)
    shapes = ((1, 3, 5, 5), (1, 2, 3, 3), (2, 3, 3, 3))
    with pytest.raises(DTypeError, match="conv2d_backward_input: operands must share one dtype, got grad_x "
                                         "float32, grad_y float64, weight float32"):
        gin(*_arrays(target, *zip(shapes, (np.float32, np.float64, np.float32))))
    with pytest.raises(DTypeError, match="conv2d_backward_input: operands must share one dtype.*weight float16"):
        gin(*_arrays(target, *zip(shapes, (np.float32, np.float32, np.float16))))
    with pytest.raises(DTypeError, match="conv2d_backward_input: unsupported dtype int32 for grad_x; expected one "
                                         "of float16, float32, float64"):
        gin(*_arrays(target, *zip(shapes, (np.int32,) * 3)))
    with pytest.raises(DTypeError, match="conv2d_backward_weight: unsupported dtype bool for x"):
        gw(*_arrays(target, ((2, 3, 3, 3), np.float32), ((1, 3, 5, 5), np.bool_), ((1, 2, 3, 3), np.float32)))
    with pytest.raises(DTypeError, match="conv2d_backward_weight: operands must share one dtype.*x float64"):
        gw(*_arrays(target, ((2, 3, 3, 3), np.float32), ((1, 3, 5, 5), np.float64), ((1, 2, 3, 3), np.float32)))


@pytest.mark.parametrize("target", TARGETS)
def test_pool2d_backward_refuses_bad_shapes_arguments_and_dtypes(target):
    mx, avg = get_kernel("max_pool2d_backward", target), get_kernel("avg_pool2d_backward", target)
    f32 = np.float32

    def both(gx_shape, gy_shape, dtype=f32, x_shape=None, x_dtype=None, gy_dtype=None, **kwargs):
        gx, gy = _arrays(target, (gx_shape, dtype), (gy_shape, gy_dtype or dtype))
        x = empty_on(target, x_shape or gx_shape, x_dtype or dtype)
        return lambda: mx(gx, x, gy, **kwargs), lambda: avg(gx, gy, **kwargs)

    for op, run in zip(("max_pool2d_backward", "avg_pool2d_backward"), range(2)):
        def call(*args, **kwargs):
            both(*args, **kwargs)[run]()

        with pytest.raises(ShapeError, match=rf"{op}: grad_y has shape \(1, 2, 3, 3\), expected \(1, 2, 2, 2\) "
                                             r"\(the pooling output for input \(1, 2, 5, 5\), kernel_size 2"):
            call((1, 2, 5, 5), (1, 2, 3, 3), kernel_size=2)
        with pytest.raises(ShapeError, match=f"{op}: padding .* at most half the kernel size"):
            call((1, 1, 6, 6), (1, 1, 4, 4), kernel_size=(3, 2), stride=2, padding=(1, 2))
        with pytest.raises(ShapeError, match=f"{op}: kernel_size must be positive"):
            call((1, 1, 6, 6), (1, 1, 6, 6), kernel_size=0)
        with pytest.raises(ShapeError, match=f"{op}: kernel .* larger than the padded input"):
            call((1, 1, 2, 2), (1, 1, 1, 1), kernel_size=3)
        with pytest.raises(ShapeError, match=f"{op}: stride must be positive"):
            call((1, 1, 4, 4), (1, 1, 2, 2), kernel_size=2, stride=0)
        with pytest.raises(ShapeError, match=f"{op}: input must be 4-D"):
            call((2, 4, 4), (2, 2, 2), kernel_size=2)
        with pytest.raises(DTypeError, match=f"{op}: unsupported dtype int64 for grad_x"):
            call((1, 1, 4, 4), (1, 1, 2, 2), dtype=np.int64, kernel_size=2)
        with pytest.raises(DTypeError, match=f"{op}: operands must share one dtype, got grad_x float32, grad_y "
                                             "float64"):
            call((1, 1, 4, 4), (1, 1, 2, 2), gy_dtype=np.float64, kernel_size=2)
        gx = broadcast_view(empty_on(target, (1, 1, 1, 4), f32), (1, 1, 4, 4))
        gy = empty_on(target, (1, 1, 2, 2), f32)
        with pytest.raises(ShapeError, match=f"{op}: grad_x is a broadcast view"):
            mx(gx, empty_on(target, (1, 1, 4, 4), f32), gy, kernel_size=2) if run == 0 else avg(gx, gy, kernel_size=2)
    with pytest.raises(ShapeError, match=r"max_pool2d_backward: x has shape \(1, 1, 4, 5\), expected "
                                         r"\(1, 1, 4, 4\) \(grad_x's shape"):
        both((1, 1, 4, 4), (1, 1, 2, 2), x_shape=(1, 1, 4, 5), kernel_size=2)[0]()
    with pytest.raises(DTypeError, match="max_pool2d_backward: operands must share one dtype.*x float16"):
        both((1, 1, 4, 4), (1, 1, 2, 2), x_dtype=np.float16, kernel_size=2)[0]()


def test_cuda_backward_kernels_refuse_host_arrays():
    host = np.zeros((1, 1, 3, 3), np.float32)
    dev = cuda.to_device(host)
    with pytest.raises(DTypeError, match=r"conv2d_backward_input \(cuda\): expected device arrays"):
        get_kernel("conv2d_backward_input", "cuda")(dev, cuda.to_device(np.zeros((1, 1, 1, 1), np.float32)), host)
    with pytest.raises(DTypeError, match=r"conv2d_backward_weight \(cuda\): expected device arrays"):
        get_kernel("conv2d_backward_weight", "cuda")(host, dev, cuda.to_device(np.zeros((1, 1, 1, 1), np.float32)))
    with pytest.raises(DTypeError, match=r"max_pool2d_backward \(cuda\): expected device arrays"):
        get_kernel("max_pool2d_backward", "cuda")(dev, host, cuda.to_device(np.zeros((1, 1, 1, 1), np.float32)),
                                                  kernel_size=3)
    with pytest.raises(DTypeError, match=r"avg_pool2d_backward \(cuda\): expected device arrays"):
        get_kernel("avg_pool2d_backward", "cuda")(dev, np.zeros((1, 1, 1, 1), np.float32), kernel_size=3)
