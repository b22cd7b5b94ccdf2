"""The compiled tier for kernels without grid barriers: each block's control flow as compiled code.

A kernel whose barriers are all ``syncthreads`` needs no block to wait for another,
so its blocks can run one after another, each through the kernel's own control
flow, the way MCUDA writes it: every node of ``fission.split`` becomes a loop over
the block's threads (``cu_all_K``), and the ``if``/``while``/``for`` around barriers
stay ``if``/``while``/``for``, taken by the whole block::

    kernel                          cu_block (one block)
    ------                          --------------------
    s[t] = x[i]                     cu_all_0: every thread: s[t] = x[i]
    syncthreads()
    while d < n:                    while True:
                                        cu_all_1: every thread evaluates d < n; they must agree
        ...                             if not that: break
        syncthreads()                   cu_all_2: every thread runs the body's region ...

A kernel without barriers is one region: ``cu_launch`` runs it for every thread of
every block, written inside the loop over a block's threads (``cu_threads_K``) when no
thread can return early, else called once per thread.  When that region is a 1-D
grid-stride loop whose turns share nothing (an elementwise kernel), a 1-D launch runs
the loop's turns of all threads together, element after element (``cu_stride_K``):
one counted loop LLVM vectorizes, where a thread at a time entered and left its own
loop for an element or two (``x.relu()`` on 1M floats: 3.9-4.5 ms -> 1.0-1.2 ms).

Everything is numba-compiled, so a barrier costs a loop over the threads and not a
trip through Python; ``scopes.Machine`` (the Python driver) stays for kernels with
grid or group barriers, where the whole grid must reach a barrier before any block
goes on.

Each ``cu_all_K`` returns ``(code, value)``: ``code`` is ``OK``, ``DIVERGENT`` (threads
of the block disagree: reported in ``cu_report``) or ``CANCELLED``; ``value`` is the
block's status after a region (fell through, broke, continued; -1 when no thread is
left) or its test's value.  ``cu_bounds_K`` returns the range of a ``for`` around
barriers, on which every thread must agree too.
"""

from __future__ import annotations

import ast
import contextlib

from .cpu_runtime import ELEMENT
from .fission import BarrierNode, BranchNode, CallNode, Region, _exposed, _names
from .translation import CONTEXT

__all__ = ["write_blockwise", "element_thread"]


def write_blockwise(w) -> None:
    """Add ``cu_all_K`` / ``cu_bounds_K``, ``cu_block`` and ``cu_launch`` to the module ``w`` writes.

    ``w`` is writer._ModuleWriter after ``compile`` and ``step``: ``w.branches`` holds every
    node's code for one thread, ``w.node_params`` the parameters of its ``cu_node_K``.
    """
    out = w.out
    tail = (["cu_alive", "cu_where", "cu_report", "cu_out", "cu_cancel", "cu_gdx", "cu_gdy", "cu_gdz",
             "cu_bdx", "cu_bdy", "cu_bdz"] + list(w.tr.params) + w.storage_names)
    args = ", ".join(tail)
    if len(w.sp.all_nodes) == 1 and isinstance(w.sp.nodes[0], Region):
        _one_region(w, tail)
        return
    kinds = {n.id: _kind(n) for n in w.sp.all_nodes}
    for k in sorted(w.branches):
        _all_threads(w, k, kinds.get(k, "region"), args)
    out(w.inner)
    out(f"def cu_block(cu_b, {args}):")
    with out:
        out('"""Block ``cu_b``: the kernel\'s control flow, each node run by every live thread."""')
        _flow(w, w.sp.nodes, args, in_loop=False)
        out("return cu_rt.OK")
    out()
    stored_params = [p for p in w.tr.params if p in w.var.stored]
    out(w.driver)
    out(f"def cu_launch(cu_b0, cu_b1, {', '.join(t for t in tail if t not in ('cu_alive', 'cu_out'))}):")
    with out:
        out('"""Blocks ``cu_b0`` to ``cu_b1 - 1``, one after another: a launch result code."""')
        _take_constants(w)
        out("cu_alive = np.ones(cu_bdx * cu_bdy * cu_bdz, np.bool_)")
        out("cu_out = np.zeros(3, np.int64)")
        with out.block("for cu_b in range(cu_b0, cu_b1):"):
            with out.block("if cu_rt.cancelled(cu_cancel):"):
                out("return cu_rt.CANCELLED")
            out("cu_alive[:] = True")
            for p in stored_params:   # every thread starts with the arguments the kernel reassigns
                out(f"cu_rt.keep_array_everywhere(v_{p}, {p})" if p in w.arrays else f"v_{p}[:] = {p}")
            out(f"cu_code = cu_block(cu_b, {args})")
            with out.block("if cu_code != cu_rt.OK:"):
                out("return cu_code")
        out("return cu_rt.OK")
    out()


