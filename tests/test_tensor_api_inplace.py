"""In-place ops (``add_``, ``+=``, ``copy_``, ``fill_``, ``clamp_``...) against numpy, on "cpu" and "cuda".

* values: ``x.op_(y)`` is numpy's ``x[...] = op(x, y)`` computed in PyTorch's
  promoted dtype and cast back to x's dtype; x keeps its shape and dtype, the
  call returns x itself, and every view of x's storage sees the new values;
* PyTorch's in-place rule at the call: a result of a higher category
  (``int.add_(1.5)``) or of another shape is refused, nothing is issued;
* aliasing: an operand that overlaps x without being the very same view is read
  before the write (``x[1:] += x[:-1]``);
* every in-place op is one instruction that *writes* x's storage (so the VM's
  WAR/WAW edges apply) and bumps ``x._version``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.device import ep
from pyflow.errors import DTypeError, PyflowError, ShapeError
from pyflow.framework.dtypes import can_cast, result_type
from pyflow.vm.builder import InstructionsBuilder
from tests.strategies import TARGETS, assert_close, values


@pytest.fixture(params=TARGETS)
def device(request) -> str:
    return request.param


INPLACE = {  # method -> (operator form, numpy on the promoted dtype)
    "add_": ("+=", np.add), "sub_": ("-=", np.subtract), "mul_": ("*=", np.multiply),
    "div_": ("/=", np.true_divide), "floor_divide_": ("//=", np.floor_divide), "remainder_": ("%=", np.remainder),
}


@given(data=st.data(), method=st.sampled_from(sorted(INPLACE)), device=st.sampled_from(TARGETS),
       x_dtype=st.sampled_from(["float32", "float64", "int32", "int64", "int16"]),
       y_dtype=st.sampled_from(["float32", "int64", "int8", "bool", "scalar-int", "scalar-float"]))
def test_inplace_ops_write_numpys_result_cast_back_into_the_tensor(data, method, device, x_dtype, y_dtype):
    shape = data.draw(st.sampled_from([(2, 3), (3,), ()]))
    seed = data.draw(st.integers(0, 2**16))
    xn = values(shape, x_dtype, 1, 5, seed)
    if y_dtype.startswith("scalar"):
        y = yn = 2 if y_dtype == "scalar-int" else 1.5
    else:
        y_shape = data.draw(st.sampled_from([shape, shape[1:], ()]))
        yn = values(y_shape, y_dtype, 1, 4, seed + 1)
        y = flow.tensor(yn, device=device)
    x = flow.tensor(xn, device=device)
    alias = x[None]
    common = result_type(x, y)
    if method == "div_" and common.kind != "f":
        common = np.dtype(np.float32)
    use_operator = data.draw(st.booleans())
    before, engine = x._version, flow.vm.get_vm().engine
    issued = engine.received
    if method == "sub_" and y_dtype == "bool":   # PyTorch refuses - with a bool operand
        with pytest.raises(DTypeError, match="Subtraction, the `-` operator, with a bool tensor"):
            getattr(x, method)(y)
        assert engine.received == issued and x._version == before
        return
    if not can_cast(common, x.dtype):
        with pytest.raises(DTypeError, match="can't be cast"):
            getattr(x, method)(y)
        assert engine.received == issued and x._version == before
        return
    if use_operator:
        same = x
        exec(f"x {INPLACE[method][0]} y", {}, {"x": x, "y": y})   # noqa: S102 - the operator form
        result = same
    else:
        result = getattr(x, method)(y)
    assert result is x and x.dtype == np.dtype(x_dtype) and x.shape == shape
    assert x._version == before + 1
    with np.errstate(all="ignore"):
        expected = INPLACE[method][1](xn.astype(common), np.asarray(yn).astype(common)).astype(x_dtype)
    assert_close(x.numpy(), expected, what=f"{method} {x_dtype} by {y_dtype}")
    assert_close(alias.numpy()[0], expected, what="a view sees the write")


def test_regression_int_add_of_a_float_is_refused_at_the_call(device):
    ints = flow.tensor([1, 2], device=device)
    halves, square = flow.tensor([0.5, 1.0], device=device), flow.ones(2, 2, dtype=flow.int64, device=device)
    issued = flow.vm.get_vm().engine.received
    for call in (lambda: ints.add_(1.5), lambda: ints.mul_(halves), lambda: ints.div_(2),
                 lambda: ints.clamp_(min=0.5)):
        with pytest.raises(DTypeError):
            call()
    with pytest.raises(ShapeError, match="keeps its shape"):
        ints.add_(square)
    assert flow.vm.get_vm().engine.received == issued, "a rejected call issued an instruction"
    assert ints.tolist() == [1, 2] and ints._version == 0


def test_copy_fill_zero_and_clamp_in_place(device):
    x = flow.zeros(2, 3, dtype=flow.int32, device=device)
    assert x.copy_(flow.tensor([1.7, -2.2, 3.9], device=device)) is x     # copy_ casts anything
    np.testing.assert_array_equal(x.numpy(), np.array([[1, -2, 3]] * 2, dtype=np.int32))
    other = flow.tensor([[5.0, 6.0, 7.0]], device="cpu" if device == "cuda" else "cuda")
    x[1].copy_(other[0])                                                  # from another device
    np.testing.assert_array_equal(x.numpy(), [[1, -2, 3], [5, 6, 7]])
    x.clamp_(min=0, max=5)
    np.testing.assert_array_equal(x.numpy(), [[1, 0, 3], [5, 5, 5]])
    x[:, 1].fill_(9)
    np.testing.assert_array_equal(x.numpy(), [[1, 9, 3], [5, 9, 5]])
    x.T[0].fill_(flow.tensor(4, device=device))
    np.testing.assert_array_equal(x.numpy(), [[4, 9, 3], [4, 9, 5]])
    assert x.zero_() is x and x.numpy().sum() == 0
    assert x._version == 6


def test_operands_overlapping_the_written_tensor_are_read_before_the_write(device):
    a = np.arange(6, dtype=np.float32)
    x = flow.tensor(a, device=device)
    x[1:] += x[:-1]
    expected = a.copy()
    expected[1:] += a[:-1]
    np.testing.assert_array_equal(x.numpy(), expected)
    m = flow.tensor(np.arange(9, dtype=np.float64).reshape(3, 3), device=device)
    mn = m.numpy()
    m.add_(m.T)                                    # overlaps itself in another order
    np.testing.assert_array_equal(m.numpy(), mn + mn.T)
    m.mul_(m)                                      # the very same view: elementwise, no copy needed
    np.testing.assert_array_equal(m.numpy(), (mn + mn.T) ** 2)
    v = flow.tensor([1.0, 2.0, 3.0, 4.0], device=device)
    v[::2] = v[1::2]                               # interleaved views of one storage
    np.testing.assert_array_equal(v.numpy(), [2.0, 2.0, 4.0, 4.0])


def test_an_inplace_op_is_one_instruction_that_writes_the_storage(device, monkeypatch):
    calls = []
    original = InstructionsBuilder.call

    def spy(self, name, run, inputs, outputs, stream, *args, **kwargs):
        calls.append((name, [b.storage for b in inputs], [b.storage for b in outputs]))
        return original(self, name, run, inputs, outputs, stream, *args, **kwargs)

    x = flow.ones(3, device=device)
    y = flow.ones(3, device=device)
    monkeypatch.setattr(InstructionsBuilder, "call", spy)
    x.add_(y)
    x[1:] *= 2
    monkeypatch.undo()
    assert [c[0] for c in calls] == ["add", "mul"]
    for name, reads, writes in calls:
        assert writes == [x._blob.storage], f"{name} does not write x's storage"
    np.testing.assert_array_equal(x.numpy(), [2.0, 4.0, 4.0])


def test_reads_issued_before_an_inplace_write_see_the_old_values_under_slow_streams():
    """WAR across streams: a copy to the other device and an op read x, then x is written in place."""
    flow.vm.shutdown()
    try:
        for seed in range(3):
            with ep.emulation(max_delay=0.01, seed=seed):
                x = flow.tensor(np.arange(4.0), device="cuda")
                on_host = x.to("cpu")              # device-to-host stream reads x
                doubled = x * 2                    # compute stream reads x
                x.add_(100)                        # ... then x is written
                x[0] = -1.0
                np.testing.assert_array_equal(on_host.numpy(), np.arange(4.0), err_msg=f"seed {seed}")
                np.testing.assert_array_equal(doubled.numpy(), np.arange(4.0) * 2)
                np.testing.assert_array_equal(x.numpy(), [-1.0, 101.0, 102.0, 103.0])
            flow.vm.shutdown()
    finally:
        flow.vm.shutdown()


def test_version_counts_writes_through_every_view(device):
    x = flow.zeros(2, 2, device=device)
    views = [x, x.T, x[0], x.view(4), x.detach()]
    x.add_(1)
    x.T[0].mul_(2)
    x.view(-1)[3] = 5.0
    assert all(v._version == 3 for v in views)
    y = x + 1                      # an out-of-place op makes a new storage
    assert y._version == 0 and x._version == 3
    with pytest.raises(PyflowError):
        x.expand(3, 2, 2).fill_(0)
    assert x._version == 3


@given(alpha=st.sampled_from([1, 2, -3, 0.5]), number=st.sampled_from([1, 2.5, -4]), op=st.sampled_from(["add", "sub"]))
@settings(max_examples=20, deadline=None)
def test_add_and_sub_scale_a_number_by_alpha_as_pytorch(alpha, number, op):
    """``x.add_(2, alpha=3)`` adds 6 (PyTorch scales the number; it used to fail: 'mul' of two numbers)."""
    base = np.array([1.0, -2.0, 3.5], np.float32)
    expected = base + number * alpha if op == "add" else base - number * alpha
    x = flow.tensor(base)
    getattr(x, f"{op}_")(number, alpha=alpha)
    np.testing.assert_allclose(x.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(getattr(flow, op)(flow.tensor(base), number, alpha=alpha).numpy(), expected, rtol=1e-6)
