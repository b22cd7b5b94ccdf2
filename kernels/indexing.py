"""dim_gather and index_copy: PyTorch's ``gather`` and ``index_copy_``.

    dim_gather(out, x, index, *, axis, check=True, stream=0)     out = torch.gather(x, axis, index)
    index_copy(out, index, source, *, axis, check=True, stream=0)    out.index_copy_(axis, index, source)

**dim_gather** (numpy: ``np.take_along_axis``): ``index`` has x's rank,
``index.shape[d] <= x.shape[d]`` off ``axis``, and ``out.shape == index.shape``::

    out[i, j, k] = x[i, index[i, j, k], k]          (axis = 1)

**index_copy** writes into ``out`` in place: ``index`` is 1-D, ``source`` has
out's shape except ``len(index)`` along ``axis``; slice ``i`` of source goes to
slice ``index[i]`` of out, every other element of out is left alone::

    out[:, index[i], :] = source[:, i, :]            (axis = 1)

With a repeated index, several slices of source go to one slice of out and any
one of them wins (the last, on the CPU; whichever thread writes last, on a GPU).
Their adjoints, which *add* (``index_add``, ``scatter_add``: autograd's backward of
index_select and dim_gather), are ``kernels/index_add.py``'s; they check indices
with this module's helpers.

Indices are int32 or int64 and must lie in ``[0, size)``: a negative index is out
of range here (PyTorch wraps none either), and raises ``IndexOutOfRangeError``
naming the op, the largest bad value, the axis and its size.  Checking on cuda
costs what ``gather``'s does (``kernels/movement.py``: a small ``status`` array,
copies and a stream synchronisation); ``check=False`` skips the wait:
* dim_gather checks after its kernel (``out`` is fresh; cells with a bad index
  are left unwritten);
* index_copy checks *before* it writes, so a bad index leaves ``out`` untouched on
  both targets (with ``check=False`` the slices with a bad index are skipped).

dtypes: every dtype of ``kernels/dtypes.py``; ``out``, ``x`` and ``source`` share
one.  Kernels: one index read, one read and one write per element copied, in a
grid-stride loop (``position`` turns a linear index into each operand's storage
offset, with the indexed axis's stride set to 0 and added back as ``k * stride``).

>>> import numpy as np
>>> from pyflow.kernels.registry import get_kernel
>>> out = np.zeros((2, 2), np.float32)
>>> get_kernel("dim_gather", "cpu")(out, np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), np.array([[1, 0], [0, 0]]),
...                                 axis=1)
>>> out.tolist()
[[2.0, 1.0], [3.0, 3.0]]
"""

from __future__ import annotations

import math

import numpy as np

from pyflow.errors import DTypeError, IndexOutOfRangeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.dtypes import INDEX_DTYPES
from pyflow.kernels.elementwise import position
from pyflow.kernels.jit import jit
from pyflow.kernels.launch import elementwise_config, launcher
from pyflow.kernels.layout import as_kernel_shape, flat, normalize_axis
from pyflow.kernels.movement import _NO_BAD_INDEX, _check_devices, _expect_out, _synchronize, record_bad_index
from pyflow.kernels.registry import register

__all__ = ["take_along_strided", "put_along_strided", "check_in_range"]


# --- device code ----------------------------------------------------------------


@jit
def take_along_strided(out, out_strides, shape, x, x_strides, axis_stride, axis_size, index, index_strides,
                       status, n):
    """``out[idx] = x[idx with its axis coordinate replaced by index[idx]]`` (dim_gather).

    ``x_strides`` has 0 on the gathered axis: the index value ``k`` moves along it
    by ``k * axis_stride``.  A bad index is recorded, never followed.
    """
    # Code plan: 1. grid-stride over the output; 2. read this element's index k;
    # 3. in [0, axis_size): copy x's element k along the axis; else record k in status.
    i = cuda.grid(1)
    while i < n:
        k = index[position(i, shape, index_strides)]
        if k >= 0 and k < axis_size:
            out[position(i, shape, out_strides)] = x[position(i, shape, x_strides) + k * axis_stride]
        else:
            record_bad_index(status, k)
        i += cuda.gridsize(1)


