"""The Runtimes alive in this process: ``flow.sync()`` waits for their graph calls, and exit closes them.

OneFlow's ``flow.sync()`` waits for the graph calls in flight too: there a call's
LaunchLazyJob instruction lasts until the call ends.  pyflow's ``nn.Graph`` returns before its
call is over (``pyflow/graph/graph.py``), so the VM's sync hook asks each live Runtime of this
rank to finish its calls.  At interpreter exit every Runtime still open is closed.  A Runtime
adds itself to ``live_runtimes`` once its actors are built and takes itself out when it closes.
"""

from __future__ import annotations

import atexit
import threading
import weakref

from pyflow import env
from pyflow.vm import add_sync_hook

__all__ = ["live_runtimes"]

live_runtimes: weakref.WeakSet = weakref.WeakSet()


def _wait_for_graph_calls() -> None:
    """``flow.sync()``'s hook: wait for this rank's graph calls in flight.  Not from an actor's own thread (an
    act may sync), and not for another rank's runtime (in one process, that rank may wait for this thread's next
    call)."""
    me, rank = threading.current_thread(), env.get_rank()
    runtimes = [r for r in list(live_runtimes) if not r.closed]
    if any(me in r.threads() for r in runtimes):
        return
    for runtime in runtimes:
        if runtime.rank == rank:
            runtime.wait_calls()


add_sync_hook(_wait_for_graph_calls)


@atexit.register
def _close_all() -> None:
    for runtime in list(live_runtimes):
        try:
            runtime.close()
        except Exception:  # noqa: BLE001 - at exit: nothing left to report to
            pass
