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
* recursion: an explicit stack of frames ``[label, ret, params...]`` in shared
  memory (one copy per block, identical in all blocks), thread 0 writes it, and a
  ``while top > 0`` loop dispatches on the label (numba has no goto).  The depth is
  an option; a push past it stops every block and reports ``StackOverflowError``.
* recursion unroll (``CallGroup``): the grid splits into groups of consecutive
  blocks, call ``k`` runs on group ``k % groups``; inside a group uTasks spread
  over its blocks (``gblock`` of ``gblocks``) and barriers are
  ``group_barrier``s (``kernels/utask/groups.py``) instead of ``grid.sync()``,
  which would wait for the other groups.  A grid barrier joins the groups; an
  overflow in one group is reported there, and every block stops after the join.

The source is plain Python; ``pyflow.kernels.utask.generated.build_kernel`` turns it
into a kernel.  ``status`` (int64) returns ``[error, detail, barriers, value]``:
error 1 is a stack overflow (detail: function index), 2 a while loop over its cap
(detail: loop index), 3 a run-time index out of its tensor (detail: the check's
site, value: the offset it had).  Every view or load at a run-time offset is
checked before it is used, so a bad index stops the kernel instead of reading or
writing another tensor's memory.  Two counters per block group follow
(``gslot = 4 + 2 * group``).
"""

from __future__ import annotations

import dataclasses

from pyflow.cocktailer.barriers import CLEAR, BarrierPlan, block_has_call, has_call
from pyflow.cocktailer.ir import (BinOp, Block, Branch, Call, CallGroup, Const, FunctionCall, FunctionDef, Load,
                                  Loop, Offset, Scalar, TensorRef, UOperator, Var, free_vars, scalar_loads)

__all__ = ["KernelSource", "generate", "ERR_STACK_OVERFLOW", "ERR_ITERATIONS", "ERR_INDEX", "render_scalar",
           "STATUS_HEAD"]

ERR_STACK_OVERFLOW = 1
ERR_ITERATIONS = 2
ERR_INDEX = 3
STATUS_HEAD = 4   # status[:4] = error, detail, barriers, value; then two counters per block group


# ---- scalars and views as source text ---------------------------------------------


def render_scalar(s: Scalar, names: dict) -> str:
    """``s`` as a Python expression; ``names`` maps Vars to their source text."""
    if isinstance(s, Const):
        return repr(s.value)
    if isinstance(s, Var):
        return names.get(s, s.name)
    if isinstance(s, Load):
        return f"{s.ref.buffer.name}[{render_offset(s.ref.offset, names)}]"
    if isinstance(s, BinOp):
        return f"({render_scalar(s.a, names)} {s.op} {render_scalar(s.b, names)})"
    raise TypeError(f"not a scalar: {s!r}")


def render_offset(o: Offset, names: dict) -> str:
    if o.dynamic is None:
        return str(o.const)
    dyn = render_scalar(o.dynamic, names)
    return f"{dyn} + {o.const}" if o.const else dyn


def render_view(ref: TensorRef, names: dict) -> str:
    if ref.offset.dynamic is None:
        return f"{ref.buffer.name}[{ref.offset.const}:{ref.offset.const + ref.size}]"
    start = render_offset(ref.offset, names)
    return f"{ref.buffer.name}[{start}:{start} + {ref.size}]"


# ---- the source writer -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Blocks:
    """Who runs the code being written: the names of "my block", "how many" and their barrier."""

    block: str
    blocks: str
    sync: str


_GRID = _Blocks("block", "blocks", "grid.sync()")
_GROUP = _Blocks("gblock", "gblocks", "group_barrier(status, gslot, gblocks)")


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


class KernelSource:
    """Generate the kernel ``name`` for ``block`` (a program body or a part of it)."""

    def __init__(self, name: str, block: Block, functions, free_vars=(), stack_depth: int = 64,
                 inline_functions: bool = True, drop_barriers: frozenset = frozenset(), first_site: int = 0):
        self.name, self.block = name, block
        self.stack_depth = stack_depth
        self.inline = inline_functions
        self.lines: list[str] = []
        self.namespace: dict = {"int64": _int64()}
        self.buffers: dict = {}           # name -> Buffer, in order of first use
        self.helper_sources: list[str] = []   # device functions of function uTasks not inlined
        self.in_function = False
        self.loop_ids: dict = {}
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
        self.group_frames = None           # inside a group's recursion: the frame its outside call started at
        self.frame_stacks: dict = {}       # the shared-memory frame stacks: name -> (frames, int64 fields)

    # -- bookkeeping ----------------------------------------------------------------
    def _called_functions(self, block):
        from pyflow.cocktailer.ir import walk

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
        name = op.fn_name
        known = self.namespace.get(name)
        if known is not None and known is not op.fn:
            k = 2
            while self.namespace.get(f"{name}_{k}") not in (None, op.fn):
                k += 1
            name = f"{name}_{k}"
        self.namespace[name] = op.fn
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

    def block_items(self, block: Block, names: dict, indent: int) -> None:
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

    def loop(self, loop: Loop, names: dict, indent: int) -> None:
        index = self.loop_ids.setdefault(id(loop), len(self.loop_ids))
        var = loop.var.name
        if loop.kind == "for":
            self.barrier(("trip", id(loop)), indent)
            self._use_scalar(loop.trip)
            self.check_indices(names, indent, scalars=[loop.trip])
            self.emit(f"for {var} in range({render_scalar(loop.trip, names)}):", indent)
            self.block_items(loop.body, names, indent + 1)
            return
        self.emit(f"# while loop {index}: at most {loop.max_iters} iterations", indent)
        self.emit(f"{var} = 0", indent)
        self.emit("while True:", indent)
        self.block_items(loop.head, names, indent + 1) if loop.head.items else None
        self.barrier(("cond", id(loop)), indent + 1)
        self._use_scalar(loop.cond)
        self.check_indices(names, indent + 1, scalars=[loop.cond])
        self.emit(f"if not {render_scalar(loop.cond, names)}:", indent + 1)
        self.emit("break", indent + 2)
        self.emit(f"if {var} == {loop.max_iters}:  # over the cap: stop every block, report", indent + 1)
        self.emit("if leader:", indent + 2)
        self.emit(f"status[0] = {ERR_ITERATIONS}", indent + 3)
        self.emit(f"status[1] = {index}", indent + 3)
        self.stop(indent + 2)
        self.block_items(loop.body, names, indent + 1)
        self.emit(f"{var} += 1", indent + 1)

    def device_function(self, call: FunctionCall, names: dict, indent: int) -> None:
        """A function uTask that is not inlined: its own device function, called by every block.

        It returns the grid barriers it executed (or -1 after an error, when every
        block must stop).  The barrier plan knows nothing across the call, so the
        body starts, and the caller continues, with a barrier before the first access.
        """
        fname = f"function_{call.name}_{len(self.helper_sources)}"
        saved = self.lines, self.buffers, self.in_function
        self.lines, self.buffers, self.in_function = [], {}, True
        self.block_items(call.body, names, 1)
        body, used = self.lines, self.buffers
        self.lines, self.buffers, self.in_function = saved
        for name, buffer in used.items():
            self.buffers.setdefault(name, buffer)
        params = list(used) + ["status"] + [v.name for v in free_vars(call.body)]
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
        """Report error ``code`` and leave: the kernel, or (in a block group) the group's recursion."""
        if self.ctx is _GRID:
            self.emit("if leader:", indent)
            self.emit(f"status[0] = {code}", indent + 1)
            self.emit(f"status[1] = {detail}", indent + 1)
            if value is not None:
                self.emit(f"status[3] = {value}", indent + 1)
            self.stop(indent)
            return
        # a block group: the first error of either group wins; this group's blocks leave the
        # dispatch loop together, and every block stops after the groups join
        if self.group_frames is None:
            raise AssertionError("an error exit in a block group outside its recursion")
        self.emit(f"if {self.ctx.block} == 0 and cuda.threadIdx.x == 0 and cuda.atomic.cas(status, 0, 0, {code}) == 0:",
                  indent)
        self.emit(f"status[1] = {detail}", indent + 1)
        if value is not None:
            self.emit(f"status[3] = {value}", indent + 1)
        self.emit("group_failed = True", indent)
        self.emit(f"top = {self.group_frames}", indent)
        self.emit("continue  # top is back at the outside call: the dispatch loop ends", indent)

    def stop(self, indent: int) -> None:
        """Leave the kernel (or the function uTask) after an error; every block does the same."""
        if self.in_function:
            self.emit("return -1", indent)
        else:
            self.emit("if leader:", indent)
            self.emit("status[2] += barriers", indent + 1)
            self.emit("return", indent)

    # -- recursion -------------------------------------------------------------------
    def recursion(self, call: Call, names: dict, indent: int) -> None:
        fdef = call.fn
        findex = self.functions.index(fdef)
        stack = f"frames_{fdef.name}"
        fields = 2 + len(fdef.params)
        self._use_buffer(fdef.stack)
        for a in call.args:
            self._use_scalar(a)
        self.barrier(("call", id(call)), indent)
        depth = self.stack_depth
        self.frame_stacks[stack] = (depth, fields)
        self.emit(f"# recursion {fdef.name}: frames [label, ret, {', '.join(p.name for p in fdef.params)}] "
                  f"in shared memory, {depth} deep", indent)
        first = call.depth   # frames below it belong to the levels recursion unroll lifted out
        if first >= depth:
            self.emit("overflow = True  # the unrolled levels above already use every frame", indent)
        else:
            if first:
                self.emit(f"# (unrolled from depth {first}: frames 0..{first - 1} stay empty, so the stack "
                          "overflows where it did before the unroll)", indent)
            self.recursion_loop(call, names, indent, stack, first)
        self.emit("if overflow:", indent)
        if self.ctx is _GRID:
            self.fail(ERR_STACK_OVERFLOW, str(findex), indent + 1)
        else:   # only this group knows: it reports (unless the other was first), every block stops after the join
            self.emit(f"if {self.ctx.block} == 0 and cuda.threadIdx.x == 0 and "
                      f"cuda.atomic.cas(status, 0, 0, {ERR_STACK_OVERFLOW}) == 0:", indent + 1)
            self.emit(f"status[1] = {findex}", indent + 2)
            self.emit("group_failed = True", indent + 1)

    def recursion_loop(self, call: Call, names: dict, indent: int, stack: str, first: int) -> None:
        """Push the outside call's frame, then dispatch frames until it has returned."""
        fdef = call.fn
        if self.ctx is _GRID:   # (a group's calls had their arguments checked before the grid split)
            self.check_indices(names, indent, scalars=call.args)
        self.emit("if cuda.threadIdx.x == 0:", indent)
        self.emit(f"{stack}[{first}, 0] = 0", indent + 1)
        self.emit(f"{stack}[{first}, 1] = {render_offset(call.result.offset, names)}", indent + 1)
        for k, a in enumerate(call.args):
            self.emit(f"{stack}[{first}, {2 + k}] = {render_scalar(a, names)}", indent + 1)
        self.emit("cuda.syncthreads()", indent)
        self.emit(f"top = {first + 1}", indent)
        self.emit("overflow = False", indent)
        self.emit(f"while top > {first}:", indent)
        self.group_frames = first if self.ctx is not _GRID else None
        inner = indent + 1
        fnames = dict(names)
        fnames[fdef.ret] = fdef.ret.name
        self.emit("frame = top - 1", inner)
        self.emit(f"label = {stack}[frame, 0]", inner)
        self.emit(f"{fdef.ret.name} = {stack}[frame, 1]", inner)
        for k, p in enumerate(fdef.params):
            self.emit(f"{p.name} = {stack}[frame, {2 + k}]", inner)
        self.emit(f"{fdef.base.name} = {fdef.root_size} + frame * {fdef.frame_size}", inner)
        self.emit("cuda.syncthreads()  # everyone has read the frame before thread 0 rewrites it", inner)
        segments = _Segments(self, fdef, stack, fnames)
        segments.build()
        self.lines.extend("    " * inner + line for line in segments.render())
        self.emit("cuda.syncthreads()  # thread 0's frame writes are visible before the next dispatch", inner)
        self.group_frames = None

    def call_group(self, group: CallGroup, names: dict, indent: int) -> None:
        """Recursion unroll: call ``k`` of ``group`` on block group ``k % groups``, all at once.

        The grid splits into ``groups = min(len(calls), blocks)`` runs of consecutive
        blocks.  Inside a group, operators spread over its blocks (``gblock`` of
        ``gblocks``) and barriers are ``group_barrier``s on the group's two counters
        in ``status``; a grid barrier joins the groups at the end.
        """
        n = len(group.calls)
        for call in group.calls:
            for a in call.args:
                self._use_scalar(a)
        self.namespace["group_barrier"] = _group_barrier()
        self.barrier(("group", id(group)), indent)
        self.check_indices(names, indent, scalars=[a for call in group.calls for a in call.args])
        self.emit(f"# recursion unroll: {n} independent calls at once, call k on block group k % groups", indent)
        self.emit(f"groups = min({n}, blocks)", indent)
        self.emit("group = block * groups // blocks", indent)
        self.emit("gfirst = (group * blocks + groups - 1) // groups", indent)
        self.emit("gblocks = ((group + 1) * blocks + groups - 1) // groups - gfirst", indent)
        self.emit("gblock = block - gfirst", indent)
        self.emit(f"gslot = {STATUS_HEAD} + 2 * group  # this group's barrier counters in status", indent)
        self.emit("group_failed = False", indent)
        saved, self.ctx = self.ctx, _GROUP
        try:
            for k, call in enumerate(group.calls):
                which = "0" if k == 0 else f"{k} % groups"
                self.emit(f"if group == {which} and not group_failed:", indent)
                self.recursion(call, names, indent + 1)
        finally:
            self.ctx = saved
        self.emit("grid.sync()  # the groups join: every call has returned", indent)
        self.emit("barriers += 1", indent)
        self.barrier_sites.append(("join", id(group)))
        self.emit("if status[0] != 0:  # a group stopped with an error: every block stops", indent)
        self.stop(indent + 1)

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


