"""Specification of ``pyflow.device.device``: DeviceType and the interned Device symbol."""

from __future__ import annotations

import copy
import pickle
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyflow.device.device import Device, DeviceType
from pyflow.errors import DeviceError

VALID_TYPES = [t for t in DeviceType if t is not DeviceType.invalid]
device_types = st.sampled_from(VALID_TYPES)
indices = st.integers(min_value=0, max_value=10_000)


@settings(max_examples=60, deadline=None)
@given(device_types, indices)
def test_str_round_trip_returns_the_same_object(device_type: DeviceType, index: int) -> None:
    d = Device(device_type, index)
    assert str(d) == f"{device_type.name}:{index}"
    assert Device(str(d)) is d


@settings(max_examples=60, deadline=None)
@given(device_types, indices)
def test_repr_format_is_exact(device_type: DeviceType, index: int) -> None:
    assert repr(Device(device_type, index)) == f"device(type='{device_type.name}', index={index})"


@settings(max_examples=60, deadline=None)
@given(device_types, indices)
def test_every_accepted_spelling_gives_one_object(device_type: DeviceType, index: int) -> None:
    name = device_type.name
    d = Device(f"{name}:{index}")
    spellings = [Device(name, index), Device(device_type, index), Device(d), Device(name, np.int64(index))]
    assert all(s is d for s in spellings)
    assert (d.type, d.device_type, d.index) == (name, device_type, index)


@pytest.mark.parametrize("device_type", VALID_TYPES, ids=lambda t: t.name)
def test_type_alone_means_index_zero(device_type: DeviceType) -> None:
    assert Device(device_type.name) is Device(device_type) is Device(f"{device_type.name}:0")
    assert Device(device_type.name).index == 0


def test_cpu_str_is_cpu_colon_zero() -> None:
    assert str(Device("cpu")) == "cpu:0"


def test_interning_is_thread_safe() -> None:
    # A key nobody made before, requested by many threads released at the same instant.
    index = 900_000 + threading.get_ident() % 1000
    n_threads = 32
    barrier = threading.Barrier(n_threads)
    got: list[Device] = []

    def make() -> None:
        barrier.wait()
        for _ in range(50):
            got.append(Device("mock", index))

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: races show up
    try:
        threads = [threading.Thread(target=make) for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    assert len(got) == n_threads * 50
    assert len({id(d) for d in got}) == 1


@settings(max_examples=30, deadline=None)
@given(device_types, indices)
def test_pickling_returns_the_interned_object(device_type: DeviceType, index: int) -> None:
    d = Device(device_type, index)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(d, protocol=protocol)) is d
    assert copy.copy(d) is d and copy.deepcopy(d) is d


def test_devices_are_immutable() -> None:
    d = Device("cuda:1")
    with pytest.raises(AttributeError):
        d.index = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        d._index = 2  # type: ignore[attr-defined]
    assert d.index == 1


def test_devices_work_as_dict_keys() -> None:
    table = {Device("cuda:0"): "a", Device("cuda:1"): "b", Device("cpu"): "c"}
    assert table[Device("cuda", 1)] == "b"
    assert Device("cuda:0") != Device("cuda:1") and Device("cuda:0") != Device("mock:0")


def test_index_existence_is_not_checked_here() -> None:
    assert Device("cuda:99").index == 99  # the ep registry checks existence, not Device


# ids=repr: a bare id "gpu" would look like the gpu marker to tests/conftest.py and be skipped
@pytest.mark.parametrize("spec", ["gpu:0", "gpu", "CUDA:0", "tpu:1"], ids=repr)
def test_unknown_type_lists_the_valid_types(spec: str) -> None:
    with pytest.raises(DeviceError) as info:
        Device(spec)
    message = str(info.value)
    assert "unknown device type" in message and repr(spec.split(":")[0]) in message
    assert "cpu, cuda, mock" in message


@pytest.mark.parametrize("spec", ["cuda:", "cuda:x", "cuda:1:2", " cuda", "cuda ", "", "cuda: 1", ":1", "cuda:1.0"])
def test_malformed_strings_say_what_is_expected(spec: str) -> None:
    with pytest.raises(DeviceError) as info:
        Device(spec)
    message = str(info.value)
    assert "malformed device string" in message and repr(spec) in message
    assert "'type:index'" in message


@pytest.mark.parametrize("args", [("cuda:-1",), ("cuda", -1), (DeviceType.cuda, -3), ("cpu:-0007",)], ids=str)
def test_negative_index_is_rejected(args: tuple) -> None:
    with pytest.raises(DeviceError, match="negative device index"):
        Device(*args)


@pytest.mark.parametrize("index", [True, False, 1.0, "1", 2.5, [1]], ids=repr)
def test_non_int_index_is_rejected(index: object) -> None:
    with pytest.raises(DeviceError) as info:
        Device("cuda", index)
    assert "must be a non-negative int" in str(info.value) and type(index).__name__ in str(info.value)


@pytest.mark.parametrize("args", [("cuda:1", 0), ("cuda:1", 1), (Device("cuda:1"), 1)], ids=str)
def test_index_given_twice_is_rejected(args: tuple) -> None:
    with pytest.raises(DeviceError, match="index given twice"):
        Device(*args)


@pytest.mark.parametrize("spec", ["invalid", "invalid:0", DeviceType.invalid], ids=str)
def test_type_invalid_is_rejected(spec: object) -> None:
    with pytest.raises(DeviceError) as info:
        Device(spec)
    assert "'invalid' cannot be used" in str(info.value) and "cpu, cuda, mock" in str(info.value)


@pytest.mark.parametrize("spec", [3, None, 1.5, ("cuda", 1)], ids=repr)
def test_non_string_specs_are_rejected(spec: object) -> None:
    with pytest.raises(DeviceError, match="cannot make a device from"):
        Device(spec)


def test_device_type_parse_accepts_names_and_members() -> None:
    assert [DeviceType.parse(t.name) for t in VALID_TYPES] == VALID_TYPES
    assert DeviceType.parse(DeviceType.mock) is DeviceType.mock
    with pytest.raises(DeviceError, match="unknown device type 'gpu'"):
        DeviceType.parse("gpu")
