"""``compile(program, mode=...)``: a traced program, ready to call, with its schedule and source."""

from __future__ import annotations

from pyflow.cocktailer.executor import Executor, Options
from pyflow.cocktailer.launch import call_with_tensors, has_tensors
from pyflow.cocktailer.trace import Program, TraceError

__all__ = ["Compiled", "compile", "MODES"]

MODES = ("host", "compiled", "auto")


class Compiled:
    """A program bound to an executor.  Call it with its inputs in order:

    * numpy or device arrays -> numpy arrays (``to_host=False``: device views): the
      call runs now, on the default stream, in buffers the executor keeps;
    * ``pyflow.Tensor`` s (numpy arguments beside them become tensors) -> ``pyflow.Tensor`` s
      on the same device: the call is ONE VM instruction on the device's compute
      stream that reads the inputs and writes the outputs, its memory from pyflow's
      caching allocator (``launch.py``), so it orders with eager ops like any op.

    ``last_stats``: launches / host_syncs / barriers of the last call (with tensors: of
    the last call that ran, so read it after a sync); ``source``: the
    generated kernel source of every uProgram; ``schedule``: the decision (mode auto).

    Threads: a ``Compiled`` may be called from several threads at once, in every mode.
    The calls take turns (a lock in the executor: every call uses the same
    preallocated buffers, and a persistent kernel fills the GPU anyway), so each
    returns exactly what it would alone.  ``last_stats`` is then the counts of the
    call that finished last, whichever thread made it: always one whole call's
    counts, never a mix.  With ``to_host=False`` the outputs are views of those
    buffers, valid until the next call from any thread.
    """

    def __init__(self, program, mode: str, options: Options, schedule=None, drop_barriers=frozenset()):
        self.program, self.mode, self.options, self.schedule = program, mode, options, schedule
        if mode == "host":
            self.executor = Executor(program, options)
        elif mode == "compiled":
            self.executor = Executor(program, options, whole_program=True, drop_barriers=drop_barriers)
        else:
            self.executor = Executor(program, options, device_units=schedule.device_units,
                                     whole_program=schedule.whole_program, drop_barriers=drop_barriers)

    def __call__(self, *arrays, to_host: bool = True):
        if has_tensors(arrays):
            return call_with_tensors(self.executor, arrays)
        return self.executor.run(*arrays, to_host=to_host)

    @property
    def last_stats(self):
        return self.executor.last_stats

    @property
    def kernels(self):
        return list(self.executor.kernels.values())

    @property
    def source(self) -> str:
        return "\n".join(k.source for k in self.kernels)


def compile(program, mode: str = "compiled", **options) -> Compiled:  # noqa: A001 - the paper's verb
    """Prepare ``program`` to run: ``mode`` is ``"host"``, ``"compiled"`` or ``"auto"``.

    ``options`` are ``Options`` fields (threads, blocks, stack_depth, inline, ...);
    with ``auto`` also the scheduler's (see ``schedule.schedule``).
    """
    if not isinstance(program, Program):
        raise TraceError(f"compile: expected a Program (from cocktailer.trace), got {type(program).__name__}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    schedule = None
    if mode == "auto":
        from pyflow.cocktailer.schedule import schedule as make_schedule

        sched_keys = {"cost_model", "sample_inputs", "measure", "optimizations"}
        schedule = make_schedule(program, Options(**{k: v for k, v in options.items() if k not in sched_keys}),
                                 **{k: v for k, v in options.items() if k in sched_keys})
        # the schedule may have optimized the program (inline, unroll, recluster) and decided inlining
        return Compiled(schedule.program, mode, schedule.options, schedule)
    return Compiled(program, mode, Options(**options), schedule)
