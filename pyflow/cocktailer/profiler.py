"""Cocktailer's profiler (seed 001, sec. 3.2): how long would this part of the program take?

Algorithm 1 asks, for each candidate uProgram, whether running it as ONE kernel
beats leaving its control flow on the host.  Cocktailer answers by measuring.
pyflow does too on a real GPU (``backend.is_gpu()``) when given sample inputs:
``Profiler`` compiles the whole program under each candidate schedule, runs it
and times it (``measure``).  In the simulator, time means nothing (a Python thread
switch costs more than a real kernel), so the profiler *counts* what a schedule
makes the hardware do and prices each count with the ``CostModel`` below:

    time = launches * launch_us + host_syncs * host_sync_us + barriers * barrier_us
         + work_us

``work_us``: an operator's uTasks run in *waves* of as many blocks as run at once,
each uTask costing ``utask_us`` plus its FLOPs and elements at one block's rates.
The asymmetry that lets the host win: a persistent kernel's grid is capped at the
co-resident limit of the whole fused kernel (every block must be running for a
grid barrier to open), while a host launch of one operator may use as many blocks
as it has uTasks (up to ``Options.host_blocks``): the GPU streams them through,
at the occupancy that operator alone allows.  So one huge operator run once is
cheaper on the host; many small operators in a loop are cheaper in one kernel.

Counts the program does not fix are assumptions, printed with every estimate:
a trip count read from the device or a while loop runs ``assumed_trip`` times, a
recursive function is called ``assumed_calls`` times per outside call, a branch
takes ``then`` with probability ``branch_probability``; the ``k`` calls of a
``CallGroup`` (recursion unroll) share one outside call's ``assumed_calls``
(and a branch arm holding them is taken), and their groups run at once: a
``CallGroup`` costs what its slowest group of blocks does.
For programs without them the counts are exact: they equal the executor's
``RunStats``.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from pyflow.cocktailer.ir import Branch, Call, CallGroup, FunctionCall, Lane, Loop, StmtBlock, UOperator, walk
from pyflow.cocktailer.optimize import static_value
from pyflow.cocktailer.scalars import scalar_loads
from pyflow.kernels.backend import cuda, is_gpu

__all__ = ["CostModel", "Estimate", "Profiler", "utask_work"]


@dataclasses.dataclass(frozen=True)
class CostModel:
    """The prices and assumptions of the simulator's profiler (microseconds).

    Defaults are round numbers of a recent data-centre GPU: a kernel launch costs
    about 5 us of host and driver time; a device-to-host read that decides control
    flow (``cudaMemcpy`` of a scalar, which waits for the stream) about 10 us; a
    cooperative-groups grid barrier about 1.5 us.  One block does about 10 GFLOP/s
    of fp32 arithmetic (a ~100-SM GPU at ~1 TFLOP/s per SM, a few blocks per SM)
    and streams about 1,000 elements per us; each uTask pays ``utask_us`` to start
    (index maths, first loads).  ``coresident_blocks``: the persistent grid's cap;
    None asks the kernel (``max_cooperative_grid_blocks``), as ``set_resource`` does.
    """

    launch_us: float = 5.0
    host_sync_us: float = 10.0
    barrier_us: float = 1.5
    utask_us: float = 0.5
    flops_per_us: float = 10_000.0
    elements_per_us: float = 1_000.0
    assumed_trip: int = 16
    assumed_calls: int = 16
    branch_probability: float = 0.5
    coresident_blocks: int | None = None

    def __post_init__(self):
        for name in ("launch_us", "host_sync_us", "barrier_us", "utask_us"):
            if getattr(self, name) < 0:
                raise ValueError(f"CostModel.{name} must be >= 0, got {getattr(self, name)}")
        if self.flops_per_us <= 0 or self.elements_per_us <= 0:
            raise ValueError("CostModel rates must be > 0")
        if not 0.0 <= self.branch_probability <= 1.0:
            raise ValueError(f"branch_probability must be in [0, 1], got {self.branch_probability}")
        if self.coresident_blocks is not None and self.coresident_blocks < 1:
            raise ValueError(f"coresident_blocks must be None or >= 1, got {self.coresident_blocks}")

    def utask_us_of(self, op: UOperator, tile: int) -> float:
        """The time one block spends on one uTask of ``op``."""
        flops, elements = utask_work(op, tile)
        return self.utask_us + flops / self.flops_per_us + elements / self.elements_per_us

    def op_us(self, op: UOperator, blocks: int, tile: int) -> float:
        """``op``'s uTasks in waves of ``blocks`` at once."""
        if op.count == 0:
            return 0.0
        return math.ceil(op.count / max(1, blocks)) * self.utask_us_of(op, tile)


