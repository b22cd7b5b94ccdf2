"""Each kernel family owns one device function that its library kernel and its uTasks call (issue 30).

The block reduction is ``kernels/reduce.py``'s ``make_block_reduce``, the row softmax
``kernels/softmax.py``'s ``make_row_softmax``, a conv's window sum ``kernels/conv.py``'s
``conv2d_window``, the tiled matmul ``kernels/matmul.py``'s ``make_matmul_tile``, the block
arg-reduction ``kernels/arg_reduce.py``'s ``make_block_arg_reduce``; ``kernels/utask/`` writes
none of them again.  Where both sides add
in the same order (softmax: a power-of-two block, every thread holding a value; conv:
always) they give the same bits.
"""

from __future__ import annotations

import functools
import inspect

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import float32

from pyflow.kernels import scalar_ops
from pyflow.kernels.arg_reduce import BETTER, make_arg_reduce, make_block_arg_reduce
from pyflow.kernels.backend import cuda
from pyflow.kernels.conv import conv2d_window
from pyflow.kernels.jit import jit
from pyflow.kernels.launch import launcher
from pyflow.kernels.matmul import make_matmul_kernel, make_matmul_tile, matmul_cuda
from pyflow.kernels.registry import get_kernel
from pyflow.kernels.reduce import make_block_reduce, make_reduce
from pyflow.kernels.softmax import make_row_softmax, make_softmax
from pyflow.kernels.utask import argmax as utask_argmax
from pyflow.kernels.utask import batched, gating, scaled_softmax
from pyflow.kernels.utask import matmul as utask_matmul
from pyflow.kernels.utask.argmax import make_argmax_sum_row_kernel, make_argmax_sum_row_utask
from pyflow.kernels.utask import reduce as utask_reduce
from pyflow.kernels.utask.reduce import make_reduce_row_utask, make_softmax_row_kernel, make_softmax_row_utask
from pyflow.kernels.utask.resnet import make_conv2d_kernel, make_conv2d_utask, resnet_utask_count
from pyflow.kernels.utask.scaled_softmax import make_scaled_softmax_row_utask
from tests.strategies import float_dtypes, values

# bit for bit: both sides of a comparison on one tier (auto compiles a kernel at its 32nd launch, and the
# tiers' float math may differ in the last bit)
pytestmark = pytest.mark.sim_tier("threads")


def _calls(device_fn) -> set:
    """The device functions ``device_fn`` reaches through its closure (what its factory gave it)."""
    return {id(cell.cell_contents) for cell in device_fn.py_func.__closure__ or ()}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_library_kernels_and_the_utasks_call_one_block_reduction_and_one_softmax(dtype):
    dtype = np.dtype(dtype)
    assert id(make_block_reduce(scalar_ops.add)) in _calls(make_reduce("sum", dtype, 8)[0])
    assert id(make_block_reduce(scalar_ops.add)) in _calls(make_reduce_row_utask(scalar_ops.add, dtype))
    row_softmax = make_row_softmax(False, dtype)
    assert id(row_softmax) in _calls(make_softmax(False, dtype, 8))
    assert id(row_softmax) in _calls(make_softmax_row_utask(dtype))
    assert id(make_row_softmax(False, dtype, 0.125)) in _calls(make_scaled_softmax_row_utask(0.125, dtype))
    assert {id(make_block_reduce(scalar_ops.maximum)), id(make_block_reduce(scalar_ops.add))} <= _calls(row_softmax)
    assert make_conv2d_utask(dtype).py_func.__globals__["conv2d_window"] is conv2d_window


