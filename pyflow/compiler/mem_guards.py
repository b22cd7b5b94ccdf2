"""Memory-sharing safety under the actor runtime (OneFlow's ``out_ctrl_shared_mem_safe_guard``): ``mem_guards``.

The memory planner (``memory.py``) lets two regsts share bytes when they are never alive at
once *in the plan's order*; actors do not follow that order.  This module finds the ctrl
edges that make the sharing safe; ``plan.replan_memory`` asks for them and
``task_graph.add_mem_guards`` writes them into the plan.

**Why sharing needs guards, and which.**  Actors act when their messages arrive: with
several calls (or micro-batches) in flight, the op that makes regst r1 for the *next*
piece may run while a reader of r2, which took over r1's bytes, still reads this piece;
and even within one piece two independent branches may act in either order.  OneFlow
(``intra_job_mem_sharing_util.cpp``, ``task_graph.cpp``) shares memory only inside a *mem
chain* (the tasks of one CUDA stream, ordered by ctrl edges between consecutive tasks, so
the stream runs them in the planned order) and adds ``out_ctrl_shared_mem_safe_guard``
ctrl regsts from the chain's first task to its last consumers (regst num 1: the next
piece waits for them).  In pyflow every op on a chunk is ordered by its *issue* (the
chunk is one storage, one VM dependence object), so the chain is the whole (rank,
device) chunk and what must be ordered are the *acts* that issue the ops.  For each pair
of regsts whose bytes overlap, r1 dying before r2 is born (its "touchers": the producer,
every reader, the inplace writers and the readers of its aliases):

* **same piece**: every toucher of r1 acts before r2's producer.  Already true when r2's
  producer is reachable from it; else a ctrl regst toucher -> r2's producer;
* **next piece** (next micro-batch or next call): every toucher of r2 acts before r1's
  producer acts again.  Already true when r1's producer makes a regst of regst num 1 that
  a task reachable from the toucher reads (the producer cannot write it again before it
  came back; not when that reader absorbs several pieces per act, acts input-wise or is
  the sink tick); else a ctrl regst r1's producer -> toucher, whose regst num 1 holds the
  producer back.

The guards are the producer's ``mem_guard`` ctrl regst (``<op>/mem_guard``).  Every guard
goes forward in the plan's order, which therefore stays a valid schedule: no deadlock.  The pairs
can be quadratic in number; ``mem_guards`` keeps both rules for all of them in time about
linear in the graph, looking only at the pairs the others follow from (see its docstring).
"""

from __future__ import annotations

import bisect
import collections

from pyflow.compiler.memory import MemoryPlan
from pyflow.compiler.task_graph import GUARD_KEY, pieces_per_call
from pyflow.errors import CompileError

__all__ = ["mem_guards", "is_input_wise", "memory_readers"]


def memory_readers(regsts) -> dict:
    """regst id -> every task that reads its memory: its consumers and those of the aliases of it."""
    readers = {rid: list(r.consumers) for rid, r in regsts.items()}
    for r in regsts.values():   # an alias's (an inplace output's) readers read the regst it stands for
        source = r
        while source.inplace_of is not None or (source.mem == "alias" and source.alias_of is not None):
            source = regsts[source.inplace_of if source.inplace_of is not None else source.alias_of]
            readers[source.id].extend(r.consumers)
    return readers


_INPUT_WISE = {"concat": None, "add": 2, "assemble": 2}   # boxing kind -> the input count it must have (None: any)


def is_input_wise(task) -> bool:
    """May ``task`` act one input at a time, in any order (a boxing concat; a two-input add or assemble)?

    The runtime's InputWise actor acts so (its ``act_input``), and the guards rely on it: such a reader
    holds no producer back (``_GuardPlanner._hold``)."""
    if task.kind != "boxing" or task.op_type not in _INPUT_WISE:
        return False
    inputs = sum(key.startswith("in_") for key in task.consumed)
    wanted = _INPUT_WISE[task.op_type]
    return inputs >= 2 and (wanted is None or inputs == wanted)


