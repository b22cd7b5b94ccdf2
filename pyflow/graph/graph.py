"""Seed 004: ``flow.nn.Graph``: trace ``build`` once, compile it to a Plan, then only run the Plan.

OneFlow's static-graph API::

    class TrainGraph(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model                        # modules become graph members
            self.add_optimizer(sgd)                   # the optimizer pass adds the update ops
            self.config.set_gradient_accumulation_steps(4)

        def build(self, x, y):
            loss = loss_fn(self.model(x), y)
            loss.backward()                           # marks the loss: the autograd pass does the rest
            return loss

    g = TrainGraph()
    loss = g(x, y)      # 1st call: trace build (lazy mode) -> Job -> passes -> Plan; then run it
    loss = g(x, y)      # later calls: run the Plan only

What happens at the first call (``g.debug(1)`` prints each step with its time):

1. **Trace**: ``build`` runs in lazy mode (``pyflow/compiler/lazy.py``): the inputs are
   ``input`` ops, every eager tensor it touches (parameters, buffers, captured
   tensors) a ``variable`` op, every op call a Job op.
2. **Compile** (``pyflow.compiler.compile_job``): the passes, the OpGraph (SBP), the
   TaskGraph (boxing, copies), regsts and memory, the Plan (``g.plan``), each rank's calls
   closed by its ticks for ``config.outputs_buffer_size`` calls in flight.
3. **Run**: the Plan runs on the actor runtime (``pyflow/runtime``), one per graph, made
   at the first call and kept (closed when the graph is garbage-collected or at exit).
   ``g.executor`` (or ``PYFLOW_GRAPH_EXECUTOR``) picks ``"actors"`` (default),
   ``"deterministic"`` (the runtime on the caller's thread, for pdb) or ``"sequential"``
   (the sequential Plan interpreter, ``pyflow/runtime/sequential.py``).

**A call, and successive calls pipelining** (OneFlow: "the outputs buffer size bounds how
many calls run at once; ``numpy()`` of an output waits for just that call").  ``g(x)``:

1. makes the output tensors it will return (empty, allocated by the VM);
2. issues a ``LaunchLazyJob`` VM instruction that reads the inputs and hands the call to the
   runtime (``pyflow/vm/policies/launch_lazy_job.py``);
3. waits only until the call's *frontier* has acted (``pyflow/runtime/call.py``): every op of
   the call that reads or writes the caller's inputs and parameters, talks to other ranks,
   or makes an output is then *issued* (not necessarily run), so whatever the caller issues
   next is ordered after it (an ``x.add_(1)`` cannot reach the call; ``model.weight.numpy()``
   sees its update) and cannot hold back anything the call's outputs need;
4. issues, per output, an *output critical section*: an instruction that writes the output
   tensor and completes once the call's output actor has handed over the value; then returns.

So ``g(x)`` returns while the call still runs (its ops in the VM, its other actors, its sink);
the next ``g(x2)`` starts meanwhile (at most ``config.outputs_buffer_size`` calls in flight: the
source tick admits no more, and a call's frontier cannot act before it is admitted), and reading
an output (``y.numpy()``, ``y + 1``) waits for that call's output only; ``flow.sync()`` (and the end
of a ``flow.trace()`` block) waits for the whole of this rank's calls in flight.  On a pipeline over
several ranks each rank's ``g(x)`` waits only for its own stage.  Why the frontier holds every
op the outputs need, rather than only those touching the caller's memory: the VM keeps some
ops of one stream in order, the caller's and the actors' alike (``y.zero_()``, the stream waits
it inserts), so a caller's op waiting for an output must not be able to come before one the
output needs (``call.py`` tells the whole story; actors issuing their ops on streams of their
own would lift this).

A failure in call k stops the runtime and raises ``OpError`` naming the actor and the op: at
``g(x)`` itself if it came before the call's frontier acted (an act upstream of an output that
raises), else at the readers of call k's outputs (a kernel that fails in the VM after ``g(x)``
returned); the outputs of later calls in flight raise it too, the next ``g(x)`` makes a new
runtime.  With ``"deterministic"`` (or the VM in step-through mode, ``PYFLOW_VM_SYNC``) the
caller's thread runs the whole call before returning.  Ctrl-C in ``g(x)`` goes up at once; the calls
handed to the runtime finish while it closes on a thread of its own (``_close_runtime``).

After each call that trains, the graph steps its learning-rate scheduler (OneFlow steps
it once per graph call) and counts the step (Adam's bias correction reads it).
"""

from __future__ import annotations

import os
import time

