"""Recursion unroll in the generated kernel (seed 001): sibling calls at once, on disjoint groups of blocks.

``optimize_recursion.unroll_recursion`` turns independent sibling calls into a
``CallGroup`` of lanes; this part of the kernel writer (``CallGroupMixin``, mixed
into ``codegen.KernelSource``) writes it, differently from the artifact on purpose
(``codegen.py`` lists the differences).  Two lanes on the grid look like::

    # recursion unroll: 2 independent lanes at once, lane k on block group k % groups1 of the grid
    groups1 = min(2, blocks)
    group1 = block * groups1 // blocks         # then gfirst1, gblocks1, gblock1, gslot1
    failed1 = False
    if group1 == 0 and not failed1:
        while True:  # lane 0; an error leaves it
            for u in range(gblock1, 1, gblocks1):   # uTasks over this group's blocks
                identity_map(u, ...)
            group_barrier(status, gslot1, gblocks1)  # not grid.sync(): the other group goes on
            ...
            break
    if group1 == 1 % groups1 and not failed1:
        ...                                     # lane 1, the same way
    grid.sync()  # the groups join: every lane is done

The grid splits into groups of consecutive blocks, lane ``k`` runs on group ``k %
groups``; inside a group uTasks spread over its blocks (``gblock1`` of
``gblocks1``) and barriers are ``group_barrier``s (``kernels/utask/groups.py``)
instead of ``grid.sync()``, which would wait for the other groups.  A lane
unrolled deeper holds a ``CallGroup`` of its own, which splits its group again
(level 2: ``gblock2``...) and is joined by the enclosing group's barrier.  The top
split is joined by a grid barrier.  An error in a group is reported there and its
blocks leave their lane (a ``while True`` loop: ``break``); a failed lane below
makes the enclosing lane leave after its join; every block stops after the grid
join.  Each group has three words in ``status`` (``codegen_common.py``).

``_Blocks`` names who runs the code being written (the grid, or a block group):
the writer emits every operator loop and barrier through it, so the same code
serves both.
"""

from __future__ import annotations

import dataclasses

from pyflow.cocktailer.codegen_common import ERR_STACK_OVERFLOW, STATUS_HEAD
from pyflow.cocktailer.ir import CallGroup, Lane
from pyflow.cocktailer.names import GROUP_LEVELS
from pyflow.errors import LaunchConfigError

__all__ = ["CallGroupMixin"]


@dataclasses.dataclass(frozen=True)
class _Blocks:
    """Who runs the code being written: the names of "my block", "how many" and their barrier.

    ``level`` 0 is the grid; level ``L`` a block group of a ``CallGroup`` nested ``L``
    deep, whose variables end in ``L`` (``gblock2``...) so an inner split leaves the
    outer one's intact.  ``failed``: the group's flag, set (the same in every block of
    the group) when something in it stopped with an error.
    """

    block: str
    blocks: str
    sync: str
    level: int = 0
    failed: str = ""


_GRID = _Blocks("block", "blocks", "grid.sync()")


def _group(level: int) -> _Blocks:
    return _Blocks(f"gblock{level}", f"gblocks{level}", f"group_barrier(status, gslot{level}, gblocks{level})",
                   level, f"failed{level}")


