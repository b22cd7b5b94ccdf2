"""``device="cuda"`` without a GPU: the simulator's threaded and compiled tiers against ``device="cpu"``.

Everything runs in one process, in the CUDA simulator (``PYFLOW_CUDA=sim``), so the
ratios compare tiers measured in the same run:

1. ops on pyflow tensors, 1M float32 (softmax: 1024 rows of 1024): ``(x * a + b).relu()``,
   ``x.sum()``, ``x.softmax(-1)``, ``x.cumsum(0)``; cuda on the compiled tier / cpu (target <= 3),
   and the threaded tier once, for scale;
2. matmul 256 x 256 float32: cuda (compiled) / cpu (target <= 30), beside a plain ``numba.njit``
   triple loop, the floor of a naive compiled kernel;
3. one SGD step of an MLP 784 -> 256 -> 10, batch 64: cuda / cpu (target <= 3); and a course-sized
   one, 8 -> 32 -> 10 on a batch of 128, many small launches: cuda on the threaded tier (what ``auto``
   gives a kernel's first small launches) and on the compiled one (what it gives them from the
   ``HOT_LAUNCHES``-th on), each against cpu (no target: what a course sees);
4. Cocktailer at the artifact's sizes, compiled executor, in the simulator: the LSTM (10 layers,
   hidden 256, seq 64, batch 1) and the RAE (127 nodes, 1024 -> 512), against references
   (PyTorch if installed, else numpy) and the time per call;
5. the seven Cocktailer models (bench_cocktailer.py's count run, small sizes, both executors) with
   every launch asked for the compiled tier: which of their kernels ran compiled, and the same values
   as the host executor (bench_cocktailer asserts it, bit for bit);
6. the kernel library: how many kernels (``pyflow.kernels.compile_check``'s cases) the compiled
   tier translates, how long the compile of one case per kernel takes, and which stay threaded;
7. ``first``: what a user's training script on "cuda" costs under the default tier (``auto``) in its
   first run on a machine and in the next: the course-sized MLP's first 40 steps, each run a new
   process with an empty kernel cache, then with the cache the first run left.

Times are the median of ``--repeats`` after one warm call (which compiles); compile times are
printed apart.  The big MLP's cpu and cuda steps alternate (``alternating``), so that a busy spell
of the machine falls on both sides of its ratio.  ``--quick`` shrinks every size (a smoke run for the tests).

    python benchmarks/bench_sim_tiers.py [--repeats 5] [--quick] [--sections ops,matmul,mlp,cocktailer,library,first]
                                         [--write benchmarks/results/sim_tiers_cpu.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types as pytypes

os.environ.setdefault("PYFLOW_CUDA", "sim")

import numba  # noqa: E402
import numpy as np  # noqa: E402

import pyflow as flow  # noqa: E402
from pyflow import nn  # noqa: E402
from pyflow.kernels import sim  # noqa: E402

SECTIONS = ("ops", "matmul", "mlp", "cocktailer", "models", "library", "first")
LINES: list = []


def say(text: str = "") -> None:
    print(text, flush=True)
    LINES.append(text)


def timed(fn, repeats: int) -> tuple:
    """(first call, median of ``repeats`` later calls), seconds; ``fn`` ends with a sync."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def alternating(steps: dict, repeats: int) -> dict:
    """``timed`` for several steps at once, one call of each in turn (after one warm call of each): a change in
    the machine's load hits them all alike, where timing one step's repeats and then the other's let a busy
    spell fall on one side of the ratio.  {name: (first call, median of ``repeats`` later calls)}."""
    first, times = {}, {name: [] for name in steps}
    for name, fn in steps.items():
        start = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - start
    for _ in range(repeats):
        for name, fn in steps.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: (first[name], statistics.median(times[name])) for name in steps}


