"""nn.Graph on the actor runtime: LaunchLazyJob ordering, input checks, faults, long runs, cleanup.

(Successive calls in flight, the output critical section and the frontier: ``test_runtime_graph_pipeline.py``.)
"""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc

import numpy as np
import pytest

import pyflow as flow
from pyflow import nn
from pyflow.errors import DTypeError, GraphError, OpError, ShapeError
from pyflow.framework.tensor import Tensor


def _graph(build):
    class G(nn.Graph):
        def build(self, *xs):
            return build(*xs)

    return G()


def _two_stage():
    return _graph(lambda x: ((x * 2.0).relu().to("cuda") + 1.0))


def settle(runtime, timeout: float = 30.0) -> None:
    """Wait until ``runtime`` has no call in flight (``g(x)`` returns before its call is over)."""
    deadline = time.monotonic() + timeout
    while runtime.calls_in_flight():
        assert time.monotonic() < deadline, runtime.hang_report(timeout, "settling")
        time.sleep(0.005)


def _actor_threads(name: str) -> list:
    return [t for t in threading.enumerate() if t.name.startswith(f"pyflow-actor-{name}")
            or t.name == f"pyflow-actor-watchdog-{name}"]


def test_eager_ops_after_a_call_see_its_outputs_and_parameters_and_cannot_race_its_inputs():
    """LaunchLazyJob + waiting for the sink: an in-place write of the input right after the call does not
    reach the call; the outputs and the updated parameters read right after are the call's."""
    flow.manual_seed(0)
    model = nn.Linear(3, 2)
    reference = nn.Linear(3, 2)
    reference.load_state_dict(model.state_dict())
    opt = flow.optim.SGD(model.parameters(), lr=0.5)
    ref_opt = flow.optim.SGD(reference.parameters(), lr=0.5)

    class Train(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.model(x).sum()
            loss.backward()
            return loss

    g = Train()
    for _ in range(3):
        x = flow.randn(4, 3)
        expected = reference(x).sum()
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        want = expected.numpy()
        loss = g(x)
        x.add_(100.0)                      # after the call: must not change what the call read
        np.testing.assert_array_equal(model.weight.numpy(), reference.weight.numpy())
        np.testing.assert_array_equal(loss.numpy(), want)
    assert g.runtime is not None and g.runtime.error is None


def test_the_call_is_a_launch_lazy_job_instruction_in_flow_trace():
    g = _two_stage()
    x = flow.randn(2, 3)
    g(x)
    with flow.trace() as tracer:
        g(x)
    names = [r.name for r in tracer.records]
    assert "launch_lazy_job[G]" in names
    assert any(r.stream.startswith("actor ") and r.name.startswith("act copy_0") for r in tracer.records)


def test_the_vm_scheduler_hands_the_call_to_the_actors_itself_no_launcher_thread_in_between():
    """One thread hand-off less per call (issue 31): LaunchLazyJob's ``launch()`` only sends the source tick a
    message, so it runs where the scheduler dispatches it, not on a lazy-job launcher worker of its own (the
    caller's thread in step-through mode); still after the writer of its input."""
    g = _two_stage()
    x = flow.randn(2, 3)
    g(x).numpy()
    runtime, threads = g.runtime, []
    start = runtime.start
    runtime.start = lambda handle: (threads.append(threading.current_thread()), start(handle))[1]
    x.add_(1.0)   # a writer of the input: the launch waits for it
    want = ((x.numpy() * 2.0).clip(0) + 1.0)
    for _ in range(3):
        np.testing.assert_array_equal(g(x).numpy(), want)
    scheduler = threading.current_thread() if flow.vm.get_vm().sync_mode else flow.vm.get_vm()._scheduler
    assert threads == [scheduler] * 3, [t.name for t in threads]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_call_puts_nothing_on_the_launcher_or_critical_section_streams_but_its_launch_and_sections(device):
    """The launch touches no input's memory, a section writes a fresh tensor and syncs its stream before it is
    done: no record_event for them, per input the actors read, before the launch or the section, or per read of an
    output (issue 31: 5 of the 17 VM instructions of a 784-256-10 training step, and their hand-offs)."""
    g = _graph(lambda x, y: (x * 2.0 + y).relu())
    x, y = flow.randn(2, 3, device=device), flow.randn(2, 3, device=device)
    g(x, y).numpy()
    for _ in range(2):
        with flow.trace() as tracer:
            out = g(x, y)
            x.add_(1.0)                 # the caller's own op on an input after the call
            value = out.numpy()
            again = (out + 1.0).numpy()
        np.testing.assert_allclose(again, value + 1.0)
        side = [r.name for r in tracer.records if "lazy_job_launcher" in r.stream or "critical_section" in r.stream]
        assert sorted(side) == ["launch_lazy_job[G]", "output_critical_section[G][0]"], side
        if device == "cpu":   # (on cuda, numpy()'s copy to the host waits for the compute stream: its own sync)
            assert not [r for r in tracer.records if r.name == "record_event"], [r.name for r in tracer.records]


def test_inputs_of_the_wrong_shape_dtype_or_count_are_clear_errors_before_anything_runs():
    g = _two_stage()
    g(flow.randn(2, 3)).numpy()
    settle(g.runtime)
    acts = len(g.runtime.timeline())
    with pytest.raises(ShapeError, match=r"input 0 must have shape \(2, 3\), dtype float32, device cpu:0, got "
                                         r"shape \(3, 3\)"):
        g(flow.randn(3, 3))
    with pytest.raises(DTypeError, match=r"input 0 must have .*dtype float32.*got .*dtype float64"):
        g(flow.randn(2, 3, dtype=flow.float64))
    with pytest.raises(GraphError, match=r"compiled for 1 input\(s\), got 2"):
        g(flow.randn(2, 3), flow.randn(2, 3))
    assert len(g.runtime.timeline()) == acts and g.runtime.error is None
    np.testing.assert_array_equal(g(flow.ones(2, 3)).numpy(), np.full((2, 3), 3.0, np.float32))


def test_a_failing_act_raises_at_the_call_and_the_next_call_gets_a_fresh_runtime():
    from pyflow.runtime.act import act

    g = _graph(lambda x: (x * 2.0).relu() + 1.0)
    g.executor = "sequential"
    g(flow.ones(2, 2))   # compiled; now run it on actors whose relu fails
    g.executor = "actors"

    def failing(plan, task, ins, outs, j, call):
        if task.op_name == "relu_0":
            raise ZeroDivisionError("relu exploded")
        return act(plan, task, ins, outs, j, call)

    g.act_fn = failing
    first = None
    with pytest.raises(OpError, match=r"actor \d+ \(normal actor of op 'relu_0', task kind compute\) failed at "
                                      r"piece \(0, 0\): ZeroDivisionError: relu exploded") as caught:
        y = g(flow.ones(2, 2))   # (it may return before relu_0 acts: the call's frontier is mul_0)
        first = g.runtime
        y.numpy()
    cause = caught.value
    while cause.__cause__ is not None and not isinstance(cause, ZeroDivisionError):
        cause = cause.__cause__
    assert isinstance(cause, ZeroDivisionError)
    g.act_fn = None
    np.testing.assert_array_equal(g(flow.ones(2, 2)).numpy(), np.full((2, 2), 3.0, np.float32))
    assert first is None or (g.runtime is not first and first.closed)
    assert not [t for t in threading.enumerate() if first is not None and t in first.threads() and t.is_alive()]


@pytest.mark.parametrize("interrupt_after", [False, True])
def test_ctrl_c_while_a_call_waits_stops_the_runtime_and_the_graph_can_be_called_again(monkeypatch,
                                                                                       interrupt_after):
    """Ctrl-C (a KeyboardInterrupt in the caller while it waits for the call's frontier, before or after
    the wait is over) with earlier calls still in flight: it reaches the caller, the runtime is closed in the
    background (the calls in flight finish, their outputs are right, no actor thread is left), and the next call works
    on a new one."""
    from pyflow.runtime.call import CallHandle

    g = _graph(lambda x: (x * 2.0).relu() + 1.0)
    g(flow.ones(2, 2))
    first = g.runtime
    threads = first.threads()
    assert threads and all(t.is_alive() for t in threads)
    earlier = [g(flow.full((2, 2), float(i))) for i in range(3)]
    real_wait = CallHandle.wait_issued

    def interrupted(self):
        if interrupt_after:
            real_wait(self)   # the frontier acted, then the user presses Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(CallHandle, "wait_issued", interrupted)
    with pytest.raises(KeyboardInterrupt):
        g(flow.ones(2, 2))
    assert g.runtime is None   # closed on a thread of its own: the interrupt does not wait for it
    for t in threads:
        t.join(30)
    assert first.closed and not any(t.is_alive() for t in threads)
    for i, y in enumerate(earlier):
        np.testing.assert_array_equal(y.numpy(), np.full((2, 2), 2.0 * i + 1.0, np.float32))
    monkeypatch.setattr(CallHandle, "wait_issued", real_wait)
    np.testing.assert_array_equal(g(flow.ones(2, 2)).numpy(), np.full((2, 2), 3.0, np.float32))
    assert g.runtime is not first


@pytest.mark.parametrize("executor", ["deterministic", "sequential"])
def test_the_executor_can_be_chosen_by_environment_variable(monkeypatch, executor):
    monkeypatch.setenv("PYFLOW_GRAPH_EXECUTOR", executor)
    g = _two_stage()
    x = flow.randn(2, 3)
    out = g(x).numpy()
    np.testing.assert_array_equal(out, ((x * 2.0).relu().to("cuda") + 1.0).numpy())
    assert (g.runtime is None) == (executor == "sequential")
    if executor == "deterministic":
        assert g.runtime.deterministic and not g.runtime.threads()
    monkeypatch.setenv("PYFLOW_GRAPH_EXECUTOR", "bogus")
    with pytest.raises(GraphError, match="executor 'bogus' is not one of actors, deterministic, sequential"):
        g(x)


def test_a_garbage_collected_graph_closes_its_runtime():
    g = _graph(lambda x: x + 1.0)

    class Named(type(g)):
        pass

    g = Named()
    g(flow.ones(2))
    threads = g.runtime.threads()
    assert threads and all(t.is_alive() for t in threads)
    del g
    gc.collect()
    for t in threads:
        t.join(5)
    assert not any(t.is_alive() for t in threads)


def _lasting_threads() -> set:
    """The names of the running threads, less the compiled tier's hang watch, which ends after a second with
    nothing to watch and starts again at the next launch (``kernels/sim/workers.py``): it comes and goes."""
    return {t.name for t in threading.enumerate() if t.name != "pyflow-sim-hang-watch"}


def test_500_calls_of_a_two_stage_graph_neither_hang_nor_grow():
    """cpu stage -> cuda stage, 500 calls: same threads, same number of live tensors, flat memory."""
    g = _two_stage()
    x = flow.randn(2, 3)
    expected = ((x * 2.0).relu().to("cuda") + 1.0).numpy()

    def calls(n):
        for _ in range(n):
            out = g(x)
        return out

    calls(100).numpy()
    settle(g.runtime)
    g.runtime.set_timeline_limit(0)
    gc.collect()
    threads = _lasting_threads()
    tensors = sum(issubclass(type(o), Tensor) for o in gc.get_objects())   # type(): reads nothing of a foreign object
    tracemalloc.start()
    try:
        calls(50).numpy()
        settle(g.runtime)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        out = calls(350)
        out.numpy()
        settle(g.runtime)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out.numpy(), expected)
    del out
    gc.collect()
    assert _lasting_threads() == threads
    assert sum(issubclass(type(o), Tensor) for o in gc.get_objects()) == tensors
    assert grown < 64 * 1024, f"{grown} bytes more after 350 more calls"


