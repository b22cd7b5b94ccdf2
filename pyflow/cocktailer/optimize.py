"""Cocktailer's control-flow optimizations (seed 001, sec. 3.2 and 4.1.3) as IR-to-IR passes.

Each pass takes a traced ``Program`` and returns a new one (the input is never
changed; unchanged statements are copied, buffers and arenas are shared) that
computes the same values bitwise: the same uTasks run on the same data, only the
control structure or the order of independent operators differs.  The scheduler
(``schedule.py``) tries each pass that is switched on in ``Optimizations`` and
keeps it only if the profiler says the program got cheaper.

* function inline - a function uTask's body is spliced into its caller, so no
  function boundary fences the operators (``Options.inline`` does the same inside
  the code generator; without it a function costs a grid barrier on each side).
* loop unroll - ``for i in range(T)`` with a static ``T`` becomes ``T // f``
  iterations of ``f`` copies of the body (copy ``k`` reads ``i*f + k``) and a
  remainder of ``T % f`` copies with constant ``i``.  When every copy has a
  constant ``i`` (full unroll), offsets like ``xs[i]`` or ``update(y, i, v)`` fold
  into static ones, the barrier analysis sees exactly which rows each operator
  touches, and barriers a dynamic offset forced (it could be any row) disappear.
* branch reclustering - inside each block of a branch, runs of operators are
  reordered, respecting every read/write dependence, into *phases* (operators
  that need no grid barrier between them), and inside a phase grouped by the
  occupancy they prefer (tiles in shared memory: ``"limited"``; streaming
  elementwise work: ``"high"``).  Fewer phases mean fewer grid barriers.  The
  paper also splits a branch into several kernels with different occupancies;
  pyflow's cost model has one co-resident limit per kernel, so that half would
  change nothing here and is not implemented.
* recursion unroll - in ``optimize_recursion.py`` (sibling subtrees on disjoint block groups).

The passes share one engine, ``_Cloner``: a deep copy of statements with a
substitution of loop variables (``Var -> Scalar``) that folds constants as it goes.
"""

from __future__ import annotations

import dataclasses
import heapq

from pyflow.cocktailer.barriers import CLEAR, BarrierPlan, op_accesses
from pyflow.cocktailer.ir import (
    Branch,
    Call,
    CallGroup,
    FunctionCall,
    Lane,
    Loop,
    Offset,
    StmtBlock,
    TensorRef,
    UOperator,
    walk,
)
from pyflow.cocktailer.scalars import (
    BinOp,
    Const,
    Load,
    Scalar,
    Var,
    as_scalar,
    py_op,
)

__all__ = [
    "Optimizations",
    "PassResult",
    "clone_block",
    "dependences",
    "fold",
    "inline_functions",
    "occupancy_class",
    "optimize",
    "recluster_block",
    "recluster_branches",
    "static_value",
    "unroll_loop",
    "unroll_loops",
]


@dataclasses.dataclass(frozen=True)
class Optimizations:
    """Which passes the scheduler may try (each is kept only if the profiler says it pays).

    ``unroll_factors``: the factors tried for every static for loop; 0 means a full
    unroll.  ``max_unrolled_ops``: a loop is left alone if unrolling it would give
    more operators than this (kernel size, and the simulator's patience).
    ``recursion_depths``: the levels of recursion unroll tried (nested block groups).
    """

    inline: bool = True
    recluster: bool = True
    unroll: bool = True
    unroll_factors: tuple = (2, 4, 0)
    max_unrolled_ops: int = 256
    unroll_recursion: bool = True
    recursion_depths: tuple = (1, 2, 3)


@dataclasses.dataclass
class PassResult:
    """A pass's output program and how many places it changed."""

    program: object
    changed: int


# ---- scalars: folding and static values ----------------------------------------------


def fold(s: Scalar) -> Scalar:
    """``s`` with operators on two constants computed now (``(2 * 4) + 1`` -> ``9``)."""
    if isinstance(s, BinOp) and isinstance(s.a, Const) and isinstance(s.b, Const):
        if s.op in ("//", "%") and s.b.value == 0:
            return s   # leave the error to run time, where it belongs
        return as_scalar(py_op(s.op)(s.a.value, s.b.value))
    return s


