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
  A loop in the function runs inside a segment; a loop whose body calls the
  function is segments too (head, body, after), its counter and trip count kept
  in extra frame fields (the artifact compiles neither).  The function and its
  unrolled copies share one frame stack: a block runs one dispatch loop at a time.
* recursion unroll (``CallGroup``): the grid splits into groups of consecutive
  blocks, lane ``k`` runs on group ``k % groups``; inside a group uTasks spread
  over its blocks (``gblock1`` of ``gblocks1``) and barriers are
  ``group_barrier``s (``kernels/utask/groups.py``) instead of ``grid.sync()``,
  which would wait for the other groups.  A lane unrolled deeper holds a
  ``CallGroup`` of its own, which splits its group again (level 2: ``gblock2``...)
  and is joined by the enclosing group's barrier.  The top split is joined by a
  grid barrier.  An error in a group is reported there and its blocks leave
  their lane (a ``while True`` loop: ``break``); a failed lane below makes the
  enclosing lane leave after its join; every block stops after the grid join.

The source is plain Python; ``pyflow.kernels.utask.generated.build_kernel`` turns it
into a kernel.  ``status`` (int64) returns ``[error, detail, barriers, value]``:
error 1 is a stack overflow (detail: function index), 2 a while loop over its cap
(detail: loop index), 3 a run-time index out of its tensor (detail: the check's
site, value: the offset it had).  Every view or load at a run-time offset is
checked before it is used, so a bad index stops the kernel instead of reading or
writing another tensor's memory.  Three words per block group follow: its
barrier's count and generation, and a flag set when the group failed (``gslotL
= 4 + 3 * slot``, the groups of every ``CallGroup`` of a kernel numbered apart).
"""

from __future__ import annotations

import dataclasses

from pyflow.cocktailer.barriers import CLEAR, BarrierPlan, block_has_call, has_call
from pyflow.cocktailer.ir import (BinOp, Block, Branch, Call, CallGroup, Const, FunctionCall, FunctionDef, Lane, Load,
                                  Loop, Offset, Scalar, TensorRef, UOperator, Var, free_vars, scalar_loads, walk)
from pyflow.cocktailer.names import GROUP_LEVELS
from pyflow.errors import LaunchConfigError

__all__ = ["KernelSource", "generate", "ERR_STACK_OVERFLOW", "ERR_ITERATIONS", "ERR_INDEX", "render_scalar",
           "STATUS_HEAD"]

ERR_STACK_OVERFLOW = 1
ERR_ITERATIONS = 2
ERR_INDEX = 3
STATUS_HEAD = 4   # status[:4] = error, detail, barriers, value; then three words per block group


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
    """Who runs the code being written: the names of "my block", "how many" and their barrier.

    ``level`` 0 is the grid; level ``L`` a block group of a ``CallGroup`` nested ``L``
    deep, whose variables end in ``L`` (``gblock2``...) so an inner split leaves the
    outer one's intact.  ``failed``: the group's flag, set (the same in every block of
    the group) when something in it stopped with an error.
    """

    block: str
    blocks: str
    sync: str
    level: int = 0
    failed: str = ""


_GRID = _Blocks("block", "blocks", "grid.sync()")


def _group(level: int) -> _Blocks:
    return _Blocks(f"gblock{level}", f"gblocks{level}", f"group_barrier(status, gslot{level}, gblocks{level})",
                   level, f"failed{level}")


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

    # -- recursion -------------------------------------------------------------------
    def frame_fields(self, fdef: FunctionDef) -> dict:
        """``{id(loop): (counter field, trip field)}`` for each loop of ``fdef`` that holds a call: a frame
        keeps ``[label, ret, params..., then these]`` (a while loop's trip field is unused)."""
        fields, k = {}, 2 + len(fdef.params)
        for item in walk(fdef.body):
            if isinstance(item, Loop) and has_call(item):
                fields[id(item)] = (k, k + 1)
                k += 2
        return fields

    def frame_loads(self, fdef: FunctionDef) -> list:
        """``(local name, field)`` of every frame field a dispatch loads besides the parameters."""
        loads = []
        for item in walk(fdef.body):
            if isinstance(item, Loop) and has_call(item):
                counter, trip = self.frame_fields(fdef)[id(item)]
                loads.append((self.local(item.var), counter))
                if item.kind == "for":
                    loads.append((f"{self.local(item.var)}_trip", trip))
        return loads

    def while_index(self, loop: Loop) -> int:
        """The number an ``IterationLimitError`` reports for ``loop`` (its place in the program's while loops)."""
        if self.while_loops is not None:
            return next(k for k, other in enumerate(self.while_loops) if other is loop)
        return self.loop_ids.setdefault(id(loop), len(self.loop_ids))

    def recursion(self, call: Call, names: dict, indent: int) -> None:
        fdef = call.fn
        findex = self.functions.index(fdef)
        # one frame stack per recursive function and its unrolled copies: a block runs one dispatch loop at a time
        stack = f"frames_{fdef.unrolled_from or fdef.name}"
        fields = 2 + len(fdef.params) + 2 * len(self.frame_fields(fdef))
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
        # in a block group only this group knows: it reports (unless another was first) and leaves its lane
        self.fail(ERR_STACK_OVERFLOW, str(findex), indent + 1)
        self.leave_if_failed(indent)   # (an error inside the dispatch loop left it too)

    def recursion_loop(self, call: Call, names: dict, indent: int, stack: str, first: int) -> None:
        """Push the outside call's frame, then dispatch frames until it has returned."""
        fdef = call.fn
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
        self.exits.append(("dispatch", first))
        inner = indent + 1
        fnames = dict(names)
        fnames[fdef.ret] = fdef.ret.name
        for item in walk(fdef.body):   # loops holding a call: their counters are loaded from the frame
            if isinstance(item, Loop) and has_call(item):
                fnames[item.var] = self.local(item.var)
        self.emit("frame = top - 1", inner)
        self.emit(f"label = {stack}[frame, 0]", inner)
        self.emit(f"{fdef.ret.name} = {stack}[frame, 1]", inner)
        for k, p in enumerate(fdef.params):
            self.emit(f"{p.name} = {stack}[frame, {2 + k}]", inner)
        for name, field in self.frame_loads(fdef):   # the counters of loops holding a call
            self.emit(f"{name} = {stack}[frame, {field}]", inner)
        self.emit(f"{fdef.base.name} = {fdef.root_size} + frame * {fdef.frame_size}", inner)
        self.emit("cuda.syncthreads()  # everyone has read the frame before thread 0 rewrites it", inner)
        segments = _Segments(self, fdef, stack, fnames)
        segments.build()
        self.lines.extend("    " * inner + line for line in segments.render())
        self.emit("cuda.syncthreads()  # thread 0's frame writes are visible before the next dispatch", inner)
        self.exits.pop()

    def call_group(self, group: CallGroup, names: dict, indent: int) -> None:
        """Recursion unroll: lane ``k`` of ``group`` on block group ``k % groups``, all at once.

        The blocks running this code (the grid, or the group of an enclosing lane)
        split into ``groups = min(len(lanes), blocks)`` runs of consecutive blocks.
        Inside a group, operators spread over its blocks (``gblockL`` of ``gblocksL``,
        ``L`` the nesting level) and barriers are ``group_barrier``s on the group's
        counters in ``status`` (three words per group: count, generation, failed); a
        lane holding a ``CallGroup`` splits its group again.  A barrier of the
        enclosing blocks joins the groups at the end: the grid's (then an error
        anywhere stops every block), or the enclosing group's (then a failed lane
        below makes the enclosing lane leave too).
        """
        n, parent = len(group.lanes), self.ctx
        if parent.level >= GROUP_LEVELS:
            raise LaunchConfigError(f"{self.name}: block groups nest at most {GROUP_LEVELS} levels deep "
                                    "(unroll the recursion fewer levels)")
        inner = _group(parent.level + 1)
        L, base = inner.level, self.group_slots
        self.group_slots += n
        self.namespace["group_barrier"] = _group_barrier()
        self.barrier(("group", id(group)), indent)
        self.emit(f"# recursion unroll: {n} independent lanes at once, lane k on block group k % groups{L} "
                  f"of {'the grid' if parent is _GRID else f'group {parent.level}'}", indent)
        self.emit(f"groups{L} = min({n}, {parent.blocks})", indent)
        self.emit(f"group{L} = {parent.block} * groups{L} // {parent.blocks}", indent)
        self.emit(f"gfirst{L} = (group{L} * {parent.blocks} + groups{L} - 1) // groups{L}", indent)
        self.emit(f"gblocks{L} = ((group{L} + 1) * {parent.blocks} + groups{L} - 1) // groups{L} - gfirst{L}", indent)
        self.emit(f"gblock{L} = {parent.block} - gfirst{L}", indent)
        self.emit(f"gslot{L} = {STATUS_HEAD} + 3 * ({base} + group{L})  # this group's words in status", indent)
        self.emit(f"{inner.failed} = False", indent)
        saved_ctx, saved_exits = self.ctx, self.exits
        self.ctx, self.exits = inner, [("lane",)]
        try:
            for k, lane in enumerate(group.lanes):
                which = "0" if k == 0 else f"{k} % groups{L}"
                self.emit(f"if group{L} == {which} and not {inner.failed}:", indent)
                self.emit(f"while True:  # lane {k}; an error leaves it", indent + 1)
                self.lane(lane, names, indent + 2)
                self.emit("break", indent + 2)
        finally:
            self.ctx, self.exits = saved_ctx, saved_exits
        self.emit(f"if {inner.failed} and gblock{L} == 0 and cuda.threadIdx.x == 0:", indent)
        self.emit(f"status[gslot{L} + 2] = 1  # the enclosing blocks read it after the join", indent + 1)
        self.emit(f"{parent.sync}  # the groups join: every lane is done", indent)
        self.emit("barriers += 1", indent)
        self.barrier_sites.append(("join", id(group)))
        if parent is _GRID:
            self.emit("if status[0] != 0:  # a group stopped with an error: every block stops", indent)
            self.stop(indent + 1)
            return
        self.emit(f"for g in range(groups{L}):", indent)
        self.emit(f"if status[{STATUS_HEAD} + 3 * ({base} + g) + 2] != 0:  # a lane below failed", indent + 1)
        self.emit(f"{parent.failed} = True", indent + 2)
        self.leave_if_failed(indent)

    def lane(self, lane: Lane, names: dict, indent: int) -> None:
        """The statements of one lane; an unrolled call's body is a frame that may be past the stack's end."""
        if lane.fn is not None and lane.depth >= self.stack_depth:
            self.emit(f"# frame {lane.depth} of {lane.fn.name}: past stack_depth={self.stack_depth}", indent)
            self.fail(ERR_STACK_OVERFLOW, str(self.functions.index(lane.fn)), indent)
            return
        self.block_items(lane.body, names, indent)

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
            elif isinstance(item, Loop) and has_call(item):
                label = self.loop(item, label, indent)
            else:
                self.straight(label, indent, item)
        return label

    def loop(self, loop: Loop, label: int, indent: int) -> int:
        """A loop whose body calls the function: its counter (and trip count) live in the frame.

        A resume point inside the loop cannot be a Python loop's iteration, so the loop
        is segments too: ``head`` tests and goes to ``body`` or ``after``; the body's
        last segment counts and goes back to ``head``.  The frame's extra fields hold
        the counter and the trip count (read once, as ``range`` does); every dispatch
        loads them, like the parameters.
        """
        counter, trip = self.w.frame_fields(self.fdef)[id(loop)]
        var = self.w.local(loop.var)
        head, body, after = self.new(), self.new(), self.new()
        if loop.kind == "for":
            self.barrier(label, indent, ("trip", id(loop)))
            self.w._use_scalar(loop.trip)
            self.checks(label, indent, [loop.trip])
            self.emit(label, indent, "if cuda.threadIdx.x == 0:")
            self.emit(label, indent + 1, f"{self.stack}[frame, {counter}] = 0  # {var}")
            self.emit(label, indent + 1, f"{self.stack}[frame, {trip}] = {render_scalar(loop.trip, self.names)}")
            self.goto(label, indent, head)
            self.emit(head, 1, f"if {var} < {var}_trip:  # for {var} in range(...): a loop holding a call")
            self.goto(head, 2, body)
            self.emit(head, 1, "else:")
            self.goto(head, 2, after)
        else:
            self.emit(label, indent, "if cuda.threadIdx.x == 0:")
            self.emit(label, indent + 1, f"{self.stack}[frame, {counter}] = 0  # {var}: the iterations so far")
            self.goto(label, indent, head)
            tested = self.sequence(loop.head.items, head, 1)
            self.barrier(tested, 1, ("cond", id(loop)))
            self.w._use_scalar(loop.cond)
            self.checks(tested, 1, [loop.cond])
            self.emit(tested, 1, f"if not {render_scalar(loop.cond, self.names)}:  # a while loop holding a call")
            self.goto(tested, 2, after)
            self.emit(tested, 1, f"elif {var} == {loop.max_iters}:  # over the cap: stop every block, report")
            self.capture(tested, lambda: self.w.fail(ERR_ITERATIONS, str(self.w.while_index(loop)), 2))
            self.emit(tested, 1, "else:")
            self.goto(tested, 2, body)
        end = self.sequence(loop.body.items, body, 1)
        self.emit(end, 1, "if cuda.threadIdx.x == 0:")
        self.emit(end, 2, f"{self.stack}[frame, {counter}] = {var} + 1")
        self.goto(end, 1, head)
        return after

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


def _private_copy(fn):
    from pyflow.kernels.utask.generated import private_copy

    return private_copy(fn)


def _group_barrier():
    from pyflow.kernels.utask.groups import group_barrier

    return group_barrier


def generate(name: str, block: Block, functions, free_vars=(), **options) -> KernelSource:
    """Generate the kernel source for ``block``; read ``.source()`` / ``.namespace`` / ``.buffers``."""
    writer = KernelSource(name, block, functions, free_vars, **options)
    writer.text = writer.source()
    return writer
