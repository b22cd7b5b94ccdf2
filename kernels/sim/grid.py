"""One simulated kernel launch: every thread of every block alive at once.

A ``GridRun`` owns the Python threads that play the CUDA threads of one launch,
and the two kinds of barrier they meet at:

* the block barrier (``cuda.syncthreads``) opens when every live thread of the
  block has arrived.  A thread that has exited counts as arrived, as on the
  hardware.  All arrivals must come from the same source line; otherwise the
  block has *divergent* barriers and the launch fails with
  ``DivergentBarrierError``;
* the grid barrier (``cuda.cg.this_grid().sync()``) opens when every thread of
  the grid has arrived.  A thread that exits while others wait (or will wait)
  there makes a GPU hang; here it raises ``GridSyncExitError``.

Each waiting thread sleeps on its own lock, and the last arrival releases them.
There is no polling, which is why this is much cheaper than the stock
simulator's busy loop.  All the bookkeeping sits under one lock, so deadlock
detection is exact: when the last running thread starts to wait and no barrier
can open, the launch fails at once with ``DeadlockError`` and a table of who
waits where.  A watchdog in the launching thread catches the rest (a spin loop
that never ends).  It aborts after ``hang_timeout`` seconds without progress,
unless a debugger is stepping through a simulated thread.

Blocks start in waves of at most the co-resident limit, as on a GPU.  A launch
that uses grid sync must fit in one wave (checked before it starts).

On failure, waiting threads are woken with an ``_Abort`` exception.  Threads
still running get one injected, so that nothing is left running.
"""

from __future__ import annotations

import ctypes
import math
import os
import random
import sys
import threading
import time
import types

import numpy as np
from numba.cuda.simulator.kernelapi import Dim3

from pyflow.errors import (
    CooperativeLaunchTooLargeError,
    DeadlockError,
    DivergentBarrierError,
    GridSyncExitError,
    KernelError,
    KernelHangError,
)

from .fake_cuda import sim_math
from .settings import SimSettings

__all__ = ["GridRun", "SimThread"]

_POLL_SECONDS = 0.05
_STOP_GRACE_SECONDS = 0.5
# Frames in these files are the simulator's own; a barrier's "site" is the first
# frame outside them (the kernel line that called syncthreads or sync).
_SIM_FILES = {os.path.join(os.path.dirname(__file__), f) for f in os.listdir(os.path.dirname(__file__))}
_SIM_FILES.add(sys.modules[Dim3.__module__].__file__)


class _Abort(BaseException):
    """Unwinds a simulated thread after the launch has failed."""


class _Site(tuple):
    """(file, line) of a barrier call; formatted only when a report needs it."""

    def __str__(self) -> str:
        return f"{os.path.basename(self[0])}:{self[1]}"


def _site(frame) -> _Site:
    while frame is not None and frame.f_code.co_filename in _SIM_FILES:
        frame = frame.f_back
    return _Site(("?", 0) if frame is None else (frame.f_code.co_filename, frame.f_lineno))


class _Barrier:
    """The threads gathered at one barrier so far, and the line they wait at."""

    def __init__(self, kind: str):
        self.kind = kind              # "syncthreads" or "grid.sync"
        self.waiting: list = []
        self.site: _Site | None = None  # call site of the first arrival


class _Block:
    def __init__(self, index: tuple, threads: int, shared):
        self.index = index
        self.dim3 = Dim3(*index)
        self.shared = shared
        self.live = threads          # threads not yet exited
        self.barrier = _Barrier("syncthreads")
        self.votes = np.zeros(threads, dtype=np.int64)
        self.alive = np.ones(threads, dtype=bool)


class SimThread(threading.Thread):
    """One CUDA thread: what ``cuda.threadIdx``/``cuda.blockIdx`` read."""

    def __init__(self, grid: "GridRun", block: _Block, thread_idx: tuple, thread_id: int):
        name = f"pyflow-sim:{grid.name}:block{block.index}:thread{thread_idx}"
        super().__init__(name=name, daemon=True)
        self.sim_grid = grid
        self.block = block
        self.blockIdx = block.dim3
        self.threadIdx = Dim3(*thread_idx)
        self.thread_id = thread_id   # linear index in the block (used for laneid)
        self.wake = threading.Lock()
        self.wake.acquire()          # held: acquiring it again sleeps until a release
        self.waiting_at = None       # (barrier kind, site) while asleep at a barrier
        self.wakes_next = None       # the thread this one wakes when it wakes (see _open)

    def run(self):
        grid = self.sim_grid
        try:
            with np.errstate(**grid.float_errors):  # numpy's errstate is per thread
                grid.kernel(*grid.args)
        except _Abort:
            pass
        except BaseException as error:  # noqa: BLE001 - reported to the launching thread
            grid.thread_failed(self, error)
        finally:
            grid.thread_exited(self)

    def where(self) -> str:
        return f"block {tuple(self.blockIdx)} thread {tuple(self.threadIdx)}"


