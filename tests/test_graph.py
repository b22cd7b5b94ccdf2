"""nn.Graph: traced graphs give the eager numbers (seed 004; OneFlow's python/oneflow/test/graph)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import nn
from pyflow.errors import CompileError, GraphError, ShapeError

X8 = [[-0.94630778, -0.83378579, -0.87060891], [2.0289922, -0.28708987, -2.18369248],
      [0.35217619, -0.67095644, -1.58943879], [0.08086036, -1.81075924, 1.20752494],
      [0.8901075, -0.49976737, -1.07153746], [-0.44872912, -1.07275683, 0.06256855],
      [-0.22556897, 0.74798368, 0.90416439], [0.48339456, -2.32742195, -0.59321527]]


def _linear_sgd(device):
    linear = nn.Linear(3, 8).to(device)
    nn.init.constant_(linear.weight, 2.068758)
    nn.init.constant_(linear.bias, 1.23)
    return linear, flow.optim.SGD(linear.parameters(), lr=0.01, momentum=0.9)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_grad_acc_matches_eager_loop(device):
    """OneFlow's test_graph_grad_acc: 3 calls with k=4 give the eager loop's losses and weights."""
    x = flow.tensor(X8, device=device)
    free_one = flow.tensor([1.0], device=device)
    eager_linear, eager_sgd = _linear_sgd(device)
    eager_losses, eager_weights = [], []
    for i in range(12):
        index = (i % 4) * 2
        out = eager_linear(x[index:index + 2])
        out += free_one
        out += flow.ones(out.shape, dtype=out.dtype, device=out.device)
        total = flow.reshape(out, shape=[-1]).sum()
        (total * 0.25).backward()
        if (i + 1) % 4 == 0:
            eager_sgd.step()
            eager_sgd.zero_grad()
            eager_weights.append(eager_linear.weight.numpy())
        eager_losses.append(total.numpy())

    graph_linear, graph_sgd = _linear_sgd(device)

    class LinearTrainGraph(nn.Graph):
        def __init__(self):
            super().__init__()
            self.linear = graph_linear
            self.add_optimizer(graph_sgd)
            self.config.set_gradient_accumulation_steps(4)

        def build(self, x):
            out = self.linear(x)
            out += free_one
            out += flow.ones(out.shape, dtype=out.dtype, device=out.device)
            out = flow.reshape(out, shape=[-1])
            loss = out.sum()
            loss.backward()
            return out, loss

    g = LinearTrainGraph()
    for i in range(3):
        flat, losses = g(x)
        assert flat.shape == (64,) and losses.shape == (4,)
        np.testing.assert_array_equal(losses.numpy(), np.array(eager_losses[4 * i:4 * i + 4]))
        np.testing.assert_allclose(graph_linear.weight.numpy(), eager_weights[i], rtol=1e-6)
    if device == "cpu":
        np.testing.assert_allclose(np.array(eager_losses[:4]), [0.49905, 11.45353, 16.26096, 34.95345], rtol=1e-5)


class _TwoStage(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 4)
        self.b = nn.Linear(4, 2)


def _two_stage_models():
    flow.manual_seed(3)
    eager = _TwoStage()
    graph = _TwoStage()
    graph.load_state_dict(eager.state_dict())
    eager.b.to("cuda")
    graph.b.to("cuda")
    return eager, graph


def test_two_stage_pipeline_with_grad_acc_matches_eager():
    """Stage 0 on the cpu, stage 1 on cuda (set_stage moves its inputs), k = 2: the eager numbers."""
    eager, graph = _two_stage_models()
    x = flow.randn(4, 3)
    y = flow.randn(4, 2, device="cuda")
    e_opt = flow.optim.SGD(eager.parameters(), lr=0.1, momentum=0.5)
    g_opt = flow.optim.SGD(graph.parameters(), lr=0.1, momentum=0.5)

    class Pipe(nn.Graph):
        def __init__(self):
            super().__init__()
            self.a, self.b = graph.a, graph.b
            self.a.to(nn.graph.GraphModule).set_stage(0, "cpu")
            self.b.to(nn.graph.GraphModule).set_stage(1, "cuda")
            self.add_optimizer(g_opt)
            self.config.set_gradient_accumulation_steps(2)

        def build(self, x, y):
            loss = ((self.b(self.a(x).relu()) - y) ** 2).mean()
            loss.backward()
            return loss

    g = Pipe()
    for _ in range(2):
        losses = g(x, y).numpy()
        expected = []
        for j in range(2):
            loss = ((eager.b(eager.a(x[2 * j:2 * j + 2]).relu().to("cuda")) - y[2 * j:2 * j + 2]) ** 2).mean()
            (loss / 2).backward()
            expected.append(loss.numpy())
        e_opt.step()
        e_opt.zero_grad()
        np.testing.assert_allclose(losses, expected, rtol=1e-6)
    for (name, p), q in zip(graph.named_parameters(), eager.parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)
    # the pipeline_buffer pass (2 stages): the cpu -> cuda copy from stage 0 into the last stage holds
    # 2 x 2 pieces; so do stage 0's activations that its backward reads (regst num 1 everywhere else)
    copies = [t for t in g.plan.tasks.values() if t.kind == "copy_h2d"]
    assert copies and all(g.plan.regsts[t.produced["out_0"]].max_regst_num == 4 for t in copies)
    job = g.job
    kept = {op.name for op in job.ops if op.attrs.get("_buffer_size") == 4 and op.type != "copy"}
    # stage 0's blobs that backward reads: the micro-batch x (a's weight gradient) and relu's output (called
    # outside the modules, on stage 0's result); a's weight is not read (x needs no gradient)
    assert kept == {"unpack_0", "relu_0"}
    # (and the ctrl regsts the sink tick reads: one per call in flight, the outputs buffer's 2; rank_ticks.py)
    ends = {rid for t in g.plan.tasks.values() if t.op_type == "sink_tick" for rid in t.consumed["ctrl"]}
    assert all(r.max_regst_num == (2 if r.id in ends else 1) for r in g.plan.regsts.values()
               if g.plan.tasks[r.producer].op_name not in kept | {t.op_name for t in copies}
               and g.plan.tasks[r.producer].kind not in ("tick",))


def test_adam_with_lr_scheduler_matches_eager():
    """Adam's step count and a scheduler's lr are tensors the graph reads each call: 4 calls = 4 eager steps."""
    flow.manual_seed(1)
    eager = nn.Linear(3, 2)
    model = nn.Linear(3, 2)
    model.load_state_dict(eager.state_dict())
    e_opt, g_opt = flow.optim.Adam(eager.parameters(), lr=0.1), flow.optim.Adam(model.parameters(), lr=0.1)
    e_sch = flow.optim.lr_scheduler.StepLR(e_opt, step_size=2, gamma=0.5)
    g_sch = flow.optim.lr_scheduler.StepLR(g_opt, step_size=2, gamma=0.5)

    class Train(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(g_opt, lr_sch=g_sch)

        def build(self, x):
            loss = (self.model(x) ** 2).sum()
            loss.backward()
            return loss

    g = Train()
    x = flow.randn(5, 3)
    for _ in range(4):
        loss = g(x)
        e_loss = (eager(x) ** 2).sum()
        e_loss.backward()
        e_opt.step()
        e_opt.zero_grad()
        e_sch.step()
        assert loss.numpy() == e_loss.numpy()
    np.testing.assert_array_equal(model.weight.numpy(), eager.weight.numpy())
    assert g_opt.param_groups[0]["lr"] == e_opt.param_groups[0]["lr"] == 0.025


def _program(ops, x, w):
    y = x
    for name in ops:
        if name == "matmul":
            y = y @ w
        elif name == "add_w":
            y = y + w.sum()
        elif name == "transpose":
            y = y.transpose(0, 1).contiguous().transpose(0, 1)
        elif name == "scale":
            y = y * 1.5 - 0.25
        else:
            y = getattr(y, name)()
    return y.sum(dim=0), y


@settings(max_examples=15, deadline=None)
@given(st.lists(st.sampled_from(["relu", "tanh", "sigmoid", "exp", "neg", "matmul", "add_w", "transpose",
                                  "scale", "abs"]), min_size=1, max_size=6),
       st.integers(1, 4))
def test_random_programs_match_eager_bitwise(ops, n):
    """Random op programs on the cpu: the graph's outputs are the eager values, bit for bit."""
    rng = np.random.default_rng(len(ops) * 7 + n)
    x = flow.tensor(rng.standard_normal((n, 3)).astype(np.float32))
    w = flow.tensor(rng.standard_normal((3, 3)).astype(np.float32) * 0.5)

    class Program(nn.Graph):
        def build(self, x):
            return _program(ops, x, w)

    g = Program()
    for _ in range(2):
        got = g(x)
        for a, b in zip(got, _program(ops, x, w)):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    g.plan.memory.check()


