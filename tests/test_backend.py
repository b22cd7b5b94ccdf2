"""Backend selection: one decision, before numba.cuda is imported, never fatal without a GPU.

Each case runs in a fresh interpreter, because the choice is made once per process.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from pyflow.kernels.backend import _probe_driver

ROOT = pathlib.Path(__file__).resolve().parents[1]
HAS_DRIVER = _probe_driver()[0]


def python(code: str, **env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PYFLOW_CUDA", "NUMBA_ENABLE"))}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(HAS_DRIVER, reason="checks the no-GPU path")
def test_auto_picks_the_simulator_without_a_driver_and_says_why():
    result = python("import pyflow; print(pyflow.is_simulator(), pyflow.backend_description())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("True CUDA simulator")
    assert "PYFLOW_CUDA=auto" in result.stdout


@pytest.mark.skipif(HAS_DRIVER, reason="checks the no-GPU path")
def test_importing_pyflow_with_gpu_requested_but_no_gpu_does_not_fail():
    result = python("import pyflow, pyflow.kernels; print(pyflow.is_gpu())", PYFLOW_CUDA="gpu")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_sim_is_honoured_even_with_a_driver():
    result = python("import pyflow; from numba.cuda.core import config; "
                    "print(pyflow.is_simulator(), config.ENABLE_CUDASIM)", PYFLOW_CUDA="sim")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "1"]


def test_numba_simulator_variable_means_simulator_under_auto():
    result = python("import pyflow; print(pyflow.is_simulator())", NUMBA_ENABLE_CUDASIM="1")
    assert result.stdout.strip() == "True", result.stderr


def test_unknown_choice_is_a_clear_error():
    result = python("import pyflow", PYFLOW_CUDA="tpu")
    assert result.returncode != 0
    assert "BackendError" in result.stderr and "auto, gpu, sim" in result.stderr


def test_numba_cuda_imported_first_in_the_other_mode_is_a_clear_error():
    result = python("from numba import cuda; import pyflow", NUMBA_ENABLE_CUDASIM="1", PYFLOW_CUDA="gpu")
    assert result.returncode != 0
    assert "BackendError" in result.stderr and "import pyflow first" in result.stderr


def test_numba_cuda_imported_first_in_the_same_mode_is_fine():
    result = python("from numba import cuda; import pyflow; print(pyflow.is_simulator())",
                    NUMBA_ENABLE_CUDASIM="1", PYFLOW_CUDA="sim")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_numba_imported_before_pyflow_still_gets_the_simulator_pyflow_chose():
    """``import numba`` reads the environment once; pyflow's choice must still reach numba.cuda."""
    result = python("import numba; import pyflow; from numba.cuda.core import config; "
                    "x = pyflow.tensor([1.0, 2.0], device='cuda'); "
                    "print(pyflow.is_simulator(), config.ENABLE_CUDASIM, (x + 1).numpy().tolist())",
                    PYFLOW_CUDA="sim")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().split(maxsplit=2) == ["True", "1", "[2.0, 3.0]"]
