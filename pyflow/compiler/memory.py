"""The compiler's memory planner: one mem block per device, shared by regsts that never meet (seed 004).

OneFlow plans device memory at compile time (``oneflow/core/job/intra_job_mem_sharing_util.cpp``,
SEMANTICS.md §5).  The tasks of one device are ordered in a chain.  A reusable regst (a
register with regst num 1: the memory one op's output lives in) is born when its producer
runs and dies after its last consumer ran, so it is alive over the half-open interval::

    [start, end) = [producer's position, last consumer's position + 1)

Two regsts *conflict* when their lifetimes intersect (``a.start < b.end and b.start < a.end``,
OneFlow's ``IsLifetimeExcluded``).  The planner gives every regst an offset inside its
device's mem block so that conflicting regsts never overlap; the block's size is the
highest end offset.  No plan can beat the **lower bound**: the most bytes ever alive at
one moment.  OneFlow's ViT plan came within 0.23% of it.

Every algorithm is an *order* plus a *placement rule* (OneFlow's
``MemReusedAlgorithmAllocateByOrder``, in ``pyflow/compiler/memory_by_order.py``)::

    order              who goes first                        ties
    mem_size_first     the largest regst (OneFlow's default)  earlier start
    lifetime_first     the longest-lived regst                earlier start
    time_line          the latest-born regst (the timeline,   later end
                       walked backwards, as OneFlow sorts it)
    mem_volume_first   the largest size x lifetime            larger size

    first fit          the lowest offset where the regst overlaps no conflicting regst
                       placed before it (OneFlow's non-compact insert)
    "+compact"         the gap between conflicting regsts that fits best (least room left
                       over); if none is big enough, the biggest gap is widened by pushing
                       every regst above it up (OneFlow's compact insert)

pyflow adds a ninth algorithm, not OneFlow's (``pyflow/compiler/memory_bottom_up.py``)::

    bottom_up          fill the block from offset 0 up: again and again, place the regst that
                       can sit lowest (above every placed regst it meets; ties: a priority
                       that favours regsts alive at the peak, then large size x lifetime);
                       then a seeded local search that perturbs those priorities around the
                       block's top and fills again, keeping no-larger blocks

OneFlow's eight miss the lower bound by 2-9% on the benchmark's random branchy DAGs of
1,000-10,000 ops; bottom_up comes within 1% (benchmarks/results/memory_plan_cpu.txt).

``algorithm="best"`` runs all nine and keeps, per device, the smallest block (ties: the first
in ``ALGORITHMS``), as OneFlow does with its eight when its job conf switches them all on (its
default is mem_size_first with first fit alone; it runs them on a thread pool).  pyflow runs
them one after another, stops as soon as a block reaches the lower bound, and abandons one of
OneFlow's as soon as its block reaches the best one so far (bottom_up always runs its whole
search, so its plan is the same alone or inside best).  Sizes are rounded up to ``alignment``
bytes first, so every offset is aligned too.

Cost: placing one regst is a few numpy passes over the regsts placed before it (kept sorted
by offset), so O(n) vector work per regst and O(n^2) in all, with a small constant: 10,000
regsts take about 0.2-0.4 s per OneFlow algorithm on a 2-core CPU, and 1-2 s for bottom_up's
search (benchmarks/bench_memory_plan.py).

Not here: inplace regsts (OneFlow gives a consumer's regst its input's offset and stretches
the input's lifetime), OneFlow's optional compression pass (``MemoryShareStrategy``,
``enable_compress_memory``: moving one regst rescans all n regsts for each regst it meets,
too slow in Python for 10,000 regsts; bottom_up's search plays its part) and chunks (the mem
blocks of one device packed together).

>>> reqs = [MemRequest(0, "cuda:0", 1024, 0, 2), MemRequest(1, "cuda:0", 512, 1, 3),
...         MemRequest(2, "cuda:0", 1000, 2, 4)]
>>> plan = plan_memory(reqs)
>>> plan.offsets, plan.block_sizes, lower_bound(reqs)
({0: 0, 1: 1024, 2: 0}, {'cuda:0': 1536}, {'cuda:0': 1536})
>>> plan.check()   # raises MemoryPlanError if two live regsts overlapped

Four regsts on which all eight of OneFlow's algorithms waste 512 bytes (mem_size_first, for
one, puts both big regsts at offset 0, so the two small ones, alive together at position 2,
stack on top of them).  bottom_up reaches the bound: one small regst goes under a big one, the
other on top of the other big one:

>>> hard = [MemRequest(0, "cuda:0", 2048, 3, 4), MemRequest(1, "cuda:0", 512, 2, 5),
...         MemRequest(2, "cuda:0", 2048, 1, 2), MemRequest(3, "cuda:0", 512, 0, 3)]
>>> min(plan_memory(hard, algorithm=name).block_sizes["cuda:0"] for name in ALGORITHMS[:8])
3072
>>> plan = plan_memory(hard)
>>> plan.algorithms, plan.block_sizes, lower_bound(hard), plan.offsets
({'cuda:0': 'bottom_up'}, {'cuda:0': 2560}, {'cuda:0': 2560}, {0: 0, 1: 2048, 2: 512, 3: 0})
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
from collections import defaultdict

import numpy as np

from pyflow.compiler.memory_bottom_up import plan_bottom_up
from pyflow.compiler.memory_by_order import place_in_order, placement_order
from pyflow.errors import ArgumentTypeError, PyflowError

__all__ = ["ALGORITHMS", "ORDERS", "MemRequest", "MemoryPlan", "MemoryPlanError", "draw",
           "lower_bound", "plan_memory", "requests_for_chain"]

ORDERS = ("mem_size_first", "lifetime_first", "time_line", "mem_volume_first")
# Every algorithm "best" tries, OneFlow's default first (it wins ties), pyflow's bottom_up last.
ALGORITHMS = ORDERS + tuple(f"{order}+compact" for order in ORDERS) + ("bottom_up",)


class MemoryPlanError(PyflowError, ValueError):
    """A memory request the planner cannot take, or a plan in which two live regsts overlap."""


@dataclasses.dataclass(frozen=True)
class MemRequest:
    """One regst's memory need: ``size`` bytes alive over ``[start, end)`` of ``device``'s chain."""

    regst_id: int
    device: str  # the mem chain it belongs to, e.g. "rank0/cuda:0"
    size: int  # bytes, before rounding up to the planner's alignment
    start: int  # the producer's position in the chain
    end: int  # the last consumer's position + 1 (exclusive)

    def __post_init__(self):
        for name in ("regst_id", "size", "start", "end"):
            value = getattr(self, name)
            if isinstance(value, bool) or not hasattr(value, "__index__"):
                raise ArgumentTypeError(f"MemRequest.{name} must be an int, got {value!r}")
            object.__setattr__(self, name, operator.index(value))  # numpy ints -> int
        if not isinstance(self.device, str) or not self.device:
            raise ArgumentTypeError(f"MemRequest.device must be a non-empty str, got {self.device!r}")
        if self.size < 0:
            raise MemoryPlanError(f"regst {self.regst_id}: size {self.size} is negative")
        if self.start < 0:
            raise MemoryPlanError(f"regst {self.regst_id}: start {self.start} is negative")
        if self.end <= self.start:
            raise MemoryPlanError(
                f"regst {self.regst_id}: lifetime [{self.start}, {self.end}) is empty; a regst lives "
                "from its producer's position to its last consumer's position + 1, so end > start")


def requests_for_chain(device: str, sizes, consumers, first_id: int = 0) -> list[MemRequest]:
    """The requests of a chain: task ``i`` produces ``sizes[i]`` bytes read by tasks ``consumers[i]``.

    A regst nobody reads still lives while its producer runs: ``[i, i + 1)``.

    >>> [(r.regst_id, r.start, r.end) for r in requests_for_chain("cuda:0", [8, 8, 8], [[1, 2], [], []])]
    [(0, 0, 3), (1, 1, 2), (2, 2, 3)]
    """
    if len(sizes) != len(consumers):
        raise MemoryPlanError(f"{len(sizes)} sizes but {len(consumers)} consumer lists: one of each per task")
    requests = []
    for i, (size, readers) in enumerate(zip(sizes, consumers)):
        if any(r <= i for r in readers):
            raise MemoryPlanError(f"task {i}'s output is read by task(s) {sorted(readers)}: a consumer "
                                  "must come after its producer in the chain")
        requests.append(MemRequest(first_id + i, device, size, i, max(readers, default=i) + 1))
    return requests


def _aligned(size: int, alignment: int) -> int:
    return -(-size // alignment) * alignment


def _validate(requests, alignment: int) -> dict[str, list[MemRequest]]:
    """The requests grouped by device, after checking them and the alignment."""
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise MemoryPlanError(f"alignment must be a positive int, got {alignment!r}")
    by_device: dict[str, list[MemRequest]] = defaultdict(list)
    seen = set()
    for r in requests:
        if not isinstance(r, MemRequest):
            raise ArgumentTypeError(f"plan_memory takes MemRequest objects, got {r!r}")
        if r.regst_id in seen:
            raise MemoryPlanError(f"regst id {r.regst_id} is requested twice; each regst needs one id")
        seen.add(r.regst_id)
        by_device[r.device].append(r)
    return dict(sorted(by_device.items()))


def _peak(sizes, starts, ends) -> int:
    """Max over time of the bytes alive: a regst freed at t makes room for one born at t."""
    events = sorted([(e, -z) for z, e in zip(sizes, ends)] + [(s, z) for z, s in zip(sizes, starts)])
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def lower_bound(requests, *, alignment: int = 512) -> dict[str, int]:
    """Per device, the most (aligned) bytes alive at one moment: no plan's block is smaller.

    >>> lower_bound([MemRequest(0, "cuda:0", 100, 0, 2), MemRequest(1, "cuda:0", 100, 2, 3)])
    {'cuda:0': 512}
    """
    return {device: _peak([_aligned(r.size, alignment) for r in rs], [r.start for r in rs],
                          [r.end for r in rs])
            for device, rs in _validate(requests, alignment).items()}


# --- placement -----------------------------------------------------------------------------


def _bottom_up(size, start, end, sized, bound: int):
    """``bottom_up``'s offsets (indexed like ``size``; empty regsts at 0) and block size."""
    offsets = np.zeros(len(size), np.int64)
    if not sized.size:
        return offsets, 0
    offsets[sized], block = plan_bottom_up(size[sized], start[sized], end[sized], bound)
    return offsets, block


