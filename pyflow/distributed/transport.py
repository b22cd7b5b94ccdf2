"""The transport: how ranks exchange data (OneFlow's CommNet and collective communication).

Ranks meet only here.  A transport moves numpy arrays (device tensors are
copied to the host first, as OneFlow's CPU collectives do) between the ranks of
a *group* (a tuple of ranks in parallel_id order):

* point to point: ``send(array, dst, tag)`` / ``recv(src, tag)``;
* collectives: ``all_reduce``, ``reduce_scatter``, ``all_gather``,
  ``all_to_all``, ``broadcast``, ``reduce``, ``barrier``.

**Every collective checks first, across the group, that all ranks are at the
same collective**: each passes a ``CollectiveDesc`` (op, shape, dtype, SBP and
placement text, and the user's Python line), and a mismatch raises
``CollectiveMismatchError`` on every rank, listing what each rank was doing
instead of deadlocking as MPI or NCCL would.  Collectives are matched by a
per-group sequence number that the *issuing* thread takes (``next_seq``), so
ranks may execute them in any order.

The base class builds every collective from one primitive, ``exchange``: each
rank of the group contributes a payload, and every rank gets the list of all
payloads (after the descriptors were checked).  ``InProcessTransport`` (ranks
as threads) implements just that; ``MPITransport`` (ranks as processes,
``mpi_transport.py``) overrides each collective with one that moves the arrays
straight between the processes.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import functools
import itertools
import threading

import numpy as np

__all__ = ["CollectiveDesc", "FailedPiece", "Transport", "SoloTransport"]


@dataclasses.dataclass(frozen=True)
class CollectiveDesc:
    """What the ranks of a collective must agree on, and where each rank issued it."""

    op: str                        # "all_gather", "to_global S(0)->B", ...
    shape: tuple = ()              # the logical shape
    dtype: str = ""
    detail: str = ""               # SBP and placement, as text
    site: tuple = ("<pyflow>", 0)  # the user's (filename, lineno): reported, not compared

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(self.shape))   # hashable, whatever sequence it was given as

    def key(self) -> tuple:
        return (self.op, self.shape, self.dtype, self.detail)

    def describe(self) -> str:
        from pyflow.vm.failure import describe_site

        what = " ".join(p for p in (self.op, f"{self.dtype}{list(self.shape)}" if self.dtype else "",
                                    self.detail) if p)
        return f"{what} (at {describe_site(self.site)})"

    @functools.lru_cache(maxsize=1024)   # noqa: B019 - descriptors are small frozen values, few distinct
    def described(self) -> str:
        """``describe()``, worked out once per distinct descriptor: a training loop issues the same few
        collectives thousands of times, and this text (it reads the user's source line) costs a process
        transport more than the rest of a call's header."""
        return self.describe()


@dataclasses.dataclass(frozen=True)
class FailedPiece:
    """What a rank contributes to a collective it cannot take part in (its input failed).

    Its peers do not wait for it in vain: their collective fails too, naming it.
    """

    rank: int
    reason: str


class Transport(abc.ABC):
    """One rank's end of the connections to the others."""

    rank: int
    world_size: int
    spans_processes: bool = False   # True: the ranks are processes (this one is the process's own rank)

    def __init__(self) -> None:
        self._seq: dict = {}
        self._seq_lock = threading.Lock()

    def next_seq(self, group: tuple) -> int:
        """The number of this rank's next collective in ``group`` (taken when it is issued)."""
        with self._seq_lock:
            counter = self._seq.setdefault(tuple(group), itertools.count())
            return next(counter)

    # --- the primitives a transport provides --------------------------------------------

    @abc.abstractmethod
    def exchange(self, group: tuple, seq: int, desc: CollectiveDesc, payload) -> list:
        """Every rank of ``group`` contributes ``payload``; return all payloads in group order.

        Checks first that every rank's ``desc`` matches (``CollectiveMismatchError``).
        """

    @abc.abstractmethod
    def send(self, array: np.ndarray, dst: int, tag: int) -> None:
        """Send ``array`` to rank ``dst`` (returns once it is on its way; the array may be reused)."""

    @abc.abstractmethod
    def recv(self, src: int, tag: int) -> np.ndarray:
        """The array rank ``src`` sent with ``tag`` (waits for it)."""

    def abandon(self, group: tuple, seq: int, desc: CollectiveDesc, reason: str) -> None:
        """Take part in a collective with a ``FailedPiece``: the peers' collective fails, naming this rank."""
        try:
            self.exchange(group, seq, desc, FailedPiece(self.rank, reason))
        except Exception:  # noqa: BLE001 - this rank's op has failed already; the peers know now
            pass

    # --- collectives, built on exchange ------------------------------------------------------

    def all_gather(self, piece: np.ndarray, group, seq, desc, axis: int = 0) -> np.ndarray:
        """The pieces of every rank, concatenated along ``axis`` in group order."""
        return np.concatenate(self.exchange(group, seq, desc, piece), axis=axis)

    def all_reduce(self, array: np.ndarray, group, seq, desc) -> np.ndarray:
        """The elementwise sum over the group (the same on every rank)."""
        return _sum(self.exchange(group, seq, desc, array))

    def reduce_scatter(self, array: np.ndarray, group, seq, desc, bounds, axis: int = 0) -> np.ndarray:
        """This rank's slice ``bounds[i]`` (along ``axis``) of the sum over the group."""
        total = _sum(self.exchange(group, seq, desc, array))
        start, stop = bounds[group.index(self.rank)]
        return np.ascontiguousarray(total[(slice(None),) * axis + (slice(start, stop),)])

    def all_to_all(self, pieces: list, group, seq, desc) -> list:
        """``pieces[i]`` goes to ``group[i]``; returns what each rank of the group sent here."""
        me = group.index(self.rank)
        return [np.array(sent[me], copy=True) for sent in self.exchange(group, seq, desc, pieces)]

    def broadcast(self, array, root: int, group, seq, desc) -> np.ndarray:
        """``root``'s array on every rank of the group."""
        payloads = self.exchange(group, seq, desc, array if self.rank == root else None)
        return np.array(payloads[group.index(root)], copy=True)

    def reduce(self, array: np.ndarray, root: int, group, seq, desc):
        """The sum over the group on ``root`` (None elsewhere)."""
        total = _sum(self.exchange(group, seq, desc, array))
        return total if self.rank == root else None

    def barrier(self, group, seq, desc) -> None:
        """Return once every rank of the group got here."""
        self.exchange(group, seq, desc, None)


def _sum(arrays: list) -> np.ndarray:
    total = np.array(arrays[0], copy=True)
    for other in arrays[1:]:
        total += other
    return total


class SoloTransport(Transport):
    """The transport of a world of one rank: a plain script, not under ``flow.distributed.run`` or mpiexec.

    OneFlow runs a plain script as a world of one, where a global tensor on ``placement("cpu", [0])``
    works as anywhere else; pyflow's process context gets this transport for that (``distributed/__init__``).
    Every collective's group is this rank alone, so each is this rank's own payload (copied, as the other
    transports hand out copies); a group naming another rank is an error at the call, since no one else
    will ever come.  A message to itself waits in a mailbox.
    """

    rank, world_size = 0, 1

    def __init__(self) -> None:
        super().__init__()
        self._mail: dict = collections.defaultdict(collections.deque)
        self._arrived = threading.Condition()

    def exchange(self, group: tuple, seq: int, desc: CollectiveDesc, payload) -> list:
        if tuple(group) != (0,):
            from pyflow.errors import DistributedError

            raise DistributedError(f"{desc.describe()} needs ranks {list(group)}, but this script is a world of one "
                                   "rank (rank 0): run the function on N ranks with flow.distributed.run(fn, "
                                   "world_size=N), or start N processes with mpiexec")
        return [np.array(payload, copy=True) if isinstance(payload, np.ndarray) else payload]

    def send(self, array: np.ndarray, dst: int, tag: int) -> None:
        with self._arrived:
            self._mail[(dst, tag)].append(np.array(array, copy=True))
            self._arrived.notify_all()

    def recv(self, src: int, tag: int) -> np.ndarray:
        with self._arrived:
            while not self._mail[(self.rank, tag)]:
                if src != self.rank:
                    from pyflow.errors import DistributedError

                    raise DistributedError(f"recv from rank {src} (tag {tag}) in a world of one rank: no one "
                                           "else will send it")
                self._arrived.wait()
            return self._mail[(self.rank, tag)].popleft()
