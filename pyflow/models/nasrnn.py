"""NASRNN (the Cocktailer artifact's ``NasRNN``) as ONE Cocktailer program (seed 001, issue 17).

The NASRNN benchmark of the Cocktailer paper (hidden 256, sequence 1000) is a
recurrent cell found by architecture search: per time step two matmuls over 8 gates
and a tail of elementwise ops.  A host framework launches a kernel per operator
every step; Cocktailer runs the whole loop in one persistent kernel (launches: 1,
host syncs: 0), which is where its NASRNN numbers come from (batch 64 on a V100:
25.38 ms against TorchScript's 108.87, SEMANTICS.md sec. 7)::

    c = m = zeros(B, H)
    for t in range(seq):                                  # ck.for_loop (a Loop uTask)
        hh = m @ weight_hh                                # (8, B, H)  matmul uOperator
        ih = x[t] @ weight_ih                             # (8, B, H)  matmul uOperator, x[t] shared by the gates
        c, m = nasrnn_cell(ih, hh, c)                     # (B, H)     fused cell uOperator
    return sum(c + m)                                     # a scalar (0-d array)

The cell (``kernels/utask/nasrnn.py``) is the artifact's, element by element::

    l = [sig(i0+h0), relu(i1+h1), sig(i2+h2), relu(i3+h3), tanh(i4+h4), sig(i5+h5), tanh(i6+h6), sig(i7+h7)]
    a = tanh(l0 * l1); b = tanh(l2 + l3); d = tanh(l4 * l5); e = sig(l6 + l7)
    c = tanh(a + c) * b;  m = tanh(c * tanh(d + e))

Per step that is 5 uOperators: the two gate matmuls (``8 * ceil(B / tile) *
ceil(H / tile)`` uTasks each, one output tile of one gate each), the cell
(``ceil(B * H / chunk)`` uTasks) and the loop's copies of the new ``c`` and ``m``
into its state (the same chunks).  The artifact's weights are (8, in, H) and
``x_t @ weight_ih`` broadcasts ``x_t`` over the gates; ``flow.matmul`` does the same (lowered to
``batched_matmul``'s uOperator, ``cocktailer/model_ops.py``), so the parameters keep the artifact's
names and shapes and go into the program as they are.

Barriers (what ``BarrierPlan`` leaves; ``compiled.last_stats.barriers`` counts them):
2 grid barriers per step, against 5 with a barrier after every operator (the artifact's rule).

* before the cell: it reads the 8 gates of its elements, which other blocks'
  matmul tiles wrote;
* before ``hh``, the first matmul of a step: it reads all of ``m``, written by
  other blocks' cell chunks, and overwrites the gates the previous step's cell
  read.  ``ih`` needs none of its own: it only reads what nobody writes in between
  and overwrites gates the same barrier protects.  ``hh`` is traced before ``ih``
  for that (the other order costs a second barrier per step, as in ``lstm.py``:
  on the first iteration ``ih`` needs none, so the plan puts the first one before
  ``hh``, and the next iteration then needs one before ``ih`` as well);
* none before the copies of the new ``c``/``m`` into the loop state: they are
  elementwise with the cell's own chunking, every element stays on its thread.

After the loop ``c + m`` is elementwise again (no barrier) and the sum needs one
(it reads every element), as does the copy of the sum into the output: ``2 * seq + 2``.

The artifact takes ``batch_size`` in its constructor; here the batch comes from
the input, and one program is traced and compiled per ``(seq, batch, mode)``.

    >>> import numpy as np
    >>> from pyflow.models import NASRNN
    >>> model = NASRNN(3, 2, threads=4, chunk=4, tile=4)
    >>> model(np.ones((2, 1, 3), np.float32)).shape
    ()
"""

from __future__ import annotations

import math

import numpy as np

import pyflow as flow
import pyflow.cocktailer as ck
from pyflow.cocktailer.api import MODES
from pyflow.cocktailer.checks import static_int
from pyflow.cocktailer.model_ops import nasrnn_cell
from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels.utask.nasrnn import GATES
from pyflow.models.lstm import DEFAULT_CHUNK, DEFAULT_TILE, check_options
from pyflow.models.device_weights import DeviceWeights, freeze
from pyflow.models.state_dict import as_input, check_state_dict

__all__ = ["NASRNN", "xavier_uniform", "check_mode"]


def xavier_uniform(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """``nn.init.xavier_uniform_`` on a tensor of ``shape``: PyTorch's fans (dim 1 in, dim 0 out, times the rest)."""
    receptive = math.prod(shape[2:])
    fan_in, fan_out = shape[1] * receptive, shape[0] * receptive
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, shape)


def check_mode(model: str, mode) -> str:
    """``mode`` if it is one of ``cocktailer.api.MODES``, else a ``ValueError`` naming them."""
    if mode not in MODES:
        raise ValueError(f"{model}: mode must be one of {MODES}, got {mode!r}")
    return mode


