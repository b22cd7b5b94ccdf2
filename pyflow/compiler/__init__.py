"""Seed 004: the lazy compiler: a traced Job -> passes -> OpGraph -> TaskGraph -> Plan.

* ``ids``          - OneFlow's task / stream / regst id layout (rank | device type | index | stream | task)
* ``job``          - the Job: logical ops, lbns, blob descs
* ``lazy``         - lazy mode: LazyTensor and the LazyTracer that ``nn.Graph.build`` records with
* ``passes``       - JobCompleter passes: grad_acc, autograd, optimizer, variable_order, checks, ticks
* ``op_graph``     - where each op runs; SBP signatures by the cost model (global ops)
* ``task_graph``   - one task per op per device, copies, boxing sub-graphs; regst descs (regst num, time shape)
* ``memory``       - the memory planner (offsets in one mem block per device)
* ``plan``         - the Plan: TaskProtos, regsts, memory; light-plan print, dot, JSON
* ``rank_ticks``   - the Plan's last step: each rank's calls closed by its ticks, for n calls in flight
* ``boxing``       - the boxing builder chain (SubTskGphBuilders): one edge -> a sub-graph of boxing nodes
* ``boxing_tasks`` - what a boxing task does when it acts (slice, concat, add, send/recv, collectives...)

``compile_job(job, tracer)`` runs them in that order.  Running a Plan is the runtime's
business (its actors, or its sequential reference interpreter), a layer above this one.
"""

from __future__ import annotations

import time

__all__ = ["compile_job"]


def compile_job(job, tracer, log=None, calls_in_flight: int = 1):
    """The Plan of ``job`` (traced by ``tracer``) for ``calls_in_flight`` calls at once (``rank_ticks.py``);
    ``log(step, seconds)`` hears each step's time."""
    from pyflow.compiler.lazy import tracing
    from pyflow.compiler.op_graph import OpGraph
    from pyflow.compiler.passes import run_passes
    from pyflow.compiler.plan import make_plan
    from pyflow.compiler.rank_ticks import close_calls
    from pyflow.compiler.task_graph import TaskGraph

    def timed(step, fn):
        start = time.perf_counter()
        result = fn()
        if log is not None:
            log(step, time.perf_counter() - start)
        return result

    with tracing(tracer):
        job.pass_log = run_passes(job, tracer, log)
    job.topological_check()
    op_graph = timed("OpGraph (SBP signatures)", lambda: OpGraph(job))
    task_graph = timed("TaskGraph (tasks, boxing, copies)", lambda: TaskGraph(op_graph))
    return timed("Plan (regsts, memory, ticks)", lambda: close_calls(make_plan(task_graph), calls_in_flight))
