"""Seed 003: one call of a compiled graph at run time: its context, its inputs checked, its handle.

A call is what ``Graph.__call__`` (or ``Runtime.launch``) starts: one piece at the source
tick, ``(call, 0)``, which the actors turn into k micro-batches and back.  Everything an
act needs besides its regsts is the call's ``CallContext``: the caller's inputs, this call's
learning rate and step count (read when the call is registered, so calls in flight each keep
their own), and where the outputs go.

* ``CallContext``  - what a call's acts read and fill besides regsts; ``call_context(job, inputs)``
  makes it for a compiled Job;
* ``CallTemplate`` - what every call shares, derived once per Runtime: ``check(inputs)`` (inputs
  that do not fit the Plan's input regsts are an error before anything runs: a compiled graph
  takes inputs like those it was traced with) and ``context(inputs)``, the call's context (a
  hand-made Plan without a Job gets an empty one);
* ``CallHandle``   - what the caller holds: ``result()`` waits until the call's sink tick acted;
  ``wait_issued()`` only until the call's *frontier* acted; ``output(i)`` until output ``i``'s
  value is written (the output actor hands it over, ``actors/output.py``).

**The frontier** (``frontier_tasks``): the tasks whose acts must have issued their ops before
``nn.Graph`` may hand a call back while the rest of it is still running, because an eager
op the caller issues next could otherwise be ordered before them:

* the tasks that touch memory the caller owns: the input and variable tasks and every task
  reading them (or an alias of them: a repeat of a parameter), among them the ops that update
  parameters in place; the caller's next op on an input or a parameter then comes after them;
* the send / recv / collective tasks: a rank's collectives must be issued in the same order
  on every rank, eager ones included (``comm_net.py``);
* the output tasks, their value's hand-over included (``actors/output.py``): then every op the
  call's outputs depend on is issued.  This one is about deadlock.  The caller's next op on an
  output waits for the output's critical section, which waits for those ops; and an op that
  keeps its stream in order (``y.zero_()``, and the stream waits the VM inserts between two
  streams of one device, for the caller's ops as for the actors') holds back every later
  stream-ordered op of that stream.  Were one the output depends on issued later, the two
  would wait for each other.  Issued earlier, it runs first.  (An act's own ops keep their stream
  in order too, so that the VM fuses runs of them, ``act.PreparedOpCall``: one issued after the
  caller's op waits for it, and the caller's op waits for nothing issued after it.)
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

from pyflow.distributed.global_tensor import make_global
from pyflow.errors import DeviceError, DTypeError, GraphError, RuntimeHangError, ShapeError
from pyflow.framework.tensor import Tensor
from pyflow.runtime.comm_net import is_comm
from pyflow.runtime.watchdog import wait_until

__all__ = ["CallContext", "call_context", "CallHandle", "CallTemplate", "frontier_tasks"]


@dataclasses.dataclass
class CallContext:
    """What one call of a Plan reads and fills besides its regsts."""

    inputs: list                                  # the graph's eager inputs, by index
    variables: dict                               # variable op name -> the eager tensor (job.variables)
    outputs: dict = dataclasses.field(default_factory=dict)   # output index -> the value (a fresh tensor)
    feeds: dict = dataclasses.field(default_factory=dict)     # variable op name -> its value for this call
    output_layouts: dict = dataclasses.field(default_factory=dict)   # output index -> (placement, sbp, shape,
    #                                                                   dtype) of a global output
    output_count: int = 0

    def results(self) -> list:
        """The outputs in order; a global output this rank holds no piece of is an empty piece of it."""
        for i, layout in self.output_layouts.items():
            if i not in self.outputs:
                self.outputs[i] = make_global(None, *layout)
        return [self.outputs[i] for i in range(self.output_count)]


def call_context(job, inputs: list) -> CallContext:
    """The context of one call: its inputs, and this call's values of the job's feeds (lr, step...)."""
    return CallContext(list(inputs), job.variables, {}, {name: value() for name, value in _feeds(job)},
                       _output_layouts(job), len(job.output_ops))


def _feeds(job) -> list:
    """(variable op name, value function) of each variable the job refills before every call."""
    by_tensor = {id(t): name for name, t in job.variables.items()}
    return [(by_tensor[id(t)], value) for t, value in job.feeds if id(t) in by_tensor]


def _output_layouts(job) -> dict:
    """Output index -> (placement, sbp, shape, dtype) of each global output of ``job``."""
    layouts = {}
    for name in job.output_ops:
        op = job.op(name)
        desc = job.blobs[op.outputs[0]]
        if desc.placement is not None:
            layouts[op.attrs["index"]] = (desc.placement, tuple(desc.sbp), tuple(desc.shape), desc.dtype)
    return layouts


class CallHandle:
    """One launched call: ``result()`` waits for it (the sink tick acted) and returns its outputs."""

    def __init__(self, runtime, index: int, context: CallContext, frontier: int = 0):
        self.index, self.context = index, context
        self._runtime = runtime
        self._done = threading.Event()
        self._outputs = None
        self._error = None
        self.started = False
        self.frontier_left = frontier            # frontier actors that have not finished this call yet
        self._issued = threading.Event()
        if not frontier:
            self._issued.set()
        self._delivered: dict = {}               # output index -> (tensor, error) once written

    def done(self) -> bool:
        return self._done.is_set()

    def issued(self) -> bool:
        """Has every frontier actor (the module docstring) acted for this call (or did the call fail)?"""
        return self._issued.is_set()

    def result(self, timeout: float | None = None) -> list:
        """The call's outputs, in output order; raises what stopped the runtime."""
        self._runtime.wait_for(self, timeout)
        if self._error is not None:
            raise self._error
        return self._outputs

    def wait_issued(self) -> None:
        """Wait until the call's frontier acted (its ops on the caller's memory, with other ranks and making
        the outputs are issued); raises what stopped the runtime."""
        self._runtime.wait_issued(self)
        if self._error is not None:
            raise self._error

    def output(self, index: int) -> Tensor:
        """This rank's piece of output ``index``, once its value is written (any thread may wait; nothing is
        driven); raises what stopped the call, or the failure of the op that made the value.

        The hand-over may come after the sink acted (the call is no longer in flight then), so this wait
        watches for a hang itself (``watchdog.wait_until``): nothing moving for the hang timeout is a
        ``RuntimeHangError`` naming this output and call, and the actor whose work never came back."""
        wait_until(self._runtime, lambda: index in self._delivered or self._error is not None,
                   f"output {index} of call {self.index} to be handed over")
        value, error = self._delivered.get(index, (None, self._error))
        if error is not None:
            raise error
        return value

    def _deliver(self, index: int, value, error=None) -> None:
        if error is None and isinstance(self._runtime.error, RuntimeHangError):
            error = self._runtime.error   # a hang report counted this hand-over as one that never came back
        self._delivered[index] = (value, error)
        self._runtime._notify()   # (the runtime's waiters, this one among them, look again)

    def _finish(self, outputs=None, error=None) -> None:
        self._outputs, self._error = outputs, error
        self.context = None   # the inputs and outputs belong to the caller now
        self._issued.set()
        self._done.set()   # (the runtime then wakes its waiters, ``output`` among them)

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else "done" if self.done() else "in flight"
        return f"<CallHandle call {self.index}: {state}>"


