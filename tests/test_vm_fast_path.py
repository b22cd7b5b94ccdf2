"""The eager fast path (issue 18): the interpreter's inference cache and batched releases.

* **Inference cache** (``pyflow/framework/interpreter.py``, ``infer``): a call whose
  signature (op, each input's shape/dtype/device or scalar type, attributes) was seen
  before skips promotion and shape inference.  Any change of shape, dtype, device,
  scalar type or attribute type is a new signature: inferred and checked afresh, so
  results and errors are the same as without the cache.
* **Batched releases** (``InstructionsBuilder.release_tensors``): the storages whose
  tensors died since the last PhysicalRun are freed by ONE ReleaseTensor per producer
  stream.  Memory is still freed, and never while an instruction can still read it:
  checked under randomly delayed emulated streams, and shown to fail when the
  release's dependences are dropped.
"""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.device import ep
from pyflow.errors import OpError, ShapeError
from pyflow.framework import interpreter
from pyflow.framework.dtypes import result_type
from pyflow.framework.op_registry import OP_REGISTRY
from pyflow.vm.policies import ReleaseTensor
from tests.helpers_devices import EMULATED_STREAMS
from tests.test_vm_runtime import in_use


def _misses(fn) -> int:
    before = dict(interpreter.cache_stats)
    fn()
    return interpreter.cache_stats["misses"] - before["misses"]


# --- the inference cache ----------------------------------------------------------------------------


def test_a_repeated_signature_is_inferred_once() -> None:
    x, y = flow.ones(3), flow.ones(3)
    assert _misses(lambda: x + y) <= 1
    before = dict(interpreter.cache_stats)
    for _ in range(5):
        x + y
    assert interpreter.cache_stats["misses"] == before["misses"], "a seen signature was inferred again"
    assert interpreter.cache_stats["hits"] >= before["hits"] + 5


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple),
       other=st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple),
       dtype=st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.bool_]),
       scalar=st.sampled_from([2, 2.5, True]))
def test_cached_inference_matches_numpy_for_every_signature_change(shape, other, dtype, scalar) -> None:
    """The same op over changing shapes, dtypes and scalar types: torch's answer every time."""
    a = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape).astype(dtype)
    b = np.ones(other, dtype=np.float32)
    for _ in range(2):   # the second time from the cache
        ta, tb = flow.tensor(a), flow.tensor(b)
        try:
            expected = np.broadcast_shapes(shape, other)
        except ValueError:
            with pytest.raises(ShapeError):
                ta + tb
        else:
            result = ta + tb
            assert result.shape == expected
            assert result.dtype == result_type(ta, tb)
            np.testing.assert_allclose(result.numpy(), a.astype(result.dtype) + b.astype(result.dtype))
        with_scalar = ta * scalar
        assert with_scalar.dtype == result_type(ta, scalar), (dtype, scalar)


def test_a_device_change_is_a_new_signature() -> None:
    x = flow.tensor([1.0, -2.0])
    assert flow.relu(x).device == flow.device("cpu")
    cuda = flow.relu(x.to("cuda"))
    assert cuda.device == flow.device("cuda") and cuda.numpy().tolist() == [1.0, 0.0]


def test_an_attribute_type_is_part_of_the_signature() -> None:
    """``full(.., 1)`` is int64 and ``full(.., 1.0)`` float32: equal values, different types."""
    assert flow.full((2,), 1).dtype == np.int64
    assert flow.full((2,), 1.0).dtype == np.float32
    assert flow.full((2,), True).dtype == np.bool_


def test_a_bad_call_still_raises_after_a_good_one_with_the_same_op() -> None:
    x = flow.ones(2, 3)
    x @ flow.ones(3, 4)
    with pytest.raises(ShapeError):
        x @ flow.ones(2, 4)
    with pytest.raises(ShapeError):   # and again: a failed inference is never cached
        x @ flow.ones(2, 4)


def test_an_op_registered_again_is_not_served_from_the_cache(monkeypatch) -> None:
    x = flow.ones(2)
    assert flow.neg(x).shape == (2,)
    op = OP_REGISTRY["neg"]

    def infer_as_row(metas, attrs):
        (meta,) = metas
        return [dataclasses.replace(meta, shape=(1,) + tuple(meta.shape))]

    monkeypatch.setitem(OP_REGISTRY, "neg", dataclasses.replace(op, infer=infer_as_row))
    with pytest.raises(OpError, match="ShapeError"):   # the kernel gets the new inference's output shape
        flow.neg(x).numpy()


def test_unhashable_attributes_are_not_cached_but_work() -> None:
    x = flow.ones(2, 3)
    before = dict(interpreter.cache_stats)
    assert x.permute([1, 0]).shape == (3, 2)
    assert x.permute([1, 0]).shape == (3, 2)
    assert interpreter.cache_stats["hits"] >= before["hits"]


# --- batched releases ------------------------------------------------------------------------------


