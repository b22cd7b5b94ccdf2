"""``flow.save`` / ``flow.load`` (``pyflow/serialization/``): checkpoints a course can trust.

Specified here: random nested containers of tensors (every dtype, 0-d and empty, cpu and the
simulated cuda, views) come back equal in type, dtype, shape, bytes, device and requires_grad;
module and optimizer state dicts survive a save, and training resumed from a file gives the
numbers of training that never stopped; map_location in its four forms; global tensors by
value; and the safety rules: a pickle is never run unless ``weights_only=False`` (the payload
below would create a marker file), damaged or foreign files are a ``SerializationError``
naming the file, and an interrupted save leaves the earlier file as it was.
"""

from __future__ import annotations

import collections
import io
import json
import math
import os
import pickle
import shlex
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
import pyflow.serialization.writer as writer
from pyflow.errors import ArgumentTypeError, DeviceError, PyflowError, SerializationError
from pyflow.kernels.dtypes import SUPPORTED_DTYPES
from tests.strategies import all_dtypes, shapes, values

DEVICES = ("cpu", "cuda", "cuda:1")


# --- comparing what came back -------------------------------------------------------------------------------------


def assert_same(loaded, original, where="obj"):
    """Same Python types all the way down; tensors and arrays equal byte for byte, with dtype, shape, device."""
    assert type(loaded) is type(original), f"{where}: {type(loaded).__name__} != {type(original).__name__}"
    if isinstance(original, flow.Tensor):
        assert (loaded.dtype, loaded.shape, loaded.requires_grad) == \
            (original.dtype, original.shape, original.requires_grad), where
        assert loaded.device == original.device, where
        assert loaded.is_leaf, where
        assert loaded.numpy().tobytes() == original.detach().numpy().tobytes(), where
    elif isinstance(original, (np.ndarray, np.generic)):
        assert (loaded.dtype, loaded.shape) == (original.dtype, original.shape), where
        assert np.asarray(loaded).tobytes() == np.asarray(original).tobytes(), where
    elif isinstance(original, dict):
        assert [(type(k), k) for k in loaded] == [(type(k), k) for k in original], where
        for key in original:
            assert_same(loaded[key], original[key], f"{where}[{key!r}]")
    elif isinstance(original, (list, tuple)):
        assert len(loaded) == len(original), where
        for i, (a, b) in enumerate(zip(loaded, original)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(original, float):
        assert (math.isnan(loaded) and math.isnan(original)) or \
            (loaded == original and math.copysign(1, loaded) == math.copysign(1, original)), where
    else:
        assert loaded == original, where


def round_trip(obj, path=None, **load_kwargs):
    """Save ``obj`` to ``path`` (None: to a BytesIO) and load it back."""
    if path is None:
        buffer = io.BytesIO()
        flow.save(obj, buffer)
        buffer.seek(0)
        return flow.load(buffer, **load_kwargs)
    flow.save(obj, path)
    return flow.load(path, **load_kwargs)


# --- random trees ----------------------------------------------------------------------------------------------------


@st.composite
def tensors(draw):
    dtype, shape = draw(all_dtypes), draw(shapes(max_dims=3, max_side=3))
    device = draw(st.sampled_from(DEVICES))
    data = values(shape, dtype, seed=draw(st.integers(0, 2**16)))
    if len(shape) >= 2 and draw(st.booleans()):   # a non-contiguous view: its values are what is saved
        t = flow.tensor(np.ascontiguousarray(data.swapaxes(0, 1)), device=device).transpose(0, 1)
    else:
        t = flow.tensor(data, device=device)
    if dtype.kind == "f" and draw(st.booleans()):
        t.requires_grad_(True)
    return t


arrays = st.builds(lambda dtype, shape, seed, scalar: values(shape, dtype, seed=seed)[()] if scalar and not shape
                   else values(shape, dtype, seed=seed),
                   all_dtypes, shapes(max_dims=2, max_side=3), st.integers(0, 2**16), st.booleans())
plain = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=6),
                  st.binary(max_size=6))
keys = st.one_of(st.text(max_size=4), st.integers(-3, 3), st.booleans(), st.none(), st.floats(-2, 2),
                 st.tuples(st.integers(0, 2), st.text(max_size=2)))