def static_value(s: Scalar | None):
    """The value of ``s`` if it is known without running the program, else None."""
    if isinstance(s, Const):
        return s.value
    if isinstance(s, BinOp):
        a, b = static_value(s.a), static_value(s.b)
        if a is not None and b is not None and not (s.op in ("//", "%") and b == 0):
            return py_op(s.op)(a, b)
    return None


# ---- the copy-with-substitution engine --------------------------------------------------


class _Cloner:
    """Deep-copies statements, replacing Vars by ``subst[id(var)]`` and folding constants.

    Nested loops get fresh loop Vars (same names), so every copy of a loop body is
    a tree of its own.  ``inline``: splice function uTasks into their caller.
    ``unroll``: unroll static for loops by this factor (0: fully).  ``recluster``:
    reorder the blocks of branches.  ``counts`` tallies what each did.
    """

    def __init__(self, subst=None, inline=False, unroll=None, recluster=False, max_ops=256, functions=None,
                 buffers=None):
        self.subst = dict(subst or {})
        self.inline, self.unroll, self.recluster, self.max_ops = inline, unroll, recluster, max_ops
        self.functions = functions or {}
        self.buffers = buffers or {}    # Buffer -> Buffer (a function copy's own stack)
        self.counts = {"inline": 0, "unroll": 0, "recluster": 0}

    # scalars and tensors
    def scalar(self, s):
        if s is None or isinstance(s, Const):
            return s
        if isinstance(s, Var):
            return self.subst.get(id(s), s)
        if isinstance(s, Load):
            return Load(self.ref(s.ref))
        if isinstance(s, BinOp):
            return fold(BinOp(s.op, self.scalar(s.a), self.scalar(s.b)))
        raise TypeError(f"not a scalar: {s!r}")

    def offset(self, o: Offset) -> Offset:
        if o.dynamic is None:
            return o
        d = self.scalar(o.dynamic)
        if isinstance(d, Const):   # the position is known now: a static offset
            return Offset(None, o.const + int(d.value))
        return Offset(d, o.const)

    def ref(self, r: TensorRef) -> TensorRef:
        return TensorRef(self.buffers.get(r.buffer, r.buffer), r.shape, self.offset(r.offset), r.bounds)

    def op(self, op: UOperator) -> UOperator:
        args = tuple(self.ref(a) if isinstance(a, TensorRef) else a for a in op.args)
        note = op.note   # the listing's text: show the copy's views, e.g. xs[(i0 * 16)] -> xs[32]
        for old, new in zip(op.args, args):
            if isinstance(old, TensorRef) and old.offset is not new.offset:
                note = note.replace(repr(old), repr(new))
        return dataclasses.replace(op, args=args, note=note,
                                   reads=tuple((self.ref(r), p) for r, p in op.reads),
                                   writes=tuple((self.ref(r), p) for r, p in op.writes))

    # statements
    def block(self, block: StmtBlock) -> StmtBlock:
        return StmtBlock([new for item in block.items for new in self.stmt(item)])

    def stmt(self, s) -> list:
        if isinstance(s, UOperator):
            return [self.op(s)]
        if isinstance(s, Loop):
            var = Var(s.var.name)
            self.subst[id(s.var)] = var
            loop = Loop(var, self.block(s.body), trip=self.scalar(s.trip),
                        head=self.block(s.head) if s.head is not None else None,
                        cond=self.scalar(s.cond), max_iters=s.max_iters, unroll=s.unroll)
            if self.unroll is not None:
                factor = self.unroll or static_value(loop.trip) or 1
                unrolled = unroll_loop(loop, factor, self.max_ops, recluster=self.recluster)
                self.counts["unroll"] += unrolled != [loop]
                return unrolled
            return [loop]
        if isinstance(s, Branch):
            branch = Branch(self.scalar(s.pred), self.block(s.then), self.block(s.orelse))
            if self.recluster:
                for name in ("then", "orelse"):
                    new, changed = recluster_block(getattr(branch, name))
                    setattr(branch, name, new)
                    self.counts["recluster"] += changed
            return [branch]
        if isinstance(s, FunctionCall):
            body = self.block(s.body)
            if self.inline:
                self.counts["inline"] += 1
                return body.items
            return [FunctionCall(s.name, body)]
        if isinstance(s, Call):
            return [Call(self.functions.get(s.fn, s.fn), tuple(self.scalar(a) for a in s.args), self.ref(s.result),
                         s.depth)]
        if isinstance(s, CallGroup):
            return [CallGroup(self.block(s.body))]
        if isinstance(s, Lane):
            return [Lane(self.block(s.body), self.functions.get(s.fn, s.fn), s.depth)]
        raise TypeError(f"cannot copy {s!r}")