from pyflow import vm
from pyflow.compiler import compile_job
from pyflow.compiler.job import Job
from pyflow.compiler.lazy import LazyTensor, LazyTracer, tracing
from pyflow.device.ep.base import is_interrupt
from pyflow.distributed.global_tensor import make_global, to_local
from pyflow.errors import GraphError
from pyflow.framework.creation import empty
from pyflow.framework.tensor import Tensor
from pyflow.graph.inputs import check_inputs, input_layout
from pyflow.nn.module import Module
from pyflow.nn.parallel import is_distributed_data_parallel
from pyflow.runtime import Runtime
from pyflow.runtime.live import close_in_background, close_when_collected
from pyflow.runtime.sequential import run_plan

__all__ = ["Graph", "GraphModule", "GraphConfig"]

_EXECUTORS = ("actors", "deterministic", "sequential")


class GraphConfig:
    """``graph.config``: how the graph compiles (OneFlow's ``GraphConfig``)."""

    def __init__(self):
        self.gradient_accumulation_steps = 1
        self.outputs_buffer_size = 2

    def set_gradient_accumulation_steps(self, value: int) -> None:
        """Split each call's inputs into ``value`` micro-batches along dim 0; update once per call."""
        if not isinstance(value, int) or value < 1:
            raise GraphError(f"set_gradient_accumulation_steps: needs an int >= 1, got {value!r}")
        self.gradient_accumulation_steps = value

    def set_outputs_buffer_size(self, value: int = 2) -> None:
        """How many calls may be in flight at once (the actor runtime's output buffer)."""
        if not isinstance(value, int) or value < 1:
            raise GraphError(f"set_outputs_buffer_size: needs an int >= 1, got {value!r}")
        self.outputs_buffer_size = value


class GraphModule:
    """A module's settings inside one graph: ``graph.model.to(flow.nn.graph.GraphModule).set_stage(1, p)``."""

    def __init__(self, name: str):
        self.name = name
        self.stage_id = None
        self.stage_placement = None

    def set_stage(self, stage_id: int, placement=None) -> "GraphModule":
        """Put the module in pipeline stage ``stage_id``; with ``placement``, its tensor inputs move there."""
        if not isinstance(stage_id, int) or stage_id < 0:
            raise GraphError(f"set_stage of {self.name}: stage_id must be an int >= 0, got {stage_id!r}")
        self.stage_id, self.stage_placement = stage_id, placement
        return self


class _ProxyModule:
    """How ``build`` sees a member module: calling it records its ops with the module's stage."""

    def __init__(self, name: str, module: Module, graph: "Graph"):
        self._name, self._module, self._graph, self._config = name, module, graph, GraphModule(name)

    def to(self, kind):
        if kind is GraphModule:
            return self._config
        raise GraphError(f"{self._name}.to({kind!r}) inside nn.Graph: only .to(flow.nn.graph.GraphModule) is "
                         "allowed here; move the module before building the graph")

    def __call__(self, *args, **kwargs):
        tracer = self._graph._tracer
        if tracer is None:
            return self._module(*args, **kwargs)
        outer = tracer.stage
        config = self._config
        if config.stage_id is not None:
            tracer.stage = config.stage_id
            if config.stage_placement is not None:
                args = tuple(_move(a, config.stage_placement) for a in args)
        try:
            return self._module(*args, **kwargs)
        finally:
            tracer.stage = outer

    def __getattr__(self, name):
        return getattr(self._module, name)


def _move(x, where):
    """A stage input moved to the stage's placement (a device for local tensors)."""
    if not isinstance(x, Tensor):
        return x
    if x.is_global or not isinstance(where, (str,)) and hasattr(where, "ranks"):
        return x.to_global(placement=where)
    return x.to(where)


def _flatten(value, found: list):
    """The tensors of ``value`` (a tensor, or tuples/lists/dicts of them), and how to rebuild it."""
    if isinstance(value, (tuple, list)):
        parts = [_flatten(v, found) for v in value]
        return (type(value), parts)
    if isinstance(value, dict):
        return (dict, {k: _flatten(v, found) for k, v in value.items()})
    if value is None:
        return (None, None)
    found.append(value)
    return ("leaf", len(found) - 1)


def _rebuild(shape, values: list):
    kind, parts = shape
    if kind == "leaf":
        return values[parts]
    if kind is None:
        return None
    if kind is dict:
        return {k: _rebuild(v, values) for k, v in parts.items()}
    return kind(_rebuild(p, values) for p in parts)


