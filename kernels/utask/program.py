"""A whole loop in one persistent kernel, built from uTasks: what Cocktailer's code generator emits.

This is the simplified RNN of the Cocktailer paper (Fig. 10), written by hand the
way ``pyflow/cocktailer/codegen.py`` generates it:

    h = h_in                                   # CopyUOperator: loop-carried input -> output
    for step in range(steps):                  # the loop runs ON the GPU, in every block
        pre = h @ W.T + b                      # matmul tile uTasks (nn.Linear layout)
        h = tanh(pre + xs[step])               # fused add-tanh elementwise uTasks

Every block runs the same loop (control flow replicated per block); each
operator's uTasks are spread over the blocks by the virtual-block loop
``for u in range(cuda.blockIdx.x, count, cuda.gridDim.x)``, and a grid barrier
separates operators wherever the next one reads what other blocks wrote (all three
here: the matmul reads every element of ``h``).  Rules: the kernel is cooperative
(all blocks co-resident: launch at most ``max_cooperative_grid_blocks`` blocks) and
every thread of every block reaches every grid barrier (loops and uTask counts are
grid-uniform; no thread returns early).
"""

from __future__ import annotations

import functools
import math

from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.utask.elementwise import copy_utask, make_elementwise_utask
from pyflow.kernels.utask.matmul import make_matmul_utask

__all__ = ["add_tanh", "make_rnn_program"]


@jit(device=True)
def add_tanh(x, y):
    """``tanh(x + y)``: the fused add-tanh operator of the RNN cell."""
    return math.tanh(x + y)


@functools.cache
def make_rnn_program(tile: int = 16, dtype="float32"):
    """The kernel ``rnn_program(h, pre, h_in, w, b, xs, batch, hidden, steps, chunk)``.

    ``h``, ``pre``, ``h_in``: (batch, hidden); ``w``: (hidden, hidden), applied as
    ``h @ w.T``; ``b``: (hidden,); ``xs``: (steps, batch, hidden); all flat and
    contiguous.  ``pre`` is scratch.  The result is left in ``h``.
    """
    linear = make_matmul_utask(tile, dtype, transpose_b=True, bias=True)
    fused = make_elementwise_utask(add_tanh).zip
    T = tile

    @jit
    def rnn_program(h, pre, h_in, w, b, xs, batch, hidden, steps, chunk):
        # Code plan:
        # 1. copy uTasks h_in -> h; grid barrier;
        # 2. per step: linear uTasks pre = h @ w.T + b; grid barrier;
        #    add-tanh uTasks h = tanh(pre + xs[step]); grid barrier.
        grid = cuda.cg.this_grid()
        n = batch * hidden
        elementwise_count = (n + chunk - 1) // chunk
        linear_count = ((batch + T - 1) // T) * ((hidden + T - 1) // T)
        for u in range(cuda.blockIdx.x, elementwise_count, cuda.gridDim.x):
            copy_utask(u, h, h_in, n, 0, 0, chunk)
        grid.sync()
        for step in range(steps):
            for u in range(cuda.blockIdx.x, linear_count, cuda.gridDim.x):
                linear(u, pre, h, w, b, batch, hidden, hidden, 1)
            grid.sync()
            x_step = xs[step * n:(step + 1) * n]  # a view of this step's inputs, no copy
            for u in range(cuda.blockIdx.x, elementwise_count, cuda.gridDim.x):
                fused(u, h, pre, x_step, n, chunk)
            grid.sync()

    return rnn_program


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array

    i64 = types.int64
    cases = [("add_tanh[float32]", add_tanh.py_func, (types.float32, types.float32), True)]
    for tile, dtype in ((16, "float32"), (4, "float64")):
        x = array(dtype)
        cases.append((f"rnn_program[tile={tile},{dtype}]", make_rnn_program(tile, dtype).py_func,
                      (x, x, x, x, x, x, i64, i64, i64, i64), False))
    return cases
