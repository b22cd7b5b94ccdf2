"""Data parallel on 2 ranks against 1 rank: one training step of MLP 784 -> 256 -> 10, the ratio of their times.

Each rank holds a replica of the model (its parameters made global with SBP B), the global batch is
split along dim 0 (S(0)), and the optimizer all-reduces the partial-sum gradients (P -> B), all of
them as one flat bucket, as OneFlow's eager data parallel (``flow.nn.parallel.DistributedDataParallel``
with its buckets) does: a step issues 3 collectives (the bucket, the mean's denominator, the loss
for ``item()``), each a chain of thread hand-offs (user -> VM -> ccl worker -> comm-net -> peer).
The 1-rank step is the same model eager on the whole batch, no global tensors.  Both run in the
*same* run, step by step alternately (rank 0 alone while the other rank waits at a barrier, then
both ranks), so the machine's load hits both alike; each step ends with ``loss.item()`` and the
times are medians.  Run it

* as threads of one process:   ``python benchmarks/bench_data_parallel.py``  (``flow.distributed.run``)
* as MPI processes:            ``python -m pyflow.distributed.launch --nproc_per_node 2
                                 benchmarks/bench_data_parallel.py``

**What 2 cores allow.**  Splitting the batch halves each rank's compute (the matmuls), but every
rank still issues every op of the step: the Python per op (interpreter, VM, SBP inference, boxing)
does not shrink with the batch, and the ranks add the gradients' all-reduce.  As threads, the
ranks share one GIL, so only the time numpy spends outside it (BLAS, elementwise loops) can
overlap; as processes they overlap fully but pay the copies of the transport.  So 2 ranks can only
win where the step is compute-bound: a large batch and one BLAS thread per rank
(``--blas-threads 1``, the default: numpy's OpenBLAS takes one thread per core, 2 here, so the
1-rank step already uses both cores for its matmuls, and two ranks would run four threads on two
cores).  The BLAS thread count is set through ``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS`` /
``MKL_NUM_THREADS`` before numpy is imported and, under the MPI launcher (which imported numpy
already), through OpenBLAS's own call; the count in use is printed.  In numbers: with ``F`` the
fixed cost of a step (its Python) and ``C`` its compute, 1 rank takes ``F1 + C`` and 2 threaded
ranks at best ``2 F2 + C/2`` (one GIL: their Python runs one after the other; ``F2 > F1``, the
global ops' own work), so they break even only once ``C/2 > 2 F2 - F1``; 2 processes at best
``F2 + C/2`` plus the collectives' latency, on 2 cores that other work shares.  The benchmark fits
``F`` and ``C`` per sample to its own smallest and largest batch and prints the batch where the
two lines cross (2 ranks never catch up when their time grows as fast as 1 rank's, as when the
cores are busy).  A small batch (64) is printed beside the large one: there the Python dominates.
In-process, 2 ranks break even at about 3,000-3,600 samples (the line two runs printed, on a machine
loaded 10-14 on its 2 cores, 3 collectives per step: 2 ranks / 1 rank 0.81-0.88 at 4,096, 1.8-2.1 at
1,024).  By the CPU columns of those runs F1 is about 13 ms, F2 about 19.5 ms (CPU, so an upper
bound on the part one GIL serialises) and C about 9.4 ms per 1,000 samples: at batch 1024 C/2 is
about 4.8 ms against 2 F2 - F1 of up to 26 ms, so one GIL cannot break even there.  Under mpiexec the ranks' fixed costs overlap: a rank costs ``F2 + C/2`` plus the 3
collectives' latency against ``F1 + C``, so it needs ``C/2 > F2 - F1`` (about 6.5 ms by those numbers:
from about 1,400 samples, latency aside; at 1024, C/2 is about 4.8 ms).

    python benchmarks/bench_data_parallel.py [--batches 64,1024] [--steps 10] [--warmup 2] [--blas-threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def _blas_threads_from_argv(default: str = "1") -> str:
    """``--blas-threads``, read before numpy is imported (BLAS reads its thread count once, at load)."""
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg == "--blas-threads" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--blas-threads="):
            return arg.split("=", 1)[1]
    return default


BLAS_THREADS = _blas_threads_from_argv()
NUMPY_LOADED_BEFORE = "numpy" in sys.modules   # under pyflow.distributed.launch: the launcher imported it
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = BLAS_THREADS
os.environ.setdefault("PYFLOW_CUDA", "sim")

import numpy as np  # noqa: E402


def _openblas_threads(wanted: int) -> str:
    """numpy's OpenBLAS thread count after setting it to ``wanted`` at run time (through ctypes).

    The environment variables act only when BLAS loads; a script run by the MPI launcher finds numpy
    (and its BLAS, 2 threads on 2 cores) already loaded, so each rank would run 2 BLAS threads, 4 on 2
    cores, their spin-waits eating the other rank's core.  Returns the count read back, or why not.
    """
    import ctypes
    import glob

    for path in glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "*openblas*")):
        lib = ctypes.CDLL(path)
        for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "64_"),
                               ("openblas", "")):
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                put(wanted)
                return str(get())
    return "unknown (no bundled OpenBLAS found)"


BLAS_IN_USE = _openblas_threads(int(BLAS_THREADS))

import pyflow as flow  # noqa: E402
from pyflow import env, nn  # noqa: E402
from pyflow.distributed import CollectiveDesc  # noqa: E402

FEATURES, HIDDEN, CLASSES = 784, 256, 10
LR, MOMENTUM = 0.05, 0.9
WORLD = 2


def mlp() -> nn.Module:
    flow.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def barrier() -> None:
    """Every rank waits here for the others (and for its own work: ``flow.sync`` first)."""
    flow.sync()
    transport, group = env.current().transport, tuple(range(env.get_world_size()))
    transport.barrier(group, transport.next_seq(group), CollectiveDesc("benchmark barrier"))


def per_rank(batch: int, steps: int, warmup: int) -> dict:
    """One rank's part: alternately a 1-rank step (rank 0 alone) and a 2-rank data-parallel step."""
    rng = np.random.default_rng(0)
    data = rng.normal(size=(batch, FEATURES)).astype(np.float32)
    labels = rng.integers(0, CLASSES, size=batch).astype(np.int64)
    ranks = flow.placement("cpu", list(range(WORLD)))
    loss_fn = nn.CrossEntropyLoss()

    replica = mlp()
    replica.to_global(ranks, flow.sbp.broadcast)
    parallel_opt = flow.optim.SGD(replica.parameters(), lr=LR, momentum=MOMENTUM)
    x = flow.tensor(data, placement=ranks, sbp=flow.sbp.split(0))
    y = flow.tensor(labels, placement=ranks, sbp=flow.sbp.split(0))
    alone = mlp() if env.get_rank() == 0 else None
    alone_opt = flow.optim.SGD(alone.parameters(), lr=LR, momentum=MOMENTUM) if alone is not None else None
    x_all, y_all = flow.tensor(data), flow.tensor(labels)

    def step(model, optimizer, inputs, targets) -> float:
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss.item()

    one, two, one_cpu, two_cpu, one_losses, two_losses = [], [], [], [], [], []
    for _ in range(warmup + steps):
        barrier()
        if alone is not None:
            start, cpu = time.perf_counter(), time.process_time()
            one_losses.append(step(alone, alone_opt, x_all, y_all))
            one.append(time.perf_counter() - start)
            one_cpu.append(time.process_time() - cpu)
        barrier()
        start, cpu = time.perf_counter(), time.process_time()
        two_losses.append(step(replica, parallel_opt, x, y))
        two.append(time.perf_counter() - start)
        two_cpu.append(time.process_time() - cpu)
    with flow.trace() as tracer:   # what one 2-rank step sends: its collectives (after the timed steps)
        step(replica, parallel_opt, x, y)
    collectives = sum(record.name == "collective" for record in tracer.records)
    return {"one": one[warmup:], "two": two[warmup:], "one_cpu": one_cpu[warmup:], "two_cpu": two_cpu[warmup:],
            "one_losses": one_losses, "two_losses": two_losses, "collectives": collectives}


