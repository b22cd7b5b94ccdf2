"""Recursion in the generated kernel (seed 001): an explicit frame stack and a dispatch loop.

A call of a recursive function (``ir.Call``) becomes, in every block, the same
loop over an explicit stack of frames ``[label, ret, params...]`` in shared memory
(one copy per block, identical in all blocks); thread 0 writes it, and a ``while
top > 0`` loop dispatches on the label (numba has no goto)::

    if cuda.threadIdx.x == 0:                 # push the outside call's frame
        frames_rae0[0, 0] = 0                 # label 0: the function's start
        frames_rae0[0, 1] = 0                 # ret: where its result goes
        frames_rae0[0, 2] = 0                 # the parameters
    cuda.syncthreads()
    top = 1
    overflow = False
    while top > 0:
        frame = top - 1
        label = frames_rae0[frame, 0]         # then ret, the parameters, the loop counters
        ...
        cuda.syncthreads()  # everyone has read the frame before thread 0 rewrites it
        if label == 0:
            grid.sync()  # segment entry: the previous segment's writes are visible
            barriers += 1
            ...                               # uTasks; a call pushes a frame: top += 1
        elif label == 1:
            ...                               # resumes after the call; a return: top -= 1
        cuda.syncthreads()  # thread 0's frame writes are visible before the next dispatch
    if overflow:
        ...                                   # report StackOverflowError, stop every block

``_Segments`` cuts the function's body at its calls into those labelled segments
(a state machine).  The depth is an option; a push past it stops every block and
reports ``StackOverflowError``.  A loop in the function runs inside a segment; a
loop whose body calls the function is segments too (head, body, after), its
counter and trip count kept in extra frame fields (the artifact compiles
neither).  The function and its unrolled copies (``codegen_groups.py``) share one
frame stack: a block runs one dispatch loop at a time.

``RecursionMixin`` is this part of ``codegen.KernelSource``.  Inside a segment,
what holds no call (operators, loops, branches, index checks, barriers) is
written by the writer itself; ``_Segments`` captures its lines.
"""

from __future__ import annotations

from pyflow.cocktailer.barriers import block_has_call, has_call
from pyflow.cocktailer.codegen_common import ERR_ITERATIONS, ERR_STACK_OVERFLOW, render_offset, render_scalar
from pyflow.cocktailer.ir import Branch, Call, FunctionCall, FunctionDef, Loop, walk

__all__ = ["RecursionMixin"]


class RecursionMixin:
    """The recursion part of ``codegen.KernelSource``: the frame stack and its dispatch loop.

    A mixin: it writes through the writer's ``emit``, ``barrier``, ``check_indices``,
    ``fail``, ``leave_if_failed`` and ``local``, and records the stacks it uses in
    the writer's ``frame_stacks`` (``source`` declares them).
    """

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


class _Segments:
    """A recursive function's body cut at its calls into labelled segments (a state machine)."""

    def __init__(self, writer: RecursionMixin, fdef: FunctionDef, stack: str, names: dict):
        self.w, self.fdef, self.stack, self.names = writer, fdef, stack, names   # writer: the KernelSource
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
