"""The compiled tier's middle: split a kernel at its barriers (loop fission), find what lives across them.

On a GPU every thread of a block runs the kernel at once and waits for the others
at ``syncthreads``.  On one CPU core the same result comes from running the code
*between* two barriers (a **region**) for every thread of the block, then the next
region, and so on: MCUDA's "thread loops".  ``split`` finds the regions and the
control flow around them, ``variables`` what each thread must keep between regions;
``writer.py`` turns them into numba-compiled Python.

What runs where:

* a **region** (statements without a barrier) becomes ``cu_node_K(...)``, a function
  run once per thread; variables that live from one region to another are kept
  per thread in arrays (``v_acc[cu_g]``), loaded at its start and stored at its end;
  variables that are a pure function of the coordinates (``row = blockIdx.y * T + ty``)
  are recomputed instead;
* an ``if``/``while``/``for`` that contains a barrier runs *once for the block*: its
  test is evaluated by every thread (``cu_node_K`` too), they must agree (CUDA requires it:
  else ``DIVERGENT``, the threaded tier's ``DivergentBarrierError``), and the block
  takes that way;
* a grid barrier (``this_grid().sync()``, ``group_barrier``) works the same one
  level up: the code between grid barriers runs for every block of the grid (or of
  the group) before the next.  So a kernel without them runs block after block, its
  control flow compiled (``blockwise.py``), and one with them runs the whole grid
  as a **scope** of blocks driven by ``scopes.Machine``: where blocks disagree about
  a test, the scope splits (a block group of Cocktailer's recursion unroll runs its
  lane while the other group runs its own).

A region ends for a thread with a status (``cpu_runtime``): fell through, exited
(``return``: the thread is gone, its block goes on without it), or left / went on
with the enclosing block-level loop (``break`` / ``continue``: the whole block must agree).
"""

from __future__ import annotations

import ast
import dataclasses
import itertools

from .translation import BARRIERS, CONTEXT, Unsupported

__all__ = ["Region", "BarrierNode", "BranchNode", "CallNode", "Split", "Variables", "split", "variables"]


@dataclasses.dataclass
class Region:
    id: int
    stmts: list
    where: str
    exits: bool = False       # may return (a thread ends)
    leaves: bool = False      # may break / continue the enclosing block-level loop
    in_loop: bool = False     # inside a block-level loop: it runs more than once per thread
    at_loop_end: bool = False


@dataclasses.dataclass
class BarrierNode:
    id: int
    kind: str                 # block, grid or group
    args: list
    where: str
    in_loop: bool = False


@dataclasses.dataclass
class BranchNode:
    id: int
    kind: str                 # if, while or for
    test: ast.expr | None     # if / while
    bounds: list | None       # for: [start, stop, step]
    target: str | None        # for: the loop variable
    body: list
    orelse: list
    where: str
    in_loop: bool = False


@dataclasses.dataclass
class CallNode:
    id: int
    unit: int                 # runs unit ``unit``'s nodes here (its arguments are in its parameters)
    where: str
    in_loop: bool = False


@dataclasses.dataclass
class Split:
    nodes: list
    all_nodes: list           # every node, the units' too, in order of their ids
    regions: list
    units: dict = dataclasses.field(default_factory=dict)   # unit id -> its nodes


def _has_barrier(node) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in BARRIERS
               for n in ast.walk(node))


def _where(stmt) -> str:
    return getattr(stmt, "cu_where", "?")


def _line_key(where: str) -> tuple:
    path, _, line = where.rpartition(":")
    return (path, int(line)) if line.isdigit() else (where, 0)


def _leaves(stmts) -> tuple:
    """(returns, break/continue outside any loop of these statements)."""
    returns = leaves = False

    def walk(node, loop_depth):
        nonlocal returns, leaves
        if isinstance(node, ast.Return):
            returns = True
        if isinstance(node, (ast.Break, ast.Continue)) and loop_depth == 0:
            leaves = True
        loop = isinstance(node, (ast.For, ast.While))
        for child in ast.iter_child_nodes(node):
            walk(child, loop_depth + 1 if loop and any(child is s for s in node.body) else loop_depth)

    for stmt in stmts:
        walk(stmt, 0)
    return returns, leaves