class CallGroupMixin:
    """The block-group part of ``codegen.KernelSource``: ``call_group`` and ``lane``.

    A mixin: it writes through the writer's ``emit``, ``barrier``, ``block_items``,
    ``fail``, ``stop`` and ``leave_if_failed``, and keeps what it changes in the
    writer's fields (``ctx``: who runs the code; ``exits``: the Python loops an error
    leaves; ``group_slots``: the groups numbered so far).
    """

    def call_group(self, group: CallGroup, names: dict, indent: int) -> None:
        """Recursion unroll: lane ``k`` of ``group`` on block group ``k % groups``, all at once.

        The blocks running this code (the grid, or the group of an enclosing lane)
        split into ``groups = min(len(lanes), blocks)`` runs of consecutive blocks.
        Inside a group, operators spread over its blocks (``gblockL`` of ``gblocksL``,
        ``L`` the nesting level) and barriers are ``group_barrier``s on the group's
        counters in ``status`` (three words per group: count, generation, failed); a
        lane holding a ``CallGroup`` splits its group again.  A barrier of the
        enclosing blocks joins the groups at the end: the grid's (then an error
        anywhere stops every block), or the enclosing group's (then a failed lane
        below makes the enclosing lane leave too).
        """
        n, parent = len(group.lanes), self.ctx
        if parent.level >= GROUP_LEVELS:
            raise LaunchConfigError(f"{self.name}: block groups nest at most {GROUP_LEVELS} levels deep "
                                    "(unroll the recursion fewer levels)")
        inner = _group(parent.level + 1)
        L, base = inner.level, self.group_slots
        self.group_slots += n
        self.namespace["group_barrier"] = _group_barrier()
        self.barrier(("group", id(group)), indent)
        self.emit(f"# recursion unroll: {n} independent lanes at once, lane k on block group k % groups{L} "
                  f"of {'the grid' if parent is _GRID else f'group {parent.level}'}", indent)
        self.emit(f"groups{L} = min({n}, {parent.blocks})", indent)
        self.emit(f"group{L} = {parent.block} * groups{L} // {parent.blocks}", indent)
        self.emit(f"gfirst{L} = (group{L} * {parent.blocks} + groups{L} - 1) // groups{L}", indent)
        self.emit(f"gblocks{L} = ((group{L} + 1) * {parent.blocks} + groups{L} - 1) // groups{L} - gfirst{L}", indent)
        self.emit(f"gblock{L} = {parent.block} - gfirst{L}", indent)
        self.emit(f"gslot{L} = {STATUS_HEAD} + 3 * ({base} + group{L})  # this group's words in status", indent)
        self.emit(f"{inner.failed} = False", indent)
        saved_ctx, saved_exits = self.ctx, self.exits
        self.ctx, self.exits = inner, [("lane",)]
        try:
            for k, lane in enumerate(group.lanes):
                which = "0" if k == 0 else f"{k} % groups{L}"
                self.emit(f"if group{L} == {which} and not {inner.failed}:", indent)
                self.emit(f"while True:  # lane {k}; an error leaves it", indent + 1)
                self.lane(lane, names, indent + 2)
                self.emit("break", indent + 2)
        finally:
            self.ctx, self.exits = saved_ctx, saved_exits
        self.emit(f"if {inner.failed} and gblock{L} == 0 and cuda.threadIdx.x == 0:", indent)
        self.emit(f"status[gslot{L} + 2] = 1  # the enclosing blocks read it after the join", indent + 1)
        self.emit(f"{parent.sync}  # the groups join: every lane is done", indent)
        self.emit("barriers += 1", indent)
        self.barrier_sites.append(("join", id(group)))
        if parent is _GRID:
            self.emit("if status[0] != 0:  # a group stopped with an error: every block stops", indent)
            self.stop(indent + 1)
            return
        self.emit(f"for g in range(groups{L}):", indent)
        self.emit(f"if status[{STATUS_HEAD} + 3 * ({base} + g) + 2] != 0:  # a lane below failed", indent + 1)
        self.emit(f"{parent.failed} = True", indent + 2)
        self.leave_if_failed(indent)

    def lane(self, lane: Lane, names: dict, indent: int) -> None:
        """The statements of one lane; an unrolled call's body is a frame that may be past the stack's end."""
        if lane.fn is not None and lane.depth >= self.stack_depth:
            self.emit(f"# frame {lane.depth} of {lane.fn.name}: past stack_depth={self.stack_depth}", indent)
            self.fail(ERR_STACK_OVERFLOW, str(self.functions.index(lane.fn)), indent)
            return
        self.block_items(lane.body, names, indent)


def _group_barrier():
    from pyflow.kernels.utask.groups import group_barrier

    return group_barrier