def _plan_device(requests: list[MemRequest], alignment: int, candidates) -> tuple[dict, int, str]:
    """The best of ``candidates`` for one device: (regst_id -> offset, block size, algorithm)."""
    ids = np.array([r.regst_id for r in requests], np.int64)
    size = np.array([_aligned(r.size, alignment) for r in requests], np.int64)
    start = np.array([r.start for r in requests], np.int64)
    end = np.array([r.end for r in requests], np.int64)
    sized = np.flatnonzero(size > 0)  # an empty regst takes no room: it sits at offset 0
    bound = _peak(size.tolist(), start.tolist(), end.tolist())
    best = None
    for name in candidates:
        if name == "bottom_up":
            placed = _bottom_up(size, start, end, sized, bound)
            if best is not None and placed[1] >= best[1]:
                placed = None  # ties go to the algorithm listed first
        else:
            order_name, _, insert = name.partition("+")
            order = sized[placement_order(order_name, size[sized], start[sized], end[sized], ids[sized])]
            placed = place_in_order(size, start, end, order, compact=insert == "compact",
                                    give_up_at=best[1] if best else None)
        if placed is not None:  # it beat every algorithm before it
            best = (*placed, name)
        if best[1] == bound:
            break  # optimal: nothing can beat the lower bound
    offsets, block, name = best
    return dict(zip(ids.tolist(), offsets.tolist())), block, name