class _Segments:
    """A recursive function's body cut at its calls into labelled segments (a state machine)."""

    def __init__(self, writer: KernelSource, fdef: FunctionDef, stack: str, names: dict):
        self.w, self.fdef, self.stack, self.names = writer, fdef, stack, names
        self.segments: list[list] = []   # per label: list of (indent, text)

    def new(self) -> int:
        self.segments.append([])
        return len(self.segments) - 1

    def build(self) -> None:
        start = self.new()
        end = self.sequence(self.fdef.body.items, start, 1)
        self.emit(end, 1, "top -= 1  # return to the caller's frame")

    def emit(self, label: int, indent: int, text: str) -> None:
        self.segments[label].append((indent, text))

    def capture(self, label: int, write) -> None:
        """Run ``write()`` (which emits through the writer) and move its lines into segment ``label``."""
        saved, self.w.lines = self.w.lines, []
        try:
            write()
        finally:
            produced, self.w.lines = self.w.lines, saved
        for line in produced:
            stripped = line.lstrip(" ")
            self.emit(label, (len(line) - len(stripped)) // 4, stripped)

    def barrier(self, label: int, indent: int, key) -> None:
        """The writer's barrier decision for ``key``, emitted into segment ``label``."""
        self.capture(label, lambda: self.w.barrier(key, indent))

    def checks(self, label: int, indent: int, scalars) -> None:
        """The writer's index checks for ``scalars``, emitted into segment ``label``."""
        self.capture(label, lambda: self.w.check_indices(self.names, indent, scalars=scalars))

    def goto(self, label: int, indent: int, target: int) -> None:
        self.emit(label, indent, "if cuda.threadIdx.x == 0:")
        self.emit(label, indent + 1, f"{self.stack}[frame, 0] = {target}")

    def straight(self, label: int, indent: int, item) -> None:
        """Emit ``item`` (no calls inside) into segment ``label`` via the writer."""
        self.capture(label, lambda: self.w.item(item, self.names, indent))

    def sequence(self, items, label: int, indent: int) -> int:
        for item in items:
            if isinstance(item, Call):
                label = self.call(item, label, indent)
            elif isinstance(item, Branch) and has_call(item):
                label = self.branch(item, label, indent)
            elif isinstance(item, FunctionCall) and has_call(item):
                label = self.sequence(item.body.items, label, indent)
            else:
                self.straight(label, indent, item)
        return label

    def call(self, call: Call, label: int, indent: int) -> int:
        if call.fn is not self.fdef:
            raise TypeError("a recursive function may only call itself")
        resume = self.new()
        stack, depth = self.stack, self.w.stack_depth
        names = self.names
        self.barrier(label, indent, ("call", id(call)))
        for a in call.args:
            self.w._use_scalar(a)
        self.checks(label, indent, scalars=call.args)
        self.emit(label, indent, f"if top == {depth}:  # no frame left: stop every block")
        self.emit(label, indent + 1, "overflow = True")
        self.emit(label, indent + 1, "top = 0")
        self.emit(label, indent, "else:")
        self.emit(label, indent + 1, "if cuda.threadIdx.x == 0:")
        self.emit(label, indent + 2, f"{stack}[frame, 0] = {resume}  # resume here after the call")
        self.emit(label, indent + 2, f"{stack}[top, 0] = 0")
        self.emit(label, indent + 2, f"{stack}[top, 1] = {render_offset(call.result.offset, names)}")
        for k, a in enumerate(call.args):
            self.emit(label, indent + 2, f"{stack}[top, {2 + k}] = {render_scalar(a, names)}")
        self.emit(label, indent + 1, f"top += 1  # call {self.fdef.name}")
        return resume

    def branch(self, item: Branch, label: int, indent: int) -> int:
        self.barrier(label, indent, ("pred", id(item)))
        self.w._use_scalar(item.pred)
        self.checks(label, indent, scalars=[item.pred])
        join = self.new()
        self.emit(label, indent, f"if {render_scalar(item.pred, self.names)}:")
        for k, arm in enumerate((item.then, item.orelse)):
            if k == 1:
                self.emit(label, indent, "else:")
            if block_has_call(arm):  # its own segments, entered through the dispatch
                start = self.new()
                self.goto(label, indent + 1, start)
                end = self.sequence(arm.items, start, 1)
                self.goto(end, 1, join)
            else:  # no call: it runs right here, in the current segment
                for inner in arm.items:
                    self.straight(label, indent + 1, inner)
                self.goto(label, indent + 1, join)
        return join

    def render(self):
        for label, lines in enumerate(self.segments):
            yield f"{'if' if label == 0 else 'elif'} label == {label}:"
            # a segment is entered from the dispatch: other blocks may be anywhere before it
            yield f"    {self.w.ctx.sync}  # segment entry: the previous segment's writes are visible"
            yield "    barriers += 1"
            for indent, text in lines or [(1, "pass")]:
                yield "    " * indent + text


def _int64():
    from numba import int64

    return int64


def _group_barrier():
    from pyflow.kernels.utask.groups import group_barrier

    return group_barrier


def generate(name: str, block: Block, functions, free_vars=(), **options) -> KernelSource:
    """Generate the kernel source for ``block``; read ``.source()`` / ``.namespace`` / ``.buffers``."""
    writer = KernelSource(name, block, functions, free_vars, **options)
    writer.text = writer.source()
    return writer