class _ByteHistory:
    """Who held which bytes of one chunk, over time: requests painted onto the byte axis in birth order.

    ``previous[r]``: ``(lo, hi, r0)`` per stretch of r's bytes whose holder just before r was r0 (r's *visible*
    predecessors: a byte in common, no holder of it in between); ``last(lo, hi)``: the stretches of
    ``[lo, hi)`` and their last holders.  A paint makes the stretches it covers one, so n paints leave at
    most 2n + 1 stretches (a sorted list, found by bisection) and O(n) predecessors in all.
    """

    def __init__(self, spans):
        self.cuts, self.holders = [0], [None]     # stretch i: bytes [cuts[i], cuts[i + 1]), held by holders[i]
        self.previous = {}
        for rid, lo, hi in spans:                 # in birth order
            self.previous[rid] = [s for s in self.last(lo, hi) if s[2] is not None]
            i, j = self._cut(lo), self._cut(hi)
            self.cuts[i:j], self.holders[i:j] = [lo], [rid]

    def _cut(self, x: int) -> int:
        """The index of the stretch starting at byte ``x`` (the one holding ``x`` split there if need be)."""
        i = bisect.bisect_right(self.cuts, x) - 1
        if self.cuts[i] != x:
            i += 1
            self.cuts.insert(i, x)
            self.holders.insert(i, self.holders[i - 1])
        return i

    def last(self, lo: int, hi: int) -> list:
        i, found = bisect.bisect_right(self.cuts, lo) - 1, []
        while i < len(self.cuts) and self.cuts[i] < hi:
            end = self.cuts[i + 1] if i + 1 < len(self.cuts) else hi
            found.append((max(lo, self.cuts[i]), min(hi, end), self.holders[i]))
            i += 1
        return found


def mem_guards(tasks, regsts, order, memory: MemoryPlan) -> list[tuple[int, int]]:
    """The ctrl edges (producer task, consumer task) that make ``memory``'s sharing safe for the actors.

    The module docstring's two rules hold for every pair of regsts sharing bytes, but pairs can be quadratic
    in number (n regsts taking turns on a byte make n^2 / 2), and so were the guards when each pair asked for
    its own (23,359 for a 1,014-op training graph).  Along one byte the holders A1, A2, A3 ... are chained:
    A1's touchers reach A2's producer (same piece), which reaches A2's touchers, which reach A3's producer.

    * *same piece*: only visible pairs (``_ByteHistory``) need the rule, the others follow along the chain;
    * *next piece*: a producer held back after a later holder's producer is held back after all touchers of
      the holders before it on those bytes; so it looks at the *last* holders of its bytes and walks down only
      until a holder's producer is held back already (mostly one step: ``_GuardPlanner._descend``).

    Reachability is a bitset per task over positions, made in one sweep from the last task to the first:
    a task's guards are decided at its turn, when every task after it has its final set, so no set changes
    afterwards (the pairwise code walked every task's set per edge).  Bitsets: n^2 / 64 words (4,000 tasks:
    2 MB, a few ms of ORs); the rest is about O(tasks + regsts + guards): a walk takes a step or two per
    request, more only past holders read by input-wise tasks alone.  Edges come in plan order.
    """
    return _GuardPlanner(tasks, regsts, order, memory).edges


