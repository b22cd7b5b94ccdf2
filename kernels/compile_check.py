"""Compile every kernel and device function to PTX for sm_90, no GPU needed.

The simulator runs kernels as Python, so it accepts code that numba.cuda cannot
compile (a list comprehension, a Python object in device code, an untyped
global).  This check compiles everything for a real GPU:

    pip install -e ".[ptx]"                     # NVVM, NVRTC, libdevice as wheels
    PYFLOW_CUDA=gpu python -m pyflow.kernels.compile_check

Each kernel family lists its kernels with representative argument types in a
``ptx_cases()`` function.  The check prints one line per case and exits 1 if any
fails.  It first compiles one trivial kernel: if even that fails, the toolkit
wheels are missing, and it prints that once, with the fix, and exits 2 (instead
of one identical failure per case).  Without a GPU, numba still asks "the current device" for its compute
capability when compiling a call to a device function.  For this check only, that
question is answered with sm_90.
"""

from __future__ import annotations

import importlib
import sys
import time
import types as pytypes

from numba import types

from pyflow.kernels import backend

__all__ = ["FAMILIES", "array", "tuple_of", "run", "pretend_sm90", "report", "toolkit_problem", "INSTALL_HINT"]

CC = (9, 0)
INSTALL_HINT = 'pip install -e ".[ptx]"'
FAMILIES = ["pyflow.kernels.examples", "pyflow.kernels.elementwise", "pyflow.kernels.reduce",
            "pyflow.kernels.arg_reduce", "pyflow.kernels.softmax", "pyflow.kernels.matmul",
            "pyflow.kernels.movement", "pyflow.kernels.indexing", "pyflow.kernels.index_add", "pyflow.kernels.scan",
            "pyflow.kernels.sort", "pyflow.kernels.conv", "pyflow.kernels.conv_backward",
            "pyflow.kernels.pool_backward", "pyflow.kernels.optim_update",
            "pyflow.kernels.utask.elementwise",
            "pyflow.kernels.utask.matmul",
            "pyflow.kernels.utask.reduce", "pyflow.kernels.utask.program",
            "pyflow.kernels.utask.cell", "pyflow.kernels.utask.groups", "pyflow.kernels.utask.batched",
            "pyflow.kernels.utask.nasrnn", "pyflow.kernels.utask.scaled_softmax",
            "pyflow.kernels.utask.embedding", "pyflow.kernels.utask.argmax", "pyflow.kernels.utask.seq2seq",
            "pyflow.kernels.utask.resnet", "pyflow.kernels.utask.gating"]


def array(dtype, ndim: int = 1, layout: str = "C"):
    """The numba type of a device array argument (flat storage is 1-D, C)."""
    return types.Array(getattr(types, str(dtype)), ndim, layout)


def tuple_of(ndim: int):
    """The numba type of a shape or strides tuple of ``ndim`` ints."""
    return types.UniTuple(types.int64, ndim)


def _cases():
    for name in FAMILIES:
        module = importlib.import_module(name)
        for case in module.ptx_cases():
            yield name.rsplit(".", 1)[-1], *case


def pretend_sm90() -> None:
    """Without a GPU, answer numba's "current device" question with sm_90 (compiling only)."""
    import numba.cuda.dispatcher as dispatcher

    if not backend._probe_driver()[0]:
        dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=CC)


def _trivial_kernel(x):
    x[0] = 1


def toolkit_problem() -> str | None:
    """None if a trivial kernel compiles to PTX here, else the error, in one line."""
    try:
        backend.cuda.compile_ptx(_trivial_kernel, (array("float32"),), cc=CC)
    except Exception as error:  # noqa: BLE001 - whatever it is, nothing else will compile either
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"{type(error).__name__}: {first}"
    return None


def run() -> int:
    if not backend.is_gpu():
        print("the PTX check needs the real CUDA target: run with PYFLOW_CUDA=gpu", file=sys.stderr)
        return 2
    pretend_sm90()
    problem = toolkit_problem()
    if problem is not None:
        print(f"the PTX check cannot compile even a trivial kernel, so the CUDA toolkit wheels (NVVM, NVRTC, "
              f"libdevice) are missing or broken; install them with: {INSTALL_HINT}  ({problem})", file=sys.stderr)
        return 2

    def compile_case(py_func, argtypes, is_device):
        backend.cuda.compile_ptx(py_func, argtypes, device=is_device, cc=CC)

    return report(((f"{family}.{label}", lambda c=case: compile_case(*c))
                   for family, label, *case in _cases()), "compiled")


def report(checks, what: str) -> int:
    """Run ``(label, check)`` pairs: one ok/FAIL line each, a total; 1 if any failed.

    ``check()`` raises on failure; what it returns (if anything) is printed after ok.
    """
    failures = count = 0
    start = time.perf_counter()
    for label, check in checks:
        count += 1
        try:
            note = check()
            print(f"ok    {label}" + (f" ({note})" if note else ""))
        except Exception as error:  # noqa: BLE001 - report every failure, then exit 1
            failures += 1
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            print(f"FAIL  {label}: {type(error).__name__}: {first}")
    print(f"{count - failures}/{count} {what} to PTX for sm_{CC[0]}{CC[1]} in {time.perf_counter() - start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(run())
