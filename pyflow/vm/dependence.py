"""Seed 002: ``LocalDepObject`` (OneFlow's ``Dependence``): who touched a tensor, in order.

Every tensor storage has one dependence object, and so does every vm stream
(its *stream-sequential* dependence).  When an instruction is received, each
object it reads or writes records the access and tells the engine which earlier
instructions the new one must wait for (its in-edges):

* a **write** waits for the last writer and for every reader since it (RAW is
  covered by the reader's own edge; this is WAR and WAW), then becomes the head:
  the earlier accesses are dropped;
* a **read** waits for the head only if the head is a write (RAW).  Concurrent
  reads get no edges between them;
* an instruction never waits for itself.

>>> class I:                      # a stand-in for an instruction
...     def __init__(self, name): self.name = name
...     def __repr__(self): return self.name
>>> dep = LocalDepObject("x")
>>> w1, r1, r2, w2 = I("w1"), I("r1"), I("r2"), I("w2")
>>> dep.access(w1, write=True), dep.access(r1, write=False), dep.access(r2, write=False)
([], [w1], [w1])
>>> dep.access(w2, write=True)      # waits for the writer and both readers
[w1, r1, r2]
"""

from __future__ import annotations

__all__ = ["LocalDepObject"]


class LocalDepObject:
    """The access history of one tensor storage (or one vm stream's sequence)."""

    __slots__ = ("name", "last_write", "reads_since")

    def __init__(self, name: str):
        self.name = name
        self.last_write = None     # the head, when it is a write
        # Readers after the head (or since the start): an ordered set (a dict), because a
        # tensor read by thousands of in-flight instructions must forget each in O(1).
        self.reads_since: dict = {}

    def access(self, instruction, write: bool) -> list:
        """Record an access by ``instruction``; return the instructions it must follow."""
        if write:
            sources = ([self.last_write] if self.last_write is not None else []) + list(self.reads_since)
            self.last_write, self.reads_since = instruction, {}
        else:
            sources = [self.last_write] if self.last_write is not None else []
            self.reads_since[instruction] = None
        return [s for s in sources if s is not instruction]

    def forget(self, instruction) -> None:
        """Drop a released instruction: later accesses need not wait for it."""
        if self.last_write is instruction:
            self.last_write = None
        self.reads_since.pop(instruction, None)

    def __repr__(self) -> str:
        return f"LocalDepObject({self.name})"
