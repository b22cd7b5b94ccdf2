"""How much work a long sum's pass 1 and a softmax row do (issue 29: simulated CUDA at CPU speed).

* pass 1 of a long row (``reduce.make_reduce``'s ``reduce_partials``) gives block ``b`` one
  contiguous stretch of the row (CUB's "even share"), so a block's reads stay together on the
  compiled tier, where its threads run one after another; on the compiled tier the launch has at
  most ``SIM_PARTIALS`` blocks;
* softmax (``softmax.make_row_softmax``) computes one ``exp`` per element: it keeps the exp of
  the sum pass in the output and divides it there.

The launches here are tiny and ask for the threaded tier, where the kernels run as Python (so a
counting ``math`` can stand in for the module's).
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow.kernels.reduce as reduce_module
import pyflow.kernels.softmax as softmax_module
from pyflow.kernels.backend import cuda, is_simulator
from pyflow.kernels.launch import launcher
from pyflow.kernels.registry import get_kernel
from tests.strategies import values

pytestmark = pytest.mark.skipif(not is_simulator(), reason="runs kernels as Python on the simulator's threaded tier")

if is_simulator():
    from pyflow.kernels import sim


@settings(max_examples=15, deadline=None)
@given(width=st.integers(1, 90), blocks=st.integers(1, 5), block=st.sampled_from([1, 2, 4, 8]),
       kind=st.sampled_from(["sum", "max"]), seed=st.integers(0, 2**16))
def test_pass_1_gives_each_block_one_stretch_of_the_row(width, blocks, block, kind, seed):
    """``partial[b]`` folds exactly elements ``[b * span, (b + 1) * span)``, ``span`` a whole number of
    blocks (ints: the folds are exact in any order); blocks past the row's end hold the identity."""
    x = values(width, np.int64, seed=seed)
    span = -(-width // (blocks * block)) * block
    identity = 0 if kind == "sum" else np.iinfo(np.int64).min
    expected = [getattr(np, kind)(x[b * span:(b + 1) * span], initial=identity) for b in range(blocks)]
    partial = cuda.device_array(blocks, np.int64)
    with sim.configure(tier="threads"):
        launcher(reduce_module.make_reduce(kind, np.dtype(np.int64), block)[1], blocks, block)(
            partial, cuda.to_device(x), (width,), (1,), width)
    assert partial.copy_to_host().tolist() == expected


def test_a_long_sum_on_the_compiled_tier_launches_at_most_sim_partials_blocks(monkeypatch):
    """Pass 1's grid on the compiled tier: a block there is a round of node passes, not free."""
    grids = []

    def recording(kernel, grid, block, stream=0):
        grids.append((kernel.__name__, grid))
        return lambda *args: None

    monkeypatch.setattr(reduce_module, "launcher", recording)
    monkeypatch.setattr(reduce_module, "compiled_launch", lambda *args: True)
    width = reduce_module.TWO_PASS_WIDTH * 64
    get_kernel("reduce_sum", "cuda")(cuda.device_array((), np.float32), cuda.device_array(width, np.float32))
    assert grids == [("reduce_partials", reduce_module.SIM_PARTIALS), ("reduce_rows", 1)]


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_computes_one_exp_per_element(monkeypatch, op):
    """The sum pass's exp is kept (softmax: in ``out``), not computed again for the output."""
    calls = []

    def counting_exp(v):
        calls.append(v)
        return math.exp(v)

    monkeypatch.setattr(softmax_module, "math", types.SimpleNamespace(exp=counting_exp, log=math.log))
    rows, width = 2, 11
    x = values((rows, width), np.float64, seed=1)
    out = cuda.device_array((rows, width), np.float64)
    with sim.configure(tier="threads"):
        get_kernel(op, "cuda")(out, cuda.to_device(x), axis=-1)
    assert len(calls) == rows * width
    shifted = x - x.max(axis=-1, keepdims=True)
    log_total = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    expected = shifted - log_total if op == "log_softmax" else np.exp(shifted - log_total)
    np.testing.assert_allclose(out.copy_to_host(), expected, rtol=1e-12, atol=1e-15)
