"""Where the compiled tier's launches run: named worker threads, and what happens when one must stop.

A compiled launch runs on a worker (``launch_submit``), so the caller's thread stays free to
watch it: for a hang (no progress for the hang timeout), for Ctrl-C, and to name the block and
thread an error happened in (``compiled.py``).  A launch whose blocks never meet may also run
ranges of its blocks on other cores (``part_submit``, ``compiled.block_ranges``).

At interpreter exit, Python's executors refuse new work while pyflow's exit handler still runs
the launches queued on its streams (a script's last optimizer step, never read); such a launch
gets a thread of its own (``_submit``).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from concurrent.futures import ThreadPoolExecutor   # imported now: at exit its import is refused

__all__ = ["launch_submit", "part_submit", "stop"]

_STOP_SECONDS = 10.0   # how long a cancelled launch may take to notice
_pool: ThreadPoolExecutor | None = None        # launches (one worker each)
_part_pool: ThreadPoolExecutor | None = None   # the other ranges of a launch's blocks
_pool_lock = threading.Lock()


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
