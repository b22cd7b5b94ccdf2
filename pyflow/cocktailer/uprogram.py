"""One uProgram compiled (seed 001): the generated persistent kernel and how to launch it.

A ``Schedule`` names the parts of a program that run as ONE persistent kernel each (the
whole body, or single loops and branches); the compiled executor (``executor.py``) and the
schedule's candidates (``schedule_interfaces.py``) make a ``CompiledUProgram`` of each:
the kernel source from ``codegen.py``, the kernel built from it, and ``grid`` (the paper's
``set_resource``): how many blocks it launches, never more than can be co-resident, since
every block must run at once to meet at the grid barriers.  Its recursion stacks live in
shared memory, so a ``stack_depth`` that cannot fit there is refused when it is compiled,
not at the launch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyflow.cocktailer import codegen
from pyflow.cocktailer.ir import Call, CallGroup, Loop, StmtBlock, UOperator, free_vars, walk
from pyflow.errors import CooperativeLaunchTooLargeError, LaunchConfigError
from pyflow.kernels.utask.generated import build_kernel, cooperative_grid_limit

if TYPE_CHECKING:
    from pyflow.cocktailer.executor import Options

__all__ = ["CompiledUProgram", "FRAME_STACK_BYTES", "while_loops"]

# Shared memory a kernel's recursion stacks may use: half of the 48 KiB a block has
# (without an opt-in), the other half is left to the uTasks' tiles (the largest, a
# 32 x 32 float64 matmul tile, takes 2 x 8 KiB).
FRAME_STACK_BYTES = 24 * 1024


class CompiledUProgram:
    """One uProgram: the generated source, the kernel, and how to call it."""

    def __init__(self, name: str, block: StmtBlock, program, options: Options, drop_barriers=frozenset(),
                 first_site: int = 0):
        self.name = name
        self.free_vars = free_vars(block)
        self.writer = codegen.generate(name, block, program.functions, self.free_vars,
                                       stack_depth=options.stack_depth, inline_functions=options.inline,
                                       drop_barriers=drop_barriers, first_site=first_site,
                                       while_loops=while_loops(program))
        self.index_sites = self.writer.index_sites   # site first_site + k checks index_sites[k]
        self.source = self.writer.text
        self.buffer_names = list(self.writer.buffers)
        self._check_frame_stacks(program, options)
        self.kernel = build_kernel(self.source, name, self.writer.namespace)
        self.max_utasks = max([_parallel_utasks(block)] + [_utasks(f) for f in program.functions])
        self.barrier_sites = len(self.writer.barrier_sites)
        self._limit = None

    def grid(self, args, options: Options, program_name: str) -> int:
        """``set_resource``: the grid size, never more than can be co-resident."""
        if self._limit is None:
            self._limit = cooperative_grid_limit(self.kernel, args, options.threads)
        if options.blocks is not None:
            if options.blocks > self._limit:
                raise CooperativeLaunchTooLargeError(
                    f"{program_name}: {options.blocks} blocks of {options.threads} threads cannot all be "
                    f"co-resident (the device fits {self._limit}); the persistent kernel needs every block "
                    "running at once. Use fewer blocks or threads, or blocks=None.")
            return options.blocks
        return max(1, min(self._limit, self.max_utasks))

    def _check_frame_stacks(self, program, options: Options) -> None:
        """The recursion stacks live in shared memory: refuse (at compile time) what cannot fit there."""
        stacks = self.writer.frame_stacks   # {array name: (frames, int64 fields per frame)}
        need = sum(8 * depth * fields for depth, fields in stacks.values())
        if need > FRAME_STACK_BYTES:
            per_frame = 8 * sum(fields for _, fields in stacks.values())
            raise LaunchConfigError(
                f"{program.name}: stack_depth={options.stack_depth} frames of {per_frame} bytes "
                f"({', '.join(stacks)}) need {need} bytes of shared memory, more than the {FRAME_STACK_BYTES} a "
                f"persistent kernel gives recursion stacks (half of a block's 48 KiB). Use "
                f"stack_depth <= {FRAME_STACK_BYTES // per_frame}, or mode='host' (its stack is on the host).")


def while_loops(program) -> list:
    """The program's while loops, body first, then each recursive function's: the numbers errors report."""
    bodies = [program.body] + [f.body for f in program.functions]
    return [s for b in bodies for s in walk(b) if isinstance(s, Loop) and s.kind == "while"]


def _utasks(fdef) -> int:
    """The most uTasks of one operator in a recursive function's body."""
    return max([s.count for s in walk(fdef.body) if isinstance(s, UOperator)], default=1)


def _parallel_utasks(block: StmtBlock) -> int:
    """The most uTasks ``block`` runs at once: one operator's, or the lanes of a ``CallGroup`` side by side."""
    most = 1
    for item in block.items:
        if isinstance(item, UOperator):
            most = max(most, item.count)
        elif isinstance(item, CallGroup):
            most = max(most, sum(_parallel_utasks(lane.body) for lane in item.lanes))
        elif isinstance(item, Call):
            most = max(most, _utasks(item.fn))
        else:
            most = max([most] + [_parallel_utasks(b) for b in getattr(item, "blocks", lambda: ())()])
    return most