def plan_memory(requests, *, alignment: int = 512, algorithm: str = "best") -> MemoryPlan:
    """Place every request in its device's mem block; see the module docstring for the algorithms.

    ``algorithm``: one of ``ALGORITHMS`` (an order, optionally with ``+compact``, or
    ``bottom_up``), or ``"best"`` to try them all and keep the smallest block per device.
    """
    if algorithm != "best" and algorithm not in ALGORITHMS:
        raise MemoryPlanError(f"unknown memory planning algorithm {algorithm!r}; choose one of "
                              f"{', '.join(ALGORITHMS)} or 'best' (try all, keep the smallest)")
    requests = tuple(requests)
    by_device = _validate(requests, alignment)
    candidates = ALGORITHMS if algorithm == "best" else (algorithm,)
    plan = MemoryPlan(requests, alignment)
    for device, rs in by_device.items():
        offsets, block, name = _plan_device(rs, alignment, candidates)
        plan.offsets.update(offsets)
        plan.block_sizes[device] = block
        plan.algorithms[device] = name
    return plan


# --- the plan ------------------------------------------------------------------------------


@dataclasses.dataclass
class MemoryPlan:
    """Where every regst lives: ``offsets[regst_id]`` inside its device's block of ``block_sizes[device]``."""

    requests: tuple[MemRequest, ...]
    alignment: int = 512
    offsets: dict[int, int] = dataclasses.field(default_factory=dict)  # regst_id -> offset
    block_sizes: dict[str, int] = dataclasses.field(default_factory=dict)  # device -> planned bytes
    algorithms: dict[str, str] = dataclasses.field(default_factory=dict)  # device -> the winner

    def size_of(self, request: MemRequest) -> int:
        """The bytes ``request`` takes in the block: its size rounded up to the alignment."""
        return _aligned(request.size, self.alignment)

    def by_device(self) -> dict[str, list[MemRequest]]:
        return _validate(self.requests, self.alignment)

    def report(self) -> list[dict]:
        """One row per device: planned bytes against the lower bound, and the winning algorithm."""
        bounds = lower_bound(self.requests, alignment=self.alignment)
        rows = []
        for device, rs in self.by_device().items():
            planned, bound = self.block_sizes[device], bounds[device]
            rows.append({"device": device, "planned_bytes": planned, "lower_bound_bytes": bound,
                         "ratio": planned / bound if bound else 1.0, "regst_num": len(rs),
                         "algorithm": self.algorithms.get(device, "")})
        return rows

    def check(self) -> None:
        """Raise MemoryPlanError unless every regst is placed, aligned, inside its block, and no two
        regsts alive at the same time overlap.

        A sweep over time keeps the live regsts sorted by offset; as they never overlap, a regst
        being born can only overlap its neighbours in that order.  O(n log n) per device.
        """
        for device, rs in self.by_device().items():
            block = self.block_sizes.get(device)
            if block is None:
                raise MemoryPlanError(f"device {device!r} has requests but no planned block size")
            for r in rs:
                offset = self.offsets.get(r.regst_id)
                if offset is None:
                    raise MemoryPlanError(f"regst {r.regst_id} on {device} was never placed")
                if offset < 0 or offset % self.alignment:
                    raise MemoryPlanError(f"regst {r.regst_id} on {device}: offset {offset} is not a "
                                          f"non-negative multiple of the alignment {self.alignment}")
                if offset + self.size_of(r) > block:
                    raise MemoryPlanError(f"regst {r.regst_id} on {device}: [{offset}, "
                                          f"{offset + self.size_of(r)}) runs past the block's {block} bytes")
            self._check_no_overlap(device, [r for r in rs if r.size > 0])

    def _check_no_overlap(self, device: str, rs: list[MemRequest]) -> None:
        events = sorted([(r.end, 0, r) for r in rs] + [(r.start, 1, r) for r in rs],
                        key=lambda ev: (ev[0], ev[1], ev[2].regst_id))  # frees before births
        live: list[tuple[int, int]] = []  # (offset, regst_id), sorted
        by_id = {r.regst_id: r for r in rs}

        def span(regst_id: int) -> tuple[int, int]:
            offset = self.offsets[regst_id]
            return offset, offset + self.size_of(by_id[regst_id])

        for _, born, r in events:
            key = (self.offsets[r.regst_id], r.regst_id)
            if not born:
                del live[bisect.bisect_left(live, key)]
                continue
            at = bisect.bisect_left(live, key)
            low, high = span(r.regst_id)
            for _, other in live[max(at - 1, 0):at + 1]:
                other_low, other_high = span(other)
                if low < other_high and other_low < high:
                    o = by_id[other]
                    raise MemoryPlanError(
                        f"{device}: regst {r.regst_id} (alive [{r.start}, {r.end}), bytes [{low}, {high})) "
                        f"overlaps regst {other} (alive [{o.start}, {o.end}), bytes [{other_low}, {other_high})) "
                        "while both are alive")
            live.insert(at, key)

    def to_dict(self) -> dict:
        """A JSON-serialisable copy: ``MemoryPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p``."""
        return {"alignment": self.alignment,
                "regsts": [{**dataclasses.asdict(r), "offset": self.offsets.get(r.regst_id)}
                           for r in self.requests],
                "block_sizes": dict(self.block_sizes), "algorithms": dict(self.algorithms)}

    @classmethod
    def from_dict(cls, d: dict) -> MemoryPlan:
        fields = ("regst_id", "device", "size", "start", "end")
        requests = tuple(MemRequest(**{f: row[f] for f in fields}) for row in d["regsts"])
        return cls(requests, d["alignment"],
                   {row["regst_id"]: row["offset"] for row in d["regsts"] if row["offset"] is not None},
                   dict(d["block_sizes"]), dict(d["algorithms"]))

    def log(self) -> str:
        """The plan as OneFlow's memory log prints it (``PlanUtil``'s memory info).

        Like OneFlow, "MiB" here is bytes / 10^6 (its ``B2MiB``), so lines compare one to one.
        alloc_order is the producer's position (``start``), free_order the last consumer's
        (``end - 1``: OneFlow's ``free_after_actor``), duration ``free - alloc + 1``.
        """
        def mib(n: int) -> str:
            return f"{n / 1e6:g}"

        by_device = self.by_device()
        lines = []
        for row in self.report():
            device = row["device"]
            lines.append(f"Device: {device} needs to allocate [ {mib(row['planned_bytes'])} MiB ] device "
                         f"memory. In general, mem block with regst_num = {row['regst_num']}, lower bound "
                         f"[ {mib(row['lower_bound_bytes'])} MiB ], planned / lower bound = "
                         f"{row['ratio']:.4f}, algorithm: {row['algorithm']}, alignment: {self.alignment}")
            ordered = sorted(by_device[device], key=lambda r: (r.start, self.offsets.get(r.regst_id, -1)))
            for order, r in enumerate(ordered):
                lines.append(f"  Order: {order} regst {r.regst_id} ,size: {mib(self.size_of(r))} MiB "
                             f"({self.size_of(r)} B) ,offset: {self.offsets.get(r.regst_id)} "
                             f",alloc_order: {r.start} ,free_order: {r.end - 1} ,duration: {r.end - r.start}")
        return "\n".join(lines)


def draw(plan: MemoryPlan, requests, device: str, ax) -> None:
    """Draw ``device``'s regsts on matplotlib axes ``ax``: time (chain position) across, offset up.

    Each regst is a box ``[start, end) x [offset, offset + size)``; the dashed line is the
    planned block size, the dotted one the lower bound.  Needs only ``ax`` (no matplotlib import).
    """
    rs = [r for r in requests if r.device == device and r.size > 0]
    sizes = [plan.size_of(r) for r in rs]
    ax.bar([r.start for r in rs], sizes, width=[r.end - r.start for r in rs],
           bottom=[plan.offsets[r.regst_id] for r in rs], align="edge", edgecolor="black", linewidth=0.3)
    ax.axhline(plan.block_sizes[device], linestyle="--", color="tab:red", label="planned block")
    ax.axhline(lower_bound(rs, alignment=plan.alignment).get(device, 0), linestyle=":", color="black",
               label="lower bound")
    ax.set_xlabel("position in the device's task chain")
    ax.set_ylabel("offset in the mem block (bytes)")
    ax.set_title(f"{device}: {plan.algorithms.get(device, '')}")
    ax.legend(loc="upper right")
