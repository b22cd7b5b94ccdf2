"""Matmul tile uTasks (seed 001, Cocktailer): uTask ``u`` computes one ``TILE x TILE`` output tile.

``out = a @ b`` with ``a`` of shape (M, K), ``b`` of shape (K, N) (or, with
``transpose_b``, (N, K) as nn.Linear stores its weights, giving ``a @ b.T``),
``out`` of shape (M, N), optionally ``+ bias`` (length N, added to every row), and
optionally a batch of such products stored one after another (Attention's heads).
Every buffer is contiguous and flat (see the contract in ``kernels/utask/__init__.py``).

The output is cut into ``ceil(M / TILE) x ceil(N / TILE)`` tiles per matrix and
uTask ``u`` enumerates them row-major, batch outermost:

    u = (m * tiles_m + tile_row) * tiles_n + tile_col

A block computes its tile in shared memory (the classic tiled matmul): for each
step of TILE along K, the block loads one TILE x TILE tile of A and one of B
(zeros outside the matrices), barrier, every output element adds TILE products,
barrier.  Element ``e = i * TILE + j`` of a tile belongs to thread
``e mod blockDim.x``; with ``blockDim.x == TILE * TILE`` (the intended size) that is
one element per thread, thread ``t -> (t // TILE, t % TILE)``, but any block size
works, because the partial sums live in shared memory (``acc``), each cell only ever
touched by its owning thread.  float32 inputs accumulate in float32 (as cuBLAS does
by default); ints in the array's own dtype.

``TILE`` and the dtype are compile-time constants (shared arrays need them), and so
are the ``transpose_b`` and ``bias`` flags (the unused branch is compiled away):
``make_matmul_utask(tile, dtype, transpose_b, bias)`` builds and caches one device
function per combination.  ``a`` and ``b`` must not overlap ``out``.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import from_dtype

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.utask.sizes import ceil_div, require_sizes

__all__ = ["TILE", "MAX_TILE", "DTYPES", "make_tile_product", "make_matmul_utask", "make_matmul_kernel", "matmul_utask_count"]

TILE = 16  # default tile side for generated code: 16 x 16 = 256 threads per block
MAX_TILE = 32  # 32 x 32 = 1024 threads, the most a block has
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
        raise ShapeError(f"matmul uTasks: tile {tile} is larger than {MAX_TILE} (3 shared "
                         f"tiles of tile * tile elements must fit in 48 KiB)")
    dtype = np.dtype(dtype)
    if dtype not in DTYPES:
        raise DTypeError(f"matmul uTasks: unsupported dtype {dtype}; expected one of "
                         f"{', '.join(map(str, DTYPES))}")
    return int(tile), dtype, bool(transpose_b), bool(bias)


def make_tile_product(tile: int = TILE, transpose_b: bool = False):
    """``tile_product(acc, a_tile, b_tile, a, b, a_base, b_base, row0, col0, M, N, K)``: the tiled loop.

    The products of one output tile (rows ``row0..``, columns ``col0..`` of the matrices
    at ``a_base`` / ``b_base``) summed into ``acc`` (``acc[i * tile + j]``):

    1. each thread zeroes the accumulators of the tile elements it owns;
    2. for each K step: load an A tile and a B tile (zero outside), barrier, add
       ``tile`` products to each owned accumulator, barrier (the tiles are free again).

    Called by every thread of the block.  The three shared arrays (``tile * tile``
    each) are the caller's: a device function that owned shared memory, reached from
    one kernel along two paths (this file's uTask and ``batched.py``'s), would define
    it twice, which NVVM rejects (``reduce.py`` tells the story).
    """
    require_sizes("matmul", minimum=1, tile=tile)
    return _tile_product(int(tile), bool(transpose_b))


@functools.cache
def _tile_product(tile, transpose_b):
    T = tile
    TT = tile * tile
    TRANS_B = transpose_b

    @jit(device=True)
    def tile_product(acc, a_tile, b_tile, a, b, a_base, b_base, row0, col0, M, N, K):
        t = cuda.threadIdx.x
        step = cuda.blockDim.x
        for e in range(t, TT, step):
            acc[e] = 0
        for k0 in range(0, K, T):
            for e in range(t, TT, step):
                row = row0 + e // T
                k = k0 + e % T
                if row < M and k < K:
                    a_tile[e] = a[a_base + row * K + k]
                else:
                    a_tile[e] = 0
                k = k0 + e // T
                col = col0 + e % T
                if k < K and col < N:
                    if TRANS_B:
                        b_tile[e] = b[b_base + col * K + k]
                    else:
                        b_tile[e] = b[b_base + k * N + col]
                else:
                    b_tile[e] = 0
            cuda.syncthreads()
            for e in range(t, TT, step):
                i = e // T
                j = e % T
                s = acc[e]
                for kk in range(T):
                    s += a_tile[i * T + kk] * b_tile[kk * T + j]
                acc[e] = s
            cuda.syncthreads()

    return tile_product


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
    TT = tile * tile
    DTYPE = from_dtype(dtype)
    HAS_BIAS = bias
    tile_product = _tile_product(tile, transpose_b)

    @jit(device=True)
    def matmul_bias_tile_utask(u, out, a, b, bias, M, N, K, batch):
        """uTask ``u``: output tile ``u`` of ``a @ b (+ bias)``, see ``make_matmul_utask``."""
        a_tile = cuda.shared.array(TT, DTYPE)  # a_tile[i * T + k] = A[row0 + i, k0 + k]
        b_tile = cuda.shared.array(TT, DTYPE)  # b_tile[k * T + j] = B[k0 + k, col0 + j]
        acc = cuda.shared.array(TT, DTYPE)     # acc[i * T + j]: partial sums of the tile
        t = cuda.threadIdx.x
        step = cuda.blockDim.x
        tiles_n = (N + T - 1) // T
        per_matrix = ((M + T - 1) // T) * tiles_n
        if u < batch * per_matrix:  # u and the sizes are block-uniform: barriers inside are safe
            m = u // per_matrix
            row0 = ((u % per_matrix) // tiles_n) * T
            col0 = ((u % per_matrix) % tiles_n) * T
            a_base = m * M * K
            b_base = m * K * N
            out_base = m * M * N
            # Code plan: 1.-2. the tile's products into acc (``tile_product``);
            # 3. write each owned element that lies inside the output (+ bias).
            tile_product(acc, a_tile, b_tile, a, b, a_base, b_base, row0, col0, M, N, K)
            for e in range(t, TT, step):
                row = row0 + e // T
                col = col0 + e % T
                if row < M and col < N:
                    value = acc[e]
                    if HAS_BIAS:
                        value += bias[col]
                    out[out_base + row * N + col] = value

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
