"""Eager-mode overhead: a chain of small ops, and throughput on large tensors (issue 4).

Small ops: ``x = x + y`` (then relu, mul, exp in turn) 10,000 times on 16-element
float32 tensors, timed per op, for
* pyflow, threaded VM (the default: scheduler thread + worker thread);
* pyflow, step-through mode (``flow.vm.sync_mode()``: everything on this thread);
* PyTorch CPU eager (if installed: ``pip install torch==2.13.0``);
* numpy;
* the floor: ``eager_floor.py``, the leanest Python VM we could write with the seed's stages
  and none of pyflow's other duties (no threads, failure semantics, streams...).
  ``floor/torch`` is what Python itself costs against PyTorch's C++ dispatch, ``pyflow/floor``
  what pyflow's design costs on top.
Large ops: the same chain on 4M-element tensors, pyflow (cpu) against numpy.

    python benchmarks/bench_eager_ops.py [--ops 10000] [--large 4000000] [--large-ops 40] [--stages]

Targets: small-op pyflow/torch <= 8; large-op pyflow/numpy <= 1.1.

``--stages`` also prints where a small op's time goes, layer by layer (seed 002's path:
interpreter -> InstructionsBuilder -> instruction -> engine -> stream policy -> kernel):
the chain runs once under ``cProfile`` in step-through mode (the same code as the threaded
VM, all on one thread, so one profile sees every layer), each function's own time is
charged to the layer of its file, and the shares are scaled to the unprofiled
step-through time per op (the profiler's overhead inflates every call alike).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("PYFLOW_CUDA", "sim")

import numpy as np  # noqa: E402

import pyflow as flow  # noqa: E402

import eager_floor  # noqa: E402  (the script's folder is on sys.path)

STEPS = ("add", "relu", "mul", "exp")


def pyflow_chain(n_ops: int, size: int) -> float:
    x = flow.tensor(np.full(size, 0.5, np.float32))
    y = flow.tensor(np.full(size, 0.25, np.float32))
    flow.sync()
    start = time.perf_counter()
    for i in range(n_ops):
        step = STEPS[i % 4]
        x = x + y if step == "add" else flow.relu(x) if step == "relu" else x * y if step == "mul" else flow.exp(-x)
    x.numpy()
    return time.perf_counter() - start


def numpy_chain(n_ops: int, size: int) -> float:
    x, y = np.full(size, 0.5, np.float32), np.full(size, 0.25, np.float32)
    start = time.perf_counter()
    for i in range(n_ops):
        step = STEPS[i % 4]
        x = x + y if step == "add" else np.maximum(x, 0) if step == "relu" else x * y if step == "mul" else np.exp(-x)
    return time.perf_counter() - start


def torch_chain(n_ops: int, size: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    x, y = torch.full((size,), 0.5), torch.full((size,), 0.25)
    start = time.perf_counter()
    for i in range(n_ops):
        step = STEPS[i % 4]
        x = x + y if step == "add" else torch.relu(x) if step == "relu" else x * y if step == "mul" else torch.exp(-x)
    return time.perf_counter() - start


# the layers of the eager path, by source file (the first match wins)
LAYERS = (
    ("framework (interpreter, tensors)", ("pyflow/framework/", "pyflow/autograd/")),
    ("builder (PhysicalRun, SoftSyncStream)", ("pyflow/vm/builder.py", "pyflow/vm/__init__.py",
                                               "pyflow/vm/failure.py", "pyflow/vm/interrupts.py")),
    ("instruction + policies", ("pyflow/vm/instruction.py", "pyflow/vm/policies/")),
    ("engine (schedule rounds, dependences)", ("pyflow/vm/engine.py", "pyflow/vm/dependence.py")),
    ("vm + stream policy + worker", ("pyflow/vm/virtual_machine.py", "pyflow/vm/stream.py",
                                     "pyflow/vm/thread_ctx.py")),
    ("memory (blobs, allocator, ep)", ("pyflow/vm/eager_blob_object.py", "pyflow/device/")),
    ("kernel (pyflow.kernels)", ("kernels/",)),
)


def layer_of(filename: str) -> str:
    for layer, parts in LAYERS:
        if any(part in filename for part in parts):
            return layer
    return "Python builtins and the rest"


def stage_breakdown(n_ops: int, per_op_us: float) -> list[tuple[str, float, float]]:
    """(layer, microseconds per op, Python calls per op), from one profiled step-through run."""
    import collections
    import cProfile
    import pstats

    profile = cProfile.Profile()
    with flow.vm.sync_mode():
        pyflow_chain(200, 16)
        profile.enable()
        pyflow_chain(n_ops, 16)
        profile.disable()
    own, calls = collections.Counter(), collections.Counter()
    for (filename, _, _), (_, ncalls, tottime, _, _) in pstats.Stats(profile).stats.items():
        own[layer_of(filename.replace(os.sep, "/"))] += tottime
        calls[layer_of(filename.replace(os.sep, "/"))] += ncalls
    total = sum(own.values())
    layers = [layer for layer, _ in LAYERS] + ["Python builtins and the rest"]
    return [(layer, own[layer] / total * per_op_us, calls[layer] / n_ops) for layer in layers]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=4_000_000)
    parser.add_argument("--large-ops", type=int, default=40)
    parser.add_argument("--stages", action="store_true", help="also print the per-layer cost of a small op")
    args = parser.parse_args()

    pyflow_chain(200, 16)  # warm up (imports, first allocations)
    threaded = pyflow_chain(args.ops, 16)
    with flow.vm.sync_mode():
        stepped = pyflow_chain(args.ops, 16)
    torch_time = torch_chain(args.ops, 16)
    numpy_time = numpy_chain(args.ops, 16)
    eager_floor.floor_seconds(200, 16)   # warm up its caches too
    floor_time = eager_floor.floor_seconds(args.ops, 16)

    def per_op(t):
        return t / args.ops * 1e6

    print(f"small ops: {args.ops} ops on 16-element float32 tensors (per op)")
    print(f"  pyflow threaded VM      {per_op(threaded):8.1f} us")
    print(f"  pyflow step-through     {per_op(stepped):8.1f} us")
    if torch_time is not None:
        print(f"  PyTorch CPU eager       {per_op(torch_time):8.1f} us")
    print(f"  numpy                   {per_op(numpy_time):8.1f} us")
    print(f"  floor (eager_floor.py)  {per_op(floor_time):8.1f} us   the leanest Python VM with the seed's stages")
    print(f"  pyflow/floor = {threaded / floor_time:.2f} threaded, {stepped / floor_time:.2f} step-through")
    if torch_time is not None:
        verdict = "meets" if threaded / torch_time <= 8 else "MISSES"
        print(f"  pyflow/torch = {threaded / torch_time:.2f} threaded, {stepped / torch_time:.2f} step-through "
              f"({verdict} the <= 8 target)")
        print(f"  floor/torch = {floor_time / torch_time:.2f} (Python itself, on the seed's stages)")
    else:
        print("  (PyTorch not installed: pip install torch==2.13.0 for the reference)")
    if args.stages:
        print("  where a small op's step-through time goes (cProfile own time by layer, scaled):")
        rows = stage_breakdown(min(args.ops, 3000), per_op(stepped))
        for layer, us, calls in rows:
            print(f"    {layer:40s} {us:7.1f} us  {calls:6.1f} Python calls")
        print(f"    {'total':40s} {sum(r[1] for r in rows):7.1f} us  {sum(r[2] for r in rows):6.1f} Python calls")

    pyflow_chain(4, args.large)  # warm up the allocator with big blocks
    large_pyflow = min(pyflow_chain(args.large_ops, args.large) for _ in range(3))
    large_numpy = min(numpy_chain(args.large_ops, args.large) for _ in range(3))
    mbytes = args.large * 4 / 1e6
    print(f"large ops: {args.large_ops} ops on {args.large}-element float32 tensors ({mbytes:.0f} MB each)")
    print(f"  pyflow (cpu)  {large_pyflow / args.large_ops * 1e3:8.2f} ms/op")
    print(f"  numpy         {large_numpy / args.large_ops * 1e3:8.2f} ms/op")
    verdict = "meets" if large_pyflow / large_numpy <= 1.1 else "MISSES"
    print(f"  pyflow/numpy = {large_pyflow / large_numpy:.3f} ({verdict} the <= 1.1 target)")
    flow.vm.shutdown()


if __name__ == "__main__":
    main()
