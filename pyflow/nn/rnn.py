"""``LSTMCell`` (one time step) and ``LSTM`` (a sequence, several layers), with PyTorch's weights and gate order.

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

__all__ = ["LSTMCell", "LSTM"]


def _size(value, what: str, layer: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ArgumentValueError(f"{layer}: {what} must be a positive int, got {value!r}")
    return value


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


class LSTM(_LSTMBase):
    """A multi-layer LSTM over a sequence: ``output, (h_n, c_n) = lstm(input, (h_0, c_0))``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.input_size = _size(input_size, "input_size", "LSTM")
        self.hidden_size = _size(hidden_size, "hidden_size", "LSTM")
        self.num_layers = _size(num_layers, "num_layers", "LSTM")
        if proj_size:
            raise ArgumentValueError(f"LSTM: proj_size={proj_size} is not supported; use proj_size=0")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1:
            raise ArgumentValueError(f"LSTM: dropout is a probability and must be in [0, 1], got {dropout!r}")
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.proj_size = bidirectional, 0
        where = {"device": device, "dtype": dtype}
        for layer in range(num_layers):
            for suffix in self._suffixes(layer):
                width = input_size if layer == 0 else hidden_size * self._directions
                self._make(f"weight_ih{suffix}", 4 * hidden_size, width, **where)
                self._make(f"weight_hh{suffix}", 4 * hidden_size, hidden_size, **where)
                if bias:
                    self._make(f"bias_ih{suffix}", 4 * hidden_size, **where)
                    self._make(f"bias_hh{suffix}", 4 * hidden_size, **where)
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
        """(h_0, c_0), each (layers * directions, N, H): given, checked, or zeros."""
        shape = (self.num_layers * self._directions, x.shape[1], self.hidden_size)
        if hx is None:
            state = zeros(*shape, dtype=x.dtype, device=x.device)
            return state, state
        for name, t in zip(("h_0", "c_0"), hx):
            if tuple(t.shape) != shape:
                raise ShapeError(f"LSTM: {name} must have shape {list(shape)} (layers * directions, batch, "
                                 f"hidden_size), got {describe(t)}")
        return hx

    def _run_direction(self, layer_input: Tensor, suffix: str, h: Tensor, c: Tensor, reverse: bool) -> tuple:
        """One layer in one direction over the whole sequence: (outputs per step, final h, final c)."""
        weight_ih, weight_hh, bias_ih, bias_hh = self._weights(suffix)
        x_part = F.linear(layer_input, weight_ih, bias_ih)   # every step's input share at once: (L, N, 4H)
        steps = range(layer_input.shape[0])
        outputs = [None] * len(steps)
        for t in reversed(steps) if reverse else steps:
            h, c = lstm_step(x_part[t], h, c, weight_hh, bias_hh)
            outputs[t] = h
        return outputs, h, c

    def forward(self, input: Tensor, hx: tuple | None = None) -> tuple:  # noqa: A002
        if input.ndim not in (2, 3) or input.shape[-1] != self.input_size:
            layout = "(N, L, input_size)" if self.batch_first else "(L, N, input_size)"
            raise ShapeError(f"LSTM: expected an input {layout} or (L, input_size) with input_size "
                             f"{self.input_size}, got {describe(input)}")
        unbatched = input.ndim == 2
        x = input.unsqueeze(1) if unbatched else input.transpose(0, 1) if self.batch_first else input
        if unbatched and hx is not None:
            hx = tuple(t.unsqueeze(1) for t in hx)
        h_0, c_0 = self._initial_state(x, hx)
        final_h, final_c = [], []
        for layer in range(self.num_layers):
            per_direction = []
            for d, suffix in enumerate(self._suffixes(layer)):
                k = layer * self._directions + d
                outputs, h, c = self._run_direction(x, suffix, h_0[k], c_0[k], reverse=d == 1)
                per_direction.append(outputs)
                final_h.append(h)
                final_c.append(c)
            steps = [cat(list(pair), dim=-1) for pair in zip(*per_direction)] if self.bidirectional else \
                per_direction[0]
            x = stack(steps, 0)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        h_n, c_n = stack(final_h, 0), stack(final_c, 0)
        if unbatched:
            return x.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        return (x.transpose(0, 1) if self.batch_first else x), (h_n, c_n)

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        for name, default in (("num_layers", 1), ("bias", True), ("batch_first", False), ("dropout", 0.0),
                              ("bidirectional", False)):
            if getattr(self, name) != default:
                text += f", {name}={getattr(self, name)}"
        return text
