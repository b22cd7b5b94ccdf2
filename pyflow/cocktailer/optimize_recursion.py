"""Cocktailer's (seed 001) recursion unroll: sibling subtrees of a recursive call on disjoint block groups.

An IR-to-IR pass like those of ``optimize.py`` (Fig. 8 of the paper), nested up
to 3 levels: it takes a traced ``Program`` and returns a new one that computes
the same values bitwise.  The scheduler (``schedule.py``) tries the depths of
``Optimizations.recursion_depths`` and keeps the cheapest, if it pays.

An outside call of a recursive function is replaced by the function's body,
inlined once for that call (its frame is the call's first frame), and inside it
each run of sibling calls that share nothing they write (RAE's ``rae(left)``,
``rae(right)``) becomes a ``CallGroup``: its lanes run at the same time, each on
its own group of blocks, each calling its own copy of the function (``rae0_g0``,
``rae0_g1``) with its own stack, followed by a copy of each result into its slot.
The unrolled tree exposes that nodes 2 and 3 are independent.  ``depth`` levels
are unrolled: below the first, a lane is not the call but the call's body
inlined again (a frame of its copy's stack), whose own sibling calls are a
``CallGroup`` nested in the lane, splitting its group of blocks again
(``rae0_g0_1``: lane 1 inside lane 0).  Each level costs a split and a join and
saves half of what is left on the critical path, while there are blocks to
split.  The code generator (``codegen_groups.py``) syncs a group with
``group_barrier`` (``kernels/utask/groups.py``) and joins the groups at a grid
barrier.

Statements are copied with ``optimize.py``'s engine (``_Cloner``, ``_rebuild``).
"""

from __future__ import annotations

import dataclasses

from pyflow.cocktailer.barriers import accesses, op_accesses, scalar_accesses
from pyflow.cocktailer.ir import (
    Branch,
    Buffer,
    Call,
    CallGroup,
    FunctionDef,
    Lane,
    Loop,
    NestedUTask,
    Offset,
    StmtBlock,
    TensorRef,
    UOperator,
    walk,
)
from pyflow.cocktailer.optimize import PassResult, _Cloner, _overlap, _rebuild
from pyflow.cocktailer.scalars import (
    Const,
    Scalar,
    Var,
)
from pyflow.cocktailer.trace import copy_operator

__all__ = ["unroll_recursion"]


# ---- recursion unroll -----------------------------------------------------------------------


def _as_offset_scalar(o: Offset) -> Scalar:
    return Const(o.const) if o.dynamic is None else (o.dynamic + o.const if o.const else o.dynamic)


