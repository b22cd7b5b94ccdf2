"""The GPU session's scripts do not rot: ``bench_kernels.py --tiny`` runs every section in the simulator,
``bench_cocktailer.py`` runs the sections asked for (timing first on a GPU), and ``gpu_session.sh``
parses and runs its steps in order (with a stand-in Python: no GPU here).

Both are for a machine with a GPU (issue 19), which the test suite rarely sees; these tests keep them
working in the meantime.  The benchmark runs in a fresh interpreter with ``PYFLOW_CUDA=sim`` always,
also under a GPU test run: there the real run is the session script's own step.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
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


@pytest.mark.slow   # ~35 s on a fresh machine (every section's kernels compiled cold); CI's slow stage runs it
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


COCKTAILER = ROOT / "benchmarks" / "bench_cocktailer.py"


def _bench_cocktailer():
    spec = importlib.util.spec_from_file_location("bench_cocktailer", COCKTAILER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_cocktailer_times_first_on_a_gpu_and_counts_only_in_the_simulator():
    choose = _bench_cocktailer().sections_to_run
    timing = ["lstm", "rae", "nasrnn", "seq2seq", "cnn"]
    assert choose(None, gpu=False) == ["counts"]              # the simulator's run is unchanged
    assert choose(None, gpu=True) == [*timing, "counts"]      # the GPU's timing table first
    assert choose("rae,counts,timing", gpu=True) == ["rae", "counts", "lstm", "nasrnn", "seq2seq", "cnn"]
    for bad in ("counts,nope", ",", "timings"):
        with pytest.raises(ValueError, match="unknown section"):
            choose(bad, gpu=True)


def test_bench_cocktailer_runs_only_the_sections_asked_for():
    result = subprocess.run([sys.executable, str(COCKTAILER), "--sections", "lstm,rae"], cwd=ROOT,
                            env=_environment(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "sections: lstm,rae" in result.stdout and "(lstm,rae skipped)" in result.stdout   # no GPU to time on
    assert "== per-call counts" not in result.stdout
    result = subprocess.run([sys.executable, str(COCKTAILER), "--sections", "counts,nope"], cwd=ROOT,
                            env=_environment(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "unknown section(s) nope" in result.stderr


def test_gpu_session_script_parses():
    result = subprocess.run(["bash", "-n", str(SESSION)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# The stand-in Python records its arguments, and keeps a copy of the sitecustomize.py it finds on PYTHONPATH.
FAKE_PYTHON = """#!/bin/bash
echo "$*" >> "$CALLS"
for folder in ${PYTHONPATH//:/ }; do
  if [ -f "$folder/sitecustomize.py" ]; then cp "$folder/sitecustomize.py" "$SHIM_COPY"; break; fi
done
case "$*" in *bench_cocktailer*) sleep "${FAKE_SLEEP:-0}";; esac
exit 0
"""


def session_knobs() -> set:
    """Every variable gpu_session.sh reads with a default (``${NAME:-...}``): its knobs, which the tests set
    themselves.  Inherited, they would change what the script runs (a GPU session's PYTEST_ARGS did)."""
    return set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):-", SESSION.read_text()))


def _session(tmp_path, mode: str, **knobs) -> tuple[subprocess.CompletedProcess, list, str]:
    """Run gpu_session.sh in ``tmp_path`` with a stand-in Python that records its arguments, every knob of the
    script cleared from the environment but ``knobs``."""
    fake, calls, out = tmp_path / "fakepy", tmp_path / f"calls_{mode}.txt", tmp_path / f"out_{mode}"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    calls.unlink(missing_ok=True)   # this run's calls only
    environment = {k: v for k, v in os.environ.items() if k not in session_knobs()}
    environment.update(PY=str(fake), CALLS=str(calls), OUT=str(out), SHIM_COPY=str(tmp_path / "shim.py"), **knobs)
    result = subprocess.run(["bash", str(SESSION), mode], cwd=tmp_path, env=environment, capture_output=True,
                            text=True, timeout=120)
    return result, calls.read_text().splitlines(), (out / "summary.txt").read_text()


def test_the_session_knobs_the_tests_clear_are_the_ones_the_script_reads():
    knobs = session_knobs()
    assert {"SESSION_SECONDS", "MIN_STEP_SECONDS", "PYTEST_WORKERS", "PYTEST_ARGS", "TEST_TIMEOUT", "KERNELS_ARGS",
            "COCKTAILER_ARGS", "OUT"} <= knobs, knobs
    header = SESSION.read_text().split("\nset -u")[0]
    assert all(k in header for k in knobs), "a knob the header does not document"


@pytest.mark.slow   # it spends its 25 s budget's first 10 s by design; CI's slow stage runs it
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
    pytest_call = next(c for c in calls if c.startswith("-m pytest"))
    cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    workers = f" -n {cores}" if cores not in ("", "1") else ""   # xdist "imports" here: on every core by default
    assert pytest_call.endswith(workers) and " -x" in pytest_call, pytest_call
    result, calls, summary = _session(tmp_path, "tests", PYTEST_WORKERS="0")
    assert " -n " not in next(c for c in calls if c.startswith("-m pytest"))
    result, calls, summary = _session(tmp_path, "bench", COCKTAILER_ARGS="--warmup 1 --repeats 2")
    assert result.returncode == 0 and "bench_kernels.py: exit 0" in summary
    assert "pytest (PYFLOW_CUDA" not in summary and not any(c.startswith("-m pytest") for c in calls)
    assert any(c.startswith("benchmarks/bench_cocktailer.py --warmup 1 --repeats 2") for c in calls)


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils' timeout")
def test_gpu_session_gives_every_python_numpy_row_stack(tmp_path):
    """numba-cuda 0.30.4 reads ``np.row_stack`` when it compiles its first kernel; numpy 2.5 has none.  The
    script's sitecustomize, on PYTHONPATH for every step, puts it back, and leaves a numpy that has it alone."""
    _session(tmp_path, "tests")
    shim = tmp_path / "shim.py"
    assert shim.exists(), "no sitecustomize.py on the steps' PYTHONPATH"
    (tmp_path / "shim").mkdir()
    (tmp_path / "shim" / "sitecustomize.py").write_text(shim.read_text())
    (tmp_path / "numpy25" / "numpy").mkdir(parents=True)      # a numpy without row_stack, as 2.5's
    (tmp_path / "numpy25" / "numpy" / "__init__.py").write_text("def vstack(arrays):\n    return 'vstack'\n")
    check = "import numpy; print(numpy.row_stack is numpy.vstack, hasattr(numpy, '__version__'))"
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}   # no shim (the GPU session has one)
    has_it = subprocess.run([sys.executable, "-c", "import numpy; print(hasattr(numpy, 'row_stack'))"], env=bare,
                            capture_output=True, text=True, timeout=60, cwd=tmp_path).stdout.strip()
    installed = "False True" if has_it == "True" else "True True"   # numpy < 2.5 keeps its own; 2.5 gets vstack
    for numpy_folder, expected in ((tmp_path / "numpy25", "True False"), (None, installed)):
        path = [str(tmp_path / "shim")] + ([str(numpy_folder)] if numpy_folder else [])
        result = subprocess.run([sys.executable, "-c", check], env=dict(os.environ, PYTHONPATH=os.pathsep.join(path)),
                                capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert result.stdout.split() == expected.split(), result.stdout + result.stderr
