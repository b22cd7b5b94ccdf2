"""What ``cuda`` means inside a simulated kernel: per-block shared memory, real barriers.

Numba's simulator runs a kernel as plain Python with the name ``cuda`` bound to a
``FakeCUDAModule``; ``cuda.threadIdx`` etc. read attributes of the current Python
thread.  pyflow keeps that design and changes the parts that assume one block runs
at a time:

* ``cuda.shared`` returns the *current thread's block's* shared memory, so every
  block has its own (the stock simulator shares one among all blocks, which is
  harmless only because it runs blocks one after another);
* ``cuda.syncthreads()`` and ``cuda.cg.this_grid().sync()`` go to the barriers of
  ``grid.GridRun``, which knows every thread of every block;
* shared and local arrays start filled with the byte 0xCD, as a reminder that
  CUDA does not zero them (a kernel that reads before writing sees garbage).

Shared arrays are identified by the bytecode position of the ``cuda.shared.array``
call, so two calls on one source line no longer alias (a stock limitation).

``sim_math`` stands in for the ``math`` module inside kernels: the same names,
but IEEE results like a GPU's (``math.log(0.0)`` is ``-inf``, ``math.sqrt(-1.0)``
is ``nan``) where Python's ``math`` would raise.
"""

from __future__ import annotations

import math
import sys
import threading
import time
import types

import numpy as np
from numba.core import types as _numba_types
from numba.cuda.simulator.kernelapi import FakeCUDAModule

from pyflow.kernels.backend import cuda as _real_cuda

__all__ = ["SimCudaModule", "SharedMemory", "to_numpy_dtype", "garbage_array"]

UNINITIALIZED_BYTE = 0xCD
# cuda.float32, cuda.int64, ...: the type names the real module has, so kernels
# may write cuda.shared.array(n, cuda.float32) on both backends.
_TYPE_NAMES = {k: v for k, v in vars(_real_cuda).items() if isinstance(v, _numba_types.Type)}


def to_numpy_dtype(dtype) -> np.dtype:
    """Accept numpy dtypes, Python types and Numba types (``float32``...)."""
    try:
        return np.dtype(dtype)
    except TypeError:
        return np.dtype(str(dtype))


def garbage_array(shape, dtype) -> np.ndarray:
    """An array of ``shape`` whose bytes are all 0xCD, like fresh GPU memory in a debugger."""
    a = np.empty(shape, to_numpy_dtype(dtype))
    a.view(np.uint8).fill(UNINITIALIZED_BYTE) if a.size else None
    return a


def _ieee(numpy_function):
    def function(*args):
        return numpy_function(*args).item()
    function.__name__ = numpy_function.__name__
    return function


# Python's math raises on domain errors and overflow; the GPU returns inf/nan.
_NUMPY_TWINS = {
    "exp": np.exp, "expm1": np.expm1, "log": np.log, "log2": np.log2, "log10": np.log10,
    "log1p": np.log1p, "sqrt": np.sqrt, "pow": np.power, "sin": np.sin, "cos": np.cos,
    "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh,
    "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh,
    "atanh": np.arctanh, "atan2": np.arctan2, "hypot": np.hypot, "fmod": np.fmod,
}
sim_math = types.SimpleNamespace(**{name: getattr(math, name) for name in dir(math) if not name.startswith("_")})
for _name, _twin in _NUMPY_TWINS.items():
    setattr(sim_math, _name, _ieee(_twin))


class SharedMemory:
    """One block's ``cuda.shared``: static arrays by call site, plus the dynamic buffer."""

    def __init__(self, dynamic_bytes: int):
        self._arrays: dict = {}
        self._lock = threading.Lock()
        self._dynamic = garbage_array(dynamic_bytes, np.uint8)

    def array(self, shape, dtype, alignment=None):
        dtype = to_numpy_dtype(dtype)
        if shape == 0 or shape == (0,):
            # Dynamic shared memory: every such array views the same bytes.
            count = self._dynamic.size // dtype.itemsize
            return self._dynamic[: count * dtype.itemsize].view(dtype)
        caller = sys._getframe(1)
        key = (caller.f_code, caller.f_lasti)
        found = self._arrays.get(key)
        if found is None:
            with self._lock:  # the first thread of the block to get here creates it
                found = self._arrays.get(key)
                if found is None:
                    found = self._arrays[key] = garbage_array(shape, dtype)
        return found


class _Local:
    def array(self, shape, dtype, alignment=None):
        return garbage_array(shape, dtype)


class _GridGroup:
    def sync(self):
        thread = threading.current_thread()
        thread.sim_grid.grid_barrier(thread)


class _CooperativeGroups:
    def this_grid(self):
        return _GridGroup()


class SimCudaModule(FakeCUDAModule):
    """The ``cuda`` seen by kernels of one simulated launch."""

    def __init__(self, grid_dim, block_dim):
        super().__init__(grid_dim, block_dim, 0)
        self.__dict__.update(_TYPE_NAMES)
        self._cg = _CooperativeGroups()
        self._local = _Local()

    @property
    def shared(self):
        return threading.current_thread().block.shared

    def syncthreads(self):
        thread = threading.current_thread()
        thread.sim_grid.block_barrier(thread)

    def syncthreads_count(self, value):
        thread = threading.current_thread()
        return thread.sim_grid.block_vote(thread, value, np.count_nonzero)

    def syncthreads_and(self, value):
        thread = threading.current_thread()
        return int(thread.sim_grid.block_vote(thread, value, np.all))

    def syncthreads_or(self, value):
        thread = threading.current_thread()
        return int(thread.sim_grid.block_vote(thread, value, np.any))

    def nanosleep(self, ns):
        # Spin-wait loops should call this; it lets other simulated threads run.
        time.sleep(0)
