"""One training step of a small MLP, pyflow against PyTorch CPU (eager mode, autograd, optimizer).

The step is ``zero_grad(); loss = cross_entropy(model(x), y); loss.backward();
optimizer.step()`` for an MLP 64 -> 128 -> 128 -> 10 (Linear, ReLU, Linear, ReLU,
Linear), batch 64, float32, on cpu, with SGD (momentum 0.9).  Both frameworks
start from the same weights (pyflow's, copied into PyTorch) and see the same
batches, so their losses agree, which the benchmark checks.  Each step ends
with ``loss.item()`` (pyflow's ops are asynchronous: reading the loss waits for
the step), and the times are the median over ``--steps`` steps after
``--warmup`` steps, for
* pyflow, threaded VM (the default: scheduler thread + worker thread);
* pyflow, step-through mode (``flow.vm.sync_mode()``: everything on this thread);
* PyTorch CPU eager (if installed: ``pip install torch==2.13.0``), one thread.
It also counts the VM instructions one pyflow step issues (with ``flow.trace()``),
by phase, and divides the step time by that count.

Its last section asks whether compiling pays off: the training step of an MLP of depth 8 (64 -> 128 x 7
-> 10) and of an MLP 784 -> 256 -> 10 as a compiled ``nn.Graph`` against the same step eager (the steps
alternate, so the machine's load hits both alike), the same Plan on the sequential interpreter (no
actors: what the Plan itself costs), the Python calls one graph call and one eager step make (cProfile),
the VM instructions each has run (``flow.trace()``: an act's ops keep their stream's order, so the VM
fuses a run of them into one instruction), and the actor runtime's own rate: acts per second of a 16-stage
pipeline Plan whose acts cost nothing (the best of three runs).  It prints ratios only; nothing is asserted about times.

    python benchmarks/bench_train_step.py [--steps 50] [--warmup 10] [--batch 64] [--hidden 128] [--graph-only]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time

os.environ.setdefault("PYFLOW_CUDA", "sim")
# one BLAS thread, as PyTorch gets one below (``torch.set_num_threads(1)``): numpy's OpenBLAS would otherwise start a
# thread per core whose spin-waits, on a 2-core machine shared with other work, slowed a step up to 50x (depth 8:
# 850 ms against 20 ms) in a way that moved with the load, not with pyflow.  OPENBLAS_NUM_THREADS=2 sets it back.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import pyflow as flow  # noqa: E402
from pyflow import nn  # noqa: E402

IN_FEATURES, CLASSES = 64, 10
LR, MOMENTUM = 0.05, 0.9


def batches(n: int, batch: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n`` batches of random inputs and labels (the same for both frameworks)."""
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(batch, IN_FEATURES)).astype(np.float32),
             rng.integers(0, CLASSES, size=batch).astype(np.int64)) for _ in range(n)]


def pyflow_model(hidden: int) -> nn.Module:
    flow.manual_seed(0)
    return nn.Sequential(nn.Linear(IN_FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, CLASSES))


def pyflow_steps(model: nn.Module, data) -> tuple[list[float], list[float]]:
    """Train on ``data`` (host arrays); returns (seconds per step, losses)."""
    optimizer = flow.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = nn.CrossEntropyLoss()
    inputs = [(flow.tensor(x), flow.tensor(y)) for x, y in data]   # made before the clock starts
    flow.sync()
    times, losses = [], []
    for x, y in inputs:
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())                                   # waits for the step's instructions
        times.append(time.perf_counter() - start)
    return times, losses


def pyflow_instructions(hidden: int, data) -> dict[str, collections.Counter]:
    """The VM instructions of one step (the second: the momentum buffers exist), traced phase by phase."""
    model = pyflow_model(hidden)
    optimizer = flow.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = nn.CrossEntropyLoss()
    (x0, y0), (x1, y1) = [(flow.tensor(x), flow.tensor(y)) for x, y in data[:2]]
    optimizer.zero_grad()
    loss_fn(model(x0), y0).backward()
    optimizer.step()
    phases = {}
    with flow.trace() as tracer:
        optimizer.zero_grad()
    phases["zero_grad"] = tracer
    with flow.trace() as tracer:
        loss = loss_fn(model(x1), y1)
    phases["forward + loss"] = tracer
    with flow.trace() as tracer:
        loss.backward()
    phases["backward"] = tracer
    with flow.trace() as tracer:
        optimizer.step()
    phases["optimizer.step"] = tracer
    return {name: collections.Counter(r.name for r in tracer.records) for name, tracer in phases.items()}