def test_the_row_gating_and_conv_utasks_write_no_tree_or_window_sum_of_their_own():
    for module in (utask_reduce, scaled_softmax, gating):
        assert "cuda.syncthreads" not in inspect.getsource(module), module.__name__
    assert "acc +=" not in inspect.getsource(make_conv2d_utask(np.float32).py_func)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_library_kernels_and_the_utasks_call_one_tiled_matmul_and_one_block_arg_reduction(dtype):
    dtype = np.dtype(dtype)
    assert id(make_matmul_tile(4, dtype, 2)) in _calls(make_matmul_kernel(4, dtype, 2))
    utask_tile = make_matmul_tile(8, dtype, 1, utask_matmul.slots_per_thread(8), True)
    assert id(utask_tile) in _calls(utask_matmul.make_matmul_utask(8, dtype, transpose_b=True, bias=True))
    assert id(make_matmul_tile(8, dtype, 1, utask_matmul.slots_per_thread(8))) in _calls(
        batched.make_broadcast_matmul_utask(8, dtype))
    for op in ("argmax", "argmin"):
        assert id(make_block_arg_reduce(BETTER[op])) in _calls(make_arg_reduce(op, dtype, 8)[0])
    assert id(make_block_arg_reduce(BETTER["argmax"])) in _calls(make_argmax_sum_row_utask(dtype))


def test_the_matmul_and_argmax_utasks_write_no_tile_loop_or_tree_of_their_own():
    for module in (utask_matmul, batched, utask_argmax):
        assert "cuda.syncthreads" not in inspect.getsource(module), module.__name__


@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 9), n=st.integers(1, 9), k=st.integers(0, 11), tile=st.sampled_from([2, 4]),
       block=st.integers(1, 20), transpose_b=st.booleans(), bias=st.booleans(), dtype=float_dtypes,
       seed=st.integers(0, 2**16))
def test_library_matmul_and_matmul_utasks_agree_bit_for_bit(m, n, k, tile, block, transpose_b, bias, dtype, seed):
    """Any uTask block size (fewer threads than slots: several passes) and any register tile give the same bits."""
    a, b = values((m, k), dtype, seed=seed), values((k, n), dtype, seed=seed + 1)
    c = values((n,), dtype, seed=seed + 2)
    library = cuda.device_array((m, n), dtype)
    matmul_cuda(library, cuda.to_device(a), cuda.to_device(b), tile=tile, per_thread=1)
    expected = library.copy_to_host() + (c if bias else 0)
    registers = cuda.device_array((m, n), dtype)
    matmul_cuda(registers, cuda.to_device(a), cuda.to_device(b), tile=tile, per_thread=2)
    assert registers.copy_to_host().tobytes() == library.copy_to_host().tobytes()
    utask = cuda.to_device(np.full(m * n, np.nan, dtype))
    b_stored = np.ascontiguousarray(b.T if transpose_b else b).reshape(-1)
    operands = (utask, cuda.to_device(a.reshape(-1)), cuda.to_device(b_stored))
    operands += (cuda.to_device(c),) if bias else ()
    launcher(utask_matmul.make_matmul_kernel(tile, dtype, transpose_b, bias), 2, block)(
        0, utask_matmul.matmul_utask_count(m, n, tile), *operands, m, n, k, 1)
    assert utask.copy_to_host().tobytes() == expected.reshape(-1).tobytes()


@settings(max_examples=12, deadline=None)
@given(rows=st.integers(1, 3), width=st.integers(1, 12), block=st.integers(1, 9), nan=st.booleans(),
       dtype=float_dtypes, seed=st.integers(0, 2**16))
def test_library_argmax_and_argmax_utasks_agree_with_numpy_on_ties_and_nan(rows, width, block, nan, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, (rows, width)).astype(dtype)   # few distinct values: many ties
    if nan:
        x[rng.integers(rows), rng.integers(width)] = np.nan
    expected = np.argmax(x, axis=1)
    library = cuda.device_array(rows, np.int64)
    get_kernel("argmax", "cuda")(library, cuda.to_device(x), axis=1)
    assert library.copy_to_host().tolist() == expected.tolist()
    utask = cuda.to_device(np.full(rows, np.nan, dtype))
    launcher(make_argmax_sum_row_kernel(dtype), 2, block)(
        0, rows, utask, cuda.to_device(x.reshape(-1)), cuda.to_device(np.zeros(rows * width, dtype)), rows, width)
    assert utask.copy_to_host().tolist() == expected.astype(dtype).tolist()


