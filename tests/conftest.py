"""Test-suite settings shared by every test module.

* hypothesis profiles: "ci" (the default: derandomized, so every run checks the
  same examples; no deadline, because simulated kernels are slow) and "dev"
  (random examples, more of them).  Pick one with HYPOTHESIS_PROFILE=dev.
* ``@pytest.mark.gpu`` tests are skipped, with the reason shown, unless the
  backend is a real GPU (``PYFLOW_CUDA=gpu``); ``-m gpu`` selects them.
* what a test needs of the devices, marked with ``tests/helpers_devices.py``, is
  decided here, once per test (``pytest_runtest_setup``): ``cuda_devices(n)``
  skips, saying "needs n CUDA devices; this machine has m", where
  ``pyflow.device.ep.device_count("cuda")`` is smaller (the simulator has 8);
  ``emulated_streams`` skips on a GPU, whose streams take no emulated delays;
  ``simulated_block_order`` skips on a GPU, which starts a grid's blocks in its own order.
* ``@pytest.mark.sim_tier("threads")`` runs the test's simulated launches on that one tier
  of the simulator (``kernels/sim/tiers.py``) unless ``PYFLOW_SIM_TIER`` chooses one for
  the run: tests that compare the results of *different* kernels bit for bit (Cocktailer's
  host and compiled executors) need one tier, because ``auto`` may run one kernel threaded
  and the other compiled, and the tiers can round floats differently in the last bit
  (numpy's scalar rules against numba's).
* ``auto``'s counts (``conftest.py`` at the root, for the doctests too): each test starts them afresh, and its
  launch count (``HOT_LAUNCHES``) is off except in modules marked ``@pytest.mark.hot_launches``.
* a test that leaves a ``configure`` block of the simulator open (a thread still inside it) errors, and its
  changes are taken away: they would otherwise hold for every later test (``kernels/sim/settings.py``).
* ``PYFLOW_REQUIRE_EXTRAS=1`` (``.ci/run`` sets it after installing every extra):
  a test that skips fails instead, unless it skips for want of a GPU.  So
  nothing that needs an extra (torch, matplotlib, the PTX toolkit) is silently
  skipped in CI.
* a failed op that a test provoked but never read nor synced is dropped when the
  test ends: left pending, it would be printed at exit and make pytest's exit
  status 1 (pyflow's failure semantics, ``pyflow/_exit.py``).  Tests that care
  about such failures assert them before they end.
"""

import os
import signal

import pytest
from hypothesis import HealthCheck, settings

from pyflow.kernels.backend import describe, is_gpu
from tests.helpers_devices import EMULATED_STREAMS_REASON, SIMULATED_BLOCK_ORDER_REASON, cuda_devices_reason

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=20,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _drop_failures_the_test_left_unseen():
    yield
    from pyflow import vm

    machine = vm.current_vm()
    if machine is not None:
        machine.take_failures()


# skips for want of a GPU, or of more of them, or on a GPU for want of the simulator's emulated streams or
# block order
_ALLOWED_SKIPS = ("needs a real GPU", "a GPU is visible", "+SKIP option", "CUDA devices; this machine has",
                  EMULATED_STREAMS_REASON, SIMULATED_BLOCK_ORDER_REASON)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and os.environ.get("PYFLOW_REQUIRE_EXTRAS", "0") not in ("", "0"):
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if not any(allowed in reason for allowed in _ALLOWED_SKIPS):
            report.outcome = "failed"
            report.longrepr = f"skipped with PYFLOW_REQUIRE_EXTRAS=1 (every extra is installed): {reason}"
    return report


def pytest_configure(config):
    # A suite started in the background by a shell (`pytest &`, nohup) inherits SIGINT ignored; then
    # _thread.interrupt_main() does nothing and the Ctrl-C tests wait for an interrupt that never
    # comes.  They test pyflow's handling of Python's own Ctrl-C, so give them that.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config.addinivalue_line("markers", "cuda_devices(n): needs n CUDA devices (ranks with local tensors on "
                                       "cuda:<rank>); skipped on a machine with fewer (tests/helpers_devices.py)")
    config.addinivalue_line("markers", "sim_tier(name): run the test's simulated launches on one tier of the "
                                       "simulator unless PYFLOW_SIM_TIER chooses (tests/conftest.py)")
    config.addinivalue_line("markers", "emulated_streams: a check that needs the simulator's emulated, randomly "
                                       "delayed CUDA streams; skipped on a GPU (tests/helpers_devices.py)")
    config.addinivalue_line("markers", "simulated_block_order: a check that needs the simulator's order of "
                                       "starting blocks; skipped on a GPU (tests/helpers_devices.py)")


@pytest.fixture(autouse=True)
def _one_simulator_tier(request):
    mark = request.node.get_closest_marker("sim_tier")
    if mark is None or is_gpu() or os.environ.get("PYFLOW_SIM_TIER"):
        yield
        return
    from pyflow.kernels.sim import configure

    with configure(tier=mark.args[0]):
        yield


@pytest.fixture(autouse=True)
def _no_simulator_setting_left_behind():
    """A ``configure`` block a test leaves open (a thread still inside one, a generator never closed) would set
    the simulator for every later test (``kernels/sim/settings.py``): the test errors, naming what it left, and
    the block's changes are taken away."""
    if is_gpu():
        yield
        return
    import importlib

    sim_settings = importlib.import_module("pyflow.kernels.sim.settings")
    before = list(sim_settings._open)
    yield
    with sim_settings._lock:
        left = [changes for entry, changes in sim_settings._open if all(entry is not e for e, _ in before)]
        if left:
            sim_settings._open[:] = before
            sim_settings._current = sim_settings._with_open_changes()
    if left:
        pytest.fail(f"the test left simulator settings changed for the tests after it: configure(...) blocks "
                    f"still open with {left}")


def pytest_runtest_setup(item):
    needed = max((mark.args[0] for mark in item.iter_markers("cuda_devices")), default=0)
    if needed:
        from pyflow.device import ep

        reason = cuda_devices_reason(needed, ep.device_count("cuda"))
        if reason:
            pytest.skip(reason)
    if is_gpu() and item.get_closest_marker("emulated_streams") is not None:
        pytest.skip(EMULATED_STREAMS_REASON)
    if is_gpu() and item.get_closest_marker("simulated_block_order") is not None:
        pytest.skip(SIMULATED_BLOCK_ORDER_REASON)


def pytest_report_header(config):
    return f"pyflow backend: {describe()}"


def pytest_collection_modifyitems(config, items):
    if is_gpu():
        return
    no_gpu = pytest.mark.skip(reason="needs a real GPU (PYFLOW_CUDA=gpu)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(no_gpu)