def torch_steps(model: nn.Module, data, hidden: int) -> tuple[list[float], list[float]] | None:
    """The same step in PyTorch, from ``model``'s weights; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    reference = torch.nn.Sequential(torch.nn.Linear(IN_FEATURES, hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(hidden, CLASSES))
    reference.load_state_dict({name: torch.from_numpy(p.numpy()) for name, p in model.state_dict().items()})
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = torch.nn.CrossEntropyLoss()
    inputs = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in data]
    times, losses = [], []
    for x, y in inputs:
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(reference(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    return times, losses


# --- nn.Graph against eager: does compiling pay off? ----------------------------------------------------------

GRAPH_CASES = (("MLP depth 8", 64, [128] * 7, 10), ("MLP 784-256-10", 784, [256], 10))


def mlp(features: int, hidden: list, classes: int) -> nn.Module:
    """Linear + ReLU per hidden width, then a Linear to ``classes``: ``len(hidden) + 1`` Linear layers."""
    flow.manual_seed(0)
    layers, width = [], features
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, classes))


def graph_and_eager_steps(case, batch: int, steps: int) -> tuple:
    """Seconds per training step (each ending with ``loss.item()``) of the same MLP, as a compiled
    ``nn.Graph`` (its first call, the compile, not timed) on the actor runtime and on the sequential
    interpreter, and eagerly; returns (graph, sequential, eager, the graph, the eager step ``(x, y) -> None``)."""
    _, features, hidden, classes = case
    rng = np.random.default_rng(1)
    data = [(flow.tensor(rng.normal(size=(batch, features)).astype(np.float32)),
             flow.tensor(rng.integers(0, classes, size=batch).astype(np.int64))) for _ in range(steps + 1)]
    loss_fn = nn.CrossEntropyLoss()
    model = mlp(features, hidden, classes)
    optimizer = flow.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    class TrainStep(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(optimizer)

        def build(self, x, y):
            loss = loss_fn(self.model(x), y)
            loss.backward()
            return loss

    graph = TrainStep()
    graph(*data[0]).item()   # trace + compile + the runtime's start
    eager_model = mlp(features, hidden, classes)
    eager_opt = flow.optim.SGD(eager_model.parameters(), lr=LR, momentum=MOMENTUM)

    def eager_step(x, y):
        eager_opt.zero_grad()
        loss = loss_fn(eager_model(x), y)
        loss.backward()
        eager_opt.step()
        loss.item()

    eager_step(*data[0])
    graph_times, sequential_times, eager_times = [], [], []
    for x, y in data[1:]:   # alternately, so that a change in the machine's load hits all alike
        start = time.perf_counter()
        graph(x, y).item()
        graph_times.append(time.perf_counter() - start)
        graph.executor = "sequential"   # the same Plan, no actors: the sequential interpreter (runtime/sequential.py)
        start = time.perf_counter()
        graph(x, y).item()
        sequential_times.append(time.perf_counter() - start)
        graph.executor = None
        start = time.perf_counter()
        eager_step(x, y)
        eager_times.append(time.perf_counter() - start)
    return graph_times, sequential_times, eager_times, graph, eager_step


def python_calls_per_eager_step(eager_step, x, y, calls: int = 5) -> int:
    """Python function calls per eager training step ``eager_step(x, y)`` (ending with ``loss.item()``), counted
    by cProfile on this thread as ``python_calls_per_graph_call`` counts a graph call's."""
    import cProfile
    import pstats

    eager_step(x, y)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        eager_step(x, y)
    profile.disable()
    return pstats.Stats(profile).total_calls // calls


