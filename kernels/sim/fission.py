"""The compiled tier's back end: split a kernel at its barriers (loop fission), write the CPU module.

On a GPU every thread of a block runs the kernel at once and waits for the others
at ``syncthreads``.  On one CPU core the same result comes from running the code
*between* two barriers (a **region**) for every thread of the block, then the next
region, and so on: MCUDA's "thread loops".  ``split`` finds the regions and the
control flow around them; ``write_module`` turns them into numba-compiled Python.

What runs where:

* a **region** (statements without a barrier) becomes ``region_K(...)``, a function
  run once per thread; variables that live from one region to another are kept
  per thread in arrays (``v_acc[cu_g]``), loaded at its start and stored at its end;
  variables that are a pure function of the coordinates (``row = blockIdx.y * T + ty``)
  are recomputed instead;
* an ``if``/``while``/``for`` that contains a barrier runs *once for the block*: its
  test is evaluated by every thread (``test_K``), they must agree (CUDA requires it:
  else ``DIVERGENT``, the threaded tier's ``DivergentBarrierError``), and the block
  takes that way;
* a grid barrier (``this_grid().sync()``, ``group_barrier``) works the same one
  level up: the code between grid barriers runs for every block of the grid (or of
  the group) before the next.  So the driver works on a **scope**, a set of blocks
  (``cu_S3``, an array of block numbers): one block for kernels without grid
  barriers (blocks run one after another), the whole grid otherwise.  Where blocks
  disagree about a test, the scope splits (a block group of Cocktailer's recursion
  unroll runs its lane while the other group runs its own).

A region ends for a thread with a status (``cpu_runtime``): fell through, exited
(``return``: the thread is gone, its block goes on without it), or left / went on
with the enclosing block-level loop (``break`` / ``continue``: the whole block must agree).
"""

from __future__ import annotations

import ast
import dataclasses
import itertools

from .translate import BARRIERS, CONTEXT, Translation, Unsupported, numba_type_source

__all__ = ["Region", "Split", "split", "variables", "write_module"]


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
class Barrier:
    id: int
    kind: str                 # block, grid or group
    args: list
    where: str
    in_loop: bool = False


@dataclasses.dataclass
class Branch:
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
class Call:
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
                nodes.append(new(Call(next(counter), stmt.value.args[0].value, _where(stmt), in_loop)))
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and \
                    isinstance(stmt.value.func, ast.Name) and stmt.value.func.id in BARRIERS:
                nodes.append(new(Barrier(next(counter), BARRIERS[stmt.value.func.id], stmt.value.args,
                                         _where(stmt), in_loop)))
            elif isinstance(stmt, ast.If):
                ident = next(counter)
                node = Branch(ident, "if", stmt.test, None, None, [], [], _where(stmt), in_loop)
                new(node)
                node.body, node.orelse = walk(stmt.body, in_loop), walk(stmt.orelse, in_loop)
                nodes.append(node)
            elif isinstance(stmt, ast.While):
                node = new(Branch(next(counter), "while", stmt.test, None, None, [], [], _where(stmt), in_loop))
                node.body = walk(stmt.body, True)
                nodes.append(node)
            elif isinstance(stmt, ast.For):
                node = new(Branch(next(counter), "for", None, _range_bounds(stmt), stmt.target.id, [], [],
                                  _where(stmt), in_loop))
                node.body = walk(stmt.body, True)
                nodes.append(node)
            else:
                raise Unsupported(f"a barrier inside a {type(stmt).__name__} statement", _where(stmt))
        flush()
        for node in nodes:
            if isinstance(node, Branch) and node.kind != "if" and node.body and isinstance(node.body[-1], Region):
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
    if isinstance(node, Call):
        return set()
    if isinstance(node, Region):
        return set().union(*(_names(s) for s in node.stmts))
    if isinstance(node, Barrier):
        return set().union(set(), *(_names(a) for a in node.args))
    if node.kind == "for":
        return set().union(*(_names(b) for b in node.bounds))
    return _names(node.test)


