"""The ``bottom_up`` memory planning algorithm: fill the mem block from offset 0 upwards (seed 004).

``pyflow.compiler.memory`` is the entry point (``plan_memory(requests, algorithm="bottom_up")``);
this module holds the algorithm.  Its inputs are numpy arrays over one device's regsts: ``size``
(aligned bytes, all > 0) and the lifetime ``[start, end)``.

**The decoder.**  OneFlow's algorithms take the regsts in a fixed order and drop each one into
the lowest gap the regsts before it left.  ``bottom_up`` fills the block from the bottom instead,
the way sand settles (the "canonical" solutions of Sekiyama et al. 2018's best-fit heuristic and
of Moffitt 2023's MiniMalloc search)::

    low[r] = the lowest offset above every placed regst alive at the same time as r
             (0 at first; it only grows)
    repeat: place the unplaced regst with the smallest  low[r] + bias[r]  at offset low[r]
            (ties: the better priority), then raise low[] of the unplaced regsts alive at
            the same time to the new regst's top

A regst always sits above every placed regst it meets, so the plan is valid whatever the
priorities are.  With ``bias = 0`` the offsets are placed in non-decreasing order: the block is
finished from the bottom up and the priorities only break ties (which are frequent: every regst
resting on the same regst ties).  A small ``bias`` (``lam x bound x rank / n``: ``lam`` 0.01-0.05)
lets a high-priority regst go first even when another could sit a little lower; on 10,000-op
graphs it often helps.

**The priorities.**  The key one is a regst's *pressure*: the most bytes alive at any moment of
its lifetime (MiniMalloc's "total", TFLite's "breadth").  Regsts that live through the peak must
pack without gaps; the others have room to spare.  A score ranks the regsts (highest first)::

    W x log(pressure / bound) + (log size + log lifetime) / 2      pressure, then area

and ``bottom_up`` first decodes (W, lam) = (20, 0), (20, 0.03) and (5, 0).

**The local search.**  Then it improves the best plan.  Each step either draws a new ``lam``
(one step in five) or takes a regst whose top is the block's top, a moment of its life (half
the time the moment with the most bytes alive), a window of time around it, and adds random
noise to the scores of the regsts alive in that window.  It decodes again and keeps the new plan
if its block is no larger (equal blocks are kept too, so the walk goes along plateaus; a decode
is abandoned as soon as its block grows past the current one).  After ``patience`` decodes
without a smaller block the walk starts again from the next starting plan (``chains`` walks at
most).  The search stops at the lower bound or after ``max_decodes`` decodes.  The noise comes
from a generator with a fixed seed: the same requests give the same plan.

Cost: the pairs of regsts alive together are listed once (``_alive_together``); a decode is then
a few numpy operations per regst, about 0.005 s for 1,000 and 0.06 s for 10,000 branchy regsts
on a 2-core CPU.  At most 200 decodes, 2n for n regsts, and 200,000 / n: 10,000 regsts take
about 1.3 s, 1,000 about 0.8 s when the bound is out of reach (benchmarks/bench_memory_plan.py).
"""

from __future__ import annotations

import numpy as np

__all__ = ["plan_bottom_up", "pressure"]

_PLACED = np.iinfo(np.int64).max
_MAX_PAIRS = 4_000_000  # more pairs of regsts alive together than this: no lists, scan the arrays


def pressure(size, start, end) -> tuple[np.ndarray, np.ndarray]:
    """Per regst, the most bytes alive at one moment of its lifetime, and that moment.

    >>> pressure(np.array([4, 2, 8]), np.array([0, 1, 3]), np.array([2, 4, 4]))
    (array([ 6, 10, 10]), array([1, 3, 3]))
    """
    delta = np.zeros(int(end.max(initial=0)) + 1, np.int64)
    np.add.at(delta, start, size)
    np.add.at(delta, end, -size)
    live = np.cumsum(delta)
    moments = np.array([s + int(live[s:e].argmax()) for s, e in zip(start.tolist(), end.tolist())], np.int64)
    return live[moments], moments


