"""Cocktailer's three scheduling interfaces (seed 001, sec. 3.2): the levels a program's parts can run at.

The hardware has levels: ``THREAD`` < ``BLOCK`` < ``DEVICE`` (a uProgram: one
kernel over the whole GPU) < ``HOST`` (the CPU, launching kernels).  The three
scheduling interfaces of the paper:

* ``schedule_operator(op)`` - a uOperator's uTasks, one per block: level ``BLOCK``
  (pyflow's uTask library has only block-level uTasks; the paper's thread level
  would run a uTask per thread).
* ``schedule_control_flow(node, body_levels)`` - the level a loop, branch,
  function or recursion takes, given its body's: **Constraint 1**, control flow
  sits at a level no lower than its body (it must control every uTask of it).  A
  body with a part on the host keeps the control flow on the host (None).
* ``set_resource(unit, options, program)`` - the grid of a uProgram: every block
  must be co-resident for its grid barriers, so ``min(co-resident limit, largest
  uTask count)`` (the limit from the kernel's ``max_cooperative_grid_blocks``).

Algorithm 1 (``schedule.py``) is the policy that calls them.
"""

from __future__ import annotations

import dataclasses
import enum

from pyflow.cocktailer.executor import Options
from pyflow.cocktailer.ir import StmtBlock, UOperator
from pyflow.cocktailer.names import kernel_name
from pyflow.cocktailer.profiler import CostModel
from pyflow.cocktailer.uprogram import CompiledUProgram
from pyflow.kernels.backend import cuda, is_gpu
from pyflow.kernels.utask.generated import cooperative_grid_limit

__all__ = ["Level", "OperatorSchedule", "Resource", "schedule_control_flow", "schedule_operator", "set_resource"]


class Level(enum.IntEnum):
    """Where a piece of the program runs; a higher level controls the lower ones."""

    THREAD = 0
    BLOCK = 1
    DEVICE = 2
    HOST = 3


@dataclasses.dataclass(frozen=True)
class OperatorSchedule:
    op: UOperator
    utasks: int
    level: Level


def schedule_operator(op: UOperator) -> OperatorSchedule:
    """A uOperator: ``op.count`` uTasks, each run by one block (``BLOCK`` level)."""
    return OperatorSchedule(op, op.count, Level.BLOCK)


def schedule_control_flow(node, body_levels) -> Level | None:
    """Constraint 1: the control flow's level is at least its body's; None if that is the host.

    Control flow inside a uProgram is replicated in every block (each block runs
    the loop and takes its share of each operator's uTasks), so it sits at
    ``BLOCK``; a body with a part on the host cannot be controlled from a block.
    """
    level = max(body_levels, default=Level.BLOCK)
    if level >= Level.DEVICE:
        return None
    return max(level, Level.BLOCK)


@dataclasses.dataclass(frozen=True)
class Resource:
    """A uProgram's configuration: its grid, and where the code generator put barriers."""

    grid: int
    limit: int
    threads: int
    barrier_sites: frozenset
    source: str


def set_resource(unit, options: Options, program, cost_model: CostModel | None = None) -> Resource | None:
    """Generate ``unit`` (a statement, or the program body) as a kernel and size its grid.

    The grid is ``options.blocks`` if given (None when that many blocks cannot be
    co-resident: the schedule fails), else ``min(limit, largest uTask count)``.
    The limit is ``cost_model.coresident_blocks`` if set, else the kernel's own.
    """
    block = unit if isinstance(unit, StmtBlock) else StmtBlock([unit])
    kernel = CompiledUProgram(kernel_name(program.name, "candidate"), block, program, options)
    limit = cost_model.coresident_blocks if cost_model is not None else None
    if limit is None:
        args = []
        if is_gpu():  # the limit depends on the registers of the kernel compiled for these types
            args = [cuda.device_array(1, dtype=b.dtype) for b in kernel.writer.buffers.values()]
            args += [cuda.device_array(3, dtype="int64")] + [0] * len(kernel.free_vars)
        limit = cooperative_grid_limit(kernel.kernel, args, options.threads)
    if options.blocks is not None:
        if options.blocks > limit:
            return None
        grid = options.blocks
    else:
        grid = max(1, min(limit, kernel.max_utasks))
    return Resource(grid, limit, options.threads, frozenset(kernel.writer.barrier_sites), kernel.source)
