"""Launch-configuration checks shared by the GPU and the simulator.

Real CUDA rejects a grid with 0 blocks or a block of more than 1024 threads;
Numba's stock simulator accepts both silently.  pyflow checks every launch here,
on both backends, so a bad configuration fails the same way everywhere:

>>> validate_launch(4, 128)
((4, 1, 1), (128, 1, 1))
>>> validate_launch(0, 32)
Traceback (most recent call last):
...
pyflow.errors.LaunchConfigError: launch of kernel '?' with grid (0, 1, 1): every grid dimension needs at least 1 block
"""

from __future__ import annotations

import numbers

from pyflow.errors import LaunchConfigError

MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIM = (1024, 1024, 64)
MAX_GRID_DIM = (2**31 - 1, 65535, 65535)
# Without an opt-in attribute a block may use 48 KiB of dynamic shared memory.
MAX_DYNAMIC_SHARED_BYTES = 48 * 1024

Dim = tuple[int, int, int]


def normalize_dims(dims, what: str, kernel: str = "?") -> Dim:
    """Turn an int or a 1-3 tuple of ints into an (x, y, z) triple, or raise."""
    if isinstance(dims, numbers.Integral) and not isinstance(dims, bool):
        dims = (int(dims),)
    if not isinstance(dims, (tuple, list)) or not 1 <= len(dims) <= 3:
        raise LaunchConfigError(
            f"launch of kernel {kernel!r}: {what} must be an int or a tuple of 1-3 ints, got {dims!r}"
        )
    for d in dims:
        if not isinstance(d, numbers.Integral) or isinstance(d, bool):
            raise LaunchConfigError(
                f"launch of kernel {kernel!r}: {what} {tuple(dims)!r} contains {d!r}, which is not an int"
            )
    x, y, z = (tuple(int(d) for d in dims) + (1, 1))[:3]
    return x, y, z


def validate_launch(grid, block, dynamic_shared_bytes: int = 0, kernel: str = "?") -> tuple[Dim, Dim]:
    """Check a launch the way the CUDA driver would; return normalized (grid, block)."""
    g = normalize_dims(grid, "grid", kernel)
    b = normalize_dims(block, "block", kernel)
    if min(g) < 1:
        raise LaunchConfigError(
            f"launch of kernel {kernel!r} with grid {g}: every grid dimension needs at least 1 block"
        )
    if min(b) < 1:
        raise LaunchConfigError(
            f"launch of kernel {kernel!r} with block {b}: every block dimension needs at least 1 thread"
        )
    threads = b[0] * b[1] * b[2]
    if threads > MAX_THREADS_PER_BLOCK:
        raise LaunchConfigError(
            f"launch of kernel {kernel!r} with block {b} = {threads} threads: "
            f"CUDA allows at most {MAX_THREADS_PER_BLOCK} threads per block"
        )
    for axis, (n, limit) in enumerate(zip(b, MAX_BLOCK_DIM)):
        if n > limit:
            raise LaunchConfigError(
                f"launch of kernel {kernel!r}: block dimension {'xyz'[axis]} = {n} exceeds {limit}"
            )
    for axis, (n, limit) in enumerate(zip(g, MAX_GRID_DIM)):
        if n > limit:
            raise LaunchConfigError(
                f"launch of kernel {kernel!r}: grid dimension {'xyz'[axis]} = {n} exceeds {limit}"
            )
    if not isinstance(dynamic_shared_bytes, numbers.Integral) or dynamic_shared_bytes < 0:
        raise LaunchConfigError(
            f"launch of kernel {kernel!r}: dynamic shared memory must be a non-negative int, "
            f"got {dynamic_shared_bytes!r}"
        )
    if dynamic_shared_bytes > MAX_DYNAMIC_SHARED_BYTES:
        raise LaunchConfigError(
            f"launch of kernel {kernel!r}: {dynamic_shared_bytes} bytes of dynamic shared memory "
            f"exceed the {MAX_DYNAMIC_SHARED_BYTES}-byte limit per block"
        )
    return g, b


def split_config(config, kernel: str = "?") -> tuple:
    """Split ``kernel[grid, block, stream, dynshared]`` into its four parts."""
    if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
        raise LaunchConfigError(
            f"kernel {kernel!r} takes a launch configuration [grid, block] or "
            f"[grid, block, stream] or [grid, block, stream, dynamic_shared_bytes], got {config!r}"
        )
    grid, block, stream, dynshared = (tuple(config) + (0, 0))[:4]
    return grid, block, stream, dynshared