def split(body: list, units=()) -> Split:
    """The kernel body (and each unit's) as nodes: regions, barriers, calls, and the branches and loops
    around them."""
    counter = itertools.count()
    everything = []

    def new(node):
        everything.append(node)
        return node

    def walk(stmts, in_loop):
        nodes, pending = [], []

        def flush():
            if pending:
                exits, leaves = _leaves(pending)
                lines = sorted({_where(s) for s in pending}, key=_line_key)
                where = lines[0] if len(lines) == 1 else f"{lines[0]}-{lines[-1].rsplit(':', 1)[-1]}"
                nodes.append(new(Region(next(counter), list(pending), where, exits, leaves, in_loop)))
                pending.clear()

        for stmt in stmts:
            if not _has_barrier(stmt):
                pending.append(stmt)
                continue
            flush()
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and \
                    isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "cu_call":
                nodes.append(new(CallNode(next(counter), stmt.value.args[0].value, _where(stmt), in_loop)))
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and \
                    isinstance(stmt.value.func, ast.Name) and stmt.value.func.id in BARRIERS:
                nodes.append(new(BarrierNode(next(counter), BARRIERS[stmt.value.func.id], stmt.value.args,
                                         _where(stmt), in_loop)))
            elif isinstance(stmt, ast.If):
                ident = next(counter)
                node = BranchNode(ident, "if", stmt.test, None, None, [], [], _where(stmt), in_loop)
                new(node)
                node.body, node.orelse = walk(stmt.body, in_loop), walk(stmt.orelse, in_loop)
                nodes.append(node)
            elif isinstance(stmt, ast.While):
                node = new(BranchNode(next(counter), "while", stmt.test, None, None, [], [], _where(stmt), in_loop))
                node.body = walk(stmt.body, True)
                nodes.append(node)
            elif isinstance(stmt, ast.For):
                node = new(BranchNode(next(counter), "for", None, _range_bounds(stmt), stmt.target.id, [], [],
                                  _where(stmt), in_loop))
                node.body = walk(stmt.body, True)
                nodes.append(node)
            else:
                raise Unsupported(f"a barrier inside a {type(stmt).__name__} statement", _where(stmt))
        flush()
        for node in nodes:
            if isinstance(node, BranchNode) and node.kind != "if" and node.body and isinstance(node.body[-1], Region):
                node.body[-1].at_loop_end = True
        return nodes

    unit_nodes = {u.id: walk(u.body, False) for u in units}
    nodes = walk(body, False)
    everything.sort(key=lambda n: n.id)
    return Split(nodes, everything, [n for n in everything if isinstance(n, Region)], unit_nodes)


def _range_bounds(stmt: ast.For) -> list:
    """[start, stop, step] of ``for x in range(...)``; other loops around barriers are not taken."""
    call = stmt.iter
    if not (isinstance(stmt.target, ast.Name) and isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
            and call.func.id == "range" and 1 <= len(call.args) <= 3 and not call.keywords):
        raise Unsupported("a loop around a barrier that is not `for name in range(...)`", _where(stmt))
    args = list(call.args)
    if len(args) == 1:
        args = [ast.Constant(0)] + args
    if len(args) == 2:
        args.append(ast.Constant(1))
    return args


# ---- variables: which live across regions, which can be recomputed -----------------------------


def _names(node, ctx=ast.Load) -> set:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def _exposed(stmts, assigned: set) -> tuple:
    """(names read before this code surely assigned them, names surely assigned at its end)."""
    exposed = set()
    assigned = set(assigned)

    def reads(node):
        exposed.update(_names(node) - assigned)

    for stmt in stmts:
        if isinstance(stmt, ast.Assign):
            reads(stmt.value)
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    assigned.add(target.id)
                elif isinstance(target, ast.Tuple):
                    reads(ast.Tuple([e for e in target.elts if not isinstance(e, ast.Name)], ast.Load()))
                    assigned.update(e.id for e in target.elts if isinstance(e, ast.Name))
                else:
                    reads(target)
        elif isinstance(stmt, ast.AugAssign):
            reads(stmt.value)
            if isinstance(stmt.target, ast.Name):
                if stmt.target.id not in assigned:
                    exposed.add(stmt.target.id)
                assigned.add(stmt.target.id)
            else:
                reads(stmt.target)
        elif isinstance(stmt, ast.If):
            reads(stmt.test)
            e1, a1 = _exposed(stmt.body, assigned)
            e2, a2 = _exposed(stmt.orelse, assigned)
            exposed |= e1 | e2
            assigned = a1 & a2
        elif isinstance(stmt, ast.While):
            reads(stmt.test)
            exposed |= _exposed(stmt.body, assigned)[0]
        elif isinstance(stmt, ast.For):
            reads(stmt.iter)
            exposed |= _exposed(stmt.body, assigned | _names(stmt.target, ast.Store))[0]
        else:
            reads(stmt)
    return exposed, assigned


def _reads(node) -> set:
    if isinstance(node, CallNode):
        return set()
    if isinstance(node, Region):
        return set().union(*(_names(s) for s in node.stmts))
    if isinstance(node, BarrierNode):
        return set().union(set(), *(_names(a) for a in node.args))
    if node.kind == "for":
        return set().union(*(_names(b) for b in node.bounds))
    return _names(node.test)


