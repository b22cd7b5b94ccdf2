"""conv2d, max_pool2d and avg_pool2d on both targets equal naive loops (PyTorch semantics).

The references below are written with explicit loops over every output element and
every window position, in float64, independent of ``kernels/conv.py`` (they compute
their own output sizes).  Inputs have random layouts (permuted, sliced, broadcast).
A float32 sum may cancel, so sums are compared within a rounding bound that scales
with the sum of |terms| (which the reference also returns), not with the result.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow.kernels.conv  # noqa: F401  (registers conv2d, max_pool2d, avg_pool2d)
from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.conv import conv2d_output_shape, pool2d_output_shape
from pyflow.kernels.layout import broadcast_view, permuted_view
from pyflow.kernels.registry import get_kernel
from tests.strategies import TARGETS, assert_close, empty_on, float_dtypes, operands, to_host

# --- independent references: explicit loops, float64 ----------------------------------


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def naive_conv2d(x, w, b, stride, padding):
    """(result, sum of |terms|) of a zero-padded cross-correlation, plus bias."""
    (n_, c_in, h_, w_), (c_out, _, kh, kw) = x.shape, w.shape
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    result = np.zeros((n_, c_out, (h_ + 2 * ph - kh) // sh + 1, (w_ + 2 * pw - kw) // sw + 1))
    size = np.zeros_like(result)
    for n, co, ho, wo in np.ndindex(result.shape):
        total = 0.0 if b is None else float(b[co])
        magnitude = abs(total)
        for ci, i, j in np.ndindex(c_in, kh, kw):
            row, col = ho * sh - ph + i, wo * sw - pw + j
            if 0 <= row < h_ and 0 <= col < w_:  # outside: zero padding adds nothing
                term = float(x[n, ci, row, col]) * float(w[co, ci, i, j])
                total += term
                magnitude += abs(term)
        result[n, co, ho, wo], size[n, co, ho, wo] = total, magnitude
    return result, size


def naive_pool2d(x, kernel_size, stride, padding, mode):
    """(result, sum of |terms|): max (padding is -inf) or mean over kH*kW (padding is 0)."""
    n_, c_, h_, w_ = x.shape
    (kh, kw), (ph, pw) = _pair(kernel_size), _pair(padding)
    sh, sw = _pair(kernel_size if stride is None else stride)
    result = np.zeros((n_, c_, (h_ + 2 * ph - kh) // sh + 1, (w_ + 2 * pw - kw) // sw + 1))
    size = np.zeros_like(result)
    for n, c, ho, wo in np.ndindex(result.shape):
        window = []
        for i, j in np.ndindex(kh, kw):
            row, col = ho * sh - ph + i, wo * sw - pw + j
            inside = 0 <= row < h_ and 0 <= col < w_
            window.append(float(x[n, c, row, col]) if inside else (-math.inf if mode == "max" else 0.0))
        if mode == "max":
            result[n, c, ho, wo] = math.nan if any(map(math.isnan, window)) else max(window)
        else:
            result[n, c, ho, wo] = sum(window) / (kh * kw)
            size[n, c, ho, wo] = sum(map(abs, window)) / (kh * kw)
    return result, size


def assert_close_to_sum(actual, expected, magnitude, dtype, terms: int, what: str = "") -> None:
    """|actual - expected| within the rounding error of a ``terms``-term sum in ``dtype``."""
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    bound = 2 * (terms + 2) * np.finfo(dtype).eps * magnitude + np.finfo(dtype).tiny
    error = np.abs(actual.astype(np.float64) - expected)
    bad = ~(error <= bound)
    if bad.any():
        first = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {actual.size} values differ ({dtype}, shape "
                             f"{actual.shape}); first at {list(first)}: {actual[first]!r} vs "
                             f"{expected[first]!r} (allowed {bound[first]:g})")


# --- the input space ------------------------------------------------------------------

sides = st.integers(1, 7)


@st.composite
def pairs(draw, values):
    """An int or an (h, w) pair, both spellings of the same argument."""
    h, w = draw(values), draw(values)
    return h if h == w and draw(st.booleans()) else (h, w)


@st.composite
def conv_problems(draw):
    """(x shape, weight shape, stride, padding) with an output of at least 1 x 1."""
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = draw(pairs(st.integers(0, 1)))
    ph, pw = _pair(padding)
    h, w = draw(st.integers(max(1, kernel[0] - 2 * ph), 7)), draw(st.integers(max(1, kernel[1] - 2 * pw), 7))
    c_in = draw(st.integers(1, 3))
    x_shape = (draw(st.integers(1, 2)), c_in, h, w)
    return x_shape, (draw(st.integers(1, 3)), c_in, *kernel), draw(pairs(st.integers(1, 2))), padding


@st.composite
def pool_problems(draw):
    """(x shape, kernel_size, stride or None, padding <= kernel_size // 2)."""
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kernel_size = kh if kh == kw and draw(st.booleans()) else (kh, kw)
    ph, pw = draw(st.integers(0, kh // 2)), draw(st.integers(0, kw // 2))
    padding = ph if ph == pw and draw(st.booleans()) else (ph, pw)
    stride = draw(st.one_of(st.none(), pairs(st.integers(1, 2))))
    x_shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)),
               draw(st.integers(max(1, kh - 2 * ph), 7)), draw(st.integers(max(1, kw - 2 * pw), 7)))
    return x_shape, kernel_size, stride, padding


