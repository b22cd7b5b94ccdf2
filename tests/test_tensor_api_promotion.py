"""PyTorch's type promotion (``pyflow/framework/dtypes.py``) and the dtypes pyflow supports.

* ``result_type`` against a table written by hand from torch's documented rules
  (https://pytorch.org/docs/stable/tensor_attributes.html#type-promotion-doc),
  and, only when ``torch`` is importable, against ``torch.result_type`` itself;
* every elementwise binary op, comparison, ``where`` and ``clamp`` gives that
  dtype, and numpy's values computed on the operands cast to it, on "cpu" and
  "cuda", for tensors with dims, zero-dim tensors and Python scalars;
* only the nine supported dtypes can exist: ``object``, strings, complex and
  datetimes are a ``DTypeError`` at the call, whichever way they come in.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pyflow as flow
from pyflow.errors import DTypeError
from pyflow.framework.dtypes import SUPPORTED_DTYPES, promote_types, result_type
from pyflow.framework.op_registry import TensorMeta
from tests.strategies import TARGETS, assert_close

D = {name: np.dtype(name) for name in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32",
                                       "float64")}


def dim(name):
    """A tensor with dims of dtype ``name`` (only its shape and dtype matter to result_type)."""
    return TensorMeta((2,), D[name])


def zero(name):
    return TensorMeta((), D[name])


# (operands, torch's result dtype): the documented examples first, then the rules one by one.
TABLE = [
    ((5, 5), "int64"),                                      # two Python ints
    ((dim("int32"), 5), "int32"),                           # a scalar of the same category does not count
    ((dim("int32"), zero("int64")), "int32"),               # ...nor does a zero-dim tensor
    ((dim("int64"), dim("int32")), "int64"),
    ((dim("bool"), dim("int64")), "int64"),
    ((dim("bool"), dim("uint8")), "uint8"),
    ((dim("float32"), dim("float64")), "float64"),
    ((dim("bool"), dim("int32")), "int32"),
    ((dim("int64"), dim("float32")), "float32"),            # another category: just big enough for the float
    ((dim("float16"), dim("int64")), "float16"),
    ((dim("uint8"), dim("int8")), "int16"),
    ((dim("uint8"), dim("int16")), "int16"),
    ((dim("uint8"), dim("int32")), "int32"),
    ((dim("int8"), dim("int16")), "int16"),
    ((dim("float16"), dim("float32")), "float32"),
    ((dim("bool"), dim("float16")), "float16"),
    ((dim("int64"), 2.5), "float32"),                       # a Python float counts as the default float32
    ((dim("int8"), 2.5), "float32"),
    ((dim("float16"), 2.5), "float16"),
    ((dim("float64"), 2.5), "float64"),
    ((dim("float32"), zero("float64")), "float32"),
    ((dim("int32"), zero("float64")), "float64"),           # a zero-dim tensor of a higher category counts
    ((dim("int8"), zero("float16")), "float16"),
    ((dim("int8"), zero("uint8")), "int8"),
    ((dim("bool"), zero("uint8")), "uint8"),
    ((dim("bool"), 5), "int64"),
    ((dim("bool"), 2.5), "float32"),
    ((dim("bool"), True), "bool"),
    ((dim("uint8"), 300), "uint8"),                         # the category decides, not the value
    ((dim("int16"), True), "int16"),
    ((zero("int32"), zero("int64")), "int64"),              # only zero-dim tensors: they promote
    ((zero("int32"), 5), "int32"),
    ((zero("int32"), 2.5), "float32"),
    ((zero("float64"), 2.5), "float64"),
    ((zero("float16"), zero("float32")), "float32"),
    ((zero("bool"), 5), "int64"),
    ((dim("int64"), zero("float64"), 2.5), "float64"),
    ((dim("int32"), zero("int64"), 2.5), "float32"),
    ((2.5, 1), "float32"),
    ((True, False), "bool"),
    ((True, 1), "int64"),
    ((np.float64(1.5), dim("int32")), "float32"),           # numpy scalars are scalars too
]


@pytest.mark.parametrize("operands, expected", TABLE, ids=[str(i) for i in range(len(TABLE))])
def test_result_type_follows_torchs_documented_rules(operands, expected):
    assert result_type(*operands) == D[expected]
    assert result_type(*reversed(operands)) == D[expected], "promotion does not depend on the order"


def test_promote_types_is_symmetric_and_stays_in_the_supported_dtypes():
    for a in SUPPORTED_DTYPES:
        for b in SUPPORTED_DTYPES:
            assert promote_types(a, b) == promote_types(b, a) in SUPPORTED_DTYPES
            assert promote_types(a, a) == a


def test_result_type_matches_torch_when_torch_is_installed():
    torch = pytest.importorskip("torch")
    as_torch = {name: getattr(torch, name) for name in D}
    for a in D:
        for b in D:
            for sa, sb in (((2,), (2,)), ((2,), ()), ((), (2,)), ((), ())):
                ta, tb = torch.zeros(sa, dtype=as_torch[a]), torch.zeros(sb, dtype=as_torch[b])
                expected = str(torch.result_type(ta, tb)).replace("torch.", "")
                assert result_type(TensorMeta(sa, D[a]), TensorMeta(sb, D[b])) == D[expected], (a, sa, b, sb)
            for scalar in (True, 3, 2.5):
                expected = str(torch.result_type(torch.zeros(2, dtype=as_torch[a]), scalar)).replace("torch.", "")
                assert result_type(dim(a), scalar) == D[expected], (a, scalar)


# --- ops give the promoted dtype and numpy's values on the promoted operands -------------------------------


NUMERIC = [name for name in D if name != "bool"]
OPS = {  # name -> (pyflow call, numpy on equal dtypes, dtypes it takes)
    "add": (lambda a, b: a + b, np.add, NUMERIC), "sub": (lambda a, b: a - b, np.subtract, NUMERIC),
    "mul": (lambda a, b: a * b, np.multiply, NUMERIC),
    "div": (lambda a, b: a / b, np.true_divide, NUMERIC),
    "maximum": (flow.maximum, np.maximum, NUMERIC), "minimum": (flow.minimum, np.minimum, NUMERIC),
    "floor_divide": (lambda a, b: a // b, np.floor_divide, NUMERIC),
    "remainder": (lambda a, b: a % b, np.remainder, NUMERIC),
    "bitwise_and": (lambda a, b: a & b, np.bitwise_and, ["bool", "uint8", "int8", "int16", "int32", "int64"]),
    "lt": (lambda a, b: a < b, np.less, list(D)), "eq": (lambda a, b: a == b, np.equal, list(D)),
    "ge": (flow.ge, np.greater_equal, list(D)),
}


def _operand(draw, dtypes, device, tensor_only=False):
    """(pyflow operand, numpy operand, what it is): a tensor with dims, a zero-dim tensor or a scalar."""
    name = draw(st.sampled_from(dtypes))
    kind = draw(st.sampled_from(["dim", "zero"] if tensor_only else ["dim", "zero", "scalar"]))
    if kind == "scalar":
        value = draw(st.sampled_from({"bool": [True, False]}.get(name, [1, 2, 3, 1.5, -2.5] if "float" in name
                                                                   else [1, 2, 3])))
        return value, value, f"scalar {value!r}"
    shape = (2, 3) if kind == "dim" else ()
    low = 0 if name in ("uint8", "bool") else -3
    values = np.random.default_rng(draw(st.integers(0, 99))).integers(low, 4, size=shape)
    array = (values != 0) if name == "bool" else values.astype(name)
    return flow.tensor(array, device=device), array, f"{name}{list(shape)}"


@given(data=st.data(), op=st.sampled_from(sorted(OPS)), device=st.sampled_from(TARGETS))
def test_binary_ops_compute_in_the_promoted_dtype(data, op, device):
    call, reference, dtypes = OPS[op]
    a, an, what_a = _operand(data.draw, dtypes, device, tensor_only=True)
    b, bn, what_b = _operand(data.draw, dtypes, device)
    if data.draw(st.booleans()) and isinstance(b, flow.Tensor):
        a, an, what_a, b, bn, what_b = b, bn, what_b, a, an, what_a
    what = f"{op}({what_a}, {what_b}) on {device}"
    common = result_type(*(x for x in (a, b)))
    if op == "div" and common.kind != "f":
        common = np.dtype(np.float32)
    with np.errstate(all="ignore"):
        expected = reference(np.asarray(an).astype(common), np.asarray(bn).astype(common))
    actual = call(a, b)
    assert actual.dtype == expected.dtype, f"{what}: {actual.dtype}, expected {expected.dtype}"
    assert_close(actual.numpy(), expected, dtype=np.float32 if expected.dtype == np.float16 else None, what=what)


@pytest.mark.parametrize("device", TARGETS)
def test_where_and_clamp_promote_their_values_like_torch(device):
    ints = flow.tensor([1, -2, 3], device=device)
    cond = ints > 0
    assert flow.where(cond, ints, 0.5).dtype == np.float32
    np.testing.assert_array_equal(flow.where(cond, ints, 0.5).numpy(), [1.0, 0.5, 3.0])
    assert flow.where(cond, ints, flow.tensor([7], dtype=flow.int8, device=device)).dtype == np.int64
    halves = flow.tensor([0.5, 1.5, 2.5], dtype=flow.float16, device=device)
    assert flow.where(cond, halves, ints).dtype == np.float16
    assert flow.clamp(ints, min=0).dtype == np.int64
    assert flow.clamp(ints, min=0.5).dtype == np.float32
    np.testing.assert_array_equal(flow.clamp(ints, min=0.5, max=2).numpy(), [1.0, 0.5, 2.0])
    assert flow.clamp(halves, max=flow.tensor(1.0, dtype=flow.float64, device=device)).dtype == np.float16


@pytest.mark.parametrize("device", TARGETS)
def test_regression_float32_plus_int64_is_float32_not_float64(device):
    """Before: numpy's rule gave float64."""
    a = flow.tensor([1.5, 2.5], device=device)
    b = flow.tensor([1, 2], device=device)
    assert (a + b).dtype == np.float32 and (b + a).dtype == np.float32
    np.testing.assert_array_equal((a + b).numpy(), [2.5, 4.5])
    assert (b / b).dtype == np.float32 and (b + 2.5).dtype == np.float32
    assert (a + flow.tensor(1.0, dtype=flow.float64, device=device)).dtype == np.float32
    assert (flow.tensor([1], dtype=flow.float16, device=device) + b).dtype == np.float16
    assert (flow.tensor([1], dtype=flow.uint8, device=device) + flow.tensor([1], dtype=flow.int8,
                                                                            device=device)).dtype == np.int16


