"""Matrix multiplication: ``out = a @ b`` with numpy's ``np.matmul`` rules, as a tiled kernel.

One registered op, ``matmul``, ``fn(out, a, b, *, stream=0)`` on "cpu" and "cuda":
* 2-D operands multiply as matrices: (M, K) @ (K, N) -> (M, N);
* 1-D operands are vectors: (K,) @ (K, N) -> (N,), (M, K) @ (K,) -> (M,),
  (K,) @ (K,) -> a 0-d result;
* leading dimensions are batch dimensions, broadcast between ``a`` and ``b``
  like numpy: (2, 1, M, K) @ (3, K, N) -> (2, 3, M, N);
* the result dtype is numpy's (``np.matmul.resolve_dtypes``): int32 @ float32
  gives float64, inputs are cast to it as they are read;
* K = 0 gives zeros; an empty result launches nothing.

Operands are read through their strides (``kernels/layout.py``): ``a.T``, a
sliced view or a batch broadcast with stride 0 is never copied.  The host turns
every operand into (batch shape, rows, cols) with one stride per dimension.

The CUDA kernel is the shared-memory tiled matmul (MiniTorch's "matmul
practice") with a register tile per thread, built per tile size, dtype and
outputs per thread by ``make_matmul_kernel``.  A block's work, one output tile, is
``make_matmul_tile``'s device function, which Cocktailer's matmul uTasks
(``kernels/utask/matmul.py``, ``batched.py``) call too.
float32 inputs accumulate in float32, like cuBLAS by default.
The CPU twin is ``np.matmul(a, b, out=out)``.

>>> import numpy as np
>>> from pyflow.kernels.registry import get_kernel
>>> a, b = np.arange(6.0).reshape(2, 3), np.ones((3, 2))
>>> out = np.empty((2, 2))
>>> get_kernel("matmul", "cpu")(out, a, b)
>>> out.tolist()
[[3.0, 3.0], [12.0, 12.0]]
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import from_dtype

from pyflow.errors import DTypeError, LaunchConfigError, ShapeError
from pyflow.kernels.backend import cuda, is_simulator
from pyflow.kernels.dtypes import SUPPORTED_DTYPES
from pyflow.kernels.elementwise import position
from pyflow.kernels.jit import jit
from pyflow.kernels.launch import compiled_launch, launcher, one_operation, require_device_arrays
from pyflow.kernels.layout import as_kernel_shape, flat, may_overlap, padded_strides
from pyflow.kernels.registry import register

__all__ = ["make_matmul_tile", "make_matmul_kernel", "matmul_cuda", "matmul_result_dtype", "matmul_shape",
           "default_tile", "MATMUL_DTYPES", "GPU_TILE", "GPU_PER_THREAD", "SIM_TILE", "MAX_GRID_Z"]

# Of kernels/dtypes.py: no bool, no 8/16-bit types (they would overflow in their own dtype, as numpy's do).
MATMUL_DTYPES = tuple(d for d in SUPPORTED_DTYPES if d.name in ("float32", "float64", "int32", "int64"))
GPU_TILE = 16      # 16 x 16 = 256 threads per block
GPU_PER_THREAD = 4  # each thread computes 4 x 4 outputs: a block computes a 64 x 64 tile of out
SIM_TILE = 4       # 16 simulated threads per block: every thread is a Python thread
SKINNY = 32        # a compiled simulated product this narrow gets a 16-wide block tile (``default_tile``)
MAX_GRID_Z = 65535  # CUDA's limit on gridDim.z; further batches loop inside the kernel


def default_tile(work: int = 0, rows: int | None = None, cols: int | None = None) -> tuple:
    """(tile, per_thread) for the registered ``matmul``: (16, 4) on a GPU, (4, 1) in the simulator's threaded tier.

    ``work`` (its multiply-adds, or its largest operand's elements if more) says whether a simulated
    launch will be compiled (``launch.compiled_launch``); there a thread costs no Python thread, so a
    GPU's configuration serves, but with a 16-wide block tile, (4, 4), where the product's narrow side
    (``rows`` or ``cols``) is 32 or less (one more kernel variant per dtype to compile).  The compiled tier
    computes every cell of a block's tile, so a 64-wide one over 10 columns (a Linear to 10 classes,
    its gradients) did 6.4 times the product's work (measured 0.36-0.40 ms against 0.22 for (64, 256)
    @ (256, 10) and (10, 64) @ (64, 256)).  The threaded tier keeps the
    classic kernel (one output per thread): its cost is Python threads and barrier arrivals, and a
    thread's arithmetic runs in Python.

    >>> from pyflow.kernels.sim import configure
    >>> with configure(tier="compiled"):
    ...     default_tile(1 << 20, 64, 256), default_tile(1 << 20, 64, 10), default_tile(1 << 20, 20, 64)
    ((16, 4), (4, 4), (4, 4))
    """
    if is_simulator():
        if not compiled_launch(work):
            return SIM_TILE, 1
        if min(rows or SKINNY + 1, cols or SKINNY + 1) <= SKINNY:
            return GPU_TILE // 4, GPU_PER_THREAD
    return GPU_TILE, GPU_PER_THREAD


# --- device code ----------------------------------------------------------------


@functools.cache
def make_matmul_tile(tile: int, dtype, per_thread: int = 1, slots: int = 1, bias: bool = False) -> object:
    """The one tiled-matmul device function: one output tile of ``out = a @ b (+ bias)``, computed and stored.

    ``matmul_tile(out, o0, o_row, o_col, bias, a, a0, a_row, a_col, b, b0, b_row, b_col, sa, sb,
    row0, col0, m, n, k, t, threads)`` computes the BM x BM tile of ``out`` at (``row0``, ``col0``),
    BM = ``tile * per_thread``, of an m x k times k x n product.  Every matrix is read through
    strides: ``A[row, kk]`` is ``a[a0 + row * a_row + kk * a_col]``, ``B`` and ``out`` likewise (a
    transposed, sliced or broadcast operand needs no copy).  With ``bias`` (a compile-time flag),
    ``bias[col]`` is added as an output is stored; without, the ``bias`` argument is not read.
    The library's ``matmul_tiled`` and Cocktailer's matmul uTasks (``kernels/utask/matmul.py``,
    ``batched.py``) call it: each kernel family owns one device function.

    Who computes what: the tile has ``tile * tile`` *slots*; slot s = (sy, sx) = (s // tile,
    s % tile) owns the ``per_thread`` x ``per_thread`` outputs at rows ``row0 + sy + i * tile``,
    cols ``col0 + sx + j * tile`` (strided, so neighbouring threads write neighbouring columns).
    Thread ``t`` of the block's ``threads`` takes slots t, t + threads, ... up to ``slots`` of
    them at once, their sums in registers (a local array).  The library's block has
    ``tile * tile`` threads: one slot each.  A uTask runs on whatever block the persistent kernel
    has; a block with fewer than ``tile * tile / slots`` threads does the tile in several passes
    (each walks all of K again), threads from ``tile * tile`` on only join the barriers.

    Code plan (every thread of the block calls it; nobody returns early):
    1. per pass, zero the sums of the thread's slots;
    2. for each K-step of ``tile``: the block copies the A tile (``sa[sy + i * tile, sx]``) and
       the B tile (``sb[sy, sx + j * tile]``) into shared memory, 0 outside the matrices
       (each thread the cells of slots t, t + threads, ...); barrier;
    3. for each k of the step, each slot reads its rows' and columns' values into registers
       and adds the R*R products; barrier, so nobody overwrites the tiles while others read them;
    4. store the pass's outputs that are inside ``out`` (+ bias).
    Every output sums its K products in order, k = 0, 1, ..., (zeros past K), whatever the tile,
    ``per_thread``, ``slots`` or block size: the same bits for every tiling.  ``sa`` (BM x tile) and
    ``sb`` (tile x BM) are the caller's shared arrays, free again on return: a device function that
    declared them, reached from one kernel along two paths, would define them twice, which NVVM
    rejects (``kernels/utask/batched.py``).  ``dtype`` types the sums and register copies.
    """
    T = int(tile)
    R = int(per_thread)
    S = int(slots)
    SLOTS = T * T
    HAS_BIAS = bool(bias)
    ACC = from_dtype(np.dtype(dtype))

    @jit(device=True)
    def matmul_tile(out, o0, o_row, o_col, bias, a, a0, a_row, a_col, b, b0, b_row, b_col, sa, sb,
                    row0, col0, m, n, k, t, threads):
        acc = cuda.local.array((S, R, R), dtype=ACC)  # the sums of this thread's slots in this pass
        ra = cuda.local.array(R, dtype=ACC)           # a slot's rows' values at one k
        rb = cuda.local.array(R, dtype=ACC)           # its columns' values at one k
        for first in range(0, SLOTS, threads * S):   # block-uniform; one pass when threads * S >= SLOTS
            for s in range(S):
                for i in range(R):
                    for j in range(R):
                        acc[s, i, j] = 0
            for k0 in range(0, k, T):
                for slot in range(t, SLOTS, threads):
                    sy = slot // T
                    sx = slot % T
                    for i in range(R):
                        row = row0 + sy + i * T
                        if row < m and k0 + sx < k:
                            sa[sy + i * T, sx] = a[a0 + row * a_row + (k0 + sx) * a_col]
                        else:
                            sa[sy + i * T, sx] = 0
                        col = col0 + sx + i * T
                        if k0 + sy < k and col < n:
                            sb[sy, sx + i * T] = b[b0 + (k0 + sy) * b_row + col * b_col]
                        else:
                            sb[sy, sx + i * T] = 0
                cuda.syncthreads()
                for s in range(S):
                    slot = first + t + s * threads
                    if slot < SLOTS:
                        sy = slot // T
                        sx = slot % T
                        for kk in range(T):
                            for i in range(R):
                                ra[i] = sa[sy + i * T, kk]
                                rb[i] = sb[kk, sx + i * T]
                            for i in range(R):
                                for j in range(R):
                                    acc[s, i, j] += ra[i] * rb[j]
                cuda.syncthreads()
            for s in range(S):
                slot = first + t + s * threads
                if slot < SLOTS:
                    for i in range(R):
                        row = row0 + slot // T + i * T
                        for j in range(R):
                            col = col0 + slot % T + j * T
                            if row < m and col < n:
                                value = acc[s, i, j]
                                if HAS_BIAS:
                                    value += bias[col]
                                out[o0 + row * o_row + col * o_col] = value

    return matmul_tile


@functools.cache
def make_matmul_kernel(tile: int, dtype, per_thread: int = 1) -> object:
    """The tiled matmul kernel for ``tile`` x ``tile`` threads per block, computing in ``dtype``.

    Each thread computes ``per_thread`` x ``per_thread`` outputs (a register tile), so a block
    computes a (tile * per_thread)-square tile of ``out``.  With ``per_thread=1`` this is the
    classic shared-memory kernel (MiniTorch's "matmul practice"): per multiply-add a thread reads
    two shared values.  With ``per_thread=R`` it reads 2R shared values per R*R multiply-adds, the
    rest comes from registers: what a GPU's fast matmuls do, and what lets the simulator's compiled
    tier keep a thread's work in CPU registers (its local arrays live on the stack).

    ``dtype`` (a numpy dtype, the result dtype) types the shared tiles and the accumulators;
    shared and local arrays need it, and their shapes, at compile time, so each
    (tile, dtype, per_thread) gets its own kernel.  A block's work is ``make_matmul_tile``'s.
    """
    T = int(tile)
    R = int(per_thread)
    BM = T * R   # rows (and columns) of out per block
    ACC = from_dtype(np.dtype(dtype))
    matmul_tile = make_matmul_tile(T, dtype, R)

    @jit
    def matmul_tiled(out, out_strides, a, a_strides, b, b_strides, batch_shape, m, n, k, batches):
        """``out[z] = a[z] @ b[z]`` for every batch index ``z``, one BM x BM tile of ``out`` per block.

        Layout: every operand is flat storage plus strides over (batch..., rows, cols);
        ``batch_shape`` is the broadcast batch shape ((1,) when none).
        Grid: x -> column tiles of ``out``, y -> row tiles, z -> batches (a
        grid-stride loop past gridDim.z).  Block: T x T threads; thread (ty, tx) is
        slot ty * T + tx of ``make_matmul_tile``: it owns the R x R outputs at rows
        ``row0 + ty + i*T``, cols ``col0 + tx + j*T`` (i, j < R).

        Rules kept: each element of ``a`` and ``b`` is read from global memory
        once per block that needs it (into shared memory), each output element is
        written once; cells outside the matrices load as 0, so partial tiles need
        no special case; every thread reaches every ``syncthreads`` (loads and the
        store are guarded, nobody returns early).
        """
        sa = cuda.shared.array((BM, T), dtype=ACC)    # rows of a x a K-step
        sb = cuda.shared.array((T, BM), dtype=ACC)    # a K-step x columns of b
        r = len(batch_shape)  # strides[r] steps a row, strides[r + 1] a column
        z = cuda.blockIdx.z
        # Code plan (per batch z of this block; the same z for the whole block):
        # 1. find where batch z starts in each operand (broadcast dims: stride 0);
        # 2. ``make_matmul_tile`` computes and stores the block's tile (K-steps through shared memory).
        while z < batches:
            a0 = position(z, batch_shape, a_strides)
            b0 = position(z, batch_shape, b_strides)
            o0 = position(z, batch_shape, out_strides)
            matmul_tile(out, o0, out_strides[r], out_strides[r + 1], out,  # bias: not read
                        a, a0, a_strides[r], a_strides[r + 1], b, b0, b_strides[r], b_strides[r + 1], sa, sb,
                        cuda.blockIdx.y * BM, cuda.blockIdx.x * BM, m, n, k,
                        cuda.threadIdx.y * T + cuda.threadIdx.x, T * T)
            z += cuda.gridDim.z

    return matmul_tiled


# --- dtype and shape rules (numpy's) ----------------------------------------------


def matmul_result_dtype(a, b) -> np.dtype:
    """The dtype numpy's matmul gives ``a @ b``; ``DTypeError`` for unsupported dtypes."""
    a, b = np.dtype(a), np.dtype(b)
    for d in (a, b):
        if d not in MATMUL_DTYPES:
            raise DTypeError(f"matmul: unsupported dtype {d} (inputs {a}, {b}); expected one of "
                             f"{', '.join(map(str, MATMUL_DTYPES))}")
    return np.matmul.resolve_dtypes((a, b, None))[2]


def matmul_shape(a_shape, b_shape) -> tuple:
    """numpy's result shape of ``a @ b``; ``ShapeError`` naming both shapes if they do not fit."""
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    where = f"matmul: shapes {a_shape} and {b_shape}"
    if not a_shape or not b_shape:
        raise ShapeError(f"{where}: a 0-d operand cannot be multiplied (use mul); "
                         "operands need at least 1 dimension")
    a2 = a_shape if len(a_shape) > 1 else (1,) + a_shape
    b2 = b_shape if len(b_shape) > 1 else b_shape + (1,)
    if a2[-1] != b2[-2]:
        raise ShapeError(f"{where} do not match: a has {a2[-1]} columns (last dim) but b has "
                         f"{b2[-2]} rows ({'only' if len(b_shape) == 1 else 'second-to-last'} dim)")
    try:
        batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    except ValueError:
        raise ShapeError(f"{where}: batch dimensions {a2[:-2]} and {b2[:-2]} cannot be "
                         "broadcast together") from None
    rows = (a2[-2],) if len(a_shape) > 1 else ()   # a vector's row dimension is dropped
    cols = (b2[-1],) if len(b_shape) > 1 else ()   # and so is a vector's column dimension
    return batch + rows + cols


def _check(out, a, b) -> tuple:
    """Every check, before any launch; returns the result shape."""
    shape = matmul_shape(a.shape, b.shape)
    dtype = matmul_result_dtype(a.dtype, b.dtype)
    if tuple(out.shape) != shape:
        raise ShapeError(f"matmul: output has shape {tuple(out.shape)}, expected {shape} "
                         f"for {tuple(a.shape)} @ {tuple(b.shape)}")
    if np.dtype(out.dtype) != dtype:
        raise DTypeError(f"matmul: output dtype is {out.dtype}, expected {dtype} "
                         f"for {a.dtype} @ {b.dtype}")
    if math.prod(shape) and any(s == 0 and n > 1 for s, n in zip(out.strides, out.shape)):
        raise ShapeError("matmul: the output is a broadcast view (stride 0): threads would race")
    if may_overlap(out, a) or may_overlap(out, b):
        raise ShapeError("matmul: the output overlaps an input; blocks would overwrite values other "
                         "blocks still read (use a separate output)")
    return shape


# --- launching on a GPU or in the simulator ----------------------------------------


def _as_matrices(array, vector_as: str) -> tuple:
    """(shape, element strides) of ``array`` as (batch..., rows, cols).

    A 1-D ``a`` is a 1 x K row (``vector_as="row"``), a 1-D ``b`` a K x 1
    column (``"col"``); the added dimension gets stride 0.
    """
    _, strides = flat(array)
    shape = tuple(array.shape)
    if len(shape) == 1:
        if vector_as == "row":
            return (1,) + shape, (0,) + strides
        return shape + (1,), strides + (0,)
    return shape, strides


def _out_strides(out, a_ndim: int, b_ndim: int) -> tuple:
    """Element strides of ``out`` over (batch..., M, N), stride 0 for a dim a vector removed."""
    strides = flat(out)[1] if out.ndim else ()
    if b_ndim == 1:
        strides = strides + (0,)
    if a_ndim == 1:
        strides = strides[:-1] + (0,) + strides[-1:]
    return strides


def _check_tile(tile) -> int:
    if isinstance(tile, bool) or not isinstance(tile, (int, np.integer)) or not 1 <= tile <= 32:
        raise LaunchConfigError(f"matmul: tile must be an int from 1 to 32 (tile*tile threads "
                                f"per block, at most 1024), got {tile!r}")
    return int(tile)


def _check_per_thread(per_thread) -> int:
    if isinstance(per_thread, bool) or not isinstance(per_thread, (int, np.integer)) or not 1 <= per_thread <= 8:
        raise LaunchConfigError(f"matmul: per_thread must be an int from 1 to 8 (per_thread**2 outputs "
                                f"per thread, in registers), got {per_thread!r}")
    return int(per_thread)


def matmul_cuda(out, a, b, *, tile: int | None = None, per_thread: int | None = None, stream=0) -> None:
    """``out[...] = a @ b`` on the device: ``tile`` x ``tile`` threads per block, each computing
    ``per_thread`` x ``per_thread`` outputs (defaults: ``default_tile()``; a ``tile`` given alone
    computes one output per thread).

    Its work, for the simulator's choice of tier, is its multiply-adds (``batches * m * n * k``): a
    threaded launch costs a Python thread per output element and a barrier per tile of ``k``.
    """
    if tile is not None:
        tile = _check_tile(tile)
    if per_thread is not None:
        per_thread = _check_per_thread(per_thread)
    require_device_arrays("matmul", out, a, b)
    shape = _check(out, a, b)
    if math.prod(shape) == 0:
        return  # M, N or a batch dim is 0: nothing to write
    a_shape, a_strides = _as_matrices(a, "row")
    b_shape, b_strides = _as_matrices(b, "col")
    m, k = a_shape[-2:]
    n = b_shape[-1]
    batch = tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    o_strides = _out_strides(out, a.ndim, b.ndim)
    if batch:
        a_strides = padded_strides(a_shape[:-2], a_strides[:-2], batch) + a_strides[-2:]
        b_strides = padded_strides(b_shape[:-2], b_strides[:-2], batch) + b_strides[-2:]
    else:  # no batch dims: one batch of shape (1,), stride 0 everywhere
        a_strides, b_strides, o_strides = (0,) + a_strides, (0,) + b_strides, (0,) + o_strides
    batches = math.prod(batch)
    work = max(a.size, b.size, out.size, batches * m * n * k)
    if tile is None:
        tile, default_per_thread = default_tile(work, m, n)
        per_thread = default_per_thread if per_thread is None else per_thread
    per_thread = 1 if per_thread is None else per_thread
    side = tile * per_thread   # of the tile of ``out`` each block computes
    grid = (math.ceil(n / side), math.ceil(m / side), min(batches, MAX_GRID_Z))
    kernel = make_matmul_kernel(tile, np.dtype(out.dtype), per_thread)
    with one_operation(work):
        launcher(kernel, grid, (tile, tile), stream)(
            flat(out)[0], o_strides, flat(a)[0], a_strides, flat(b)[0], b_strides,
            as_kernel_shape(batch), m, n, k, batches)


def _matmul_cuda(out, a, b, *, stream=0) -> None:
    matmul_cuda(out, a, b, stream=stream)


def _matmul_cpu(out, a, b, *, stream=0) -> None:
    _check(out, a, b)
    with np.errstate(all="ignore"):  # IEEE inf/nan without warnings, as on a GPU
        np.matmul(a, b, out=out)


register("matmul", "cuda", _matmul_cuda)
register("matmul", "cpu", _matmul_cpu)


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array, tuple_of

    i64 = types.int64
    cases = []
    for tile, per_thread in ((GPU_TILE, GPU_PER_THREAD), (GPU_TILE, 1), (SIM_TILE, 1)):
        for a, b in (("float32", "float32"), ("float64", "float64"), ("int32", "int32"),
                     ("int64", "int64"), ("int32", "float32")):
            result = matmul_result_dtype(a, b)
            for nb in (1, 2):  # batch rank 1 (also "no batch") and 2
                t = tuple_of(nb + 2)
                argtypes = (array(result.name), t, array(a), t, array(b), t, tuple_of(nb), i64, i64, i64, i64)
                cases.append((f"matmul_tiled[tile={tile},per_thread={per_thread},{a}@{b},batch rank {nb}]",
                              make_matmul_kernel(tile, result, per_thread).py_func, argtypes, False))
    for tile, per_thread, slots, bias in ((GPU_TILE, GPU_PER_THREAD, 1, False), (16, 1, 8, True), (4, 1, 1, True)):
        x, tiles = array("float32"), array("float32", 2)
        argtypes = (x, i64, i64, i64, x, x, i64, i64, i64, x, i64, i64, i64, tiles, tiles) + (i64,) * 7
        cases.append((f"matmul_tile[tile={tile},per_thread={per_thread},slots={slots}{',bias' if bias else ''}]",
                      make_matmul_tile(tile, "float32", per_thread, slots, bias).py_func, argtypes, True))
    return cases
