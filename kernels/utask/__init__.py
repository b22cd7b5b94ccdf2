"""uTask device functions (seed 001, Cocktailer): the building blocks of a persistent kernel.

Cocktailer splits every operator into *uTasks*: independent pieces of work, each
executed by ONE thread block.  The code generator (``pyflow/cocktailer/codegen.py``)
compiles a whole program (loops, branches, recursion) into one kernel whose
blocks loop over an operator's uTasks ("virtual blocks"), with a grid barrier
wherever a dependence crosses blocks::

    for u in range(cuda.blockIdx.x, n_utasks, cuda.gridDim.x):   # block-uniform
        matmul_tile_utask(u, out, a, b, M, N, K, batch)
    cuda.cg.this_grid().sync()

This package holds the device functions such a kernel calls, one family per module:

* ``elementwise`` - ``make_elementwise_utask(fn)``: map, zip and row-broadcast zip
  (``x + bias``) over chunks of ``CHUNK`` elements; ``copy_utask`` (with offsets).
* ``matmul``      - ``make_matmul_utask(tile, dtype, transpose_b, bias)``: one
  ``tile x tile`` output tile per uTask, batched, ``x @ W.T + b`` like nn.Linear.
  Its block's work is the library's tiled matmul, ``kernels/matmul.py``'s ``make_matmul_tile``.
* ``reduce``      - ``make_reduce_row_utask(combine, dtype)`` (sum, max: one row
  per uTask, shared-memory tree) and ``make_softmax_row_utask(dtype)`` (stable).
  Their block's work is the library's device functions: ``kernels/reduce.py``'s
  ``make_block_reduce`` and ``kernels/softmax.py``'s ``make_row_softmax``.
* ``cell``        - the fused LSTM cell and a fill.
* ``batched``     - ``make_broadcast_matmul_utask``: batched matmul tiles where one
  operand repeats (per-gate / per-head weights) and outputs may be strided (KV cache rows).
* ``nasrnn``      - the fused NASRNN cell.
* ``scaled_softmax`` - ``softmax(scale * x)`` per row (Attention's scores).
* ``embedding``   - rows of a table gathered by token ids read from device memory.
* ``argmax``      - ``argmax(x + y)`` per row, the first maximum on a tie (greedy decoding);
  its tree is ``kernels/arg_reduce.py``'s ``make_block_arg_reduce``, the library argmax's.
* ``seq2seq``     - the Seq2seq decoder's gate-major LSTM cell with per-gate biases.
* ``resnet``      - BlockDrop's and SkipNet's layers: direct conv2d, eval-mode batch
  norm (+ ReLU), max/average pooling (with zero channels: DownsampleB), per output chunk.
* ``gating``      - their decisions (BlockDrop's policy rows and counts, SkipNet's
  controller head) and the per-sample residual blend of a gated block.
* ``groups``      - ``group_barrier``: a barrier among a group of blocks (recursion
  unroll runs sibling subtrees on disjoint groups; ``grid.sync`` would wait for all).
* ``program``     - a small persistent kernel (an RNN loop, Cocktailer's Fig. 10)
  built only from these uTasks and grid barriers: how the generated code looks.

Each module also has, per op, a ``<op>_utask_count(...)`` host function (how many
uTasks the op needs) and a *uOperator kernel* that runs a range of the op's uTasks
in the virtual-block loop: the op as a launch of its own (tests, PTX check).

The uTask contract (every device function here keeps it; generated code relies on it)
--------------------------------------------------------------------------------------
1. ``<op>_utask(u, ...)`` computes exactly the part of the output owned by uTask
   ``u``, for ``0 <= u < <op>_utask_count(...)``.  Ownership is a partition: no two
   uTasks write the same element, and together they write every element.  A ``u``
   past the count writes nothing.
2. It is called by ALL threads of one block with the same ``u`` (block-uniform).
   Parallelism inside the block uses ``cuda.threadIdx.x`` / ``cuda.blockDim.x``
   (1-D blocks; any block size from 1 to 1024 gives the same result, only slower
   or faster).  Never ``threadIdx.y``/``z`` or ``blockIdx``: the uTask does not know
   which block runs it.
3. It may use shared memory and ``cuda.syncthreads()``; every thread of the block
   reaches every barrier (work is guarded, nobody returns early).  It never uses a
   grid barrier: crossing blocks is the caller's business.
4. It leaves shared memory free: its last read of shared memory happens before
   its last barrier, so the next uTask the same block runs (the next iteration of
   the virtual-block loop, or another op) may overwrite it at once.
5. Buffers are contiguous flat 1-D arrays (Cocktailer preallocates contiguous
   buffers); a matrix of shape (M, K) is ``a[i * K + k]``, a batch of them follows
   one after another.  Sizes are passed as ints.  To address part of a buffer, pass
   ``buf[off:off + n]`` (a view, no copy; also allowed inside device code) or, for
   copies, the explicit offsets of ``copy_utask``.
6. The work granularity is explicit: elementwise uTasks take ``chunk`` (host
   default ``elementwise.CHUNK``), matmul uTasks a ``tile`` fixed by the factory,
   row uTasks one row.  The ``*_utask_count`` functions take the same numbers.

Factories are cached (``functools.cache``): calling one twice returns the same
device functions, so numba compiles each specialization once.
"""

from pyflow.kernels.utask.elementwise import (CHUNK, ElementwiseUTasks, copy_utask, copy_utask_count,
                                              elementwise_utask_count, make_elementwise_utask)
from pyflow.kernels.utask.matmul import TILE, make_matmul_utask, matmul_utask_count
from pyflow.kernels.utask.reduce import (MAX_BLOCK, make_reduce_row_utask, make_softmax_row_utask,
                                         reduce_row_utask_count, softmax_row_utask_count)

__all__ = ["CHUNK", "TILE", "MAX_BLOCK", "ElementwiseUTasks", "make_elementwise_utask",
           "elementwise_utask_count", "copy_utask", "copy_utask_count", "make_matmul_utask",
           "matmul_utask_count", "make_reduce_row_utask", "make_softmax_row_utask",
           "reduce_row_utask_count", "softmax_row_utask_count"]
