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
Offsets and conditions are ``Scalar`` expressions: constants, loop counters,
function parameters, and ``Load``s of one element of a buffer (a device value).
Both executors read the same tree: the host executor evaluates scalars on the host
(a device-to-host read per ``Load``), the code generator renders them as Python
expressions inside the kernel.
"""

from __future__ import annotations

import dataclasses
import math
import operator

import numpy as np

__all__ = ["Buffer", "Offset", "TensorRef", "Scalar", "Const", "Var", "Load", "BinOp", "UOperator",
           "StmtBlock", "NestedUTask", "Loop", "Branch", "FunctionCall", "FunctionDef", "Call", "CallGroup", "Lane",
           "walk", "as_scalar", "is_int_scalar", "free_vars"]


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


# ---- scalars ----------------------------------------------------------------------


class Scalar:
    """A scalar expression evaluated on the device (or, by the host executor, on the host)."""

    def _bin(self, op, other, swap=False):
        other = as_scalar(other)
        return BinOp(op, other, self) if swap else BinOp(op, self, other)

    def __add__(self, o): return self._bin("+", o)
    def __radd__(self, o): return self._bin("+", o, True)
    def __sub__(self, o): return self._bin("-", o)
    def __rsub__(self, o): return self._bin("-", o, True)
    def __mul__(self, o): return self._bin("*", o)
    def __rmul__(self, o): return self._bin("*", o, True)
    def __floordiv__(self, o): return self._bin("//", o)
    def __mod__(self, o): return self._bin("%", o)
    def __lt__(self, o): return self._bin("<", o)
    def __le__(self, o): return self._bin("<=", o)
    def __gt__(self, o): return self._bin(">", o)
    def __ge__(self, o): return self._bin(">=", o)
    def __and__(self, o): return self._bin("and", o)
    def __or__(self, o): return self._bin("or", o)
    def eq(self, o): return self._bin("==", o)
    def ne(self, o): return self._bin("!=", o)

    def __bool__(self):
        raise TypeError("a Scalar is a device value: it has no truth value at trace time; "
                        "use cocktailer.cond / while_loop instead of if / while")

    __hash__ = object.__hash__


@dataclasses.dataclass(eq=False)
class Const(Scalar):
    value: int | float

    def __repr__(self): return repr(self.value)


@dataclasses.dataclass(eq=False)
class Var(Scalar):
    """A loop counter, a function parameter or a frame field; ``name`` is its code name."""

    name: str

    def __repr__(self): return self.name


@dataclasses.dataclass(eq=False)
class Load(Scalar):
    """One element of a buffer (``ref`` is a 0-d or 1-element TensorRef)."""

    ref: "TensorRef"

    def __repr__(self): return f"{self.ref.buffer.name}[{self.ref.offset}]"


_PY_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
           "%": operator.mod, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
           "==": operator.eq, "!=": operator.ne, "and": lambda a, b: bool(a) and bool(b),
           "or": lambda a, b: bool(a) or bool(b)}


@dataclasses.dataclass(eq=False)
class BinOp(Scalar):
    op: str
    a: Scalar
    b: Scalar

    def __post_init__(self):
        if self.op not in _PY_OPS:
            raise ValueError(f"unknown scalar operator {self.op!r}")

    def __repr__(self): return f"({self.a!r} {self.op} {self.b!r})"


def as_scalar(x) -> Scalar:
    """A Python int/float/bool as a ``Const``; a ``Scalar`` as itself."""
    if isinstance(x, Scalar):
        return x
    if isinstance(x, (bool, np.bool_)):
        return Const(int(x))
    if isinstance(x, (int, np.integer)):
        return Const(int(x))
    if isinstance(x, (float, np.floating)):
        return Const(float(x))
    raise TypeError(f"expected a Scalar, an int or a float, got {x!r}")


def is_int_scalar(s: Scalar) -> bool:
    """Does ``s`` always hold an int?  Loop counters, parameters and comparisons do; a float does not."""
    if isinstance(s, Const):
        return not isinstance(s.value, float)
    if isinstance(s, Load):
        return s.ref.dtype.kind in "iub"
    if isinstance(s, BinOp):
        return s.op in ("<", "<=", ">", ">=", "==", "!=", "and", "or") or (is_int_scalar(s.a) and is_int_scalar(s.b))
    return True   # a Var: a loop counter, a function parameter, a frame field


def scalar_loads(s: Scalar):
    """Every ``Load`` inside ``s`` (and inside the offsets it reads at)."""
    if isinstance(s, Load):
        yield s
        yield from scalar_loads(s.ref.offset.dynamic) if s.ref.offset.dynamic is not None else ()
    elif isinstance(s, BinOp):
        yield from scalar_loads(s.a)
        yield from scalar_loads(s.b)


def scalar_vars(s: Scalar | None):
    """Every ``Var`` inside ``s``."""
    if isinstance(s, Var):
        yield s
    elif isinstance(s, BinOp):
        yield from scalar_vars(s.a)
        yield from scalar_vars(s.b)
    elif isinstance(s, Load):
        yield from scalar_vars(s.ref.offset.dynamic)


def py_op(op: str):
    return _PY_OPS[op]


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