def _alive_together(start, end):
    """A function: regst k -> the indices of the regsts whose lifetime meets k's (maybe k too).

    The lists are built once (O(n^2) vector work) when they are small enough; otherwise every
    call scans the arrays.
    """
    by_start = np.argsort(start, kind="stable")
    starts, ends = start[by_start], end[by_start]
    born_before_end = np.searchsorted(starts, end, side="left")
    pairs = int((born_before_end - np.searchsorted(np.sort(end), start, side="right")).sum())
    if pairs > _MAX_PAIRS:
        return lambda k: np.flatnonzero((start < end[k]) & (end > start[k]))
    lists = [by_start[:hi][ends[:hi] > s] for hi, s in zip(born_before_end.tolist(), start.tolist())]
    bounds = np.concatenate(([0], np.cumsum([len(found) for found in lists])))
    flat = np.concatenate(lists)
    return lambda k: flat[bounds[k]:bounds[k + 1]]


def _decode(size, rank, alive_with, bias, give_up_at=None):
    """Offsets and block size from filling bottom-up; ``rank`` breaks ties (lower goes first).

    Returns None as soon as the block reaches ``give_up_at``: a block only grows.
    """
    n = len(size)
    sizes = size.tolist()
    offsets = np.zeros(n, np.int64)
    low = np.zeros(n, np.int64)
    after = bias * n + rank
    key = after.copy()  # (low + bias) * n + rank = low * n + after: the smallest is placed next
    block = 0
    for _ in range(n):
        k = int(key.argmin())
        x = int(low[k])
        top = x + sizes[k]
        if top > block:
            block = top
            if give_up_at is not None and block >= give_up_at:
                return None
        offsets[k] = x
        key[k] = low[k] = _PLACED
        near = alive_with(k)
        raised = near[low[near] < top]
        low[raised] = top
        key[raised] = after[raised] + top * n
    return offsets, block


def plan_bottom_up(size, start, end, bound: int, *, max_decodes: int | None = None,
                   patience: int = 64, chains: int = 3, seed: int = 2018):
    """The best plan found: ``(offsets, block)`` for regsts of ``size`` bytes (> 0) alive over
    ``[start, end)``; ``bound`` is their lower bound (the search stops if it gets there).
    """
    n = len(size)
    if max_decodes is None:
        max_decodes = max(8, min(200, 2 * n, 200_000 // n))
    peak, moment = pressure(size, start, end)
    log_pressure = np.log(peak / bound)
    log_area = (np.log(size) + np.log(end - start)) / 2
    alive_with = _alive_together(start, end)

    def decode(score, lam, give_up_at=None):
        order = np.argsort(-score, kind="stable")
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n)
        return _decode(size, rank, alive_with, rank * int(lam * bound) // n, give_up_at)

    starts = []  # plans as (block, offsets, score, lam)
    for weight, lam in ((20, 0.0), (20, 0.03), (5, 0.0)):
        score = weight * log_pressure + log_area
        offsets, block = decode(score, lam)
        if block <= bound:
            return offsets, block
        starts.append((block, offsets, score, lam))
    starts.sort(key=lambda plan: plan[0])
    best, decodes = starts[0], len(starts)

    rng = np.random.default_rng(seed)
    window = 2 * int(np.median(end - start)) + 2
    for chain in range(chains):  # each chain walks from one of the starting plans
        current, since_better = starts[chain % len(starts)], 0
        while since_better < patience and decodes < max_decodes and best[0] > bound:
            block, offsets, score, lam = current
            if rng.random() < 0.2:
                lam = float(rng.choice([0.0, 0.01, 0.03, 0.05]))
            else:
                c = int(rng.choice(np.flatnonzero(offsets + size == block)))  # a regst at the top
                at = int(moment[c]) if rng.random() < 0.5 else int(rng.integers(start[c], end[c]))
                half = int(rng.integers(1, window))
                near = np.flatnonzero((start < at + half) & (end > at - half))
                score = score.copy()
                score[near] += rng.normal(0.0, rng.choice([0.1, 0.5, 2.0]), len(near))
            decoded = decode(score, lam, give_up_at=block + 1)  # equal blocks are kept
            decodes += 1
            since_better += 1
            if decoded is not None:
                if decoded[1] < block:
                    since_better = 0
                current = (decoded[1], decoded[0], score, lam)
                best = min(best, current, key=lambda plan: plan[0])
    return best[1], best[0]
