"""``scopes.Machine`` compiled: the control machine of kernels with grid and group barriers, in numba.

``scopes.py`` is the machine to read: plain Python, one call per node executed.  A
Cocktailer program executes tens of thousands of nodes per call (an LSTM of 2
layers over 4 steps: 16,427), each doing little work, so the Python machine and
the trip from Python into the compiled node (about 20 us) were most of the time.
This module is the same machine written for ``numba.njit``: the generated
module's ``cu_drive`` loop (``writer.py``) calls ``step`` for the next node, runs
it for the scope's threads, and hands the results to ``take``, all compiled.

The machine's state lives in arrays, so that compiled functions can change it in
place.  A set of blocks (a scope) is a boolean mask over the grid's blocks, in
block order as ``scopes`` keeps its sorted arrays:

==============  =================================================================
``st``          [pc, depth of the "if" stack, depth of the loop stack]
``scope``       the blocks running now
``values``      the last TEST's (or GROUP's) value per block
``waiting``     [if depth, block]: the blocks an ``if`` set aside
``done``...     [loop depth, block]: ``done``, ``broke``, ``cont``, ``queued`` (a
                ``for``'s blocks whose group has not run), ``ranges`` [.., 3]
``counter``     [loop depth, 3]: the running ``for`` group's (now, stop, step)
==============  =================================================================

>>> from pyflow.kernels.sim import scopes
>>> code = encode([(scopes.TEST, 0, 0, 0), (scopes.IF_SPLIT, 0, 3, 0), (scopes.RUN, 1, 0, 0),
...                (scopes.IF_ELSE, 0, 5, 0), (scopes.RUN, 2, 0, 0), (scopes.IF_JOIN, 0, 0, 0), (scopes.END, 0, 0, 0)])
>>> m = new_state(code, 4)
>>> int(step(code, *m)), np.flatnonzero(m[1]).tolist()        # blocks 0..3 evaluate test 0
(1, [0, 1, 2, 3])
>>> take(code, *m, np.array([1, 0, 0, 1]), np.zeros((4, 3), np.int64), np.ones(4, np.bool_))
>>> int(step(code, *m)), np.flatnonzero(m[1]).tolist()        # the "then" blocks run region 1
(0, [0, 3])
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import scopes
from .cpu_runtime import (BROKE, CONTINUED, FELL_THROUGH, GRID_EXIT, GRID_PARTIAL, GROUP_KEY, GROUP_MISMATCH,
                          OK)

__all__ = ["OPS", "encode", "new_state", "step", "take", "check_grid_barrier", "check_group_barrier"]

# the opcodes, in this order; the first six need the threads (step returns at them)
OPS = (scopes.RUN, scopes.TEST, scopes.FOR_BOUNDS, scopes.ASSIGN, scopes.GRID, scopes.GROUP, scopes.END,
       scopes.IF_SPLIT, scopes.IF_ELSE, scopes.IF_JOIN, scopes.LOOP_ENTER, scopes.WHILE_COND, scopes.LOOP_BACK,
       scopes.FOR_GROUP, scopes.FOR_CHECK, scopes.FOR_BACK, scopes.LOOP_EXIT)
(RUN, TEST, FOR_BOUNDS, ASSIGN, GRID, GROUP, END, IF_SPLIT, IF_ELSE, IF_JOIN, LOOP_ENTER, WHILE_COND, LOOP_BACK,
 FOR_GROUP, FOR_CHECK, FOR_BACK, LOOP_EXIT) = range(len(OPS))
_JIT = njit(cache=True, nogil=True, boundscheck=True)


def encode(code: list) -> np.ndarray:
    """``scopes``' instructions ``(name, a, b, c)`` as an int64 array [n, 4] of opcodes."""
    return np.array([(OPS.index(op), a, b, c) for op, a, b, c in code], np.int64).reshape(-1, 4)


def new_state(code: np.ndarray, blocks: int) -> tuple:
    """A machine at the start, every block in the scope: the arrays ``step`` and ``take`` work on."""
    ifs = 1 + int(np.sum(code[:, 0] == IF_SPLIT))                       # deeper nesting needs more splits
    loops = 1 + int(np.sum((code[:, 0] == LOOP_ENTER) | (code[:, 0] == FOR_BOUNDS)))
    flags = np.zeros((5, loops, blocks), np.bool_)     # done, broke, cont, queued; [4] unused
    return (np.zeros(3, np.int64), np.ones(blocks, np.bool_), np.zeros(blocks, np.int64),
            np.zeros((ifs, blocks), np.bool_), flags, np.zeros((loops, blocks, 3), np.int64),
            np.zeros((loops, 3), np.int64))


