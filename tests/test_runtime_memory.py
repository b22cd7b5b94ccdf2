"""The actor runtime allocates from the Plan's own memory layout, and the compiler's guards keep sharing safe.

Properties: the runtime's chunks are exactly ``plan.memory.block_sizes`` (regsts that are never
alive at once in the Plan's order share bytes there); random programs with several calls in flight
give the sequential interpreter's numbers, threaded and under random interleavings; and without
the ``mem_guard`` ctrl regsts some interleaving gives wrong numbers, within one call (a branch
overwriting bytes another branch still reads) and across calls (the next call overwriting bytes
this call still reads).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import nn
from pyflow.compiler.mem_guards import mem_guards
from pyflow.compiler.task_graph import GUARD_KEY
from pyflow.runtime import Runtime
from pyflow.runtime.sequential import run_plan
from tests.test_runtime import _graph as runtime_graph
from tests.test_runtime import assert_all_regsts_back_and_actors_exited

UNARY = ["relu", "tanh", "neg", "sigmoid", "abs", "scale", "matmul", "rowsum"]
BINARY = ["add", "mul", "sub"]


def _graph(build, k=1):
    """``test_runtime``'s graph of ``build``, run by the sequential interpreter (the reference)."""
    g = runtime_graph(build, k)
    g.executor = "sequential"
    return g


def _random_program(steps, w):
    """A branchy program: each step applies an op to earlier values (moving one to the other's device)."""
    def build(x):
        values = [x]
        for kind, name, i, j, move in steps:
            a = values[i % len(values)]
            if move:
                a = a.to("cuda" if a.device.type == "cpu" else "cpu")
            if kind == "unary":
                if name == "matmul":
                    y = a @ (w if a.device.type == "cpu" else w.to("cuda"))
                elif name == "scale":
                    y = a * 1.5 - 0.25
                elif name == "rowsum":
                    y = a.sum(dim=1, keepdim=True) * a
                else:
                    y = getattr(a, name)()
            else:
                b = values[j % len(values)]
                if b.device != a.device:
                    b = b.to(a.device)
                y = getattr(a, name)(b)
            values.append(y)
        return values[-1], values[len(values) // 2]   # a late and an early value: some live long
    return build


def _steps():
    unary = st.tuples(st.just("unary"), st.sampled_from(UNARY), st.integers(0, 20), st.just(0), st.booleans())
    binary = st.tuples(st.just("binary"), st.sampled_from(BINARY), st.integers(0, 20), st.integers(0, 20),
                       st.booleans())
    return st.lists(st.one_of(unary, binary), min_size=2, max_size=8)


def strip_mem_guards(plan):
    """``plan`` without its ``mem_guard`` ctrl regsts (the same memory layout, no safety edges)."""
    guards = {t.produced[GUARD_KEY] for t in plan.tasks.values() if GUARD_KEY in t.produced}
    tasks = {}
    for tid, t in plan.tasks.items():
        produced = {k: v for k, v in t.produced.items() if k != GUARD_KEY}
        consumed = {k: [r for r in ids if r not in guards] for k, ids in t.consumed.items()}
        tasks[tid] = dataclasses.replace(t, produced=produced, consumed={k: v for k, v in consumed.items() if v})
    regsts = {rid: r for rid, r in plan.regsts.items() if rid not in guards}
    return dataclasses.replace(plan, tasks=tasks, regsts=regsts)


def _rank0_blocks(plan) -> dict:
    return {key: size for key, size in plan.memory.block_sizes.items() if key.startswith("rank0/")}


def _private_bytes(plan) -> int:
    """What the chunks would take if no two regsts shared bytes (each its size x regst num, aligned)."""
    return sum(plan.memory.size_of(r) for r in plan.memory.requests)


@settings(max_examples=10, deadline=None)
@given(_steps(), st.integers(1, 3), st.sampled_from([None, 0, 1, 2, 3]))
def test_random_programs_with_calls_in_flight_match_run_plan_in_the_plans_own_memory(steps, k, seed):
    """Random branchy programs (values moved between cpu and cuda, k micro-batches), three calls with
    different inputs in flight at once, threaded (seed None) or deterministic with a random interleaving:
    every output equals run_plan's for that input, bitwise; the runtime's chunks have exactly the Plan's
    ``block_sizes``; afterwards every regst is back and every actor exited."""
    rng = np.random.default_rng(len(steps) * 7 + k)
    w = flow.tensor(rng.standard_normal((3, 3)).astype(np.float32) * 0.5)
    xs = [flow.tensor(rng.standard_normal((2 * k, 3)).astype(np.float32)) for _ in range(3)]
    g = _graph(_random_program(steps, w), k)
    g(xs[0])   # compiles
    expected = [[t.numpy() for t in run_plan(g.plan, [x], g.job)] for x in xs]
    rt = Runtime(g.plan, g.job, deterministic=seed is not None, seed=seed, max_calls_in_flight=3)
    assert rt.regst_mgr.chunk_bytes() == _rank0_blocks(g.plan)
    handles = [rt.launch([x]) for x in xs]
    handles[-1].result()   # deterministic: waiting for the last call lets the three calls interleave
    for handle, want in zip(handles, expected):
        for got, value in zip(handle.result(), want):
            np.testing.assert_array_equal(got.numpy(), value)
    rt.close()
    assert_all_regsts_back_and_actors_exited(rt)
    position = {tid: i for i, tid in enumerate(g.plan.order)}
    for task in g.plan.tasks.values():   # every guard goes forward in the Plan's order: no deadlock
        if GUARD_KEY in task.produced:
            assert all(position[c] > position[task.task_id] for c in g.plan.regsts[task.produced[GUARD_KEY]].consumers)


def test_a_training_graph_runs_in_the_plans_shared_memory_and_gives_run_plans_numbers():
    """An MLP training step with k = 2: the runtime's chunk is the Plan's block (well under what private
    regsts would take); losses and weights after 3 calls equal the sequential interpreter's."""
    def make():
        flow.manual_seed(3)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
        opt = flow.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        class Train(nn.Graph):
            def __init__(self):
                super().__init__()
                self.model = model
                self.add_optimizer(opt)
                self.config.set_gradient_accumulation_steps(2)

            def build(self, x):
                loss = (self.model(x) ** 2).mean()
                loss.backward()
                return loss

        g = Train()
        g.executor = "sequential"
        return g, model

    x = flow.tensor(np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32))
    (ref, ref_model), (mine, model) = make(), make()
    ref(x)
    mine(x)
    rt = Runtime(mine.plan, mine.job, deterministic=True, seed=5)
    assert rt.regst_mgr.chunk_bytes() == _rank0_blocks(mine.plan)
    assert sum(_rank0_blocks(mine.plan).values()) <= 0.5 * _private_bytes(mine.plan)   # (views take no memory)
    for _ in range(3):
        want = run_plan(ref.plan, [x], ref.job)[0].numpy()
        ref._after_call()
        got = rt.launch([x]).result()[0].numpy()
        mine._after_call()
        np.testing.assert_array_equal(got, want)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    rt.close()


