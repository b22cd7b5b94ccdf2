"""Batched matmul uTasks with a broadcast operand and a strided output (seed 001): per-gate and per-head weights.

Two of the Cocktailer paper's models multiply by a *stack* of weight matrices that
only one side of the product has:

    NASRNN      ih[g]       = x_t    @ W_ih[g]     g < 8: x_t (B, I) is shared by the 8 gates
    Attention   q[b, h]     = x[b, h] @ W_q[h]     W_q (heads, d, d) is shared by the batch rows b
                k[b, h, gen] = x[b, h] @ W_k[h]    the result is row ``gen`` of the KV cache k (B, heads, S, d)

``matmul.py``'s uTask pairs matrix ``m`` of ``a`` with matrix ``m`` of ``b`` and packs
the outputs.  Here output matrix ``m < batch`` is

    out[m * out_stride : ...] (M, N) = a[m % a_period] (M, K) @ b[m % b_period] (K, N)   (b.T with transpose_b)

``a_period``/``b_period`` repeat an operand (numpy broadcasting, when an operand's
batch dims are a suffix of the output's: W_q[h] for m = b * heads + h is
``m % heads``; a shared x_t has period 1).  ``out_stride = M * N`` packs the outputs
one after another; a larger stride puts output ``m`` into rows of a bigger matrix
(with ``out`` a view starting at row ``gen`` of the first cache matrix and
``out_stride = S * d``, row ``gen`` of every cache matrix).

uTask ``u`` is tile ``u % per_matrix`` of output matrix ``m = u // per_matrix``
(``per_matrix = ceil(M / tile) * ceil(N / tile)``, as in ``matmul.py``), computed by
the library's tiled matmul (``kernels/matmul.py``'s ``make_matmul_tile``, as
``matmul.py``'s uTask does) with the three matrices' start offsets worked out from
``m`` (so its results are bitwise ``matmul_utask``'s).  ``out`` must not overlap ``a``
or ``b``.  The arguments end with ``M, N, K, batch`` like ``matmul_utask``'s (the
scheduler's cost model reads K there).

Why not call ``matmul.py``'s tile uTask on views of the three matrices?  It owns
shared arrays, and numba-cuda links a device function's module into every caller's:
two of these uTasks reaching ONE specialization of it through two callers define its
shared arrays twice, which NVVM rejects (``ERROR_INVALID_IR``).  So only uTasks,
which a kernel calls directly, own shared memory: this one declares its two tiles
and hands them to ``make_matmul_tile``'s function, which owns none.
"""

from __future__ import annotations

import functools

from numba import from_dtype

from pyflow.errors import ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.matmul import make_matmul_tile
from pyflow.kernels.utask.matmul import _normalize, matmul_utask_count, slots_per_thread
from pyflow.kernels.utask.sizes import require_sizes

__all__ = ["make_broadcast_matmul_utask", "make_broadcast_matmul_kernel", "broadcast_matmul_utask_count",
           "check_periods"]


def broadcast_matmul_utask_count(M: int, N: int, tile: int, batch: int) -> int:
    """uTasks of ``batch`` M x N products: ``batch * ceil(M / tile) * ceil(N / tile)`` (periods do not matter).

    >>> broadcast_matmul_utask_count(1, 8, tile=4, batch=6)
    12
    """
    return matmul_utask_count(M, N, tile, batch)


def check_periods(batch: int, a_period: int, b_period: int, out_stride: int, M: int, N: int) -> None:
    """``ShapeError`` unless each period is >= 1 and divides ``batch``, and outputs do not overlap."""
    require_sizes("broadcast_matmul", minimum=1, a_period=a_period, b_period=b_period)
    require_sizes("broadcast_matmul", minimum=M * N, out_stride=out_stride)
    if batch % a_period or batch % b_period:
        raise ShapeError(f"broadcast_matmul uTasks: the periods {a_period} and {b_period} must divide "
                         f"batch {batch}")


# --- device code ----------------------------------------------------------------