def containers(children):
    return st.one_of(st.lists(children, max_size=3), st.lists(children, max_size=3).map(tuple),
                     st.dictionaries(keys, children, max_size=3),
                     st.dictionaries(keys, children, max_size=3).map(collections.OrderedDict))


trees = st.recursive(st.one_of(plain, tensors(), arrays), containers, max_leaves=8)


@given(obj=trees, to_path=st.booleans())
def test_a_random_tree_round_trips_with_types_dtypes_shapes_values_devices_and_requires_grad(
        obj, to_path, tmp_path_factory):
    path = tmp_path_factory.mktemp("tree") / "tree.pf" if to_path else None
    assert_same(round_trip(obj, path), obj)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_dim_empty_and_every_dtype_on_each_device(device):
    obj = {str(d): [flow.tensor(values((2, 3), d, seed=1), device=device), flow.tensor(values((), d), device=device),
                    flow.zeros(0, 3, dtype=d, device=device)] for d in SUPPORTED_DTYPES}
    assert_same(round_trip(obj), obj)


def test_special_floats_keep_their_bits():
    obj = [flow.tensor(np.array([np.nan, -0.0, np.inf, -np.inf, 1e-45], np.float32)), math.nan, -0.0, math.inf,
           np.float16(np.nan), 2**80]
    assert_same(round_trip(obj), obj)


def test_a_view_saves_only_its_values_and_loads_contiguous():
    base = flow.arange(1000, dtype=flow.float32)
    view = base.reshape(10, 100)[2:4, ::50]             # 4 of the 1000 values, non-contiguous
    buffer = io.BytesIO()
    flow.save(view, buffer)
    assert buffer.tell() < 1000                          # not the 4000-byte storage
    buffer.seek(0)
    loaded = flow.load(buffer)
    assert loaded.is_contiguous() and loaded.tolist() == [[200.0, 250.0], [300.0, 350.0]]


def test_a_tensor_reached_twice_loads_as_one_object_and_a_parameter_stays_a_parameter():
    t = flow.ones(2)
    p = flow.nn.Parameter(flow.zeros(3))
    frozen = flow.nn.Parameter(flow.zeros(1), requires_grad=False)
    loaded = round_trip({"a": t, "b": [t, p], "c": frozen})
    assert loaded["a"] is loaded["b"][0]
    assert type(loaded["b"][1]) is flow.nn.Parameter and loaded["b"][1].requires_grad
    assert type(loaded["c"]) is flow.nn.Parameter and not loaded["c"].requires_grad


def test_a_non_leaf_loads_as_a_leaf_that_requires_grad_as_in_pytorch():
    x = flow.tensor([1.0, 2.0], requires_grad=True)
    loaded = round_trip(x * 3)
    assert loaded.is_leaf and loaded.requires_grad and loaded.grad_fn is None
    assert loaded.tolist() == [3.0, 6.0]


# --- modules and optimizers ------------------------------------------------------------------------------------------


def make_model(device, seed):
    flow.manual_seed(seed)
    return flow.nn.Sequential(flow.nn.Linear(4, 8), flow.nn.BatchNorm1d(8), flow.nn.ReLU(),
                              flow.nn.Linear(8, 2)).to(device)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_module_state_dict_save_load_gives_equal_outputs(device, tmp_path):
    model = make_model(device, seed=1)
    x = flow.tensor(values((5, 4), np.float32, seed=2), device=device)
    model(x)                                             # train mode: the running stats and the counter move
    model.eval()
    flow.save(model.state_dict(), tmp_path / "model.pf")
    other = make_model(device, seed=7).eval()
    assert not np.array_equal(other(x).numpy(), model(x).numpy())
    state = flow.load(tmp_path / "model.pf")
    assert type(state) is collections.OrderedDict and list(state) == list(model.state_dict())
    assert state["1.num_batches_tracked"].dtype == np.int64
    other.load_state_dict(state)
    np.testing.assert_array_equal(other(x).numpy(), model(x).numpy())


OPTIMIZERS = {
    "sgd-momentum": lambda ps: flow.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "adam": lambda ps: flow.optim.Adam(ps, lr=0.05, amsgrad=True, weight_decay=0.1),
}


