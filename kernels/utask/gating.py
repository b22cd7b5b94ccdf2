"""Gated residual blocks as uTasks (seed 001, issue 17): the decisions of BlockDrop and SkipNet, and the blend.

BlockDrop and SkipNet decide, per residual block and per sample, whether the
block runs.  The batch runs a block when *any* sample wants it (a device-side
reduction whose result a ``cond`` tests: Cocktailer's branch on a device
scalar); then every sample blends, by its own 0/1 decision ``m``, the block's
output with its input::

    out = relu(residual + fx) * m + residual * (1 - m)        (residual_gate_utask)

* ``policy_row_utask(u, policy, counts, probs, batch, blocks)`` (BlockDrop): row
  ``u`` is network block ``u``.  ``probs`` (batch, blocks) are the policy
  network's probabilities; ``policy[u, b] = 0 if probs[b, u] < 0.5 else 1`` (the
  artifact's ``torch.where(probs < 0.5, 0, 1)``: a NaN runs the block), stored
  transposed (blocks, batch) so that a block's decisions are one row, and
  ``counts[u]`` is their sum: how many samples run block ``u``.
* ``skip_action_utask(u, mask, total, h, weight, bias, offset, batch, hidden)``
  (SkipNet, one uTask, ``u == 0``): the head of the recurrent controller.  Per
  sample ``b``: ``mask[b] = 1 if sigmoid(h[b] . weight + bias[0]) > 0.5 else 0``
  (the 1x1 ``proj`` conv, a sigmoid and the threshold, in the dtype), and
  ``total[0] = sum over b of (mask[b] + offset[0])``: the artifact's
  ``torch.sum(mask + cond_control[k])``, which its ``forward_fix`` tests ``> 0``.
* ``residual_gate_utask(u, out, fx, residual, mask, n, sample, chunk)``: the blend
  above, elementwise over ``n`` elements, ``m = mask[i // sample]`` (``sample``:
  elements per sample).  ``out`` may be ``fx`` or ``residual``.

The two decision uTasks sum over the batch with ``kernels/reduce.py``'s ``block_reduce``
(a tree over the block's threads, thread ``t`` taking samples ``t, t + lanes, ...``).
Each declares its own shared array and hands it to ``block_reduce``, which owns
none: a device function with a shared array reached along two paths of one
kernel is defined twice and NVVM rejects the kernel (``batched.py``).
Only these uTasks, which a kernel calls directly, own shared memory.  Factories
(``make_policy_row_utask(dtype)``, ``make_skip_action_utask(dtype)``) fix the
dtype of the shared array and of the 0, 0.5 and 1 constants.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import from_dtype

from pyflow.errors import DTypeError, ShapeError
from pyflow.kernels import scalar_ops
from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit
from pyflow.kernels.reduce import make_block_reduce
from pyflow.kernels.scalar_ops import relu, sigmoid
from pyflow.kernels.utask.reduce import MAX_BLOCK
from pyflow.kernels.utask.sizes import ceil_div, require_sizes

__all__ = ["make_policy_row_utask", "make_skip_action_utask", "residual_gate_utask", "make_policy_row_kernel",
           "make_skip_action_kernel", "residual_gate_kernel", "policy_row_utask_count", "skip_action_utask_count",
           "residual_gate_utask_count"]

_DTYPES = (np.dtype("float32"), np.dtype("float64"))


def policy_row_utask_count(blocks: int, batch: int) -> int:
    """uTasks of BlockDrop's policy: one per network block (a row of decisions).

    >>> policy_row_utask_count(15, 64)
    15
    """
    require_sizes("policy_row", blocks=blocks, batch=batch)
    return int(blocks)


def skip_action_utask_count(batch: int, hidden: int) -> int:
    """uTasks of SkipNet's controller head: one, for the whole batch (its sum is one number)."""
    require_sizes("skip_action", minimum=1, batch=batch, hidden=hidden)
    return 1


