"""Specification of ``pyflow.device.stream``: StreamType, its traits, Stream symbols, StreamMgr."""

from __future__ import annotations

import copy
import itertools
import pickle
import random
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyflow.device.device import Device, DeviceType
from pyflow.device.stream import (
    INDEPENDENT_THREAD_UID,
    WORKER_THREAD_UID,
    Stream,
    StreamMgr,
    StreamType,
    allocator_stream_type,
    default_stream,
    need_soft_sync,
    on_independent_thread,
    supports_stream_wait,
)
from pyflow.errors import DeviceError, StreamTypeError

S = StreamType
CPU, CUDA, MOCK = DeviceType.cpu, DeviceType.cuda, DeviceType.mock
ALL_PAIRS = list(itertools.product(StreamType, [CPU, CUDA, MOCK]))

# The specification, written out case by case (not computed from the implementation's sets).
SOFT_SYNC_TRUE = {(S.compute, CUDA), (S.compute, MOCK), (S.pinned_compute, CUDA), (S.pinned_compute, MOCK)}
STREAM_WAIT_TRUE = {
    (S.compute, CUDA), (S.host2device, CUDA), (S.device2host, CUDA), (S.ccl, CUDA), (S.pinned_compute, CUDA)
}
INDEPENDENT_TRUE = {S.critical_section, S.lazy_job_launcher}
ALLOCATOR_STREAM = {
    S.compute: S.compute,
    S.host2device: S.compute,
    S.device2host: S.device2host,
    S.ccl: S.compute,
    S.barrier: None,
    S.critical_section: None,
    S.lazy_job_launcher: None,
    S.pinned_compute: S.pinned_compute,
}


def _fresh_thread_uid() -> int:
    """A thread_uid no other test uses, so the keys built from it are new."""
    return random.randrange(10**6, 10**9)


@pytest.mark.parametrize("stream_type,device_type", ALL_PAIRS, ids=lambda x: x.name)
def test_need_soft_sync_table(stream_type: StreamType, device_type: DeviceType) -> None:
    assert need_soft_sync(stream_type, device_type) is ((stream_type, device_type) in SOFT_SYNC_TRUE)


@pytest.mark.parametrize("stream_type,device_type", ALL_PAIRS, ids=lambda x: x.name)
def test_supports_stream_wait_table(stream_type: StreamType, device_type: DeviceType) -> None:
    assert supports_stream_wait(stream_type, device_type) is ((stream_type, device_type) in STREAM_WAIT_TRUE)


@pytest.mark.parametrize("stream_type", list(StreamType), ids=lambda x: x.name)
def test_on_independent_thread_table(stream_type: StreamType) -> None:
    assert on_independent_thread(stream_type) is (stream_type in INDEPENDENT_TRUE)


@pytest.mark.parametrize("stream_type", list(StreamType), ids=lambda x: x.name)
def test_allocator_stream_type_table(stream_type: StreamType) -> None:
    assert allocator_stream_type(stream_type) is ALLOCATOR_STREAM[stream_type]


def test_stream_type_parse_accepts_every_name() -> None:
    assert [StreamType.parse(t.name) for t in StreamType] == list(StreamType)
    assert StreamType.parse(S.ccl) is S.ccl


@pytest.mark.parametrize("bad", ["gpu_compute", "Compute", "", "invalid", 1, None], ids=repr)
def test_unknown_stream_types_list_the_valid_ones(bad: object) -> None:
    with pytest.raises(StreamTypeError) as info:
        StreamType.parse(bad)
    assert repr(bad) in str(info.value)
    assert all(t.name in str(info.value) for t in StreamType)
    with pytest.raises(StreamTypeError):
        Stream.new("cuda", bad)


def test_thread_uid_defaults() -> None:
    assert INDEPENDENT_THREAD_UID == {S.critical_section: 1, S.lazy_job_launcher: 2}
    for stream_type in StreamType:
        expected = {S.critical_section: 1, S.lazy_job_launcher: 2}.get(stream_type, 0)
        assert Stream.new("cuda:0", stream_type).thread_uid == expected
    assert WORKER_THREAD_UID == 0


@pytest.mark.parametrize("stream_type,device_type", ALL_PAIRS, ids=lambda x: x.name)
def test_support_wait_event_defaults_to_the_trait(stream_type: StreamType, device_type: DeviceType) -> None:
    stream = Stream.new(Device(device_type), stream_type)
    assert stream.support_wait_event is ((stream_type, device_type) in STREAM_WAIT_TRUE)


def test_support_wait_event_can_be_turned_off_but_not_on() -> None:
    off = Stream.new("cuda:0", S.compute, support_wait_event=False)
    assert off.support_wait_event is False and off is not Stream.new("cuda:0", S.compute)
    with pytest.raises(StreamTypeError, match="cannot support stream wait"):
        Stream.new("cpu", S.compute, support_wait_event=True)