# --- results ----------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), problem=conv_problems(), dtype=float_dtypes, with_bias=st.booleans())
def test_conv2d_equals_naive_loops(target, data, problem, dtype, with_bias):
    x_shape, w_shape, stride, padding = problem
    x = data.draw(operands(x_shape, dtype), label="x")
    w = data.draw(operands(w_shape, dtype), label="weight")
    b = data.draw(operands((w_shape[0],), dtype), label="bias") if with_bias else None
    expected, magnitude = naive_conv2d(x.numpy(), w.numpy(), None if b is None else b.numpy(), stride, padding)
    out = empty_on(target, expected.shape, dtype)
    get_kernel("conv2d", target)(out, x.on(target), w.on(target), None if b is None else b.on(target),
                                 stride=stride, padding=padding)
    what = (f"conv2d {dtype} x{x_shape} {x.layout} w{w_shape} {w.layout} bias={b is not None} "
            f"stride={stride} padding={padding} on {target}")
    assert_close_to_sum(to_host(out), expected, magnitude, dtype, terms=math.prod(w_shape[1:]) + 1, what=what)


@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=10)
@given(data=st.data(), problem=conv_problems(), dtype=float_dtypes)
def test_conv2d_writes_exactly_the_cells_of_a_strided_output_view(target, data, problem, dtype):
    x_shape, w_shape, stride, padding = problem
    x, w = data.draw(operands(x_shape, dtype), label="x"), data.draw(operands(w_shape, dtype), label="weight")
    expected, magnitude = naive_conv2d(x.numpy(), w.numpy(), None, stride, padding)
    out = data.draw(operands(expected.shape, dtype, allow_broadcast=False), label="out")
    storage = out.base.copy() if target == "cpu" else cuda.to_device(out.base)
    view = out.view(storage)
    get_kernel("conv2d", target)(view, x.on(target), w.on(target), None, stride=stride, padding=padding)
    assert_close_to_sum(to_host(view), expected, magnitude, dtype, terms=math.prod(w_shape[1:]),
                        what=f"conv2d into a {out.layout} output on {target}")
    after = to_host(storage)
    inside = np.zeros(out.base.shape, bool)
    out.view(inside)[...] = True
    np.testing.assert_array_equal(after[~inside], out.base[~inside], err_msg="cells outside the view changed")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), problem=pool_problems(), dtype=float_dtypes)
