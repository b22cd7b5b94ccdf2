"""Seed 004: the JobCompleter: passes that turn the traced Job into the Job the compiler builds.

OneFlow runs a list of job passes over the user's Job before it builds the OpGraph
(``oneflow/core/job_rewriter/``).  pyflow's, one small module each, in this order:

==================  =================================================================
``grad_acc``        gradient accumulation: inputs Unpacked into k micro-batches,
                    variables and constants Repeated k times, outputs Packed (time shapes)
``autograd``        the backward ops, from each op's own backward rule (``OpDef.backward``)
``optimizer``       the update ops of every ``add_optimizer`` (gradients Acc'ed over k)
``variable_order``  control edges: an op that writes a variable runs after its readers
``checks``          links between pipeline stages go through ``to_global`` / ``.to()``
``pipeline_buffer`` regst nums between pipeline stages (OneFlow's pipeline_buffer_pass)
``ticks``           one source tick and one sink tick: the graph starts and ends at one op
==================  =================================================================

``run_passes`` runs them and reports each one's time (``nn.Graph.debug(1)`` prints it).
"""

from __future__ import annotations

import time

from pyflow.compiler.passes import autograd, checks, grad_acc, optimizer, pipeline_buffer, ticks, variable_order

__all__ = ["PASSES", "run_passes"]

PASSES = [("grad_acc", grad_acc.run), ("autograd", autograd.run), ("optimizer", optimizer.run),
          ("variable_order", variable_order.run), ("checks", checks.run),
          ("pipeline_buffer", pipeline_buffer.run), ("ticks", ticks.run)]


def run_passes(job, tracer, log=None) -> dict:
    """Run every pass over ``job`` (in place); returns ``{pass name: str(job) after it}``."""
    after = {}
    for name, run in PASSES:
        start = time.perf_counter()
        run(job, tracer)
        if log is not None:
            log(f"pass {name} ({len(job)} ops)", time.perf_counter() - start)
        after[name] = str(job)
    return after
