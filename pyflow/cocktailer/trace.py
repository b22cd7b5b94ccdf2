"""The front end (seed 001): write a program with ops and control flow, trace it into the IR.

    import pyflow.cocktailer as ck

    def rnn(h0, xs, w, b):
        def step(t, h):                        # t: the loop counter (a device Scalar)
            return ck.tanh(ck.linear(h, w, b) + xs[t])
        return ck.for_loop(xs.shape[0], step, h0)

    program = ck.trace(rnn, ck.spec(4, 8), ck.spec(5, 4, 8), ck.spec(8, 8), ck.spec(8))

Arguments are symbolic ``Tensor``s: every op checks shapes *now* (a ``ShapeError``
names the op and the shapes) and appends a ``UOperator`` to the statement being
traced.  Control flow takes Python functions and traces each body once:
``for_loop``, ``while_loop``, ``cond``, ``function`` (a function uTask, optionally
recursive).  Device values used for control are ``Scalar``s: ``t.item()`` reads the
one element of a tensor, ``table[i].item()`` one element of an int table.

Memory (the paper's memory management): every buffer is preallocated.  Inputs are
read-only; intermediates get static offsets in one arena per dtype; a loop's body
reuses its intermediates every iteration; loop-carried values live in state buffers
(the inputs are copied in before the loop, and each iteration's results copied back
unless they were updated in place); the two branches of a ``cond`` share scratch
space and each copies its results into the cond's outputs (so an output only one
branch changes still gets a copy in the other); a recursive function's locals live
in frames of its own stack arena.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
import threading

import numpy as np

from pyflow.cocktailer.ir import (Block, Branch, Buffer, Call, FunctionCall, FunctionDef, Load, Loop,
                                  Offset, Scalar, TensorRef, UOperator, Var, as_scalar, walk)
from pyflow.errors import DTypeError, PyflowError, ShapeError
from pyflow.kernels.utask import CHUNK, TILE
from pyflow.kernels.utask.elementwise import copy_utask
from pyflow.kernels.utask.sizes import ceil_div

__all__ = ["TraceError", "TensorSpec", "spec", "Tensor", "Program", "trace", "for_loop", "while_loop",
           "cond", "function"]

FLOAT_DTYPES = (np.dtype("float32"), np.dtype("float64"))
INDEX_DTYPES = (np.dtype("int32"), np.dtype("int64"))


class TraceError(PyflowError, ValueError):
    """A program that cannot be traced: ops outside ``trace``, a stale tensor, bad control flow."""


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """The shape and dtype of a program input."""

    shape: tuple
    dtype: np.dtype = FLOAT_DTYPES[0]

    def __post_init__(self):
        shape = tuple(int(d) for d in self.shape)
        if any(d < 0 for d in shape):
            raise ShapeError(f"a TensorSpec needs non-negative sizes, got {shape}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if self.dtype not in FLOAT_DTYPES + INDEX_DTYPES:
            raise DTypeError(f"program inputs are float32/float64 tensors or int32/int64 tables, "
                             f"got {self.dtype}")


def spec(*shape, dtype="float32") -> TensorSpec:
    """``spec(4, 8)``: a float32 input of shape (4, 8); ``spec(7, dtype="int64")``: an int table."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return TensorSpec(shape, dtype)


# ---- the tracing context ----------------------------------------------------------


class _Arena:
    """Bump allocation of static offsets in one buffer; ``mark``/``reset`` give branches shared space."""

    def __init__(self, buffer: Buffer):
        self.buffer, self.top = buffer, 0

    def alloc(self, n: int) -> Offset:
        offset, self.top = self.top, self.top + n
        self.buffer.size = max(self.buffer.size, self.top)
        return Offset(None, offset)


class _Frame:
    """Allocation inside a recursive function's frame: offsets ``base + k``."""

    def __init__(self, fn: FunctionDef):
        self.fn, self.top = fn, 0

    def alloc(self, n: int) -> Offset:
        offset, self.top = self.top, self.top + n
        self.fn.frame_size = max(self.fn.frame_size, self.top)
        return Offset(self.fn.base, offset)