def residual_gate_utask_count(n: int, chunk: int) -> int:
    """uTasks of the blend over ``n`` elements: ``ceil(n / chunk)``."""
    require_sizes("residual_gate", n=n)
    require_sizes("residual_gate", minimum=1, chunk=chunk)
    return ceil_div(n, chunk)


def _normalize(op, dtype, max_block):
    dtype = np.dtype(dtype)
    if dtype not in _DTYPES:
        raise DTypeError(f"{op} uTasks: unsupported dtype {dtype}; expected float32 or float64")
    require_sizes(op, minimum=1, max_block=max_block)
    if max_block > MAX_BLOCK:
        raise ShapeError(f"{op} uTasks: max_block {max_block} is larger than a block can be ({MAX_BLOCK})")
    return dtype, int(max_block)


# --- device code ----------------------------------------------------------------


def make_policy_row_utask(dtype="float32", max_block: int = MAX_BLOCK):
    """``policy_row_utask(u, policy, counts, probs, batch, blocks)``: block ``u``'s decisions and their count.

    ``probs`` (batch, blocks), ``policy`` (blocks, batch), ``counts`` (blocks,).  A
    ``u >= blocks`` (or an empty batch) writes nothing.
    """
    return _policy_row(*_normalize("policy_row", dtype, max_block))


@functools.cache
def _policy_row(dtype, max_block):
    block_sum = make_block_reduce(scalar_ops.add)
    LANES = max_block
    DTYPE = from_dtype(dtype)
    ZERO, HALF, ONE = (dtype.type(v) for v in (0.0, 0.5, 1.0))

    @jit(device=True)
    def policy_row_utask(u, policy, counts, probs, batch, blocks):
        tmp = cuda.shared.array(LANES, DTYPE)   # this uTask's: block_reduce owns no shared memory
        t = cuda.threadIdx.x
        lanes = min(cuda.blockDim.x, LANES)
        active = min(lanes, batch)
        if u < blocks and batch > 0:   # block-uniform: the barriers in block_reduce are safe
            # Code plan: 1. thread t thresholds samples t, t + lanes, ... of column u of
            # probs into row u of policy and sums its decisions; 2. the block's tree adds
            # the threads' sums; 3. thread 0 writes the count.
            acc = ZERO
            if t < active:
                for b in range(t, batch, lanes):
                    decision = ZERO if probs[b * blocks + u] < HALF else ONE
                    policy[u * batch + b] = decision
                    acc += decision
            total = block_sum(tmp, acc, active)
            if t == 0:
                counts[u] = total

    return policy_row_utask


def make_skip_action_utask(dtype="float32", max_block: int = MAX_BLOCK):
    """``skip_action_utask(u, mask, total, h, weight, bias, offset, batch, hidden)``: SkipNet's decisions, summed.

    ``h`` (batch, hidden), ``weight`` (hidden,), ``bias`` and ``offset`` one element,
    ``mask`` (batch,), ``total`` one element.  Only ``u == 0`` does anything.
    """
    return _skip_action(*_normalize("skip_action", dtype, max_block))


@functools.cache
def _skip_action(dtype, max_block):
    block_sum = make_block_reduce(scalar_ops.add)
    LANES = max_block
    DTYPE = from_dtype(dtype)
    ZERO, HALF, ONE = (dtype.type(v) for v in (0.0, 0.5, 1.0))

    @jit(device=True)
    def skip_action_utask(u, mask, total, h, weight, bias, offset, batch, hidden):
        tmp = cuda.shared.array(LANES, DTYPE)   # this uTask's: block_reduce owns no shared memory
        t = cuda.threadIdx.x
        lanes = min(cuda.blockDim.x, LANES)
        active = min(lanes, batch)
        if u == 0 and batch > 0:   # block-uniform
            # Code plan: 1. thread t takes samples t, t + lanes, ...: the proj dot
            # product, its bias, the sigmoid rounded to the dtype, the threshold; it
            # writes mask[b] and sums mask[b] + offset; 2. the tree adds the sums;
            # 3. thread 0 writes the total the branch will test.
            acc = ZERO
            if t < active:
                for b in range(t, batch, lanes):
                    z = ZERO
                    for j in range(hidden):
                        z += h[b * hidden + j] * weight[j]
                    z += bias[0]
                    prob = DTYPE(sigmoid(z))
                    decision = ONE if prob > HALF else ZERO
                    mask[b] = decision
                    acc += decision + offset[0]
            s = block_sum(tmp, acc, active)
            if t == 0:
                total[0] = s

    return skip_action_utask


