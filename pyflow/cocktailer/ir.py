"""Cocktailer's IR (seed 001): uOperators, nested uTasks and the buffers they work on.

A traced program (``trace.py``) is a tree of statements:

* ``UOperator`` - one operator split into ``utask_count`` independent uTasks; uTask
  ``u`` calls a device function from ``kernels/utask/`` (``fn(u, *args)``) and
  computes its own slice of the outputs.
* ``NestedUTask`` kinds, each holding statement lists (``StmtBlock``):
  ``Loop`` (a for loop with a trip count, or a while loop with a device-side
  condition), ``Branch`` (then/else on a device scalar), ``FunctionCall`` (a
  function uTask: the body of a called function), ``Call`` (a uTask reference to
  a ``FunctionDef``; a function that references itself is recursive) and
  ``CallGroup`` (independent ``Lane``s run at the same time on disjoint groups of
  blocks: what recursion unroll makes of sibling subtrees; a lane is one call, or
  the call's body unrolled again, holding a ``CallGroup`` of its own).

Tensors are ``TensorRef``s: a shape and an element offset into a ``Buffer``, a flat
preallocated device array (Cocktailer preallocates everything: inputs, one arena per
dtype for intermediates and loop state, a stack arena per recursive function).
Offsets and conditions are ``Scalar`` expressions (``scalars.py``): constants, loop
counters, function parameters, and ``Load``s of one element of a buffer (a device value).
Both executors read the same tree: the host executor evaluates scalars on the host
(a device-to-host read per ``Load``), the code generator renders them as Python
expressions inside the kernel.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from pyflow.cocktailer.scalars import Scalar, Var, scalar_vars

__all__ = ["Buffer", "Offset", "TensorRef", "UOperator", "StmtBlock", "NestedUTask", "Loop", "Branch", "FunctionCall",
           "FunctionDef", "Call", "CallGroup", "Lane", "walk", "free_vars"]


@dataclasses.dataclass(eq=False)
class Buffer:
    """A flat, contiguous, preallocated device array of ``size`` elements.

    ``role``: ``"input"`` (the caller's data, read-only), ``"arena"`` (intermediates,
    loop state and outputs of one dtype), ``"stack"`` (a recursive function's frames).
    """

    name: str
    size: int
    dtype: np.dtype
    role: str

    def __repr__(self) -> str:
        return f"Buffer({self.name}, {self.size} x {self.dtype}, {self.role})"


# ---- tensors ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Offset:
    """An element offset: ``dynamic + const``, where ``dynamic`` is a Scalar or None."""

    dynamic: Scalar | None
    const: int

    @property
    def is_static(self) -> bool:
        return self.dynamic is None

    def __add__(self, k: "int | Scalar") -> "Offset":
        if isinstance(k, Scalar):
            return Offset(k if self.dynamic is None else self.dynamic + k, self.const)
        return Offset(self.dynamic, self.const + int(k))

    def __repr__(self):
        if self.dynamic is None:
            return str(self.const)
        return f"{self.dynamic!r} + {self.const}" if self.const else repr(self.dynamic)


@dataclasses.dataclass(frozen=True, eq=False)
class TensorRef:
    """A contiguous tensor: ``shape`` elements of ``buffer`` starting at ``offset``.

    ``bounds``: for a view at a run-time offset (``xs[t]``), the static element range
    ``[lo, hi)`` of the tensor it was cut from; every value of the offset stays inside
    (indices must be in range).  The barrier planner uses it instead of "anywhere".
    """

    buffer: Buffer
    shape: tuple
    offset: Offset
    bounds: tuple | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.buffer.dtype

    def reshaped(self, shape) -> "TensorRef":
        return TensorRef(self.buffer, tuple(shape), self.offset, self.bounds)

    @property
    def region(self) -> tuple | None:
        """The static element range this tensor may occupy, or None if unknown."""
        if self.offset.dynamic is None:
            return (self.offset.const, self.offset.const + self.size)
        return self.bounds

    def __repr__(self):
        return f"{self.buffer.name}[{self.offset!r}:+{self.size}]{list(self.shape)}"


# ---- statements -------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class UOperator:
    """An operator as ``count`` uTasks: ``for u in range(count): fn(u, *args)``.

    ``args`` are TensorRefs (passed as views) and ints.  ``reads``/``writes`` list
    the TensorRefs each uTask family touches with its *access pattern*:
    ``("elementwise", chunk)`` when element ``e`` of the view is touched by uTask
    ``e // chunk`` and thread ``(e % chunk) % blockDim`` (so two such operators on
    the same elements need no barrier between them), or ``None`` (any uTask may
    touch any element: a dependence on it crosses blocks).
    """

    name: str               # the op, e.g. "linear", "tanh"
    fn: object              # the uTask device function
    fn_name: str            # its name in generated code
    count: int              # number of uTasks
    args: tuple
    reads: tuple            # ((TensorRef, pattern), ...)
    writes: tuple
    note: str = ""          # what it computes, for listings

    def __repr__(self):
        return f"UOperator({self.name}: {self.note}, {self.count} uTasks)"


@dataclasses.dataclass(eq=False)
class StmtBlock:
    """A sequence of statements: a program's, a loop's or a function's body, a branch's arm.

    "Block" alone is a CUDA thread block here (uTasks run on blocks), and the allocator's ``Block``."""

    items: list = dataclasses.field(default_factory=list)


class NestedUTask:
    """A uTask made of uTasks: a loop, a branch, a function (or a reference to one)."""

    kind = "nested"

    def blocks(self):
        return ()


