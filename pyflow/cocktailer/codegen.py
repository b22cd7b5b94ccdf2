"""Code generation (seed 001): a block of the IR as the source of ONE persistent grid-sync kernel.

The kernel has the shape Cocktailer's artifact generates (SEMANTICS.md sec. 7):
control flow is replicated in every block (every thread runs the same loops and
branches, so they are grid-uniform), and each operator's uTasks are spread over the
blocks by the virtual-block loop::

    for u in range(block, 12, blocks):       # uTask u runs on block u % gridDim
        linear_bias_t16_float32(u, arena_float32[0:256], ...)
    grid.sync()                               # only if a dependence crosses blocks
    barriers += 1

Differences from the artifact, on purpose:

* barriers: the artifact syncs the grid after every operator; here the barrier
  plan (``barriers.py``) puts one only before an access that conflicts with one
  another block may have made since the last barrier.
* while loops: each block evaluates the condition itself; the analysis guarantees
  a barrier between the op that produced the condition's input and the read, and
  between the read and any later overwrite, so every block sees the same value.
* recursion: an explicit stack of frames in shared memory and a loop dispatching
  on their labels, with loops inside the recursive function, also loops that
  call it (the artifact compiles neither): ``codegen_recursion.py``.
* recursion unroll (``CallGroup``): sibling calls at once on disjoint groups of
  blocks, with group barriers instead of ``grid.sync()``: ``codegen_groups.py``.

The code generator, one seam a module:

* ``codegen.py`` (here): ``KernelSource``, the writer: operators, for and while
  loops, branches, function uTasks (inlined, or device functions of their own),
  barriers, run-time index checks, and how an error stops the kernel (or leaves a
  block group); ``generate``.
* ``codegen_recursion.py``: the frame stack, and ``_Segments``, which cuts a
  recursive function's body into the labelled segments the dispatch loop runs.
* ``codegen_groups.py``: recursion unroll's block groups (``call_group``, ``lane``).
* ``codegen_common.py``: what the three share: the ``status`` words (error codes,
  the words of each block group) and IR scalars and views as source text.

``KernelSource`` mixes in the recursion and block-group parts
(``RecursionMixin``, ``CallGroupMixin``): their methods are the writer's, and
write through its ``emit``, ``barrier``, ``fail``...

The source is plain Python; ``pyflow.kernels.utask.generated.build_kernel`` turns it
into a kernel.  ``status`` (int64) returns ``[error, detail, barriers, value]``, then
three words per block group (``codegen_common.py`` says what each holds).
"""

from __future__ import annotations

from pyflow.cocktailer.barriers import CLEAR, BarrierPlan, has_call
from pyflow.cocktailer.codegen_common import (ERR_INDEX, ERR_ITERATIONS, ERR_STACK_OVERFLOW, STATUS_HEAD,
                                              render_offset, render_scalar, render_view)
from pyflow.cocktailer.codegen_groups import _GRID, CallGroupMixin
from pyflow.cocktailer.codegen_recursion import RecursionMixin
from pyflow.cocktailer.ir import (Branch, Call, CallGroup, FunctionCall, Loop, StmtBlock, TensorRef, UOperator,
                                  free_vars, walk)
from pyflow.cocktailer.scalars import BinOp, Load, Var, scalar_loads

__all__ = ["KernelSource", "generate", "ERR_STACK_OVERFLOW", "ERR_ITERATIONS", "ERR_INDEX", "render_scalar",
           "STATUS_HEAD"]


# ---- the source writer -------------------------------------------------------------


def _checked_refs(refs=(), scalars=()) -> list:
    """The views at a run-time offset with known bounds in ``refs``/``scalars``, inner loads first."""
    out = []

    def ref(r):
        if r.offset.dynamic is not None:
            scalar(r.offset.dynamic)
            if r.bounds is not None and all(r is not x for x in out):
                out.append(r)

    def scalar(x):
        if isinstance(x, Load):
            ref(x.ref)
        elif isinstance(x, BinOp):
            scalar(x.a)
            scalar(x.b)

    for r in refs:
        ref(r)
    for x in scalars:
        scalar(x)
    return out


