"""Seq2seq greedy decoding (the Cocktailer artifact's ``AttnDecoderRNN``) as ONE Cocktailer program.

The Seq2seq benchmark of the Cocktailer paper (seed 001, issue 17; LSTM 256, a
vocabulary of 3797, at most 50 steps) is the paper's *while loop*: a decoder that
feeds its own output back and stops at the first step whose tokens are all the end
token (or after ``max_length`` steps).  How many steps run is known only on the
device, after each step's argmax; a host framework reads it back every step (a
sync), Cocktailer tests it inside the persistent kernel (launches: 1, host syncs: 0)::

    tok = SOS (1) for every row; out = zeros(max_length, B)
    x = embedding(tok); top = max(tok)                      # (B, H); a device scalar
    i = 0                                                   # the artifact's id
    while top > EOS (0) and i < max_length:                 # tested on the device
        hh = h @ weight_hh_l0_t;  ih = x @ weight_ih_l0_t   # (4, B, H) each: batched matmuls
        h, c = lstm_cell(ih, hh, biases, c)                 # the artifact's cell, gate-major
        tok = argmax(out(h) + std[i])                       # per row: Linear(H, V), then argmax
        out[i] = tok
        top = max(tok)                                      # the next test's reduction
        x = embedding(tok)                                  # the next step's input
        i += 1
    return out (int64), h

``std`` (max_length, B, V) is added to the logits before the argmax; the artifact's
benchmark puts 1e6 at the tokens of a reference sentence (teacher forcing through
the noise term), so it decides the trip count.  ``encoder_output`` gives only the
batch size, as in the artifact (whose attention is not used in its forward).

The loop is ``while_loop_counted`` (``cocktailer/model_ops.py``): a while loop whose
condition and body get the iteration count ``i``, the artifact's ``id``, as a device
int that indexes ``std[i]`` and names the row ``out[i]``.  Like the artifact's body,
which ends with ``cond = (max(output) > EOS) & (id < max_length)``, each step ends by
reducing its tokens to ``top`` (``max_rows_into``: ``reduce.py``'s row-max uTask
writing the loop's state in place); the test then reads ``top`` from device memory,
in every block, after a grid barrier.  Tokens live on the device as floats
(Cocktailer's tensors are float; ids are exact below 2**24 in float32); ``__call__``
returns ``out`` as int64.

Per step 8 uOperators: the two gate matmuls (``4 * ceil(B / tile) * ceil(H / tile)``
uTasks each), the fused cell (``kernels/utask/seq2seq.py``, ``ceil(B * H / chunk)``),
``linear`` (``ceil(B / tile) * ceil(V / tile)``), the argmax of ``logits + std[i]``
(``kernels/utask/argmax.py``, one uTask per row), the copy of the tokens into row
``i`` of ``out``, the row max (one uTask) and the embedding gather
(``kernels/utask/embedding.py``, ``ceil(B * H / chunk)``); then the loop's copies of
the new ``x``, ``h`` and ``c`` into its state.

Barriers (what ``BarrierPlan`` leaves; ``compiled.last_stats.barriers`` counts them):
5 grid barriers per step, against 12 with a barrier after every operator and the
test (the artifact's rule).

* before the cell: it reads whole gates, which other blocks' matmul tiles wrote;
* before ``linear``: it reads whole rows of the new ``h``, written in chunks;
* before the argmax: it reads whole logit rows, written in tiles;
* before ``out[i] = tok``: it reads the tokens other blocks' argmax uTasks wrote.
  The row max and the embedding read them too, and come after it, so this one
  barrier covers all three;
* before the test: every block reads the ``top`` that one block wrote.

None before the next step's matmuls: ``h`` and ``x`` were written before the test's
barrier (``x = embedding(tok)`` at the top of the step, where the artifact writes
it, would cost one more, before ``ih``; so would a max computed in the loop's head,
or copied into the state).  None before the copies into the state: they are
elementwise with the cell's and the gather's own chunking.  One before the loop
(the first ``top`` is copied into the state) and the last, failing, test's:
``5 * steps + 2``.

The program is traced and compiled once per ``(batch, mode)``; the weights are inputs.

    >>> import numpy as np
    >>> from pyflow.models import Seq2seq
    >>> model = Seq2seq(4, 5, max_length=3, threads=4, chunk=4, tile=4)
    >>> std = np.zeros((3, 1, 5), np.float32); std[:, 0, 2] = 1e6     # token 2 at every step
    >>> out, h = model(np.zeros((3, 1, 4), np.float32), std, np.zeros((1, 4)), np.zeros((1, 4)))
    >>> out[:, 0].tolist(), out.dtype, h.shape
    ([2, 2, 2], dtype('int64'), (1, 4))
"""

