"""Checking a state dict before ``Module.load_state_dict`` writes anything.

A state dict maps PyTorch's dotted names (``0.weight``, ``bn.running_mean``) to
values.  Every entry is checked against the module's own tensor of that name
first, so a bad dict leaves the module unchanged, and each kind of mistake has
its own error that names the key:

* keys the module lacks, or keys the dict lacks (``strict``): ``StateDictError``,
  a ``KeyError`` listing all of them;
* a different shape: ``ShapeError`` with both shapes;
* another device (or a local value for a global tensor): ``DeviceError`` with both;
* something that is not a tensor: ``ArgumentTypeError``.  A numpy array is host
  data and is taken as a tensor on the module tensor's device.

>>> import pyflow as flow
>>> own = {"w": flow.zeros(2)}
>>> pairs, result = check_state_dict("M", own, {"w": flow.ones(2), "x": flow.ones(1)}, strict=False)
>>> result
IncompatibleKeys(missing_keys=[], unexpected_keys=['x'])
>>> check_state_dict("M", own, {"w": flow.ones(3)}, strict=True)
Traceback (most recent call last):
    ...
pyflow.errors.ShapeError: load_state_dict: size mismatch for 'w': the state dict has shape [3], ...
"""

from __future__ import annotations

import collections

import numpy as np

from pyflow.errors import ArgumentTypeError, DeviceError, ShapeError, StateDictError
from pyflow.framework.tensor import Tensor, tensor

__all__ = ["StateDictError", "IncompatibleKeys", "check_state_dict"]


IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def check_state_dict(module: str, own: dict, state_dict, strict: bool) -> tuple:
    """``([(target, value), ...], IncompatibleKeys)`` for loading ``state_dict`` into the tensors ``own``
    (name -> the module's tensor); raises for anything that does not fit (see the module docstring)."""
    if not hasattr(state_dict, "items"):
        raise ArgumentTypeError(f"load_state_dict of {module}: expected a dict of tensors, got "
                                f"{type(state_dict).__name__}")
    missing = [key for key in own if key not in state_dict]
    unexpected = [key for key in state_dict if key not in own]
    if strict and (missing or unexpected):
        problems = ([f"missing keys {missing}"] if missing else []) + (
            [f"unexpected keys {unexpected}"] if unexpected else [])
        raise StateDictError(f"load_state_dict of {module}: " + "; ".join(problems)
                             + f" (the module's keys: {list(own)})")
    pairs = [(target, _checked_value(key, target, state_dict[key])) for key, target in own.items()
             if key in state_dict]
    return pairs, IncompatibleKeys(missing, unexpected)


def _checked_value(key: str, target: Tensor, value) -> Tensor:
    """``value`` (for the state-dict entry ``key``) checked against the module's tensor ``target``."""
    if isinstance(value, np.ndarray):
        value = _host_tensor(value, target)
    elif not isinstance(value, Tensor):
        raise ArgumentTypeError(f"load_state_dict: the value of {key!r} is a {type(value).__name__}, not a pyflow "
                                "tensor (convert a torch tensor with flow.tensor(v.numpy()))")
    if tuple(value.shape) != tuple(target.shape):
        raise ShapeError(f"load_state_dict: size mismatch for {key!r}: the state dict has shape "
                         f"{list(value.shape)}, the module's tensor has shape {list(target.shape)}")
    if value.is_local and target.is_local and value.device != target.device:
        return value.to(target.device)   # as PyTorch's copy_: the values move to the module's device
    if _where(value) != _where(target):
        raise DeviceError(f"load_state_dict: {key!r} is on {_where(value)} but the module's tensor is on "
                          f"{_where(target)}: move the values first ({{k: v.to(device)}}), or load before "
                          "calling module.to()")
    return value


def _where(t: Tensor) -> str:
    """A tensor's device, or a global tensor's placement, as text."""
    return f"placement {t.placement}" if t.is_global else str(t.device)


def _host_tensor(array: np.ndarray, target: Tensor) -> Tensor:
    """A state-dict value given as a numpy array: host data, made a tensor where ``target`` is."""
    if target.is_local:
        return tensor(array, device=target.device)
    return tensor(array, placement=target.placement, sbp=target.sbp)
