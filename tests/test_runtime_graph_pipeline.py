"""Successive nn.Graph calls pipeline: ``g(x)`` returns once its call's frontier acted, the rest runs on.

Properties: calls issued back to back and read in any order give the sequential interpreter's
numbers; at most ``outputs_buffer_size`` calls are in flight, and with room for more several are;
``numpy()`` of an output waits for that call only; eager ops issued right after a call (writing its
input or a parameter it reads, zeroing its output) neither reach the call nor hang; a failure in call
k raises at the reader of call k's output, naming the actor and the op.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import pyflow as flow
from pyflow import nn
from pyflow.errors import OpError
from pyflow.runtime.act import act
from pyflow.runtime.sequential import run_plan
from tests.test_runtime_graph import settle

W = np.array([[1.0, -2.0, 0.5], [0.0, 1.0, 1.5], [2.0, 0.5, -1.0]], np.float32)


def _graph(buffer: int = 2, slow_output: float = 0.0):
    """x @ w (w a captured parameter), relu, to cuda, + 1.  ``slow_output``: writing each call's output value
    takes that long in the VM (a kernel that sleeps, issued by the output task's act)."""
    w = flow.tensor(W)

    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.config.set_outputs_buffer_size(buffer)

        def build(self, x):
            return (x @ w).relu().to("cuda") + 1.0

    g = G()
    if slow_output:
        g.act_fn = slow_outputs(slow_output)
    return g, w


def slow_outputs(seconds: float):
    """An act whose output tasks also queue a kernel writing their (cuda) value that takes ``seconds`` on the
    device (the simulator's asynchronous stream): the VM goes on, the value is ready that much later."""
    def slow_kernel(stream, blob):
        stream.launch(time.sleep, seconds, name="slow kernel")

    def act_fn(plan, task, ins, outs, j, call):
        results = act(plan, task, ins, outs, j, call)
        if task.kind == "output":
            value = results[0]._blob
            flow.vm.run(lambda b: b.access_blob_by_callback(value, slow_kernel, "mut", name="slow kernel"))
        return results
    return act_fn


def _inputs(n: int) -> list:
    rng = np.random.default_rng(n)
    return [flow.tensor(rng.standard_normal((2, 3)).astype(np.float32)) for _ in range(n)]


def _expected(x) -> np.ndarray:
    return np.maximum(x.numpy() @ W, 0) + 1.0


def _side_graph(buffer: int, slow: float):
    """returns (x @ w).relu() + 1 (on the cpu); also works out (x * 3).exp() on cuda, returned nowhere, each act
    of that exp sleeping ``slow`` seconds (its own actor thread: the call goes on after its output is made)."""
    w = flow.tensor(W)

    class Side(nn.Graph):
        def __init__(self):
            super().__init__()
            self.config.set_outputs_buffer_size(buffer)

        def build(self, x):
            (x * 3.0).to("cuda").exp()
            return (x @ w).relu() + 1.0

    def sleepy(plan, task, ins, outs, j, call):
        if task.op_name == "exp_0":
            time.sleep(slow)
        return act(plan, task, ins, outs, j, call)

    g = Side()
    g.act_fn = sleepy
    return g


@pytest.mark.parametrize("buffer", [1, 3])
def test_calls_back_to_back_read_out_of_order_match_and_the_buffer_bounds_the_calls_in_flight(buffer):
    """Eight calls issued back to back (a slow side branch keeps each in flight after its output is made),
    their outputs read newest first: each equals the sequential interpreter's.  Sampled after every return,
    the calls in flight never exceed the outputs buffer size, and with room for several, several overlap;
    from the timeline, call n + size starts only after call n's sink acted."""
    g = _side_graph(buffer, slow=0.03)
    xs = _inputs(8)
    g(xs[0]).numpy()   # compile and warm up
    settle(g.runtime)
    plan = g.plan
    before = (plan.to_json(), sorted(vars(plan)))
    in_flight, ys = [], []
    for x in xs:
        ys.append(g(x))
        in_flight.append(len(g.runtime.calls_in_flight()))
    for x, y in reversed(list(zip(xs, ys))):
        np.testing.assert_array_equal(y.numpy(), _expected(x))
    np.testing.assert_array_equal(ys[3].numpy(), run_plan(g.plan, [xs[3]], g.job)[0].numpy())
    assert max(in_flight) <= buffer and (buffer == 1 or max(in_flight) >= 2), in_flight
    settle(g.runtime)
    timeline = g.runtime.timeline()
    source = {r.call: r.start for r in timeline if r.op_name == "source_tick"}
    sink = {r.call: r.end for r in timeline if r.op_name == "sink_tick"}
    assert all(source[n + buffer] >= sink[n] for n in sink if n + buffer in source)
    assert buffer == 1 or any(source[n + 1] < sink[n] for n in sink if n + 1 in source)   # calls overlapped
    # the runtime ran the Plan the compiler closed for this buffer, and neither it nor run_plan edited it
    assert g.runtime.plan is plan and plan.calls_in_flight == buffer
    assert (plan.to_json(), sorted(vars(plan))) == before


def test_each_ranks_calls_are_closed_by_its_ticks_in_the_compiled_plan_which_the_runtime_never_edits():
    """S(0) on ranks 0 and 1 -> B on rank 0, outputs buffer 3: in ``g.plan`` as compiled, every task that reads
    nothing (a recv) reads its rank's source tick's ctrl regst, every task nobody on its rank reads (a send)
    makes a ctrl regst its rank's sink tick reads, and the sink's ctrl regsts have regst num 3.  Four calls
    back to back on the actor runtime give the sequential interpreter's numbers, and the Plan after them is
    the Plan before."""
    S, B = flow.sbp.split, flow.sbp.broadcast

    def body():
        both, p0 = flow.placement("cpu", [0, 1]), flow.placement("cpu", [0])
        xs = [flow.tensor(np.arange(12, dtype=np.float32).reshape(4, 3) + 10 * i, placement=both, sbp=S(0))
              for i in range(4)]

        class G(nn.Graph):
            def __init__(self):
                super().__init__()
                self.config.set_outputs_buffer_size(3)

            def build(self, x):
                return ((x * 2.0).to_global(placement=p0, sbp=B) + 1.0).tanh()

        g = G()
        first = g(xs[0])
        plan = g.plan
        before = (plan.to_json(), sorted(vars(plan)))
        ticks = {(t.rank, t.op_type): t.task_id for t in plan.tasks.values() if t.op_type.endswith("_tick")}
        closed = []
        for task in plan.tasks.values():
            if task.op_type in ("source_tick", "sink_tick"):
                continue
            if task.op_type == "recv":
                (start,) = task.consumed["ctrl"]
                closed.append(plan.regsts[start].producer == ticks[task.rank, "source_tick"])
            if task.op_type == "send":
                end = plan.regsts[task.produced["ctrl"]]
                closed.append(end.consumers == [ticks[task.rank, "sink_tick"]])
        nums = {plan.regsts[rid].max_regst_num for t in plan.tasks.values() if t.op_type == "sink_tick"
                for rid in t.consumed["ctrl"]}
        ys = [first] + [g(x) for x in xs[1:]]
        got = [y.numpy() for y in ys]   # numpy() of a global tensor: every rank
        want = [run_plan(plan, [x], g.job)[0].numpy() for x in xs]
        same = g.runtime.plan is plan and (plan.to_json(), sorted(vars(plan))) == before
        return closed, nums, plan.calls_in_flight, same, got, want

    for closed, nums, calls, same, got, want in flow.distributed.run(body, world_size=2):
        assert closed and all(closed) and nums == {3} and calls == 3 and same
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def test_a_call_returns_before_it_is_over_and_numpy_waits_for_its_output():
    """Writing the output takes 0.3 s: ``g(x)`` returns well before (the call still in flight), ``numpy()`` of
    its output then waits for it and gives the call's value."""
    g, _ = _graph(2, slow_output=0.3)
    x = _inputs(1)[0]
    g(x).numpy()
    settle(g.runtime)
    start = time.perf_counter()
    y = g(x)
    returned = time.perf_counter() - start
    assert g.runtime.calls_in_flight() and returned < 0.25, returned
    np.testing.assert_array_equal(y.numpy(), _expected(x))
    assert time.perf_counter() - start >= 0.3


def test_eager_ops_right_after_a_call_neither_reach_it_nor_hang():
    """Right after ``y = g(x)``: ``x.add_`` and ``w.add_`` (its input and a parameter it reads) do not change
    y; ``y.zero_()`` (an op that keeps stream order and waits for y) runs after y was written, and the calls
    issued after it still finish.  (The copy to cuda is slow, so that the user's ``y.zero_()`` comes before
    the stream wait the copy's reader issues: were the output tasks not in the call's frontier, that wait
    would queue behind ``y.zero_()``, which waits for the output, which waits for it.  So the call after it
    runs in a thread of its own here, given 30 s.)"""
    g, w = _graph(3)

    def slow_copy(plan, task, ins, outs, j, call):
        if task.kind == "copy_h2d":
            time.sleep(0.05)
        return act(plan, task, ins, outs, j, call)

    g.act_fn = slow_copy
    xs = _inputs(3)
    g(xs[0]).numpy()
    want = [_expected(x) for x in xs]
    y0 = g(xs[0])
    xs[0].add_(100.0)
    w.add_(100.0)
    y1 = g(xs[1])   # reads the new w
    y1.zero_()
    done = {}
    caller = threading.Thread(target=lambda: done.update(y2=g(xs[2])), name="test-caller", daemon=True)
    caller.start()
    caller.join(30)
    assert "y2" in done, "g(x) issued after y.zero_() did not return (a VM deadlock)"
    y2 = done["y2"]
    np.testing.assert_array_equal(y0.numpy(), want[0])
    np.testing.assert_array_equal(y1.numpy(), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(y2.numpy(), np.maximum(xs[2].numpy() @ (W + 100.0), 0) + 1.0)


def test_a_failure_in_call_k_raises_at_the_reader_of_call_ks_output_naming_the_actor_and_the_op():
    """In call 2 the kernel of add_0 (the last op before the output, issued on the output's own actor thread)
    fails, as a rule after ``g(x)`` returned: calls 0 and 1 read right; reading call 2's output (or, if the
    runtime stopped before the call's frontier acted, the call itself) raises OpError naming the actor (the
    output's, or add_0's), the failed op and the error; a later call raises the same or ran on a new runtime
    and is right; the dead runtime's threads are gone."""
    g, _ = _graph(4)
    xs = _inputs(5)
    g(xs[0]).numpy()
    settle(g.runtime)
    runtime, failed = g.runtime, []

    def explode(stream, blob):
        raise ZeroDivisionError("kernel exploded")

    def failing(plan, task, ins, outs, j, call):
        results = act(plan, task, ins, outs, j, call)
        if task.op_name == "add_0" and call.inputs[0] is xs[2] and not failed:
            failed.append(True)
            flow.vm.run(lambda b: b.access_blob_by_callback(results[0]._blob, explode, "mut",
                                                            name="exploding kernel"))
        return results

    runtime.act_fn = failing
    ys = []
    for x in xs:
        try:
            ys.append(g(x))
        except OpError as error:
            ys.append(error)
    assert g.runtime is runtime or runtime.error is not None
    for i in (0, 1):
        np.testing.assert_array_equal(ys[i].numpy(), _expected(xs[i]))
    # (named by the output actor that hands the value over, or by add_0 itself if its other consumers heard first)
    with pytest.raises(OpError, match=r"(?s)actor \d+ \((output actor of op 'output_0'\) handing over output 0 of "
                                      r"call \d+|normal actor of op 'add_0'\): its device work failed).*"
                                      r"op 'exploding kernel'.*ZeroDivisionError: kernel exploded"):
        if isinstance(ys[2], OpError):   # (the runtime stopped before call 2's frontier acted: g raised it)
            raise ys[2]
        ys[2].numpy()
    for i in (3, 4):
        if isinstance(ys[i], OpError):
            assert "kernel exploded" in str(ys[i])
            continue
        try:
            np.testing.assert_array_equal(ys[i].numpy(), _expected(xs[i]))
        except OpError as error:
            assert "kernel exploded" in str(error)
    np.testing.assert_array_equal(g(xs[3]).numpy(), _expected(xs[3]))
    assert g.runtime is not runtime and runtime.closed
    assert not [t for t in runtime.threads() if t.is_alive()]


def test_the_deterministic_executor_runs_each_call_to_the_end_before_returning():
    g, _ = _graph(3)
    g.executor = "deterministic"
    xs = _inputs(3)
    ys = []
    for x in xs:
        ys.append(g(x))
        assert g.runtime.calls_in_flight() == [] and not g.runtime.threads()
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y.numpy(), _expected(x))


def test_calls_from_a_rank_pipeline_on_two_ranks():
    """Two stages on two ranks (an inference graph: stage 0 on rank 0, stage 1 on rank 1), six calls issued
    back to back on each rank, read afterwards: each is the eager value."""
    B = flow.sbp.broadcast

    def body():
        p0, p1 = flow.placement("cpu", [0]), flow.placement("cpu", [1])
        flow.manual_seed(2)
        a = nn.Linear(3, 4).to_global(placement=p0, sbp=B)
        b = nn.Linear(4, 2).to_global(placement=p1, sbp=B)

        class Pipe(nn.Graph):
            def __init__(self):
                super().__init__()
                self.a, self.b = a, b
                self.a.to(nn.graph.GraphModule).set_stage(0, p0)
                self.b.to(nn.graph.GraphModule).set_stage(1, p1)
                self.config.set_outputs_buffer_size(3)

            def build(self, x):
                return self.b(self.a(x).tanh())

        g = Pipe()
        xs = [flow.tensor(np.full((2, 3), 0.1 * i, np.float32), placement=p0, sbp=B) for i in range(6)]
        ys = [g(x) for x in xs]
        got = [y.numpy() for y in ys]
        want = [b(a(x).tanh().to_global(placement=p1, sbp=B)).numpy() for x in xs]
        return got, want

    for got, want in flow.distributed.run(body, world_size=2):
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_no_thread_is_left_after_the_graph_is_closed_with_calls_in_flight():
    before = set(threading.enumerate())
    g, _ = _graph(3, slow_output=0.02)
    ys = [g(x) for x in _inputs(4)]
    g._close_runtime()
    for y, x in zip(ys, _inputs(4)):
        np.testing.assert_array_equal(y.numpy(), _expected(x))
    assert not [t for t in threading.enumerate() if t not in before and t.name.startswith("pyflow-actor")]


def test_the_timeline_read_right_after_a_call_holds_all_of_its_acts():
    """``g(x)`` returns while a slow side branch still runs; ``g.runtime.timeline()`` waits for the calls in flight,
    so it holds every act of the call, the sink tick's included (``wait=False``: only the acts so far)."""
    g = _side_graph(buffer=2, slow=0.2)
    x = _inputs(1)[0]
    g(x).numpy()
    settle(g.runtime)
    acts = len(g.runtime.timeline())
    g(x)
    assert g.runtime.calls_in_flight()
    partial = g.runtime.timeline(wait=False)
    assert not [r for r in partial[acts:] if r.op_name == "exp_0"]
    records = g.runtime.timeline()[acts:]
    assert not g.runtime.calls_in_flight()
    assert sorted(r.actor_id for r in records) == sorted(g.runtime.actors)   # each actor once per call
    assert {"exp_0", "sink_tick"} <= {r.op_name for r in records}


def test_flow_sync_and_flow_trace_wait_for_the_graph_calls_in_flight():
    """``flow.sync()`` right after ``g(x)`` returns only once the call is over (as in OneFlow, where the call's
    LaunchLazyJob lasts that long), and ``flow.trace()`` records the acts of the calls made inside it, their
    last acts (the slow side branch, the sink tick) included."""
    g = _side_graph(buffer=2, slow=0.2)
    x = _inputs(1)[0]
    g(x).numpy()
    settle(g.runtime)
    g(x)
    assert g.runtime.calls_in_flight()
    flow.sync()
    assert not g.runtime.calls_in_flight()
    with flow.trace() as tracer:
        g(x)
    names = {r.name.split(" (")[0] for r in tracer.records}
    assert {"act exp_0", "act sink_tick", "launch_lazy_job[Side]"} <= names, names
