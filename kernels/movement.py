"""Data movement: slice, concat, split, add_n, permute, transpose, gather, index_select.

The compiler's boxing (split/concat/slice/add_n for SBP conversions) and the
models (embedding lookups, gathers) move data between tensors with these ops.
Every registered function writes into a preallocated ``out``; ``stream`` is a
keyword (the cpu twins ignore it)::

    slice(out, x, *, starts, stops, steps, stream=0)      out = x[start:stop:step, ...]
    concat(out, inputs, *, axis, stream=0)                out = np.concatenate(inputs, axis)
    split(outs, x, *, axis, stream=0)                     the inverse: sizes of outs along axis
    add_n(out, inputs, *, stream=0)                       out = inputs[0] + inputs[1] + ...
    permute(out, x, *, perm, stream=0)                    out = np.transpose(x, perm)
    transpose(out, x, *, dim0, dim1, stream=0)            swap two axes (torch.transpose)
    gather(out, table, indices, *, stream=0, check=True)  out = table[indices]   (axis 0)
    index_select(out, x, index, *, axis, stream=0, check=True)   np.take(x, index, axis)

How they run:
* slice, concat, split, permute, transpose are *copies between strided views*:
  the host builds the views (``x[a:b:s]``, the part of ``out`` one input fills, a
  permuted view; ``layout.sliced_view`` and ``permuted_view``, on every backend) and
  the elementwise ``copy`` kernel, which reads and writes any layout, moves the
  data: one launch per view, so k launches for k inputs.
* add_n reuses the elementwise ``add`` (``out = x0 + x1``, then ``out = out + xi``);
  ``out`` may be ``inputs[0]`` or ``inputs[1]`` but no later input.
* gather and index_select are one kernel, ``take_strided``: an index read per
  output element.  An index ``k`` in ``[-n, n)`` is valid (negative ones wrap, as
  in numpy); any other index is never used to read memory.  The cpu twin lets
  numpy find it; the kernel records it in a small device ``status`` array
  (int64[2]: a flag and the largest bad index) with atomics, and the host raises
  ``IndexOutOfRangeError`` (op, value, dimension size) if ``check=True``.
  **Cost of check=True**: a host->device copy of ``status`` before the launch, a
  device->host copy after it, and a synchronisation of the stream, so the call
  waits for the kernel and cannot overlap with later host work.  With
  ``check=False`` nothing waits; cells whose index is bad are left unwritten.
  Every index is checked even when the output is empty (as numpy's ``x[index]``
  from 2.3 on; numpy 2.0-2.2 only warn there, and ``np.take`` skips the check
  whenever the output is empty, so the cpu twin checks the indices itself).

dtypes: every dtype of ``kernels/dtypes.py`` (add_n: numbers, not bool); indices
int32 or int64.  ``kernels/indexing.py`` has dim_gather and index_copy.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from pyflow.errors import AxisError, DTypeError, IndexOutOfRangeError, ShapeError
from pyflow.kernels import elementwise  # noqa: F401  (registers "copy", "cast", "add")
from pyflow.kernels.backend import cuda
from pyflow.kernels.dtypes import INDEX_DTYPES, NUMERIC_DTYPES, SUPPORTED_DTYPES
from pyflow.kernels.elementwise import binary_result_dtype, position
from pyflow.kernels.jit import jit
from pyflow.kernels.launch import elementwise_config, launcher, require_device_arrays
from pyflow.kernels.layout import as_kernel_shape, flat, normalize_axis, permuted_view, sliced_view
from pyflow.kernels.registry import get_kernel, register

__all__ = ["INDEX_DTYPES", "check_indices", "permuted_view", "record_bad_index", "take_strided"]

_NUMERIC = NUMERIC_DTYPES
_NO_BAD_INDEX = np.iinfo(np.int64).min   # status[1] before any thread records a bad index


# --- device code ----------------------------------------------------------------


@jit(device=True)
def record_bad_index(status, value):
    """Raise the flag ``status[0]`` and keep the largest bad index in ``status[1]`` (atomics)."""
    cuda.atomic.max(status, 0, 1)
    cuda.atomic.max(status, 1, value)


@jit
def take_strided(out, out_strides, shape, x, x_strides, axis_stride, axis_size,
                 index, index_strides, status, n):
    """``out[pre, j, post] = x[pre, index[j], post]`` with ``j`` any index position.

    Every operand is seen over the output's ``shape``: ``x_strides`` are 0 on the
    index dims (the index picks the position along the gathered axis, whose
    stride is ``axis_stride``), ``index_strides`` are 0 on the pre and post dims.
    Rules: one index read and (when the index is valid) one read of ``x`` and one
    write of ``out`` per output element; a bad index is recorded, never followed.
    """
    # Code plan: 1. grid-stride over the output's linear indices;
    # 2. read this element's index and wrap a negative one (k + size);
    # 3. valid: copy x's element at that position along the axis into out;
    # 4. invalid: leave out alone and record the index in status.
    i = cuda.grid(1)
    while i < n:
        k = index[position(i, shape, index_strides)]
        j = k + axis_size if k < 0 else k
        if j >= 0 and j < axis_size:
            out[position(i, shape, out_strides)] = x[position(i, shape, x_strides) + j * axis_stride]
        else:
            record_bad_index(status, k)
        i += cuda.gridsize(1)


@jit
def check_indices(index, shape, index_strides, axis_size, status, n):
    """Record any index outside ``[-axis_size, axis_size)`` (used when the output is empty)."""
    i = cuda.grid(1)
    while i < n:
        k = index[position(i, shape, index_strides)]
        if k < -axis_size or k >= axis_size:
            record_bad_index(status, k)
        i += cuda.gridsize(1)


# --- views and checks (host) ------------------------------------------------------


def _along(array, axis: int, start: int, size: int):
    """The view ``array[..., start:start + size, ...]`` (``axis`` is the sliced one)."""
    return sliced_view(array, (slice(None),) * axis + (slice(start, start + size),))


def _expect_out(op, out, shape, dtype, what="output") -> None:
    shape, dtype = tuple(shape), np.dtype(dtype)
    if tuple(out.shape) != shape:
        raise ShapeError(f"{op}: {what} has shape {tuple(out.shape)}, expected {shape}")
    if np.dtype(out.dtype) != dtype:
        raise DTypeError(f"{op}: {what} dtype is {out.dtype}, expected {dtype}")
    if np.dtype(out.dtype) not in SUPPORTED_DTYPES:
        raise DTypeError(f"{op}: unsupported dtype {out.dtype}")
    if math.prod(shape) and any(s == 0 and n > 1 for s, n in zip(out.strides, out.shape)):
        raise ShapeError(f"{op}: the {what} is a broadcast view (stride 0): threads would race")


def _check_devices(target, op, *arrays) -> None:
    if target == "cuda":
        require_device_arrays(op, *arrays)


def _same_except_axis(op, what, shapes, ndim, axis, reference=None) -> None:
    """ShapeError unless every shape has rank ``ndim`` and matches ``reference`` off ``axis``."""
    reference = tuple(reference if reference is not None else shapes[0])
    for shape in shapes:
        if len(shape) != ndim or any(a != b for d, (a, b) in enumerate(zip(shape, reference)) if d != axis):
            listed = ", ".join(str(tuple(s)) for s in shapes)
            raise ShapeError(f"{op}: {what} shapes {listed} must have rank {ndim} and equal sizes except "
                             f"along axis {axis}" + (f" (x has shape {reference})" if what == "output" else ""))


# --- slice, concat, split, permute, transpose: copies between views ------------------


def _make_slice(target):
    def slice_(out, x, *, starts, stops, steps, stream=0):
        _check_devices(target, "slice", out, x)
        if not len(starts) == len(stops) == len(steps) == x.ndim:
            raise ShapeError(f"slice: starts {tuple(starts)}, stops {tuple(stops)}, steps {tuple(steps)} "
                             f"need one entry per dimension of x, shape {tuple(x.shape)}")
        for step in steps:
            if step is not None and step <= 0:
                raise ShapeError(f"slice: steps {tuple(steps)} must be positive (got {step})")
        index = tuple(slice(a, b, s) for a, b, s in zip(starts, stops, steps))
        shape = tuple(len(range(*s.indices(n))) for s, n in zip(index, x.shape))
        _expect_out("slice", out, shape, x.dtype)
        if math.prod(shape):
            get_kernel("copy", target)(out, sliced_view(x, index), stream=stream)
    return slice_


def _make_concat(target):
    def concat(out, inputs, *, axis, stream=0):
        inputs = list(inputs)
        _check_devices(target, "concat", out, *inputs)
        if not inputs:
            raise ShapeError("concat: needs at least one input")
        if any(x.ndim == 0 for x in inputs):
            raise ShapeError(f"concat: 0-d tensors cannot be concatenated "
                             f"(shapes {', '.join(str(tuple(x.shape)) for x in inputs)})")
        ndim = inputs[0].ndim
        axis = normalize_axis(axis, ndim, "concat")
        _same_except_axis("concat", "input", [x.shape for x in inputs], ndim, axis)
        for x in inputs:
            if np.dtype(x.dtype) != np.dtype(out.dtype):
                raise DTypeError(f"concat: input dtypes {', '.join(str(x.dtype) for x in inputs)} "
                                 f"must all equal the output's {out.dtype}")
        shape = list(inputs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in inputs)
        _expect_out("concat", out, shape, out.dtype)
        # Code plan: input i fills out[..., offset_i:offset_i + size_i, ...].
        offset = 0
        for x in inputs:
            if x.size:
                get_kernel("copy", target)(_along(out, axis, offset, x.shape[axis]), x, stream=stream)
            offset += x.shape[axis]
    return concat


def _make_split(target):
    def split(outs, x, *, axis, stream=0):
        outs = list(outs)
        _check_devices(target, "split", x, *outs)
        if not outs:
            raise ShapeError("split: needs at least one output")
        axis = normalize_axis(axis, x.ndim, "split")
        _same_except_axis("split", "output", [o.shape for o in outs], x.ndim, axis, reference=x.shape)
        sizes = [o.shape[axis] for o in outs]
        if sum(sizes) != x.shape[axis]:
            raise ShapeError(f"split: output sizes {sizes} along axis {axis} add up to {sum(sizes)}, "
                             f"but x has {x.shape[axis]} there (shape {tuple(x.shape)})")
        for i, o in enumerate(outs):
            _expect_out("split", o, o.shape, x.dtype, what=f"output {i}")
        offset = 0
        for o in outs:
            if o.size:
                get_kernel("copy", target)(o, _along(x, axis, offset, o.shape[axis]), stream=stream)
            offset += o.shape[axis]
    return split


def _permute(target, op, out, x, perm, stream):
    shape = tuple(x.shape[p] for p in perm)
    _expect_out(op, out, shape, x.dtype)
    if math.prod(shape):
        get_kernel("copy", target)(out, permuted_view(x, perm), stream=stream)


def _make_permute(target):
    def permute(out, x, *, perm, stream=0):
        _check_devices(target, "permute", out, x)
        if len(perm) != x.ndim:
            raise ShapeError(f"permute: perm {tuple(perm)} needs one entry per dimension of x, "
                             f"shape {tuple(x.shape)}")
        axes = tuple(normalize_axis(p, x.ndim, "permute") for p in perm)
        if sorted(axes) != list(range(x.ndim)):
            raise AxisError(f"permute: perm {tuple(perm)} repeats an axis; it must be a permutation "
                            f"of {tuple(range(x.ndim))}")
        _permute(target, "permute", out, x, axes, stream)
    return permute


def _make_transpose(target):
    def transpose(out, x, *, dim0, dim1, stream=0):
        _check_devices(target, "transpose", out, x)
        a, b = normalize_axis(dim0, x.ndim, "transpose"), normalize_axis(dim1, x.ndim, "transpose")
        perm = list(range(x.ndim))
        perm[a], perm[b] = b, a
        _permute(target, "transpose", out, x, tuple(perm), stream)
    return transpose


# --- add_n: the elementwise add, accumulated in place ---------------------------------


def _make_add_n(target):
    def add_n(out, inputs, *, stream=0):
        inputs = list(inputs)
        _check_devices(target, "add_n", out, *inputs)
        if not inputs:
            raise ShapeError("add_n: needs at least one input")
        for x in inputs:
            if np.dtype(x.dtype) not in _NUMERIC:
                raise DTypeError(f"add_n: unsupported dtype {x.dtype}; expected one of "
                                 f"{', '.join(map(str, _NUMERIC))}")
        if any(tuple(x.shape) != tuple(inputs[0].shape) for x in inputs):
            raise ShapeError(f"add_n: inputs must have one shape, got "
                             f"{', '.join(str(tuple(x.shape)) for x in inputs)}")
        dtype = functools.reduce(lambda a, b: binary_result_dtype("add", a, b), [x.dtype for x in inputs])
        _expect_out("add_n", out, inputs[0].shape, dtype)
        if not out.size:
            return
        # Code plan: out = x0 + x1 when that already has the final dtype (else out = x0
        # converted); then out = out + xi in place: each thread reads then writes its cell.
        if len(inputs) > 1 and binary_result_dtype("add", inputs[0].dtype, inputs[1].dtype) == dtype:
            get_kernel("add", target)(out, inputs[0], inputs[1], stream=stream)
            rest = inputs[2:]
        else:
            get_kernel("cast", target)(out, inputs[0], stream=stream)
            rest = inputs[1:]
        for x in rest:
            get_kernel("add", target)(out, out, x, stream=stream)
    return add_n


# --- gather and index_select ---------------------------------------------------------


def _check_take(op, out, x, index, axis):
    """Shape and dtype checks; returns the normalized axis."""
    axis = normalize_axis(axis, x.ndim, op)
    if np.dtype(index.dtype) not in INDEX_DTYPES:
        raise DTypeError(f"{op}: indices must be int32 or int64, got {index.dtype}")
    _expect_out(op, out, tuple(x.shape[:axis]) + tuple(index.shape) + tuple(x.shape[axis + 1:]), x.dtype)
    return axis


def _out_of_range(op, value, axis, size) -> IndexOutOfRangeError:
    valid = f"valid: {-size} to {size - 1}" if size else "the dimension is empty"
    return IndexOutOfRangeError(f"{op}: index {value} is out of range for dimension {axis} "
                                f"of size {size} ({valid})")


def _take_cpu(op, out, x, index, axis):
    """numpy's ``np.take(x, index, axis)`` into out, after checking every index here: np.take
    skips the check when the output is empty (another axis of size 0)."""
    n = x.shape[axis]
    bad = np.asarray(index)[(index < -n) | (index >= n)]
    if bad.size:
        raise _out_of_range(op, int(bad.max()), axis, n)
    np.take(x, index, axis=axis, out=out)  # straight into out, negative indices wrap


def _synchronize(stream) -> None:
    sync = getattr(stream, "synchronize", None)
    sync() if callable(sync) else cuda.synchronize()


def _take_cuda(op, out, x, index, axis, stream, check):
    n_out, n_index, size = math.prod(out.shape), math.prod(index.shape), x.shape[axis]
    if not n_index:
        return
    status = cuda.to_device(np.array([0, _NO_BAD_INDEX], np.int64), stream=stream)
    index_storage, index_strides = flat(index)  # a 0-d index: shape (1,), stride (0,)
    if n_out:
        shape = as_kernel_shape(out.shape)
        out_storage, out_strides = flat(out)
        x_storage, x_strides = flat(x)
        # out's dims are x's pre-axis dims + index dims + x's post-axis dims: see each operand over them
        pad = (0,) * (x.ndim - axis - 1)
        own = index_strides if index.ndim else ()
        x_over_out = x_strides[:axis] + (0,) * index.ndim + x_strides[axis + 1:] or (0,)
        index_over_out = (0,) * axis + own + pad or (0,)
        grid, block = elementwise_config(n_out, [out.dtype, x.dtype])
        launcher(take_strided, grid, block, stream)(
            out_storage, out_strides, shape, x_storage, x_over_out, x_strides[axis], size,
            index_storage, index_over_out, status, n_out)
    else:  # nothing to write, but every index must still be valid
        grid, block = elementwise_config(n_index)
        launcher(check_indices, grid, block, stream)(
            index_storage, as_kernel_shape(index.shape), index_strides, size, status, n_index)
    if check:
        flags = status.copy_to_host(stream=stream)
        _synchronize(stream)
        if flags[0]:
            raise _out_of_range(op, int(flags[1]), axis, size)


def _make_gather(target):
    def gather(out, table, indices, *, stream=0, check=True):
        _check_devices(target, "gather", out, table, indices)
        _check_take("gather", out, table, indices, 0)
        if target == "cpu":
            _take_cpu("gather", out, table, indices, 0)
        else:
            _take_cuda("gather", out, table, indices, 0, stream, check)
    return gather


def _make_index_select(target):
    def index_select(out, x, index, *, axis, stream=0, check=True):
        _check_devices(target, "index_select", out, x, index)
        if index.ndim != 1:
            raise ShapeError(f"index_select: index must be 1-D, got shape {tuple(index.shape)}")
        axis = _check_take("index_select", out, x, index, axis)
        if target == "cpu":
            _take_cpu("index_select", out, x, index, axis)
        else:
            _take_cuda("index_select", out, x, index, axis, stream, check)
    return index_select


_FACTORIES = {"slice": _make_slice, "concat": _make_concat, "split": _make_split, "add_n": _make_add_n,
              "permute": _make_permute, "transpose": _make_transpose, "gather": _make_gather,
              "index_select": _make_index_select}
for _op, _make in _FACTORIES.items():
    for _target in ("cpu", "cuda"):
        register(_op, _target, _make(_target))


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array, tuple_of

    i64, t1, t2, t3 = types.int64, tuple_of(1), tuple_of(2), tuple_of(3)
    status = array("int64")
    cases = [("record_bad_index[int32]", record_bad_index.py_func, (status, types.int32), True),
             ("record_bad_index[int64]", record_bad_index.py_func, (status, i64), True)]
    for data, idx in (("float32", "int32"), ("float64", "int64"), ("bool", "int64"), ("float16", "int32"),
                      ("uint8", "int64"), ("int8", "int32"), ("int16", "int64")):
        cases.append((f"take_strided[{data},{idx}]", take_strided.py_func,
                      (array(data), t3, t3, array(data), t3, i64, i64, array(idx), t3, status, i64), False))
    for idx in ("int32", "int64"):
        cases.append((f"check_indices[{idx}]", check_indices.py_func,
                      (array(idx), t2, t2, i64, status, i64), False))
    cases.append(("check_indices[int32, 1-d]", check_indices.py_func, (array("int32"), t1, t1, i64, status, i64),
                  False))
    return cases
