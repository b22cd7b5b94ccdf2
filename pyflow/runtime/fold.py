"""The Runtime's own Plan: view tasks folded into the acts of the tasks that read them.

A view task copies nothing and issues no VM instruction: its regst is an alias of its input's
(``task_graph.py``), and its act only makes a layout over that memory (``view_acts.py``).  As an
actor it still costs what every actor costs per call: its input arrives (a message), it acts, it
sends the view to each consumer, each gives it back, then it gives its input back.  In the
training step of an MLP 784 -> 256 -> 10, 19 of the Plan's 70 tasks are views (a Linear's
``weight.T``, the reshapes of autograd's reductions), about a fifth of the runtime's messages.

``fold_views(plan)`` gives the Runtime a Plan without them (``Runtime(plan, fold=True)``, which
``nn.Graph``'s runtime is; a Runtime made by hand runs every task as an actor unless asked).  Each task that read a view's regst
reads the regst the view was made from (the *root*) and makes the view itself, at its own act,
with the view task's act (``view_acts.viewing_act``), just before its op: the same layout over
the same memory, now without an actor between.  Nothing else changes:

* **back pressure**: the root regst goes back to its producer once every reader is done with
  it.  Before, the view task held its input until every reader had given the view back (an alias
  pins its input, ``actors/base.py``), which is the same moment;
* **memory**: a view's regst has no memory of its own, and the memory plan counts the readers of
  an alias as readers of the root already (``mem_guards.memory_readers``): offsets and guards
  stay as they are;
* **what each task does** is made from the compiler's Plan, as without folding (``act.act_table``):
  a view task left an actor whose input is now a root still gets its input through the views, so
  its act sees the layout it was made for;
* **the compiler's Plan** (``g.plan``, ``print(g.plan)``) keeps every view task: folding is how
  this runtime runs them, as OneFlow's runtime decides on its own how an actor runs its kernels.

A view task folds when it is a plain link: one input, one output (no control regst in or out),
its producer, itself and its readers acting once per piece alike (no gradient-accumulation rate
between them), and every reader an ordinary compute or output task that, unless it folds too,
neither makes an output in the view's memory (an inplace or alias output of it) nor would then read
one root twice.  The rest keep their actors.

>>> import pyflow as flow
>>> class Step(flow.nn.Graph):
...     def build(self, x):
...         return (x.t() * 2).reshape(-1)
>>> g = Step()
>>> g(flow.ones(2, 3)).numpy().tolist()
[2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
>>> folded, chains = fold_views(g.plan)
>>> sorted(t.op_type for t in g.plan.tasks.values() if t.kind == "compute")
['mul', 'view', 'view']
>>> sorted(t.op_type for t in folded.tasks.values() if t.kind == "compute")
['mul']
>>> [[g.plan.tasks[v].op_type for v in chain] for _, chain in chains[folded.task_of("mul_0")[0].task_id]]
[['view']]
"""

from __future__ import annotations

import dataclasses

from pyflow.compiler.task_graph import pieces_per_call

__all__ = ["fold_views"]

_READERS = ("compute", "output")   # task kinds whose act takes its inputs from ``act.make_act`` (a viewing act can)