class _Trace:
    def __init__(self, chunk: int, tile: int):
        self.chunk, self.tile = chunk, tile
        self.buffers: list[Buffer] = []
        self.arenas: dict = {}
        self.functions: list[FunctionDef] = []
        self.blocks: list[Block] = []
        self.frames: list[_Frame] = []          # innermost recursive function being traced
        self.loop_depth = 0
        self.names: dict = {}

    def fresh(self, stem: str) -> str:
        n = self.names.get(stem, 0)
        self.names[stem] = n + 1
        return f"{stem}{n}"

    def allocator(self, dtype):
        if self.frames:
            frame = self.frames[-1]
            if np.dtype(dtype) != frame.fn.dtype:
                raise DTypeError(f"function {frame.fn.name!r}: its locals must be {frame.fn.dtype}, got {dtype}")
            return frame
        dtype = np.dtype(dtype)
        if dtype not in self.arenas:
            buffer = Buffer(f"arena_{dtype}", 0, dtype, "arena")
            self.buffers.append(buffer)
            self.arenas[dtype] = _Arena(buffer)
        return self.arenas[dtype]

    def new_ref(self, shape, dtype) -> TensorRef:
        shape = tuple(int(d) for d in shape)
        allocator = self.allocator(dtype)
        offset = allocator.alloc(math.prod(shape))
        buffer = allocator.fn.stack if isinstance(allocator, _Frame) else allocator.buffer
        return TensorRef(buffer, shape, offset)

    def emit(self, item) -> None:
        self.blocks[-1].items.append(item)

    @contextlib.contextmanager
    def block(self, block: Block):
        self.blocks.append(block)
        try:
            yield block
        finally:
            self.blocks.pop()

    @contextlib.contextmanager
    def shared_scratch(self):
        """Allocations made inside start where the previous sibling's started (cond branches)."""
        marks = {d: a.top for d, a in self.arenas.items()}
        frame_mark = self.frames[-1].top if self.frames else None
        ends = []

        def restart():
            ends.append(({d: a.top for d, a in self.arenas.items()}, self.frames[-1].top if self.frames else 0))
            for d, a in self.arenas.items():
                a.top = marks.get(d, 0)
            if self.frames:
                self.frames[-1].top = frame_mark

        yield restart
        ends.append(({d: a.top for d, a in self.arenas.items()}, self.frames[-1].top if self.frames else 0))
        for d, a in self.arenas.items():  # after the cond: past the larger branch
            a.top = max(e[0].get(d, 0) for e in ends)
        if self.frames:
            self.frames[-1].top = max(e[1] for e in ends)


_local = threading.local()


def _current() -> _Trace:
    t = getattr(_local, "trace", None)
    if t is None:
        raise TraceError("cocktailer ops and control flow only work inside cocktailer.trace(...)")
    return t


# ---- symbolic tensors -------------------------------------------------------------