@pytest.mark.parametrize("make, device", [(OPTIMIZERS["sgd-momentum"], "cpu"), (OPTIMIZERS["adam"], "cpu"),
                                          (OPTIMIZERS["sgd-momentum"], "cuda")],   # cuda: the simulator is slow
                         ids=["sgd-momentum-cpu", "adam-cpu", "sgd-momentum-cuda"])
def test_training_resumed_from_a_file_equals_training_that_never_stopped(make, device, tmp_path):
    batches = [(flow.tensor(values((6, 4), np.float32, seed=10 + k), device=device),
                flow.tensor(values((6, 2), np.float32, seed=20 + k), device=device)) for k in range(4)]

    def train(model, opt, steps):
        for x, y in steps:
            opt.zero_grad()
            flow.nn.MSELoss()(model(x), y).backward()
            opt.step()

    model = make_model(device, seed=3)
    opt = make(model.parameters())
    train(model, opt, batches[:2])
    flow.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 2}, tmp_path / "ckpt.pf")
    train(model, opt, batches[2:])                       # the run that never stopped

    checkpoint = flow.load(tmp_path / "ckpt.pf")
    resumed = make_model(device, seed=99)                # other weights: all must come from the file
    resumed_opt = make(resumed.parameters())
    resumed.load_state_dict(checkpoint["model"])
    resumed_opt.load_state_dict(checkpoint["optimizer"])
    assert checkpoint["epoch"] == 2 and sorted(checkpoint["optimizer"]["state"]) == list(range(6))
    train(resumed, resumed_opt, batches[2:])
    for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        np.testing.assert_array_equal(b.numpy(), a.numpy(), err_msg=name)
    assert_same(round_trip(resumed_opt.state_dict()), opt.state_dict())


# --- map_location ----------------------------------------------------------------------------------------------------


def saved_on_devices() -> io.BytesIO:
    buffer = io.BytesIO()
    flow.save({"cpu": flow.tensor([1.0]), "cuda0": flow.tensor([2.0], device="cuda:0"),
               "cuda1": flow.tensor([3.0], device="cuda:1", requires_grad=True)}, buffer)
    buffer.seek(0)
    return buffer


def devices_of(loaded) -> dict:
    assert [t.tolist() for t in loaded.values()] == [[1.0], [2.0], [3.0]] and loaded["cuda1"].requires_grad
    return {key: str(t.device) for key, t in loaded.items()}


@pytest.mark.parametrize("map_location, expected", [
    (None, ("cpu:0", "cuda:0", "cuda:1")),
    ("cpu", ("cpu:0", "cpu:0", "cpu:0")),
    (flow.device("cuda:2"), ("cuda:2", "cuda:2", "cuda:2")),
    ({"cuda:1": "cpu", "cpu": "cuda:3"}, ("cuda:3", "cuda:0", "cpu:0")),
    ({flow.device("cuda:0"): flow.device("cuda:1")}, ("cpu:0", "cuda:1", "cuda:1")),
    (lambda t, location: t, ("cpu:0", "cpu:0", "cpu:0")),                  # torch's "keep on the cpu" idiom
    (lambda t, location: None, ("cpu:0", "cuda:0", "cuda:1")),             # None: where it was saved
    (lambda t, location: t.to("cuda:2") if location == "cuda:1" else None, ("cpu:0", "cuda:0", "cuda:2")),
], ids=["none", "str", "device", "dict", "dict-of-devices", "callable", "callable-none", "callable-some"])
def test_map_location(map_location, expected):
    loaded = flow.load(saved_on_devices(), map_location=map_location)
    assert tuple(devices_of(loaded).values()) == expected


def with_data_json(buffer: io.BytesIO, edit) -> io.BytesIO:
    """A copy of a saved archive whose data.json text went through ``edit``."""
    out = io.BytesIO()
    with zipfile.ZipFile(buffer) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            target.writestr(info, edit(data.decode()).encode() if info.filename == "data.json" else data)
    out.seek(0)
    return out


def test_a_device_this_machine_lacks_names_map_location_and_a_dict_fixes_it():
    moved = with_data_json(saved_on_devices(), lambda text: text.replace('"cuda:1"', '"cuda:99"'))
    with pytest.raises(SerializationError, match=r"obj\['cuda1'\].*saved on cuda:99.*map_location"):
        flow.load(moved)
    moved.seek(0)
    assert devices_of(flow.load(moved, map_location={"cuda:99": "cuda:1"}))["cuda1"] == "cuda:1"


