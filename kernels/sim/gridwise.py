"""The compiled tier for kernels with grid or group barriers: the launch as nodes run for a scope of blocks.

The writer's last part for such kernels (kernel source -> translate -> fission ->
writer -> compiled), beside ``blockwise.py`` for the others.  A grid barrier needs
every block of the grid there before any goes on, so no block can run its control
flow alone: the control flow is bytecode (``CODE``, written by ``writer.py``) that
``scopes.Machine`` steps through for a *scope* of blocks, and each node it reaches
(a region, a test, a ``for``'s range) runs for every live thread of the scope:

* ``cu_run(cu_op, cu_node, ...)``: node ``cu_node``'s ``cu_node_K`` for every live
  thread of the blocks ``cu_S`` (found by a binary tree of tests), with the check
  that the threads of a block agree on a test's value, a region's status or a
  range (else ``DIVERGENT``, the threaded tier's ``DivergentBarrierError``);
* ``cu_drive``: the whole launch compiled, ``grid_machine.step`` finding the next
  node and ``grid_machine.take`` going on (``scopes.Machine``'s loop, in numba),
  with the grid and group barriers checked between nodes.
"""

from __future__ import annotations

from .fission import Region

__all__ = ["write_gridwise"]


def write_gridwise(w) -> None:
    """Add ``cu_run`` (one node for every live thread of the scope) and ``cu_drive`` to the module ``w`` writes.

    ``w`` is writer._ModuleWriter after ``compile``, ``allocate`` and ``step``: ``w.code`` holds the
    control flow's instructions, ``w.node_params`` the parameters of each ``cu_node_K``,
    ``w.storage_names`` what ``cu_allocate`` returns.  Only what the kernel needs is written: a
    kernel of one region and no test has nothing its threads must agree on, and only a ``for``
    around barriers has a range.
    """
    out = w.out
    params = (["cu_op", "cu_node", "cu_flag", "cu_it", "cu_S", "cu_base", "cu_alive", "cu_where", "cu_report",
               "cu_cancel", "cu_gdx", "cu_gdy", "cu_gdz", "cu_bdx", "cu_bdy", "cu_bdz"]
              + list(w.tr.params) + w.storage_names)
    ops = {op for op, *_ in w.code}
    agree = bool(ops - {"RUN", "END"}) or any(isinstance(n, Region) and n.leaves for n in w.sp.all_nodes)
    out(w.driver)
    out(f"def cu_run({', '.join(params)}):")
    with out:
        out('"""Node ``cu_node`` for every live thread of the blocks ``cu_S``: each block\'s result.')
        out("")
        out("cu_op: 0 a region (RUN, ASSIGN: its status), 1 a test (TEST, GROUP: its value),")
        out('2 a range (FOR_BOUNDS: start, stop, step).  Threads of a block must agree."""')
        out("cu_nt = cu_bdx * cu_bdy * cu_bdz")
        out("cu_out = np.zeros(3, np.int64)")
        out("cu_res = np.full(cu_S.shape[0], -1, np.int64)")
        out("cu_bounds = np.zeros((cu_S.shape[0], 3), np.int64)")
        out("cu_live = np.zeros(cu_S.shape[0], np.bool_)")
        with out.block("for cu_i in range(cu_S.shape[0]):"):
            out("cu_b = cu_S[cu_i]")
            out("cu_bx = cu_b % cu_gdx")
            out("cu_by = cu_b // cu_gdx % cu_gdy")
            out("cu_bz = cu_b // (cu_gdx * cu_gdy)")
            out("cu_sb = cu_b - cu_base")
            out("cu_first = -1")
            out("cu_t = -1")
            # three loops, not one divided up: two divisions per thread cost more than many nodes' work
            out("for cu_tz in range(cu_bdz):")
            out.level += 1
            out("for cu_ty in range(cu_bdy):")
            out.level += 1
            with out.block("for cu_tx in range(cu_bdx):"):
                out("cu_t += 1")
                out("cu_g = cu_sb * cu_nt + cu_t")
                with out.block("if not cu_alive[cu_g]:"):
                    out("continue")
                out("cu_where[0] += 1")
                out("cu_where[1] = cu_b")
                out("cu_where[2] = cu_t")
                out("cu_where[3] = cu_node")
                _dispatch(w, sorted(w.branches))
                with out.block("if cu_op == 0:"):
                    with out.block("if cu_r == cu_rt.EXITED:"):
                        out("cu_alive[cu_g] = False")
                        out("continue")
                    with out.block("if cu_r == cu_rt.STOPPED:"):
                        out("return cu_rt.CANCELLED, cu_res, cu_bounds, cu_live")
                if "FOR_BOUNDS" in ops:
                    _bounds_agreement(out)
                if agree:
                    _value_agreement(out)
                else:   # one region, no test: nothing for the threads to agree on
                    out("cu_first = cu_r")
            out.level -= 2
            out("cu_res[cu_i] = cu_first")
        out("return cu_rt.OK, cu_res, cu_bounds, cu_live")
    out()
    _drive(w, params)