class GridRun:
    """Run ``kernel(*args)`` on a grid of simulated threads; raise what went wrong."""

    def __init__(self, name: str, kernel, args, grid_dim, block_dim, make_shared,
                 coresident: int, cooperative: bool, settings: SimSettings, real_cuda, fake_cuda,
                 debug: bool = False, only_blocks=None):
        self.name, self.args = name, args
        self.real_cuda, self.fake_cuda = real_cuda, fake_cuda
        # Like a GPU, float errors give inf/nan silently; jit(debug=True) makes them raise.
        self.float_errors = {"divide": "raise", "invalid": "raise"} if debug else {"all": "ignore"}
        self.rebound: dict = {}
        self.kernel = self.rebind(kernel)
        self.block_dim = block_dim
        self.threads_per_block = block_dim[0] * block_dim[1] * block_dim[2]
        self.block_indices = [(x, y, z) for z in range(grid_dim[2])
                              for y in range(grid_dim[1]) for x in range(grid_dim[0])]
        if only_blocks is not None:   # the compiled tier re-runs a failing block here to name its line
            self.block_indices = [b for b in self.block_indices if b in only_blocks]
        self.total_threads = len(self.block_indices) * self.threads_per_block
        self.make_shared = make_shared
        self.coresident = len(self.block_indices) if cooperative else min(coresident, len(self.block_indices))
        self.all_resident = self.coresident >= len(self.block_indices)
        self.settings = settings
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # wakes the launching thread
        self.threads: list[SimThread] = []
        self.running = 0          # started threads neither waiting nor exited
        self.exited: list[SimThread] = []
        self.started_blocks = 0
        self.finished_blocks = 0
        self.grid = _Barrier("grid.sync")
        self.progress = 0         # bumped whenever something moves forward
        self.error: BaseException | None = None
        self.more_failures = 0

    # ---- the launching thread ---------------------------------------------------

    def execute(self) -> None:
        order = list(self.block_indices)
        if self.settings.start_order == "reverse":
            order.reverse()
        rng = random.Random(self.settings.seed) if self.settings.start_order == "shuffle" else None
        pending = iter(order)
        try:
            self._run_blocks(pending, rng)
        except BaseException as error:  # Ctrl-C while we wait: no simulated thread may run on
            with self.lock:
                self._fail(error)
            self._stop_everyone()
            raise
        if self.error is not None:
            self._stop_everyone()
            raise self.error

    def _run_blocks(self, pending, rng) -> None:
        """Start blocks as co-residency allows and watch for the end, a failure or a hang."""
        with self.lock:
            last_progress, last_change = -1, time.monotonic()
            while True:
                batch = []
                while self.started_blocks - self.finished_blocks < self.coresident:
                    index = next(pending, None)
                    if index is None:
                        break
                    batch.extend(self._make_block(index))
                if rng is not None:
                    rng.shuffle(batch)
                for thread in batch:
                    thread.start()
                if self.error is not None or len(self.exited) == self.total_threads:
                    break
                self.changed.wait(_POLL_SECONDS)
                now = time.monotonic()
                if self.progress != last_progress or self._being_debugged():
                    last_progress, last_change = self.progress, now
                elif self.settings.hang_timeout is not None and now - last_change > self.settings.hang_timeout:
                    self._fail(KernelHangError(
                        f"kernel {self.name!r} made no progress for {self.settings.hang_timeout:g} s "
                        f"(PYFLOW_SIM_TIMEOUT / configure(hang_timeout=...)):\n{self._report(running=True)}"))

    def _make_block(self, index) -> list[SimThread]:
        block = _Block(index, self.threads_per_block, self.make_shared())
        bx, by, bz = self.block_dim
        made = [SimThread(self, block, (x, y, z), x + bx * (y + by * z))
                for z in range(bz) for y in range(by) for x in range(bx)]
        self.threads.extend(made)
        self.running += len(made)
        self.started_blocks += 1
        self.progress += 1
        return made

    def _being_debugged(self) -> bool:
        """True if pdb (or any tracer) is stepping through one of our threads."""
        frames = sys._current_frames()
        for thread in self.threads:
            frame = frames.get(thread.ident)
            while frame is not None:
                if frame.f_trace is not None:
                    return True
                frame = frame.f_back
        return False

    def _stop_everyone(self) -> None:
        """Wake waiters (done by _fail), then make sure no simulated thread still runs."""
        deadline = time.monotonic() + _STOP_GRACE_SECONDS
        for thread in self.threads:
            if thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t for t in self.threads if t.is_alive()]
        for thread in stuck:  # a spin loop: inject _Abort into it
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Abort))
        for thread in stuck:
            thread.join(2.0)

    # ---- called by simulated threads --------------------------------------------

    def rebind(self, function):
        """``function`` with ``cuda`` (and ``math``) in its globals replaced for this launch.

        ``cuda`` becomes the launch's fake module and ``math`` the IEEE ``sim_math``.
        Module globals are copied, never mutated, so host code in the same module
        keeps seeing the real ``numba.cuda`` while the kernel runs.
        """
        found = self.rebound.get(function)
        if found is None:
            swap = {id(self.real_cuda): self.fake_cuda, id(math): sim_math}
            env = {k: swap.get(id(v), v) for k, v in function.__globals__.items()}
            found = types.FunctionType(function.__code__, env, function.__name__,
                                       function.__defaults__, function.__closure__)
            found.__kwdefaults__ = function.__kwdefaults__
            self.rebound[function] = found
        return found

    def block_barrier(self, thread: SimThread) -> None:
        site = _site(sys._getframe(1))
        with self.lock:
            if self.error is not None:
                raise _Abort
            barrier = thread.block.barrier
            if barrier.waiting and site != barrier.site:
                self._fail(DivergentBarrierError(
                    f"kernel {self.name!r}: divergent syncthreads in block {thread.block.index}: "
                    f"{len(barrier.waiting)} thread(s) wait at {barrier.site}, "
                    f"{thread.where()} arrived at {site}; every thread of a block must reach the same barrier"))
                raise _Abort
            must_sleep = self._arrive(thread, barrier, thread.block.live, site)
        if must_sleep:
            self._sleep(thread)

    def block_vote(self, thread: SimThread, value, combine):
        """syncthreads_count / _and / _or: barrier, combine everyone's value, barrier."""
        block = thread.block
        block.votes[thread.thread_id] = 1 if value else 0
        self.block_barrier(thread)
        result = combine(block.votes[block.alive])
        self.block_barrier(thread)
        return result

    def grid_barrier(self, thread: SimThread) -> None:
        site = _site(sys._getframe(1))
        with self.lock:
            if self.error is not None:
                raise _Abort
            if not self.all_resident:
                self._fail(CooperativeLaunchTooLargeError(
                    f"kernel {self.name!r} called this_grid().sync() but its {len(self.block_indices)} "
                    f"blocks are not all co-resident (limit {self.coresident}); launch at most "
                    "kernel.max_cooperative_grid_blocks(blockdim, dynsmem) blocks"))
                raise _Abort
            if self.exited:
                gone = self.exited[0]
                self._fail(GridSyncExitError(
                    f"kernel {self.name!r}: {thread.where()} reached the grid barrier at {site}, but "
                    f"{gone.where()} had already exited; on a GPU this grid barrier would hang "
                    "(every thread must reach every grid sync: no early return)"))
                raise _Abort
            must_sleep = self._arrive(thread, self.grid, self.total_threads, site)
        if must_sleep:
            self._sleep(thread)

    def thread_failed(self, thread: SimThread, error: BaseException) -> None:
        with self.lock:
            if self.error is not None:
                self.more_failures += 1
                return
            failure = KernelError(
                f"kernel {self.name!r} failed in threadIdx={tuple(thread.threadIdx)} "
                f"blockIdx={tuple(thread.blockIdx)}{_kernel_line(error)}: {type(error).__name__}: {error}",
                kernel=self.name, thread_idx=tuple(thread.threadIdx), block_idx=tuple(thread.blockIdx))
            failure.__cause__ = error
            self._fail(failure)

    def thread_exited(self, thread: SimThread) -> None:
        with self.lock:
            self.running -= 1
            block = thread.block
            block.live -= 1
            block.alive[thread.thread_id] = False
            self.exited.append(thread)
            self.progress += 1
            if self.error is None:
                if self.grid.waiting:
                    self._fail(GridSyncExitError(
                        f"kernel {self.name!r}: {thread.where()} exited while {len(self.grid.waiting)} "
                        f"thread(s) wait at the grid barrier at {self.grid.site}; on a GPU this hangs "
                        "(every thread must reach every grid sync: no early return)"))
                elif block.barrier.waiting and len(block.barrier.waiting) == block.live:
                    self._open(block.barrier)  # the exited thread counted as arrived
                elif self.running == 0 and self._anyone_waiting():
                    self._fail(self._deadlock())
            if block.live == 0:
                self.finished_blocks += 1
                self.changed.notify()  # a co-resident slot is free, or the launch is over

    # ---- bookkeeping (caller holds self.lock) -----------------------------------

    def _arrive(self, thread: SimThread, barrier: _Barrier, needed: int, site: str) -> bool:
        """Count ``thread`` in; open the barrier if it was the last. True: it must sleep."""
        if len(barrier.waiting) + 1 == needed:
            self._open(barrier)
            return False
        if not barrier.waiting:
            barrier.site = site
        barrier.waiting.append(thread)
        thread.waiting_at = (barrier.kind, site)
        self.running -= 1
        if self.running == 0:
            self._fail(self._deadlock())
        return True

    def _sleep(self, thread: SimThread) -> None:
        try:
            thread.wake.acquire()  # released by _open (directly or through a baton) or _fail
        finally:  # pass the baton even if an abort is injected right now
            successor, thread.wakes_next = thread.wakes_next, None
            if successor is not None:
                successor.wake.release()
        if self.error is not None:
            raise _Abort

    def _open(self, barrier: _Barrier) -> None:
        """Wake everyone gathered at ``barrier``, one after another.

        Waking all sleepers at once would make them fight over the GIL; instead
        the first is woken and each wakes the next (a baton), so only about two
        threads are runnable at any time.  The barrier is open for all of them now.
        """
        waiters = barrier.waiting
        for waiter, successor in zip(waiters, waiters[1:] + [None]):
            waiter.waiting_at = None
            waiter.wakes_next = successor
        if waiters:
            waiters[0].wake.release()
        self.running += len(waiters)
        self.progress += 1
        barrier.waiting, barrier.site = [], None

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        for barrier in {t.block.barrier for t in self.threads} | {self.grid}:
            for waiter in barrier.waiting:
                waiter.wake.release()
            barrier.waiting = []
        self.changed.notify()

    def _anyone_waiting(self) -> bool:
        return bool(self.grid.waiting) or any(t.waiting_at for t in self.threads)

    def _deadlock(self) -> DeadlockError:
        return DeadlockError(
            f"kernel {self.name!r} deadlocked: every live thread waits at a barrier that cannot open "
            f"(missing or divergent barrier?):\n{self._report(running=False)}")

    def _report(self, running: bool) -> str:
        """Group threads by block and by where they are; one line per group."""
        frames = sys._current_frames() if running else {}
        exited = set(self.exited)
        groups: dict = {}
        for thread in self.threads:
            if thread in exited:
                state = "exited"
            elif thread.waiting_at:
                state = "waiting at {} at {}".format(*thread.waiting_at)
            else:
                state = f"running at {_site(frames.get(thread.ident))}" if running else "running"
            groups.setdefault((thread.block.index, state), 0)
            groups[(thread.block.index, state)] += 1
        lines = [f"  block {b}: {n} thread(s) {state}" for (b, state), n in sorted(groups.items())]
        not_started = len(self.block_indices) - len({t.block for t in self.threads})
        if not_started:
            lines.append(f"  {not_started} block(s) not started (waiting for a co-resident slot)")
        return "\n".join(lines)


def _kernel_line(error: BaseException) -> str:
    """' at kernel.py:12' for the deepest traceback frame outside numpy and the simulator."""
    numpy_dir = os.path.dirname(np.__file__)
    where = ""
    tb = error.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename not in _SIM_FILES and not filename.startswith(numpy_dir):
            where = f" at {os.path.basename(filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where
