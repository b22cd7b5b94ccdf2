"""The act of a view task: a layout over its input's memory, no VM instruction (``act.py``'s table).

A Plan's view task makes no copy: its regst is an alias of its input's (``task_graph.py``), and its act gives
the view of this call's input tensor: the view op's layout rule and attrs over this rank's piece, its strides
included (a split piece views its own rows; a view of a view needs no copy), or, for a view made by no op,
the layout the trace recorded.  Where the input persists across calls (a planned regst's memory, a variable)
the view made at one act serves the later ones (``_reusing_views``).
"""

from __future__ import annotations

from pyflow.errors import ShapeError
from pyflow.framework.interpreter import apply
from pyflow.framework.op_registry import get_op

__all__ = ["make_view_act", "made_by_view", "viewing_act"]

_LAYOUTS_KEPT = 64   # layouts of one task's input remembered (cleared when full: a cache)


def make_view_act(plan, task, attrs: dict):
    """``task``'s act ``(ins, outs, j, call) -> [the view]`` (``task`` a view task, ``attrs`` its op's attrs)."""
    persists = _persists(plan, task.consumed["in_0"][0])
    if "_op" in attrs:
        return _reusing_views(_view_op_act(get_op(attrs["_op"]).view, attrs["_op_attrs"]), persists)
    # A view made by no op: the recorded layout, relative to a contiguous input (``_perm``: a permutation
    # of a split piece's own dims); an input that is itself a strided view is read contiguously first.
    of_view = made_by_view(plan, task.consumed["in_0"][0])

    def view(ins, outs, j, call):
        x = ins["in_0"]
        if of_view and not x.is_contiguous():
            (x,) = apply("contiguous", [x])
        if "_perm" in attrs:
            return [x.permute(*attrs["_perm"])]
        return [x._view(attrs["shape"], attrs["strides"], x._blob.offset + attrs["offset"])]   # relative
    return _reusing_views(view, persists)


def viewing_act(act, plan, chains: list):
    """``act`` (a task's, ``act.make_act``) that first makes the views its inputs came through in ``plan``: per
    ``(key, [view task ids])`` of ``chains`` (``fold.fold_views``), input ``key`` is the views' root, and each
    view task's act, in order, views it as that task's actor would have."""
    made = [(key, [make_view_act(plan, plan.tasks[v], plan.op_attrs[plan.tasks[v].op_name][2]) for v in views])
            for key, views in chains]

    def act_with_views(ins, outs, j, call):
        for key, views in made:
            x = ins[key]
            for view in views:
                (x,) = view({"in_0": x}, (), j, call)
            ins[key] = x
        return act(ins, outs, j, call)
    return act_with_views


def _view_op_act(layout, op_attrs: dict):
    """The act of a view op's task: the op's layout rule (``OpDef.view``) with its attrs over the input
    piece's own layout, as the global interpreter views each rank's piece (the attrs are the same on every
    piece: a reshape keeps a split dim as -1, a narrow or an index never cuts it), and as eager views a
    view (a permute of a permute: no copy).  Where the rule cannot view the piece's strides (a reshape of
    dims not contiguous with each other) it views the piece's elements laid out contiguously, as eager's
    reshape copies.  The rule is a function of the piece's layout, which the Plan fixes: it is asked once
    per layout (``seen``), not at every act."""
    seen: dict = {}   # (shape, strides, offset) of the input piece -> the view's layout, or None: not viewable

    def layout_of(blob):
        key = (blob.shape, blob.strides, blob.offset)
        if key not in seen:
            if len(seen) > _LAYOUTS_KEPT:
                seen.clear()
            try:
                seen[key] = layout(tuple(blob.shape), tuple(blob.strides), blob.offset, op_attrs)
            except ShapeError:
                seen[key] = None
        return seen[key]

    def view(ins, outs, j, call):
        x = ins["in_0"]
        found = layout_of(x._blob)
        if found is None:
            (x,) = apply("contiguous", [x])
            found = layout_of(x._blob)
            if found is None:   # (not even contiguous: the rule's own error)
                layout(tuple(x._blob.shape), tuple(x._blob.strides), x._blob.offset, op_attrs)
        return [x._view(*found)]
    return view


_VIEWS_KEPT = 8   # views of one task's inputs kept for reuse (one per copy of a regst, a few at most)


def _reusing_views(view_act, persists: bool):
    """A view task's act ``view_act`` that gives the view it made before when its input is that same tensor, with
    the same layout, again (``persists``: the input is a planned regst's memory or a variable, the same tensors at
    every call; a call's input is not kept).  The view is a layout over memory the input holds, so the same view
    serves every call, as an eager loop reuses ``w.t()`` made once: no Tensor made per act, and its kernels'
    arrays, made once per blob (``EagerBlobObject.array``), are not made again on the VM's worker at every call.
    A view that had to copy its input (``contiguous``) is made again at every act: its copy is new each time."""
    if not persists:
        return view_act
    kept: dict = {}   # the input's blob -> (the input, its layout, the view)

    def view(ins, outs, j, call):
        x = ins["in_0"]
        blob = x._blob
        layout = (blob.shape, blob.strides, blob.offset)
        found = kept.get(blob)
        if found is not None and found[0] is x and found[1] == layout:
            return [found[2]]
        (made,) = view_act(ins, outs, j, call)
        if made._blob.storage is blob.storage:   # a view, no copy
            if len(kept) >= _VIEWS_KEPT:
                kept.clear()
            kept[blob] = (x, layout, made)
        return [made]
    return view


def _persists(plan, regst_id: int) -> bool:
    """Is regst ``regst_id`` (or the regst it is an alias of) the Plan's own memory or a variable: the same
    tensors at every call?"""
    regst = plan.regsts[regst_id]
    while regst.mem == "alias" and regst.alias_of is not None:
        regst = plan.regsts[regst.alias_of]
    return regst.mem in ("planned", "variable")


def made_by_view(plan, regst_id: int) -> bool:
    """Is regst ``regst_id`` a view's output, or an alias passed on from one (a repeat of a view)?"""
    regst = plan.regsts[regst_id]
    while True:
        if plan.tasks[regst.producer].op_type == "view":
            return True
        if regst.mem != "alias" or regst.alias_of is None:
            return False
        regst = plan.regsts[regst.alias_of]
