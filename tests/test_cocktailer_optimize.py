"""Cocktailer's optimizations (seed 001, sec. 3.2, 4.1.3): inline, loop unroll, branch reclustering.

Specifications tested here:

* every pass leaves the values unchanged, bitwise (random programs compiled after
  the passes vs the original program on the host executor);
* loop unroll gives the structure it promises: ``T // f`` iterations of ``f``
  copies plus ``T % f`` constant copies, or, when ``f >= T``, only constant
  copies whose offsets are folded to static ones; and the scheduler keeps a full
  unroll when the folded offsets let barriers go;
* reclustering never breaks a dependence (the new order is a topological order of
  every read/write dependence of the old one, for random operator DAGs with
  in-place updates) and cuts barriers on a constructed branch;
* inline removes function uTasks and the barriers their fences cost.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
import pyflow.cocktailer as ck
import pyflow.nn.functional as F
from pyflow.cocktailer.executor import Options
from pyflow.cocktailer.ir import Branch, FunctionCall, Loop, StmtBlock, UOperator, walk
from pyflow.cocktailer.optimize import (
    Optimizations,
    barrier_sites,
    dependences,
    fold,
    inline_functions,
    occupancy_class,
    optimize,
    recluster_block,
    recluster_branches,
    static_value,
    unroll_loop,
    unroll_loops,
)
from pyflow.cocktailer.random_programs import build, inputs
from pyflow.cocktailer.scalars import BinOp, Const, Var
from pyflow.cocktailer.schedule import schedule
from tests.strategies import cocktailer_programs

# host and compiled executors are compared bit for bit: both on one simulator tier (tests/conftest.py;
# under auto a kernel launched again and again switches to the compiled tier part-way through a test)
pytestmark = pytest.mark.sim_tier("threads")

THREADS = 4


def ops_of(block):
    return [s for s in walk(block) if isinstance(s, UOperator)]


def loops_of(block):
    return [s for s in walk(block) if isinstance(s, Loop)]


def executions(block) -> int:
    """How many operator runs ``block`` makes (static trip counts only)."""
    count = 0
    for s in block.items:
        if isinstance(s, UOperator):
            count += 1
        elif isinstance(s, Loop):
            count += static_value(s.trip) * executions(s.body)
        else:
            count += sum(executions(b) for b in s.blocks())
    return count


def rnn(trip):
    def prog(h0, xs, w, b):
        return ck.for_loop(trip, lambda t, h: flow.tanh(F.linear(h, w, b) + xs[t]), h0)

    rng = np.random.default_rng(trip)
    args = (rng.standard_normal((2, 8)).astype(np.float32), rng.standard_normal((max(trip, 1), 2, 8)).astype(np.float32),
            (rng.standard_normal((8, 8)) * 0.3).astype(np.float32), rng.standard_normal(8).astype(np.float32))
    return ck.trace(prog, *args, chunk=4, tile=4), args


# ---- scalars --------------------------------------------------------------------------


def test_fold_and_static_value():
    i = Var("i")
    assert fold(BinOp("+", Const(2), Const(3))).value == 5
    assert fold(BinOp("*", i, Const(3))).op == "*"
    assert static_value(BinOp("*", BinOp("+", Const(1), Const(2)), Const(4))) == 12
    assert static_value(BinOp("+", i, Const(1))) is None
    assert static_value(BinOp("//", Const(1), Const(0))) is None   # left to run time


# ---- loop unroll -------------------------------------------------------------------------


@settings(max_examples=10)
@given(trip=st.integers(0, 7), factor=st.integers(1, 5), blocks=st.integers(1, 3))
def test_unrolled_loops_have_the_promised_structure_and_the_same_values(trip, factor, blocks):
    program, args = rnn(trip)
    (loop,) = loops_of(program.body)
    body_ops = len(ops_of(loop.body))
    new = unroll_loop(loop, factor)
    f = min(factor, trip)
    if trip < 2 or factor < 2:
        assert new == [loop]
    elif trip // f == 1:   # full unroll: no loop left, every offset static
        assert not any(isinstance(s, Loop) for s in new) and len(new) == trip * body_ops
        assert all(a.offset.dynamic is None for s in new for a in s.args if hasattr(a, "offset"))
    else:
        main, *rest = new
        assert isinstance(main, Loop) and static_value(main.trip) == trip // f and main.unroll == f
        assert len(ops_of(main.body)) == f * body_ops and len(rest) == (trip % f) * body_ops
        assert "unrolled x" in str(unroll_loops(program, factor).program)
    unrolled = unroll_loops(program, factor).program
    assert executions(unrolled.body) == executions(program.body)   # the same operators run, as often
    host = ck.compile(program, mode="host", threads=THREADS)(*args)
    np.testing.assert_array_equal(ck.compile(unrolled, mode="compiled", threads=THREADS, blocks=blocks)(*args), host)
    assert loops_of(program.body) == [loop] and len(ops_of(loop.body)) == body_ops   # the input is untouched


def rows_program():
    def rows(x):   # y[i] = tanh(x[i]): each step writes a row the barrier plan cannot place
        return ck.for_loop(4, lambda i, y: ck.update(y, i, flow.tanh(x[i])), flow.zeros(4, 8))

    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    return ck.trace(rows, x, chunk=4, tile=4), (x,)


def test_full_unroll_folds_dynamic_rows_and_the_schedule_keeps_it_for_the_barriers_it_saves():
    program, args = rows_program()
    sched = schedule(program, Options(threads=THREADS))
    kept = [n for n in sched.optimizations if n.kept]
    assert kept and kept[-1].name.startswith("unroll") and kept[-1].after.barriers < kept[-1].before.barriers
    assert not loops_of(sched.program.body)
    runs = {}
    host = ck.compile(program, mode="host", threads=THREADS)(*args)
    # A float32 tanh other than numpy's (CUDA's tanhf is within 2 ulp of the true value, numpy's within 1) may
    # differ from numpy's by a few ulp: 1 on the H200.  The executors run the same device tanh: bit for bit.
    np.testing.assert_array_max_ulp(host, np.tanh(args[0]), maxulp=3)
    for name, prog in (("loop", program), ("unrolled", sched.program)):
        compiled = ck.compile(prog, mode="compiled", threads=THREADS)
        np.testing.assert_array_equal(compiled(*args), host, err_msg=name)
        runs[name] = compiled.last_stats.barriers
    assert runs["unrolled"] < runs["loop"]
    assert runs["unrolled"] == sched.estimate.barriers   # the model counted what the kernel executes


def test_unroll_leaves_device_trip_counts_and_while_loops_alone():
    def prog(h, n):
        h = ck.for_loop(n[0].item(), lambda i, h: flow.tanh(h), h)
        return ck.while_loop(lambda h: h.reshape(1, -1).sum(-1).item() > 100.0, flow.tanh, h, max_iters=3)

    program = ck.trace(prog, ck.spec(2, 4), ck.spec(1, dtype="int64"), chunk=4, tile=4)
    assert unroll_loops(program, 2).changed == 0 and unroll_loops(program, 0).changed == 0


# ---- branch reclustering ----------------------------------------------------------------------


def two_towers():
    def prog(x, w1, w2, flag):
        def towers(x):
            a = flow.tanh(F.linear(x, w1))
            b = flow.tanh(F.linear(x, w2))
            return a + b

        return ck.cond(flag[0].item(), towers, flow.relu, x)

    rng = np.random.default_rng(1)
    args = (rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32),
            rng.standard_normal((8, 8)).astype(np.float32), np.array([1], np.int64))
    return ck.trace(prog, *args, chunk=4, tile=4), args


def test_reclustering_groups_the_two_towers_and_saves_a_barrier():
    program, args = two_towers()
    result = recluster_branches(program)
    assert result.changed == 1
    (branch,) = [s for s in walk(result.program.body) if isinstance(s, Branch)]
    assert [op.name for op in branch.then.items] == ["linear", "linear", "tanh", "tanh", "add", "copy"]
    assert [occupancy_class(op) for op in branch.then.items[:3]] == ["limited", "limited", "high"]
    host = ck.compile(program, mode="host", threads=THREADS)(*args)
    barriers = {}
    for name, prog in (("before", program), ("after", result.program)):
        compiled = ck.compile(prog, mode="compiled", threads=THREADS, blocks=3)
        np.testing.assert_array_equal(compiled(*args), host)
        barriers[name] = compiled.last_stats.barriers
    assert barriers == {"before": 2, "after": 1}
    sched = schedule(program, Options(threads=THREADS))
    (note,) = [n for n in sched.optimizations if n.name == "recluster"]
    assert note.kept and note.after.barriers < note.before.barriers


def test_dependence_weights_follow_the_barrier_rules():
    program, _ = two_towers()
    (branch,) = [s for s in walk(program.body) if isinstance(s, Branch)]
    assert [op.name for op in branch.then.items] == ["linear", "tanh", "linear", "tanh", "add", "copy"]
    deps = dependences(branch.then.items)
    assert deps[(0, 1)] == 1          # tanh reads linear's tiles: written by any block
    assert (0, 2) not in deps         # the two linears share only a read of x
    assert deps[(1, 4)] == 0          # add reads tanh's chunks on the same threads: order only
    assert deps[(4, 5)] == 0


# random DAGs of operators with in-place updates, inside a branch
dag_steps = st.lists(st.tuples(st.sampled_from(["linear", "tanh", "add", "mul", "softmax", "update"]),
                               st.integers(0, 50), st.integers(0, 50), st.integers(0, 3)), min_size=2, max_size=8)


def dag_program(steps):
    def prog(x, w, flag):
        def dag(x):
            pool = [x]
            for kind, a, b, row in steps:
                u, v = pool[a % len(pool)], pool[b % len(pool)]
                if kind == "linear":
                    pool.append(F.linear(u, w))
                elif kind == "tanh":
                    pool.append(flow.tanh(u))
                elif kind == "add":
                    pool.append(u + v)
                elif kind == "mul":
                    pool.append(u * v)
                elif kind == "softmax":
                    pool.append(u.softmax(-1))
                elif u.readonly:
                    pool.append(ck.update(u.clone(), row, v[row]))
                else:   # in place: every earlier reader of u must stay before it
                    pool[a % len(pool)] = ck.update(u, row, v[row])
            return tuple(pool[-2:]) if len(pool) > 2 else (pool[-1], pool[-1])

        return ck.cond(flag[0].item(), dag, lambda x: (flow.relu(x), flow.tanh(x)), x)

    return prog


@settings(max_examples=15)
@given(steps=dag_steps, blocks=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_reclustering_never_breaks_a_dependence(steps, blocks, seed):
    rng = np.random.default_rng(seed)
    args = (rng.standard_normal((4, 8)).astype(np.float32), (rng.standard_normal((8, 8)) * 0.5).astype(np.float32),
            np.array([1], np.int64))
    program = ck.trace(dag_program(steps), *args, chunk=4, tile=4)
    (branch,) = [s for s in walk(program.body) if isinstance(s, Branch)]
    old = list(branch.then.items)
    new_block, changed = recluster_block(branch.then)
    assert sorted(map(id, new_block.items)) == sorted(map(id, old))   # the same operators, reordered
    position = {id(op): k for k, op in enumerate(new_block.items)}
    for i, j in dependences(old):
        assert position[id(old[i])] < position[id(old[j])], f"{old[j]} moved before {old[i]}"
    assert barrier_sites(new_block) <= barrier_sites(StmtBlock(old))
    assert changed == (barrier_sites(new_block) < barrier_sites(StmtBlock(old)))
    host = ck.compile(program, mode="host", threads=THREADS)(*args)
    reclustered = recluster_branches(program).program
    got = ck.compile(reclustered, mode="compiled", threads=THREADS, blocks=blocks)(*args)
    for g, h in zip(got, host):
        np.testing.assert_array_equal(g, h)


# ---- function inline --------------------------------------------------------------------------


def test_inline_removes_function_utasks_and_their_fences():
    @ck.function
    def cell(h, w, b):
        return flow.tanh(F.linear(h, w, b))

    _, args = rnn(3)
    program = ck.trace(lambda h0, xs, w, b: ck.for_loop(3, lambda i, h: cell(h, w, b) + h, h0),
                       *args, chunk=4, tile=4, name="fn")
    inlined = inline_functions(program)
    assert inlined.changed == 1 and not any(isinstance(s, FunctionCall) for s in walk(inlined.program.body))
    assert any(isinstance(s, FunctionCall) for s in walk(program.body))
    sched = schedule(program, Options(threads=THREADS))
    (note,) = [n for n in sched.optimizations if n.name == "inline"]
    assert note.kept and note.after.barriers < note.before.barriers
    fenced = ck.compile(program, mode="compiled", threads=THREADS, inline=False)
    auto = ck.compile(program, mode="auto", threads=THREADS)
    np.testing.assert_array_equal(auto(*args), fenced(*args))
    assert auto.last_stats.barriers < fenced.last_stats.barriers
    off = schedule(program, Options(threads=THREADS), optimizations=Optimizations(inline=False))
    assert any(isinstance(s, FunctionCall) for s in walk(off.program.body)) and off.options.inline is False


# ---- every pass together, random programs ------------------------------------------------------


def statements(depth: int):
    return cocktailer_programs(depth, loops=2)


@settings(max_examples=12)
@given(desc=statements(2), factor=st.sampled_from([0, 2, 3]), inline=st.booleans(), recluster=st.booleans(),
       blocks=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_optimized_random_programs_give_the_same_values_bitwise(desc, factor, inline, recluster, blocks, seed):
    args = inputs(2, 4, 3, seed)
    program = ck.trace(build(desc), *args, chunk=4, tile=4, name="random")
    optimized = optimize(program, inline=inline, recluster=recluster, unroll=factor).program
    host = ck.compile(program, mode="host", threads=THREADS)(*args)
    np.testing.assert_array_equal(ck.compile(optimized, mode="compiled", threads=THREADS, blocks=blocks)(*args), host)
    np.testing.assert_array_equal(ck.compile(optimized, mode="host", threads=THREADS)(*args), host)
