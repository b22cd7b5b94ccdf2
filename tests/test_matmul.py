"""matmul on both targets equals numpy's np.matmul: matrices, vectors, batches, every layout.

Tolerance (``assert_matmul_close``): integers must match numpy exactly.  Floats
are compared with numpy computed in float64, within the classic error bound of
a K-term dot product (Higham, "Accuracy and Stability of Numerical
Algorithms", 3.1): |computed - exact| <= K*u * (|A| @ |B|), u = eps/2 of the
result dtype.  The float64 reference adds at most the same again, so we allow
(K + 1) * eps * (|A| @ |B|).  The bound holds in any summation order (tiles,
FMA, BLAS blocking), scales with K as float32 accumulation needs, and is far
below one dropped or doubled product, so a wrong kernel cannot hide in it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import pyflow.kernels.matmul as matmul_module  # registers "matmul"
from pyflow.errors import DTypeError, LaunchConfigError, ShapeError
from pyflow.kernels.backend import cuda, is_simulator
from pyflow.kernels.layout import broadcast_view, permuted_view, sliced_view
from pyflow.kernels.matmul import matmul_cuda, matmul_result_dtype
from pyflow.kernels.registry import get_kernel
from tests.strategies import TARGETS, dtypes, empty_on, float_dtypes, operands, to_host, values

sides = st.integers(0, 7)
nonzero_sides = st.integers(1, 7)
batch_shapes = mutually_broadcastable_shapes(num_shapes=2, max_dims=2, min_side=1, max_side=3)


def assert_matmul_close(actual, a, b, what: str = "") -> None:
    """``actual`` is numpy's ``a @ b``: exact for ints, within the K-scaled bound for floats."""
    actual = np.asarray(actual)
    expected_dtype = matmul_result_dtype(a.dtype, b.dtype)
    with np.errstate(all="ignore"):
        expected = np.matmul(a, b)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected_dtype, f"{what}: dtype {actual.dtype} != {expected_dtype}"
    if expected_dtype.kind != "f":
        wrong = actual != expected
        assert not wrong.any(), (f"{what}: {int(wrong.sum())} of {actual.size} values differ; first at "
                                 f"{np.argwhere(wrong)[0].tolist()}: {actual[wrong][0]} != {expected[wrong][0]}")
        return
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(all="ignore"):
        exact = np.matmul(a64, b64)
        k = a.shape[-1]
        bound = (k + 1) * np.finfo(expected_dtype).eps * np.matmul(np.abs(a64), np.abs(b64))
        error = np.abs(actual.astype(np.float64) - exact)
    bad = ~(error <= bound + np.finfo(expected_dtype).tiny)  # NaN (garbage) counts as bad
    same_special = (actual == exact) | (np.isnan(actual) & np.isnan(exact))
    bad = np.where(np.isfinite(exact), bad, ~same_special)  # inf/nan: exactly numpy's inf or nan
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {actual.size} values off ({expected_dtype}, K={k}); "
                           f"first at {np.argwhere(bad)[0].tolist()}: {actual[bad][0]!r} vs {exact[bad][0]!r}, "
                           f"allowed {bound[bad][0]:g}")


def run_matmul(target, a, b, tile=None):
    """Run matmul on ``target`` into a garbage-filled output; return it on the host."""
    out_shape = np.matmul(np.empty(a.shape, np.int8), np.empty(b.shape, np.int8)).shape
    out = empty_on(target, out_shape, matmul_result_dtype(a.dtype, b.dtype))
    if tile is None:
        get_kernel("matmul", target)(out, a, b)
    else:
        matmul_cuda(out, a, b, tile=tile)
    return to_host(out)


