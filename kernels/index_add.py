"""index_add and scatter_add (PyTorch's ``index_add_``, ``scatter_add_``): the adjoints of index_select, dim_gather.

    index_add(out, index, source, *, axis, check=True, stream=0)     out.index_add_(axis, index, source)
    scatter_add(out, index, source, *, axis, check=True, stream=0)   out.scatter_add_(axis, index, source)

Both write into ``out`` in place and *add* instead of writing (autograd's backward
of index_select and dim_gather, ``kernels/indexing.py``), so repeated indices
accumulate (``np.add.at``)::

    out[:, index[i], :] += source[:, i, :]                  index_add (axis = 1; index 1-D)
    out[i, index[i, j, k], k] += source[i, j, k]            scatter_add (axis = 1; index and
                                                            source one shape, no larger than out off the axis)

They *gather* rather than scatter: one thread owns one element of ``out`` and
walks the indices along the axis in order, adding every matching element of
source.  A scatter (a thread per source element, ``cuda.atomic.add``) would add
in whatever order threads happen to run, so two runs could differ in their last
bits (and atomics on int8 or float16 do not exist); gathering, every element of
out receives its terms in index order.  Each thread reads its element once into
an accumulator, adds the matching terms there and, if any matched, writes it once.
float16 is summed in float32 and rounded to float16 once, at that write, as
PyTorch's CPU ``scatter_add_`` does: 4096 ones added into one float16 zero give
4096 (rounding every add would stall at 2048, where 2048 + 1 is a tie that rounds
back to 2048), and a partial sum past 65504 is no inf.  Every other dtype is
summed in itself: float32 and float64 round every add, integers wrap around as
numpy's do.  The cpu twin does the same with ``np.add.at`` (for float16 on a
float32 copy of out, the elements that received a term then cast back), so the
targets agree bit for bit, run after run.  (PyTorch's CPU ``index_add_`` sums
float16 in float32 only for out of rank 2 or more, the first or last axis and an
int64 index; otherwise it rounds every add, as ``np.add.at`` does.)  The price of
gathering is that every thread reads every index along the axis:
O(out.size x len(index)) index reads.  A faster deterministic version would sort
the indices once (a stable sort) and give each out slice its run of sources.
dtypes: every numeric dtype (not bool); ``out`` and ``source`` share one.

Indices are int32 or int64 and must lie in ``[0, size)``, checked as
``kernels/indexing.py`` checks them (``IndexOutOfRangeError`` naming the op, the
largest bad value, the axis and its size), *before* anything is added, so a bad
index leaves ``out`` untouched on both targets (with ``check=False`` the elements
with a bad index are skipped).

>>> import numpy as np
>>> from pyflow.kernels.registry import get_kernel
>>> out = np.zeros(3, np.float32)
>>> get_kernel("index_add", "cpu")(out, np.array([0, 2, 0]), np.array([1.0, 2.0, 3.0], np.float32), axis=0)
>>> out.tolist()
[4.0, 0.0, 2.0]
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.conv_backward import accumulate_dtype
from pyflow.kernels.dtypes import NUMERIC_DTYPES, names
from pyflow.kernels.elementwise import position
from pyflow.kernels.indexing import _check_index_dtype, _new_status, _raise_if_bad_cpu, _raise_if_bad_cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.launch import elementwise_config, launcher
from pyflow.kernels.layout import as_kernel_shape, flat, normalize_axis
from pyflow.kernels.movement import _check_devices, _expect_out, record_bad_index
from pyflow.kernels.registry import register

__all__ = ["make_add_along_gather", "check_in_range_strided"]


# --- device code ----------------------------------------------------------------


@functools.cache
def make_add_along_gather(acc_dtype):
    """The index_add / scatter_add kernel, summing in ``acc_dtype`` (``accumulate_dtype`` of out's)."""
    acc_type = numba.from_dtype(np.dtype(acc_dtype))

    @jit
    def add_along_gather(out, out_strides, shape, along, source, source_strides, source_axis_stride, index,
                         index_strides, index_axis_stride, count, n):
        """``out[idx] += source[idx off the axis, m]`` for every m in ``[0, count)`` whose index is idx's
        coordinate on the axis, in order of m (index_add, scatter_add).

        The loop runs over ``shape``: out's own, or (scatter_add) index's with out's size
        on the axis.  ``along`` is 1 on the axis and 0 elsewhere (``position`` with it
        gives the coordinate on the axis); source's and index's strides are 0 on the
        axis, and m moves along it by ``*_axis_stride``.  Rules: a thread owns its
        element of out; it reads it once into ``acc_type``, reads every index along
        the axis, adds source (cast to ``acc_type``) only where the index matches, and
        writes out once, if anything matched (one rounding to out's dtype).  A bad
        index matches no element, so it is never followed.
        """
        # Code plan: 1. grid-stride over shape; 2. this element's coordinate j on the axis, the
        # starts of its lines of index and source, its value in acc; 3. for m = 0, 1, ...:
        # index == j -> acc += source; 4. anything added -> write acc back once.
        i = cuda.grid(1)
        while i < n:
            j = position(i, shape, along)
            target = position(i, shape, out_strides)
            source_line = position(i, shape, source_strides)
            index_line = position(i, shape, index_strides)
            acc = acc_type(out[target])
            added = False
            for m in range(count):
                if index[index_line + m * index_axis_stride] == j:
                    acc += acc_type(source[source_line + m * source_axis_stride])
                    added = True
            if added:
                out[target] = acc
            i += cuda.gridsize(1)

    return add_along_gather


@jit
def check_in_range_strided(index, shape, index_strides, axis_size, status, n):
    """Record every entry of the (strided, any rank) ``index`` outside ``[0, axis_size)``."""
    i = cuda.grid(1)
    while i < n:
        k = index[position(i, shape, index_strides)]
        if k < 0 or k >= axis_size:
            record_bad_index(status, k)
        i += cuda.gridsize(1)


# --- checks (host) -----------------------------------------------------------------


def _check_accumulate(op, out, index, source, axis) -> int:
    """The checks index_add and scatter_add share, but the shapes; returns the normalized axis."""
    axis = normalize_axis(axis, out.ndim, op)
    _check_index_dtype(op, index)
    _expect_out(op, out, out.shape, out.dtype)
    if np.dtype(out.dtype) not in NUMERIC_DTYPES:
        raise DTypeError(f"{op}: unsupported dtype {out.dtype}; expected one of {names(NUMERIC_DTYPES)}")
    if np.dtype(source.dtype) != np.dtype(out.dtype):
        raise DTypeError(f"{op}: source dtype {source.dtype} differs from out's {out.dtype}")
    return axis


def _check_index_add(out, index, source, axis) -> int:
    axis = _check_accumulate("index_add", out, index, source, axis)
    if index.ndim != 1:
        raise ShapeError(f"index_add: index must be 1-D, got shape {tuple(index.shape)}")
    expected = tuple(len(index) if d == axis else n for d, n in enumerate(out.shape))
    if tuple(source.shape) != expected:
        raise ShapeError(f"index_add: source has shape {tuple(source.shape)}, expected {expected} "
                         f"(out's shape {tuple(out.shape)} with the {len(index)} indices along axis {axis})")
    return axis


def _check_scatter_add(out, index, source, axis) -> int:
    axis = _check_accumulate("scatter_add", out, index, source, axis)
    if index.ndim != out.ndim or any(i > n for d, (i, n) in enumerate(zip(index.shape, out.shape)) if d != axis):
        raise ShapeError(f"scatter_add: index shape {tuple(index.shape)} must have the rank of out, "
                         f"{tuple(out.shape)}, and be no larger off axis {axis}")
    if tuple(source.shape) != tuple(index.shape):
        raise ShapeError(f"scatter_add: source has shape {tuple(source.shape)}, expected index's "
                         f"{tuple(index.shape)}")
    return axis


# --- the ops -------------------------------------------------------------------------


def _add_along_cuda(op, out, index, source, axis, shape, index_strides, index_axis_stride, count, check, stream):
    """The shared launch of index_add / scatter_add: check every index first, then gather over ``shape``."""
    size = out.shape[axis]
    if not index.size:
        return
    if check:
        status = _new_status(stream)
        i_storage, i_strides = flat(index)
        grid, block = elementwise_config(index.size)
        launcher(check_in_range_strided, grid, block, stream)(
            i_storage, as_kernel_shape(index.shape), i_strides, size, status, index.size)
        _raise_if_bad_cuda(op, status, axis, size, stream)
    n = math.prod(shape)
    if not n:
        return
    (out_storage, out_strides), (s_storage, s_strides), (i_storage, _) = flat(out), flat(source), flat(index)
    along = tuple(1 if d == axis else 0 for d in range(out.ndim))
    source_off_axis = tuple(0 if d == axis else s for d, s in enumerate(s_strides))
    kernel = make_add_along_gather(accumulate_dtype(out.dtype))
    grid, block = elementwise_config(n, [out.dtype])
    launcher(kernel, grid, block, stream)(
        out_storage, out_strides, shape, along, s_storage, source_off_axis, s_strides[axis], i_storage,
        index_strides, index_axis_stride, count, n)


def _add_at_cpu(out, where, source) -> None:
    """``np.add.at(out, where, source)``, summing in ``accumulate_dtype``: for float16, on a float32
    copy of out, the elements that received a term then rounded back once (as the kernel does)."""
    acc = accumulate_dtype(out.dtype)
    if acc == out.dtype:
        np.add.at(out, where, source)
        return
    total = out.astype(acc)
    np.add.at(total, where, source.astype(acc))
    with np.errstate(over="ignore"):  # a sum past float16's range becomes inf, as on cuda
        out[where] = total[where]


def _make_index_add(target):
    def index_add(out, index, source, *, axis, check=True, stream=0):
        _check_devices(target, "index_add", out, index, source)
        axis = _check_index_add(out, index, source, axis)
        if target == "cpu":
            _raise_if_bad_cpu("index_add", index, axis, out.shape[axis])  # before adding anything
            _add_at_cpu(out, (slice(None),) * axis + (np.asarray(index),), np.asarray(source))
            return
        # index is the same for every element off the axis (strides 0), and moves along it
        (i_stride,) = flat(index)[1]
        _add_along_cuda("index_add", out, index, source, axis, tuple(out.shape), (0,) * out.ndim, i_stride,
                        len(index), check, stream)
    return index_add


def _make_scatter_add(target):
    def scatter_add(out, index, source, *, axis, check=True, stream=0):
        _check_devices(target, "scatter_add", out, index, source)
        axis = _check_scatter_add(out, index, source, axis)
        if target == "cpu":
            _raise_if_bad_cpu("scatter_add", index, axis, out.shape[axis])  # before adding anything
            where = list(np.indices(index.shape, sparse=True))
            where[axis] = np.asarray(index)
            _add_at_cpu(out, tuple(where), np.asarray(source))
            return
        # over index's extent off the axis (the rest of out gets nothing), out's size on it
        shape = tuple(out.shape[d] if d == axis else n for d, n in enumerate(index.shape))
        i_strides = flat(index)[1]
        index_off_axis = tuple(0 if d == axis else s for d, s in enumerate(i_strides))
        _add_along_cuda("scatter_add", out, index, source, axis, shape, index_off_axis, i_strides[axis],
                        index.shape[axis], check, stream)
    return scatter_add


for _target in ("cpu", "cuda"):
    register("index_add", _target, _make_index_add(_target))
    register("scatter_add", _target, _make_scatter_add(_target))


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array, tuple_of

    i64, t3 = types.int64, tuple_of(3)
    status = array("int64")
    cases = [(f"check_in_range_strided[{idx}]", check_in_range_strided.py_func,
              (array(idx), t3, t3, i64, status, i64), False) for idx in ("int32", "int64")]
    for data, idx in (("float32", "int32"), ("float64", "int64"), ("float16", "int64"), ("float16", "int32"),
                      ("uint8", "int32"), ("int8", "int64"), ("int16", "int32"), ("int32", "int64"),
                      ("int64", "int32")):
        a, i, acc = array(data), array(idx), accumulate_dtype(data)
        cases.append((f"add_along_gather[{data},{idx},acc={acc}]", make_add_along_gather(acc).py_func,
                      (a, t3, t3, t3, a, t3, i64, i, t3, i64, i64, i64), False))
    return cases
