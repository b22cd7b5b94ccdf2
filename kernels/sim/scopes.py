"""The compiled tier's control machine: which blocks run which part of a kernel, as bytecode.

``fission.py`` turns a kernel with barriers into *nodes*: regions (code between
barriers, run by every thread of a block), tests (the condition of an ``if`` /
``while`` or the range of a ``for`` around barriers; every thread of a block must
agree) and barriers.  The control flow between the nodes is a small program for
this machine; the nodes' code is the kernel's ``run`` function (numba-compiled),
which runs one node for every live thread of a set of blocks.  The machine is
plain Python on numpy arrays: it costs nothing to compile, a student can step
through it, and it runs once per node executed, not once per thread.  Launches
use its compiled twin, ``grid_machine.py`` (the same instructions, in numba: a
Cocktailer program executes tens of thousands of small nodes per call, and the
trips through Python were most of its time); ``compiled._COMPILED_MACHINE =
False`` drives them with this one, and the tests check that both agree.

The machine holds a **scope**: the blocks (numbers, sorted) that run the current
part.  Where the blocks of a scope disagree about a test, the scope splits: ``if``
runs the "then" blocks, then the "else" blocks, then joins them; a loop keeps the
blocks whose test holds and collects the others (and those that ``break``) until
no block is left in it.  So one machine serves a block at a time (kernels
without grid barriers) and the whole grid (kernels with them; Cocktailer's block
groups are scopes that split at their lane's ``if``).

Instructions are tuples ``(op, a, b, c)``::

    RUN n _ e          every live thread runs region n; blocks that break / continue
                       go to the innermost loop; e=1: continue == fall through (loop end)
    TEST n             every live thread evaluates test n; each block's value is kept
    IF_SPLIT _ else    scope := blocks whose value is 1; the 0 blocks wait (jump to else if none)
    IF_ELSE _ join     scope := the waiting blocks; the "then" blocks wait (jump to join if none)
    IF_JOIN            scope := the two parts together again
    LOOP_ENTER         a new loop frame (blocks done with the loop, broke, continued)
    WHILE_COND _ exit  blocks whose value is 0 are done; scope := the 1 blocks (exit if none)
    LOOP_BACK head ex  scope := this iteration's survivors and those that continued (to head, or exit)
    FOR_BOUNDS n       every live thread evaluates range(...) n; a loop frame; blocks wait in
                       groups of equal ranges
    FOR_GROUP _ exit   scope := the next group; its counter starts (exit if no group is left)
    FOR_CHECK _ group  the counter past the end: the group is done (back to group)
    ASSIGN n           every live thread runs region n with the counter (the loop variable's store)
    FOR_BACK chk grp   like LOOP_BACK, and the counter steps
    LOOP_EXIT          scope := every block done with the loop; the frame goes
    GRID n             a grid barrier: every block of the grid is in the scope, no thread gone
    GROUP n            a group barrier: test n gives its member count, which must be the scope's
    END

``next()`` runs control instructions until one needs the threads (RUN, TEST,
FOR_BOUNDS, ASSIGN, GRID, GROUP) or the end; the launch runs that node for every
live thread of ``machine.scope`` and hands each block's result to ``take()``.

>>> code = [(TEST, 0, 0, 0), (IF_SPLIT, 0, 3, 0), (RUN, 1, 0, 0), (IF_ELSE, 0, 5, 0),
...         (RUN, 2, 0, 0), (IF_JOIN, 0, 0, 0), (END, 0, 0, 0)]
>>> m = Machine(code, np.arange(4))
>>> m.next()[:2], m.scope.tolist()              # blocks 0..3 evaluate test 0
(('TEST', 0), [0, 1, 2, 3])
>>> m.take(np.array([1, 0, 0, 1]))
>>> m.next()[:2], m.scope.tolist()              # the "then" blocks run region 1
(('RUN', 1), [0, 3])
>>> m.take(np.zeros(2, np.int64))
>>> m.next()[:2], m.scope.tolist()              # the "else" blocks run region 2
(('RUN', 2), [1, 2])
>>> m.take(np.zeros(2, np.int64))
>>> m.next()[0], m.scope.tolist()               # joined again: the end
('END', [0, 1, 2, 3])
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .cpu_runtime import BROKE, CONTINUED, FELL_THROUGH

__all__ = ["RUN", "TEST", "IF_SPLIT", "IF_ELSE", "IF_JOIN", "LOOP_ENTER", "WHILE_COND", "LOOP_BACK", "FOR_BOUNDS",
           "FOR_GROUP", "FOR_CHECK", "ASSIGN", "FOR_BACK", "LOOP_EXIT", "GRID", "GROUP", "END", "NEEDS_THREADS",
           "Machine"]

RUN, TEST, IF_SPLIT, IF_ELSE, IF_JOIN, LOOP_ENTER, WHILE_COND, LOOP_BACK = (
    "RUN", "TEST", "IF_SPLIT", "IF_ELSE", "IF_JOIN", "LOOP_ENTER", "WHILE_COND", "LOOP_BACK")
FOR_BOUNDS, FOR_GROUP, FOR_CHECK, ASSIGN, FOR_BACK, LOOP_EXIT, GRID, GROUP, END = (
    "FOR_BOUNDS", "FOR_GROUP", "FOR_CHECK", "ASSIGN", "FOR_BACK", "LOOP_EXIT", "GRID", "GROUP", "END")
NEEDS_THREADS = (RUN, TEST, FOR_BOUNDS, ASSIGN, GRID, GROUP)
_NONE = np.zeros(0, np.int64)


@dataclasses.dataclass
class _Loop:
    """A loop around barriers: the blocks done with it, those that broke or continued this round."""

    done: np.ndarray = dataclasses.field(default_factory=lambda: _NONE)
    broke: np.ndarray = dataclasses.field(default_factory=lambda: _NONE)
    cont: np.ndarray = dataclasses.field(default_factory=lambda: _NONE)
    waiting: np.ndarray = dataclasses.field(default_factory=lambda: _NONE)     # for: groups not yet run
    ranges: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 3), np.int64))
    counter: list = dataclasses.field(default_factory=lambda: [0, 0, 1])     # for: now, stop, step


def _union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.union1d(a, b) if b.size else a


class Machine:
    """Runs ``code`` over the blocks ``blocks``; see the module docstring."""

    def __init__(self, code: list, blocks: np.ndarray):
        self.code, self.pc, self.scope = code, 0, np.asarray(blocks, np.int64)
        self.waiting: list = []     # scopes set aside by IF_SPLIT / IF_ELSE
        self.loops: list = []       # _Loop frames, innermost last
        self.values = _NONE         # the last TEST's value per block of the scope

    def next(self) -> tuple:
        """Run control instructions; return the next instruction that needs the threads (or END)."""
        while True:
            op, a, b, c = self.code[self.pc]
            if op in NEEDS_THREADS or op == END:
                return self.code[self.pc]
            loop = self.loops[-1] if self.loops else None
            if op == IF_SPLIT:
                self.waiting.append(self.scope[self.values == 0])
                self.scope = self.scope[self.values == 1]
                self.pc = self.pc + 1 if self.scope.size else b
            elif op == IF_ELSE:
                self.waiting[-1], self.scope = self.scope, self.waiting[-1]
                self.pc = self.pc + 1 if self.scope.size else b
            elif op == IF_JOIN:
                self.scope = _union(self.scope, self.waiting.pop())
                self.pc += 1
            elif op == LOOP_ENTER:
                self.loops.append(_Loop())
                self.pc += 1
            elif op == WHILE_COND:
                loop.done = _union(loop.done, self.scope[self.values == 0])
                self.scope = self.scope[self.values == 1]
                self.pc = self.pc + 1 if self.scope.size else b
            elif op in (LOOP_BACK, FOR_BACK):
                self.scope = _union(self.scope, loop.cont)
                loop.done, loop.broke, loop.cont = _union(loop.done, loop.broke), _NONE, _NONE
                if op == FOR_BACK:
                    loop.counter[0] += loop.counter[2]
                self.pc = a if self.scope.size else b
            elif op == FOR_GROUP:
                if not loop.waiting.size:
                    self.pc = b
                    continue
                same = (loop.ranges == loop.ranges[0]).all(axis=1)
                loop.counter = [int(v) for v in loop.ranges[0]]
                self.scope, loop.waiting = loop.waiting[same], loop.waiting[~same]
                loop.ranges = loop.ranges[~same]
                self.pc += 1
            elif op == FOR_CHECK:
                now, stop, step = loop.counter
                if step == 0:
                    raise ValueError("range() arg 3 must not be zero (a for loop around a barrier)")
                if (step > 0 and now < stop) or (step < 0 and now > stop):
                    self.pc += 1
                else:
                    loop.done, self.scope = _union(loop.done, self.scope), _NONE
                    self.pc = b
            elif op == LOOP_EXIT:
                self.scope = _union(self.loops.pop().done, self.scope)
                self.pc += 1
            else:
                raise ValueError(f"unknown instruction {op!r}")

    @property
    def counter(self) -> int:
        """The innermost for loop's counter (what ASSIGN stores in the loop variable)."""
        return self.loops[-1].counter[0]

    def take(self, results: np.ndarray, bounds: np.ndarray | None = None, live: np.ndarray | None = None) -> None:
        """Each block's result (in scope order) of the instruction ``next`` returned; go on.

        RUN / ASSIGN: a status per block (-1: no thread left); TEST / GROUP: a value per block;
        FOR_BOUNDS: ``bounds`` (start, stop, step) per block and ``live`` (it has threads).
        """
        op = self.code[self.pc][0]
        if op in (RUN, ASSIGN):
            if self.loops:
                loop = self.loops[-1]
                loop.broke = _union(loop.broke, self.scope[results == BROKE])
                loop.cont = _union(loop.cont, self.scope[results == CONTINUED])
            self.scope = self.scope[results == FELL_THROUGH]
        elif op in (TEST, GROUP):
            self.values = results
        elif op == FOR_BOUNDS:
            self.loops.append(_Loop(waiting=self.scope[live], ranges=bounds[live]))
            self.scope = _NONE
        self.pc += 1
