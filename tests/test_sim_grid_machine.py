"""The compiled tier's two drivers of kernels with grid and group barriers agree: ``scopes.Machine`` in Python
and ``grid_machine`` in numba (the default, ``compiled._COMPILED_MACHINE``).  Same nodes, same order: the same
values bit for bit, and the same errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyflow.errors import DeadlockError, GridSyncExitError
from pyflow.kernels.backend import cuda, is_simulator
from pyflow.kernels.jit import jit
from pyflow.kernels.utask.groups import group_barrier
from tests.strategies import cocktailer_programs

pytestmark = pytest.mark.skipif(not is_simulator(), reason="the simulator's compiled tier")

if is_simulator():
    from pyflow.kernels import sim
    from pyflow.kernels.sim import compiled, grid_machine, scopes

MACHINES = ("python", "numba")


def _drive(monkeypatch, machine: str) -> None:
    monkeypatch.setattr(compiled, "_COMPILED_MACHINE", machine == "numba")


@jit
def rounds_of_grid_sums(x, out, rounds):
    """Each round, every block adds the grid's total of the last round: a grid barrier in a loop whose trip
    count differs per block parity, with a block-divergent if around another grid barrier."""
    grid = cuda.cg.this_grid()
    i = cuda.grid(1)
    for r in range(rounds):
        grid.sync()
        total = 0.0
        for k in range(x.shape[0]):
            total += x[k]
        grid.sync()
        x[i] = x[i] + total * 0.001
        if r % 2 == 0:
            grid.sync()
    out[i] = x[i]


@pytest.mark.parametrize("machine", MACHINES)
def test_grid_barriers_in_loops_give_the_threaded_tiers_values(monkeypatch, machine):
    _drive(monkeypatch, machine)
    want_x, want = np.arange(12.0), np.zeros(12)
    with sim.configure(tier="threads"):
        rounds_of_grid_sums[3, 4](want_x, want, 3)
    x, out = np.arange(12.0), np.zeros(12)
    with sim.configure(tier="compiled"):
        rounds_of_grid_sums[3, 4](x, out, 3)
    assert rounds_of_grid_sums.last_tier == "compiled"
    np.testing.assert_allclose(out, want, rtol=1e-12)


@jit
def exit_before_grid_sync(x):
    if cuda.blockIdx.x == 1 and cuda.threadIdx.x == 0:
        return
    cuda.cg.this_grid().sync()
    x[cuda.threadIdx.x] = 1


@jit
def groups_of_the_wrong_size(state, members):
    """Blocks 0 and 1 meet at a group barrier that says it has ``members`` members."""
    group_barrier(state, 3, members)


@pytest.mark.parametrize("machine", MACHINES)
def test_both_drivers_report_a_grid_sync_after_an_exit_and_a_group_miscount(monkeypatch, machine):
    _drive(monkeypatch, machine)
    with sim.configure(tier="compiled", hang_timeout=20):
        with pytest.raises(GridSyncExitError):
            exit_before_grid_sync[2, 4](np.zeros(4))
        with pytest.raises(DeadlockError):
            groups_of_the_wrong_size[2, 4](np.zeros(8, np.int64), 3)
        groups_of_the_wrong_size[2, 4](np.zeros(8, np.int64), 2)   # the right count passes
    assert groups_of_the_wrong_size.last_tier == "compiled"


@pytest.mark.slow   # each random program is a kernel of its own, compiled cold: 50-250 s; CI runs it (-m slow)
@settings(max_examples=3, deadline=None)
@given(desc=cocktailer_programs(2, ops=2), blocks=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_cocktailer_programs_are_bit_equal_under_both_drivers(desc, blocks, seed):
    import pyflow.cocktailer as ck
    from pyflow.cocktailer.random_programs import build, inputs

    args = inputs(1, 4, 3, seed)
    program = ck.trace(build(desc), *args, chunk=4, tile=4, name="random")
    got = {}
    for machine in MACHINES:
        with pytest.MonkeyPatch.context() as patch:
            _drive(patch, machine)
            with sim.configure(tier="compiled"):
                run = ck.compile(program, mode="compiled", threads=4, blocks=blocks)
                got[machine] = run(*args)
                assert [k.kernel.last_tier for k in run.kernels] == ["compiled"]
    for a, b in zip(np.atleast_1d(got["python"]), np.atleast_1d(got["numba"])):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.integers(0, 1), min_size=1, max_size=6), data=st.data())
def test_step_and_take_follow_scopes_machine_through_an_if_and_a_for(values, data):
    """The control code of ``if test: for i in range(...): run 1  else: run 2``, blocks disagreeing about the
    test and about the range: both machines ask for the same nodes with the same scopes."""
    S = scopes
    code = [(S.TEST, 0, 0, 0),          # 0
            (S.IF_SPLIT, 0, 9, 0),      # 1  no block says 1: to the else part
            (S.FOR_BOUNDS, 1, 0, 0),    # 2
            (S.FOR_GROUP, 0, 8, 0),     # 3  no group left: to the loop's exit
            (S.FOR_CHECK, 0, 3, 0),     # 4  past the end: the next group
            (S.ASSIGN, 2, 0, 0),        # 5
            (S.RUN, 3, 0, 0),           # 6
            (S.FOR_BACK, 4, 3, 0),      # 7
            (S.LOOP_EXIT, 0, 0, 0),     # 8
            (S.IF_ELSE, 0, 11, 0),      # 9  no block says 0: to the join
            (S.RUN, 5, 0, 0),           # 10
            (S.IF_JOIN, 0, 0, 0),       # 11
            (S.END, 0, 0, 0)]           # 12
    blocks = len(values)
    stops = data.draw(st.lists(st.integers(0, 3), min_size=blocks, max_size=blocks), label="stops")
    python, encoded = S.Machine(code, np.arange(blocks)), grid_machine.encode(code)
    state = grid_machine.new_state(encoded, blocks)
    for _ in range(200):
        op, node, _, _ = python.next()
        opcode = grid_machine.step(encoded, *state)
        assert grid_machine.OPS[opcode] == op
        assert np.flatnonzero(state[1]).tolist() == python.scope.tolist()
        if op == S.END:
            return
        if op == S.ASSIGN:
            assert state[6][state[0][2] - 1, 0] == python.counter
        n = python.scope.size
        results = (np.array([values[b] for b in python.scope], np.int64) if op == S.TEST
                   else np.zeros(n, np.int64))
        bounds = np.array([[0, stops[b], 1] for b in python.scope], np.int64).reshape(n, 3)
        live = np.ones(n, np.bool_)
        python.take(results, bounds, live)
        grid_machine.take(encoded, *state, results, bounds, live)
    pytest.fail("the control code did not end")
