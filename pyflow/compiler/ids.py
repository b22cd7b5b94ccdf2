"""Ids in a Plan, laid out bit by bit as OneFlow lays them out (seed 004; ``oneflow/core/graph/task_id.cpp``).

A **task id** (an actor's id at run time) is one int64 that says where the task
runs, high bits to low::

    |  rank  | device type | device index | stream index | task index |
    |   16   |      5      |       7      |      15      |     21     |   = 64 bits
    |<------------ device id ------------>|
    |<------------------- stream id ------------------->|

so ``task_id >> 21`` is the task's **stream id**: the thread that runs it (every
compute task of one device shares one stream index; copies and collectives get
their own).  A **thread id** is the stream id as its own int64 (rank | type |
index | stream index, low bits first).  Regst descs, mem blocks and chunks are
numbered per rank: ``(rank << 48) + counter``.

Device types use OneFlow's numbers, which ``pyflow.device.DeviceType`` shares
(cpu 1, cuda 2, mock 3).

>>> task = TaskId(rank=1, device_type=DeviceType.cuda, device_index=0, stream_index=3, task_index=7)
>>> encoded = encode_task_id(task)
>>> hex(encoded), decode_task_id(encoded) == task
('0x1100000600007', True)
>>> thread_id(encoded) == encode_stream_id(task.stream_id)
True
>>> per_rank_id(rank=2, counter=5)
562949953421317
"""

from __future__ import annotations

import dataclasses

from pyflow.device import DeviceType
from pyflow.errors import ArgumentTypeError

__all__ = ["TaskId", "StreamId", "encode_task_id", "decode_task_id", "encode_stream_id", "decode_stream_id",
           "thread_id", "per_rank_id", "RANK_BITS", "DEVICE_TYPE_BITS", "DEVICE_INDEX_BITS", "STREAM_INDEX_BITS",
           "TASK_INDEX_BITS"]

RANK_BITS, DEVICE_TYPE_BITS, DEVICE_INDEX_BITS, STREAM_INDEX_BITS, TASK_INDEX_BITS = 16, 5, 7, 15, 21
PER_RANK_SHIFT = 48   # regst desc, mem block and chunk ids: (rank << 48) + counter

# Shifts, low to high: the task index sits in the lowest bits.
_STREAM_INDEX_SHIFT = TASK_INDEX_BITS
_DEVICE_INDEX_SHIFT = _STREAM_INDEX_SHIFT + STREAM_INDEX_BITS
_DEVICE_TYPE_SHIFT = _DEVICE_INDEX_SHIFT + DEVICE_INDEX_BITS
_RANK_SHIFT = _DEVICE_TYPE_SHIFT + DEVICE_TYPE_BITS
assert _RANK_SHIFT + RANK_BITS == 64


def _check(name: str, value: int, bits: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < (1 << bits):
        raise ArgumentTypeError(f"{name} must be an int in [0, {1 << bits}) ({bits} bits), got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class StreamId:
    """Where a task runs: a stream (thread) of one device of one rank."""

    rank: int
    device_type: DeviceType
    device_index: int
    stream_index: int

    def __post_init__(self):
        _check("rank", self.rank, RANK_BITS)
        if not isinstance(self.device_type, DeviceType):
            raise ArgumentTypeError(f"device_type must be a DeviceType, got {self.device_type!r}")
        _check("device_index", self.device_index, DEVICE_INDEX_BITS)
        _check("stream_index", self.stream_index, STREAM_INDEX_BITS)


@dataclasses.dataclass(frozen=True)
class TaskId:
    """A task: its stream and its index among that stream's tasks."""

    rank: int
    device_type: DeviceType
    device_index: int
    stream_index: int
    task_index: int

    def __post_init__(self):
        StreamId(self.rank, self.device_type, self.device_index, self.stream_index)   # checks the fields
        _check("task_index", self.task_index, TASK_INDEX_BITS)

    @property
    def stream_id(self) -> StreamId:
        return StreamId(self.rank, self.device_type, self.device_index, self.stream_index)


def encode_stream_id(stream: StreamId) -> int:
    """The stream id as an int64: rank | device type | device index | stream index (a thread id)."""
    return (stream.rank << (_RANK_SHIFT - TASK_INDEX_BITS)
            | stream.device_type.value << (_DEVICE_TYPE_SHIFT - TASK_INDEX_BITS)
            | stream.device_index << (_DEVICE_INDEX_SHIFT - TASK_INDEX_BITS)
            | stream.stream_index)


def decode_stream_id(value: int) -> StreamId:
    return _decode(value << TASK_INDEX_BITS).stream_id


def encode_task_id(task: TaskId) -> int:
    """The task id as an int64 (an actor id)."""
    return encode_stream_id(task.stream_id) << TASK_INDEX_BITS | task.task_index


def _field(value: int, shift: int, bits: int) -> int:
    return (value >> shift) & ((1 << bits) - 1)


def _decode(value: int) -> TaskId:
    return TaskId(rank=_field(value, _RANK_SHIFT, RANK_BITS),
                  device_type=DeviceType(_field(value, _DEVICE_TYPE_SHIFT, DEVICE_TYPE_BITS)),
                  device_index=_field(value, _DEVICE_INDEX_SHIFT, DEVICE_INDEX_BITS),
                  stream_index=_field(value, _STREAM_INDEX_SHIFT, STREAM_INDEX_BITS),
                  task_index=_field(value, 0, TASK_INDEX_BITS))


def decode_task_id(value: int) -> TaskId:
    """The fields of an encoded task id (OneFlow's ``DecodeTaskIdFromInt64``)."""
    if not isinstance(value, int) or not 0 <= value < (1 << 64):
        raise ArgumentTypeError(f"a task id is a 64-bit non-negative int, got {value!r}")
    return _decode(value)


def thread_id(task_id: int) -> int:
    """The thread that runs actor ``task_id``: its stream id (OneFlow's ``ThrdId4ActorId``)."""
    return task_id >> TASK_INDEX_BITS


def per_rank_id(rank: int, counter: int) -> int:
    """A regst desc / mem block / chunk id: ``(rank << 48) + counter``."""
    _check("rank", rank, RANK_BITS)
    _check("counter", counter, PER_RANK_SHIFT)
    return (rank << PER_RANK_SHIFT) + counter
