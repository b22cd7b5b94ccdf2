"""A barrier among a GROUP of blocks (seed 001, recursion unroll): what ``grid.sync`` is for the grid.

Cocktailer's recursion unroll runs sibling subtrees of a recursion at the same
time, each on its own group of blocks (``pyflow/cocktailer/codegen_groups.py``,
``CallGroup``).  Inside a group the blocks still need barriers between operators,
but a grid barrier would wait for blocks of the other group, which are somewhere
else in a different subtree: the groups would deadlock.  So each group meets at a
barrier of its own, built from two int64 counters in global memory::

    state[slot]      threads 0 of the group's blocks that have arrived
    state[slot + 1]  the generation: how many times this barrier has opened

A block arrives with its thread 0 (the others wait at ``syncthreads``): it notes
the generation, adds itself to the count, and the last arrival sets the count back
to 0 and bumps the generation, which releases the others spinning on it::

    group_barrier(status, 3 + 2 * group, blocks_in_group)

Rules (as for ``grid.sync``): every block of the group calls it, the same number
of times; the group's blocks are co-resident (the kernel is cooperative); the
counters start at 0 (the executor zeroes them before each launch).  Memory
written before the barrier by any block of the group is visible after it: the
arriving thread fences before it counts, the released one after it sees the new
generation, and ``syncthreads`` extends that to its block.  Spinning threads call
``cuda.nanosleep`` (backoff on the GPU; a thread switch in the simulator).
"""

from __future__ import annotations

from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit

__all__ = ["group_barrier"]


@jit(device=True)
def group_barrier(state, slot, members):
    """Wait until all ``members`` blocks of the group using ``state[slot:slot + 2]`` have arrived."""
    cuda.syncthreads()                              # the whole block has arrived
    if cuda.threadIdx.x == 0:
        cuda.threadfence()                          # this block's writes before the count
        generation = cuda.atomic.add(state, slot + 1, 0)   # an atomic read: nobody can bump it yet
        arrived = cuda.atomic.add(state, slot, 1)
        if arrived == members - 1:                  # the last one: reset, then release the others
            cuda.atomic.exch(state, slot, 0)
            cuda.threadfence()
            cuda.atomic.add(state, slot + 1, 1)
        else:
            while cuda.atomic.add(state, slot + 1, 0) == generation:
                cuda.nanosleep(64)
        cuda.threadfence()                          # the others' writes before ours
    cuda.syncthreads()                              # ... and before the rest of the block's


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array

    i64 = types.int64
    return [("group_barrier", group_barrier.py_func, (array("int64"), i64, i64), True)]
