"""Launch helpers: the one place that picks grid and block sizes and builds launchers.

* ``elementwise_config(n)`` - blocks and threads for ``n`` independent items
  processed with a grid-stride loop.  On a GPU: 256 threads per block and enough
  blocks to fill the device, capped (the loop covers the rest).  In the
  simulator's threaded tier every CUDA thread is a Python thread, so a small grid
  (at most ``SIM_MAX_BLOCKS`` x ``SIM_MAX_THREADS``) runs the same loop much
  faster; a launch for the compiled tier (``compiled_launch``) gets the GPU's grid:
  there threads run one after another, and neighbouring threads touching
  neighbouring elements is what keeps the loop in the CPU's cache (two blocks of
  32 threads striding over 1M floats run 2-3 times slower).
* ``rows_config(rows, width)`` - one block per row (reductions, softmax), the block
  a power of two no wider than the row needs.  A simulated launch that will run on
  the compiled tier (``compiled_launch``) gets a GPU's number of blocks: there a
  block costs no Python thread, and each block-level step of the kernel costs one
  step of the tier's control machine whatever the number of blocks it serves.
  In the simulator a row's block is ``SIM_ROW_THREADS`` wide on both tiers (the
  same block, so the same order of additions, so the same bits on both): there a
  block's threads take turns, so a row's shared-memory tree (log2(block) barriers,
  each a pass over the block's threads) is overhead that a narrower block shrinks,
  while the row's elements cost the same however many threads share them (a
  1024-wide softmax on the compiled tier: 32 threads 1.3 times slower than 8).
* ``launcher(kernel, grid, block, stream)`` - ``kernel[grid, block, stream]`` built
  once and cached, as numba-cuda recommends for launch overhead.
* ``one_operation(work)`` - the launches inside are parts of one operation of
  ``work`` items, which ``compiled_launch`` judged: in the simulator each then
  runs on the tier the whole operation gets (a reduction's one-block final pass
  would otherwise run threaded after a compiled first pass); nothing on a GPU.
* ``require_device_arrays(op, *arrays)`` - CUDA launchers take device arrays
  only: a numpy array would be copied to the device and back at every launch.
"""

from __future__ import annotations

import contextlib
import functools
import math

import numpy as np

from pyflow.errors import DTypeError
from pyflow.kernels.backend import is_simulator
from pyflow.kernels.layout import is_device_array

__all__ = ["elementwise_config", "rows_config", "launcher", "one_operation", "require_device_arrays", "compiled_launch",
           "GPU_THREADS", "GPU_MAX_BLOCKS", "SIM_MAX_THREADS", "SIM_MAX_BLOCKS", "SIM_ROW_THREADS"]

GPU_THREADS = 256
GPU_MAX_BLOCKS = 4096          # enough to fill an H100 (132 SMs x 8 blocks x 4 waves)
SIM_MAX_THREADS = 32
SIM_MAX_BLOCKS = 2
SIM_ROW_THREADS = 8   # rows_config's block in the simulator, on both tiers (see the module docstring)


def elementwise_config(n: int, dtypes=()) -> tuple[int, int]:
    """(blocks, threads) for a grid-stride loop over ``n >= 1`` items of arrays of ``dtypes``."""
    if is_simulator() and not compiled_launch(n, dtypes):
        threads = min(SIM_MAX_THREADS, n)
        return min(SIM_MAX_BLOCKS, math.ceil(n / threads)), threads
    return min(GPU_MAX_BLOCKS, math.ceil(n / GPU_THREADS)), GPU_THREADS


def compiled_launch(work: int, dtypes=()) -> bool:
    """Will a simulated launch of ``work`` (its largest array's elements) run on the compiled tier?

    What ``kernels/sim/tiers.py`` decides for a launch of that size (always False on a GPU).
    Arrays of float16 (``dtypes``, as far as the caller knows them) stay threaded: numba has
    no float16 on the CPU, and a GPU-sized grid of Python threads would take minutes.
    """
    if not is_simulator() or any(np.dtype(d) == np.float16 for d in dtypes):
        return False
    from pyflow.kernels.sim import settings, tiers

    tier = settings().tier
    return tier == "compiled" or (tier == "auto" and work >= tiers.BIG_WORK)


@contextlib.contextmanager
def one_operation(work: int):
    """Launches inside belong to one operation of ``work`` items (see the module docstring)."""
    if not is_simulator():
        yield
        return
    from pyflow.kernels.sim import tiers

    with tiers.operation_work(work):
        yield


def rows_config(rows: int, width: int, max_threads: int | None = None, dtypes=()) -> tuple[int, int]:
    """(blocks, threads): a block per row (grid-stride over rows), threads a power of two."""
    cap = max_threads or (SIM_ROW_THREADS if is_simulator() else GPU_THREADS)
    threads = 1
    while threads < min(width, cap):
        threads *= 2
    few = is_simulator() and not compiled_launch(rows * width, dtypes)
    blocks = min(rows, SIM_MAX_BLOCKS if few else GPU_MAX_BLOCKS)
    return max(blocks, 1), threads


@functools.lru_cache(maxsize=4096)
def _cached(kernel, grid, block, stream, dynshared):
    return kernel[grid, block, stream, dynshared]


def launcher(kernel, grid, block, stream=0, dynshared: int = 0):
    """``kernel[grid, block, stream, dynshared]``, built once per configuration."""
    try:
        return _cached(kernel, grid, block, stream, dynshared)
    except TypeError:  # an unhashable stream object: build it now
        return kernel[grid, block, stream, dynshared]


def require_device_arrays(op: str, *arrays) -> None:
    """``DTypeError`` unless every array is a device array (no hidden host copies)."""
    for array in arrays:
        if not is_device_array(array):
            raise DTypeError(f"{op} (cuda): expected device arrays, got {type(array).__name__}; "
                             "move data with cuda.to_device or an ep stream copy first")
