"""``configure`` (kernels/sim/settings.py): blocks open on several threads at once, closed in any order.

The bug these tests pin down: ``configure`` used to restore "the settings before me" on exit.  Two blocks
that overlap on two threads (A enters, B enters, A exits, B exits) then left A's changes in force for the
rest of the process: tests/test_sim_inline_launch.py's three callers, each in ``configure(tier="compiled")``,
left the whole rest of a test run on the compiled tier now and then (test_sort.py's topk compiled cold,
160 s instead of 2, and the doctests at the end of CI's run compiled too).
"""

from __future__ import annotations

import dataclasses
import importlib
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyflow.errors import LaunchConfigError

sim_settings = importlib.import_module("pyflow.kernels.sim.settings")   # (the package exports settings())
configure, settings = sim_settings.configure, sim_settings.settings

# changes a block may make: a few fields, each with a few values
CHANGES = st.dictionaries(st.sampled_from(["tier", "cores", "seed", "start_order"]), st.none(), min_size=1).flatmap(
    lambda keys: st.fixed_dictionaries({
        key: {"tier": st.sampled_from(["auto", "threads", "compiled"]), "cores": st.integers(1, 4),
              "seed": st.integers(0, 9), "start_order": st.sampled_from(["forward", "reverse", "shuffle"])}[key]
        for key in keys}))


@given(blocks=st.lists(CHANGES, min_size=1, max_size=5), data=st.data())
def test_any_order_of_closing_leaves_the_open_blocks_changes_and_at_the_end_the_environments(blocks, data):
    base = settings()
    opened = []   # (block number, its context manager), in the order entered
    for number, changes in enumerate(blocks):
        manager = configure(**changes)
        manager.__enter__()
        opened.append((number, manager))
    while opened:
        number, manager = opened.pop(data.draw(st.integers(0, len(opened) - 1)))
        manager.__exit__(None, None, None)
        want = base
        for other, _ in opened:   # still open, oldest first: the later entered wins
            want = dataclasses.replace(want, **blocks[other])
        assert settings() == want
    assert settings() == base


def test_blocks_on_several_threads_at_once_leave_nothing_behind():
    """Four threads open a block each, one after another, and close them in the order they opened them: the
    last to close used to bring back the third one's tier."""
    base = settings()
    tiers = ["compiled", "threads", "compiled", "threads"]
    entered = [threading.Event() for _ in tiers]
    leave = [threading.Event() for _ in tiers]

    def block(i):
        with configure(tier=tiers[i]):
            entered[i].set()
            leave[i].wait(10)

    threads = [threading.Thread(target=block, args=(i,), name=f"test-configure-{i}") for i in range(len(tiers))]
    for thread, event in zip(threads, entered):
        thread.start()
        assert event.wait(10)
    assert settings().tier == tiers[-1]
    for thread, event in zip(threads, leave):
        event.set()
        thread.join(10)
        assert not thread.is_alive()
    assert settings() == base


def test_a_bad_value_changes_nothing():
    base = settings()
    with pytest.raises(LaunchConfigError, match="tier"):
        with configure(tier="fast"):
            pass
    assert settings() == base and not sim_settings._open