def _take_constants(w) -> None:
    """At the top of ``cu_launch``: the parameters that are tuples of 0s and 1s at this launch (``writer.write_module``'s
    ``constants``) take the module's constants, which LLVM folds into the functions it inlines there."""
    for p in w.constants:
        w.out(f"{p} = cu_const_{p}")


def _one_region(w, tail: list) -> None:
    """A kernel without barriers: ``cu_launch`` runs its one region for every thread of every block.

    Nothing to agree on and nobody to wait for: a thread that returns is simply done.  When no
    thread can return early (the region's only ways out are its end and a cancelled launch), the
    region's code is written inside the loop over a block's threads (``cu_threads_K``) instead of
    called once per thread: numba does not inline a node of any size, and a call passing every
    array, field by field, cost an elementwise kernel 4 times its work per thread.
    """
    out = w.out
    k = w.sp.nodes[0].id
    params = [t for t in tail if t not in ("cu_alive", "cu_out")]
    body = _body_without_exits(w.branches[k])
    loop = _grid_stride(w, body) if body is not None else None
    if body is not None:
        _thread_loop(w, k, body, params)
    if loop is not None:
        _collapsed(w, k, loop, params)
    out(w.driver)
    out(f"def cu_launch(cu_b0, cu_b1, {', '.join(params)}):")
    with out:
        out('"""Blocks ``cu_b0`` to ``cu_b1 - 1``, one after another: a launch result code."""')
        _take_constants(w)
        out("cu_nt = cu_bdx * cu_bdy * cu_bdz")
        out("cu_sb = 0")
        out(f"cu_where[3] = {k}")
        if loop is not None:   # a 1-D launch: one element after another (a 2-D block repeats grid(1)'s values)
            with out.block("if cu_bdy == 1 and cu_bdz == 1 and cu_gdy == 1 and cu_gdz == 1:"):
                out("cu_where[1] = cu_rt.ELEMENT   # cu_where[2]: an element; element_thread finds its thread")
                with out.block(f"if cu_stride_{k}(cu_b0, cu_b1, {', '.join(params)}) == cu_rt.STOPPED:"):
                    out("return cu_rt.CANCELLED")
                out("return cu_rt.OK")
        with out.block("for cu_b in range(cu_b0, cu_b1):"):
            with out.block("if cu_rt.cancelled(cu_cancel):"):
                out("return cu_rt.CANCELLED")
            out("cu_where[0] += 1   # progress, for the hang watchdog")
            out("cu_where[1] = cu_b")
            if body is not None:
                with out.block(f"if cu_threads_{k}(cu_b, {', '.join(params)}) == cu_rt.STOPPED:"):
                    out("return cu_rt.CANCELLED")
            else:
                _block_coordinates(out)
                out("cu_t = -1")
                with _each_thread(out):
                    out("cu_where[2] = cu_t   # where an exception happens; progress too")
                    out(f"cu_r = cu_node_{k}({', '.join(w.node_params[k])})")
                    with out.block("if cu_r == cu_rt.STOPPED:"):
                        out("return cu_rt.CANCELLED")
        out("return cu_rt.OK")
    out()


# cuda.grid(1) and cuda.gridsize(1) as translate.py writes them
_GRID_START, _GRID_STEP = "cu_bx * cu_bdx + cu_tx", "cu_gdx * cu_bdx"
_CANCEL_CHECK = "if cu_rt.cancelled(cu_cancel):\n    return cu_rt.STOPPED"
_CHUNK = 65536   # elements between two looks at the cancel flag