# --- two ranks: send / recv and collectives -----------------------------------------------------------------


def _two_rank_graph(kind: str):
    """A graph on two ranks: data parallel (the gradients' all-reduces) or two pipeline stages (send/recv)."""
    S, B = flow.sbp.split, flow.sbp.broadcast
    rng = np.random.default_rng(5)
    xv, yv = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    both, p0, p1 = flow.placement("cpu", [0, 1]), flow.placement("cpu", [0]), flow.placement("cpu", [1])
    flow.manual_seed(11)
    if kind == "data_parallel":
        a = nn.Linear(3, 5).to_global(placement=both, sbp=B)
        b = nn.Linear(5, 2).to_global(placement=both, sbp=B)
        x, y = flow.tensor(xv, placement=both, sbp=S(0)), flow.tensor(yv, placement=both, sbp=S(0))
    else:
        a = nn.Linear(3, 5).to_global(placement=p0, sbp=B)
        b = nn.Linear(5, 2).to_global(placement=p1, sbp=B)
        x, y = flow.tensor(xv, placement=p0, sbp=B), flow.tensor(yv, placement=p1, sbp=B)
    opt = flow.optim.SGD(list(a.parameters()) + list(b.parameters()), lr=0.1, momentum=0.5)

    class Train(nn.Graph):
        def __init__(self):
            super().__init__()
            self.a, self.b = a, b
            if kind == "pipeline":
                self.a.to(nn.graph.GraphModule).set_stage(0, p0)
                self.b.to(nn.graph.GraphModule).set_stage(1, p1)
            self.add_optimizer(opt)
            self.config.set_gradient_accumulation_steps(2)

        def build(self, x, y):
            loss = ((self.b(self.a(x).relu()) - y) ** 2).mean()
            loss.backward()
            return loss

    g = Train()
    g.executor = "sequential"
    g(x, y)   # compiles (one call on the sequential interpreter)
    return g, [a, b], (x, y)


