"""The actor runtime's watchdog and hang report: when nothing moves, say who waits for what.

A Plan can be made to deadlock (a regst num of 0, a cycle of control regsts), and a
bug can do it too.  Actors then simply stop acting; nothing raises.  The watchdog (a
thread named ``pyflow-actor-watchdog-<graph>``) looks every second or so: if calls are
in flight (or outputs wait for their hand-over, below), no act's device work is pending (a
long kernel is not a hang), and no actor acted for ``hang_timeout`` seconds
(``PYFLOW_HANG_TIMEOUT``, default 60), it stops the
runtime with a ``RuntimeHangError`` built by ``hang_report``: every actor that holds
something and cannot act, and why, in the seed's terms:

* not read-ready: which consumed regst desc lacks the piece this act needs (and from
  which producer it comes);
* not write-ready: which produced regst desc has no free regst, and which consumers
  still hold each copy (their reading count);
* device work that never came back: an act issued its ops, but the VM never got to the
  callback that tells the actor they are done (``device_ctx.py``).

"No device work pending" means no callback the VM *got to* is waiting for kernels: a kernel
that runs long holds its callback in the stream's sync, which is no hang; work the VM never
gets to (an instruction queued behind one that waits for this very call) is, once the VM
itself stops moving (``vm_mark``: while it launches and releases instructions, the call's
work may just be queued behind a long stretch of eager work).  One cpu kernel that runs
longer than the hang timeout, before the call's callback, is reported: raise the timeout.  So a call
whose outputs wait for such work (``flow.sync()``, a read of an output, the output critical
section) ends with this report, not a silent wait.

**Hand-overs** (``handovers_pending``): a call leaves "in flight" when its sink acts, but its
output critical sections still wait for the output actors' hand-over callbacks.  A VM worker
blocked before one of them (in another callback, say) used to be reported only if a critical
section was already waiting when it blocked: a section queued behind the blocked worker never
starts its wait.  So the watchdog watches pending hand-overs too, as it watches calls in
flight: nothing moving for the hang timeout with one pending is a hang, whichever came first.

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

__all__ = ["Watchdog", "hang_report", "default_hang_timeout", "wait_until", "vm_mark", "handovers_pending"]


def default_hang_timeout() -> float:
    """``PYFLOW_HANG_TIMEOUT`` seconds (default 60)."""
    return float(os.environ.get("PYFLOW_HANG_TIMEOUT", "60"))


def hang_report(runtime, idle: float, what: str) -> str:
    """Every waiting actor of ``runtime``: the regst desc it waits for, the device work it issued that never came
    back."""
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
        issued = sorted(actor.device_work.values())
        if issued:
            reasons.append(f"its device work issued after act(s) {issued} never came back from the VM (the VM did "
                           "not get to it: a stream worker blocked, or a dependence never met)")
        if reasons:
            waiting += 1
            lines.append(f"  actor {tid} {actor.op_name!r} ({actor.kind}, {actor.acts} acts, on "
                         f"{actor.thread.name}): " + "; ".join(reasons))
    if not waiting:
        idle_actors = [f"{a.op_name!r} ({a.actor_id})" for a in runtime.actors.values() if not a.exited]
        lines.append(f"  none holds a piece; live actors: {', '.join(idle_actors)}")
    return "\n".join(lines)


def handovers_pending(runtime) -> str | None:
    """The outputs whose hand-over callback has not come back ("output 0 of call 3 to be handed over"), or None.

    The output critical section of each waits for it (or will, once the VM gets to the section), even after
    the call left "in flight"."""
    pending = []
    for actor in list(runtime.actors.values()):
        if actor.kind == "output" and actor.device_work:
            index = runtime.plan.op_attrs[actor.op_name][2]["index"]
            calls = sorted((acts - 1) // actor.acts_per_call for acts in list(actor.device_work.values()))
            pending += [f"output {index} of call {n} to be handed over" for n in calls]
    return ", ".join(pending) or None


def vm_mark(runtime):
    """How far the rank's VM got (instructions launched, released).  A VM that moves is no hang, even while
    no actor acts: the call's work may be queued behind a long stretch of eager work.  A stuck call's VM
    stops too (everything waits), or soon has nothing else to do."""
    vm = getattr(runtime.ctx, "vm", None)
    return (vm.launched, vm.engine.released) if vm is not None else None


_SIGNAL_LOOK = 0.25   # seconds: how often a caller waiting on the main thread looks for a pending Ctrl-C


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def wait_until(runtime, predicate, what: str) -> None:
    """Block until ``predicate()`` (read under ``runtime.changed``, which every change it may depend on
    notifies); raise the runtime's error if it stopped, or stop it with a ``RuntimeHangError`` naming ``what``
    if no actor acted for ``runtime.hang_timeout`` seconds while no device work was pending."""
    started, mark = time.perf_counter(), vm_mark(runtime)
    with runtime.changed:
        while not predicate():
            if runtime.error is not None:
                raise runtime.error
            if vm_mark(runtime) != mark:     # the VM moved: progress too
                started, mark = time.perf_counter(), vm_mark(runtime)
            idle = time.perf_counter() - max(runtime._progress, started)   # _progress: when an actor last acted
            if idle < runtime.hang_timeout:     # wake at a notify, or when the hang timeout would be reached
                timeout = runtime.hang_timeout - idle
            elif runtime._callbacks > 0:        # device work pending (a long kernel is no hang): look again later
                timeout = min(runtime.hang_timeout, 1.0)
            else:
                error = RuntimeHangError(hang_report(runtime, idle, what))
                break
            # a bounded wait (the timeout may be inf); on the main thread a short one: a Ctrl-C that the OS gave
            # another thread only sets a flag, which the main thread reads when it runs again
            runtime.changed.wait(min(max(timeout, 0.01), _SIGNAL_LOOK if _on_main_thread() else 3600.0))
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
        mark, moved = vm_mark(runtime), time.perf_counter()
        while not self._stop.wait(interval):
            if runtime.error is not None:
                return
            if vm_mark(runtime) != mark:     # the VM moved: progress too
                mark, moved = vm_mark(runtime), time.perf_counter()
            busy, idle, device_work = runtime.activity()
            idle = min(idle, time.perf_counter() - moved)
            if device_work or idle <= runtime.hang_timeout:
                continue
            what = "running calls" if busy else handovers_pending(runtime)   # (the module docstring's hand-overs)
            if what is not None:
                runtime.fail(RuntimeHangError(hang_report(runtime, idle, what)))
                return
