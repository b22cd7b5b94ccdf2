"""Advanced indexing with several index tensors, lists or ranges, broadcast together, as numpy and PyTorch do:
``x[rows, cols]`` (the NLL-from-scratch idiom ``-logp[range(n), y]``), with slices between or around them (the
index's dims go first when the indexed dims are apart), for reading, for ``x[i, j] = v`` and for the gradient.
A list holding lists is read as a tuple, as PyTorch reads it (numpy >= 1.23 reads one array: a silently
different shape)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.errors import ArgumentTypeError, IndexOutOfRangeError, ShapeError

SHAPE = (3, 4, 5)


@st.composite
def several_indices(draw):
    """An index of 3 items for SHAPE: at least two integer arrays (lists, numpy arrays, ranges or ints
    among them), the rest full slices; arrays of broadcastable shapes."""
    kinds = draw(st.lists(st.sampled_from(["array", "int", "slice"]), min_size=3, max_size=3)
                 .filter(lambda k: k.count("array") >= 2 or (k.count("array") == 1 and k.count("int") >= 1)))
    base = draw(st.sampled_from([(2,), (1, 2), (2, 1), (3,), ()]))
    items = []
    for d, kind in enumerate(kinds):
        size = SHAPE[d]
        if kind == "slice":
            items.append(slice(None))
        elif kind == "int":
            items.append(draw(st.integers(-size, size - 1)))
        else:
            shape = base if draw(st.booleans()) else base[-1:] if base else ()
            values = draw(st.lists(st.integers(-size, size - 1), min_size=int(np.prod(shape)),
                                   max_size=int(np.prod(shape))))
            array = np.array(values, np.int64).reshape(shape)
            items.append(array if draw(st.booleans()) else array.tolist())
    return tuple(items)


def _as_flow(index, wrap_tensor: bool):
    return tuple(flow.tensor(np.asarray(i)) if wrap_tensor and isinstance(i, (list, np.ndarray)) else i
                 for i in index)


@settings(max_examples=60, deadline=None)
@given(index=several_indices(), tensors=st.booleans())
def test_reading_with_several_index_tensors_equals_numpy(index, tensors):
    a = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    want = a[tuple(np.asarray(i) if isinstance(i, list) else i for i in index)]
    got = flow.tensor(a)[_as_flow(index, tensors)]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.numpy(), want)


@settings(max_examples=40, deadline=None)
@given(index=several_indices(), scalar=st.booleans())
def test_writing_with_several_index_tensors_equals_numpy(index, scalar):
    a = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    np_index = tuple(np.asarray(i) if isinstance(i, list) else i for i in index)
    shape = a[np_index].shape
    value = -1.0 if scalar else -np.arange(1, 1 + int(np.prod(shape)), dtype=np.float32).reshape(shape)
    # numpy writes duplicates in order (the last wins), and so does one index_copy on the host; keep them
    # distinct where the order would matter
    flat = np.arange(a.size).reshape(SHAPE)[np_index].ravel()
    if not scalar and len(set(flat.tolist())) != flat.size:
        return
    want = a.copy()
    want[np_index] = value
    x = flow.tensor(a)
    x[index] = value if scalar else flow.tensor(value)
    np.testing.assert_array_equal(x.numpy(), want)


def test_nll_from_scratch_matches_cross_entropy_with_its_gradient():
    rng = np.random.default_rng(0)
    logits = flow.tensor(rng.standard_normal((5, 3)).astype(np.float32), requires_grad=True)
    target = flow.tensor([0, 2, 1, 2, 0])
    loss = -logits.log_softmax(dim=1)[range(5), target].mean()
    loss.backward()
    other = logits.detach().clone().requires_grad_(True)
    reference = flow.nn.functional.cross_entropy(other, target)
    reference.backward()
    np.testing.assert_allclose(loss.item(), reference.item(), rtol=1e-6)
    np.testing.assert_allclose(logits.grad.numpy(), other.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_a_list_of_lists_is_a_tuple_as_in_pytorch():
    x = flow.arange(12).reshape(3, 4)
    assert x[[[0, 2], [1, 3]]].tolist() == [1, 11]          # x[[0, 2], [1, 3]]
    assert x[[slice(0, 2), 1]].tolist() == [1, 5]            # x[0:2, 1]
    assert x[[0, 2]].shape == (2, 4)                         # a flat list stays one index


def test_bad_several_indices_are_clear_errors():
    x = flow.zeros(3, 4)
    with pytest.raises(ShapeError, match="do not broadcast"):
        x[[0, 1], [0, 1, 2]]
    with pytest.raises(IndexOutOfRangeError, match="out of bounds"):
        x[[0, 3], [0, 1]]
    with pytest.raises(ArgumentTypeError, match="mask.nonzero"):
        x[flow.tensor([True, False, True]), [0, 1]]