def test_max_pool2d_equals_naive_loops_with_padding_as_minus_inf(target, data, problem, dtype):
    x_shape, kernel_size, stride, padding = problem
    x = data.draw(operands(x_shape, dtype), label="x")
    expected, _ = naive_pool2d(x.numpy(), kernel_size, stride, padding, "max")
    out = empty_on(target, expected.shape, dtype)
    get_kernel("max_pool2d", target)(out, x.on(target), kernel_size=kernel_size, stride=stride, padding=padding)
    assert_close(to_host(out), expected.astype(dtype),
                 what=f"max_pool2d {dtype} x{x_shape} {x.layout} k={kernel_size} s={stride} p={padding} on {target}")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), problem=pool_problems(), dtype=float_dtypes)
def test_avg_pool2d_equals_naive_loops_counting_padding_in_the_divisor(target, data, problem, dtype):
    x_shape, kernel_size, stride, padding = problem
    x = data.draw(operands(x_shape, dtype), label="x")
    expected, magnitude = naive_pool2d(x.numpy(), kernel_size, stride, padding, "avg")
    out = empty_on(target, expected.shape, dtype)
    get_kernel("avg_pool2d", target)(out, x.on(target), kernel_size=kernel_size, stride=stride, padding=padding)
    what = f"avg_pool2d {dtype} x{x_shape} {x.layout} k={kernel_size} s={stride} p={padding} on {target}"
    assert_close_to_sum(to_host(out), expected, magnitude, dtype, terms=math.prod(_pair(kernel_size)), what=what)


@pytest.mark.parametrize("target", TARGETS)
@settings(max_examples=10)
@given(problem=pool_problems(), dtype=float_dtypes, where=st.integers(0, 10**6))
def test_max_pool2d_propagates_nan(target, problem, dtype, where):
    x_shape, kernel_size, stride, padding = problem
    x = np.arange(math.prod(x_shape), dtype=dtype).reshape(x_shape)
    x.reshape(-1)[where % x.size] = np.nan
    expected, _ = naive_pool2d(x, kernel_size, stride, padding, "max")
    out = empty_on(target, expected.shape, dtype)
    get_kernel("max_pool2d", target)(out, x if target == "cpu" else cuda.to_device(x),
                                     kernel_size=kernel_size, stride=stride, padding=padding)
    assert_close(to_host(out), expected.astype(dtype), what=f"max_pool2d with a NaN on {target}")


@pytest.mark.parametrize("target", TARGETS)
def test_empty_batch_gives_an_empty_output(target):
    x, w = empty_on(target, (0, 2, 4, 4), np.float32), empty_on(target, (3, 2, 3, 3), np.float32)
    out = empty_on(target, (0, 3, 4, 4), np.float32)
    get_kernel("conv2d", target)(out, x, w, None, padding=1)
    get_kernel("max_pool2d", target)(empty_on(target, (0, 2, 2, 2), np.float32), x, kernel_size=2)
    assert to_host(out).shape == (0, 3, 4, 4)


def test_output_shape_helpers_follow_pytorch_on_resnet_layers():
    assert conv2d_output_shape((64, 3, 224, 224), (64, 3, 7, 7), stride=2, padding=3) == (64, 64, 112, 112)
    assert pool2d_output_shape((64, 64, 112, 112), kernel_size=3, stride=2, padding=1) == (64, 64, 56, 56)
    assert conv2d_output_shape((1, 64, 56, 56), (64, 64, 3, 3), stride=1, padding=1) == (1, 64, 56, 56)
    assert conv2d_output_shape((1, 64, 56, 56), (128, 64, 1, 1), stride=2, padding=0) == (1, 128, 28, 28)
    assert conv2d_output_shape((1, 3, 5, 7), (2, 3, 2, 3), stride=(2, 1), padding=(1, 0)) == (1, 2, 3, 5)
    assert pool2d_output_shape((1, 512, 7, 7), kernel_size=7) == (1, 512, 1, 1)
    assert pool2d_output_shape((1, 1, 6, 5), kernel_size=(3, 2), stride=None, padding=(1, 1)) == (1, 1, 2, 3)


# --- bad input: a clear error before any launch, on both targets --------------------------


def _conv(target, x_shape, w_shape, out_shape, dtype=np.float32, w_dtype=None, **kwargs):
    x, w = empty_on(target, x_shape, dtype), empty_on(target, w_shape, w_dtype or dtype)
    get_kernel("conv2d", target)(empty_on(target, out_shape, dtype), x, w, None, **kwargs)


