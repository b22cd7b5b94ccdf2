"""Seeds 000 §3 / 004: ``placement`` - which devices of which ranks hold a global tensor.

OneFlow's ``ParallelDesc``: a device type and a set of ranks, arranged as a
1-D list or a 2-D *hierarchy* (``[[0, 1], [2, 3]]``: 2 groups of 2).  Ranks are
sorted: ``placement("cuda", [0, 2, 1, 3])`` is ``placement("cuda", [0, 1, 2, 3])``,
and a rank's **parallel_id** is its position in that ascending order.  Rank r
uses device ``cuda:<local rank of r>`` (or the cpu); a rank outside the
placement has no parallel_id and runs nothing for tensors placed there.

Ranks must exist: here, rank 0 of a world of 4 (``flow.distributed.run`` sets this up):

>>> from pyflow import env
>>> with env.bound(env.RankContext(rank=0, world_size=4)):
...     p = placement("cuda", [[0, 2], [1, 3]])
...     same = placement("cpu", [1, 0]) == placement("cpu", [0, 1])
>>> p, same
(placement(type="cuda", ranks=[[0, 1], [2, 3]]), True)
>>> p.hierarchy, p.parallel_num, p.parallel_id(2), p.coordinates(2)
((2, 2), 4, 2, (1, 0))
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from pyflow import env
from pyflow.device import Device, ep
from pyflow.errors import DeviceError

__all__ = ["placement"]

_TYPES = ("cpu", "cuda")


def _flatten(ranks, depth: int = 0) -> tuple[list, tuple]:
    """(flat list, hierarchy) of a list or a nested list of equal-length lists of ints."""
    if isinstance(ranks, (range, np.ndarray)):
        ranks = ranks.tolist() if isinstance(ranks, np.ndarray) else list(ranks)
    if not isinstance(ranks, (list, tuple)) or not ranks:
        raise DeviceError(f"placement ranks must be a non-empty list (or nested list) of ints, got {ranks!r}")
    if all(isinstance(r, numbers.Integral) and not isinstance(r, bool) for r in ranks):
        return [int(r) for r in ranks], (len(ranks),)
    if depth >= 1 or not all(isinstance(r, (list, tuple, range)) for r in ranks):
        raise DeviceError(f"placement ranks must be a list of ints or a list of lists of ints (a 2-D "
                          f"hierarchy), got {ranks!r}")
    rows = [_flatten(row, depth + 1) for row in ranks]
    if len({len(flat) for flat, _ in rows}) != 1:
        raise DeviceError(f"placement ranks {ranks!r}: every row of a 2-D hierarchy needs the same length")
    return [r for flat, _ in rows for r in flat], (len(rows), len(rows[0][0]))


class placement:  # noqa: N801 - OneFlow's and PyTorch's lowercase name
    """A device type and the ranks that hold a global tensor's pieces (OneFlow ``ParallelDesc``)."""

    __slots__ = ("_type", "_flat", "_hierarchy", "_ids", "_hash")

    def __init__(self, type: str, ranks) -> None:  # noqa: A002 - OneFlow's argument name
        if type not in _TYPES:
            raise DeviceError(f"unknown placement type {type!r}: expected one of {', '.join(_TYPES)}")
        flat, hierarchy = _flatten(ranks)
        if len(set(flat)) != len(flat):
            raise DeviceError(f"placement ranks {ranks!r} name a rank twice")
        world = env.get_world_size()
        outside = [r for r in flat if not 0 <= r < world]
        if outside:
            raise DeviceError(f"placement ranks {ranks!r}: rank(s) {outside} are outside the world of "
                              f"{world} rank(s) (0..{world - 1})")
        self._type, self._flat, self._hierarchy = type, tuple(sorted(flat)), hierarchy
        self._ids = {r: i for i, r in enumerate(self._flat)}
        self._hash = hash(self._key())   # a placement never changes; every global op's cache key hashes it

    @classmethod
    def all(cls, type: str) -> "placement":  # noqa: A002
        """Every rank of the world, 1-D (``flow.placement.all("cuda")``)."""
        return cls(type, list(range(env.get_world_size())))

    # --- what it is ------------------------------------------------------------------

    @property
    def type(self) -> str:
        return self._type

    @property
    def ranks(self) -> list:
        """The sorted ranks, shaped like the hierarchy (a list, or a list of lists)."""
        if len(self._hierarchy) == 1:
            return list(self._flat)
        cols = self._hierarchy[1]
        return [list(self._flat[i:i + cols]) for i in range(0, len(self._flat), cols)]

    @property
    def hierarchy(self) -> tuple:
        return self._hierarchy

    @property
    def parallel_num(self) -> int:
        return len(self._flat)

    @property
    def flat_ranks(self) -> tuple:
        """The ranks in parallel_id order."""
        return self._flat

    def parallel_id(self, rank: int) -> int | None:
        """``rank``'s position in the placement, or None if it holds no piece."""
        return self._ids.get(rank)

    def has(self, rank: int) -> bool:
        return rank in self._ids

    def device(self, rank: int | None = None) -> Device:
        """The device a rank uses for this placement: ``cpu``, or ``cuda:<local rank>``.

        With fewer GPUs than ranks on the machine (ranks as threads on a 1-GPU box)
        the ranks share them: ``cuda:<local rank % GPUs>``.
        """
        if self._type == "cpu":
            return Device("cpu")
        ctx = env.current()
        local = ctx.local_rank + ((ctx.rank if rank is None else rank) - ctx.rank)
        return Device("cuda", local % ep.device_count("cuda"))

    def coordinates(self, parallel_id: int) -> tuple:
        """``parallel_id``'s index along each hierarchy axis (row-major)."""
        coords = []
        for size in reversed(self._hierarchy):
            coords.append(parallel_id % size)
            parallel_id //= size
        return tuple(reversed(coords))

    # --- value semantics ----------------------------------------------------------------------

    def _key(self) -> tuple:
        return (self._type, self._flat, self._hierarchy)

    def __eq__(self, other) -> bool:
        return isinstance(other, placement) and self._key() == other._key()

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        """Pickled as its arguments (another process rebuilds it, and its hash, which differs there)."""
        return placement, (self._type, self.ranks)

    def __repr__(self) -> str:
        return f'placement(type="{self._type}", ranks={self.ranks})'

    __str__ = __repr__

    def __len__(self) -> int:
        return math.prod(self._hierarchy)
