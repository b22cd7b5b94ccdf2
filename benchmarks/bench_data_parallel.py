"""Data parallel on 2 ranks against 1 rank: one training step of MLP 784 -> 256 -> 10, the ratio of their times.

Each rank holds a replica of the model (its parameters made global with SBP B), the global batch is
split along dim 0 (S(0)), and the optimizer all-reduces the partial-sum gradients (P -> B), as
OneFlow's eager data parallel (``flow.nn.parallel.DistributedDataParallel`` without buckets) does.
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
win where the step is compute-bound: a large batch (1024: the matmuls are most of the 1-rank
step) and one BLAS thread per rank (``--blas-threads 1``, the default: with two BLAS threads the
1-rank step already uses both cores, and two ranks would run four threads on two cores).  The
BLAS thread count is fixed through ``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``
before numpy is imported, and printed.  A small batch (64) is printed beside it: there the Python
per rank dominates and 2 ranks are slower.

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
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = BLAS_THREADS
os.environ.setdefault("PYFLOW_CUDA", "sim")

import numpy as np  # noqa: E402

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

    one, two, one_losses, two_losses = [], [], [], []
    for _ in range(warmup + steps):
        barrier()
        if alone is not None:
            start = time.perf_counter()
            one_losses.append(step(alone, alone_opt, x_all, y_all))
            one.append(time.perf_counter() - start)
        barrier()
        start = time.perf_counter()
        two_losses.append(step(replica, parallel_opt, x, y))
        two.append(time.perf_counter() - start)
    with flow.trace() as tracer:   # what one 2-rank step sends: its collectives (after the timed steps)
        step(replica, parallel_opt, x, y)
    collectives = sum(record.name == "collective" for record in tracer.records)
    return {"one": one[warmup:], "two": two[warmup:], "one_losses": one_losses, "two_losses": two_losses,
            "collectives": collectives}


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
             f"BLAS threads per rank: {BLAS_THREADS} (OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = MKL_NUM_THREADS), "
             f"{os.cpu_count()} cores; median of {args.steps} steps after {args.warmup}, each ending with loss.item()",
             f"  {'global batch':>12} {'per rank':>9} {'1 rank ms':>10} {'2 ranks ms':>11} {'2 ranks / 1 rank':>17} "
             f"{'largest loss difference':>24} {'collectives / step':>19}"]
    for batch in (int(b) for b in args.batches.split(",")):
        results = flow.distributed.run(per_rank, world_size=WORLD, args=(batch, args.steps, args.warmup))
        first = results[0]
        one_ms = statistics.median(first["one"]) * 1e3
        two_ms = statistics.median(max(times) for times in zip(*(r["two"] for r in results))) * 1e3
        difference = float(np.abs(np.array(first["one_losses"]) - np.array(first["two_losses"])).max())
        assert difference < 1e-4, f"1 rank and {WORLD} ranks trained differently ({difference})"
        lines.append(f"  {batch:12} {batch // WORLD:9} {one_ms:10.2f} {two_ms:11.2f} {two_ms / one_ms:17.2f} "
                     f"{difference:24.1e} {first['collectives']:19}")
    lines.append("  (target: 2 ranks / 1 rank <= 1.0 at batch 1024; 2 ranks: the slowest rank's step; collectives: "
                 "those one 2-rank step issues on rank 0,\n   of which data parallel needs 5: the 4 gradients' "
                 "all-reduce and the loss's for item(); the rest: the mean's denominator P -> B (forward, and again in the "
                 "backward),\n   the seed gradient's P -> S(0), and the global zeros and ones autograd makes (a broadcast each))")
    if env.get_rank() == 0:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
