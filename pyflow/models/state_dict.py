"""Checking a state dict against the parameters a model expects (shared by ``lstm`` and ``rae``).

A model here keeps its parameters as numpy arrays and takes them, like PyTorch's
``load_state_dict(strict=True)``, as a dict from PyTorch's parameter names to
arrays.  Every key is checked before anything is stored, so a bad dict leaves the
model unchanged and the one error names everything wrong with it at once: the
missing keys, the unexpected keys and the wrong shapes.
"""

from __future__ import annotations

import numpy as np

from pyflow.errors import StateDictError

__all__ = ["as_array", "as_input", "check_state_dict"]


def as_array(value, dtype) -> np.ndarray:
    """``value`` as a contiguous numpy array of ``dtype``; a torch tensor is detached and moved to CPU."""
    if hasattr(value, "detach"):  # a torch tensor (torch is never imported here)
        value = value.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(value), dtype=dtype)


def as_input(value, dtype):
    """A model's input: a ``pyflow.Tensor`` stays a tensor on its device (cast to ``dtype`` by an eager op
    if needed), so the program's call is one VM instruction and returns tensors; anything else ``as_array``."""
    from pyflow.framework.tensor import Tensor

    if isinstance(value, Tensor):
        return value if value.dtype == np.dtype(dtype) else value.to(dtype=np.dtype(dtype))
    return as_array(value, dtype)


def check_state_dict(model: str, state_dict, expected: dict, dtype) -> dict:
    """``state_dict`` checked against ``expected`` (name -> shape); returns name -> a new array of ``dtype``.

    >>> check_state_dict("M", {"w": [[1, 2]]}, {"w": (1, 2)}, "float32")["w"].dtype
    dtype('float32')
    """
    if not hasattr(state_dict, "keys"):
        raise StateDictError(f"{model}.load_state_dict: expected a dict of arrays, got {type(state_dict).__name__}")
    problems = []
    missing = [k for k in expected if k not in state_dict]
    unexpected = sorted(str(k) for k in state_dict if k not in expected)
    if missing:
        problems.append(f"missing keys {missing}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected}")
    arrays = {}
    for name, shape in expected.items():
        if name not in state_dict:
            continue
        try:
            array = as_array(state_dict[name], dtype)
        except (TypeError, ValueError) as e:
            problems.append(f"{name!r} is not a numeric array ({e})")
            continue
        if array.shape != tuple(shape):
            problems.append(f"{name!r} has shape {array.shape}, expected {tuple(shape)}")
            continue
        arrays[name] = array.copy()   # the model's own (it may make it read-only): never the caller's array
    if problems:
        raise StateDictError(f"{model}.load_state_dict: " + "; ".join(problems))
    return arrays
