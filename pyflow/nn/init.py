"""``flow.nn.init``: fill a parameter in place with the values an initialisation scheme prescribes.

Every function writes into its tensor under ``flow.no_grad()`` (a parameter is a
leaf that requires grad, so a recorded in-place write would be an error) and
returns it.  Random values come from pyflow's generator (``flow.rand`` /
``flow.randn``, drawn on the host), so ``flow.manual_seed(s)`` makes them
repeatable.  The formulas are PyTorch's:

* ``fan_in`` = ``size(1) * receptive field``, ``fan_out`` = ``size(0) * receptive field``,
  where the receptive field is the product of the dims after the first two (a
  ``Linear`` weight ``(out, in)`` has fan_in ``in``; a ``Conv2d`` weight
  ``(out, in, kh, kw)`` has fan_in ``in * kh * kw``);
* ``xavier_uniform_``: U(-a, a), ``a = gain * sqrt(6 / (fan_in + fan_out))``;
* ``kaiming_uniform_``: U(-b, b), ``b = gain * sqrt(3 / fan)``, with
  ``gain = calculate_gain(nonlinearity, a)``.  ``Linear`` and ``Conv2d`` use it with
  ``a = sqrt(5)``, which makes ``b = 1 / sqrt(fan_in)``.

>>> import math
>>> import pyflow as flow
>>> w = kaiming_uniform_(flow.empty(4, 25), a=math.sqrt(5))
>>> bool(w.abs().max().item() <= 1 / math.sqrt(25))
True
>>> calculate_gain("relu") == math.sqrt(2), calculate_gain("tanh")
(True, 1.6666666666666667)
"""

from __future__ import annotations

import math

import numpy as np

from pyflow.errors import ArgumentTypeError, ShapeError
from pyflow.framework.args import describe
from pyflow.framework.creation import rand, randn
from pyflow.framework.tensor import Tensor
from pyflow.nn.module import ArgumentValueError, no_grad

__all__ = ["calculate_gain", "uniform_", "normal_", "constant_", "ones_", "zeros_", "xavier_uniform_",
           "xavier_normal_", "kaiming_uniform_", "kaiming_normal_"]

_LINEAR = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
           "sigmoid")


def calculate_gain(nonlinearity: str, param=None) -> float:
    """The factor that keeps activations' variance steady through ``nonlinearity`` (PyTorch's table):
    1 for linear layers and sigmoid, 5/3 for tanh, sqrt(2) for relu, sqrt(2 / (1 + slope^2)) for
    leaky_relu (``param``: the negative slope, 0.01 by default), 3/4 for selu."""
    if nonlinearity in _LINEAR:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = param
        else:
            raise ArgumentTypeError(f"calculate_gain: the negative slope {param!r} is not a number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ArgumentValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r} (supported: "
                             f"{', '.join(_LINEAR)}, tanh, relu, leaky_relu, selu)")


def _checked(tensor, op: str) -> Tensor:
    if not isinstance(tensor, Tensor):
        raise ArgumentTypeError(f"init.{op}: expects a tensor, got {type(tensor).__name__}")
    return tensor


def _fill_from(tensor: Tensor, values: Tensor) -> Tensor:
    """Write ``values`` (float64, on the cpu) into ``tensor`` in place, without recording it."""
    with no_grad():
        tensor.copy_(values)
    return tensor


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill with values drawn uniformly from [a, b)."""
    _checked(tensor, "uniform_")
    if not a <= b:
        raise ArgumentValueError(f"init.uniform_: the bounds must have a <= b, got a={a}, b={b}")
    return _fill_from(tensor, rand(tensor.shape, dtype=np.float64) * (b - a) + a)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill with values drawn from N(mean, std^2)."""
    _checked(tensor, "normal_")
    if std < 0:
        raise ArgumentValueError(f"init.normal_: std must be non-negative, got {std}")
    return _fill_from(tensor, randn(tensor.shape, dtype=np.float64) * std + mean)


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill with ``val``."""
    _checked(tensor, "constant_")
    with no_grad():
        tensor.fill_(val)
    return tensor


def ones_(tensor: Tensor) -> Tensor:
    """Fill with ones."""
    return constant_(tensor, 1)


def zeros_(tensor: Tensor) -> Tensor:
    """Fill with zeros."""
    return constant_(tensor, 0)


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple:
    """``(fan_in, fan_out)`` of a weight of at least 2 dims (see the module docstring)."""
    if tensor.ndim < 2:
        raise ShapeError(f"init: fan in and fan out need a tensor of at least 2 dims, got {describe(tensor)}")
    receptive_field = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive_field, tensor.shape[0] * receptive_field


def _fan(tensor: Tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ArgumentValueError(f"init: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def xavier_uniform_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot: U(-a, a) with ``a = gain * sqrt(6 / (fan_in + fan_out))``."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(_checked(tensor, "xavier_uniform_"))
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out)) if fan_in + fan_out else 0.0
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot: N(0, std^2) with ``std = gain * sqrt(2 / (fan_in + fan_out))``."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(_checked(tensor, "xavier_normal_"))
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)) if fan_in + fan_out else 0.0)


def _kaiming_std(tensor: Tensor, a, mode: str, nonlinearity: str, op: str) -> float:
    fan = _fan(_checked(tensor, op), mode)
    return calculate_gain(nonlinearity, a) / math.sqrt(fan) if fan else 0.0   # zero elements: nothing to fill


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu") -> Tensor:
    """He: U(-b, b) with ``b = sqrt(3) * gain / sqrt(fan)`` (``a``: leaky_relu's negative slope)."""
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_uniform_")
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
    """He: N(0, std^2) with ``std = gain / sqrt(fan)``."""
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_normal_"))