# --- results equal numpy -----------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), m=sides, n=sides, k=sides, dtype_a=dtypes, dtype_b=dtypes)
def test_matrix_product_equals_numpy_on_any_layout(target, data, m, n, k, dtype_a, dtype_b):
    a = data.draw(operands((m, k), dtype_a), label="a")
    b = data.draw(operands((k, n), dtype_b), label="b")
    result = run_matmul(target, a.on(target), b.on(target))
    assert_matmul_close(result, a.numpy(), b.numpy(),
                        what=f"{dtype_a}({m},{k}) {a.layout} @ {dtype_b}({k},{n}) {b.layout} on {target}")


@pytest.mark.parametrize("target", TARGETS)
@given(data=st.data(), batches=batch_shapes, m=nonzero_sides, n=nonzero_sides, k=sides, dtype=dtypes)
def test_batch_dims_broadcast_like_numpy(target, data, batches, m, n, k, dtype):
    """Batch dims broadcast (sizes 1-3; empty products are tested below)."""
    batch_a, batch_b = batches.input_shapes
    a = data.draw(operands(batch_a + (m, k), dtype), label="a")
    b = data.draw(operands(batch_b + (k, n), dtype), label="b")
    result = run_matmul(target, a.on(target), b.on(target))
    assert_matmul_close(result, a.numpy(), b.numpy(),
                        what=f"{batch_a}+({m},{k}) {a.layout} @ {batch_b}+({k},{n}) {b.layout} on {target}")


VECTOR_CASES = {  # name -> (shape of a, shape of b) in terms of (B, M, N, K)
    "vector @ matrix": lambda B, M, N, K: ((K,), (K, N)),
    "matrix @ vector": lambda B, M, N, K: ((M, K), (K,)),
    "vector @ vector": lambda B, M, N, K: ((K,), (K,)),
    "vector @ batch": lambda B, M, N, K: ((K,), (B, K, N)),
    "batch @ vector": lambda B, M, N, K: ((B, M, K), (K,)),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(VECTOR_CASES))
@given(data=st.data(), batch=st.integers(0, 3), m=sides, n=sides, k=sides, dtype=dtypes)
def test_vector_operands_follow_numpy(target, case, data, batch, m, n, k, dtype):
    """1-D operands: a is a row, b a column, and that dimension is dropped (vector @ vector is 0-d)."""
    shape_a, shape_b = VECTOR_CASES[case](batch, m, n, k)
    a = data.draw(operands(shape_a, dtype), label="a")
    b = data.draw(operands(shape_b, dtype), label="b")
    result = run_matmul(target, a.on(target), b.on(target))
    assert_matmul_close(result, a.numpy(), b.numpy(), what=f"{case} {shape_a} @ {shape_b} on {target}")


@pytest.mark.parametrize("target", TARGETS)
@given(m=sides, n=sides, k=sides, dtype=float_dtypes, seed=st.integers(0, 2**16))
def test_transposed_and_sliced_views_are_read_through_strides(target, m, n, k, dtype, seed):
    """``a.T``, ``x.transpose(0, 2, 1)`` and step slices, as views of the caller's memory.

    The views are ``kernels/layout.py``'s, as the framework makes them: numba's ``DeviceNDArray``
    copies on ``.T`` (2-D only) and cannot slice an empty array.
    """
    at = values((k, m), dtype, seed=seed)                 # a = at.T
    bt = values((2, n, k), dtype, seed=seed + 1)          # b = bt.transpose(0, 2, 1)
    wide = values((m, 2 * k + 1), dtype, seed=seed + 2)   # c = wide[:, 1::2]
    on = (lambda x: x) if target == "cpu" else cuda.to_device
    a = permuted_view(on(at), (1, 0))
    b = permuted_view(on(bt), (0, 2, 1))
    c = sliced_view(on(wide), (slice(None), slice(1, None, 2)))
    assert_matmul_close(run_matmul(target, a, b), at.T, bt.transpose(0, 2, 1), what="a.T @ b^T(0,2,1)")
    assert_matmul_close(run_matmul(target, c, b), wide[:, 1::2], bt.transpose(0, 2, 1), what="sliced @ b")


