"""Every kernel compiles for a real GPU (sm_90), checked without one."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest

from pyflow.kernels.compile_check import FAMILIES

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(code_or_module: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYFLOW_CUDA="gpu")
    return subprocess.run([sys.executable, *code_or_module], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)


def _toolkit_installed() -> bool:
    probe = ("from cuda.pathfinder import load_nvidia_dynamic_lib as load; "
             "load('nvrtc'); load('nvvm')")
    return _run(["-c", probe]).returncode == 0


def _defines_kernels(path: pathlib.Path) -> bool:
    """Does the module decorate a function with ``@jit`` or ``@jit(...)`` (not device=True)?"""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                call = decorator if isinstance(decorator, ast.Call) else None
                name = (call.func if call else decorator)
                device = call and any(k.arg == "device" for k in call.keywords)
                if isinstance(name, ast.Name) and name.id == "jit" and not device:
                    return True
    return False


def test_every_module_with_kernels_is_in_the_compile_check():
    defining = {".".join(("pyflow", "kernels", *p.relative_to(ROOT / "kernels").with_suffix("").parts))
                for p in (ROOT / "kernels").rglob("*.py") if "sim" not in p.parts and _defines_kernels(p)}
    assert defining, "found no kernels at all: the scan is broken"
    assert defining <= set(FAMILIES), f"add to compile_check.FAMILIES: {sorted(defining - set(FAMILIES))}"


def test_without_the_toolkit_the_check_says_so_once_and_names_the_fix():
    """Every compile failing (here: made to fail) is one line with the pip command and exit code 2,
    not one identical failure per case."""
    code = ("import sys; from pyflow.kernels import backend, compile_check\n"
            "def missing(*args, **kwargs):\n"
            "    raise OSError('Failure finding libnvrtc.so.13')\n"
            "backend.cuda.compile_ptx = missing\n"
            "sys.exit(compile_check.run())")
    result = _run(["-c", code])
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert 'pip install -e ".[ptx]"' in result.stderr and "libnvrtc" in result.stderr
    assert "FAIL" not in result.stdout and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(not _toolkit_installed(), reason='needs the CUDA toolkit wheels: pip install -e ".[ptx]"')
def test_every_kernel_compiles_to_ptx_for_sm90():
    result = _run(["-m", "pyflow.kernels.compile_check"])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "FAIL" not in result.stdout


@pytest.mark.skipif(not _toolkit_installed(), reason='needs the CUDA toolkit wheels: pip install -e ".[ptx]"')
def test_one_kernel_with_softmaxes_of_two_widths_and_a_sum_compiles_to_ptx():
    """Regression: ``block_reduce`` owned a shared array and was reached from three row uTasks, so numba-cuda
    linked its module (and defined the array) more than once and NVVM answered ERROR_INVALID_IR."""
    result = _run(["-m", "pyflow.cocktailer.compile_check", "row_ops"])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "ok    row_ops" in result.stdout and "1/1 generated kernels compiled" in result.stdout


@pytest.mark.skipif(not _toolkit_installed(), reason='needs the CUDA toolkit wheels: pip install -e ".[ptx]"')
def test_functions_not_inlined_calling_the_kernels_shared_memory_utasks_compile_to_ptx():
    """Regression: with ``inline=False`` a function uTask's device function and the kernel both called the tiled
    linear and the row softmax (uTasks declaring shared arrays), so the kernel's PTX module defined their shared
    arrays twice and NVVM answered ERROR_INVALID_IR; each device function now calls private copies.  The same
    program runs in the simulator against numpy in ``tests/test_cocktailer_functions.py``."""
    result = _run(["-m", "pyflow.cocktailer.compile_check", "functions_share_utasks_not_inlined"])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "ok    functions_share_utasks_not_inlined" in result.stdout
    assert "1/1 generated kernels compiled" in result.stdout


@pytest.mark.skipif(not _toolkit_installed(), reason='needs the CUDA toolkit wheels: pip install -e ".[ptx]"')
def test_generated_cocktailer_kernels_compile_to_ptx_for_sm90():
    """Loops, while loops, branches, fenced functions (nested, sharing shared-memory uTasks), the recursion
    stack (with loops inside the recursive function) and recursion unroll's block groups (nested two
    levels), row reductions of several shapes in one kernel, the LSTM, NASRNN, Attention, Seq2seq,
    BlockDrop and SkipNet models (handed to Cocktailer's check by ``pyflow.models.compile_check``), as
    numba.cuda sees them."""
    result = _run(["-m", "pyflow.models.compile_check"])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "FAIL" not in result.stdout and "15/15 generated kernels compiled" in result.stdout