class Tensor:
    """A symbolic tensor of a program being traced (a ``TensorRef`` plus a version).

    ``update`` writes in place and returns the new version; using the old one
    afterwards is a ``TraceError`` (it no longer holds what it held).
    """

    def __init__(self, ref: TensorRef, readonly: bool = False):
        self.ref = ref
        self.readonly = readonly
        self._stale_by: str | None = None

    @property
    def shape(self) -> tuple:
        return self.ref.shape

    @property
    def dtype(self) -> np.dtype:
        return self.ref.dtype

    @property
    def size(self) -> int:
        return self.ref.size

    def _use(self, op: str) -> TensorRef:
        if self._stale_by is not None:
            raise TraceError(f"{op}: this tensor was updated in place by {self._stale_by}; "
                             "use the tensor that update(...) returned")
        return self.ref

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, at {self.ref!r})"

    # row views -----------------------------------------------------------------
    def __getitem__(self, index) -> "Tensor":
        """``x[i]``: row ``i`` of the first axis, a view (``i`` an int or a device Scalar)."""
        ref = self._use("indexing")
        if not self.shape:
            raise ShapeError("cannot index a 0-d tensor")
        inner = self.shape[1:]
        row = math.prod(inner)
        if isinstance(index, Scalar):
            offset = ref.offset + (index * row if row != 1 else index)
        else:
            i = int(index)
            if not -self.shape[0] <= i < self.shape[0]:
                raise ShapeError(f"index {i} out of range for a tensor of shape {self.shape}")
            offset = ref.offset + (i % self.shape[0]) * row
        bounds = ref.region if offset.dynamic is not None else None
        return Tensor(TensorRef(ref.buffer, inner, offset, bounds), self.readonly)

    def reshape(self, *shape) -> "Tensor":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(int(d) for d in shape)
        if shape.count(-1) == 1:  # one side inferred, as in numpy
            known = math.prod(d for d in shape if d != -1)
            if known and self.size % known == 0:
                shape = tuple(self.size // known if d == -1 else d for d in shape)
        if any(d < 0 for d in shape) or math.prod(shape) != self.size:
            raise ShapeError(f"reshape: cannot view {self.shape} ({self.size} elements) as {tuple(shape)}")
        return Tensor(self._use("reshape").reshaped(shape), self.readonly)

    def item(self) -> Scalar:
        """The tensor's single element as a device Scalar (for conditions, indices)."""
        ref = self._use("item")
        if self.size != 1:
            raise ShapeError(f"item() needs a tensor of one element, got shape {self.shape}")
        return Load(ref)

    # arithmetic: the ops of ops.py (imported when used: ops.py builds on this module)
    def __add__(self, other): return _ops().add(self, other)
    def __sub__(self, other): return _ops().sub(self, other)
    def __mul__(self, other): return _ops().mul(self, other)
    def __neg__(self): return _ops().neg(self)
    def tanh(self): return _ops().tanh(self)
    def sigmoid(self): return _ops().sigmoid(self)
    def relu(self): return _ops().relu(self)


def _ops():
    from pyflow.cocktailer import ops

    return ops


def _tensor(x, op: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TraceError(f"{op}: expected a traced Tensor, got {type(x).__name__}")
    return x


def _float(x: Tensor, op: str) -> TensorRef:
    ref = x._use(op)
    if ref.dtype not in FLOAT_DTYPES:
        raise DTypeError(f"{op}: needs a float32/float64 tensor, got {ref.dtype} (int tables are only "
                         "for indices: table[i].item())")
    return ref


def _same_dtype(op, *refs):
    dtypes = {r.dtype for r in refs}
    if len(dtypes) > 1:
        raise DTypeError(f"{op}: inputs have different dtypes {sorted(map(str, dtypes))}")


def _emit_op(name, fn, fn_name, count, args, reads, writes, note="") -> None:
    _current().emit(UOperator(name, fn, fn_name, count, tuple(args), tuple(reads), tuple(writes), note))


# ---- the CopyUOperator (memory management) ---------------------------------------


def copy_operator(dst: TensorRef, src: TensorRef, why: str, chunk: int) -> UOperator:
    """A CopyUOperator ``dst = src`` (same size), ``chunk`` elements per uTask."""
    ew = ("elementwise", chunk)
    return UOperator("copy", copy_utask, "copy_utask", ceil_div(src.size, chunk), (dst, src, src.size, 0, 0, chunk),
                     ((src, ew),), ((dst, ew),), f"{dst!r} = {src!r}  # {why}")


def _copy_into(dst: TensorRef, src: TensorRef, why: str) -> None:
    t = _current()
    t.emit(copy_operator(dst, src, why, t.chunk))


# ---- control flow ------------------------------------------------------------------


def _as_tuple(result, what: str) -> tuple:
    if isinstance(result, Tensor):
        return (result,)
    if isinstance(result, (tuple, list)) and all(isinstance(r, Tensor) for r in result):
        return tuple(result)
    raise TraceError(f"{what} must return a Tensor or a tuple of Tensors, got {type(result).__name__}")


def _unwrap(values: tuple, single: bool):
    return values[0] if single else values


def _loop_state(init: tuple, what: str):
    """State buffers for loop-carried values, initialised by copies (CopyUOperators)."""
    t = _current()
    states = []
    for v in init:
        ref = _float(_tensor(v, what), what)
        state = t.new_ref(ref.shape, ref.dtype)
        _copy_into(state, ref, f"{what}: loop-carried input")
        states.append(Tensor(state))
    return states


def _write_back(states, results, what: str) -> None:
    if len(results) != len(states):
        raise TraceError(f"{what}: the body returned {len(results)} values for {len(states)} carried values")
    for s, r in zip(states, results):
        ref = _float(r, what)
        if ref.shape != s.shape or ref.dtype != s.dtype:
            raise ShapeError(f"{what}: a carried value changed from {s.shape} {s.dtype} to "
                             f"{ref.shape} {ref.dtype}")
        if ref.buffer is s.ref.buffer and ref.offset == s.ref.offset or (
                ref.buffer is s.ref.buffer and ref.offset.dynamic is s.ref.offset.dynamic
                and ref.offset.const == s.ref.offset.const):
            continue  # updated in place (or unchanged): nothing to copy
        _copy_into(s.ref, ref, f"{what}: carried value for the next iteration")


def for_loop(trip, body, *init):
    """Run ``body(i, *carried) -> carried`` for ``i`` in ``range(trip)``; returns the final values.

    ``trip`` is an int or a device Scalar (read on the device, every block alike).
    """
    t = _current()
    if not init:
        raise TraceError("for_loop: needs at least one loop-carried tensor")
    trip = as_scalar(trip)
    states = _loop_state(init, "for_loop")
    var = Var(t.fresh("i"))
    loop = Loop(var, Block(), trip=trip)
    t.loop_depth += 1
    try:
        with t.block(loop.body):
            results = _as_tuple(body(var, *states), "for_loop body")
            _write_back(states, results, "for_loop")
    finally:
        t.loop_depth -= 1
    t.emit(loop)
    return _unwrap(tuple(Tensor(s.ref) for s in states), len(states) == 1)


def while_loop(cond_fn, body, *init, max_iters: int = 10_000):
    """``while cond_fn(*carried): carried = body(*carried)``; at most ``max_iters`` iterations.

    ``cond_fn`` returns a Scalar (e.g. ``sum_rows(h).item() > 0``); ops inside it
    run before every test.  More than ``max_iters`` iterations raise
    ``IterationLimitError`` when the program runs.
    """
    t = _current()
    if not init:
        raise TraceError("while_loop: needs at least one loop-carried tensor")
    if not isinstance(max_iters, int) or max_iters < 0:
        raise TraceError(f"while_loop: max_iters must be an int >= 0, got {max_iters!r}")
    states = _loop_state(init, "while_loop")
    var = Var(t.fresh("w"))
    loop = Loop(var, Block(), head=Block(), max_iters=max_iters)
    t.loop_depth += 1
    try:
        with t.block(loop.head):
            predicate = cond_fn(*states)
            if not isinstance(predicate, Scalar):
                raise TraceError(f"while_loop: the condition must be a device Scalar (t.item() > 0), "
                                 f"got {type(predicate).__name__}")
            loop.cond = predicate
        with t.block(loop.body):
            results = _as_tuple(body(*states), "while_loop body")
            _write_back(states, results, "while_loop")
    finally:
        t.loop_depth -= 1
    t.emit(loop)
    return _unwrap(tuple(Tensor(s.ref) for s in states), len(states) == 1)


def cond(pred, then_fn, else_fn, *operands):
    """``then_fn(*operands)`` if ``pred`` else ``else_fn(*operands)``; both return alike shapes.

    ``pred`` is a device Scalar (a Python bool traces only the branch it picks).
    """
    t = _current()
    if not isinstance(pred, Scalar):
        return (then_fn if pred else else_fn)(*operands)
    branch = Branch(pred, Block(), Block())
    results_of: dict = {}   # branch block -> the TensorRefs it returned
    shapes = None
    with t.shared_scratch() as restart:
        for k, (fn, block) in enumerate(((then_fn, branch.then), (else_fn, branch.orelse))):
            if k == 1:
                restart()
            with t.block(block):
                results = _as_tuple(fn(*operands), "cond branch")
                refs = [_float(r, "cond") for r in results]
                if shapes is None:
                    shapes = [(r.shape, r.dtype) for r in refs]
                elif [(r.shape, r.dtype) for r in refs] != shapes:
                    raise ShapeError(f"cond: the branches return different shapes: {shapes} and "
                                     f"{[(r.shape, r.dtype) for r in refs]}")
                results_of[id(block)] = refs
    # the outputs live outside the shared scratch; each branch copies its results into them
    outs = [t.new_ref(shape, dtype) for shape, dtype in shapes]
    for block in (branch.then, branch.orelse):
        with t.block(block):
            for o, r in zip(outs, results_of[id(block)]):
                _copy_into(o, r, "cond output")
    t.emit(branch)
    return _unwrap(tuple(Tensor(o) for o in outs), len(outs) == 1)


# ---- functions and recursion ------------------------------------------------------


class Function:
    """``@function``: a function uTask.  With ``returns=spec(...)`` it may call itself (recursion).

    A plain function is traced at each call into a ``FunctionCall`` (inlined by the
    ``inline`` optimization).  A recursive one is traced once into a
    ``FunctionDef``: it takes int Scalars (e.g. a node id) and returns one tensor of
    the declared shape; every call is a ``Call`` (a uTask reference).
    """

    def __init__(self, fn, returns: TensorSpec | None):
        functools.update_wrapper(self, fn)
        self.fn, self.returns = fn, returns
        self._defs: dict = {}   # one FunctionDef per trace

    def __call__(self, *args):
        t = _current()
        if self.returns is None:
            call = FunctionCall(self.__name__, Block())
            with t.block(call.body):
                result = self.fn(*args)
            t.emit(call)
            return result
        if not all(isinstance(a, (Scalar, int, np.integer)) for a in args):
            raise TraceError(f"recursive function {self.__name__!r}: arguments must be int Scalars "
                             f"(node ids, indices), got {[type(a).__name__ for a in args]}")
        fdef = self._definition(t, len(args))
        caller = t.frames[-1] if t.frames else None
        if caller is not None and caller.fn is fdef:
            result = t.new_ref(fdef.result_shape, fdef.dtype)  # a slot in the caller's frame
        else:  # an outside call: the result lands in the stack's root area, then is copied out
            result = TensorRef(fdef.stack, fdef.result_shape, Offset(None, 0))
        t.emit(Call(fdef, tuple(as_scalar(a) for a in args), result))
        if caller is not None and caller.fn is fdef:
            return Tensor(result)
        out = t.new_ref(fdef.result_shape, fdef.dtype)
        _copy_into(out, result, f"result of {fdef.name}")
        return Tensor(out)

    def _definition(self, t: _Trace, n_args: int) -> FunctionDef:
        fdef = self._defs.get(id(t))
        if fdef is not None:
            if len(fdef.params) != n_args:
                raise TraceError(f"{fdef.name}: called with {n_args} arguments, defined with {len(fdef.params)}")
            return fdef
        if t.frames:
            raise TraceError(f"{self.__name__!r}: a recursive function may only call itself, not "
                             f"{t.frames[-1].fn.name!r}'s other recursive functions")
        name = t.fresh(self.__name__)
        dtype = self.returns.dtype
        if dtype not in FLOAT_DTYPES:
            raise DTypeError(f"{self.__name__}: returns must be float32/float64, got {dtype}")
        fdef = FunctionDef(name, tuple(Var(f"{name}_{p}") for p in _param_names(self.fn, n_args)),
                           self.returns.shape, dtype)
        fdef.stack = Buffer(f"stack_{name}", 0, dtype, "stack")
        fdef.base, fdef.ret = Var(f"{name}_base"), Var(f"{name}_ret")
        fdef.body = Block()
        t.buffers.append(fdef.stack)
        t.functions.append(fdef)
        self._defs[id(t)] = fdef
        frame = _Frame(fdef)
        t.frames.append(frame)
        saved_depth, t.loop_depth = t.loop_depth, 0
        try:
            with t.block(fdef.body):
                result = self.fn(*fdef.params)
                ref = _float(_tensor(result, fdef.name), fdef.name)
                if ref.shape != fdef.result_shape or ref.dtype != dtype:
                    raise ShapeError(f"{fdef.name}: returns {ref.shape} {ref.dtype}, declared "
                                     f"{fdef.result_shape} {dtype}")
                _copy_into(TensorRef(fdef.stack, ref.shape, Offset(fdef.ret, 0)), ref, "return")
        finally:
            t.frames.pop()
            t.loop_depth = saved_depth
        for item in walk(fdef.body):
            if isinstance(item, Loop):
                raise TraceError(f"{fdef.name}: loops inside a recursive function are not supported "
                                 "(call the function from a loop instead)")
        return fdef


def _param_names(fn, n: int):
    try:
        names = [p.name for p in inspect.signature(fn).parameters.values()][:n]
    except (TypeError, ValueError):
        names = []
    return names + [f"p{k}" for k in range(len(names), n)]


def function(fn=None, *, returns: TensorSpec | None = None):
    """Decorator: ``@function`` (a function uTask) or ``@function(returns=spec(d))`` (may recurse)."""
    if fn is None:
        return lambda f: Function(f, returns)
    return Function(fn, returns)


# ---- trace ------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class Program:
    """A traced program: buffers, the statement tree, inputs and outputs."""

    name: str
    body: Block
    inputs: list            # [(name, Buffer, TensorSpec)]
    outputs: list           # [TensorRef]
    buffers: list           # every Buffer (inputs, arenas, stacks)
    functions: list         # recursive FunctionDefs
    chunk: int
    tile: int
    single_output: bool

    def listing(self) -> str:
        """The statement tree, one line per statement (what ``print(program)`` shows)."""
        from pyflow.cocktailer.show import listing

        return listing(self)

    __str__ = listing


def trace(fn, *specs, chunk: int = CHUNK, tile: int = TILE, name: str | None = None) -> Program:
    """Trace ``fn(*inputs)`` into a ``Program``; ``specs`` give the inputs' shapes and dtypes.

    A spec is a ``TensorSpec`` (``spec(4, 8)``) or an array (its shape and dtype).
    ``chunk`` (elements per elementwise uTask) and ``tile`` (matmul tile side) fix the
    uTask granularity.
    """
    if not isinstance(chunk, int) or chunk < 1 or not isinstance(tile, int) or not 1 <= tile <= 32:
        raise TraceError(f"trace: chunk must be an int >= 1 and tile an int in 1..32, got {chunk}, {tile}")
    if getattr(_local, "trace", None) is not None:
        raise TraceError("trace: already tracing (nested trace calls are not supported)")
    t = _Trace(chunk, tile)
    names = _param_names(fn, len(specs))
    inputs, args = [], []
    for pname, s in zip(names, specs):
        if not isinstance(s, TensorSpec):
            s = TensorSpec(np.shape(s), np.asarray(s).dtype)
        buffer = Buffer(f"in_{pname}", math.prod(s.shape), s.dtype, "input")
        t.buffers.append(buffer)
        inputs.append((pname, buffer, s))
        args.append(Tensor(TensorRef(buffer, s.shape, Offset(None, 0)), readonly=True))
    body = Block()
    _local.trace = t
    try:
        with t.block(body):
            results = fn(*args)
            single = isinstance(results, Tensor)
            results = _as_tuple(results, "the program")
            outputs = []
            for r in results:  # outputs get their own arena space (never an input, never aliased)
                ref = r._use("output")
                out = t.new_ref(ref.shape, ref.dtype)
                _copy_into(out, ref, "program output")
                outputs.append(out)
    finally:
        _local.trace = None
    return Program(name or getattr(fn, "__name__", "program"), body, inputs, outputs, t.buffers,
                   t.functions, chunk, tile, single)
