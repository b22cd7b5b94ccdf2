"""Cocktailer's scheduler (seed 001, sec. 3.2): which parts of a program become ONE kernel.

The three scheduling interfaces of the paper (``schedule_operator``, ``schedule_control_flow``,
``set_resource``) and the levels they return are ``schedule_interfaces.py``; this module is the
policy that calls them.

``schedule(program, options)`` is **Algorithm 1**, the traversal-based bottom-up
policy: visit the statement tree children first; every operator is schedulable;
a control-flow node whose whole body is schedulable becomes a candidate uProgram,
and it goes to the device if the profiler (``profiler.py``) says one kernel is
cheaper than leaving its control on the host.  The program body is the last node
("a program of several operators is first wrapped in a function operator"): if
it pays, the whole program is one kernel.  (The paper also tries each candidate
at several unit levels; pyflow's uTasks are all block-level, so there is one.)
Around that, the optimizations of ``optimize.py`` and ``optimize_recursion.py``
are tried and kept when they pay (recursion unroll at each depth of
``Optimizations.recursion_depths``: the cheapest depth wins, none if none beats
the program without it).  The
``Schedule`` it returns prints every decision with both costs and why:

    >>> print(ck.compile(program, mode="auto").schedule)      # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses

from pyflow.cocktailer.executor import Options
from pyflow.cocktailer.ir import Branch, Call, CallGroup, FunctionCall, Lane, Loop, StmtBlock, UOperator, walk
from pyflow.cocktailer.optimize import Optimizations, inline_functions, optimize, recluster_branches
from pyflow.cocktailer.optimize_recursion import unroll_recursion
from pyflow.cocktailer.profiler import CostModel, Estimate, Profiler, nested_in
from pyflow.cocktailer.schedule_interfaces import (Level, Resource, schedule_control_flow, schedule_operator,
                                                  set_resource)
from pyflow.errors import LaunchConfigError

__all__ = ["Decision", "Schedule", "constraint_violations", "schedule"]


# ---- decisions and the schedule --------------------------------------------------------


@dataclasses.dataclass
class Decision:
    """One node's outcome: its level, both costs, the choice and why."""

    node: str
    level: Level
    host: Estimate | None
    device: Estimate | None
    choice: str      # "device" | "host" | "with definition"
    reason: str


@dataclasses.dataclass
class OptimizationNote:
    """One optimization tried: what it changed, the program's cost before and after, kept or not."""

    name: str
    detail: str
    before: Estimate | None
    after: Estimate | None
    kept: bool

    def __str__(self) -> str:
        if self.after is None:
            return f"  {self.name:<16} {self.detail}"
        verdict = "kept" if self.kept else "not kept"
        return (f"  {self.name:<16} {self.detail}: {self.before.total_us:.1f} -> {self.after.total_us:.1f} us, "
                f"barriers {self.before.barriers:g} -> {self.after.barriers:g}; {verdict}")


@dataclasses.dataclass
class Schedule:
    """The result of Algorithm 1: what ``Executor`` needs, and why.

    ``program``: the program to run (optimizations applied); ``options``: its
    ``Options`` (``inline`` as the inline pass decided); ``whole_program``: one
    kernel for everything; else ``device_units``: statements compiled as one kernel
    each, the rest on the host.  ``levels``: Algorithm 1's level of every node
    (``id`` -> Level).  ``estimate``: the profiler's price of the result.
    """

    program: object
    options: Options
    whole_program: bool
    device_units: list
    decisions: list
    levels: dict
    estimate: Estimate
    profiler: str
    model: CostModel
    optimizations: list = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        m = self.model
        prices = "" if self.profiler.startswith("measured") else (
            f"; launch {m.launch_us:g} us, host sync {m.host_sync_us:g} us, grid barrier {m.barrier_us:g} us; "
            f"assumed: trip {m.assumed_trip}, calls {m.assumed_calls}, p(then) {m.branch_probability:g}")
        out = [f"schedule of {self.program.name} (profiler: {self.profiler}{prices})"]
        if self.optimizations:
            out.append("optimizations:")
            out.extend(str(n) for n in self.optimizations)
        out.append("decisions (Algorithm 1, bottom-up; costs in us):")
        width = max([len(d.node) for d in self.decisions] + [4])
        out.append(f"  {'node':<{width}}  {'level':<6} {'host':>9} {'device':>9}  {'choice':<15} reason")
        for d in self.decisions:
            host = f"{d.host.total_us:9.1f}" if d.host else f"{'-':>9}"
            dev = f"{d.device.total_us:9.1f}" if d.device else f"{'-':>9}"
            out.append(f"  {d.node:<{width}}  {d.level.name.lower():<6} {host} {dev}  {d.choice:<15} {d.reason}")
        if self.whole_program:
            out.append(f"result: the whole program is ONE uProgram (one kernel): {self.estimate}")
        elif self.device_units:
            names = ", ".join(describe(u) for u in self.device_units)
            out.append(f"result: {len(self.device_units)} uProgram(s) on the device [{names}], the rest on the host: "
                       f"{self.estimate}")
        else:
            out.append(f"result: everything on the host, one launch per operator: {self.estimate}")
        return "\n".join(out)


