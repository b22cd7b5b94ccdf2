"""Datasets (``torch.utils.data``'s): what a DataLoader reads samples from.

Two protocols, as in PyTorch, because data comes in two shapes:

* **map-style** - ``dataset[i]`` for ``i`` in ``range(len(dataset))``.  Any object with
  ``__getitem__`` and ``__len__`` works (a list, a numpy array); ``Dataset`` is the base
  class that documents the protocol and gives ``+`` (``ConcatDataset``).  A sampler chooses
  the indices, so shuffling and splitting need no copy of the data.
* **iterable-style** - ``IterableDataset``: ``iter(dataset)`` yields samples, for streams
  whose length or random access is unknown (a file read line by line, a generator).  The
  loader cannot shuffle it or choose indices; it only groups what comes out into batches.

The helpers here build datasets from datasets without copying samples:

* ``TensorDataset(*tensors)`` - sample ``i`` is ``(t[i] for t in tensors)`` (views, no copy);
* ``Subset(dataset, indices)`` - a view of some indices; ``random_split`` makes disjoint ones;
* ``ConcatDataset(datasets)`` / ``ChainDataset(datasets)`` - one after the other.

>>> import pyflow as flow
>>> ds = TensorDataset(flow.arange(6).reshape(3, 2), flow.tensor([10, 20, 30]))
>>> len(ds), [t.tolist() for t in ds[1]]
(3, [[2, 3], 20])
>>> a, b = random_split(range(10), [0.7, 0.3], generator=flow.Generator().manual_seed(0))
>>> len(a), len(b), sorted(list(a) + list(b)) == list(range(10))
(7, 3, True)
"""

from __future__ import annotations

import bisect
import itertools
import math
import numbers
import warnings
from typing import Iterable, Sequence

from pyflow.errors import ArgumentTypeError, ArgumentValueError, ShapeError
from pyflow.framework.random_perm import Generator, permutation
from pyflow.framework.tensor import Tensor

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "Subset", "ConcatDataset", "ChainDataset",
           "random_split"]


class Dataset:
    """A map-style dataset: subclasses define ``__getitem__(index)`` and (for samplers and ``len(loader)``)
    ``__len__``.  ``a + b`` is ``ConcatDataset([a, b])``.

    >>> class Squares(Dataset):
    ...     def __len__(self): return 4
    ...     def __getitem__(self, i): return i * i
    >>> [Squares()[i] for i in range(4)], len(Squares() + Squares())
    ([0, 1, 4, 9], 8)
    """

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__}: subclasses of Dataset should implement __getitem__")

    def __add__(self, other) -> "ConcatDataset":
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """An iterable-style dataset: subclasses define ``__iter__`` (and ``__len__`` if they know it, which
    ``len(loader)`` uses).  ``a + b`` is ``ChainDataset([a, b])``.

    pyflow's DataLoader refuses ``num_workers > 0`` for these (see ``dataloader.py``): PyTorch gives each
    worker *process* its own copy, which yields every sample once per worker unless the dataset shards
    itself; pyflow's workers are threads sharing one object, where that rule would be a trap.
    """

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__}: subclasses of IterableDataset should implement "
                                  "__iter__")

    def __getitem__(self, index):
        raise TypeError(f"{type(self).__name__} is an IterableDataset: iterate it, it has no dataset[i]")

    def __add__(self, other) -> "ChainDataset":
        return ChainDataset([self, other])