def python_calls_per_graph_call(graph, x, y, calls: int = 5) -> tuple[int, str]:
    """(Python function calls per ``graph(x, y).item()``, "tasks of the Plan (actors)"), counted by cProfile: the
    runtime folds the view tasks into their readers' acts (``pyflow/runtime/fold.py``), so it has fewer actors.

    cProfile sees one thread, so the graph runs with ``executor = "deterministic"`` here: its actors act on
    this thread, and the count is the whole runtime's work per call (the VM's worker threads, which run the
    kernels, are not counted: eager ops cost them the same)."""
    import cProfile
    import pstats

    graph.executor = "deterministic"
    try:
        graph(x, y).item()   # a new runtime, on this thread
        graph(x, y).item()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(calls):
            graph(x, y).item()
        profile.disable()
        actors = len(graph.runtime.plan.tasks)
    finally:
        graph.executor = None
    return pstats.Stats(profile).total_calls // calls, f"{len(graph.plan.tasks)} ({actors})"


def vm_instructions_per_step(step, calls: int = 3) -> int:
    """VM instructions one ``step()`` (a graph call or an eager step, ending with ``loss.item()``) had run, as
    ``flow.trace()`` records them: a fused run of in-order ops counts once, as the VM schedules, dispatches and
    releases it once (the actors' own records, "act ...", are not instructions)."""
    step()
    counts = []
    for _ in range(calls):
        with flow.trace() as tracer:
            step()
        counts.append(sum(1 for r in tracer.records if not r.stream.startswith("actor ")))
    return min(counts)


def zero_cost_acts_per_second(calls: int = 300, stages: int = 16) -> dict[str, float]:
    """Acts per second of the actor runtime itself: a hand-made linear pipeline Plan (``pipeline.py``) of
    ``stages`` tick tasks whose acts cost nothing, run deterministically (every actor on one thread, the
    caller's) and threaded (a thread per stage)."""
    from pyflow.runtime import Runtime
    from pyflow.runtime.pipeline import linear_pipeline_plan

    def zero_cost(plan, task, ins, outs, j, call):
        return outs

    plan = linear_pipeline_plan([f"stage{i}" for i in range(stages)], regst_num=2)
    rates = {}
    for mode, deterministic in (("one thread (deterministic)", True), (f"threaded ({stages + 1} threads)", False)):
        best = float("inf")
        for _ in range(3):   # the best of three: the machine's other load only ever slows a run down
            with Runtime(plan, deterministic=deterministic, act_fn=zero_cost, max_calls_in_flight=4,
                         timeline=0) as runtime:
                runtime.launch([]).result()   # warm
                start = time.perf_counter()
                handles = [runtime.launch([]) for _ in range(calls)]
                for handle in handles:
                    handle.result()
                best = min(best, time.perf_counter() - start)
        rates[mode] = calls * len(plan.tasks) / best
    return rates


