"""A model called with ``pyflow.Tensor`` s keeps its weights on the device between calls (issue 17).

What this pins down (``pyflow/models/device_weights.py``):

1. Every one of the seven models, called with tensors on "cuda" (the simulator):
   the first call uploads each weight once (a host-to-device copy through the VM,
   ``tensor`` instructions), every later call copies nothing host-to-device
   and issues its one program instruction and no ``tensor`` instruction, and
   the results equal the numpy path's.
2. ``load_state_dict`` with new values: the next call uploads the changed
   weights (only those) and computes with them; with the same values, nothing.
3. Parameter assignment (``model.weight = new``) is seen; a parameter array is
   read-only (an in-place write raises instead of going unseen); a writable
   array assigned and then changed in place is seen too (its values are compared).
4. A hypothesis state machine over ``DeviceWeights`` alone: after any sequence of
   calls, reloads, assignments and in-place writes, the tensor handed to the
   program holds the current values, and uploads happen exactly when the values
   changed.
"""

from __future__ import annotations

import gc
import inspect

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.device.ep import base as ep_base
from pyflow.models import NASRNN, RAE, Attention, BlockDrop, Seq2seq, SkipNet, StackedLSTM
from pyflow.models.device_weights import DeviceWeights, freeze

TINY = {"threads": 4, "chunk": 4, "tile": 4}
TINY_RESNET = {"threads": 4, "chunk": 16, "tile": 4}


@pytest.fixture(autouse=True)
def fresh_vm():
    flow.vm.shutdown()
    yield
    flow.vm.shutdown()


@pytest.fixture
def h2d(monkeypatch):
    """A list that gets the byte count of every host-to-device copy any ep stream makes."""
    import importlib
    import sys

    copies = []
    for name in ("cpu", "emulated", "cuda"):
        if f"pyflow.device.ep.{name}" not in sys.modules and name == "cuda":
            continue   # (the simulator never loads the GPU's ep)
        module = importlib.import_module(f"pyflow.device.ep.{name}")
        for cls in vars(module).values():
            if inspect.isclass(cls) and issubclass(cls, ep_base.EpStream) and "memcpy_h2d" in vars(cls):
                def spy(self, dst, src, original=vars(cls)["memcpy_h2d"]):
                    copies.append(src.nbytes)
                    return original(self, dst, src)

                monkeypatch.setattr(cls, "memcpy_h2d", spy)
    return copies


# ---- the seven models, their inputs (numpy) and how many weight arrays each uploads ------------------------------


def _tree():
    left = np.array([1, 3, 0, 0, 0], np.int64)
    right = np.array([2, 4, 0, 0, 0], np.int64)
    is_leaf = np.array([0, 0, 1, 1, 1], np.int64)
    return left, right, is_leaf


def lstm():
    x = np.random.default_rng(0).standard_normal((3, 2, 3)).astype(np.float32)
    return StackedLSTM(3, 4, num_layers=2, **TINY), (x,), {}, 5 + 2   # 5 weights, the zero h0 and c0


def rae():
    rng = np.random.default_rng(1)
    return RAE(3, **TINY), (*_tree(), rng.standard_normal((5, 3)).astype(np.float32)), {}, 3   # W, b, the root


def nasrnn():
    x = np.random.default_rng(2).standard_normal((3, 2, 4)).astype(np.float32)
    return NASRNN(4, 4, **TINY), (x,), {}, 2


def attention():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2, 1, 4)).astype(np.float32)
    k, v = np.zeros((2, 1, 2, 5, 4), np.float32)
    k[:, :, :3], v[:, :, :3] = rng.standard_normal((2, 1, 2, 3, 4))
    return Attention(2, 4, 3, **TINY), (x, k, v), {}, 4


def seq2seq():
    rng = np.random.default_rng(4)
    encoder_output = rng.standard_normal((3, 2, 4)).astype(np.float32)
    std = rng.standard_normal((3, 2, 6)).astype(np.float32)
    h, c = rng.standard_normal((2, 2, 4)).astype(np.float32)
    return Seq2seq(4, 6, 3, **TINY), (encoder_output, std, h, c), {}, 7 + 1   # 7 weights, the start tokens


def blockdrop():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    probs = rng.random((2, 3)).astype(np.float32)
    return BlockDrop((1, 1, 1), 3, width=2, image_size=8, **TINY_RESNET), (x, probs), {}, 1


def skipnet():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    ch, cc = (0.5 * rng.standard_normal((2, 1, 2, 10))).astype(np.float32)
    model = SkipNet((1, 1, 1, 1), image_size=16, num_classes=3, width=1, **TINY_RESNET)
    return model, (x, ch, cc), {"actions": [1, 0, 1]}, 2   # the parameters, the actions' control vector


MODELS = {"lstm": lstm, "rae": rae, "nasrnn": nasrnn, "attention": attention, "seq2seq": seq2seq,
          "blockdrop": blockdrop, "skipnet": skipnet}


def flat(out) -> list:
    """A model's outputs as a flat list of numpy arrays (StackedLSTM's ``(out, (h, c))`` included)."""
    items = out if isinstance(out, tuple) else (out,)
    result = []
    for item in items:
        result += flat(item) if isinstance(item, tuple) else [item.numpy() if isinstance(item, flow.Tensor) else item]
    return result


def traced(model, args, kwargs):
    """One call: (its outputs as numpy, the VM instructions it issued)."""
    gc.collect()
    flow.sync()
    with flow.trace() as tracer:
        out = model(*args, **kwargs)
    names = [r.name for r in tracer.records]
    return flat(out), names


