"""A 4-stage pipeline-parallel nn.Graph on 4 ranks: N calls in flight at once vs the same N calls one by one.

The graph is four ``nn.Linear`` stages, stage s placed on rank s (``set_stage(s, placement)``,
OneFlow's style, as tutorial 7 and ``tests/test_graph_global.py`` do), activations crossing
ranks as send / recv tasks; every rank runs its own tasks of the one Plan on its own actor
runtime (in-process ranks, ``flow.distributed.run``).  The stage costs dominate: each stage's
matmul act sleeps ``--cost`` seconds (``Graph.act_fn``; ``time.sleep`` releases the GIL, as a
kernel on a device would), so the numbers measure the runtime's pipelining, not numpy.

Three ways to run ``--calls`` calls, timed on every rank (the slowest rank counts):

* ``one by one``   - ``g(x).numpy()`` per call: each call is waited for (``numpy()`` of the
  global output is a collective of all ranks), so the stages take turns: about 4 x cost per call;
* ``in flight``    - ``g(x)`` for every input, then ``numpy()`` of every output: ``g(x)`` returns
  once its rank's part of the call is issued (``pyflow/graph/graph.py``), so while rank 3 works on
  call n, rank 0 already works on call n + 3: about (calls + 3) x cost in all;
* ``call over``    - ``g(x)``, then wait until the call is over *on this rank* (its sink tick acted)
  before the next, outputs read at the end: what nn.Graph did before its calls could return early
  (each rank still works on its own stage only, so the ranks overlap too);
* ``runtime.launch`` - the same through the graph's runtime directly (``g.runtime.launch``), no VM
  instruction around the calls: what nn.Graph's own machinery costs.

The ideal ratio of "one by one" to "in flight" is 4 x calls / (calls + 3) (the bound).

    python benchmarks/bench_graph_pipeline.py [--cost 0.02] [--calls 16]
        [--write benchmarks/results/graph_pipeline_cpu.txt]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import pyflow as flow
from pyflow import nn
from pyflow.runtime.act import act

from bench_pipeline import write_result   # (the script's folder is on sys.path)

STAGES = 4


def sleeping_stages(cost: float):
    """An act whose matmul acts (one per stage) sleep ``cost`` seconds first."""
    def act_fn(plan, task, ins, outs, j, call):
        if task.op_type == "matmul":
            time.sleep(cost)
        return act(plan, task, ins, outs, j, call)
    return act_fn


def run_rank(cost: float, calls: int, repeats: int) -> dict:
    """One rank's part: build the graph, warm up, time the three ways (best of ``repeats``)."""
    B = flow.sbp.broadcast
    places = [flow.placement("cpu", [s]) for s in range(STAGES)]
    flow.manual_seed(0)
    layers = [nn.Linear(8, 8).to_global(placement=p, sbp=B) for p in places]

    class Pipeline(nn.Graph):
        def __init__(self):
            super().__init__()
            for s, layer in enumerate(layers):
                setattr(self, f"stage{s}", layer)
                getattr(self, f"stage{s}").to(nn.graph.GraphModule).set_stage(s, places[s])
            self.config.set_outputs_buffer_size(STAGES + 1)

        def build(self, x):
            for s in range(STAGES):
                x = getattr(self, f"stage{s}")(x).tanh()
            return x

    g = Pipeline()
    g.act_fn = sleeping_stages(cost)
    rng = np.random.default_rng(1)
    xs = [flow.tensor(rng.standard_normal((4, 8)).astype(np.float32), placement=places[0], sbp=B)
          for _ in range(calls)]
    want = [g(x).numpy() for x in xs[:2]]   # compile, warm up

    def one_by_one():
        return [g(x).numpy() for x in xs]

    def in_flight():
        ys = [g(x) for x in xs]
        return [y.numpy() for y in ys]

    def call_over():
        ys = []
        for x in xs:
            ys.append(g(x))
            while g.runtime.calls_in_flight():
                time.sleep(0.0005)
        return [y.numpy() for y in ys]

    def through_runtime():
        handles = [g.runtime.launch([x]) for x in xs]
        return [h.result()[0].numpy() for h in handles]

    times = {}
    ways = (("one by one", one_by_one), ("in flight", in_flight), ("call over", call_over),
            ("runtime.launch", through_runtime))
    for name, way in ways:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            got = way()
            best = min(best, time.perf_counter() - start)
            for a, b in zip(got[:2], want):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)   # the same numbers every way
        times[name] = best
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cost", type=float, default=0.02, help="seconds per stage per call (a sleeping matmul act)")
    parser.add_argument("--calls", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", help="also write the table to this file (with the date and command)")
    args = parser.parse_args()
    per_rank = flow.distributed.run(lambda: run_rank(args.cost, args.calls, args.repeats), world_size=STAGES)
    times = {name: max(t[name] for t in per_rank) for name in per_rank[0]}   # the slowest rank
    bound = STAGES * args.calls / (args.calls + STAGES - 1)
    ideal = {"one by one": args.calls * STAGES * args.cost, "in flight": (args.calls + STAGES - 1) * args.cost}
    lines = [f"{STAGES}-stage pipeline nn.Graph on {STAGES} in-process ranks, {args.calls} calls, each stage "
             f"{args.cost * 1e3:g} ms per call (a sleeping matmul act); best of {args.repeats}, slowest rank",
             f"{'way':<16}{'seconds':>10}{'ms/call':>10}{'ideal s':>10}"]
    for name, seconds in times.items():
        ideal_s = ideal.get(name, ideal["in flight"])
        lines.append(f"{name:<16}{seconds:>10.3f}{seconds / args.calls * 1e3:>10.2f}{ideal_s:>10.3f}")
    ratio = times["one by one"] / times["in flight"]
    lines.append(f"one by one / in flight = {ratio:.2f} (bound 4 x calls / (calls + 3) = {bound:.2f}; "
                 f"{ratio / bound:.2f} of it)")
    lines.append(f"one by one / runtime.launch = {times['one by one'] / times['runtime.launch']:.2f}")
    print("\n".join(lines))
    if args.write:
        write_result(args.write, "no GPU (cpu ranks; the stages sleep)", lines,
                     "the machine was shared with other sessions during the run")


if __name__ == "__main__":
    main()
