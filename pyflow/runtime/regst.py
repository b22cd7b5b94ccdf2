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

* ``planned`` regsts live in one chunk per (rank, device) (``make_chunks``); copy
  i of a regst desc is the view ``planned_tensor(plan, chunks, desc, copy=i)``;
* ``variable`` / ``input`` / ``alias`` / ``output`` regsts stand for memory that is
  not the runtime's (a parameter, the caller's input, another regst's memory, the
  tensor handed back to the caller): each act sets the regst's tensor;
* ``ctrl`` regsts carry no memory at all: only the piece id and the back pressure.

**Where in the chunk.**  Exactly where the compiler's memory plan (``plan.memory``) puts
it: the chunk of (rank, device) has ``plan.memory.block_sizes`` bytes, and regsts that are
never alive at the same time in the Plan's order share bytes there, as in OneFlow.  That
is safe although actors do not follow the Plan's order (pipelining, several calls in
flight, independent branches in any order) because the compiler added the ``mem_guard``
ctrl regsts that order the acts touching shared bytes (``pyflow/compiler/plan.py``, "Why
sharing needs guards"), and pyflow's VM runs every op on one chunk in the order the acts
issued them.  A Plan whose memory plan gives some planned regst less than ``size x regst
num`` bytes (its regst nums edited by hand) is planned again by the Runtime first
(``memory_fits``, ``replan_memory``); the RegstMgr itself refuses one.
"""

from __future__ import annotations

import numpy as np

from pyflow.errors import GraphError
from pyflow.framework.creation import empty
from pyflow.framework.tensor import Tensor
from pyflow.vm.eager_blob_object import EagerBlobObject

__all__ = ["Regst", "RegstMgr", "memory_fits", "requests_by_regst", "make_chunks", "planned_tensor"]


class Regst:
    """One in-flight copy of a regst desc: its tensor, the piece it holds, who still reads it."""

    __slots__ = ("desc", "producer", "index", "tensor", "piece", "readers_left", "pinned_input", "sends", "returns")

    def __init__(self, desc, index: int, tensor=None):
        self.desc = desc                  # the compiler's RegstDesc
        self.producer = desc.producer     # the actor it goes back to (read for every message: a plain field)
        self.index = index                # which copy (0 .. regst num - 1)
        self.tensor = tensor              # a planned view, or what the last act made it (None: ctrl)
        self.piece = None                 # (call, j) while it is in flight, else None
        self.readers_left: set = set()    # consumers (actor ids) that have not returned it yet
        self.pinned_input = None          # an alias regst: the consumed regst whose memory it is
        # the messages that send it to its consumers and give it back from each (actor id -> message), made once
        # by the actors (``Actor.__init__``) and reused: each is in flight at most once at a time, since the copy
        # goes out again only after every consumer gave it back; a send sets only its ``piece``
        self.sends: list = []
        self.returns: dict = {}

    @property
    def reading_count(self) -> int:
        """How many consumers still read it (0: free, back with its producer)."""
        return len(self.readers_left)

    def __repr__(self) -> str:
        state = f"piece {self.piece}, reading count {self.reading_count}" if self.piece is not None else "free"
        return f"<Regst {self.desc.lbn}#{self.index} ({state})>"


def make_chunks(plan, rank: int) -> dict:
    """One new uint8 eager tensor per chunk of ``rank`` (``plan.memory.block_sizes`` bytes each)."""
    mine = f"rank{rank}/"
    return {key: empty(max(int(size), 1), dtype="uint8", device=key.split("/", 1)[1])
            for key, size in plan.memory.block_sizes.items() if key.startswith(mine)}   # others: their rank's


def planned_tensor(plan, chunks: dict, regst, copy: int = 0) -> Tensor:
    """Copy ``copy`` of a planned regst (of its ``max_regst_num``): a view into its device's chunk."""
    chunk = chunks[plan.chunk_key(regst)]
    dtype = np.dtype(regst.dtype)
    offset = plan.memory.offsets[plan.memory_root(regst).id] + copy * regst.nbytes   # inplace: the input's memory
    blob = EagerBlobObject(chunk._blob.storage, regst.shape, dtype, None, offset // dtype.itemsize)
    return Tensor.over_blob(blob, chunk._handle)


def requests_by_regst(plan) -> dict:
    """``plan.memory``'s requests keyed by regst id: one pass over them, so checking every regst is linear in
    the plan (a scan of every request per regst was quadratic: ~3 s of start-up at a 3,990-task plan)."""
    found: dict = {}
    for request in plan.memory.requests:
        found.setdefault(request.regst_id, request)   # the first one, as a scan would find
    return found


def _room_missing(plan, desc, requests: dict) -> str | None:
    """Why ``plan.memory`` cannot hold planned regst ``desc`` (``size x regst num`` bytes), or None.

    ``requests``: ``requests_by_regst(plan)``, made once by the caller (an O(1) look-up per regst)."""
    if desc.inplace_of is not None:
        return None   # it lives in its root's request
    request = requests.get(desc.id)
    need = desc.nbytes * desc.max_regst_num
    if request is not None and request.size >= need:
        return None
    have = "no request" if request is None else f"a request of {request.size} bytes"
    return f"regst {desc.lbn} needs {need} bytes (regst num {desc.max_regst_num}) but the memory plan has {have}"


def memory_fits(plan) -> bool:
    """Does ``plan.memory`` hold every planned regst, each copy of it (False: regst nums edited since)?"""
    requests = requests_by_regst(plan)
    return not any(_room_missing(plan, d, requests) for d in plan.regsts.values() if d.mem == "planned")


def _check_room(plan, desc, requests: dict) -> None:
    """The memory plan must give ``desc`` its ``size x regst num`` bytes (an inplace output: its root's)."""
    if desc.inplace_of is not None:
        if desc.max_regst_num != 1:
            raise GraphError(f"plan {plan.job_name}: regst {desc.lbn} is written in place but has regst num "
                             f"{desc.max_regst_num}; only regst num 1 can be inplace")
        return
    missing = _room_missing(plan, desc, requests)
    if missing is not None:
        raise GraphError(f"plan {plan.job_name}: {missing} for it; after editing regst nums, plan the memory "
                         "again (pyflow.compiler.plan.replan_memory)")


class RegstMgr:
    """Every Regst of the tasks ``task_ids`` of a Plan (``rank``'s), made once: ``regsts_of(desc_id)``."""

    def __init__(self, plan, task_ids, rank: int):
        mine = set(task_ids)
        descs = [desc for desc in plan.regsts.values() if desc.producer in mine]
        self.plan = plan
        self.chunks = make_chunks(plan, rank)   # one uint8 tensor per device of this rank (its own)
        self._regsts: dict[int, list[Regst]] = {}
        requests = requests_by_regst(plan)
        for desc in descs:
            if desc.mem == "planned":
                _check_room(plan, desc, requests)
            copies = []
            for i in range(desc.max_regst_num):   # regst num 0 is allowed: that producer can never act
                tensor = planned_tensor(plan, self.chunks, desc, copy=i) if desc.mem == "planned" else None
                copies.append(Regst(desc, i, tensor))
            self._regsts[desc.id] = copies

    def regsts_of(self, desc_id: int) -> list[Regst]:
        return self._regsts[desc_id]

    def copies_of(self, desc_id: int) -> list[Regst]:
        """``regsts_of(desc_id)``, or none where another rank's task produces that desc."""
        return self._regsts.get(desc_id, [])

    def all_regsts(self) -> list[Regst]:
        return [r for copies in self._regsts.values() for r in copies]

    def chunk_bytes(self) -> dict:
        """Bytes of each chunk the runtime allocated: the compiler's ``plan.memory.block_sizes`` of this rank."""
        return {key: int(chunk.shape[0]) if self.plan.memory.block_sizes[key] else 0
                for key, chunk in self.chunks.items()}
