"""Which CUDA pyflow runs on: a real GPU, or Numba's CUDA simulator.

This is the one module that decides, and the one module that imports
``numba.cuda``; every other module gets ``cuda`` from here::

    from pyflow.kernels.backend import cuda

The decision is made once, at import, from ``PYFLOW_CUDA``:

``auto`` (default)
    a GPU when a CUDA driver answers with at least one device, else the simulator;
``gpu``
    the real CUDA target (kernels fail to launch if there is no GPU);
``sim``
    Numba's CUDA simulator, extended by ``pyflow.kernels.sim`` with a launch in
    which all blocks run at once and grid barriers are real.

The simulator has to be chosen before ``numba.cuda`` is first imported
(Numba reads ``NUMBA_ENABLE_CUDASIM`` then).  If something imported it earlier in
the other mode, this module raises ``BackendError`` instead of guessing.
Probing the driver uses ``ctypes`` only, so importing pyflow never fails on a
machine without a GPU.
"""

from __future__ import annotations

import ctypes
import os
import sys

from pyflow.errors import BackendError

__all__ = ["cuda", "MODE", "REASON", "is_simulator", "is_gpu", "describe", "release_threads"]

_CHOICES = ("auto", "gpu", "sim")


def _probe_driver() -> tuple[bool, str]:
    """Ask the CUDA driver (through ctypes, not Numba) how many GPUs it sees."""
    names = ["nvcuda.dll"] if sys.platform == "win32" else ["libcuda.so.1", "libcuda.so", "libcuda.dylib"]
    lib = None
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        return False, "no CUDA driver library found"
    try:
        if lib.cuInit(0) != 0:
            return False, "the CUDA driver is present but cuInit failed (no usable GPU)"
        count = ctypes.c_int(0)
        if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
            return False, "the CUDA driver reports no GPU"
    except AttributeError:
        return False, "the CUDA driver library lacks cuInit"
    return True, f"CUDA driver reports {count.value} GPU(s)"


def _decide() -> tuple[str, str]:
    """Return ("gpu" | "sim", reason) from PYFLOW_CUDA and the driver probe."""
    wanted = os.environ.get("PYFLOW_CUDA", "auto").strip().lower() or "auto"
    if wanted not in _CHOICES:
        raise BackendError(f"PYFLOW_CUDA={wanted!r} is not one of {', '.join(_CHOICES)}")
    if wanted == "sim":
        return "sim", "PYFLOW_CUDA=sim"
    if wanted == "gpu":
        return "gpu", "PYFLOW_CUDA=gpu"
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return "sim", "NUMBA_ENABLE_CUDASIM is set"
    found, why = _probe_driver()
    return ("gpu" if found else "sim"), f"PYFLOW_CUDA=auto: {why}"


MODE, REASON = _decide()

if "numba.cuda" in sys.modules:
    # Someone imported numba.cuda first: we can only accept the mode it chose.
    from numba.cuda.core import config as _numba_config

    _already_sim = bool(_numba_config.ENABLE_CUDASIM)
    if _already_sim != (MODE == "sim"):
        raise BackendError(
            f"numba.cuda was imported before pyflow in {'simulator' if _already_sim else 'GPU'} "
            f"mode, but pyflow selected {MODE!r} ({REASON}); import pyflow first or set "
            "PYFLOW_CUDA to match"
        )
else:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if MODE == "sim" else "0"
    if "numba.core.config" in sys.modules:
        # ``import numba`` came first: numba read its environment then, and numba.cuda reads
        # numba's config (not the environment) when it is imported.  Without this reload a
        # program that imports numba before pyflow gets the real CUDA target under a pyflow
        # that believes it is simulating.
        sys.modules["numba.core.config"].reload_config()

from numba import cuda  # noqa: E402  (must follow the environment set-up above)


def is_simulator() -> bool:
    """True when kernels run in the (pyflow-extended) CUDA simulator."""
    return MODE == "sim"


def is_gpu() -> bool:
    """True when kernels run on a real GPU."""
    return MODE == "gpu"


def release_threads() -> None:
    """End the threads the simulator keeps between launches and has no work for now (its compiled tier's
    hang watch and launch pools: ``sim/workers.py``); a later launch starts them again.  Nothing on a GPU.
    ``pyflow.vm.shutdown`` calls it, so no pyflow thread outlives a shutdown."""
    if MODE == "sim":
        from pyflow.kernels.sim import workers

        workers.release()


def describe() -> str:
    """One line for humans: which backend is active and why."""
    what = "CUDA simulator (pyflow concurrent-grid launch)" if MODE == "sim" else "GPU (numba-cuda)"
    return f"{what}; chosen because {REASON}"
