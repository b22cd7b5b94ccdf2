"""Cocktailer (seed 001): random programs agree on both executors; one launch, no host syncs; barriers matter.

The central property: a traced program gives the same values under the compiled
executor (one persistent kernel, concurrent blocks, grid barriers) and the host
executor (one launch per operator, control flow in Python), bitwise, for any grid
of 1-6 blocks and with inlining on or off: both run the same uTasks, and a
uTask's result never depends on which block runs it.  Each program is also
interpreted with numpy from the same random description, so a bug shared by both
executors (say, in the front end) is caught too.

Random programs: a carried state ``h`` (batch, hidden) goes through statements
drawn by hypothesis: ops (linear+tanh, add a row of ``xs``, softmax, mul), ``for``
loops (static or device-resident trip counts), ``while`` loops counting up to a
device limit, and ``cond``s on a device flag or on the sign of a sum, nested up to
depth 3.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
import pyflow.cocktailer as ck
import pyflow.nn.functional as F
from pyflow.cocktailer.api import Compiled
from pyflow.cocktailer.executor import Options
from pyflow.cocktailer.random_programs import build, inputs, numpy_twin
from pyflow.errors import (CooperativeLaunchTooLargeError, DTypeError, IndexOutOfRangeError,
                           IterationLimitError, ShapeError, StackOverflowError)
from pyflow.kernels import sim
from tests.strategies import cocktailer_programs

# host and compiled executors are compared bit for bit: both on one simulator tier (tests/conftest.py)
pytestmark = pytest.mark.sim_tier("threads")

# ---- random program descriptions --------------------------------------------------
# a statement is a tuple: ("op", kind) | ("for", trip, device, body) | ("while", limit, device, body)
#                         | ("cond", pred_kind, flag_index, then, else)

def statements(depth: int):
    return cocktailer_programs(depth, ops=2)


def trace_random(desc, args):
    return ck.trace(build(desc), *args, chunk=4, tile=4, name="random")


@settings(max_examples=12)
@given(desc=statements(3), batch=st.integers(1, 2), hidden=st.integers(2, 6), blocks=st.integers(1, 6),
       inline=st.booleans(), seed=st.integers(0, 2**16))
def test_random_programs_agree_on_both_executors_and_with_numpy(desc, batch, hidden, blocks, inline, seed):
    args = inputs(batch, hidden, 3, seed)
    program = trace_random(desc, args)
    host = ck.compile(program, mode="host", threads=4, inline=inline)(*args)
    compiled = ck.compile(program, mode="compiled", threads=4, blocks=blocks, inline=inline)
    got = compiled(*args)
    np.testing.assert_array_equal(got, host)
    np.testing.assert_allclose(got, numpy_twin(desc, *args[:6]), rtol=1e-4, atol=1e-5)
    assert compiled.last_stats.launches == 1 and compiled.last_stats.host_syncs == 0


# ---- functions (inline on / off) and recursion ------------------------------------------


def test_function_utasks_inline_or_fenced_give_the_same_values():
    @ck.function
    def cell(h, w, b):
        return flow.tanh(F.linear(h, w, b))

    def prog(h0, w, b):
        return ck.for_loop(3, lambda i, h: cell(h, w, b) + h, h0)

    rng = np.random.default_rng(3)
    args = (rng.standard_normal((2, 5)).astype(np.float32), rng.standard_normal((5, 5)).astype(np.float32),
            rng.standard_normal(5).astype(np.float32))
    program = ck.trace(prog, *args, chunk=4, tile=4)
    host = ck.compile(program, mode="host", threads=4)(*args)
    runs = {}
    for inline in (True, False):
        c = ck.compile(program, mode="compiled", threads=4, blocks=3, inline=inline)
        np.testing.assert_array_equal(c(*args), host)
        runs[inline] = c.last_stats.barriers
    assert runs[False] > runs[True]  # a fenced function uTask costs barriers on both sides


def random_tree(leaves: int, rng):
    left, right, leaf = [], [], []

    def grow(k):
        i = len(leaf)
        leaf.append(1 if k == 1 else 0)
        left.append(0)
        right.append(0)
        if k > 1:
            a = int(rng.integers(1, k))
            left[i], right[i] = grow(a), grow(k - a)
        return i

    grow(leaves)
    return np.array(left, np.int64), np.array(right, np.int64), np.array(leaf, np.int64)


def tree_program(dim):
    def prog(left, right, is_leaf, values, w, b):
        @ck.function(returns=ck.spec(dim))
        def walk(node):
            def inner():
                both = flow.cat([walk(left[node].item()), walk(right[node].item())])
                return flow.relu(F.linear(both, w, b))

            return ck.cond(is_leaf[node].item(), lambda: flow.tanh(values[node]), inner)

        return walk(0)

    return prog


def tree_reference(left, right, is_leaf, values, w, b):
    def walk(n):
        if is_leaf[n]:
            return np.tanh(values[n])
        return np.maximum(w @ np.concatenate([walk(left[n]), walk(right[n])]) + b, 0)

    return walk(0)


@settings(max_examples=6)
@given(leaves=st.integers(1, 7), dim=st.integers(1, 4), blocks=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_random_recursion_trees_agree(leaves, dim, blocks, seed):
    rng = np.random.default_rng(seed)
    left, right, is_leaf = random_tree(leaves, rng)
    n = len(left)
    args = (left, right, is_leaf, rng.standard_normal((n, dim)).astype(np.float32),
            (rng.standard_normal((dim, 2 * dim)) * 0.5).astype(np.float32), rng.standard_normal(dim).astype(np.float32))
    program = ck.trace(tree_program(dim), *args, chunk=4, tile=4)
    host = ck.compile(program, mode="host", threads=4)
    compiled = ck.compile(program, mode="compiled", threads=4, blocks=blocks)
    got = compiled(*args)
    np.testing.assert_array_equal(got, host(*args))
    np.testing.assert_allclose(got, tree_reference(*args), rtol=1e-5, atol=1e-6)
    assert compiled.last_stats.launches == 1 and compiled.last_stats.host_syncs == 0
    assert host.last_stats.host_syncs >= n  # every node's is_leaf flag was read on the host


def chain(depth: int):
    """A left-deep tree: node k's left child is node k + 1, its right child a leaf."""
    left, right, leaf = [], [], []
    for k in range(depth):
        left.append(2 * k + 1 if k < depth - 1 else 0)
        right.append(2 * k + 2 if k < depth - 1 else 0)
        leaf.append(0 if k < depth - 1 else 1)
    # renumber: inner nodes 0, 2, 4, ...; the chain continues at the left child
    n = 2 * depth - 1
    L, R, F = np.zeros(n, np.int64), np.zeros(n, np.int64), np.ones(n, np.int64)
    for k in range(depth - 1):
        L[2 * k], R[2 * k], F[2 * k] = 2 * k + 2, 2 * k + 1, 0
    return L, R, F


