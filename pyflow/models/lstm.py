"""``StackedLSTM``: a multi-layer LSTM (``nn.LSTM`` semantics) as ONE Cocktailer program (seed 001, issue 5).

The LSTM benchmark of the Cocktailer paper (10 layers, hidden 256, sequence 64) is
the textbook case of dynamic control flow in a model: a loop over time, and inside
it, per layer, two matmuls and a fused elementwise cell.  Written for a host
framework it is a kernel launch per operator, ``seq * (5 * layers + 1)`` here (the
host executor); written for Cocktailer it is one ``for_loop`` whose body the
compiled executor turns into the body of one persistent kernel (launches: 1, host
syncs: 0)::

    for t in range(seq):                                   # ck.for_loop (a Loop uTask)
        for k in range(num_layers):                        # unrolled while tracing
            gh = F.linear(h[k], W_hh[k], b_hh[k])         # (B, 4H)  matmul uOperator
            gx = F.linear(layer_in, W_ih[k], b_ih[k])     # (B, 4H)  matmul uOperator
            h_k, c_k = ck.lstm_cell(gx, gh, c[k])          # (B, H)   fused cell uOperator
            h = ck.update(h, k, h_k); c = ck.update(c, k, c_k)   # copy uOperators
            layer_in = h_k
        out = ck.update(out, t, layer_in)                  # output row t

Per time step that is ``5 * num_layers + 1`` uOperators.  Their uTasks: each
``linear`` has ``ceil(B / tile) * ceil(4H / tile)`` (one output tile each), the
cell and each copy ``ceil(B * H / chunk)`` (a chunk of cell elements each).

Barriers (what ``BarrierPlan`` in ``barriers.py`` leaves): ``2 * num_layers + 1``
grid barriers per step (plus one after the loop), against the artifact's one after
every operator (``5 * num_layers + 1``); ``compiled.last_stats.barriers`` counts them.

* before the cell of each layer: it reads whole gate rows that other blocks'
  matmul tiles wrote;
* before the first matmul of each layer: layer ``k > 0`` reads ``h_k`` of layer
  ``k - 1`` across blocks; layer 0's ``gh`` overwrites the gates the previous
  step's cell read.  ``gh`` is traced before ``gx`` so that this one barrier also
  covers ``gx`` (the other order costs a second barrier: on the first iteration
  ``gh`` reads the copied-in ``h0``);
* before the output row ``out[t]``: its position depends on ``t``, so the plan
  treats it as touching the whole arena;
* none before the copies of ``h_k``/``c_k`` into the state: they are elementwise
  with the cell's own chunking, so every element stays on the thread that wrote it.

Weights are program *inputs*, stacked per layer (``w_hh`` is (L, 4H, H), layer ``k``
its row view ``w_hh[k]``), so one trace (and one generated kernel) serves any
weights; a program is traced and compiled once per ``(seq, batch, mode)`` and
cached.  ``model.compiled_for(seq, batch, mode)`` returns the ``Compiled`` object:
its ``source`` is the generated kernel and ``last_stats`` the counts of the last call.

    >>> import numpy as np
    >>> from pyflow.models import StackedLSTM
    >>> model = StackedLSTM(3, 2, num_layers=1, threads=4, chunk=4, tile=4)
    >>> out, (h_n, c_n) = model(np.ones((2, 1, 3), np.float32))
    >>> out.shape, h_n.shape, c_n.shape
    ((2, 1, 2), (1, 1, 2), (1, 1, 2))
"""

from __future__ import annotations

import functools

import numpy as np

import pyflow as flow
import pyflow.cocktailer as ck
import pyflow.nn.functional as F
from pyflow.cocktailer.api import MODES
from pyflow.cocktailer.checks import is_int, static_int
from pyflow.errors import DTypeError, ShapeError
from pyflow.models.device_weights import DeviceWeights, freeze
from pyflow.models.state_dict import as_input, check_state_dict

__all__ = ["StackedLSTM", "DEFAULT_THREADS", "DEFAULT_CHUNK", "DEFAULT_TILE", "check_options"]

