"""What the compiled tier's generated code imports: the ``njit`` options, atomics, result codes.

The compiled tier (``compiled.py``) writes a kernel as a Python module of
``numba.njit`` functions (``fission.py`` writes it).  Everything that module needs
besides numpy, math and numba is here, so a student reading a generated module
finds every name in one short file.

Atomics: the compiled tier runs one simulated thread at a time, so an atomic
read-modify-write is a plain read and write.  Each helper returns the old value
and computes the new one exactly as numba's simulator does (``max`` keeps the
old value unless the new one is greater, so a NaN argument is ignored; ``inc``
and ``dec`` wrap at ``val``).  A launch with an atomic keeps its blocks on one
core (``Translation.blocks_independent``), so nothing here needs a lock.

Launch results (``launch`` returns one; ``report`` holds the details):
``OK``, ``DIVERGENT`` (threads of a block took different ways around a barrier),
``GRID_EXIT`` (a thread exited, another reached a grid barrier: a GPU hangs),
``GRID_PARTIAL`` (a grid barrier inside block-divergent control flow),
``GROUP_MISMATCH`` (a group barrier reached by another number of blocks than its
``members``), ``CANCELLED`` (the caller asked the launch to stop: Ctrl-C or a hang).

>>> import numpy as np
>>> a = np.zeros(3, np.int64)
>>> atomic_add(a, 1, 5), atomic_add(a, 1, 2), a.tolist()
(0, 5, [0, 7, 0])
"""

from __future__ import annotations

import functools
import math

import numba
import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

__all__ = ["JIT", "JIT_OPTIONS", "INNER", "DRIVER", "INNER_UNCHECKED", "DRIVER_UNCHECKED", "BARE", "BARE_UNCHECKED", "cancelled", "OK", "DIVERGENT", "GRID_EXIT", "GRID_PARTIAL", "GROUP_MISMATCH", "CANCELLED",
           "GROUP_KEY", "ELEMENT", "FELL_THROUGH", "EXITED", "BROKE", "CONTINUED", "STOPPED", "UNINITIALIZED_BYTE",
           "atomic_add", "atomic_sub", "atomic_and_", "atomic_or_", "atomic_xor", "atomic_inc", "atomic_dec",
           "atomic_exch", "atomic_max", "atomic_min", "atomic_nanmax", "atomic_nanmin", "atomic_cas",
           "atomic_compare_and_swap", "garbage", "array_at", "keep_array", "keep_array_everywhere", "stack_array",
           "copy_array", "copy_back", "fixed_shape"]

# boundscheck: an index out of range raises IndexError, as the threaded tier's numpy does;
# error_model="numpy": integer division by zero gives 0 and float division inf/nan, as on a GPU;
# nogil: two streams' launches really run at once; cache: compiled once per machine.
JIT_OPTIONS = {"boundscheck": True, "error_model": "numpy", "nogil": True, "cache": True}
JIT = njit(**JIT_OPTIONS)
# helpers (device functions without barriers) are only called from compiled code: no Python wrapper
INNER = njit(no_cpython_wrapper=True, no_cfunc_wrapper=True, **JIT_OPTIONS)
DRIVER = JIT
# PYFLOW_SIM_BOUNDSCHECK=0: no index checks.  A checked index costs a few ns and keeps LLVM from
# vectorizing a loop (a tiled matmul runs about 8 times slower checked); an index out of range
# unchecked reads garbage or corrupts memory, so the checks are on unless asked otherwise.
INNER_UNCHECKED = njit(no_cpython_wrapper=True, no_cfunc_wrapper=True, **{**JIT_OPTIONS, "boundscheck": False})
DRIVER_UNCHECKED = njit(**{**JIT_OPTIONS, "boundscheck": False})
# A node runs once per thread, and numba counts references to every array it is given: an atomic
# increment and decrement per array per call (about 17 ns, where the node's own work is often 1).
# A node allocates nothing, so it can do without numba's runtime (``_nrt=False``: no counts);
# a kernel whose code needs the runtime (a typed dict of per-thread arrays) is compiled with INNER.
BARE = njit(no_cpython_wrapper=True, no_cfunc_wrapper=True, _nrt=False, **JIT_OPTIONS)
BARE_UNCHECKED = njit(no_cpython_wrapper=True, no_cfunc_wrapper=True, _nrt=False,
                      **{**JIT_OPTIONS, "boundscheck": False})

