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
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from _pytest.doctest import DoctestModule  # pytest's collector; pytest 8 and 9 import through _getobj

ROOT = Path(__file__).resolve().parent
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
