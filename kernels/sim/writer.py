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
  ``cu_drive``, the whole launch compiled (``grid_machine`` steps through ``CODE``).
"""

from __future__ import annotations

import ast

from .blockwise import write_blockwise
from .region_code import StatusRewriter, copy_statement, on_stack, stack_declarations
from .fission import BarrierNode, BranchNode, CallNode, Region, Split, Variables, _defs, _exposed, _names, _reads
from .translate import CONTEXT, Translation

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
                 header: str, imports: str, boundscheck: bool = True, bare: bool = True) -> str:
    """The CPU module for one kernel (see the module docstring).

    Unchecked indexes if not ``boundscheck``; ``bare``: the per-thread functions without numba's
    reference counting (``cpu_runtime.BARE``), which a kernel using typed dicts cannot do without.
    """
    writer = _ModuleWriter(tr, sp, var, storage_types, cooperative)
    if not boundscheck:
        writer.inner, writer.driver = "@cu_rt.INNER_UNCHECKED", "@cu_rt.DRIVER_UNCHECKED"
    if bare:
        writer.inner = "@cu_rt.BARE" if boundscheck else "@cu_rt.BARE_UNCHECKED"
    return writer.write(header, imports)


class _ModuleWriter:
    """Writes the module: ``cu_node_K`` (each node's code for one thread), ``cu_allocate``, and
    ``cu_launch`` (``blockwise.py``) or ``CODE`` and ``cu_run`` (for ``scopes.Machine``)."""

    inner, driver = "@cu_rt.INNER", "@cu_rt.DRIVER"   # the decorators: checked indexes

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
            self.run()
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
        out(self.driver)
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
        self.drive(params)

    def drive(self, run_params: list) -> None:
        """``cu_drive``: the whole launch, compiled: ``grid_machine.step`` finds the next node, ``cu_run``
        runs it for the scope's threads, ``grid_machine.take`` goes on (``scopes.Machine``'s loop, in numba).
        Grid and group barriers are checked here: every block at a grid barrier, and no thread gone; each
        group's blocks as many as its members."""
        out = self.out
        state = ["cu_code", "cu_st", "cu_scope", "cu_values", "cu_waiting", "cu_flags", "cu_ranges", "cu_counter"]
        tail = run_params[run_params.index("cu_alive"):]
        out("CODE_OPS = cu_gm.encode(CODE)   # the same instructions, as opcodes for grid_machine")
        out()
        out(self.driver)
        out(f"def cu_drive({', '.join(state + tail)}):")
        with out:
            out('"""The launch: every node the control code reaches, for every live thread of its scope."""')
            out("cu_nt = cu_bdx * cu_bdy * cu_bdz")
            out("cu_none3 = np.zeros((0, 3), np.int64)")
            with out.block("while True:"):
                out(f"cu_op = cu_gm.step({', '.join(state)})")
                with out.block("if cu_op == cu_gm.END:"):
                    out("return cu_rt.OK")
                with out.block("if cu_rt.cancelled(cu_cancel):"):
                    out("return cu_rt.CANCELLED")
                out("cu_node, cu_flag = cu_code[cu_st[0], 1], cu_code[cu_st[0], 3]")
                out("cu_S = np.flatnonzero(cu_scope)")
                with out.block("if cu_op == cu_gm.GRID:   # grid_machine.check_grid_barrier"):
                    out("cu_code_ = cu_gm.check_grid_barrier(cu_S, cu_alive, cu_nt, cu_report, cu_node)")
                    with out.block("if cu_code_ != cu_rt.OK:"):
                        out("return cu_code_")
                    out(f"cu_gm.take({', '.join(state)}, cu_S, cu_none3, cu_scope)")
                    out("continue")
                out("cu_it = cu_counter[cu_st[2] - 1, 0] if cu_op == cu_gm.ASSIGN else 0")
                out("cu_kind = 1 if cu_op == cu_gm.TEST or cu_op == cu_gm.GROUP else (2 if cu_op == cu_gm.FOR_BOUNDS "
                    "else 0)")
                args = ", ".join(["cu_kind", "cu_node", "cu_flag", "cu_it", "cu_S", "0"] + tail)
                out(f"cu_code_, cu_res, cu_bounds, cu_lv = cu_run({args})")
                with out.block("if cu_code_ != cu_rt.OK:"):
                    out("return cu_code_")
                with out.block("if cu_op == cu_gm.GROUP:"):
                    out("cu_code_ = cu_gm.check_group_barrier(cu_S, cu_res, cu_report, cu_node)")
                    with out.block("if cu_code_ != cu_rt.OK:"):
                        out("return cu_code_")
                out(f"cu_gm.take({', '.join(state)}, cu_res, cu_bounds, cu_lv)")
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