class NASRNN:
    """The artifact's ``NasRNN(batch_size, input_size, hidden_size)`` on Cocktailer.

    ``model(inputs, mode=None)`` with ``inputs`` (seq, batch, input_size) returns
    ``sum(c + m)`` after the last step, a 0-d array (a 0-d ``pyflow.Tensor`` on its
    device when ``inputs`` is a tensor: the call is then one VM instruction).  ``mode``: ``"compiled"`` (the
    whole loop is one persistent kernel), ``"host"`` (one launch per operator, the
    loop in Python) or ``"auto"`` (Cocktailer's scheduler decides); None takes the
    constructor's ``mode``.  ``dtype``: float32 or float64; ``chunk``/``tile``: the
    trace's uTask sizes; other keywords (``threads``, ``blocks``, ...) are
    ``cocktailer.Options``.  Weights start, like the artifact's, xavier-uniform, from ``seed``.
    """

    def __init__(self, input_size: int, hidden_size: int, *, mode: str = "compiled", dtype="float32",
                 chunk: int = DEFAULT_CHUNK, tile: int = DEFAULT_TILE, seed: int = 0, **options):
        self.input_size = static_int(input_size, "NASRNN: input_size", low=1)
        self.hidden_size = static_int(hidden_size, "NASRNN: hidden_size", low=1)
        self.mode = check_mode("NASRNN", mode)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype("float32"), np.dtype("float64")):
            raise DTypeError(f"NASRNN: dtype must be float32 or float64, got {self.dtype}")
        self.chunk, self.tile = chunk, tile
        self.options = check_options("NASRNN", chunk, tile, options)
        self._compiled: dict = {}       # (seq, batch, mode) -> Compiled
        self.last_compiled = None
        self.device_weights = DeviceWeights()   # the weights as tensors, per device (calls with tensors)
        rng = np.random.default_rng(seed)
        self.load_state_dict({name: xavier_uniform(rng, shape) for name, shape in self.parameter_shapes().items()})

    # ---- parameters (the artifact's names) -------------------------------------------
    def parameter_shapes(self) -> dict:
        """``weight_ih`` (8, input_size, H) and ``weight_hh`` (8, H, H)."""
        H = self.hidden_size
        return {"weight_ih": (GATES, self.input_size, H), "weight_hh": (GATES, H, H)}

    def load_state_dict(self, state_dict) -> None:
        """Take the artifact model's parameters (numpy arrays or torch tensors); raises ``StateDictError``."""
        p = check_state_dict("NASRNN", state_dict, self.parameter_shapes(), self.dtype)
        self.weight_ih, self.weight_hh = freeze(p["weight_ih"], p["weight_hh"])   # read-only (device_weights)

    def state_dict(self) -> dict:
        return {"weight_ih": self.weight_ih.copy(), "weight_hh": self.weight_hh.copy()}

    # ---- the program -----------------------------------------------------------------
    def program(self, seq: int, batch: int) -> ck.Program:
        """Trace NASRNN over ``seq`` steps of ``batch`` rows (the weights are program inputs)."""
        H, dtype = self.hidden_size, self.dtype

        def nasrnn(inputs, weight_ih, weight_hh):
            def step(t, c, m):
                hh = m @ weight_hh                            # (8, B, H); first: see "Barriers" above
                ih = inputs[t] @ weight_ih                    # (8, B, H): x_t broadcast over the gates
                return nasrnn_cell(ih, hh, c)                 # the new (c, m)

            c, m = ck.for_loop(seq, step, flow.zeros(batch, H, dtype=dtype), flow.zeros(batch, H, dtype=dtype))
            return (c + m).sum()                              # flow ops, lowered to uTasks (cocktailer/lowerings.py)

        return ck.trace(nasrnn, ck.spec(seq, batch, self.input_size, dtype=dtype),
                        *(ck.spec(shape, dtype=dtype) for shape in self.parameter_shapes().values()),
                        chunk=self.chunk, tile=self.tile, name=f"nasrnn_s{seq}_b{batch}")

    def compiled_for(self, seq: int, batch: int, mode: str | None = None) -> ck.Compiled:
        """The cached ``Compiled`` program for ``(seq, batch, mode)`` (traced and compiled on first use)."""
        mode = check_mode("NASRNN", self.mode if mode is None else mode)
        key = (int(seq), int(batch), mode)
        if key not in self._compiled:
            self._compiled[key] = ck.compile(self.program(seq, batch), mode=mode, **self.options)
        return self._compiled[key]

    # ---- calling ---------------------------------------------------------------------
    def program_inputs(self, inputs) -> tuple:
        """``(inputs, weight_ih, weight_hh)``, checked and converted: what the ``Compiled`` program takes."""
        x = as_input(inputs, self.dtype)   # a pyflow.Tensor stays one: the call returns a tensor
        if x.ndim != 3 or x.shape[2] != self.input_size or x.shape[0] < 1 or x.shape[1] < 1:
            raise ShapeError(f"NASRNN: inputs must be (seq, batch, {self.input_size}) with seq, batch >= 1, "
                             f"got {x.shape}")
        return x, self.weight_ih, self.weight_hh

    def __call__(self, inputs, mode: str | None = None) -> np.ndarray:
        args = self.device_weights.bind(self.program_inputs(inputs), (1, 2))   # with tensors: weights stay uploaded
        compiled = self.compiled_for(args[0].shape[0], args[0].shape[1], mode)
        out = compiled(*args)
        self.last_compiled = compiled
        return out

    def __repr__(self):
        return (f"NASRNN({self.input_size}, {self.hidden_size}, mode={self.mode!r}, dtype={self.dtype}, "
                f"chunk={self.chunk}, tile={self.tile}, options={self.options})")
