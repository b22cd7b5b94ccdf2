"""The user-facing API (``import pyflow as flow``) against numpy, on "cpu" and "cuda".

Each test states one property of the public surface: how ``flow.tensor`` picks
dtypes, what the factories make, the attributes, ``numpy()`` / ``item()`` /
``.to()``, operators and functions (values as numpy computes them, result dtypes
as PyTorch promotes), views (which share the storage of their base), and errors: bad input
raises at the call, before any instruction exists, with a message naming the
op, the shapes, dtypes and devices, and the VM stays usable afterwards.  A
kernel that fails on a worker surfaces as ``OpError`` at the next sync point.

"cuda" runs in pyflow's simulator on emulated asynchronous streams, so tensors
here stay tiny.  By topic, more in test_tensor_api_promotion.py (dtypes),
test_tensor_api_views.py (views, indexing), test_tensor_api_ops.py (math,
reductions, creation, nn.functional), test_tensor_api_inplace.py (in-place ops)
and test_bad_input.py (one row per bad input).
"""

from __future__ import annotations

import math
import time
import uuid

import numpy as np
import pytest

import pyflow as flow
from pyflow.device import DeviceType, ep
from pyflow.errors import (
    AxisError,
    DeviceError,
    DTypeError,
    IndexOutOfRangeError,
    OpError,
    PyflowError,
    ShapeError,
)
from pyflow.framework.op_registry import BROADCAST_ONLY, NO_BACKWARD, OP_REGISTRY, OpDef, TensorMeta, register_op
from tests.helpers_devices import cuda_devices
from tests.strategies import TARGETS, assert_close, to_host


@pytest.fixture(params=TARGETS)
def device(request) -> str:
    """Every test that takes ``device`` runs on "cpu" and on "cuda"."""
    return request.param


# --- helpers ---------------------------------------------------------------------------------


def arange(shape, dtype=np.float32, start=0.0) -> np.ndarray:
    """Distinct, exactly representable values of ``shape`` (easy to read in a failure)."""
    return (np.arange(math.prod(shape), dtype=np.float64) + start).reshape(shape).astype(dtype)


def overwrite(t: flow.Tensor, values) -> None:
    """Write ``values`` into ``t``'s memory in VM order (as ``flow.tensor`` fills a new tensor).

    A raw VM write, independent of pyflow's in-place ops (tested on their own in
    test_tensor_api_inplace.py): how a test changes a tensor's storage to see which
    other tensors share it.
    """
    values = np.ascontiguousarray(values, dtype=t.dtype)

    def fill(ep_stream, blob):
        target = blob.array()
        if blob.device.device_type is DeviceType.cuda:
            ep_stream.memcpy_h2d(target, values)
        else:
            target[...] = values

    flow.vm.run(lambda builder: builder.access_blob_by_callback(t._blob, fill, "mut", name="overwrite"))


def assert_vm_usable(device) -> None:
    """A correct op after an error still runs and gives the right answer."""
    x = flow.tensor([1.0, -2.0, 3.0], device=device)
    np.testing.assert_array_equal((flow.relu(x) * 2).numpy(), [2.0, 0.0, 6.0])


def rejected_at_the_call(error_type, call, *, op: str, tensors, device, extra=()):
    """``call()`` raises ``error_type`` itself, issues no instruction, and the message names
    the op, every tensor's shape and dtype, and the device; then the VM still works."""
    engine = flow.vm.get_vm().engine
    before = engine.received
    with pytest.raises(error_type) as info:
        call()
    message = str(info.value)
    assert isinstance(info.value, PyflowError)
    assert engine.received == before, f"a rejected call issued {engine.received - before} instruction(s)"
    assert op in message, f"the message does not name the op {op!r}: {message}"
    for t in tensors:
        shape_texts = (str(tuple(t.shape)), str(list(t.shape)))
        assert any(s in message for s in shape_texts), f"the message does not name shape {t.shape}: {message}"
        assert str(t.dtype) in message, f"the message does not name dtype {t.dtype}: {message}"
        assert str(t.device) in message, f"the message does not name device {t.device}: {message}"
    for text in extra:
        assert text in message, f"the message does not mention {text!r}: {message}"
    assert_vm_usable(device)
    return info.value


# --- making tensors --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool"])
def test_tensor_from_a_numpy_array_keeps_its_dtype_shape_and_values(device, dtype):
    array = arange((2, 3), dtype) if dtype != "bool" else np.array([[True, False, True], [False, False, True]])
    t = flow.tensor(array, device=device)
    assert t.dtype == np.dtype(dtype)
    assert t.shape == (2, 3)
    assert t.device == flow.device(device)
    result = t.numpy()
    assert result.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(result, array)


