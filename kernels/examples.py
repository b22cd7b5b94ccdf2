"""Small kernels whose blocks talk to each other across a grid barrier.

They are what the demo (``python -m pyflow``), the simulator tests and the first
tutorial run.  Each is written once and runs on a GPU and in the simulator.
Numba's stock simulator gets both wrong for more than one block.  It runs block
0 to completion before block 1 starts, so the grid barrier lets a block read
results the other blocks have not written yet.

Every thread must reach every ``this_grid().sync()``, so nobody returns early:
threads past the end of the data carry a neutral value instead.
"""

from numba import float64

from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit

MAX_BLOCK = 1024  # shared arrays need a compile-time size


@jit
def prefix_sum(x, out, block_sums):
    """Inclusive scan of ``x`` into ``out`` across the whole grid (one element per thread).

    Code plan:
    1. each block scans its slice in shared memory (Hillis-Steele, log2(block) steps);
    2. the last thread of each block publishes the block's total in ``block_sums``;
    3. grid barrier: every block's total is now visible to every block;
    4. each element adds the totals of all earlier blocks.
    """
    tmp = cuda.shared.array(MAX_BLOCK, dtype=float64)
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    i = b * cuda.blockDim.x + t
    n = x.shape[0]
    tmp[t] = x[i] if i < n else 0.0
    cuda.syncthreads()
    step = 1
    while step < cuda.blockDim.x:
        add = tmp[t - step] if t >= step else 0.0
        cuda.syncthreads()
        tmp[t] += add
        cuda.syncthreads()
        step *= 2
    if t == cuda.blockDim.x - 1:
        block_sums[b] = tmp[t]
    cuda.cg.this_grid().sync()
    carry = 0.0
    for k in range(b):
        carry += block_sums[k]
    if i < n:
        out[i] = tmp[t] + carry


@jit
def two_phase_sum(x, partial, total):
    """Sum of ``x`` into ``total[0]``: block partial sums, grid barrier, block 0 adds them.

    Code plan:
    1. each thread sums a grid-stride slice; the block reduces in shared memory;
    2. thread 0 of each block writes the block's partial sum;
    3. grid barrier;
    4. block 0, thread 0 adds the partial sums.
    """
    tmp = cuda.shared.array(MAX_BLOCK, dtype=float64)
    t = cuda.threadIdx.x
    acc = 0.0
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        acc += x[i]
    tmp[t] = acc
    cuda.syncthreads()
    width = cuda.blockDim.x
    while width > 1:
        half = (width + 1) // 2
        if t < width - half:
            tmp[t] += tmp[t + half]
        cuda.syncthreads()
        width = half
    if t == 0:
        partial[cuda.blockIdx.x] = tmp[0]
    cuda.cg.this_grid().sync()
    if cuda.blockIdx.x == 0 and t == 0:
        s = 0.0
        for k in range(cuda.gridDim.x):
            s += partial[k]
        total[0] = s


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    f64 = types.float64[::1]
    return [
        ("prefix_sum", prefix_sum.py_func, (f64, f64, f64), False),
        ("two_phase_sum", two_phase_sum.py_func, (f64, f64, f64), False),
    ]