def test_inplace_proposals_are_accepted_only_when_nothing_else_reads_the_input():
    """relu/neg/exp of a blob nobody else reads write over it (one memory for the chain); a blob with two
    readers keeps its memory; the values stay the eager ones."""
    x = flow.tensor(np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4))

    class Chain(nn.Graph):
        def build(self, x):
            y = x * 2.0               # read by relu only: relu may write over it
            z = y.relu().neg().exp()  # each link read once: one memory for y, relu, neg, exp
            t = x * 3.0               # read by tanh and by the sum below: keeps its memory
            return z, t.tanh() + t

    g = Chain()
    z, u = g(x)
    np.testing.assert_array_equal(z.numpy(), (x * 2.0).relu().neg().exp().numpy())
    np.testing.assert_array_equal(u.numpy(), ((x * 3.0).tanh() + x * 3.0).numpy())
    plan = g.plan
    by_op = {plan.tasks[r.producer].op_name: r for r in plan.regsts.values() if r.mem == "planned"}
    assert by_op["relu_0"].inplace_of == by_op["mul_0"].id
    assert by_op["neg_0"].inplace_of == by_op["relu_0"].id and by_op["exp_0"].inplace_of == by_op["neg_0"].id
    assert {plan.memory_root(by_op[n]).id for n in ("relu_0", "neg_0", "exp_0")} == {by_op["mul_0"].id}
    assert by_op["tanh_0"].inplace_of is None          # mul_1 has two readers
    assert "inplace_of: " in str(plan)
    root_request = next(q for q in plan.memory.requests if q.regst_id == by_op["mul_0"].id)
    position = {tid: i for i, tid in enumerate(plan.order)}
    exp_reader = max(position[c] for c in by_op["exp_0"].consumers)
    assert root_request.end == exp_reader + 1          # the input's memory lives until the chain's last reader
    plan.memory.check()


