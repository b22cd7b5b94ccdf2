"""Attention decoding with a KV cache (the Cocktailer artifact's ``Attention``) as ONE Cocktailer program.

The Attention benchmark of the Cocktailer paper (seed 001, issue 17; 12 heads of
64, a KV cache of 64 rows, the first 32 given, 32 generation steps) is a loop of
autoregressive decoding: each step projects the current token ``x`` per head,
appends its key and value to the cache at row ``gen_id``, attends over the cache
and projects the result, which is the next step's ``x``.  One persistent kernel
runs all the steps (launches: 1, host syncs: 0)::

    k, v = copies of the caller's k, v                      # the artifact's k = k + 0.0
    for i in range(S - start_len):                          # ck.for_loop; gen_id = start_len + i
        q = x @ weight_q                                    # (B, nh, 1, d)  matmul uOperator
        k[:, :, gen_id] = x @ weight_k                      # matmul uOperator writing cache rows
        v[:, :, gen_id] = x @ weight_v                      # matmul uOperator writing cache rows
        scores = k @ q^T                                    # (B, nh, S, 1)  matmul uOperator
        attn = softmax(scores^T * scale)                    # (B, nh, 1, S)  fused scaled softmax
        x = (attn @ v) @ weight_o                           # two matmul uOperators, the second into x
    return k, v, x

Per step 7 uOperators: ``x @ W`` for q, k, v and o is ``batched_matmul``'s uOperator (``flow.matmul``
for q; ``batched_matmul(..., into=)`` for the writes in place: k, v and o) with the
per-head weights (nh, d, d) broadcast over the batch (``B * nh * ceil(d / tile)``
uTasks, one output tile each); the k and v projections write straight into row
``gen_id`` of every cache matrix (an output stride of ``S * d``, the start a run-time
offset ``gen_id * d``, checked in the kernel against the cache's range), so there
is no separate copy; ``k @ q^T`` is ``B * nh * ceil(S / tile)`` uTasks; the scaled
softmax one uTask per (batch, head) row; ``attn @ v`` ``B * nh * ceil(d / tile)``.
The last matmul writes the loop state ``x`` in place (``into=x``), so no copy.

Barriers (what ``BarrierPlan`` leaves; ``compiled.last_stats.barriers`` counts them):
5 grid barriers per step, against 7 with a barrier after every operator (the
artifact's rule).  Every operator here but the first three reads whole rows
another block wrote just before, so it waits:

* before ``q``: it reads all of ``x``, which the previous step's last matmul wrote
  (and the k/v projections after it only read ``x`` and write cache rows nobody
  has touched since: no barrier of their own);
* before ``k @ q^T``: it reads the cache rows just written (a write at a run-time
  row touches, as far as the plan can prove, the whole cache);
* before the softmax, before ``attn @ v`` and before ``@ weight_o``: each reads a
  whole row or matrix of the one before.

One more after the loop, before the copies into the outputs: ``5 * steps + 1``.

The scale: the artifact multiplies by the literal ``0.125`` (1/sqrt(64) for its
64-wide heads), not by ``1/sqrt(d)``; ``scale=0.125`` is the default here whatever
``size_per_head`` is, so the model computes what the artifact computes at every
size.  Pass ``scale=1/math.sqrt(d)`` for the textbook scaling.  Like the artifact,
there is no mask: the softmax runs over all ``S`` cache rows, the not yet generated
(the caller's, usually zeros) included.

    >>> import numpy as np
    >>> from pyflow.models import Attention
    >>> model = Attention(2, 4, start_len=2, threads=4, chunk=4, tile=4)
    >>> k, v, x = model(np.ones((1, 2, 1, 4), np.float32), np.zeros((1, 2, 3, 4), np.float32),
    ...                 np.zeros((1, 2, 3, 4), np.float32))
    >>> k.shape, v.shape, x.shape
    ((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 1, 4))
"""

from __future__ import annotations

import math
import numbers

import numpy as np

