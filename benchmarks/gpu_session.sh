#!/usr/bin/env bash
# pyflow's GPU session (issue 19) as one script: run it from the repository root on a machine with an
# NVIDIA GPU.  It records the machine and the versions, installs pyflow (no network needed), runs the
# test suite on the GPU, then the benchmarks, each step under `timeout` so that the whole run ends
# within about 9.5 minutes, and writes every log under $OUT.
#
#   bash benchmarks/gpu_session.sh [all|tests|bench]      (default: all)
#
#   all    env + pytest (at most 4 min) + bench_kernels.py (at most 130 s) + bench_cocktailer.py (what is left)
#   tests  env + pytest with up to 9 minutes to itself
#   bench  env + bench_kernels.py (at most 4 min) + bench_cocktailer.py (what is left, ~4.5 min)
#
# Through the device tool, from the repository root of a checkout (the working tree travels; files
# written under $OUT come back).  10 minutes a call, and 15 minutes of device time a session IN ALL: the
# machine's start (a few minutes), every call and the idle time between calls.  So one full call, and a
# short second one right after it, while the machine is still warm (a fresh start needs 4 minutes left):
#   run  command="bash benchmarks/gpu_session.sh tests"                      timeout_s=600
#   run  command="SESSION_SECONDS=150 bash benchmarks/gpu_session.sh bench"  timeout_s=180
# (or `bench` first, in full, when its numbers matter more; `all` fits one call but runs a third of the tests)
# What the first session (2026-11-28, one H200, 16 cores) learned:
#   * `tests` needs a call of its own: in `all`, pytest's 240 s ran 1175 of the suite's ~3,300 tests on 14
#     xdist workers; even 540 s may not run them all (PYTEST_ARGS can name test files, e.g.
#     PYTEST_ARGS="--maxfail=100 tests/test_elementwise.py tests/test_conv.py").  pytest now runs on every
#     core by default (pytest-xdist, when the image has it).
#   * bench_cocktailer.py's counts (simulator sizes: many small kernels, each JIT-compiled) took its whole
#     3 minutes; it now times first on a GPU (--sections timing,counts; COCKTAILER_ARGS picks others).
#   * the image's numpy (2.5.2) had no np.row_stack, which numba-cuda 0.30.4 reads when it compiles its
#     first kernel: every kernel failed.  The script puts the alias back (the sitecustomize shim below).
# Environment knobs (prefix them in the command, e.g. "PYTEST_WORKERS=8 bash benchmarks/gpu_session.sh tests"):
#   SESSION_SECONDS   the whole script's budget (default 560); each step is cut to what is left,
#                     and skipped if that is under MIN_STEP_SECONDS (default 20)
#   PYTEST_WORKERS    run pytest on N processes with pytest-xdist (default: the machine's cores, `nproc`,
#                     when xdist is importable; 0: one process, as CI does)
#   TESTS_SECONDS, KERNELS_SECONDS, COCKTAILER_SECONDS   a step's own limit (0: skip bench_kernels.py)
#   BENCH_FIRST       1: run the benchmarks before the tests
#   PYTEST_ARGS       replaces "-x" (e.g. "--maxfail=30" to see more than the first failure)
#   TEST_TIMEOUT      pytest-timeout's limit per test, seconds (default 180; 0: none)
#   KERNELS_ARGS      extra arguments for bench_kernels.py (e.g. "--sections matmul,barriers")
#   COCKTAILER_ARGS   arguments for bench_cocktailer.py (default "--warmup 3 --repeats 10"; add e.g.
#                     "--sections lstm,rae" to pick its sections, in that order)
#   PY                the Python to use (default: the image's python3/python that imports torch; never .venv)
# Files back under $OUT (at most 8): env.log, pytest_gpu.log, pytest_gpu.xml, bench_kernels.log,
# kernels_gpu.txt, bench_cocktailer.log, summary.txt.  The tool's output tail ends with summary.txt.
# The same script runs anywhere with a GPU: without $OUT it writes to ./gpu_out (git-ignore it or
# delete it; never commit GPU numbers that were not measured).