def describe(node, program=None) -> str:
    """A short name for a node in the decision table."""
    if isinstance(node, StmtBlock):
        text = f"program {program.name}" if program is not None else "program"
        ops = sum(isinstance(s, UOperator) for s in walk(node))
    elif isinstance(node, Call):
        text = f"call {node.fn.name}({', '.join(map(repr, node.args))})"
        ops = sum(isinstance(s, UOperator) for s in walk(node.fn.body))
    else:
        if isinstance(node, Loop) and node.kind == "for":
            text = f"for {node.var!r} in range({node.trip!r})"
        elif isinstance(node, Loop):
            text = f"while {node.cond!r} (<= {node.max_iters})"
        elif isinstance(node, Branch):
            text = f"if {node.pred!r}"
        elif isinstance(node, FunctionCall):
            text = f"function {node.name}"
        elif isinstance(node, CallGroup):
            text = f"{len(node.lanes)} lanes at once ({', '.join(_lane_name(lane) for lane in node.lanes)})"
        elif isinstance(node, Lane):
            text = f"lane {_lane_name(node)}"
        else:
            return repr(node)
        ops = sum(isinstance(s, UOperator) for b in node.blocks() for s in walk(b))
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{text} [{ops} ops]"


def _lane_name(lane) -> str:
    calls = [s for s in lane.body.items if isinstance(s, Call)]
    return lane.fn.name if lane.fn is not None else (calls[0].fn.name if calls else "lane")


def cheaper(a: Estimate, b: Estimate) -> bool:
    """``a`` costs less than ``b`` by more than rounding (a tie keeps the simpler choice)."""
    return a.total_us < b.total_us - 1e-9 * max(1.0, b.total_us)


def explain(host: Estimate, device: Estimate, resource: Resource, options: Options, model: CostModel) -> str:
    """Why the cheaper side won, in the cost model's terms."""
    if host.measured:
        return f"measured: one kernel {device.total_us:.1f} us, host control {host.total_us:.1f} us"
    launches, syncs = host.launches - device.launches, host.host_syncs - device.host_syncs
    saved = launches * model.launch_us + syncs * model.host_sync_us
    barriers = device.barriers - host.barriers
    work = device.work_us - host.work_us
    saves = f"{launches:g} launches and {syncs:g} host syncs ({saved:.1f} us)"
    if cheaper(device, host):
        return f"one kernel saves {saves}, pays {barriers:g} grid barriers and {work:+.1f} us of work"
    if work >= barriers * model.barrier_us:
        return (f"the persistent grid is capped at {resource.grid} co-resident blocks (a host launch uses up "
                f"to {options.host_blocks}): {work:+.1f} us of work outweighs the {saves} it saves")
    return f"{barriers:g} grid barriers ({barriers * model.barrier_us:.1f} us) outweigh the {saves} it saves"


