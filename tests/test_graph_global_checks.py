"""A global nn.Graph checks each call's inputs against the layout it was traced with (issue 32).

OneFlow's graph refuses, at the call, an input whose meta differs from the traced one.  Before
this check a local tensor or another dtype ran, and another logical shape or SBP failed deep inside
an actor (``OpError: actor ... ShapeError``); now each raises ``GraphError`` naming the input, on
every rank, before anything runs, and the graph still runs inputs laid out as traced.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.errors import GraphError

S, B = flow.sbp.split, flow.sbp.broadcast
SBPS = {"S0": S(0), "S1": S(1), "B": B}
TRACED = {"kind": "global", "dtype": "float32", "shape": (4, 4), "ranks": (0, 1), "sbp": "S0"}
CHANGES = {"kind": "local", "dtype": "float64", "shape": (6, 4), "ranks": (0,), "sbp": "S1"}


def _tensor(layout: dict):
    value = np.arange(int(np.prod(layout["shape"])), dtype=layout["dtype"]).reshape(layout["shape"]) / 8
    if layout["kind"] == "local":
        return flow.tensor(value)
    return flow.tensor(value, placement=flow.placement("cpu", list(layout["ranks"])), sbp=SBPS[layout["sbp"]])


@settings(max_examples=10, deadline=None)
@given(st.sets(st.sampled_from(sorted(CHANGES)), max_size=2), st.sampled_from(["B", "S1"]))
def test_a_call_whose_input_differs_from_the_traced_one_raises_graph_error_naming_it(changed, second_sbp):
    """``changed``: which of the first input's fields differ from the trace (none: it runs)."""
    bad = dict(TRACED, **{field: CHANGES[field] for field in changed})

    def body():
        p = flow.placement("cpu", [0, 1])
        w = flow.tensor(np.ones((4, 3), np.float32), placement=p, sbp=B)

        class Affine(flow.nn.Graph):
            def build(self, x, y):
                return x @ w + y.sum()

        g = Affine()
        second = _tensor(dict(TRACED, sbp=second_sbp))
        want = g(_tensor(TRACED), second).numpy()
        try:
            g(_tensor(bad), second).numpy()
            outcome = "ran"
        except GraphError as error:
            outcome = str(error)
        again = g(_tensor(TRACED), second).numpy()   # the refused call ran nothing; the graph still works
        return outcome, np.array_equal(again, want)

    for outcome, still_works in flow.distributed.run(body, world_size=2, timeout=60):
        assert still_works
        if not changed:
            assert outcome == "ran"
        else:
            assert outcome.startswith("nn.Graph Affine: input 0 is a "), outcome
            if "kind" in changed:
                assert "local tensor, but the graph was traced with a global one" in outcome
            else:
                assert "traced with dtype float32, logical shape [4, 4]" in outcome and "sbp.split(dim=0)" in outcome


def test_a_local_graph_called_with_a_global_tensor_raises_graph_error():
    """The reverse: an input traced local may not come global (the runtime skipped global inputs)."""
    def body():
        class Double(flow.nn.Graph):
            def build(self, x):
                return x * 2

        g = Double()
        g(flow.tensor(np.ones((2, 2), np.float32))).numpy()
        try:
            g(_tensor(dict(TRACED, shape=(2, 2), sbp="B"))).numpy()
        except GraphError as error:
            return str(error)
        return "ran"

    for outcome in flow.distributed.run(body, world_size=2, timeout=60):
        assert "input 0 is a global tensor, but the graph was traced with a local one" in outcome, outcome


# --- no actor threads left after failed runs ------------------------------------------------------------------------


def _failing_rank_with_graphs(fail_in_graph: bool):
    """A rank that runs a global graph, then fails (in its own code, or in a second graph's act on rank 1)."""
    from pyflow import env
    from pyflow.runtime.act import act

    p = flow.placement("cpu", [0, 1])
    w = flow.tensor(np.ones((4, 3), np.float32), placement=p, sbp=B)

    class Project(flow.nn.Graph):
        def build(self, x):
            return (x @ w).to_global(sbp=B)

    g = Project()
    g(_tensor(TRACED)).numpy()   # g's runtime stays open: the failure's traceback keeps g alive
    if not fail_in_graph:
        raise ValueError("the rank's own code fails")

    def failing_act(plan, task, *args):
        if task.op_name.startswith("matmul") and env.get_rank() == 1:
            raise ValueError("a kernel fails")
        return act(plan, task, *args)

    failing = Project()
    failing.act_fn = failing_act
    failing(_tensor(TRACED)).numpy()


def test_failed_runs_with_global_graphs_leave_no_actor_threads():
    """Before: each failed run left its graphs' actor and watchdog threads (1 -> 5 -> 9 threads here)."""
    import threading
    import time

    from pyflow.errors import RankError

    def running():   # less the compiled tier's hang watch, which comes and goes (kernels/sim/workers.py)
        return [t.name for t in threading.enumerate() if t.name != "pyflow-sim-hang-watch"]

    before = len(running())
    for fail_in_graph in (False, True, False, True):
        try:
            flow.distributed.run(_failing_rank_with_graphs, world_size=2, args=(fail_in_graph,), timeout=30)
        except RankError:
            pass
        else:
            raise AssertionError("the run should have failed")
    deadline = time.monotonic() + 30   # the rank threads end on their own, soon after run() reports
    while len(running()) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    left = running()
    assert len(left) == before, left


def test_when_one_rank_alone_gives_a_different_input_every_rank_refuses_the_call():
    """Each rank checks its own inputs; were only rank 1's input local, rank 0 would start the call and
    wait in a collective for rank 1 until the collective timeout.  The ranks exchange their verdicts
    first (``pyflow/graph/inputs.py``): both raise GraphError, naming rank 1's input, and the graph runs on."""
    def body():
        p = flow.placement("cpu", [0, 1])
        w = flow.tensor(np.ones((4, 3), np.float32), placement=p, sbp=B)

        class Affine(flow.nn.Graph):
            def build(self, x):
                return (x @ w).sum()

        g = Affine()
        x = _tensor(TRACED)
        want = g(x).numpy()
        odd = x.to_local() if flow.env.get_rank() == 1 else x   # rank 1 alone passes its piece, a local tensor
        try:
            g(odd).numpy()
            outcome = "ran"
        except GraphError as error:
            outcome = str(error)
        return outcome, np.array_equal(g(x).numpy(), want)

    (first, works_0), (second, works_1) = flow.distributed.run(body, world_size=2, timeout=40)
    assert works_0 and works_1
    assert second.startswith("nn.Graph Affine: input 0 is a local tensor, but the graph was traced with a global")
    assert first == second + " (on rank 1; every rank of the graph refuses the call)"
