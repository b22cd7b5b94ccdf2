"""The compiler's memory planner against the memory lower bound (seed 004, ``pyflow.compiler.memory``).

Random op DAGs in topological order (= the device's task chain); op ``i`` produces one regst
of a log-uniform size (1 KiB .. 16 MiB) that lives from ``i`` to its last consumer.  Three shapes:

* ``chain``: each op reads the one before it, and 15% also read one of the 8 before that
  (residual connections);
* ``branchy``: each op reads 1-3 ops among the 50 before it, 2% read any earlier op
  (parallel branches, long skips);
* ``training``: a ``chain`` forward pass, then its backward pass in reverse: the backward op
  of forward op ``f`` reads the incoming gradient and ``f``'s inputs and output, so
  activations live until their backward use (the peak is at the turn).

For each shape and size (ops), a few seeds: the planned / lower-bound ratio (min, median, max
over the seeds) of every algorithm and of ``best``, which algorithm won, and the planning time
of ``best``, of ``mem_size_first`` (OneFlow's default) and of ``bottom_up`` (pyflow's) per op.

    python benchmarks/bench_memory_plan.py [--sizes 100 1000 10000] [--seeds 3]

Target: ``best`` within 1.02x of the lower bound on every workload (OneFlow's ViT plan: 1.0023x).

Then real compiles: ``nn.Graph`` training graphs (an MLP of ``depth`` Linear + ReLU layers,
SGD with momentum, gradient accumulation 2, the graph of tutorial 07 grown deeper): the Job's
op count, the whole compile time (trace, passes, OpGraph, TaskGraph, Plan) per op, which should
stay flat as the graph grows (OneFlow users report minutes: #9198, #10180), and the plan's
planned / lower bound bytes.

    python benchmarks/bench_memory_plan.py [--depths 2 8 32 128]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import numpy as np

from pyflow.compiler.memory import ALGORITHMS, lower_bound, plan_memory, requests_for_chain

KIB, MIB = 1024, 1024 * 1024
TARGET = 1.02


def log_uniform_sizes(n: int, rng) -> list[int]:
    return np.exp(rng.uniform(np.log(KIB), np.log(16 * MIB), n)).astype(np.int64).tolist()


def chain_parents(n: int, rng) -> list[list[int]]:
    parents = [[]]
    for i in range(1, n):
        mine = {i - 1}
        if i >= 2 and rng.random() < 0.15:
            mine.add(int(rng.integers(max(0, i - 9), i - 1)))
        parents.append(sorted(mine))
    return parents


def branchy_parents(n: int, rng) -> list[list[int]]:
    parents = [[]]
    for i in range(1, n):
        window = max(0, i - 50)
        mine = set(rng.integers(window, i, size=int(rng.integers(1, 4))).tolist())
        if rng.random() < 0.02:
            mine.add(int(rng.integers(0, i)))
        parents.append(sorted(mine))
    return parents


def consumers_of(parents: list[list[int]]) -> list[list[int]]:
    consumers = [[] for _ in parents]
    for child, mine in enumerate(parents):
        for p in mine:
            consumers[p].append(child)
    return consumers


def workload(shape: str, n: int, seed: int):
    rng = np.random.default_rng(seed)
    if shape == "training":
        m = n // 2  # forward ops 0..m-1; the backward op of forward op f sits at 2m - 1 - f
        sizes = log_uniform_sizes(m, rng)
        forward = chain_parents(m, rng)
        parents = forward + [[] for _ in range(m)]
        for f in range(m):
            b = 2 * m - 1 - f
            incoming = b - 1  # the gradient from the backward op before (the loss for f = m - 1)
            parents[b] = sorted({incoming, f, *forward[f]})
        sizes = sizes + sizes[::-1]  # a gradient is as big as its activation
    else:
        parents = (chain_parents if shape == "chain" else branchy_parents)(n, rng)
        sizes = log_uniform_sizes(n, rng)
    return requests_for_chain("rank0/cuda:0", sizes, consumers_of(parents))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 8, 32, 128])
    args = parser.parse_args()

    names = (*ALGORITHMS, "best")
    rows = [names[i:i + 4] for i in range(0, len(names), 4)]  # four columns a line
    print(f"planned / lower bound, min / median / max over {args.seeds} seeds; target: best <= {TARGET}")
    for i, row in enumerate(rows):
        print(f"{'workload' if i == 0 else '':<16}" + "".join(f"{n:>26}" for n in row))
    timings = collections.defaultdict(list)  # (shape, ops) -> [(best s, mem_size_first s, bottom_up s)]
    verdicts = []
    for shape in ("chain", "branchy", "training"):
        for n in args.sizes:
            ratios = collections.defaultdict(list)
            winners = collections.Counter()
            for seed in range(args.seeds):
                requests = workload(shape, n, seed)
                bound = lower_bound(requests)["rank0/cuda:0"]
                for name in names:
                    began = time.perf_counter()
                    plan = plan_memory(requests, algorithm=name)
                    took = time.perf_counter() - began
                    ratios[name].append(plan.block_sizes["rank0/cuda:0"] / bound)
                    if name == "best":
                        plan.check()
                        winners[plan.algorithms["rank0/cuda:0"]] += 1
                        best_time = took
                    elif name == "mem_size_first":
                        default_time = took
                    elif name == "bottom_up":
                        bottom_up_time = took
                timings[(shape, n)].append((best_time, default_time, bottom_up_time))

            def cell(name: str) -> str:
                r = ratios[name]
                return f"{min(r):.4f}/{statistics.median(r):.4f}/{max(r):.4f}"

            label = f"{shape} {n}"
            for i, row in enumerate(rows):
                print(f"{label if i == 0 else '':<16}" + "".join(f"{cell(name):>26}" for name in row))
            worst = max(ratios["best"])
            verdicts.append((label, worst, worst <= TARGET, dict(winners)))

    print("\nbest against the target, per workload (worst seed):")
    for label, worst, met, winners in verdicts:
        print(f"  {label:<16} {worst:.4f}  {'meets' if met else 'MISSES'} <= {TARGET}   won by {winners}")

    print("\nplanning time per op (median over seeds): best (all nine, early exits), mem_size_first, bottom_up:")
    for (shape, n), runs in timings.items():
        best, single, bottom_up = (statistics.median(run[k] for run in runs) for k in range(3))
        print(f"  {shape:<9} {n:>6} ops   best {best * 1e6 / n:7.1f} us/op ({best:7.3f} s)"
              f"   mem_size_first {single * 1e6 / n:7.1f} us/op ({single:7.3f} s)"
              f"   bottom_up {bottom_up * 1e6 / n:7.1f} us/op ({bottom_up:7.3f} s)")

    graph_compiles(args.depths)


def graph_compiles(depths: list[int]) -> None:
    """Compile nn.Graph training graphs of growing depth: ops, compile time per op, planned / lower bound."""
    import pyflow as flow

    print("\nnn.Graph training graphs (MLP, Linear(16, 16) + ReLU per layer, SGD momentum, grad acc 2):")
    print(f"  {'depth':>5} {'job ops':>8} {'tasks':>6} {'compile s':>10} {'us/op':>8}   planned / lower bound")
    for depth in depths:
        flow.manual_seed(0)
        layers = []
        for _ in range(depth):
            layers += [flow.nn.Linear(16, 16), flow.nn.ReLU()]
        model = flow.nn.Sequential(*layers)
        optimizer = flow.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        class Train(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.model = model
                self.add_optimizer(optimizer)
                self.config.set_gradient_accumulation_steps(2)

            def build(self, x):
                loss = (self.model(x) ** 2).mean()
                loss.backward()
                return loss

        g = Train()
        g(flow.randn(8, 16))
        seconds = sum(took for _, took in g.compile_log)
        (row,) = g.plan.memory_report()
        print(f"  {depth:>5} {len(g.job):>8} {len(g.plan.tasks):>6} {seconds:>10.3f} {seconds * 1e6 / len(g.job):>8.0f}"
              f"   {row['ratio']:.4f} ({row['planned_bytes']} / {row['lower_bound_bytes']} bytes)")


if __name__ == "__main__":
    main()