def on(device: str, tier: str = "compiled"):
    """Run on ``device``; for cuda, on ``tier`` of the simulator."""
    return sim.configure(tier=tier) if device == "cuda" else _Nothing()


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def ratio_row(name: str, times: dict, target: float | None) -> None:
    cpu = times["cpu"][1]
    cells = [f"{name:<28}", f"cpu {cpu * 1e3:9.3f} ms"]
    for key in ("compiled", "threads"):
        if key in times:
            first, median = times[key]
            cells.append(f"{key} {median * 1e3:10.3f} ms ({median / cpu:8.1f}x, first {first:6.2f} s)")
    verdict = ""
    if target is not None:
        got = times["compiled"][1] / cpu
        verdict = f"  compiled/cpu {got:.2f} {'meets' if got <= target else 'MISSES'} <= {target:g}"
    say("  ".join(cells) + verdict)


# ---- 1. ops on 1M floats -------------------------------------------------------------------------


def ops(args) -> None:
    n = 1 << (14 if args.quick else 20)
    side = int(n ** 0.5)
    rng = np.random.default_rng(0)
    data = rng.standard_normal(n).astype(np.float32)
    say(f"== ops on {n} float32 (softmax: {side} rows of {side}); cuda = the simulator ==")
    cases = {
        "(x * a + b).relu()": lambda x: (x * 1.5 + 0.25).relu(),
        "x.sum()": lambda x: x.sum(),
        "x.softmax(-1)": lambda x: x.reshape(side, side).softmax(-1),
        "x.cumsum(0)": lambda x: x.cumsum(0),
    }
    for name, op in cases.items():
        times, results = {}, {}
        for device, tier in (("cpu", None), ("cuda", "compiled"), ("cuda", "threads")):
            if tier == "threads" and n > (1 << 16) and not args.threads_big:
                continue
            x = flow.tensor(data, device=device)

            def run(x=x, op=op):
                y = op(x)
                flow.vm.sync()
                return y

            with on(device, tier or "compiled"):
                times[tier or "cpu"] = timed(run, 1 if tier == "threads" else args.repeats)
                results[tier or "cpu"] = run().numpy()
        for key in results:
            np.testing.assert_allclose(results[key], results["cpu"], rtol=2e-4, atol=2e-3 * np.sqrt(n))
        ratio_row(name, times, 3)


# ---- 2. matmul -----------------------------------------------------------------------------------


@numba.njit(cache=True)
def naive_matmul(a, b, out):
    """The floor of a naive compiled kernel: three loops, no tiles."""
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            acc = np.float32(0)
            for k in range(a.shape[1]):
                acc += a[i, k] * b[k, j]
            out[i, j] = acc


def matmul(args) -> None:
    n = 64 if args.quick else 256
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    say(f"== matmul {n} x {n} float32 ==")
    times, results = {}, {}
    for device in ("cpu", "cuda"):
        x, y = flow.tensor(a, device=device), flow.tensor(b, device=device)

        def run(x=x, y=y):
            z = x @ y
            flow.vm.sync()
            return z

        with on(device):
            times["compiled" if device == "cuda" else "cpu"] = timed(run, args.repeats)
            results[device] = run().numpy()
    np.testing.assert_allclose(results["cuda"], results["cpu"], rtol=1e-4, atol=1e-3)
    out = np.empty((n, n), np.float32)
    first, median = timed(lambda: naive_matmul(a, b, out), args.repeats)
    ratio_row(f"a @ b ({n})", times, 30)
    say(f"{'':28}  njit triple loop (the naive floor) {median * 1e3:.3f} ms = "
        f"{median / times['cpu'][1]:.1f}x cpu; the compiled tier is {times['compiled'][1] / median:.1f}x the floor")


# ---- 3. an SGD step ------------------------------------------------------------------------------


