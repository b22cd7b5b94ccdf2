"""Row reduction and softmax uTasks (seed 001, Cocktailer): uTask ``u`` owns row ``u``.

``x`` holds ``rows`` rows of ``width`` elements, one after another (flat, contiguous).

* ``reduce_row_utask(u, out, x, rows, width)``: ``out[u] = x[u, 0] (+) x[u, 1] (+) ...``
  where ``(+)`` is a scalar device function (``scalar_ops.add`` for sum,
  ``scalar_ops.maximum`` for max, see ``COMBINE``); rows need ``width >= 1``.
* ``softmax_row_utask(u, out, x, rows, width)``: ``out[u, j] = exp(x[u, j] - max_u) / sum_u``,
  stable (the row max is subtracted first, so ``exp`` never overflows); Attention
  needs it.  ``out`` may be ``x`` (in place).

The block's work is the library's: the reduction folds with ``kernels/reduce.py``'s
``block_reduce`` (a shared-memory tree over the block's threads), the softmax is
``kernels/softmax.py``'s ``row_softmax`` (each kernel family owns one device function,
which its library kernel and its uTask call).  Both take the shared array from their
caller and own none: numba-cuda links a device function's module into every caller's,
so a device function with a shared array, reached from one kernel along two paths (a
softmax and a sum in one program both calling the tree), is defined twice and NVVM
rejects the kernel with ``ERROR_INVALID_IR`` (``batched.py`` tells the whole story).
Functions are merged (linkonce), shared arrays are not; so only the uTasks, which a
kernel calls directly, own shared memory.  The shared array needs a compile-time size
and dtype, so factories build the uTasks: ``make_reduce_row_utask(combine, dtype,
max_block)`` supports blocks of up to ``max_block`` threads doing the work
(``MAX_BLOCK`` = 1024, every legal block, by default); threads beyond it only join the
barriers.  ``dtype`` is the accumulator's type (use int64 to sum int32 without
overflow, as numpy does).

Code plan of a row uTask:
1. each active thread ``t`` folds the elements ``t, t + lanes, t + 2 * lanes, ...`` of
   the row into one value (``lanes = min(blockDim.x, max_block)``, ``active =
   min(lanes, width)``: a row narrower than the block leaves threads idle);
2. ``block_reduce`` combines the ``active`` values (tree: halve the width each
   step, a barrier after each) and hands the result to every thread;
3. thread 0 writes it (softmax: every thread normalises its own elements).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import from_dtype

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels import scalar_ops
from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.reduce import make_block_reduce
from pyflow.kernels.softmax import make_row_softmax
from pyflow.kernels.utask.sizes import require_sizes

__all__ = ["MAX_BLOCK", "COMBINE", "make_reduce_row_utask", "make_softmax_row_utask",
           "make_reduce_row_kernel", "make_softmax_row_kernel", "reduce_row_utask_count",
           "softmax_row_utask_count"]

MAX_BLOCK = 1024
COMBINE = {"sum": scalar_ops.add, "max": scalar_ops.maximum, "min": scalar_ops.minimum}
_REDUCE_DTYPES = tuple(np.dtype(t) for t in ("float32", "float64", "int32", "int64"))
_SOFTMAX_DTYPES = _REDUCE_DTYPES[:2]


def reduce_row_utask_count(rows: int, width: int) -> int:
    """uTasks of a row reduction: one per row.  An empty row has no max: ``width >= 1``.

    >>> reduce_row_utask_count(6, 40)
    6
    """
    require_sizes("reduce_row", rows=rows)
    require_sizes("reduce_row", minimum=1 if rows else 0, width=width)
    return int(rows)


def softmax_row_utask_count(rows: int, width: int) -> int:
    """uTasks of a row softmax: one per row (an empty row is a uTask with nothing to do)."""
    require_sizes("softmax_row", rows=rows, width=width)
    return int(rows)


def _normalize(op, dtype, max_block, allowed):
    dtype = np.dtype(dtype)
    if dtype not in allowed:
        raise DTypeError(f"{op} uTasks: unsupported dtype {dtype}; expected one of {', '.join(map(str, allowed))}")
    require_sizes(op, minimum=1, max_block=max_block)
    if max_block > MAX_BLOCK:
        raise ShapeError(f"{op} uTasks: max_block {max_block} is larger than a block can be ({MAX_BLOCK})")
    return dtype, int(max_block)


# --- device code ----------------------------------------------------------------


def make_reduce_row_utask(combine, dtype="float32", max_block: int = MAX_BLOCK):
    """``reduce_row_utask(u, out, x, rows, width)``: ``out[u] = combine`` over row ``u`` of ``x``.

    ``combine`` is a scalar device function (``COMBINE["sum"]``, ``COMBINE["max"]``);
    ``dtype`` the accumulator type.  A ``u >= rows`` (or ``width == 0``) writes nothing.
    """
    return _reduce_row(combine, *_normalize("reduce_row", dtype, max_block, _REDUCE_DTYPES))


@functools.cache
def _reduce_row(combine, dtype, max_block):
    block_reduce = make_block_reduce(combine)
    LANES = max_block
    DTYPE = from_dtype(dtype)

    @jit(device=True)
    def reduce_row_utask(u, out, x, rows, width):
        tmp = cuda.shared.array(LANES, DTYPE)  # this uTask's: block_reduce owns no shared memory
        t = cuda.threadIdx.x
        lanes = min(cuda.blockDim.x, LANES)
        active = min(lanes, width)
        if u < rows and width > 0:  # block-uniform: barriers inside are safe
            base = u * width
            acc = x[base]  # a placeholder of the right type for idle threads
            if t < active:
                acc = x[base + t]
                for j in range(t + lanes, width, lanes):
                    acc = combine(acc, x[base + j])
            total = block_reduce(tmp, acc, active)
            if t == 0:
                out[u] = total

    return reduce_row_utask


def make_softmax_row_utask(dtype="float32", max_block: int = MAX_BLOCK):
    """``softmax_row_utask(u, out, x, rows, width)``: stable softmax of row ``u`` into row ``u`` of ``out``."""
    return _softmax_row(*_normalize("softmax_row", dtype, max_block, _SOFTMAX_DTYPES))


@functools.cache
def _softmax_row(dtype, max_block):
    row_softmax = make_row_softmax(False, dtype)
    LANES = max_block
    DTYPE = from_dtype(dtype)

    @jit(device=True)
    def softmax_row_utask(u, out, x, rows, width):
        tmp = cuda.shared.array(LANES, DTYPE)  # this uTask's: row_softmax owns no shared memory
        lanes = min(cuda.blockDim.x, LANES)
        if u < rows and width > 0:  # block-uniform: barriers inside are safe
            base = u * width
            row_softmax(tmp, out, base, 1, x, base, 1, width, lanes, min(lanes, width))

    return softmax_row_utask


# --- uOperator kernels: one op's uTasks in the virtual-block loop ----------------


def make_reduce_row_kernel(combine, dtype="float32", max_block: int = MAX_BLOCK):
    """Kernel ``(u_begin, u_end, out, x, rows, width)``: uTasks ``u_begin <= u < u_end``."""
    return _reduce_row_kernel(combine, *_normalize("reduce_row", dtype, max_block, _REDUCE_DTYPES))


@functools.cache
def _reduce_row_kernel(combine, dtype, max_block):
    utask = _reduce_row(combine, dtype, max_block)

    @jit
    def reduce_row_kernel(u_begin, u_end, out, x, rows, width):
        for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):  # block-uniform
            utask(u, out, x, rows, width)

    return reduce_row_kernel


def make_softmax_row_kernel(dtype="float32", max_block: int = MAX_BLOCK):
    """Kernel ``(u_begin, u_end, out, x, rows, width)``: uTasks ``u_begin <= u < u_end``."""
    return _softmax_row_kernel(*_normalize("softmax_row", dtype, max_block, _SOFTMAX_DTYPES))


@functools.cache
def _softmax_row_kernel(dtype, max_block):
    utask = _softmax_row(dtype, max_block)

    @jit
    def softmax_row_kernel(u_begin, u_end, out, x, rows, width):
        for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):  # block-uniform
            utask(u, out, x, rows, width)

    return softmax_row_kernel


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array

    i64 = types.int64
    cases = []
    for name, dtype, acc in (("sum", "float32", "float32"), ("max", "float64", "float64"),
                             ("sum", "int32", "int64"), ("max", "int64", "int64")):
        x, out = array(dtype), array(acc)
        utask = make_reduce_row_utask(COMBINE[name], acc, 256)
        kernel = make_reduce_row_kernel(COMBINE[name], acc, 256)
        cases.append((f"reduce_row_utask[{name},{dtype}->{acc}]", utask.py_func, (i64, out, x, i64, i64), True))
        cases.append((f"reduce_row_kernel[{name},{dtype}->{acc}]", kernel.py_func,
                      (i64, i64, out, x, i64, i64), False))
    for dtype in ("float32", "float64"):
        x = array(dtype)
        cases.append((f"softmax_row_utask[{dtype}]", make_softmax_row_utask(dtype).py_func,
                      (i64, x, x, i64, i64), True))
        cases.append((f"softmax_row_kernel[{dtype}]", make_softmax_row_kernel(dtype).py_func,
                      (i64, i64, x, x, i64, i64), False))
    return cases