def break_even(batches: list, one_ms: dict, two_ms: dict, under_mpi: bool) -> list:
    """Where 2 ranks would catch up with 1, from this run's own times: each mode's step time as a fixed
    cost plus a cost per sample, a line through the smallest and the largest batch measured."""
    small, large = min(batches), max(batches)
    if small == large:
        return ["  (give two batch sizes, e.g. --batches 64,1024, for the break-even batch)"]
    modes = (("1", one_ms), ("2", two_ms))
    per_sample = {mode: (times[large] - times[small]) / (large - small) for mode, times in modes}
    fixed = {mode: times[small] - per_sample[mode] * small for mode, times in modes}
    lines = [f"  fixed cost per step (what does not grow with the batch: the Python of every op, the collectives): "
             f"1 rank {fixed['1']:.1f} ms, 2 ranks {fixed['2']:.1f} ms; compute per 1,000 samples of the global batch: "
             "1 rank "
             f"{per_sample['1'] * 1e3:.1f} ms, 2 ranks {per_sample['2'] * 1e3:.1f} ms"]
    if per_sample["2"] >= per_sample["1"]:
        lines.append("  2 ranks' time grows with the batch as fast as 1 rank's in this run (the two cores are busy "
                     "elsewhere, or one GIL serialises the ranks): no batch breaks even here")
    else:
        even = (fixed["2"] - fixed["1"]) / (per_sample["1"] - per_sample["2"])
        lines.append(f"  by these measurements 2 ranks break even with 1 at a global batch of about {max(even, 0):,.0f}"
                     f"{' (at or below ' + str(small) + ')' if even <= small else ''}")
    why = ("as threads, every rank's Python runs under one GIL: 2 ranks pay their fixed cost one after the other "
           "and overlap only the kernels that release it (BLAS)") if not under_mpi else \
          ("as processes, the ranks' Python overlaps, but each rank's comm-net thread and the copies of the "
           "transport take CPU of the same 2 cores")
    lines.append(f"  what 2 cores allow: splitting the batch halves each rank's compute, not its fixed cost; {why}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64,1024", help="global batch sizes, comma-separated")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--blas-threads", default="1", help="BLAS threads per rank (set before numpy loads)")
    args = parser.parse_args()
    under_mpi = env.process_context().transport is not None and env.process_context().world_size > 1
    how = f"{WORLD} MPI processes (mpiexec)" if under_mpi else f"{WORLD} in-process ranks (threads, one GIL)"
    lines = [f"data parallel, MLP {FEATURES}-{HIDDEN}-{CLASSES}, SGD momentum, {how}; 1 rank: the same step "
             "eager on the whole batch, alternating with the 2-rank step in the same run",
             f"BLAS threads per rank: {BLAS_IN_USE} (asked {BLAS_THREADS}: OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = "
             f"MKL_NUM_THREADS{', and set at run time: the launcher had loaded numpy' if NUMPY_LOADED_BEFORE else ''}; "
             f"numpy's default here: {os.cpu_count()}, one per core), "
             f"{os.cpu_count()} cores; median of {args.steps} steps after {args.warmup}, each ending with loss.item()",
             f"  {'global batch':>12} {'per rank':>9} {'1 rank ms':>10} {'2 ranks ms':>11} {'2 ranks / 1 rank':>17} "
             f"{'1 rank CPU ms':>14} {'2 ranks CPU ms':>15} {'largest loss difference':>24} {'collectives / step':>19}"]
    batches, one_by_batch, two_by_batch = [int(b) for b in args.batches.split(",")], {}, {}
    for batch in batches:
        results = flow.distributed.run(per_rank, world_size=WORLD, args=(batch, args.steps, args.warmup))
        first = results[0]
        one_ms = statistics.median(first["one"]) * 1e3
        two_ms = statistics.median(max(times) for times in zip(*(r["two"] for r in results))) * 1e3
        difference = float(np.abs(np.array(first["one_losses"]) - np.array(first["two_losses"])).max())
        assert difference < 1e-4, f"1 rank and {WORLD} ranks trained differently ({difference})"
        one_cpu, two_cpu = statistics.median(first["one_cpu"]) * 1e3, statistics.median(first["two_cpu"]) * 1e3
        one_by_batch[batch], two_by_batch[batch] = one_ms, two_ms
        lines.append(f"  {batch:12} {batch // WORLD:9} {one_ms:10.2f} {two_ms:11.2f} {two_ms / one_ms:17.2f} "
                     f"{one_cpu:14.2f} {two_cpu:15.2f} {difference:24.1e} {first['collectives']:19}")
    lines.append("  (target: 2 ranks / 1 rank <= 1.0 at batch 1024; 2 ranks: the slowest rank's step; CPU: the "
                 "process's CPU time over the step, all its threads\n   (in-process: both ranks'; under mpiexec: rank "
                 "0's process); collectives: those one 2-rank step issues on rank 0: the 4 gradients' all-reduce as one"
                 "\n   bucket (Optimizer._gradients), the mean's denominator P -> B (once: the backward reuses the "
                 "forward's boxing) and the loss's for item())")
    lines += break_even(batches, one_by_batch, two_by_batch, under_mpi)
    if env.get_rank() == 0:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
