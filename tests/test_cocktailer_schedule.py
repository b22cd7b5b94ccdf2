"""Cocktailer's scheduler and profiler (seed 001, sec. 3.2): Algorithm 1 under the cost model.

Specifications tested here:

* the cost model's counts are the executor's: for programs whose trip counts are
  static and that have no branches, the modelled launches / host syncs / barriers
  equal ``RunStats`` exactly, on the host and as one kernel;
* the schedule puts a loop of small operators on the device (launches saved) and
  leaves one huge operator on the host (the persistent grid is capped at the
  co-resident limit), and the printed decision says why;
* Constraint 1: control flow is never scheduled below its body; a body with a
  part on the host keeps its control flow on the host;
* ``set_resource``: the grid is the co-resident limit capped by the largest uTask
  count; more blocks than can be co-resident make the schedule fail;
* whatever the schedule decides (random programs, random prices), ``mode="auto"``
  gives the host executor's results bitwise, recursion and loops over branches and
  recursions included.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyflow.kernels import sim
from pyflow.kernels.backend import cuda, is_simulator

import pyflow as flow
import pyflow.cocktailer as ck
import pyflow.nn.functional as F
from pyflow.cocktailer.executor import Options
from pyflow.cocktailer.ir import Call, UOperator, walk
from pyflow.cocktailer.optimize import Optimizations
from pyflow.cocktailer.profiler import CostModel, Profiler
from pyflow.cocktailer.random_programs import OPS, build, inputs
from pyflow.cocktailer.schedule import constraint_violations, schedule
from pyflow.cocktailer.schedule_interfaces import Level, schedule_control_flow, schedule_operator, set_resource
from tests.strategies import cocktailer_programs

# host and compiled executors are compared bit for bit: both on one simulator tier (tests/conftest.py;
# under auto a kernel launched again and again switches to the compiled tier part-way through a test)
pytestmark = pytest.mark.sim_tier("threads")

THREADS = 4


def rnn_program(steps=3):
    def rnn(h0, xs, w, b):
        return ck.for_loop(xs.shape[0], lambda t, h: flow.tanh(F.linear(h, w, b) + xs[t]), h0)

    rng = np.random.default_rng(0)
    args = (rng.standard_normal((2, 8)).astype(np.float32), rng.standard_normal((steps, 2, 8)).astype(np.float32),
            (rng.standard_normal((8, 8)) * 0.3).astype(np.float32), rng.standard_normal(8).astype(np.float32))
    return ck.trace(rnn, *args, chunk=4, tile=4), args


def decision(sched, prefix):
    found = [d for d in sched.decisions if d.node.startswith(prefix)]
    assert found, f"no decision for {prefix!r} in\n{sched}"
    return found[-1]


# ---- the three interfaces -------------------------------------------------------------


def test_schedule_operator_puts_each_utask_on_a_block():
    program, _ = rnn_program()
    for op in (s for s in walk(program.body) if isinstance(s, UOperator)):
        scheduled = schedule_operator(op)
        assert scheduled.level == Level.BLOCK and scheduled.utasks == op.count


@pytest.mark.parametrize("body, expected", [
    ([], Level.BLOCK),
    ([Level.BLOCK, Level.BLOCK], Level.BLOCK),
    ([Level.THREAD], Level.BLOCK),          # control replicated per block sits at block level at least
    ([Level.BLOCK, Level.HOST], None),       # Constraint 1: cannot control a host part from a block
    ([Level.DEVICE], None),
])
def test_schedule_control_flow_keeps_control_flow_no_lower_than_its_body(body, expected):
    assert schedule_control_flow(None, body) == expected


def coresident_limit(threads: int) -> int:
    """The active backend's co-resident limit for blocks of ``threads`` threads of a kernel whose registers
    and shared memory do not bind (the uTask kernels at 4 threads): SMs x blocks per SM.

    The simulator's occupancy model; on a GPU the device's attributes (the H200: 132 SMs x 32 = 4224).
    """
    if is_simulator():
        return sim.max_coresident_blocks(threads)
    device = cuda.get_current_device()
    warps = -(-threads // device.WARP_SIZE)
    per_sm = min(device.MAX_BLOCKS_PER_MULTIPROCESSOR,
                 device.MAX_THREADS_PER_MULTIPROCESSOR // (warps * device.WARP_SIZE))
    return device.MULTIPROCESSOR_COUNT * per_sm


def test_set_resource_caps_the_grid_at_the_co_resident_limit():
    def wide(x):
        return flow.tanh(x)

    limit = coresident_limit(THREADS)
    small = ck.trace(wide, ck.spec(2, 8), chunk=4, tile=4)        # 4 uTasks
    big = ck.trace(wide, ck.spec(limit, 8), chunk=4, tile=4)      # 2 x limit uTasks: more than fit at once
    assert set_resource(small.body, Options(threads=THREADS), small).grid == 4
    resource = set_resource(big.body, Options(threads=THREADS), big)
    assert (resource.limit, resource.grid) == (limit, limit)
    assert set_resource(big.body, Options(threads=THREADS, blocks=limit), big).grid == limit
    assert set_resource(big.body, Options(threads=THREADS, blocks=limit + 1), big) is None
    assert set_resource(big.body, Options(threads=THREADS), big, CostModel(coresident_blocks=3)).grid == 3


@pytest.mark.skipif(not is_simulator(), reason="about the simulator's occupancy model: sim.configure changes the "
                                               "simulated GPU, not a real one")
def test_on_a_smaller_simulated_gpu_the_kernels_own_limit_shrinks():
    big = ck.trace(lambda x: flow.tanh(x), ck.spec(32, 8), chunk=4, tile=4)
    limit = set_resource(big.body, Options(threads=THREADS), big).limit
    with sim.configure(multiprocessor_count=1):   # one SM instead of two: the kernel's own limit halves
        assert set_resource(big.body, Options(threads=THREADS), big).limit == limit // 2


# ---- the profiler's counts are the executor's -------------------------------------------------

static_statements = st.recursive(
    st.lists(st.tuples(st.just("op"), st.sampled_from(OPS)), min_size=1, max_size=2),
    lambda inner: st.lists(st.one_of(st.tuples(st.just("op"), st.sampled_from(OPS)),
                                     st.tuples(st.just("for"), st.integers(0, 2), st.just(False), inner)),
                           min_size=1, max_size=3),
    max_leaves=6)


@settings(max_examples=8)
@given(desc=static_statements, seed=st.integers(0, 2**16))
def test_cost_model_counts_equal_run_stats_for_static_programs(desc, seed):
    args = inputs(2, 4, 3, seed)
    program = ck.trace(build(desc), *args, chunk=4, tile=4, name="static")
    options = Options(threads=THREADS)
    profiler = Profiler(program, options)
    host = ck.compile(program, mode="host", threads=THREADS)
    host(*args)
    modelled = profiler.cost(program.body, {})
    assert (modelled.launches, modelled.host_syncs, modelled.barriers) == (
        host.last_stats.launches, host.last_stats.host_syncs, 0)
    compiled = ck.compile(program, mode="compiled", threads=THREADS)
    compiled(*args)
    modelled = profiler.cost(program.body, {}, set_resource(program.body, options, program))
    assert (modelled.launches, modelled.host_syncs, modelled.barriers) == (1, 0, compiled.last_stats.barriers)


def test_function_uTasks_not_inlined_cost_the_barriers_the_kernel_executes():
    @ck.function
    def cell(h, w, b):
        return flow.tanh(F.linear(h, w, b))

    program, args = rnn_program()
    program = ck.trace(lambda h0, xs, w, b: ck.for_loop(3, lambda i, h: cell(h, w, b) + h, h0),
                       *args, chunk=4, tile=4, name="fn")
    for inline in (True, False):
        options = Options(threads=THREADS, inline=inline)
        compiled = ck.compile(program, mode="compiled", threads=THREADS, inline=inline)
        compiled(*args)
        modelled = Profiler(program, options).cost(program.body, {}, set_resource(program.body, options, program))
        assert modelled.barriers == compiled.last_stats.barriers


# ---- decisions -----------------------------------------------------------------------------


def test_a_loop_of_small_operators_goes_to_the_device():
    program, args = rnn_program()
    auto = ck.compile(program, mode="auto", threads=THREADS)
    sched = auto.schedule
    loop = decision(sched, "for ")
    assert loop.choice == "device" and loop.device.total_us < loop.host.total_us
    assert "launches" in loop.reason
    assert sched.whole_program and not constraint_violations(sched)
    got = auto(*args)
    np.testing.assert_array_equal(got, ck.compile(program, mode="host", threads=THREADS)(*args))
    assert (auto.last_stats.launches, auto.last_stats.host_syncs) == (1, 0)
    text = str(sched)
    assert "for i0 in range(3)" in text and "ONE uProgram" in text


# The persistent grid's cap, fixed (the simulated GPU's): the cost model's asymmetry needs a cap below a host
# launch's 1024 blocks, which the H200 does not have for 4-thread blocks (4224 fit at once).
SMALL_GPU = CostModel(coresident_blocks=16)


def test_a_single_huge_operator_stays_on_the_host():
    program = ck.trace(lambda x: flow.tanh(x), ck.spec(64, 64), chunk=4, tile=4, name="huge")  # 1024 uTasks
    sched = schedule(program, Options(threads=THREADS), SMALL_GPU)
    top = decision(sched, "program huge")
    assert top.choice == "host" and top.host.total_us < top.device.total_us
    assert "co-resident" in top.reason
    assert not sched.whole_program and sched.device_units == []
    assert "everything on the host" in str(sched)


def test_constraint_1_keeps_a_loop_on_the_host_when_its_body_is():
    # the inner loop runs one huge operator once: the host wins it; the outer loop, whose
    # small operators alone would pay off on the device, must then stay on the host too
    def prog(h0, x):
        def outer(i, h):
            big = ck.for_loop(1, lambda j, y: flow.tanh(y), x.clone())
            return flow.relu(h) + big.sum(-1).reshape(1, 8)
        return ck.for_loop(2, outer, h0)

    args = (np.ones((1, 8), np.float32), np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))
    program = ck.trace(prog, *args, chunk=4, tile=4)
    model = CostModel(coresident_blocks=1)   # a persistent grid of one block: 16 waves of the tanh
    auto = ck.compile(program, mode="auto", threads=THREADS, cost_model=model)
    sched = auto.schedule
    inner, outer = [d for d in sched.decisions if d.node.startswith("for ")]
    assert inner.choice == "host" and "co-resident" in inner.reason
    assert outer.choice == "host" and "Constraint 1" in outer.reason and outer.level == Level.HOST
    assert not constraint_violations(sched)
    np.testing.assert_array_equal(auto(*args), ck.compile(program, mode="host", threads=THREADS)(*args))


def test_schedule_prints_every_decision_with_both_costs():
    program, _ = rnn_program()
    text = str(schedule(program, Options(threads=THREADS)))
    for needle in ("profiler: cost model", "launch 5 us", "optimizations:", "decisions (Algorithm 1",
                   "host", "device", "choice", "reason", "program rnn"):
        assert needle in text


# ---- recursion ------------------------------------------------------------------------------


def tree_args(seed=0, dim=3):
    left = np.array([1, 3, 0, 0, 0], np.int64)
    right = np.array([2, 4, 0, 0, 0], np.int64)
    leaf = np.array([0, 0, 1, 1, 1], np.int64)
    rng = np.random.default_rng(seed)
    return (left, right, leaf, rng.standard_normal((5, dim)).astype(np.float32),
            (rng.standard_normal((dim, 2 * dim)) * 0.5).astype(np.float32), rng.standard_normal(dim).astype(np.float32),
            np.array([1, 0, 1, 0, 1], np.int64))


def rae_in_a_loop(dim=3):
    def prog(left, right, is_leaf, values, w, b, flags):
        @ck.function(returns=ck.spec(dim))
        def rae(node):
            x = ck.cond(flags[node].item(), lambda: flow.tanh(values[node]), lambda: flow.relu(values[node]))

            def inner():
                return flow.tanh(F.linear(flow.cat([rae(left[node].item()), rae(right[node].item())]), w, b))

            return ck.cond(is_leaf[node].item(), lambda: x.clone(), inner)

        return ck.for_loop(2, lambda i, h: h + rae(0), values[0].clone())

    return prog


@pytest.mark.parametrize("model, on_device", [
    (CostModel(), True),                                        # syncs and launches dominate: one kernel
    (CostModel(host_sync_us=1000.0, barrier_us=500.0), False),  # barriers dearer than syncs: host recursion
])
def test_recursion_in_a_loop_is_scheduled_either_way_and_stays_correct(model, on_device):
    args = tree_args()
    program = ck.trace(rae_in_a_loop(), *args, chunk=4, tile=4)
    auto = ck.compile(program, mode="auto", threads=THREADS, cost_model=model,
                      optimizations=Optimizations(unroll_recursion=False))   # (unrolled: see below)
    sched = auto.schedule
    assert not constraint_violations(sched)
    assert decision(sched, "if in_is_leaf").choice == "with definition"   # holds the recursive calls
    call = decision(sched, "call ")
    assert (call.choice == "device") == on_device
    if not on_device:   # the branch without calls still runs as its own uProgram, inside the host recursion
        assert [type(u).__name__ for u in sched.device_units] == ["Branch"]
        assert not any(isinstance(s, Call) for u in sched.device_units for b in u.blocks() for s in walk(b))
    got = auto(*args)
    np.testing.assert_array_equal(got, ck.compile(program, mode="host", threads=THREADS)(*args))
    assert (auto.last_stats.host_syncs == 0) == on_device


# ---- random programs, random prices: auto mode is always the host executor's result --------------


def statements(depth: int):
    return cocktailer_programs(depth)


cost_models = st.builds(CostModel, launch_us=st.sampled_from([0.0, 5.0, 50.0]),
                        host_sync_us=st.sampled_from([0.0, 10.0]), barrier_us=st.sampled_from([0.0, 1.5, 40.0]),
                        assumed_trip=st.sampled_from([1, 16]), branch_probability=st.sampled_from([0.0, 0.5, 1.0]),
                        coresident_blocks=st.sampled_from([None, 1, 2]))


@settings(max_examples=10)
@given(desc=statements(2), model=cost_models, blocks=st.sampled_from([None, 2]), seed=st.integers(0, 2**16))
def test_auto_mode_agrees_with_the_host_executor_whatever_it_decides(desc, model, blocks, seed):
    args = inputs(2, 4, 3, seed)
    program = ck.trace(build(desc), *args, chunk=4, tile=4, name="random")
    auto = ck.compile(program, mode="auto", threads=THREADS, blocks=blocks, cost_model=model)
    sched = auto.schedule
    assert not constraint_violations(sched)
    assert all(not isinstance(u, UOperator) for u in sched.device_units)   # uPrograms hold control flow
    got = auto(*args)
    np.testing.assert_array_equal(got, ck.compile(program, mode="host", threads=THREADS)(*args))
    if sched.whole_program:
        assert (auto.last_stats.launches, auto.last_stats.host_syncs) == (1, 0)


# ---- measuring instead of modelling -------------------------------------------------------------


def test_the_measuring_profiler_times_whole_program_candidates():
    # on a GPU this is the default with sample inputs; in the simulator it only exercises the code
    program, args = rnn_program(steps=2)
    sched = schedule(program, Options(threads=THREADS), sample_inputs=args, measure=True,
                     optimizations=Optimizations(unroll=False))
    assert sched.profiler.startswith("measured") and sched.estimate.measured
    assert all(d.host.measured and d.device.measured for d in sched.decisions if d.host)
    assert "measured:" in decision(sched, "program").reason
    with pytest.raises(ValueError, match="sample_inputs"):
        Profiler(program, Options(), measure=True)