class _Algorithm1:
    """One bottom-up traversal of one program (see the module docstring)."""

    def __init__(self, program, options: Options, profiler: Profiler):
        self.program, self.options, self.profiler = program, options, profiler
        self.units: dict = {}            # id -> (statement, Resource): the uPrograms so far
        self.levels: dict = {}
        self.decisions: list = []
        self.defining: list = []         # recursive functions whose body is being visited
        self.function_levels: dict = {}

    def run(self) -> Schedule:
        body = self.program.body
        levels = [self.visit(s) for s in body.items]
        self.levels[id(body)] = self.consider(body, levels)
        whole = id(body) in self.units
        if whole:
            estimate = self.decisions[-1].device
        else:
            self.prune()
            estimate = self.profiler.cost(body, self.units)
        units = [] if whole else [s for s, _ in self.units.values()]
        return Schedule(self.program, self.options, whole, units, self.decisions, self.levels, estimate,
                        self.profiler.kind, self.profiler.model)

    def visit(self, node) -> Level:
        if isinstance(node, UOperator):
            level = schedule_operator(node).level
        elif isinstance(node, Call) and node.fn in self.defining:
            level = Level.BLOCK   # a uTask reference inside its own definition: placed with the definition
        elif isinstance(node, Lane):   # runs on a group of its CallGroup's blocks: never a uProgram alone
            level = schedule_control_flow(node, self.children_levels(node)) or Level.HOST
        else:
            level = self.consider(node, self.children_levels(node))
        self.levels[id(node)] = level
        return level

    def children_levels(self, node) -> list:
        if isinstance(node, Call):
            fn = node.fn
            if fn not in self.function_levels:
                self.defining.append(fn)
                levels = [self.visit(s) for s in fn.body.items]
                self.defining.pop()
                self.function_levels[fn] = max(levels, default=Level.BLOCK)
            return [self.function_levels[fn]]
        return [self.visit(s) for b in node.blocks() for s in b.items]

    def decide(self, node, level, host, device, choice, reason) -> None:
        self.decisions.append(Decision(describe(node, self.program), level, host, device, choice, reason))

    def consider(self, node, child_levels) -> Level:
        level = schedule_control_flow(node, child_levels)
        if level is None:
            self.decide(node, Level.HOST, None, None, "host",
                        "Constraint 1: a part of its body runs on the host, so its control flow stays there too")
            return Level.HOST
        inner = [fn for fn in self.defining if any(isinstance(s, Call) and s.fn is fn for s in _statements(node))]
        if inner:
            self.decide(node, level, None, None, "with definition",
                        f"holds a uTask reference to {inner[0].name}: it runs where {inner[0].name}'s "
                        "outside call runs")
            return level
        try:
            resource = set_resource(node, self.options, self.program, self.profiler.model)
        except LaunchConfigError as e:   # e.g. its recursion stack does not fit in shared memory
            self.decide(node, Level.HOST, None, None, "host", f"set_resource failed: {e}")
            return Level.HOST
        if resource is None:
            self.decide(node, Level.HOST, None, None, "host",
                        f"set_resource failed: {self.options.blocks} blocks cannot all be co-resident")
            return Level.HOST
        host = self.profiler.cost(node, self.units)
        device = self.profiler.cost(node, self.units, resource)
        why = explain(host, device, resource, self.options, self.profiler.model)
        if cheaper(device, host):
            for key in [k for k, (s, _) in self.units.items() if nested_in(node, s)]:
                del self.units[key]
            self.units[id(node)] = (node, resource)
            self.decide(node, level, host, device, "device", why)
            return level
        self.decide(node, Level.HOST, host, device, "host", why)
        return Level.HOST

    def prune(self) -> None:
        """Drop uPrograms the host never launches (inside a recursion that runs on the device)."""
        reached, seen = set(), set()

        def visit(block):
            for item in block.items:
                if id(item) in self.units:
                    reached.add(id(item))
                    continue
                for inner in getattr(item, "blocks", lambda: ())():
                    visit(inner)
                if isinstance(item, Call) and item.fn not in seen:
                    seen.add(item.fn)
                    visit(item.fn.body)

        visit(self.program.body)
        self.units = {k: v for k, v in self.units.items() if k in reached}


def _statements(node):
    if isinstance(node, StmtBlock):
        return list(walk(node))
    return [s for b in node.blocks() for s in walk(b)]


def constraint_violations(sched: Schedule) -> list:
    """Every place where Algorithm 1's levels break Constraint 1 (control flow below its body)."""
    levels, problems = sched.levels, []

    def check(node, children):
        got = [levels[id(c)] for c in children if id(c) in levels]
        if got and id(node) in levels and levels[id(node)] < max(got):
            problems.append(f"{describe(node, sched.program)} at {levels[id(node)].name} holds a "
                            f"{max(got).name} statement")

    def visit(block):
        for item in block.items:
            if isinstance(item, Call):
                check(item, item.fn.body.items)
            elif not isinstance(item, UOperator):
                check(item, [s for b in item.blocks() for s in b.items])
                for b in item.blocks():
                    visit(b)

    check(sched.program.body, sched.program.body.items)
    visit(sched.program.body)
    for fn in sched.program.functions:
        visit(fn.body)
    for unit in ([sched.program.body] if sched.whole_program else sched.device_units):
        for s in _statements(unit):
            if levels.get(id(s), Level.BLOCK) > Level.BLOCK:
                problems.append(f"{describe(s, sched.program)} is at {levels[id(s)].name} inside a uProgram")
    return problems


