"""``LSTMCell`` (one time step), ``LSTM`` and ``GRU`` (a sequence, several layers), with PyTorch's weights and
gate order.

One step, for input ``x``, hidden state ``h`` and cell state ``c``::

    gates      = x @ W_ih.T + b_ih + h @ W_hh.T + b_hh      # (N, 4 * hidden): i, f, g, o
    i, f, o    = sigmoid(...)     g = tanh(...)             # input, forget, output gates; candidate
    c'         = f * c + i * g
    h'         = o * tanh(c')

The four gates are stacked in PyTorch's order **i, f, g, o** along dim 0 of the
weights, so a PyTorch state dict loads as it is.  ``LSTMCell`` holds ``weight_ih``
(4H, I), ``weight_hh`` (4H, H), ``bias_ih``, ``bias_hh`` (4H); ``LSTM`` holds the
same per layer ``k`` as ``weight_ih_l{k}``... (``..._reverse`` for the backward
direction of a bidirectional LSTM).  Every weight starts U(-1/sqrt(H), 1/sqrt(H)).

``LSTM`` takes (L, N, I) (``batch_first``: (N, L, I); unbatched: (L, I)) and returns
``output, (h_n, c_n)``: the last layer's h at every step, and each layer's final
h and c, shaped (num_layers * directions, N, H).  The loop over time is Python:
each step is a handful of ops, and autograd records them like any others.

``GRU`` is the same loop with PyTorch's GRU step (gates **r, z, n**, stacked in that
order: weights (3H, I) and (3H, H))::

    r  = sigmoid(x W_ir.T + b_ir + h W_hr.T + b_hr)        z = sigmoid(x W_iz.T + b_iz + h W_hz.T + b_hz)
    n  = tanh(x W_in.T + b_in + r * (h W_hn.T + b_hn))     h' = (1 - z) * n + z * h

and returns ``output, h_n``.

>>> import pyflow as flow
>>> lstm = LSTM(3, 4, num_layers=2, batch_first=True)
>>> lstm
LSTM(3, 4, num_layers=2, batch_first=True)
>>> [name for name, _ in lstm.named_parameters()][:4]
['weight_ih_l0', 'weight_hh_l0', 'bias_ih_l0', 'bias_hh_l0']
>>> output, (h_n, c_n) = lstm(flow.ones(2, 5, 3))
>>> output.shape, h_n.shape, c_n.shape
((2, 5, 4), (2, 2, 4), (2, 2, 4))
"""

from __future__ import annotations

import math

from pyflow.errors import ShapeError
from pyflow.framework.args import describe
from pyflow.framework.creation import empty, zeros
from pyflow.framework.movement import cat, stack
from pyflow.framework.tensor import Tensor
from pyflow.nn import functional as F
from pyflow.nn import init
from pyflow.nn.module import ArgumentValueError, Module
from pyflow.nn.parameter import Parameter

__all__ = ["LSTMCell", "LSTM", "GRU"]


