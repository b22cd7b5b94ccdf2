"""Seed 002: ``InstructionPolicy``: what an instruction does and what it touches.

A policy answers the engine's questions about one kind of instruction:

* ``input_dependences`` / ``output_dependences`` - the dependence objects it reads
  and writes (``LocalDepObject``; a written object orders it after earlier readers);
* ``stream_sequential_dependence`` - the stream's own dependence object when the
  instruction must also stay in order with every other such instruction of its
  stream (collective streams, ops with mutable inputs, source ops); instructions
  sharing one may be *fused*;
* ``fuse_type`` - "none", "enable" or "tail_only" (may only end a fused group);
* ``is_barrier`` - run on the scheduler thread once every earlier instruction
  has been released;
* ``prescheduleable(src_stream, dst_stream)`` - may an in-edge from ``src`` count
  as satisfied once ``src`` is dispatched (default: only on the same vm stream);
* ``prepare(instruction)`` (scheduler thread: allocate outputs) and
  ``compute(instruction)`` (worker thread: the work itself);
* ``records_event`` - record an ep event after compute, so that "done" waits for
  the device (RecordEvent; every instruction of an event-recorded stream, d2h).

For pyflow's failure semantics (``pyflow/vm/failure.py``) a policy also says
which blobs it ``read_blobs`` and ``written_blobs`` (a failure marks the written
ones failed; a failed read blob means the policy does not run), and carries
``site`` / ``thread``: the user's line and thread that issued it, and ``issuer``: who
wants to hear when its ep-stream work runs (``builder.set_issuer``); the builder sets
them.  ``members()`` is the policy itself, or a fused group's policies: the VM
prepares and computes each member on its own, so one member's failure never
touches another's.
"""

from __future__ import annotations

__all__ = ["InstructionPolicy"]


class InstructionPolicy:
    """Base class: an instruction that reads and writes nothing and does nothing."""

    name = "instruction"
    fuse_type = "none"
    is_barrier = False
    records_event = False
    handles_failed_inputs = False  # True: compute runs even if a read blob failed; the policy deals with it
    failure = None                 # the Failure of this policy, once it failed
    site = ("<pyflow>", 0)         # (filename, lineno) of the user's line that issued it
    thread = None                  # threading.get_ident() of the thread that issued it
    issuer = None                  # told when its ep-stream work ran (``builder.set_issuer``: an actor's act)

    prepares = False               # does it override ``prepare`` (set per class: the VM skips the call if not)
    allocates = 0                  # bytes its prepare allocates (the engine's throttle on memory allocated ahead)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.prepares = cls.prepare is not InstructionPolicy.prepare

    def members(self) -> tuple:
        """The policies to prepare and compute one by one (a fused group: its members)."""
        return (self,)

    def read_blobs(self) -> tuple:
        """Blobs whose values this policy reads (a failed one stops it)."""
        return ()

    def written_blobs(self) -> tuple:
        """Blobs this policy writes (marked failed when it fails)."""
        return ()

    def input_dependences(self) -> list:
        return []

    def output_dependences(self) -> list:
        return []

    @property
    def stream_sequential_dependence(self):
        return None

    def prescheduleable(self, src_stream, dst_stream) -> bool:
        return src_stream is dst_stream

    def prepare(self, instruction) -> None:
        """Runs on the scheduler thread before dispatch (allocation)."""

    def compute(self, instruction) -> None:
        """Runs on the stream's worker thread (or the scheduler thread for barriers)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
