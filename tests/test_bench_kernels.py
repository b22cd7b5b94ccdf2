"""The GPU session's scripts do not rot: ``bench_kernels.py --tiny`` runs every section in the simulator,
and ``gpu_session.sh`` parses and runs its steps in order (with a stand-in Python: no GPU here).

Both are for a machine with a GPU (issue 19), which the test suite rarely sees; these tests keep them
working in the meantime.  The benchmark runs in a fresh interpreter with ``PYFLOW_CUDA=sim`` always,
also under a GPU test run: there the real run is the session script's own step.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench_kernels.py"
SESSION = ROOT / "benchmarks" / "gpu_session.sh"
SECTION_TITLES = ["== elementwise", "== reduce_sum", "== matmul", "== barriers", "== eager ops on cuda"]


def _environment(**extra) -> dict:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PYFLOW_CUDA", "NUMBA_ENABLE"))}
    environment.update(PYFLOW_CUDA="sim", **extra)
    return environment


def test_bench_kernels_tiny_runs_every_section_in_the_simulator(tmp_path):
    table = tmp_path / "kernels.txt"
    result = subprocess.run([sys.executable, str(BENCH), "--tiny", "--write", str(table)], cwd=ROOT,
                            env=_environment(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for title in SECTION_TITLES:
        assert title in out, f"section {title!r} missing:\n{out}"
    assert "FAILED" not in out
    assert "SIMULATOR RUN" in out and "ratio is meaningless" in out   # the output says so
    for row in ("add", "relu(x.T)", "all (two-pass)", "grid.sync()", "group_barrier, 2 groups",
                "pyflow threaded VM"):
        assert row in out, f"row {row!r} missing:\n{out}"
    written = table.read_text()
    assert written.startswith("# benchmarks/bench_kernels.py; command:")
    assert "# device: no GPU" in written and "date: " in written
    assert all(title in written for title in SECTION_TITLES)


def test_bench_kernels_rejects_an_unknown_section():
    result = subprocess.run([sys.executable, str(BENCH), "--tiny", "--sections", "matmul,nope"], cwd=ROOT,
                            env=_environment(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "unknown section(s) nope" in result.stderr


def test_gpu_session_script_parses():
    result = subprocess.run(["bash", "-n", str(SESSION)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


FAKE_PYTHON = """#!/bin/bash
echo "$*" >> "$CALLS"
case "$*" in *bench_cocktailer*) sleep "${FAKE_SLEEP:-0}";; esac
exit 0
"""


def _session(tmp_path, mode: str, **extra) -> tuple[subprocess.CompletedProcess, list, str]:
    """Run gpu_session.sh in ``tmp_path`` with a stand-in Python that records its arguments."""
    fake, calls, out = tmp_path / "fakepy", tmp_path / f"calls_{mode}.txt", tmp_path / f"out_{mode}"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    environment = dict(os.environ, PY=str(fake), CALLS=str(calls), OUT=str(out), **extra)
    result = subprocess.run(["bash", str(SESSION), mode], cwd=tmp_path, env=environment, capture_output=True,
                            text=True, timeout=120)
    return result, calls.read_text().splitlines(), (out / "summary.txt").read_text()


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils' timeout")
def test_gpu_session_runs_its_steps_in_order_within_its_budget(tmp_path):
    # 25 s in all, 15 s of it kept as a margin: a few seconds per step, and bench_cocktailer.py outlasts its own
    result, calls, summary = _session(tmp_path, "all", SESSION_SECONDS="25", MIN_STEP_SECONDS="1",
                                      PYTEST_WORKERS="8", FAKE_SLEEP="30")
    assert result.returncode == 1, result.stderr[-3000:]      # bench_cocktailer.py ran out of time
    steps = [line for line in calls if line.startswith(("-m pip", "-m pyflow", "-m pytest", "benchmarks/"))]
    assert [s.split()[0] + " " + s.split()[1] for s in steps] == [
        "-m pip", "-m pyflow", "-m pytest", "benchmarks/bench_kernels.py --write",
        "benchmarks/bench_cocktailer.py --warmup"]
    assert "install --no-deps --no-build-isolation -e ." in steps[0]
    assert "-m gpu or not slow" in steps[2] and " -x" in steps[2] and "-n 8" in steps[2]
    assert "kernels_gpu.txt" in steps[3]
    for name in ("python -m pyflow (demo): exit 0", "pytest (PYFLOW_CUDA=gpu): exit 0", "bench_kernels.py: exit 0",
                 "bench_cocktailer.py: TIMED OUT"):
        assert name in summary, summary
    assert "===== summary.txt =====" in result.stdout

    result, calls, summary = _session(tmp_path, "tests")
    assert result.returncode == 0 and "pytest (PYFLOW_CUDA=gpu): exit 0" in summary
    assert "bench_kernels.py:" not in summary and "bench_cocktailer.py:" not in summary
    result, calls, summary = _session(tmp_path, "bench", COCKTAILER_ARGS="--warmup 1 --repeats 2")
    assert result.returncode == 0 and "bench_kernels.py: exit 0" in summary
    assert "pytest (PYFLOW_CUDA" not in summary and not any(c.startswith("-m pytest") for c in calls)
    assert any(c.startswith("benchmarks/bench_cocktailer.py --warmup 1 --repeats 2") for c in calls)
