"""The compiled tier's hang watch does not count numba compiling a function at its first call as a hang.

On a loaded machine a compile at a launch's first call (the grid machine, a generated function) took over
``hang_timeout`` seconds and was reported as ``KernelHangError`` (seen in llvmlite's ``finalize_object``).
The watch asks where the launch's worker thread is: inside numba's compiler, the clock of "no progress"
starts again.  Here the worker is a thread stopped in a function whose module is named like numba's.
"""

from __future__ import annotations

import concurrent.futures
import threading
import types

import numpy as np
import pytest

from pyflow.errors import KernelHangError
from pyflow.kernels.backend import is_simulator

pytestmark = pytest.mark.skipif(not is_simulator(), reason="the simulator's compiled tier")

if is_simulator():
    from pyflow.kernels.sim import compiled


def _function_in_module(name: str):
    """A function ``wait(event)`` whose frame says it runs in module ``name``."""
    scope = {"__name__": name}
    exec("def wait(event):\n    event.wait(30)\n", scope)
    return scope["wait"]


def _watched(module_name: str, seconds_past_limit: float):
    """Watch a worker stopped in ``module_name`` for longer than the hang limit, then let it finish."""
    release, worker = threading.Event(), []
    wait = _function_in_module(module_name)

    def work():
        worker.append(threading.get_ident())
        wait(release)
        return 0, 0

    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="test-hang-watch")
    future = pool.submit(work)
    threading.Timer(seconds_past_limit, release.set).start()
    where, cancel = np.full((1, 4), -1, np.int64), np.zeros(1, np.int64)
    try:
        return compiled.CompiledKernel._watch(types.SimpleNamespace(name="k"), future, where, cancel, 0.1, worker)
    finally:
        release.set()
        pool.shutdown(wait=True)


def test_a_worker_inside_numbas_compiler_is_not_a_hang():
    assert _watched("numba.core.compiler", 0.5) == (0, 0)


def test_a_worker_stopped_elsewhere_is_still_a_hang():
    with pytest.raises(KernelHangError, match="made no progress for 0.1 s"):
        _watched("somewhere.else", 0.5)


def test_compiling_reads_the_worker_threads_frames():
    assert compiled._compiling([]) is False
    assert compiled._compiling([threading.get_ident()]) is False   # this test's own frames: not numba's