def utask_work(op: UOperator, tile: int) -> tuple:
    """``(flops, elements)`` of one uTask: a matmul tile, or an equal share of the elements touched."""
    if op.name in ("linear", "matmul"):
        K = [a for a in op.args if isinstance(a, int)][-2]   # (..., M, N, K, batch)
        return 2.0 * tile * tile * K, 2.0 * tile * K + tile * tile
    touched = sum(ref.size for ref, _ in op.reads) + sum(ref.size for ref, _ in op.writes)
    elements = touched / max(1, op.count)
    return elements, elements


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What a candidate costs: the counts, and the time (modelled, or measured on a GPU)."""

    launches: float = 0.0
    host_syncs: float = 0.0
    barriers: float = 0.0
    work_us: float = 0.0
    total_us: float = 0.0
    measured: bool = False

    def __str__(self) -> str:
        how = "measured" if self.measured else "est."
        return (f"{self.total_us:.1f} us {how} ({self.launches:g} launches, {self.host_syncs:g} syncs, "
                f"{self.barriers:g} barriers, work {self.work_us:.1f} us)")


class _Tally:
    def __init__(self):
        self.launches = self.host_syncs = self.barriers = self.work_us = 0.0

    def add(self, other: "_Tally") -> None:
        self.launches += other.launches
        self.host_syncs += other.host_syncs
        self.barriers += other.barriers
        self.work_us += other.work_us

    def estimate(self, model: CostModel) -> Estimate:
        total = (self.launches * model.launch_us + self.host_syncs * model.host_sync_us
                 + self.barriers * model.barrier_us + self.work_us)
        return Estimate(self.launches, self.host_syncs, self.barriers, self.work_us, total)


def _loads(s) -> int:
    return 0 if s is None else sum(1 for _ in scalar_loads(s))


def _ref_loads(ref) -> int:
    return _loads(ref.offset.dynamic)


def segments_per_frame(block: StmtBlock, p: float, trip=lambda loop: 16.0) -> float:
    """Expected dispatches of a recursive body per frame (each starts with a grid barrier).

    The code generator cuts the body at its calls into labelled segments: the entry,
    one resume point per call, and for a branch with calls inside one label per
    side plus the join.  A loop holding a call (``trip(loop)`` iterations) is a head
    segment per test, a body segment per iteration and one after it.
    """
    count = 0.0
    for item in block.items:
        holds_call = any(isinstance(s, Call) for b in getattr(item, "blocks", lambda: ())() for s in walk(b))
        if isinstance(item, Call):
            count += 1
        elif isinstance(item, Branch) and holds_call:
            count += (2 + p * segments_per_frame(item.then, p, trip)
                      + (1 - p) * segments_per_frame(item.orelse, p, trip))
        elif isinstance(item, Loop) and holds_call:
            n = trip(item)
            head = segments_per_frame(item.head, p, trip) if item.head is not None else 0.0
            count += (n + 1) * (1 + head) + n * (1 + segments_per_frame(item.body, p, trip)) + 1
        elif isinstance(item, FunctionCall):
            count += segments_per_frame(item.body, p, trip)
    return count


def _then_probability(branch: Branch, p: float) -> float:
    """``p``, except that an arm holding a ``CallGroup`` is taken: an unrolled call's tree has
    ``assumed_calls`` frames, so its root has children (else unrolling would look cheaper by chance)."""
    if any(isinstance(s, CallGroup) for s in walk(branch.then)):
        return 1.0
    if any(isinstance(s, CallGroup) for s in walk(branch.orelse)):
        return 0.0
    return p


class _ModelWalk:
    """Counts one candidate: control on the host (``host``) or inside a kernel (``kernel``)."""

    def __init__(self, model: CostModel, program, options):
        self.model, self.program, self.options = model, program, options
        self.inside: set = set()   # recursive functions whose body is being counted
        self.share = 1.0           # the part of an outside call's tree one call covers (CallGroup)

    def frames(self, mult: float) -> float:
        """How many frames an outside call runs (``mult`` times); a call of a group runs its share."""
        return mult * self.model.assumed_calls * self.share

    def trip(self, loop: Loop) -> float:
        value = static_value(loop.trip) if loop.kind == "for" else None
        return float(value) if value is not None else float(self.model.assumed_trip)

    # control flow on the host: the host executor, with ``units`` launched as kernels
    def host(self, block: StmtBlock, mult: float, tally: _Tally, units: dict) -> None:
        p = self.model.branch_probability
        for item in block.items:
            unit = units.get(id(item))
            if unit is not None:   # a uProgram of its own: one launch each time control reaches it
                tally.launches += mult
                self.kernel(StmtBlock([item]), mult, tally, unit[1])
            elif isinstance(item, UOperator):
                if item.count:
                    tally.launches += mult
                    tally.host_syncs += mult * sum(_ref_loads(a) for a in item.args if hasattr(a, "offset"))
                    blocks = min(item.count, self.options.host_blocks)
                    tally.work_us += mult * self.model.op_us(item, blocks, self.program.tile)
            elif isinstance(item, Loop) and item.kind == "for":
                tally.host_syncs += mult * _loads(item.trip)
                self.host(item.body, mult * self.trip(item), tally, units)
            elif isinstance(item, Loop):
                n = float(self.model.assumed_trip)
                self.host(item.head, mult * (n + 1), tally, units)
                tally.host_syncs += mult * (n + 1) * _loads(item.cond)
                self.host(item.body, mult * n, tally, units)
            elif isinstance(item, Branch):
                tally.host_syncs += mult * _loads(item.pred)
                then_p = _then_probability(item, p)
                self.host(item.then, mult * then_p, tally, units)
                self.host(item.orelse, mult * (1 - then_p), tally, units)
            elif isinstance(item, FunctionCall):
                self.host(item.body, mult, tally, units)
            elif isinstance(item, CallGroup):   # the host runs the lanes one after another
                saved, self.share = self.share, self.share / len(item.lanes)
                self.host(item.body, mult, tally, units)
                self.share = saved
            elif isinstance(item, Lane):
                self.host(item.body, mult, tally, units)
            elif isinstance(item, Call):
                tally.host_syncs += mult * (sum(_loads(a) for a in item.args) + _ref_loads(item.result))
                if item.fn not in self.inside:   # an outside call: count the whole call tree
                    self.inside.add(item.fn)
                    self.host(item.fn.body, self.frames(mult), tally, units)
                    self.inside.discard(item.fn)

    # inside one persistent kernel of grid ``resource.grid``
    def kernel(self, block: StmtBlock, mult: float, tally: _Tally, resource) -> None:
        p, sites = self.model.branch_probability, resource.barrier_sites
        for item in block.items:
            if isinstance(item, UOperator):
                tally.barriers += mult * (id(item) in sites)
                tally.work_us += mult * self.model.op_us(item, resource.grid, self.program.tile)
            elif isinstance(item, Loop) and item.kind == "for":
                tally.barriers += mult * (("trip", id(item)) in sites)
                self.kernel(item.body, mult * self.trip(item), tally, resource)
            elif isinstance(item, Loop):
                n = float(self.model.assumed_trip)
                self.kernel(item.head, mult * (n + 1), tally, resource)
                tally.barriers += mult * (n + 1) * (("cond", id(item)) in sites)
                self.kernel(item.body, mult * n, tally, resource)
            elif isinstance(item, Branch):
                tally.barriers += mult * (("pred", id(item)) in sites)
                then_p = _then_probability(item, p)
                self.kernel(item.then, mult * then_p, tally, resource)
                self.kernel(item.orelse, mult * (1 - then_p), tally, resource)
            elif isinstance(item, FunctionCall):
                # not inlined, its body is a device function the barrier plan cannot see into:
                # the extra barriers (at its first access, and the caller's next) are in ``sites``
                self.kernel(item.body, mult, tally, resource)
            elif isinstance(item, CallGroup):
                self.group(item, mult, tally, resource)
            elif isinstance(item, Lane):
                self.kernel(item.body, mult, tally, resource)
            elif isinstance(item, Call):
                tally.barriers += mult * (("call", id(item)) in sites)
                if item.fn not in self.inside:
                    frames = self.frames(mult)
                    tally.barriers += frames * (1 + segments_per_frame(item.fn.body, p, self.trip))
                    self.inside.add(item.fn)
                    self.kernel(item.fn.body, frames, tally, resource)
                    self.inside.discard(item.fn)

    def group(self, item: CallGroup, mult: float, tally: _Tally, resource) -> None:
        """Lane ``k`` on block group ``k % groups``, each group a share of the blocks (of the grid, or of the
        enclosing lane's group); the slowest group counts.  Each lane covers its share of the call tree."""
        sites = resource.barrier_sites
        tally.barriers += mult * ((("group", id(item)) in sites) + (("join", id(item)) in sites))
        groups = min(len(item.lanes), resource.grid)
        part = dataclasses.replace(resource, grid=max(1, resource.grid // groups))
        saved, self.share = self.share, self.share / len(item.lanes)
        per_group = [_Tally() for _ in range(groups)]
        for k, lane in enumerate(item.lanes):
            self.kernel(lane.body, mult, per_group[k % groups], part)
        self.share = saved
        tally.add(max(per_group, key=lambda t: t.estimate(self.model).total_us))


def nested_in(node, other) -> bool:
    """Is statement ``other`` lexically inside ``node`` (a statement or a StmtBlock)?"""
    blocks = [node] if isinstance(node, StmtBlock) else list(getattr(node, "blocks", lambda: ())())
    return any(s is other for b in blocks for s in walk(b))


class Profiler:
    """Prices candidates: with the ``CostModel``, or by running them (``measure``) on a GPU.

    ``cost(node, units, resource)``: ``node`` (a statement, or the program body) with
    its control flow on the host and the statements in ``units`` (``{id: (stmt,
    Resource)}``) launched as kernels when ``resource`` is None; as one uProgram
    (one kernel of ``resource.grid`` blocks) otherwise.  Measuring times the whole
    program under the candidate schedule (the difference between two candidates is
    the node's); the model prices the node alone.
    """

    def __init__(self, program, options, cost_model: CostModel | None = None, sample_inputs=None,
                 measure: bool | None = None, repeats: int = 3, warmup: int = 1):
        self.program, self.options = program, options
        self.model = cost_model or CostModel()
        if measure is None:
            measure = is_gpu() and sample_inputs is not None
        if measure and sample_inputs is None:
            raise ValueError("Profiler(measure=True) needs sample_inputs to run the candidates on")
        if measure:   # upload once: the timed runs should not include copying the inputs over
            sample_inputs = [cuda.to_device(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
                             for a in sample_inputs]
        self.measure, self.sample_inputs = measure, sample_inputs
        self.repeats, self.warmup = repeats, warmup
        self._timed: dict = {}

    @property
    def kind(self) -> str:
        if self.measure:
            return "measured" + ("" if is_gpu() else " (in the simulator: the times mean nothing)")
        return "cost model"

    def cost(self, node, units: dict, resource=None) -> Estimate:
        if self.measure:
            return self._measure(node, units, resource is not None)
        walk_ = _ModelWalk(self.model, self.program, self.options)
        tally = _Tally()
        block = node if isinstance(node, StmtBlock) else StmtBlock([node])
        if resource is None:
            walk_.host(block, 1.0, tally, units)
        else:
            tally.launches += 1
            walk_.kernel(block, 1.0, tally, resource)
        return tally.estimate(self.model)

    # ---- measuring (a real GPU; in the simulator only to exercise the code) ------------
    def _measure(self, node, units: dict, as_device: bool) -> Estimate:
        from pyflow.cocktailer.executor import Executor

        whole = as_device and node is self.program.body
        kept = [] if whole else [stmt for stmt, _ in units.values() if not (as_device and nested_in(node, stmt))]
        if as_device and not whole:
            kept.append(node)
        key = (whole, frozenset(id(s) for s in kept))
        if key not in self._timed:
            executor = Executor(self.program, self.options, device_units=kept, whole_program=whole)
            for _ in range(self.warmup):
                executor.run(*self.sample_inputs)
            best = math.inf
            for _ in range(max(1, self.repeats)):
                cuda.synchronize()
                start = time.perf_counter()
                executor.run(*self.sample_inputs, to_host=False)
                cuda.synchronize()
                best = min(best, (time.perf_counter() - start) * 1e6)
            s = executor.last_stats
            self._timed[key] = Estimate(s.launches, s.host_syncs, s.barriers, 0.0, best, measured=True)
        return self._timed[key]
