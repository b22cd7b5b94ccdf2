"""The compiled tier's module writer: a split kernel (``fission.py``) as a Python module of njit functions.

The module (kept in the cache directory; ``compiled.py`` imports it) has:

* ``cu_node_K``: one thread's part of node K (a region between barriers, the test of
  an ``if``/``while`` around barriers, the range of such a ``for``), with the variables
  that live across barriers loaded from and stored to per-thread arrays (``v_x[cu_g]``);
* ``cu_allocate``: those arrays and the kernel's shared and local memory;
* for a kernel without grid or group barriers, ``cu_launch``: its blocks one after
  another, each running the kernel's control flow as compiled code (``blockwise.py``);
* for the others, ``CODE`` (the control flow as bytecode for ``scopes.Machine``),
  ``cu_run``, which runs one node for every live thread of the machine's scope, and
  ``cu_drive``, the whole launch compiled (``grid_machine`` steps through ``CODE``;
  both written by ``gridwise.py``).
"""

from __future__ import annotations

import ast

from .blockwise import write_blockwise
from .gridwise import write_gridwise
from .region_code import StatusRewriter, copy_statement, on_stack, stack_declarations
from .fission import BarrierNode, CallNode, Region, Split, Variables, _defs, _exposed, _names, _reads
from .translation import CONTEXT, Translation

__all__ = ["write_module"]



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
                 header: str, imports: str, boundscheck: bool = True, bare: bool = True,
                 constants: dict | None = None) -> str:
    """The CPU module for one kernel (see the module docstring).

    Unchecked indexes if not ``boundscheck``; ``bare``: the per-thread functions without numba's
    reference counting (``cpu_runtime.BARE``), which a kernel using typed dicts cannot do without.
    ``constants``: parameter -> its value, a tuple of 0s and 1s at the launches this module is for
    (``compiled.constant_tuples``); ``cu_launch`` takes them as module constants, which LLVM folds into
    the code it inlines.
    """
    writer = _ModuleWriter(tr, sp, var, storage_types, cooperative)
    writer.constants = dict(constants or {})
    if not boundscheck:
        writer.inner, writer.driver = "@cu_rt.INNER_UNCHECKED", "@cu_rt.DRIVER_UNCHECKED"
    if bare:
        writer.inner = "@cu_rt.BARE" if boundscheck else "@cu_rt.BARE_UNCHECKED"
    return writer.write(header, imports)


class _ModuleWriter:
    """Writes the module: ``cu_node_K`` (each node's code for one thread), ``cu_allocate``, and
    ``cu_launch`` (``blockwise.py``) or ``CODE``, ``cu_run`` and ``cu_drive`` (``gridwise.py``)."""

    inner, driver = "@cu_rt.INNER", "@cu_rt.DRIVER"   # the decorators: checked indexes
    constants: dict = {}   # parameter -> its value at this launch, a tuple of 0s and 1s (``write_module``)

    def __init__(self, tr, sp, var, storage_types, cooperative):
        self.tr, self.sp, self.var, self.types, self.coop = tr, sp, var, storage_types, cooperative
        self.fixed_params = [p for p in tr.params if p not in var.universe]
        self.out = _Lines()
        self.scalar = {v: t for v, t in storage_types.items() if not t.startswith(("numba.", "carray:"))}
        self.arrays = {v: (t.split(":")[1], int(t.split(":")[2]))   # kept by address (cpu_runtime.keep_array)
                       for v, t in storage_types.items() if t.startswith("carray:")}
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
            elif v in self.arrays:
                dtype, ndim = self.arrays[v]
                shape = "".join(f"v_{v}[cu_g, {2 + d}], " for d in range(ndim))
                lines.append(f"if v_{v}[cu_g, 0]:")
                lines.append(f"    {v} = cu_rt.array_at(v_{v}[cu_g, 1], ({shape}), np.{dtype})")
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
        stores = [f"cu_rt.keep_array(v_{v}, cu_g, {v})" if v in self.arrays else f"v_{v}[cu_g] = {v}"
                  for v in sorted(defs & stored)]
        prologue = self.prologue(reads, loads)
        stacked = on_stack(node, reads, self.tr.storage, self.var.remat, set(self.arrays))
        for v, storage in stacked.items():   # copied in, used, copied back
            prologue[prologue.index(f"{v} = {storage}[cu_g]")] = (
                f"{v} = {storage}_on_stack(); cu_rt.copy_array({v}, {storage}[cu_g])")
            stores.append(f"cu_rt.copy_back({storage}[cu_g], {v})")
        body = StatusRewriter(stores).visit(ast.Module(body=[copy_statement(s) for s in node.stmts], type_ignores=[]))
        self.branches[node.id] = ([f"# region {node.id}: {node.where}"] + prologue
                                  + ast.unparse(body).splitlines() + stores + ["return cu_rt.FELL_THROUGH"])

    def test(self, node, lines: list, reads: set) -> None:
        if node.id in self.branches:   # a unit's test, written at its first call
            return
        loads = set(self.var.stored) & reads
        self.branches[node.id] = ([f"# test {node.id}: {node.where}"] + self.prologue(reads, loads) + lines)

    def group_barrier(self, node: BarrierNode) -> None:
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
            out(self.inner)
            out(f"def cu_node_{k}({', '.join(params)}):")
            with out:
                out(f'"""{lines[0].lstrip("# ")}"""')
                for line in lines[1:]:
                    out(line)
            out()

    # ---- the control flow as bytecode ---------------------------------------------------

    def emit(self, op: str, a: int = 0, b: int = 0, c: int = 0) -> int:
        self.code.append([op, a, b, c])
        return len(self.code) - 1

    def patch(self, at: int, slot: int, value: int) -> None:
        self.code[at][slot] = value

    def compile(self, nodes: list) -> None:
        for node in nodes:
            if isinstance(node, CallNode):   # the unit's control flow here; its code is in step once
                self.compile(self.sp.units[node.unit])
            elif isinstance(node, Region):
                if node.id not in self.branches:
                    self.region(node)
                self.emit("RUN", node.id, 0, int(node.at_loop_end))
            elif isinstance(node, BarrierNode):
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
        for line in stack_declarations(self.tr.storage):
            out(line)
        for p, value in self.constants.items():
            out(f"cu_const_{p} = {value!r}   # {p} at the launches this module is for")
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
            out(self.inner)
            for line in ast.unparse(helper.tree).splitlines():
                out(line)
            out()
        self.step()
        if self.coop:
            write_gridwise(self)
        else:
            write_blockwise(self)
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
                elif v in self.arrays:   # [set, address, *shape] per thread: cpu_runtime.keep_array
                    out(f"v_{v} = np.zeros((cu_nslot * cu_nt, {2 + self.arrays[v][1]}), np.int64)")
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
                where, arg = self.storage_names.index('v_' + p), self.tr.params.index(p)
                if p in self.arrays:
                    out(f"cu_rt.keep_array_everywhere(cu_storage[{where}], cu_args[{arg}])")
                else:
                    out(f"cu_storage[{where}][:] = cu_args[{arg}]")
            out("return None")
        out()
