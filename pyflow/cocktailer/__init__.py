"""Cocktailer (seed 001): dynamic control flow compiled into one persistent grid-sync kernel.

    import pyflow.cocktailer as ck

    program = ck.trace(fn, ck.spec(4, 8), ...)        # fn of flow ops -> IR (trace.py, ir.py)
    host = ck.compile(program, mode="host")           # every op a launch, control on the host
    fast = ck.compile(program, mode="compiled")       # the whole program: one kernel
    auto = ck.compile(program, mode="auto")           # Algorithm 1 decides (schedule.py)
    out = fast(x, ...);  fast.last_stats              # launches, host_syncs, barriers
    print(fast.source)                                # the generated kernel

Modules: ``ir`` (uOperator, nested uTasks, uProgram pieces) with ``scalars`` (device scalar
expressions: trip counts, conditions, dynamic offsets), ``trace`` (front end: tracing,
memory management), ``control`` (for, while, cond), ``functions`` (function uTasks,
recursion), ``ops`` (the uOperator builders; the fused ``lstm_cell``, ``update``),
``lowering`` (the tracer that lowers flow ops on traced tensors to uTasks) with ``lowerings`` (each op's uTask lowering, set on its OpDef),
``names``/``checks`` (code names, static ints),
``codegen`` (kernel source) with ``codegen_recursion`` (recursion stack),
``codegen_groups`` (block groups) and ``codegen_common`` (status words, scalars as
text), ``barriers`` (where grid barriers go), ``executor``
(host and compiled executors) with ``uprogram`` (one uProgram compiled: its kernel and grid),
``schedule_interfaces`` (the paper's three scheduling
interfaces), ``schedule``/``profiler`` (Algorithm 1 and its cost model), ``optimize``
(inline, loop unroll, branch reclustering), ``optimize_recursion`` (recursion unroll).
"""

from pyflow.cocktailer.api import Compiled, compile
from pyflow.cocktailer.control import cond, for_loop, while_loop
from pyflow.cocktailer.executor import Options, RunStats
from pyflow.cocktailer.functions import function
from pyflow.cocktailer import lowering, lowerings  # noqa: F401  (installs the tracer, attaches the lowerings)
from pyflow.cocktailer.ops import lstm_cell, update
from pyflow.cocktailer.trace import Program, TensorSpec, TracedTensor, TraceError, spec, trace

__all__ = ["trace", "spec", "TensorSpec", "TracedTensor", "Program", "TraceError", "compile", "Compiled", "Options",
           "RunStats", "for_loop", "while_loop", "cond", "function", "lstm_cell", "update"]
