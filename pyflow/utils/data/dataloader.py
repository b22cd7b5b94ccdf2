"""``DataLoader`` (``torch.utils.data.DataLoader``): a dataset -> an iterable of batches, epoch after epoch.

A training loop wants ``for x, y in loader:``.  The loader composes three small parts,
each replaceable, so the loop never sees indices, order or stacking:

    sampler -> batch sampler -> fetch (``dataset[i]`` for each index) -> collate_fn -> batch

* **which samples, in which order**: ``sampler`` (default ``SequentialSampler``, or
  ``RandomSampler`` with ``shuffle=True``, drawing from ``generator`` or, by default, the
  global generator: ``flow.manual_seed(s)`` fixes every epoch's order);
* **grouped how**: ``BatchSampler(sampler, batch_size, drop_last)``, or your ``batch_sampler``;
  ``batch_size=None`` turns batching off (each sample is ``default_convert``-ed alone);
* **stacked how**: ``collate_fn`` (default ``default_collate``: one tensor per field).

``len(loader)`` is PyTorch's: the number of batches (``ceil(n / batch_size)``, or ``floor``
with ``drop_last``); for an ``IterableDataset`` it needs the dataset's ``__len__`` (else
``TypeError``).  Each ``iter(loader)`` is a new epoch.

``num_workers > 0`` makes batches on that many threads ahead of the loop (``worker.py`` says
why threads and how): the same batches in the same order as ``num_workers=0``, at most
``prefetch_factor * num_workers`` ahead, a worker's exception raised in the loop's thread.
An ``IterableDataset`` with ``num_workers > 0`` is refused: PyTorch's rule gives each worker a
*copy* of the dataset, so every sample comes once per worker unless the dataset shards itself
with ``get_worker_info()``; with threads sharing one object that rule would only be a trap.

>>> import pyflow as flow
>>> from pyflow.utils.data import TensorDataset
>>> ds = TensorDataset(flow.arange(10).reshape(5, 2), flow.arange(5))
>>> loader = DataLoader(ds, batch_size=2)
>>> len(loader), [(x.shape, y.tolist()) for x, y in loader]
(3, [((2, 2), [0, 1]), ((2, 2), [2, 3]), ((1, 2), [4])])
>>> flow.manual_seed(0); a = [b.tolist() for b in DataLoader(range(6), batch_size=3, shuffle=True)]
>>> flow.manual_seed(0); a == [b.tolist() for b in DataLoader(range(6), batch_size=3, shuffle=True)]
True
"""

from __future__ import annotations

import functools
import itertools
import numbers

from pyflow.errors import ArgumentTypeError, ArgumentValueError
from pyflow.framework.random_perm import Generator, draw
from pyflow.utils.data.collate import default_collate, default_convert
from pyflow.utils.data.dataset import IterableDataset
from pyflow.utils.data.sampler import BatchSampler, RandomSampler, SequentialSampler
from pyflow.utils.data.worker import ThreadedIter

__all__ = ["DataLoader"]


def _fetch(dataset, collate_fn, auto_collation: bool, indices):
    """One batch of a map-style dataset: read each index, then collate (or convert the one sample)."""
    if auto_collation:
        return collate_fn([dataset[i] for i in indices])
    return collate_fn(dataset[indices])


