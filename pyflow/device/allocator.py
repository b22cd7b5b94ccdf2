"""The caching allocator: OneFlow's BinAllocator, in Python (seed 000, device memory).

Seed concept: ``oneflow/core/vm/bin_allocator`` -- cache device memory so that most
allocations never reach cudaMalloc.  Touches only its ``backend`` (an ep device's
``alloc``/``free``) and ``pyflow.errors``; the VM calls ``allocate`` while preparing an
instruction and ``deallocate`` when a tensor is released.

Vocabulary.  A *block* is one buffer bought from the backend (one cudaMalloc).  A block
is cut into *pieces*, kept in a doubly linked list in address order (``prev``/``next``);
each piece is used (handed out) or free (cached).

- Alignment: every request is rounded up to a multiple of ``alignment`` (512 B).
- Bins: free pieces sit in 20 bins; bin ``i`` holds sizes in [512 << i, 512 << (i+1)),
  the last (19) everything from 512 << 19 = 256 MiB up; each bin is sorted by (size, ptr).
- Find: from ``bin_num(aligned)`` upwards, take the first piece with size >= aligned.
  Split it when the rest is big enough (piece >= 2 * aligned, or rest >= 128 MiB): the
  rest becomes a new free piece right after it.
- Free: mark the piece free, merge it with a free ``next``, then with a free ``prev``,
  and put the merged piece into its bin.
- Growth: when nothing fits, buy a block of 2 MiB (request < 1 MiB), 20 MiB (< 10 MiB)
  or the request rounded up to 2 MiB, and find again.
- Shrink: give every block whose pieces are all free back to the backend.
- pyflow: an optional ``capacity`` caps the reserved bytes.  Growth asks for just the
  request when the chunk does not fit (capacity, or a backend ``MemoryError``).  When
  even that fails the allocator shrinks once, retries once, and then raises
  ``OutOfMemoryError`` naming the request, the device and the stats.

A tiny run (the backend hands out fake addresses; real ones are ep devices):

>>> from types import SimpleNamespace
>>> class Backend:
...     def alloc(self, nbytes): return SimpleNamespace(ptr=0x10000, nbytes=nbytes)
...     def free(self, raw): pass
>>> allocator = CachingAllocator(Backend())
>>> a = allocator.allocate(1000)            # rounded up to 1024, a 2 MiB block is bought
>>> hex(a.ptr), a.size, allocator.stats().reserved
('0x10000', 1024, 2097152)
>>> allocator.deallocate(a.ptr)             # merged back: the block is one free piece
>>> allocator.shrink()                      # ... which goes back to the backend
2097152
"""

from __future__ import annotations

import bisect
import operator
import threading
from dataclasses import dataclass
from typing import Any, Iterator

from pyflow.errors import AllocationError, DoubleFreeError, InvalidFreeError, OutOfMemoryError

MiB = 1 << 20
NUM_BINS = 20
MIN_BIN_SIZE = 512  # bin 0 starts here, whatever the alignment (OneFlow: kCudaMemAllocAlignSize)
PIECE_SPLIT_THRESHOLD = 128 * MiB  # a rest this large is always split off


def bin_num(size: int) -> int:
    """Bin of a free piece: ``min(19, floor(log2(max(size, 512) >> 9)))``."""
    return min(NUM_BINS - 1, (max(size, MIN_BIN_SIZE) >> 9).bit_length() - 1)


def bin_size(num: int) -> int:
    """Smallest piece size bin ``num`` holds: ``512 << num``."""
    return MIN_BIN_SIZE << num