def _size(value, what: str, layer: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ArgumentValueError(f"{layer}: {what} must be a positive int, got {value!r}")
    return value


def gru_step(x_part: Tensor, h: Tensor, weight_hh: Tensor, bias_hh: Tensor | None) -> Tensor:
    """One GRU step (PyTorch's equations, gates r, z, n); ``x_part`` is ``x @ W_ih.T + b_ih``, already made."""
    x_r, x_z, x_n = x_part.chunk(3, dim=-1)
    h_r, h_z, h_n = F.linear(h, weight_hh, bias_hh).chunk(3, dim=-1)
    r, z = F.sigmoid(x_r + h_r), F.sigmoid(x_z + h_z)
    n = F.tanh(x_n + r * h_n)
    return (1.0 - z) * n + z * h


def lstm_step(x_part: Tensor, h: Tensor, c: Tensor, weight_hh: Tensor, bias_hh: Tensor | None) -> tuple:
    """One LSTM step; ``x_part`` is the input's share of the gates, ``x @ W_ih.T + b_ih``, already made."""
    gates = x_part + F.linear(h, weight_hh, bias_hh)
    i, f, g, o = gates.chunk(4, dim=-1)
    c = F.sigmoid(f) * c + F.sigmoid(i) * F.tanh(g)
    return F.sigmoid(o) * F.tanh(c), c


class _LSTMBase(Module):
    def _make(self, name: str, *shape, device, dtype) -> None:
        self.register_parameter(name, Parameter(empty(*shape, device=device, dtype=dtype)))

    def reset_parameters(self) -> None:
        """PyTorch's default: every weight and bias uniform in +-1/sqrt(hidden_size)."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for param in self.parameters():
            init.uniform_(param, -bound, bound)


class LSTMCell(_LSTMBase):
    """One LSTM step: ``(h', c') = cell(x, (h, c))``; x (N, input_size) or (input_size,); h, c default to zeros."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.input_size = _size(input_size, "input_size", "LSTMCell")
        self.hidden_size = _size(hidden_size, "hidden_size", "LSTMCell")
        self.bias = bias
        where = {"device": device, "dtype": dtype}
        self._make("weight_ih", 4 * hidden_size, input_size, **where)
        self._make("weight_hh", 4 * hidden_size, hidden_size, **where)
        if bias:
            self._make("bias_ih", 4 * hidden_size, **where)
            self._make("bias_hh", 4 * hidden_size, **where)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def forward(self, input: Tensor, hx: tuple | None = None) -> tuple:  # noqa: A002
        if input.ndim not in (1, 2) or input.shape[-1] != self.input_size:
            raise ShapeError(f"LSTMCell: expected an input (N, {self.input_size}) or ({self.input_size},), "
                             f"got {describe(input)}")
        batch = () if input.ndim == 1 else (input.shape[0],)
        if hx is None:
            state = zeros(*batch, self.hidden_size, dtype=input.dtype, device=input.device)
            hx = (state, state)
        for name, t in zip(("h", "c"), hx):
            if tuple(t.shape) != (*batch, self.hidden_size):
                raise ShapeError(f"LSTMCell: {name} must have shape {[*batch, self.hidden_size]} for input "
                                 f"{describe(input)}, got {describe(t)}")
        x_part = F.linear(input, self.weight_ih, self.bias_ih)
        return lstm_step(x_part, hx[0], hx[1], self.weight_hh, self.bias_hh)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class _Recurrent(_LSTMBase):
    """The loop LSTM and GRU share: layers, directions, ``batch_first``, unbatched input, dropout between
    layers.  A subclass says how many gate blocks its weights stack (``GATES``), names its states
    (``STATES``: ``h_0``, and ``c_0`` for an LSTM) and makes one step (``_step``)."""

    GATES: int
    STATES: tuple

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype=None) -> None:
        super().__init__()
        name = type(self).__name__
        self.input_size = _size(input_size, "input_size", name)
        self.hidden_size = _size(hidden_size, "hidden_size", name)
        self.num_layers = _size(num_layers, "num_layers", name)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1:
            raise ArgumentValueError(f"{name}: dropout is a probability and must be in [0, 1], got {dropout!r}")
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional = bidirectional
        where = {"device": device, "dtype": dtype}
        gates = self.GATES * hidden_size
        for layer in range(num_layers):
            for suffix in self._suffixes(layer):
                width = input_size if layer == 0 else hidden_size * self._directions
                self._make(f"weight_ih{suffix}", gates, width, **where)
                self._make(f"weight_hh{suffix}", gates, hidden_size, **where)
                if bias:
                    self._make(f"bias_ih{suffix}", gates, **where)
                    self._make(f"bias_hh{suffix}", gates, **where)
        self.reset_parameters()

    @property
    def _directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _suffixes(self, layer: int) -> list:
        return [f"_l{layer}"] + ([f"_l{layer}_reverse"] if self.bidirectional else [])

    def _weights(self, suffix: str) -> tuple:
        get = self._parameters.get
        return get(f"weight_ih{suffix}"), get(f"weight_hh{suffix}"), get(f"bias_ih{suffix}"), get(f"bias_hh{suffix}")

    def _initial_state(self, x: Tensor, hx) -> tuple:
        """The initial states, each (layers * directions, N, H): given, checked, or zeros."""
        shape = (self.num_layers * self._directions, x.shape[1], self.hidden_size)
        if hx is None:
            return (zeros(*shape, dtype=x.dtype, device=x.device),) * len(self.STATES)
        for name, t in zip(self.STATES, hx):
            if tuple(t.shape) != shape:
                raise ShapeError(f"{type(self).__name__}: {name} must have shape {list(shape)} (layers * "
                                 f"directions, batch, hidden_size), got {describe(t)}")
        return hx

    def _run_direction(self, layer_input: Tensor, suffix: str, state: tuple, reverse: bool) -> tuple:
        """One layer in one direction over the whole sequence: (h at each step, final states)."""
        weight_ih, weight_hh, bias_ih, bias_hh = self._weights(suffix)
        x_part = F.linear(layer_input, weight_ih, bias_ih)   # every step's input share at once: (L, N, gates)
        steps = range(layer_input.shape[0])
        outputs = [None] * len(steps)
        for t in reversed(steps) if reverse else steps:
            state = self._step(x_part[t], state, weight_hh, bias_hh)
            outputs[t] = state[0]
        return outputs, state

    def _run(self, input: Tensor, hx: tuple | None) -> tuple:  # noqa: A002
        """(output, final states stacked: one (layers * directions, N, H) tensor per state)."""
        if input.ndim not in (2, 3) or input.shape[-1] != self.input_size:
            layout = "(N, L, input_size)" if self.batch_first else "(L, N, input_size)"
            raise ShapeError(f"{type(self).__name__}: expected an input {layout} or (L, input_size) with "
                             f"input_size {self.input_size}, got {describe(input)}")
        unbatched = input.ndim == 2
        x = input.unsqueeze(1) if unbatched else input.transpose(0, 1) if self.batch_first else input
        if unbatched and hx is not None:
            hx = tuple(t.unsqueeze(1) for t in hx)
        initial = self._initial_state(x, hx)
        finals = [[] for _ in self.STATES]
        for layer in range(self.num_layers):
            per_direction = []
            for d, suffix in enumerate(self._suffixes(layer)):
                k = layer * self._directions + d
                outputs, state = self._run_direction(x, suffix, tuple(t[k] for t in initial), reverse=d == 1)
                per_direction.append(outputs)
                for final, t in zip(finals, state):
                    final.append(t)
            steps = [cat(list(pair), dim=-1) for pair in zip(*per_direction)] if self.bidirectional else \
                per_direction[0]
            x = stack(steps, 0)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        states = tuple(stack(final, 0) for final in finals)
        if unbatched:
            return x.squeeze(1), tuple(t.squeeze(1) for t in states)
        return (x.transpose(0, 1) if self.batch_first else x), states

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        for name, default in (("num_layers", 1), ("bias", True), ("batch_first", False), ("dropout", 0.0),
                              ("bidirectional", False)):
            if getattr(self, name) != default:
                text += f", {name}={getattr(self, name)}"
        return text


