"""The simulated GPU: its size (how many blocks fit at once) and the simulator's knobs.

On a real GPU, how many blocks can run at the same time ("co-resident") depends
on the kernel's block size and shared memory, through an occupancy calculation:

    blocks per SM = min(max blocks per SM,
                        max threads per SM // threads per block,
                        shared memory per SM // shared memory per block)
    co-resident blocks = number of SMs * blocks per SM

A cooperative launch (one that uses ``cuda.cg.this_grid().sync()``) must fit:
every block has to be running to reach the barrier.  ``max_coresident_blocks``
is what ``kernel.max_cooperative_grid_blocks(blockdim, dynsmem)`` answers in the
simulator.  The defaults describe a small GPU (2 SMs) so that simulated grids stay
cheap; change them with ``configure`` or the environment variables below.

Knobs (environment variable -> default):
    PYFLOW_SIM_SMS      multiprocessor_count (2)
    PYFLOW_SIM_TIMEOUT  hang_timeout seconds without progress (30; 0 disables)
    PYFLOW_SIM_ORDER    start_order: forward | reverse | shuffle (shuffle)
    PYFLOW_SIM_SEED     seed of the shuffle (0)
    PYFLOW_SIM_TIER     tier: auto | threads | compiled (auto; see ``tiers.py``)
    PYFLOW_SIM_BOUNDSCHECK  boundscheck: the compiled tier checks indexes (1; 0: faster, unchecked)
    PYFLOW_SIM_CORES    cores: CPU cores one compiled launch may use (all of them; 1: blocks one after another)
"""

from __future__ import annotations

import dataclasses
import os
import threading
from contextlib import contextmanager

from pyflow.errors import LaunchConfigError

__all__ = ["SimSettings", "settings", "configure", "max_coresident_blocks"]

_ORDERS = ("forward", "reverse", "shuffle")
_TIERS = ("auto", "threads", "compiled")


@dataclasses.dataclass(frozen=True)
class SimSettings:
    """Everything the simulator can be told; an immutable snapshot."""

    multiprocessor_count: int = 2
    max_threads_per_multiprocessor: int = 1024
    max_blocks_per_multiprocessor: int = 8
    shared_memory_per_multiprocessor: int = 96 * 1024
    # Seconds a launch may go without progress (a barrier opening, a thread
    # finishing) before it is aborted as hung.  None disables the watchdog.
    hang_timeout: float | None = 30.0
    # Order in which simulated threads are started.  "shuffle" (seeded) makes a
    # missing barrier show up as a wrong answer rather than depend on luck.
    start_order: str = "shuffle"
    seed: int = 0
    # If set, sys.setswitchinterval during launches: small values (1e-6) make
    # Python switch threads often and expose races that the default 5 ms hides.
    switch_interval: float | None = None
    # Which tier runs a launch (tiers.py): auto, threads (every CUDA thread a Python
    # thread) or compiled (the kernel as njit loops over blocks and threads).
    tier: str = "auto"
    # The compiled tier checks every index (IndexError naming block and thread, as the threaded
    # tier's numpy arrays raise); False runs unchecked: faster, and an index out of range is not seen.
    boundscheck: bool = True
    # The compiled tier runs the blocks of a launch whose blocks never meet (no grid or group barrier,
    # no atomic, no fence) on up to this many CPU cores at once, as a GPU's SMs run them.
    cores: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)

    def __post_init__(self):
        for name in ("multiprocessor_count", "max_threads_per_multiprocessor",
                     "max_blocks_per_multiprocessor", "shared_memory_per_multiprocessor", "cores"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise LaunchConfigError(f"simulator setting {name} must be a positive int, got {getattr(self, name)!r}")
        if self.start_order not in _ORDERS:
            raise LaunchConfigError(f"simulator start_order must be one of {_ORDERS}, got {self.start_order!r}")
        if self.tier not in _TIERS:
            raise LaunchConfigError(f"simulator tier must be one of {_TIERS}, got {self.tier!r} (PYFLOW_SIM_TIER)")
        if self.hang_timeout is not None and self.hang_timeout <= 0:
            raise LaunchConfigError("simulator hang_timeout must be positive or None")


def _from_environment() -> SimSettings:
    timeout = float(os.environ.get("PYFLOW_SIM_TIMEOUT", "30"))
    return SimSettings(
        multiprocessor_count=int(os.environ.get("PYFLOW_SIM_SMS", "2")),
        hang_timeout=timeout if timeout > 0 else None,
        start_order=os.environ.get("PYFLOW_SIM_ORDER", "shuffle"),
        seed=int(os.environ.get("PYFLOW_SIM_SEED", "0")),
        tier=os.environ.get("PYFLOW_SIM_TIER", "auto").strip().lower() or "auto",
        boundscheck=os.environ.get("PYFLOW_SIM_BOUNDSCHECK", "1").strip().lower() not in ("0", "false", "no", "off"),
        cores=int(os.environ.get("PYFLOW_SIM_CORES") or os.cpu_count() or 1),
    )


_base = _from_environment()   # the environment's settings, in force outside every ``configure`` block
_open: list = []   # (token, changes) of each ``configure`` block open now, in the order they were entered
_current = _base
_lock = threading.Lock()


def settings() -> SimSettings:
    """The settings in force now."""
    return _current


@contextmanager
def configure(**changes):
    """Change simulator settings inside a ``with`` block (process-wide).

    >>> with configure(multiprocessor_count=1, hang_timeout=2.0):
    ...     settings().multiprocessor_count
    1

    Blocks may be open on several threads at once and close in any order: the settings in force are the
    environment's with the changes of every block still open applied in the order they were entered, so a
    block that ends takes away its own changes and nobody else's.  (Restoring "the settings before me" would
    not do: of two blocks that overlap on two threads, the second to close would bring back the first one's
    changes for the rest of the process.)

    >>> first, second = configure(tier="threads"), configure(cores=1)
    >>> _ = first.__enter__(); _ = second.__enter__()
    >>> _ = first.__exit__(None, None, None); settings().tier == _base.tier, settings().cores
    (True, 1)
    >>> _ = second.__exit__(None, None, None); settings() == _base
    True
    """
    global _current
    token = object()
    with _lock:
        dataclasses.replace(_current, **changes)   # a bad value raises here, before anything changes
        _open.append((token, changes))
        _current = _with_open_changes()
    try:
        yield _current
    finally:
        with _lock:
            _open[:] = [entry for entry in _open if entry[0] is not token]
            _current = _with_open_changes()


def _with_open_changes() -> SimSettings:
    """The environment's settings with the changes of every open ``configure`` block, oldest first."""
    found = _base
    for _, changes in _open:
        found = dataclasses.replace(found, **changes)
    return found


def max_coresident_blocks(threads_per_block: int, dynamic_shared_bytes: int = 0,
                          s: SimSettings | None = None) -> int:
    """How many blocks of this shape the simulated GPU runs at once (occupancy)."""
    s = s or _current
    per_sm = min(
        s.max_blocks_per_multiprocessor,
        s.max_threads_per_multiprocessor // max(threads_per_block, 1),
        s.shared_memory_per_multiprocessor // dynamic_shared_bytes if dynamic_shared_bytes else 1 << 30,
    )
    return s.multiprocessor_count * per_sm