def _grid_stride(w, body: list):
    """``(prefix, i, bound, turn)`` if region code ``body`` (no early exits) is ``prefix; i = cuda.grid(1);
    while i < bound: turn; i += cuda.gridsize(1)`` and the turns share nothing: no shared or local memory,
    atomics or fences, no block or thread number read but through ``i``, no variable a turn reads
    before it sets it, ``i`` and ``bound`` unchanged by a turn, no break or continue.  Then a thread's
    turns may run in any order among the other threads' turns: element after element.  Else None."""
    if w.tr.storage or not w.tr.blocks_independent:
        return None
    stmts = ast.parse("\n".join(body)).body
    if len(stmts) < 2:
        return None
    *prefix, start, loop = stmts
    if not (isinstance(start, ast.Assign) and len(start.targets) == 1 and isinstance(start.targets[0], ast.Name)
            and ast.unparse(start.value) == _GRID_START and isinstance(loop, ast.While) and not loop.orelse):
        return None
    i, test = start.targets[0].id, loop.test
    if not (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == i
            and len(test.ops) == 1 and isinstance(test.ops[0], ast.Lt)):
        return None
    *turn, step = loop.body
    if not (isinstance(step, ast.AugAssign) and isinstance(step.op, ast.Add) and isinstance(step.target, ast.Name)
            and step.target.id == i and ast.unparse(step.value) == _GRID_STEP):
        return None
    if turn and ast.unparse(turn[0]) == _CANCEL_CHECK:   # StatusRewriter's: asked once per chunk instead
        turn = turn[1:]
    assigned = set().union(*(_names(s, ast.Store) for s in turn))
    reads = set().union(*(_names(s) for s in prefix + turn))
    if (not turn or i in assigned or _exposed(turn, set())[0] & assigned or _names(test.comparators[0]) & assigned
            or (reads | _names(test)) & set(CONTEXT)
            or any(isinstance(n, (ast.Break, ast.Continue)) for s in turn for n in ast.walk(s))):
        return None
    return prefix, i, test.comparators[0], turn


def _collapsed(w, k: int, loop: tuple, params: list) -> None:
    """``cu_stride_K``: the grid-stride loop of region K, its turns for blocks ``cu_b0`` to ``cu_b1 - 1``
    together, element after element (``_grid_stride``).  A range of blocks gets its share of the
    elements (every element is some thread's: which core runs it does not matter).  The element is
    kept in ``cu_where[2]`` (LLVM moves the store out of the loop), and named by ``element_thread``."""
    prefix, i, bound, turn = loop
    out = w.out
    out(w.inner)
    out(f"def cu_stride_{k}(cu_b0, cu_b1, {', '.join(params)}):")
    with out:
        out(f'"""{w.branches[k][0].lstrip("# ")}: the grid-stride loop, element after element."""')
        for line in ast.unparse(ast.Module(body=prefix, type_ignores=[])).splitlines():
            out(line)
        out(f"cu_stop = {ast.unparse(bound)}")
        out(f"cu_chunks = (cu_stop + {_CHUNK - 1}) // {_CHUNK}")
        with out.block("for cu_m in range(cu_chunks * cu_b0 // cu_gdx, cu_chunks * cu_b1 // cu_gdx):"):
            with out.block("if cu_rt.cancelled(cu_cancel):"):
                out("return cu_rt.STOPPED")
            out("cu_where[0] += 1   # progress, for the hang watchdog")
            out("cu_k = cu_m & 0x3FFFFFFFFFFF   # not negative, as LLVM can tell: the index checks fold")
            with out.block(f"for cu_j in range(min({_CHUNK}, cu_stop - cu_k * {_CHUNK})):"):
                out(f"{i} = cu_k * {_CHUNK} + cu_j")
                out(f"cu_where[2] = {i}")
                for line in ast.unparse(ast.Module(body=turn, type_ignores=[])).splitlines():
                    out(line)
        out("return cu_rt.FELL_THROUGH")
    out()


def element_thread(where, grid, block) -> tuple:
    """(block, thread) numbers ``where`` names: ``where[1:3]``, or, after a collapsed grid-stride loop
    (``where[1] == ELEMENT``), the thread whose turn element ``where[2]`` is (element mod the grid's size).

    >>> element_thread([5, -2, 1000, 0], (4, 1, 1), (32, 1, 1))
    (3, 8)
    """
    if where[1] != ELEMENT:
        return where[1], where[2]
    thread = where[2] % (grid[0] * block[0])
    return thread // block[0], thread % block[0]


def _body_without_exits(lines: list):
    """A region's code for one thread (``writer.region``) without its final ``return``, or None if a
    thread can leave it otherwise than by its end or a cancelled launch (a kernel's ``return``)."""
    exits = {ast.unparse(n.value) for n in ast.walk(ast.parse("\n".join(lines[1:]))) if isinstance(n, ast.Return)}
    if lines[-1] != "return cu_rt.FELL_THROUGH" or exits - {"cu_rt.FELL_THROUGH", "cu_rt.STOPPED"}:
        return None
    return lines[1:-1]


