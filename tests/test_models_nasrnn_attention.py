"""pyflow.models.NASRNN and Attention (seed 001, issue 17): the Cocktailer artifact's models, as specifications.

* Each model, in both modes, equals a PyTorch reference written here from the
  artifact's model (``artifacts/models/nasrnn.py``, ``attention.py``, branch
  cocktailer_artifact), with the reference's random weights loaded through
  ``load_state_dict``, at the artifact's tolerance (atol = rtol = 1e-3); the two
  executors are bitwise equal.
* Compiled: one launch, no host syncs, and the grid barriers the module docstrings
  count (fewer than the artifact's one per operator).
* Attention's scale is the artifact's literal 0.125 whatever the head size.
* The new uTasks (broadcast/strided batched matmul, NASRNN cell, scaled softmax)
  equal numpy in uOperator kernels with random grids and block sizes, and write
  nothing outside what they own.
* Bad state dicts, inputs and ``batched_matmul`` shapes raise errors naming the problem.

Sizes are tiny (threads 4, chunk 4, tile 4): every kernel runs in the simulator.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow.cocktailer as ck
from pyflow.cocktailer.model_ops import batched_matmul, nasrnn_cell, scaled_softmax_rows
from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.launch import launcher
from pyflow.kernels.utask.batched import broadcast_matmul_utask_count, make_broadcast_matmul_kernel
from pyflow.kernels.utask.nasrnn import nasrnn_cell_kernel, nasrnn_cell_utask_count
from pyflow.kernels.utask.scaled_softmax import make_scaled_softmax_row_kernel, scaled_softmax_row_utask_count
from pyflow.models import NASRNN, Attention, StateDictError
from tests.strategies import assert_close, float_dtypes, values

TINY = {"threads": 4, "chunk": 4, "tile": 4}
TOL = {"atol": 1e-3, "rtol": 1e-3}   # the artifact's correctness check


# ---- the artifact's models in PyTorch (the references) ------------------------------------


def _torch():
    return pytest.importorskip("torch")


@functools.cache
def artifact_models():
    """``(NasRNN, Attention)``: the artifact's two models as torch modules, on the CPU.

    Differences from the artifact, none in what they compute: the batch comes from
    the input (the artifact's NasRNN takes it in its constructor), the states are
    made on the CPU, and Attention takes ``start_len`` (and the scale, default the
    artifact's 0.125) as arguments instead of module constants.
    """
    torch = _torch()
    nn = torch.nn

    class NasRNN(nn.Module):
        def __init__(self, input_size, hidden_size):
            super().__init__()
            self.weight_ih = nn.Parameter(torch.randn(8, input_size, hidden_size))
            self.weight_hh = nn.Parameter(torch.randn(8, hidden_size, hidden_size))
            nn.init.xavier_uniform_(self.weight_ih)
            nn.init.xavier_uniform_(self.weight_hh)
            self.hidden_size = hidden_size

        def forward(self, inputs):  # (seq, batch, input_size)
            c = torch.zeros(inputs.shape[1], self.hidden_size)
            m = torch.zeros(inputs.shape[1], self.hidden_size)
            for t in range(inputs.shape[0]):
                ih = torch.matmul(inputs[t], self.weight_ih)       # (8, B, H)
                hh = torch.matmul(m, self.weight_hh)
                acts = (torch.sigmoid, torch.relu, torch.sigmoid, torch.relu,
                        torch.tanh, torch.sigmoid, torch.tanh, torch.sigmoid)
                l1 = [act(ih[g] + hh[g]) for g, act in enumerate(acts)]
                a = torch.tanh(l1[0] * l1[1])
                b = torch.tanh(l1[2] + l1[3])
                d = torch.tanh(l1[4] * l1[5])
                e = torch.sigmoid(l1[6] + l1[7])
                c = torch.tanh(a + c) * b
                m = torch.tanh(c * torch.tanh(d + e))
            return torch.sum(c + m)

    class Attention(nn.Module):
        def __init__(self, num_head, size_per_head, start_len, scale=0.125):
            super().__init__()
            for name in ("weight_q", "weight_k", "weight_v", "weight_o"):
                weight = nn.Parameter(torch.randn(num_head, size_per_head, size_per_head))
                nn.init.xavier_uniform_(weight)
                setattr(self, name, weight)
            self.num_head, self.size_per_head, self.start_len, self.scale = num_head, size_per_head, start_len, scale

        def forward(self, x, k, v):  # x (B, nh, 1, d); k, v (B, nh, S, d)
            k, v = k + 0.0, v + 0.0
            batch = x.shape[0]
            gen_id = self.start_len
            for _ in range(k.shape[2] - self.start_len):
                q = torch.matmul(x, self.weight_q)
                k[:, :, gen_id, :] = torch.reshape(torch.matmul(x, self.weight_k),
                                                   (batch, self.num_head, self.size_per_head))
                v[:, :, gen_id, :] = torch.reshape(torch.matmul(x, self.weight_v),
                                                   (batch, self.num_head, self.size_per_head))
                attn = torch.matmul(k, q.transpose(2, 3)).transpose(2, 3) * self.scale
                attn = torch.softmax(attn, dim=3)
                x = torch.matmul(torch.matmul(attn, v), self.weight_o)
                gen_id += 1
            return k, v, x

    return NasRNN, Attention


def numpy_state(module) -> dict:
    return {name: p.detach().numpy() for name, p in module.state_dict().items()}


def nasrnn_pair(input_size, hidden, seed, **options):
    torch = _torch()
    torch.manual_seed(seed)
    reference = artifact_models()[0](input_size, hidden)
    model = NASRNN(input_size, hidden, **{**TINY, **options})
    model.load_state_dict(numpy_state(reference))
    return reference, model


def attention_pair(num_head, d, start, seed, scale=0.125, **options):
    torch = _torch()
    torch.manual_seed(seed)
    reference = artifact_models()[1](num_head, d, start, scale)
    model = Attention(num_head, d, start, scale=scale, **{**TINY, **options})
    model.load_state_dict(numpy_state(reference))
    return reference, model


def attention_inputs(rng, batch, num_head, d, seq_len, start):
    """As the artifact makes them: a random token, caches random in the first ``start`` rows, zeros after."""
    x = rng.standard_normal((batch, num_head, 1, d)).astype(np.float32)
    k = np.zeros((batch, num_head, seq_len, d), np.float32)
    v = np.zeros((batch, num_head, seq_len, d), np.float32)
    k[:, :, :start] = rng.standard_normal((batch, num_head, start, d))
    v[:, :, :start] = rng.standard_normal((batch, num_head, start, d))
    return x, k, v


def run_reference(reference, *arrays):
    torch = _torch()
    with torch.no_grad():
        out = reference(*(torch.from_numpy(a) for a in arrays))
    return tuple(o.numpy() for o in out) if isinstance(out, tuple) else out.numpy()


# ---- NASRNN ------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 2])
def test_nasrnn_matches_the_artifact_at_hidden_8_seq_5(batch):
    reference, model = nasrnn_pair(8, 8, seed=batch, blocks=3)
    x = np.random.default_rng(batch).standard_normal((5, batch, 8)).astype(np.float32)
    want = run_reference(reference, x)
    compiled, host = model(x, mode="compiled"), model(x, mode="host")
    assert compiled.shape == () and compiled.dtype == np.float32
    np.testing.assert_allclose(compiled, want, **TOL)
    assert np.array_equal(compiled, host)


@settings(max_examples=4, deadline=None)
@given(seq=st.integers(1, 4), batch=st.integers(1, 3), input_size=st.integers(1, 6), hidden=st.integers(1, 9),
       blocks=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_nasrnn_matches_the_artifact_and_host_equals_compiled(seq, batch, input_size, hidden, blocks, seed):
    reference, model = nasrnn_pair(input_size, hidden, seed, blocks=blocks)
    x = np.random.default_rng(seed).standard_normal((seq, batch, input_size)).astype(np.float32)
    want = run_reference(reference, x)
    compiled, host = model(x, mode="compiled"), model(x, mode="host")
    np.testing.assert_allclose(compiled, want, **TOL)
    assert np.array_equal(compiled, host)


def test_nasrnn_compiled_is_one_launch_without_host_syncs_and_two_barriers_a_step():
    seq = 4
    model = NASRNN(3, 5, blocks=2, **TINY)
    x = np.ones((seq, 2, 3), np.float32)
    model(x)
    compiled = model.last_compiled
    assert compiled is model.compiled_for(seq, 2, "compiled")
    assert (compiled.last_stats.launches, compiled.last_stats.host_syncs) == (1, 0)
    # nasrnn.py: before hh and before the cell, each step; before the sum and the output copy
    assert compiled.last_stats.barriers == 2 * seq + 2
    assert f"for i0 in range({seq})" in compiled.source
    model(x, mode="host")                     # every operator a launch: 5 per step at least
    assert model.last_compiled.last_stats.launches >= 5 * seq


def test_nasrnn_mode_comes_from_the_constructor_unless_the_call_names_one():
    model = NASRNN(2, 3, mode="host", blocks=1, **TINY)
    x = np.ones((2, 1, 2), np.float32)
    host = model(x)
    assert model.last_compiled.mode == "host"
    assert np.array_equal(model(x, mode="compiled"), host) and model.last_compiled.mode == "compiled"
    with pytest.raises(ValueError, match="mode must be one of"):
        NASRNN(2, 3, mode="eager")
    with pytest.raises(ValueError, match="mode must be one of"):
        model(x, mode="eager")


def test_nasrnn_default_init_is_xavier_uniform_and_state_dict_round_trips():
    model = NASRNN(6, 4, seed=1, **TINY)
    bound = math.sqrt(6 / (6 * 4 + 8 * 4))           # fan_in = in * H, fan_out = 8 * H (torch's 3-d fans)
    assert 0.5 * bound < np.abs(model.weight_ih).max() <= bound
    state = model.state_dict()
    other = NASRNN(6, 4, seed=2, **TINY)
    other.load_state_dict(state)
    x = np.random.default_rng(0).standard_normal((2, 1, 6)).astype(np.float32)
    assert np.array_equal(model(x), other(x))


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("weight_hh"), "missing keys ['weight_hh']"),
    (lambda d: d.update(bias=np.zeros(4)), "unexpected keys ['bias']"),
    (lambda d: d.update(weight_ih=np.zeros((4, 8, 3))), "'weight_ih' has shape (4, 8, 3), expected (8, 3, 4)"),
])
def test_bad_nasrnn_state_dict_names_the_problem_and_changes_nothing(change, message):
    model = NASRNN(3, 4, **TINY)
    before = model.state_dict()
    state = {k: v + 1 for k, v in before.items()}
    change(state)
    with pytest.raises(StateDictError, match=r"NASRNN\.load_state_dict") as info:
        model.load_state_dict(state)
    assert message in str(info.value)
    assert all(np.array_equal(before[k], v) for k, v in model.state_dict().items())


def test_nasrnn_rejects_bad_inputs_before_running():
    model = NASRNN(3, 4, **TINY)
    with pytest.raises(ShapeError, match=r"inputs must be \(seq, batch, 3\)"):
        model(np.ones((2, 1, 5), np.float32))
    with pytest.raises(ShapeError, match="inputs must be"):
        model(np.ones((2, 3), np.float32))
    assert model._compiled == {}


# ---- Attention ---------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 2])
def test_attention_matches_the_artifact_at_2_heads_of_8_cache_6_start_3(batch):
    reference, model = attention_pair(2, 8, 3, seed=batch, blocks=3)
    x, k, v = attention_inputs(np.random.default_rng(batch), batch, 2, 8, 6, 3)
    want = run_reference(reference, x, k, v)
    compiled, host = model(x, k, v, mode="compiled"), model(x, k, v, mode="host")
    for got, ref, name in zip(compiled, want, "kvx"):
        assert got.shape == ref.shape and got.dtype == np.float32, name
        np.testing.assert_allclose(got, ref, **TOL, err_msg=name)
    for a, b in zip(compiled, host):
        assert np.array_equal(a, b)


@settings(max_examples=4, deadline=None)
@given(batch=st.integers(1, 2), num_head=st.integers(1, 3), d=st.sampled_from([1, 4, 8, 9]),
       start=st.integers(0, 3), steps=st.integers(0, 3), blocks=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_attention_matches_the_artifact_and_host_equals_compiled(batch, num_head, d, start, steps, blocks, seed):
    """The reference scales by the literal 0.125 at every head size d: so does the model."""
    reference, model = attention_pair(num_head, d, start, seed, blocks=blocks)
    x, k, v = attention_inputs(np.random.default_rng(seed), batch, num_head, d, start + steps, start)
    want = run_reference(reference, x, k, v)
    compiled, host = model(x, k, v, mode="compiled"), model(x, k, v, mode="host")
    for got, ref, name in zip(compiled, want, "kvx"):
        np.testing.assert_allclose(got, ref, **TOL, err_msg=name)
    for a, b in zip(compiled, host):
        assert np.array_equal(a, b)


def test_attention_scale_is_the_artifacts_fixed_literal_unless_given():
    rng = np.random.default_rng(5)
    x, k, v = attention_inputs(rng, 1, 2, 4, 4, 2)
    x *= 4  # large enough scores that the scale matters
    fixed_ref, fixed = attention_pair(2, 4, 2, seed=7)
    textbook_ref, textbook = attention_pair(2, 4, 2, seed=7, scale=1 / math.sqrt(4))
    assert fixed.scale == 0.125 and textbook.scale == 0.5
    got_fixed, got_textbook = fixed(x, k, v)[2], textbook(x, k, v)[2]
    np.testing.assert_allclose(got_fixed, run_reference(fixed_ref, x, k, v)[2], **TOL)
    np.testing.assert_allclose(got_textbook, run_reference(textbook_ref, x, k, v)[2], **TOL)
    assert not np.allclose(got_fixed, got_textbook, **TOL)


def test_attention_compiled_is_one_launch_without_host_syncs_and_five_barriers_a_step():
    start, seq_len = 2, 6
    model = Attention(2, 4, start, blocks=2, **TINY)
    x, k, v = attention_inputs(np.random.default_rng(0), 2, 2, 4, seq_len, start)
    model(x, k, v)
    compiled = model.last_compiled
    steps = seq_len - start
    assert (compiled.last_stats.launches, compiled.last_stats.host_syncs) == (1, 0)
    # attention.py: before q, k @ q^T, the softmax, attn @ v and @ weight_o; one before the outputs
    assert compiled.last_stats.barriers == 5 * steps + 1
    assert f"for i0 in range({steps})" in compiled.source
    model(x, k, v, mode="host")               # 7 operators a step, each a launch
    assert model.last_compiled.last_stats.launches >= 7 * steps


def test_attention_leaves_the_callers_caches_alone_and_writes_only_generated_rows():
    reference, model = attention_pair(2, 4, 3, seed=2, blocks=2)
    x, k, v = attention_inputs(np.random.default_rng(2), 1, 2, 4, 5, 3)
    k_before, v_before = k.copy(), v.copy()
    k_out, v_out, _ = model(x, k, v)
    assert np.array_equal(k, k_before) and np.array_equal(v, v_before)
    assert np.array_equal(k_out[:, :, :3], k[:, :, :3]) and np.array_equal(v_out[:, :, :3], v[:, :, :3])
    assert np.abs(k_out[:, :, 3:]).min() > 0 and np.abs(v_out[:, :, 3:]).min() > 0


def test_attention_with_a_full_cache_runs_no_step():
    model = Attention(2, 4, 3, **TINY)
    x, k, v = attention_inputs(np.random.default_rng(3), 1, 2, 4, 3, 3)
    k_out, v_out, x_out = model(x, k, v)
    assert np.array_equal(k_out, k) and np.array_equal(v_out, v) and np.array_equal(x_out, x)
    assert model.last_compiled.last_stats.launches == 1


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("weight_o"), "missing keys ['weight_o']"),
    (lambda d: d.update(weight_k=np.zeros((2, 4, 3))), "'weight_k' has shape (2, 4, 3), expected (2, 4, 4)"),
])
def test_bad_attention_state_dict_names_the_problem_and_changes_nothing(change, message):
    model = Attention(2, 4, 1, **TINY)
    before = model.state_dict()
    state = {k: v + 1 for k, v in before.items()}
    change(state)
    with pytest.raises(StateDictError, match=r"Attention\.load_state_dict") as info:
        model.load_state_dict(state)
    assert message in str(info.value)
    assert all(np.array_equal(before[k], v) for k, v in model.state_dict().items())


def test_attention_rejects_bad_inputs_before_running():
    model = Attention(2, 4, 3, **TINY)
    x, k, v = attention_inputs(np.random.default_rng(4), 1, 2, 4, 5, 3)
    with pytest.raises(ShapeError, match=r"x must be \(batch, 2, 1, 4\)"):
        model(x[:, :1], k, v)
    with pytest.raises(ShapeError, match="S >= start_len=3"):
        model(x, k[:, :, :2], v[:, :, :2])
    with pytest.raises(ShapeError, match="k and v must have the same shape"):
        model(x, k, v[:, :, :4])
    with pytest.raises(ShapeError, match="v must be"):
        model(x, k, v[:1, :1])
    with pytest.raises(DTypeError, match="scale must be a finite number"):
        Attention(2, 4, 3, scale=float("nan"))
    assert model._compiled == {}


# ---- the ops in the front end ------------------------------------------------------------


def test_batched_matmul_rejects_shapes_that_do_not_broadcast_or_fit():
    def trace(fn, *shapes):
        return ck.trace(fn, *(ck.spec(*s) for s in shapes), **{k: TINY[k] for k in ("chunk", "tile")})

    with pytest.raises(ShapeError, match="do not broadcast"):
        trace(lambda a, b: batched_matmul(a, b), (3, 2, 4), (2, 4, 5))
    with pytest.raises(ShapeError, match="K differs"):
        trace(lambda a, b: batched_matmul(a, b), (2, 4), (8, 3, 5))
    with pytest.raises(ShapeError, match="does not fit into"):
        trace(lambda a, b, c: batched_matmul(a, b, into=c.clone(), at=0), (2, 1, 4), (2, 4, 4), (2, 6, 5))
    with pytest.raises(ShapeError, match="at=6 puts 1 rows outside the 6"):
        trace(lambda a, b, c: batched_matmul(a, b, into=c.clone(), at=6), (2, 1, 4), (2, 4, 4), (2, 6, 4))
    with pytest.raises(ck.TraceError, match="read-only"):
        trace(lambda a, b, c: batched_matmul(a, b, into=c, at=0), (2, 1, 4), (2, 4, 4), (2, 6, 4))
    with pytest.raises(ShapeError, match="overlaps an operand"):
        trace(lambda a, b: (lambda c: batched_matmul(c, b, into=c))(a.clone()), (4, 4), (4, 4))
    with pytest.raises(ShapeError, match=r"gates \(8, 2, 3\)"):
        trace(lambda g, c: nasrnn_cell(g, g, c), (8, 2, 3), (2, 4))
    with pytest.raises(DTypeError, match="scale must be a finite number"):
        trace(lambda x: scaled_softmax_rows(x, "0.125"), (2, 3))


def test_a_cache_row_past_the_end_at_run_time_stops_the_kernel():
    """``at`` a device value: the kernel checks the view against the cache before the matmul writes it."""
    from pyflow.errors import IndexOutOfRangeError

    def write_rows(x, w, cache, row):
        return batched_matmul(x, w, into=cache.clone(), at=row[0].item())

    program = ck.trace(write_rows, ck.spec(2, 1, 4), ck.spec(2, 4, 4), ck.spec(2, 3, 4), ck.spec(1, dtype="int64"),
                       chunk=4, tile=4)
    rng = np.random.default_rng(6)
    x, w, cache = (rng.standard_normal(s).astype(np.float32) for s in ((2, 1, 4), (2, 4, 4), (2, 3, 4)))
    for mode in ("compiled", "host"):
        run = ck.compile(program, mode=mode, threads=4, blocks=2)
        got = run(x, w, cache, np.array([1]))
        want = cache.copy()
        want[:, 1] = (x @ w)[:, 0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        with pytest.raises(IndexOutOfRangeError, match="run-time index"):
            run(x, w, cache, np.array([3]))


# ---- the uTasks in uOperator kernels -------------------------------------------------------

grids = st.integers(1, 4)
blocks = st.integers(4, 16)


@settings(max_examples=5, deadline=None)
@given(outer=st.integers(1, 3), inner=st.integers(1, 3), M=st.integers(1, 5), N=st.integers(1, 6),
       K=st.integers(1, 5), extra_rows=st.integers(0, 2), periods=st.tuples(st.integers(0, 2), st.integers(0, 2)),
       transpose_b=st.booleans(), tile=st.sampled_from([2, 4]), dtype=float_dtypes, grid=grids, block=blocks,
       seed=st.integers(0, 2**16))
def test_broadcast_matmul_utasks_equal_numpy_and_write_only_their_rows(outer, inner, M, N, K, extra_rows, periods,
                                                                       transpose_b, tile, dtype, grid, block, seed):
    """Output m = a[m % a_period] @ b[m % b_period] lands in rows row..row+M-1 of a (batch, R, N) buffer."""
    batch = outer * inner
    a_period, b_period = ({0: 1, 1: inner, 2: batch}[p] for p in periods)
    R = M + extra_rows
    row = extra_rows // 2
    a = values((a_period, M, K), dtype, seed=seed)
    b = values((b_period, N, K) if transpose_b else (b_period, K, N), dtype, seed=seed + 1)
    full = cuda.to_device(np.full(batch * R * N, np.nan, dtype))
    span = (batch - 1) * R * N + M * N
    view = full[row * N:row * N + span]
    count = broadcast_matmul_utask_count(M, N, tile, batch)
    kernel = make_broadcast_matmul_kernel(tile, dtype, transpose_b)
    # one uTask past the count too: it must write nothing
    launcher(kernel, grid, block)(0, count + 1, view, cuda.to_device(a.reshape(-1)), cuda.to_device(b.reshape(-1)),
                                  a_period, b_period, R * N, M, N, K, batch)
    got = full.copy_to_host().reshape(batch, R, N)
    b_mats = np.swapaxes(b, 1, 2) if transpose_b else b
    m = np.arange(batch)
    want = np.full((batch, R, N), np.nan)
    want[:, row:row + M] = np.matmul(a[m % a_period].astype(np.float64), b_mats[m % b_period].astype(np.float64))
    assert_close(got, want.astype(dtype), what=f"broadcast matmul batch {batch} periods {a_period},{b_period}")


@settings(max_examples=5, deadline=None)
@given(batch=st.integers(1, 3), hidden=st.integers(1, 7), chunk=st.integers(1, 8), in_place=st.booleans(),
       dtype=float_dtypes, grid=grids, block=blocks, seed=st.integers(0, 2**16))
def test_nasrnn_cell_utasks_equal_numpy(batch, hidden, chunk, in_place, dtype, grid, block, seed):
    n = batch * hidden
    ih, hh = values((8, n), dtype, low=-3, high=3, seed=seed), values((8, n), dtype, low=-3, high=3, seed=seed + 1)
    c = values(n, dtype, low=-1, high=1, seed=seed + 2)
    c_dev = cuda.to_device(c)
    c_out = c_dev if in_place else cuda.to_device(np.full(n, np.nan, dtype))
    m_out = cuda.to_device(np.full(n, np.nan, dtype))
    launcher(nasrnn_cell_kernel, grid, block)(0, nasrnn_cell_utask_count(batch, hidden, chunk) + 1, c_out, m_out,
                                              cuda.to_device(ih.reshape(-1)), cuda.to_device(hh.reshape(-1)), c_dev,
                                              n, chunk)
    z = ih.astype(np.float64) + hh
    sig = lambda s: 1 / (1 + np.exp(-s))  # noqa: E731
    l1 = [sig(z[0]), np.maximum(z[1], 0), sig(z[2]), np.maximum(z[3], 0), np.tanh(z[4]), sig(z[5]),
          np.tanh(z[6]), sig(z[7])]
    c_new = np.tanh(np.tanh(l1[0] * l1[1]) + c) * np.tanh(l1[2] + l1[3])
    m_new = np.tanh(c_new * np.tanh(np.tanh(l1[4] * l1[5]) + sig(l1[6] + l1[7])))
    assert_close(c_out.copy_to_host(), c_new.astype(dtype), what="c")
    assert_close(m_out.copy_to_host(), m_new.astype(dtype), what="m")


@settings(max_examples=5, deadline=None)
@given(rows=st.integers(1, 4), width=st.integers(1, 40), scale=st.sampled_from([0.125, 1.0, -2.0, 30.0]),
       in_place=st.booleans(), max_block=st.sampled_from([1, 3, 1024]), dtype=float_dtypes, grid=grids,
       block=blocks, seed=st.integers(0, 2**16))
def test_scaled_softmax_row_utasks_equal_numpy(rows, width, scale, in_place, max_block, dtype, grid, block, seed):
    """Rows wider than the block, negative scales, and scales that overflow a naive exp (30 * 10)."""
    x = values((rows, width), dtype, seed=seed)
    x_dev = cuda.to_device(x.reshape(-1))
    out = x_dev if in_place else cuda.to_device(np.full(rows * width, np.nan, dtype))
    launcher(make_scaled_softmax_row_kernel(scale, dtype, max_block), grid, block)(
        0, scaled_softmax_row_utask_count(rows, width) + 1, out, x_dev, rows, width)
    z = scale * x.astype(np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    assert_close(out.copy_to_host().reshape(rows, width), (e / e.sum(axis=1, keepdims=True)).astype(dtype),
                 what=f"softmax({scale} * x) {x.shape} max_block={max_block}")