class Graph:
    """Subclass it, assign modules in ``__init__``, write ``build(self, *inputs)``; call it like a module."""

    def __init__(self):
        object.__setattr__(self, "_members", {})
        self.config = GraphConfig()
        self._optimizers = []
        self._job = None
        self._traced_job_text = ""
        self._plan = None
        self._debug_level = 0
        self._tracer = None
        self._out_shape = None
        self._input_layouts = []   # each input's layout (inputs.py) at the trace: later calls must match it
        self._calls = 0
        self.compile_log = []     # (step, seconds) of the first call

    # --- members --------------------------------------------------------------------------------

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, Module):
            if is_distributed_data_parallel(value):
                raise GraphError(f"{type(self).__name__}.{name}: a DistributedDataParallel module averages its "
                                 "gradients from eager backward hooks, which a compiled backward never runs; in an "
                                 "nn.Graph, train data parallel with global tensors (parameters "
                                 "to_global(placement, flow.sbp.broadcast), the batch flow.sbp.split(0))")
            self._members[name] = _ProxyModule(name, value, self)
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        members = self.__dict__.get("_members", {})
        if name in members:
            return members[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def build(self, *args):
        raise NotImplementedError(f"nn.Graph {type(self).__name__} must define build(self, *inputs)")

    def add_optimizer(self, optim, *, lr_sch=None) -> None:
        """Train: the optimizer pass adds ``optim``'s update ops; ``lr_sch`` is stepped after every call."""
        self._optimizers.append((optim, lr_sch))

    def debug(self, v_level: int = 0) -> None:
        """``v_level >= 1``: print each compile step (trace, every pass, OpGraph, TaskGraph, Plan) and its time."""
        self._debug_level = v_level

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def job(self) -> Job:
        """The compiled Job (after the passes); ``None`` before the first call."""
        return self._job

    @property
    def plan(self):
        """The Plan (``print(g.plan)``: OneFlow's light plan); ``None`` before the first call."""
        return self._plan

    # --- calls ----------------------------------------------------------------------------------

    def __call__(self, *args):
        for i, a in enumerate(args):
            if not isinstance(a, Tensor):
                raise GraphError(f"nn.Graph {self.name}: input {i} is a {type(a).__name__}; graph inputs must be "
                                 "tensors (capture other values in __init__ or as constants in build)")
            if isinstance(a, LazyTensor):
                raise GraphError(f"nn.Graph {self.name} called inside another graph's build: graphs cannot be "
                                 "nested; call its modules directly")
        if self._plan is None:
            self._compile(args)
        else:
            check_inputs(self.name, args, self._input_layouts)
        outputs = self._run(list(args))
        self._after_call()
        return _rebuild(self._out_shape, outputs)

    # --- running the Plan -----------------------------------------------------------------------

    executor = None   # "actors" | "deterministic" | "sequential"; None: $PYFLOW_GRAPH_EXECUTOR, else "actors"
    act_fn = None     # the runtime's act (``Runtime(act_fn=...)``: tests and benchmarks, e.g. acts that sleep)

    def _executor(self) -> str:
        choice = self.__dict__.get("executor") or os.environ.get("PYFLOW_GRAPH_EXECUTOR") or "actors"
        if choice not in _EXECUTORS:
            raise GraphError(f"nn.Graph {self.name}: executor {choice!r} is not one of {', '.join(_EXECUTORS)}")
        return choice

    def _run(self, args: list) -> list:
        """One call of the Plan (the module docstring's "A call"), or of the sequential interpreter."""
        executor = self._executor()
        if executor == "sequential":
            return run_plan(self._plan, args, self._job)
        runtime = self._runtime_for(deterministic=executor == "deterministic")
        handle = runtime.register(args)   # checks the inputs first: an error here runs nothing
        try:
            outputs, sections = self._output_tensors(runtime, handle)
            # every input, a global one's piece too: the call starts once their writers are done (an output critical
            # section among them leaves nothing on its stream for the actors' first read to wait for, which could be
            # queued behind this call's own section: ``InstructionsBuilder.launch_lazy_job``)
            inputs = [a._blob for a in args]
            vm.run(lambda builder: builder.launch_lazy_job(self.name, lambda: runtime.start(handle), inputs))
            if runtime.deterministic or vm.get_vm().sync_mode:
                handle.result()        # the caller's thread runs the actors, or every op: the whole call
            else:
                handle.wait_issued()   # the frontier acted: what the caller issues next comes after it
            vm.run(lambda builder: builder.launch_lazy_job(self.name, None, [], sections))
            return outputs
        except BaseException as error:
            # Ctrl-C (or pdb's quit): it goes up at once, the runtime closes on a thread of its own (however long
            # a stage takes); a dead runtime, or a call that never started: close it now (its threads exit); either
            # way the next call makes a new one
            if is_interrupt(error) or runtime.error is not None or not handle.started:
                self._close_runtime(quiet=True, background=is_interrupt(error))
            raise

    def _output_tensors(self, runtime, handle) -> tuple:
        """The tensors the call returns (made now, written by the output critical sections) and the sections:
        ``(index, blob, fetch)`` per output piece this rank holds.  A global output is this rank's piece
        wrapped (an empty piece where the rank holds none)."""
        context = handle.context
        # (index, regst desc) of each output task of this rank: found in the Plan once, not at every call
        plan, specs = self._plan, self.__dict__.get("_output_specs")
        if specs is None or specs[0] is not plan or specs[1] != runtime.rank:
            found = [(plan.op_attrs[t.op_name][2]["index"], plan.regsts[t.produced["out_0"]])
                     for t in plan.tasks.values() if t.kind == "output" and t.rank == runtime.rank]
            specs = (plan, runtime.rank, found)
            object.__setattr__(self, "_output_specs", specs)
        pieces = {index: empty(tuple(desc.shape), dtype=desc.dtype, device=desc.device) for index, desc in specs[2]}
        outputs = []
        for i in range(context.output_count):
            layout = context.output_layouts.get(i)
            outputs.append(pieces[i] if layout is None else make_global(pieces.get(i), *layout))
        sections = [(i, to_local(piece)._blob, lambda i=i: handle.output(i)) for i, piece in sorted(pieces.items())]
        return outputs, sections

    @property
    def runtime(self):
        """The actor runtime running this graph's Plan (``None`` before the first call)."""
        return self.__dict__.get("_runtime")

    def _runtime_for(self, deterministic: bool) -> Runtime:
        runtime = self.__dict__.get("_runtime")
        # a call failed since the last one returned, or the rank's VM shut down (which closes its runtimes)
        if runtime is not None and (runtime.error is not None or runtime.closed):
            self._close_runtime(quiet=True)
            runtime = None
        if runtime is not None and runtime.deterministic != deterministic:
            self._close_runtime()
            runtime = None
        if runtime is None:
            runtime = Runtime(self._plan, self._job, deterministic=deterministic, name=self.name,
                              max_calls_in_flight=self.config.outputs_buffer_size, act_fn=self.act_fn, fold=True)
            object.__setattr__(self, "_runtime", runtime)
            # closes the runtime when the graph is garbage-collected (holds no ref to the graph), on a thread
            # of its own; at exit live.py closes it
            object.__setattr__(self, "_runtime_closer", close_when_collected(self, runtime))
        return runtime

    def _close_runtime(self, quiet: bool = False, background: bool = False) -> None:
        """Close this graph's runtime now (its threads stop); the next call makes a new one.

        ``quiet``: an error while closing is dropped (the caller is raising the one that matters).
        ``background``: on a thread of its own (``live.close_in_background``): an interrupted caller never waits.
        """
        closer = self.__dict__.get("_runtime_closer")
        object.__setattr__(self, "_runtime", None)
        object.__setattr__(self, "_runtime_closer", None)
        detached = closer.detach() if closer is not None else None   # closed here, not when collected
        if detached is None:
            return
        _, _, (runtime,), _ = detached   # (the finalizer's object, function, arguments, keywords)
        if background:
            close_in_background(runtime)
            return
        try:
            runtime.close()
        except Exception:  # noqa: BLE001 - see the docstring
            if not quiet:
                raise

    def _log(self, step: str, seconds: float) -> None:
        self.compile_log.append((step, seconds))
        if self._debug_level >= 1:
            print(f"[nn.Graph {self.name}] {step}: {seconds * 1e3:.2f} ms")

    def _compile(self, args) -> None:
        job = Job(self.name)
        job.grad_acc_steps = self.config.gradient_accumulation_steps
        job.optimizers = list(self._optimizers)
        tracer = LazyTracer(job)
        for member, proxy in self._members.items():
            for name, t in list(proxy._module.named_parameters()) + list(proxy._module.named_buffers()):
                tracer.names[id(t)] = f"{member}.{name}"
        start = time.perf_counter()
        self._tracer = tracer
        try:
            with tracing(tracer):
                inputs = [tracer.input(a, i) for i, a in enumerate(args)]
                result = self.build(*inputs)
                found: list = []
                self._out_shape = _flatten(result, found)
                for i, x in enumerate(found):
                    tracer.output(x, i)
        finally:
            self._tracer = None
        self._input_layouts = [input_layout(a) for a in args]
        self._traced_job_text = str(job)
        self._log(f"trace build ({len(job)} ops)", time.perf_counter() - start)
        if self._optimizers and job.loss_lbn is None:
            raise GraphError(f"nn.Graph {self.name} has an optimizer but build() called no loss.backward()")
        self._plan = compile_job(job, tracer, log=self._log, calls_in_flight=self.config.outputs_buffer_size)
        self._job = job

    def _after_call(self) -> None:
        self._calls += 1
        for optim, lr_sch in self._optimizers:
            optim._graph_steps = getattr(optim, "_graph_steps", 0) + 1
            if lr_sch is not None:
                lr_sch.step()

    def __repr__(self) -> str:
        members = ", ".join(f"{k}: {type(v._module).__name__}" for k, v in self._members.items())
        state = "compiled" if self._plan is not None else "not compiled yet"
        return f"nn.Graph {self.name} ({members}; {state})"