def _defs(node) -> set:
    if isinstance(node, Region):
        return set().union(*(_names(s, ast.Store) for s in node.stmts))
    if isinstance(node, Branch) and node.kind == "for":
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
        elif isinstance(node, Branch) and node.kind == "for":
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
            if isinstance(func, ast.Name) and func.id in _PURE_CALLS or _dotted(func):
                return all(ok(a) for a in node.args)
            if isinstance(func, ast.Attribute) and func.attr == "view":
                return ok(func.value) and all(_dotted(a) for a in node.args)
        return False

    return ok(expr)


def _dotted(node) -> bool:
    """``numba.types.float32`` or ``np.float32``: a type, callable as a cast."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in ("numba", "np")


# ---- writing the module ---------------------------------------------------------------------------


class _Lines:
    def __init__(self):
        self.lines, self.level = [], 0

    def __call__(self, text: str = "") -> None:
        self.lines.append("    " * self.level + text if text else "")

    def block(self, text: str):
        self(text)
        return self

    def __enter__(self):
        self.level += 1

    def __exit__(self, *exc):
        self.level -= 1

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def write_module(tr: Translation, sp: Split, var: Variables, storage_types: dict, cooperative: bool,
                 header: str, imports: str) -> str:
    """The CPU module for one kernel: helpers, ``region_K``/``test_K`` functions and ``launch``."""
    return _ModuleWriter(tr, sp, var, storage_types, cooperative).write(header, imports)


class _ModuleWriter:
    """Writes the module: ``CODE`` (the control flow, for ``scopes.py``'s machine), ``step`` (every
    node's code for one thread: ``if cu_node == K: ...``) and ``launch`` (the loop that asks the
    machine what to run next and runs ``step`` for every live thread of the scope)."""

    def __init__(self, tr, sp, var, storage_types, cooperative):
        self.tr, self.sp, self.var, self.types, self.coop = tr, sp, var, storage_types, cooperative
        self.fixed_params = [p for p in tr.params if p not in var.universe]
        self.out = _Lines()
        self.scalar = {v: t for v, t in storage_types.items() if not t.startswith("numba.")}
        self.code: list = []
        self.branches: dict = {}        # node id -> lines of step's code for it
        self.assigns: dict = {}         # for node id -> the id of its loop variable's store

    # ---- one thread's code for each node ---------------------------------------------

    def prologue(self, reads: set, loads: set) -> list:
        """Recomputed and loaded variables at the start of a node's code."""
        lines, needed = [], set()
        for v in reversed(self.var.remat_order):  # the remat names read, and those their expressions read
            if v in reads or v in needed:
                needed.add(v)
                needed |= _names(self.var.remat[v]) & set(self.var.remat)
        for v in self.var.remat_order:
            if v in needed:
                lines.append(f"{v} = {ast.unparse(self.var.remat[v])}")
        for v in sorted(loads):
            if v in self.scalar:
                lines.append(f"{v} = v_{v}[cu_g]")
            else:
                lines.append(f"if cu_g in v_{v}:")
                lines.append(f"    {v} = v_{v}[cu_g]")
        return lines

    def region(self, node: Region) -> None:
        reads = set().union(*(_names(s) for s in node.stmts))
        defs = _defs(node)
        exposed, surely = _exposed(node.stmts, set())
        stored = set(self.var.stored)
        loads = stored & (exposed | (defs - surely) | (defs if node.leaves else set()))
        stores = [f"v_{v}[cu_g] = {v}" for v in sorted(defs & stored)]
        body = _StatusRewriter(stores).visit(ast.Module(body=[_copy(s) for s in node.stmts], type_ignores=[]))
        self.branches[node.id] = ([f"# region {node.id}: {node.where}"] + self.prologue(reads, loads)
                                  + ast.unparse(body).splitlines() + stores + ["return cu_rt.FELL_THROUGH"])

    def test(self, node, lines: list, reads: set) -> None:
        if node.id in self.branches:   # a unit's test, written at its first call
            return
        loads = set(self.var.stored) & reads
        self.branches[node.id] = ([f"# test {node.id}: {node.where}"] + self.prologue(reads, loads) + lines)

    def group_barrier(self, node: Barrier) -> None:
        """``group_barrier(state, slot, members)`` (kernels/utask/groups.py) without its spin-wait.

        Every thread of every block of the scope runs this before any goes on, so thread 0 of
        each block does the real barrier's arrival (count up; the last one resets the count
        and bumps the generation), leaving ``state`` as a GPU leaves it, and nobody has to
        wait.  The value, ``slot * 2**31 + members``, lets the launch check that ``members``
        blocks of that group arrived together (``compiled._drive``).
        """
        state, slot, members = (ast.unparse(a) for a in node.args)
        reads = set().union(*(_names(a) for a in node.args))
        lines = [f"cu_state, cu_slot, cu_members = {state}, {slot}, {members}",
                 "if cu_tx == 0:",
                 "    if cu_rt.atomic_add(cu_state, cu_slot, 1) == cu_members - 1:",
                 "        cu_rt.atomic_exch(cu_state, cu_slot, 0)",
                 "        cu_rt.atomic_add(cu_state, cu_slot + 1, 1)",
                 "return cu_slot * cu_rt.GROUP_KEY + cu_members"]
        self.test(node, lines, reads)

    def step(self) -> None:
        """One function per node, ``cu_node_K(...)``: a thread's part of node K, taking what it uses.

        (One function holding every node's code, chosen by a test, cost 5 to 30 times a node's
        work per thread: numba sets up and releases every variable of every branch on each call.)
        """
        context = list(CONTEXT) + ["cu_it", "cu_out", "cu_cancel"]
        names = (context + list(self.fixed_params) + [f"v_{v}" for v in self.var.stored]
                 + [s.name for s in self.tr.storage])
        self.node_params = {}
        out = self.out
        for k, lines in sorted(self.branches.items()):
            used = _names(ast.parse("\n".join(line for line in lines if not line.lstrip().startswith("#"))))
            params = [n for n in names if n in used]
            self.node_params[k] = params
            out("@cu_rt.INNER")
            out(f"def cu_node_{k}({', '.join(params)}):")
            with out:
                out(f'"""{lines[0].lstrip("# ")}"""')
                for line in lines[1:]:
                    out(line)
            out()

    def dispatch(self, ids: list) -> None:
        """In ``cu_run``: ``cu_r = cu_node_K(...)`` for the node asked for, by a binary tree of tests."""
        out = self.out
        if len(ids) > 8:
            middle = ids[len(ids) // 2]
            with out.block(f"if cu_node < {middle}:"):
                self.dispatch(ids[:len(ids) // 2])
            with out.block("else:"):
                self.dispatch(ids[len(ids) // 2:])
            return
        for n, k in enumerate(ids):
            with out.block(f"{'if' if n == 0 else 'elif'} cu_node == {k}:"):
                out(f"cu_r = cu_node_{k}({', '.join(self.node_params[k])})")
        with out.block("else:"):
            out("cu_r = -1")

    # ---- the control flow as bytecode ---------------------------------------------------

    def emit(self, op: str, a: int = 0, b: int = 0, c: int = 0) -> int:
        self.code.append([op, a, b, c])
        return len(self.code) - 1

    def patch(self, at: int, slot: int, value: int) -> None:
        self.code[at][slot] = value

    def compile(self, nodes: list) -> None:
        for node in nodes:
            if isinstance(node, Call):   # the unit's control flow here; its code is in step once
                self.compile(self.sp.units[node.unit])
            elif isinstance(node, Region):
                if node.id not in self.branches:
                    self.region(node)
                self.emit("RUN", node.id, 0, int(node.at_loop_end))
            elif isinstance(node, Barrier):
                if node.kind == "grid":
                    self.emit("GRID", node.id)
                elif node.kind == "group":
                    self.group_barrier(node)
                    self.emit("GROUP", node.id)
            elif node.kind == "if":
                self.test(node, [f"return 1 if ({ast.unparse(node.test)}) else 0"], _names(node.test))
                self.emit("TEST", node.id)
                split = self.emit("IF_SPLIT")
                self.compile(node.body)
                other = self.emit("IF_ELSE")
                self.patch(split, 2, other)
                self.compile(node.orelse)
                self.patch(other, 2, self.emit("IF_JOIN"))
            elif node.kind == "while":
                self.test(node, [f"return 1 if ({ast.unparse(node.test)}) else 0"], _names(node.test))
                self.emit("LOOP_ENTER")
                head = self.emit("TEST", node.id)
                cond = self.emit("WHILE_COND")
                self.compile(node.body)
                back = self.emit("LOOP_BACK", head)
                exit_at = self.emit("LOOP_EXIT", 0)
                self.patch(cond, 2, exit_at)
                self.patch(back, 2, exit_at)
            else:
                bounds = [f"cu_out[{k}] = int({ast.unparse(b)})" for k, b in enumerate(node.bounds)]
                self.test(node, bounds + ["return 0"], _reads(node))
                self.emit("FOR_BOUNDS", node.id)
                group = self.emit("FOR_GROUP")
                check = self.emit("FOR_CHECK", 0, group)
                if node.target in self.var.stored:
                    assign = self.assigns.get(node.id)
                    if assign is None:
                        assign = self.assigns[node.id] = len(self.sp.all_nodes) + len(self.assigns)
                        self.branches[assign] = [f"# the loop variable of {node.where}",
                                                 f"v_{node.target}[cu_g] = cu_it", "return cu_rt.FELL_THROUGH"]
                    self.emit("ASSIGN", assign)
                self.compile(node.body)
                self.emit("FOR_BACK", check, group)
                exit_at = self.emit("LOOP_EXIT", 1)
                self.patch(group, 2, exit_at)

    # ---- the module ---------------------------------------------------------------

    def write(self, header: str, imports: str) -> str:
        out = self.out
        for line in header.splitlines():
            out(f"# {line}" if line else "#")
        out(imports)
        for v, text in sorted(self.types.items()):
            if text.startswith("numba."):
                out(f"T_{v} = {text}")
        self.compile(self.sp.nodes)
        self.emit("END")
        out(f"COOPERATIVE = {self.coop}   # grid or group barriers: the whole grid is one scope")
        out("# the control flow, run by pyflow.kernels.sim.scopes.Machine: (op, a, b, c); see its docstring")
        out("CODE = [")
        for k, (op, a, b, c) in enumerate(self.code):
            out(f"    ({op}, {a}, {b}, {c}),   # {k}")
        out("]")
        out()
        self.allocate()
        for helper in self.tr.helpers:
            out("@cu_rt.INNER")
            for line in ast.unparse(helper.tree).splitlines():
                out(line)
            out()
        self.step()
        self.run()
        return out.text()

    def allocate(self) -> None:
        """``allocate(slots, threads, dyn)``: per-thread variables, shared and local memory (plain Python)."""
        out = self.out
        self.storage_names = [f"v_{v}" for v in self.var.stored] + [s.name for s in self.tr.storage]
        out("def cu_allocate(cu_nslot, cu_nt, cu_dyn):")
        with out:
            out('"""What the kernel\'s threads keep: ``cu_nslot`` blocks of ``cu_nt`` threads at a time."""')
            for v in self.var.stored:
                if v in self.scalar:
                    out(f"v_{v} = np.empty(cu_nslot * cu_nt, {self.scalar[v]})")
                else:
                    out(f"v_{v} = Dict.empty(key_type=numba.types.int64, value_type=T_{v})")
            for s in self.tr.storage:
                dtype = f"np.{'bool_' if s.dtype.kind == 'b' else s.dtype.name}"
                if s.kind == "dynamic":
                    out("cu_dsh = cu_rt.garbage((cu_nslot, cu_dyn), np.uint8)   # dynamic shared memory")
                    continue
                rows = "cu_nslot" if s.kind == "shared" else "cu_nslot * cu_nt"
                out(f"{s.name} = cu_rt.garbage(({rows},) + {tuple(s.shape)!r}, {dtype})   # {s.kind} memory, {s.where}")
            out(f"return ({''.join(n + ', ' for n in self.storage_names)})")
        out()
        out("def cu_start_batch(cu_storage, cu_args):")
        with out:
            out('"""Every thread starts with the arguments the kernel reassigns."""')
            stored_params = [p for p in self.tr.params if p in self.var.stored]
            for p in stored_params:
                out(f"cu_storage[{self.storage_names.index('v_' + p)}][:] = cu_args[{self.tr.params.index(p)}]")
            out("return None")
        out()

    def run(self) -> None:
        """``run(...)``: one instruction's node for every live thread of the scope (numba-compiled).

        Only what the kernel needs is written: a kernel of one region and no test has
        nothing its threads must agree on, and only a ``for`` around barriers has a range.
        """
        out = self.out
        params = (["cu_op", "cu_node", "cu_flag", "cu_it", "cu_S", "cu_base", "cu_alive", "cu_where", "cu_report",
                   "cu_cancel", "cu_gdx", "cu_gdy", "cu_gdz", "cu_bdx", "cu_bdy", "cu_bdz"]
                  + list(self.tr.params) + self.storage_names)
        ops = {op for op, *_ in self.code}
        agree = bool(ops - {"RUN", "END"}) or any(isinstance(n, Region) and n.leaves for n in self.sp.all_nodes)
        out("@cu_rt.DRIVER")
        out(f"def cu_run({', '.join(params)}):")
        with out:
            out('"""Node ``cu_node`` for every live thread of the blocks ``cu_S``: each block\'s result.')
            out("")
            out("cu_op: 0 a region (RUN, ASSIGN: its status), 1 a test (TEST, GROUP: its value),")
            out('2 a range (FOR_BOUNDS: start, stop, step).  Threads of a block must agree."""')
            out("cu_nt = cu_bdx * cu_bdy * cu_bdz")
            out("cu_out = np.zeros(3, np.int64)")
            out("cu_res = np.full(cu_S.shape[0], -1, np.int64)")
            out("cu_bounds = np.zeros((cu_S.shape[0], 3), np.int64)")
            out("cu_live = np.zeros(cu_S.shape[0], np.bool_)")
            with out.block("for cu_i in range(cu_S.shape[0]):"):
                out("cu_b = cu_S[cu_i]")
                out("cu_bx = cu_b % cu_gdx")
                out("cu_by = cu_b // cu_gdx % cu_gdy")
                out("cu_bz = cu_b // (cu_gdx * cu_gdy)")
                out("cu_sb = cu_b - cu_base")
                out("cu_first = -1")
                out("cu_t = -1")
                # three loops, not one divided up: two divisions per thread cost more than many nodes' work
                out("for cu_tz in range(cu_bdz):")
                out.level += 1
                out("for cu_ty in range(cu_bdy):")
                out.level += 1
                with out.block("for cu_tx in range(cu_bdx):"):
                    out("cu_t += 1")
                    out("cu_g = cu_sb * cu_nt + cu_t")
                    with out.block("if not cu_alive[cu_g]:"):
                        out("continue")
                    out("cu_where[0] += 1")
                    out("cu_where[1] = cu_b")
                    out("cu_where[2] = cu_t")
                    out("cu_where[3] = cu_node")
                    self.dispatch(sorted(self.branches))
                    with out.block("if cu_op == 0:"):
                        with out.block("if cu_r == cu_rt.EXITED:"):
                            out("cu_alive[cu_g] = False")
                            out("continue")
                        with out.block("if cu_r == cu_rt.STOPPED:"):
                            out("return cu_rt.CANCELLED, cu_res, cu_bounds, cu_live")
                    if "FOR_BOUNDS" in ops:
                        self.bounds_agreement()
                    if agree:
                        self.value_agreement()
                    else:   # one region, no test: nothing for the threads to agree on
                        out("cu_first = cu_r")
                out.level -= 2
                out("cu_res[cu_i] = cu_first")
            out("return cu_rt.OK, cu_res, cu_bounds, cu_live")
        out()

    def bounds_agreement(self) -> None:
        """A range: the first live thread's, which every other thread of the block must give too."""
        out = self.out
        with out.block("if cu_op == 2:"):
            with out.block("if not cu_live[cu_i]:"):
                out("cu_live[cu_i] = True")
                out("cu_bounds[cu_i, 0] = cu_out[0]")
                out("cu_bounds[cu_i, 1] = cu_out[1]")
                out("cu_bounds[cu_i, 2] = cu_out[2]")
            with out.block("elif cu_bounds[cu_i, 0] != cu_out[0] or cu_bounds[cu_i, 1] != cu_out[1] "
                           "or cu_bounds[cu_i, 2] != cu_out[2]:"):
                self.diverge()
            out("continue")

    def value_agreement(self) -> None:
        """A test's value or a region's status: the first live thread's, which the others must give too."""
        out = self.out
        with out.block("if cu_first == -1:"):
            out("cu_first = cu_r")
        with out.block("elif cu_first != cu_r:"):
            with out.block("if cu_flag == 1 and (cu_first == cu_rt.FELL_THROUGH or cu_first == cu_rt.CONTINUED) "
                           "and (cu_r == cu_rt.FELL_THROUGH or cu_r == cu_rt.CONTINUED):"):
                out("cu_first = cu_rt.CONTINUED   # at the end of a loop body, continue is falling through")
                out("continue")
            self.diverge()

    def diverge(self) -> None:
        self.out("cu_report[0] = cu_rt.DIVERGENT; cu_report[1] = cu_b; cu_report[2] = cu_t; cu_report[3] = cu_node")
        self.out("return cu_rt.DIVERGENT, cu_res, cu_bounds, cu_live")


class _StatusRewriter(ast.NodeTransformer):
    """In a region: ``return`` ends the thread; a block-level break / continue stores, then reports."""

    def __init__(self, stores: list):
        self.stores = [ast.parse(s).body[0] for s in stores]
        self.depth = 0

    def visit_Return(self, node):
        return ast.copy_location(ast.Return(_runtime("EXITED")), node)

    def loop(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1
        if isinstance(node, ast.While):   # a spin loop must not outlive a cancelled launch
            check = ast.parse("if cu_rt.cancelled(cu_cancel):\n    return cu_rt.STOPPED").body[0]
            node.body.insert(0, check)
        return node

    visit_For = visit_While = loop

    def leave(self, node, status: str):
        if self.depth:
            return node
        return [*(_copy(s) for s in self.stores), ast.Return(_runtime(status))]

    def visit_Break(self, node):
        return self.leave(node, "BROKE")

    def visit_Continue(self, node):
        return self.leave(node, "CONTINUED")


def _runtime(name: str) -> ast.expr:
    """``cu_rt.NAME``: generated code reaches cpu_runtime through one cu_ name, which no kernel variable can hide."""
    return ast.Attribute(ast.Name("cu_rt", ast.Load()), name, ast.Load())


def _copy(node):
    return ast.parse(ast.unparse(node)).body[0] if isinstance(node, ast.stmt) else node
