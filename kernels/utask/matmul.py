"""Matmul tile uTasks (seed 001, Cocktailer): uTask ``u`` computes one ``TILE x TILE`` output tile.

``out = a @ b`` with ``a`` of shape (M, K), ``b`` of shape (K, N) (or, with
``transpose_b``, (N, K) as nn.Linear stores its weights, giving ``a @ b.T``),
``out`` of shape (M, N), optionally ``+ bias`` (length N, added to every row), and
optionally a batch of such products stored one after another (Attention's heads).
Every buffer is contiguous and flat (see the contract in ``kernels/utask/__init__.py``).

The output is cut into ``ceil(M / TILE) x ceil(N / TILE)`` tiles per matrix and
uTask ``u`` enumerates them row-major, batch outermost:

    u = (m * tiles_m + tile_row) * tiles_n + tile_col

A block computes its tile with the library's tiled matmul, ``kernels/matmul.py``'s
``make_matmul_tile`` (each kernel family owns one device function, which its library
kernel and its uTask call): for each step of TILE along K, the block loads one
TILE x TILE tile of A and one of B into shared memory (zeros outside the matrices),
barrier, every output element adds TILE products, barrier.  Output ``e = i * TILE + j``
of a tile is slot ``e`` of ``make_matmul_tile``, computed by thread ``e mod
blockDim.x``; with ``blockDim.x == TILE * TILE`` that is one element per thread, but
any block size works: a thread keeps up to ``slots_per_thread(tile)`` sums in
registers, so a block of at least ``WARP`` threads does a tile in one pass, a
smaller one in several (each walks K again).  float32 inputs accumulate in float32
(as cuBLAS does by default); ints in the array's own dtype.  The bias is added as
each output is stored, as the library stores it.

``TILE`` and the dtype are compile-time constants (shared arrays need them), and so
is the ``bias`` flag (the unused branch is compiled away); ``transpose_b`` only swaps
B's strides.  ``make_matmul_utask(tile, dtype, transpose_b, bias)`` builds and caches
one device function per combination.  ``a`` and ``b`` must not overlap ``out``.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import from_dtype

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.matmul import make_matmul_tile
from pyflow.kernels.utask.sizes import ceil_div, require_sizes

__all__ = ["TILE", "MAX_TILE", "WARP", "DTYPES", "slots_per_thread", "make_matmul_utask", "make_matmul_kernel",
           "matmul_utask_count"]

TILE = 16  # default tile side for generated code: 16 x 16 = 256 threads per block
MAX_TILE = 32  # 32 x 32 = 1024 threads, the most a block has
WARP = 32      # a block of at least this many threads computes a tile in one pass
DTYPES = tuple(np.dtype(t) for t in ("float32", "float64", "int32", "int64"))


def matmul_utask_count(M: int, N: int, tile: int = TILE, batch: int = 1) -> int:
    """uTasks of a (batched) M x N matmul output: ``batch * ceil(M / tile) * ceil(N / tile)``.

    K does not matter: a uTask owns output elements, and walks all of K itself.

    >>> matmul_utask_count(5, 9, tile=4), matmul_utask_count(5, 9, tile=4, batch=3), matmul_utask_count(0, 9)
    (6, 18, 0)
    """
    require_sizes("matmul", M=M, N=N, batch=batch)
    require_sizes("matmul", minimum=1, tile=tile)
    return batch * ceil_div(M, tile) * ceil_div(N, tile)


def _normalize(tile, dtype, transpose_b, bias):
    require_sizes("matmul", minimum=1, tile=tile)
    if tile > MAX_TILE:
        raise ShapeError(f"matmul uTasks: tile {tile} is larger than {MAX_TILE} (tile * tile "
                         f"threads may own a tile's outputs, and a block has at most 1024)")
    dtype = np.dtype(dtype)
    if dtype not in DTYPES:
        raise DTypeError(f"matmul uTasks: unsupported dtype {dtype}; expected one of "
                         f"{', '.join(map(str, DTYPES))}")
    return int(tile), dtype, bool(transpose_b), bool(bias)


def slots_per_thread(tile: int) -> int:
    """Outputs of a ``tile x tile`` tile one thread sums at once (in registers): enough for a ``WARP``.

    >>> slots_per_thread(16), slots_per_thread(4), slots_per_thread(32)
    (8, 1, 32)
    """
    return ceil_div(tile * tile, WARP)


def make_matmul_utask(tile: int = TILE, dtype="float32", transpose_b: bool = False, bias: bool = False):
    """The device function computing one output tile; its signature depends on ``bias``:

    * ``bias=False``: ``matmul_tile_utask(u, out, a, b, M, N, K, batch)``
    * ``bias=True``:  ``matmul_bias_tile_utask(u, out, a, b, bias, M, N, K, batch)``

    ``a`` is (batch, M, K), ``b`` is (batch, K, N) or with ``transpose_b`` (batch, N, K),
    ``out`` is (batch, M, N), ``bias`` has N elements; all flat and contiguous.  To
    share one weight matrix over a batch (``x @ W.T`` for many rows), fold the batch
    into M instead.  A ``u`` past ``matmul_utask_count(M, N, tile, batch)`` writes nothing.
    """
    return _build(*_normalize(tile, dtype, transpose_b, bias))


@functools.cache
def _build(tile, dtype, transpose_b, bias):
    T = tile
    DTYPE = from_dtype(dtype)
    TRANS_B = transpose_b
    HAS_BIAS = bias
    matmul_tile = make_matmul_tile(tile, dtype, 1, slots_per_thread(tile), bias)

    @jit(device=True)
    def matmul_bias_tile_utask(u, out, a, b, bias, M, N, K, batch):
        """uTask ``u``: output tile ``u`` of ``a @ b (+ bias)``, see ``make_matmul_utask``."""
        a_tile = cuda.shared.array((T, T), DTYPE)  # a_tile[i, k] = A[row0 + i, k0 + k]
        b_tile = cuda.shared.array((T, T), DTYPE)  # b_tile[k, j] = B[k0 + k, col0 + j]
        tiles_n = (N + T - 1) // T
        per_matrix = ((M + T - 1) // T) * tiles_n
        if u < batch * per_matrix:  # u and the sizes are block-uniform: barriers inside are safe
            # Code plan: 1. matrix m and the tile (row0, col0) of uTask u; 2. the library's
            # tiled matmul computes and stores it (B read through its strides: b.T needs no copy).
            m = u // per_matrix
            row0 = ((u % per_matrix) // tiles_n) * T
            col0 = ((u % per_matrix) % tiles_n) * T
            b_row = 1 if TRANS_B else N   # B[k, col] = b[k * b_row + col * b_col]
            b_col = K if TRANS_B else 1
            matmul_tile(out, m * M * N, N, 1, bias, a, m * M * K, K, 1, b, m * K * N, b_row, b_col, a_tile, b_tile,
                        row0, col0, M, N, K, cuda.threadIdx.x, cuda.blockDim.x)

    if HAS_BIAS:
        return matmul_bias_tile_utask

    @jit(device=True)
    def matmul_tile_utask(u, out, a, b, M, N, K, batch):
        """uTask ``u``: output tile ``u`` of ``a @ b``, see ``make_matmul_utask``."""
        matmul_bias_tile_utask(u, out, a, b, out, M, N, K, batch)  # bias unused: HAS_BIAS is False

    return matmul_tile_utask


def make_matmul_kernel(tile: int = TILE, dtype="float32", transpose_b: bool = False, bias: bool = False):
    """The uOperator kernel: uTasks ``u_begin <= u < u_end`` in the virtual-block loop.

    Arguments: ``(u_begin, u_end, out, a, b, [bias,] M, N, K, batch)``.
    """
    return _build_kernel(*_normalize(tile, dtype, transpose_b, bias))


@functools.cache
def _build_kernel(tile, dtype, transpose_b, bias):
    utask = _build(tile, dtype, transpose_b, bias)
    if bias:
        @jit
        def matmul_bias_kernel(u_begin, u_end, out, a, b, bias, M, N, K, batch):
            for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):  # block-uniform
                utask(u, out, a, b, bias, M, N, K, batch)
        return matmul_bias_kernel

    @jit
    def matmul_kernel(u_begin, u_end, out, a, b, M, N, K, batch):
        for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):  # block-uniform
            utask(u, out, a, b, M, N, K, batch)
    return matmul_kernel


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array

    i64 = types.int64
    cases = []
    for tile, dtype, transpose_b, bias in ((16, "float32", False, False), (16, "float32", True, True),
                                           (4, "float64", True, False), (8, "int32", False, True),
                                           (2, "int64", False, False)):
        x = array(dtype)
        operands = (x, x, x, x) if bias else (x, x, x)
        label = f"[tile={tile},{dtype}{',b.T' if transpose_b else ''}{',bias' if bias else ''}]"
        utask = make_matmul_utask(tile, dtype, transpose_b, bias)
        kernel = make_matmul_kernel(tile, dtype, transpose_b, bias)
        cases.append((f"{utask.__name__}{label}", utask.py_func, (i64, *operands, i64, i64, i64, i64), True))
        cases.append((f"{kernel.__name__}{label}", kernel.py_func, (i64, i64, *operands, i64, i64, i64, i64), False))
    return cases