class _RecursionUnroll:
    """Unrolls every outside call of a recursive function ``depth`` levels (see the module docstring)."""

    def __init__(self, program, depth: int):
        self.program, self.depth = program, depth
        self.copies: dict = {}      # (FunctionDef, lane path) -> its copy for that block group
        self.changed = 0

    def copy_of(self, fdef: FunctionDef, path: tuple) -> FunctionDef:
        """The copy of ``fdef`` for the lane at ``path`` (its index at each level): the same body on a stack
        of its own, so concurrent lanes share nothing.  ``walk0_g1`` is lane 1's, ``walk0_g1_0`` lane 0's
        inside it."""
        key = (fdef, path)
        if key not in self.copies:
            name = f"{fdef.name}_g{'_'.join(map(str, path))}"
            params = tuple(Var(f"{name}_{p.name[len(fdef.name) + 1:]}") for p in fdef.params)
            copy = FunctionDef(name, params, fdef.result_shape, fdef.dtype, frame_size=fdef.frame_size,
                               max_depth=fdef.max_depth, unrolled_from=fdef.unrolled_from or fdef.name)
            copy.stack = Buffer(f"stack_{name}", 0, fdef.stack.dtype, "stack")
            copy.base, copy.ret = Var(f"{name}_base"), Var(f"{name}_ret")
            subst = {id(p): q for p, q in zip(fdef.params, params)}
            subst.update({id(fdef.base): copy.base, id(fdef.ret): copy.ret})
            copy.body = _Cloner(subst, functions={fdef: copy}, buffers={fdef.stack: copy.stack}).block(fdef.body)
            self.copies[key] = copy
        return self.copies[key]

    def rewrite(self, block: StmtBlock) -> None:
        """Replace outside calls in ``block`` (and the blocks nested in it) by their unrolled form."""
        items = []
        for item in block.items:
            if isinstance(item, Call):
                unrolled = self.unroll_call(item)
                if unrolled is not None:
                    items.extend(unrolled)
                    self.changed += 1
                    continue
            elif isinstance(item, NestedUTask) and not isinstance(item, CallGroup):
                for inner in item.blocks():
                    self.rewrite(inner)
            items.append(item)
        block.items = items

    @staticmethod
    def inline(f: FunctionDef, args, ret: Scalar, depth: int, stack=None) -> StmtBlock:
        """``f``'s body for one call: its parameters ``args``, its frame ``depth`` of ``stack`` (default
        ``f.stack``), its result at ``ret``.  Its own calls of ``f`` stay calls of ``f``."""
        subst = {id(p): a for p, a in zip(f.params, args)}
        subst.update({id(f.base): Const(f.root_size + depth * f.frame_size), id(f.ret): ret})
        return _Cloner(subst, buffers={f.stack: stack} if stack is not None else None).block(f.body)

    def unroll_call(self, call: Call):
        """The body of ``call.fn`` inlined for ``call``, its sibling calls grouped; None if none are."""
        f = call.fn
        body = self.inline(f, call.args, _as_offset_scalar(call.result.offset), call.depth)
        if not self.group_siblings(body, f, call.depth + 1, (), f):
            return None
        return body.items

    def group_siblings(self, block: StmtBlock, f: FunctionDef, depth: int, path: tuple, own: FunctionDef) -> bool:
        """Turn each run of independent calls of ``f`` in ``block`` (and nested blocks) into a CallGroup.

        ``block`` is a frame at ``depth - 1`` of the lane at ``path`` (``()``: the outside
        call's), whose stack belongs to ``own``.  A grouped call becomes a lane: the call
        of a copy of ``f`` at the last level, else its body inlined (a frame at ``depth``
        of the copy's stack) with its own siblings grouped again.  Calls left alone call
        ``own``, starting at ``depth`` too: the inlined body is the frame above them.
        """
        grouped, items, run = False, [], []

        def flush():
            nonlocal grouped
            if len(run) > 1 and self.independent(run):
                lanes, copies = [], []
                for k, c in enumerate(run):
                    g = self.copy_of(f, path + (k,))
                    root = TensorRef(g.stack, f.result_shape, Offset(None, 0))
                    if len(path) + 1 < self.depth:   # unroll this call too: its body, in a frame of g's stack
                        body = self.inline(f, c.args, Const(0), depth, g.stack)
                        self.group_siblings(body, f, depth + 1, path + (k,), g)
                        lanes.append(Lane(body, g, depth))
                    else:
                        lanes.append(Lane(StmtBlock([Call(g, c.args, root, depth)])))
                    copies.append(copy_operator(c.result, root, f"result of {g.name}", self.program.chunk))
                items.append(CallGroup(StmtBlock(lanes)))
                items.extend(copies)
                grouped = True
            else:
                items.extend(Call(own, c.args, c.result, depth) for c in run)
            run.clear()

        for item in block.items:
            if isinstance(item, Call) and item.fn is f:
                run.append(item)
                continue
            flush()
            if isinstance(item, NestedUTask):
                for inner in item.blocks():
                    grouped |= self.group_siblings(inner, f, depth, path, own)
            items.append(item)
        flush()
        block.items = items
        return grouped

    def independent(self, run: list) -> bool:
        """Does no call of ``run`` write what another reads or writes (each copy's own stack aside)?"""
        f = run[0].fn
        body = []   # what the function's body touches, whichever call runs it
        for s in walk(f.body):
            if isinstance(s, UOperator):
                body += list(op_accesses(s))
            elif isinstance(s, Branch):
                body += list(scalar_accesses(s.pred))
            elif isinstance(s, Loop):
                body += list(scalar_accesses(s.trip)) + list(scalar_accesses(s.cond))
            elif isinstance(s, Call):
                body += [a for x in s.args for a in scalar_accesses(x)]
        body = [a for a in body if a.buffer is not f.stack]   # each copy gets a stack of its own
        touched = []
        for c in run:
            acc = body + [a for x in c.args for a in scalar_accesses(x)]
            acc += list(accesses(c.result, None, True))   # the slot its result is copied to, afterwards
            touched.append(acc)
        return not any(_overlap(a, b) for i in range(len(run)) for j in range(i + 1, len(run))
                       for a in touched[i] for b in touched[j])


def unroll_recursion(program, depth: int = 1) -> PassResult:
    """Unroll each outside call of a recursive function ``depth`` levels; sibling calls run on disjoint block
    groups, and below the first level their own siblings on disjoint parts of their group (nested groups).

    ``changed``: the calls unrolled (a call whose body has no two independent
    sibling calls is left as it was).  The new program has a copy of the function
    per lane (and its stack buffer); the original stays for its other callers.
    """
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"unroll_recursion: depth must be an int >= 1, got {depth!r}")
    copy = _rebuild(program).program
    unroll = _RecursionUnroll(copy, depth)
    unroll.rewrite(copy.body)
    if not unroll.changed:
        return PassResult(program, 0)
    copies = list(unroll.copies.values())
    return PassResult(dataclasses.replace(copy, functions=copy.functions + copies,
                                          buffers=copy.buffers + [g.stack for g in copies]), unroll.changed)