@functools.cache
def _sum_kernel(block: int):
    block_sum = make_block_reduce(scalar_ops.add)

    @jit
    def sum_kernel(out, x, active):
        cache = cuda.shared.array(block, float32)
        t = cuda.threadIdx.x
        value = x[t] if t < active else float32(0)
        total = block_sum(cache, value, active)
        if t == 0:
            out[0] = total

    return sum_kernel


def _tree(x: np.ndarray) -> np.float32:
    """The documented order: halve the live width (rounding up), pairing t with t + half."""
    cache = list(x)
    width = len(cache)
    while width > 1:
        half = (width + 1) // 2
        for t in range(width - half):
            cache[t] = np.float32(cache[t] + cache[t + half])
        width = half
    return cache[0]


@settings(max_examples=15, deadline=None)
@given(block=st.sampled_from([1, 2, 4, 8]), data=st.data(), seed=st.integers(0, 2**16))
def test_block_reduce_adds_in_its_documented_order_bit_for_bit(block, data, seed):
    """A power-of-two ``active`` is the library's order (CUB's), any other the uTasks'."""
    active = data.draw(st.integers(1, block), label="active")
    x = (np.random.default_rng(seed).standard_normal(block) * 1e3).astype(np.float32)
    out = cuda.to_device(np.full(1, np.nan, np.float32))
    launcher(_sum_kernel(block), 1, block)(out, cuda.to_device(x), active)
    assert out.copy_to_host()[0].tobytes() == _tree(x[:active]).tobytes()


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(1, 3), block=st.sampled_from([1, 2, 4, 8]), extra=st.integers(0, 12), dtype=float_dtypes,
       seed=st.integers(0, 2**16))
def test_library_softmax_and_softmax_utasks_agree_bit_for_bit_when_they_fold_alike(rows, block, extra, dtype, seed):
    """Rows at least a block wide, a power-of-two block: every thread of both holds a value."""
    width = block + extra
    x = values((rows, width), dtype, seed=seed)
    library = cuda.to_device(np.full(rows * width, np.nan, dtype))
    launcher(make_softmax(False, np.dtype(dtype), block), 2, block)(
        library, (width,), 1, cuda.to_device(x.reshape(-1)), (rows,), (width,), 1, rows, width)
    utask = cuda.to_device(np.full(rows * width, np.nan, dtype))
    launcher(make_softmax_row_kernel(dtype, block), 2, block)(0, rows, utask, cuda.to_device(x.reshape(-1)),
                                                             rows, width)
    assert library.copy_to_host().tobytes() == utask.copy_to_host().tobytes()


@settings(max_examples=10, deadline=None)
@given(batch=st.integers(1, 2), c_in=st.integers(1, 3), c_out=st.integers(1, 3), side=st.integers(1, 6),
       kernel=st.integers(1, 3), stride=st.integers(1, 2), data=st.data(), dtype=float_dtypes,
       seed=st.integers(0, 2**16))
def test_library_conv2d_and_conv_utasks_agree_bit_for_bit(batch, c_in, c_out, side, kernel, stride, data, dtype, seed):
    pad = data.draw(st.integers(0, kernel // 2), label="pad")
    side = max(side, kernel - 2 * pad)
    x = values((batch, c_in, side, side), dtype, seed=seed)
    w = values((c_out, c_in, kernel, kernel), dtype, seed=seed + 1)
    h_out = (side + 2 * pad - kernel) // stride + 1
    library = cuda.device_array((batch, c_out, h_out, h_out), dtype)
    get_kernel("conv2d", "cuda")(library, cuda.to_device(x), cuda.to_device(w), None, stride=stride, padding=pad)
    n, chunk = batch * c_out * h_out * h_out, 8
    utask = cuda.to_device(np.full(n, np.nan, dtype))
    launcher(make_conv2d_kernel(dtype), 2, 4)(0, resnet_utask_count(n, chunk), utask, cuda.to_device(x.reshape(-1)),
                                              cuda.to_device(w.reshape(-1)), batch, c_in, side, side, c_out, kernel,
                                              stride, pad, h_out, h_out, chunk)
    assert library.copy_to_host().tobytes() == utask.copy_to_host().tobytes()