# what launch() returns
OK, DIVERGENT, GRID_EXIT, GRID_PARTIAL, GROUP_MISMATCH, CANCELLED = 0, 1, 2, 3, 4, 9
# what a region returns for one thread: it ran to the end, returned (the thread exits), left or
# went on with the enclosing block-level loop, or was stopped (the launch is cancelled)
FELL_THROUGH, EXITED, BROKE, CONTINUED, STOPPED = 0, 1, 2, 3, 9
UNINITIALIZED_BYTE = 0xCD  # shared and local memory start as this byte, as in the threaded tier
GROUP_KEY = 1 << 31        # a group barrier's node gives slot * GROUP_KEY + members
ELEMENT = -2               # where[1] when where[2] is the element a collapsed grid-stride loop was at (blockwise.py)


@intrinsic
def _load_acquire(typingctx, flags):
    """``flags[0]`` read with an atomic (acquire) load, which LLVM never hoists out of a loop."""
    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.load_atomic(array.data, "acquire", 8)
    return types.int64(flags), codegen


@njit(cache=True, nogil=True)
def cancelled(flags) -> bool:
    """Has the launch been asked to stop?  Generated ``while`` loops ask it on every turn.

    A plain ``flags[0] != 0`` would be read once: LLVM sees no store in a spin loop and
    moves the load out of it, and the loop would never notice.
    """
    return _load_acquire(flags) != 0


@intrinsic
def array_at(typingctx, address, shape, dtype):
    """The C-contiguous array of ``dtype`` (``np.float32``) and ``shape`` whose elements start at ``address``
    (see ``keep_array``).  No owner, no reference count: ``numba.carray`` would do, but numba refuses a new
    array in code compiled without its runtime (``BARE``); here the array is built as LLVM values directly."""
    ndim = len(shape)
    element = dtype.instance_type
    result = types.Array(element, ndim, "C")

    def codegen(context, builder, signature, args):
        address_value, shape_value, _ = args
        array = context.make_array(result)(context, builder)
        intp = context.get_value_type(types.intp)
        itemsize = context.get_abi_sizeof(context.get_data_type(element))
        sizes = cgutils.unpack_tuple(builder, shape_value, ndim)
        strides, step = [], intp(itemsize)
        for size in reversed(sizes):
            strides.insert(0, step)
            step = builder.mul(step, size)
        data = builder.inttoptr(address_value, context.get_data_type(element).as_pointer())
        populate_array(array, data=data, shape=sizes, strides=strides, itemsize=intp(itemsize), meminfo=None)
        return array._getvalue()
    return result(address, shape, dtype), codegen


@functools.cache
def stack_array(shape: tuple, dtype):
    """A function ``f()`` giving a fresh C-contiguous array of this ``shape`` and ``dtype`` on the caller's stack.

    A thread's small ``cuda.local.array`` lives in the launch's table of local memory between
    barriers; inside one region the generated code copies it to such an array and back
    (``copy_array``).  Its shape and address are then constants LLVM can see, so it keeps the
    elements in registers: a register-tiled matmul's accumulators cost no memory traffic, as on a
    GPU.  The shape is fixed when the module is written (an ``alloca`` needs its size).
    """
    shape = tuple(int(d) for d in shape)
    element = numba.from_dtype(np.dtype(dtype))
    result = types.Array(element, len(shape), "C")

    @intrinsic
    def on_stack(typingctx):
        def codegen(context, builder, signature, args):
            data_type = context.get_data_type(element)
            data = cgutils.alloca_once(builder, data_type, size=max(1, math.prod(shape)))
            intp = context.get_value_type(types.intp)
            itemsize = context.get_abi_sizeof(data_type)
            strides, step = [], itemsize
            for size in reversed(shape):
                strides.insert(0, intp(step))
                step *= size
            array = context.make_array(result)(context, builder)
            populate_array(array, data=data, shape=[intp(d) for d in shape], strides=strides,
                           itemsize=intp(itemsize), meminfo=None)
            return array._getvalue()
        return result(), codegen

    return on_stack


def _copier(sized_by: int):
    """An intrinsic ``f(destination, source)``: ``destination[...] = source`` for two C-contiguous arrays
    of one shape and dtype, one memcpy of the byte count of argument ``sized_by`` (0 or 1)."""
    @intrinsic
    def copy(typingctx, destination, source):
        def codegen(context, builder, signature, args):
            to = context.make_array(signature.args[0])(context, builder, args[0])
            from_ = context.make_array(signature.args[1])(context, builder, args[1])
            sized = (to, from_)[sized_by]
            cgutils.raw_memcpy(builder, to.data, from_.data, builder.mul(sized.nitems, sized.itemsize), 1)
            return context.get_dummy_value()
        return types.none(destination, source), codegen
    return copy