@pytest.mark.parametrize("data, dtype, shape", [
    (1.5, np.float32, ()),
    (7, np.int64, ()),
    (True, np.bool_, ()),
    ([1.0, 2.5], np.float32, (2,)),
    ([[1, 2, 3], [4, 5, 6]], np.int64, (2, 3)),
    ([[True], [False]], np.bool_, (2, 1)),
    ([[1, 2.5]], np.float32, (1, 2)),
], ids=["float", "int", "bool", "floats", "nested-ints", "nested-bools", "mixed"])
def test_tensor_from_python_data_takes_torch_default_dtypes(device, data, dtype, shape):
    t = flow.tensor(data, device=device)
    assert t.dtype == np.dtype(dtype)
    assert t.shape == shape and t.ndim == len(shape)
    np.testing.assert_array_equal(t.numpy(), np.array(data, dtype=dtype))


def test_tensor_copies_its_data(device):
    array = np.array([1.0, 2.0], dtype=np.float32)
    t = flow.tensor(array, device=device)
    array[0] = 100.0
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0])


def test_factories_make_the_shape_dtype_device_and_values_asked_for(device):
    cases = [
        (flow.zeros(2, 3, device=device), (2, 3), np.float32, np.zeros((2, 3))),
        (flow.zeros((4,), dtype=flow.int64, device=device), (4,), np.int64, np.zeros(4)),
        (flow.ones(3, dtype=flow.float64, device=device), (3,), np.float64, np.ones(3)),
        (flow.ones((), device=device), (), np.float32, np.ones(())),
        (flow.full((2, 2), 7, dtype=flow.int32, device=device), (2, 2), np.int32, np.full((2, 2), 7)),
        (flow.full((3,), -1.5, device=device), (3,), np.float32, np.full(3, -1.5)),
    ]
    for t, shape, dtype, expected in cases:
        assert (t.shape, t.dtype, t.device) == (shape, np.dtype(dtype), flow.device(device))
        np.testing.assert_array_equal(t.numpy(), expected.astype(dtype))
    for sample in (flow.randn, flow.rand):
        t = sample(2, 3, dtype=flow.float64, device=device)
        assert (t.shape, t.dtype, t.device) == ((2, 3), np.dtype(np.float64), flow.device(device))
        values = t.numpy()
        assert np.isfinite(values).all() and len(np.unique(values)) == 6
    uniform = flow.rand(50, device="cpu").numpy()
    assert ((0 <= uniform) & (uniform < 1)).all()


def test_manual_seed_makes_randn_and_rand_reproducible(device):
    flow.manual_seed(1234)
    first = (flow.randn(2, 3, device=device).numpy(), flow.rand(4, device=device).numpy())
    flow.manual_seed(1234)
    second = (flow.randn(2, 3, device=device).numpy(), flow.rand(4, device=device).numpy())
    third = flow.randn(2, 3, device=device).numpy()
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    assert not np.array_equal(first[0], third), "the generator did not move on"
    flow.manual_seed(99)
    assert not np.array_equal(flow.randn(2, 3, device=device).numpy(), first[0])


# --- attributes and reading values ---------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3), (2, 1, 4)])
def test_attributes_describe_the_tensor(device, shape):
    t = flow.zeros(shape, dtype=flow.float64, device=device)
    assert t.shape == shape
    assert t.dtype == np.dtype(np.float64)
    assert t.device == flow.device(device) and t.device.type == device
    assert t.ndim == len(shape)
    assert t.numel() == math.prod(shape)
    assert t.numpy().shape == shape


def test_numpy_returns_a_copy_that_does_not_alias_the_tensor(device):
    t = flow.tensor([1.0, 2.0, 3.0], device=device)
    first = t.numpy()
    first[:] = -1.0
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal((t + 1).numpy(), [2.0, 3.0, 4.0])
    view = t[1:]
    values = view.numpy()
    values[0] = 50.0
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0, 3.0])


def test_item_gives_a_python_scalar_and_rejects_more_than_one_element(device):
    assert flow.tensor(2.5, device=device).item() == 2.5
    assert isinstance(flow.tensor(2.5, device=device).item(), float)
    value = flow.tensor([[7]], device=device).item()
    assert value == 7 and isinstance(value, int)
    assert flow.tensor([1.0, 4.0], device=device).sum().item() == 5.0
    with pytest.raises(ShapeError, match=r"\(2, 3\)"):
        flow.zeros(2, 3, device=device).item()
    with pytest.raises(ShapeError):
        flow.zeros(0, device=device).item()
    assert_vm_usable(device)


