"""No name is read that nothing defines: pyflakes' undefined-name check over every Python file of the repository.

A name nothing defines is a NameError waiting for the line to run: a test helper renamed in one test but still
called by its old name in another reached CI that way, and a runtime act that re-raised an ``except ... as``
name after its block had ended (Python unbinds it) raised a NameError instead of the act's error.  pyflakes
reads the code without running it, so the check costs a second, not a code path that happens to run.
"""

from __future__ import annotations

import pathlib

import pytest

pyflakes_api = pytest.importorskip("pyflakes.api", reason="pyflakes is in the test extra: pip install -e '.[test]'")
from pyflakes import messages  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ("pyflow", "kernels", "tests", "tutorials", "benchmarks")
UNDEFINED = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


class _Collect:
    """A pyflakes reporter that keeps the messages instead of printing them."""

    def __init__(self):
        self.found = []

    def flake(self, message):
        self.found.append(message)

    def unexpectedError(self, filename, msg):
        self.found.append(f"{filename}: {msg}")

    def syntaxError(self, filename, msg, lineno, offset, text):
        self.found.append(f"{filename}:{lineno}: {msg}")


def undefined_names(path: pathlib.Path) -> list:
    reporter = _Collect()
    pyflakes_api.checkPath(str(path), reporter)
    return [str(m) for m in reporter.found if isinstance(m, str) or isinstance(m, UNDEFINED)]


def test_no_python_file_reads_a_name_nothing_defines():
    files = sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)
    assert len(files) > 300, "the check found too few files to be looking in the right place"
    found = [line for path in files for line in undefined_names(path)]
    assert not found, "\n".join(found)


def test_the_check_sees_a_name_left_behind_by_a_rename(tmp_path):
    """The check itself: the NameError that reached CI (a helper renamed, one caller not)."""
    source = tmp_path / "renamed.py"
    source.write_text("def first_wrong_seed():\n    return 1\n\n\ndef test_it():\n    assert wrong_without()\n")
    assert [line.split(": ", 1)[1] for line in undefined_names(source)] == ["undefined name 'wrong_without'"]
