"""Specification of the caching allocator (pyflow/device/allocator.py, OneFlow's BinAllocator).

The allocator runs on a fake backend that hands out fake addresses (no memory is
touched), so multi-GiB requests are cheap.  Random operation sequences are replayed
step by step; each property test checks one property after every step.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyflow.device.allocator import (
    NUM_BINS,
    Allocation,
    AllocatorStats,
    CachingAllocator,
    MiB,
    bin_num,
    bin_size,
    growth_size,
    round_up,
)
from pyflow.errors import (
    AllocationError,
    DoubleFreeError,
    InvalidFreeError,
    OutOfMemoryError,
)

# --- a fake device -------------------------------------------------------------------


class FakeDeviceOOM(MemoryError):
    """What a real backend might raise: some MemoryError subclass."""


@dataclass(frozen=True, eq=False)
class FakeRaw:
    ptr: int
    nbytes: int


class FakeBackend:
    """Increasing 4 KiB-aligned addresses from 0x10000 with gaps; a device ``limit``.

    ``fail_next`` makes the next n ``alloc`` calls raise, whatever the limit.
    """

    def __init__(self, limit: int | None = None):
        self.limit = limit
        self.fail_next = 0
        self.next_ptr = 0x10000
        self.live: dict[int, FakeRaw] = {}
        self.num_allocs = self.num_frees = self.num_refused = 0

    @property
    def live_bytes(self) -> int:
        return sum(raw.nbytes for raw in self.live.values())

    def alloc(self, nbytes: int) -> FakeRaw:
        if self.fail_next > 0 or (self.limit is not None and self.live_bytes + nbytes > self.limit):
            self.fail_next = max(0, self.fail_next - 1)
            self.num_refused += 1
            raise FakeDeviceOOM(f"fake device: cannot allocate {nbytes} bytes")
        raw = FakeRaw(self.next_ptr, nbytes)
        self.next_ptr = round_up(self.next_ptr + nbytes + 0x3000, 0x1000)  # leave a gap
        self.live[raw.ptr] = raw
        self.num_allocs += 1
        return raw

    def free(self, raw: FakeRaw) -> None:
        assert self.live.pop(raw.ptr) is raw, "freed a block the backend does not hold"
        self.num_frees += 1


def make(capacity=None, limit=None, device="cuda:0"):
    backend = FakeBackend(limit)
    return CachingAllocator(backend, device=device, capacity=capacity), backend


# --- random operation sequences --------------------------------------------------------

sizes = st.one_of(
    st.integers(0, 4096),
    st.integers(0, 4 * MiB),
    st.integers(0, 48 * MiB),
    st.sampled_from([1, 511, 512, 513, MiB - 1, MiB, 10 * MiB - 1, 10 * MiB, 300 * MiB]),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), sizes),
        st.tuples(st.just("free"), st.integers(0, 1000)),
        st.tuples(st.just("shrink"), st.just(0)),
    ),
    max_size=50,
)


@dataclass
class Step:
    op: str
    result: object  # Allocation, OutOfMemoryError, bytes returned by shrink, or None
    blocks_before: dict  # the backend's live blocks before the op
    live_before: list


def replay(allocator, backend, ops):
    """Run ``ops``, yielding a Step after each; ``live`` holds the live allocations."""
    live: list[Allocation] = []
    for kind, arg in ops:
        blocks_before, live_before = dict(backend.live), list(live)
        result = None
        if kind == "alloc":
            try:
                result = allocator.allocate(arg)
                live.append(result)
            except OutOfMemoryError as error:
                result = error
        elif kind == "free" and live:
            allocator.deallocate(live.pop(arg % len(live)).ptr)
        elif kind == "shrink":
            result = allocator.shrink()
        yield Step(kind, result, blocks_before, live_before), live


def holds_live(raw, live) -> bool:
    return any(a.raw is raw for a in live if a.size)


# --- properties over random sequences ----------------------------------------------------


@given(ops=operations)
def test_live_allocations_are_aligned_disjoint_and_inside_live_blocks(ops):
    allocator, backend = make()
    for step, live in replay(allocator, backend, ops):
        spans = sorted((a.ptr, a.ptr + a.size) for a in live if a.size)
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
        for a in live:
            assert a.size == round_up(a.requested, 512)
            if a.size == 0:
                assert (a.ptr, a.raw, a.offset) == (0, None, 0)
                continue
            assert a.ptr % 512 == 0 and a.offset % 512 == 0
            assert backend.live.get(a.raw.ptr) is a.raw
            assert a.offset == a.ptr - a.raw.ptr and a.offset + a.size <= a.raw.nbytes


@given(ops=operations)
def test_stats_match_a_model_of_live_allocations_and_backend_calls(ops):
    allocator, backend = make()
    peak = 0
    for step, live in replay(allocator, backend, ops):
        in_use = sum(a.size for a in live)
        peak = max(peak, in_use)
        assert allocator.stats() == AllocatorStats(
            reserved=backend.live_bytes,
            in_use=in_use,
            peak_in_use=peak,
            cached=backend.live_bytes - in_use,
            num_backing_allocs=backend.num_allocs,
            num_backing_frees=backend.num_frees,
            num_blocks=len(backend.live),
            num_live_allocations=sum(1 for a in live if a.size),
        )


@given(ops=operations)
def test_shrink_returns_exactly_the_blocks_without_live_allocations(ops):
    allocator, backend = make()
    live = []
    for step, live in replay(allocator, backend, ops):
        if step.op == "shrink":
            idle = [raw for raw in step.blocks_before.values() if not holds_live(raw, live)]
            assert step.result == sum(raw.nbytes for raw in idle)
            assert set(backend.live) == set(step.blocks_before) - {raw.ptr for raw in idle}
    for a in live:
        allocator.deallocate(a.ptr)
    allocator.shrink()
    assert allocator.stats().reserved == 0 and allocator.stats().num_blocks == 0
    assert backend.live == {}


@given(ops=operations)
def test_pieces_tile_their_blocks_and_free_neighbours_are_always_merged(ops):
    allocator, backend = make()
    for step, live in replay(allocator, backend, ops):
        pieces = allocator.pieces()
        assert {p.block_ptr for p in pieces} == set(backend.live)
        for raw in backend.live.values():
            mine = [p for p in pieces if p.block_ptr == raw.ptr]
            assert [p.ptr for p in mine] == list(np.cumsum([raw.ptr] + [p.size for p in mine[:-1]]))
            assert sum(p.size for p in mine) == raw.nbytes
            assert not any(a.is_free and b.is_free for a, b in zip(mine, mine[1:]))
        for p in pieces:
            assert p.bin_num == (bin_num(p.size) if p.is_free else None)


@given(ops=operations, capacity=st.integers(0, 64 * MiB))
def test_out_of_memory_only_when_the_capacity_is_truly_exceeded(ops, capacity):
    allocator, backend = make(capacity=capacity)
    for step, live in replay(allocator, backend, ops):
        stats = allocator.stats()
        assert stats.reserved <= capacity
        if isinstance(step.result, OutOfMemoryError):
            aligned = round_up(step.result.request, 512)
            free_sizes = [p.size for p in allocator.pieces() if p.is_free]
            assert all(size < aligned for size in free_sizes)
            assert stats.reserved + aligned > capacity
            assert step.result.stats == stats
            # still usable: a small request succeeds whenever anything could hold it
            if free_sizes or stats.reserved + 512 <= capacity:
                allocator.deallocate(allocator.allocate(1).ptr)


# --- growth, shrink-and-retry, OOM reports --------------------------------------------------


def test_growth_size_follows_oneflow_chunks():
    assert growth_size(512) == growth_size(MiB - 512) == 2 * MiB
    assert growth_size(MiB) == growth_size(10 * MiB - 512) == 20 * MiB
    assert growth_size(10 * MiB) == 10 * MiB
    assert growth_size(10 * MiB + 512) == 12 * MiB


def test_growth_shrinks_to_the_request_when_the_chunk_would_pass_the_capacity():
    allocator, backend = make(capacity=3 * MiB)
    a = allocator.allocate(MiB)  # OneFlow would buy 20 MiB
    assert [raw.nbytes for raw in backend.live.values()] == [MiB]
    assert a.size == MiB and allocator.stats().reserved == MiB


def test_backend_memory_error_returns_cached_blocks_and_retries():
    allocator, backend = make(limit=4 * MiB)
    allocator.deallocate(allocator.allocate(512).ptr)  # a cached, fully free 2 MiB block
    cached_block = next(iter(backend.live))
    a = allocator.allocate(3 * MiB)  # 20 MiB and 3 MiB fail next to it; shrink; retry
    assert cached_block not in backend.live
    assert [raw.nbytes for raw in backend.live.values()] == [3 * MiB]
    assert a.size == 3 * MiB and backend.num_frees == 1
    assert allocator.stats().num_backing_frees == 1 and allocator.stats().reserved == 3 * MiB


def test_transient_backend_failure_is_retried_after_shrink():
    allocator, backend = make()
    backend.fail_next = 2  # the 2 MiB chunk and the bare request both fail once
    a = allocator.allocate(512)
    assert a.size == 512 and backend.num_refused == 2 and allocator.stats().reserved == 2 * MiB


def test_out_of_memory_error_names_request_device_and_stats():
    allocator, backend = make(limit=4 * MiB, device="cuda:1")
    keep = allocator.allocate(MiB)
    with pytest.raises(OutOfMemoryError) as info:
        allocator.allocate(5 * MiB)
    error = info.value
    assert isinstance(error, MemoryError)
    assert error.request == 5 * MiB and error.device == "cuda:1"
    assert error.stats == allocator.stats() and error.stats.in_use == MiB
    for text in ("cuda:1", str(5 * MiB), "5.0 MiB", "reserved", "in use"):
        assert text in str(error)
    allocator.deallocate(keep.ptr)
    assert allocator.allocate(3 * MiB).size == 3 * MiB  # usable after the OOM


def test_lowering_the_capacity_returns_cached_blocks():
    allocator, backend = make()
    allocator.deallocate(allocator.allocate(512).ptr)
    assert allocator.stats().reserved == 2 * MiB
    allocator.capacity = MiB
    assert allocator.capacity == MiB and allocator.stats().reserved == 0
    with pytest.raises(OutOfMemoryError):
        allocator.allocate(MiB + 1)


# --- bins, split and merge, by example ----------------------------------------------------


@given(size=st.integers(0, 1 << 40))
def test_bin_num_puts_a_size_between_its_bin_size_and_the_next(size):
    num = bin_num(size)
    assert 0 <= num < NUM_BINS
    assert bin_size(num) <= max(size, 512)
    assert num == NUM_BINS - 1 or max(size, 512) < bin_size(num + 1)


def test_bin_num_examples():
    examples = (0, 512, 1023, 1024, 2 * MiB - 512, 2 * MiB)
    assert [bin_num(s) for s in examples] == [0, 0, 0, 1, 11, 12]
    # 512 << 19 is 256 MiB: the last bin starts there (and has no upper end)
    assert bin_num(256 * MiB - 1) == 18 and bin_num(256 * MiB) == bin_num(4 << 30) == 19


def layout(allocator):
    """[(offset from the first block, size, free?)] of every piece."""
    pieces = allocator.pieces()
    return [(p.ptr - pieces[0].block_ptr, p.size, p.is_free) for p in pieces]


def test_allocating_512_from_a_fresh_block_leaves_one_free_remainder():
    allocator, backend = make()
    a = allocator.allocate(512)
    assert layout(allocator) == [(0, 512, False), (512, 2 * MiB - 512, True)]
    assert a.offset == 0 and a.raw is next(iter(backend.live.values()))
    assert [p.bin_num for p in allocator.pieces()] == [None, 11]


def test_freeing_neighbours_merges_back_into_one_piece():
    allocator, _ = make()
    a, b, c = (allocator.allocate(512) for _ in range(3))
    allocator.deallocate(b.ptr)  # a and c are used: b stays alone
    assert layout(allocator) == [(0, 512, False), (512, 512, True), (1024, 512, False),
                                 (1536, 2 * MiB - 1536, True)]
    allocator.deallocate(a.ptr)  # a merges with its free next, b
    assert layout(allocator)[:2] == [(0, 1024, True), (1024, 512, False)]
    allocator.deallocate(c.ptr)  # c merges with both neighbours
    assert layout(allocator) == [(0, 2 * MiB, True)]
    assert allocator.pieces()[0].bin_num == 12


def test_find_takes_the_smallest_fitting_piece_then_the_lowest_address():
    allocator, _ = make()
    a, _b, c, _d, e, _f = (allocator.allocate(n) for n in (1024, 512, 512, 512, 512, 512))
    for x in (a, c, e):
        allocator.deallocate(x.ptr)  # free pieces: 1024 at 0, 512 at 1536, 512 at 2560
    assert allocator.allocate(512).ptr == c.ptr  # bin 0 before bin 1, lowest ptr first
    assert allocator.allocate(512).ptr == e.ptr
    assert allocator.allocate(512).ptr == a.ptr  # 1024 >= 2 * 512: split
    assert layout(allocator)[:2] == [(0, 512, False), (512, 512, True)]


def test_a_piece_under_twice_the_request_is_not_split():
    allocator, _ = make()
    a, _b = allocator.allocate(1536), allocator.allocate(512)
    allocator.deallocate(a.ptr)
    again = allocator.allocate(1024)  # 1536 < 2 * 1024: the whole piece is used
    assert again.ptr == a.ptr and again.size == 1024
    assert layout(allocator)[0] == (0, 1536, False)
    assert allocator.stats().in_use == 1024 + 512


def test_a_rest_of_128_mib_is_split_even_under_twice_the_request():
    allocator, _ = make()
    allocator.deallocate(allocator.allocate(300 * MiB).ptr)
    allocator.allocate(160 * MiB)
    assert layout(allocator) == [(0, 160 * MiB, False), (160 * MiB, 140 * MiB, True)]


def test_alignment_is_configurable_and_must_be_a_power_of_two():
    allocator = CachingAllocator(FakeBackend(), alignment=4096)
    assert allocator.allocate(1).size == 4096 and allocator.allocate(4097).size == 8192
    for bad in (0, 3, 768, -512, 512.0):
        with pytest.raises(AllocationError, match="alignment"):
            CachingAllocator(FakeBackend(), alignment=bad)


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("nbytes", [-1, 1.5, 2.0, "12", None, True])
def test_bad_sizes_raise_allocation_error(nbytes):
    allocator, _ = make()
    with pytest.raises(AllocationError, match="cuda:0"):
        allocator.allocate(nbytes)


@pytest.mark.parametrize("capacity", [-1, 1.5, "1 GiB"])
def test_bad_capacities_raise_allocation_error(capacity):
    with pytest.raises(AllocationError, match="capacity"):
        make(capacity=capacity)
    allocator, _ = make()
    with pytest.raises(AllocationError, match="capacity"):
        allocator.capacity = capacity
    assert allocator.capacity is None


def test_numpy_integer_sizes_are_accepted():
    allocator, _ = make()
    a = allocator.allocate(np.int64(100))
    assert a.size == 512 and a.requested == 100
    allocator.deallocate(np.int64(a.ptr))


def test_zero_size_allocation_has_no_block_and_freeing_it_is_a_no_op():
    allocator, backend = make()
    a = allocator.allocate(0)
    assert (a.ptr, a.size, a.requested, a.raw, a.offset) == (0, 0, 0, None, 0)
    allocator.deallocate(0)
    allocator.deallocate(a.ptr)
    assert backend.num_allocs == 0 and allocator.stats().num_live_allocations == 0


def test_freeing_an_unknown_pointer_raises_invalid_free():
    allocator, _ = make()
    allocator.allocate(512)
    with pytest.raises(InvalidFreeError, match="0xdead000") as info:
        allocator.deallocate(0xDEAD000)
    assert not isinstance(info.value, DoubleFreeError)
    for bad in (-512, "0x10000", 1.0):
        with pytest.raises(InvalidFreeError):
            allocator.deallocate(bad)


def test_freeing_an_interior_pointer_raises_invalid_free():
    allocator, _ = make()
    a = allocator.allocate(1024)
    with pytest.raises(InvalidFreeError, match=f"{a.ptr + 512:#x}.*inside") as info:
        allocator.deallocate(a.ptr + 512)
    assert not isinstance(info.value, DoubleFreeError)
    allocator.deallocate(a.ptr)  # the allocation itself is untouched


def test_double_free_raises_double_free_error_even_after_merging():
    allocator, _ = make()
    a, b, _c = (allocator.allocate(512) for _ in range(3))
    allocator.deallocate(b.ptr)
    with pytest.raises(DoubleFreeError, match=f"{b.ptr:#x}"):
        allocator.deallocate(b.ptr)
    allocator.deallocate(a.ptr)  # b's piece merges into a's
    for ptr in (a.ptr, b.ptr):
        with pytest.raises(DoubleFreeError, match="cuda:0"):
            allocator.deallocate(ptr)
    first_half = allocator.allocate(512)  # a again; the split-off rest still holds b
    assert first_half.ptr == a.ptr
    with pytest.raises(DoubleFreeError):
        allocator.deallocate(b.ptr)
    allocator.deallocate(first_half.ptr)
    reused = allocator.allocate(1024)  # covers a and b again: b is now interior
    assert reused.ptr == a.ptr
    with pytest.raises(InvalidFreeError) as info:
        allocator.deallocate(b.ptr)
    assert not isinstance(info.value, DoubleFreeError)


def test_freeing_into_a_returned_block_raises_invalid_free():
    allocator, _ = make()
    a = allocator.allocate(512)
    allocator.deallocate(a.ptr)
    allocator.shrink()
    with pytest.raises(InvalidFreeError, match="never handed out"):
        allocator.deallocate(a.ptr)


# --- threads and the student view ---------------------------------------------------------


def test_concurrent_allocate_and_free_keep_the_stats_consistent():
    allocator, backend = make()

    def worker(seed):
        rng, mine = random.Random(seed), []
        for _ in range(300):
            if mine and rng.random() < 0.5:
                allocator.deallocate(mine.pop(rng.randrange(len(mine))).ptr)
            else:
                mine.append(allocator.allocate(rng.randrange(1, 3 * MiB)))
        for a in mine:
            allocator.deallocate(a.ptr)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = allocator.stats()
    assert stats.in_use == 0 and stats.num_live_allocations == 0
    assert stats.reserved == backend.live_bytes == stats.cached
    assert allocator.shrink() == stats.reserved and backend.live == {}


def test_describe_lists_blocks_and_pieces():
    allocator, _ = make()
    allocator.allocate(512)
    text = allocator.describe()
    assert "cuda:0" in text and "block 0x10000" in text
    assert "used" in text and "free  bin 11" in text and str(2 * MiB - 512) in text
