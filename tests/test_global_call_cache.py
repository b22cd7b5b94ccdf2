"""The global interpreter decides each kind of call once (issue 31): counts of what a repeated step does.

A data-parallel step makes the same global op calls every step, on every rank.  The checks, the
logical inference, the SBP signature, which inputs to box and the outputs' ``GlobalInfo`` are worked
out on a call's first appearance (``global_ops._Call``) and looked up after, so a repeated step
re-derives nothing and a global op costs a handful of Python calls besides its local op.  Counts
only (cache lookups, Python calls, instructions, objects); no times.
"""

import pickle
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.distributed import global_ops
from pyflow.distributed.global_tensor import GlobalInfo
from pyflow.errors import DeviceError

FEATURES, HIDDEN, CLASSES, BATCH = 6, 5, 3, 8
# Python calls a repeated global op call makes in GlobalInterpreter.apply, outside its local op and its
# boxing: about 10 (the key: a hash per input's GlobalInfo; the context; a wrapper per piece).  It was
# about 39 when every call was checked, inferred and wrapped anew; a cache that missed would cost more.
CALLS_PER_OP = 14


def _step(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = flow.nn.CrossEntropyLoss()(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def _data_parallel(step_fn, steps: int = 2):
    """Train the MLP data-parallel on 2 ranks; ``step_fn(step)`` runs each step on each rank and reports."""
    rng = np.random.default_rng(0)
    data = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    labels = rng.integers(0, CLASSES, size=BATCH)

    def per_rank():
        flow.manual_seed(0)
        ranks = flow.placement("cpu", [0, 1])
        model = flow.nn.Sequential(flow.nn.Linear(FEATURES, HIDDEN), flow.nn.ReLU(), flow.nn.Linear(HIDDEN, CLASSES))
        model.to_global(ranks, flow.sbp.broadcast)
        optimizer = flow.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x = flow.tensor(data, placement=ranks, sbp=flow.sbp.split(0))
        y = flow.tensor(labels, placement=ranks, sbp=flow.sbp.split(0))
        _step(model, optimizer, x, y)   # the first step decides every kind of call
        return [step_fn(lambda: _step(model, optimizer, x, y)) for _ in range(steps)]

    return flow.distributed.run(per_rank, world_size=2, timeout=120)


def test_a_repeated_step_only_looks_its_calls_up(monkeypatch):
    chosen = []
    choose = global_ops.choose_signature
    monkeypatch.setattr(global_ops, "choose_signature", lambda *a: chosen.append(a[0]) or choose(*a))
    before = dict(global_ops.cache_stats)
    first = len(chosen)

    def counted(step):
        step()
        return len(chosen)

    reports = _data_parallel(counted, steps=3)
    assert all(n == reports[0][0] for report in reports for n in report), reports   # nothing chosen after step 1
    assert global_ops.cache_stats["hits"] - before["hits"] > 2 * 3 * 40   # ~50 global ops a step, per rank
    assert first <= reports[0][0]


def _python_calls_in_global_ops(step) -> tuple:
    """(global op calls, Python calls inside GlobalInterpreter.apply but outside its local op and boxing)."""
    counts = {"ops": 0, "calls": 0}
    stack = []

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            kind = None
            if code is GLOBAL_APPLY:
                kind = "global"
                counts["ops"] += 1
            elif code in OUTSIDE and "global" in stack:
                kind = "outside"
            if "global" in stack and "outside" not in stack and kind != "outside":
                counts["calls"] += 1
            stack.append(kind)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return counts["ops"], counts["calls"]


GLOBAL_APPLY = global_ops.GlobalInterpreter.apply.__code__
OUTSIDE = {flow.framework.interpreter.apply_local.__code__, global_ops._boxed.__code__}


def test_a_repeated_global_op_call_costs_a_handful_of_python_calls():
    for report in _data_parallel(_python_calls_in_global_ops):
        for ops, calls in report:
            assert ops > 40 and calls <= CALLS_PER_OP * ops, (ops, calls, calls / ops)


def test_each_kind_of_call_gives_its_outputs_one_global_info():
    def per_rank():
        ranks = flow.placement("cpu", [0, 1])
        x = flow.tensor(np.arange(8.0), placement=ranks, sbp=flow.sbp.split(0))
        y = flow.tensor(np.ones(8), placement=ranks, sbp=flow.sbp.broadcast)
        first, second, other = x + y, x + y, x * y
        return first._global is second._global, first._global is other._global, (second * 2).numpy()

    for same, shared, value in flow.distributed.run(per_rank, world_size=2):
        assert same and not shared   # one info per kind of call, its own per kind
        np.testing.assert_array_equal(value, 2 * (np.arange(8.0) + 1))


def test_a_call_seen_before_still_refuses_local_tensors_and_other_placements():
    def per_rank():
        on2, on1 = flow.placement("cpu", [0, 1]), flow.placement("cpu", [0])
        x = flow.tensor(np.arange(4.0), placement=on2, sbp=flow.sbp.split(0))
        x + x   # the kind of call is kept
        errors = []
        for other in (flow.tensor(np.arange(4.0)), flow.tensor(np.arange(4.0), placement=on1, sbp=flow.sbp.broadcast)):
            with pytest.raises(DeviceError) as caught:
                x + other
            errors.append(str(caught.value))
        return errors

    for mixed, placements in flow.distributed.run(per_rank, world_size=2):
        assert "global and local tensors mixed" in mixed and "different placements" in placements


def test_a_global_info_hashes_once_and_pickles_as_its_fields():
    with flow.env.bound(flow.env.RankContext(rank=0, world_size=2)):
        on2 = flow.placement("cpu", [0, 1])
        info = GlobalInfo(on2, (flow.sbp.split(0),), (4, 2))
        assert info._hash is None and hash(info) == info._hash == hash(GlobalInfo(on2, (flow.sbp.split(0),), (4, 2)))
        copy = pickle.loads(pickle.dumps(info))
        assert copy == info and copy._hash is None and hash(copy) == hash(info)
        assert info.layout is info.layout and info.layout.sbp == info.sbp
        assert info != GlobalInfo(on2, (flow.sbp.broadcast,), (4, 2))


def test_a_broadcast_boxed_to_a_split_on_its_rank_is_one_copy():
    """B -> S(0) (autograd's seed gradient, every step) slices each rank's piece: one contiguous copy, no
    empty output allocated first."""
    def per_rank():
        x = flow.tensor(np.arange(6.0), placement=flow.placement("cpu", [0, 1]), sbp=flow.sbp.broadcast)
        flow.sync()
        with flow.trace() as tracer:
            y = x.to_global(sbp=flow.sbp.split(0))
            flow.sync()
        return [r.name for r in tracer.records if r.name != "release_tensor"], y.to_local().numpy()

    (names0, piece0), (names1, piece1) = flow.distributed.run(per_rank, world_size=2)
    for names in (names0, names1):
        assert names.count("contiguous") == 1 and "empty" not in names and "collective" not in names, names
    np.testing.assert_array_equal(np.concatenate([piece0, piece1]), np.arange(6.0))


def _typed_equal(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is tuple:
        return len(a) == len(b) and all(_typed_equal(x, y) for x, y in zip(a, b))
    return a == b


_atoms = st.one_of(st.integers(-2, 2), st.floats(-2, 2, allow_nan=False), st.booleans())
_attrs = st.recursive(_atoms, lambda inner: st.tuples(inner) | st.tuples(inner, inner), max_leaves=6)


@settings(max_examples=200)
@given(a=st.tuples(_attrs, _attrs), b=st.tuples(_attrs, _attrs))
def test_a_tuple_attribute_keys_by_its_values_and_their_types(a, b):
    """``1`` and ``1.0`` (and ``True``) are equal in Python but infer different dtypes: a key tells them apart."""
    assert (global_ops._typed(a) == global_ops._typed(b)) == _typed_equal(a, b)