class _GuardPlanner:
    """``mem_guards``' sweep; ``visits`` counts its reachability tests (a deterministic measure of its work)."""

    def __init__(self, tasks, regsts, order, memory: MemoryPlan):
        self.tasks, self.regsts, self.visits = tasks, regsts, 0
        self.position = {tid: i for i, tid in enumerate(order)}
        readers = memory_readers(regsts)
        self.requests = {r.regst_id: r for r in memory.requests if memory.size_of(r) > 0}
        self.touchers = {rid: {regsts[rid].producer, *readers[rid]} for rid in self.requests}
        self.span = {rid: (memory.offsets[rid], memory.offsets[rid] + memory.size_of(r))
                     for rid, r in self.requests.items()}
        self.history, self.looping = {}, {}   # per chunk: all holders; those with a toucher acting k times a call
        for device, rs in memory.by_device().items():
            rids = [r.regst_id for r in sorted(rs, key=lambda r: (r.start, r.regst_id)) if r.regst_id in self.span]
            self.history[device] = _ByteHistory([(rid, *self.span[rid]) for rid in rids])
            self.looping[device] = _ByteHistory([(rid, *self.span[rid]) for rid in rids
                                                 if any(self._acts(t) > 1 for t in self.touchers[rid])])
        self.later = collections.defaultdict(list)      # r1 -> its visible successors
        for h in self.history.values():
            for r2, stretches in h.previous.items():
                for r1 in dict.fromkeys(s[2] for s in stretches):
                    self.later[r1].append(r2)
        self.touched_by, self.made_by = collections.defaultdict(list), collections.defaultdict(list)
        for rid in self.requests:
            self.made_by[regsts[rid].producer].append(rid)
            for t in self.touchers[rid] if rid in self.later else ():
                self.touched_by[t].append(rid)
        self.reach, self.guards, self.maximal = {}, collections.defaultdict(dict), {}
        successors = collections.defaultdict(list)
        for r in regsts.values():
            successors[r.producer].extend(r.consumers)
        for tid in reversed(order):
            bits = 1 << self.position[tid]
            for c in successors[tid]:
                if self.position[c] <= self.position[tid]:
                    raise CompileError(f"task {tasks[c].op_name} reads a regst of {tasks[tid].op_name}, which "
                                       "comes after it in the plan's order: the order is not a topological one")
                bits |= self.reach[c]
            self.reach[tid] = bits
            self._same_piece(tid)
            if tid in self.made_by:
                self._next_piece(tid)
        self.edges = sorted(((s, d) for s, ds in self.guards.items() for d in ds),
                            key=lambda e: (self.position[e[0]], self.position[e[1]]))

    def _acts(self, tid: int) -> int:
        return self.tasks[tid].time_shape[1]

    def _add(self, src: int, dst: int) -> None:
        if self.position[dst] <= self.position[src]:
            raise CompileError(f"the memory plan's lifetimes disagree with the plan's order: a guard "
                               f"{self.tasks[src].op_name} -> {self.tasks[dst].op_name} would go backwards")
        self.guards[src][dst] = None
        self.reach[src] |= self.reach[dst]

    def _same_piece(self, t: int) -> None:
        """Rule 1 for the visible pairs whose first regst ``t`` touches: ``t`` reaches the next producer."""
        producers = {self.regsts[r2].producer for r1 in self.touched_by.get(t, ()) for r2 in self.later[r1]}
        for w2 in sorted(producers, key=self.position.get):   # the earliest first: it may reach the others
            self.visits += 1
            if not self.reach[t] >> self.position[w2] & 1:
                self._add(t, w2)

    def _hold(self, c: int, made: int) -> None:
        """``c`` acts on a regst num 1 regst of the current producer, which makes ``made`` pieces of it per
        call: unless ``c`` is the sink tick or input-wise, a toucher reaching ``c`` is held back if it acts
        once per call (``weak``), any toucher if ``c`` acts once per piece (``strong``)."""
        task = self.tasks[c]
        if task.op_type != "sink_tick" and not is_input_wise(task):
            self.weak |= 1 << self.position[c]
            if made <= task.time_shape[1]:
                self.strong |= 1 << self.position[c]

    def _held(self, t: int) -> bool:
        self.visits += 1
        return bool(self.reach[t] & (self.weak if self._acts(t) == 1 else self.strong))

    def _next_piece(self, w1: int) -> None:
        """Rule 2 for every request ``w1`` makes: ``w1`` held back after the touchers of each later holder of
        its bytes.  In the loop (k pieces per call) two walks: the touchers acting k times per call need a
        strong hold, found among the holders with such touchers; the others a weak one, among all."""
        task = self.tasks[w1]
        self.strong = self.weak = 0
        for key, rid in task.produced.items():
            for c in self.regsts[rid].consumers if self.regsts[rid].max_regst_num == 1 else ():
                self._hold(c, pieces_per_call(task, key))
        for c in self.guards.get(w1, ()):
            self._hold(c, pieces_per_call(task, GUARD_KEY))
        for r1 in self.made_by[w1]:
            device = self.requests[r1].device
            if self._acts(w1) > 1:
                self._descend(w1, r1, self.looping[device], lambda t: self._acts(t) > 1, strong=True)
                self._descend(w1, r1, self.history[device], lambda t: self._acts(t) == 1, strong=False)
            else:   # one piece per call: strong and weak holds are the same
                self._descend(w1, r1, self.history[device], lambda t: True, strong=True)

    def _descend(self, w1: int, r1: int, history: _ByteHistory, wanted, strong: bool) -> None:
        """Walk ``history`` down ``r1``'s bytes from their last holders to ``r1``: guard ``w1`` -> each
        maximal ``wanted`` toucher of a holder that is not held back; stop where the holder's producer is."""
        end1, checked, walked = self.requests[r1].end, set(), set()
        stack = history.last(*self.span[r1])
        while stack:
            lo, hi, x = stack.pop()
            self.visits += 1
            if x is None or self.requests[x].start < end1 or (lo, hi, x) in walked:
                continue   # r1 itself or a holder before it; or a stretch walked already
            walked.add((lo, hi, x))
            if x not in checked:
                checked.add(x)
                for t in self._maximal(x):
                    if wanted(t) and not self._held(t):
                        self._add(w1, t)
                        self._hold(t, pieces_per_call(self.tasks[w1], GUARD_KEY))
            if not self.reach[self.regsts[x].producer] & (self.strong if strong else self.weak):
                stack.extend((max(lo, a), min(hi, b), y) for a, b, y in history.previous[x] if a < hi and lo < b)

    def _maximal(self, rid: int) -> list:
        """The touchers of ``rid`` that reach no other one (final: they all come after the sweep's task)."""
        if rid not in self.maximal:
            touchers = sorted(self.touchers[rid], key=self.position.get)
            mask = sum(1 << self.position[t] for t in touchers)
            self.maximal[rid] = [t for t in touchers if self.reach[t] & mask == 1 << self.position[t]]
        return self.maximal[rid]