@dataclasses.dataclass(eq=False)
class Loop(NestedUTask):
    """``for var in range(trip)`` (``cond is None``) or ``while cond`` (evaluated after ``head``).

    A while loop counts its iterations in ``var`` too and stops with an
    ``IterationLimitError`` after ``max_iters``.
    """

    var: Var
    body: StmtBlock
    trip: Scalar | None = None
    head: StmtBlock | None = None
    cond: Scalar | None = None
    max_iters: int = 0
    unroll: int = 1

    @property
    def kind(self):
        return "for" if self.cond is None else "while"

    def blocks(self):
        return (self.body,) if self.head is None else (self.head, self.body)


@dataclasses.dataclass(eq=False)
class Branch(NestedUTask):
    pred: Scalar
    then: StmtBlock
    orelse: StmtBlock
    kind = "branch"

    def blocks(self):
        return (self.then, self.orelse)


@dataclasses.dataclass(eq=False)
class FunctionCall(NestedUTask):
    """A function uTask: the traced body of one call of a (non-recursive) function."""

    name: str
    body: StmtBlock
    kind = "function"

    def blocks(self):
        return (self.body,)


@dataclasses.dataclass(eq=False)
class FunctionDef:
    """A recursive function: ``params`` (int Vars), frame-relative locals, one result.

    Its locals live in ``stack`` at ``base + k``: frame ``d`` (depth ``d``) has
    ``base = root_size + d * frame_size``.  ``ret`` is the offset in ``stack`` where
    the result goes (the caller's slot).  ``base``/``ret`` are Vars of the body.
    """

    name: str
    params: tuple
    result_shape: tuple
    dtype: np.dtype
    stack: Buffer | None = None
    base: Var | None = None
    ret: Var | None = None
    body: StmtBlock | None = None
    frame_size: int = 0
    max_depth: int = 0      # frames the stack buffer has room for (set by the memory plan)
    unrolled_from: str | None = None   # a copy made by recursion unroll: the original's name

    @property
    def root_size(self) -> int:
        return math.prod(self.result_shape)


@dataclasses.dataclass(eq=False)
class Call(NestedUTask):
    """A uTask reference: call ``fn(*args)``, its result lands in ``result`` (in fn's stack).

    ``depth``: the depth of the callee's first frame.  0 for a call written in the
    program; a call that recursion unroll lifted out of ``d`` levels of the
    recursion starts at depth ``d``, so a tree overflows ``stack_depth`` exactly
    where it did before the unroll.
    """

    fn: FunctionDef
    args: tuple
    result: TensorRef
    depth: int = 0
    kind = "reference"


@dataclasses.dataclass(eq=False)
class Lane(NestedUTask):
    """One lane of a ``CallGroup``: the statements one group of blocks runs (``body``).

    Recursion unroll makes a lane of each sibling call: the ``Call`` itself (on a
    copy of the function with its own stack), or, unrolled one level deeper, that
    call's body inlined, whose own sibling calls are a ``CallGroup`` again.  Such a
    body is frame ``depth`` of ``fn``'s stack (``fn``: the copy it belongs to; None
    for a lane that is just a call): a lane at ``depth >= stack_depth`` overflows
    the stack exactly where the call it replaces would have.
    """

    body: StmtBlock
    fn: "FunctionDef | None" = None
    depth: int = 0
    kind = "lane"

    def blocks(self):
        return (self.body,)


@dataclasses.dataclass(eq=False)
class CallGroup(NestedUTask):
    """Independent ``Lane``s (``body.items``) run at the same time, each on its own group of blocks.

    Made by recursion unroll (``optimize_recursion.unroll_recursion``) from sibling calls
    that share nothing they write: each lane calls its own copies of the function,
    with their own stacks.  Lane ``k`` runs on block group ``k % groups`` of the
    blocks running the group (the grid, or the enclosing lane's group) with
    ``groups = min(len(lanes), blocks)``; a ``CallGroup`` inside a lane splits that
    lane's group again (nested block groups).  The host executor simply runs the
    lanes one after another.
    """

    body: StmtBlock
    kind = "group"

    @property
    def lanes(self) -> list:
        return self.body.items

    @property
    def calls(self) -> list:
        """The calls of lanes that are one call each (the lanes of a one-level unroll)."""
        return [s for lane in self.lanes for s in lane.body.items if isinstance(s, Call)]

    def blocks(self):
        return (self.body,)


def walk(block: StmtBlock):
    """Every statement under ``block``, depth first, nested blocks included."""
    for item in block.items:
        yield item
        if isinstance(item, NestedUTask):
            for inner in item.blocks():
                yield from walk(inner)


def bound_vars(block: StmtBlock):
    """Vars a block binds itself (its loop counters)."""
    return {id(s.var) for s in walk(block) if isinstance(s, Loop)}


def free_vars(block: StmtBlock) -> list:
    """Vars a block reads but does not bind (enclosing host loop counters, frame fields)."""
    found, bound = {}, bound_vars(block)

    def note(s):
        for v in scalar_vars(s):
            if id(v) not in bound:
                found.setdefault(id(v), v)

    def refs(r):
        if isinstance(r, TensorRef):
            note(r.offset.dynamic)

    for s in walk(block):
        if isinstance(s, UOperator):
            for a in s.args:
                refs(a)
        elif isinstance(s, Loop):
            note(s.trip)
            note(s.cond)
        elif isinstance(s, Branch):
            note(s.pred)
        elif isinstance(s, Call):
            for a in s.args:
                note(a)
            refs(s.result)
    return sorted(found.values(), key=lambda v: v.name)