def clone_block(block: StmtBlock, subst=None) -> StmtBlock:
    """A deep copy of ``block`` with ``subst`` (``{id(var): Scalar}``) applied and constants folded."""
    return _Cloner(subst).block(block)


def _rebuild(program, **passes) -> PassResult:
    """Copy ``program`` (body and recursive functions) through a ``_Cloner`` with ``passes``."""
    functions = {f: dataclasses.replace(f) for f in program.functions}
    cloner = _Cloner(functions=functions, **passes)
    for old, new in functions.items():
        new.body = cloner.block(old.body)
    body = cloner.block(program.body)
    new_program = dataclasses.replace(program, body=body, functions=[functions[f] for f in program.functions])
    return PassResult(new_program, sum(cloner.counts.values()))


# ---- function inline ----------------------------------------------------------------------


def inline_functions(program) -> PassResult:
    """Splice every function uTask's body into its caller (recursive functions stay calls)."""
    return _rebuild(program, inline=True)


# ---- loop unroll ----------------------------------------------------------------------------


def unroll_loop(loop: Loop, factor: int, max_ops: int = 256, recluster: bool = False) -> list:
    """The statements that replace ``loop`` unrolled by ``factor`` (``[loop]`` if it cannot be).

    Only a for loop with a static trip count ``T`` unrolls.  With ``f = min(factor, T)``:
    a loop of ``T // f`` iterations whose body is ``f`` copies (copy ``k`` sees
    ``i -> i*f + k``), then ``T % f`` copies with ``i`` a constant.  When the loop
    would run once (``f == T``) every copy gets a constant ``i``: a full unroll.
    The body's intermediates keep their offsets: copy ``k+1`` overwrites what copy
    ``k`` left, exactly as iteration ``k+1`` did, so the values are unchanged.
    """
    trip = static_value(loop.trip) if loop.kind == "for" else None
    if trip is None or factor < 2 or trip < 2:
        return [loop]
    f = min(int(factor), int(trip))
    main, rest = divmod(int(trip), f)
    body_ops = sum(isinstance(s, UOperator) for s in walk(loop.body))
    if body_ops * (trip if main == 1 else f + rest) > max_ops:
        return [loop]

    def copy(value) -> list:
        return _Cloner({id(loop.var): value}, recluster=recluster).block(loop.body).items

    if main == 1:   # one trip of the unrolled loop: every copy has a constant counter
        return [s for k in range(trip) for s in copy(Const(k))]
    var = Var(loop.var.name)
    body = [s for k in range(f) for s in copy(var * f + k if k else var * f)]
    out = [Loop(var, StmtBlock(body), trip=Const(main), unroll=f)]
    out += [s for k in range(rest) for s in copy(Const(main * f + k))]
    return out


def unroll_loops(program, factor: int, max_ops: int = 256) -> PassResult:
    """Unroll every static for loop of ``program`` by ``factor`` (0: fully); inner loops first."""
    return _rebuild(program, unroll=factor, max_ops=max_ops)


# ---- branch reclustering --------------------------------------------------------------------

#: operators that keep tiles or a reduction tree in shared memory: they prefer (and
#: get) fewer co-resident blocks than streaming elementwise work.
LIMITED_OCCUPANCY = frozenset({"linear", "matmul", "sum_rows", "max_rows", "softmax_rows"})


