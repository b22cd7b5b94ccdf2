"""The actor runtime's watchdog and hang report: when nothing moves, say who waits for what.

A Plan can be made to deadlock (a regst num of 0, a cycle of control regsts), and a
bug can do it too.  Actors then simply stop acting; nothing raises.  The watchdog (a
thread named ``pyflow-actor-watchdog-<graph>``) looks every second or so: if calls are
in flight, no act's device work is pending (a long kernel is not a hang), and no actor
acted for ``hang_timeout`` seconds (``PYFLOW_HANG_TIMEOUT``, default 60), it stops the
runtime with a ``RuntimeHangError`` built by ``hang_report``: every actor that holds
something and cannot act, and why, in the seed's terms:

* not read-ready: which consumed regst desc lacks the piece this act needs (and from
  which producer it comes);
* not write-ready: which produced regst desc has no free regst, and which consumers
  still hold each copy (their reading count).

A deterministic runtime needs no watchdog: when no message is left and its call is not
done, it reports at once.

**Waiting without polling** (``wait_until``): a caller waiting for the runtime (its actors
built, a call issued, the calls in flight finished, every actor exited) blocks on the
runtime's ``changed`` condition, which the runtime notifies whenever one of those things
happens (and when it fails).  It never sleeps a fixed time in a loop: it wakes when it has something to look
at, or when the hang timeout would be reached.  Then it does what the watchdog does: if no
actor acted for ``hang_timeout`` seconds and no device work is pending, it stops the runtime
with the same ``RuntimeHangError``, naming what it waited for.  (A poll with
``time.sleep(0.001)`` spent 54% of a graph call's caller time asleep and 44% on the lock the
predicate takes.)
"""

from __future__ import annotations

import os
import threading
import time

from pyflow.errors import RuntimeHangError

__all__ = ["Watchdog", "hang_report", "default_hang_timeout", "wait_until"]


def default_hang_timeout() -> float:
    """``PYFLOW_HANG_TIMEOUT`` seconds (default 60)."""
    return float(os.environ.get("PYFLOW_HANG_TIMEOUT", "60"))


def hang_report(runtime, idle: float, what: str) -> str:
    """Every waiting actor of ``runtime`` and the regst desc it waits for."""
    if runtime.deterministic:
        why = "no message is left to deliver"
    else:
        why = f"no actor acted for {idle:.1f} s (hang timeout {runtime.hang_timeout:g} s, PYFLOW_HANG_TIMEOUT)"
    lines = [f"the actor runtime of {runtime.plan.job_name!r} (rank {runtime.rank}) is stuck while {what}: {why}; "
             f"calls in flight: {runtime.calls_in_flight()}; waiting actors:"]
    waiting = 0
    for tid in runtime.plan.order:
        actor = runtime.actors.get(tid)
        if actor is None or actor.exited:
            continue
        reasons = actor.why_waiting()
        if reasons:
            waiting += 1
            lines.append(f"  actor {tid} {actor.op_name!r} ({actor.kind}, {actor.acts} acts, on "
                         f"{actor.thread.name}): " + "; ".join(reasons))
    if not waiting:
        idle_actors = [f"{a.op_name!r} ({a.actor_id})" for a in runtime.actors.values() if not a.exited]
        lines.append(f"  none holds a piece; live actors: {', '.join(idle_actors)}")
    return "\n".join(lines)


def wait_until(runtime, predicate, what: str) -> None:
    """Block until ``predicate()`` (read under ``runtime.changed``, which every change it may depend on
    notifies); raise the runtime's error if it stopped, or stop it with a ``RuntimeHangError`` naming ``what``
    if no actor acted for ``runtime.hang_timeout`` seconds while no device work was pending."""
    started = time.monotonic()
    with runtime.changed:
        while not predicate():
            if runtime.error is not None:
                raise runtime.error
            idle = time.monotonic() - max(runtime._progress, started)   # _progress: when an actor last acted
            if idle < runtime.hang_timeout:     # wake at a notify, or when the hang timeout would be reached
                timeout = runtime.hang_timeout - idle
            elif runtime._callbacks > 0:        # device work pending (a long kernel is no hang): look again later
                timeout = min(runtime.hang_timeout, 1.0)
            else:
                error = RuntimeHangError(hang_report(runtime, idle, what))
                break
            runtime.changed.wait(min(max(timeout, 0.01), 3600.0))   # (a bounded wait: the timeout may be inf)
        else:
            return
    runtime.fail(error)
    raise error


class Watchdog:
    """A thread that stops ``runtime`` with a hang report when its calls stop moving."""

    def __init__(self, runtime):
        self.runtime = runtime
        self._stop = threading.Event()
        name = f"pyflow-actor-watchdog{'-' + runtime.name if runtime.name else ''}"
        self.thread = threading.Thread(target=self._watch, daemon=True, name=name)

    def start(self) -> None:
        self.thread.start()

    def stop(self, join: bool = True) -> None:
        self._stop.set()
        if join and self.thread is not threading.current_thread():
            self.thread.join()

    def _watch(self) -> None:
        runtime = self.runtime
        interval = max(min(1.0, runtime.hang_timeout / 4), 0.01)
        while not self._stop.wait(interval):
            if runtime.error is not None:
                return
            busy, idle, device_work = runtime.activity()
            if busy and not device_work and idle > runtime.hang_timeout:
                runtime.fail(RuntimeHangError(hang_report(runtime, idle, "running calls")))
                return
