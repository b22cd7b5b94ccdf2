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


@pytest.mark.skipif(not _toolkit_installed(), reason='needs the CUDA toolkit wheels: pip install -e ".[ptx]"')
def test_every_kernel_compiles_to_ptx_for_sm90():
    result = _run(["-m", "pyflow.kernels.compile_check"])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "FAIL" not in result.stdout


@pytest.mark.skipif(not _toolkit_installed(), reason='needs the CUDA toolkit wheels: pip install -e ".[ptx]"')
def test_generated_cocktailer_kernels_compile_to_ptx_for_sm90():
    """Loops, while loops, branches, fenced functions, the recursion stack and recursion unroll's block
    groups, as numba.cuda sees them."""
    result = _run(["-m", "pyflow.cocktailer.compile_check"])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "FAIL" not in result.stdout and "6/6 generated kernels compiled" in result.stdout
