"""The actor runtime's costs, in logical terms (counts, never times).

Properties: a caller waiting for the runtime blocks and is woken, it never polls with
``time.sleep``, and a hang while it waits still becomes a ``RuntimeHangError`` naming what it
waited for; the deterministic pool derives each message's call once and hands messages out
oldest first (among the calls allowed) as a plain list scan would; the runtime makes each
task's act once, when it starts, not per act; the memory-plan check looks at each memory
request once per check (linear in the plan), not once per regst.
"""

from __future__ import annotations

import dataclasses
import time
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import nn
import pyflow.runtime.act as act_module
import pyflow.runtime.regst as regst_module
import pyflow.runtime.runtime as runtime_module
import pyflow.runtime.thread as thread_module
import pyflow.runtime.watchdog as watchdog_module
from pyflow.errors import RuntimeHangError
from pyflow.runtime import Runtime
from pyflow.runtime.thread import DeterministicThread


def _compiled(build):
    class G(nn.Graph):
        def build(self, x):
            return build(x)
    g = G()
    g.executor = "sequential"
    x = flow.randn(2, 3)
    expected = g(x).numpy()
    return g, x, expected


def _no_sleep(monkeypatch):
    """Make ``time.sleep`` raise inside the runtime's and the watchdog's modules (nowhere else)."""
    def sleep(seconds):
        raise AssertionError(f"the runtime polled with time.sleep({seconds})")
    fake = types.SimpleNamespace(sleep=sleep, monotonic=time.monotonic, perf_counter=time.perf_counter)
    monkeypatch.setattr(runtime_module, "time", fake)
    monkeypatch.setattr(watchdog_module, "time", fake)


def test_waiting_callers_block_and_never_call_time_sleep(monkeypatch):
    g, x, expected = _compiled(lambda x: (x * 2.0).relu() + 1.0)
    _no_sleep(monkeypatch)
    rt = Runtime(g.plan, g.job)   # waits for its actors to be built
    handles = [rt.launch([x]) for _ in range(4)]
    rt.wait_issued(handles[-1])
    rt.wait_calls()
    for handle in handles:
        np.testing.assert_array_equal(handle.result()[0].numpy(), expected)
    rt.close()                    # waits for every actor to exit
    assert rt.error is None and not rt.calls_in_flight()


def test_a_hang_while_waiting_is_still_reported_naming_what_waits(monkeypatch):
    """The watchdog is stopped: the waiting caller itself notices that nothing moves, without sleeping."""
    g, x, _ = _compiled(lambda x: (x * 2.0).relu() + 1.0)
    (mul,) = g.plan.task_of("mul_0")
    rid = mul.produced["out_0"]
    regsts = dict(g.plan.regsts)
    regsts[rid] = dataclasses.replace(regsts[rid], max_regst_num=0)
    _no_sleep(monkeypatch)
    rt = Runtime(dataclasses.replace(g.plan, regsts=regsts), g.job, hang_timeout=0.3)
    rt._watchdog.stop()
    rt.launch([x])
    with pytest.raises(RuntimeHangError, match=r"(?s)stuck while the calls in flight to finish.*'mul_0'.*"
                                               r"not write-ready.*regst num 0"):
        rt.wait_calls()
    assert isinstance(rt.error, RuntimeHangError)
    rt.close()   # the runtime stopped: its threads leave
    assert not any(t.is_alive() for t in rt.threads())


def test_the_deterministic_pool_derives_each_messages_call_once(monkeypatch):
    g, x, expected = _compiled(lambda x: ((x * 2.0).relu() + 1.0).tanh())
    seen = []
    original = thread_module._call_of
    monkeypatch.setattr(thread_module, "_call_of", lambda msg: seen.append(msg) or original(msg))
    with Runtime(g.plan, g.job, deterministic=True, max_calls_in_flight=2) as rt:
        handles = [rt.launch([x]) for _ in range(6)]   # launches of later calls wait in the pool meanwhile
        for handle in handles:
            np.testing.assert_array_equal(handle.result()[0].numpy(), expected)
    assert 0 < len(seen) <= rt.home.enqueued   # at most once per message, when it arrives (an act's regst messages
    #                                            read theirs inline); no scan of the pool per message


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.one_of(st.tuples(st.just("put"), st.integers(-1, 4)),
                          st.tuples(st.just("take"), st.one_of(st.none(), st.integers(-1, 4)))), max_size=40))
def test_the_deterministic_pool_hands_out_the_oldest_message_of_the_calls_allowed(ops):
    """Against the definition: a list of pending messages, the first whose call is at most ``max_call``."""
    home = DeterministicThread(runtime=None)
    reference = []
    for i, (op, arg) in enumerate(ops):
        if op == "put":
            msg = flow.runtime.msg.cmd_msg(0, "launch", arg) if arg >= 0 else flow.runtime.msg.cmd_msg(0, "turn")
            reference.append((thread_module._call_of(msg), msg))
            home.enqueue(msg)
            continue
        expected = next((m for c, m in reference if arg is None or c <= arg), None)
        if expected is not None:
            reference.remove(next(e for e in reference if e[1] is expected))
        assert home.take(max_call=arg) is expected
        assert home.pending() == [m for _, m in reference]


def test_the_runtime_makes_each_tasks_act_once_not_per_act(monkeypatch):
    g, x, expected = _compiled(lambda x: ((x * 2.0).relu() + 1.0).tanh())
    made = []
    original = act_module.make_act
    monkeypatch.setattr(act_module, "make_act", lambda plan, task: made.append(task.task_id) or
                        original(plan, task))
    with Runtime(g.plan, g.job) as rt:
        tasks = len(rt.actors)
        for _ in range(5):
            np.testing.assert_array_equal(rt.launch([x]).result()[0].numpy(), expected)
        acts = len(rt.timeline())
    assert sorted(made) == sorted(rt.actors) and len(made) == tasks < acts


class _CountingRequests(tuple):
    """``plan.memory.requests`` that count how many requests anyone iterated over."""

    looked_at = 0

    def __iter__(self):
        for request in tuple.__iter__(self):
            type(self).looked_at += 1
            yield request


def _counting(plan):
    _CountingRequests.looked_at = 0
    memory = dataclasses.replace(plan.memory, requests=_CountingRequests(plan.memory.requests))
    return dataclasses.replace(plan, memory=memory)


def test_checking_the_memory_plan_looks_at_each_request_once():
    """memory_fits and the RegstMgr's check are linear in the plan: each request looked at once, not once per
    regst (quadratic: ~3 s of start-up at a 3,990-task plan)."""
    class Wide(nn.Graph):
        def build(self, x):
            return [(x * float(i)).relu() for i in range(12)]   # x * i: a regst of its own each
    g = Wide()
    g.executor = "sequential"
    g(flow.randn(2, 3))
    plan = _counting(g.plan)
    requests = len(plan.memory.requests)
    planned = sum(d.mem == "planned" for d in plan.regsts.values())
    assert requests > 10 and planned > 10
    assert regst_module.memory_fits(plan)
    assert _CountingRequests.looked_at == requests
    _CountingRequests.looked_at = 0
    regst_module.RegstMgr(plan, list(plan.tasks), 0)
    assert _CountingRequests.looked_at == requests