class LSTM(_Recurrent):
    """A multi-layer LSTM over a sequence: ``output, (h_n, c_n) = lstm(input, (h_0, c_0))``."""

    GATES, STATES = 4, ("h_0", "c_0")

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype=None) -> None:
        if proj_size:
            raise ArgumentValueError(f"LSTM: proj_size={proj_size} is not supported; use proj_size=0")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device=device, dtype=dtype)
        self.proj_size = 0

    def _step(self, x_part: Tensor, state: tuple, weight_hh: Tensor, bias_hh: Tensor | None) -> tuple:
        return lstm_step(x_part, *state, weight_hh, bias_hh)

    def forward(self, input: Tensor, hx: tuple | None = None) -> tuple:  # noqa: A002
        output, (h_n, c_n) = self._run(input, hx)
        return output, (h_n, c_n)


class GRU(_Recurrent):
    """A multi-layer GRU over a sequence: ``output, h_n = gru(input, h_0)`` (``gru_step`` has the equations)."""

    GATES, STATES = 3, ("h_0",)

    def _step(self, x_part: Tensor, state: tuple, weight_hh: Tensor, bias_hh: Tensor | None) -> tuple:
        return (gru_step(x_part, state[0], weight_hh, bias_hh),)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple:  # noqa: A002
        output, (h_n,) = self._run(input, None if hx is None else (hx,))
        return output, h_n