@given(data=st.data(), tile=st.integers(1, 5), m=st.integers(1, 7), n=st.integers(1, 7),
       k=st.integers(1, 7), dtype=dtypes)
def test_every_tile_size_gives_the_numpy_result(data, tile, m, n, k, dtype):
    """Sides that are not multiples of the tile: partial tiles in M, N and K."""
    a = data.draw(operands((m, k), dtype), label="a")
    b = data.draw(operands((k, n), dtype), label="b")
    result = run_matmul("cuda", a.on("cuda"), b.on("cuda"), tile=tile)
    assert_matmul_close(result, a.numpy(), b.numpy(), what=f"tile {tile}: ({m},{k}) @ ({k},{n})")


@given(data=st.data(), tile=st.integers(1, 4), per_thread=st.integers(1, 3), m=st.integers(1, 9),
       n=st.integers(1, 9), k=st.integers(1, 9), dtype=dtypes)
def test_every_register_tile_gives_the_numpy_result(data, tile, per_thread, m, n, k, dtype):
    """Each thread computes per_thread x per_thread outputs: partial register tiles in M and N too."""
    a = data.draw(operands((m, k), dtype), label="a")
    b = data.draw(operands((k, n), dtype), label="b")
    out = empty_on("cuda", (m, n), matmul_result_dtype(a.numpy().dtype, b.numpy().dtype))
    matmul_cuda(out, a.on("cuda"), b.on("cuda"), tile=tile, per_thread=per_thread)
    assert_matmul_close(to_host(out), a.numpy(), b.numpy(),
                        what=f"tile {tile}, per_thread {per_thread}: ({m},{k}) @ ({k},{n})")