def _tiny_train_graph(k=2):
    model = nn.Linear(2, 2)
    opt = flow.optim.SGD(model.parameters(), lr=0.1)

    class Train(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)
            self.config.set_gradient_accumulation_steps(k)

        def build(self, x):
            loss = self.model(x).sum()
            loss.backward()
            return loss

    g = Train()
    g(flow.randn(4, 2))
    return g


def test_plan_regsts_match_tasks_and_ids_decode():
    """Every regst's producer produces it and every consumer consumes it; task ids decode to the task."""
    from pyflow.compiler.ids import decode_task_id

    plan = _tiny_train_graph().plan
    for r in plan.regsts.values():
        assert r.id in plan.tasks[r.producer].produced.values()
        for c in r.consumers:
            assert any(r.id in ids for ids in plan.tasks[c].consumed.values())
    for tid, task in plan.tasks.items():
        decoded = decode_task_id(tid)
        assert (decoded.rank, decoded.stream_index) == (task.rank, {"compute": 0, "host2device": 1,
                                                                      "device2host": 2}[task.stream])
        assert task.thread_id == tid >> 21
    assert sorted(plan.order) == sorted(plan.tasks)


def test_plan_prints_light_plan_dot_memory_report_and_round_trips_json():
    from pyflow.compiler.plan import Plan

    g = _tiny_train_graph()
    text = str(g.plan)
    assert "actor id : " in text and "consume : in_0 : <- [" in text and "regst_num: 1" in text
    assert "time_shape: (1, 2)" in text     # the micro-batch loop
    assert g.plan.to_dot().startswith('digraph "Train"')
    (row,) = g.plan.memory_report()
    assert row["planned_bytes"] >= row["lower_bound_bytes"] > 0
    again = Plan.from_json(g.plan.to_json())
    assert str(again) == text and again.memory.offsets == g.plan.memory.offsets