import pyflow as flow
import pyflow.cocktailer as ck
from pyflow.cocktailer.checks import static_int
from pyflow.cocktailer.model_ops import batched_matmul
from pyflow.errors import DTypeError, ShapeError
from pyflow.models.lstm import DEFAULT_CHUNK, DEFAULT_TILE, check_options
from pyflow.models.nasrnn import check_mode, xavier_uniform
from pyflow.models.device_weights import DeviceWeights, freeze
from pyflow.models.state_dict import as_input, check_state_dict

__all__ = ["Attention", "ARTIFACT_SCALE"]

ARTIFACT_SCALE = 0.125   # the artifact's literal (= 1 / sqrt(64), its size_per_head)
WEIGHTS = ("weight_q", "weight_k", "weight_v", "weight_o")


class Attention:
    """The artifact's ``Attention(num_head, size_per_head)`` with ``START_LEN = start_len``, on Cocktailer.

    ``model(x, k, v, mode=None)`` with ``x`` (B, nh, 1, d) and the caches ``k``, ``v``
    (B, nh, S, d), ``S >= start_len``, runs ``S - start_len`` decoding steps and
    returns ``(k, v, x)``: the caches with rows ``start_len .. S - 1`` written, and
    the last step's output.  The caller's arrays are not changed.  ``x``, ``k``, ``v``
    may be ``pyflow.Tensor`` s: the outputs are then tensors on their device, and the
    call is one VM instruction (``cocktailer/launch.py``).  ``mode``:
    ``"compiled"``, ``"host"`` or ``"auto"`` (None: the constructor's).  ``scale``:
    the softmax's scale (default the artifact's 0.125, see the module doc).
    ``dtype``, ``chunk``, ``tile``, ``seed`` and the ``cocktailer.Options`` keywords
    as for ``NASRNN``.  Weights start xavier-uniform, like the artifact's.
    """

    def __init__(self, num_head: int, size_per_head: int, start_len: int, *, scale: float = ARTIFACT_SCALE,
                 mode: str = "compiled", dtype="float32", chunk: int = DEFAULT_CHUNK, tile: int = DEFAULT_TILE,
                 seed: int = 0, **options):
        self.num_head = static_int(num_head, "Attention: num_head", low=1)
        self.size_per_head = static_int(size_per_head, "Attention: size_per_head", low=1)
        self.start_len = static_int(start_len, "Attention: start_len", low=0)
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
            raise DTypeError(f"Attention: scale must be a finite number, got {scale!r}")
        self.scale = float(scale)
        self.mode = check_mode("Attention", mode)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype("float32"), np.dtype("float64")):
            raise DTypeError(f"Attention: dtype must be float32 or float64, got {self.dtype}")
        self.chunk, self.tile = chunk, tile
        self.options = check_options("Attention", chunk, tile, options)
        self._compiled: dict = {}       # (batch, seq_len, mode) -> Compiled
        self.last_compiled = None
        self.device_weights = DeviceWeights()   # the weights as tensors, per device (calls with tensors)
        rng = np.random.default_rng(seed)
        self.load_state_dict({name: xavier_uniform(rng, shape) for name, shape in self.parameter_shapes().items()})

    # ---- parameters (the artifact's names) -------------------------------------------
    def parameter_shapes(self) -> dict:
        """``weight_q``, ``weight_k``, ``weight_v``, ``weight_o``: each (num_head, d, d)."""
        shape = (self.num_head, self.size_per_head, self.size_per_head)
        return {name: shape for name in WEIGHTS}

    def load_state_dict(self, state_dict) -> None:
        """Take the artifact model's parameters (numpy arrays or torch tensors); raises ``StateDictError``."""
        p = check_state_dict("Attention", state_dict, self.parameter_shapes(), self.dtype)
        self.weights = tuple(freeze(p[name]) for name in WEIGHTS)   # read-only (device_weights)

    def state_dict(self) -> dict:
        return {name: w.copy() for name, w in zip(WEIGHTS, self.weights)}

    # ---- the program -----------------------------------------------------------------
    def program(self, batch: int, seq_len: int) -> ck.Program:
        """Trace the decoding loop for a batch of ``batch`` and caches of ``seq_len`` rows."""
        nh, d, start, scale, dtype = self.num_head, self.size_per_head, self.start_len, self.scale, self.dtype
        if seq_len < start:
            raise ShapeError(f"Attention: the caches have {seq_len} rows, fewer than start_len={start}")

        def attention(x, k, v, weight_q, weight_k, weight_v, weight_o):
            def step(i, x, k, v):
                gen_id = i + start                                       # a device Scalar
                q = x @ weight_q                                          # (B, nh, 1, d)
                k = batched_matmul(x, weight_k, into=k, at=gen_id)       # row gen_id of every k matrix
                v = batched_matmul(x, weight_v, into=v, at=gen_id)
                scores = k @ q.transpose(-1, -2)                         # (B, nh, S, 1)
                attn = flow.softmax(scores.reshape(batch, nh, 1, seq_len) * scale, -1)
                x = batched_matmul(attn @ v, weight_o, into=x)   # the next step's x, in place
                return x, k, v

            if seq_len == start:    # a full cache: no step (and no body to trace, the cache may be empty)
                return k, v, x      # (the outputs are copies of them, as every program output is)
            x, k, v = ck.for_loop(seq_len - start, step, x, k, v)
            return k, v, x

        token, cache, weight = (ck.spec(batch, nh, 1, d, dtype=dtype), ck.spec(batch, nh, seq_len, d, dtype=dtype),
                                ck.spec(nh, d, d, dtype=dtype))
        return ck.trace(attention, token, cache, cache, weight, weight, weight, weight, chunk=self.chunk,
                        tile=self.tile, name=f"attention_b{batch}_s{seq_len}")

    def compiled_for(self, batch: int, seq_len: int, mode: str | None = None) -> ck.Compiled:
        """The cached ``Compiled`` program for ``(batch, seq_len, mode)`` (traced and compiled on first use)."""
        mode = check_mode("Attention", self.mode if mode is None else mode)
        key = (int(batch), int(seq_len), mode)
        if key not in self._compiled:
            self._compiled[key] = ck.compile(self.program(batch, seq_len), mode=mode, **self.options)
        return self._compiled[key]

    # ---- calling ---------------------------------------------------------------------
    def program_inputs(self, x, k, v) -> tuple:
        """``(x, k, v, *weights)``, checked and converted: what the ``Compiled`` program takes."""
        nh, d = self.num_head, self.size_per_head
        x, k, v = (as_input(a, self.dtype) for a in (x, k, v))   # pyflow.Tensors stay tensors
        if x.ndim != 4 or x.shape[1:] != (nh, 1, d) or x.shape[0] < 1:
            raise ShapeError(f"Attention: x must be (batch, {nh}, 1, {d}) with batch >= 1, got {x.shape}")
        for name, cache in (("k", k), ("v", v)):
            if cache.shape[:2] != x.shape[:2] or cache.ndim != 4 or cache.shape[3] != d \
                    or cache.shape[2] < self.start_len:
                raise ShapeError(f"Attention: {name} must be ({x.shape[0]}, {nh}, S, {d}) with S >= "
                                 f"start_len={self.start_len}, got {cache.shape}")
        if k.shape != v.shape:
            raise ShapeError(f"Attention: k and v must have the same shape, got {k.shape} and {v.shape}")
        return (x, k, v, *self.weights)

    def __call__(self, x, k, v, mode: str | None = None):
        args = self.program_inputs(x, k, v)
        args = self.device_weights.bind(args, range(3, len(args)))   # with tensors: weights stay uploaded
        compiled = self.compiled_for(args[0].shape[0], args[1].shape[2], mode)
        out = compiled(*args)
        self.last_compiled = compiled
        return out

    def __repr__(self):
        return (f"Attention({self.num_head}, {self.size_per_head}, start_len={self.start_len}, scale={self.scale}, "
                f"mode={self.mode!r}, dtype={self.dtype}, chunk={self.chunk}, tile={self.tile}, "
                f"options={self.options})")