@given(tile=st.integers(1, 4), per_thread=st.integers(1, 3), m=st.integers(1, 8), n=st.integers(1, 8),
       k=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_every_tiling_sums_in_the_same_order(tile, per_thread, m, n, k, seed):
    """The same float32 bits for any tile and register tile: each output adds its products k = 0, 1, ...,
    so a change of launch configuration (a GPU's or the simulator's) never changes a result."""
    a, b = values((m, k), np.float32, seed=seed), values((k, n), np.float32, seed=seed + 1)
    results = []
    for config in ((1, 1), (tile, per_thread)):
        out = cuda.device_array((m, n), np.float32)
        matmul_cuda(out, cuda.to_device(a), cuda.to_device(b), tile=config[0], per_thread=config[1])
        results.append(out.copy_to_host())
    np.testing.assert_array_equal(results[1], results[0])


@pytest.mark.parametrize("per_thread", [0, 9, 2.0, True])
def test_bad_per_thread_is_refused(per_thread):
    a = cuda.device_array((2, 2), np.float32)
    with pytest.raises(LaunchConfigError, match="per_thread must be an int from 1 to 8"):
        matmul_cuda(a, cuda.to_device(np.ones((2, 2), np.float32)), cuda.to_device(np.ones((2, 2), np.float32)),
                    per_thread=per_thread)


@pytest.mark.parametrize("tile, per_thread", [(2, 1), (3, 1), (4, 1), (5, 1), (2, 2), (1, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_several_blocks_in_every_grid_direction(tile, per_thread, dtype):
    """(2, 7, 7) @ (7, 6): 2-4 blocks along x and y, 2 batches along z, 2-7 K-steps."""
    a, b = values((2, 7, 7), dtype, seed=tile), values((7, 6), dtype, seed=10 + tile)
    out = cuda.device_array((2, 7, 6), dtype)
    matmul_cuda(out, permuted_view(cuda.to_device(a), (0, 2, 1)), cuda.to_device(b), tile=tile,
                per_thread=per_thread)
    assert_matmul_close(out.copy_to_host(), a.transpose(0, 2, 1), b, what=f"tile {tile}, per_thread {per_thread}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shapes", [((3, 0), (0, 4)), ((2, 3, 0), (0, 2)), ((0,), (0,)), ((0,), (0, 5))])
def test_zero_inner_dimension_gives_zeros(target, shapes):
    a, b = (empty_on(target, s, np.float32) for s in shapes)
    result = run_matmul(target, a, b)
    assert result.shape == np.matmul(np.empty(shapes[0]), np.empty(shapes[1])).shape
    assert (result == 0).all(), result


@pytest.mark.parametrize("shapes", [((0, 3), (3, 4)), ((2, 3), (3, 0)), ((0, 2, 3), (3, 4)),
                                    ((2, 0, 3), (1, 3, 4))])
def test_empty_result_launches_nothing(monkeypatch, shapes):
    def no_launch(*args, **kwargs):
        raise AssertionError(f"matmul launched a kernel for the empty product {shapes}")

    monkeypatch.setattr(matmul_module, "launcher", no_launch)
    a, b = (empty_on("cuda", s, np.float64) for s in shapes)
    out = empty_on("cuda", np.matmul(np.empty(shapes[0]), np.empty(shapes[1])).shape, np.float64)
    get_kernel("matmul", "cuda")(out, a, b)


def test_broadcast_batch_operand_is_read_not_copied(monkeypatch):
    """A batch broadcast with stride 0 reaches the kernel as stride 0 over the user's own buffer."""
    seen = []
    real_launcher = matmul_module.launcher

    def spy(kernel, grid, block, stream=0):
        launch = real_launcher(kernel, grid, block, stream)

        def call(out, out_strides, a, a_strides, *rest):
            seen.append((a, a_strides))
            launch(out, out_strides, a, a_strides, *rest)
        return call

    monkeypatch.setattr(matmul_module, "launcher", spy)
    small = values((1, 3, 4), np.float32, seed=1)
    b = values((5, 4, 2), np.float32, seed=2)
    a_device = cuda.to_device(small)
    a = broadcast_view(a_device, (5, 3, 4))
    result = run_matmul("cuda", a, cuda.to_device(b))
    assert_matmul_close(result, np.broadcast_to(small, (5, 3, 4)), b, what="stride-0 batch")
    (storage, strides), = seen
    assert strides[0] == 0, f"the batch stride of a is {strides[0]}, expected 0 (broadcast)"
    assert _start_address(storage) == _start_address(a_device), "a was copied"


@pytest.mark.skipif(not is_simulator(), reason="the simulator's compiled tier picks its own block tile")
@pytest.mark.parametrize("m, n, k", [(64, 10, 256), (10, 64, 256), (64, 256, 10), (100, 30, 8), (3, 5, 7)])
def test_a_compiled_skinny_product_computes_at_most_twice_its_cells(monkeypatch, m, n, k):
    """Every cell of a block's tile is computed, inside the matrices or not: the default tile of a product
    with a narrow side (a Linear to 10 classes, its gradients) must fit that side, not compute 6.4 times
    the product's cells as a 64-wide tile over 10 columns did."""
    from pyflow.kernels import sim

    launched = []
    real_launcher = matmul_module.launcher

    def spy(kernel, grid, block, stream=0):
        launched.append((kernel, grid, block))
        return real_launcher(kernel, grid, block, stream)

    monkeypatch.setattr(matmul_module, "launcher", spy)
    a, b = values((m, k), np.float32, seed=5), values((k, n), np.float32, seed=6)
    with sim.configure(tier="compiled"):
        result = run_matmul("cuda", cuda.to_device(a), cuda.to_device(b))
    assert_matmul_close(result, a, b, what=f"({m}, {k}) @ ({k}, {n})")
    (kernel, (gx, gy, _), (tile, _)), = launched
    per_thread = next(r for r in range(1, 9) if matmul_module.make_matmul_kernel(tile, np.dtype(np.float32), r) is kernel)
    side = tile * per_thread
    cells = gx * side * gy * side
    assert cells <= max(2 * m * n, 16 * 16), f"a {side}-wide tile computes {cells} cells for {m} x {n}"


def _start_address(device_array) -> int:
    """Where a device array's first element lives (the numpy buffer behind it in the simulator)."""
    if is_simulator():
        return device_array._ary.__array_interface__["data"][0]
    return device_array.__cuda_array_interface__["data"][0]


def test_batches_beyond_the_grid_z_limit_are_looped_over(monkeypatch):
    monkeypatch.setattr(matmul_module, "MAX_GRID_Z", 2)
    a = values((5, 2, 3), np.int64, seed=3)
    b = values((5, 3, 2), np.int64, seed=4)
    assert_matmul_close(run_matmul("cuda", cuda.to_device(a), cuda.to_device(b)), a, b,
                        what="5 batches on a grid of z = 2")


@pytest.mark.parametrize("target", TARGETS)
def test_output_may_be_a_transposed_view(target):
    """The product lands in ``base`` itself, written through the transposed view's strides."""
    a, b = values((3, 4), np.float64, seed=5), values((4, 5), np.float64, seed=6)
    base = empty_on(target, (5, 3), np.float64)
    on = (lambda x: x) if target == "cpu" else cuda.to_device
    get_kernel("matmul", target)(permuted_view(base, (1, 0)), on(a), on(b))
    assert_matmul_close(to_host(base).T, a, b, what="into out.T")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_inf_and_nan_propagate_like_numpy_in_a_partial_k_tile(target, dtype):
    """K = 5, tiles 2-4: the last K-tile is partial.  Its unused cells, in the A tile and in the
    B tile, must hold 0, not a stale inf from the previous tile (0 * inf would make a nan)."""
    a = values((3, 5), dtype, low=1, high=5, seed=7)
    a[0, 1], a[1, 2], a[2, 3] = np.inf, -np.inf, np.nan
    b = values((5, 4), dtype, low=1, high=5, seed=8)
    b[1, 0], b[2, 1], b[3, 3] = 0, np.inf, -np.inf  # inf * 0: nan in numpy too
    on = (lambda x: x) if target == "cpu" else cuda.to_device
    for tile in ([None] if target == "cpu" else [None, 2, 3, 4]):
        with np.errstate(all="ignore"):
            result = run_matmul(target, on(a), on(b), tile=tile)
        assert_matmul_close(result, a, b, what=f"inf/nan with tile {tile} on {target}")


def test_float32_inputs_accumulate_in_float32():
    """Like cuBLAS's default: 1e8 + 1 rounds to 1e8 in float32, so the sum below is 0, not 1."""
    a = cuda.to_device(np.array([[1e8, 1.0, -1e8]], np.float32))
    b = cuda.to_device(np.ones((3, 1), np.float32))
    assert run_matmul("cuda", a, b, tile=4)[0, 0] == 0.0


# --- bad input: a clear error before any launch, where numpy also refuses ---------


@pytest.mark.parametrize("target", TARGETS)
@given(m=sides, n=sides, k_a=sides, k_b=sides, nd_a=st.integers(1, 3), nd_b=st.integers(1, 3))
def test_inner_dimension_mismatch_raises_like_numpy(target, m, n, k_a, k_b, nd_a, nd_b):
    assume(k_a != k_b)
    shape_a = ((2,) * (nd_a - 2) + (m, k_a)) if nd_a > 1 else (k_a,)
    shape_b = ((2,) * (nd_b - 2) + (k_b, n)) if nd_b > 1 else (k_b,)
    with pytest.raises(ValueError):
        np.matmul(np.empty(shape_a), np.empty(shape_b))
    a, b = empty_on(target, shape_a, np.float32), empty_on(target, shape_b, np.float32)
    out = empty_on(target, (1,), np.float32)
    with pytest.raises(ShapeError, match=rf"matmul: shapes {_re(shape_a)} and {_re(shape_b)} do not match"):
        get_kernel("matmul", target)(out, a, b)


def _re(shape) -> str:
    return str(tuple(shape)).replace("(", r"\(").replace(")", r"\)")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shapes", [((), (3,)), ((2, 3), ()), ((), ())])
def test_0d_operand_is_refused_like_numpy(target, shapes):
    with pytest.raises(ValueError):
        np.matmul(np.ones(shapes[0]), np.ones(shapes[1]))
    a, b = (empty_on(target, s, np.float64) for s in shapes)
    with pytest.raises(ShapeError, match=rf"matmul: shapes {_re(shapes[0])} and {_re(shapes[1])}: a 0-d"):
        get_kernel("matmul", target)(empty_on(target, (), np.float64), a, b)


@pytest.mark.parametrize("target", TARGETS)
def test_batch_dims_that_do_not_broadcast_are_refused(target):
    a, b = empty_on(target, (2, 3, 4), np.float32), empty_on(target, (3, 4, 5), np.float32)
    with pytest.raises(ShapeError, match=r"batch dimensions \(2,\) and \(3,\) cannot be broadcast"):
        get_kernel("matmul", target)(empty_on(target, (2, 3, 5), np.float32), a, b)


@pytest.mark.parametrize("target", TARGETS)
def test_wrong_output_or_unsupported_dtype_is_refused(target):
    a, b = empty_on(target, (2, 3), np.int32), empty_on(target, (3, 4), np.float32)
    run = get_kernel("matmul", target)
    with pytest.raises(ShapeError, match=r"matmul: output has shape \(4, 2\), expected \(2, 4\)"):
        run(empty_on(target, (4, 2), np.float64), a, b)
    with pytest.raises(DTypeError, match="matmul: output dtype is float32, expected float64"):
        run(empty_on(target, (2, 4), np.float32), a, b)
    with pytest.raises(DTypeError, match="matmul: unsupported dtype bool"):
        run(empty_on(target, (2, 4), np.bool_), empty_on(target, (2, 3), np.bool_), b)
    for small in (np.float16, np.int8, np.uint8, np.int16):  # of kernels/dtypes.py, matmul takes 4
        with pytest.raises(DTypeError, match=f"matmul: unsupported dtype {np.dtype(small)}"):
            run(empty_on(target, (2, 4), small), empty_on(target, (2, 3), small), empty_on(target, (3, 4), small))


@pytest.mark.parametrize("target", TARGETS)
def test_broadcast_output_is_refused(target):
    a, b = empty_on(target, (3, 2), np.float32), empty_on(target, (2, 4), np.float32)
    out = broadcast_view(empty_on(target, (1, 4), np.float32), (3, 4))
    with pytest.raises(ShapeError, match="broadcast view"):
        get_kernel("matmul", target)(out, a, b)


def test_cuda_matmul_refuses_host_arrays():
    with pytest.raises(DTypeError, match="expected device arrays"):
        get_kernel("matmul", "cuda")(np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 2)))


@pytest.mark.parametrize("tile", [0, 33, 2.0, True])
def test_bad_tile_is_refused(tile):
    a = empty_on("cuda", (2, 2), np.float32)
    with pytest.raises(LaunchConfigError, match="tile must be an int from 1 to 32"):
        matmul_cuda(a, a, a, tile=tile)


@pytest.mark.parametrize("target", TARGETS)
def test_an_output_overlapping_an_input_is_refused(target):
    """A tiled kernel would overwrite values other blocks still read."""
    a = empty_on(target, (4, 4), np.float32)
    with pytest.raises(ShapeError, match="overlaps an input"):
        get_kernel("matmul", target)(a, a, empty_on(target, (4, 4), np.float32))
    with pytest.raises(ShapeError, match="overlaps an input"):
        get_kernel("matmul", target)(a[:, :2], empty_on(target, (4, 3), np.float32), a[:3, :2])