@pytest.mark.parametrize("map_location, error", [(3, ArgumentTypeError), ("tpu", DeviceError),
                                                 (lambda t, loc: t.numpy(), ArgumentTypeError)])
def test_a_bad_map_location_is_a_specific_error(map_location, error):
    with pytest.raises(error):
        flow.load(saved_on_devices(), map_location=map_location)


# --- global tensors: saved by value ----------------------------------------------------------------------------------


def test_global_tensors_are_saved_by_value_and_rebuilt_on_their_placement_and_sbp(tmp_path):
    path = str(tmp_path / "global.pf")
    logical = np.arange(12, dtype=np.float32).reshape(3, 4)
    layouts = {"S0": flow.sbp.split(0), "S1": flow.sbp.split(1), "B": flow.sbp.broadcast, "P": flow.sbp.partial_sum}

    def body():
        p = flow.placement("cpu", [0, 1])
        saved = {name: flow.tensor(logical, placement=p, sbp=sbp) for name, sbp in layouts.items()}
        saved["w"] = flow.tensor(logical, placement=p, sbp=flow.sbp.split(0), requires_grad=True)
        flow.save(saved, path)                           # every rank: numpy() of a global tensor is a collective
        loaded = flow.load(path)
        local = flow.load(path, map_location="cpu")
        return [(t.placement == p, t.sbp, t.requires_grad, t.to_local().numpy(), saved[k].to_local().numpy(),
                 t.numpy(), local[k].is_global, local[k].numpy()) for k, t in loaded.items()]

    for rank_result in flow.distributed.run(body, world_size=2):
        for (same_place, sbp, grad, piece, saved_piece, value, is_global, local), (name, expected) in \
                zip(rank_result, list(layouts.items()) + [("w", flow.sbp.split(0))]):
            assert same_place and sbp == (expected,) and grad == (name == "w"), name
            np.testing.assert_array_equal(piece, saved_piece, err_msg=name)   # each rank's piece, as saved
            np.testing.assert_array_equal(value, logical, err_msg=name)
            assert not is_global
            np.testing.assert_array_equal(local, logical, err_msg=name)
    # outside the world of two ranks: the logical value with a device, a clear error without
    assert flow.load(path, map_location="cpu")["P"].tolist() == logical.tolist()
    with pytest.raises(SerializationError, match=r"global tensor on placement.*map_location='cpu'"):
        flow.load(path)


# --- nothing runs: pickles -------------------------------------------------------------------------------------------


