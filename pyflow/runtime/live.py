"""The Runtimes alive in this process: ``flow.sync()`` waits for their graph calls, and exit closes them.

OneFlow's ``flow.sync()`` waits for the graph calls in flight too: there a call's
LaunchLazyJob instruction lasts until the call ends.  pyflow's ``nn.Graph`` returns before its
call is over (``pyflow/graph/graph.py``), so the VM's sync hook asks each live Runtime of this
rank to finish its calls.  When a rank's VM shuts down (the rank ended, failed or not: ``distributed.run``;
or ``flow.vm.shutdown()``) that rank's Runtimes are closed first, so their threads end even while an
exception's frames keep the graph alive.  At interpreter exit every Runtime still open is closed.  A Runtime
adds itself to ``live_runtimes`` once its actors are built and takes itself out when it closes.
"""

from __future__ import annotations

import atexit
import threading
import weakref

from pyflow import _exit, env
from pyflow.vm import add_shutdown_hook, add_sync_hook

__all__ = ["live_runtimes", "close_when_collected", "close_in_background"]

live_runtimes: weakref.WeakSet = weakref.WeakSet()


def _wait_for_graph_calls() -> None:
    """``flow.sync()``'s hook: wait for this rank's graph calls in flight.  Not from an actor's own thread (an
    act may sync), and not for another rank's runtime (in one process, that rank may wait for this thread's next
    call)."""
    me, rank = threading.current_thread(), env.get_rank()
    runtimes = list(live_runtimes)   # one being closed too (a collected graph's, ``close_when_collected``)
    if any(me in r.threads() for r in runtimes):
        return
    for runtime in runtimes:
        if runtime.rank == rank:
            runtime.wait_calls()


add_sync_hook(_wait_for_graph_calls)


def _close_this_ranks() -> None:
    """The VM's shutdown hook: close the Runtimes made in the calling rank context (their errors were
    reported by the reads and ``flow.sync()`` before; the rank is ending, nobody is left to report to)."""
    ctx = env.current()
    for runtime in [r for r in list(live_runtimes) if r.ctx is ctx]:
        try:
            runtime.close()
        except Exception:  # noqa: BLE001 - see the docstring
            pass


add_shutdown_hook(_close_this_ranks)


def close_when_collected(owner, runtime) -> weakref.finalize:
    """Close ``runtime`` once ``owner`` (its ``nn.Graph``) is garbage-collected, on a thread of its own.

    A finalizer runs on whichever thread the collection happens to interrupt: a VM worker in the middle
    of a kernel, an actor, another rank's thread.  Closing waits for the calls in flight, and those may
    need that very thread (the VM worker, that rank's next collective): closed there, the call and the
    close would wait for each other for ever.  So the close runs on a short-lived thread
    (``pyflow-close-<graph>``); ``flow.sync()`` still waits for its calls (the runtime stays live until
    it is closed).  At exit ``_close_all`` closes what is left, on the exiting thread.  The owner closing
    its runtime itself ``detach()``es the finalizer and calls ``runtime.close()``.
    """
    finalizer = weakref.finalize(owner, close_in_background, runtime)
    finalizer.atexit = False
    return finalizer


def close_in_background(runtime) -> None:
    """Close ``runtime`` on a short-lived daemon thread (``pyflow-close-<graph>``), its errors dropped: for a
    collected graph (above), and for a graph call Ctrl-C interrupted (``nn.Graph``: the caller gets the
    interrupt at once, while the calls in flight finish, or hang until the hang timeout, on that thread)."""
    def close():
        try:
            runtime.close()
        except Exception:  # noqa: BLE001 - nobody waits for this close: the calls' errors went to their readers
            pass
    threading.Thread(target=close, daemon=True, name=f"pyflow-close-{runtime.name or runtime.plan.job_name}").start()


@atexit.register
def _close_all() -> None:
    """At exit: close every Runtime still open (their calls in flight finish first); Ctrl-C meanwhile gives
    them up and ends the process with status 130 (``pyflow/_exit.py``)."""
    try:
        for runtime in list(live_runtimes):
            try:
                runtime.close()
            except Exception:  # noqa: BLE001 - at exit: nothing left to report to
                pass
    except KeyboardInterrupt:
        _exit.abandon("the graph calls in flight")