@pytest.mark.parametrize("device", TARGETS)
def test_unary_math_of_integers_is_float32_and_rounding_keeps_integers(device):
    ints = flow.tensor([[1, -2], [3, 0]], dtype=flow.int16, device=device)
    for fn in (flow.sin, flow.cos, flow.exp, flow.sqrt, flow.sigmoid, flow.tanh):
        assert fn(ints).dtype == np.float32, fn.__name__
    for fn in (flow.floor, flow.ceil, flow.round, flow.abs, flow.neg, flow.sign):
        assert fn(ints).dtype == np.int16, fn.__name__
    np.testing.assert_array_equal(flow.sign(ints).numpy(), np.sign(ints.numpy()))
    assert_close(flow.sin(ints).numpy(), np.sin(ints.numpy().astype(np.float32)))


# --- only the supported dtypes exist ------------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda x: flow.tensor(np.array([1.5, "x", None], dtype=object)),
    lambda x: flow.zeros(4, dtype=object),
    lambda x: flow.ones(2, dtype=np.complex64),
    lambda x: flow.cast(x, object),
    lambda x: x.to(object),
    lambda x: x.to(np.dtype("U3")),
    lambda x: flow.tensor([1 + 2j]),
    lambda x: flow.tensor(["a", "b"]),
    lambda x: flow.tensor(np.array(["2020-01-01"], dtype="datetime64[D]")),
    lambda x: flow.tensor([1, None]),
    lambda x: flow.tensor(None),
    lambda x: flow.from_numpy(np.zeros(2, np.uint64)),
    lambda x: flow.empty(2, dtype="float128"),
], ids=["object-array", "zeros-object", "ones-complex", "cast-object", "to-object", "to-str", "complex",
        "strings", "datetime", "none-in-list", "none", "uint64", "float128"])
