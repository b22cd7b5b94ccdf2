"""OneFlow's eight memory planning algorithms: an order plus a placement rule (seed 004).

``pyflow.compiler.memory`` is the entry point (``plan_memory(requests, algorithm=...)``, its
docstring's table names the orders and the two rules); this module holds OneFlow's
``MemReusedAlgorithmAllocateByOrder``: sort one device's regsts by an order, then drop each one
into the mem block by first fit or by OneFlow's compact insert.  Its inputs are numpy arrays over
one device's regsts: ``size`` (aligned bytes) and the lifetime ``[start, end)``.  pyflow's ninth
algorithm, ``bottom_up``, is ``memory_bottom_up.py``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["placement_order", "place_in_order"]


def placement_order(name: str, size, start, end, ids) -> np.ndarray:
    """Indices of the regsts in the order ``name`` places them (np.lexsort: last key first)."""
    life = end - start
    keys = {"mem_size_first": (ids, start, -size),
            "lifetime_first": (ids, start, -life),
            "time_line": (ids, -end, -start),
            "mem_volume_first": (ids, -size, -(size * life))}[name]
    return np.lexsort(keys)


def _first_fit(lo, hi, z: int) -> int:
    """Lowest offset for ``z`` bytes among conflicting regsts ``[lo, hi)`` sorted by ``lo``."""
    if not lo.size or lo[0] >= z:
        return 0  # the room below the lowest conflicting regst is enough
    heads = np.maximum.accumulate(hi)  # heads[k]: the highest top among regsts 0..k
    room = lo[1:] - heads[:-1]  # room[k]: the free bytes between regst k + 1 and all below it
    fits = np.flatnonzero(room >= z)
    return int(heads[fits[0]]) if fits.size else int(heads[-1])


def _compact_fit(lo, hi, z: int, block: int) -> tuple[int, int, int]:
    """OneFlow's compact insert: ``(offset, gap end, bytes to push up)`` for ``z`` bytes.

    The candidate gaps are those between conflicting regsts plus the one from the highest
    of them to the block's top.  A gap that fits leaving the least room wins; if none fits,
    the biggest one does and everything at or above its end moves up by what is missing.
    """
    heads = np.concatenate(([0], np.maximum.accumulate(hi)))
    gap_ends = np.append(lo, max(block, int(heads[-1])))
    room = gap_ends - heads
    real = room > 0
    real[-1] = True  # the top gap counts even when empty (then the regst goes on top)
    leftover = np.where(real, room - z, np.iinfo(np.int64).min)
    fits = leftover >= 0
    k = int(np.where(fits, leftover, np.iinfo(np.int64).max).argmin()) if fits.any() else int(leftover.argmax())
    return int(heads[k]), int(gap_ends[k]), max(0, -int(leftover[k]))


def place_in_order(size, start, end, order, compact: bool, give_up_at: int | None = None):
    """Offsets (indexed like ``size``) and the block size, placing regsts one by one in ``order``.

    The regsts placed so far are kept sorted by offset in the columns of ``placed``:
    offset, top (offset + size), start, end, and which regst it is.  A block only grows,
    so once it reaches ``give_up_at`` (the best block another algorithm found) this one
    cannot win: it stops and returns None.
    """
    placed = np.empty((5, len(order)), np.int64)
    OFF, TOP, START, END, WHO = range(5)
    count = block = 0
    for i in order.tolist():
        z, s, e = int(size[i]), int(start[i]), int(end[i])
        rows = placed[:, :count]
        live = (rows[START] < e) & (rows[END] > s)  # the placed regsts this one conflicts with
        lo, hi = rows[OFF].compress(live), rows[TOP].compress(live)
        if compact:
            x, gap_end, push = _compact_fit(lo, hi, z, block)
            if push:
                above = int(np.searchsorted(rows[OFF], gap_end, side="left"))
                placed[OFF:TOP + 1, above:count] += push
                # OneFlow adds `push` to its block even when nothing pushed was at the top;
                # here the block stays the highest top, as everywhere else.
                block = int(placed[TOP, :count].max(initial=0))
        else:
            x = _first_fit(lo, hi, z)
        block = max(block, x + z)
        if give_up_at is not None and block >= give_up_at:
            return None
        at = int(np.searchsorted(placed[OFF, :count], x, side="right"))
        placed[:, at + 1:count + 1] = placed[:, at:count]  # numpy copies overlapping slices safely
        placed[:, at] = (x, x + z, s, e, i)
        count += 1
    offsets = np.zeros(len(size), np.int64)
    offsets[placed[WHO, :count]] = placed[OFF, :count]
    return offsets, block