def _thread_loop(w, k: int, body: list, params: list) -> None:
    """``cu_threads_K``: region K's code for every thread of block ``cu_b``, in the loop; STOPPED if cancelled."""
    out = w.out
    out(w.inner)
    out(f"def cu_threads_{k}(cu_b, {', '.join(params)}):")
    with out:
        out(f'"""{w.branches[k][0].lstrip("# ")}, for every thread of block cu_b (no thread exits early)."""')
        out("cu_sb = 0")
        _block_coordinates(out)
        out("cu_t = -1")
        with _each_thread(out):
            out("cu_where[2] = cu_t   # where an exception happens; progress too")
            for line in body:
                out(line)
        out("return cu_rt.FELL_THROUGH")
    out()


def _block_coordinates(out) -> None:
    """``cu_bx``, ``cu_by``, ``cu_bz``: block ``cu_b``'s coordinates in the grid (blockIdx)."""
    out("cu_bx = cu_b % cu_gdx")
    out("cu_by = cu_b // cu_gdx % cu_gdy")
    out("cu_bz = cu_b // (cu_gdx * cu_gdy)")


@contextlib.contextmanager
def _each_thread(out):
    """The loops over a block's threads (``cu_t``: the thread's number in the block, ``cu_g`` its slot).

    Three loops, not one divided up: two divisions per thread cost more than many nodes' work.
    """
    for line in ("for cu_tz in range(cu_bdz):", "for cu_ty in range(cu_bdy):", "for cu_tx in range(cu_bdx):"):
        out(line)
        out.level += 1
    out("cu_t += 1")
    out("cu_g = cu_t")
    yield
    out.level -= 3


def _kind(node) -> str:
    if isinstance(node, BranchNode):
        return "bounds" if node.kind == "for" else "test"
    if isinstance(node, BarrierNode):
        return "group"
    return "region"


def _all_threads(w, k: int, kind: str, args: str) -> None:
    """``cu_all_K`` (or ``cu_bounds_K``): node K for every live thread of block ``cu_b``.

    A region no thread can leave but by its end (or a cancelled launch) is written here, in the
    loop, instead of called per thread (see ``_one_region``): nothing to check after it."""
    out = w.out
    name = "cu_bounds" if kind == "bounds" else "cu_all"
    at_loop_end = any(isinstance(n, Region) and n.id == k and n.at_loop_end for n in w.sp.all_nodes)
    body = _body_without_exits(w.branches[k]) if kind == "region" else None
    out(w.inner)
    out(f"def {name}_{k}(cu_it, cu_b, {args}):")
    with out:
        out(f'"""{w.branches[k][0].lstrip("# ")}, for every live thread of block cu_b."""')
        out("cu_nt = cu_bdx * cu_bdy * cu_bdz")
        _block_coordinates(out)
        out("cu_sb = 0")
        out("cu_first = -1")
        out("cu_lo = cu_hi = cu_st = 0")
        out("cu_t = -1")
        out("cu_where[1] = cu_b")
        out(f"cu_where[3] = {k}")
        with _each_thread(out):
            with out.block("if not cu_alive[cu_g]:"):
                out("continue")
            out("cu_where[0] += 1   # progress, for the hang watchdog")
            out("cu_where[2] = cu_t   # where an exception happens")
            if body is not None:   # the region's code here: its only status is FELL_THROUGH
                for line in body:
                    stop = line.strip() == "return cu_rt.STOPPED"
                    out(line.replace("cu_rt.STOPPED", "cu_rt.CANCELLED, 0") if stop else line)
                out("cu_first = cu_rt.FELL_THROUGH")
            else:
                out(f"cu_r = cu_node_{k}({', '.join(w.node_params[k])})")
                if kind == "region":
                    with out.block("if cu_r == cu_rt.EXITED:"):
                        out("cu_alive[cu_g] = False")
                        out("continue")
                    with out.block("if cu_r == cu_rt.STOPPED:"):
                        out("return cu_rt.CANCELLED, 0")
                if kind == "bounds":
                    with out.block("if cu_first == -1:"):
                        out("cu_first = 0")
                        out("cu_lo, cu_hi, cu_st = cu_out[0], cu_out[1], cu_out[2]")
                    with out.block("elif cu_lo != cu_out[0] or cu_hi != cu_out[1] or cu_st != cu_out[2]:"):
                        _diverge(out, k, "cu_rt.DIVERGENT, 0, 0, 0, False")
                else:
                    with out.block("if cu_first == -1:"):
                        out("cu_first = cu_r")
                    with out.block("elif cu_first != cu_r:"):
                        if at_loop_end:   # at the end of a loop body, continue is falling through
                            with out.block("if (cu_first == cu_rt.FELL_THROUGH or cu_first == cu_rt.CONTINUED) "
                                           "and (cu_r == cu_rt.FELL_THROUGH or cu_r == cu_rt.CONTINUED):"):
                                out("cu_first = cu_rt.CONTINUED")
                                out("continue")
                        _diverge(out, k, "cu_rt.DIVERGENT, 0")
        if kind == "bounds":
            out("return cu_rt.OK, cu_lo, cu_hi, cu_st, cu_first == 0")
        else:
            out("return cu_rt.OK, cu_first")
    out()