def test_str_shows_the_values_the_device_and_the_dtype(device):
    text = str(flow.tensor([[1.5, -2.0], [0.0, 3.0]], device=device))
    where = "" if device == "cpu" else f", device='{device}:0'"   # as PyTorch: cpu and float32 go unsaid
    assert text == f"tensor([[ 1.5000, -2.0000],\n        [ 0.0000,  3.0000]]{where})", text
    assert str(flow.tensor([1.5], dtype=flow.float64, device=device)) == f"tensor([1.5000]{where}, dtype=flow.float64)"
    assert "7" in str(flow.tensor(7, device=device))


# --- moving between devices and dtypes --------------------------------------------------------------


def test_to_moves_values_between_cpu_and_cuda_both_ways(device):
    other = "cuda" if device == "cpu" else "cpu"
    array = arange((2, 3), np.float64, start=-2.5)
    t = flow.tensor(array, device=device)
    moved = t.to(other)
    assert moved.device == flow.device(other) and moved.dtype == t.dtype and moved.shape == t.shape
    back = moved.to(device)
    assert back.device == flow.device(device)
    np.testing.assert_array_equal(moved.numpy(), array)
    np.testing.assert_array_equal(back.numpy(), array)
    np.testing.assert_array_equal((moved * 2).to(device).numpy(), array * 2)  # an op right after each copy
    assert t.to(device) is t, ".to() its own device copies nothing"
    np.testing.assert_array_equal(t.T.to(other).numpy(), array.T)  # a non-contiguous source


@cuda_devices(2)
def test_to_between_two_cuda_devices_goes_through_the_host():
    array = arange((3, 2), np.float32)
    t = flow.tensor(array, device="cuda:0")
    moved = (t + 1).to("cuda:1")
    assert moved.device == flow.device("cuda:1")
    np.testing.assert_array_equal(moved.numpy(), array + 1)
    np.testing.assert_array_equal((moved * 2).to("cuda:0").numpy(), (array + 1) * 2)


def run_with_slow_cuda_streams(body, seeds=range(3)) -> None:
    """``body(seed)`` in a fresh VM whose cuda ep streams sleep 0-50 ms before each task."""
    flow.vm.shutdown()
    try:
        for seed in seeds:
            with ep.emulation(max_delay=0.05, seed=seed):
                body(seed)
            flow.vm.shutdown()
    finally:
        flow.vm.shutdown()


def release_now() -> None:
    """Issue the ReleaseTensor of every tensor dropped so far (the next op does) and let it run."""
    flow.zeros(1)
    time.sleep(0.01)


def test_a_copy_to_cuda_keeps_its_values_when_the_host_source_is_freed_at_once():
    """``y = x.to("cuda"); del x``: x's memory may be reused only once the copy has read it."""
    def body(seed):
        x = flow.tensor(np.arange(6.0))
        y = x.to("cuda")        # the copy waits behind a delay in the host-to-device stream
        del x
        release_now()
        z = flow.full((6,), -1.0, dtype=flow.float64)  # the host allocator may hand out x's block
        np.testing.assert_array_equal(y.numpy(), np.arange(6.0), err_msg=f"emulation seed {seed}")
        np.testing.assert_array_equal(z.numpy(), np.full(6, -1.0))

    run_with_slow_cuda_streams(body)


def test_dropping_an_unread_copy_to_cuda_at_once_leaves_later_tensors_alone():
    """``y = x.to("cuda"); del y``: y's memory may be reused only once the copy has written it."""
    def body(seed):
        x = flow.tensor(np.arange(6.0))
        y = x.to("cuda")        # the copy waits behind a delay in the host-to-device stream
        del y
        release_now()
        z = flow.full((6,), -1.0, dtype=flow.float64, device="cuda")  # may get y's block
        np.testing.assert_array_equal(z.numpy(), np.full(6, -1.0), err_msg=f"emulation seed {seed}")
        np.testing.assert_array_equal(x.numpy(), np.arange(6.0))

    run_with_slow_cuda_streams(body)


def test_a_copy_from_cuda_can_be_read_on_the_host_right_after_it_is_copied_back():
    """``b = a.to("cpu"); c = b.to("cuda")``: host reads of b wait for the copy that wrote b."""
    def body(seed):
        a = flow.tensor(np.array([0.5, -1.5], dtype=np.float32), device="cuda")
        b = a.to("cpu")         # device-to-host copy: b is written on the cuda device's d2h stream
        c = b.to("cuda")        # ...and read on its h2d stream: b's last user is now the h2d stream
        np.testing.assert_array_equal(b.numpy(), [0.5, -1.5], err_msg=f"emulation seed {seed}")
        np.testing.assert_array_equal((b * 2).numpy(), [1.0, -3.0], err_msg=f"emulation seed {seed}")
        np.testing.assert_array_equal(c.numpy(), [0.5, -1.5])

    run_with_slow_cuda_streams(body)