@jit(device=True)
def residual_gate_utask(u, out, fx, residual, mask, n, sample, chunk):
    """uTask ``u`` of ``out = relu(residual + fx) * m + residual * (1 - m)``, ``m = mask[i // sample]``."""
    # Code plan: 1. the chunk [start, stop) u owns; 2. per element: its sample's
    # decision, the block's output through the residual and relu, the blend; each
    # element read and written by one thread (so out may be fx or residual).
    start = u * chunk
    stop = min(n, start + chunk)
    for i in range(start + cuda.threadIdx.x, stop, cuda.blockDim.x):
        m = mask[i // sample]
        r = residual[i]
        out[i] = relu(r + fx[i]) * m + r * (1 - m)


# --- uOperator kernels: one op's uTasks in the virtual-block loop ----------------


def make_policy_row_kernel(dtype="float32", max_block: int = MAX_BLOCK):
    """Kernel ``(u_begin, u_end, policy, counts, probs, batch, blocks)``."""
    return _policy_row_kernel(*_normalize("policy_row", dtype, max_block))


@functools.cache
def _policy_row_kernel(dtype, max_block):
    utask = _policy_row(dtype, max_block)

    @jit
    def policy_row_kernel(u_begin, u_end, policy, counts, probs, batch, blocks):
        for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):   # block-uniform
            utask(u, policy, counts, probs, batch, blocks)

    return policy_row_kernel


def make_skip_action_kernel(dtype="float32", max_block: int = MAX_BLOCK):
    """Kernel ``(u_begin, u_end, mask, total, h, weight, bias, offset, batch, hidden)``."""
    return _skip_action_kernel(*_normalize("skip_action", dtype, max_block))


@functools.cache
def _skip_action_kernel(dtype, max_block):
    utask = _skip_action(dtype, max_block)

    @jit
    def skip_action_kernel(u_begin, u_end, mask, total, h, weight, bias, offset, batch, hidden):
        for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):   # block-uniform
            utask(u, mask, total, h, weight, bias, offset, batch, hidden)

    return skip_action_kernel


@jit
def residual_gate_kernel(u_begin, u_end, out, fx, residual, mask, n, sample, chunk):
    """uTasks ``u_begin <= u < u_end`` of ``residual_gate_utask``."""
    for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):
        residual_gate_utask(u, out, fx, residual, mask, n, sample, chunk)


def ptx_cases():
    """(label, py_func, argtypes, is_device) for the PTX compile check."""
    from numba import types

    from pyflow.kernels.compile_check import array

    i64 = types.int64
    cases = []
    for dtype in ("float32", "float64"):
        x = array(dtype)
        cases.append((f"policy_row_utask[{dtype}]", make_policy_row_utask(dtype, 256).py_func,
                      (i64, x, x, x, i64, i64), True))
        cases.append((f"policy_row_kernel[{dtype}]", make_policy_row_kernel(dtype, 256).py_func,
                      (i64, i64, x, x, x, i64, i64), False))
        cases.append((f"skip_action_utask[{dtype}]", make_skip_action_utask(dtype, 256).py_func,
                      (i64,) + (x,) * 6 + (i64, i64), True))
        cases.append((f"skip_action_kernel[{dtype}]", make_skip_action_kernel(dtype, 256).py_func,
                      (i64, i64) + (x,) * 6 + (i64, i64), False))
        cases.append((f"residual_gate_utask[{dtype}]", residual_gate_utask.py_func,
                      (i64, x, x, x, x, i64, i64, i64), True))
        cases.append((f"residual_gate_kernel[{dtype}]", residual_gate_kernel.py_func,
                      (i64, i64, x, x, x, x, i64, i64, i64), False))
    return cases