def _diverge(out, k: int, result: str) -> None:
    out(f"cu_report[0] = cu_rt.DIVERGENT; cu_report[1] = cu_b; cu_report[2] = cu_t; cu_report[3] = {k}")
    out(f"return {result}")


def _flow(w, nodes: list, args: str, in_loop: bool) -> None:
    """The structured control flow of ``nodes`` inside ``cu_block``."""
    out = w.out
    for node in nodes:
        if isinstance(node, CallNode):   # a device function with barriers: its nodes, here
            _flow(w, w.sp.units[node.unit], args, in_loop)
        elif isinstance(node, BarrierNode):
            continue   # a block barrier: the next node starts after every thread ran this one
        elif isinstance(node, Region):
            _region(out, node.id, "0", args, in_loop)
        elif node.kind == "if":
            _value(out, node.id, args)
            with out.block("if cu_v == 1:"):
                _flow(w, node.body, args, in_loop)
                out("pass")
            if node.orelse:
                with out.block("else:"):
                    _flow(w, node.orelse, args, in_loop)
        elif node.kind == "while":
            with out.block("while True:"):
                with out.block("if cu_rt.cancelled(cu_cancel):"):
                    out("return cu_rt.CANCELLED")
                _value(out, node.id, args)
                with out.block("if cu_v != 1:"):
                    out("break")
                _flow(w, node.body, args, in_loop=True)
        else:
            counter = f"cu_i{node.id}"
            out(f"cu_code, cu_from{node.id}, cu_to{node.id}, cu_step{node.id}, cu_any = cu_bounds_{node.id}(0, cu_b, {args})")
            with out.block("if cu_code != cu_rt.OK:"):
                out("return cu_code")
            with out.block("if not cu_any:"):
                out("return cu_rt.OK")
            with out.block(f"if cu_step{node.id} == 0:"):
                out('raise ValueError("range() arg 3 must not be zero (a for loop around a barrier)")')
            with out.block(f"for {counter} in range(cu_from{node.id}, cu_to{node.id}, cu_step{node.id}):"):
                with out.block("if cu_rt.cancelled(cu_cancel):"):
                    out("return cu_rt.CANCELLED")
                if node.id in w.assigns:   # the loop variable, stored for every thread
                    _region(out, w.assigns[node.id], counter, args, in_loop=True)
                _flow(w, node.body, args, in_loop=True)


def _region(out, k: int, it: str, args: str, in_loop: bool) -> None:
    out(f"cu_code, cu_v = cu_all_{k}({it}, cu_b, {args})")
    with out.block("if cu_code != cu_rt.OK:"):
        out("return cu_code")
    with out.block("if cu_v != cu_rt.FELL_THROUGH:"):
        if in_loop:
            with out.block("if cu_v == cu_rt.BROKE:"):
                out("break")
            with out.block("if cu_v == cu_rt.CONTINUED:"):
                out("continue")
        out("return cu_rt.OK   # no thread of the block is left")


def _value(out, k: int, args: str) -> None:
    out(f"cu_code, cu_v = cu_all_{k}(0, cu_b, {args})")
    with out.block("if cu_code != cu_rt.OK:"):
        out("return cu_code")
    with out.block("if cu_v == -1:"):
        out("return cu_rt.OK   # no thread of the block is left")