def test_recursion_deeper_than_32_frames():
    L, R, F = chain(40)  # 40 frames active at the deepest point (the artifact fixes 32)
    rng = np.random.default_rng(0)
    dim = 2
    args = (L, R, F, rng.standard_normal((len(L), dim)).astype(np.float32),
            (rng.standard_normal((dim, 2 * dim)) * 0.5).astype(np.float32), rng.standard_normal(dim).astype(np.float32))
    program = ck.trace(tree_program(dim), *args, chunk=4, tile=4)
    compiled = ck.compile(program, mode="compiled", threads=2, blocks=2, stack_depth=41)
    np.testing.assert_allclose(compiled(*args), tree_reference(*args), rtol=1e-5, atol=1e-6)
    for mode in ("compiled", "host"):
        with pytest.raises(StackOverflowError, match="stack_depth=39"):
            ck.compile(program, mode=mode, threads=2, blocks=2, stack_depth=39)(*args)


# ---- barriers -----------------------------------------------------------------------


def rnn_program():
    def rnn(h0, xs, w, b):
        return ck.for_loop(xs.shape[0], lambda t, h: flow.tanh(F.linear(h, w, b) + xs[t]), h0)

    rng = np.random.default_rng(0)
    args = (rng.standard_normal((2, 8)).astype(np.float32), rng.standard_normal((3, 2, 8)).astype(np.float32),
            (rng.standard_normal((8, 8)) * 0.3).astype(np.float32), rng.standard_normal(8).astype(np.float32))
    return ck.trace(rnn, *args, chunk=4, tile=4), args