def _pool(op, target, x_shape, out_shape, dtype=np.float32, **kwargs):
    get_kernel(op, target)(empty_on(target, out_shape, dtype), empty_on(target, x_shape, dtype), **kwargs)


@pytest.mark.parametrize("target", TARGETS)
def test_channel_mismatch_is_a_shape_error(target):
    with pytest.raises(ShapeError, match=r"conv2d: input \(1, 3, 5, 5\) has 3 channels but weight"):
        _conv(target, (1, 3, 5, 5), (2, 4, 3, 3), (1, 2, 3, 3))


@pytest.mark.parametrize("target", TARGETS)
def test_kernel_larger_than_padded_input_is_a_shape_error(target):
    with pytest.raises(ShapeError, match="conv2d: kernel .* larger than the padded input"):
        _conv(target, (1, 1, 2, 5), (1, 1, 5, 1), (1, 1, 1, 5), padding=(1, 0))
    for op in ("max_pool2d", "avg_pool2d"):
        with pytest.raises(ShapeError, match=f"{op}: kernel .* larger than the padded input"):
            _pool(op, target, (1, 1, 2, 2), (1, 1, 1, 1), kernel_size=3, padding=0)


@pytest.mark.parametrize("target", TARGETS)
def test_bad_stride_or_padding_is_a_shape_error(target):
    with pytest.raises(ShapeError, match="conv2d: padding must be non-negative"):
        _conv(target, (1, 1, 5, 5), (1, 1, 3, 3), (1, 1, 1, 1), padding=-1)
    with pytest.raises(ShapeError, match="conv2d: stride must be positive"):
        _conv(target, (1, 1, 5, 5), (1, 1, 3, 3), (1, 1, 3, 3), stride=(1, 0))
    with pytest.raises(ShapeError, match="conv2d: stride must be an int or a pair"):
        _conv(target, (1, 1, 5, 5), (1, 1, 3, 3), (1, 1, 3, 3), stride=(1, 1, 1))
    for op in ("max_pool2d", "avg_pool2d"):
        with pytest.raises(ShapeError, match=f"{op}: padding .* at most half the kernel size"):
            _pool(op, target, (1, 1, 6, 6), (1, 1, 4, 4), kernel_size=(3, 2), stride=2, padding=(1, 2))
        with pytest.raises(ShapeError, match=f"{op}: kernel_size must be positive"):
            _pool(op, target, (1, 1, 6, 6), (1, 1, 6, 6), kernel_size=0)


@pytest.mark.parametrize("target", TARGETS)
def test_wrong_output_or_bias_is_refused(target):
    with pytest.raises(ShapeError, match=r"conv2d: output has shape \(1, 2, 4, 4\), expected \(1, 2, 3, 3\)"):
        _conv(target, (1, 3, 5, 5), (2, 3, 3, 3), (1, 2, 4, 4))
    with pytest.raises(ShapeError, match=r"max_pool2d: output has shape .* expected \(1, 3, 2, 2\)"):
        _pool("max_pool2d", target, (1, 3, 5, 5), (1, 3, 3, 3), kernel_size=2)
    x, w = empty_on(target, (1, 3, 5, 5), np.float32), empty_on(target, (2, 3, 3, 3), np.float32)
    with pytest.raises(ShapeError, match=r"conv2d: bias has shape \(3,\), expected \(2,\)"):
        get_kernel("conv2d", target)(empty_on(target, (1, 2, 3, 3), np.float32), x, w,
                                     empty_on(target, (3,), np.float32))
    with pytest.raises(ShapeError, match="broadcast view"):
        out = broadcast_view(empty_on(target, (1, 1, 3, 3), np.float32), (1, 2, 3, 3))
        get_kernel("conv2d", target)(out, x, w, None)
    with pytest.raises(ShapeError, match="must be 4-D"):
        _pool("avg_pool2d", target, (3, 5, 5), (3, 2, 2), kernel_size=2)