def _defs(node) -> set:
    if isinstance(node, Region):
        return set().union(*(_names(s, ast.Store) for s in node.stmts))
    if isinstance(node, BranchNode) and node.kind == "for":
        return {node.target}
    return set()


_PURE_CALLS = {"len", "min", "max", "abs", "int", "float"}


@dataclasses.dataclass
class Variables:
    """Per-thread state of a kernel with barriers."""

    stored: list              # live across regions: an array (or dict) per variable, v_<name>[cu_g]
    remat: dict               # name -> its defining expression, recomputed where it is read
    remat_order: list         # remat names, each after those its expression reads
    universe: set             # every variable the body assigns


def variables(sp: Split, params: list, param_types: dict) -> Variables:
    """Which variables must be kept per thread between regions, and which can be recomputed."""
    universe = set()
    defs_count: dict = {}
    single: dict = {}
    for node in sp.all_nodes:
        if isinstance(node, Region):
            for stmt in node.stmts:
                for sub in ast.walk(stmt):
                    if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                        universe.add(sub.id)
                        defs_count[sub.id] = defs_count.get(sub.id, 0) + 1
                    if isinstance(sub, ast.Assign) and len(sub.targets) == 1 and isinstance(sub.targets[0], ast.Name):
                        single.setdefault(sub.targets[0].id, sub.value)
        elif isinstance(node, BranchNode) and node.kind == "for":
            universe.add(node.target)
            defs_count[node.target] = defs_count.get(node.target, 0) + 2   # never recomputed
    fixed = {p for p in params if p not in universe}
    tuples = {p for p in fixed if type(param_types.get(p)).__name__ in ("UniTuple", "Tuple")}
    candidates = {v for v, n in defs_count.items() if n == 1 and v in single}
    changed = True
    while changed:
        changed = False
        for v in sorted(candidates):
            if not _pure(single[v], fixed, tuples, candidates):
                candidates.discard(v)
                changed = True
    remat = {v: single[v] for v in candidates}
    order, placed = [], set()
    while len(order) < len(remat):   # each after those it reads (pure expressions have no cycles)
        for v in sorted(remat):
            if v not in placed and _names(remat[v]) & set(remat) <= placed:
                order.append(v)
                placed.add(v)
    if len(sp.all_nodes) == 1:       # one region run once per thread: nothing lives across
        return Variables([], remat, order, universe)
    stored = set()
    for node in sp.all_nodes:
        exposed = _exposed(node.stmts, set())[0] if isinstance(node, Region) else _reads(node)
        for v in exposed & universe:
            if v in remat:
                continue
            elsewhere = any(v in _defs(other) for other in sp.all_nodes if other is not node)
            if elsewhere or (node.in_loop and v in _defs(node)):
                stored.add(v)
    return Variables(sorted(stored), remat, order, universe)


def _pure(expr, fixed: set, tuples: set, remat: set) -> bool:
    """Is ``expr`` a function of the coordinates, unchanging arguments and other such names only?"""
    def ok(node) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Name):
            return node.id in CONTEXT or node.id in fixed or node.id in remat or node.id.startswith("cu_")
        if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Tuple)):
            return all(ok(c) for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr))
        if isinstance(node, ast.Attribute):
            return node.attr in ("shape", "ndim", "size") and ok(node.value) or _dotted(node)
        if isinstance(node, ast.Subscript):
            if isinstance(node.slice, ast.Slice):    # a view: no memory is read
                return ok(node.value) and all(ok(p) for p in (node.slice.lower, node.slice.upper, node.slice.step)
                                              if p is not None)
            base = node.value
            if isinstance(base, ast.Name) and (base.id in tuples or base.id.startswith(("cu_sh", "cu_lo", "cu_dsh"))):
                return ok(node.slice)
            return isinstance(base, ast.Attribute) and base.attr == "shape" and ok(base) and ok(node.slice)
        if isinstance(node, ast.Call) and not node.keywords:
            func = node.func
            if isinstance(func, ast.Name) and func.id in _PURE_CALLS or _dotted(func) or _fixed_shape(func):
                return all(ok(a) for a in node.args)
            if isinstance(func, ast.Attribute) and func.attr == "view":
                return ok(func.value) and all(_dotted(a) for a in node.args)
        return False

    return ok(expr)


def _fixed_shape(func) -> bool:
    """``cu_rt.fixed_shape``: a shared array seen with constant shape (``translate``), a view like ``a[i]``."""
    return (isinstance(func, ast.Attribute) and func.attr == "fixed_shape" and isinstance(func.value, ast.Name)
            and func.value.id == "cu_rt")


def _dotted(node) -> bool:
    """``numba.types.float32`` or ``np.float32``: a type, callable as a cast."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in ("numba", "np")
