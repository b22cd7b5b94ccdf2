"""The two executors of a traced program (seed 001), over the same IR and the same uTasks.

* host executor - what PyTorch or JAX do with dynamic control flow: every operator
  is its own kernel launch (``uoperator_kernel``: the op's uTasks in the
  virtual-block loop), loops and branches run in Python, and every condition,
  device trip count and recursion argument is a device-to-host read.
* compiled executor - a ``Schedule`` names parts of the program (uPrograms) that run
  as ONE persistent kernel each (a ``CompiledUProgram``, ``uprogram.py``, its source
  from ``codegen.py``); with the whole program on the device a call is one launch and
  no host syncs.  Parts left on the host run as in
  the host executor.

Both use the same buffers and the same uTask device functions with the same block
size, so their results are bitwise equal: a uTask's result depends only on ``u``,
never on the block that runs it.

``RunStats`` (``executor.last_stats``) counts, per call: ``launches`` (kernels
launched), ``host_syncs`` (device-to-host reads made to decide control flow; the
final read of the outputs and of the status word is not counted) and ``barriers``
(the grid barriers, and the group barriers of a ``CallGroup``, that block 0
waited at, counted inside the kernels).

The host executor walks the program with an explicit stack of tasks (``_walk``),
not Python recursion, so a program that recurses 5000 calls deep runs (or stops
with ``StackOverflowError`` at ``stack_depth``) like the compiled kernel, whose
stack of frames lives in shared memory.  An executor runs one call at a time (a
lock): every call uses the same preallocated buffers.

``run(*arrays)`` is the array path (numpy in, numpy out, the executor's own device
buffers, the default stream).  ``execute(memory, stream)`` is the part both paths
share: the tensor path (``launch.py``) calls it from inside one VM instruction,
over buffers from pyflow's caching allocator, with the ep stream's native stream.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

from pyflow.cocktailer import codegen
from pyflow.cocktailer.checks import static_int
from pyflow.cocktailer.ir import (Branch, Call, CallGroup, FunctionCall, Lane, Loop, StmtBlock, TensorRef, UOperator,
                                  walk)
from pyflow.cocktailer.names import kernel_name
from pyflow.cocktailer.scalars import BinOp, Const, Load, Scalar, Var, py_op
from pyflow.cocktailer.uprogram import CompiledUProgram, while_loops
from pyflow.errors import (DTypeError, IndexOutOfRangeError, IterationLimitError, LaunchConfigError, ShapeError,
                           StackOverflowError)
from pyflow.kernels.backend import cuda
from pyflow.kernels.utask.generated import uoperator_kernel

__all__ = ["Options", "RunStats", "Executor", "copy_into"]


@dataclasses.dataclass(frozen=True)
class Options:
    """How a program runs.

    ``threads``: threads per block (every kernel, both executors).  ``blocks``: grid
    of the persistent kernels (None: ``set_resource`` picks the co-resident limit,
    capped by the largest uTask count; the calls of a ``CallGroup`` run side by
    side, so there their counts add up).  ``host_blocks``: cap on the grid of one
    host-executor launch.  ``stack_depth``: frames per recursive function.
    ``inline``: inline function uTasks (else each is fenced by grid barriers).
    Each count is an int (a ``DTypeError`` otherwise) in its range (a
    ``LaunchConfigError`` otherwise).
    """

    threads: int = 32
    blocks: int | None = None
    host_blocks: int = 1024
    stack_depth: int = 64
    inline: bool = True

    def __post_init__(self):
        def check(name, high=None):
            value = static_int(getattr(self, name), f"Options: {name}", 1, high, LaunchConfigError)
            object.__setattr__(self, name, value)

        check("threads", 1024)
        if self.blocks is not None:
            check("blocks")
        check("host_blocks")
        check("stack_depth")


@dataclasses.dataclass
class RunStats:
    launches: int = 0
    host_syncs: int = 0
    barriers: int = 0

    def __str__(self):
        return f"launches={self.launches} host_syncs={self.host_syncs} barriers={self.barriers}"


class Executor:
    """Runs a program; ``device_units`` are the statements (or the whole body) compiled to kernels."""

    def __init__(self, program, options: Options, device_units=(), whole_program: bool = False,
                 drop_barriers=frozenset()):
        self.program, self.options = program, options
        self.kernels: dict = {}
        self.index_sites: list = []   # every kernel's run-time index checks, numbered across kernels
        if whole_program:
            self.kernels["body"] = CompiledUProgram(kernel_name(program.name, "uprogram"), program.body, program,
                                                    options, drop_barriers)
            self.index_sites += self.kernels["body"].index_sites
        for k, stmt in enumerate(device_units):
            self.kernels[id(stmt)] = CompiledUProgram(kernel_name(program.name, f"uprogram{k}"), StmtBlock([stmt]),
                                                      program, options, drop_barriers,
                                                      first_site=len(self.index_sites))
            self.index_sites += self.kernels[id(stmt)].index_sites
        self.last_stats = self.stats = RunStats()
        self.stream = 0                 # the numba stream of the call in progress (0: the default stream)
        self._memory = None
        self._lock = threading.Lock()   # one call at a time: every call uses the same buffers

    # ---- memory ------------------------------------------------------------------
    def scratch_buffers(self) -> list:
        """``[(name, elements, dtype)]``: every buffer a call needs besides its inputs (the arena).

        Intermediates, loop state and outputs, recursion stacks, and the status word.
        The array path keeps one set per executor (``_allocate``); the tensor path
        takes them from pyflow's caching allocator, per call (``launch.py``).
        """
        buffers = []
        for b in self.program.buffers:
            if b.role == "input":
                continue
            size = b.size
            if b.role == "stack":
                fdef = next(f for f in self.program.functions if f.stack is b)
                size = fdef.root_size + self.options.stack_depth * fdef.frame_size
            buffers.append((b.name, max(size, 1), np.dtype(b.dtype)))
        buffers.append(("status", self._status_size(), np.dtype(np.int64)))
        return buffers

    def _allocate(self):
        if self._memory is None:
            self._memory = {name: cuda.device_array(size, dtype=dtype)
                            for name, size, dtype in self.scratch_buffers()}
        return self._memory

    def _status_size(self) -> int:
        """``[error, detail, barriers, value]``, then three words per block group of every ``CallGroup``
        (``group_barrier``'s count and generation, a failed flag; see ``codegen``)."""
        bodies = [self.program.body] + [f.body for f in self.program.functions]
        lanes = sum(len(s.lanes) for b in bodies for s in walk(b) if isinstance(s, CallGroup))
        return codegen.STATUS_HEAD + 3 * lanes

    def check_inputs(self, arrays) -> None:
        """Raise unless ``arrays`` (arrays or tensors) have the traced count, shapes and dtypes."""
        spec = self.program.inputs
        if len(arrays) != len(spec):
            raise ShapeError(f"{self.program.name}: expected {len(spec)} inputs "
                             f"({', '.join(n for n, _, _ in spec)}), got {len(arrays)}")
        for (name, buffer, s), a in zip(spec, arrays):
            shape = tuple(a.shape) if hasattr(a, "shape") else np.shape(a)   # (a tensor's values are not read)
            dtype = np.dtype(a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype)
            if shape != s.shape:
                raise ShapeError(f"{self.program.name}: input {name!r} has shape {shape}, traced as {s.shape}")
            if dtype != s.dtype:
                raise DTypeError(f"{self.program.name}: input {name!r} is {dtype}, traced as {s.dtype}")

    def _bind_inputs(self, arrays, memory):
        self.check_inputs(arrays)
        for (name, buffer, s), a in zip(self.program.inputs, arrays):
            shape = tuple(getattr(a, "shape", np.shape(a)))
            if hasattr(a, "copy_to_host"):  # a device array: use it in place, flat
                memory[buffer.name] = a.reshape(-1) if len(shape) != 1 else a
            else:   # numpy, lists, scalars, anything numpy can read
                memory[buffer.name] = cuda.to_device(np.ascontiguousarray(a, dtype=s.dtype).reshape(-1))

    # ---- running -------------------------------------------------------------------
    def run(self, *arrays, to_host: bool = True):
        """One call.  Calls from several threads take turns (``self._lock``); ``last_stats`` is
        the counts of the call that finished last.  With ``to_host=False`` the outputs are
        views of the program's buffers, valid until the next call."""
        arrays = [_host_values(a) for a in arrays]   # outside the lock: numpy() may wait for the VM
        with self._lock:
            memory = self._allocate()
            self._bind_inputs(arrays, memory)
            try:
                outs = self.execute(memory)
                outs = [o.copy_to_host().reshape(ref.shape) if to_host else o
                        for o, ref in zip(outs, self.program.outputs)]
            finally:
                self.last_stats = self.stats
        return outs[0] if self.program.single_output else tuple(outs)

    def execute(self, memory: dict, stream=0) -> list:
        """Run the program over ``memory`` (buffer name -> flat array), its kernels launched on
        ``stream`` (a numba stream; 0: the default); returns the outputs' flat views.

        The caller holds ``self._lock`` and reads ``self.stats`` afterwards.  Reading the
        status word back waits for the program (it is how a device error is reported).
        """
        self.stats, self.memory, self.stream = RunStats(), memory, stream
        _fill_zeros(memory["status"], stream)
        if "body" in self.kernels:
            self._launch(self.kernels["body"], {})
        else:
            self._walk(self.program.body)
        status = _to_host(memory["status"], stream)
        self._raise_for(status)
        self.stats.barriers += int(status[2])
        return [self._view(ref, {}) for ref in self.program.outputs]

    def _raise_for(self, status) -> None:
        code, detail = int(status[0]), int(status[1])
        if code == codegen.ERR_STACK_OVERFLOW:
            fdef = self.program.functions[detail]
            name = fdef.unrolled_from or fdef.name
            raise StackOverflowError(f"{self.program.name}: recursive function {name!r} went deeper than "
                                     f"stack_depth={self.options.stack_depth} frames")
        if code == codegen.ERR_INDEX:
            self._index_error(self.index_sites[detail], int(status[3]))
        if code == codegen.ERR_ITERATIONS:
            loops = while_loops(self.program)
            cap = loops[detail].max_iters if detail < len(loops) else "?"
            raise IterationLimitError(f"{self.program.name}: a while loop ran more than max_iters={cap} "
                                      "iterations")

    def _launch(self, compiled: CompiledUProgram, env: dict) -> None:
        args = [self.memory[n] for n in compiled.buffer_names] + [self.memory["status"]]
        args += [int(env[id(v)]) for v in compiled.free_vars]
        blocks = compiled.grid(args, self.options, self.program.name)
        compiled.kernel[blocks, self.options.threads, self.stream](*args)
        self.stats.launches += 1

    # host-side evaluation ------------------------------------------------------------
    def _scalar(self, s: Scalar, env: dict):
        if isinstance(s, Const):
            return s.value
        if isinstance(s, Var):
            return env[id(s)]
        if isinstance(s, Load):
            view = self._view(s.ref, env, size=1)
            self.stats.host_syncs += 1   # a device-to-host read decides what runs next
            return _to_host(view, self.stream)[0].item()
        if isinstance(s, BinOp):
            return py_op(s.op)(self._scalar(s.a, env), self._scalar(s.b, env))
        raise TypeError(f"not a scalar: {s!r}")

    def _view(self, ref: TensorRef, env: dict, size: int | None = None):
        start = ref.offset.const + (int(self._scalar(ref.offset.dynamic, env))
                                    if ref.offset.dynamic is not None else 0)
        n = ref.size if size is None else size
        if ref.bounds is not None and not ref.bounds[0] <= start <= start + n <= ref.bounds[1]:
            self._index_error(ref, start)
        return self.memory[ref.buffer.name][start:start + (ref.size if size is None else size)]

    def _index_error(self, ref: TensorRef, start: int):
        raise IndexOutOfRangeError(
            f"{self.program.name}: a run-time index puts {ref!r} at element {start}, outside "
            f"[{ref.bounds[0]}, {ref.bounds[1]}) of the tensor it indexes")

    # the host walk: an explicit stack of tasks, no Python recursion ------------------------
    def _walk(self, body: StmtBlock) -> None:
        """Run ``body`` on the host, the statements in progress on an explicit stack.

        A *task* is a generator for one block or one nested uTask: it does its own work
        (launches, host reads) and ``yield``s each sub-task it needs run, in order.  This
        loop runs the task on top of ``stack``; a yielded sub-task goes on top and runs to
        its end before the task below resumes.  So the Python stack stays this shallow
        however deep the program nests or recurses: a chain of 1000 calls is a ``stack``
        of a few thousand tasks (the compiled kernel keeps its frames in shared memory).
        """
        stack = [self._block(body, {}, -1)]
        while stack:
            try:
                task = next(stack[-1])
            except StopIteration:
                stack.pop()
            else:
                stack.append(task)

    def _block(self, block: StmtBlock, env: dict, frame: int):
        """Task: the statements of ``block`` in order (``frame``: the recursion's frame, -1 outside)."""
        for item in block.items:
            compiled = self.kernels.get(id(item))
            if compiled is not None:
                self._launch(compiled, env)
            elif isinstance(item, UOperator):
                self._operator(item, env)
            else:
                yield self._nested(item, env, frame)

    def _operator(self, item: UOperator, env: dict) -> None:
        """One operator, one launch: its uTasks in the virtual-block loop."""
        if item.count == 0:
            return
        args = [self._view(a, env) if isinstance(a, TensorRef) else int(a) for a in item.args]
        blocks = min(item.count, self.options.host_blocks)
        uoperator_kernel(item.fn, len(args))[blocks, self.options.threads, self.stream](0, item.count, *args)
        self.stats.launches += 1

    def _nested(self, item, env: dict, frame: int):
        """Task: a nested uTask; it yields the blocks it runs, one at a time."""
        if isinstance(item, Loop) and item.kind == "for":
            for i in range(int(self._scalar(item.trip, env))):
                env[id(item.var)] = i
                yield self._block(item.body, env, frame)
        elif isinstance(item, Loop):
            env[id(item.var)] = 0
            while True:
                yield self._block(item.head, env, frame)
                if not self._scalar(item.cond, env):
                    break
                if env[id(item.var)] == item.max_iters:
                    raise IterationLimitError(f"{self.program.name}: a while loop ran more than "
                                              f"max_iters={item.max_iters} iterations")
                yield self._block(item.body, env, frame)
                env[id(item.var)] += 1
        elif isinstance(item, Branch):
            yield self._block(item.then if self._scalar(item.pred, env) else item.orelse, env, frame)
        elif isinstance(item, (FunctionCall, CallGroup)):   # a group's lanes: one after another
            yield self._block(item.body, env, frame)
        elif isinstance(item, Lane):
            if item.fn is not None and item.depth >= self.options.stack_depth:   # an unrolled call's frame
                name = item.fn.unrolled_from or item.fn.name
                raise StackOverflowError(f"{self.program.name}: recursive function {name!r} went deeper "
                                         f"than stack_depth={self.options.stack_depth} frames")
            yield self._block(item.body, env, frame)
        elif isinstance(item, Call):
            inner, callee = self._enter(item, env, frame)
            yield self._block(item.fn.body, inner, callee)
        else:
            raise TypeError(f"cannot run {item!r}")

    def _enter(self, call: Call, env: dict, frame: int) -> tuple:
        """A call's frame: the callee's environment (parameters, base, return slot) and its depth."""
        fdef = call.fn
        callee = frame + 1 + call.depth
        if callee >= self.options.stack_depth:
            name = fdef.unrolled_from or fdef.name
            raise StackOverflowError(f"{self.program.name}: recursive function {name!r} went deeper "
                                     f"than stack_depth={self.options.stack_depth} frames")
        inner = dict(env)
        for p, a in zip(fdef.params, call.args):
            inner[id(p)] = int(self._scalar(a, env))
        inner[id(fdef.ret)] = call.result.offset.const + (
            int(self._scalar(call.result.offset.dynamic, env)) if call.result.offset.dynamic is not None else 0)
        inner[id(fdef.base)] = fdef.root_size + callee * fdef.frame_size
        return inner, callee


def _fill_zeros(array, stream) -> None:
    """``array[:] = 0`` in ``stream``'s order (a device array) or now (a numpy array: the simulator on the host)."""
    if isinstance(array, np.ndarray):
        array[...] = 0
    else:
        array.copy_to_device(np.zeros(array.shape, array.dtype), stream=stream)


def _to_host(array, stream) -> np.ndarray:
    """A host copy of ``array`` once ``stream``'s work so far is done (a device-to-host read)."""
    if isinstance(array, np.ndarray):
        return array.copy()
    host = array.copy_to_host(stream=stream)
    if stream != 0:
        stream.synchronize()
    return host


def copy_into(dst, src, stream) -> None:
    """``dst[:] = src`` for two flat arrays of one kind (device or numpy), in ``stream``'s order."""
    if isinstance(dst, np.ndarray):
        np.copyto(dst, src)
    else:
        dst.copy_to_device(src, stream=stream)


def _host_values(a):
    """A ``pyflow.Tensor`` argument as numpy (``numpy()`` waits for the ops that make it); others as they are."""
    from pyflow.framework.tensor import Tensor as FlowTensor   # seed 002's eager tensors

    return a.numpy() if isinstance(a, FlowTensor) else a
