"""Elementwise and copy uTasks (seed 001, Cocktailer): uTask ``u`` owns one chunk of elements.

An elementwise operator over ``n`` elements is ``ceil(n / chunk)`` uTasks; uTask
``u`` owns the elements ``[u * chunk, min(n, (u + 1) * chunk))`` and the threads of
its block stride through that chunk (thread ``t`` does ``start + t``,
``start + t + blockDim.x``, ...).  No shared memory, no barriers: these uTasks
may run in any block, in any order, with any block size.

numba.cuda device functions cannot take a function as an argument, so, as in
``kernels/elementwise.py`` (MiniTorch's ``map``/``zip``), a cached factory closes
over a scalar device function from ``kernels/scalar_ops.py``:

    add = make_elementwise_utask(scalar_ops.add)
    add.zip(u, out, a, b, n, chunk)              # out[i] = a[i] + b[i]
    add.zip_rows(u, out, x, bias, n, inner, chunk)   # out[i] = x[i] + bias[i % inner]

``copy_utask`` copies a chunk between offsets of two buffers: Cocktailer's
CopyUOperator, which copies loop-carried inputs to outputs before a loop.

Rules: one read per input element and one write per output element, both by the
thread that owns the element, so ``out`` may be the same array as an input
(``h = tanh(h)`` is safe).  Different arrays must not overlap partially.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.utask.sizes import ceil_div, require_sizes

__all__ = ["CHUNK", "ElementwiseUTasks", "make_elementwise_utask", "make_elementwise_kernels",
           "elementwise_utask_count", "copy_utask", "copy_kernel", "copy_utask_count"]

# Elements per uTask when the code generator has no better idea: four per thread
# of a 256-thread block.  Tests pass small chunks explicitly.
CHUNK = 1024


class ElementwiseUTasks(NamedTuple):
    """The three device functions (or, from ``make_elementwise_kernels``, kernels) of one ``fn``.

    * ``map(u, out, x, n, chunk)``: ``out[i] = fn(x[i])``
    * ``zip(u, out, a, b, n, chunk)``: ``out[i] = fn(a[i], b[i])``
    * ``zip_rows(u, out, a, b, n, inner, chunk)``: ``out[i] = fn(a[i], b[i % inner])``,
      i.e. ``b`` (length ``inner``) repeated over the rows of ``a``: ``x + bias``.
    """

    map: object
    zip: object
    zip_rows: object


def elementwise_utask_count(n: int, chunk: int = CHUNK) -> int:
    """uTasks of an elementwise op over ``n`` elements: ``ceil(n / chunk)`` (0 for ``n == 0``).

    >>> elementwise_utask_count(10, chunk=4), elementwise_utask_count(0, chunk=4)
    (3, 0)
    """
    require_sizes("elementwise", n=n)
    require_sizes("elementwise", minimum=1, chunk=chunk)
    return ceil_div(n, chunk)


def copy_utask_count(n: int, chunk: int = CHUNK) -> int:
    """uTasks of a copy of ``n`` elements: ``ceil(n / chunk)``."""
    require_sizes("copy", n=n)
    require_sizes("copy", minimum=1, chunk=chunk)
    return ceil_div(n, chunk)


# --- device code ----------------------------------------------------------------


@functools.cache
def make_elementwise_utask(fn) -> ElementwiseUTasks:
    """The map / zip / zip_rows uTasks applying the scalar device function ``fn``."""

    @jit(device=True)
    def map_utask(u, out, x, n, chunk):
        """uTask ``u`` of ``out[i] = fn(x[i])``: the elements of chunk ``u``."""
        # Code plan: 1. the chunk [start, stop) that u owns (stop clipped to n);
        # 2. the block's threads stride through it, one read and one write each.
        start = u * chunk
        stop = min(n, start + chunk)
        for i in range(start + cuda.threadIdx.x, stop, cuda.blockDim.x):
            out[i] = fn(x[i])

    @jit(device=True)
    def zip_utask(u, out, a, b, n, chunk):
        """uTask ``u`` of ``out[i] = fn(a[i], b[i])``."""
        start = u * chunk
        stop = min(n, start + chunk)
        for i in range(start + cuda.threadIdx.x, stop, cuda.blockDim.x):
            out[i] = fn(a[i], b[i])

    @jit(device=True)
    def zip_rows_utask(u, out, a, b, n, inner, chunk):
        """uTask ``u`` of ``out[i] = fn(a[i], b[i % inner])`` (``b`` broadcast over rows)."""
        start = u * chunk
        stop = min(n, start + chunk)
        for i in range(start + cuda.threadIdx.x, stop, cuda.blockDim.x):
            out[i] = fn(a[i], b[i % inner])

    return ElementwiseUTasks(map_utask, zip_utask, zip_rows_utask)


@jit(device=True)
def copy_utask(u, dst, src, n, dst_offset, src_offset, chunk):
    """uTask ``u`` of ``dst[dst_offset + i] = src[src_offset + i]`` for ``0 <= i < n``.

    The two ranges must not overlap unless they are the same (then it is a no-op).
    """
    start = u * chunk
    stop = min(n, start + chunk)
    for i in range(start + cuda.threadIdx.x, stop, cuda.blockDim.x):
        dst[dst_offset + i] = src[src_offset + i]


# --- uOperator kernels: one op's uTasks in the virtual-block loop ----------------
#
# Each runs the uTasks u_begin <= u < u_end of one op.  The loop variable depends on
# blockIdx only, so it is block-uniform: every thread of a block runs the same uTasks
# and reaches the same barriers.  A generated kernel does exactly this between grid
# barriers; on their own these kernels are also the op as a single launch.


@functools.cache
def make_elementwise_kernels(fn) -> ElementwiseUTasks:
    """Kernels ``map/zip/zip_rows(u_begin, u_end, <the uTask's arguments after u>)``."""
    map_utask, zip_utask, zip_rows_utask = make_elementwise_utask(fn)

    @jit
    def map_kernel(u_begin, u_end, out, x, n, chunk):
        for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):
            map_utask(u, out, x, n, chunk)

    @jit
    def zip_kernel(u_begin, u_end, out, a, b, n, chunk):
        for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):
            zip_utask(u, out, a, b, n, chunk)

    @jit
    def zip_rows_kernel(u_begin, u_end, out, a, b, n, inner, chunk):
        for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):
            zip_rows_utask(u, out, a, b, n, inner, chunk)

    return ElementwiseUTasks(map_kernel, zip_kernel, zip_rows_kernel)