def fold_views(plan) -> tuple:
    """``(the Plan without its foldable view tasks, chains)``: ``chains[task id]`` is ``[(key, [view task ids])]``,
    the views (in the order they apply, as tasks of ``plan``) that task makes of its input ``key`` at each act.
    A Plan with nothing to fold comes back as it is."""
    tasks, regsts = plan.tasks, plan.regsts
    folded = {tid for tid, task in tasks.items() if _plain_view(plan, task)}
    while True:   # drop the views that cannot fold given the others, until every one left can
        pinning = {tid for tid in folded if _pinned_by_reader(plan, folded, tasks[tid])}
        chains, clashing = _chains(plan, folded - pinning)
        if not pinning and not clashing:
            break
        folded -= pinning | clashing
    if not folded:
        return plan, {}
    new_regsts = {rid: r for rid, r in regsts.items() if r.producer not in folded}
    for rid, r in new_regsts.items():
        readers = list(dict.fromkeys(_readers(plan, folded, rid)))
        if readers != list(r.consumers):
            new_regsts[rid] = dataclasses.replace(r, consumers=readers)
    new_tasks = {tid: t for tid, t in tasks.items() if tid not in folded}
    for tid, chain in chains.items():
        task = new_tasks[tid]
        consumed = dict(task.consumed)
        for key, views in chain:
            consumed[key] = [tasks[views[0]].consumed["in_0"][0]]
        new_tasks[tid] = dataclasses.replace(task, consumed=consumed)
    kept = [tid for tid in plan.order if tid not in folded]
    start, end = plan.loop   # (positions in the order: counted again without the folded tasks)
    loop = (sum(1 for tid in plan.order[:start] if tid not in folded),
            sum(1 for tid in plan.order[:end] if tid not in folded))
    return dataclasses.replace(plan, tasks=new_tasks, regsts=new_regsts, order=kept, loop=loop), chains


def _plain_view(plan, task) -> bool:
    """Could ``task`` fold into its readers (see the module docstring)?"""
    if task.kind != "compute" or plan.op_attrs.get(task.op_name, ("",))[0] != "view":
        return False
    if set(task.consumed) != {"in_0"} or set(task.produced) != {"out_0"} or len(task.consumed["in_0"]) != 1:
        return False
    source, out = plan.regsts[task.consumed["in_0"][0]], plan.regsts[task.produced["out_0"]]
    producer = plan.tasks[source.producer]
    key = next(k for k, rid in producer.produced.items() if rid == source.id)
    rate = task.time_shape[1]
    if out.mem != "alias" or not out.consumers or pieces_per_call(producer, key) != rate:
        return False
    for rid in out.consumers:
        reader = plan.tasks[rid]
        if reader.time_shape[1] != rate or reader.rank != task.rank:
            return False
        if reader.kind not in _READERS:
            return False
    return True


def _pinned_by_reader(plan, folded: set, view) -> bool:
    """Does a reader of ``view`` that keeps its actor make its output in the view's memory (an alias or inplace
    output of it, which pins its input: ``actors/base.py``)?  A view of it that folds too does not count."""
    out = view.produced["out_0"]
    return any(plan.regsts[p].alias_of == out or plan.regsts[p].inplace_of == out
               for reader in plan.regsts[out].consumers if reader not in folded
               for p in plan.tasks[reader].produced.values())


def _chains(plan, folded: set) -> tuple:
    """``(chains, clashing)``: per task that stays and reads a folded view, its chains (``fold_views``); and the
    folded views whose chains end at a root some reader would then read twice."""
    chains, clashing = {}, set()
    for tid, task in plan.tasks.items():
        if tid in folded:
            continue
        mine, roots = [], {}   # roots: root regst id -> the chains (view ids) that reach it, or [] read as it is
        for key, ids in task.consumed.items():
            for rid in ids:
                views = []
                while plan.regsts[rid].producer in folded:
                    view = plan.regsts[rid].producer
                    views.insert(0, view)
                    rid = plan.tasks[view].consumed["in_0"][0]
                roots.setdefault(rid, []).append(views)
                if views:
                    mine.append((key, views))
        for reaching in roots.values():
            if len(reaching) > 1:
                clashing.update(view for views in reaching for view in views)
        if mine:
            chains[tid] = mine
    return chains, clashing


def _readers(plan, folded: set, rid: int) -> list:
    """The tasks that stay and read regst ``rid``, directly or through folded views, in consumer order."""
    found = []
    for consumer in plan.regsts[rid].consumers:
        if consumer in folded:
            found += _readers(plan, folded, plan.tasks[consumer].produced["out_0"])
        else:
            found.append(consumer)
    return found