def test_unsupported_dtypes_are_a_dtype_error_at_the_call(make):
    """Regression: an object dtype used to reach a kernel and crash the process (segfault)."""
    x = flow.zeros(2)
    engine = flow.vm.get_vm().engine
    before = engine.received
    with pytest.raises(DTypeError) as info:
        make(x)
    assert engine.received == before, "a rejected call issued an instruction"
    assert "dtype" in str(info.value)
    np.testing.assert_array_equal((flow.ones(2) * 2).numpy(), [2.0, 2.0])


@pytest.mark.parametrize("device", TARGETS)
@pytest.mark.parametrize("dtype", [d.name for d in SUPPORTED_DTYPES])
def test_every_supported_dtype_round_trips_and_casts(device, dtype):
    values = np.array([0, 1, 3], dtype=dtype)
    t = flow.tensor(values, device=device)
    assert t.dtype == np.dtype(dtype) and t.element_size() == np.dtype(dtype).itemsize
    np.testing.assert_array_equal(t.numpy(), values)
    for target in ("float32", "int64", "bool"):
        np.testing.assert_array_equal(t.to(np.dtype(target)).numpy(), values.astype(target))
    np.testing.assert_array_equal(np.asarray(t.to(flow.float16)), values.astype(np.float16))


@pytest.mark.parametrize("device", TARGETS)
def test_regression_to_float16_converts_at_once_and_reads_back(device):
    """Before: ``x.to(np.float16)`` was accepted and failed only at ``numpy()``."""
    x = flow.tensor([0.5, -1.25, 3.0], device=device)
    half = x.to(np.float16)
    assert half.dtype == np.float16 and (half * 2).dtype == np.float16
    np.testing.assert_array_equal(half.numpy(), np.array([0.5, -1.25, 3.0], np.float16))
    np.testing.assert_array_equal((half + x).numpy(), np.array([1.0, -2.5, 6.0], np.float32))