@pytest.mark.parametrize("target", ["float64", "int64", "int32", "float32"])
def test_to_dtype_casts_like_numpy_astype(device, target):
    array = np.array([[-1.75, 0.5], [2.25, 3.0]], dtype=np.float32)
    t = flow.tensor(array, device=device)
    cast = t.to(np.dtype(target))
    assert cast.dtype == np.dtype(target) and cast.device == t.device
    np.testing.assert_array_equal(cast.numpy(), array.astype(target))
    both = t.to(device="cpu", dtype=np.dtype(target))
    assert both.device == flow.device("cpu") and both.dtype == np.dtype(target)
    np.testing.assert_array_equal(both.numpy(), array.astype(target))


# --- operators and functions -----------------------------------------------------------------------


def test_arithmetic_operators_match_numpy(device):
    a = np.array([[1.5, -2.0, 3.0], [0.25, 4.0, -1.0]], dtype=np.float32)
    b = np.array([2.0, 0.5, -4.0], dtype=np.float32)  # broadcasts over a's rows
    m = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.0]], dtype=np.float32)
    ta, tb, tm = (flow.tensor(v, device=device) for v in (a, b, m))
    results = {"+": (ta + tb, a + b), "-": (ta - tb, a - b), "*": (ta * tb, a * b), "/": (ta / tb, a / b),
               "@": (ta @ tm, a @ m), "**": (flow.abs(ta) ** tb, np.abs(a) ** b), "neg": (-ta, -a)}
    for what, (actual, expected) in results.items():
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
        assert_close(actual.numpy(), expected, what=what)


def test_comparisons_give_bool_tensors(device):
    a = np.array([1.0, 2.0, 3.0, 2.0])
    b = np.array([3.0, 2.0, 1.0, 0.0])
    ta, tb = flow.tensor(a, device=device), flow.tensor(b, device=device)
    cases = {"<": (ta < tb, a < b), "<=": (ta <= tb, a <= b), ">": (ta > tb, a > b), ">=": (ta >= tb, a >= b),
             "==": (ta == tb, a == b), "!=": (ta != tb, a != b), "> 2": (ta > 2, a > 2), "== 2.0": (ta == 2.0, a == 2)}
    for what, (actual, expected) in cases.items():
        assert actual.dtype == np.bool_, what
        np.testing.assert_array_equal(actual.numpy(), expected, err_msg=what)


@pytest.mark.parametrize("dtype, scalar, result", [
    ("float32", 1, "float32"), ("float32", 2.5, "float32"), ("float64", 3, "float64"),
    ("int64", 2, "int64"), ("int64", 0.5, "float32"), ("int32", 3, "int32"), ("int16", True, "int16"),
])
def test_python_scalars_follow_torch_promotion_in_both_operand_orders(device, dtype, scalar, result):
    """A Python scalar never widens a tensor of its category (int64 + 2 stays int64, float32 + 2.5
    float32); a float scalar makes an integer tensor float32; true division of integers is float32."""
    array = np.array([[1, 2], [3, 4]], dtype=dtype)
    t = flow.tensor(array, device=device)
    result = np.dtype(result)
    quotient = result if result.kind == "f" else np.dtype(np.float32)
    a, s = array.astype(result), np.array(scalar).astype(result)
    cases = {"t+s": (t + scalar, a + s, result), "s+t": (scalar + t, s + a, result),
             "t-s": (lambda: t - scalar, a - s, result), "s-t": (lambda: scalar - t, s - a, result),
             "t*s": (t * scalar, a * s, result), "s*t": (scalar * t, s * a, result),
             "s/t": (scalar / t, s.astype(quotient) / a.astype(quotient), quotient),
             "t**s": (t ** scalar, a ** s, result), "s**t": (scalar ** t, s ** a, result)}
    if isinstance(scalar, bool):   # PyTorch refuses - with a bool operand, a Python bool included
        del cases["t-s"], cases["s-t"]
        for subtract in (lambda: t - scalar, lambda: scalar - t):
            with pytest.raises(DTypeError, match="Subtraction, the `-` operator, with a bool tensor"):
                subtract()
    for what, (actual, expected, dtype_) in cases.items():
        actual = actual() if callable(actual) else actual
        assert actual.dtype == dtype_, f"{what}: {actual.dtype}, torch says {dtype_}"
        assert actual.device == t.device
        assert_close(actual.numpy(), expected.astype(dtype_), what=what)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_unary_functions_match_numpy(device, dtype):
    x = np.array([[-2.0, -0.5, 0.0], [0.25, 1.0, 3.0]], dtype=dtype)
    positive = np.abs(x) + 0.5
    t, tp = flow.tensor(x, device=device), flow.tensor(positive, device=device)
    cases = {
        "relu": (flow.relu(t), np.maximum(x, 0)),
        "sigmoid": (flow.sigmoid(t), 1 / (1 + np.exp(-x))),
        "tanh": (flow.tanh(t), np.tanh(x)),
        "exp": (flow.exp(t), np.exp(x)),
        "log": (flow.log(tp), np.log(positive)),
        "sqrt": (flow.sqrt(tp), np.sqrt(positive)),
        "abs": (flow.abs(t), np.abs(x)),
        "method": (t.tanh().exp(), np.exp(np.tanh(x))),
    }
    for what, (actual, expected) in cases.items():
        assert actual.dtype == np.dtype(dtype), what
        assert_close(actual.numpy(), expected.astype(dtype), what=what)


