"""Cost of one barrier in pyflow's simulator vs Numba's stock simulator.

Prints, for several block sizes, the time of one block barrier (syncthreads) and
one grid barrier (this_grid().sync()) in pyflow's concurrent-grid simulator,
next to one syncthreads in the stock simulator with the same number of threads
(the stock simulator's grid sync is only a block barrier, so that is its best
case).  Cost per barrier = (time with N barriers - time with 0) / N, best of R.

    python benchmarks/bench_sim_barriers.py [--barriers 200] [--repeats 3]

Target (issue 2): pyflow's barrier <= 1/3 of the stock one.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("PYFLOW_CUDA", "sim")

import numpy as np  # noqa: E402

from pyflow.kernels import jit  # noqa: E402
from pyflow.kernels.backend import cuda, is_simulator  # noqa: E402


def block_barriers(n):
    for _ in range(n[0]):
        cuda.syncthreads()


def grid_barriers(n):
    for _ in range(n[0]):
        cuda.cg.this_grid().sync()


def per_barrier(launch, barriers: int, repeats: int) -> float:
    def best(count):
        arg = np.array([count])
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            launch(arg)
            times.append(time.perf_counter() - start)
        return min(times)

    return (best(barriers) - best(0)) / barriers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--barriers", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not is_simulator():
        raise SystemExit("this benchmark compares simulators: run with PYFLOW_CUDA=sim")

    ours_block, ours_grid = jit(block_barriers), jit(grid_barriers)
    stock_block = cuda.jit(block_barriers)
    print(f"{'threads':>8} {'layout':>10} {'stock syncthreads':>18} {'pyflow syncthreads':>19} "
          f"{'ratio':>6} {'pyflow grid.sync':>17} {'ratio':>6}")
    worst = 0.0
    for threads, blocks in [(32, 1), (64, 2), (128, 4), (256, 4)]:
        per_block = threads // blocks
        stock = per_barrier(stock_block[1, threads], args.barriers, args.repeats)
        ours = per_barrier(ours_block[1, threads], args.barriers, args.repeats)
        grid = per_barrier(ours_grid[blocks, per_block], args.barriers, args.repeats)
        worst = max(worst, ours / stock, grid / stock)
        print(f"{threads:>8} {f'{blocks}x{per_block}':>10} {stock * 1e3:>15.3f} ms {ours * 1e3:>16.3f} ms "
              f"{ours / stock:>6.3f} {grid * 1e3:>14.3f} ms {grid / stock:>6.3f}")
    verdict = "meets" if worst <= 1 / 3 else "MISSES"
    print(f"worst ratio pyflow/stock = {worst:.3f} ({verdict} the <= 0.333 target)")


if __name__ == "__main__":
    main()
