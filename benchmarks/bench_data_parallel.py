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

**Two ways to train data parallel**, both timed in every run: the model's parameters global with SBP B
and the batch S(0) (the columns "2 ranks"), where every op runs through the global interpreter; and
``flow.nn.parallel.DistributedDataParallel`` (the columns "DDP"), a local replica per rank on its own
shard, whose gradients are averaged by one all-reduce per bucket from the backward's hooks: per op,
a rank pays what 1 rank pays, plus one collective per step.

**What 2 cores allow.**  Splitting the batch halves each rank's compute (the matmuls), but every
rank still issues every op of the step: the Python per op (interpreter, VM, SBP inference, boxing)
does not shrink with the batch, and the ranks add the gradients' all-reduce.  As threads, the
ranks share one GIL, so only the time numpy spends outside it (BLAS, elementwise loops) can
overlap; as processes they overlap fully but pay the copies of the transport.  So 2 ranks can only
win where the step is compute-bound.

**BLAS threads, each side its own.**  numpy's OpenBLAS takes one thread per core (2 here); two
ranks with 2 each would run four on two cores.  So each of the 2 ranks gets cores / 2
(``--blas-threads``; under mpiexec the launcher gives its ranks that already,
``launch.blas_environment``), while the 1-rank step runs *twice*, on two models trained alike: with
numpy's default (``--one-rank-blas-threads``, the cores) and with 1 thread, and the ratio is
against the faster of the two (on busy cores the second BLAS thread waits for a core on every call:
runs on this machine loaded 6-10 measured 37-67 ms for 1 rank with 2 threads against 14-30 ms with
1).  An OpenBLAS thread spins about 0.11 s after its last call before it sleeps (measured: 6-9 ms
of CPU per 10 ms), so after the 2-thread step rank 0 pauses 0.15 s: the spin would take a core
from the 2-rank step.  The comm-net thread (``mpi_commnet.py``) sleeps between its polls with a
back-off; it spun (``sched_yield``) for 20 ms after each progress before, 4-14 ms of CPU per 2-rank
step on rank 0 (``time.pthread_getcpuclockid`` per thread), 1.6-4.5 now.  The counts are set
through ``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` before numpy is
imported and at run time through OpenBLAS's own call; the counts in use are printed.

**Where a rank's time goes** (CPU per step and thread, batch 1024, under mpiexec, 1 BLAS thread):
1 rank: user thread 3.6-4.1 ms, VM scheduler 1.1-1.2, VM worker 12.5-13.3 (about 9 of it the
matmuls); each of 2 ranks: user thread 5.6-5.9 (the global ops, boxing, the collectives, the
bucket), scheduler 1.7, worker 8.7-8.9, ccl worker 0.6, comm-net 1.5-1.7.  The user thread was
6.6-8.5 before each kind of global call was decided once (``global_ops._Call``: about 9 Python calls
per global op besides its local op, against 32-35; 7,960 per step on a rank, against 9,930, and 5,430
for 1 rank).  So a rank of 2 spends about what 1 rank spends (17-18 ms) on half the samples: the
compute it saves, the global ops, the bucket and the collectives' instructions (84 a step against
63 for 1 rank: 3 collectives, 3 allocations and 11 stream events for them, the bucket's cat) add
back, and most of it holds the rank's GIL, so its threads cannot overlap it.

**In numbers.**  With ``F`` the fixed cost of a step (its Python) and ``C`` its compute, 1 rank takes
``F1 + C`` and 2 threaded ranks at best ``2 F2 + C/2`` (one GIL: their Python runs one after the other;
``F2 > F1``, the global ops' own work), so they break even only once ``C/2 > 2 F2 - F1``; 2 processes at
best ``F2 + C/2`` plus the collectives' latency, on 2 cores that other work shares.  The benchmark fits
``F`` and ``C`` per sample to its own smallest and largest batch and prints the batch where the two
lines cross (2 ranks never catch up when their time grows as fast as 1 rank's, as when the cores are
busy).  A small batch (64) is printed beside the large one: there the Python dominates.  In-process, 2
ranks break even at about 3,000-3,600 samples (the line two runs printed, on a machine loaded 10-14 on
its 2 cores, 3 collectives per step: 2 ranks / 1 rank 0.81-0.88 at 4,096, 1.8-2.1 at 1,024).  By the CPU
columns of those runs F1 is about 13 ms, F2 about 19.5 ms (CPU, so an upper bound on the part one GIL
serialises) and C about 9.4 ms per 1,000 samples: at batch 1024 C/2 is about 4.8 ms against 2 F2 - F1 of
up to 26 ms, so one GIL cannot break even there.  Under mpiexec the ranks' fixed costs overlap: a rank
costs ``F2 + C/2`` plus the 3 collectives' latency against ``F1 + C``, so it needs ``C/2 > F2 - F1``
(about 6.5 ms by those numbers: from about 1,400 samples, latency aside; at 1024, C/2 is about 4.8 ms).
With the 1-rank reference at its best BLAS setting and the machine loaded 6-10 (issue 31, the session
that made these changes), no batch up to 8,192 broke even in-process, and under mpiexec the ratio at
1024 was 1.9-3.1: two ranks need both cores at once, which a loaded machine rarely gives them.

**DDP by batch, and the bound.**  The break-even lines are fitted for both 2-rank ways.  In-process
(``--batches 1024,4096,8192 --steps 8``, a quiet machine, issue 31's last session), DDP / 1 rank was
1.49, 1.03 and 1.14, the global way 1.91, 1.39 and 1.36; the fit puts DDP's break-even in-process at
about 5,000-37,000 samples over two runs (the global way's beyond any batch measured).  It cannot go
far below 1 on 2 cores at any batch: the reference is 1 rank at its *faster* BLAS setting, and with 2
BLAS threads its matmuls already run on both cores (faster than with 1 thread at 1024 and 4096 in these
runs: 17.6-19.2 ms against 21.6-22.5 at 1024), so the compute of 1 rank is about as parallel as that of 2
ranks, and what the 2 ranks add (the collective, a second copy of every op's Python) has little left to
hide behind.  Data parallel on 2
cores wins only where one BLAS call cannot use both cores well, and its fixed cost is small beside
that.  Under mpiexec DDP breaks even at about 1,300-2,500 samples by the fit (``--batches 1024,4096``, three
runs: 1.02-1.10 at 1,024, 0.84-0.95 at 4,096; the global way 1.40-1.65 and 1.07-1.16).

    python benchmarks/bench_data_parallel.py [--batches 64,1024] [--steps 10] [--warmup 2] [--blas-threads 1]
        [--one-rank-blas-threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


WORLD = 2
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _flag_from_argv(flag: str, default: str) -> str:
    """``flag``'s value, read before numpy is imported (BLAS reads its thread count once, at load)."""
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return default


BLAS_THREADS = _flag_from_argv("--blas-threads", str(max(1, CORES // WORLD)))   # each of the 2 ranks: C/N
ONE_RANK_BLAS_THREADS = int(_flag_from_argv("--one-rank-blas-threads", str(CORES)))   # 1 rank: numpy's default
OPENBLAS_IDLE_SPIN = 0.15   # s: OpenBLAS's idle threads spin ~0.11 s (2**28 cycles) after a call before they sleep
NUMPY_LOADED_BEFORE = "numpy" in sys.modules   # under pyflow.distributed.launch: the launcher imported it
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = BLAS_THREADS
os.environ.setdefault("PYFLOW_CUDA", "sim")

import numpy as np  # noqa: E402


def _openblas_threads(wanted: int) -> str:
    """numpy's OpenBLAS thread count after setting it to ``wanted`` at run time (through ctypes).

    The environment variables act only when BLAS loads; a script run by the MPI launcher finds numpy
    loaded already (with the launcher's C/N threads per rank, ``launch.blas_environment``), and the
    1-rank step of this benchmark runs with more threads than the 2-rank step in the same process.
    Returns the count read back, or why not.
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


ONE_RANK_BLAS_IN_USE = _openblas_threads(ONE_RANK_BLAS_THREADS)   # read back: can it be raised at run time?
BLAS_IN_USE = _openblas_threads(int(BLAS_THREADS))

import pyflow as flow  # noqa: E402
from pyflow import env, nn  # noqa: E402
from pyflow.distributed import CollectiveDesc  # noqa: E402

FEATURES, HIDDEN, CLASSES = 784, 256, 10
LR, MOMENTUM = 0.05, 0.9


def mlp() -> nn.Module:
    flow.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def barrier() -> None:
    """Every rank waits here for the others (and for its own work: ``flow.sync`` first)."""
    flow.sync()
    transport, group = env.current().transport, tuple(range(env.get_world_size()))
    transport.barrier(group, transport.next_seq(group), CollectiveDesc("benchmark barrier"))


def per_rank(batch: int, steps: int, warmup: int, bucket_size: int = 10) -> dict:
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
    # rank 0 alone, one model per BLAS thread count: with 1 thread, and with numpy's default (one per core)
    counts = sorted({1, ONE_RANK_BLAS_THREADS}) if env.get_rank() == 0 else []
    alone = {n: mlp() for n in counts}
    alone_opt = {n: flow.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM) for n, model in alone.items()}
    x_all, y_all = flow.tensor(data), flow.tensor(labels)
    # DDP: a local replica per rank (rank 0's weights: the same as the others' here), its own shard, gradients
    # averaged by one all-reduce per bucket from the backward's hooks (pyflow/nn/parallel.py)
    share, me = batch // WORLD, env.get_rank()
    ddp_model = nn.parallel.DistributedDataParallel(mlp(), bucket_size=bucket_size)
    ddp_opt = flow.optim.SGD(ddp_model.parameters(), lr=LR, momentum=MOMENTUM)
    x_mine, y_mine = flow.tensor(data[me * share:(me + 1) * share]), flow.tensor(labels[me * share:(me + 1) * share])

    def step(model, optimizer, inputs, targets) -> float:
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss.item()

    one, one_cpu, one_losses = ({n: [] for n in counts} for _ in range(3))
    two, two_cpu, two_losses = [], [], []
    ddp, ddp_cpu, ddp_losses = [], [], []
    for _ in range(warmup + steps):
        barrier()
        for n in counts:
            _openblas_threads(n)   # process-wide: in-process, the other rank waits at the barrier meanwhile
            start, cpu = time.perf_counter(), time.process_time()
            one_losses[n].append(step(alone[n], alone_opt[n], x_all, y_all))
            one[n].append(time.perf_counter() - start)
            one_cpu[n].append(time.process_time() - cpu)
            _openblas_threads(int(BLAS_THREADS))
            if n > 1:
                time.sleep(OPENBLAS_IDLE_SPIN)   # its idle BLAS threads would spin on the 2-rank step's cores
        barrier()
        start, cpu = time.perf_counter(), time.process_time()
        two_losses.append(step(replica, parallel_opt, x, y))
        two.append(time.perf_counter() - start)
        two_cpu.append(time.process_time() - cpu)
        barrier()
        start, cpu = time.perf_counter(), time.process_time()
        ddp_losses.append(step(ddp_model, ddp_opt, x_mine, y_mine))   # this rank's shard's loss
        ddp.append(time.perf_counter() - start)
        ddp_cpu.append(time.process_time() - cpu)
    with flow.trace() as tracer:   # what one 2-rank step sends: its collectives (after the timed steps)
        step(replica, parallel_opt, x, y)
    collectives = sum(record.name == "collective" for record in tracer.records)
    return {"one": {n: t[warmup:] for n, t in one.items()}, "one_cpu": {n: t[warmup:] for n, t in one_cpu.items()},
            "two": two[warmup:], "two_cpu": two_cpu[warmup:], "one_losses": one_losses, "two_losses": two_losses,
            "collectives": collectives, "ddp": ddp[warmup:], "ddp_cpu": ddp_cpu[warmup:], "ddp_losses": ddp_losses}


def break_even(batches: list, one_ms: dict, parallel_ms: dict, under_mpi: bool) -> list:
    """Where 2 ranks would catch up with 1, from this run's own times: each mode's step time as a fixed
    cost plus a cost per sample, a line through the smallest and the largest batch measured.  ``parallel_ms``:
    per 2-rank mode (the global way, DDP), its times by batch."""
    small, large = min(batches), max(batches)
    if small == large:
        return ["  (give two batch sizes, e.g. --batches 64,1024, for the break-even batch)"]

    def line(times):
        per_sample = (times[large] - times[small]) / (large - small)
        return times[small] - per_sample * small, per_sample

    fixed_1, per_sample_1 = line(one_ms)
    lines = [f"  fixed cost per step (what does not grow with the batch: the Python of every op, the collectives) "
             f"and compute per 1,000 samples of the global batch: 1 rank {fixed_1:.1f} ms + {per_sample_1 * 1e3:.1f} ms"]
    for mode, times in parallel_ms.items():
        fixed, per_sample = line(times)
        lines.append(f"  {mode}: {fixed:.1f} ms + {per_sample * 1e3:.1f} ms per 1,000 samples; ")
        if per_sample >= per_sample_1:
            lines[-1] += ("its time grows with the batch as fast as 1 rank's in this run (the two cores are busy "
                          "elsewhere, or one GIL serialises the ranks): no batch breaks even here")
        else:
            even = (fixed - fixed_1) / (per_sample_1 - per_sample)
            lines[-1] += (f"by these measurements it breaks even with 1 rank at a global batch of about {max(even, 0):,.0f}"
                          f"{' (at or below ' + str(small) + ')' if even <= small else ''}")
    why = ("as threads, every rank's Python runs under one GIL: 2 ranks pay their fixed cost one after the other "
           "and overlap only the kernels that release it (BLAS)") if not under_mpi else \
          ("as processes, the ranks' Python overlaps, but a rank of 2 spends about what 1 rank spends on the "
           "whole step (the global ops' Python adds back the compute it saves), and needs both cores at once")
    lines.append(f"  what 2 cores allow: splitting the batch halves each rank's compute, not its fixed cost; {why}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64,1024", help="global batch sizes, comma-separated")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--bucket-size", type=int, default=10, help="DDP: parameters per all-reduce "
                        "(default 10, DistributedDataParallel's: the MLP's 4 in one bucket)")
    parser.add_argument("--blas-threads", default=BLAS_THREADS, help="BLAS threads of each of the 2 ranks "
                        "(default: cores / 2; set before numpy loads)")
    parser.add_argument("--one-rank-blas-threads", type=int, default=ONE_RANK_BLAS_THREADS, help="BLAS threads of the "
                        "1-rank step (default: the cores, as numpy takes; set at run time)")
    args = parser.parse_args()
    under_mpi = env.process_context().transport is not None and env.process_context().world_size > 1
    how = f"{WORLD} MPI processes (mpiexec)" if under_mpi else f"{WORLD} in-process ranks (threads, one GIL)"
    lines = [f"data parallel, MLP {FEATURES}-{HIDDEN}-{CLASSES}, SGD momentum, {how}; 1 rank: the same step "
             "eager on the whole batch, alternating with the 2-rank step in the same run",
             f"BLAS threads: 1 rank {ONE_RANK_BLAS_IN_USE} (numpy's default here: one per core), each of the 2 "
             f"ranks {BLAS_IN_USE} (asked {BLAS_THREADS}: OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = MKL_NUM_THREADS"
             f"{', the launcher' + chr(39) + 's C/N' if NUMPY_LOADED_BEFORE else ''}); both set at run time (OpenBLAS "
             f"call), the 2-rank step after a {OPENBLAS_IDLE_SPIN} s pause that lets idle BLAS threads stop spinning; "
             f"{CORES} cores; median of {args.steps} steps after {args.warmup}, each ending with loss.item()",
             f"  {'global batch':>12} {'per rank':>9} {'1 rank ms':>10} {'1 rank, 1 BLAS':>15} {'2 ranks ms':>11} "
             f"{'2 ranks / 1 rank':>17} {'1 rank CPU ms':>14} {'2 ranks CPU ms':>15} {'largest loss difference':>24} "
             f"{'collectives / step':>19} {'DDP ms':>8} {'DDP / 1 rank':>13} {'DDP CPU ms':>11}"]
    batches, one_by_batch, two_by_batch, ddp_by_batch = [int(b) for b in args.batches.split(",")], {}, {}, {}
    for batch in batches:
        results = flow.distributed.run(per_rank, world_size=WORLD, args=(batch, args.steps, args.warmup, args.bucket_size))
        first = results[0]
        ms = {n: statistics.median(times) * 1e3 for n, times in first["one"].items()}
        best = min(ms, key=ms.get)   # the 1 rank's faster BLAS setting in this run: the reference
        one_ms, one_alone_ms = ms[ONE_RANK_BLAS_THREADS], ms[1]
        two_ms = statistics.median(max(times) for times in zip(*(r["two"] for r in results))) * 1e3
        difference = max(float(np.abs(np.array(losses) - np.array(first["two_losses"])).max())
                         for losses in first["one_losses"].values())
        assert difference < 1e-4, f"1 rank and {WORLD} ranks trained differently ({difference})"
        shard_mean = np.mean([r["ddp_losses"] for r in results], axis=0)   # equal shards: the whole batch's mean
        ddp_difference = max(float(np.abs(np.array(losses) - shard_mean).max()) for losses in first["one_losses"].values())
        assert ddp_difference < 1e-4, f"1 rank and {WORLD} DDP ranks trained differently ({ddp_difference})"
        ddp_ms = statistics.median(max(times) for times in zip(*(r["ddp"] for r in results))) * 1e3
        ddp_cpu = statistics.median(first["ddp_cpu"]) * 1e3
        one_cpu, two_cpu = statistics.median(first["one_cpu"][best]) * 1e3, statistics.median(first["two_cpu"]) * 1e3
        one_by_batch[batch], two_by_batch[batch], ddp_by_batch[batch] = ms[best], two_ms, ddp_ms
        lines.append(f"  {batch:12} {batch // WORLD:9} {one_ms:10.2f} {one_alone_ms:15.2f} {two_ms:11.2f} "
                     f"{two_ms / ms[best]:17.2f} {one_cpu:14.2f} {two_cpu:15.2f} {difference:24.1e} "
                     f"{first['collectives']:19} {ddp_ms:8.2f} {ddp_ms / ms[best]:13.2f} {ddp_cpu:11.2f}")
    lines.append(f"  (target: 2 ranks / 1 rank <= 1.0 at batch 1024; 1 rank: with {ONE_RANK_BLAS_THREADS} BLAS threads "
                 "and with 1, the ratio against the faster (on busy cores more BLAS threads can be slower);\n"
                 "   2 ranks: the slowest rank's step; CPU: the process's CPU time over the step (1 rank: the faster), "
                 "all its threads\n   (in-process: both ranks'; under mpiexec: rank 0's process); collectives: "
                 "those one 2-rank step issues on rank 0: the 4 gradients' all-reduce as one\n   bucket "
                 "(Optimizer._gradients), the mean's denominator P -> B (once: the backward reuses the forward's "
                 "boxing) and the loss's for item());\n   DDP: nn.parallel.DistributedDataParallel, a local replica per "
                 "rank on its shard (no global tensor), its 4 gradients averaged by one all-reduce (one bucket),\n"
                 "   each rank's loss.item() its shard's; the losses checked: the ranks' mean against 1 rank's)")
    lines += break_even(batches, one_by_batch, {"2 ranks, global": two_by_batch, "2 ranks, DDP": ddp_by_batch},
                        under_mpi)
    if env.get_rank() == 0:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