@pytest.mark.parametrize("a_shape, b_shape", [((2, 3), (3, 4)), ((3,), (3, 2)), ((2, 3), (3,)), ((3,), (3,)),
                                              ((2, 2, 3), (3, 2))])
def test_matmul_matches_numpy(device, a_shape, b_shape):
    a, b = arange(a_shape, np.float64, start=-3), arange(b_shape, np.float64, start=1) / 4
    result = flow.matmul(flow.tensor(a, device=device), flow.tensor(b, device=device))
    assert result.shape == np.matmul(a, b).shape
    assert_close(result.numpy(), np.matmul(a, b))


@pytest.mark.parametrize("dim", [None, 0, 1, -1, (0, 1)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_and_mean_reduce_like_numpy(device, dim, keepdim):
    x = arange((2, 3), np.float32, start=-2)
    t = flow.tensor(x, device=device)
    for name, actual, expected in (
            ("sum", t.sum(dim=dim, keepdim=keepdim), x.sum(axis=dim, keepdims=keepdim)),
            ("mean", t.mean(dim=dim, keepdim=keepdim), x.mean(axis=dim, keepdims=keepdim)),
            ("flow.sum", flow.sum(t, dim, keepdim), x.sum(axis=dim, keepdims=keepdim))):
        assert actual.shape == expected.shape and actual.dtype == expected.dtype, name
        assert_close(actual.numpy(), expected, what=name)


def test_max_without_dim_is_a_tensor_and_with_dim_values_and_indices(device):
    x = np.array([[1.0, 5.0, -2.0], [7.0, 0.0, 7.0]], dtype=np.float32)
    t = flow.tensor(x, device=device)
    whole = flow.max(t)
    assert isinstance(whole, flow.Tensor) and whole.shape == ()
    assert whole.item() == 7.0
    for dim in (0, 1, -1):
        for keepdim in (False, True):
            values, indices = t.max(dim=dim, keepdim=keepdim)
            result = flow.max(t, dim, keepdim)
            assert result.values.shape == values.shape and result.indices.dtype == np.int64
            np.testing.assert_array_equal(values.numpy(), x.max(axis=dim, keepdims=keepdim))
            np.testing.assert_array_equal(indices.numpy(), np.argmax(x, axis=dim, keepdims=keepdim))
            assert indices.dtype == np.int64


def test_argmax_matches_numpy_and_picks_the_first_maximum(device):
    x = np.array([[3.0, 9.0, 9.0], [4.0, 4.0, 1.0]])
    t = flow.tensor(x, device=device)
    np.testing.assert_array_equal(flow.argmax(t).numpy(), np.argmax(x))
    for dim in (0, 1, -2):
        result = t.argmax(dim=dim)
        assert result.dtype == np.int64
        np.testing.assert_array_equal(result.numpy(), np.argmax(x, axis=dim))
    np.testing.assert_array_equal(flow.argmax(t, 1, keepdim=True).numpy(), np.argmax(x, axis=1, keepdims=True))


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_and_log_softmax_match_numpy(device, dim, dtype):
    x = np.array([[1.0, -2.0, 30.0], [0.5, 0.5, -1.0]], dtype=dtype)
    shifted = x - x.max(axis=dim, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=dim, keepdims=True))
    t = flow.tensor(x, device=device)
    soft, log_soft = flow.softmax(t, dim), flow.log_softmax(t, dim=dim)
    assert soft.dtype == np.dtype(dtype) and soft.shape == x.shape
    assert_close(soft.numpy(), np.exp(log_softmax).astype(dtype), what="softmax")
    assert_close(log_soft.numpy(), log_softmax.astype(dtype), what="log_softmax")
    assert_close(t.softmax(dim).numpy().sum(axis=dim), np.ones(x.shape[1 - dim % 2], dtype), what="sums to 1")


def test_cat_concatenates_along_a_dim(device):
    a, b, c = arange((2, 3)), arange((1, 3), start=10), arange((2, 2), start=20)
    ta, tb, tc = (flow.tensor(v, device=device) for v in (a, b, c))
    np.testing.assert_array_equal(flow.cat([ta, tb], 0).numpy(), np.concatenate([a, b], 0))
    np.testing.assert_array_equal(flow.cat([ta, tc, ta], dim=1).numpy(), np.concatenate([a, c, a], 1))
    np.testing.assert_array_equal(flow.cat((ta, tc), -1).numpy(), np.concatenate([a, c], -1))
    np.testing.assert_array_equal(flow.cat([ta.T, tb.T], 1).numpy(), np.concatenate([a.T, b.T], 1))


def test_where_picks_from_a_or_b_with_broadcasting(device):
    a = arange((2, 3), np.float32, start=-3)
    b = np.array([10.0, 20.0, 30.0], dtype=np.float32)
    ta, tb = flow.tensor(a, device=device), flow.tensor(b, device=device)
    np.testing.assert_array_equal(flow.where(ta > 0, ta, tb).numpy(), np.where(a > 0, a, b))
    np.testing.assert_array_equal(flow.where(ta > 0, ta, 0.0).numpy(), np.where(a > 0, a, np.float32(0)))
    assert flow.where(ta > 0, ta, 0.0).dtype == np.float32
    cond = flow.tensor([True, False, True], device=device)
    np.testing.assert_array_equal(flow.where(cond, ta, tb).numpy(), np.where([True, False, True], a, b))


def test_sync_returns_only_when_every_issued_op_has_finished_on_the_device(device):
    """After ``flow.sync()`` the results are in memory, even read behind the VM's back.

    The VM is restarted with randomly delayed emulated cuda streams, so device work
    really lags behind the VM's bookkeeping unless ``sync`` waits for it.
    """
    flow.vm.shutdown()
    try:
        with ep.emulation(max_delay=0.002, seed=7):
            x = flow.tensor(np.ones((2, 3), dtype=np.float32), device=device)
            results = []
            for _ in range(6):
                x = flow.tanh(x) + 1
                results.append(x)
            engine = flow.vm.get_vm().engine
            issued = engine.received
            flow.sync()
            assert engine.released >= issued, "sync returned before every earlier instruction was released"
            expected = np.ones((2, 3), dtype=np.float32)
            for step, r in enumerate(results):
                expected = np.tanh(expected) + 1
                assert_close(to_host(r._blob.array()), expected, what=f"step {step}, read directly from memory")
            del x, results, r
    finally:
        flow.vm.shutdown()


# --- views -------------------------------------------------------------------------------------


def test_transpose_permute_and_T_match_numpy(device):
    x = arange((2, 3, 4))
    t = flow.tensor(x, device=device)
    cases = {"transpose(0,2)": (t.transpose(0, 2), x.transpose(2, 1, 0)),
             "transpose(-1,1)": (t.transpose(-1, 1), np.swapaxes(x, -1, 1)),
             "permute": (t.permute(1, 2, 0), x.transpose(1, 2, 0)),
             "permute(tuple)": (t.permute((2, 0, 1)), x.transpose(2, 0, 1)),
             "T": (t.T, x.T), "T.T": (t.T.T, x),
             "op on view": (t.permute(2, 0, 1) * 2 + t.permute(2, 0, 1), x.transpose(2, 0, 1) * 3),
             "matmul on view": (t[0].T @ t[1], x[0].T @ x[1])}
    for what, (actual, expected) in cases.items():
        assert actual.shape == expected.shape, what
        assert_close(actual.numpy(), expected, what=what)


@pytest.mark.parametrize("index", [
    (slice(1, 3), slice(None)), (Ellipsis, 0), (None,), -1, (-2, slice(None, None, 2)),
    (slice(None), slice(1, None), slice(None, None, 3)), (0, Ellipsis, None), (slice(5, 9),),
    (1, -1, -1), (slice(None, None, 2), None, 1),
], ids=lambda index: str(index).replace(" ", ""))
def test_basic_indexing_matches_numpy(device, index):
    x = arange((3, 4, 5), start=-30)
    t = flow.tensor(x, device=device)
    view = t[index]
    assert view.shape == x[index].shape
    assert_close(view.numpy(), x[index])
    assert_close((view * 1.5 - 1).numpy(), x[index] * 1.5 - 1, what="an op on the view")


def test_views_of_views_compose_like_numpy(device):
    x = arange((4, 6), start=-5)
    t = flow.tensor(x, device=device)
    assert_close(t[1:, ::2].T[1:][..., -1].numpy(), x[1:, ::2].T[1:][..., -1])
    assert_close(t.T[::3][None].sum(dim=-1).numpy(), x.T[::3][None].sum(axis=-1))
    assert_close(flow.softmax(t[:, 1::2], 0).numpy()[0], (np.exp(x[:, 1::2]) / np.exp(x[:, 1::2]).sum(0))[0])


def test_views_follow_the_writes_to_their_base_in_program_order(device):
    x = arange((2, 3))
    t = flow.tensor(x, device=device)
    views = {"t[1]": (t[1], lambda a: a[1]), "t.T": (t.T, lambda a: a.T),
             "t[..., ::2]": (t[..., ::2], lambda a: a[..., ::2]), "t[None]": (t[None], lambda a: a[None]),
             "reshape(-1)": (t.reshape(-1), lambda a: a.reshape(-1)),
             "permute": (t.permute(1, 0), lambda a: a.transpose(1, 0))}
    issued_before = {what: view * 1 for what, (view, _) in views.items()}  # not read yet
    new = -10 * arange((2, 3))
    overwrite(t, new)                  # write the base, in VM order
    for what, (view, numpy_view) in views.items():
        assert_close(issued_before[what].numpy(), numpy_view(x), what=f"{what}, issued before the write")
        assert_close(view.numpy(), numpy_view(new), what=what)
        assert_close((view + 1).numpy(), numpy_view(new) + 1, what=f"{what} + 1")


def test_writing_through_a_view_changes_the_base(device):
    t = flow.tensor(arange((2, 3)), device=device)
    overwrite(t[1], [7.0, 8.0, 9.0])
    np.testing.assert_array_equal(t.numpy(), [[0.0, 1.0, 2.0], [7.0, 8.0, 9.0]])


def test_reshape_of_a_contiguous_tensor_is_a_view_and_of_a_non_contiguous_one_a_copy(device):
    x = arange((2, 3))
    t = flow.tensor(x, device=device)
    for shape, expected in (((3, 2), x.reshape(3, 2)), ((-1,), x.reshape(-1)), ((1, -1, 3), x.reshape(1, -1, 3))):
        assert t.reshape(*shape).shape == expected.shape
        np.testing.assert_array_equal(t.reshape(shape).numpy(), expected)
    as_view = t.reshape(3, -1)
    as_copy = t.T.reshape(-1)              # the transpose is not contiguous
    np.testing.assert_array_equal(as_copy.numpy(), x.T.reshape(-1))
    overwrite(t, x + 100)
    np.testing.assert_array_equal(as_view.numpy(), (x + 100).reshape(3, 2))
    np.testing.assert_array_equal(as_copy.numpy(), x.T.reshape(-1))


# --- errors at the call ---------------------------------------------------------------------------


def test_shape_mismatch_raises_shape_error_at_the_call(device):
    a = flow.zeros(2, 3, device=device)
    b = flow.ones(2, dtype=flow.float64, device=device)
    rejected_at_the_call(ShapeError, lambda: a + b, op="add", tensors=[a, b], device=device)
    rejected_at_the_call(ShapeError, lambda: flow.matmul(a, a), op="matmul", tensors=[a], device=device)
    positive = a > 0
    rejected_at_the_call(ShapeError, lambda: flow.where(positive, a, b), op="where", tensors=[positive, a, b],
                         device=device)


def test_dtype_errors_raise_dtype_error_at_the_call(device):
    ints = flow.tensor([1, 2, 3], device=device)
    floats = flow.zeros(3, device=device)
    rejected_at_the_call(DTypeError, lambda: flow.softmax(ints), op="softmax", tensors=[ints], device=device)
    rejected_at_the_call(DTypeError, lambda: flow.where(floats, floats, floats), op="where", tensors=[floats],
                         device=device)
    rejected_at_the_call(DTypeError, lambda: ints.add_(floats), op="add", tensors=[ints, floats],
                         device=device, extra=["can't be cast"])
    with pytest.raises(DTypeError):
        flow.tensor(["a", "b"], device=device)
    assert_vm_usable(device)


def test_mixing_devices_raises_device_error_that_says_to_use_to(device):
    other = "cuda" if device == "cpu" else "cpu"
    a = flow.zeros(2, 3, device=device)
    b = flow.ones(3, device=other)
    rejected_at_the_call(DeviceError, lambda: a * b, op="mul", tensors=[a, b], device=device, extra=[".to("])
    at = a.T
    rejected_at_the_call(DeviceError, lambda: flow.matmul(b, at), op="matmul", tensors=[b, at], device=device,
                         extra=[".to("])
    row = b[None]
    rejected_at_the_call(DeviceError, lambda: flow.cat([a, row]), op="cat", tensors=[a, row], device=device,
                         extra=[".to("])


@pytest.mark.parametrize("call, op", [
    (lambda t: t.sum(dim=2), "sum"), (lambda t: flow.mean(t, -3), "mean"), (lambda t: flow.softmax(t, 2), "softmax"),
    (lambda t: flow.argmax(t, 5), "argmax"), (lambda t: flow.max(t, dim=-3), "max"),
    (lambda t: flow.cat([t, t], 2), "cat"), (lambda t: t.transpose(0, 2), "transpose"),
    (lambda t: t.permute(0, 3), "permute"),
], ids=["sum", "mean", "softmax", "argmax", "max", "cat", "transpose", "permute"])
def test_invalid_axes_raise_axis_error_at_the_call(device, call, op):
    t = flow.zeros(2, 3, device=device)
    error = rejected_at_the_call(AxisError, lambda: call(t), op=op, tensors=[t], device=device)
    assert isinstance(error, IndexError)


@pytest.mark.parametrize("index", [2, -3, (0, 3), (1, -4), (0, 0, 0)], ids=str)
def test_indexing_out_of_range_raises_index_out_of_range_error(device, index):
    t = flow.zeros(2, 3, device=device)
    error = rejected_at_the_call(IndexOutOfRangeError, lambda: t[index], op="index", tensors=[t], device=device)
    assert isinstance(error, IndexError)


@pytest.mark.parametrize("shape", [(4,), (4, -1), (-1, -1), (7, 1)], ids=str)
def test_reshape_to_a_wrong_size_raises_shape_error(device, shape):
    t = flow.zeros(2, 3, device=device)
    rejected_at_the_call(ShapeError, lambda: t.reshape(shape), op="reshape", tensors=[t], device=device)


def test_cat_of_mismatched_shapes_raises_shape_error(device):
    a, b = flow.zeros(2, 3, device=device), flow.zeros(2, 2, device=device)
    rejected_at_the_call(ShapeError, lambda: flow.cat([a, b], 0), op="cat", tensors=[a, b], device=device)
    c = flow.zeros(3, device=device)
    rejected_at_the_call(ShapeError, lambda: flow.cat([a, c], 1), op="cat", tensors=[a, c], device=device)
    s = flow.zeros((), device=device)
    rejected_at_the_call(ShapeError, lambda: flow.cat([s, s]), op="cat", tensors=[s], device=device)


# --- errors while running ----------------------------------------------------------------------------


class Boom(RuntimeError):
    """The throwaway op's kernel failure."""


@pytest.fixture
def failing_op():
    """A registered op whose kernel raises on the stream (unregistered afterwards)."""
    name = f"boom_{uuid.uuid4().hex[:8]}"

    def launch(kernel, outputs, inputs, attrs, stream):
        raise Boom(f"{name} always fails")

    register_op(OpDef(name, lambda inputs, attrs: [TensorMeta(inputs[0].shape, inputs[0].dtype)],
                      kernel="relu", launch=launch, sbp_signatures=BROADCAST_ONLY, backward=NO_BACKWARD,
                      doc="fails on purpose (test)"))
    try:
        yield name
    finally:
        del OP_REGISTRY[name]


@pytest.mark.parametrize("sync_point", ["numpy", "flow.sync", "item"])
def test_a_kernel_exception_surfaces_as_op_error_naming_the_op_at_the_next_sync_point(device, failing_op,
                                                                                      sync_point):
    from pyflow.framework.interpreter import apply

    x = flow.tensor([1.0, 2.0], device=device)
    (broken,) = apply(failing_op, [x])  # returns at once: the kernel fails later, on a worker
    later = flow.exp(x)                 # does not depend on the failed op
    read = {"numpy": broken.numpy, "flow.sync": flow.sync, "item": lambda: broken.sum().item()}[sync_point]
    with pytest.raises(OpError) as info:
        read()
    assert info.value.op == failing_op
    assert failing_op in str(info.value) and "always fails" in str(info.value)
    assert_close(later.numpy(), np.exp([1.0, 2.0]).astype(np.float32), what="an op after the failure")
    flow.sync()                         # the error was reported once, not again
    assert_vm_usable(device)
    np.testing.assert_array_equal((x * x).numpy(), [1.0, 4.0])