def _drive(w, run_params: list) -> None:
    """``cu_drive``: the whole launch, compiled: ``grid_machine.step`` finds the next node, ``cu_run``
    runs it for the scope's threads, ``grid_machine.take`` goes on (``scopes.Machine``'s loop, in numba).
    Grid and group barriers are checked here: every block at a grid barrier, and no thread gone; each
    group's blocks as many as its members."""
    out = w.out
    state = ["cu_code", "cu_st", "cu_scope", "cu_values", "cu_waiting", "cu_flags", "cu_ranges", "cu_counter"]
    tail = run_params[run_params.index("cu_alive"):]
    out("CODE_OPS = cu_gm.encode(CODE)   # the same instructions, as opcodes for grid_machine")
    out()
    out(w.driver)
    out(f"def cu_drive({', '.join(state + tail)}):")
    with out:
        out('"""The launch: every node the control code reaches, for every live thread of its scope."""')
        out("cu_nt = cu_bdx * cu_bdy * cu_bdz")
        out("cu_none3 = np.zeros((0, 3), np.int64)")
        with out.block("while True:"):
            out(f"cu_op = cu_gm.step({', '.join(state)})")
            with out.block("if cu_op == cu_gm.END:"):
                out("return cu_rt.OK")
            with out.block("if cu_rt.cancelled(cu_cancel):"):
                out("return cu_rt.CANCELLED")
            out("cu_node, cu_flag = cu_code[cu_st[0], 1], cu_code[cu_st[0], 3]")
            out("cu_S = np.flatnonzero(cu_scope)")
            with out.block("if cu_op == cu_gm.GRID:   # grid_machine.check_grid_barrier"):
                out("cu_code_ = cu_gm.check_grid_barrier(cu_S, cu_alive, cu_nt, cu_report, cu_node)")
                with out.block("if cu_code_ != cu_rt.OK:"):
                    out("return cu_code_")
                out(f"cu_gm.take({', '.join(state)}, cu_S, cu_none3, cu_scope)")
                out("continue")
            out("cu_it = cu_counter[cu_st[2] - 1, 0] if cu_op == cu_gm.ASSIGN else 0")
            out("cu_kind = 1 if cu_op == cu_gm.TEST or cu_op == cu_gm.GROUP else (2 if cu_op == cu_gm.FOR_BOUNDS "
                "else 0)")
            args = ", ".join(["cu_kind", "cu_node", "cu_flag", "cu_it", "cu_S", "0"] + tail)
            out(f"cu_code_, cu_res, cu_bounds, cu_lv = cu_run({args})")
            with out.block("if cu_code_ != cu_rt.OK:"):
                out("return cu_code_")
            with out.block("if cu_op == cu_gm.GROUP:"):
                out("cu_code_ = cu_gm.check_group_barrier(cu_S, cu_res, cu_report, cu_node)")
                with out.block("if cu_code_ != cu_rt.OK:"):
                    out("return cu_code_")
            out(f"cu_gm.take({', '.join(state)}, cu_res, cu_bounds, cu_lv)")
    out()


def _dispatch(w, ids: list) -> None:
    """In ``cu_run``: ``cu_r = cu_node_K(...)`` for the node asked for, by a binary tree of tests."""
    out = w.out
    if len(ids) > 8:
        middle = ids[len(ids) // 2]
        with out.block(f"if cu_node < {middle}:"):
            _dispatch(w, ids[:len(ids) // 2])
        with out.block("else:"):
            _dispatch(w, ids[len(ids) // 2:])
        return
    for n, k in enumerate(ids):
        with out.block(f"{'if' if n == 0 else 'elif'} cu_node == {k}:"):
            out(f"cu_r = cu_node_{k}({', '.join(w.node_params[k])})")
    with out.block("else:"):
        out("cu_r = -1")


def _bounds_agreement(out) -> None:
    """A range: the first live thread's, which every other thread of the block must give too."""
    with out.block("if cu_op == 2:"):
        with out.block("if not cu_live[cu_i]:"):
            out("cu_live[cu_i] = True")
            out("cu_bounds[cu_i, 0] = cu_out[0]")
            out("cu_bounds[cu_i, 1] = cu_out[1]")
            out("cu_bounds[cu_i, 2] = cu_out[2]")
        with out.block("elif cu_bounds[cu_i, 0] != cu_out[0] or cu_bounds[cu_i, 1] != cu_out[1] "
                       "or cu_bounds[cu_i, 2] != cu_out[2]:"):
            _diverge(out)
        out("continue")


def _value_agreement(out) -> None:
    """A test's value or a region's status: the first live thread's, which the others must give too."""
    with out.block("if cu_first == -1:"):
        out("cu_first = cu_r")
    with out.block("elif cu_first != cu_r:"):
        with out.block("if cu_flag == 1 and (cu_first == cu_rt.FELL_THROUGH or cu_first == cu_rt.CONTINUED) "
                       "and (cu_r == cu_rt.FELL_THROUGH or cu_r == cu_rt.CONTINUED):"):
            out("cu_first = cu_rt.CONTINUED   # at the end of a loop body, continue is falling through")
            out("continue")
        _diverge(out)


def _diverge(out) -> None:
    out("cu_report[0] = cu_rt.DIVERGENT; cu_report[1] = cu_b; cu_report[2] = cu_t; cu_report[3] = cu_node")
    out("return cu_rt.DIVERGENT, cu_res, cu_bounds, cu_live")
