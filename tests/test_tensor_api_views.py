"""Views and indexing against numpy, on "cpu" and "cuda".

* ``view`` follows PyTorch's stride rule: it succeeds exactly when the new shape
  can walk the old strides, and the result shares the storage (a write through
  it changes the base); otherwise it raises and ``reshape`` copies;
* ``expand``, ``squeeze``, ``unsqueeze``, ``narrow``, ``split``, ``chunk``, ``T`` are
  views; ``flatten``, ``repeat``, ``stack`` give numpy's values;
* ``x[index]`` and ``x[index] = value`` for random basic indices combined with one
  integer index or one boolean mask give numpy's results, and writes go to the
  base storage.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pyflow as flow
from pyflow.errors import ArgumentTypeError, ShapeError
from pyflow.framework.views import view_strides
from tests.strategies import TARGETS, assert_close, shapes


@pytest.fixture(params=TARGETS)
def device(request) -> str:
    return request.param


def arange(shape, dtype=np.float32) -> np.ndarray:
    return np.arange(math.prod(shape), dtype=np.float64).reshape(shape).astype(dtype)


# --- layouts: a tensor and its numpy twin seen through the same view ---------------------------------------


@st.composite
def layouts(draw, max_dims=3):
    """(base shape, a recipe that makes a view of the base) applied alike to a tensor and to numpy."""
    shape = draw(shapes(min_dims=1, max_dims=max_dims, min_side=1, max_side=4))
    kind = draw(st.sampled_from(["contiguous", "permuted", "sliced"]))
    if kind == "permuted":
        perm = tuple(draw(st.permutations(range(len(shape)))))
        return shape, kind, lambda a: a.permute(perm) if isinstance(a, flow.Tensor) else a.transpose(perm)
    if kind == "sliced":
        index = tuple(slice(draw(st.integers(0, n - 1)), None, draw(st.integers(1, 2))) for n in shape)
        return shape, kind, lambda a: a[index]
    return shape, kind, lambda a: a


def _factorizations(n: int, dims: int) -> list:
    if dims == 1:
        return [(n,)]
    return [(k,) + rest for k in range(1, n + 1) if n % k == 0 for rest in _factorizations(n // k, dims - 1)]


@given(data=st.data(), layout=layouts(), device=st.sampled_from(TARGETS))
def test_view_succeeds_exactly_when_the_strides_allow_it_and_shares_the_storage(data, layout, device):
    shape, kind, make_view = layout
    base_np = arange(shape)
    base = flow.tensor(base_np, device=device)
    t, t_np = make_view(base), make_view(base_np)
    target = data.draw(st.sampled_from([s for d in (1, 2, 3) for s in _factorizations(t.numel(), d)]))
    reshaped = t.reshape(target)
    np.testing.assert_array_equal(reshaped.numpy(), t_np.reshape(target), err_msg=f"reshape {kind} to {target}")
    strides = view_strides(t.shape, t.stride(), target)
    if strides is None:
        with pytest.raises(ShapeError, match="reshape"):
            t.view(target)
        assert not np.shares_memory(t_np.reshape(target), base_np), "numpy finds a view where torch's rule does not"
        return
    v = t.view(target)
    assert v.stride() == strides and v._blob.storage is base._blob.storage
    v.mul_(-1)                      # a write through the view changes the base
    t_np.reshape(target)[...] *= -1
    np.testing.assert_array_equal(base.numpy(), base_np, err_msg=f"write through view {target} of {kind}")


def test_regression_view_of_a_transpose_raises_instead_of_copying(device):
    x = flow.tensor(arange((2, 3)), device=device)
    with pytest.raises(ShapeError) as info:
        x.T.view(-1)
    assert "view" in str(info.value) and ".reshape(" in str(info.value) and "[3, 2]" in str(info.value)
    flat = x.T.reshape(-1)
    np.testing.assert_array_equal(flat.numpy(), arange((2, 3)).T.reshape(-1))
    assert flat._blob.storage is not x._blob.storage, "reshape copies when a view is impossible"
    assert x.view(3, 2)._blob.storage is x._blob.storage and x.reshape(6)._blob.storage is x._blob.storage


def test_expand_is_a_stride_zero_view_that_cannot_be_written(device):
    x = flow.tensor([[1.0], [2.0]], device=device)
    e = x.expand(3, 2, 4)
    assert e.shape == (3, 2, 4) and e.stride() == (0, 1, 0) and e._blob.storage is x._blob.storage
    np.testing.assert_array_equal(e.numpy(), np.broadcast_to([[1.0], [2.0]], (3, 2, 4)))
    np.testing.assert_array_equal(x.expand(-1, 3).numpy(), [[1.0] * 3, [2.0] * 3])
    np.testing.assert_array_equal(x.expand_as(flow.zeros(2, 2)).numpy(), [[1.0, 1.0], [2.0, 2.0]])
    with pytest.raises(ShapeError, match="clone"):
        e.add_(1)
    with pytest.raises(ShapeError, match="expand"):
        x.expand(3, 3)


def test_shape_views_match_numpy(device):
    a = arange((2, 1, 3))
    x = flow.tensor(a, device=device)
    cases = {
        "unsqueeze(0)": (x.unsqueeze(0), a[None]), "unsqueeze(-1)": (x.unsqueeze(-1), a[..., None]),
        "unsqueeze(2)": (x.unsqueeze(2), np.expand_dims(a, 2)), "squeeze()": (x.squeeze(), a.squeeze()),
        "squeeze(1)": (x.squeeze(1), a.squeeze(1)), "squeeze(0)": (x.squeeze(0), a),
        "narrow": (x.narrow(2, 1, 2), a[:, :, 1:3]), "narrow(-2)": (x.narrow(-1, -2, 2), a[:, :, 1:]),
        "T": (x.squeeze().T, a.squeeze().T), "detach": (x.detach(), a),
    }
    for what, (actual, expected) in cases.items():
        assert actual.shape == expected.shape, what
        assert actual._blob.storage is x._blob.storage, f"{what} is not a view"
        np.testing.assert_array_equal(actual.numpy(), expected, err_msg=what)


def test_view_ops_are_also_functions_as_in_torch(device):
    a = arange((2, 3))
    x = flow.tensor(a, device=device)
    np.testing.assert_array_equal(flow.reshape(x, (3, 2)).numpy(), a.reshape(3, 2))
    np.testing.assert_array_equal(flow.flatten(x).numpy(), a.reshape(-1))
    np.testing.assert_array_equal(flow.transpose(x, 0, 1).numpy(), a.T)
    np.testing.assert_array_equal(flow.permute(x, (1, 0)).numpy(), a.T)
    np.testing.assert_array_equal(flow.squeeze(flow.unsqueeze(x, 0)).numpy(), a)
    np.testing.assert_array_equal(flow.narrow(x, 1, 1, 2).numpy(), a[:, 1:])
    assert [p.shape for p in flow.split(x, 2, dim=1)] == [(2, 2), (2, 1)]
    assert [p.shape for p in flow.chunk(x, 2)] == [(1, 3), (1, 3)]
    copy = flow.clone(x)
    assert copy._blob.storage is not x._blob.storage
    np.testing.assert_array_equal(copy.numpy(), a)


def test_split_and_chunk_are_views_with_torchs_sizes(device):
    a = arange((5, 2))
    x = flow.tensor(a, device=device)
    for parts, sizes in ((x.split(2), [2, 2, 1]), (x.split([1, 4]), [1, 4]), (x.chunk(2), [3, 2]),
                         (x.chunk(5), [1] * 5), (x.split(1, dim=1), None)):
        if sizes is not None:
            assert [p.shape[0] for p in parts] == sizes
        assert all(p._blob.storage is x._blob.storage for p in parts)
        np.testing.assert_array_equal(np.concatenate([p.numpy() for p in parts], axis=0 if sizes else 1), a)
    with pytest.raises(ShapeError):
        x.split([2, 2])


def test_flatten_repeat_stack_cat_match_numpy(device):
    a = arange((2, 3, 2))
    x = flow.tensor(a, device=device)
    np.testing.assert_array_equal(x.flatten().numpy(), a.reshape(-1))
    np.testing.assert_array_equal(x.flatten(1).numpy(), a.reshape(2, -1))
    np.testing.assert_array_equal(x.flatten(0, 1).numpy(), a.reshape(6, 2))
    np.testing.assert_array_equal(flow.tensor(5.0, device=device).flatten().numpy(), [5.0])
    np.testing.assert_array_equal(x.repeat(1, 2, 1).numpy(), np.tile(a, (1, 2, 1)))
    np.testing.assert_array_equal(x[0].repeat(2, 1, 3).numpy(), np.tile(a[0], (2, 1, 3)))
    assert x.repeat(1, 1, 1)._blob.storage is not x._blob.storage, "repeat always copies"
    for dim in (0, 1, -1, 3):
        np.testing.assert_array_equal(flow.stack([x, x * 2], dim).numpy(), np.stack([a, a * 2], dim))
    np.testing.assert_array_equal(flow.cat([x, x.int()], 1).numpy(), np.concatenate([a, a], 1))
    assert flow.cat([x, x.int()]).dtype == np.float32, "cat promotes, as torch.cat"


# --- indexing ---------------------------------------------------------------------------------------------------


@st.composite
def indices(draw, shape, unique_integers=False):
    """A numpy-style index for ``shape``: basic items with at most one list of ints or one bool mask."""
    advanced = draw(st.sampled_from(["none", "ints", "mask"]))
    at = draw(st.integers(0, len(shape) - 1))
    span = draw(st.integers(1, len(shape) - at)) if advanced == "mask" else 1
    items, d = [], 0
    while d < len(shape):
        if draw(st.integers(0, 5)) == 0:
            items.append(None)
        n = shape[d]
        if advanced != "none" and d == at:
            if advanced == "mask":
                items.append(np.array(draw(st.lists(st.booleans(), min_size=math.prod(shape[d:d + span]),
                                                    max_size=math.prod(shape[d:d + span])))
                                      ).reshape(shape[d:d + span]))
                d += span
                continue
            pool = list(range(n)) if unique_integers else list(range(-n, n))
            chosen = draw(st.lists(st.sampled_from(pool), max_size=3, unique=unique_integers))
            items.append(np.array(chosen, dtype=np.int64))
        else:
            kind = draw(st.sampled_from(["int", "slice", "all"]))
            if kind == "int":
                items.append(draw(st.integers(-n, n - 1)))
            elif kind == "slice":
                items.append(slice(draw(st.integers(-n, n)), draw(st.integers(-n, n) | st.none()),
                                   draw(st.integers(1, 3))))
            else:
                items.append(slice(None))
        d += 1
    if advanced == "none" and items and draw(st.booleans()):
        cut = draw(st.integers(0, len(items)))
        items = items[:cut] + [Ellipsis]
    return tuple(items)


def _as_pyflow_index(index, device, as_tensor):
    """The same index with its array turned into a pyflow tensor (or a list)."""
    return tuple((flow.tensor(i, device=device) if as_tensor else i.tolist()) if isinstance(i, np.ndarray) else i
                 for i in index)


@given(data=st.data(), device=st.sampled_from(TARGETS))
def test_getitem_matches_numpy(data, device):
    shape = data.draw(shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    index = data.draw(indices(shape))
    a = arange(shape)
    x = flow.tensor(a, device=device)
    expected = a[index]
    actual = x[_as_pyflow_index(index, device, as_tensor=data.draw(st.booleans()))]
    assert actual.shape == expected.shape, f"{index}: {actual.shape} != {expected.shape}"
    np.testing.assert_array_equal(actual.numpy(), expected, err_msg=str(index))


@given(data=st.data(), device=st.sampled_from(TARGETS))
def test_setitem_matches_numpy_and_writes_the_base(data, device):
    shape = data.draw(shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    index = data.draw(indices(shape, unique_integers=True))
    a = arange(shape)
    x = flow.tensor(a, device=device)
    alias = x.view(-1)                      # another view of the same storage sees every write
    target_shape = a[index].shape
    if data.draw(st.booleans()):
        value, value_np = -1.5, -1.5
    else:
        suffix = target_shape[data.draw(st.integers(0, len(target_shape))):]
        value_np = -arange(suffix) - 1
        value = flow.tensor(value_np, device=device)
    before = x._version
    x[_as_pyflow_index(index, device, as_tensor=data.draw(st.booleans()))] = value
    a[index] = value_np
    np.testing.assert_array_equal(x.numpy(), a, err_msg=str(index))
    np.testing.assert_array_equal(alias.numpy(), a.reshape(-1))
    assert x._version > before, "a write bumps the version counter"


def test_regression_indexing_with_a_mask_or_an_int_tensor_no_longer_calls_eq(device):
    """``Ellipsis in index`` compared tensors with ``==`` (DTypeError ... ellipsis); now by identity."""
    a = np.array([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]], dtype=np.float32)
    x = flow.tensor(a, device=device)
    np.testing.assert_array_equal(x[x > 0].numpy(), a[a > 0])
    np.testing.assert_array_equal(x[flow.tensor([1, 0, 1], device=device)].numpy(), a[[1, 0, 1]])
    np.testing.assert_array_equal(x[..., flow.tensor([2, 0], device=device)].numpy(), a[..., [2, 0]])
    np.testing.assert_array_equal(x[0, x[0] > 0].numpy(), a[0, a[0] > 0])
    x[x < 0] = 0.0
    np.testing.assert_array_equal(x.numpy(), np.maximum(a, 0))


def test_a_mask_over_dims_that_do_not_merge_in_place_still_writes_the_base(device):
    a = arange((3, 4))
    x = flow.tensor(a, device=device)
    view = x.T[1:]                            # (3, 3), strides (1, 4): its dims cannot merge as a view
    mask = view > 4
    view[mask] = flow.tensor(-1.0, device=device)
    a.T[1:][a.T[1:] > 4] = -1.0
    np.testing.assert_array_equal(x.numpy(), a)


def test_bad_indices_raise_at_the_call(device):
    x = flow.zeros(2, 3, device=device)
    assert x[[0], [1]].tolist() == [0.0]   # several index lists are supported (tests/test_indexing_several.py)
    with pytest.raises(ArgumentTypeError):
        x["a"]
    with pytest.raises(IndexError):
        x[flow.tensor([True, False, True], device=device)]
    with pytest.raises(TypeError):
        x[flow.tensor([0.5], device=device)]
    with pytest.raises(ValueError):
        x[::-1]


# --- attributes ---------------------------------------------------------------------------------------------


def test_attributes_and_conversions(device):
    a = arange((2, 3), np.float64)
    x = flow.tensor(a, device=device)
    assert x.is_cuda == (device == "cuda") and x.ndim == x.dim() == 2 and x.numel() == 6
    assert x.size() == (2, 3) and x.size(1) == 3 and x.size(-2) == 2 and x.element_size() == 8
    assert x.stride() == (3, 1) and x.T.stride(0) == 1
    assert x.tolist() == a.tolist() and flow.is_tensor(x) and not flow.is_tensor(a)
    np.testing.assert_allclose(x, a)                     # numpy reads a tensor through __array__
    assert np.asarray(x).dtype == np.float64 and np.asarray(x, dtype=np.float32).dtype == np.float32
    ints = flow.tensor([1, 2], device=device)
    assert ints.type_as(x).dtype == np.float64 and ints.to(x).dtype == np.float64
    assert ints.to(x).device == x.device and ints.float().dtype == np.float32 and x.half().dtype == np.float16
    assert x.to(x) is x and x.to(device, copy=True) is not x
    with pytest.raises(ValueError):
        np.array(x, copy=False)


def test_regression_np_asarray_gives_the_values_not_an_object_array(device):
    x = flow.tensor([[1.5, 2.5]], device=device)
    values = np.asarray(x)
    assert values.dtype == np.float32 and values.shape == (1, 2)
    np.testing.assert_array_equal(values, [[1.5, 2.5]])
    np.testing.assert_allclose(x * 2, [[3.0, 5.0]])


def test_tensor_class_makes_uninitialised_float32_tensors_and_stays_the_isinstance_class():
    t = flow.Tensor(2, 3)
    assert isinstance(t, flow.Tensor) and t.shape == (2, 3) and t.dtype == np.float32
    assert flow.Tensor().shape == (0,)
    assert flow.Tensor([1, 2]).dtype == np.float32 and flow.Tensor([1, 2]).tolist() == [1.0, 2.0]
    assert isinstance(flow.zeros(1) + 1, flow.Tensor)
    assert_close(flow.Tensor(3).fill_(2).numpy(), np.full(3, 2.0, np.float32))
