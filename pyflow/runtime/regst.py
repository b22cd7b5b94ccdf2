"""Seed 003: ``Regst`` and ``RegstMgr``: the memory actors hand each other, and who makes it.

A **regst desc** (the compiler's ``RegstDesc``) says what one produced blob looks
like and how many copies of it may be in flight: its *regst num*.  At run time each
copy is a **Regst**.  A Regst is the runtime's unit of memory *and* of messaging:

* its producer writes it (one act), stamps it with the **piece id** it now holds
  (``(call, j)``: which call of the graph, which micro-batch), and sends it to
  every consumer; its **reading count** is then the number of consumers;
* each consumer reads it and sends it back; every return lowers the reading count;
  at zero the regst is free, and the producer may write it again.

So the regst num is back pressure: a producer with r copies is at most r pieces
ahead of its slowest consumer (seed 003, 5.5.5).

**RegstMgr** makes every Regst of the rank's tasks once, before anything runs (OneFlow
allocates all memory when the runtime starts; running costs no allocation):

* ``planned`` regsts live in one chunk per (rank, device) (``chunk_tensors``); copy
  i of a regst desc is the view ``planned_tensor(plan, chunks, desc, copy=i)``;
* ``variable`` / ``input`` / ``alias`` / ``output`` regsts stand for memory that is
  not the runtime's (a parameter, the caller's input, another regst's memory, the
  tensor handed back to the caller): each act sets the regst's tensor;
* ``ctrl`` regsts carry no memory at all: only the piece id and the back pressure.

**Where in the chunk.**  The compiler's memory plan lets regsts that are never alive
at the same time *in the Plan's sequential order* share bytes.  Actors do not run in
that order: with pipelining, micro-batch j + 1 of one op runs while micro-batch j
of a later op still holds its regst.  OneFlow makes sharing safe with control edges
the compiler adds between the regsts of one mem block; pyflow's compiler does not add
them (yet), so the RegstMgr lays the chunk out again with every planned regst alive
all call long (no sharing, ``size x regst num`` each) and then uses ``chunk_tensors``
and ``planned_tensor`` on that layout.  ``layout_plan`` is the Plan with that memory.
"""

from __future__ import annotations

import dataclasses

from pyflow.compiler.memory import MemoryPlan, MemRequest
from pyflow.compiler.run_plan import chunk_tensors, planned_tensor

__all__ = ["Regst", "RegstMgr", "private_layout"]

_ALIGNMENT = 512


class Regst:
    """One in-flight copy of a regst desc: its tensor, the piece it holds, who still reads it."""

    __slots__ = ("desc", "index", "tensor", "piece", "readers_left", "pinned_input")

    def __init__(self, desc, index: int, tensor=None):
        self.desc = desc                  # the compiler's RegstDesc
        self.index = index                # which copy (0 .. regst num - 1)
        self.tensor = tensor              # a planned view, or what the last act made it (None: ctrl)
        self.piece = None                 # (call, j) while it is in flight, else None
        self.readers_left: set = set()    # consumers (actor ids) that have not returned it yet
        self.pinned_input = None          # an alias regst: the consumed regst whose memory it is

    @property
    def reading_count(self) -> int:
        """How many consumers still read it (0: free, back with its producer)."""
        return len(self.readers_left)

    @property
    def producer(self) -> int:
        return self.desc.producer

    def __repr__(self) -> str:
        state = f"piece {self.piece}, reading count {self.reading_count}" if self.piece is not None else "free"
        return f"<Regst {self.desc.lbn}#{self.index} ({state})>"


def private_layout(plan, descs) -> MemoryPlan:
    """A memory layout in which no two of ``descs`` (planned regsts) share bytes (see the module docstring)."""
    offsets, sizes, requests = {}, {}, []
    for desc in sorted(descs, key=lambda r: r.id):
        if desc.mem != "planned" or desc.inplace_of is not None:
            continue   # an inplace output lives in its input's memory (``planned_tensor`` finds it)
        key = plan.chunk_key(desc)
        size = desc.nbytes * max(desc.max_regst_num, 1)
        offsets[desc.id] = sizes.get(key, 0)
        sizes[key] = offsets[desc.id] + -(-max(size, 1) // _ALIGNMENT) * _ALIGNMENT
        requests.append(MemRequest(desc.id, key, size, 0, 1))
    return MemoryPlan(tuple(requests), _ALIGNMENT, offsets, sizes, {key: "private" for key in sizes})


class RegstMgr:
    """Every Regst of the tasks ``task_ids`` of a Plan (this rank's), made once: ``regsts_of(desc_id)``."""

    def __init__(self, plan, task_ids):
        mine = set(task_ids)
        descs = [desc for desc in plan.regsts.values() if desc.producer in mine]
        self.layout_plan = dataclasses.replace(plan, memory=private_layout(plan, descs))
        self.chunks = chunk_tensors(self.layout_plan)   # one uint8 tensor per device of this rank
        self._regsts: dict[int, list[Regst]] = {}
        for desc in descs:
            copies = []
            for i in range(desc.max_regst_num):   # regst num 0 is allowed: that producer can never act
                tensor = planned_tensor(self.layout_plan, self.chunks, desc, copy=i) if desc.mem == "planned" else None
                copies.append(Regst(desc, i, tensor))
            self._regsts[desc.id] = copies

    def regsts_of(self, desc_id: int) -> list[Regst]:
        return self._regsts[desc_id]

    def all_regsts(self) -> list[Regst]:
        return [r for copies in self._regsts.values() for r in copies]

    def chunk_bytes(self) -> dict:
        """Bytes of each chunk the runtime allocated (against the compiler's ``plan.memory.block_sizes``)."""
        return dict(self.layout_plan.memory.block_sizes)
