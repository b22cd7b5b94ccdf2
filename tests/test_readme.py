"""The README's Python examples run as written (each top-level ```python block, in a fresh namespace).

Indented blocks are fragments inside a list (a ``breakpoint()`` guard, for one);
they are shown, not run.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = [(text[: text.index("\n")] if "\n" in text else text, text)
          for text in re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)]


def test_the_readme_has_examples_to_run():
    assert len(BLOCKS) >= 5


def _tiers_of_a_fresh_process(code: str):
    """Cocktailer's example compares its two executors bit for bit, as a fresh process runs them: each small
    launch on the simulator's threaded tier.  Late in a test session ``auto`` has compiled some of the host
    executor's kernels (at their 32nd launch), whose float math may differ in the last bit; so that example
    runs on the threaded tier here, as Cocktailer's tests do."""
    from pyflow.kernels.backend import is_simulator

    if "ck.compile(" not in code or not is_simulator() or os.environ.get("PYFLOW_SIM_TIER"):
        return contextlib.nullcontext()
    from pyflow.kernels.sim import configure

    return configure(tier="threads")


@pytest.mark.parametrize("first_line, code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_each_readme_example_runs(first_line, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # the files an example writes (a checkpoint) land in a fresh directory
    with contextlib.redirect_stdout(io.StringIO()), _tiers_of_a_fresh_process(code):
        exec(compile(code, f"README.md ({first_line})", "exec"), {"__name__": "readme"})  # noqa: S102