from __future__ import annotations

import functools
import math

import numpy as np

import pyflow as flow
import pyflow.cocktailer as ck
import pyflow.nn.functional as F
from pyflow.cocktailer.checks import static_int
from pyflow.cocktailer.model_ops import argmax_sum_rows, embedding, gate_lstm_cell, max_rows_into, while_loop_counted
from pyflow.errors import DTypeError, ShapeError
from pyflow.framework.tensor import Tensor, tensor
from pyflow.kernels.utask.seq2seq import GATES
from pyflow.models.lstm import DEFAULT_CHUNK, DEFAULT_TILE, check_options
from pyflow.models.nasrnn import check_mode, xavier_uniform
from pyflow.models.device_weights import DeviceWeights, freeze
from pyflow.models.state_dict import as_input, check_state_dict

__all__ = ["Seq2seq", "SOS", "EOS", "steps_run"]

SOS = 1   # the artifact's start-of-sentence token: every row's first input
EOS = 0   # its end token: the loop stops once every row's last token is EOS
_EXACT_IDS = {np.dtype("float32"): 2 ** 24, np.dtype("float64"): 2 ** 53}   # ids a float holds exactly


class Seq2seq:
    """The artifact's ``AttnDecoderRNN(hidden_size, output_size, max_length=max_length)`` on Cocktailer.

    ``model(encoder_output, std, h, c, mode=None)`` with ``encoder_output`` (S, B, H)
    (only its batch size B is used, as in the artifact), ``std`` (max_length, B, V)
    added to each step's logits, and the LSTM state ``h`` (B, H) (or (1, B, H)) and
    ``c`` (B, H), returns ``(output_all, h)``: the tokens, int64 (max_length, B), zero
    after the last step, and the final ``h`` (B, H).  ``model.last_steps`` is how many
    steps the last call ran (read off its tokens, ``steps_run``).  When any input is a
    ``pyflow.Tensor``, both outputs are tensors on its device: the call is one VM
    instruction (``cocktailer/launch.py``) and the int64 cast an eager op after it.
    ``mode``: ``"compiled"``, ``"host"`` or ``"auto"`` (None: the constructor's).
    ``dtype``, ``chunk``, ``tile``, ``seed`` and the ``cocktailer.Options`` keywords as
    for ``NASRNN``.  Weights start as the
    artifact's: the gate weights xavier-uniform, the gate biases and the embedding
    standard normal, ``out`` as ``nn.Linear``.
    """

    def __init__(self, hidden_size: int, output_size: int, max_length: int = 50, *, mode: str = "compiled",
                 dtype="float32", chunk: int = DEFAULT_CHUNK, tile: int = DEFAULT_TILE, seed: int = 0, **options):
        self.hidden_size = static_int(hidden_size, "Seq2seq: hidden_size", low=1)
        self.output_size = static_int(output_size, "Seq2seq: output_size", low=SOS + 1)   # SOS must be a token
        self.max_length = static_int(max_length, "Seq2seq: max_length", low=1)   # the artifact always runs a step
        self.mode = check_mode("Seq2seq", mode)
        self.dtype = np.dtype(dtype)
        if self.dtype not in _EXACT_IDS:
            raise DTypeError(f"Seq2seq: dtype must be float32 or float64, got {self.dtype}")
        if self.output_size > _EXACT_IDS[self.dtype]:
            raise ShapeError(f"Seq2seq: output_size {self.output_size} has token ids a {self.dtype} cannot hold "
                             f"exactly (at most {_EXACT_IDS[self.dtype]}); use dtype='float64'")
        self.chunk, self.tile = chunk, tile
        self.options = check_options("Seq2seq", chunk, tile, options)
        self._compiled: dict = {}       # (batch, mode) -> Compiled
        self.last_compiled = None
        self.device_weights = DeviceWeights()   # the weights as tensors, per device (calls with tensors)
        self._last_tokens = None   # the last call's output_all, read by ``last_steps`` when asked
        self._last_steps = None
        self.load_state_dict(self._initial_parameters(np.random.default_rng(seed)))

    # ---- parameters (the artifact's names) -------------------------------------------
    def parameter_shapes(self) -> dict:
        """The artifact's state dict: ``gru.*`` (its LSTM cell), ``out.*`` (Linear(H, V)), ``embedding.weight``."""
        H, V = self.hidden_size, self.output_size
        shapes = {"gru.weight_ih_l0_t": (GATES, H, H), "gru.weight_hh_l0_t": (GATES, H, H)}
        for g in range(GATES):
            shapes[f"gru.bias_ih_{g}"] = (H,)
            shapes[f"gru.bias_hh_{g}"] = (H,)
        shapes.update({"out.weight": (V, H), "out.bias": (V,), "embedding.weight": (V, H)})
        return shapes

    def _initial_parameters(self, rng) -> dict:
        bound = 1.0 / math.sqrt(self.hidden_size)   # nn.Linear's default init
        params = {}
        for name, shape in self.parameter_shapes().items():
            if name.startswith("gru.weight"):
                params[name] = xavier_uniform(rng, shape)
            elif name.startswith("out."):
                params[name] = rng.uniform(-bound, bound, shape)
            else:   # gate biases (torch.randn) and the embedding (nn.Embedding's N(0, 1))
                params[name] = rng.standard_normal(shape)
        return params

    def load_state_dict(self, state_dict) -> None:
        """Take the artifact model's parameters (numpy arrays or torch tensors); raises ``StateDictError``."""
        p = check_state_dict("Seq2seq", state_dict, self.parameter_shapes(), self.dtype)
        self.weight_ih, self.weight_hh = p["gru.weight_ih_l0_t"], p["gru.weight_hh_l0_t"]
        # the four gate biases stacked (4, H): one program input each for ih and hh
        self.bias_ih = np.stack([p[f"gru.bias_ih_{g}"] for g in range(GATES)])
        self.bias_hh = np.stack([p[f"gru.bias_hh_{g}"] for g in range(GATES)])
        self.out_weight, self.out_bias = p["out.weight"], p["out.bias"]
        self.embedding_weight = p["embedding.weight"]
        freeze(*self._weights())   # read-only (device_weights)

    def state_dict(self) -> dict:
        d = {"gru.weight_ih_l0_t": self.weight_ih.copy(), "gru.weight_hh_l0_t": self.weight_hh.copy()}
        for g in range(GATES):
            d[f"gru.bias_ih_{g}"] = self.bias_ih[g].copy()
            d[f"gru.bias_hh_{g}"] = self.bias_hh[g].copy()
        d.update({"out.weight": self.out_weight.copy(), "out.bias": self.out_bias.copy(),
                  "embedding.weight": self.embedding_weight.copy()})
        return d

    def _weights(self) -> tuple:
        return (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh, self.out_weight, self.out_bias,
                self.embedding_weight)

    # ---- the program -----------------------------------------------------------------
    def program(self, batch: int) -> ck.Program:
        """Trace the decoding loop for a batch of ``batch`` rows (see the module doc)."""
        H, V, L, dtype = self.hidden_size, self.output_size, self.max_length, self.dtype

        def seq2seq(start, std, h0, c0, w_ih, w_hh, b_ih, b_hh, out_w, out_b, emb):
            def more(i, x, h, c, out, top):                # the artifact's cond, tested before every step
                return (top.item() > EOS) & (i < L)

            def step(i, x, h, c, out, top):
                hh = h @ w_hh                                            # (4, B, H)
                ih = x @ w_ih                                            # (4, B, H): x broadcast over the gates
                h, c = gate_lstm_cell(ih, hh, b_ih, b_hh, c)
                tok = argmax_sum_rows(F.linear(h, out_w, out_b), std[i])   # (B,): argmax(out(h) + std[id])
                out = ck.update(out, i, tok)                             # output_all[id] = tok
                top = max_rows_into(tok.reshape(1, batch), into=top)     # max(tok), for the next test
                return embedding(emb, tok), h, c, out, top               # x: the next step's input

            x0, top0 = embedding(emb, start), start.reshape(1, batch).amax(-1)   # flow ops: cocktailer/lowerings.py
            _, h, _, out, _ = while_loop_counted(more, step, x0, h0, c0, flow.zeros(L, batch, dtype=dtype), top0,
                                                 max_iters=L)
            return out, h

        specs = [ck.spec(batch, dtype=dtype), ck.spec(L, batch, V, dtype=dtype), ck.spec(batch, H, dtype=dtype),
                 ck.spec(batch, H, dtype=dtype)] + [ck.spec(w.shape, dtype=dtype) for w in self._weights()]
        return ck.trace(seq2seq, *specs, chunk=self.chunk, tile=self.tile, name=f"seq2seq_b{batch}")

    def compiled_for(self, batch: int, mode: str | None = None) -> ck.Compiled:
        """The cached ``Compiled`` program for ``(batch, mode)`` (traced and compiled on first use)."""
        mode = check_mode("Seq2seq", self.mode if mode is None else mode)
        key = (int(batch), mode)
        if key not in self._compiled:
            self._compiled[key] = ck.compile(self.program(batch), mode=mode, **self.options)
        return self._compiled[key]

    # ---- calling ---------------------------------------------------------------------
    def program_inputs(self, encoder_output, std, h, c) -> tuple:
        """``(start, std, h, c, *weights)``, checked and converted: what the ``Compiled`` program takes.

        ``start`` is every row's first token, SOS (an input: a program has no fill but zeros).
        """
        H, V, L = self.hidden_size, self.output_size, self.max_length
        shape = tuple(np.shape(encoder_output))
        if len(shape) != 3 or shape[1] < 1 or shape[2] != H:
            raise ShapeError(f"Seq2seq: encoder_output must be (length, batch, {H}) with batch >= 1, got {shape}")
        B = shape[1]
        std, h, c = (as_input(a, self.dtype) for a in (std, h, c))   # pyflow.Tensors stay tensors
        if isinstance(encoder_output, Tensor) and not any(isinstance(a, Tensor) for a in (std, h, c)):
            std = tensor(std, device=encoder_output.device)   # tensors in, tensors out: on encoder_output's device
        if h.shape == (1, B, H):    # the artifact's (1, bs, hidden), reshaped as its forward does
            h = h.reshape(B, H)
        if std.shape != (L, B, V):
            raise ShapeError(f"Seq2seq: std must be (max_length, batch, output_size) = {(L, B, V)}, got {std.shape}")
        if h.shape != (B, H) or c.shape != (B, H):
            raise ShapeError(f"Seq2seq: h and c must be (batch, hidden_size) = {(B, H)} (h may be (1, {B}, {H})), "
                             f"got {h.shape} and {c.shape}")
        return (_start_tokens(B, self.dtype), std, h, c, *self._weights())

    def __call__(self, encoder_output, std, h, c, mode: str | None = None):
        args = self.program_inputs(encoder_output, std, h, c)
        # with tensors the weights (and the constant start tokens) stay uploaded between calls
        args = self.device_weights.bind(args, [0, *range(4, len(args))])
        compiled = self.compiled_for(args[0].shape[0], mode)
        out, h_n = compiled(*args)
        self.last_compiled = compiled
        if isinstance(out, np.ndarray):
            tokens = out.astype(np.int64)
            self._last_tokens, self._last_steps = None, steps_run(tokens)
        else:   # a pyflow.Tensor: an eager cast, in stream order; last_steps reads it only when asked
            tokens = out.to(dtype=np.dtype(np.int64))
            self._last_tokens, self._last_steps = tokens, None
        return tokens, h_n

    @property
    def last_steps(self):
        """How many steps the last call ran (``steps_run`` of its tokens); None before a call.  After a call on
        tensors, the first read waits for the tokens."""
        if self._last_tokens is not None:
            self._last_tokens, self._last_steps = None, steps_run(self._last_tokens.numpy())
        return self._last_steps

    def __repr__(self):
        return (f"Seq2seq({self.hidden_size}, {self.output_size}, max_length={self.max_length}, mode={self.mode!r}, "
                f"dtype={self.dtype}, chunk={self.chunk}, tile={self.tile}, options={self.options})")


@functools.lru_cache(maxsize=16)
def _start_tokens(batch: int, dtype) -> np.ndarray:
    """Every row's first token, SOS: one read-only array per (batch, dtype), so a tensor call reuses its upload."""
    return freeze(np.full(batch, SOS, dtype))


def steps_run(output_all: np.ndarray) -> int:
    """How many steps wrote ``output_all`` (max_length, B): through the first all-EOS row, else all of them.

    The loop goes on while some row's last token is not EOS, so the rows before the
    last step each hold a token other than EOS, and the last written row is all EOS
    unless the loop ran out of steps.

    >>> steps_run(np.array([[4, 0], [0, 0], [0, 0]])), steps_run(np.array([[4], [5]]))
    (2, 2)
    """
    ended = np.flatnonzero(~(output_all != EOS).any(axis=1))
    return int(ended[0]) + 1 if ended.size else len(output_all)
