"""Seed 003's pipeline on the actor runtime: throughput against the bottleneck bound, by regst num.

Four actors in a row, as in seed 003 (5.5.5): data loading -> preprocessing -> copy ->
training.  Each act sleeps its stage's cost (``time.sleep`` releases the GIL, as a kernel on
a device or an I/O wait would); one stage, the bottleneck, costs twice as much as the others.
The Plan is ``pyflow.runtime.pipeline.linear_pipeline_plan`` (control regsts: only pieces and
back pressure, no memory, no VM work), every stage on a thread of its own.

For regst num 1, 2, 3 and for each choice of bottleneck stage: launch ``--calls`` calls at
once, measure the steady-state rate at the sink (calls per second, the first ``stages + 1``
calls left out) and divide by the bottleneck bound ``1 / bottleneck cost``.

* regst num 1: a stage may start piece i + 1 only after the next stage finished piece i, so
  the period is at least the largest cost of two neighbours (``model`` column: bound /
  (c_s + c_s+1));
* regst num >= 2: the faster stages work ahead into the second regst and wait; the pipeline
  runs at the bottleneck's rate.  Target: >= 0.95 of the bound at regst num 2.

Last, the runtime's own cost: the same pipeline with zero-cost stages (acts per second), and
milliseconds per call of two small ``nn.Graph`` s (the simulator's kernels included) on the
actors, in deterministic mode and on the sequential interpreter.

    python benchmarks/bench_pipeline.py [--cost 0.005] [--calls 40] [--write benchmarks/results/pipeline_cpu.txt]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

from pyflow.runtime import Runtime
from pyflow.runtime.pipeline import linear_pipeline_plan, sleeping_act

STAGES = ["loading", "preprocessing", "copy", "training"]
TARGET = 0.95


def steady_rate(costs: dict, regst_num: int, calls: int) -> float:
    """Calls per second at the sink once the pipeline is full."""
    plan = linear_pipeline_plan(STAGES, regst_num=regst_num)
    with Runtime(plan, act_fn=sleeping_act(costs), max_calls_in_flight=calls) as rt:
        for handle in [rt.launch([]) for _ in range(calls)]:
            handle.result()
        ends = sorted(r.end for r in rt.timeline() if r.op_name == "sink_tick")[len(STAGES) + 1:]
    return (len(ends) - 1) / (ends[-1] - ends[0])


def overhead(calls: int) -> float:
    """Acts per second of the runtime alone (zero-cost stages, regst num 2)."""
    plan = linear_pipeline_plan(STAGES, regst_num=2)
    with Runtime(plan, act_fn=sleeping_act({}), max_calls_in_flight=calls) as rt:
        start = time.perf_counter()
        for handle in [rt.launch([]) for _ in range(calls)]:
            handle.result()
        seconds = time.perf_counter() - start
    return calls * len(plan.tasks) / seconds


def graph_call_ms(executor: str, calls: int = 40, repeats: int = 3) -> dict:
    """ms per call of two small graphs: cpu -> cuda inference, and a k=2 training step (best of ``repeats``)."""
    import pyflow as flow
    from pyflow import nn

    class TwoStage(nn.Graph):
        def build(self, x):
            return (x * 2.0).relu().to("cuda") + 1.0

    model = nn.Linear(3, 2)

    class Train(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(flow.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
            self.config.set_gradient_accumulation_steps(2)

        def build(self, x):
            loss = self.model(x).tanh().sum()
            loss.backward()
            return loss

    found = {}
    for graph in (TwoStage(), Train()):
        graph.executor = executor
        x = flow.randn(4, 3)
        graph(x).numpy()   # compile, warm the kernels
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(calls):
                out = graph(x)
            out.numpy()
            best = min(best, (time.perf_counter() - start) / calls * 1e3)
        found[graph.name] = best
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cost", type=float, default=0.005, help="seconds per act of a fast stage")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--write", help="also write the table to this file (with the date and command)")
    args = parser.parse_args()
    lines = [f"throughput / bottleneck bound (steady state, {args.calls} calls, fast stages {args.cost * 1e3:g} ms, "
             f"bottleneck {2 * args.cost * 1e3:g} ms); target >= {TARGET} at regst num 2",
             f"{'bottleneck':<15}{'model r=1':>10}{'regst num 1':>13}{'regst num 2':>13}{'regst num 3':>13}"]
    worst = 1.0
    for bottleneck in STAGES:
        costs = {s: (2 * args.cost if s == bottleneck else args.cost) for s in STAGES}
        bound = 1 / max(costs.values())
        pair = max(costs[a] + costs[b] for a, b in zip(STAGES, STAGES[1:]))
        ratios = [steady_rate(costs, num, args.calls) / bound for num in (1, 2, 3)]
        worst = min(worst, ratios[1])
        lines.append(f"{bottleneck:<15}{max(costs.values()) / pair:>10.3f}"
                     + "".join(f"{r:>13.3f}" for r in ratios))
    lines.append(f"worst at regst num 2: {worst:.3f} ({'meets' if worst >= TARGET else 'misses'} the {TARGET} target)")
    lines.append(f"runtime overhead: {overhead(400):,.0f} acts/s with zero-cost stages (6 actors, 4 threads)")
    lines.append("nn.Graph, ms per call, best of 3 x 40 calls (its simulated cuda kernels included):")
    lines.append(f"  {'executor':<15}{'TwoStage':>10}{'Train (k=2)':>13}")
    for executor in ("actors", "deterministic", "sequential"):
        ms = graph_call_ms(executor)
        lines.append(f"  {executor:<15}{ms['TwoStage']:>10.2f}{ms['Train']:>13.2f}")
    print("\n".join(lines))
    if args.write:
        write_result(args.write, "no GPU (the stages sleep; graph kernels run in the CUDA simulator)", lines,
                     "the machine was shared with other sessions during the run: ratios are indicative to ~1%")


def write_result(path: str, device: str, lines: list, note: str) -> None:
    """``lines`` into ``path`` behind a header: the script and its command, the machine, ``device``, the date,
    and ``note`` (the load during the run)."""
    command = " ".join([".venv/bin/python", *sys.argv])
    header = [f"# benchmarks/{os.path.basename(sys.argv[0])}; command: {command}",
              f"# machine: {os.cpu_count()}-core {platform.machine()}, {platform.python_implementation()} "
              f"{platform.python_version()}, {device}; date: {datetime.date.today().isoformat()}",
              f"# {note}"]
    with open(path, "w", encoding="utf-8") as file:
        file.write("\n".join(header + lines) + "\n")


if __name__ == "__main__":
    main()
