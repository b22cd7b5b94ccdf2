"""PyTorch's rule for in-place writes through views of leaves (issue: a reliability finding).

A leaf that requires grad may not be written in place (its gradient would be lost) — and not through a view of
it either: ``x[1:].mul_(2)`` changed x under its own gradient (``(x * x).sum().backward()`` gave ``[2, 8, 12]``
for ``x = [1, 2, 3]``).  Views share the leaf's storage; copies (advanced indexing, ``clone``) do not and stay
writable; under ``no_grad`` (an optimizer's update) anything goes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.errors import AutogradError

VIEW_WRITES = {
    "slice.mul_": lambda x: x[1:].mul_(2),
    "view.add_": lambda x: x.view(x.shape).add_(1),
    "T.zero_": lambda x: x.T.zero_(),
    "x[:2] += 1": lambda x: x.__setitem__(slice(0, 2), x[:2].__iadd__(1)),
    "reshape then slice": lambda x: x.reshape(-1)[:1].fill_(7.0),
    "setitem on a view": lambda x: x[1:].__setitem__(0, 5.0),
    "narrow.copy_": lambda x: x.narrow(0, 0, 1).copy_(flow.tensor([9.0])),
}


@pytest.mark.parametrize("write", sorted(VIEW_WRITES))
def test_an_in_place_write_through_a_view_of_a_leaf_that_requires_grad_is_an_error(write):
    x = flow.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(AutogradError, match=r"a view of float32\[3\], a leaf tensor that requires grad"):
        VIEW_WRITES[write](x)
    assert x.tolist() == [1.0, 2.0, 3.0]   # nothing was written
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0, 6.0]


@pytest.mark.parametrize("write", sorted(VIEW_WRITES))
def test_under_no_grad_and_on_a_leaf_that_needs_no_grad_the_view_write_happens(write):
    want = np.array([1.0, 2.0, 3.0], np.float32)
    x = flow.tensor(want)
    VIEW_WRITES[write](x)   # no grad needed: a plain in-place write
    y = flow.tensor(want, requires_grad=True)
    with flow.no_grad():
        VIEW_WRITES[write](y)
    assert y.tolist() == x.tolist() != want.tolist()


def test_copies_of_a_leaf_stay_writable_and_the_base_itself_records_an_indexed_write():
    x = flow.tensor([1.0, 2.0, 3.0], requires_grad=True)
    picked = x[[0, 1]]          # advanced indexing copies
    picked.mul_(2)
    assert picked.tolist() == [2.0, 4.0] and x.tolist() == [1.0, 2.0, 3.0]
    y = x * 1.0
    y[1:] = y[1:] * 3           # a write into the base is recorded
    y.sum().backward()
    assert x.grad.tolist() == [1.0, 3.0, 3.0]


def test_a_write_through_a_view_of_a_computed_tensor_is_refused_not_silently_wrong():
    """PyTorch carries it into the base's history (CopySlices); pyflow does not yet, and used to give the base
    the gradient of the values before the write ([1, 1, 1] here, for values [1, 6, 9]): now an error."""
    x = flow.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1.0
    with pytest.raises(AutogradError, match="CopySlices"):
        y[1:].mul_(3)
    assert y.tolist() == [1.0, 2.0, 3.0]
    with flow.no_grad():
        y[1:].mul_(3)           # no history to keep: allowed
    assert y.tolist() == [1.0, 6.0, 9.0]


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 6), start=st.integers(0, 1), depth=st.integers(1, 3))
def test_a_view_of_a_view_of_a_leaf_is_still_a_view_of_the_leaf(n, start, depth):
    x = flow.tensor(np.arange(float(n), dtype=np.float32), requires_grad=True)
    v = x
    for _ in range(depth):
        v = v[start:] if v.shape[0] > start else v.view(v.shape)
    with pytest.raises(AutogradError, match="a view of"):
        v.add_(1)
    assert x.tolist() == list(range(n))


def test_grad_fn_reads_as_pytorchs_name_and_next_functions():
    """A course prints ``type(y.grad_fn).__name__``, ``y.grad_fn.name()`` and walks ``next_functions``."""
    w = flow.tensor([1.0, 2.0], requires_grad=True)
    y = (w * 3.0).sum()
    assert type(y.grad_fn).__name__ == y.grad_fn.name() == "SumBackward0"
    (mul, nr), = y.grad_fn.next_functions
    assert mul.name() == "MulBackward0" and nr == 0
    (acc, _), (none, zero) = mul.next_functions
    assert acc.name() == "AccumulateGrad" and acc.next_functions == () and (none, zero) == (None, 0)
    assert isinstance(y.grad_fn, flow.autograd.graph.Node) and y.grad_fn.op_name == "reduce_sum"
