"""Generated persistent kernels compile for a real GPU (sm_90), checked without one.

The simulator runs generated source as Python, so it would accept code numba.cuda
cannot compile (a Python object in device code, an untyped global).  This traces
example programs covering every construct the code generator emits - a for loop
over a device trip count, a while loop, branches, non-inlined function uTasks (nested,
and sharing shared-memory uTasks with the kernel),
recursion through the shared-memory frame stack (with for and while loops inside
the recursive function, holding the call or not), recursion unroll's block groups
(nested two levels deep) with their group barriers, row reductions and softmaxes of several shapes in one kernel,
an LSTM - and compiles each generated kernel to PTX with the argument types it is launched with.
The paper's models (NASRNN, Attention, Seq2seq, BlockDrop, SkipNet) sit above this package, so
they hand their programs to the check (``run(more=...)``) from ``pyflow/models/compile_check.py``,
which runs everything:

    pip install -e ".[ptx]"
    PYFLOW_CUDA=gpu python -m pyflow.models.compile_check [LABEL ...]        # these examples and the models'
    PYFLOW_CUDA=gpu python -m pyflow.cocktailer.compile_check [LABEL ...]    # these examples only

It prints one line per kernel (only the named examples, if labels are given) and
exits 1 if any fails.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

import pyflow.cocktailer as ck
from pyflow.cocktailer.executor import Options
from pyflow.cocktailer.names import kernel_name
from pyflow.cocktailer.optimize_recursion import unroll_recursion
from pyflow.cocktailer.uprogram import CompiledUProgram
from pyflow.framework.creation import zeros
from pyflow.framework.movement import cat
from pyflow.kernels import backend

__all__ = ["examples", "compile_example", "run"]


def _rnn(h0, xs, w, b):
    return ck.for_loop(xs.shape[0], lambda t, h: (h @ w.T + b + xs[t]).tanh(), h0)


def _control(h0, w, b, trips, flags, one):
    @ck.function
    def cell(h):
        return (h @ w.T + b).tanh().softmax(-1)

    def body(i, h):
        h = ck.cond(flags[i].item(), lambda h: cell(h), lambda h: (h - b).relu(), h)
        h, _ = ck.while_loop(lambda h, n: n[0].item() < 2, lambda h, n: (h * h, n + one),
                             h, zeros(1), max_iters=8)
        return h.maximum(h.tanh())

    return ck.for_loop(trips[0].item(), body, h0)


def _tree(left, right, is_leaf, values, w, b):
    @ck.function(returns=ck.spec(4))
    def rae(node):
        return ck.cond(is_leaf[node].item(), lambda: values[node].clone(),
                       lambda: (cat([rae(left[node].item()), rae(right[node].item())]) @ w.T + b).tanh())

    return rae(0)


def _shared_utasks(x, w, b):
    """The kernel, two calls of a fenced function and the function nested in it all call the softmax and the
    tiled linear (uTasks owning shared arrays): each device function must reach copies of its own."""
    @ck.function
    def head(h):
        return (h @ w.T + b).softmax(-1)

    @ck.function
    def cell(h):
        return head((h @ w.T + b).tanh())

    h = (x @ w.T + b).softmax(-1)
    h = cell(h)
    return cell(h), h.sum(-1)


def _loops_tree(kids, nkids, values, w, b, one):
    """Loops inside a recursive function: a for loop holding the call (trip count read on the device), a while
    loop holding it, a while loop without one."""
    @ck.function(returns=ck.spec(4))
    def walk(node):
        def inner():
            total = ck.for_loop(nkids[node].item(), lambda i, acc: acc + walk(kids[node * 3 + i].item()),
                                zeros(4))
            again, _ = ck.while_loop(lambda h, n: n[0].item() < 1,
                                     lambda h, n: (h + walk(kids[node * 3].item()), n + one),
                                     total, zeros(1), max_iters=2)
            return ck.while_loop(lambda h: (h * h).reshape(1, 4).sum(-1).item() > 1.0,
                                 lambda h: (h @ w.T + b).tanh(), again, max_iters=8)

        return ck.cond(nkids[node].item().eq(0), lambda: values[node].clone(), inner)

    return walk(0)


def _lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    def step(t, h, c, out):
        h, c = ck.lstm_cell(x[t] @ w_ih.T + b_ih, h @ w_hh.T + b_hh, c)
        return h, c, ck.update(out, t, h)

    return ck.for_loop(x.shape[0], step, h0, c0, zeros(x.shape[0], *h0.shape))[2]


def _row_ops(x, y):
    """Two softmaxes of different widths and a sum: row uTasks reaching one reduction tree three ways."""
    return x.softmax(-1), y.softmax(-1), x.softmax(-1).sum(-1)


def examples():
    """(label, program, inline) for each example."""
    i64 = "int64"
    yield "rnn", ck.trace(_rnn, ck.spec(2, 8), ck.spec(3, 2, 8), ck.spec(8, 8), ck.spec(8), tile=16), True
    control = ck.trace(_control, ck.spec(2, 8), ck.spec(8, 8), ck.spec(8), ck.spec(1, dtype=i64),
                       ck.spec(4, dtype=i64), ck.spec(1))
    yield "control_flow", control, True
    yield "control_flow_not_inlined", control, False
    tree = ck.trace(_tree, ck.spec(7, dtype=i64), ck.spec(7, dtype=i64), ck.spec(7, dtype=i64),
                    ck.spec(7, 4), ck.spec(4, 8), ck.spec(4))
    # a non-inlined function calling a shared-memory uTask the kernel calls too defined its shared array twice
    # (ERROR_INVALID_IR) until each device function called private copies (regression example)
    yield "functions_share_utasks_not_inlined", ck.trace(_shared_utasks, ck.spec(2, 8), ck.spec(8, 8), ck.spec(8),
                                                         tile=4), False
    yield "recursion", tree, True
    yield "recursion_with_loops", ck.trace(_loops_tree, ck.spec(21, dtype=i64), ck.spec(7, dtype=i64),
                                           ck.spec(7, 4), ck.spec(4, 4), ck.spec(4), ck.spec(1)), True
    yield "recursion_unrolled", unroll_recursion(tree).program, True
    # two levels: a lane inlined, block groups split inside block groups, a failed flag per group (deeper
    # levels repeat the same code; three take the check 40 s longer)
    yield "recursion_unrolled_2_levels", unroll_recursion(tree, 2).program, True
    # a device function with a shared array reached along two paths is defined twice (ERROR_INVALID_IR):
    # reduce.py's block_reduce owned one until the row uTasks declared theirs (regression example)
    yield "row_ops", ck.trace(_row_ops, ck.spec(2, 8), ck.spec(3, 5)), True
    yield "lstm_float64", ck.trace(_lstm, ck.spec(3, 2, 4, dtype="float64"), ck.spec(2, 5, dtype="float64"),
                                   ck.spec(2, 5, dtype="float64"), ck.spec(20, 4, dtype="float64"),
                                   ck.spec(20, 5, dtype="float64"), ck.spec(20, dtype="float64"),
                                   ck.spec(20, dtype="float64")), True


def argtypes(compiled: CompiledUProgram):
    """The numba types the kernel is launched with: flat C arrays, the status word, int64 loop vars."""
    from numba import types

    from pyflow.kernels.compile_check import array

    buffers = compiled.writer.buffers
    return tuple([array(np.dtype(buffers[n].dtype)) for n in compiled.buffer_names] + [array("int64")]
                 + [types.int64] * len(compiled.free_vars))


def compile_example(program, inline: bool) -> str:
    """Compile ``program``'s generated kernel to PTX (raises if NVVM rejects it); a one-line summary."""
    from pyflow.kernels.compile_check import CC

    compiled = CompiledUProgram(kernel_name(program.name, "uprogram"), program.body, program, Options(inline=inline))
    backend.cuda.compile_ptx(compiled.kernel.py_func, argtypes(compiled), cc=CC)
    return f"{compiled.barrier_sites} grid barriers in the source"


def run(only=None, more=()) -> int:
    """Compile every example and those in ``more`` (label, program, inline), or those labelled in ``only``:
    0 if all compiled, 1 if not, 2 if it cannot check."""
    if not backend.is_gpu():
        print("the PTX check needs the real CUDA target: run with PYFLOW_CUDA=gpu", file=sys.stderr)
        return 2
    from pyflow.kernels.compile_check import pretend_sm90, report

    pretend_sm90()
    chosen = [(label, program, inline) for label, program, inline in itertools.chain(examples(), more)
              if not only or label in only]
    unknown = set(only or ()) - {label for label, _, _ in chosen}
    if unknown:
        print(f"no such example: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    return report(((label, lambda p=program, i=inline: compile_example(p, i)) for label, program, inline in chosen),
                  "generated kernels compiled")


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
