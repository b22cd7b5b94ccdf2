"""``flow.distributed.run(fn, world_size)``: N ranks in one process, each a thread acting as a process.

OneFlow's multi-rank programs are SPMD scripts: every process runs the same
code and branches on ``flow.env.get_rank()``.  ``run`` runs such a function
once per rank, each in its own thread named ``pyflow-rank-<r>`` with its own
rank context (``pyflow/env.py``): its rank, its virtual machine and streams,
default devices ``cuda:<local rank>`` and ``cpu``, and an ``InProcessTransport``
to the others.  It returns ``[result of rank 0, ..., result of rank N-1]``.

When a rank's function returns, the rank waits for its work
(``flow.sync()``: its failed ops raise here), then stops its VM.  Return
plain values (numbers, numpy arrays): a tensor belongs to its rank's VM,
which is gone afterwards.

If any rank raises, the world is aborted: every rank waiting in a collective
stops at once (``RankAbortedError``), and ``run`` raises ``RankError`` naming the
rank that failed first, with its exception as ``__cause__``.  A rank busy in its
own code (a loop, a sleep: nothing pyflow can interrupt) does not hold the report
back: after a short grace ``run`` raises, naming the line each such rank is at,
and leaves those ranks to finish as daemon threads.  Ranks that run
different code are reported by the transport instead of hanging.

**In a process that is an MPI rank** (``mpiexec -n N python script.py``, or
``python -m pyflow.distributed.launch``: ``pyflow/distributed/mpi.py``) the ranks
are the processes: ``run(fn, N)`` runs ``fn`` once, in the calling thread, as this
process's rank, then gathers every rank's result, so each process gets the same
``[result of rank 0, ..., result of rank N-1]``.  ``world_size`` must be the MPI
world's size.  So an SPMD script runs unchanged as threads or as processes.

>>> import pyflow as flow
>>> flow.distributed.run(lambda: flow.env.get_rank() * 10, world_size=3)
[0, 10, 20]
"""

from __future__ import annotations

import numbers
import sys
import threading
import time

from pyflow import env, vm
from pyflow.distributed.inprocess import InProcessWorld, InProcessTransport
from pyflow.distributed.mpi import process_transport, run_this_rank
from pyflow.errors import DistributedError, RankAbortedError, RankError

__all__ = ["run"]

_JOIN_POLL_SECONDS = 0.1
_GRACE_SECONDS = 2.0   # after a rank failed, how long the others get to stop before run() reports


def _secondary(error: BaseException) -> bool:
    """Did this rank fail only because another one did?"""
    while error is not None:
        if isinstance(error, RankAbortedError):
            return True
        error = error.__cause__
    return False


def run(fn, world_size: int, args=(), timeout: float | None = None) -> list:
    """Run ``fn(*args)`` once per rank, as ``world_size`` ranks in this process; their results, in order.

    ``timeout``: seconds a collective may wait for the other ranks before the
    watchdog reports (default ``PYFLOW_COLLECTIVE_TIMEOUT``, 60).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) or world_size < 1:
        raise DistributedError(f"distributed.run: world_size must be an int >= 1, got {world_size!r}")
    if not callable(fn):
        raise DistributedError(f"distributed.run: fn must be callable, got {type(fn).__name__}")
    if env.current() is env.process_context() and process_transport() is not None:
        return run_this_rank(fn, int(world_size), args, timeout)   # this process is one rank of an MPI job
    world = InProcessWorld(int(world_size), timeout)
    results: list = [None] * world.world_size
    errors: dict = {}
    order: list = []  # ranks in the order they failed

    def rank_main(rank: int) -> None:
        ctx = env.RankContext(rank=rank, world_size=world.world_size, local_rank=rank,
                              transport=InProcessTransport(world, rank))
        with env.bound(ctx):
            try:
                result = fn(*args)
                vm.sync()  # the rank's work is done, and its failed ops raise here
                results[rank] = result
            except BaseException as error:  # noqa: BLE001 - reported by run(), naming the rank
                errors[rank] = error
                order.append(rank)
                world.abort(rank, error)
            finally:
                world.finish(rank)
                try:
                    vm.shutdown(release_held=True)   # the rank ended: its tensors are nobody's now
                except BaseException as error:  # noqa: BLE001
                    errors.setdefault(rank, error)

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"pyflow-rank-{r}", daemon=True)
               for r in range(world.world_size)]
    for thread in threads:
        thread.start()
    failed_at = None
    try:
        while any(thread.is_alive() for thread in threads):
            for thread in threads:
                thread.join(_JOIN_POLL_SECONDS / len(threads))
            if errors and failed_at is None:
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > _GRACE_SECONDS:
                break   # a rank failed; one still busy in its own code would keep run() silent: report now
    except BaseException as error:  # Ctrl-C in the main thread: stop every rank, then go up
        world.abort(-1, error)
        for thread in threads:
            thread.join(5.0)
        raise
    if errors:
        first = next((r for r in order if not _secondary(errors[r])), order[0] if order else min(errors))
        error = errors[first]
        others = sorted(r for r in errors if r != first)
        also = f" (rank(s) {others} stopped too)" if others else ""
        busy = [(r, t) for r, t in enumerate(threads) if t.is_alive()]
        if busy:
            also += (f"; rank(s) {[r for r, _ in busy]} still running their own code, left to finish as "
                     "daemon threads: " + ", ".join(f"rank {r} at {_where(t)}" for r, t in busy))
        raise RankError(f"rank {first} of {world.world_size} failed{also}: {type(error).__name__}: {error}",
                        rank=first) from error
    return results


def _where(thread: threading.Thread) -> str:
    """The innermost line of ``thread``'s stack outside pyflow and the standard library."""
    from pyflow.distributed.mpi_watchdog import user_line

    frame = sys._current_frames().get(thread.ident)
    return user_line(frame) if frame is not None else "(ended)"