set -u
set -x
MODE="${1:-all}"
case "$MODE" in all|tests|bench) ;; *) echo "usage: $0 [all|tests|bench]" >&2; exit 2 ;; esac

OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0   # small simulator-sized grids: a warning per launch filled the logs

# numpy 2.5 removed np.row_stack (deprecated in 2.0), and numba-cuda 0.30.4 still registers an overload of
# it (numba/cuda/np/arrayobj.py) the first time it compiles a kernel: on the image of 2026-11-28 (numpy
# 2.5.2) every kernel failed with "module 'numpy' has no attribute 'row_stack'".  pyproject.toml wants
# numpy < 2.5, but the image's Python is what the GPU runs.  A sitecustomize.py in a temporary folder on
# PYTHONPATH puts the alias back in every Python started here (pytest's workers included) and does
# nothing where numpy still has it; then it runs the image's own sitecustomize, if there is one.
SHIM_DIR=$(mktemp -d)
trap 'rm -rf -- "$SHIM_DIR"' EXIT
cat >"$SHIM_DIR/sitecustomize.py" <<'SHIM'
# written by benchmarks/gpu_session.sh: numpy.row_stack for numba-cuda 0.30.4 on numpy >= 2.5
import importlib.machinery
import importlib.util
import os
import sys

try:
    import numpy
    if not hasattr(numpy, "row_stack"):
        numpy.row_stack = numpy.vstack
except ImportError:
    pass
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _spec is not None and _spec.loader is not None:   # the image's own sitecustomize, which this one hides
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
SHIM
export PYTHONPATH="$SHIM_DIR${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
DEADLINE=$((START + ${SESSION_SECONDS:-560}))
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
STATUS=0

note() { echo "$*" | tee -a "$SUMMARY"; }

# seconds for the next step: its default, cut to what is left before the deadline (minus a margin)
budget() {
  local want=$1 left=$((DEADLINE - $(date +%s) - 15))
  if [ "$left" -lt "$want" ]; then want=$left; fi
  echo "$want"
}

# step NAME DEFAULT_SECONDS LOG COMMAND...: run under timeout (SIGINT first, so pytest and Python
# print what they have), tee the output to LOG, note the exit status and the time in summary.txt
step() {
  local name=$1 want=$2 log=$3 t rc begin
  shift 3
  t=$(budget "$want")
  if [ "$t" -lt "${MIN_STEP_SECONDS:-20}" ]; then
    note "$name: SKIPPED (only ${t}s left of SESSION_SECONDS)"
    STATUS=1
    return
  fi
  begin=$(date +%s)
  timeout -s INT -k 20 "$t" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    note "$name: TIMED OUT after ${t}s (exit $rc); partial output in $(basename "$log")"
  else
    note "$name: exit $rc in $(($(date +%s) - begin))s (limit ${t}s)"
  fi
  if [ "$rc" -ne 0 ]; then STATUS=1; fi
}

# --- the Python: the image's (it holds torch, cupy, numba-cuda), never the repository's .venv --------
if [ -z "${PY:-}" ]; then
  for candidate in python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import torch" >/dev/null 2>&1; then
      PY=$candidate
      break
    fi
  done
  PY="${PY:-python3}"
fi


# --- the machine, the versions, the install (every command bounded) --------------------------------
VERSIONS='
import importlib
for name in ("numpy", "numba", "numba_cuda", "llvmlite", "torch", "cupy", "pytest", "hypothesis", "xdist",
             "pytest_timeout", "setuptools"):
    try:
        version = getattr(importlib.import_module(name), "__version__", "?")
        print(name.ljust(16), version)
    except Exception as error:
        print(name.ljust(16), "NOT IMPORTABLE:", type(error).__name__, error)