class CallTemplate:
    """What every call of one rank's Plan has in common, derived once, when its Runtime starts: the inputs it
    takes, its outputs' count and global layouts, the variables refilled per call (``job`` None: a hand-made
    Plan, with no variables, feeds or global outputs).  A launch then only checks its inputs against it
    (``check``) and binds this call's values (``context``): no walk of the Plan per call."""

    def __init__(self, plan, job, input_tasks: list):
        self.where = f"graph {plan.job_name}"
        self.input_count = sum(op_type == "input" for op_type, _, _ in plan.op_attrs.values())
        # input index -> its regst desc on this rank (``input_tasks``: this rank's input tasks)
        self.expected = {plan.op_attrs[t.op_name][2]["index"]: plan.regsts[t.produced["out_0"]] for t in input_tasks}
        if job is None:
            self.variables, self.feeds, self.layouts = {}, [], {}
            self.output_count = sum(op_type == "output" for op_type, _, _ in plan.op_attrs.values())
        else:
            self.variables, self.feeds, self.layouts = job.variables, _feeds(job), _output_layouts(job)
            self.output_count = len(job.output_ops)

    def check(self, inputs: list) -> None:
        """Raise if ``inputs`` do not match the Plan's input regsts (before anything runs)."""
        where = self.where
        if len(inputs) != self.input_count:
            raise GraphError(f"{where} was compiled for {self.input_count} input(s), got {len(inputs)}")
        for i, x in enumerate(inputs):
            if not isinstance(x, Tensor):
                raise GraphError(f"{where}: input {i} is a {type(x).__name__}; graph inputs must be tensors")
            desc = self.expected.get(i)
            if x.is_global or desc is None:
                continue   # a global input: each rank's input task takes its own piece
            wrong = (ShapeError if tuple(x.shape) != tuple(desc.shape) else
                     DTypeError if x.dtype != np.dtype(desc.dtype) else
                     DeviceError if str(x.device) != desc.device else None)
            if wrong is not None:
                raise wrong(f"{where}: input {i} must have shape {tuple(desc.shape)}, dtype {desc.dtype}, device "
                            f"{desc.device}, got shape {tuple(x.shape)}, dtype {x.dtype}, device {x.device}; a "
                            "compiled graph takes inputs like those it was traced with (build a new graph for "
                            "others)")

    def context(self, inputs: list) -> CallContext:
        """The context of one call: ``inputs``, and this call's values of the feeds (read now)."""
        feeds = {name: value() for name, value in self.feeds}
        return CallContext(inputs, self.variables, {}, feeds, self.layouts, self.output_count)


def _callers_memory(plan, rid: int) -> bool:
    """Is regst ``rid`` memory the caller owns (an input, a parameter), or an alias of it?"""
    regst = plan.regsts[rid]
    while regst.mem == "alias" and regst.alias_of is not None:
        regst = plan.regsts[regst.alias_of]
    return regst.mem in ("input", "variable")


def frontier_tasks(plan, tasks) -> set:
    """The ids of ``tasks`` (one rank's) in a call's frontier (see the module docstring)."""
    found = set()
    for task in tasks:
        reads = [rid for key, ids in task.consumed.items() if key != "ctrl" for rid in ids]
        if (task.kind in ("input", "variable", "output") or is_comm(task)
                or any(_callers_memory(plan, rid) for rid in reads + list(task.produced.values()))):
            found.add(task.task_id)
    return found