# Defaults chosen for the simulator, where every simulated thread costs real time
# (a kernel's cost grows with blocks * threads): small blocks of 8 threads, and uTasks
# big enough that a small model is a few dozen of them.  StackedLSTM(32, 32, 2) over 4 steps
# of batch 4: 0.9 s compiled with these, 2.9 s with threads 32, 5.4 s with 64.  On a
# GPU take threads=256, chunk=256, tile=16 (pass them to the constructor).
# ``blocks`` stays None: the co-resident limit, capped by the largest uTask count.
DEFAULT_THREADS = 8
DEFAULT_CHUNK = 32
DEFAULT_TILE = 8


def check_options(model: str, chunk, tile, options: dict) -> dict:
    """The trace sizes and ``cocktailer.Options`` checked at construction, not at the first call."""
    message = f"{model}: chunk must be an int >= 1 and tile an int in 1..32, got {chunk!r}, {tile!r}"
    if not is_int(chunk) or not is_int(tile):
        raise DTypeError(message)
    if chunk < 1 or not 1 <= tile <= 32:
        raise ShapeError(message)
    options = {"threads": DEFAULT_THREADS, **options}
    ck.Options(**options)  # raises DTypeError or LaunchConfigError (a ValueError) naming a bad field
    return options


@functools.lru_cache(maxsize=16)
def _zeros(shape: tuple, dtype) -> np.ndarray:
    """The zero state for a missing ``h0`` / ``c0``: one read-only array per shape, so tensor calls reuse its upload."""
    return freeze(np.zeros(shape, dtype))