@jit
def put_along_strided(out, out_strides, shape, axis_stride, axis_size, source, source_strides, index,
                      index_strides, status, n):
    """``out[idx with its axis coordinate replaced by index[that coordinate]] = source[idx]`` (index_copy).

    The loop runs over source's ``shape``; ``out_strides`` has 0 on the axis and
    ``index_strides`` is 0 everywhere but on the axis.
    """
    # Code plan: 1. grid-stride over source; 2. read the index k of this element's slice;
    # 3. in [0, axis_size): write the element into slice k of out; else record k.
    i = cuda.grid(1)
    while i < n:
        k = index[position(i, shape, index_strides)]
        if k >= 0 and k < axis_size:
            out[position(i, shape, out_strides) + k * axis_stride] = source[position(i, shape, source_strides)]
        else:
            record_bad_index(status, k)
        i += cuda.gridsize(1)


@jit
def check_in_range(index, index_stride, axis_size, status, n):
    """Record every entry of the 1-D ``index`` outside ``[0, axis_size)``."""
    i = cuda.grid(1)
    while i < n:
        k = index[i * index_stride]
        if k < 0 or k >= axis_size:
            record_bad_index(status, k)
        i += cuda.gridsize(1)


# --- checks (host) -----------------------------------------------------------------


def _out_of_range(op, value, axis, size) -> IndexOutOfRangeError:
    valid = f"valid: 0 to {size - 1}" if size else "the dimension is empty"
    return IndexOutOfRangeError(f"{op}: index {value} is out of range for dimension {axis} "
                                f"of size {size} ({valid})")


def _check_index_dtype(op, index):
    if np.dtype(index.dtype) not in INDEX_DTYPES:
        raise DTypeError(f"{op}: indices must be int32 or int64, got {index.dtype}")


def _raise_if_bad_cpu(op, index, axis, size) -> None:
    index = np.asarray(index)
    bad = index[(index < 0) | (index >= size)]
    if bad.size:
        raise _out_of_range(op, int(bad.max()), axis, size)


def _new_status(stream):
    return cuda.to_device(np.array([0, _NO_BAD_INDEX], np.int64), stream=stream)


def _raise_if_bad_cuda(op, status, axis, size, stream) -> None:
    flags = status.copy_to_host(stream=stream)
    _synchronize(stream)
    if flags[0]:
        raise _out_of_range(op, int(flags[1]), axis, size)


def _check_dim_gather(out, x, index, axis) -> int:
    axis = normalize_axis(axis, x.ndim, "dim_gather")
    _check_index_dtype("dim_gather", index)
    if index.ndim != x.ndim or any(i > n for d, (i, n) in enumerate(zip(index.shape, x.shape)) if d != axis):
        raise ShapeError(f"dim_gather: index shape {tuple(index.shape)} must have the rank of x, "
                         f"{tuple(x.shape)}, and be no larger off axis {axis}")
    _expect_out("dim_gather", out, index.shape, x.dtype)
    return axis


def _check_index_copy(out, index, source, axis) -> int:
    axis = normalize_axis(axis, out.ndim, "index_copy")
    _check_index_dtype("index_copy", index)
    if index.ndim != 1:
        raise ShapeError(f"index_copy: index must be 1-D, got shape {tuple(index.shape)}")
    expected = tuple(len(index) if d == axis else n for d, n in enumerate(out.shape))
    if tuple(source.shape) != expected:
        raise ShapeError(f"index_copy: source has shape {tuple(source.shape)}, expected {expected} "
                         f"(out's shape {tuple(out.shape)} with the {len(index)} indices along axis {axis})")
    if np.dtype(source.dtype) != np.dtype(out.dtype):
        raise DTypeError(f"index_copy: source dtype {source.dtype} differs from out's {out.dtype}")
    _expect_out("index_copy", out, out.shape, out.dtype)
    return axis


