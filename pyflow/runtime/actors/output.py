"""Seed 003: the output actor: hands each call's output value to the call's handle once it is written.

An output task's act (``act``, ``runtime/act.py``) copies the value into a fresh tensor: the regst
it reads is the runtime's memory, used again by the next piece, while the value is the
caller's.  The output actor then waits, without blocking its thread, until that copy is done
(``after_device_work``), and hands the tensor (this rank's piece of it) to the call's
``CallHandle`` (``output(index)``): that is what ``nn.Graph``'s output critical section waits
for before it copies the value into the tensor the caller already holds
(``pyflow/vm/policies/launch_lazy_job.py``).  A copy that failed is handed over as its error.
"""

from __future__ import annotations

from pyflow.distributed.global_tensor import to_local
from pyflow.errors import OpError
from pyflow.runtime.actors.base import Actor
from pyflow.runtime.device_ctx import after_device_work

__all__ = ["OutputActor"]


class OutputActor(Actor):
    """A normal actor whose value, once written, goes to the call's handle."""

    kind = "output"

    def after_act(self, n: int, j: int, start: float, end: float, slots=None, consumed=None) -> None:
        """Issue the hand-over first: once the act is recorded the call's frontier may be complete
        (``pyflow/runtime/call.py``), and by then every op the output needs must be issued."""
        handle = self.runtime.handle(n)   # in flight: the sink cannot have acted for this call yet
        index = self.plan.op_attrs[self.op_name][2]["index"]
        value = to_local(handle.context.outputs[index])
        token = object()
        self.device_work[token] = self.acts   # (for hang reports: the hand-over is not done yet)

        def on_done(failure):   # on a VM worker
            self.device_work.pop(token, None)
            self.runtime.callback_finished()
            if failure is None:
                handle._deliver(index, value)
                return
            where = (f"actor {self.actor_id} (output actor of op {self.op_name!r}) handing over output {index} "
                     f"of call {n} of {self.plan.job_name!r}")
            if isinstance(failure, BaseException):
                error = OpError(f"{where}: {type(failure).__name__}: {failure}", op=self.op_name)
                error.__cause__ = failure
            else:
                error = failure.to_error(reading=where)
            handle._deliver(index, None, error)
            self.runtime.fail_from_device(self, failure)

        after_device_work([], [value], f"output {self.op_name} of call {n} written", on_done,
                          self.runtime.callback_started)
        super().after_act(n, j, start, end, slots, consumed)
