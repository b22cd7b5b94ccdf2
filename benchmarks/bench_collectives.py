"""All-reduce and all-gather bandwidth: pyflow's MPI transport against mpi4py on the same buffers.

The MPI transport (``pyflow/distributed/mpi_transport.py``) hands every call to
its process's comm-net thread, checks the ranks' descriptors (in the same round
as the first data) and moves the arrays with point-to-point messages.  This
script measures what that costs against calling mpi4py directly
(``comm.Allreduce`` / ``comm.Allgather``) on the same numpy buffers, in the same
processes, interleaved, best of ``--rounds``: ``ratio = mpi4py time / pyflow
time`` (target >= 0.9 for messages of 1 MB and more).  For comparison, the
in-process transport (ranks as threads of one process) on the same sizes.

In the same processes, interleaved too, it times the *floor* of the design
(``collective_floor.py``): the leanest transport built on pyflow's design (one
thread makes every MPI call, round 1 carries the cross-rank header check,
outputs from the host pool), with nothing else on the path.  ``floor ratio =
mpi4py time / floor time`` says what the design itself allows on this machine;
``pyflow/floor = floor time / pyflow time`` says how close pyflow comes to it.

Bandwidth is the algorithm bandwidth: the message size (one rank's array: the
all-reduce's input, the all-gather's piece) over the time of one call.

    python benchmarks/bench_collectives.py [--sizes 65536,1048576,4194304,16777216] [--rounds 5]
        [--write benchmarks/results/collectives_cpu.txt]

runs ``mpiexec -n 2`` and ``mpiexec -n 4`` of itself (``--worker``) and prints a table: MPICH's or
Open MPI's ``mpiexec``, as root too (``pyflow.distributed.launch.local_job``, as the tests' MPI jobs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time

import numpy as np

TARGET = 0.9
OPS = ("all_reduce", "all_gather")


def _time(fn, calls: int, sync) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls


def _calls(size: int) -> int:
    """Calls per timing: enough to last a few milliseconds, at most 40."""
    return max(4, min(40, (64 << 20) // max(size, 1) // 4))


def worker(sizes: list, rounds: int) -> None:
    """In each MPI process: time both ways; rank 0 prints one JSON line per (op, size)."""
    import pyflow as flow   # this process becomes its MPI rank
    from mpi4py import MPI

    from collective_floor import FloorTransport
    from pyflow.distributed import CollectiveDesc

    comm, transport = MPI.COMM_WORLD, flow.env.current().transport
    floor = FloorTransport(comm)
    rank, n = comm.Get_rank(), comm.Get_size()
    group = tuple(range(n))
    for size in sizes:
        a = np.random.default_rng(rank).standard_normal(size // 4).astype(np.float32)
        out_reduce, out_gather = np.empty_like(a), np.empty(n * a.size, np.float32)
        desc = CollectiveDesc("bench", a.shape, "float32")
        key = desc.key()
        ways = {
            "all_reduce": {"mpi4py": lambda: comm.Allreduce(a, out_reduce),
                           "pyflow": lambda: transport.all_reduce(a, group, transport.next_seq(group), desc),
                           "floor": lambda: floor.all_reduce(a, key)},
            "all_gather": {"mpi4py": lambda: comm.Allgather(a, out_gather),
                           "pyflow": lambda: transport.all_gather(a, group, transport.next_seq(group), desc),
                           "floor": lambda: floor.all_gather(a, key)},
        }
        for op, timed in ways.items():
            timed["mpi4py"]()   # the same answer every way, first
            want = (out_reduce if op == "all_reduce" else out_gather).copy()
            for way in ("pyflow", "floor"):
                np.testing.assert_allclose(timed[way](), want, rtol=1e-5, atol=1e-5)
            best = dict.fromkeys(timed, float("inf"))
            for _ in range(rounds):   # interleaved, so all see the same machine
                for way, fn in timed.items():
                    best[way] = min(best[way], _time(fn, _calls(size), comm.Barrier))
            if rank == 0:
                print(json.dumps({"n": n, "op": op, "size": size, **best}), flush=True)
    floor.close()


def in_process(sizes: list, n: int, rounds: int) -> dict:
    """The in-process transport (n ranks as threads): seconds per call, by (op, size)."""
    import threading

    import pyflow as flow
    from pyflow.distributed import CollectiveDesc

    results = {}
    barrier = threading.Barrier(n)

    def body():
        transport, rank = flow.env.current().transport, flow.env.get_rank()
        group = tuple(range(n))
        for size in sizes:
            a = np.random.default_rng(rank).standard_normal(size // 4).astype(np.float32)
            desc = CollectiveDesc("bench", a.shape, "float32")
            for op in OPS:
                call = getattr(transport, op)
                best = min(_time(lambda: call(a, group, transport.next_seq(group), desc), _calls(size), barrier.wait)
                           for _ in range(rounds))
                if rank == 0:
                    results[(op, size)] = best

    flow.distributed.run(body, n)
    return results


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="65536,1048576,4194304,16777216", help="bytes per rank, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--procs", default="2,4")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--write", help="also write the table to this file")
    parser.add_argument("--note", default="", help="a line about the run for the file's header")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.worker:
        worker(sizes, args.rounds)
        return
    from pyflow.distributed.launch import find_mpiexec, local_job, mpi_flavor

    mpiexec = find_mpiexec()
    flavor = mpi_flavor(mpiexec)
    rows, lines = [], []
    for n in (int(p) for p in args.procs.split(",")):
        command, environment = local_job(n, [sys.executable, os.path.abspath(__file__), "--worker", "--sizes",
                                             args.sizes, "--rounds", str(args.rounds)], mpiexec, flavor)
        done = subprocess.run(command, env=environment, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{shlex.join(command)} failed with status {done.returncode}:\n{done.stderr[-3000:]}")
        threads = in_process(sizes, n, args.rounds)
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                row["threads"] = threads[(row["op"], row["size"])]
                rows.append(row)
    lines.append(f"{'procs':>5}  {'op':<10} {'size':>6}  {'mpi4py MB/s':>11} {'pyflow MB/s':>11} {'ratio':>6}  "
                 f"{'floor MB/s':>10} {'ratio':>6} {'pyflow/floor':>12}  {'threads MB/s':>12} {'ratio':>6}")
    for r in rows:
        mb = r["size"] / 2**20
        lines.append(f"{r['n']:>5}  {r['op']:<10} {_size(r['size']):>6}  {mb / r['mpi4py']:>11.0f} "
                     f"{mb / r['pyflow']:>11.0f} {r['mpi4py'] / r['pyflow']:>6.2f}  {mb / r['floor']:>10.0f} "
                     f"{r['mpi4py'] / r['floor']:>6.2f} {r['floor'] / r['pyflow']:>12.2f}  "
                     f"{mb / r['threads']:>12.0f} {r['mpi4py'] / r['threads']:>6.2f}")
    big = [r for r in rows if r["size"] >= 1 << 20]
    for who in ("pyflow", "floor") if big else ():
        ratios = [r["mpi4py"] / r[who] for r in big]
        lines.append(f"{who}: ratio = mpi4py's time / {who}'s (same buffers, interleaved, best of {args.rounds}); "
                     f"target >= {TARGET} from 1 MB: worst {min(ratios):.2f} "
                     f"({'met' if min(ratios) >= TARGET else 'missed'}); met for {sum(b >= TARGET for b in ratios)} "
                     f"of {len(ratios)} rows")
    text = "\n".join(lines)
    print(text)
    if args.write:
        command = shlex.join([os.path.relpath(sys.executable)] + sys.argv)
        header = (f"# benchmarks/bench_collectives.py; command: {command}\n"
                  f"# machine: {os.cpu_count()}-core {platform.machine()} VM, CPython {platform.python_version()}, "
                  f"{'Open MPI' if flavor == 'openmpi' else 'MPICH'} ({mpiexec}) with mpi4py; "
                  f"date: {datetime.date.today()}\n"
                  + (f"# {args.note}\n" if args.note else ""))
        with open(args.write, "w") as out:
            out.write(header + text + "\n")


if __name__ == "__main__":
    main()
