"""A compiled call issues its ops from what its tasks decided once, in counts (never times; issue 31).

Properties: after a task's first act, its op is issued without ``apply`` (no inference, no checks, no
signature look-up per act: ``act.PreparedOpCall``), with values bit for bit those of eager; a training step of
a depth-8 MLP as a graph then makes fewer Python calls than the same step eager; a prepared call whose inputs
do not have the signature it was prepared for issues nothing and leaves the op to ``apply``; an input that
overlaps the memory an op writes is still copied first, however often its layout repeats; an actor thread's
poll loop hands a message to its actor without a call of its own; a fed value new at every call (the step
count) is filled without ``apply``; an act's ops keep their stream's order, so the VM fuses runs of them.
"""

from __future__ import annotations

import collections
import threading

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.framework.op_registry import get_op
from pyflow.runtime import Runtime
from pyflow.runtime.act import PreparedOpCall
from pyflow.runtime.pipeline import linear_pipeline_plan
from tests.helpers_training import calls_of, profiled, training_steps


def test_a_compiled_training_step_issues_its_ops_without_apply_and_beats_eager_in_python_calls():
    graph_step, eager_step, g, (model, eager) = training_steps(6, [8] * 7, 3, seed=7)   # depth 8
    graph_stats, eager_stats = profiled(graph_step, 3), profiled(eager_step, 3)
    tasks = len(g.plan.tasks)
    applies = calls_of(graph_stats, "interpreter.py", "apply") / 3
    assert applies <= 4, applies   # 101 per call before: every compute act; now the output's clone (an empty and
    #                                a copy) and the learning rate's and momentum's fill_ in their variables
    assert graph_stats.total_calls < eager_stats.total_calls, (graph_stats.total_calls, eager_stats.total_calls)
    assert graph_stats.total_calls / 3 / tasks < 140, graph_stats.total_calls / 3 / tasks   # 155 before
    for p, q in zip(model.parameters(), eager.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_a_prepared_call_leaves_inputs_of_another_signature_to_apply():
    a, b = flow.randn(2, 3), flow.randn(2, 3)
    call = PreparedOpCall.of(get_op("add"), [a, b], [], {})
    assert call is not None
    (out,) = call([a, b], [])
    np.testing.assert_array_equal(out.numpy(), (a + b).numpy())
    assert call([a.double(), b.double()], []) is None
    assert call([flow.randn(3, 2), flow.randn(3, 2)], []) is None
    into = PreparedOpCall.of(get_op("add"), [a, b], [flow.empty(2, 3)], {})
    assert into([a, b], [flow.empty(2, 3, dtype=flow.float64)]) is None   # the output's dtype is checked too
    assert PreparedOpCall.of(get_op("add"), [a, 1.5], [], {}) is None   # a number to convert: apply's work


@settings(max_examples=15, deadline=None)
@given(shift=st.integers(0, 3), length=st.integers(1, 4), calls=st.integers(2, 4), seed=st.integers(0, 2**16))
def test_an_input_overlapping_the_output_is_copied_at_every_act(shift, length, calls, seed):
    data = flow.tensor(np.random.default_rng(seed).standard_normal(8).astype(np.float32))
    source, target = data.narrow(0, shift, length), data.narrow(0, 2, length)
    call = PreparedOpCall.of(get_op("neg"), [source], [target], {})
    expected = data.numpy()
    for _ in range(calls):   # the same layouts at every act: the overlap decided once, the copy made each time
        want = expected.copy()
        want[2:2 + length] = -expected[shift:shift + length]
        (out,) = call([source], [target])
        assert out is target
        expected = data.numpy()
        np.testing.assert_array_equal(expected, want)


def test_an_actor_thread_hands_a_message_to_its_actor_without_a_call_of_its_own():
    """The threaded poll loop's usual case is inlined, as the deterministic loop's is (``thread.py``): ``handle``
    runs only for the constructs, not once per message (over a thousand here)."""
    handled = collections.Counter()

    def count(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "handle" and frame.f_code.co_filename.endswith("thread.py"):
            handled[threading.current_thread().name] += 1

    def zero_cost(plan, task, ins, outs, j, call):
        return outs
    plan = linear_pipeline_plan([f"stage{i}" for i in range(8)], regst_num=2)
    threading.setprofile(count)   # the actor threads start with the runtime: they are counted
    try:
        with Runtime(plan, deterministic=False, act_fn=zero_cost, max_calls_in_flight=4, timeline=0) as runtime:
            handles = [runtime.launch([]) for _ in range(60)]
            for handle in handles:
                handle.result(timeout=60)
    finally:
        threading.setprofile(None)
    actor_threads = {name: n for name, n in handled.items() if name.startswith("pyflow-actor")}
    assert actor_threads and sum(actor_threads.values()) <= len(plan.tasks), handled   # one per construct


def test_a_fed_value_new_at_every_call_is_filled_without_apply():
    """The optimizer's step count, a feed with a new value at every call, is filled through the first call's
    prepared ``fill`` with its own value (``act._refill``), as the learning rate is: no ``fill_`` through
    ``apply`` per call, and the step variable holds this call's count."""
    graph_step, eager_step, g, (model, eager) = training_steps(6, [8], 3, seed=3)
    losses = []
    stats = profiled(lambda: losses.append(graph_step()), 4)
    assert calls_of(stats, "inplace.py", "fill_") == 0   # 4 before: the step count's, at every call
    for loss in losses:
        np.testing.assert_array_equal(loss, eager_step())
    steps = [t for t, _ in g.job.feeds if t.dtype == flow.int64]
    assert len(steps) == 1 and steps[0].item() == g._optimizers[0][0]._graph_steps == 6
    for p, q in zip(model.parameters(), eager.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_an_acts_ops_keep_their_streams_order_so_the_vm_fuses_runs_of_them():
    """A prepared act's OpCall is in its stream's order (``sequential``): with the VM's scheduler held while a call
    issues, its acts' ops are fused into a few instructions (each one dispatch, one run, one release), and the
    call's loss and parameters still equal eager's bit for bit."""
    graph_step, eager_step, g, (model, eager) = training_steps(5, [8, 8], 3, seed=5)
    runtime = Runtime(g.plan, g.job, deterministic=True, max_calls_in_flight=1)
    try:
        x, y = (flow.tensor(a) for a in _batch(5, 3, seed=5))
        runtime.launch([x, y]).result()   # each task's first act (through apply), then prepared ones
        vm = flow.vm.get_vm()
        with flow.trace() as tracer:
            with vm._schedule_lock:   # every instruction of the call waits in the VM's pending list
                (loss,) = runtime.launch([x, y]).result()
            loss.numpy()
    finally:
        runtime.close()
    fused = [r for r in tracer.records if r.name.startswith("fuse[")]
    compute = sum(1 for t in g.plan.tasks.values() if t.kind == "compute" and t.op_type != "view")
    assert sum(r.count for r in fused) >= compute - 4, (compute, [r.name for r in tracer.records])
    assert len(fused) <= compute // 5, [r.name for r in fused]   # (the engine fuses up to 10 at a time)
    assert any("matmul" in r.name for r in fused)


def _batch(features: int, classes: int, seed: int):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((4, features)).astype(np.float32),
            rng.integers(0, classes, size=4).astype(np.int64))