# ---- Algorithm 1 with the optimizations around it ------------------------------------------------


def _has_functions(program) -> bool:
    blocks = [program.body] + [f.body for f in program.functions]
    return any(isinstance(s, FunctionCall) for b in blocks for s in walk(b))


def schedule(program, options: Options | None = None, cost_model: CostModel | None = None, *,
             sample_inputs=None, measure: bool | None = None,
             optimizations: Optimizations | None = None) -> Schedule:
    """Algorithm 1 on ``program``, trying each optimization of ``optimizations``.

    ``cost_model``: the simulator's prices (default ``CostModel()``); on a GPU with
    ``sample_inputs`` the candidates are timed instead (``measure`` forces either).
    An optimization is kept only if the whole program's estimate drops.
    """
    options = options or Options()
    opts = optimizations if optimizations is not None else Optimizations()
    model = cost_model or CostModel()

    def algorithm1(prog, opt) -> Schedule:
        return _Algorithm1(prog, opt, Profiler(prog, opt, model, sample_inputs, measure)).run()

    notes = []
    allow_inline = opts.inline and options.inline
    best = algorithm1(program, dataclasses.replace(options, inline=False) if _has_functions(program) else options)
    if not _has_functions(program):
        notes.append(OptimizationNote("inline", "no function uTasks", None, None, False))
    elif not allow_inline:
        notes.append(OptimizationNote("inline", "switched off: each function a device function, fenced by barriers",
                                      None, None, False))
    else:
        cand = inline_functions(program)
        trial = algorithm1(cand.program, dataclasses.replace(options, inline=True))
        keep = cheaper(trial.estimate, best.estimate)
        notes.append(OptimizationNote("inline", f"{cand.changed} function uTask(s) spliced into their callers",
                                      best.estimate, trial.estimate, keep))
        best = trial if keep else best

    reclustered = False
    if opts.recluster:
        cand = recluster_branches(best.program)
        if not cand.changed:
            notes.append(OptimizationNote("recluster", "no branch block with operators to regroup", None, None, False))
        else:
            trial = algorithm1(cand.program, best.options)
            reclustered = cheaper(trial.estimate, best.estimate)
            notes.append(OptimizationNote("recluster", f"{cand.changed} branch block(s) regrouped",
                                          best.estimate, trial.estimate, reclustered))
            best = trial if reclustered else best

    if opts.unroll:
        base = best
        for factor in opts.unroll_factors:
            cand = optimize(base.program, unroll=factor, recluster=reclustered, max_ops=opts.max_unrolled_ops)
            name = "unroll full" if factor == 0 else f"unroll x{factor}"
            if not cand.changed:
                notes.append(OptimizationNote(name, "no static for loop to unroll (or too big)", None, None, False))
                continue
            trial = algorithm1(cand.program, base.options)
            keep = cheaper(trial.estimate, best.estimate)
            notes.append(OptimizationNote(name, f"{cand.changed} loop(s)", best.estimate, trial.estimate, keep))
            best = trial if keep else best

    if opts.unroll_recursion:
        base = best
        for depth in opts.recursion_depths:   # each depth from the program before, the cheapest kept
            cand = unroll_recursion(base.program, depth)
            name = "recursion unroll" if depth == 1 else f"recursion unroll x{depth}"
            if not cand.changed:
                notes.append(OptimizationNote(name, "no outside call with independent sibling calls",
                                              None, None, False))
                break
            try:
                trial = algorithm1(cand.program, base.options)
            except LaunchConfigError as e:   # e.g. more block groups than the status word or the grid allow
                notes.append(OptimizationNote(name, f"cannot be compiled: {e}", None, None, False))
                continue
            keep = cheaper(trial.estimate, best.estimate)
            what = ("sibling subtrees on disjoint block groups" if depth == 1 else
                    f"{depth} levels: sibling subtrees on nested block groups")
            notes.append(OptimizationNote(name, f"{cand.changed} call(s): {what}", best.estimate, trial.estimate,
                                          keep))
            best = trial if keep else best

    best.optimizations = notes
    return best