@_JIT
def step(code, st, scope, values, waiting, flags, ranges, counter):
    """Run control instructions; return the opcode of the next one that needs the threads (or END)."""
    done, broke, cont, queued = flags[0], flags[1], flags[2], flags[3]
    while True:
        pc = st[0]
        op, b = code[pc, 0], code[pc, 2]
        if op <= END:
            return op
        lp = st[2] - 1   # the innermost loop frame
        if op == IF_SPLIT:
            w = st[1]
            st[1] += 1
            for k in range(scope.shape[0]):
                waiting[w, k] = scope[k] and values[k] == 0
                scope[k] = scope[k] and values[k] == 1
            st[0] = pc + 1 if scope.any() else b
        elif op == IF_ELSE:
            w = st[1] - 1
            for k in range(scope.shape[0]):
                scope[k], waiting[w, k] = waiting[w, k], scope[k]
            st[0] = pc + 1 if scope.any() else b
        elif op == IF_JOIN:
            st[1] -= 1
            scope |= waiting[st[1]]
            st[0] = pc + 1
        elif op == LOOP_ENTER:
            st[2] += 1
            for f in range(4):
                flags[f, lp + 1] = False
            st[0] = pc + 1
        elif op == WHILE_COND:
            for k in range(scope.shape[0]):
                if scope[k] and values[k] == 0:
                    done[lp, k] = True
                    scope[k] = False
            st[0] = pc + 1 if scope.any() else b
        elif op == LOOP_BACK or op == FOR_BACK:
            scope |= cont[lp]
            done[lp] |= broke[lp]
            broke[lp] = False
            cont[lp] = False
            if op == FOR_BACK:
                counter[lp, 0] += counter[lp, 2]
            st[0] = code[pc, 1] if scope.any() else b
        elif op == FOR_GROUP:
            if not queued[lp].any():
                st[0] = b
                continue
            first = np.argmax(queued[lp])   # the lowest queued block: its range is the group's
            counter[lp] = ranges[lp, first]
            for k in range(scope.shape[0]):
                same = queued[lp, k] and (ranges[lp, k] == ranges[lp, first]).all()
                scope[k] = same
                if same:
                    queued[lp, k] = False
            st[0] = pc + 1
        elif op == FOR_CHECK:
            now, stop, stride = counter[lp, 0], counter[lp, 1], counter[lp, 2]
            if stride == 0:
                raise ValueError("range() arg 3 must not be zero (a for loop around a barrier)")
            if (stride > 0 and now < stop) or (stride < 0 and now > stop):
                st[0] = pc + 1
            else:
                done[lp] |= scope
                scope[:] = False
                st[0] = b
        elif op == LOOP_EXIT:
            scope |= done[lp]
            st[2] -= 1
            st[0] = pc + 1
        else:
            raise ValueError("unknown instruction in the control code")


@_JIT
def take(code, st, scope, values, waiting, flags, ranges, counter, results, bounds, live):
    """Each scope block's result (in block order, as ``cu_run`` gives them) of the instruction ``step``
    returned; go on.  RUN / ASSIGN: a status per block (-1: no thread left); TEST / GROUP: a value per
    block; FOR_BOUNDS: ``bounds`` (start, stop, step) per block and ``live`` (it has threads)."""
    op = code[st[0], 0]
    lp = st[2] - 1
    i = 0
    if op == FOR_BOUNDS:
        st[2] += 1
        lp += 1
        for f in range(4):
            flags[f, lp] = False
    for k in range(scope.shape[0]):
        if not scope[k]:
            continue
        if op == RUN or op == ASSIGN:
            if lp >= 0:
                flags[1, lp, k] |= results[i] == BROKE
                flags[2, lp, k] |= results[i] == CONTINUED
            scope[k] = results[i] == FELL_THROUGH
        elif op == TEST or op == GROUP:
            values[k] = results[i]
        elif op == FOR_BOUNDS:
            flags[3, lp, k] = live[i]
            ranges[lp, k] = bounds[i]
            scope[k] = False
        i += 1
    st[0] += 1

@_JIT
def check_grid_barrier(here, alive, threads, report, node):
    """A grid barrier reached by the blocks ``here``: every block of the grid must be there and no thread
    gone (a GPU would hang).  ``OK``, or the launch result with ``report`` filled in."""
    if here.shape[0] == 0:
        return OK
    if not alive.all():
        report[0], report[3] = GRID_EXIT, node
        return GRID_EXIT
    live = 0
    for b in range(alive.shape[0] // threads):
        live += alive[b * threads:(b + 1) * threads].any()
    if here.shape[0] != live:
        report[0], report[3], report[4] = GRID_PARTIAL, node, here.shape[0]
        return GRID_PARTIAL
    return OK


@_JIT
def check_group_barrier(here, results, report, node):
    """A group barrier: each block's ``results`` is ``slot * GROUP_KEY + members`` (-1: no thread left); the
    blocks of each slot that got here together must be as many as its ``members``."""
    for i in range(here.shape[0]):
        if results[i] == -1:
            continue
        slot, members = results[i] // GROUP_KEY, results[i] % GROUP_KEY
        count = 0
        for j in range(here.shape[0]):
            count += results[j] != -1 and results[j] // GROUP_KEY == slot
        if members != count:
            report[0], report[1], report[3] = GROUP_MISMATCH, here[i], node
            report[4], report[5] = members, count
            return GROUP_MISMATCH
    return OK
