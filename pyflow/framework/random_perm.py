"""Random permutations and explicit generators: ``flow.Generator`` and ``flow.randperm``.

A data loader that shuffles needs one thing from the random layer: a permutation of
``0..n-1`` that a seed makes reproducible.  pyflow's random functions (``rand``, ``randn``,
``randint`` in ``creation.py``) draw from the calling **rank's** numpy generator, which
``flow.manual_seed`` reseeds (a rank owns one, as a OneFlow process does).  This module adds:

* ``Generator`` - PyTorch's explicit generator object: a seeded numpy ``Generator`` inside,
  ``manual_seed`` / ``initial_seed`` / ``seed``.  Pass one to ``randperm``, ``RandomSampler``,
  ``DataLoader`` or ``random_split`` to make *that* stream of draws independent of everything
  else the program draws.  ``flow.Generator()`` starts from PyTorch's default seed
  (67280421310721), so two fresh generators give the same numbers, as in PyTorch.
* ``randperm(n, generator=None)`` - a random permutation as an int64 tensor.  With no
  generator it draws from the rank's global one, so ``flow.manual_seed(0)`` fixes it.
* ``draw(generator, fn)`` - the one place that takes the right lock and calls
  ``fn(numpy_generator)``: the sampler uses it to get Python ints without making a tensor.

Draws happen on the host (numpy) for every device, then the values are copied, as
``flow.rand`` does; a ``Generator`` records a ``device`` only for PyTorch's API.

>>> import pyflow as flow
>>> g = flow.Generator().manual_seed(0)
>>> p = flow.randperm(5, generator=g)
>>> sorted(p.tolist()), p.dtype, g.initial_seed()
([0, 1, 2, 3, 4], dtype('int64'), 0)
>>> flow.randperm(6, generator=flow.Generator().manual_seed(3)).tolist() == \\
...     flow.randperm(6, generator=flow.Generator().manual_seed(3)).tolist()
True
"""

from __future__ import annotations

import threading

import numpy as np

from pyflow.errors import ArgumentTypeError, ArgumentValueError, DTypeError
from pyflow.framework import args
from pyflow.framework.creation import _generator, _leaf, _rng_lock
from pyflow.framework.dtypes import DEFAULT_INT, as_dtype, to_scalar
from pyflow.framework.tensor import Tensor, tensor

__all__ = ["Generator", "randperm", "draw", "permutation"]

DEFAULT_SEED = 67280421310721   # torch.Generator().initial_seed()
_SEED_LOW, _SEED_HIGH = -0x8000_0000_0000_0000, 0xFFFF_FFFF_FFFF_FFFF   # the seeds torch accepts


def _check_seed(seed, op: str) -> int:
    seed = args.as_int(seed, op, "seed")
    if not _SEED_LOW <= seed <= _SEED_HIGH:
        raise ArgumentValueError(f"{op}: seed {seed} is out of range; it must be in "
                                 f"[{_SEED_LOW}, {_SEED_HIGH}] (a 64-bit int, signed or unsigned)")
    return seed


class Generator:
    """An explicit random generator (``torch.Generator``): its own seeded stream of draws.

    Why an object and not only the global seed: a loader's shuffle order should not change
    because the model's initialisation drew one more number.  Give the loader its own
    generator and its order depends on that generator's seed alone.

    Thread-safe: each draw holds the generator's lock (a loader's workers and the main
    thread may share one).

    >>> g = Generator()
    >>> g.initial_seed()
    67280421310721
    >>> g.manual_seed(7) is g, g.initial_seed()
    (True, 7)
    """

    def __init__(self, device="cpu"):
        self.device = args.device(device, "Generator")
        self._lock = threading.Lock()
        self._seed = DEFAULT_SEED
        self._rng = np.random.default_rng(DEFAULT_SEED)

    def manual_seed(self, seed: int) -> "Generator":
        """Restart the stream from ``seed`` (a 64-bit int; negative ones are taken modulo 2**64, as torch
        does).  Returns the generator, so ``Generator().manual_seed(0)`` is one expression."""
        seed = _check_seed(seed, "Generator.manual_seed")
        with self._lock:
            self._seed = seed
            self._rng = np.random.default_rng(seed % 2**64)
        return self

    def initial_seed(self) -> int:
        """The seed the current stream started from."""
        return self._seed

    def seed(self) -> int:
        """Reseed from the operating system's entropy (a fresh, non-reproducible stream); returns the seed."""
        new_seed = int(np.random.SeedSequence().generate_state(1, np.uint64)[0])
        self.manual_seed(new_seed)
        return new_seed

    def __repr__(self) -> str:
        return f"<pyflow.Generator device={self.device} initial_seed={self._seed}>"


def draw(generator: Generator | None, fn):
    """``fn(numpy_generator)`` under the right lock: ``generator``'s own, or (None) the calling rank's global
    generator that ``flow.manual_seed`` seeds."""
    if generator is None:
        with _rng_lock:
            return fn(_generator())
    if not isinstance(generator, Generator):
        raise ArgumentTypeError(f"generator must be a pyflow.Generator or None, got {type(generator).__name__}")
    with generator._lock:
        return fn(generator._rng)


def permutation(n: int, generator: Generator | None = None) -> list:
    """A random permutation of ``range(n)`` as Python ints (what a sampler yields; no tensor is made)."""
    return draw(generator, lambda rng: rng.permutation(n)).tolist()


def randperm(n: int, *, generator: Generator | None = None, dtype=None, device=None,
             requires_grad: bool = False) -> Tensor:
    """A random permutation of ``0..n-1`` (``torch.randperm``), int64 unless ``dtype``.

    Drawn on the host from ``generator`` (default: the rank's global generator, so
    ``flow.manual_seed`` makes it reproducible), then copied to ``device``.

    >>> randperm(0).tolist(), randperm(1).tolist()
    ([], [0])
    >>> randperm(300, dtype="uint8")
    Traceback (most recent call last):
    ...
    pyflow.errors.DTypeError: randperm: value 299 is out of range for uint8...
    """
    n = args.sizes((n,), "randperm")[0]
    dtype = as_dtype(dtype if dtype is not None else DEFAULT_INT, "randperm")
    if dtype.kind == "b":
        raise DTypeError("randperm: a permutation cannot be bool; use an integer or float dtype")
    if n:
        to_scalar(n - 1, dtype, "randperm")   # every value must fit the dtype ...
        if dtype.kind == "f" and n - 1 > 2 ** (np.finfo(dtype).nmant + 1):   # ... exactly (float16: n <= 2049)
            raise DTypeError(f"randperm: {dtype} cannot hold every integer up to {n - 1} exactly")
    values = draw(generator, lambda rng: rng.permutation(n))
    return _leaf(tensor(values.astype(dtype), device=args.device(device, "randperm")), requires_grad)