try:
    import torch
    print("torch.cuda", torch.version.cuda, torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
except Exception as error:
    print("torch.cuda:", error)
'
{
  date -u
  timeout 30 nvidia-smi
  timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  command -v "$PY"
  "$PY" --version
  timeout 30 nvcc --version 2>&1 | tail -n 2
  timeout 120 "$PY" -c "$VERSIONS"
  timeout 60 "$PY" -c "from numba import cuda; cuda.detect()"
  timeout 60 "$PY" -c "from numba.cuda.cudadrv.libs import test; test()" 2>&1 | tail -n 40
  timeout 180 "$PY" -m pip install --no-deps --no-build-isolation -e .
  if ! (cd / && timeout 60 "$PY" -c "import pyflow.kernels"); then
    # the editable install failed (e.g. a setuptools older than 77): make pyflow.kernels importable
    # by hand, in the device machine's copy of the tree only (nothing is committed from there)
    echo "pip install -e . FAILED: falling back to PYTHONPATH and a pyflow/kernels symlink"
    ln -sfn ../kernels pyflow/kernels
  fi
} >"$OUT/env.log" 2>&1
if ! (cd / && "$PY" -c "import pyflow.kernels" >/dev/null 2>&1); then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
tail -n 40 "$OUT/env.log"
# a first look: the backend, the devices, two grid-sync kernels, eight training steps (into env.log)
step "python -m pyflow (demo)" 120 "$OUT/demo.log" env PYFLOW_CUDA=gpu "$PY" -m pyflow
cat "$OUT/demo.log" >>"$OUT/env.log"
rm -f "$OUT/demo.log"

# --- the tests on the GPU ------------------------------------------------------------------------------
run_tests() {
  PYTEST_OPTS=(-q -m "gpu or not slow" -p no:cacheprovider -rfE --durations=30 --junitxml="$OUT/pytest_gpu.xml")
  read -r -a EXTRA <<<"${PYTEST_ARGS:--x}"
  PYTEST_OPTS+=(${EXTRA[@]+"${EXTRA[@]}"})
  if [ "${TEST_TIMEOUT:-180}" != 0 ] && "$PY" -c "import pytest_timeout" >/dev/null 2>&1; then
    PYTEST_OPTS+=(--timeout="${TEST_TIMEOUT:-180}")
  fi
  WORKERS="${PYTEST_WORKERS:-$(nproc 2>/dev/null || echo 0)}"
  if [ "$WORKERS" != 0 ] && [ "$WORKERS" != 1 ] && "$PY" -c "import xdist" >/dev/null 2>&1; then
    PYTEST_OPTS+=(-n "$WORKERS")
  fi
  if [ "$MODE" = tests ]; then want=540; else want=240; fi
  step "pytest (PYFLOW_CUDA=gpu)" "${TESTS_SECONDS:-$want}" "$OUT/pytest_gpu.log" \
    env PYFLOW_CUDA=gpu "$PY" -m pytest "${PYTEST_OPTS[@]}"
}

# --- the benchmarks ------------------------------------------------------------------------------------
run_bench() {
  if [ "$MODE" = bench ]; then want=240; else want=130; fi
  if [ "${KERNELS_SECONDS:-$want}" != 0 ]; then
    read -r -a KARGS <<<"${KERNELS_ARGS:-}"
    step "bench_kernels.py" "${KERNELS_SECONDS:-$want}" "$OUT/bench_kernels.log" \
      env PYFLOW_CUDA=gpu "$PY" benchmarks/bench_kernels.py --write "$OUT/kernels_gpu.txt" ${KARGS[@]+"${KARGS[@]}"}
  fi
  read -r -a CARGS <<<"${COCKTAILER_ARGS:---warmup 3 --repeats 10}"
  step "bench_cocktailer.py" "${COCKTAILER_SECONDS:-600}" "$OUT/bench_cocktailer.log" \
    env PYFLOW_CUDA=gpu "$PY" benchmarks/bench_cocktailer.py ${CARGS[@]+"${CARGS[@]}"}
}

# BENCH_FIRST=1: the benchmarks before the tests (when their numbers matter more and time is short)
if [ "${BENCH_FIRST:-0}" = 1 ] && [ "$MODE" != tests ]; then run_bench; fi
if [ "$MODE" != bench ]; then run_tests; fi
if [ "${BENCH_FIRST:-0}" != 1 ] && [ "$MODE" != tests ]; then run_bench; fi

note "mode $MODE: $(($(date +%s) - START))s in all; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
set +x
echo "===== summary.txt ====="
cat "$SUMMARY"
exit "$STATUS"
