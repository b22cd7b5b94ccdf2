"""The compiled tier's launch path and launch sizes (issue 29): what a launch costs outside the kernel,
and the grids the library picks for the compiled tier.

* A launch finds its compiled module by ``tiers.argument_key`` (dtypes, dimensions, layouts and
  writability read from the arrays), not by ``numba.typeof`` at every launch; a launch whose
  arguments differ in any of those gets its own module and the right values.
* Row kernels (reductions, softmax) get ``SIM_ROW_THREADS``-wide blocks on both tiers (so the same
  bits on both), and a long sum on the compiled tier ``reduce.SIM_PARTIALS`` partial blocks, each
  over its own stretch of the row.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyflow.kernels.backend import cuda, is_simulator
from pyflow.kernels.jit import jit

pytestmark = pytest.mark.skipif(not is_simulator(), reason="the simulator's tiers exist only without a GPU")

if is_simulator():
    from pyflow.kernels import launch, sim
    from pyflow.kernels.reduce import SIM_PARTIALS
    from pyflow.kernels.registry import get_kernel
    from pyflow.kernels.sim import tiers


@jit
def scaled_copy(out, x, scale):
    """out[i, j] = x[i, j] * scale over a 2-D grid of threads."""
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = x[i, j] * scale


def test_a_repeated_launch_does_not_ask_numba_for_the_argument_types(monkeypatch):
    x = cuda.to_device(np.arange(12, dtype=np.float32).reshape(3, 4))
    out = cuda.device_array((3, 4), np.float32)
    with sim.configure(tier="compiled"):
        scaled_copy[(1, 1), (4, 4)](out, x, 2.0)
        calls = []
        typeof = numba.typeof
        monkeypatch.setattr(numba, "typeof", lambda value, *a: calls.append(value) or typeof(value, *a))
        for _ in range(3):
            scaled_copy[(1, 1), (4, 4)](out, x, 3.0)
    assert scaled_copy.last_tier == "compiled"
    assert calls == []
    np.testing.assert_array_equal(out.copy_to_host(), np.arange(12, dtype=np.float32).reshape(3, 4) * 3)


LAYOUTS = {
    "C": lambda a: a,
    "F": lambda a: np.asfortranarray(a),
    "strided": lambda a: a[:, ::2],
    "readonly": lambda a: _readonly(a),
}


def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


@settings(max_examples=8, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(LAYOUTS)), st.sampled_from(["float32", "int64"]),
                          st.sampled_from([2, np.float32(0.5)])), min_size=2, max_size=4))
def test_launches_with_other_argument_types_get_their_own_module(launches):
    """Each launch gives numpy's values whatever layouts, dtypes and scalar types came before it."""
    with sim.configure(tier="compiled"):
        for layout, dtype, scale in launches:
            x = LAYOUTS[layout](np.arange(24, dtype=dtype).reshape(3, 8))
            out = np.zeros(x.shape, np.float64)
            scaled_copy[(1, 2), (4, 4)](out, x, scale)
            assert scaled_copy.last_tier == "compiled"
            np.testing.assert_array_equal(out, x.astype(np.float64) * scale)


def test_argument_key_tells_apart_what_numba_types_apart():
    a = np.zeros((2, 3), np.float32)
    key = tiers.argument_key
    assert key([a, 1]) == key([a + 1, 5]) != key([a, 1.0])
    assert len({key([a]), key([a.T]), key([a[:, ::2]]), key([_readonly(a)]), key([a.astype(np.float64)]),
                key([a], boundscheck=False)}) == 6
    assert key([np.float32(1)]) != key([1.0]) and key([(1, 2)]) != key([(1, 2, 3)])
    assert key([1 << 64]) is None and key([object()]) is None


def test_row_kernels_get_narrow_blocks_on_both_tiers():
    with sim.configure(tier="compiled"):
        assert launch.rows_config(1024, 1024, dtypes=[np.float32]) == (1024, 8)
        assert launch.rows_config(4, 3) == (4, 4)
    with sim.configure(tier="threads"):
        assert launch.rows_config(1024, 1024) == (launch.SIM_MAX_BLOCKS, 8)


# reduce_max and argmax compile two kernels of their own each (5-7 s apiece on a fresh machine): CI's slow stage
@pytest.mark.parametrize("op", ["reduce_sum", pytest.param("reduce_max", marks=pytest.mark.slow),
                                pytest.param("argmax", marks=pytest.mark.slow)])
def test_a_long_reduction_gives_the_same_value_on_both_tiers_with_the_compiled_grid(op, monkeypatch):
    """A 40,000-element row (two passes): the compiled tier's pass 1 has ``SIM_PARTIALS`` blocks."""
    x = np.random.default_rng(5).standard_normal(40_000).astype(np.float32)
    seen = []
    original = launch.launcher
    monkeypatch.setattr("pyflow.kernels.reduce.launcher",
                        lambda kernel, grid, block, *rest: seen.append((grid, block)) or original(kernel, grid, block, *rest))
    results = {}
    for tier in ("threads", "compiled"):
        out = cuda.device_array((), np.int64 if op == "argmax" else np.float32)
        with sim.configure(tier=tier):
            get_kernel(op, "cuda")(out, cuda.to_device(x))
        results[tier] = out.copy_to_host()
    assert seen[2] == (SIM_PARTIALS, launch.SIM_ROW_THREADS)   # compiled pass 1
    if op == "reduce_sum":
        np.testing.assert_allclose(results["compiled"], results["threads"], rtol=1e-5)
    else:
        assert results["compiled"] == results["threads"]
    want = {"reduce_sum": x.sum(dtype=np.float64), "reduce_max": x.max(), "argmax": x.argmax()}[op]
    np.testing.assert_allclose(results["compiled"], want, rtol=1e-4)


def test_softmax_rows_agree_across_tiers_with_narrow_blocks():
    x = np.random.default_rng(6).standard_normal((33, 70)).astype(np.float32)
    results = {}
    for tier in ("threads", "compiled"):
        out = cuda.device_array(x.shape, np.float32)
        with sim.configure(tier=tier):
            get_kernel("softmax", "cuda")(out, cuda.to_device(x))
        results[tier] = out.copy_to_host()
    np.testing.assert_array_max_ulp(results["compiled"], results["threads"], maxulp=4)   # the same additions
    np.testing.assert_allclose(results["compiled"].sum(axis=1), 1, rtol=1e-5)