def graph_report(steps: int, batch: int) -> None:
    """Print the section: graph / eager per training step, Python calls per call, the runtime's acts/s."""
    print(f"\nnn.Graph vs eager, one training step (batch {batch}, SGD momentum, each step ends with loss.item()), "
          f"median of {steps} steps")
    print(f"  {'model':16} {'graph ms':>9} {'eager ms':>9} {'graph/eager':>12} {'sequential/eager':>17} {'tasks (actors)':>15} "
          f"{'Python calls: graph call':>25} {'eager step':>11} {'VM instructions: graph / eager':>31}")
    for case in GRAPH_CASES:
        graph_times, sequential_times, eager_times, graph, eager_step = graph_and_eager_steps(case, batch, steps)
        g_ms, e_ms = statistics.median(graph_times) * 1e3, statistics.median(eager_times) * 1e3
        s_ms = statistics.median(sequential_times) * 1e3
        rng = np.random.default_rng(2)
        x = flow.tensor(rng.normal(size=(batch, case[1])).astype(np.float32))
        y = flow.tensor(rng.integers(0, case[3], size=batch).astype(np.int64))
        calls, tasks = python_calls_per_graph_call(graph, x, y)
        eager_calls = python_calls_per_eager_step(eager_step, x, y)
        g_vm = vm_instructions_per_step(lambda: graph(x, y).item())
        e_vm = vm_instructions_per_step(lambda: eager_step(x, y))
        graph._close_runtime()
        print(f"  {case[0]:16} {g_ms:9.2f} {e_ms:9.2f} {g_ms / e_ms:12.2f} {s_ms / e_ms:17.2f} {tasks:>15} {calls:25,} "
              f"{eager_calls:11,} {f'{g_vm} / {e_vm}':>31}")
    print("  (targets: graph/eager <= 0.8, stretch 0.5; sequential: the same Plan on the sequential interpreter, no "
          "actors: the floor the runtime can reach;\n   Python calls counted by cProfile with the graph's actors "
          "on the caller's thread, executor='deterministic', and the eager step's on the same thread;\n   VM "
          "instructions: those flow.trace() records per step, a fused run of in-order ops once)")
    for mode, rate in zero_cost_acts_per_second().items():
        print(f"  actor runtime, zero-cost acts, {mode:28}: {rate:10,.0f} acts/s  (target >= 100,000 on one thread)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--graph-only", action="store_true", help="only the nn.Graph vs eager section")
    args = parser.parse_args()
    if args.graph_only:
        graph_report(args.steps, args.batch)
        flow.vm.shutdown()
        return
    data = batches(args.warmup + args.steps, args.batch)

    def median_ms(times):
        return statistics.median(times[args.warmup:]) * 1e3

    start_weights = pyflow_model(args.hidden).state_dict()
    model = pyflow_model(args.hidden)
    threaded, losses = pyflow_steps(model, data)
    stepped_model = pyflow_model(args.hidden)
    with flow.vm.sync_mode():
        stepped, stepped_losses = pyflow_steps(stepped_model, data)
    reference_model = pyflow_model(args.hidden)
    reference_model.load_state_dict(start_weights)
    torch_result = torch_steps(reference_model, data, args.hidden)
    phases = pyflow_instructions(args.hidden, data)

    print(f"one training step: MLP {IN_FEATURES} -> {args.hidden} -> {args.hidden} -> {CLASSES}, batch {args.batch}, "
          f"float32, cpu, cross-entropy, SGD(lr={LR}, momentum={MOMENTUM})")
    print(f"median of {args.steps} steps after {args.warmup} warm-up steps (each step ends with loss.item())")
    print(f"  pyflow threaded VM      {median_ms(threaded):8.2f} ms")
    print(f"  pyflow step-through     {median_ms(stepped):8.2f} ms")
    if torch_result is not None:
        torch_times, torch_losses = torch_result
        print(f"  PyTorch CPU eager       {median_ms(torch_times):8.3f} ms  (1 thread)")
        print(f"  pyflow/torch = {median_ms(threaded) / median_ms(torch_times):.1f} threaded, "
              f"{median_ms(stepped) / median_ms(torch_times):.1f} step-through")
        difference = np.abs(np.array(losses) - np.array(torch_losses)).max()
        print(f"  same weights, same batches: losses {losses[0]:.4f} -> {losses[-1]:.4f} (pyflow), "
              f"{torch_losses[0]:.4f} -> {torch_losses[-1]:.4f} (torch), largest difference {difference:.1e}")
        assert difference < 1e-3, "pyflow and PyTorch trained differently"
    else:
        print("  (PyTorch not installed: pip install torch==2.13.0 for the reference)")
    assert np.allclose(losses, stepped_losses, rtol=1e-5, atol=1e-6), "the threaded VM and step-through differ"

    total = sum(sum(counter.values()) for counter in phases.values())
    print(f"VM instructions of one pyflow step: {total}")
    for name, counter in phases.items():
        top = ", ".join(f"{op} {n}" for op, n in counter.most_common()) or "(none: set_to_none drops the grads)"
        print(f"  {name:15} {sum(counter.values()):4}: {top}")
    print("  (release_tensor frees a tensor that died: its finalizer queues it, and the next op issues it,\n"
          "   so a phase's releases are often of the tensors of the phase before)")
    ops = total - sum(counter["release_tensor"] for counter in phases.values())
    print(f"  per instruction: {median_ms(threaded) / total * 1e3:.0f} us threaded, "
          f"{median_ms(stepped) / total * 1e3:.0f} us step-through (the step time over the instruction count)")
    print(f"  per op ({ops} instructions that are not release_tensor): {median_ms(threaded) / ops * 1e3:.0f} us "
          f"threaded, {median_ms(stepped) / ops * 1e3:.0f} us step-through "
          "(benchmarks/bench_eager_ops.py times one small op alone)")
    graph_report(args.steps, args.batch)
    flow.vm.shutdown()


if __name__ == "__main__":
    main()
