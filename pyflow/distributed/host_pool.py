"""``HostPool``: the caching pool of host arrays the MPI transport receives into and returns (seed 003's CommNet).

The MPI transport (``mpi_transport.py``, ``mpi_protocols.py``) takes its
outputs and receive buffers of 64 KB and more from a ``HostPool``, so a large
buffer is not page-faulted anew on every call; why that matters, and how a
block comes back exactly when the last array that sees it is gone, is in
``HostPool``'s docstring.
"""

from __future__ import annotations

import math
import threading
import weakref

import numpy as np

__all__ = ["HostPool"]


class _Block(np.ndarray):
    """A pooled block of host memory (its own type, so that numpy's views stop at the lease below)."""


class _Lease(np.ndarray):
    """One loan of a block: every array handed out is a view of it, so it lives exactly as long as they do."""


class HostPool:
    """A caching allocator for the transport's host arrays (outputs and receive buffers of 64 KB and more).

    A fresh large numpy array is fresh memory from the OS: the first write of
    each page faults (here about 4 ms for 16 MB, more than the copy itself), which
    MPI writing into a buffer it was given never pays.  Like pyflow's device
    allocator, the pool keeps blocks (sizes rounded up to a power of two) and
    lends them again.  An array it hands out is a view of a ``_Lease`` of a
    block; numpy's views of it (slices, reshapes, transposes) keep the lease
    alive, so the block comes back (``weakref.finalize``) exactly when the last
    array that sees it is gone.  At most ``limit`` bytes of free blocks are kept.
    """

    SMALL = 64 << 10

    def __init__(self, limit: int = 256 << 20):
        self.limit = limit
        self._free: dict = {}     # size -> [blocks]
        self._free_bytes = 0
        self._lock = threading.RLock()   # a lease may die (and come back) on any thread, inside empty() too

    def empty(self, shape, dtype) -> np.ndarray:
        """An uninitialized C-contiguous array, on a free block when there is one."""
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        nbytes = math.prod(shape) * dtype.itemsize   # (np.prod: 3 us of the 7 this call took)
        if nbytes < self.SMALL:
            return np.empty(shape, dtype)
        size = 1 << (nbytes - 1).bit_length()
        with self._lock:
            blocks = self._free.get(size)
            if blocks:
                block = blocks.pop()
                self._free_bytes -= size
            else:
                block = np.empty(size, np.uint8).view(_Block)
        lease = block[:nbytes].view(_Lease)
        weakref.finalize(lease, self._give_back, size, block)
        return lease.view(np.ndarray).view(dtype).reshape(shape)

    def copy(self, array) -> np.ndarray:
        """A C-contiguous copy of ``array``, on a pooled block."""
        array = np.asarray(array)
        out = self.empty(array.shape, array.dtype)
        out[...] = array
        return out

    def _give_back(self, size: int, block: np.ndarray) -> None:
        with self._lock:
            if self._free_bytes + size <= self.limit:
                self._free.setdefault(size, []).append(block)
                self._free_bytes += size
