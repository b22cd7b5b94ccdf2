"""A model's weights kept on the device between calls (issue 17): uploaded once, again only when they change.

A model called with ``pyflow.Tensor`` s runs its program as one VM instruction
(``cocktailer/launch.py``), whose inputs must all be tensors on one device.  The
weights are numpy arrays on the host (``load_state_dict``): turning them into
tensors at every call would copy every weight host-to-device every call.  A
``DeviceWeights`` keeps, per device and per argument slot, the tensor made the
last time, and makes a new one only when the array in that slot changed:

* the same array object, read-only (and so is what it views), is the same weight:
  the tensor is reused (the models' ``load_state_dict`` stores read-only arrays of
  their own, ``freeze``, so ``model.weight[0] = 1`` raises instead of going unseen);
* another array object (``load_state_dict`` again, ``model.weight = new``) or a
  writable one is compared with the values uploaded last time (kept as a
  read-only reference, or a copy): equal values reuse the tensor, others are
  uploaded (``pyflow.tensor(array, device=...)``: one VM instruction that copies
  host-to-device, its memory from the device's caching allocator, like any tensor).

``uploads`` counts the tensors made (what a test or a benchmark reads), and the
cached tensors go when the model does.  The numpy path (no tensor argument) never
comes here: the executor keeps its own device buffers.

    >>> import numpy as np, pyflow as flow
    >>> cache = DeviceWeights()
    >>> w = freeze(np.ones(3, np.float32))
    >>> args = cache.bind((flow.tensor(np.zeros(3, np.float32)), w), slots=[1])
    >>> args2 = cache.bind((flow.tensor(np.zeros(3, np.float32)), w), slots=[1])
    >>> cache.uploads, args[1] is args2[1]
    (1, True)
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

__all__ = ["DeviceWeights", "freeze"]


def freeze(*arrays):
    """Mark ``arrays`` read-only (in place) and return them (one array, or a tuple): a model's parameters.

    Writing one raises ``ValueError: assignment destination is read-only``; change a
    model's parameters with ``load_state_dict`` or by assigning a new array.
    """
    for a in arrays:
        if a is not None:
            a.setflags(write=False)
    return arrays[0] if len(arrays) == 1 else arrays


@dataclasses.dataclass
class _Uploaded:
    source: np.ndarray      # the array uploaded (read-only: itself; writable: a copy of its values then)
    tensor: object          # the pyflow.Tensor holding it on the device


class DeviceWeights:
    """Per device, the tensors of a model's weight arguments (see the module docstring)."""

    def __init__(self):
        self._uploaded: dict = {}    # (device, slot) -> _Uploaded
        self._lock = threading.Lock()
        self.uploads = 0

    def bind(self, args: tuple, slots) -> tuple:
        """``args`` with the numpy arrays at indices ``slots`` replaced by their device tensors.

        Only when the call takes the tensor path (some argument is a ``pyflow.Tensor``):
        the device is the first tensor's.  Otherwise ``args`` come back as they are.
        """
        from pyflow.framework.tensor import Tensor

        first = next((a for a in args if isinstance(a, Tensor)), None)
        if first is None:
            return tuple(args)
        device = first.device
        out = list(args)
        with self._lock:
            for slot in slots:
                if isinstance(out[slot], np.ndarray):
                    out[slot] = self._tensor(device, slot, out[slot])
        return tuple(out)

    def _tensor(self, device, slot: int, array: np.ndarray):
        from pyflow.framework.tensor import tensor

        key = (device, slot)
        have = self._uploaded.get(key)
        if have is not None and _same(have.source, array):
            if have.source is not array and _frozen(array):
                have.source = array          # the new frozen array now stands for these values
            return have.tensor
        uploaded = tensor(np.ascontiguousarray(array), device=device)
        self._uploaded[key] = _Uploaded(array if _frozen(array) else array.copy(), uploaded)
        self.uploads += 1
        return uploaded

    def clear(self) -> None:
        """Forget every uploaded tensor (the next tensor call uploads again)."""
        with self._lock:
            self._uploaded.clear()


def _frozen(array) -> bool:
    """Can nobody write ``array``'s values: it is read-only, and so is every array it is a view of?"""
    while isinstance(array, np.ndarray):
        if array.flags.writeable:
            return False
        array = array.base
    return True


def _same(source: np.ndarray, array: np.ndarray) -> bool:
    """Does ``array`` hold what was uploaded from ``source``?  Identity of a frozen array, else the values."""
    if source is array and _frozen(array):
        return True
    return source.shape == array.shape and source.dtype == array.dtype and np.array_equal(source, array)