def round_up(nbytes: int, multiple: int) -> int:
    """``nbytes`` rounded up to a multiple of ``multiple``."""
    return -(-nbytes // multiple) * multiple


def growth_size(aligned: int) -> int:
    """Bytes OneFlow asks the backend for when no cached piece holds ``aligned``."""
    if aligned < 1 * MiB:
        return 2 * MiB
    if aligned < 10 * MiB:
        return 20 * MiB
    return round_up(aligned, 2 * MiB)


def format_bytes(nbytes: int) -> str:
    """Human-readable size: ``format_bytes(3 * 2**20) == '3.0 MiB'``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


@dataclass(frozen=True)
class Allocation:
    """What ``allocate`` hands out; view the memory as ``raw[offset : offset + size]``."""

    ptr: int  # address; 0 for a zero-size allocation
    size: int  # the request rounded up to the alignment
    requested: int  # bytes asked for
    raw: Any  # the backend buffer the piece lives in (None for size 0)
    offset: int  # ptr - raw.ptr (0 for size 0)


@dataclass(frozen=True)
class AllocatorStats:
    """A snapshot of the allocator's counters (bytes unless named ``num_``)."""

    reserved: int  # bytes in blocks bought from the backend
    in_use: int  # sum of the aligned sizes of live allocations
    peak_in_use: int  # the largest ``in_use`` ever seen
    cached: int  # reserved - in_use
    num_backing_allocs: int  # successful backend.alloc calls (cudaMalloc)
    num_backing_frees: int  # backend.free calls (cudaFree)
    num_blocks: int  # live blocks
    num_live_allocations: int  # allocations not yet freed (size 0 not counted)

    def __str__(self) -> str:
        return (
            f"reserved {format_bytes(self.reserved)}, in use {format_bytes(self.in_use)} "
            f"(peak {format_bytes(self.peak_in_use)}), cached {format_bytes(self.cached)}, "
            f"{self.num_blocks} blocks, {self.num_live_allocations} live allocations, "
            f"{self.num_backing_allocs} backend allocs / {self.num_backing_frees} frees"
        )


@dataclass(frozen=True)
class PieceInfo:
    """Read-only view of one piece, for ``pieces()``, ``describe()`` and tests."""

    ptr: int
    size: int
    is_free: bool
    bin_num: int | None  # the bin it sits in; None while used
    block_ptr: int


@dataclass(eq=False)
class Block:
    """One buffer bought from the backend; ``first_piece`` starts its piece list."""

    raw: Any
    ptr: int
    size: int
    first_piece: Piece | None = None

    def pieces(self) -> Iterator[Piece]:
        piece = self.first_piece
        while piece is not None:
            yield piece
            piece = piece.next


@dataclass(eq=False)
class Piece:
    """A range [ptr, ptr + size) of a block, used or free."""

    ptr: int
    size: int
    block: Block
    is_free: bool = True
    prev: Piece | None = None
    next: Piece | None = None
    bin_num: int | None = None  # None while not in a bin (OneFlow: kInvalidBinNum)
    in_use: int = 0  # aligned size of the allocation occupying it (0 while free)


class CachingAllocator:
    """OneFlow's BinAllocator over ``backend`` (``alloc(nbytes) -> raw``, ``free(raw)``)."""

    def __init__(self, backend, *, device: str = "cpu", alignment: int = 512,
                 capacity: int | None = None):
        if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
            raise AllocationError(f"{device}: alignment must be a power of two, got {alignment!r}")
        self.backend = backend
        self.device = device
        self.alignment = alignment
        self._lock = threading.Lock()  # VM threads allocate and free concurrently
        self._bins: list[list[tuple[int, int]]] = [[] for _ in range(NUM_BINS)]  # (size, ptr)
        self._ptr2piece: dict[int, Piece] = {}  # every piece, used or free, by its start
        # Sorted pointers once handed out and freed since, whose memory nobody got
        # again: freeing one of them again is a double free (even after merging).
        self._freed: list[int] = []
        self._blocks: dict[int, Block] = {}  # by base address
        self._capacity = None if capacity is None else self._checked(capacity, "capacity")
        self._reserved = self._in_use = self._peak_in_use = 0
        self._num_backing_allocs = self._num_backing_frees = self._num_live = 0

    # --- public API (each method takes the lock once) -------------------------------

    def allocate(self, nbytes: int) -> Allocation:
        """Hand out at least ``nbytes`` bytes, aligned; raises ``OutOfMemoryError``."""
        nbytes = self._checked(nbytes, "the size of an allocation")
        with self._lock:
            if nbytes == 0:
                return Allocation(ptr=0, size=0, requested=0, raw=None, offset=0)
            aligned = round_up(nbytes, self.alignment)
            piece = self.find_piece(aligned)
            if piece is None:
                grown = self.allocate_block_to_extend_total_mem(aligned)
                if not grown:  # empty the cache once, then try once more
                    self._shrink_locked()
                    grown = self.allocate_block_to_extend_total_mem(aligned)
                if not grown:
                    raise self._out_of_memory(nbytes, aligned)
                piece = self.find_piece(aligned)
            piece.in_use = aligned
            self._in_use += aligned
            self._peak_in_use = max(self._peak_in_use, self._in_use)
            self._num_live += 1
            raw = piece.block.raw
            return Allocation(ptr=piece.ptr, size=aligned, requested=nbytes, raw=raw,
                              offset=piece.ptr - raw.ptr)

    def deallocate(self, ptr: int) -> None:
        """Give back an allocation by its ``ptr``; ``deallocate(0)`` does nothing."""
        address = _as_int(ptr)
        if address == 0:
            return
        with self._lock:
            piece = self._ptr2piece.get(address)
            if piece is None or piece.is_free:
                raise self._bad_free(ptr)
            self._in_use -= piece.in_use
            self._num_live -= 1
            piece.is_free, piece.in_use = True, 0
            bisect.insort(self._freed, piece.ptr)
            if piece.next is not None and piece.next.is_free:
                self.merge_neighbour_free_piece(piece, piece.next)
            if piece.prev is not None and piece.prev.is_free:
                piece = self.merge_neighbour_free_piece(piece.prev, piece)
            self.insert_piece_to_bin(piece)

    def shrink(self) -> int:
        """Return every block whose pieces are all free; the number of bytes returned."""
        with self._lock:
            return self._shrink_locked()

    def stats(self) -> AllocatorStats:
        with self._lock:
            return self._stats_locked()

    def pieces(self) -> list[PieceInfo]:
        """Every piece of every block, in address order."""
        with self._lock:
            return self._pieces_locked()

    @property
    def capacity(self) -> int | None:
        """Most bytes this allocator may reserve (None: no limit but the backend's)."""
        return self._capacity

    @capacity.setter
    def capacity(self, value: int | None) -> None:
        """Lowering it below ``reserved`` returns cached blocks; live ones stay."""
        with self._lock:
            self._capacity = None if value is None else self._checked(value, "capacity")
            if self._capacity is not None and self._reserved > self._capacity:
                self._shrink_locked()

    def describe(self) -> str:
        """A multi-line dump of the blocks and their pieces, for reading in a debugger."""
        with self._lock:
            lines = [f"CachingAllocator({self.device}, capacity "
                     f"{'unlimited' if self._capacity is None else format_bytes(self._capacity)}): "
                     f"{self._stats_locked()}"]
            for info in self._pieces_locked():
                if info.ptr == info.block_ptr:
                    block = self._blocks[info.block_ptr]
                    lines.append(f"  block {block.ptr:#x}  {format_bytes(block.size)}")
                state = f"free  bin {info.bin_num}" if info.is_free else "used"
                lines.append(f"    +{info.ptr - info.block_ptr:#010x}  {info.size:>12} B  {state}")
            return "\n".join(lines)

    # --- bins -----------------------------------------------------------------------

    def insert_piece_to_bin(self, piece: Piece) -> None:
        assert piece.is_free and piece.bin_num is None
        piece.bin_num = bin_num(piece.size)
        bisect.insort(self._bins[piece.bin_num], (piece.size, piece.ptr))

    def remove_piece_from_bin(self, piece: Piece) -> None:
        assert piece.is_free and piece.bin_num is not None
        pieces = self._bins[piece.bin_num]
        del pieces[bisect.bisect_left(pieces, (piece.size, piece.ptr))]
        piece.bin_num = None

    def find_piece(self, aligned: int) -> Piece | None:
        """Take the first free piece, in (size, ptr) order, holding ``aligned`` bytes."""
        bins = self._bins
        for num in range(bin_num(aligned), NUM_BINS):
            pieces = bins[num]
            if not pieces:
                continue
            i = bisect.bisect_left(pieces, (aligned, -1))
            if i < len(pieces):
                piece = self._ptr2piece[pieces[i][1]]
                self.remove_piece_from_bin(piece)
                if piece.size >= 2 * aligned or piece.size - aligned >= PIECE_SPLIT_THRESHOLD:
                    self.split_piece(piece, aligned)
                piece.is_free = False
                self._forget_freed(piece.ptr, piece.ptr + piece.size)  # old pointers here are now interior
                return piece
        return None

    def split_piece(self, piece: Piece, aligned: int) -> None:
        """Cut ``piece`` to ``aligned`` bytes; the rest becomes a free piece after it."""
        rest = Piece(ptr=piece.ptr + aligned, size=piece.size - aligned, block=piece.block,
                     prev=piece, next=piece.next)
        if piece.next is not None:
            piece.next.prev = rest
        piece.next, piece.size = rest, aligned
        self._ptr2piece[rest.ptr] = rest
        self.insert_piece_to_bin(rest)

    def merge_neighbour_free_piece(self, lhs: Piece, rhs: Piece) -> Piece:
        """``lhs`` grows over its neighbour ``rhs``, which vanishes; returns ``lhs``."""
        for piece in (lhs, rhs):
            if piece.bin_num is not None:
                self.remove_piece_from_bin(piece)
        lhs.size += rhs.size
        lhs.next = rhs.next
        if rhs.next is not None:
            rhs.next.prev = lhs
        del self._ptr2piece[rhs.ptr]
        return lhs

    # --- growth and shrink ------------------------------------------------------------

    def allocate_block_to_extend_total_mem(self, aligned: int) -> bool:
        """Buy a block holding ``aligned`` bytes, as one free piece; False on failure."""
        room = float("inf") if self._capacity is None else self._capacity - self._reserved
        chunk = round_up(growth_size(aligned), self.alignment)  # OneFlow's growth step
        # pyflow: when the chunk passes the capacity or the backend refuses it, ask for
        # just the request, so that only a request that truly does not fit fails.
        for size in (chunk, aligned) if chunk > aligned else (aligned,):
            if size > room:
                continue
            try:
                raw = self.backend.alloc(size)
            except MemoryError:  # any MemoryError means "the device is out of memory"
                continue
            block = Block(raw=raw, ptr=raw.ptr, size=size)
            block.first_piece = Piece(ptr=raw.ptr, size=size, block=block)
            self._blocks[block.ptr] = block
            self._ptr2piece[block.ptr] = block.first_piece
            self.insert_piece_to_bin(block.first_piece)
            self._reserved += size
            self._num_backing_allocs += 1
            return True
        return False

    def _shrink_locked(self) -> int:
        """OneFlow's DeallocateFreeBlockForGarbageCollection."""
        returned = 0
        for block in list(self._blocks.values()):
            if all(piece.is_free for piece in block.pieces()):
                self.backend.free(block.raw)
                for piece in block.pieces():
                    self.remove_piece_from_bin(piece)
                    del self._ptr2piece[piece.ptr]
                del self._blocks[block.ptr]
                self._forget_freed(block.ptr, block.ptr + block.size)
                self._reserved -= block.size
                self._num_backing_frees += 1
                returned += block.size
        return returned

    # --- helpers ---------------------------------------------------------------------

    def _stats_locked(self) -> AllocatorStats:
        return AllocatorStats(
            reserved=self._reserved, in_use=self._in_use, peak_in_use=self._peak_in_use,
            cached=self._reserved - self._in_use, num_backing_allocs=self._num_backing_allocs,
            num_backing_frees=self._num_backing_frees, num_blocks=len(self._blocks),
            num_live_allocations=self._num_live)

    def _pieces_locked(self) -> list[PieceInfo]:
        return [PieceInfo(p.ptr, p.size, p.is_free, p.bin_num, block.ptr)
                for block in sorted(self._blocks.values(), key=lambda b: b.ptr)
                for p in block.pieces()]

    def _checked(self, value: Any, what: str) -> int:
        number = _as_int(value)
        if number is None or number < 0:
            raise AllocationError(f"{self.device}: {what} must be a non-negative integer, "
                                  f"got {value!r}")
        return number

    def _out_of_memory(self, nbytes: int, aligned: int) -> OutOfMemoryError:
        stats = self._stats_locked()
        limit = "unlimited" if self._capacity is None else format_bytes(self._capacity)
        return OutOfMemoryError(
            f"{self.device}: out of memory allocating {nbytes} bytes ({format_bytes(nbytes)}, "
            f"{aligned} bytes aligned) after returning every cached block; capacity {limit}; "
            f"{stats}", request=nbytes, device=self.device, stats=stats)

    def _bad_free(self, ptr: Any) -> InvalidFreeError:
        address = _as_int(ptr)
        if address is None or address < 0:
            return InvalidFreeError(f"{self.device}: cannot free {ptr!r}: not a pointer")
        ptr, where = address, f"{address:#x}"
        piece = self._piece_containing(ptr)
        if piece is not None and piece.is_free and self._was_freed(ptr):
            return DoubleFreeError(f"{self.device}: double free of {where}: it was already freed")
        if piece is None:
            why = "it was never handed out by this allocator (or its block was returned)"
        elif piece.is_free:
            why = f"it lies in cached free memory (free piece at {piece.ptr:#x})"
        else:
            why = (f"it points inside the allocation at {piece.ptr:#x} "
                   f"(+{ptr - piece.ptr} bytes); free the allocation's own ptr")
        return InvalidFreeError(f"{self.device}: cannot free {where}: {why}")

    def _forget_freed(self, start: int, stop: int) -> None:
        """Drop remembered freed pointers in [start, stop): that memory was handed out again."""
        del self._freed[bisect.bisect_left(self._freed, start):bisect.bisect_left(self._freed, stop)]

    def _was_freed(self, ptr: int) -> bool:
        i = bisect.bisect_left(self._freed, ptr)
        return i < len(self._freed) and self._freed[i] == ptr

    def _piece_containing(self, ptr: int) -> Piece | None:
        pieces = (p for b in self._blocks.values() for p in b.pieces())
        return next((p for p in pieces if p.ptr <= ptr < p.ptr + p.size), None)


def _as_int(value: Any) -> int | None:
    """``value`` as an int (numpy integers too), or None; a bool is not a size."""
    try:
        return None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        return None
