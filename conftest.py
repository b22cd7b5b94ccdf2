"""Doctests: the README's test command also runs every ``>>>`` example in pyflow/ and kernels/.

pyproject.toml turns them on (``--doctest-modules``; testpaths ``tests``, ``pyflow``, ``kernels``;
``doctest_optionflags``).  This file makes pytest import each of those modules once, under the name
it is installed as:

* kernels/ is installed as ``pyflow.kernels`` (``package-dir`` in pyproject.toml).  Left to itself,
  pytest would import kernels/layout.py as a top-level ``kernels.layout``: a second copy of
  ``pyflow.kernels.layout``, whose kernels register twice in the kernel registry.  Here every module
  under pyflow/ and kernels/ is imported by its installed name (``pyflow.kernels.layout``), and must
  be the very file pytest found.
* tests/ has no doctests; its modules are collected as tests only, as before.

tests/test_packaging.py checks that every module with ``>>>`` is collected, under its real name,
except those in ``DOCTEST_EXCLUDED``.

It also sets the simulator's ``auto`` tier (``kernels/sim/tiers.py``) alike for every test and doctest:

* each starts ``auto``'s counts afresh (``tiers.forget_counts``), as a script in a new process would: summed
  over a whole run, the library's elementwise kernels passed ``HOT_WORK`` half-way and every new argument
  type after that compiled (49 compiles, 36 s on a fresh machine), and which tests compiled depended on
  which ran before them;
* the launch count (``HOT_LAUNCHES``: a kernel compiles at its 32nd launch with the same argument types,
  which a training loop repays) is off, except in modules marked ``@pytest.mark.hot_launches``: the suite
  launches hundreds of kernels a few dozen times each, and on CI's cold cache their compiles cost more than
  their threaded launches (five kernel test files: 33 s without the count, 62 s with it, 13 compiles); the
  boxing tests, which repeat the same small launches hundreds of times, keep it (276 -> 162 s).  A doctest
  that launched one kernel 50 times compiled it (6 s cold).  ``tests/test_sim_tiers.py`` tests the rule;
* machine code left in the cache directory by an earlier run (``CACHED_READY``) makes no launch compiled,
  here and in the processes the tests start (``PYFLOW_SIM_REUSE_CACHE=0``): which tier a test's launches
  take, and so the last bits of its floats and the checks it gets, does not depend on what ran on the machine
  before (nor on what the tests before it compiled: in CI's cold cache, the subprocess tests of the second
  half loaded what the first half compiled, 0.1-0.2 s each for numba's CPU target alone).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
from _pytest.doctest import DoctestModule  # pytest's collector; pytest 8 and 9 import through _getobj

ROOT = Path(__file__).resolve().parent
os.environ["PYFLOW_SIM_REUSE_CACHE"] = "0"   # (read when kernels/sim/tiers.py is imported, here and in subprocesses)
# source directory -> the package it is installed as (pyproject.toml, [tool.setuptools])
INSTALLED_AS = {ROOT / "pyflow": "pyflow", ROOT / "kernels": "pyflow.kernels"}

# Modules whose doctests are not collected, each with the reason.  Paths are relative to this file.
# Nothing else is left out: kernels/compile_check.py and pyflow/cocktailer/compile_check.py import
# without the optional GPU toolkit (they need it only when run), and pyflow/trace/plot.py imports
# matplotlib only when it draws.
DOCTEST_EXCLUDED = {
    "pyflow/__main__.py": "the `python -m pyflow` demo script, no examples; pytest never collects a "
                          "__main__.py for doctests anyway (the demo itself sits behind "
                          "`if __name__ == '__main__'`)",
}
collect_ignore = list(DOCTEST_EXCLUDED)


def pytest_configure(config):
    config.addinivalue_line("markers", "hot_launches: keep auto's launch count (tiers.HOT_LAUNCHES) on in this test "
                                       "(conftest.py: off elsewhere in the suite)")


@pytest.fixture(autouse=True)
def _auto_tier_counts_per_test(request, monkeypatch):
    from pyflow.kernels.backend import is_gpu

    if not is_gpu():
        from pyflow.kernels.sim import tiers

        tiers.forget_counts()
        monkeypatch.setattr(tiers, "CACHED_READY", False)
        if request.node.get_closest_marker("hot_launches") is None:
            monkeypatch.setattr(tiers, "HOT_LAUNCHES", 1 << 62)
    yield


def installed_name(path: Path) -> str | None:
    """``kernels/utask/sizes.py`` -> ``pyflow.kernels.utask.sizes``; None outside pyflow/ and kernels/."""
    path = path.resolve()
    for source, package in INSTALLED_AS.items():
        if path.is_relative_to(source):
            parts = path.relative_to(source).with_suffix("").parts
            if parts and parts[-1] == "__init__":
                parts = parts[:-1]
            return ".".join((package, *parts))
    return None


class InstalledModuleDoctests(DoctestModule):
    """The doctests of one module of pyflow/ or kernels/, imported by its installed name."""

    def _getobj(self):
        name = installed_name(self.path)
        module = importlib.import_module(name)
        found = Path(module.__file__).resolve()
        if found != self.path.resolve():
            raise self.CollectError(
                f"{name} is imported from {found}, not from {self.path}: "
                "install this checkout (pip install -e .) to run its doctests")
        return module


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    collectors = yield
    result = []
    for collector in collectors:
        if type(collector) is DoctestModule:
            if installed_name(file_path) is None:
                continue  # tests/ and anything else: no doctests, and no second import
            collector = InstalledModuleDoctests.from_parent(parent, path=file_path)
        result.append(collector)
    return result
