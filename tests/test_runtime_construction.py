"""A Runtime whose construction is interrupted (Ctrl-C) or fails leaves no actor thread behind (issue 32).

Construction starts a thread per stream of the Plan, builds each actor on its thread, then starts the
watchdog.  A ``KeyboardInterrupt`` (or an error) at any of those steps used to leave the threads started so
far idle for good, waiting for messages nobody would send.  Each step is interrupted here in turn; every
``pyflow-actor-<name>-*`` thread (and the watchdog) must be gone within a generous bound.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from pyflow.runtime import Runtime, runtime as runtime_module, thread as thread_module
from pyflow.runtime.pipeline import linear_pipeline_plan

BOUND = 30.0   # seconds; the threads leave within hundredths
_names = itertools.count()


def _threads_of(name: str) -> list:
    return [t for t in threading.enumerate() if t.is_alive() and name in t.name]


def _gone(name: str) -> list:
    deadline = time.monotonic() + BOUND
    while _threads_of(name) and time.monotonic() < deadline:
        time.sleep(0.01)
    return _threads_of(name)


def _interrupt_the_wait(monkeypatch):
    """Ctrl-C while the caller waits for the actors to be built (the threads run)."""
    original = Runtime._wait

    def wait(self, predicate, what):
        if what == "constructing the actors":
            raise KeyboardInterrupt
        return original(self, predicate, what)
    monkeypatch.setattr(Runtime, "_wait", wait)


def _interrupt_after_the_watchdog_started(monkeypatch):
    original = runtime_module.Watchdog.start

    def start(self):
        original(self)
        raise KeyboardInterrupt
    monkeypatch.setattr(runtime_module.Watchdog, "start", start)


def _interrupt_between_thread_starts(monkeypatch):
    """Ctrl-C after the first actor thread started, before the others."""
    original, started = thread_module.Thread.start, []

    def start(self):
        if started:
            raise KeyboardInterrupt
        started.append(self)
        original(self)
    monkeypatch.setattr(thread_module.Thread, "start", start)


def _fail_building_an_actor(monkeypatch):
    original = thread_module.make_actor

    def make_actor(runtime, task, thread):
        if task.op_name == "b":
            raise ValueError("this actor cannot be built")
        return original(runtime, task, thread)
    monkeypatch.setattr(thread_module, "make_actor", make_actor)


@pytest.mark.parametrize("inject, raised", [(_interrupt_the_wait, KeyboardInterrupt),
                                            (_interrupt_after_the_watchdog_started, KeyboardInterrupt),
                                            (_interrupt_between_thread_starts, KeyboardInterrupt),
                                            (_fail_building_an_actor, ValueError)])
def test_an_interrupted_or_failed_construction_leaves_no_actor_thread(monkeypatch, inject, raised):
    name = f"construct-probe-{next(_names)}"
    inject(monkeypatch)
    with pytest.raises(raised):
        Runtime(linear_pipeline_plan(["a", "b", "c"]), name=name)
    monkeypatch.undo()
    assert not _gone(name), _threads_of(name)
    with Runtime(linear_pipeline_plan(["a", "b", "c"]), name=name) as runtime:   # and a new one works
        runtime.launch([]).result()
    assert not _gone(name)


def test_a_task_whose_act_cannot_be_made_raises_its_own_error_when_it_acts(monkeypatch):
    """``make_act`` defers a failure to the act (the runtime names the actor then): the act raises the error
    ``_make_act`` raised, not a NameError (Python unbinds an ``except ... as`` name when its block ends)."""
    from pyflow.runtime import act as act_module

    def refuse(plan, task):
        raise ValueError("no kernel for this task")

    monkeypatch.setattr(act_module, "_make_act", refuse)
    deferred = act_module.make_act(None, None)
    with pytest.raises(ValueError, match="no kernel for this task"):
        deferred({}, [], 0, None)