class TensorDataset(Dataset):
    """Samples from tensors that share their first dim: sample ``i`` is ``tuple(t[i] for t in tensors)``.

    Each ``t[i]`` is a view (no copy); the loader's ``default_collate`` stacks the views of a batch
    into one tensor per field.  Every tensor must have the same size along dim 0.

    >>> import pyflow as flow
    >>> TensorDataset(flow.zeros(3, 2), flow.zeros(4))
    Traceback (most recent call last):
    ...
    pyflow.errors.ShapeError: TensorDataset: size mismatch between tensors: every tensor needs the same size \
along dim 0, got tensor 0 with shape (3, 2) (3 samples), tensor 1 with shape (4,) (4 samples)
    """

    def __init__(self, *tensors: Tensor):
        if not tensors:
            raise ArgumentValueError("TensorDataset: needs at least one tensor, e.g. TensorDataset(inputs, labels)")
        for i, t in enumerate(tensors):
            if not isinstance(t, Tensor):
                raise ArgumentTypeError(f"TensorDataset: argument {i} must be a pyflow tensor, got "
                                        f"{type(t).__name__} (use flow.tensor(...) or flow.from_numpy(...))")
            if t.ndim == 0:
                raise ShapeError(f"TensorDataset: tensor {i} is 0-d; samples are taken along dim 0, so each "
                                 "tensor needs at least one dim")
        if any(t.shape[0] != tensors[0].shape[0] for t in tensors):
            listed = ", ".join(f"tensor {i} with shape {t.shape} ({t.shape[0]} samples)"
                               for i, t in enumerate(tensors))
            raise ShapeError("TensorDataset: size mismatch between tensors: every tensor needs the same size "
                             f"along dim 0, got {listed}")
        self.tensors = tuple(tensors)

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].shape[0]


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``, in that order: ``subset[i] == dataset[indices[i]]``."""

    def __init__(self, dataset, indices: Sequence[int]):
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset):
    """Map-style datasets one after the other: index ``i`` goes to the dataset whose range holds it.

    ``cumulative_sizes[k]`` is the total length of datasets ``0..k``; a bisection finds the dataset.

    >>> c = ConcatDataset([[0, 1, 2], [10, 11]])
    >>> len(c), c[3], c[-1], c.cumulative_sizes
    (5, 10, 11, [3, 5])
    """

    def __init__(self, datasets: Iterable):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ArgumentValueError("ConcatDataset: datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise ArgumentTypeError(f"ConcatDataset does not support IterableDataset ({type(d).__name__}); "
                                        "use ChainDataset")
        self.cumulative_sizes = list(itertools.accumulate(len(d) for d in self.datasets))

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx):
        if idx < 0:
            if -idx > len(self):
                raise ArgumentValueError(f"ConcatDataset: absolute value of index {idx} should not exceed "
                                         f"dataset length {len(self)}")
            idx = len(self) + idx
        if idx >= len(self):
            raise IndexError(f"ConcatDataset: index {idx} is out of range for a dataset of length {len(self)}")
        which = bisect.bisect_right(self.cumulative_sizes, idx)
        start = self.cumulative_sizes[which - 1] if which else 0
        return self.datasets[which][idx - start]


class ChainDataset(IterableDataset):
    """Iterable datasets one after the other (chained lazily; ``len`` is the sum when each has one)."""

    def __init__(self, datasets: Iterable):
        self.datasets = list(datasets)
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise ArgumentTypeError(f"ChainDataset only supports IterableDataset, got {type(d).__name__}")

    def __iter__(self):
        for d in self.datasets:
            yield from d

    def __len__(self) -> int:
        return sum(len(d) for d in self.datasets)


def _split_lengths(n: int, lengths: Sequence) -> list:
    """Integer lengths from ``lengths``: ints as given, or fractions summing to 1 (PyTorch's rule)."""
    lengths = list(lengths)
    for i, x in enumerate(lengths):
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise ArgumentTypeError(f"random_split: length at index {i} must be an int or a fraction, got {x!r}")
    total = sum(lengths)
    integral = all(isinstance(x, numbers.Integral) for x in lengths)
    # Fractions when they sum to 1 (torch: ints too, if their sum 1 is at most n: [1] of a 1-sample dataset).
    # Unlike torch, float fractions of an empty dataset give empty splits instead of a sum-mismatch error.
    if math.isclose(total, 1) and (total <= n or not integral):
        counts = []
        for i, frac in enumerate(lengths):
            if not 0 <= frac <= 1:
                raise ArgumentValueError(f"random_split: fraction at index {i} is not between 0 and 1: {frac}")
            counts.append(int(math.floor(n * frac)))
        for i in range(n - sum(counts)):   # the rounding remainder, one each, round-robin
            counts[i % len(counts)] += 1
        for i, count in enumerate(counts):
            if count == 0:
                warnings.warn(f"random_split: length of split at index {i} is 0; this might result in an "
                              "empty dataset", stacklevel=3)
        return counts
    for i, x in enumerate(lengths):
        if not isinstance(x, numbers.Integral) or x < 0:
            raise ArgumentValueError(f"random_split: lengths must be non-negative ints or fractions summing to 1, "
                                     f"got {x!r} at index {i} in {lengths}")
    if total != n:
        raise ArgumentValueError(f"random_split: sum of input lengths ({total}) does not equal the length of the "
                                 f"input dataset ({n})")
    return [int(x) for x in lengths]


def random_split(dataset, lengths: Sequence, generator: Generator | None = None) -> list:
    """Split ``dataset`` into disjoint ``Subset`` s of the given ``lengths`` (ints summing to ``len(dataset)``,
    or fractions summing to 1: ``floor(n * f)`` each, the remainder given out one by one from the first).

    One random permutation (``generator``, default: the global generator that ``flow.manual_seed`` seeds)
    is cut into consecutive pieces, so the subsets are disjoint and together hold every index once.

    >>> [len(s) for s in random_split(range(5), [0.5, 0.5])]
    [3, 2]
    >>> random_split(range(5), [2, 2])
    Traceback (most recent call last):
    ...
    pyflow.errors.ArgumentValueError: random_split: sum of input lengths (4) does not equal the length of the \
input dataset (5)
    """
    counts = _split_lengths(len(dataset), lengths)
    indices = permutation(sum(counts), generator)
    return [Subset(dataset, indices[end - count:end])
            for end, count in zip(itertools.accumulate(counts), counts)]
