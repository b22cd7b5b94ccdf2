"""``benchmarks/eager_floor.py``, the reference ``bench_eager_ops.py`` prints beside PyTorch, computes what
it claims to (the chain's value, with memory given back and reused, instructions in dependence order), and the
benchmark runs and prints its rows.  A floor that skipped work would make pyflow look worse than it is."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("eager_floor", ROOT / "benchmarks" / "eager_floor.py")
floor = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(floor)


@settings(max_examples=20, deadline=None)
@given(n_ops=st.integers(0, 60), size=st.integers(1, 9))
def test_the_floor_computes_the_benchmark_chain_exactly(n_ops, size):
    value, _ = floor.floor_chain(n_ops, size)
    np.testing.assert_array_equal(value, floor.numpy_chain_value(n_ops, size))


def test_the_floor_gives_memory_back_and_reuses_it():
    floor.floor_chain(50, 16)
    _, made = floor.floor_chain(400, 16)   # 400 ops (500 instructions): a few buffers, recycled
    assert made <= 2


def test_the_floor_engine_runs_an_instruction_only_after_the_writers_and_readers_it_depends_on():
    engine, ran = floor.Engine(), []

    def kernel(name):
        def run(*inputs, out):
            ran.append(name)
            out[...] = sum(inputs) + 1 if inputs else 1
        return run

    a, b = floor.Storage(4), floor.Storage(4)
    write_a = floor.Instruction(kernel("write a"), [], [a])
    write_a.waits = 1          # held back: not ready yet (as if its own input were still being made)
    engine.receive(write_a)
    read_a = floor.Instruction(kernel("read a"), [a], [b])      # read after write
    engine.receive(read_a)
    rewrite_a = floor.Instruction(kernel("rewrite a"), [], [a])  # write after write and after read
    engine.receive(rewrite_a)
    assert (read_a.waits, rewrite_a.waits) == (1, 2)
    engine.schedule()
    assert ran == []           # nothing can run before write_a
    write_a.waits = 0
    engine.ready.append(write_a)
    engine.schedule()
    assert ran == ["write a", "read a", "rewrite a"]
    assert b.buffer[0] == 2 and a.buffer[0] == 1


def test_bench_eager_ops_prints_pyflow_torch_and_the_floor():
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PYFLOW_CUDA")}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_eager_ops.py"), "--ops", "300",
                             "--large", "20000", "--large-ops", "4"], cwd=ROOT, env={**environment,
                            "PYFLOW_CUDA": "sim"}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for row in ("pyflow threaded VM", "pyflow step-through", "floor (eager_floor.py)", "pyflow/floor =",
                "pyflow/numpy ="):
        assert row in result.stdout, result.stdout