@pytest.mark.parametrize("kind", ["data_parallel", "pipeline"])
@pytest.mark.parametrize("seed", [None, 1, 2])
def test_two_ranks_on_the_runtime_give_the_sequential_numbers_and_communicate_in_plan_order(kind, seed):
    """Each rank runs its own tasks on its own Runtime (threaded, or deterministic with a different random
    interleaving on each rank): losses and weights are the sequential interpreter's, bitwise, and every
    rank's send / recv / collective acts come in the same order (the Plan's)."""
    from pyflow.runtime.sequential import run_plan
    from pyflow.runtime import Runtime
    from pyflow.runtime.comm_net import is_comm

    def body():
        rank = flow.env.get_rank()
        ref, ref_params, (x, y) = _two_rank_graph(kind)
        mine, params, _ = _two_rank_graph(kind)
        rt = Runtime(mine.plan, mine.job, deterministic=seed is not None,
                     seed=None if seed is None else seed * 10 + rank)
        losses = []
        for _ in range(2):
            want = run_plan(ref.plan, [x, y], ref.job)[0]
            ref._after_call()
            got = rt.launch([x, y]).result()[0]
            mine._after_call()
            losses.append((got.numpy(), want.numpy()))
        weights = [(p.weight.numpy(), q.weight.numpy()) for p, q in zip(params, ref_params)]
        rt.close()
        comm = [(r.op_name, r.piece) for r in rt.timeline() if is_comm(rt.plan.tasks[r.actor_id])]
        return losses, weights, comm, rank

    results = flow.distributed.run(body, world_size=2)
    for losses, weights, comm, rank in results:
        for got, want in losses + weights:
            np.testing.assert_array_equal(got, want)
        assert comm, rank
    if kind == "data_parallel":   # the same collectives (one node per rank of each edge), in the same order
        edges = [[(name.rsplit("-n", 1)[0], piece) for name, piece in r[2]] for r in results]
        assert edges[0] == edges[1]
    else:                         # what one rank sends the other receives, in the same order
        sends = [[(n.replace("-send", ""), p) for n, p in r[2] if n.endswith("-send")] for r in results]
        recvs = [[(n.replace("-recv", ""), p) for n, p in r[2] if n.endswith("-recv")] for r in results]
        assert sends[0] == recvs[1] and sends[1] == recvs[0]
