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

    python benchmarks/bench_train_step.py [--steps 50] [--warmup 10] [--batch 64] [--hidden 128]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time

os.environ.setdefault("PYFLOW_CUDA", "sim")

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    args = parser.parse_args()
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
    flow.vm.shutdown()


if __name__ == "__main__":
    main()