def _wrong_interleavings(plan, job, inputs, seeds) -> list:
    """The seeds whose deterministic interleaving gives numbers other than run_plan's."""
    expected = [[t.numpy() for t in run_plan(plan, [x], job)] for x in inputs]
    wrong = []
    for seed in seeds:
        with Runtime(plan, job, deterministic=True, seed=seed, max_calls_in_flight=len(inputs)) as rt:
            handles = [rt.launch([x]) for x in inputs]
            handles[-1].result()   # (waiting for the last call delivers every call's messages, interleaved)
            got = [[t.numpy() for t in h.result()] for h in handles]
        if any(not np.array_equal(a, b) for call, want in zip(got, expected) for a, b in zip(call, want)):
            wrong.append(seed)
    return wrong


def _offset(plan, op_name: str) -> int:
    (task,) = plan.task_of(op_name)
    return plan.memory.offsets[plan.memory_root(plan.regsts[task.produced["out_0"]]).id]


def test_without_the_guards_a_branch_overwrites_bytes_another_branch_still_reads():
    """a = x * 2 is read by a sum; b = x * 3, on another branch, takes a's bytes once the sum has read them.
    Nothing but the guard (sum -> the op making b) orders the two branches: without it some interleavings
    let b's op write first and the sum reads 3x; with it, none does."""
    g = _graph(lambda x: ((x * 2.0).sum(dim=0), (x * 3.0).tanh()))
    x = flow.tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
    g(x)
    plan = g.plan
    assert _offset(plan, "mul_0") == _offset(plan, "mul_1")   # the two share bytes
    (sum_task,), (mul_1,) = plan.task_of("reduce_sum_0"), plan.task_of("mul_1")
    bare = strip_mem_guards(plan)
    assert (sum_task.task_id, mul_1.task_id) in mem_guards(bare.tasks, bare.regsts, plan.order, plan.memory)
    seeds = range(24)
    assert _wrong_interleavings(plan, g.job, [x], seeds) == []
    assert _wrong_interleavings(bare, g.job, [x], seeds) != []


def test_without_the_guards_the_next_call_overwrites_bytes_this_call_still_reads():
    """A = x @ w, B = A @ w, C = B @ w: C takes A's bytes (A is dead once B is made), and the data edges
    order everything within a call.  But the next call's first matmul writes A's bytes again: it must wait
    until this call's output task has read C.  Without the guard (first matmul -> C's reader), with three
    calls in flight, some interleavings hand back a C the next call overwrote; with it, none does."""
    w = flow.tensor(np.random.default_rng(1).standard_normal((3, 3)).astype(np.float32))
    g = _graph(lambda x: ((x @ w) @ w) @ w)
    xs = [flow.tensor(np.full((2, 3), float(i + 1), np.float32)) for i in range(3)]
    g(xs[0])
    plan = g.plan
    assert _offset(plan, "matmul_0") == _offset(plan, "matmul_2")
    (first,), (output,) = plan.task_of("matmul_0"), plan.task_of("output_0")
    assert output.task_id in plan.regsts[first.produced[GUARD_KEY]].consumers
    seeds = range(24)
    assert _wrong_interleavings(plan, g.job, xs, seeds) == []
    assert _wrong_interleavings(strip_mem_guards(plan), g.job, xs, seeds) != []