def test_debug_prints_every_pass_with_its_time(capsys):
    model = nn.Linear(2, 2)

    class Infer(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model

        def build(self, x):
            return self.model(x)

    g = Infer()
    g.debug(1)
    g(flow.randn(1, 2))
    out = capsys.readouterr().out
    for step in ("trace build", "pass grad_acc", "pass autograd", "pass ticks", "OpGraph", "TaskGraph", "Plan"):
        assert step in out
    assert " ms" in out


# --- bad input ---------------------------------------------------------------------------------------------


def _graph_of(fn):
    class G(nn.Graph):
        def build(self, *xs):
            return fn(*xs)

    return G()


def test_reading_values_in_build_is_an_error_naming_the_line():
    with pytest.raises(GraphError, match=r"numpy\(\) of a lazy tensor .* at test_graph.py:\d+.*cocktailer"):
        _graph_of(lambda x: x.numpy())(flow.ones(2))
    with pytest.raises(GraphError, match=r"bool\(\).*test_graph.py"):
        _graph_of(lambda x: x if x.sum() > 0 else -x)(flow.ones(2))
    with pytest.raises(GraphError, match="item"):
        _graph_of(lambda x: x * x.sum().item())(flow.ones(2))


def test_bad_outputs_inputs_nesting_and_backward_are_errors():
    with pytest.raises(GraphError, match="outputs must be tensors"):
        _graph_of(lambda x: (x, 3))(flow.ones(2))
    with pytest.raises(GraphError, match="graph inputs must be tensors"):
        _graph_of(lambda x: x)(3)
    inner = _graph_of(lambda x: x + 1)
    with pytest.raises(GraphError, match="nested"):
        _graph_of(lambda x: inner(x))(flow.ones(2))
    w = nn.Parameter(flow.ones(2))
    with pytest.raises(GraphError, match="only a scalar loss"):
        _graph_of(lambda x: (x * w).backward())(flow.ones(2))
    with pytest.raises(GraphError, match="not a multiple of 3"):
        g = _graph_of(lambda x: x)
        g.config.set_gradient_accumulation_steps(3)
        g(flow.ones(4))


def test_a_link_between_stages_without_a_move_is_an_error_naming_both_ops():
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)

    class Bad(nn.Graph):
        def __init__(self):
            super().__init__()
            self.a, self.b = a, b
            self.a.to(nn.graph.GraphModule).set_stage(0)
            self.b.to(nn.graph.GraphModule).set_stage(1)

        def build(self, x):
            return self.b(self.a(x))

    with pytest.raises(CompileError, match=r"Cross diff stage link: .*stage 0.* -> .*stage 1.*test_graph.py"):
        Bad()(flow.ones(1, 2))


def test_shape_errors_inside_build_name_the_op_and_line():
    with pytest.raises(ShapeError, match=r"matmul.*nn.Graph build at test_graph.py"):
        _graph_of(lambda x: x @ x)(flow.ones(2, 3))