def test_barriers_only_where_a_dependence_crosses_blocks():
    program, args = rnn_program()
    compiled = ck.compile(program, mode="compiled", threads=4, blocks=3)
    compiled(*args)
    source = compiled.source
    # per step: linear reads all of h (barrier), add reads linear's tiles (barrier);
    # add -> tanh -> copy touch the same chunks on the same threads: no barrier
    assert source.count("grid.sync()") == 2
    assert compiled.last_stats.barriers == 2 * 3
    assert compiled.last_stats.launches == 1 and compiled.last_stats.host_syncs == 0
    host = ck.compile(program, mode="host", threads=4)
    host(*args)
    assert host.last_stats.launches == 1 + 3 * 4 + 1 and host.last_stats.barriers == 0


def test_removing_a_needed_barrier_breaks_the_result():
    program, args = rnn_program()
    good = ck.compile(program, mode="host", threads=4)(*args)
    sites = ck.compile(program, mode="compiled", threads=4, blocks=3).kernels[0].writer.barrier_sites
    assert sites
    for site in sites:
        wrong = 0
        for seed in range(3):  # the simulator's block start order: a race shows under some order
            with sim.configure(seed=seed, tier="threads"):   # a race shows only among threads
                broken = Compiled(program, "compiled", Options(threads=4, blocks=3), drop_barriers=frozenset([site]))
                wrong += not np.array_equal(broken(*args), good)
        assert wrong, f"dropping the barrier {site} went unnoticed"


# ---- errors -------------------------------------------------------------------------


def test_shape_errors_at_trace_time_name_the_op_and_shapes():
    with pytest.raises(ShapeError, match=r"linear: input float32\[2, 3\] .*does not fit weight float32\[4, 5\]"):
        ck.trace(lambda x, w: F.linear(x, w), ck.spec(2, 3), ck.spec(4, 5))
    with pytest.raises(ShapeError, match="add: shapes"):
        ck.trace(lambda a, b: a + b, ck.spec(2, 3), ck.spec(3, 2))
    with pytest.raises(ShapeError, match="carried value changed"):
        ck.trace(lambda h: ck.for_loop(2, lambda i, h: h.sum(-1), h), ck.spec(2, 3))
    with pytest.raises(ShapeError, match="branches return different shapes"):
        ck.trace(lambda h, f: ck.cond(f[0].item(), lambda: h, lambda: h.sum(-1)), ck.spec(2, 3),
                 ck.spec(1, dtype="int64"))
    with pytest.raises(DTypeError, match="int tables are only"):
        ck.trace(lambda t: t + t, ck.spec(3, dtype="int64"))
    with pytest.raises(DTypeError, match="op 'tanh': input 0 is int64 but the op computes in float32"):
        ck.trace(lambda t: flow.tanh(t), ck.spec(3, dtype="int64"))
    with pytest.raises(TypeError, match="no truth value"):
        ck.trace(lambda f, h: flow.tanh(h) if f[0].item() else h, ck.spec(1, dtype="int64"), ck.spec(2))
    with pytest.raises(ck.TraceError, match="inside cocktailer.trace"):
        ck.lstm_cell(None, None, None)


def test_stale_tensor_after_update_and_readonly_inputs():
    def prog(x):
        out = flow.zeros(2, 3)
        new = ck.update(out, 0, x)
        return out[1] + new[0]

    with pytest.raises(ck.TraceError, match="updated in place"):
        ck.trace(prog, ck.spec(3))
    with pytest.raises(ck.TraceError, match="read-only"):
        ck.trace(lambda x: ck.update(x, 0, x[1]), ck.spec(2, 3))