# --- the ops -------------------------------------------------------------------------


def _make_dim_gather(target):
    def dim_gather(out, x, index, *, axis, check=True, stream=0):
        _check_devices(target, "dim_gather", out, x, index)
        axis = _check_dim_gather(out, x, index, axis)
        size = x.shape[axis]
        if target == "cpu":
            _raise_if_bad_cpu("dim_gather", index, axis, size)
            part = x[tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(index.shape))]
            out[...] = np.take_along_axis(part, index, axis=axis)
            return
        n = math.prod(index.shape)
        if not n:
            return
        status = _new_status(stream)
        (out_storage, out_strides), (x_storage, x_strides), (i_storage, i_strides) = flat(out), flat(x), flat(index)
        x_off_axis = tuple(0 if d == axis else s for d, s in enumerate(x_strides))
        grid, block = elementwise_config(n, [out.dtype])
        launcher(take_along_strided, grid, block, stream)(
            out_storage, out_strides, as_kernel_shape(index.shape), x_storage, x_off_axis, x_strides[axis], size,
            i_storage, i_strides, status, n)
        if check:
            _raise_if_bad_cuda("dim_gather", status, axis, size, stream)
    return dim_gather


def _make_index_copy(target):
    def index_copy(out, index, source, *, axis, check=True, stream=0):
        _check_devices(target, "index_copy", out, index, source)
        axis = _check_index_copy(out, index, source, axis)
        size = out.shape[axis]
        if target == "cpu":
            _raise_if_bad_cpu("index_copy", index, axis, size)  # before writing anything
            out[(slice(None),) * axis + (np.asarray(index),)] = source
            return
        if not len(index):
            return
        status = _new_status(stream)
        i_storage, (i_stride,) = flat(index)
        if check:  # every index, before any write
            grid, block = elementwise_config(len(index))
            launcher(check_in_range, grid, block, stream)(i_storage, i_stride, size, status, len(index))
            _raise_if_bad_cuda("index_copy", status, axis, size, stream)
        n = math.prod(source.shape)
        if not n:
            return
        (out_storage, out_strides), (s_storage, s_strides) = flat(out), flat(source)
        out_off_axis = tuple(0 if d == axis else s for d, s in enumerate(out_strides))
        index_on_axis = tuple(i_stride if d == axis else 0 for d in range(source.ndim))
        grid, block = elementwise_config(n, [out.dtype])
        launcher(put_along_strided, grid, block, stream)(
            out_storage, out_off_axis, as_kernel_shape(source.shape), out_strides[axis], size, s_storage, s_strides,
            i_storage, index_on_axis, status, n)
    return index_copy


for _target in ("cpu", "cuda"):
    register("dim_gather", _target, _make_dim_gather(_target))
    register("index_copy", _target, _make_index_copy(_target))


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array, tuple_of

    i64, t3 = types.int64, tuple_of(3)
    status = array("int64")
    cases = []
    for data, idx in (("float32", "int32"), ("float64", "int64"), ("bool", "int64"), ("float16", "int32"),
                      ("uint8", "int64"), ("int8", "int32"), ("int16", "int64"), ("int64", "int32")):
        a, i = array(data), array(idx)
        cases.append((f"take_along_strided[{data},{idx}]", take_along_strided.py_func,
                      (a, t3, t3, a, t3, i64, i64, i, t3, status, i64), False))
        cases.append((f"put_along_strided[{data},{idx}]", put_along_strided.py_func,
                      (a, t3, t3, i64, i64, a, t3, i, t3, status, i64), False))
    for idx in ("int32", "int64"):
        cases.append((f"check_in_range[{idx}]", check_in_range.py_func, (array(idx), i64, i64, status, i64), False))
    return cases
