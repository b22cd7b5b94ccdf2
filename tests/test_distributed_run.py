"""``flow.distributed.run`` and the in-process transport: ranks as threads acting as processes.

Properties: each rank sees its own rank context (rank, world size, local rank,
its own VM); results come back in rank order; every collective of the
transport equals its numpy definition for random groups, shapes and
contributions; and nothing hangs: an exception on one rank, divergent
collectives, a rank that returns early and a rank that never arrives all end
every rank within a bound, with an error naming the rank and the Python line.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import env
from pyflow.distributed import CollectiveDesc
from pyflow.framework.sbp import balanced_split
from pyflow.errors import CollectiveMismatchError, CollectiveTimeoutError, DistributedError, RankError
from tests.helpers_devices import cuda_devices

run = flow.distributed.run


def desc(op, shape=(), site=("test", 0)):
    return CollectiveDesc(op, tuple(shape), "float64", site=site)


def transport():
    return env.current().transport


# --- ranks behave as processes ----------------------------------------------------------------------------


def test_each_rank_sees_its_own_rank_context_and_results_come_back_in_rank_order():
    def body():
        return (flow.env.get_rank(), flow.env.get_world_size(), flow.env.get_local_rank(),
                id(flow.vm.get_vm()), threading_name())

    results = run(body, world_size=4)
    assert [r[:3] for r in results] == [(r, 4, r) for r in range(4)]
    assert len({r[3] for r in results}) == 4, "ranks shared a VM"
    assert [r[4] for r in results] == [f"pyflow-rank-{r}" for r in range(4)]
    assert flow.env.get_rank() == 0 and flow.env.get_world_size() == 1  # the caller is untouched


def threading_name():
    import threading

    return threading.current_thread().name


@cuda_devices(3)   # rank r's tensor is on cuda:r
def test_ranks_compute_with_their_own_vm_and_no_thread_survives():
    import threading

    before = {t.name for t in threading.enumerate()}

    def body():
        x = flow.tensor([1.0, 2.0], device="cuda") * (flow.env.get_rank() + 1)
        return x.numpy().tolist()

    assert run(body, world_size=3) == [[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]]
    time.sleep(0.1)
    left = {t.name for t in threading.enumerate()} - before
    assert not {n for n in left if n.startswith(("pyflow-rank", "pyflow-vm"))}, left


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "2"])
def test_world_size_must_be_a_positive_int(bad):
    with pytest.raises(DistributedError):
        run(lambda: None, world_size=bad)


# --- collectives equal their definitions ---------------------------------------------------------------------


@settings(max_examples=15)
@given(world=st.integers(1, 4), data=st.data())
def test_every_collective_equals_its_numpy_definition(world, data):
    group = tuple(sorted(data.draw(st.sets(st.integers(0, world - 1), min_size=1), label="group")))
    n = len(group)
    shape = data.draw(st.tuples(st.integers(1, 4), st.integers(0, 3)), label="shape")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    inputs = {r: rng.standard_normal(shape) for r in group}
    pieces = {r: [rng.standard_normal((k, shape[1])) for k in range(1, n + 1)] for r in group}
    root = data.draw(st.sampled_from(group))
    bounds = balanced_split(shape[0], n)

    def body():
        rank, t = flow.env.get_rank(), transport()
        if rank not in group:
            return None
        out = {}
        for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "barrier"):
            seq = t.next_seq(group)
            d = desc(op, shape)
            if op == "all_reduce":
                out[op] = t.all_reduce(inputs[rank], group, seq, d)
            elif op == "all_gather":
                out[op] = t.all_gather(inputs[rank], group, seq, d, axis=1)
            elif op == "reduce_scatter":
                out[op] = t.reduce_scatter(inputs[rank], group, seq, d, bounds, axis=0)
            elif op == "broadcast":
                out[op] = t.broadcast(inputs[rank], root, group, seq, d)
            elif op == "reduce":
                out[op] = t.reduce(inputs[rank], root, group, seq, d)
            elif op == "all_to_all":
                out[op] = t.all_to_all(pieces[rank], group, seq, d)
            else:
                out[op] = t.barrier(group, seq, d)
        return out

    results = run(body, world_size=world)
    total = sum(inputs[r] for r in group)
    for i, rank in enumerate(group):
        out = results[rank]
        np.testing.assert_allclose(out["all_reduce"], total)
        np.testing.assert_array_equal(out["all_gather"], np.concatenate([inputs[r] for r in group], axis=1))
        start, stop = bounds[i]
        np.testing.assert_allclose(out["reduce_scatter"], total[start:stop])
        np.testing.assert_array_equal(out["broadcast"], inputs[root])
        if rank == root:
            np.testing.assert_allclose(out["reduce"], total)
        else:
            assert out["reduce"] is None
        for j, src in enumerate(group):
            np.testing.assert_array_equal(out["all_to_all"][j], pieces[src][i])
    assert all(results[r] is None for r in range(world) if r not in group)


def test_point_to_point_messages_arrive_in_order_and_are_copies():
    def body():
        t, rank = transport(), flow.env.get_rank()
        if rank == 0:
            a = np.arange(3.0)
            t.send(a, dst=1, tag=7)
            a[:] = -1  # the message was copied when sent
            t.send(np.full(2, 9.0), dst=1, tag=7)
            return None
        return [t.recv(src=0, tag=7).tolist(), t.recv(src=0, tag=7).tolist()]

    assert run(body, world_size=2)[1] == [[0.0, 1.0, 2.0], [9.0, 9.0]]


# --- nothing hangs -----------------------------------------------------------------------------------------------


def test_an_exception_on_one_rank_stops_every_rank_and_names_it():
    def body():
        t = transport()
        if flow.env.get_rank() == 2:
            raise ValueError("rank 2 breaks")
        t.barrier((0, 1, 2), t.next_seq((0, 1, 2)), desc("barrier"))  # would wait for rank 2 forever

    start = time.monotonic()
    with pytest.raises(RankError) as info:
        run(body, world_size=3, timeout=30)
    assert time.monotonic() - start < 5
    assert info.value.rank == 2 and "rank 2 of 3 failed" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)


def test_divergent_collectives_raise_on_every_rank_naming_each_ranks_op_and_line():
    def body():
        t, g = transport(), (0, 1)
        site = ("script.py", 10 + flow.env.get_rank())
        if flow.env.get_rank() == 0:
            return t.all_reduce(np.ones(2), g, t.next_seq(g), desc("all_reduce", (2,), site))
        return t.all_gather(np.ones(2), g, t.next_seq(g), desc("all_gather", (2,), site))

    with pytest.raises(RankError) as info:
        run(body, world_size=2, timeout=30)
    message = str(info.value.__cause__)
    assert isinstance(info.value.__cause__, CollectiveMismatchError)
    assert "rank 0: all_reduce float64[2] (at script.py:10)" in message
    assert "rank 1: all_gather float64[2] (at script.py:11)" in message


def test_a_rank_that_returns_without_reaching_a_collective_is_reported_at_once():
    def body():
        t, g = transport(), (0, 1)
        if flow.env.get_rank() == 0:
            t.barrier(g, t.next_seq(g), desc("barrier", site=("script.py", 3)))

    start = time.monotonic()
    with pytest.raises(RankError) as info:
        run(body, world_size=2, timeout=30)
    assert time.monotonic() - start < 5
    assert "rank 1 returned from its function" in str(info.value.__cause__)
    assert "script.py:3" in str(info.value.__cause__)


def test_collectives_of_different_groups_that_wait_for_each_other_are_reported_at_once():
    def body():
        t, rank = transport(), flow.env.get_rank()
        g = (0, 1) if rank == 0 else (0, 1, 2)
        if rank in (0, 1):
            t.barrier(g, t.next_seq(g), desc("barrier"))

    start = time.monotonic()
    with pytest.raises(RankError) as info:
        run(body, world_size=3, timeout=30)
    assert time.monotonic() - start < 5
    assert isinstance(info.value.__cause__, CollectiveMismatchError)


def test_the_watchdog_names_a_rank_that_never_arrives():
    def body():
        t, g = transport(), (0, 1)
        if flow.env.get_rank() == 1:
            time.sleep(1.5)  # busy elsewhere, far longer than the watchdog allows
            return None
        t.barrier(g, t.next_seq(g), desc("barrier", site=("script.py", 5)))

    start = time.monotonic()
    with pytest.raises(RankError) as info:
        run(body, world_size=2, timeout=0.3)
    elapsed = time.monotonic() - start
    cause = info.value.__cause__
    assert isinstance(cause, CollectiveTimeoutError), cause
    assert "for rank(s) [1]" in str(cause) and "script.py:5" in str(cause)
    assert "rank 1: running" in str(cause)
    assert elapsed < 3


@settings(max_examples=30, deadline=None)
@given(op=st.sampled_from(["all_reduce", "all_gather", "to_global S(0)->B"]),
       shape=st.lists(st.integers(0, 9), max_size=3), lineno=st.integers(0, 40))
def test_a_descriptor_is_described_once_per_value_and_its_shape_is_a_tuple(op, shape, lineno):
    """``described()`` (the MPI transport's header text, cached per distinct descriptor) is ``describe()``, for
    equal descriptors made apart; a shape given as a list is kept as a tuple, so the descriptor is hashable."""
    first = CollectiveDesc(op, list(shape), "float32", "S(0)", (__file__, lineno))
    again = CollectiveDesc(op, tuple(shape), "float32", "S(0)", (__file__, lineno))
    assert first == again and hash(first) == hash(again)
    assert first.shape == tuple(shape) and first.key() == (op, tuple(shape), "float32", "S(0)")
    assert first.described() == again.described() == first.describe()
    assert (f"{__file__}:{lineno}" if lineno else f"(at {__file__})") in first.described()   # 0: no line to name


def test_a_rank_busy_in_its_own_code_does_not_hold_back_the_report_of_a_failed_one():
    """Rank 0 times out in a collective while rank 1 sits in user code (here an event, set after the
    report): run() raises at once with rank 0's error and names rank 1's line, instead of waiting for it."""
    import threading

    release = threading.Event()

    def body():
        if flow.env.get_rank() == 1:
            release.wait(60)   # the line the report names
            return 1
        x = flow.tensor(np.ones(2, np.float32), placement=flow.placement("cpu", [0, 1]), sbp=flow.sbp.split(0))
        return x.numpy().tolist()

    try:
        with pytest.raises(flow.errors.RankError) as caught:
            flow.distributed.run(body, 2, timeout=1)
        assert release.is_set() is False   # reported while rank 1 still waited
    finally:
        release.set()
    message = str(caught.value)
    assert "rank 0 of 2 failed" in message and "CollectiveTimeoutError" in message
    assert "rank(s) [1] still running" in message and "release.wait(60)" in message


def test_a_failed_ranks_tensors_give_their_memory_back_though_its_exception_keeps_them():
    """The RankError's traceback keeps the failed rank's frames, and so its tensors, alive; their VM is shut
    down, so no release would ever run: the shutdown gives their memory back (30 failed runs kept 180 MiB)."""
    from pyflow.device import StreamType

    allocators = []

    def body():
        held = flow.zeros(256, 1024, device="cuda")   # 1 MiB, referenced by this frame
        allocators.append(flow.vm.get_vm().allocator(held.device, StreamType.compute))
        flow.sync()
        assert allocators[0].stats().in_use >= held.numel() * 4
        raise ValueError("this rank fails, holding a tensor")

    caught = []
    for _ in range(3):
        try:
            flow.distributed.run(body, 1)
        except flow.errors.RankError as error:
            caught.append(error)   # kept: its traceback keeps the tensor alive
    assert len(caught) == 3 and len(allocators) == 3
    for allocator in allocators:
        stats = allocator.stats()
        assert stats.in_use == 0 and stats.reserved == 0, stats