def occupancy_class(op: UOperator) -> str:
    """``"limited"`` (shared-memory tiles, registers) or ``"high"`` (streaming elementwise)."""
    return "limited" if op.name in LIMITED_OCCUPANCY else "high"


def _overlap(a, b) -> bool:
    """Do two accesses touch a common element, one of them writing (a dependence)?"""
    return (a.buffer is b.buffer and (a.write or b.write) and a.lo < a.hi and b.lo < b.hi
            and a.lo < b.hi and b.lo < a.hi)


def dependences(ops) -> dict:
    """``{(i, j): weight}`` for ``i < j`` when op ``j`` must stay after op ``i``.

    Weight 1: the two touch common elements from possibly different blocks (a grid
    barrier must separate them); weight 0: only through the same elementwise
    pattern (same element, same block and thread: program order is enough).
    """
    touched = [list(op_accesses(op)) for op in ops]
    deps = {}
    for j in range(len(ops)):
        for i in range(j):
            pairs = [(x, y) for x in touched[i] for y in touched[j] if _overlap(x, y)]
            if pairs:
                deps[(i, j)] = 1 if any(x.conflicts(y) for x, y in pairs) else 0
    return deps


def _recluster_run(ops: list) -> list:
    """A dependence-respecting order of ``ops``: by phase, then occupancy class, then position."""
    deps = dependences(ops)
    preds = {j: [] for j in range(len(ops))}
    users = {i: [] for i in range(len(ops))}
    for i, j in deps:
        preds[j].append(i)
        users[i].append(j)
    # phase: how many barriers must come before the op (the longest path of weight-1 edges)
    phase = [0] * len(ops)
    for j in range(len(ops)):   # predecessors come earlier in program order: already done
        phase[j] = max([phase[i] + deps[(i, j)] for i in preds[j]], default=0)
    rank = {"limited": 0, "high": 1}
    waiting = {j: len(preds[j]) for j in range(len(ops))}
    ready = [(phase[j], rank[occupancy_class(ops[j])], j) for j in range(len(ops)) if not waiting[j]]
    heapq.heapify(ready)
    order = []
    while ready:   # Kahn's topological sort, smallest (phase, class, position) first
        *_, i = heapq.heappop(ready)
        order.append(ops[i])
        for j in users[i]:
            waiting[j] -= 1
            if not waiting[j]:
                heapq.heappush(ready, (phase[j], rank[occupancy_class(ops[j])], j))
    return order


def barrier_sites(block: StmtBlock, inline: bool = True) -> int:
    """How many grid barriers the code generator would put in ``block`` (entered with nothing pending)."""
    plan = BarrierPlan(inline)
    plan.block(block, CLEAR)
    return len(plan.before)


def recluster_block(block: StmtBlock) -> tuple:
    """``(block', changed)``: each run of operators between nested statements reordered.

    A reordered run is kept only if it needs strictly fewer barriers than the
    original (counted by the code generator's own barrier plan).
    """
    items, run, changed = [], [], False

    def flush():
        nonlocal changed
        if len(run) > 1:
            new = _recluster_run(run)
            if barrier_sites(StmtBlock(new)) < barrier_sites(StmtBlock(list(run))):
                items.extend(new)
                changed = True
                run.clear()
                return
        items.extend(run)
        run.clear()

    for item in block.items:
        if isinstance(item, UOperator):
            run.append(item)
        else:
            flush()
            items.append(item)
    flush()
    return StmtBlock(items), changed


def recluster_branches(program) -> PassResult:
    """Recluster the then/else blocks of every branch (``changed``: blocks reordered)."""
    return _rebuild(program, recluster=True)


def optimize(program, inline: bool = False, recluster: bool = False, unroll=None, max_ops: int = 256) -> PassResult:
    """Several passes in one copy: inline, then unroll (``unroll``: a factor, 0 full, None off), recluster."""
    return _rebuild(program, inline=inline, recluster=recluster, unroll=unroll, max_ops=max_ops)