@pytest.mark.parametrize("target", TARGETS)
def test_non_float_or_mixed_dtypes_are_a_dtype_error(target):
    with pytest.raises(DTypeError, match="conv2d: unsupported dtype int32 for out"):
        _conv(target, (1, 1, 3, 3), (1, 1, 3, 3), (1, 1, 1, 1), dtype=np.int32)
    with pytest.raises(DTypeError, match="conv2d: operands must share one dtype.*weight float64"):
        _conv(target, (1, 1, 3, 3), (1, 1, 3, 3), (1, 1, 1, 1), w_dtype=np.float64)
    x, w = empty_on(target, (1, 1, 3, 3), np.float32), empty_on(target, (2, 1, 3, 3), np.float32)
    with pytest.raises(DTypeError, match="conv2d: operands must share one dtype.*bias float64"):
        get_kernel("conv2d", target)(empty_on(target, (1, 2, 1, 1), np.float32), x, w,
                                     empty_on(target, (2,), np.float64))
    with pytest.raises(DTypeError, match="conv2d: unsupported dtype float16 for out"):
        _conv(target, (1, 1, 3, 3), (1, 1, 3, 3), (1, 1, 1, 1), dtype=np.float16)
    for op in ("max_pool2d", "avg_pool2d"):
        with pytest.raises(DTypeError, match=f"{op}: unsupported dtype int64"):
            _pool(op, target, (1, 1, 4, 4), (1, 1, 2, 2), dtype=np.int64, kernel_size=2)
        with pytest.raises(DTypeError, match=f"{op}: unsupported dtype uint8"):
            _pool(op, target, (1, 1, 4, 4), (1, 1, 2, 2), dtype=np.uint8, kernel_size=2)
        with pytest.raises(DTypeError, match=f"{op}: operands must share one dtype"):
            get_kernel(op, target)(empty_on(target, (1, 1, 2, 2), np.float64),
                                   empty_on(target, (1, 1, 4, 4), np.float32), kernel_size=2)


def test_cuda_kernels_refuse_host_arrays():
    x, w = np.zeros((1, 1, 3, 3), np.float32), np.zeros((1, 1, 3, 3), np.float32)
    with pytest.raises(DTypeError, match="conv2d \\(cuda\\): expected device arrays"):
        get_kernel("conv2d", "cuda")(np.zeros((1, 1, 1, 1), np.float32), x, w, None)
    with pytest.raises(DTypeError, match="max_pool2d \\(cuda\\): expected device arrays"):
        get_kernel("max_pool2d", "cuda")(np.zeros((1, 1, 1, 1), np.float32), x, kernel_size=3)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("layer", [
    ((2, 3, 6, 6), (3, 3, 3, 3), 1, 1),          # ResNet 3x3 conv: more outputs than threads
    ((1, 3, 7, 6), (2, 3, 3, 3), 2, 1),          # strided 3x3 downsampling
    ((2, 2, 5, 5), (3, 2, 1, 1), 2, 0),          # 1x1 projection shortcut
])
def test_conv2d_resnet_like_layers_equal_naive_loops(target, layer):
    x_shape, w_shape, stride, padding = layer
    rng = np.random.default_rng(0)
    n, c, h, w = x_shape
    x_nhwc = rng.uniform(-1, 1, (n, h, w, c))  # channels-last storage, read as an NCHW view
    weight, bias = rng.uniform(-1, 1, w_shape), rng.uniform(-1, 1, w_shape[0])
    expected, magnitude = naive_conv2d(x_nhwc.transpose(0, 3, 1, 2), weight, bias, stride, padding)
    out = empty_on(target, expected.shape, np.float64)
    on = (lambda a: a) if target == "cpu" else cuda.to_device
    get_kernel("conv2d", target)(out, permuted_view(on(x_nhwc), (0, 3, 1, 2)), on(weight), on(bias),
                                 stride=stride, padding=padding)
    assert_close_to_sum(to_host(out), expected, magnitude, np.float64, terms=math.prod(w_shape[1:]) + 1,
                        what=f"conv2d {layer} on {target}")