@jit
def copy_kernel(u_begin, u_end, dst, src, n, dst_offset, src_offset, chunk):
    """uTasks ``u_begin <= u < u_end`` of ``copy_utask`` in the virtual-block loop."""
    for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):
        copy_utask(u, dst, src, n, dst_offset, src_offset, chunk)


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels import scalar_ops
    from pyflow.kernels.compile_check import array

    i64 = types.int64
    cases = []
    for name, dtype, unary, binary in (("f32", "float32", scalar_ops.tanh, scalar_ops.add),
                                       ("f64", "float64", scalar_ops.sigmoid, scalar_ops.mul),
                                       ("i32", "int32", scalar_ops.relu, scalar_ops.maximum)):
        x = array(dtype)
        for label, fn in (("map", unary), ("zip", binary)):
            device, kernel = make_elementwise_utask(fn), make_elementwise_kernels(fn)
            if label == "map":
                cases.append((f"map_utask[{fn.__name__},{name}]", device.map.py_func, (i64, x, x, i64, i64), True))
                cases.append((f"map_kernel[{fn.__name__},{name}]", kernel.map.py_func,
                              (i64, i64, x, x, i64, i64), False))
                continue
            cases.append((f"zip_utask[{fn.__name__},{name}]", device.zip.py_func, (i64, x, x, x, i64, i64), True))
            cases.append((f"zip_rows_utask[{fn.__name__},{name}]", device.zip_rows.py_func,
                          (i64, x, x, x, i64, i64, i64), True))
            cases.append((f"zip_kernel[{fn.__name__},{name}]", kernel.zip.py_func,
                          (i64, i64, x, x, x, i64, i64), False))
            cases.append((f"zip_rows_kernel[{fn.__name__},{name}]", kernel.zip_rows.py_func,
                          (i64, i64, x, x, x, i64, i64, i64), False))
        cases.append((f"copy_utask[{name}]", copy_utask.py_func, (i64, x, x, i64, i64, i64, i64), True))
        cases.append((f"copy_kernel[{name}]", copy_kernel.py_func, (i64, i64, x, x, i64, i64, i64, i64), False))
    return cases
