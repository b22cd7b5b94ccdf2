"""The rank context: what one OneFlow *process* owns (OneFlow's ``GlobalProcessCtx``, seed 000 §3).

OneFlow runs one process per device, and each process has its rank, the world
size, its local rank on the machine, its own virtual machine, streams and
allocator caches.  pyflow keeps the rule **a rank behaves as a process** but
lets N ranks live as N threads of one Python process (tests, courses, pdb):
everything a process owns hangs off a ``RankContext``, and each rank thread
binds its own (``bound``).  Code that is not inside a rank thread sees the
*process context*: rank 0 of a world of 1, or, in a process that MPI started
(``mpiexec``, ``python -m pyflow.distributed.launch``), this process's MPI rank
with its ``MPITransport`` (``pyflow/distributed/mpi.py`` installs it with
``set_process_context`` when pyflow is imported).

* ``current()``      - the calling thread's rank context;
* ``bound(ctx)``     - make ``ctx`` the calling thread's context inside a ``with``;
* ``process_context()`` / ``set_process_context(ctx)`` - what threads outside rank threads see;
* ``get_rank()``, ``get_world_size()``, ``get_local_rank()`` - ``flow.env``'s API.

Ranks meet only through ``ctx.transport`` (``pyflow/distributed/``), never
through shared Python objects.  ``ctx.vm`` is made by ``pyflow.vm.get_vm`` on
first use.  This module imports nothing from pyflow except ``errors``.

>>> get_rank(), get_world_size()
(0, 1)
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

__all__ = ["RankContext", "current", "bound", "process_context", "set_process_context", "get_rank",
           "get_world_size", "get_local_rank"]


@dataclasses.dataclass(eq=False)
class RankContext:
    """One rank: its ids, its transport to the other ranks, and its virtual machine."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    transport: object = None  # pyflow.distributed.Transport; None in a world of one
    vm: object = None         # this rank's pyflow.vm.VirtualMachine (made on first use)
    generator: object = None  # this rank's numpy random Generator (flow.manual_seed; made on first use)

    def __repr__(self) -> str:
        return f"RankContext(rank={self.rank}, world_size={self.world_size}, local_rank={self.local_rank})"


_default = RankContext()
_local = threading.local()


def current() -> RankContext:
    """The calling thread's rank context (the process context outside rank threads)."""
    return getattr(_local, "ctx", None) or _default


def process_context() -> RankContext:
    """The context of this process: what every thread that is not a rank thread sees."""
    return _default


def set_process_context(ctx: RankContext) -> RankContext:
    """Make ``ctx`` this process's context (an MPI process becomes its rank); returns the previous one."""
    global _default
    previous, _default = _default, ctx
    return previous


@contextlib.contextmanager
def bound(ctx: RankContext):
    """Inside the block, the calling thread is rank ``ctx.rank`` (its VM, its transport)."""
    previous = getattr(_local, "ctx", None)
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = previous


def get_rank() -> int:
    """This rank's id (``flow.env.get_rank()``)."""
    return current().rank


def get_world_size() -> int:
    """How many ranks there are (``flow.env.get_world_size()``)."""
    return current().world_size


def get_local_rank() -> int:
    """This rank's index on its machine (``flow.env.get_local_rank()``)."""
    return current().local_rank
