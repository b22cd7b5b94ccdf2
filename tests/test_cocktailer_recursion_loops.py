"""Loops inside recursive functions (seed 001; the artifact cannot compile them): for and while, with calls or not.

A recursive function uTask may hold ``for_loop`` s and ``while_loop`` s.  A loop
without a call runs inside one segment of the function's state machine (a Python
loop in the kernel); a loop whose body calls the function is itself cut into
segments (``codegen_recursion._Segments.loop``): its counter and trip count live in the
frame, so every recursive call resumes inside the right iteration.  The
properties:

* random trees of any arity (a node's children visited by a ``for_loop`` over a
  per-node child count read on the device) give numpy's values, bitwise the same
  on the host executor and the compiled kernel, on any grid, in the model modes
  ``"host"``, ``"compiled"`` and ``"auto"``, and with the loop unrolled;
* a while loop holding a call runs its test before each iteration, and one over
  its cap raises ``IterationLimitError`` on both executors, also inside a block
  group of recursion unroll; the stack still overflows where it should;
* recursion unroll inlines the function's body (and its loops) into lanes that
  call copies of the function holding the same loops: every loop counter keeps a
  kernel local of its own, also one read after a call returns;
* every loop kind compiles to PTX (``tests/test_ptx.py``, example
  ``recursion_with_loops``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
import pyflow.cocktailer as ck
import pyflow.nn.functional as F
from pyflow.cocktailer.ir import CallGroup, Loop, walk
from pyflow.cocktailer.optimize import unroll_loops
from pyflow.cocktailer.optimize_recursion import unroll_recursion
from pyflow.errors import IterationLimitError, StackOverflowError
from tests.test_cocktailer import random_tree
from tests.test_cocktailer_unroll import balanced

# host and compiled executors are compared bit for bit: both on one simulator tier (tests/conftest.py)
pytestmark = pytest.mark.sim_tier("threads")

ARITY = 3   # kids[node * ARITY + i] is child i of node (i < nkids[node])


def nary_program(dim: int, refine: int = 2):
    """Each inner node sums its children (a for loop holding the call, trip count read on the device), then
    refines the sum ``refine`` times (a for loop without a call); a leaf gives its value."""

    def prog(kids, nkids, values, w, b):
        @ck.function(returns=ck.spec(dim))
        def walk_tree(node):
            def inner():
                def child(i, acc):
                    return acc + walk_tree(kids[node * ARITY + i].item())

                total = ck.for_loop(nkids[node].item(), child, flow.zeros(dim))
                return ck.for_loop(refine, lambda j, h: flow.tanh(F.linear(h, w, b)), total)

            return ck.cond(nkids[node].item().eq(0), lambda: values[node].clone(), inner)

        return walk_tree(0)

    return prog


def nary_reference(kids, nkids, values, w, b, refine: int = 2):
    def visit(node):
        if nkids[node] == 0:
            return values[node].astype(np.float64)
        acc = sum(visit(kids[node * ARITY + i]) for i in range(nkids[node]))
        for _ in range(refine):
            acc = np.tanh(w.astype(np.float64) @ acc + b)
        return acc

    return visit(0)


def random_nary_tree(nodes: int, rng):
    """A random tree of ``nodes`` nodes, each with 0..ARITY children, node 0 the root (breadth first)."""
    nkids = np.zeros(nodes, np.int64)
    kids = np.zeros(nodes * ARITY, np.int64)
    frontier, nxt = [0], 1
    while frontier and nxt < nodes:
        node = frontier.pop(0)
        count = int(min(rng.integers(1, ARITY + 1), nodes - nxt))
        for i in range(count):
            kids[node * ARITY + i] = nxt
            frontier.append(nxt)
            nxt += 1
        nkids[node] = count
    return kids, nkids


def tree_args(kids, nkids, dim, rng):
    n = len(nkids)
    return (kids, nkids, rng.standard_normal((n, dim)).astype(np.float32),
            (rng.standard_normal((dim, dim)) * 0.6).astype(np.float32), rng.standard_normal(dim).astype(np.float32))


@settings(max_examples=10, deadline=None)
@given(nodes=st.integers(1, 12), dim=st.integers(1, 4), blocks=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_trees_of_any_arity_walked_by_a_loop_holding_the_call_agree_with_numpy(nodes, dim, blocks, seed):
    rng = np.random.default_rng(seed)
    args = tree_args(*random_nary_tree(nodes, rng), dim, rng)
    program = ck.trace(nary_program(dim), *args, chunk=2, tile=2)
    assert [s.kind for s in walk(program.functions[0].body) if isinstance(s, Loop)] == ["for", "for"]
    host = ck.compile(program, mode="host", threads=2)
    want = host(*args)
    compiled = ck.compile(program, mode="compiled", threads=2, blocks=blocks)
    np.testing.assert_array_equal(compiled(*args), want)
    assert compiled.last_stats.launches == 1 and compiled.last_stats.host_syncs == 0
    np.testing.assert_allclose(want, nary_reference(*args), rtol=1e-5, atol=1e-6)
    inner = int(np.sum(args[1] > 0))
    assert host.last_stats.launches >= 2 * inner * 3   # every refine step is launches of its own on the host


def _fixed_tree():
    """0 -> 1, 2, 3; 2 -> 4, 5; 3 -> 6: arities 3, 2 and 1 in one tree."""
    nkids = np.array([3, 0, 2, 1, 0, 0, 0], np.int64)
    kids = np.zeros(7 * ARITY, np.int64)
    kids[0:3], kids[6:8], kids[9] = [1, 2, 3], [4, 5], 6
    return kids, nkids


@pytest.mark.parametrize("mode", ["host", "compiled", "auto"])
def test_every_mode_gives_the_reference(mode):
    rng = np.random.default_rng(3)
    args = tree_args(*_fixed_tree(), 3, rng)
    program = ck.trace(nary_program(3), *args, chunk=2, tile=2)
    got = ck.compile(program, mode=mode, threads=2)(*args)
    np.testing.assert_allclose(got, nary_reference(*args), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got, ck.compile(program, mode="host", threads=2)(*args))


def static_arity_program(dim: int):
    """Every inner node has exactly two children, visited by ``for_loop(2, ...)``: a static trip count."""

    def prog(left, right, is_leaf, values, w, b):
        @ck.function(returns=ck.spec(dim))
        def walk_tree(node):
            def inner():
                def child(i, acc):   # child i; the first also adds the node's own value (a branch in the loop)
                    own = ck.cond(i.eq(0), lambda: values[node].clone(), lambda: flow.zeros(dim))
                    return acc + own + walk_tree((left[node].item() * (1 - i)) + right[node].item() * i)

                total = ck.for_loop(2, child, flow.zeros(dim))
                return flow.tanh(F.linear(total, w, b))

            return ck.cond(is_leaf[node].item(), lambda: values[node].clone(), inner)

        return walk_tree(0)

    return prog


def test_a_static_child_loop_unrolled_or_not_gives_the_same_values_in_every_mode():
    left, right, is_leaf = balanced(8)
    rng = np.random.default_rng(4)
    dim = 2
    values = rng.standard_normal((15, dim)).astype(np.float32)
    w = (rng.standard_normal((dim, dim)) * 0.6).astype(np.float32)
    b = rng.standard_normal(dim).astype(np.float32)
    args = (left, right, is_leaf, values, w, b)

    def reference(node=0):
        if is_leaf[node]:
            return values[node].astype(np.float64)
        acc = values[node].astype(np.float64) + reference(left[node]) + reference(right[node])
        return np.tanh(w.astype(np.float64) @ acc + b)

    program = ck.trace(static_arity_program(dim), *args, chunk=2, tile=2)
    want = ck.compile(program, mode="host", threads=2)(*args)
    np.testing.assert_allclose(want, reference(), rtol=1e-5, atol=1e-6)
    unrolled_loop = unroll_loops(program, 0).program    # the child loop, fully: a call per child, no loop
    assert not any(isinstance(s, Loop) for s in walk(unrolled_loop.functions[0].body))
    assert any(isinstance(s, Loop) for s in walk(program.functions[0].body))
    for prog in (program, unrolled_loop):
        np.testing.assert_array_equal(ck.compile(prog, mode="host", threads=2)(*args), want)
        for blocks in (1, 4):
            np.testing.assert_array_equal(ck.compile(prog, mode="compiled", threads=2, blocks=blocks)(*args), want)
    auto = ck.compile(program, mode="auto", threads=2)
    np.testing.assert_array_equal(auto(*args), want)
    assert auto.last_stats.launches == 1


# ---- while loops -----------------------------------------------------------------------------------------


def while_program(dim: int, repeats_cap: int = 8):
    """Each inner node calls its child while a counter is below the node's ``repeat`` (a while loop holding the
    call), then shrinks the sum while its norm is above 1 (a while loop without a call)."""

    def prog(child, repeat, values, one, half):
        @ck.function(returns=ck.spec(dim))
        def walk_tree(node):
            def inner():
                def more(acc, n):
                    return n[0].item() < repeat[node].item()

                def again(acc, n):
                    return acc + walk_tree(child[node].item()), n + one

                acc, _ = ck.while_loop(more, again, flow.zeros(dim), flow.zeros(1), max_iters=repeats_cap)
                return ck.while_loop(lambda h: (h * h).reshape(1, dim).sum(-1).item() > 1.0,
                                     lambda h: h * half, acc, max_iters=64)

            return ck.cond(repeat[node].item().eq(0), lambda: values[node].clone(), inner)

        return walk_tree(0)

    return prog


def while_reference(child, repeat, values):
    def visit(node):
        if repeat[node] == 0:
            return values[node].astype(np.float64)
        acc = sum(visit(child[node]) for _ in range(repeat[node]))
        while np.sum(acc * acc) > 1.0:
            acc = acc * 0.5
        return acc

    return visit(0)


def chain_args(repeats, dim, rng):
    """A chain 0 -> 1 -> ... -> len(repeats): node k calls node k + 1 ``repeats[k]`` times; the last is a leaf."""
    n = len(repeats) + 1
    child = np.array([min(k + 1, n - 1) for k in range(n)], np.int64)
    repeat = np.array(list(repeats) + [0], np.int64)
    values = rng.standard_normal((n, dim)).astype(np.float32) * 3
    return child, repeat, values, np.ones(1, np.float32), np.full(dim, 0.5, np.float32)


@settings(max_examples=8, deadline=None)
@given(repeats=st.lists(st.integers(1, 3), min_size=1, max_size=3), dim=st.integers(1, 3),
       blocks=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_while_loops_in_a_recursion_with_and_without_a_call_agree_with_numpy(repeats, dim, blocks, seed):
    rng = np.random.default_rng(seed)
    args = chain_args(repeats, dim, rng)
    program = ck.trace(while_program(dim), *args, chunk=2, tile=2)
    want = ck.compile(program, mode="host", threads=2)(*args)
    compiled = ck.compile(program, mode="compiled", threads=2, blocks=blocks)
    np.testing.assert_array_equal(compiled(*args), want)
    np.testing.assert_allclose(want, while_reference(*args[:3]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode, blocks", [("host", 1), ("compiled", 1), ("compiled", 3)])
def test_a_while_loop_holding_a_call_over_its_cap_raises(mode, blocks):
    rng = np.random.default_rng(5)
    args = chain_args([2, 5], 2, rng)             # node 1 repeats 5 times, the cap is 4
    program = ck.trace(while_program(2, repeats_cap=4), *args, chunk=2, tile=2)
    with pytest.raises(IterationLimitError, match="max_iters=4"):
        ck.compile(program, mode=mode, threads=2, blocks=blocks)(*args)
    ok = chain_args([2, 4], 2, rng)
    np.testing.assert_allclose(ck.compile(program, mode=mode, threads=2, blocks=blocks)(*ok),
                               while_reference(*ok[:3]), rtol=1e-5, atol=1e-6)


def test_an_error_in_a_loop_inside_a_block_group_stops_the_kernel():
    """Recursion unroll puts the calls of a binary node's loop on two block groups; one group's while loop goes
    over its cap inside its recursion, the other finishes; the kernel reports it, nothing hangs."""

    def prog(left, right, repeat, values, one):
        @ck.function(returns=ck.spec(2))
        def walk_tree(node):
            def inner():
                a = walk_tree(left[node].item())
                b = walk_tree(right[node].item())
                spun, _ = ck.while_loop(lambda h, n: n[0].item() < repeat[node].item(),
                                        lambda h, n: (flow.tanh(h), n + one), a + b, flow.zeros(1),
                                        max_iters=3)
                return spun

            return ck.cond(repeat[node].item().eq(0), lambda: values[node].clone(), inner)

        return walk_tree(0)

    # 0 -> 1, 2; 1 -> 3, 4; 2 -> 5, 6; node 5 is inner too? no: leaves 3..6; node 2 spins 9 times (cap 3)
    left = np.array([1, 3, 5, 0, 0, 0, 0], np.int64)
    right = np.array([2, 4, 6, 0, 0, 0, 0], np.int64)
    values = np.random.default_rng(6).standard_normal((7, 2)).astype(np.float32)
    one = np.ones(1, np.float32)
    program = ck.trace(prog, left, right, np.array([1, 2, 9, 0, 0, 0, 0], np.int64), values, one, chunk=2, tile=2)
    unrolled = unroll_recursion(program, 1).program
    assert any(isinstance(s, CallGroup) for s in walk(unrolled.body))
    for prog_, mode, blocks in ((program, "host", 1), (unrolled, "compiled", 4), (unrolled, "compiled", 1)):
        with pytest.raises(IterationLimitError, match="max_iters=3"):
            ck.compile(prog_, mode=mode, threads=2, blocks=blocks)(left, right, np.array([1, 2, 9, 0, 0, 0, 0]),
                                                                   values, one)
        good = ck.compile(prog_, mode=mode, threads=2, blocks=blocks)(left, right, np.array([1, 2, 3, 0, 0, 0, 0]),
                                                                      values, one)
        want = ck.compile(program, mode="host", threads=2)(left, right, np.array([1, 2, 3, 0, 0, 0, 0]), values, one)
        np.testing.assert_array_equal(good, want)


def test_the_stack_still_overflows_where_it_should():
    rng = np.random.default_rng(7)
    args = chain_args([1, 1, 1, 1], 2, rng)      # five frames deep
    program = ck.trace(while_program(2), *args, chunk=2, tile=2)
    for mode in ("host", "compiled"):
        np.testing.assert_allclose(ck.compile(program, mode=mode, threads=2, stack_depth=5)(*args),
                                   while_reference(*args[:3]), rtol=1e-5, atol=1e-6)
        with pytest.raises(StackOverflowError, match="stack_depth=4"):
            ck.compile(program, mode=mode, threads=2, stack_depth=4)(*args)


# ---- loops in unrolled recursions: every counter its own --------------------------------------------------


def revisit_program(dim: int):
    """An inner node walks both children (sibling calls: recursion unroll groups them), then again in a for loop
    holding the call, whose counter also picks a scale row *after* the call returns."""

    def prog(left, right, is_leaf, values, scale):
        @ck.function(returns=ck.spec(dim))
        def walk_tree(node):
            def inner():
                both = walk_tree(left[node].item()) + walk_tree(right[node].item())

                def again(i, acc):
                    child = walk_tree((left[node].item() * (1 - i)) + right[node].item() * i)
                    return flow.tanh(acc + (child * scale[i]))

                return ck.for_loop(2, again, both)

            return ck.cond(is_leaf[node].item(), lambda: values[node].clone(), inner)

        return walk_tree(0)

    return prog


def revisit_reference(left, right, is_leaf, values, scale):
    def visit(node):
        if is_leaf[node]:
            return values[node].astype(np.float64)
        acc = visit(left[node]) + visit(right[node])
        for i, child in enumerate((left[node], right[node])):
            acc = np.tanh(acc + visit(child) * scale[i])
        return acc

    return visit(0)


@settings(max_examples=8, deadline=None)
@given(leaves=st.integers(1, 6), depth=st.integers(0, 3), blocks=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_a_loop_holding_a_call_in_an_unrolled_lane_keeps_its_own_counter(leaves, depth, blocks, seed):
    rng = np.random.default_rng(seed)
    left, right, is_leaf = random_tree(leaves, rng)
    dim = 2
    args = (left, right, is_leaf, rng.standard_normal((len(left), dim)).astype(np.float32),
            np.array([[0.5, -1.0], [2.0, 0.25]], np.float32))
    program = ck.trace(revisit_program(dim), *args, chunk=2, tile=2)
    want = ck.compile(program, mode="host", threads=2)(*args)
    np.testing.assert_allclose(want, revisit_reference(*args), rtol=1e-5, atol=1e-6)
    prog = unroll_recursion(program, depth).program if depth else program
    if depth and leaves > 1:
        assert any(isinstance(s, CallGroup) for s in walk(prog.body))
    np.testing.assert_array_equal(ck.compile(prog, mode="compiled", threads=2, blocks=blocks)(*args), want)
    np.testing.assert_array_equal(ck.compile(prog, mode="host", threads=2)(*args), want)