def test_while_loop_over_its_cap_raises_on_both_executors():
    def prog(h, one):
        return ck.while_loop(lambda h: h[0].item() > -1, lambda h: h + one, h, max_iters=4)

    program = ck.trace(prog, ck.spec(1), ck.spec(1), chunk=4, tile=4)
    args = (np.zeros(1, np.float32), np.ones(1, np.float32))
    for mode in ("host", "compiled"):
        with pytest.raises(IterationLimitError, match="max_iters=4"):
            ck.compile(program, mode=mode, threads=2, blocks=2)(*args)


def test_a_grid_that_cannot_be_coresident_is_refused_and_inputs_are_checked():
    program, args = rnn_program()
    with pytest.raises(CooperativeLaunchTooLargeError, match="co-resident"):
        ck.compile(program, mode="compiled", threads=4, blocks=10_000)(*args)
    c = ck.compile(program, mode="compiled", threads=4)
    with pytest.raises(ShapeError, match="input 'xs' has shape"):
        c(args[0], args[0], args[2], args[3])
    with pytest.raises(DTypeError, match="float64"):
        c(args[0].astype(np.float64), *args[1:])
    np.testing.assert_array_equal(c(*args), ck.compile(program, mode="host", threads=4)(*args))


def test_device_trip_counts_and_loop_containing_branch_and_recursion():
    """A loop whose body has a branch and a recursive call compiles (the artifact cannot)."""
    dim = 2

    def prog(left, right, is_leaf, values, w, b, trips, flags):
        @ck.function(returns=ck.spec(dim))
        def walk(node):
            def inner():
                return flow.relu(F.linear(flow.cat([walk(left[node].item()), walk(right[node].item())]), w, b))

            return ck.cond(is_leaf[node].item(), lambda: flow.tanh(values[node]), inner)

        def step(i, acc):
            acc = ck.cond(flags[i].item(), lambda a: a + walk(0), lambda a: a - values[0], acc)
            return acc

        return ck.for_loop(trips[0].item(), step, flow.zeros(dim))

    rng = np.random.default_rng(5)
    left, right, is_leaf = random_tree(4, rng)
    n = len(left)
    values = rng.standard_normal((n, dim)).astype(np.float32)
    w = (rng.standard_normal((dim, 2 * dim)) * 0.5).astype(np.float32)
    b = rng.standard_normal(dim).astype(np.float32)
    trips, flags = np.array([3], np.int64), np.array([1, 0, 1], np.int64)
    args = (left, right, is_leaf, values, w, b, trips, flags)
    program = ck.trace(prog, *args, chunk=4, tile=4)
    compiled = ck.compile(program, mode="compiled", threads=4, blocks=3)
    got = compiled(*args)
    np.testing.assert_array_equal(got, ck.compile(program, mode="host", threads=4)(*args))
    tree = tree_reference(left, right, is_leaf, values, w, b)
    np.testing.assert_allclose(got, tree + tree - values[0], rtol=1e-5, atol=1e-6)
    assert compiled.last_stats.launches == 1 and compiled.last_stats.host_syncs == 0


def test_generated_source_is_kept_readable_and_steppable():
    import inspect
    import linecache

    program, _ = rnn_program()
    c = ck.compile(program, mode="compiled", threads=4, blocks=2)
    kernel = c.kernels[0].kernel
    filename = kernel.py_func.__code__.co_filename
    assert filename.startswith("<cocktailer ")
    assert "".join(linecache.getlines(filename)) == c.source
    assert inspect.getsource(kernel.py_func) == c.source
    assert "for i0 in range(3):" in c.source and "grid.sync()" in c.source


