"""Where the compiled tier's launches run, who watches them for a hang, and what happens when one must stop.

A launch made on a thread other than the main thread (the VM's stream threads: the eager case)
runs *inline*, on that thread, while one long-lived thread, ``pyflow-sim-hang-watch``, watches
every such launch (``watch``): when one makes no progress (``Progress``) for the hang timeout, the
watch sets the launch's ``cancel`` flag, the compiled code stops at its next check, and the caller
raises ``KernelHangError``.  A launch that does not stop (a loop in a device function, which the
tier cannot interrupt) keeps its thread; the watch then writes a report to stderr, so the program
does not hang silently.  Handing each launch to a worker and waiting on its future cost 30-55 us
(of a tiny launch's 60-110 us, on a loaded 2-core machine: the wake-up of one thread, then of the
other); being watched costs a set insertion and removal.

A launch made on the main thread runs on a worker (``launch_submit``) while the main thread
watches it (``compiled.py``): only the main thread receives Ctrl-C, and it must stay free to
take it, stop the launch and raise.  A launch whose blocks never meet may also run ranges of its
blocks on other cores (``part_submit``, ``compiled.block_ranges``).

At interpreter exit, Python's executors refuse new work while pyflow's exit handler still runs
the launches queued on its streams (a script's last optimizer step, never read); such a launch
gets a thread of its own (``_submit``).
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor   # imported now: at exit its import is refused

__all__ = ["launch_submit", "part_submit", "stop", "release", "Progress", "watch", "unwatch", "thread_doing",
           "thread_compiling"]

_STOP_SECONDS = 10.0   # how long a cancelled launch may take to notice
_POLL_SECONDS = 0.02   # how often a launch's progress is looked at
_IDLE_SECONDS = 1.0    # the hang watch ends after this long with no launch to watch (the next one starts it)
_pool: ThreadPoolExecutor | None = None        # launches (one worker each)
_part_pool: ThreadPoolExecutor | None = None   # the other ranges of a launch's blocks
_pool_lock = threading.Lock()


class Progress:
    """What the hang watch knows of one running launch: its ``where`` rows (a row per range of blocks:
    nodes run, block, thread, node), its ``cancel`` flag, its hang limit and its thread (``worker``,
    a list that holds the thread's id once it runs).  ``hung(now)``: no progress for longer than
    ``hang_timeout`` seconds, not counting numba compiling a function at its first call."""

    def __init__(self, name: str, where, cancel, hang_timeout, worker: list):
        self.name, self.where, self.cancel, self.hang_timeout, self.worker = name, where, cancel, hang_timeout, worker
        self.last, self.since = None, time.monotonic()
        self.doing = None        # set when the watch stopped it: where its thread was (``thread_doing``)
        self.reported = False    # the watch wrote that it did not stop

    def hung(self, now: float) -> bool:
        seen = (int(self.where[:, 0].sum()), tuple(self.where[:, 2]))
        if seen != self.last:   # a node run, or the next thread, in some range of blocks: progress
            self.last, self.since = seen, now
        elif thread_compiling(self.worker):   # numba compiling a function the launch calls: not the kernel's time
            self.since = now
        elif self.hang_timeout is not None and now - self.since > self.hang_timeout:
            return True
        return False

    def message(self, stopped: bool) -> str:
        """``KernelHangError``'s text (``stopped``: the launch noticed its cancel flag)."""
        return (f"kernel {self.name!r} made no progress for {self.hang_timeout:g} s (compiled tier; "
                f"last in block number {self.where[0, 1]}, thread number {self.where[0, 2]}); "
                "PYFLOW_SIM_TIMEOUT / configure(hang_timeout=...) sets the limit"
                + ("" if stopped else "; its thread did not stop (a loop the tier cannot "
                   "interrupt, in a device function) and keeps running") + (self.doing or ""))


# ---- the hang watch of inline launches -------------------------------------------------------

_watched: set = set()                 # the Progress of every inline launch running now
_watch_changed = threading.Condition()
_watch_thread: threading.Thread | None = None
_watching = False   # the watch thread is polling: a launch adds itself without taking the lock
_ending = False     # ``release`` asked the watch to end as soon as it has nothing to watch
_added = 0          # launches watched so far (the watch stays polling while they keep coming)


def watch(progress: Progress) -> bool:
    """Watch an inline launch until ``unwatch``; False if no watch thread can start (at interpreter exit)."""
    global _watch_thread, _ending, _added
    _watched.add(progress)   # a set's add and discard are atomic: no lock while the watch polls
    _added += 1   # (two threads may count one: the watch only asks whether it changed)
    if _watching:
        return True
    with _watch_changed:     # it may be waiting for a launch to watch, or gone
        if _watch_thread is None:
            _ending = False
            thread = threading.Thread(target=_watch_loop, name="pyflow-sim-hang-watch", daemon=True)
            try:
                thread.start()
            except RuntimeError:   # "can't create new thread at interpreter shutdown"
                _watched.discard(progress)
                return False
            _watch_thread = thread
        _watch_changed.notify()
    return True


def unwatch(progress: Progress) -> None:
    _watched.discard(progress)


def _watch_loop() -> None:
    """The hang watch: every ``_POLL_SECONDS`` while inline launches run or keep coming; ends after
    ``_IDLE_SECONDS`` without one (a daemon thread besides: it never holds up the interpreter's exit).

    It goes idle only when a poll finds no launch running and none made since the poll before: most
    launches take microseconds, so a poll mostly finds none running even while a stream makes one after
    another, and an idle watch costs each launch its lock and a wake-up of this thread (before this rule,
    200 of 200 tiny launches in a row took them; cProfile put the lock at 56 us of a 640-element product's
    launch on a stream)."""
    global _watch_thread, _watching, _ending
    seen = -1   # ``_added`` at the last poll
    _watching = True
    try:
        while True:
            if not _watched and _added == seen:   # none running, none made since the last poll: idle
                with _watch_changed:
                    _watching = False   # from now on a launch that adds itself notifies ...
                    if not _watched and _added == seen:    # ... and one added before is seen here
                        if not _ending:
                            _watch_changed.wait(_IDLE_SECONDS)
                        if not _watched and _added == seen:
                            _watch_thread = None
                            return
                    _watching, _ending = True, False   # (a launch came after ``release``: go on watching)
            seen = _added
            now = time.monotonic()
            for progress in list(_watched):
                if progress.doing is None and progress.hung(now):
                    progress.doing = thread_doing(progress.worker)
                    progress.since = now
                    progress.cancel[0] = 1
                elif progress.doing is not None and not progress.reported and now - progress.since > _STOP_SECONDS:
                    progress.reported = True
                    _report_stuck(progress)
            with _watch_changed:   # (a wait, not a sleep: ``release`` wakes it at once)
                if _watched:
                    _ending = False
                if not _ending:
                    _watch_changed.wait(_POLL_SECONDS)
    finally:   # (also if it failed: the next launch starts another)
        with _watch_changed:
            _watching = False
            if _watch_thread is threading.current_thread():
                _watch_thread = None


def release() -> None:
    """End the simulator's helper threads that have nothing to do: the hang watch (at once, not after
    ``_IDLE_SECONDS``, unless a launch is running: another rank's, say) and the pools' workers (after their
    launches).  A later launch starts them again.  ``vm.shutdown`` calls it (``backend.release_threads``):
    no thread of pyflow outlives a shutdown."""
    global _pool, _part_pool, _ending
    with _pool_lock:
        pools, _pool, _part_pool = (_pool, _part_pool), None, None
    for pool in pools:
        if pool is not None:
            pool.shutdown(wait=True)
    with _watch_changed:
        thread = _watch_thread
        if thread is None or _watched:
            return
        _ending = True
        _watch_changed.notify()
    if thread is not threading.current_thread():
        thread.join(_IDLE_SECONDS + 1.0)


def _report_stuck(progress: Progress) -> None:
    """A launch told to stop goes on: its caller cannot raise; say so on stderr rather than hang silently."""
    thread = next((t.name for t in threading.enumerate() if progress.worker and t.ident == progress.worker[0]), "?")
    print(f"pyflow: {progress.message(stopped=False)}; thread {thread!r} is stuck in it", file=sys.stderr, flush=True)


# ---- the launches of the main thread, and the other ranges of blocks ----------------------------
def stop(future, cancel) -> bool:
    """Ask a launch to stop and wait a little; False (and a fresh pool for later launches) if it goes on."""
    global _pool, _part_pool
    cancel[0] = 1
    concurrent.futures.wait([future], timeout=_STOP_SECONDS)
    if future.done():
        return True
    with _pool_lock:   # the stuck workers keep their threads; later launches get threads of their own
        _pool = _part_pool = None
    return False


def launch_submit(fn):
    """Run ``fn`` (a launch) on a worker; its future."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="pyflow-sim-compiled")
        return _submit(_pool, fn, "pyflow-sim-compiled-at-exit")


def part_submit(fn):
    """Run ``fn`` (a range of a launch's blocks) on another core's worker; its future."""
    global _part_pool
    with _pool_lock:
        if _part_pool is None:
            _part_pool = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) - 1),
                                            thread_name_prefix="pyflow-sim-blocks")
        return _submit(_part_pool, fn, "pyflow-sim-blocks-at-exit")


def _submit(pool, fn, name: str):
    """``pool.submit(fn)``; once the interpreter is exiting (every executor refuses work then, while pyflow's
    exit handler still runs the launches queued on its streams), a thread of its own for ``fn``."""
    try:
        return pool.submit(fn)
    except RuntimeError:   # "cannot schedule new futures after interpreter shutdown"
        pass
    future = concurrent.futures.Future()

    def run():
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn())
            except BaseException as error:   # handed to the launch's caller, as the pool would
                future.set_exception(error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def thread_doing(worker: list) -> str:
    """Where a launch's thread is: the last Python lines it runs ('' if it has not started)."""
    frame = sys._current_frames().get(worker[0]) if worker else None
    if frame is None:
        return "; the launch had not started (every worker thread of the compiled tier was busy)"
    lines = []
    while frame is not None and len(lines) < 4:
        lines.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}")
        frame = frame.f_back
    return "; its thread was at " + " <- ".join(lines)


def thread_compiling(worker: list) -> bool:
    """Is the launch's thread inside numba's compiler (a function of the generated module or the
    grid machine compiled at its first call: seconds on a loaded machine, and no hang)?"""
    frame = sys._current_frames().get(worker[0]) if worker else None
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(("numba.core.", "llvmlite.")):
            return True
        frame = frame.f_back
    return False
