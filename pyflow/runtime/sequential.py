"""A sequential interpreter of a Plan: run every task once per call, in the Plan's order.

This is the smallest thing that executes a Plan, kept for the tests and for debugging
(``nn.Graph`` runs its Plans on the actor runtime, ``runtime.py``; its
``executor="sequential"`` picks this one): no threads, no messages, no back pressure;
the tasks run in ``plan.order``, the micro-batch loop k times, each rank its own tasks.
What each task does is ``act`` (``act.py``), the actor runtime's definition too.  What it
does check is the compiler's output: every regst lives where the memory plan put it
(a view into its device's chunk), so a plan that let two live regsts overlap gives
wrong numbers here.
"""

from __future__ import annotations

import threading
import weakref

from pyflow import env
from pyflow.framework.tensor import Tensor
from pyflow.runtime.act import act, produced_regsts
from pyflow.runtime.call import call_context
from pyflow.runtime.regst import make_chunks, planned_tensor

__all__ = ["run_plan", "chunk_tensors"]

_chunks: dict = {}   # id(plan) -> {rank: chunks}, while the plan lives
_chunks_lock = threading.Lock()


def chunk_tensors(plan, rank: int) -> dict:
    """The sequential interpreter's chunks of ``rank`` for ``plan``: ``make_chunks``, made at its first call and
    kept while ``plan`` lives (here, not on the Plan: no executor writes a Plan)."""
    with _chunks_lock:
        by_rank = _chunks.get(id(plan))
        if by_rank is None:
            by_rank = _chunks[id(plan)] = {}
            weakref.finalize(plan, _chunks.pop, id(plan), None)
        if rank not in by_rank:
            by_rank[rank] = make_chunks(plan, rank)
        return by_rank[rank]


def run_plan(plan, inputs: list, job) -> list:
    """Run one call of ``plan``: ``inputs`` are the graph's eager inputs; returns its outputs in order."""
    rank = env.get_rank()
    chunks = chunk_tensors(plan, rank)
    values: dict[int, Tensor] = {}   # regst id -> the tensor it is this call
    for regst in plan.regsts.values():
        if regst.mem == "planned" and regst.rank == rank:
            values[regst.id] = planned_tensor(plan, chunks, regst)
    call = call_context(job, inputs)
    start, end = plan.loop
    order = plan.order
    steps = [(order[:start], 1), (order[start:end], plan.loop_times if end > start else 0), (order[end:], 1)]
    for tids, times in steps:
        for j in range(times):
            for tid in tids:
                task = plan.tasks[tid]
                if task.rank != rank:
                    continue   # every rank runs its own tasks of the one Plan
                ins = {key: values[ids[0]] for key, ids in task.consumed.items() if key != "ctrl"}
                produced = produced_regsts(plan, task)
                results = act(plan, task, ins, [values.get(r.id) for r in produced], j, call)
                for r, result in zip(produced, results):
                    values[r.id] = result
    return call.results()