def test_tensors_dying_together_are_freed_by_one_release() -> None:
    flow.vm.shutdown()   # a VM of its own: what earlier tests left is freed into their allocator, not this count
    baseline = in_use()
    tensors = [flow.full((100,), float(i)) for i in range(12)]
    flow.sync()
    assert in_use() > baseline
    with flow.trace() as trace:
        del tensors
        gc.collect()
        keep = flow.ones(1)    # the next PhysicalRun issues the releases
        flow.sync()
    del keep
    releases = [r for r in trace.records if r.name == "release_tensor"]
    assert len(releases) == 1, [r.name for r in trace.records]
    gc.collect()
    flow.sync()
    assert in_use() == baseline, "a batch release left memory in use"


def _batch_program(seed: int, n: int, size: int) -> list:
    """Tensors on cuda read by slow readers on another stream (d2h) and the same stream, then
    all deleted at once; new tensors then take their memory.  Returns (got, expected) pairs."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(size).astype(np.float32) for _ in range(n)]
    ys = [flow.exp(flow.tensor(a, device="cuda")) for a in arrays]
    on_host = [y.to("cpu") for y in ys]          # read on the device2host stream
    doubled = [y * 2.0 for y in ys]              # read on the compute stream
    del ys
    gc.collect()
    fresh = [flow.full((size,), 1e6, device="cuda") for _ in range(n)]  # memory the releases gave back
    pairs = [(h.numpy(), np.exp(a)) for h, a in zip(on_host, arrays)]
    pairs += [(d.numpy(), 2 * np.exp(a)) for d, a in zip(doubled, arrays)]
    assert all((f.numpy() == 1e6).all() for f in fresh)
    return pairs


def _run_delayed(seed: int, n: int, size: int) -> list:
    flow.vm.shutdown()
    try:
        with ep.emulation(max_delay=0.003, seed=seed):
            return _batch_program(seed, n, size)
    finally:
        flow.vm.shutdown()


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 5), size=st.sampled_from([4, 64]))
def test_a_batch_release_never_frees_memory_an_instruction_still_reads(seed, n, size) -> None:
    for got, expected in _run_delayed(seed, n, size):
        np.testing.assert_allclose(got, expected, rtol=1e-5)


@EMULATED_STREAMS   # a mutation check: only emulated streams lag enough behind the host to expose it
def test_the_batch_property_fails_when_releases_ignore_their_readers(monkeypatch) -> None:
    """Mutation check: a ReleaseTensor that waits for nobody frees memory still being read."""
    monkeypatch.setattr(ReleaseTensor, "output_dependences", lambda self: [])
    wrong = 0
    for seed in range(6):
        try:
            pairs = _run_delayed(seed, 4, 64)
        except Exception:  # noqa: BLE001 - a read of freed memory may also fail outright
            wrong += 1
            continue
        wrong += any(not np.allclose(g, e, rtol=1e-5) for g, e in pairs)
    assert wrong > 0, "dropping the release's dependences went unnoticed: the property cannot see it"


# --- the throttle on memory allocated ahead ------------------------------------------------------------


def _peak_of_a_big_chain(monkeypatch, ahead_bytes: int) -> int:
    """Peak bytes in use while a chain of 4 MiB ops runs on a fresh threaded VM."""
    from pyflow.vm import engine

    monkeypatch.setattr(engine, "AHEAD_BYTES", ahead_bytes)
    flow.vm.shutdown()
    try:
        n = 1 << 20   # 4 MiB of float32
        x, y = flow.full((n,), 0.5), flow.full((n,), 0.25)
        for _ in range(16):
            x = flow.exp(-(x * y))    # the worker needs far longer than the issuing thread
        assert abs(float(x.numpy()[0]) - _reference_chain(16)) < 1e-5
        return flow.vm.get_vm().allocator(flow.device("cpu"), flow.StreamType.compute).stats().peak_in_use
    finally:
        flow.vm.shutdown()


def _reference_chain(steps: int) -> float:
    x = np.float32(0.5)
    for _ in range(steps):
        x = np.exp(-(x * np.float32(0.25)), dtype=np.float32)
    return float(x)


def test_a_thread_issuing_big_ops_does_not_allocate_far_ahead_of_the_worker(monkeypatch) -> None:
    mib = 1 << 20
    throttled = _peak_of_a_big_chain(monkeypatch, 8 * mib)
    # live x and y, the ops allowed ahead (8 MiB), the one being computed, releases on their way
    assert throttled <= 40 * mib, f"peak {throttled / mib:.0f} MiB"
    unthrottled = _peak_of_a_big_chain(monkeypatch, 1 << 40)
    assert unthrottled > throttled + 16 * mib, (
        f"without the throttle the peak ({unthrottled / mib:.0f} MiB) should be far higher than with it "
        f"({throttled / mib:.0f} MiB): the test cannot see the throttle")
