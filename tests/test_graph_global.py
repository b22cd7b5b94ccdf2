"""nn.Graph on global tensors: SBP signatures in the OpGraph, boxing sub-graphs in the TaskGraph, run per rank.

Every rank traces and compiles the same Job; the Plan holds the tasks of every
rank, and each rank runs its own (``run_plan`` skips the others').  The tests:

* every builder of the compiler's boxing chain is the one chosen for its edge
  inside a graph (``x.to_global(...)`` in build), and the graph's output equals the
  logical value, as eager boxing gives it;
* random programs of global ops (matmul, elementwise, reductions, transposes,
  to_global) give the eager global results, with the same SBPs;
* data-parallel training (S(0) data, B parameters) with SGD and Adam, with and
  without gradient accumulation, gives the eager global numbers call after call.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.errors import DeviceError, GraphError
from pyflow.runtime.sequential import chunk_tensors

from tests.test_compiler_boxing import CHOICES

run = flow.distributed.run
S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum


def _placement(kind, ranks):
    return flow.placement(kind, ranks)


# --- the boxing chain inside a graph --------------------------------------------------------------------------------


@pytest.mark.parametrize("src, dst, shape, builder, kinds", CHOICES,
                         ids=[f"{c[3]}-{i}" for i, c in enumerate(CHOICES)])
def test_each_boxing_builder_is_chosen_for_its_edge_in_a_graph_and_its_tasks_give_the_logical_value(
        src, dst, shape, builder, kinds):
    logical = (np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) - 7) / 4

    def body():
        src_p, dst_p = _placement(src[0], src[1]), _placement(dst[0], dst[1])
        x = flow.tensor(logical, placement=src_p, sbp=src[2:])

        class Box(flow.nn.Graph):
            def build(self, x):
                return x.to_global(placement=dst_p, sbp=dst[2:])

        g = Box()
        y = g(x)
        assert y.placement == dst_p and tuple(y.sbp) == tuple(dst[2:])
        eager = x.to_global(placement=dst_p, sbp=dst[2:])
        pieces_equal = np.array_equal(y.to_local().numpy(), eager.to_local().numpy())
        return [b["builder"] for b in g.plan.boxings], y.numpy(), pieces_equal

    for builders, value, pieces_equal in run(body, world_size=4):
        assert builders == ([] if src == dst else [builder])   # the same layout: no edge to box
        np.testing.assert_array_equal(value, logical)
        assert pieces_equal   # piece for piece what eager boxing leaves (P pieces included)


# --- random programs against eager ---------------------------------------------------------------------------------


SBPS = {"S0": S(0), "S1": S(1), "B": B}


@st.composite
def programs(draw):
    steps = draw(st.lists(st.sampled_from(["matmul", "add", "relu", "mul", "sum0", "T", "box_B", "box_S0",
                                           "box_S1", "exp_neg"]), min_size=1, max_size=5))
    return draw(st.sampled_from(list(SBPS))), draw(st.sampled_from(list(SBPS))), steps


def _program(x, w, steps, p):
    y = x
    for step in steps:
        if step == "matmul" and y.ndim == 2 and y.shape[1] == w.shape[0]:
            y = y @ w
        elif step == "add":
            y = y + 1.5
        elif step == "relu":
            y = y.relu()
        elif step == "mul" and y.ndim == 2:
            y = y * y
        elif step == "sum0" and y.ndim == 2:
            y = y.sum(dim=0, keepdim=True)
        elif step == "T" and y.ndim == 2:
            y = y.T
        elif step.startswith("box_"):
            y = y.to_global(placement=p, sbp=SBPS[step[4:]])
        elif step == "exp_neg":
            y = (-y).exp()
    return y


@settings(max_examples=25, deadline=None)
@given(programs())
def test_random_global_programs_give_the_eager_results_and_sbps(program):
    x_sbp, w_sbp, steps = program
    xv = (np.arange(24, dtype=np.float32).reshape(4, 6) - 11) / 8
    wv = (np.arange(36, dtype=np.float32).reshape(6, 6) % 7 - 3) / 5

    def body():
        p = flow.placement("cpu", [0, 1])
        x = flow.tensor(xv, placement=p, sbp=SBPS[x_sbp])
        w = flow.tensor(wv, placement=p, sbp=SBPS[w_sbp])

        class Program(flow.nn.Graph):
            def build(self, x):
                return _program(x, w, steps, p)

        got = Program()(x)
        want = _program(x, w, steps, p)
        return tuple(got.sbp), got.numpy(), tuple(want.sbp), want.numpy()

    for got_sbp, got, want_sbp, want in run(body, world_size=2):
        assert got_sbp == want_sbp
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# --- data-parallel training ---------------------------------------------------------------------------------------


def _train(world: int, optim_name: str, k: int, calls: int = 3, device: str = "cpu"):
    rng = np.random.default_rng(7)
    xv = rng.standard_normal((4 * world, 3)).astype(np.float32)
    yv = rng.standard_normal((4 * world, 2)).astype(np.float32)

    def make(p):
        flow.manual_seed(3)
        model = flow.nn.Linear(3, 2).to_global(placement=p, sbp=B)
        if optim_name == "sgd":
            return model, flow.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return model, flow.optim.Adam(model.parameters(), lr=0.05)

    def body():
        p = flow.placement(device, list(range(world)))
        x = flow.tensor(xv, placement=p, sbp=S(0))
        y = flow.tensor(yv, placement=p, sbp=S(0))
        graph_model, graph_optim = make(p)
        eager_model, eager_optim = make(p)

        class Train(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.model = graph_model
                self.add_optimizer(graph_optim)
                self.config.set_gradient_accumulation_steps(k)

            def build(self, x, y):
                loss = ((self.model(x) - y) ** 2).mean()
                loss.backward()
                return loss

        g = Train()
        graph_losses = [g(x, y).numpy() for _ in range(calls)]
        eager_losses = []
        for _ in range(calls):   # the eager twin: each rank's piece split into k micro-batches (OneFlow's unpack)
            losses = []
            for j in range(k):
                rows = x.to_local().shape[0] // k
                xj = x.to_local().narrow(0, j * rows, rows).to_global(placement=p, sbp=S(0))
                yj = y.to_local().narrow(0, j * rows, rows).to_global(placement=p, sbp=S(0))
                loss = ((eager_model(xj) - yj) ** 2).mean()
                (loss / k).backward()
                losses.append(loss.numpy())
            eager_optim.step()
            eager_optim.zero_grad()
            eager_losses.append(np.array(losses) if k > 1 else losses[0])
        return (graph_losses, eager_losses, graph_model.weight.numpy(), eager_model.weight.numpy(),
                [b["builder"] for b in g.plan.boxings])

    return run(body, world_size=world)


@pytest.mark.parametrize("optim_name, k", [("sgd", 1), ("sgd", 2), ("adam", 2)])
def test_data_parallel_training_gives_the_eager_numbers(optim_name, k):
    for graph_losses, eager_losses, graph_w, eager_w, builders in _train(2, optim_name, k):
        for got, want in zip(graph_losses, eager_losses):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(graph_w, eager_w, rtol=1e-6, atol=1e-7)
        assert "collective_boxing(all_reduce)" in builders   # the gradients of B parameters: P -> B


def test_every_rank_compiles_one_plan_of_all_ranks_and_runs_its_own_tasks_in_its_own_memory():
    def body():
        p = flow.placement("cpu", [0, 1])
        x = flow.tensor(np.ones((4, 3), np.float32), placement=p, sbp=S(0))
        w = flow.tensor(np.ones((3, 2), np.float32), placement=p, sbp=B)

        class G(flow.nn.Graph):
            def build(self, x):
                return (x @ w).sum()

        g = G()
        out = g(x)
        plan = g.plan
        ranks = {t.rank for t in plan.tasks.values()}
        chunks = sorted(row["device"] for row in plan.memory_report())
        # the memory this rank made: the actor runtime's chunks (or the sequential interpreter's)
        mine = set(g.runtime.regst_mgr.chunks if g.runtime is not None else chunk_tensors(plan, flow.env.get_rank()))
        loaded = flow.compiler.plan.Plan.from_json(plan.to_json())
        return (out.numpy(), tuple(out.sbp), ranks, chunks, mine, flow.env.get_rank(), str(plan) == str(loaded),
                plan.boxings)

    for value, sbp, ranks, chunks, mine, rank, same, boxings in run(body, world_size=2):
        assert value == 24.0 and sbp == (P,)   # x @ w: (S(0), B) -> S(0); sum: S(0) -> P; no boxing
        assert ranks == {0, 1} and chunks == ["rank0/cpu:0", "rank1/cpu:0"] and mine == {f"rank{rank}/cpu:0"}
        assert same and boxings == []


# --- bad input ------------------------------------------------------------------------------------------------------


def test_global_and_local_mixed_in_build_is_an_error_naming_the_line():
    def body():
        p = flow.placement("cpu", [0, 1])
        x = flow.tensor(np.ones((2, 2), np.float32), placement=p, sbp=B)
        local = flow.ones(2, 2)

        class G(flow.nn.Graph):
            def build(self, x):
                return x + local

        with pytest.raises(DeviceError, match=r"at test_graph_global.py:\d+: global and local tensors mixed"):
            G()(x)
        return True

    assert all(run(body, world_size=2))


def test_to_local_inside_build_and_unsplittable_micro_batches_are_clear_errors():
    def body():
        p = flow.placement("cpu", [0, 1])
        x = flow.tensor(np.ones((6, 2), np.float32), placement=p, sbp=S(0))

        class ToLocal(flow.nn.Graph):
            def build(self, x):
                return x.to_local()

        class Acc(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.config.set_gradient_accumulation_steps(2)

            def build(self, x):
                return x * 2

        with pytest.raises(GraphError, match="to_local"):
            ToLocal()(x)
        with pytest.raises(GraphError, match="multiple of 4 .2 micro-batches of each of 2 S.0. pieces"):
            Acc()(x)
        return True

    assert all(run(body, world_size=2))


def test_gradients_through_views_of_global_parameters_give_the_eager_numbers():
    wv = np.arange(8, dtype=np.float32) / 8

    def body():
        p = flow.placement("cpu", [0, 1])
        x = flow.tensor(np.arange(8, dtype=np.float32).reshape(4, 2), placement=p, sbp=S(0))

        def make():
            w = flow.tensor(wv, placement=p, sbp=B).requires_grad_()
            return w, flow.optim.SGD([w], lr=0.1)

        gw, gopt = make()
        ew, eopt = make()

        def loss_of(x, w):
            return ((x @ w.reshape(2, 4)).T * w.reshape(4, 2)[:, :1]).sum()

        class G(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.add_optimizer(gopt)

            def build(self, x):
                loss = loss_of(x, gw)
                loss.backward()
                return loss

        g = G()
        got = [g(x).numpy() for _ in range(2)]
        want = []
        for _ in range(2):
            loss = loss_of(x, ew)
            loss.backward()
            eopt.step()
            eopt.zero_grad()
            want.append(loss.numpy())
        return got, want, gw.numpy(), ew.numpy()

    for got, want, gw, ew in run(body, world_size=2):
        np.testing.assert_allclose(got, want, rtol=1e-6)
        np.testing.assert_allclose(gw, ew, rtol=1e-6)


# --- pipeline stages on two ranks -----------------------------------------------------------------------------------


def test_two_stage_pipeline_on_two_ranks_with_grad_acc_gives_the_eager_numbers():
    """Stage 0 on rank 0, stage 1 on rank 1 (set_stage with placements), k = 2: activations cross as
    comm_net send/recv tasks, gradients cross back; the numbers are eager's."""
    rng = np.random.default_rng(5)
    xv = rng.standard_normal((4, 3)).astype(np.float32)
    yv = rng.standard_normal((4, 2)).astype(np.float32)

    def body():
        p0, p1 = flow.placement("cpu", [0]), flow.placement("cpu", [1])

        def make():
            flow.manual_seed(11)
            a = flow.nn.Linear(3, 5).to_global(placement=p0, sbp=B)
            b = flow.nn.Linear(5, 2).to_global(placement=p1, sbp=B)
            params = list(a.parameters()) + list(b.parameters())
            return a, b, flow.optim.SGD(params, lr=0.1, momentum=0.5)

        ga, gb, gopt = make()
        ea, eb, eopt = make()
        x = flow.tensor(xv, placement=p0, sbp=B)
        y = flow.tensor(yv, placement=p1, sbp=B)

        class Pipe(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.a, self.b = ga, gb
                self.a.to(flow.nn.graph.GraphModule).set_stage(0, p0)
                self.b.to(flow.nn.graph.GraphModule).set_stage(1, p1)
                self.add_optimizer(gopt)
                self.config.set_gradient_accumulation_steps(2)

            def build(self, x, y):
                loss = ((self.b(self.a(x).relu()) - y) ** 2).mean()
                loss.backward()
                return loss

        g = Pipe()
        got, want = [], []
        for _ in range(2):
            got.append(g(x, y).numpy())
            losses = []
            for j in range(2):
                h = ea(flow.tensor(xv[2 * j:2 * j + 2], placement=p0, sbp=B)).relu().to_global(placement=p1)
                loss = ((eb(h) - flow.tensor(yv[2 * j:2 * j + 2], placement=p1, sbp=B)) ** 2).mean()
                (loss / 2).backward()
                losses.append(loss.numpy())
            eopt.step()
            eopt.zero_grad()
            want.append(np.array(losses))
        kinds = {t.op_type for t in g.plan.tasks.values() if t.kind == "boxing"}
        weights = [w.numpy() for w in (ga.weight, gb.weight, ea.weight, eb.weight)]
        return got, want, kinds, weights

    for got, want, kinds, (gaw, gbw, eaw, ebw) in run(body, world_size=2):
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6)
        np.testing.assert_allclose(gaw, eaw, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(gbw, ebw, rtol=1e-6, atol=1e-7)
        assert {"send", "recv"} <= kinds
