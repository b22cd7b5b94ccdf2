"""uTask device functions (kernels/utask/): each op's uTasks, run in the virtual-block loop, equal numpy.

Every test launches a *uOperator kernel*: ``for u in range(u_begin + blockIdx.x, u_end,
gridDim.x): op_utask(u, ...)``, with random grids of 1..4 blocks and blocks of 4..16
threads, so one block often runs several uTasks back to back (shared memory reused)
and the block size rarely matches the tile.  Outputs start as NaN, so an element no
uTask writes shows up.  The partition tests run one uTask per launch and check that
the uTasks' outputs are disjoint and cover everything.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels import scalar_ops
from pyflow.kernels.backend import cuda
from pyflow.kernels.launch import launcher
from pyflow.kernels.utask import (MAX_BLOCK, copy_utask_count, elementwise_utask_count, make_matmul_utask,
                                  make_reduce_row_utask, make_softmax_row_utask, matmul_utask_count,
                                  reduce_row_utask_count, softmax_row_utask_count)
from pyflow.kernels.utask.elementwise import copy_kernel, make_elementwise_kernels
from pyflow.kernels.utask.matmul import make_matmul_kernel
from pyflow.kernels.utask.program import make_rnn_program
from pyflow.kernels.utask.reduce import COMBINE, make_reduce_row_kernel, make_softmax_row_kernel
from tests.strategies import assert_close, float_dtypes, values

grids = st.integers(1, 4)
blocks = st.integers(4, 16)
seeds = st.integers(0, 2**32 - 1)
UNARY = {"tanh": (scalar_ops.tanh, np.tanh), "neg": (scalar_ops.neg, np.negative),
         "sigmoid": (scalar_ops.sigmoid, lambda x: 1 / (1 + np.exp(-x)))}
BINARY = {"add": (scalar_ops.add, np.add), "mul": (scalar_ops.mul, np.multiply),
          "sub": (scalar_ops.sub, np.subtract), "max": (scalar_ops.maximum, np.maximum)}


def _run(kernel, grid, block, count, *args):
    """All uTasks ``0 <= u < count`` of a uOperator kernel, on ``grid`` blocks."""
    launcher(kernel, grid, block)(0, count, *args)


def _nan(n, dtype):
    return cuda.to_device(np.full(n, np.nan, dtype))


def _within(actual, expected, bound, what):
    """|actual - expected| <= bound elementwise (bound: a rounding-error estimate)."""
    actual = np.asarray(actual, np.float64)
    bad = ~(np.abs(actual - expected) <= bound)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} values off; first at "
                           f"{np.argwhere(bad)[0].tolist()}: {actual[bad][0]!r} vs {expected[bad][0]!r}")


# --- elementwise and copy ---------------------------------------------------------


@pytest.mark.parametrize("op", sorted(UNARY))
@given(n=st.integers(0, 200), chunk=st.integers(1, 64), grid=grids, block=blocks, dtype=float_dtypes, seed=seeds)
def test_map_utasks_equal_numpy(op, n, chunk, grid, block, dtype, seed):
    fn, reference = UNARY[op]
    x = values(n, dtype, seed=seed)
    out = _nan(n, dtype)
    _run(make_elementwise_kernels(fn).map, grid, block, elementwise_utask_count(n, chunk),
         out, cuda.to_device(x), n, chunk)
    assert_close(out.copy_to_host(), reference(x.astype(np.float64)).astype(dtype), what=f"{op} n={n} chunk={chunk}")


@pytest.mark.parametrize("op", sorted(BINARY))
@given(n=st.integers(0, 200), chunk=st.integers(1, 64), grid=grids, block=blocks, dtype=float_dtypes, seed=seeds)
def test_zip_utasks_equal_numpy(op, n, chunk, grid, block, dtype, seed):
    fn, reference = BINARY[op]
    a, b = values(n, dtype, seed=seed), values(n, dtype, seed=seed + 1)
    out = _nan(n, dtype)
    _run(make_elementwise_kernels(fn).zip, grid, block, elementwise_utask_count(n, chunk),
         out, cuda.to_device(a), cuda.to_device(b), n, chunk)
    assert_close(out.copy_to_host(), reference(a, b), what=f"{op} n={n} chunk={chunk}")


@given(rows=st.integers(0, 6), inner=st.integers(1, 40), chunk=st.integers(1, 64), grid=grids, block=blocks,
       dtype=float_dtypes, seed=seeds)
def test_zip_rows_utasks_add_a_bias_to_every_row(rows, inner, chunk, grid, block, dtype, seed):
    x, bias = values((rows, inner), dtype, seed=seed), values(inner, dtype, seed=seed + 1)
    n = rows * inner
    out = _nan(n, dtype)
    _run(make_elementwise_kernels(scalar_ops.add).zip_rows, grid, block, elementwise_utask_count(n, chunk),
         out, cuda.to_device(x.reshape(-1)), cuda.to_device(bias), n, inner, chunk)
    assert_close(out.copy_to_host().reshape(rows, inner), x + bias, what=f"x{x.shape} + bias chunk={chunk}")


@given(n=st.integers(0, 100), chunk=st.integers(1, 64), grid=grids, block=blocks, seed=seeds)
def test_map_utasks_may_write_in_place(n, chunk, grid, block, seed):
    """``h = tanh(h)``: out and x the same buffer."""
    h = values(n, np.float64, seed=seed)
    device = cuda.to_device(h)
    _run(make_elementwise_kernels(scalar_ops.tanh).map, grid, block, elementwise_utask_count(n, chunk),
         device, device, n, chunk)
    assert_close(device.copy_to_host(), np.tanh(h), what=f"in-place tanh n={n}")


@given(n=st.integers(0, 100), dst_offset=st.integers(0, 10), src_offset=st.integers(0, 10),
       chunk=st.integers(1, 64), grid=grids, block=blocks, seed=seeds)
def test_copy_utasks_copy_between_offsets_and_touch_nothing_else(n, dst_offset, src_offset, chunk, grid, block,
                                                                 seed):
    src = values(src_offset + n + 3, np.float32, seed=seed)
    dst = np.full(dst_offset + n + 3, np.nan, np.float32)
    expected = dst.copy()
    expected[dst_offset:dst_offset + n] = src[src_offset:src_offset + n]
    device = cuda.to_device(dst)
    _run(copy_kernel, grid, block, copy_utask_count(n, chunk), device, cuda.to_device(src), n,
         dst_offset, src_offset, chunk)
    assert_close(device.copy_to_host(), expected, what=f"copy n={n} dst+{dst_offset} src+{src_offset}")


@given(n=st.integers(0, 200), chunk=st.integers(1, 64), grid=grids, block=blocks)
def test_each_element_is_written_exactly_once(n, chunk, grid, block):
    """The int version of a write counter: ``out[i] = out[i] + 1`` (zip add, out aliasing a)."""
    counts = cuda.to_device(np.zeros(n, np.int64))
    _run(make_elementwise_kernels(scalar_ops.add).zip, grid, block, elementwise_utask_count(n, chunk),
         counts, counts, cuda.to_device(np.ones(n, np.int64)), n, chunk)
    assert_close(counts.copy_to_host(), np.ones(n, np.int64), what=f"writes per element, n={n} chunk={chunk}")


# --- matmul -------------------------------------------------------------------------


MATMUL_DTYPES = ("float32", "float64", "int32", "int64")


@st.composite
def matmul_problems(draw, dtypes=MATMUL_DTYPES, side=9):
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    M, N, K = (draw(st.integers(0, side), label=name) for name in "MNK")
    batch = draw(st.integers(1, 2), label="batch")
    transpose_b, bias = draw(st.booleans(), label="transpose_b"), draw(st.booleans(), label="bias")
    seed = draw(seeds)
    a = values((batch, M, K), dtype, seed=seed)
    b = values((batch, N, K) if transpose_b else (batch, K, N), dtype, seed=seed + 1)
    c = values(N, dtype, seed=seed + 2)
    return dtype, M, N, K, batch, transpose_b, bias, a, b, c


def _matmul_reference(M, N, K, transpose_b, bias, a, b, c):
    """(exact-ish float64 result, rounding bound for the array's dtype)."""
    b64 = b.astype(np.float64)
    b64 = b64.transpose(0, 2, 1) if transpose_b else b64
    expected = a.astype(np.float64) @ b64 + (c if bias else 0)
    magnitude = np.abs(a.astype(np.float64)) @ np.abs(b64) + (np.abs(c) if bias else 0)
    eps = np.finfo(a.dtype).eps if a.dtype.kind == "f" else 0
    return expected, (K + 2) * eps * magnitude


def _launch_matmul(tile, problem, grid, block, u_range=None):
    dtype, M, N, K, batch, transpose_b, bias, a, b, c = problem
    out = cuda.to_device(np.zeros(batch * M * N, dtype) if dtype.kind == "i" else np.full(batch * M * N, np.nan, dtype))
    operands = [cuda.to_device(a.reshape(-1)), cuda.to_device(b.reshape(-1))] + ([cuda.to_device(c)] if bias else [])
    count = matmul_utask_count(M, N, tile, batch)
    begin, end = u_range or (0, count)
    launcher(make_matmul_kernel(tile, dtype, transpose_b, bias), grid, block)(begin, end, out, *operands,
                                                                             M, N, K, batch)
    return out.copy_to_host().reshape(batch, M, N)


@given(problem=matmul_problems(), tile=st.integers(2, 4), grid=grids, block=blocks)
def test_matmul_tile_utasks_equal_numpy(problem, tile, grid, block):
    dtype, M, N, K, batch, transpose_b, bias, a, b, c = problem
    expected, bound = _matmul_reference(M, N, K, transpose_b, bias, a, b, c)
    actual = _launch_matmul(tile, problem, grid, block)
    _within(actual, expected, bound, f"matmul {dtype} batch={batch} {M}x{K} @ {K}x{N} tile={tile} "
                                     f"b.T={transpose_b} bias={bias} grid={grid} block={block}")


# --- row reductions and softmax ---------------------------------------------------------


@pytest.mark.parametrize("name", ["sum", "max"])
@given(rows=st.integers(0, 6), width=st.integers(1, 40), grid=grids, block=blocks,
       max_block=st.sampled_from([1, 3, 8, MAX_BLOCK]),
       dtypes_=st.sampled_from([("float32", "float32"), ("float64", "float64"), ("int32", "int64")]), seed=seeds)
def test_reduce_row_utasks_equal_numpy(name, rows, width, grid, block, max_block, dtypes_, seed):
    dtype, acc = dtypes_
    x = values((rows, width), dtype, seed=seed)
    out = cuda.to_device(np.full(rows, -12345, acc))
    kernel = make_reduce_row_kernel(COMBINE[name], acc, max_block)
    _run(kernel, grid, block, reduce_row_utask_count(rows, width), out, cuda.to_device(x.reshape(-1)), rows, width)
    x64 = x.astype(np.float64)
    expected = x64.sum(axis=1) if name == "sum" else x64.max(axis=1)
    bound = width * np.finfo(acc).eps * np.abs(x64).sum(axis=1) if np.dtype(acc).kind == "f" else 0
    _within(out.copy_to_host(), expected, bound, f"{name} rows of {x.shape} {dtype}->{acc} max_block={max_block}")


def _softmax(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@given(rows=st.integers(0, 6), width=st.integers(0, 40), grid=grids, block=blocks,
       max_block=st.sampled_from([1, 3, 8, MAX_BLOCK]), dtype=float_dtypes,
       shift=st.sampled_from([0.0, 1000.0, -1000.0]), seed=seeds)
def test_softmax_row_utasks_equal_numpy_even_for_large_inputs(rows, width, grid, block, max_block, dtype, shift,
                                                              seed):
    """Stable: with a shift of +-1000 a naive exp overflows (inf / inf = nan) or underflows (0 / 0)."""
    x = (values((rows, width), dtype, seed=seed) + dtype.type(shift)).astype(dtype)
    out = _nan(rows * width, dtype)
    _run(make_softmax_row_kernel(dtype, max_block), grid, block, softmax_row_utask_count(rows, width),
         out, cuda.to_device(x.reshape(-1)), rows, width)
    expected = _softmax(x) if width else x
    assert_close(out.copy_to_host().reshape(rows, width), expected.astype(dtype),
                 what=f"softmax {x.shape} {dtype} shift={shift} max_block={max_block}")


@given(rows=st.integers(1, 4), width=st.integers(1, 20), grid=grids, block=blocks,
       max_block=st.sampled_from([1, 3, MAX_BLOCK]), seed=seeds)
def test_softmax_row_utasks_may_work_in_place(rows, width, grid, block, max_block, seed):
    """out is x; with max_block < blockDim an element written twice would be divided twice."""
    x = values((rows, width), np.float64, seed=seed)
    device = cuda.to_device(x.reshape(-1))
    _run(make_softmax_row_kernel(np.float64, max_block), grid, block, rows, device, device, rows, width)
    assert_close(device.copy_to_host().reshape(rows, width), _softmax(x),
                 what=f"in-place softmax {x.shape} max_block={max_block}")


# --- ownership: the uTasks partition the output ------------------------------------------


def _owner_masks(run_one, count):
    """For u in 0..count (one past the end too), which output elements uTask u alone writes."""
    return [~np.isnan(run_one(u)) for u in range(count + 1)]


def _assert_partition(masks, what):
    owners = np.zeros(masks[-1].shape, np.int64)
    for mask in masks[:-1]:
        owners += mask
    assert (owners == 1).all(), f"{what}: elements written by {sorted(set(owners.ravel().tolist()))} uTasks"
    assert not masks[-1].any(), f"{what}: uTask {len(masks) - 1} (past the count) wrote something"


@settings(max_examples=10)
@given(n=st.integers(0, 40), inner=st.integers(1, 5), chunk=st.integers(3, 16), seed=seeds)
def test_elementwise_and_copy_utasks_partition_their_output(n, inner, chunk, seed):
    count = elementwise_utask_count(n, chunk)
    a, b = cuda.to_device(values(n, np.float64, seed=seed)), cuda.to_device(values(inner, np.float64, seed=seed))
    kernels = make_elementwise_kernels(scalar_ops.add)

    def run(kernel, *args):
        def one(u):
            out = _nan(n, np.float64)
            launcher(kernel, 1, 4)(u, u + 1, out, *args)
            return out.copy_to_host()
        return one

    for what, one in (("zip_rows", run(kernels.zip_rows, a, b, n, inner, chunk)),
                      ("copy", lambda u: _copy_one(u, a, n, chunk))):
        masks = _owner_masks(one, count)
        _assert_partition(masks, f"{what} n={n} chunk={chunk}")
        for u, mask in enumerate(masks[:-1]):  # and uTask u owns exactly chunk u
            assert mask.nonzero()[0].tolist() == list(range(u * chunk, min(n, (u + 1) * chunk)))


def _copy_one(u, src, n, chunk):
    out = _nan(n, np.float64)
    launcher(copy_kernel, 1, 4)(u, u + 1, out, src, n, 0, 0, chunk)
    return out.copy_to_host()


@settings(max_examples=10)
@given(problem=matmul_problems(dtypes=("float64",), side=6), tile=st.integers(2, 3))
def test_matmul_utasks_partition_their_output(problem, tile):
    _, M, N, _, batch, *_ = problem
    count = matmul_utask_count(M, N, tile, batch)
    masks = _owner_masks(lambda u: _launch_matmul(tile, problem, 1, 4, (u, u + 1)), count)
    _assert_partition(masks, f"matmul batch={batch} {M}x{N} tile={tile}")
    for u, mask in enumerate(masks[:-1]):  # uTask u owns one tile, numbered row-major, batch outermost
        m, r = divmod(u, -(-M // tile) * -(-N // tile))
        i, j = divmod(r, -(-N // tile))
        assert mask[m, i * tile:(i + 1) * tile, j * tile:(j + 1) * tile].all()


@settings(max_examples=10)
@given(rows=st.integers(0, 5), width=st.integers(1, 12), seed=seeds)
def test_row_utasks_partition_their_output(rows, width, seed):
    x = cuda.to_device(values(rows * width, np.float64, seed=seed))

    def reduce_one(u):
        out = _nan(rows, np.float64)
        launcher(make_reduce_row_kernel(COMBINE["sum"], np.float64), 1, 4)(u, u + 1, out, x, rows, width)
        return out.copy_to_host()

    def softmax_one(u):
        out = _nan(rows * width, np.float64)
        launcher(make_softmax_row_kernel(np.float64), 1, 4)(u, u + 1, out, x, rows, width)
        return out.copy_to_host().reshape(rows, width)

    for what, one in (("reduce_row", reduce_one), ("softmax_row", softmax_one)):
        masks = _owner_masks(one, reduce_row_utask_count(rows, width))
        _assert_partition(masks, f"{what} {rows}x{width}")
        assert all(masks[u][u].all() for u in range(rows)), f"{what}: uTask u must own row u"


# --- counts and argument checks -------------------------------------------------------------


def test_utask_counts_follow_the_granularity():
    assert [elementwise_utask_count(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    assert copy_utask_count(1000, 256) == 4
    assert matmul_utask_count(5, 9, 4) == 2 * 3
    assert matmul_utask_count(5, 9, 4, batch=3) == 18
    assert matmul_utask_count(0, 9, 4, batch=3) == matmul_utask_count(5, 0, 4) == 0
    assert matmul_utask_count(16, 16) == 1  # the default tile is 16
    assert reduce_row_utask_count(6, 40) == softmax_row_utask_count(6, 40) == 6
    assert reduce_row_utask_count(0, 0) == softmax_row_utask_count(3, 0) - 3 == 0


@pytest.mark.parametrize("call", [
    lambda: elementwise_utask_count(-1, 4), lambda: elementwise_utask_count(4, 0),
    lambda: elementwise_utask_count(4.0, 4), lambda: copy_utask_count(True, 4),
    lambda: matmul_utask_count(3, -1, 4), lambda: matmul_utask_count(3, 3, 0),
    lambda: matmul_utask_count(3, 3, 4, batch=-2), lambda: reduce_row_utask_count(2, 0),
    lambda: softmax_row_utask_count(-1, 3), lambda: make_matmul_utask(33, "float32"),
    lambda: make_matmul_utask(0, "float32"), lambda: make_reduce_row_utask(COMBINE["sum"], "float32", 0),
    lambda: make_reduce_row_utask(COMBINE["sum"], "float32", MAX_BLOCK + 1),
], ids=["negative n", "chunk 0", "float n", "bool n", "negative N", "tile 0", "negative batch",
        "empty rows to reduce", "negative rows", "tile 33", "factory tile 0", "max_block 0", "max_block 1025"])
def test_bad_sizes_raise_shape_error(call):
    with pytest.raises(ShapeError, match="uTasks"):
        call()


@pytest.mark.parametrize("call", [
    lambda: make_matmul_utask(4, "bool"), lambda: make_reduce_row_utask(COMBINE["max"], "float16"),
    lambda: make_softmax_row_utask("int32"),
], ids=["matmul bool", "reduce float16", "softmax int32"])
def test_unsupported_dtypes_raise_dtype_error(call):
    with pytest.raises(DTypeError, match="unsupported dtype"):
        call()


def test_factories_are_cached():
    assert make_matmul_utask(4, "float32") is make_matmul_utask(4, np.float32)
    assert make_softmax_row_utask("float64") is make_softmax_row_utask(np.dtype("float64"))
    assert make_elementwise_kernels(scalar_ops.add) is make_elementwise_kernels(scalar_ops.add)


# --- a whole program: uTasks between grid barriers in one persistent kernel ----------------------


@settings(max_examples=10)
@given(batch=st.integers(1, 3), hidden=st.integers(1, 6), steps=st.integers(0, 3), tile=st.integers(2, 3),
       chunk=st.integers(2, 8), grid=grids, block=blocks, seed=seeds)
def test_rnn_program_equals_the_numpy_loop(batch, hidden, steps, tile, chunk, grid, block, seed):
    """copy, then per step linear (x @ W.T + b) and add-tanh uTasks, grid barriers between."""
    h_in = values((batch, hidden), np.float64, -1, 1, seed=seed)
    w = values((hidden, hidden), np.float64, -1, 1, seed=seed + 1)
    b = values(hidden, np.float64, -1, 1, seed=seed + 2)
    xs = values((steps, batch, hidden), np.float64, -1, 1, seed=seed + 3)
    expected = h_in
    for step in range(steps):
        expected = np.tanh(expected @ w.T + b + xs[step])
    h, pre = _nan(batch * hidden, np.float64), _nan(batch * hidden, np.float64)
    args = [cuda.to_device(v.reshape(-1)) for v in (h_in, w, b, xs)]
    launcher(make_rnn_program(tile, "float64"), grid, block)(h, pre, *args, batch, hidden, steps, chunk)
    assert_close(h.copy_to_host().reshape(batch, hidden), expected, what=f"rnn {steps} steps, grid={grid}")
