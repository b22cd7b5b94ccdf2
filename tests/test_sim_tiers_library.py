"""The kernel library and Cocktailer give the same values on both simulator tiers.

Each case runs one registered cuda kernel (``pyflow.kernels.registry``) on the same random
input, laid out at random (``tests/strategies.py``: transposed, sliced, broadcast), once on the
threaded tier and once on the compiled one.  Integers and bools must be equal; floats equal to
a few units in the last place: the tiers compute in the same order, but the threaded tier rounds
mixed float32/float64 arithmetic as numpy's scalars do and the compiled tier as numba (and so a
GPU) does, and their libm functions (``exp``, ``tanh``) may differ in the last bit.

The default run takes a few ops of each family in float32 and int64, on 2-D operands whose
sizes give one block size per kernel (each rank and block size is a kernel of its own, compiled
once, and a fresh machine compiles each); ``-m slow`` sweeps every unary op and adds the
reductions, row kernels, top-k and Cocktailer programs (about two minutes of compiles on a
fresh machine; CI runs them, ``.ci/run``).  Each
distinct kernel compiles once (numba caches it on disk).  Cocktailer's random programs (one
persistent kernel with grid barriers each) agree on the host, the threaded and the compiled tier
(``tests/test_sim_grid_machine.py`` runs such programs compiled in the default run).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyflow.kernels.backend import cuda, is_simulator
from pyflow.kernels.registry import get_kernel
from tests.strategies import cocktailer_programs, operands, shapes

pytestmark = pytest.mark.skipif(not is_simulator(), reason="the simulator's tiers exist only without a GPU")

if is_simulator():
    from pyflow.kernels import sim

F32, I64 = np.dtype(np.float32), np.dtype(np.int64)


def on_each_tier(call, *inputs):
    """``call(*device views)`` on each tier, from the same inputs; the outputs as numpy arrays."""
    results = {}
    for tier in ("threads", "compiled"):
        with sim.configure(tier=tier):
            results[tier] = call(*[x.on("cuda") if hasattr(x, "on") else x for x in inputs])
    return results["threads"], results["compiled"]


def assert_tiers_agree(threads, compiled, dtype) -> None:
    for a, b in zip(threads, compiled):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype
        if a.dtype.kind == "f":
            assert np.array_equal(np.isnan(a), np.isnan(b))
            np.testing.assert_array_max_ulp(np.nan_to_num(a), np.nan_to_num(b), maxulp=4)
        else:
            np.testing.assert_array_equal(a, b)


def unary(op):
    def call(x):
        out = cuda.device_array(x.shape, np.dtype(_result(op, x.dtype)))
        get_kernel(op, "cuda")(out, x)
        return [out.copy_to_host()]
    return call


def _result(op, dtype):
    from pyflow.kernels.ufuncs import unary_result_dtype

    return unary_result_dtype(op, dtype)


def binary(op):
    def call(a, b):
        from pyflow.kernels.layout import broadcast_shapes
        from pyflow.kernels.ufuncs import binary_result_dtype

        out = cuda.device_array(broadcast_shapes(a.shape, b.shape, op=op), binary_result_dtype(op, a.dtype, b.dtype))
        get_kernel(op, "cuda")(out, a, b)
        return [out.copy_to_host()]
    return call


def reduction(op, axis):
    def call(x):
        from pyflow.kernels.reduce import plan_reduce

        plan = plan_reduce(op, x, axis, False)
        out = cuda.device_array(plan.out_shape, plan.out_dtype)
        get_kernel(op, "cuda")(out, x, axis=axis)
        return [out.copy_to_host()]
    return call


def rows(op):
    def call(x):
        out = cuda.device_array(x.shape, x.dtype)
        if op == "cumsum":
            get_kernel(op, "cuda")(out, x, axis=x.ndim - 1)
        else:
            get_kernel(op, "cuda")(out, x, axis=-1)
        return [out.copy_to_host()]
    return call


def matmul(a, b):
    out = cuda.device_array((a.shape[0], b.shape[1]), np.result_type(a.dtype, b.dtype))
    get_kernel("matmul", "cuda")(out, a, b)
    return [out.copy_to_host()]


def topk(k):
    def call(x):
        values = cuda.device_array(x.shape[:-1] + (k,), x.dtype)
        indices = cuda.device_array(x.shape[:-1] + (k,), np.int64)
        get_kernel("topk", "cuda")(values, indices, x, k=k)
        return [values.copy_to_host(), indices.copy_to_host()]
    return call


@settings(max_examples=6, deadline=None)
@given(data=st.data(), shape=shapes(min_dims=2, max_dims=2, min_side=1, max_side=6),
       dtype=st.sampled_from([F32, I64]), op=st.sampled_from(["neg", "abs", "relu", "sign"]))
def test_unary_elementwise_ops_agree(data, shape, dtype, op):
    x = data.draw(operands(shape, dtype), label="x")
    assert_tiers_agree(*on_each_tier(unary(op), x), dtype)


@settings(max_examples=6, deadline=None)
@given(data=st.data(), shape=shapes(min_dims=2, max_dims=2, min_side=1, max_side=6),
       dtype=st.sampled_from([F32, I64]), op=st.sampled_from(["add", "mul", "floor_divide", "max", "lt"]))
def test_binary_elementwise_ops_broadcast_and_agree(data, shape, dtype, op):
    a = data.draw(operands(shape, dtype), label="a")
    b = data.draw(operands(shape[-1:], dtype), label="b")   # broadcast along the leading axes
    assert_tiers_agree(*on_each_tier(binary(op), a, b), dtype)


@pytest.mark.slow   # a compile per kernel variant: CI runs it (.ci/run, -m slow)
@settings(max_examples=6, deadline=None)
@given(data=st.data(), shape=shapes(min_dims=2, max_dims=2, min_side=5, max_side=8),   # one block size: 8
       dtype=st.sampled_from([F32, I64]), op=st.sampled_from(["reduce_sum", "reduce_max", "argmax"]))
def test_reductions_over_an_axis_agree(data, shape, dtype, op):
    x = data.draw(operands(shape, dtype, allow_broadcast=False), label="x")
    axis = data.draw(st.integers(0, len(shape) - 1), label="axis")
    assert_tiers_agree(*on_each_tier(reduction(op, axis), x), dtype)


@pytest.mark.slow   # a compile per kernel variant: CI runs it (.ci/run, -m slow)
@settings(max_examples=5, deadline=None)
@given(data=st.data(), rows_=st.integers(1, 3), width=st.integers(17, 80), op=st.sampled_from(["softmax", "cumsum"]))
def test_row_kernels_with_shared_memory_trees_agree(data, rows_, width, op):
    shape = (rows_, width)   # blocks of SIM_ROW_THREADS = 8 threads (one kernel per op); cumsum's segments run 3 to 10 long
    x = data.draw(operands(shape, F32, allow_broadcast=False), label="x")
    assert_tiers_agree(*on_each_tier(rows(op), x), F32)


@settings(max_examples=5, deadline=None)
@given(data=st.data(), m=st.integers(1, 9), k=st.integers(0, 9), n=st.integers(1, 9),
       dtype=st.sampled_from([F32, I64]))
def test_tiled_matmul_agrees(data, m, k, n, dtype):
    a = data.draw(operands((m, k), dtype, allow_broadcast=False), label="a")
    b = data.draw(operands((k, n), dtype, allow_broadcast=False), label="b")
    assert_tiers_agree(*on_each_tier(matmul, a, b), dtype)


@pytest.mark.slow   # a compile per kernel variant: CI runs it (.ci/run, -m slow)
@settings(max_examples=4, deadline=None)
@given(data=st.data(), rows_=st.integers(1, 3), width=st.integers(17, 50), k=st.integers(1, 4))
def test_topk_agrees(data, rows_, width, k):
    x = data.draw(operands((rows_, width), F32, allow_broadcast=False), label="x")   # one block size: SIM_ROW_THREADS = 8
    assert_tiers_agree(*on_each_tier(topk(k), x), F32)


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(__import__("pyflow.kernels.ufuncs", fromlist=["UNARY"]).UNARY))
@pytest.mark.parametrize("dtype", [np.dtype(np.float64), np.dtype(np.int32)])
def test_every_unary_op_agrees(op, dtype):
    from pyflow.kernels.ufuncs import UNARY

    if dtype not in UNARY[op].accepts:
        pytest.skip(f"{op} does not take {dtype}")
    x = np.random.default_rng(0).uniform(-5, 5, (3, 7)).astype(dtype)
    assert_tiers_agree(*on_each_tier(unary(op), cuda.to_device(x)), dtype)


# ---- Cocktailer: one persistent kernel per program, with grid barriers ----------------------------


@pytest.mark.slow   # a compile per kernel variant: CI runs it (.ci/run, -m slow)
@settings(max_examples=2, deadline=None)   # each program is a kernel of its own: a compile each
@given(desc=cocktailer_programs(2, ops=2),
       blocks=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_cocktailer_random_programs_agree_on_host_threads_and_compiled(desc, blocks, seed):
    import pyflow.cocktailer as ck
    from pyflow.cocktailer.random_programs import build, inputs, numpy_twin

    args = inputs(1, 4, 3, seed)
    program = ck.trace(build(desc), *args, chunk=4, tile=4, name="random")
    host = ck.compile(program, mode="host", threads=4)(*args)
    got = {}
    for tier in ("threads", "compiled"):
        with sim.configure(tier=tier):
            run = ck.compile(program, mode="compiled", threads=4, blocks=blocks)
            got[tier] = run(*args)
            assert [k.kernel.last_tier for k in run.kernels] == [tier]
    np.testing.assert_array_equal(got["threads"], host)   # the same arithmetic, the same order
    np.testing.assert_allclose(got["compiled"], host, rtol=1e-5, atol=1e-6)   # numba's libm: last bits
    np.testing.assert_allclose(got["compiled"], numpy_twin(desc, *args[:6]), rtol=1e-4, atol=1e-5)