class StackedLSTM:
    """``nn.LSTM(input_size, hidden_size, num_layers)`` (bias, seq-first, unidirectional) on Cocktailer.

    Its layers are stacked into one traced program (the paper's LSTM model); ``pyflow.nn.LSTM`` is
    the eager module, which runs the same equations op by op.

    ``model(x, h0=None, c0=None, mode="compiled")`` with ``x`` (seq, batch, input_size)
    (or (seq, input_size), unbatched) returns ``(output, (h_n, c_n))``: output
    (seq, batch, hidden_size), h_n and c_n (num_layers, batch, hidden_size).  ``mode``
    is ``"compiled"`` (the whole loop is one persistent kernel), ``"host"`` (one launch
    per operator, the loop in Python) or ``"auto"`` (Cocktailer's scheduler decides).

    ``x`` (and the states) may be ``pyflow.Tensor`` s: the outputs are then tensors on
    their device, and the call is one VM instruction (``cocktailer/launch.py``).  The
    weights are uploaded to that device at the first such call and stay there
    (``device_weights``): later calls copy nothing host-to-device until
    ``load_state_dict`` or an assignment (``model.w_hh = ...``) changes them.  The
    parameter arrays are read-only.

    ``dtype``: float32 or float64 (inputs are converted to it).  ``chunk`` and ``tile``:
    the uTask sizes of the trace; other keywords (``threads``, ``blocks``,
    ``host_blocks``, ``inline``) are ``cocktailer.Options``.  Weights start, like
    PyTorch's, uniform in ``(-1/sqrt(H), 1/sqrt(H))`` from ``seed``.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, *, dtype="float32",
                 chunk: int = DEFAULT_CHUNK, tile: int = DEFAULT_TILE, seed: int = 0, **options):
        self.input_size, self.hidden_size, self.num_layers = (
            static_int(value, f"StackedLSTM: {name}", low=1)
            for name, value in (("input_size", input_size), ("hidden_size", hidden_size), ("num_layers", num_layers)))
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype("float32"), np.dtype("float64")):
            raise DTypeError(f"StackedLSTM: dtype must be float32 or float64, got {self.dtype}")
        self.chunk, self.tile = chunk, tile
        self.options = check_options("StackedLSTM", chunk, tile, options)
        self._compiled: dict = {}       # (seq, batch, mode) -> Compiled
        self.last_compiled = None       # the Compiled of the last call (its last_stats, source)
        self.device_weights = DeviceWeights()   # the weights as tensors, per device (calls with tensors)
        rng = np.random.default_rng(seed)
        bound = 1.0 / np.sqrt(self.hidden_size)
        self.load_state_dict({name: rng.uniform(-bound, bound, shape)
                              for name, shape in self.parameter_shapes().items()})

    # ---- parameters (PyTorch's names) ----------------------------------------------
    def parameter_shapes(self) -> dict:
        """PyTorch's parameter names and shapes: ``weight_ih_l{k}`` (4H, I or H), ``weight_hh_l{k}`` ..."""
        H4, H = 4 * self.hidden_size, self.hidden_size
        shapes = {}
        for k in range(self.num_layers):
            shapes[f"weight_ih_l{k}"] = (H4, self.input_size if k == 0 else H)
            shapes[f"weight_hh_l{k}"] = (H4, H)
            shapes[f"bias_ih_l{k}"] = (H4,)
            shapes[f"bias_hh_l{k}"] = (H4,)
        return shapes

    def load_state_dict(self, state_dict) -> None:
        """Take ``nn.LSTM``'s parameters (numpy arrays, or torch tensors); every key and shape is checked.

        Raises ``StateDictError`` naming the missing keys, unexpected keys and wrong
        shapes; the model is unchanged then.
        """
        p = check_state_dict("StackedLSTM", state_dict, self.parameter_shapes(), self.dtype)
        L = self.num_layers
        # stacked per layer, so a layer's weight is a row view of one program input
        self.w_ih_first = p["weight_ih_l0"]
        self.w_ih_rest = np.stack([p[f"weight_ih_l{k}"] for k in range(1, L)]) if L > 1 else None
        self.w_hh = np.stack([p[f"weight_hh_l{k}"] for k in range(L)])
        self.b_ih = np.stack([p[f"bias_ih_l{k}"] for k in range(L)])
        self.b_hh = np.stack([p[f"bias_hh_l{k}"] for k in range(L)])
        freeze(*self._weights())   # read-only: a tensor call reuses their device copies until they are replaced

    def state_dict(self) -> dict:
        """The parameters under PyTorch's names (copies)."""
        d = {}
        for k in range(self.num_layers):
            d[f"weight_ih_l{k}"] = (self.w_ih_first if k == 0 else self.w_ih_rest[k - 1]).copy()
            d[f"weight_hh_l{k}"] = self.w_hh[k].copy()
            d[f"bias_ih_l{k}"] = self.b_ih[k].copy()
            d[f"bias_hh_l{k}"] = self.b_hh[k].copy()
        return d

    def _weights(self) -> tuple:
        rest = (self.w_ih_rest,) if self.num_layers > 1 else ()
        return (self.w_ih_first,) + rest + (self.w_hh, self.b_ih, self.b_hh)

    # ---- the program -----------------------------------------------------------------
    def program(self, seq: int, batch: int) -> ck.Program:
        """Trace the LSTM over ``seq`` steps of ``batch`` rows (weights are inputs, see the module doc)."""
        H, L, dtype = self.hidden_size, self.num_layers, self.dtype

        def lstm_program(x, h0, c0, w_ih_first, w_ih_rest, w_hh, b_ih, b_hh):
            def step(t, h, c, out):
                layer_in = x[t]                                    # (B, I): a row view, no copy
                for k in range(L):
                    w_ih = w_ih_first if k == 0 else w_ih_rest[k - 1]
                    gh = F.linear(h[k], w_hh[k], b_hh[k])     # gh first: see "Barriers" above
                    gx = F.linear(layer_in, w_ih, b_ih[k])
                    h_k, c_k = ck.lstm_cell(gx, gh, c[k])
                    h = ck.update(h, k, h_k)
                    c = ck.update(c, k, c_k)
                    layer_in = h_k
                return h, c, ck.update(out, t, layer_in)

            h, c, out = ck.for_loop(seq, step, h0, c0, flow.zeros(seq, batch, H, dtype=dtype))   # a flow op
            return out, h, c

        # the parameter names become the program's input names (trace reads the signature)
        if L == 1:
            def lstm(x, h0, c0, w_ih_first, w_hh, b_ih, b_hh):
                return lstm_program(x, h0, c0, w_ih_first, None, w_hh, b_ih, b_hh)
        else:
            def lstm(x, h0, c0, w_ih_first, w_ih_rest, w_hh, b_ih, b_hh):
                return lstm_program(x, h0, c0, w_ih_first, w_ih_rest, w_hh, b_ih, b_hh)

        specs = [ck.spec(seq, batch, self.input_size, dtype=dtype), ck.spec(L, batch, H, dtype=dtype),
                 ck.spec(L, batch, H, dtype=dtype)] + [ck.spec(w.shape, dtype=dtype) for w in self._weights()]
        return ck.trace(lstm, *specs, chunk=self.chunk, tile=self.tile, name=f"lstm_l{L}_s{seq}_b{batch}")

    def compiled_for(self, seq: int, batch: int, mode: str = "compiled") -> ck.Compiled:
        """The cached ``Compiled`` program for ``(seq, batch, mode)`` (traced and compiled on first use)."""
        if mode not in MODES:
            raise ValueError(f"StackedLSTM: mode must be one of {MODES}, got {mode!r}")
        key = (int(seq), int(batch), mode)
        if key not in self._compiled:
            self._compiled[key] = ck.compile(self.program(seq, batch), mode=mode, **self.options)
        return self._compiled[key]

    # ---- calling ---------------------------------------------------------------------
    def program_inputs(self, x, h0=None, c0=None) -> tuple:
        """The program's input arrays ``(x, h0, c0, *weights)`` for batched ``x``, checked and converted.

        ``model(x)`` is ``model.compiled_for(seq, batch, mode)(*model.program_inputs(x))``;
        a benchmark can move these to the device once and call the ``Compiled`` itself.
        """
        x = as_input(x, self.dtype)
        if x.ndim != 3 or x.shape[2] != self.input_size or x.shape[0] < 1 or x.shape[1] < 1:
            raise ShapeError(f"StackedLSTM: input must be (seq, batch, {self.input_size}) or (seq, {self.input_size}) "
                             f"with seq, batch >= 1, got {x.shape}")
        state_shape = (self.num_layers, x.shape[1], self.hidden_size)
        states = []
        for name, state in (("h0", h0), ("c0", c0)):
            state = _zeros(state_shape, self.dtype) if state is None else as_input(state, self.dtype)
            if state.shape != state_shape:
                raise ShapeError(f"StackedLSTM: {name} must be (num_layers, batch, hidden_size) = {state_shape}, "
                                 f"got {state.shape}")
            states.append(state)
        return (x, *states, *self._weights())

    def __call__(self, x, h0=None, c0=None, mode: str = "compiled"):
        x = as_input(x, self.dtype)   # pyflow.Tensors stay tensors: tensors in, tensors out
        unbatched = x.ndim == 2  # nn.LSTM's unbatched form: (seq, input), states (layers, hidden)
        if unbatched:
            x = x[:, None, :]
            h0, c0 = (s if s is None or np.ndim(s) != 2 else as_input(s, self.dtype)[:, None, :] for s in (h0, c0))
        inputs = self.program_inputs(x, h0, c0)
        # with tensors the weights (and the zero states used for a missing h0 / c0) stay uploaded between calls
        constants = [k for k, s in ((1, h0), (2, c0)) if s is None] + list(range(3, len(inputs)))
        inputs = self.device_weights.bind(inputs, constants)
        compiled = self.compiled_for(x.shape[0], x.shape[1], mode)
        out, h_n, c_n = compiled(*inputs)
        self.last_compiled = compiled
        if unbatched:
            out, h_n, c_n = out[:, 0], h_n[:, 0], c_n[:, 0]
        return out, (h_n, c_n)

    def __repr__(self):
        return (f"StackedLSTM({self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
                f"dtype={self.dtype}, chunk={self.chunk}, tile={self.tile}, options={self.options})")
