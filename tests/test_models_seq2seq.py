"""pyflow.models.Seq2seq (seed 001, issue 17): the Cocktailer artifact's Seq2seq decoder, as specifications.

* In both modes the model equals a PyTorch reference written here from the
  artifact's ``AttnDecoderRNN`` (``artifacts/models/seq2seq.py``, branch
  cocktailer_artifact), with the reference's random weights loaded through
  ``load_state_dict``: the tokens exactly, ``h`` at the artifact's tolerance
  (atol = rtol = 1e-3); the two executors are bitwise equal.
* ``std`` forces the tokens (1e6 at the wanted id, as the artifact's benchmark does),
  so the trip count is known: a batch that says EOS early stops there, one that
  never does runs ``max_length`` steps, and a row that says EOS while another goes
  on keeps decoding.
* Compiled: one launch, no host syncs, ``5 * steps + 2`` grid barriers (the module
  docstring's count); host: every test of the condition is a device-to-host read.
* The new uTasks (row argmax of a sum, embedding gather, gate-major LSTM cell)
  equal numpy in uOperator kernels, with torch.argmax's tie and NaN rules.
* ``while_loop_counted`` hands its body the iteration count; bad state dicts,
  inputs and op shapes raise errors naming the problem.

Sizes are tiny (threads 4, chunk 4, tile 4): every kernel runs in the simulator.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import pyflow as flow
import pyflow.cocktailer as ck
from pyflow.cocktailer.model_ops import argmax_sum_rows, embedding, gate_lstm_cell, max_rows_into, while_loop_counted
from pyflow.errors import DTypeError, IterationLimitError, ShapeError
from pyflow.kernels.backend import cuda
from pyflow.kernels.launch import launcher
from pyflow.kernels.utask.argmax import argmax_sum_row_utask_count, make_argmax_sum_row_kernel
from pyflow.kernels.utask.embedding import embedding_kernel, embedding_utask_count
from pyflow.kernels.utask.seq2seq import gate_lstm_cell_kernel, gate_lstm_cell_utask_count
from pyflow.models import Seq2seq, StateDictError
from pyflow.models.seq2seq import EOS, SOS, steps_run
from tests.strategies import assert_close, float_dtypes, values

TINY = {"threads": 4, "chunk": 4, "tile": 4}
TOL = {"atol": 1e-3, "rtol": 1e-3}   # the artifact's correctness check
FORCE = 1e6                          # what the artifact's gen_mask_from_sequence puts at a wanted token


# ---- the artifact's model in PyTorch (the reference) ----------------------------------------


def _torch():
    return pytest.importorskip("torch")


@functools.cache
def artifact_decoder():
    """The artifact's ``AttnDecoderRNN`` (with its hand-written LSTM cell) as a torch module, on the CPU.

    Differences from the artifact, none in what it computes: tensors are made on the
    CPU, ``max_length`` is an argument, the condition is read with ``bool(...)`` (the
    artifact's TorchScript variant), and ``forward`` also records each step's
    decision margin (the gap between the two largest values argmax chose from).
    """
    torch = _torch()
    nn = torch.nn

    class LSTMCell(nn.Module):   # the artifact's ``gru``: weights stacked by gate, one bias vector per gate
        def __init__(self, hidden_size, input_size):
            super().__init__()
            self.weight_ih_l0_t = nn.Parameter(torch.randn(4, input_size, hidden_size))
            self.weight_hh_l0_t = nn.Parameter(torch.randn(4, input_size, hidden_size))
            for g in range(4):
                setattr(self, f"bias_ih_{g}", nn.Parameter(torch.randn(hidden_size)))
                setattr(self, f"bias_hh_{g}", nn.Parameter(torch.randn(hidden_size)))
            nn.init.xavier_uniform_(self.weight_ih_l0_t)
            nn.init.xavier_uniform_(self.weight_hh_l0_t)

    class AttnDecoderRNN(nn.Module):
        def __init__(self, hidden_size, output_size, max_length):
            super().__init__()
            self.hidden_size, self.max_length = hidden_size, max_length
            self.gru = LSTMCell(hidden_size, hidden_size)
            self.out = nn.Linear(hidden_size, output_size)
            self.embedding = nn.Embedding(output_size, hidden_size)
            self.margins = []

        def forward(self, encoder_output, std, h, c):
            batch = encoder_output.size()[1]
            output_all = torch.zeros(self.max_length, batch, dtype=torch.int64)
            output = torch.full((batch,), SOS, dtype=torch.int64)
            cond, step = True, 0
            self.margins = []
            while cond:
                x = self.embedding(output)
                h = torch.reshape(h, (batch, self.hidden_size))
                ih = torch.matmul(x, self.gru.weight_ih_l0_t)
                hh = torch.matmul(h, self.gru.weight_hh_l0_t)
                z = [(ih[g] + getattr(self.gru, f"bias_ih_{g}")) + (hh[g] + getattr(self.gru, f"bias_hh_{g}"))
                     for g in range(4)]
                ingate, forgetgate = torch.sigmoid(z[0]), torch.sigmoid(z[1])
                cellgate, outgate = torch.tanh(z[2]), torch.sigmoid(z[3])
                c = (forgetgate * c) + (ingate * cellgate)
                h = outgate * torch.tanh(c)
                scores = self.out(h) + std[step]
                top2 = torch.topk(scores, min(2, scores.shape[1]), dim=1).values
                self.margins.append(float((top2[:, 0] - top2[:, -1]).min()) if scores.shape[1] > 1 else np.inf)
                output = scores.argmax(1)
                output_all[step] = output
                step += 1
                cond = bool(torch.max(output) > EOS) and step < self.max_length
            return output_all, h

    return AttnDecoderRNN


def numpy_state(module) -> dict:
    return {name: p.detach().numpy() for name, p in module.state_dict().items()}


def seq2seq_pair(hidden, vocab, max_length, seed, **options):
    torch = _torch()
    torch.manual_seed(seed)
    reference = artifact_decoder()(hidden, vocab, max_length)
    model = Seq2seq(hidden, vocab, max_length, **{**TINY, **options})
    model.load_state_dict(numpy_state(reference))
    return reference, model


def forced_std(tokens, vocab, rng=None, noise=0.0, forced=None) -> np.ndarray:
    """``std`` (max_length, B, V) putting ``FORCE`` at ``tokens[k][b]`` where ``forced[k][b]`` (default: everywhere).

    Elsewhere small noise (``noise`` times a normal sample), which leaves those
    decisions to the model.
    """
    tokens = np.asarray(tokens)
    std = np.zeros(tokens.shape + (vocab,), np.float32)
    if noise:
        std += (noise * rng.standard_normal(std.shape)).astype(np.float32)
    forced = np.ones(tokens.shape, bool) if forced is None else np.asarray(forced)
    k, b = np.nonzero(forced)
    std[k, b, tokens[k, b]] = FORCE
    return std


def decoder_inputs(rng, batch, hidden, max_length):
    """``(encoder_output, h, c)`` as the artifact makes them: standard normal."""
    encoder_output = rng.standard_normal((max_length, batch, hidden)).astype(np.float32)
    h, c = (rng.standard_normal((batch, hidden)).astype(np.float32) for _ in range(2))
    return encoder_output, h, c


def run_reference(reference, encoder_output, std, h, c):
    torch = _torch()
    with torch.no_grad():
        out, h_n = reference(*(torch.from_numpy(a) for a in (encoder_output, std, h, c)))
    return out.numpy(), h_n.numpy()


def expected_tokens(tokens) -> tuple:
    """What the loop writes when every decision is forced to ``tokens`` (max_length, B): (output_all, steps)."""
    tokens = np.asarray(tokens, np.int64)
    steps = steps_run(tokens)
    out = np.zeros_like(tokens)
    out[:steps] = tokens[:steps]
    return out, steps


def check_both_modes(reference, model, encoder_output, std, h, c, steps=None):
    """Both executors against the reference (tokens exactly, h at TOL) and against each other (bitwise)."""
    want_out, want_h = run_reference(reference, encoder_output, std, h, c)
    results = {}
    for mode in ("compiled", "host"):
        out, h_n = model(encoder_output, std, h, c, mode=mode)
        assert out.dtype == np.int64 and out.shape == want_out.shape, mode
        assert np.array_equal(out, want_out), f"{mode}: tokens\n{out.T}\nwant\n{want_out.T}"
        assert h_n.shape == want_h.shape and h_n.dtype == np.float32, mode
        np.testing.assert_allclose(h_n, want_h, **TOL, err_msg=f"{mode}: h")
        assert model.last_steps == len(reference.margins), mode
        if steps is not None:
            assert model.last_steps == steps, mode
        results[mode] = (out, h_n, model.last_compiled.last_stats)
    assert np.array_equal(results["compiled"][1], results["host"][1])
    return results


# ---- the model against the artifact --------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 2])
def test_a_batch_that_says_eos_early_stops_there(batch):
    """H 8, V 11, max_length 5: step 3 is EOS in every row; the later forced tokens are never written."""
    reference, model = seq2seq_pair(8, 11, 5, seed=batch, blocks=3)
    tokens = [[3, 4], [5, 0], [2, 7], [EOS, EOS], [9, 6]]   # row 1 says EOS at step 1 and goes on
    tokens = np.array(tokens)[:, :batch]
    encoder_output, h, c = decoder_inputs(np.random.default_rng(batch), batch, 8, 5)
    std = forced_std(tokens, 11)
    want, steps = expected_tokens(tokens)
    assert steps == 4
    results = check_both_modes(reference, model, encoder_output, std, h, c, steps)
    assert np.array_equal(results["compiled"][0], want)
    assert not results["compiled"][0][4].any()   # step 4 never ran: its forced tokens are not there


@pytest.mark.parametrize("batch", [1, 2])
def test_a_batch_that_never_says_eos_runs_max_length_steps(batch):
    reference, model = seq2seq_pair(8, 11, 5, seed=10 + batch, blocks=2)
    tokens = np.array([[1, 10], [4, 4], [7, 2], [10, 1], [2, 3]])[:, :batch]
    encoder_output, h, c = decoder_inputs(np.random.default_rng(10 + batch), batch, 8, 5)
    results = check_both_modes(reference, model, encoder_output, forced_std(tokens, 11), h, c, steps=5)
    assert np.array_equal(results["host"][0], tokens)


def test_the_first_step_always_runs_and_eos_at_once_stops_after_it():
    reference, model = seq2seq_pair(8, 11, 5, seed=3, blocks=2)
    tokens = np.array([[EOS, EOS], [5, 6], [5, 6], [5, 6], [5, 6]])
    encoder_output, h, c = decoder_inputs(np.random.default_rng(3), 2, 8, 5)
    results = check_both_modes(reference, model, encoder_output, forced_std(tokens, 11), h, c, steps=1)
    assert not results["compiled"][0].any()


@settings(max_examples=4, deadline=None)
@given(batch=st.integers(1, 3), hidden=st.integers(1, 9), vocab=st.integers(2, 12), max_length=st.integers(1, 5),
       blocks=st.integers(1, 4), data=st.data(), seed=st.integers(0, 2**16))
def test_forced_decoding_matches_the_artifact_at_any_size(batch, hidden, vocab, max_length, blocks, data, seed):
    """Random sizes and forced sentences, each row with EOS at a random step (or none)."""
    reference, model = seq2seq_pair(hidden, vocab, max_length, seed, blocks=blocks)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab, size=(max_length, batch))
    for b in range(batch):   # each row: EOS from a random step on, or never
        stop = data.draw(st.integers(0, max_length), label=f"row {b}'s first EOS")
        tokens[stop:, b] = EOS
    encoder_output, h, c = decoder_inputs(rng, batch, hidden, max_length)
    want, steps = expected_tokens(tokens)
    results = check_both_modes(reference, model, encoder_output, forced_std(tokens, vocab), h, c, steps)
    assert np.array_equal(results["compiled"][0], want)


@settings(max_examples=4, deadline=None)
@given(batch=st.integers(1, 2), max_length=st.integers(2, 5), forced_share=st.sampled_from([0.0, 0.5]),
       seed=st.integers(0, 2**16))
def test_free_decisions_are_the_models_own_argmax(batch, max_length, forced_share, seed):
    """Some or all decisions left to the model (std is small noise there); near-ties are skipped (assume)."""
    reference, model = seq2seq_pair(8, 11, max_length, seed, blocks=2)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 11, size=(max_length, batch))
    forced = rng.random((max_length, batch)) < forced_share
    std = forced_std(tokens, 11, rng, noise=0.5, forced=forced)
    encoder_output, h, c = decoder_inputs(rng, batch, 8, max_length)
    run_reference(reference, encoder_output, std, h, c)
    assume(min(reference.margins) > 1e-3)   # a float32 near-tie could go either way
    check_both_modes(reference, model, encoder_output, std, h, c)


def test_compiled_is_one_launch_without_host_syncs_and_five_barriers_a_step():
    model = Seq2seq(4, 7, 6, blocks=2, **TINY)
    encoder_output, h, c = decoder_inputs(np.random.default_rng(0), 2, 4, 6)
    for steps in (2, 6):
        tokens = np.full((6, 2), 3)
        tokens[steps - 1:] = EOS   # the last step is the one that says EOS
        std = forced_std(tokens, 7)
        model(encoder_output, std, h, c)
        stats = model.last_compiled.last_stats
        assert model.last_steps == steps
        assert (stats.launches, stats.host_syncs) == (1, 0)
        # seq2seq.py: before the cell, linear, the argmax, out[i] = tok and each test; one before the loop
        assert stats.barriers == 5 * steps + 2
        model(encoder_output, std, h, c, mode="host")   # every test of the condition reads the device
        stats = model.last_compiled.last_stats
        assert stats.host_syncs == steps + 1 and stats.launches >= 11 * steps
    assert "while True:" in model.compiled_for(2, "compiled").source


def test_h_may_come_as_the_artifacts_1_b_h_and_the_callers_arrays_are_left_alone():
    reference, model = seq2seq_pair(4, 6, 3, seed=4, blocks=2)
    encoder_output, h, c = decoder_inputs(np.random.default_rng(4), 2, 4, 3)
    std = forced_std(np.array([[2, 3], [4, 5], [1, 1]]), 6)
    before = [a.copy() for a in (encoder_output, std, h, c)]
    out, h_n = model(encoder_output, std, h[None], c)
    want_out, want_h = run_reference(reference, encoder_output, std, h, c)
    assert np.array_equal(out, want_out)
    np.testing.assert_allclose(h_n, want_h, **TOL)
    assert all(np.array_equal(a, b) for a, b in zip(before, (encoder_output, std, h, c)))


def test_mode_comes_from_the_constructor_and_float64_works():
    model = Seq2seq(3, 5, 3, mode="host", dtype="float64", blocks=1, **TINY)
    encoder_output, h, c = decoder_inputs(np.random.default_rng(5), 1, 3, 3)
    std = forced_std(np.array([[2], [4], [EOS]]), 5)
    out, h_n = model(encoder_output, std, h, c)
    assert model.last_compiled.mode == "host" and h_n.dtype == np.float64
    assert out[:, 0].tolist() == [2, 4, EOS] and model.last_steps == 3
    for mode in ("compiled", "auto"):    # auto: the scheduler puts the whole loop on the device here
        out_c, h_c = model(encoder_output, std, h, c, mode=mode)
        assert np.array_equal(out, out_c) and np.array_equal(h_n, h_c), mode


def test_default_init_and_state_dict_round_trip():
    model = Seq2seq(4, 6, 3, seed=1, **TINY)
    state = model.state_dict()
    assert list(state) == list(model.parameter_shapes())
    assert {k: v.shape for k, v in state.items()} == model.parameter_shapes()
    bound = np.sqrt(6 / (4 * 4 + 4 * 4))    # xavier on (4, H, H): fan_in = H * H, fan_out = 4 * H
    assert 0.5 * bound < np.abs(state["gru.weight_ih_l0_t"]).max() <= bound
    assert np.abs(state["out.weight"]).max() <= 0.5   # nn.Linear: 1 / sqrt(H)
    other = Seq2seq(4, 6, 3, seed=2, **TINY)
    other.load_state_dict(state)
    encoder_output, h, c = decoder_inputs(np.random.default_rng(1), 1, 4, 3)
    std = np.zeros((3, 1, 6), np.float32)
    first, second = model(encoder_output, std, h, c), other(encoder_output, std, h, c)
    assert np.array_equal(first[0], second[0]) and np.array_equal(first[1], second[1])


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("gru.bias_hh_3"), "missing keys ['gru.bias_hh_3']"),
    (lambda d: d.update({"decoder.weight": np.zeros(3)}), "unexpected keys ['decoder.weight']"),
    (lambda d: d.update({"embedding.weight": np.zeros((4, 6))}),
     "'embedding.weight' has shape (4, 6), expected (6, 4)"),
])
def test_bad_state_dict_names_the_problem_and_changes_nothing(change, message):
    model = Seq2seq(4, 6, 3, **TINY)
    before = model.state_dict()
    state = {k: v + 1 for k, v in before.items()}
    change(state)
    with pytest.raises(StateDictError, match=r"Seq2seq\.load_state_dict") as info:
        model.load_state_dict(state)
    assert message in str(info.value)
    assert all(np.array_equal(before[k], v) for k, v in model.state_dict().items())


def test_bad_sizes_and_inputs_are_refused_before_running():
    model = Seq2seq(4, 6, 3, **TINY)
    encoder_output, h, c = decoder_inputs(np.random.default_rng(6), 2, 4, 3)
    std = np.zeros((3, 2, 6), np.float32)
    with pytest.raises(ShapeError, match=r"encoder_output must be \(length, batch, 4\)"):
        model(encoder_output[..., :3], std, h, c)
    with pytest.raises(ShapeError, match=r"std must be \(max_length, batch, output_size\) = \(3, 2, 6\)"):
        model(encoder_output, std[:2], h, c)
    with pytest.raises(ShapeError, match="h and c must be"):
        model(encoder_output, std, h[:1], c)
    assert model._compiled == {}
    with pytest.raises(ShapeError, match="max_length must be an int >= 1"):
        Seq2seq(4, 6, 0)
    with pytest.raises(ShapeError, match="output_size must be an int >= 2"):
        Seq2seq(4, 1, 3)
    with pytest.raises(ShapeError, match="cannot hold exactly"):
        Seq2seq(1, 2**24 + 1, 1)
    with pytest.raises(DTypeError, match="float32 or float64"):
        Seq2seq(4, 6, 3, dtype="int64")
    with pytest.raises(ValueError, match="mode must be one of"):
        Seq2seq(4, 6, 3, mode="eager")


# ---- while_loop_counted and the ops in the front end -------------------------------------


def test_while_loop_counted_hands_its_body_the_iteration_count():
    """``i`` is 0 at the first test and body; the condition may stop on it or on a device value."""
    def program(xs, limit):
        def body(i, acc, n):
            return acc + xs[i], n + flow.exp(flow.zeros(1))   # acc += xs[i]; n += 1
        return while_loop_counted(lambda i, acc, n: (i < limit[0].item()) & (n[0].item() < 3), body,
                                  flow.zeros(2), flow.zeros(1), max_iters=4)

    traced = ck.trace(program, ck.spec(5, 2), ck.spec(1, dtype="int64"), chunk=4, tile=4)
    xs = np.arange(10, dtype=np.float32).reshape(5, 2)
    for mode in ("compiled", "host"):
        run = ck.compile(traced, mode=mode, threads=4, blocks=2)
        for limit, steps in ((2, 2), (5, 3), (0, 0)):
            acc, n = run(xs, np.array([limit]))
            assert np.array_equal(acc, xs[:steps].sum(axis=0)) and n[0] == steps, (mode, limit)


def test_while_loop_counted_stops_at_max_iters_like_while_loop():
    traced = ck.trace(lambda h: while_loop_counted(lambda i, h: i >= 0, lambda i, h: flow.tanh(h), h, max_iters=3),
                      ck.spec(2), chunk=4, tile=4)
    for mode in ("compiled", "host"):
        with pytest.raises(IterationLimitError, match="max_iters=3"):
            ck.compile(traced, mode=mode, threads=4)(np.ones(2, np.float32))


def test_the_new_ops_reject_shapes_that_do_not_fit():
    def trace(fn, *shapes):
        return ck.trace(fn, *(ck.spec(*s) for s in shapes), chunk=4, tile=4)

    with pytest.raises(ShapeError, match=r"needs a table \(V, D\) and ids \(R,\)"):
        trace(lambda w, ids: embedding(w, ids), (5, 3), (2, 1))
    with pytest.raises(ShapeError, match="needs two tensors of one shape"):
        trace(lambda x, y: argmax_sum_rows(x, y), (2, 5), (2, 4))
    with pytest.raises(ShapeError, match="do not fit into"):
        trace(lambda x, y: max_rows_into(x, into=y.clone()), (2, 5), (3,))
    with pytest.raises(ck.TraceError, match="read-only"):
        trace(lambda x, y: max_rows_into(x, into=y), (2, 5), (2,))
    with pytest.raises(ShapeError, match=r"\(4, B, H\) twice, \(4, H\) twice"):
        trace(lambda g, b, c: gate_lstm_cell(g, g, b, b, c), (4, 2, 3), (4, 2), (2, 3))
    with pytest.raises(ck.TraceError, match="must be a device Scalar"):
        trace(lambda h: while_loop_counted(lambda i, h: h, lambda i, h: h, h), (2,))


# ---- the uTasks in uOperator kernels -------------------------------------------------------

grids = st.integers(1, 4)
blocks = st.integers(1, 16)


@settings(max_examples=6, deadline=None)
@given(rows=st.integers(1, 4), width=st.integers(1, 40), ties=st.booleans(), nans=st.booleans(),
       max_block=st.sampled_from([1, 3, 1024]), dtype=float_dtypes, grid=grids, block=blocks,
       seed=st.integers(0, 2**16))
def test_argmax_of_a_sum_is_torch_argmax_first_max_and_nan_wins(rows, width, ties, nans, max_block, dtype, grid,
                                                                 block, seed):
    """Ties (values from a small set) keep the first index; a NaN beats every number, the first NaN wins."""
    torch = _torch()
    rng = np.random.default_rng(seed)
    x = (rng.integers(-2, 3, (rows, width)) if ties else rng.standard_normal((rows, width))).astype(dtype)
    y = (rng.integers(-1, 2, (rows, width)) if ties else rng.standard_normal((rows, width))).astype(dtype)
    if nans:
        x[rng.random((rows, width)) < 0.2] = np.nan
    out = cuda.to_device(np.full(rows + 1, -7.0, dtype))   # one element past the rows: must stay -7
    launcher(make_argmax_sum_row_kernel(dtype, max_block), grid, block)(
        0, argmax_sum_row_utask_count(rows, width) + 1, out, cuda.to_device(x.reshape(-1)),
        cuda.to_device(y.reshape(-1)), rows, width)
    got = out.copy_to_host()
    want = torch.argmax(torch.from_numpy(x + y), dim=1).numpy()
    assert np.array_equal(want, np.argmax(x + y, axis=1))   # the two references agree on the rule
    assert np.array_equal(got[:rows], want.astype(dtype)) and got[rows] == -7.0, (got, want)


@pytest.mark.parametrize("block", [1, 3, 8])
def test_argmax_ties_keep_the_first_index_whichever_thread_holds_it(block):
    """Rows whose maximum appears several times, spread over the block's threads and the tree."""
    width = 13
    x = np.zeros((5, width), np.float32)
    x[1, [9, 2, 5]] = 4.0                   # first at 2
    x[2, [12, 0]] = 1.0                     # first and last
    x[3, [3, 7]] = np.nan                   # NaN wins, the first NaN
    x[4] = -np.arange(width)[::-1]          # strictly increasing: the last
    y = np.zeros_like(x)
    y[4, 0] = 20.0                          # x + y: the sum decides, not x
    out = cuda.to_device(np.full(5, -7.0, np.float32))
    launcher(make_argmax_sum_row_kernel(np.float32), 2, block)(0, 5, out, cuda.to_device(x.reshape(-1)),
                                                               cuda.to_device(y.reshape(-1)), 5, width)
    assert out.copy_to_host().tolist() == [0, 2, 0, 3, 0]


@settings(max_examples=5, deadline=None)
@given(rows=st.integers(1, 4), dim=st.integers(1, 7), vocab=st.integers(1, 6), chunk=st.integers(1, 8),
       dtype=float_dtypes, grid=grids, block=blocks, seed=st.integers(0, 2**16))
def test_embedding_gathers_rows_by_device_ids_and_nan_for_a_bad_id(rows, dim, vocab, chunk, dtype, grid, block,
                                                                    seed):
    rng = np.random.default_rng(seed)
    weight = values((vocab, dim), dtype, seed=seed)
    ids = rng.integers(0, vocab, rows).astype(dtype)
    ids[rng.random(rows) < 0.3] = rng.choice([-1.0, vocab, np.nan])   # out of the table: a NaN row
    out = cuda.to_device(np.full(rows * dim + 1, -7.0, dtype))
    launcher(embedding_kernel, grid, block)(0, embedding_utask_count(rows, dim, chunk) + 1, out,
                                            cuda.to_device(weight.reshape(-1)), cuda.to_device(ids), rows, dim,
                                            vocab, chunk)
    got = out.copy_to_host()
    valid = (ids >= 0) & (ids < vocab)
    want = np.full((rows, dim), np.nan, dtype)
    want[valid] = weight[ids[valid].astype(np.int64)]
    assert_close(got[:-1].reshape(rows, dim), want, what=f"embedding of ids {ids}")
    assert got[-1] == -7.0


@settings(max_examples=5, deadline=None)
@given(batch=st.integers(1, 3), hidden=st.integers(1, 7), chunk=st.integers(1, 8), in_place=st.booleans(),
       dtype=float_dtypes, grid=grids, block=blocks, seed=st.integers(0, 2**16))
def test_gate_lstm_cell_equals_numpy(batch, hidden, chunk, in_place, dtype, grid, block, seed):
    n = batch * hidden
    ih, hh = values((4, n), dtype, low=-3, high=3, seed=seed), values((4, n), dtype, low=-3, high=3, seed=seed + 1)
    b_ih, b_hh = values((4, hidden), dtype, low=-1, high=1, seed=seed + 2), values((4, hidden), dtype, seed=seed + 3)
    c = values(n, dtype, low=-1, high=1, seed=seed + 4)
    c_dev = cuda.to_device(c)
    c_out = c_dev if in_place else cuda.to_device(np.full(n, np.nan, dtype))
    h_out = cuda.to_device(np.full(n, np.nan, dtype))
    launcher(gate_lstm_cell_kernel, grid, block)(0, gate_lstm_cell_utask_count(batch, hidden, chunk) + 1, h_out,
                                                 c_out, *(cuda.to_device(a.reshape(-1)) for a in (ih, hh, b_ih, b_hh)),
                                                 c_dev, batch, hidden, chunk)
    z = (ih.astype(np.float64).reshape(4, batch, hidden) + b_ih[:, None]) + (hh.reshape(4, batch, hidden)
                                                                             + b_hh[:, None])
    sig = lambda s: 1 / (1 + np.exp(-s))  # noqa: E731
    c_new = sig(z[1]) * c.reshape(batch, hidden) + sig(z[0]) * np.tanh(z[2])
    h_new = sig(z[3]) * np.tanh(c_new)
    assert_close(c_out.copy_to_host(), c_new.reshape(-1).astype(dtype), what="c")
    assert_close(h_out.copy_to_host(), h_new.reshape(-1).astype(dtype), what="h")


def test_utask_counts():
    assert argmax_sum_row_utask_count(3, 11) == 3 and argmax_sum_row_utask_count(0, 0) == 0
    assert embedding_utask_count(2, 5, 4) == 3 and gate_lstm_cell_utask_count(2, 5, 4) == 3
    with pytest.raises(ShapeError, match="width must be an int >= 1"):
        argmax_sum_row_utask_count(2, 0)
    with pytest.raises(DTypeError, match="float32 or float64"):
        make_argmax_sum_row_kernel("int32")