def test_ids_are_dense_in_creation_order() -> None:
    uid = _fresh_thread_uid()
    first = StreamMgr.num_streams()
    made = [Stream.new("mock:0", stream_type, uid + k) for k, stream_type in enumerate(StreamType)]
    assert [s.unique_stream_id for s in made] == list(range(first, first + len(made)))
    assert StreamMgr.num_streams() == first + len(made)


def test_same_key_gives_same_object_and_id() -> None:
    a = Stream.new("cuda:1", "host2device")
    ids_before = StreamMgr.num_streams()
    b = Stream.new(Device("cuda", 1), S.host2device, 0)
    c = Stream.new(Device(DeviceType.cuda, 1), "host2device", thread_uid=None, support_wait_event=True)
    assert a is b is c and a.unique_stream_id == b.unique_stream_id
    assert StreamMgr.num_streams() == ids_before  # nothing new was created
    assert default_stream("cuda") is Stream.new(Device("cuda:0"), S.compute)


def test_stream_for_id_round_trips() -> None:
    Stream.new("cpu")
    for uid in range(StreamMgr.num_streams()):
        assert StreamMgr.stream_for_id(uid).unique_stream_id == uid
    s = Stream.new("mock:1", S.ccl)
    assert StreamMgr.stream_for_id(s.unique_stream_id) is s
    for bad in (StreamMgr.num_streams(), -1, True, "0"):
        with pytest.raises(KeyError):
            StreamMgr.stream_for_id(bad)


def test_concurrent_creation_gives_no_duplicates() -> None:
    uid = _fresh_thread_uid()
    keys = [("mock:0", stream_type, uid + k) for k in range(10) for stream_type in (S.compute, S.ccl, S.barrier)]
    n_threads = 16
    barrier = threading.Barrier(n_threads)
    results: list[list[Stream]] = [[] for _ in range(n_threads)]

    def make(i: int) -> None:
        order = list(range(len(keys)))
        random.Random(i).shuffle(order)
        barrier.wait()
        results[i] = [None] * len(keys)  # type: ignore[list-item]
        for j in order:
            results[i][j] = Stream.new(*keys[j])

    first = StreamMgr.num_streams()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: races show up
    try:
        threads = [threading.Thread(target=make, args=(i,)) for i in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    for j in range(len(keys)):
        assert len({id(r[j]) for r in results}) == 1
    ids = sorted(r.unique_stream_id for r in results[0])
    assert ids == list(range(first, first + len(keys)))


def test_repr_format() -> None:
    s = Stream.new("cuda:0")
    assert repr(s) == f"stream(cuda:0, compute, uid={s.unique_stream_id})"
    t = Stream.new("cpu", S.device2host)
    assert repr(t) == f"stream(cpu:0, device2host, uid={t.unique_stream_id})"


def test_pickling_returns_the_interned_stream() -> None:
    s = Stream.new("cuda:1", S.critical_section)
    assert pickle.loads(pickle.dumps(s)) is s
    assert copy.copy(s) is s and copy.deepcopy(s) is s


def test_streams_are_immutable_and_not_directly_constructible() -> None:
    s = Stream.new("cpu")
    with pytest.raises(AttributeError):
        s._thread_uid = 5  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="Stream.new"):
        Stream(Device("cpu"), S.compute)  # type: ignore[call-arg]
    assert s.thread_uid == 0


@pytest.mark.parametrize(
    "kwargs,error",
    [
        (dict(device="gpu:0"), DeviceError),
        (dict(device=0), DeviceError),
        (dict(device="cuda", stream_type=3), StreamTypeError),
        (dict(device="cuda", thread_uid=-1), StreamTypeError),
        (dict(device="cuda", thread_uid=1.0), StreamTypeError),
        (dict(device="cuda", thread_uid=True), StreamTypeError),
        (dict(device="cuda", support_wait_event="yes"), StreamTypeError),
    ],
    ids=str,
)
def test_bad_arguments_are_rejected(kwargs: dict, error: type) -> None:
    with pytest.raises(error):
        Stream.new(**kwargs)


@settings(max_examples=50, deadline=None)
@given(
    st.sampled_from([CPU, CUDA, MOCK]),
    st.integers(0, 3),
    st.sampled_from(list(StreamType)),
    st.none() | st.integers(0, 5),
)
def test_new_is_idempotent_and_keeps_its_arguments(device_type, index, stream_type, thread_uid) -> None:
    s = Stream.new(Device(device_type, index), stream_type, thread_uid)
    assert Stream.new(f"{device_type.name}:{index}", stream_type.name, s.thread_uid) is s
    assert (s.device, s.stream_type) == (Device(device_type, index), stream_type)
    assert s.thread_uid == (INDEPENDENT_THREAD_UID.get(stream_type, 0) if thread_uid is None else thread_uid)
    assert s.need_soft_sync is need_soft_sync(stream_type, device_type)
    assert s.on_independent_thread is on_independent_thread(stream_type)
    assert StreamMgr.stream_for_id(s.unique_stream_id) is s