def mlp(args) -> None:
    batch, hidden = (16, 64) if args.quick else (64, 256)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=batch).astype(np.int64)
    say(f"== one SGD step, MLP 784 -> {hidden} -> 10, batch {batch} ==")
    steps, losses = {}, {}
    for device in ("cpu", "cuda"):
        flow.manual_seed(0)
        model = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, 10)).to(device)
        opt = flow.optim.SGD(model.parameters(), lr=0.05)
        loss_fn = nn.CrossEntropyLoss()
        xs, ys = flow.tensor(x, device=device), flow.tensor(y, device=device)
        seen = losses[device] = []

        def step(model=model, opt=opt, loss_fn=loss_fn, xs=xs, ys=ys, seen=seen):
            opt.zero_grad()
            loss = loss_fn(model(xs), ys)
            loss.backward()
            opt.step()
            seen.append(loss.item())
        steps["compiled" if device == "cuda" else "cpu"] = step
    with on("cuda"):
        times = alternating(steps, args.repeats)
    np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=1e-4)
    ratio_row("SGD step", times, 3)
    small_mlp(args)


def small_mlp(args) -> None:
    """The course-sized step: its kernels are small launches, which ``auto`` runs threaded for a kernel's first
    ``tiers.HOT_LAUNCHES - 1`` launches with the same argument types, then compiled: both tiers timed apart."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((128, 8)).astype(np.float32)
    y = rng.integers(0, 10, size=128).astype(np.int64)
    say("== one SGD step, MLP 8 -> 32 -> 10, batch 128 (small launches) ==")
    times = {}
    for device, tier in (("cpu", None), ("cuda", "threads"), ("cuda", "compiled")):
        flow.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 10)).to(device)
        opt = flow.optim.SGD(model.parameters(), lr=0.05)
        loss_fn = nn.CrossEntropyLoss()
        xs, ys = flow.tensor(x, device=device), flow.tensor(y, device=device)

        def step(model=model, opt=opt, loss_fn=loss_fn, xs=xs, ys=ys):
            opt.zero_grad()
            loss = loss_fn(model(xs), ys)
            loss.backward()
            opt.step()
            loss.item()

        with on(device, tier or "compiled"):
            times[tier or "cpu"] = timed(step, max(2, args.repeats // 2))
    say(f"(auto runs a kernel's first {sim.tiers.HOT_LAUNCHES - 1} small launches with the same argument types as "
        "'threads' does, then as 'compiled' does)")
    ratio_row("SGD step (threads)", {"cpu": times["cpu"], "threads": times["threads"]}, None)
    ratio_row("SGD step (compiled)", {"cpu": times["cpu"], "compiled": times["compiled"]}, None)


def first(args) -> None:
    """A new process's first steps of the course-sized MLP on "cuda" under ``auto``, twice: with an empty kernel
    cache (a fresh machine: small launches threaded until a kernel is hot, then compiles) and with the cache the
    first run left (``tiers.CACHED_READY``: its machine code is loaded at a kernel's ``CACHED_LAUNCHES``-th launch)."""
    steps = 6 if args.quick else 40
    say(f"== a new process: its first {steps} SGD steps of the MLP 8 -> 32 -> 10, batch 128, on cuda, tier auto ==")
    with tempfile.TemporaryDirectory() as cache:
        for run in ("first run (an empty kernel cache)", "next run (the cache the first run left)"):
            done = subprocess.run([sys.executable, __file__, "--first-steps", str(steps)], capture_output=True,
                                  text=True, check=True,
                                  env=dict(os.environ, PYFLOW_SIM_CACHE=cache, PYFLOW_SIM_TIER="auto"))
            times = json.loads(done.stdout.strip().splitlines()[-1])
            say(f"{run:40} all {sum(times):7.2f} s  first step {times[0]:6.2f} s  steps over 0.1 s: "
                f"{sum(t > 0.1 for t in times):2}  median of the last 5: {statistics.median(times[-5:]) * 1e3:6.1f} ms")


def first_steps(steps: int) -> None:
    """(``--first-steps``, in the child process of ``first``) print the seconds of each of ``steps`` steps."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((128, 8)).astype(np.float32)
    y = rng.integers(0, 10, size=128).astype(np.int64)
    flow.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 10)).to("cuda")
    opt = flow.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    xs, ys = flow.tensor(x, device="cuda"), flow.tensor(y, device="cuda")
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(xs), ys)
        loss.backward()
        opt.step()
        loss.item()
        times.append(time.perf_counter() - start)
    print(json.dumps(times))


# ---- 4. Cocktailer at the artifact's sizes -------------------------------------------------------


def lstm_reference(lstm, x):
    """``nn.LSTM``'s forward pass: PyTorch's own if installed, else the same equations in numpy."""
    state = lstm.state_dict()
    layers = lstm.num_layers
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        ref = torch.nn.LSTM(lstm.input_size, lstm.hidden_size, layers)
        ref.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
        with torch.no_grad():
            return ref(torch.tensor(x))[0].numpy(), "PyTorch nn.LSTM"

    def sigmoid(v):
        return 1 / (1 + np.exp(-v))

    inp = x.astype(np.float64)
    for k in range(layers):
        h = np.zeros((x.shape[1], lstm.hidden_size))
        c = np.zeros_like(h)
        outs = []
        for t in range(x.shape[0]):
            gates = (inp[t] @ state[f"weight_ih_l{k}"].T + state[f"bias_ih_l{k}"]
                     + h @ state[f"weight_hh_l{k}"].T + state[f"bias_hh_l{k}"])
            i, f, g, o = np.split(gates, 4, axis=1)
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(c)
            outs.append(h)
        inp = np.stack(outs)
    return inp, "numpy (the same equations)"


def rae_reference(rae, left, right, is_leaf, inp):
    state = rae.state_dict()
    w, b = (state[k].astype(np.float64) for k in ("encoder.weight", "encoder.bias"))

    def walk(node):
        if is_leaf[node]:
            return inp[node].astype(np.float64)
        return np.tanh(w @ np.concatenate([walk(left[node]), walk(right[node])]) + b)

    return walk(0)


def cocktailer(args) -> None:
    from pyflow.models import RAE, StackedLSTM

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_cocktailer import balanced_tree

    layers, hidden, seq = (2, 32, 8) if args.quick else tuple(int(v) for v in args.lstm.split(","))
    say(f"== Cocktailer, compiled executor, in the simulator's compiled tier ==")
    lstm = StackedLSTM(hidden, hidden, layers, threads=64)
    x = np.random.default_rng(3).standard_normal((seq, 1, hidden)).astype(np.float32)
    with sim.configure(tier="compiled"):
        first, median = timed(lambda: lstm(x, mode="compiled"), max(1, args.repeats // 2))
        out = lstm(x, mode="compiled")[0]
    want, what = lstm_reference(lstm, x)
    worst = float(np.abs(out - want).max())
    say(f"LSTM {layers} layers, hidden {hidden}, seq {seq}, batch 1: {median * 1e3:.1f} ms per call "
        f"(first call, with the compile: {first:.1f} s); max |diff| vs {what} {worst:.1e}")
    assert worst < 1e-4, worst

    dim, leaves = (32, 8) if args.quick else (512, 64)
    rae = RAE(dim, threads=64)
    left, right, is_leaf = balanced_tree(leaves)
    inp = np.random.default_rng(4).standard_normal((len(left), dim)).astype(np.float32)
    with sim.configure(tier="compiled"):
        first, median = timed(lambda: rae(left, right, is_leaf, inp, mode="compiled"), max(1, args.repeats // 2))
        got = rae(left, right, is_leaf, inp, mode="compiled")
    worst = float(np.abs(got - rae_reference(rae, left, right, is_leaf, inp)).max())
    say(f"RAE {len(left)} nodes, Linear({2 * dim} -> {dim}): {median * 1e3:.1f} ms per call (first call, with the "
        f"compile: {first:.1f} s); max |diff| vs numpy {worst:.1e}")
    assert worst < 1e-4, worst


# ---- 5. the seven models' programs ---------------------------------------------------------------


def models(args) -> None:
    import contextlib
    import io

    from pyflow.kernels.sim import kernel as sim_kernel

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_cocktailer

    say("== the seven Cocktailer models (bench_cocktailer's counts, small sizes), every launch asked to compile ==")
    tiers: dict = {}
    original = sim_kernel.SimLaunch.__call__

    def recording(self, *a):
        try:
            return original(self, *a)
        finally:
            tiers.setdefault(self.kernel.__name__, set()).add(getattr(self.kernel, "last_tier", "?"))

    sim_kernel.SimLaunch.__call__ = recording
    start = time.perf_counter()
    try:
        with sim.configure(tier="compiled"), contextlib.redirect_stdout(io.StringIO()):
            bench_cocktailer.counts(bench_cocktailer.SIM_SIZES)
    finally:
        sim_kernel.SimLaunch.__call__ = original
    threaded = sorted(n for n, t in tiers.items() if t != {"compiled"})
    say(f"{len(tiers)} distinct kernels launched (the programs' persistent kernels and the host executor's "
        f"per-op kernels), {len(tiers) - len(threaded)} always ran compiled; {time.perf_counter() - start:.0f} s "
        "with the compiles; host and compiled executors agreed bit for bit")
    for name in threaded[:10]:
        say(f"  {name}: {sorted(tiers[name])}")


# ---- 6. the kernel library -----------------------------------------------------------------------


def library(args) -> None:
    from pyflow.kernels.compile_check import _cases
    from pyflow.kernels.sim.compiled import CompiledKernel, Unsupported

    say("== the kernel library in the compiled tier (compile_check's cases: every kernel, its dtypes) ==")
    kernels, cases, translated, threaded = {}, 0, 0, {}
    for family, label, fn, argtypes, is_device in _cases():
        if is_device:
            continue
        cases += 1
        compiled = kernels.get(fn)
        if compiled is None:
            compiled = kernels[fn] = CompiledKernel(pytypes.SimpleNamespace(__name__=fn.__name__, py_func=fn))
            compiled.first_case = (family, label, tuple(argtypes))
        try:
            compiled.translated()
            translated += 1
        except Unsupported as error:
            threaded[f"{family}:{label}"] = str(error)
    say(f"{translated} of {cases} cases ({len(kernels)} kernels) translate; threaded only: {len(threaded)}")
    for name, why in list(threaded.items())[:10]:
        say(f"  {name}: {why}")
    chosen = list(kernels.values())[: (8 if args.quick else None)]
    seconds, failed = [], []
    for compiled in chosen:
        family, label, types = compiled.first_case
        start = time.perf_counter()
        try:
            compiled._build(types)
            seconds.append(time.perf_counter() - start)
        except Exception as error:   # Unsupported, or numba's own (float16 has no CPU type): stays threaded
            failed.append(f"{family}:{label}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
    say(f"compiled one case of each of {len(chosen)} kernels: {len(seconds)} compiled, {len(failed)} did not; "
        f"compile time per kernel median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s, "
        f"total {sum(seconds):.0f} s (numba's machine code is cached after: {sim.module_cache.cache_dir()})")
    for line in failed[:10]:
        say(f"  {line}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--threads-big", action="store_true",
                        help="also time the threaded tier at the full 1M size (minutes)")
    parser.add_argument("--lstm", default="10,256,64", help="the LSTM's layers,hidden,seq (default: the artifact's)")
    parser.add_argument("--write", help="also write the table to this file, with a header")
    parser.add_argument("--first-steps", type=int, help=argparse.SUPPRESS)   # the child process of ``first``
    args = parser.parse_args(argv)
    if args.first_steps:
        first_steps(args.first_steps)
        return 0
    wanted = [s for s in args.sections.split(",") if s]
    unknown = set(wanted) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    say(f"backend: {flow.kernels.describe() if hasattr(flow, 'kernels') else 'simulator'}")
    for section in wanted:
        globals()[section](args)
    if args.write:
        with open(args.write, "w") as f:
            f.write(f"# benchmarks/bench_sim_tiers.py {' '.join(argv if argv is not None else sys.argv[1:])}\n")
            f.write(f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                    f"numpy {np.__version__}, numba {numba.__version__}; "
                    f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
            f.write("\n".join(LINES) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