def perturbed(state_dict: dict, scale: float) -> dict:
    """The same state dict with every float parameter scaled (counters kept)."""
    return {k: v * scale if np.issubdtype(np.asarray(v).dtype, np.floating) else v for k, v in state_dict.items()}


# ---- 1. uploaded once -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_weights_are_uploaded_at_the_first_tensor_call_only(name, h2d):
    model, arrays, kwargs, weights = MODELS[name]()
    want = flat(model(*arrays, **kwargs))
    tensors = [flow.tensor(a, device="cuda") for a in arrays]
    flow.sync()
    h2d.clear()
    got, names = traced(model, tensors, kwargs)
    assert model.device_weights.uploads == weights
    assert len(h2d) == weights and names.count("tensor") == weights
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    for _ in range(2):
        h2d.clear()
        got, names = traced(model, tensors, kwargs)
        assert h2d == [] and "tensor" not in names, names
        assert sum(n.startswith("cocktailer[") for n in names) == 1
        assert model.device_weights.uploads == weights
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


# ---- 2. load_state_dict -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["lstm", "rae", "blockdrop"])
def test_after_load_state_dict_a_tensor_call_uses_the_new_weights(name, h2d):
    model, arrays, kwargs, weights = MODELS[name]()
    tensors = [flow.tensor(a, device="cuda") for a in arrays]
    old = flat(model(*tensors, **kwargs))
    model.load_state_dict(model.state_dict())     # the same values: nothing to upload
    h2d.clear()
    same, names = traced(model, tensors, kwargs)
    assert h2d == [] and "tensor" not in names
    for s, o in zip(same, old):
        np.testing.assert_array_equal(s, o)
    model.load_state_dict(perturbed(model.state_dict(), 0.5))
    h2d.clear()
    new, names = traced(model, tensors, kwargs)
    changed = {"lstm": 5, "rae": 2, "blockdrop": 1}[name]   # the weights; not the zero states nor the root
    assert len(h2d) == changed and names.count("tensor") == changed
    want = flat(model(*arrays, **kwargs))                  # the numpy path, with the new weights
    for n, w in zip(new, want):
        np.testing.assert_array_equal(n, w)
    assert not np.array_equal(new[0], old[0])
    h2d.clear()
    again, _ = traced(model, tensors, kwargs)
    assert h2d == []
    np.testing.assert_array_equal(again[0], want[0])


# ---- 3. assignment and in-place writes --------------------------------------------------------------------------


def test_parameter_assignment_and_in_place_writes(h2d):
    model, arrays, kwargs, _ = rae()
    tensors = [flow.tensor(a, device="cuda") for a in arrays]
    first = flat(model(*tensors))[0]
    with pytest.raises(ValueError, match="read-only"):
        model.weight[0, 0] = 1.0
    bias = np.array(model.bias, copy=True)   # writable
    bias += 0.25
    model.bias = bias
    h2d.clear()
    (second,), _ = traced(model, tensors, kwargs)
    assert len(h2d) == 1
    np.testing.assert_array_equal(second, flat(model(*arrays))[0])
    assert not np.array_equal(first, second)
    h2d.clear()
    traced(model, tensors, kwargs)
    assert h2d == []    # a writable array, unchanged: compared, not uploaded
    bias[:] = -1.0      # changed in place after the call: seen at the next one
    (third,), _ = traced(model, tensors, kwargs)
    assert len(h2d) == 1
    np.testing.assert_array_equal(third, flat(model(*arrays))[0])
    assert not np.array_equal(second, third)


def test_the_numpy_path_never_uploads_through_the_cache():
    model, arrays, kwargs, _ = nasrnn()
    model(*arrays)
    model(*arrays)
    assert model.device_weights.uploads == 0


def test_a_state_dict_loaded_is_the_models_own_copy():
    model, _, _, _ = rae()
    state = {k: np.array(v) for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    assert state["encoder.weight"].flags.writeable   # the caller's arrays are not frozen
    state["encoder.weight"][:] = 7.0
    assert not np.any(model.weight == 7.0)


# ---- 4. DeviceWeights against a model of what it must do -----------------------------------------------------------

ACTIONS = st.lists(st.sampled_from(["call", "reload_same", "reload_new", "assign_writable", "write_in_place"]),
                   min_size=1, max_size=12)


@settings(max_examples=25, deadline=None)
@given(actions=ACTIONS, device=st.sampled_from(["cpu", "cuda"]))
def test_device_weights_hold_the_current_values_and_upload_exactly_on_change(actions, device):
    cache = DeviceWeights()
    current = freeze(np.arange(4, dtype=np.float32))
    uploaded_values = None    # what the device holds (None: nothing yet)
    uploads = 0
    x = flow.tensor(np.zeros(2, np.float32), device=device)
    for step, action in enumerate(actions):
        if action == "reload_same":
            current = freeze(current.copy())
        elif action == "reload_new":
            current = freeze(current + 1)
        elif action == "assign_writable":
            current = np.array(current, copy=True)
        elif action == "write_in_place" and current.flags.writeable:
            current[step % 4] += 10
        if action != "call":
            continue
        _, w = cache.bind((x, current), slots=[1])
        if uploaded_values is None or not np.array_equal(uploaded_values, current):
            uploads += 1
            uploaded_values = current.copy()
        assert cache.uploads == uploads
        assert isinstance(w, flow.Tensor) and w.device == flow.device(device)
        np.testing.assert_array_equal(w.numpy(), current)
    assert cache.bind((np.zeros(2), current), slots=[1])[1] is current   # no tensor: the numpy path