class KernelSource(RecursionMixin, CallGroupMixin):
    """Generate the kernel ``name`` for ``block`` (a program body or a part of it).

    The recursion (``codegen_recursion.py``) and the block groups of recursion
    unroll (``codegen_groups.py``) are written by the methods mixed in.
    """

    def __init__(self, name: str, block: StmtBlock, functions, free_vars=(), stack_depth: int = 64,
                 inline_functions: bool = True, drop_barriers: frozenset = frozenset(), first_site: int = 0,
                 while_loops=None):
        self.name, self.block = name, block
        self.stack_depth = stack_depth
        self.inline = inline_functions
        self.lines: list[str] = []
        self.namespace: dict = {"int64": _int64()}
        self.buffers: dict = {}           # name -> Buffer, in order of first use
        self.helper_sources: list[str] = []   # device functions of function uTasks not inlined
        self.helper_count = 0
        self.in_function = False           # writing a device function's body (a function uTask not inlined)
        self.helper = None                 # ... that one's name: its uTasks are private copies
        self.private: dict = {}            # (helper, uTask fn) -> the copy's name in the namespace
        self.loop_ids: dict = {}
        self.local_names: dict = {}       # id(loop counter Var) -> its local in the kernel (``local``)
        self.used_locals: set = {v.name for v in free_vars}   # (the kernel's free vars are its parameters)
        self.while_loops = while_loops    # the program's while loops: an iteration error reports a place in it
        self.functions = list(functions)
        self.free_vars = list(free_vars)
        self.plan = BarrierPlan(inline_functions)
        self.drop_barriers = drop_barriers
        self.plan.block(block, CLEAR)
        for fdef in self._called_functions(block):
            # every segment of a recursive body starts with a grid barrier (see _Segments)
            self.plan.in_recursion = True
            self.plan.block(fdef.body, CLEAR)
            self.plan.in_recursion = False
        self.barrier_sites: list = []      # the plan keys of every emitted grid.sync
        self.ctx = _GRID                   # the whole grid, or one block group of a CallGroup
        self.index_sites: list = []        # the TensorRef of each run-time index check, numbered from first_site
        self.first_site = first_site
        self.exits: list = []              # in a block group: the Python loops around the code being written,
                                           # innermost last: ("lane",), ("loop",) or ("dispatch", first frame)
        self.group_slots = 0               # block groups numbered so far (three status words each)
        self.frame_stacks: dict = {}       # the shared-memory frame stacks: name -> (frames, int64 fields)

    # -- bookkeeping ----------------------------------------------------------------
    def _called_functions(self, block):
        seen = []
        for item in walk(block):
            if isinstance(item, Call) and item.fn not in seen:
                seen.append(item.fn)
        return seen

    def _use_buffer(self, buffer) -> str:
        self.buffers.setdefault(buffer.name, buffer)
        return buffer.name

    def _use_ref(self, ref: TensorRef):
        self._use_buffer(ref.buffer)
        for load in scalar_loads(ref.offset.dynamic) if ref.offset.dynamic is not None else ():
            self._use_ref(load.ref)

    def _use_scalar(self, s):
        for load in scalar_loads(s) if s is not None else ():
            self._use_ref(load.ref)

    def _fn(self, op: UOperator) -> str:
        if self.helper is not None:
            return self._private_fn(op)
        name = op.fn_name
        known = self.namespace.get(name)
        if known is not None and known is not op.fn:
            k = 2
            while self.namespace.get(f"{name}_{k}") not in (None, op.fn):
                k += 1
            name = f"{name}_{k}"
        self.namespace[name] = op.fn
        return name

    def _private_fn(self, op: UOperator) -> str:
        """Inside device function ``self.helper``: the name of its own copy of ``op``'s uTask.

        A uTask declaring a shared array, reached from the kernel along two paths (the
        kernel calls it, and so does a device function the kernel calls), would define
        that array twice in the kernel's PTX (``private_copy`` explains): so each device
        function calls copies of its own, and every path reaches a different uTask.
        """
        key = (self.helper, op.fn)
        name = self.private.get(key)
        if name is None:
            name = f"{op.fn_name}_in_{self.helper}"
            self.private[key] = name
            self.namespace[name] = _private_copy(op.fn)
        return name

    # -- emission ---------------------------------------------------------------------
    def emit(self, text: str, indent: int) -> None:
        self.lines.append("    " * indent + text)

    def barrier(self, key, indent: int) -> None:
        reason = self.plan.before.get(key)
        if reason is None:
            return
        if key in self.drop_barriers:
            self.emit(f"# (barrier {reason} dropped on purpose)", indent)
            return
        self.emit(f"{self.ctx.sync}  # {reason}: another block touched what comes next", indent)
        self.emit("barriers += 1", indent)
        self.barrier_sites.append(key)

    def op(self, op: UOperator, names: dict, indent: int) -> None:
        self.barrier(id(op), indent)
        self.check_indices(names, indent, refs=[a for a in op.args if isinstance(a, TensorRef)])
        fn = self._fn(op)
        args = []
        for a in op.args:
            if isinstance(a, TensorRef):
                self._use_ref(a)
                args.append(render_view(a, names))
            else:
                args.append(repr(int(a)))
        self.emit(f"# {op.name}: {op.note}", indent)
        self.emit(f"for u in range({self.ctx.block}, {op.count}, {self.ctx.blocks}):", indent)
        self.emit(f"{fn}(u, {', '.join(args)})", indent + 1)

    def block_items(self, block: StmtBlock, names: dict, indent: int) -> None:
        if not block.items:
            self.emit("pass", indent)
        for item in block.items:
            self.item(item, names, indent)

    def item(self, item, names: dict, indent: int) -> None:
        if isinstance(item, UOperator):
            self.op(item, names, indent)
        elif isinstance(item, Loop):
            self.loop(item, names, indent)
        elif isinstance(item, Branch):
            self.barrier(("pred", id(item)), indent)
            self._use_scalar(item.pred)
            self.check_indices(names, indent, scalars=[item.pred])
            self.emit(f"if {render_scalar(item.pred, names)}:", indent)
            self.block_items(item.then, names, indent + 1)
            self.emit("else:", indent)
            self.block_items(item.orelse, names, indent + 1)
        elif isinstance(item, FunctionCall):
            # a function holding a recursion, or inside a block group, is always inlined
            if self.inline or has_call(item) or self.ctx is not _GRID:
                self.emit(f"# function uTask {item.name} (inlined)", indent)
                self.block_items(item.body, names, indent)
            else:
                self.device_function(item, names, indent)
        elif isinstance(item, Call):
            self.recursion(item, names, indent)
        elif isinstance(item, CallGroup):
            self.call_group(item, names, indent)
        else:
            raise TypeError(f"cannot generate code for {item!r}")

    def local(self, var: Var) -> str:
        """The kernel's local for loop counter ``var``: its name, unless another counter of the kernel has it.

        Copies of a function (recursion unroll) and bodies inlined from it hold loops
        whose counters have the same names; a call's dispatch loop runs inside such a
        loop, so each counter needs a local of its own (``i0``, ``i0_1``, ...).
        """
        name = self.local_names.get(id(var))
        if name is None:
            name, k = var.name, 0
            while name in self.used_locals:
                k += 1
                name = f"{var.name}_{k}"
            self.local_names[id(var)] = name
            self.used_locals.add(name)
        return name

    def while_index(self, loop: Loop) -> int:
        """The number an ``IterationLimitError`` reports for ``loop`` (its place in the program's while loops)."""
        if self.while_loops is not None:
            return next(k for k, other in enumerate(self.while_loops) if other is loop)
        return self.loop_ids.setdefault(id(loop), len(self.loop_ids))


    def loop(self, loop: Loop, names: dict, indent: int) -> None:
        var = self.local(loop.var)
        names = {**names, loop.var: var}
        if loop.kind == "for":
            self.barrier(("trip", id(loop)), indent)
            self._use_scalar(loop.trip)
            self.check_indices(names, indent, scalars=[loop.trip])   # (the trip never reads the counter)
            self.emit(f"for {var} in range({render_scalar(loop.trip, names)}):", indent)
            self.exits.append(("loop",))
            self.block_items(loop.body, names, indent + 1)
            self.exits.pop()
            self.leave_if_failed(indent)
            return
        index = self.while_index(loop)
        self.emit(f"# while loop {index}: at most {loop.max_iters} iterations", indent)
        self.emit(f"{var} = 0", indent)
        self.emit("while True:", indent)
        self.exits.append(("loop",))
        self.block_items(loop.head, names, indent + 1) if loop.head.items else None
        self.barrier(("cond", id(loop)), indent + 1)
        self._use_scalar(loop.cond)
        self.check_indices(names, indent + 1, scalars=[loop.cond])
        self.emit(f"if not {render_scalar(loop.cond, names)}:", indent + 1)
        self.emit("break", indent + 2)
        self.emit(f"if {var} == {loop.max_iters}:  # over the cap: stop every block, report", indent + 1)
        self.fail(ERR_ITERATIONS, str(index), indent + 2)
        self.block_items(loop.body, names, indent + 1)
        self.emit(f"{var} += 1", indent + 1)
        self.exits.pop()
        self.leave_if_failed(indent)

    def device_function(self, call: FunctionCall, names: dict, indent: int) -> None:
        """A function uTask that is not inlined: its own device function, called by every block.

        It returns the grid barriers it executed (or -1 after an error, when every
        block must stop).  It calls uTasks of its own (``_private_fn``): copies
        compiled apart from the kernel's, so a uTask with a shared array that both
        call is not defined twice in one PTX module.  The barrier plan knows nothing
        across the call, so the body starts, and the caller continues, with a barrier
        before the first access.
        """
        fname = f"function_{call.name}_{self.helper_count}"   # numbered at entry: a nested one is written first
        self.helper_count += 1
        saved = self.lines, self.buffers, self.in_function, self.helper
        self.lines, self.buffers, self.in_function, self.helper = [], {}, True, fname
        self.block_items(call.body, names, 1)
        body, used = self.lines, self.buffers
        self.lines, self.buffers, self.in_function, self.helper = saved
        for name, buffer in used.items():
            self.buffers.setdefault(name, buffer)
        params = list(used) + ["status"] + [names.get(v, v.name) for v in free_vars(call.body)]
        self.helper_sources.append("\n".join(
            ["@jit(device=True)", f"def {fname}({', '.join(params)}):",
             f'    """function uTask {call.name}: returns its grid barriers, -1 if every block must stop."""',
             *_PREAMBLE[1:], *body, "    return barriers"]))
        self.emit(f"# function uTask {call.name}: a device function (not inlined)", indent)
        self.emit(f"done = {fname}({', '.join(params)})", indent)
        self.emit("if done < 0:", indent)
        self.stop(indent + 1)
        self.emit("barriers += done", indent)

    def check_indices(self, names: dict, indent: int, refs=(), scalars=()) -> None:
        """Before a statement: every run-time offset it uses must keep its view inside its tensor."""
        for ref in _checked_refs(refs, scalars):
            site = self.first_site + len(self.index_sites)
            self.index_sites.append(ref)
            lo, hi = ref.bounds
            start = render_offset(ref.offset, names)
            self.emit(f"if not {lo} <= {start} <= {hi - ref.size}:  # a run-time index: {ref!r} "
                      f"must stay in [{lo}, {hi})", indent)
            self.fail(ERR_INDEX, str(site), indent + 1, value=start)

    def fail(self, code: int, detail: str, indent: int, value: str | None = None) -> None:
        """Report error ``code`` and leave: the kernel, or (in a block group) the group's lane."""
        if self.ctx is _GRID:
            self.emit("if leader:", indent)
            self.emit(f"status[0] = {code}", indent + 1)
            self.emit(f"status[1] = {detail}", indent + 1)
            if value is not None:
                self.emit(f"status[3] = {value}", indent + 1)
            self.stop(indent)
            return
        # a block group: the first error of any group wins; this group's blocks leave their lane together
        # (what failed is the same in all of them), and every block stops after the groups join
        self.emit(f"if {self.ctx.block} == 0 and cuda.threadIdx.x == 0 and cuda.atomic.cas(status, 0, 0, {code}) == 0:",
                  indent)
        self.emit(f"status[1] = {detail}", indent + 1)
        if value is not None:
            self.emit(f"status[3] = {value}", indent + 1)
        self.emit(f"{self.ctx.failed} = True", indent)
        self.leave(indent)

    def leave(self, indent: int) -> None:
        """In a block group after an error: out of the innermost Python loop, towards the end of the lane."""
        if not self.exits:
            raise AssertionError("an error exit in a block group outside its lane")
        innermost = self.exits[-1]
        if innermost[0] == "dispatch":
            self.emit(f"top = {innermost[1]}", indent)
            self.emit("continue  # top is back at the outside call: the dispatch loop ends", indent)
        else:
            self.emit("break  # out of the lane" if innermost[0] == "lane" else "break", indent)

    def leave_if_failed(self, indent: int) -> None:
        """After a loop inside a block group: if it was left on an error, leave the next loop out too."""
        if self.ctx is not _GRID:
            self.emit(f"if {self.ctx.failed}:", indent)
            self.leave(indent + 1)

    def stop(self, indent: int) -> None:
        """Leave the kernel (or the function uTask) after an error; every block does the same."""
        if self.in_function:
            self.emit("return -1", indent)
        else:
            self.emit("if leader:", indent)
            self.emit("status[2] += barriers", indent + 1)
            self.emit("return", indent)

    # -- the whole kernel ----------------------------------------------------------------
    def source(self) -> str:
        body_start = len(self.lines)
        self.block_items(self.block, {}, 1)
        body = self.lines[body_start:]
        del self.lines[body_start:]
        params = list(self.buffers) + ["status"] + [v.name for v in self.free_vars]
        head = [f"def {self.name}({', '.join(params)}):", *_PREAMBLE[1:]]
        for stack, (depth, fields) in self.frame_stacks.items():
            head.append(f"    {stack} = cuda.shared.array(({depth}, {fields}), int64)")
        tail = ["    if leader:", "        status[2] += barriers"]
        helpers = [h + "\n\n" for h in self.helper_sources]
        return "".join(helpers) + "\n".join(head + body + tail) + "\n"


_PREAMBLE = ("def ...:",
             "    grid = cuda.cg.this_grid()",
             "    block = cuda.blockIdx.x",
             "    blocks = cuda.gridDim.x",
             "    leader = block == 0 and cuda.threadIdx.x == 0",
             "    barriers = 0")


def _int64():
    from numba import int64

    return int64


def _private_copy(fn):
    from pyflow.kernels.utask.generated import private_copy

    return private_copy(fn)


def generate(name: str, block: StmtBlock, functions, free_vars=(), **options) -> KernelSource:
    """Generate the kernel source for ``block``; read ``.source()`` / ``.namespace`` / ``.buffers``."""
    writer = KernelSource(name, block, functions, free_vars, **options)
    writer.text = writer.source()
    return writer
