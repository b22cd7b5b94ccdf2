"""The compiled tier runs a launch made off the main thread on the caller's own thread (``kernels/sim/workers.py``).

Properties: such a launch is never handed to a worker (the main thread's still are: it must stay free
for Ctrl-C); it gives the same values and the same errors, naming block and thread; a hang is stopped by
the one hang watch thread (``pyflow-sim-hang-watch``) and raised as ``KernelHangError`` on the caller;
a long launch that makes progress is no hang; a launch that does not stop when told is reported on
stderr, not left to hang silently; the watch thread ends when nothing is left to watch.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from pyflow.errors import DivergentBarrierError, KernelError, KernelHangError
from pyflow.kernels.backend import cuda, is_simulator
from pyflow.kernels.jit import jit
from tests.test_sim_tiers import add_many_times, spin_until_set, store_past_the_end   # the tier tests' kernels

pytestmark = pytest.mark.skipif(not is_simulator(), reason="the simulator's compiled tier")

if is_simulator():
    from pyflow.kernels import sim
    from pyflow.kernels.sim import workers

BOUND_SECONDS = 20.0   # a reported hang or error comes back well within this, even on a loaded machine


@jit
def add_index(x):
    i = cuda.grid(1)
    if i < x.shape[0]:
        x[i] += i


@jit
def barrier_in_one_branch(x):
    t = cuda.threadIdx.x
    if t < 2:
        cuda.syncthreads()
    x[t] = t


def on_a_thread(launch, *args, **setting):
    """Run ``kernel[config](*args)`` (``launch``) in the compiled tier on a thread of its own; its error, if any,
    raised here."""
    outcome = []

    def run():
        try:
            with sim.configure(tier="compiled", **setting):
                launch(*args)
        except BaseException as error:   # handed to the test
            outcome.append(error)

    thread = threading.Thread(target=run, name="test-inline-caller")
    thread.start()
    thread.join(BOUND_SECONDS * 2)
    assert not thread.is_alive(), "the launch did not come back"
    if outcome:
        raise outcome[0]


@pytest.fixture
def no_hand_off(monkeypatch):
    """Launches handed to a worker, counted by the thread that handed them."""
    handed, submit = [], workers.launch_submit

    def counted(fn):
        handed.append(threading.current_thread().name)
        return submit(fn)

    monkeypatch.setattr(workers, "launch_submit", counted)
    return handed


def test_a_launch_off_the_main_thread_runs_inline_and_one_on_it_is_handed_to_a_worker(no_hand_off):
    x = np.zeros(100)
    on_a_thread(add_index[4, 32], x)
    assert no_hand_off == []
    np.testing.assert_array_equal(x, np.arange(100.0))
    with sim.configure(tier="compiled"):
        add_index[4, 32](x)
    assert no_hand_off == ["MainThread"]
    np.testing.assert_array_equal(x, 2 * np.arange(100.0))


def test_an_index_out_of_range_inline_names_block_and_thread(no_hand_off):
    with pytest.raises(KernelError) as caught:
        on_a_thread(store_past_the_end[3, 4], np.zeros(8), 8)
    compiled = caught.value.__cause__   # the threaded re-run names the line; its cause is the compiled tier's
    assert "compiled tier" in str(compiled) and "IndexError" in str(compiled)
    assert compiled.block_idx == (2, 0, 0) and compiled.thread_idx == (0, 0, 0)
    assert no_hand_off == []


def test_a_divergent_barrier_inline_is_the_compiled_tiers_error(no_hand_off):
    with pytest.raises(DivergentBarrierError, match="compiled tier"):
        on_a_thread(barrier_in_one_branch[1, 4], np.zeros(4), hang_timeout=5)
    assert no_hand_off == []


def test_a_hang_inline_is_stopped_by_the_watch_and_raised_on_the_caller(no_hand_off):
    started = time.monotonic()
    with pytest.raises(KernelHangError, match=r"spin_until_set.*no progress for 0.5 s"):
        on_a_thread(spin_until_set[1, 2], np.zeros(1), hang_timeout=0.5)
    assert time.monotonic() - started < BOUND_SECONDS
    assert no_hand_off == []


def test_a_long_inline_launch_that_makes_progress_is_no_hang():
    x = np.zeros(64 * 32)
    on_a_thread(add_many_times[64, 32], x, 40_000, hang_timeout=0.3, cores=1)
    np.testing.assert_array_equal(x, 40_000.0)


def test_the_watch_is_one_named_thread_that_ends_when_nothing_is_left_to_watch(monkeypatch):
    monkeypatch.setattr(workers, "_IDLE_SECONDS", 0.1)
    callers = [threading.Thread(target=on_a_thread, args=(add_many_times[8, 32], np.zeros(256), 2000))
               for _ in range(3)]
    for caller in callers:
        caller.start()
    seen = set()
    while any(c.is_alive() for c in callers):
        seen.add(sum(t.name == "pyflow-sim-hang-watch" for t in threading.enumerate()))
        time.sleep(0.001)
    for caller in callers:
        caller.join()
    assert seen <= {0, 1}
    deadline = time.monotonic() + BOUND_SECONDS
    while any(t.name == "pyflow-sim-hang-watch" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the hang watch did not end"
        time.sleep(0.01)


def test_a_run_of_short_inline_launches_finds_the_watch_polling(monkeypatch):
    """A launch takes the watch's lock (and wakes its thread) only when the watch is idle.  Short launches are
    seldom running when it polls, so it stays polling while new ones keep coming (``workers._added``); before,
    it went idle at every poll that found none running (and never counted itself polling after it started),
    and about 4 of 5 launches of a stream paid a lock and a wake-up, as much as the launch itself."""
    took_lock = []
    real_condition = workers._watch_changed

    class Counted:
        def __enter__(self):
            if threading.current_thread().name == "test-inline-caller":
                took_lock.append(1)
            return real_condition.__enter__()

        def __exit__(self, *exc):
            return real_condition.__exit__(*exc)

        def __getattr__(self, name):
            return getattr(real_condition, name)

    monkeypatch.setattr(workers, "_watch_changed", Counted())
    x = np.zeros(256)
    launch = add_index[8, 32]

    def many():
        for _ in range(200):
            launch(x)

    on_a_thread(many)
    np.testing.assert_array_equal(x, 200 * np.arange(256.0))
    assert len(took_lock) <= 50, f"{len(took_lock)} of 200 launches woke the watch"


def _simulator_threads() -> set:
    return {t.name.rstrip("_0123456789") for t in threading.enumerate() if t.name.startswith("pyflow-sim-")}


def test_a_vm_shutdown_ends_the_idle_watch_and_the_launch_pools_at_once():
    """``vm.shutdown`` calls ``backend.release_threads``: the watch would otherwise linger ``_IDLE_SECONDS``, the
    pools' workers for the whole process."""
    from pyflow import vm
    from pyflow.kernels.backend import release_threads

    x = np.zeros(256)
    on_a_thread(add_index[8, 32], x)   # off the main thread: the watch runs
    with sim.configure(tier="compiled", cores=2):
        add_index[8, 32](x)   # on the main thread: a pool's worker runs it
    assert {"pyflow-sim-hang-watch", "pyflow-sim-compiled"} <= _simulator_threads()
    vm.shutdown()
    assert _simulator_threads() == set()
    on_a_thread(add_index[8, 32], x)   # they start again when needed
    assert "pyflow-sim-hang-watch" in _simulator_threads()
    release_threads()
    assert _simulator_threads() == set()
    np.testing.assert_array_equal(x, 3 * np.arange(256.0))


