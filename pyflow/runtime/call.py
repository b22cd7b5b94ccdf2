"""Seed 003: one call of a compiled graph at run time: its context, its inputs checked, its handle.

A call is what ``Graph.__call__`` (or ``Runtime.launch``) starts: one piece at the source
tick, ``(call, 0)``, which the actors turn into k micro-batches and back.  Everything an
act needs besides its regsts is the call's ``CallContext`` (``pyflow/compiler/run_plan.py``):
the caller's inputs, this call's learning rate and step count (read when the call is
registered, so calls in flight each keep their own), and where the outputs go.

* ``check_inputs`` - inputs that do not fit the Plan's input regsts are an error before
  anything runs (a compiled graph takes inputs like those it was traced with);
* ``new_context``  - the call's context (a hand-made Plan without a Job gets an empty one);
* ``CallHandle``   - what the caller holds: ``result()`` waits until the call's sink tick acted.
"""

from __future__ import annotations

import threading

import numpy as np

from pyflow.compiler.run_plan import CallContext, call_context
from pyflow.errors import DeviceError, DTypeError, GraphError, ShapeError
from pyflow.framework.tensor import Tensor

__all__ = ["CallHandle", "check_inputs", "new_context"]


class CallHandle:
    """One launched call: ``result()`` waits for it (the sink tick acted) and returns its outputs."""

    def __init__(self, runtime, index: int, context: CallContext):
        self.index, self.context = index, context
        self._runtime = runtime
        self._done = threading.Event()
        self._outputs = None
        self._error = None
        self.started = False

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> list:
        """The call's outputs, in output order; raises what stopped the runtime."""
        self._runtime.wait_for(self, timeout)
        if self._error is not None:
            raise self._error
        return self._outputs

    def _finish(self, outputs=None, error=None) -> None:
        self._outputs, self._error = outputs, error
        self.context = None   # the inputs and outputs belong to the caller now
        self._done.set()

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else "done" if self.done() else "in flight"
        return f"<CallHandle call {self.index}: {state}>"


def check_inputs(plan, input_tasks: list, inputs: list) -> None:
    """Raise if ``inputs`` do not match the Plan (``input_tasks``: this rank's input tasks)."""
    count = sum(op_type == "input" for op_type, _, _ in plan.op_attrs.values())
    expected = {plan.op_attrs[t.op_name][2]["index"]: plan.regsts[t.produced["out_0"]] for t in input_tasks}
    where = f"graph {plan.job_name}"
    if len(inputs) != count:
        raise GraphError(f"{where} was compiled for {count} input(s), got {len(inputs)}")
    for i, x in enumerate(inputs):
        if not isinstance(x, Tensor):
            raise GraphError(f"{where}: input {i} is a {type(x).__name__}; graph inputs must be tensors")
        desc = expected.get(i)
        if x.is_global or desc is None:
            continue   # a global input: each rank's input task takes its own piece
        wrong = (ShapeError if tuple(x.shape) != tuple(desc.shape) else
                 DTypeError if x.dtype != np.dtype(desc.dtype) else
                 DeviceError if str(x.device) != desc.device else None)
        if wrong is not None:
            raise wrong(f"{where}: input {i} must have shape {tuple(desc.shape)}, dtype {desc.dtype}, device "
                        f"{desc.device}, got shape {tuple(x.shape)}, dtype {x.dtype}, device {x.device}; a "
                        "compiled graph takes inputs like those it was traced with (build a new graph for others)")


def new_context(plan, job, inputs: list, outputs: dict | None) -> CallContext:
    """The context of one call (``job`` None: a hand-made Plan, with no variables, feeds or global outputs)."""
    if job is not None:
        return call_context(job, inputs, outputs)
    count = sum(op_type == "output" for op_type, _, _ in plan.op_attrs.values())
    return CallContext(list(inputs), {}, dict(outputs or {}), {}, {}, count)
