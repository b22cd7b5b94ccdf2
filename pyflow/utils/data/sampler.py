"""Samplers (``torch.utils.data``'s): which indices of a map-style dataset, in which order, in which batches.

The loader separates *what* is read (the dataset) from *in which order* (a sampler), so
shuffling, subsetting and resampling never touch the data.  A sampler is an iterable of
indices, re-iterated once per epoch; a batch sampler is an iterable of lists of indices.

* ``SequentialSampler``  - ``0, 1, ..., n-1``;
* ``RandomSampler``      - a fresh permutation each epoch (or ``num_samples`` draws with
  replacement); with no ``generator`` each epoch seeds a private one from the global
  generator, so ``flow.manual_seed(s)`` fixes every epoch's order (PyTorch's rule);
* ``SubsetRandomSampler`` - the given indices, shuffled each epoch;
* ``BatchSampler``       - groups another sampler's indices into lists of ``batch_size``
  (the last one shorter, or dropped with ``drop_last``).

Samplers yield Python ints: indices are host-side bookkeeping, never tensors.

>>> list(BatchSampler(SequentialSampler(range(7)), batch_size=3, drop_last=False))
[[0, 1, 2], [3, 4, 5], [6]]
>>> len(BatchSampler(range(7), 3, drop_last=True))
2
"""

from __future__ import annotations

import numbers
from typing import Iterator, Sequence

from pyflow.errors import ArgumentTypeError, ArgumentValueError
from pyflow.framework.random_perm import Generator, draw, permutation

__all__ = ["Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler", "BatchSampler"]


class Sampler:
    """Base class: subclasses define ``__iter__`` (the indices of one epoch) and, if known, ``__len__``."""

    def __init__(self, data_source=None):
        pass

    def __iter__(self) -> Iterator:
        raise NotImplementedError(f"{type(self).__name__}: subclasses of Sampler should implement __iter__")


class SequentialSampler(Sampler):
    """The indices ``0 .. len(data_source) - 1`` in order (the loader's default without ``shuffle``)."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


def _epoch_generator(generator: Generator | None) -> Generator:
    """The generator for one epoch: ``generator`` itself, or a new one seeded by one draw from the global one.

    Why a private generator per epoch (PyTorch's rule): the epoch's order is fixed by a single draw
    at its start, so other code drawing random numbers *during* the epoch cannot change it.
    """
    if generator is not None:
        return generator
    seed = draw(None, lambda rng: int(rng.integers(0, 2**63)))
    return Generator().manual_seed(seed)


class RandomSampler(Sampler):
    """Random indices of ``data_source``: each epoch a new permutation, or, with ``replacement=True``,
    ``num_samples`` independent uniform draws.

    Without replacement and with ``num_samples`` > ``len(data_source)``, whole permutations follow
    one another (the last one cut short), so each index appears as evenly as possible.  Unlike
    PyTorch, an empty dataset with the default ``num_samples`` gives an empty epoch rather than an
    error (an explicit ``num_samples`` must still be positive, as in PyTorch).

    >>> import pyflow as flow
    >>> sorted(RandomSampler(range(5), generator=flow.Generator().manual_seed(1)))
    [0, 1, 2, 3, 4]
    >>> len(list(RandomSampler(range(3), replacement=True, num_samples=10)))
    10
    """

    def __init__(self, data_source, replacement: bool = False, num_samples: int | None = None,
                 generator: Generator | None = None):
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(replacement, bool):
            raise ArgumentTypeError(f"RandomSampler: replacement should be a boolean value, but got "
                                    f"replacement={replacement!r}")
        if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral)
                                        or num_samples <= 0):
            raise ArgumentValueError(f"RandomSampler: num_samples should be a positive integer value, but got "
                                     f"num_samples={num_samples!r}")
        if generator is not None and not isinstance(generator, Generator):
            raise ArgumentTypeError(f"RandomSampler: generator must be a pyflow.Generator or None, got "
                                    f"{type(generator).__name__}")

    @property
    def num_samples(self) -> int:
        """How many indices one epoch yields (default: ``len(data_source)``, read each time: it may change)."""
        return len(self.data_source) if self._num_samples is None else int(self._num_samples)

    def __iter__(self) -> Iterator[int]:
        n, count = len(self.data_source), self.num_samples
        generator = _epoch_generator(self.generator)
        if self.replacement:
            if n == 0:
                raise ArgumentValueError(f"RandomSampler: cannot draw {count} samples with replacement from an "
                                         "empty data source")
            yield from draw(generator, lambda rng: rng.integers(0, n, count)).tolist()
            return
        if n == 0:
            return
        for _ in range(count // n):
            yield from permutation(n, generator)
        if count % n:
            yield from permutation(n, generator)[:count % n]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given ``indices``, in a new random order each epoch (e.g. a validation split of one dataset).

    >>> sorted(SubsetRandomSampler([4, 8, 15]))
    [4, 8, 15]
    """

    def __init__(self, indices: Sequence[int], generator: Generator | None = None):
        self.indices = indices
        self.generator = generator

    def __iter__(self) -> Iterator:
        for i in permutation(len(self.indices), _epoch_generator(self.generator)):
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class BatchSampler(Sampler):
    """Lists of ``batch_size`` indices from ``sampler``; the last list is shorter unless ``drop_last``.

    ``len`` (PyTorch's rule): ``len(sampler) // batch_size`` with ``drop_last``, else rounded up.

    >>> BatchSampler(range(4), batch_size=0, drop_last=False)
    Traceback (most recent call last):
    ...
    pyflow.errors.ArgumentValueError: BatchSampler: batch_size should be a positive integer value, but got \
batch_size=0
    """

    def __init__(self, sampler, batch_size: int, drop_last: bool):
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size <= 0:
            raise ArgumentValueError(f"BatchSampler: batch_size should be a positive integer value, but got "
                                     f"batch_size={batch_size!r}")
        if not isinstance(drop_last, bool):
            raise ArgumentValueError(f"BatchSampler: drop_last should be a boolean value, but got "
                                     f"drop_last={drop_last!r}")
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list]:
        batch = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        try:
            n = len(self.sampler)
        except TypeError:
            raise TypeError(f"BatchSampler: its sampler ({type(self.sampler).__name__}) has no len(), so the "
                            "number of batches is unknown") from None
        return n // self.batch_size if self.drop_last else (n + self.batch_size - 1) // self.batch_size