def test_a_launch_watched_just_after_a_release_is_polled_not_spun(monkeypatch):
    """``release`` asks an idle watch to end; a launch that comes before it has ended keeps it, polling every
    ``_POLL_SECONDS`` (a wait), not in a loop with no wait (counted: the watch looks at a launch once a poll)."""
    looks = []
    real_hung = workers.Progress.hung
    monkeypatch.setattr(workers.Progress, "hung", lambda self, now: looks.append(now) or real_hung(self, now))

    def release_came_late():   # release's request, found by the watch while it watches a launch
        while not looks:
            time.sleep(0.001)
        workers._ending = True

    late = threading.Thread(target=release_came_late)
    late.start()
    started = time.monotonic()
    on_a_thread(add_many_times[64, 32], np.zeros(64 * 32), 100_000, cores=1)
    polls = (time.monotonic() - started) / workers._POLL_SECONDS
    late.join()
    assert looks and len(looks) <= 3 * polls + 10, (len(looks), polls)


def test_a_launch_that_does_not_stop_when_told_is_reported_on_stderr(monkeypatch, capfd):
    """A loop in a device function never looks at ``cancel``; here the launch's thread is one that waits."""
    monkeypatch.setattr(workers, "_STOP_SECONDS", 0.2)
    release, worker = threading.Event(), []

    def stuck():
        worker.append(threading.get_ident())
        release.wait(BOUND_SECONDS)

    thread = threading.Thread(target=stuck, name="test-stuck-launch")
    thread.start()
    while not worker:
        time.sleep(0.001)
    cancel = np.zeros(1, np.int64)
    progress = workers.Progress("stuck_kernel", np.full((1, 4), -1, np.int64), cancel, 0.1, worker)
    assert workers.watch(progress)
    try:
        deadline = time.monotonic() + BOUND_SECONDS
        while progress.reported is False:
            assert time.monotonic() < deadline, "no report"
            time.sleep(0.01)
    finally:
        workers.unwatch(progress)
        release.set()
        thread.join()
    assert cancel[0] == 1
    err = capfd.readouterr().err
    assert "'stuck_kernel' made no progress for 0.1 s" in err and "did not stop" in err
    assert "'test-stuck-launch' is stuck" in err and "its thread was at" in err