def make_broadcast_matmul_utask(tile: int = 16, dtype="float32", transpose_b: bool = False):
    """``broadcast_matmul_utask(u, out, a, b, a_period, b_period, out_stride, M, N, K, batch)``.

    ``a`` holds ``a_period`` matrices (M, K), ``b`` holds ``b_period`` matrices (K, N)
    (with ``transpose_b``: (N, K)), ``out`` is at least ``(batch - 1) * out_stride + M * N``
    long; all flat and contiguous.  A ``u`` past the count writes nothing.
    """
    tile, dtype, transpose_b, _ = _normalize(tile, dtype, transpose_b, False)
    return _build(tile, dtype, transpose_b)


@functools.cache
def _build(tile, dtype, transpose_b):
    T = tile
    DTYPE = from_dtype(dtype)
    TRANS_B = transpose_b
    matmul_tile = make_matmul_tile(tile, dtype, 1, slots_per_thread(tile))

    @jit(device=True)
    def broadcast_matmul_utask(u, out, a, b, a_period, b_period, out_stride, M, N, K, batch):
        """uTask ``u``: one output tile of ``a[m % a_period] @ b[m % b_period]``, see the module doc."""
        a_tile = cuda.shared.array((T, T), DTYPE)  # a_tile[i, k] = A_m[row0 + i, k0 + k]
        b_tile = cuda.shared.array((T, T), DTYPE)  # b_tile[k, j] = B_m[k0 + k, col0 + j]
        tiles_n = (N + T - 1) // T
        per_matrix = ((M + T - 1) // T) * tiles_n
        if u < batch * per_matrix:  # u and the sizes are block-uniform: barriers inside are safe
            # Code plan: 1. product m, its tile (row0, col0), where its three matrices start;
            # 2. the library's tiled matmul computes and stores the tile.
            m = u // per_matrix
            row0 = ((u % per_matrix) // tiles_n) * T
            col0 = ((u % per_matrix) % tiles_n) * T
            b_row = 1 if TRANS_B else N   # B_m[k, col] = b[b_base + k * b_row + col * b_col]
            b_col = K if TRANS_B else 1
            matmul_tile(out, m * out_stride, N, 1, out,  # bias: not read
                        a, (m % a_period) * M * K, K, 1, b, (m % b_period) * K * N, b_row, b_col, a_tile, b_tile,
                        row0, col0, M, N, K, cuda.threadIdx.x, cuda.blockDim.x)

    return broadcast_matmul_utask


def make_broadcast_matmul_kernel(tile: int = 16, dtype="float32", transpose_b: bool = False):
    """The uOperator kernel ``(u_begin, u_end, out, a, b, a_period, b_period, out_stride, M, N, K, batch)``."""
    tile, dtype, transpose_b, _ = _normalize(tile, dtype, transpose_b, False)
    return _build_kernel(tile, dtype, transpose_b)


@functools.cache
def _build_kernel(tile, dtype, transpose_b):
    utask = _build(tile, dtype, transpose_b)

    @jit
    def broadcast_matmul_kernel(u_begin, u_end, out, a, b, a_period, b_period, out_stride, M, N, K, batch):
        for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):  # block-uniform
            utask(u, out, a, b, a_period, b_period, out_stride, M, N, K, batch)

    return broadcast_matmul_kernel


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array

    i64 = types.int64
    cases = []
    for tile, dtype, transpose_b in ((16, "float32", False), (8, "float32", True), (4, "float64", False)):
        x = array(dtype)
        ints = (i64,) * 7
        label = f"[tile={tile},{dtype}{',b.T' if transpose_b else ''}]"
        utask = make_broadcast_matmul_utask(tile, dtype, transpose_b)
        kernel = make_broadcast_matmul_kernel(tile, dtype, transpose_b)
        cases.append((f"broadcast_matmul_utask{label}", utask.py_func, (i64, x, x, x, *ints), True))
        cases.append((f"broadcast_matmul_kernel{label}", kernel.py_func, (i64, i64, x, x, x, *ints), False))
    return cases
