"""Checking the arguments of the eager API at the call: sizes, dims, devices.

Every user function validates its Python arguments here *before* anything is
issued, so a bad call raises at once, names the op (and the tensor, as
``describe`` writes it) and leaves no instruction behind:

* sizes are non-negative ints (``ShapeError`` for a negative one,
  ``ArgumentTypeError`` for ``2.5``, ``"3"`` or ``True``);
* dims are ints in range (``ArgumentTypeError`` for ``1.0`` or ``"x"``,
  ``AxisError`` when out of range);
* devices exist (``DeviceError`` for ``"cuda:7"`` on a machine with two);
* tensor arguments are tensors (``ArgumentTypeError`` for a list or a number).

>>> sizes((2, 3), "zeros"), sizes(((2, 3),), "zeros"), sizes(((),), "ones")
((2, 3), (2, 3), ())
>>> sizes((2.5,), "zeros")
Traceback (most recent call last):
...
pyflow.errors.ArgumentTypeError: zeros: sizes must be ints, got 2.5 (float) in (2.5,)
"""

from __future__ import annotations

import operator

import numpy as np

from pyflow.device import Device, ep
from pyflow.errors import ArgumentTypeError, AxisError, DeviceError, ShapeError

__all__ = ["describe", "as_int", "sizes", "broadcasts_to", "dim", "dims", "device", "tensor", "tensor_list"]


def describe(t) -> str:
    """A tensor as error messages name it: ``float32[2, 3] on cuda:0`` (global: its placement and SBP)."""
    info = getattr(t, "_global", None)
    if info is not None:
        return f"{t.dtype}{list(t.shape)} on {info.placement} sbp={info.sbp}"
    return f"{t.dtype}{list(t.shape)} on {t.device}"


def as_int(value, op: str, what: str) -> int:
    """``value`` as a Python int (ints, numpy ints, one-element integer tensors); never a bool or a float."""
    if isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{op}: {what} must be an int, got {value!r} (bool)")
    try:
        return operator.index(value)
    except TypeError:
        raise ArgumentTypeError(f"{op}: {what} must be an int, got {value!r} ({type(value).__name__})") from None


def sizes(args, op: str, allow_minus_one: bool = False) -> tuple:
    """A shape from ``f(2, 3)`` or ``f((2, 3))``: a tuple of non-negative ints (-1 once, if allowed)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = args[0]
    shape = []
    for n in args:
        if isinstance(n, (bool, np.bool_)):
            raise ArgumentTypeError(f"{op}: sizes must be ints, got {n!r} (bool) in {tuple(args)}")
        try:
            shape.append(operator.index(n))
        except TypeError:
            raise ArgumentTypeError(f"{op}: sizes must be ints, got {n!r} ({type(n).__name__}) "
                                    f"in {tuple(args)}") from None
    floor = -1 if allow_minus_one else 0
    if any(n < floor for n in shape) or shape.count(-1) > 1:
        raise ShapeError(f"{op}: invalid shape {tuple(shape)}: sizes must be non-negative"
                         + (" (one may be -1, inferred)" if allow_minus_one else ""))
    return tuple(shape)


def broadcasts_to(shape, target) -> bool:
    """Does ``shape`` broadcast to ``target`` (leaving ``target`` as it is)?"""
    if len(shape) > len(target):
        return False
    return all(a == b or a == 1 for a, b in zip(reversed(shape), reversed(target)))


def dim(value, ndim: int, op: str, tensor=None) -> int:
    """A dim in ``[-ndim, ndim)`` as a non-negative int (the tensor is described only in an error)."""
    d = value if type(value) is int else as_int(value, op, f"dim{_of(tensor)}")
    if not -ndim <= d < ndim:
        what = _of(tensor)
        valid = f"valid: {-ndim} to {ndim - 1}" if ndim else "a 0-d tensor has no dims"
        raise AxisError(f"{op}: dim {d} is out of range for a tensor of rank {ndim}{what} ({valid})")
    return d % ndim


def _of(tensor) -> str:
    return f" of {describe(tensor)}" if tensor is not None else ""


def dims(value, ndim: int, op: str, tensor=None):
    """``None`` (all), an int, or a sequence of distinct ints, each checked by ``dim``; returns
    None, an int or a tuple (the form the kernels take)."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        found = tuple(dim(d, ndim, op, tensor) for d in value)
        if len(set(found)) != len(found):
            raise AxisError(f"{op}: repeated dim in {tuple(value)}"
                            + (f" of {describe(tensor)}" if tensor is not None else ""))
        return found
    return dim(value, ndim, op, tensor)


def device(value, op: str) -> Device:
    """A ``Device`` that exists on this machine (``None``: cpu); ``DeviceError`` naming ``op``."""
    if value is None:
        return Device("cpu")
    try:
        found = Device(value)
        ep.get_device(found)  # raises for an index the machine does not have
    except DeviceError as error:
        raise DeviceError(f"{op}: {error}") from None
    except TypeError:
        raise DeviceError(f"{op}: {value!r} is not a device (use 'cpu', 'cuda' or 'cuda:1')") from None
    return found


def tensor(value, op: str):
    """``value`` if it is a ``Tensor``; else ``ArgumentTypeError`` naming ``op`` (an op's tensor argument)."""
    from pyflow.framework.tensor import Tensor   # tensor.py imports this module

    if not isinstance(value, Tensor):
        raise ArgumentTypeError(f"{op}: expects a tensor, got {type(value).__name__}: {value!r:.60}")
    return value


def tensor_list(values, op: str) -> list:
    """A non-empty list of tensors (``cat``, ``stack``)."""
    from pyflow.framework.tensor import Tensor

    if isinstance(values, Tensor) or not isinstance(values, (tuple, list)):
        raise ArgumentTypeError(f"{op}: expects a list or tuple of tensors, got {type(values).__name__}")
    for t in values:
        if not isinstance(t, Tensor):
            raise ArgumentTypeError(f"{op}: expects tensors, got {type(t).__name__} in the list")
    if not values:
        raise ShapeError(f"{op}: needs at least one tensor")
    return list(values)
