"""Collation (``torch.utils.data``'s ``default_collate`` / ``default_convert``): samples -> one batch.

A dataset returns one sample at a time; a model wants one tensor per field with the batch
along dim 0.  ``default_collate(samples)`` looks at the first sample and recurses on its
structure, so a batch keeps the shape of a sample:

====================================  ==================================================
each sample's element is              the batch holds
====================================  ==================================================
a ``flow.Tensor``                     ``flow.stack(elements)``: a new dim 0, same device
a numpy array / numpy scalar          a tensor of the arrays stacked (numpy's dtype kept)
a Python ``float`` / ``int`` / bool   a 1-D tensor: float64 / int64 / bool (PyTorch's)
a ``str`` or ``bytes``                the list of them, unchanged
a dict (any Mapping)                  the same keys, each value collated
a namedtuple                          the same namedtuple, each field collated
a tuple or list                       a **list** of the collated positions (PyTorch's rule)
====================================  ==================================================

``default_convert`` is what the loader applies when batching is off (``batch_size=None``):
numpy arrays become tensors, everything else stays as it is, recursively.

>>> import numpy as np
>>> batch = default_collate([{"x": np.ones(2, np.float32), "y": 1, "name": "a"},
...                          {"x": np.zeros(2, np.float32), "y": 0, "name": "b"}])
>>> batch["x"].shape, batch["x"].dtype, batch["y"].tolist(), batch["name"]
((2, 2), dtype('float32'), [1, 0], ['a', 'b'])
>>> [t.tolist() for t in default_collate([(1.5, 2), (2.5, 3)])]
[[1.5, 2.5], [2, 3]]
"""

from __future__ import annotations

import collections.abc
import re

import numpy as np

from pyflow.errors import ShapeError
from pyflow.framework.dtypes import DEFAULT_INT
from pyflow.framework.movement import stack
from pyflow.framework.tensor import Tensor, tensor

__all__ = ["default_collate", "default_convert"]

_ERROR = ("default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}")
_NOT_NUMERIC = re.compile(r"[SaUO]")   # numpy dtype codes of strings, bytes and Python objects


def _is_namedtuple(value) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def default_collate(batch: list):
    """Stack a list of samples into a batch, field by field (the table in this module's docstring).

    Tensors must agree in shape and live on one device (``flow.stack`` checks and names them);
    the sequences of one position must have the same length.

    >>> import pyflow as flow
    >>> default_collate([flow.tensor([1, 2]), flow.tensor([3, 4])]).tolist()
    [[1, 2], [3, 4]]
    >>> default_collate([[1, 2], [3]])
    Traceback (most recent call last):
    ...
    RuntimeError: default_collate: each element in list of batch should be of equal size, got lengths [2, 1]
    """
    if not isinstance(batch, collections.abc.Sequence) or isinstance(batch, (str, bytes)):
        raise TypeError(f"default_collate: expects a list of samples, got {type(batch).__name__}")
    if len(batch) == 0:
        raise ShapeError("default_collate: the batch is empty; there is no sample to take the structure from")
    elem = batch[0]
    if isinstance(elem, Tensor):
        return stack(list(batch), 0)
    if isinstance(elem, np.ndarray):
        if _NOT_NUMERIC.search(elem.dtype.str) is not None:
            raise TypeError(_ERROR.format(elem.dtype))
        shapes = [np.shape(b) for b in batch]
        if any(shape != shapes[0] for shape in shapes):
            raise ShapeError(f"default_collate: numpy arrays of one batch must have the same shape, got {shapes}")
        return tensor(np.stack(batch))   # one host copy, then one tensor (not one tensor per sample)
    if isinstance(elem, np.generic):   # a numpy scalar: its dtype is kept (as torch.as_tensor does)
        if _NOT_NUMERIC.search(elem.dtype.str) is not None:
            return list(batch)          # np.str_ / np.bytes_: strings, kept as a list
        return tensor(np.asarray(batch))
    if isinstance(elem, float):
        return tensor(batch, dtype=np.float64)   # PyTorch: Python floats collate to float64
    if isinstance(elem, bool):
        return tensor(batch)                      # (bool before int: True is an int to Python)
    if isinstance(elem, int):
        return tensor(batch, dtype=DEFAULT_INT)
    if isinstance(elem, (str, bytes)):
        return list(batch)
    if isinstance(elem, collections.abc.Mapping):
        collated = {key: default_collate([d[key] for d in batch]) for key in elem}
        try:
            return type(elem)(collated)   # keep an OrderedDict or a custom mapping's type
        except TypeError:
            return collated
    if _is_namedtuple(elem):
        return type(elem)(*(default_collate(list(field)) for field in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        lengths = [len(sample) for sample in batch]
        if any(n != lengths[0] for n in lengths):
            raise RuntimeError(f"default_collate: each element in list of batch should be of equal size, got "
                               f"lengths {lengths}")
        columns = [default_collate(list(column)) for column in zip(*batch)]
        if isinstance(elem, tuple):
            return columns   # PyTorch returns a list for tuples (backwards compatibility)
        try:
            return type(elem)(columns)
        except TypeError:
            return columns
    raise TypeError(_ERROR.format(type(elem)))


def default_convert(data):
    """Numpy arrays (and numpy number scalars) -> tensors, recursively through dicts, namedtuples, tuples and
    lists; everything else unchanged.  The loader's ``collate_fn`` when ``batch_size=None``.

    >>> import numpy as np
    >>> out = default_convert({"x": np.arange(3), "tag": "t", "n": 1})
    >>> out["x"].tolist(), out["tag"], out["n"]
    ([0, 1, 2], 't', 1)
    """
    if isinstance(data, Tensor):
        return data
    if isinstance(data, (np.ndarray, np.generic)):
        if _NOT_NUMERIC.search(data.dtype.str) is not None:
            return data
        return tensor(data)
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        converted = {key: default_convert(value) for key, value in data.items()}
        try:
            return type(data)(converted)
        except TypeError:
            return converted
    if _is_namedtuple(data):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]   # PyTorch: a tuple converts to a list
    if isinstance(data, collections.abc.Sequence):
        try:
            return type(data)([default_convert(d) for d in data])
        except TypeError:
            return [default_convert(d) for d in data]
    return data
