"""Plan ids (``pyflow/compiler/ids.py``): OneFlow's bit layout, round trips, bad fields."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyflow.compiler.ids import (TaskId, decode_stream_id, decode_task_id, encode_stream_id, encode_task_id,
                                 per_rank_id, thread_id)
from pyflow.device import DeviceType
from pyflow.errors import ArgumentTypeError

tasks = st.builds(TaskId, rank=st.integers(0, 2**16 - 1), device_type=st.sampled_from(list(DeviceType)),
                  device_index=st.integers(0, 127), stream_index=st.integers(0, 2**15 - 1),
                  task_index=st.integers(0, 2**21 - 1))


@given(task=tasks)
def test_task_ids_round_trip_and_their_stream_is_their_thread(task):
    encoded = encode_task_id(task)
    assert 0 <= encoded < 2**64
    assert decode_task_id(encoded) == task
    assert thread_id(encoded) == encode_stream_id(task.stream_id)
    assert decode_stream_id(thread_id(encoded)) == task.stream_id


@given(a=tasks, b=tasks)
def test_different_tasks_have_different_ids_and_ids_order_by_rank_first(a, b):
    assert (encode_task_id(a) == encode_task_id(b)) == (a == b)
    if a.rank < b.rank:
        assert encode_task_id(a) < encode_task_id(b)


def test_each_field_sits_where_oneflow_puts_it():
    def only(**fields):
        base = dict(rank=0, device_type=DeviceType.invalid, device_index=0, stream_index=0, task_index=0)
        return encode_task_id(TaskId(**{**base, **fields}))

    assert only(task_index=1) == 1
    assert only(stream_index=1) == 1 << 21
    assert only(device_index=1) == 1 << 36
    assert only(device_type=DeviceType.cpu) == 1 << 43
    assert only(device_type=DeviceType.cuda) == 2 << 43
    assert only(rank=1) == 1 << 48
    assert per_rank_id(3, 9) == (3 << 48) + 9


@pytest.mark.parametrize("fields", [dict(rank=2**16), dict(device_index=128), dict(stream_index=2**15),
                                    dict(task_index=2**21), dict(task_index=-1), dict(rank=1.0),
                                    dict(device_type="cuda")])
def test_a_field_out_of_its_bits_is_an_error_naming_it(fields):
    base = dict(rank=0, device_type=DeviceType.cpu, device_index=0, stream_index=0, task_index=0)
    name = next(iter(fields))
    with pytest.raises(ArgumentTypeError, match=name):
        TaskId(**{**base, **fields})
    with pytest.raises(ArgumentTypeError):
        decode_task_id(-1)