# A stack copy of a local array (``stack_array``) is filled by ``copy_array(stack, row)`` and written back
# by ``copy_back(row, stack)``: both count the bytes of the stack copy, a constant LLVM sees, so each
# copy is a few moves (a byte count read from the launch's table was a call of memcpy per thread).
copy_array = _copier(0)
copy_back = _copier(1)


@intrinsic
def fixed_shape(typingctx, array, shape):
    """``array`` (C-contiguous) with ``shape``, a tuple of constants equal to its own: the same elements,
    a shape LLVM knows.  A block's ``cuda.shared.array`` is a row of the launch's table, whose shape
    is read at run time; seen through this, an index check against a constant folds away where the
    index is a loop counter below it (a tiled matmul's ``sb[kk, ...]``), and the others get cheaper."""
    ndim = len(shape)
    result = types.Array(array.dtype, ndim, "C")

    def codegen(context, builder, signature, args):
        source = context.make_array(signature.args[0])(context, builder, args[0])
        intp = context.get_value_type(types.intp)
        itemsize = context.get_abi_sizeof(context.get_data_type(array.dtype))
        sizes = cgutils.unpack_tuple(builder, args[1], ndim)
        strides, step = [], intp(itemsize)
        for size in reversed(sizes):
            strides.insert(0, step)
            step = builder.mul(step, size)
        view = context.make_array(result)(context, builder)
        populate_array(view, data=source.data, shape=sizes, strides=strides, itemsize=intp(itemsize),
                       meminfo=None)
        return view._getvalue()
    return result(array, shape), codegen


@JIT
def keep_array(table, g, array):
    """Thread ``g``'s array variable kept as where its elements are: ``[1, address, *shape]``.

    A C-contiguous array that lives across a barrier is one of the launch's arrays (an
    argument, shared or local memory, or a slice of one), alive until the launch ends; so the
    generated code keeps its address and shape in an int64 table and makes the array again
    with ``array_at``.  A typed dict of arrays did the same with a hash lookup and a
    reference count per access (and kept numba's runtime in every node).
    """
    table[g, 0] = 1
    table[g, 1] = array.ctypes.data
    for d in range(array.ndim):
        table[g, 2 + d] = array.shape[d]


@JIT
def keep_array_everywhere(table, array):
    """Every thread starts with ``array`` (a kernel argument the kernel reassigns)."""
    for g in range(table.shape[0]):
        keep_array(table, g, array)


def garbage(shape, dtype) -> np.ndarray:
    """A fresh array whose bytes are all 0xCD, like shared or local memory in the threaded tier."""
    a = np.empty(shape, dtype)
    a.view(np.uint8).fill(UNINITIALIZED_BYTE) if a.size else None
    return a


@JIT
def atomic_add(array, index, val):
    old = array[index]
    array[index] = old + val
    return old


@JIT
def atomic_sub(array, index, val):
    old = array[index]
    array[index] = old - val
    return old


@JIT
def atomic_and_(array, index, val):
    old = array[index]
    array[index] = old & val
    return old


@JIT
def atomic_or_(array, index, val):
    old = array[index]
    array[index] = old | val
    return old


@JIT
def atomic_xor(array, index, val):
    old = array[index]
    array[index] = old ^ val
    return old


@JIT
def atomic_inc(array, index, val):
    old = array[index]
    array[index] = 0 if old >= val else old + 1
    return old


@JIT
def atomic_dec(array, index, val):
    old = array[index]
    array[index] = val if (old == 0 or old > val) else old - 1
    return old


@JIT
def atomic_exch(array, index, val):
    old = array[index]
    array[index] = val
    return old


@JIT
def atomic_max(array, index, val):
    old = array[index]
    array[index] = val if val > old else old   # Python's max(old, val)
    return old


@JIT
def atomic_min(array, index, val):
    old = array[index]
    array[index] = val if val < old else old   # Python's min(old, val)
    return old


@JIT
def atomic_nanmax(array, index, val):
    old = array[index]
    array[index] = val if (val > old or old != old) and val == val else old
    return old


@JIT
def atomic_nanmin(array, index, val):
    old = array[index]
    array[index] = val if (val < old or old != old) and val == val else old
    return old


@JIT
def atomic_cas(array, index, old, val):
    loaded = array[index]
    if loaded == old:
        array[index] = val
    return loaded


@JIT
def atomic_compare_and_swap(array, old, val):
    loaded = array.flat[0]
    if loaded == old:
        array.flat[0] = val
    return loaded