class DataLoader:
    """Batches from ``dataset``, one epoch per ``iter(loader)`` (the module docstring tells the parts).

    The arguments after ``collate_fn`` are keyword-only: PyTorch's positional order has
    ``pin_memory`` there, which pyflow does not take, so a positional call cannot bind
    silently to the wrong parameter.  ``worker_init_fn(worker_id)`` runs first on each worker
    thread (with ``num_workers=0`` it is not called, as in PyTorch).
    """

    def __init__(self, dataset, batch_size: int | None = 1, shuffle: bool | None = None, sampler=None,
                 batch_sampler=None, num_workers: int = 0, collate_fn=None, *, drop_last: bool = False,
                 timeout: float = 0, worker_init_fn=None, generator: Generator | None = None,
                 prefetch_factor: int | None = None):
        iterable = isinstance(dataset, IterableDataset)
        self._check(iterable, batch_size, shuffle, sampler, batch_sampler, num_workers, drop_last, timeout,
                    generator, prefetch_factor)
        self.dataset = dataset
        self.num_workers = int(num_workers)
        self.prefetch_factor = (2 if prefetch_factor is None else int(prefetch_factor)) if num_workers else None
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.generator = generator
        self._iterable = iterable
        if sampler is None and not iterable:   # (an iterable dataset orders itself: no sampler)
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        if batch_sampler is not None:          # the user's batches: batch_size and drop_last do not apply
            batch_size, drop_last = None, False
        elif batch_size is not None and not iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn

    @staticmethod
    def _check(iterable, batch_size, shuffle, sampler, batch_sampler, num_workers, drop_last, timeout, generator,
               prefetch_factor) -> None:
        """PyTorch's argument rules, checked at construction with PyTorch's messages (plus what to do)."""
        if isinstance(num_workers, bool) or not isinstance(num_workers, numbers.Integral) or num_workers < 0:
            raise ArgumentValueError(f"DataLoader: num_workers option should be a non-negative int, got "
                                     f"{num_workers!r}; use num_workers=0 to load on the calling thread")
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or timeout < 0:
            raise ArgumentValueError(f"DataLoader: timeout option should be non-negative, got {timeout!r}")
        if timeout > 0 and num_workers == 0:
            raise ArgumentValueError("DataLoader: timeout applies to waiting for worker threads; with "
                                     "num_workers=0 it must be 0")
        if prefetch_factor is not None:
            if num_workers == 0:
                raise ArgumentValueError("DataLoader: prefetch_factor option could only be specified with workers; "
                                         "let num_workers > 0 to enable them")
            if isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, numbers.Integral) \
                    or prefetch_factor <= 0:
                raise ArgumentValueError(f"DataLoader: prefetch_factor should be a positive int, got "
                                         f"{prefetch_factor!r}")
        if generator is not None and not isinstance(generator, Generator):
            raise ArgumentTypeError(f"DataLoader: generator must be a pyflow.Generator or None, got "
                                    f"{type(generator).__name__}")
        if iterable:
            for name, value in (("shuffle", shuffle), ("sampler", sampler), ("batch_sampler", batch_sampler)):
                if value not in (None, False):
                    raise ArgumentValueError(f"DataLoader with IterableDataset: expected unspecified {name} option, "
                                             f"but got {name}={value!r} (the dataset alone decides its order)")
            if num_workers > 0:
                raise ArgumentValueError(
                    "DataLoader: num_workers > 0 is not supported for an IterableDataset. PyTorch gives each worker "
                    "process its own copy of the dataset, so every sample comes once per worker unless the dataset "
                    "shards itself; pyflow's workers are threads sharing one object. Use num_workers=0, or a "
                    "map-style Dataset (with __getitem__ and __len__) to load with workers.")
        if batch_sampler is not None and (batch_size != 1 or shuffle or sampler is not None or drop_last):
            raise ArgumentValueError("DataLoader: batch_sampler option is mutually exclusive with batch_size, "
                                     "shuffle, sampler, and drop_last")
        if sampler is not None and shuffle:
            raise ArgumentValueError("DataLoader: sampler option is mutually exclusive with shuffle")
        if batch_size is None and drop_last:
            raise ArgumentValueError("DataLoader: batch_size=None option disables auto-batching and is mutually "
                                     "exclusive with drop_last")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral)
                                       or batch_size <= 0):
            raise ArgumentValueError(f"DataLoader: batch_size should be a positive integer value or None, but got "
                                     f"batch_size={batch_size!r}")
        if not isinstance(drop_last, bool):
            raise ArgumentValueError(f"DataLoader: drop_last should be a boolean value, but got "
                                     f"drop_last={drop_last!r}")

    @property
    def _auto_collation(self) -> bool:
        """Are samples grouped into batches (by a batch sampler, or ``batch_size`` for an iterable dataset)?"""
        return self.batch_sampler is not None or (self._iterable and self.batch_size is not None)

    @property
    def _index_sampler(self):
        """What yields one batch's worth of indices: the batch sampler, or the sampler when batching is off."""
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    def __len__(self) -> int:
        if self._iterable:
            try:
                n = len(self.dataset)
            except TypeError:
                raise TypeError(f"len(DataLoader): the IterableDataset {type(self.dataset).__name__} defines no "
                                "__len__, so the number of batches is unknown") from None
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else (n + self.batch_size - 1) // self.batch_size
        return len(self._index_sampler)

    def _length_or_none(self):
        try:
            return len(self)
        except TypeError:
            return None

    def __iter__(self):
        # One draw per epoch from the loader's generator (PyTorch's base seed: WorkerInfo.seed), taken with or
        # without workers, so num_workers never changes what a seeded generator gives the sampler.
        base_seed = draw(self.generator, lambda rng: int(rng.integers(0, 2**62)))
        if self.num_workers == 0:
            return _SingleThreadIter(self)
        fetch = functools.partial(_fetch, self.dataset, self.collate_fn, self._auto_collation)
        return ThreadedIter(fetch, self._index_sampler, self.dataset, num_workers=self.num_workers,
                            prefetch_factor=self.prefetch_factor, timeout=self.timeout,
                            worker_init_fn=self.worker_init_fn, base_seed=base_seed, length=self._length_or_none())

    def __repr__(self) -> str:
        return (f"DataLoader(dataset={type(self.dataset).__name__}, batch_size={self.batch_size}, "
                f"drop_last={self.drop_last}, num_workers={self.num_workers})")


class _SingleThreadIter:
    """One epoch on the calling thread (``num_workers=0``): each ``next`` reads and collates one batch."""

    def __init__(self, loader: DataLoader):
        self._loader = loader
        self._closed = False
        if loader._iterable:
            self._samples = iter(loader.dataset)
        else:
            self._indices = iter(loader._index_sampler)
            self._fetch = functools.partial(_fetch, loader.dataset, loader.collate_fn, loader._auto_collation)

    def __iter__(self) -> "_SingleThreadIter":
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def __next__(self):
        if self._closed:
            raise StopIteration
        try:
            return self._next_batch()
        except StopIteration:
            self._closed = True
            raise

    def _next_batch(self):
        loader = self._loader
        if not loader._iterable:
            return self._fetch(next(self._indices))
        if not loader._auto_collation:
            return loader.collate_fn(next(self._samples))
        batch = list(itertools.islice(self._samples, loader.batch_size))
        if not batch or (loader.drop_last and len(batch) < loader.batch_size):
            raise StopIteration
        return loader.collate_fn(batch)

    def close(self) -> None:
        """End the epoch early (nothing to stop: there are no workers)."""
        self._closed = True