def test_a_dependence_carried_around_the_loop_gets_a_barrier():
    """Iteration i+1's linear overwrites t while iteration i's add may still read it (write after read).

    Nothing before the loop conflicts with the linear, so only the loop fixpoint
    (the end of an iteration meets the start of the next) finds this barrier.
    """

    def prog(h0, xs, w):
        return ck.for_loop(xs.shape[0], lambda i, h: F.linear(xs[i], w) + h, h0)

    rng = np.random.default_rng(0)
    args = (rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((4, 4, 8)).astype(np.float32),
            rng.standard_normal((8, 8)).astype(np.float32))
    program = ck.trace(prog, *args, chunk=4, tile=4)
    compiled = ck.compile(program, mode="compiled", threads=4, blocks=4)
    body = compiled.source.split("for i0 in range(4):")[1]
    assert body.index("grid.sync()  # before linear") < body.index("linear_t4_float32(")
    np.testing.assert_array_equal(compiled(*args), ck.compile(program, mode="host", threads=4)(*args))
    assert compiled.last_stats.barriers == 2 * 4


def test_a_row_written_at_a_runtime_index_only_conflicts_with_its_own_tensor():
    """``out[t]`` may be any row of ``out`` but nothing else: the ops around it need no barrier."""

    def prog(h0):
        def step(t, h, out):
            a = flow.tanh(h)
            out = ck.update(out, t, a)
            return flow.tanh(a), out

        return ck.for_loop(3, step, h0, flow.zeros(3, *h0.shape))[1]

    h0 = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)
    program = ck.trace(prog, h0, chunk=4, tile=4)
    compiled = ck.compile(program, mode="compiled", threads=4, blocks=3)
    got = compiled(h0)
    expected, h = [], h0
    for _ in range(3):
        expected.append(np.tanh(h))
        h = np.tanh(np.tanh(h))
    np.testing.assert_allclose(got, np.stack(expected), rtol=1e-6)
    # one barrier per step, before the row write (the previous step's row write may
    # still be running in another block), none for the elementwise ops around it,
    # and one before the output copy reads all of out
    assert compiled.last_stats.barriers == 3 + 1


@pytest.mark.parametrize("mode", ["host", "compiled"])
def test_a_runtime_index_out_of_range_is_reported_by_both_executors(mode):
    def prog(xs, n):
        return ck.for_loop(n[0].item(), lambda t, h: h + xs[t], flow.zeros(xs.shape[1:]))

    xs = np.ones((2, 3), np.float32)
    program = ck.trace(prog, xs, np.array([3], np.int64), chunk=4, tile=4)
    with pytest.raises(IndexOutOfRangeError, match=r"puts in_xs\[\(i0 \* 3\):\+3\]\[3\] at element 6, outside \[0, 6\)"):
        ck.compile(program, mode=mode, threads=2, blocks=2)(xs, np.array([3], np.int64))
    np.testing.assert_array_equal(ck.compile(program, mode=mode, threads=2, blocks=2)(xs, np.array([2], np.int64)),
                                  [2, 2, 2])


@pytest.mark.parametrize("blocks", [1, 3])
def test_a_bad_node_id_inside_a_recursion_stops_the_kernel_with_an_index_error(blocks):
    from pyflow.cocktailer.optimize_recursion import unroll_recursion

    left, right, is_leaf = random_tree(4, np.random.default_rng(0))
    inner = int(np.flatnonzero(is_leaf == 0)[-1])
    right[inner] = 99                       # a child that is not a node
    rng = np.random.default_rng(1)
    args = (left, right, is_leaf, rng.standard_normal((len(left), 2)).astype(np.float32),
            rng.standard_normal((2, 4)).astype(np.float32), rng.standard_normal(2).astype(np.float32))
    program = ck.trace(tree_program(2), *args, chunk=4, tile=4)
    for prog in (program, unroll_recursion(program).program):   # the whole grid, or one block group
        for mode in ("host", "compiled"):
            with pytest.raises(IndexOutOfRangeError, match=f"at element 99, outside \\[0, {len(left)}\\)"):
                ck.compile(prog, mode=mode, threads=2, blocks=blocks)(*args)
