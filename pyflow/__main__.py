"""``python -m pyflow``: which backend is active, the devices, a grid-sync demo, and a few training steps.

The demo runs a cross-block prefix sum and a two-phase reduction, kernels whose
blocks exchange data across ``cuda.cg.this_grid().sync()``.  Their memory comes
from the caching allocator over the ep device, and they are launched on an ep
stream.  Both results are checked against numpy.

Then eight SGD steps train a tiny MLP on cpu (eager mode: forward, autograd's
backward and the optimizer's update are all VM instructions), printing the loss.
Exit status 1 if a result differs from numpy or the loss does not go down.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import types  # numba's types only: numba.cuda is imported by pyflow, in the mode it chose

import pyflow
from pyflow import nn
from pyflow.device import CachingAllocator, DeviceType, ep
from pyflow.kernels import max_cooperative_grid_blocks
from pyflow.kernels.examples import prefix_sum, two_phase_sum

# What both demo kernels are launched with: three float64 vectors (numba types a
# C-contiguous 1-D float64 device array as float64[::1]).
VECTORS = (types.float64[::1],) * 3


def show_devices() -> None:
    print(f"pyflow {pyflow.__version__}")
    print(f"backend: {pyflow.backend_description()}")
    for device_type in (DeviceType.cpu, DeviceType.cuda):
        try:
            count = ep.device_count(device_type)
        except pyflow.errors.PyflowError as error:
            print(f"  {device_type.name}: unavailable ({error})")
            continue
        for index in range(count):
            ep_device = ep.get_device(pyflow.device(device_type, index))
            print(f"  {ep_device.device!r}: {type(ep_device).__name__}")


def run_demo(blocks: int = 4, threads: int = 32) -> bool:
    """Prefix sum and reduction on cuda:0, in memory from the caching allocator."""
    cuda0 = ep.get_device("cuda:0")
    allocator = CachingAllocator(cuda0, device="cuda:0")
    stream = cuda0.create_stream("demo")
    # Both kernels sync the grid, so their blocks must all be co-resident.  On a GPU the
    # limit is a property of the compiled code: ask for it compiled for the launch's types.
    limit = min(max_cooperative_grid_blocks(kernel, threads, 0, VECTORS) for kernel in (prefix_sum, two_phase_sum))
    blocks = min(blocks, limit)
    n = blocks * threads - 3  # not a multiple of the block: the tail threads idle
    x_host = np.random.default_rng(0).normal(size=n)

    def array(shape, dtype=np.float64):
        count = int(np.prod(shape))
        piece = allocator.allocate(count * np.dtype(dtype).itemsize)
        return piece, cuda0.as_array(piece.raw, piece.offset, shape, dtype)

    pieces, arrays = zip(*[array((n,)), array((n,)), array((blocks,)), array((blocks,)), array((1,))])
    x, scan, block_sums, partial, total = arrays
    scan_host, total_host = np.empty(n), np.empty(1)
    stream.memcpy_h2d(x, x_host)
    stream.launch(prefix_sum[blocks, threads, stream.native], x, scan, block_sums, name="prefix_sum")
    stream.launch(two_phase_sum[blocks, threads, stream.native], x, partial, total, name="two_phase_sum")
    stream.memcpy_d2h(scan_host, scan)
    stream.memcpy_d2h(total_host, total)
    stream.sync()

    scan_ok = np.allclose(scan_host, np.cumsum(x_host))
    total_ok = np.isclose(total_host[0], x_host.sum())
    print(f"\ngrid-sync demo on cuda:0 ({blocks} blocks x {threads} threads, "
          f"co-resident limit {limit}, n = {n}):")
    print(f"  prefix sum    last = {scan_host[-1]: .6f}  numpy {np.cumsum(x_host)[-1]: .6f}  "
          f"{'OK' if scan_ok else 'MISMATCH'}")
    print(f"  two-phase sum      = {total_host[0]: .6f}  numpy {x_host.sum(): .6f}  "
          f"{'OK' if total_ok else 'MISMATCH'}")
    for piece in pieces:
        allocator.deallocate(piece.ptr)
    print(f"  allocator: {allocator.stats()}")
    cuda0.destroy_stream(stream)
    allocator.shrink()
    return bool(scan_ok and total_ok)


def run_training(steps: int = 8) -> bool:
    """SGD with momentum on a tiny MLP (4 -> 16 -> 2), a 2-class problem; True if the loss went down.

    On cpu, where one step takes about 10 ms; on cuda in the CUDA simulator it
    takes about a second (every kernel is interpreted, thread by thread).
    """
    rng = np.random.default_rng(0)
    x_host = rng.normal(size=(32, 4)).astype(np.float32)
    labels = (x_host[:, 0] + x_host[:, 1] > 0).astype(np.int64)   # class 1 above a line
    x, y = pyflow.tensor(x_host), pyflow.tensor(labels)
    pyflow.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = pyflow.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    print("\ntraining on cpu: MLP 4 -> 16 -> 2 (Linear, ReLU, Linear), cross-entropy, "
          "SGD(lr=0.5, momentum=0.9), 32 samples:")
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"  step {step}: loss {losses[-1]:.4f}")
    went_down = losses[-1] < 0.8 * losses[0]
    # (not "OK": tests/test_integration.py counts the grid-sync demo's two " OK"s)
    print(f"  loss {losses[0]:.4f} -> {losses[-1]:.4f}: {'went down' if went_down else 'DID NOT GO DOWN'}")
    return went_down


def main() -> int:
    show_devices()
    ok = run_demo()
    ok = run_training() and ok
    pyflow.vm.shutdown()
    ep.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