class Payload:
    """Unpickling this runs a shell command that creates ``marker``: what a malicious checkpoint does."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


def test_the_payload_really_runs_when_unpickled(tmp_path):   # so the tests below prove something
    pickle.loads(pickle.dumps(Payload(tmp_path / "ran")))
    assert (tmp_path / "ran").exists()


@pytest.mark.parametrize("weights_only", [True, False])
def test_a_bare_pickle_file_is_refused_and_not_run(weights_only, tmp_path):
    path, marker = tmp_path / "evil.pt", tmp_path / "marker"
    path.write_bytes(pickle.dumps({"weight": Payload(marker)}))
    with pytest.raises(SerializationError, match=f"{path}.*is a pickle") as raised:
        flow.load(path, weights_only=weights_only)
    assert raised.value.path == str(path) and not marker.exists()


def test_a_saved_pickle_is_refused_by_default_naming_file_and_class_and_runs_only_with_weights_only_false(tmp_path):
    path, marker = tmp_path / "ckpt.pf", tmp_path / "marker"
    flow.save({"weight": flow.ones(2), "extra": [Payload(marker)]}, path)
    with pytest.raises(SerializationError, match=rf"{path} holds a pickled .*Payload at obj\['extra'\]\[0\].*"
                                                 "weights_only=False"):
        flow.load(path)
    assert not marker.exists()
    flow.load(path, weights_only=False)                  # the user said they trust it: the payload runs
    assert marker.exists()


class Holder:
    def __init__(self, t, note):
        self.t, self.note = t, note


def test_with_weights_only_false_an_object_round_trips_with_its_tensors_stored_as_arrays():
    t = flow.tensor([1.5, 2.5], device="cuda:1")
    loaded = round_trip({"holder": Holder(t, {1, 2}), "t": t}, weights_only=False)
    assert loaded["holder"].note == {1, 2} and loaded["holder"].t is loaded["t"]
    assert_same(loaded["t"], t)


def crafted(root, members) -> io.BytesIO:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("data.json", json.dumps({"format": "pyflow.save", "version": 1, "root": root}))
        for name, data in members.items():
            archive.writestr(name, data)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("kind", ["tensor", "ndarray"])
def test_an_npy_member_holding_a_pickled_object_array_is_refused_and_not_run(kind, tmp_path):
    marker, npy = tmp_path / "marker", io.BytesIO()
    np.save(npy, np.array([Payload(marker)], dtype=object), allow_pickle=True)
    root = {"type": kind, "file": "tensors/0.npy", "dtype": "object", "shape": [1], "requires_grad": False,
            "device": "cpu"}
    with pytest.raises(SerializationError, match="is corrupt.*cannot be read"):
        flow.load(crafted(root, {"tensors/0.npy": npy.getvalue()}), weights_only=False)
    assert not marker.exists()


# --- damaged and foreign files ---------------------------------------------------------------------------------------


def saved_bytes() -> bytes:
    buffer = io.BytesIO()
    flow.save({"w": flow.arange(6, dtype=flow.float32).reshape(2, 3), "step": 4, "name": "net"}, buffer)
    return buffer.getvalue()


SAVED = saved_bytes()


@settings(max_examples=40)
@given(keep=st.integers(0, len(SAVED) - 1))
def test_a_truncated_file_is_an_error_naming_the_file(keep, tmp_path_factory):
    path = tmp_path_factory.mktemp("cut") / "cut.pf"
    path.write_bytes(SAVED[:keep])
    with pytest.raises(SerializationError, match=str(path)) as raised:
        flow.load(path)
    assert raised.value.path == str(path) and isinstance(raised.value, (PyflowError, RuntimeError))


@settings(max_examples=40)
@given(data=st.one_of(st.binary(max_size=300), st.binary(max_size=300).map(lambda b: b"PK\x03\x04" + b),
                      st.binary(max_size=300).map(lambda b: b"PK\x03\x04" + b + b"PK\x05\x06" + bytes(18)),
                      st.binary(max_size=300).map(lambda b: b"\x80\x04" + b)))
def test_random_bytes_are_an_error_naming_the_file(data, tmp_path_factory):
    path = tmp_path_factory.mktemp("random") / "random.bin"
    path.write_bytes(data)
    with pytest.raises(SerializationError, match=str(path)):
        flow.load(path)


def test_any_damaged_byte_is_an_error_or_changes_nothing():
    original, errors = flow.load(io.BytesIO(SAVED)), 0
    for position in range(len(SAVED)):                   # every byte, three ways (a flag bit, the top bit, all)
        for flip in (0x01, 0x80, 0xFF):
            damaged = bytearray(SAVED)
            damaged[position] ^= flip
            try:
                loaded = flow.load(io.BytesIO(bytes(damaged)))
            except SerializationError as error:
                assert "<BytesIO object>" in str(error)
                errors += 1
            else:
                assert_same(loaded, original, f"byte {position} ^ {flip:#x}")   # e.g. a timestamp: no harm
    assert errors > 2 * len(SAVED)                       # most damage is caught (the CRCs, the headers)


def test_foreign_zips_empty_files_newer_versions_and_text_mode_are_clear_errors(tmp_path):
    npz = tmp_path / "arrays.npz"
    np.savez(npz, a=np.ones(2))
    with pytest.raises(SerializationError, match=f"{npz} is a zip archive but not one flow.save wrote"):
        flow.load(npz)
    (tmp_path / "empty.pf").write_bytes(b"")
    with pytest.raises(SerializationError, match="empty.pf is not a file flow.save wrote: it is empty"):
        flow.load(tmp_path / "empty.pf")
    newer = crafted(None, {})
    newer = with_data_json(newer, lambda text: text.replace('"version": 1', '"version": 2'))
    with pytest.raises(SerializationError, match="format version 2; this pyflow reads version 1"):
        flow.load(newer)
    with pytest.raises(SerializationError, match="unknown node"):
        flow.load(crafted({"type": "module", "name": "os"}, {}))
    with pytest.raises(SerializationError, match=r"tensors/0.npy\) are missing"):
        flow.load(crafted({"type": "ndarray", "file": "tensors/0.npy"}, {}))
    with pytest.raises(ArgumentTypeError, match="text mode"):
        flow.load(io.StringIO("PK"))


# --- saving never leaves a half-written file ------------------------------------------------------------------------


@pytest.mark.parametrize("failure", [OSError("disk full (simulated)"), KeyboardInterrupt()],
                         ids=["error", "interrupt"])
def test_an_interrupted_save_leaves_the_earlier_file_intact_and_nothing_else(failure, tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pf"
    flow.save({"epoch": 1, "w": flow.ones(3)}, path)
    before = path.read_bytes()
    real, calls = writer._write_array, []

    def write_then_fail(member, values):
        calls.append(values.shape)
        if len(calls) == 2:                              # the second array: half its bytes, then the failure
            member.write(b"\x93NUMPY" + bytes(40))
            raise failure
        real(member, values)

    monkeypatch.setattr(writer, "_write_array", write_then_fail)
    state = {"epoch": 2, "w": flow.zeros(3), "b": flow.zeros(5)}
    with pytest.raises(type(failure)) as raised:
        flow.save(state, path)
    assert raised.value is failure                       # the simulated failure, not another error on the way
    assert path.read_bytes() == before and flow.load(path)["epoch"] == 1
    calls.clear()
    with pytest.raises(type(failure)):
        flow.save(state, tmp_path / "new.pf")
    calls.clear()
    buffer = io.BytesIO()
    with pytest.raises(type(failure)):
        flow.save(state, buffer)
    assert buffer.getvalue() == b""                      # a file object: nothing written either
    assert os.listdir(tmp_path) == ["ckpt.pf"]           # no new.pf, no temporary file left behind


def test_a_save_replaces_the_file_whole_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "ckpt.pf"
    for epoch in range(3):
        flow.save({"epoch": epoch}, str(path))
    assert flow.load(str(path)) == {"epoch": 2} and os.listdir(tmp_path) == ["ckpt.pf"]


# --- the format, and bad arguments -----------------------------------------------------------------------------------


def test_the_format_is_a_zip_of_json_and_npy_files_any_tool_can_read():
    buffer = io.BytesIO()
    flow.save(collections.OrderedDict(w=flow.tensor([[1, 2]], dtype=flow.int16, device="cuda:1"), lr=0.1), buffer)
    with zipfile.ZipFile(buffer) as archive:
        assert sorted(archive.namelist()) == ["data.json", "tensors/0.npy"]
        header = json.loads(archive.read("data.json"))
        array = np.load(io.BytesIO(archive.read("tensors/0.npy")), allow_pickle=False)
    assert header["format"] == "pyflow.save" and header["version"] == 1
    (_, w), (_, lr) = header["root"]["items"]
    assert w["device"] == "cuda:1" and w["dtype"] == "int16" and lr == 0.1
    assert array.dtype == np.int16 and array.tolist() == [[1, 2]]


def test_bad_arguments_and_unsavable_objects_are_specific_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        flow.save({}, tmp_path / "no" / "such" / "folder.pf")
    with pytest.raises(IsADirectoryError):
        flow.save({}, tmp_path)
    with pytest.raises(ArgumentTypeError, match="path .* or a binary file object"):
        flow.save({}, 3)
    with pytest.raises(ArgumentTypeError, match="weights_only must be True or False"):
        flow.load(tmp_path / "x.pf", weights_only="yes")
    with pytest.raises(ArgumentTypeError):
        flow.load(3)
    loop: list = []
    loop.append(loop)
    with pytest.raises(SerializationError, match=r"obj\[0\]\[0\] contains itself"):
        flow.save([loop], io.BytesIO())
    with pytest.raises(SerializationError, match=r"cannot save obj\['f'\] \(function\)"):
        flow.save({"f": lambda: 0}, io.BytesIO())
    with pytest.raises(FileNotFoundError):
        flow.load(tmp_path / "missing.pf")
