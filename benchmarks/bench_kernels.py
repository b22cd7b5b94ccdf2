"""The kernel library on a GPU: bandwidth, matmul, barriers and eager ops against references (issue 19).

Every section times pyflow's own entry points, as the framework calls them, against a
reference measured in the same run on the same device:

* ``elementwise``: add, mul, relu, exp (float32, contiguous; and relu of a transposed view,
  the strided kernel) through ``get_kernel(op, "cuda")(out, *inputs, stream=s)``, at 4, 16, 64
  and 256 MB per operand.  Bandwidth counts every input read and the output written once; the
  reference is a device-to-device copy of one operand (``DeviceNDArray.copy_to_device``, what
  ``CudaStream.memcpy_d2d`` runs), counting its read and its write.  Target: >= 0.70 of the
  copy's bandwidth.  PyTorch's same op (``out=``) is a second reference.
* ``reduce``: ``reduce_sum`` of the whole array (the two-pass path) and of rows of 1024 (one
  block per row), bytes read against the same copy; ``torch.sum`` beside it.
* ``matmul``: square float32 matrices (1024, 2048, 4096), ``get_kernel("matmul", "cuda")``
  against ``torch.matmul`` (cuBLAS; TF32 off, so both do float32 arithmetic) and ``cupy.matmul``
  if CuPy imports.  Target: within 5x of cuBLAS.
* ``barriers``: a cooperative kernel doing N ``cuda.cg.this_grid().sync()``, against one doing
  N ``group_barrier`` s (``kernels/utask/groups.py``: what Cocktailer's recursion unroll uses
  for a group of blocks), one group of the whole grid and two groups of half of it.  Cost per
  barrier = (time with N barriers - time with none) / N, at one block per SM and at the
  co-resident limit (``cooperative_grid_limit``, as Cocktailer sizes its grids).
* ``eager``: a chain of ``x + y``, relu, ``x * y``, ``exp(-x)`` on 16-element float32 tensors on
  ``device="cuda"`` through the VM (threaded and step-through), against the same chain in
  PyTorch on the same GPU; and on 4M-element tensors (throughput).

Timing: each case is warmed up first (the first call JIT-compiles the kernel), then timed
``--repeats`` times; each repeat times a batch of calls (enough to take a few milliseconds)
between CUDA events recorded on the stream the work runs on, and the table shows the best and
the median time per call.  ``host us`` is the wall time the host spent issuing one call (when it
exceeds the kernel's time, the case is launch-bound).

    PYFLOW_CUDA=gpu python benchmarks/bench_kernels.py [--write benchmarks/results/kernels_gpu.txt]
    python benchmarks/bench_kernels.py --tiny          # every section at tiny sizes (the simulator: < 1 min)
    python benchmarks/bench_kernels.py --sections matmul,barriers --repeats 5

In the CUDA simulator (no GPU) times are wall-clock times of Python threads and every ratio
is meaningless: ``--tiny`` only checks that each section runs and prints its table; PyTorch on
the cpu stands in for PyTorch on cuda there.  A reference that cannot run (no PyTorch, no CuPy,
a PyTorch without CUDA on a GPU machine) is printed as ``skipped: reason``.  Exit status 1 if a
section failed (its traceback goes to stderr; the other sections still run).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback

import numpy as np

import pyflow as flow
from pyflow.kernels import backend, jit
from pyflow.kernels.backend import cuda
from pyflow.kernels.layout import permuted_view
from pyflow.kernels.registry import get_kernel
from pyflow.kernels.utask.generated import cooperative_grid_limit
from pyflow.kernels.utask.groups import group_barrier

SECTIONS = ("elementwise", "reduce", "matmul", "eager", "barriers")   # the one that could hang, last
BANDWIDTH_TARGET = 0.70     # of a device-to-device copy's bandwidth
MATMUL_TARGET = 5.0         # times cuBLAS's time at most
MB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Sizes:
    elementwise: tuple      # elements per operand
    reduce: tuple           # elements
    row: int                # reduce: the row length of the per-row sum
    matmul: tuple           # square sides
    barriers: int           # barriers per kernel
    barrier_threads: int
    small_ops: int          # eager: ops on 16-element tensors
    large_ops: int          # eager: ops on large tensors
    large: int              # eager: elements of a large tensor
    warmup: int
    repeats: int
    batch_seconds: float    # each timed batch lasts about this long (0: one call per batch)


FULL = Sizes(elementwise=(1 << 20, 1 << 22, 1 << 24, 1 << 26), reduce=(1 << 20, 1 << 22, 1 << 24, 1 << 26),
             row=1024, matmul=(1024, 2048, 4096), barriers=10_000, barrier_threads=256,
             small_ops=10_000, large_ops=200, large=1 << 22, warmup=3, repeats=10, batch_seconds=0.005)
TINY = Sizes(elementwise=(1024, 4096), reduce=(4096, 1 << 15), row=256, matmul=(16, 32), barriers=8,
             barrier_threads=32, small_ops=16, large_ops=4, large=4096, warmup=1, repeats=2, batch_seconds=0.0)


# --- timing -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Stat:
    """Seconds per call: best and median over the repeats; ``host``: issuing one call (best)."""

    best: float
    median: float
    host: float


class WallTimer:
    """Wall clock around a batch, ``sync`` before and after (the simulator; PyTorch on the cpu)."""

    def __init__(self, sync=lambda: None):
        self.sync = sync

    def start(self):
        self.sync()
        self.t0 = time.perf_counter()

    def stop(self) -> float:
        self.sync()
        return time.perf_counter() - self.t0


class NumbaEventTimer:
    """CUDA events recorded on the numba stream the timed work is launched on."""

    def __init__(self, stream):
        self.stream = stream
        self.begin, self.end = cuda.event(timing=True), cuda.event(timing=True)

    def sync(self):
        self.stream.synchronize()

    def start(self):
        self.begin.record(self.stream)

    def stop(self) -> float:
        self.end.record(self.stream)
        self.end.synchronize()
        return cuda.event_elapsed_time(self.begin, self.end) / 1e3


class TorchEventTimer:
    """CUDA events on PyTorch's current stream."""

    def __init__(self, torch):
        self.torch = torch
        self.begin = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def sync(self):
        self.torch.cuda.synchronize()

    def start(self):
        self.begin.record()

    def stop(self) -> float:
        self.end.record()
        self.end.synchronize()
        return self.begin.elapsed_time(self.end) / 1e3


class CupyEventTimer:
    """CUDA events on CuPy's current stream."""

    def __init__(self, cp):
        self.cp = cp
        self.begin, self.end = cp.cuda.Event(), cp.cuda.Event()

    def sync(self):
        self.cp.cuda.get_current_stream().synchronize()

    def start(self):
        self.begin.record()

    def stop(self) -> float:
        self.end.record()
        self.end.synchronize()
        return self.cp.cuda.get_elapsed_time(self.begin, self.end) / 1e3


def measure(fn, timer, sizes: Sizes, repeats: int | None = None) -> Stat:
    """Warm ``fn`` up, then time ``repeats`` batches of calls with ``timer``; seconds per call."""
    for _ in range(sizes.warmup):
        fn()
    timer.sync()
    inner = 1
    if sizes.batch_seconds:
        timer.start()
        fn()
        one = max(timer.stop(), 1e-7)
        inner = max(1, min(1000, math.ceil(sizes.batch_seconds / one)))
    times, host = [], []
    for _ in range(repeats or sizes.repeats):
        timer.start()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        host.append((time.perf_counter() - t0) / inner)
        times.append(timer.stop() / inner)
    return Stat(min(times), statistics.median(times), min(host))


def ms(stat: Stat) -> str:
    return f"{stat.best * 1e3:9.3f} {stat.median * 1e3:9.3f}"


def transposed_relu(square, dense, stream):
    """The strided case's timed call: ``relu`` of the transpose of ``square`` into ``dense``, on ``stream``.

    The transposed view is made once, here, by ``permuted_view``: ``square``'s own memory with its strides
    swapped, so each call is one launch of the strided kernel.  numba's ``square.T`` is no view:
    ``DeviceNDArray.transpose`` allocates a copy and fills it with a kernel that
    ``numba.cuda.kernels.transpose`` defines (``@cuda.jit``) afresh, so compiles afresh, at every call.
    Timed inside the call, that was the first GPU table's ~100 ms of host time per call, whatever the size.
    """
    relu, transposed = get_kernel("relu", "cuda"), permuted_view(square, (1, 0))
    return lambda: relu(dense, transposed, stream=stream)


# --- the machine and the references -----------------------------------------------


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception as error:   # noqa: BLE001 - any import failure is "not available"
        return f"not importable ({type(error).__name__})"


def nvidia_smi() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        found = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip().splitlines()[0] if found.returncode == 0 and found.stdout.strip() else None


def device_line() -> str:
    """The GPU as numba sees it (name, compute capability, SMs) and as nvidia-smi does."""
    if not backend.is_gpu():
        return "no GPU: Numba's CUDA simulator (pyflow's concurrent-grid launch); times are not GPU times"
    gpu = cuda.get_current_device()
    name = gpu.name.decode() if isinstance(gpu.name, bytes) else gpu.name
    smi = nvidia_smi()
    return (f"{name}, compute capability {'.'.join(map(str, gpu.compute_capability))}, "
            f"{gpu.MULTIPROCESSOR_COUNT} SMs" + (f"; nvidia-smi: {smi}" if smi else ""))


def load_torch():
    """(torch, device string, why not) for the references: cuda on a GPU, the cpu in the simulator."""
    try:
        import torch
    except ImportError as error:
        return None, None, f"torch not importable ({error})"
    if backend.is_gpu():
        if not torch.cuda.is_available():
            return None, None, f"torch {torch.__version__} has no CUDA (torch.cuda.is_available() is False)"
        torch.backends.cuda.matmul.allow_tf32 = False   # float32 arithmetic, as pyflow's matmul
        torch.backends.cudnn.allow_tf32 = False
        return torch, "cuda", None
    return torch, "cpu", None


def torch_timer(torch, device: str):
    return TorchEventTimer(torch) if device == "cuda" else WallTimer()


def load_cupy():
    """(cupy, why not): only on a GPU (CuPy has no simulator)."""
    if not backend.is_gpu():
        return None, "cupy runs on a GPU only (this is the simulator)"
    try:
        import cupy
    except Exception as error:   # noqa: BLE001 - ImportError, or a CUDA library it cannot load
        return None, f"cupy not importable ({type(error).__name__}: {error})"
    return cupy, None


class Bench:
    """Runs the sections; ``out`` prints a line at once (flushed) and keeps it for ``--write``."""

    def __init__(self, sizes: Sizes, tiny: bool, write: str | None, header: list):
        self.sizes, self.tiny, self.write, self.header = sizes, tiny, write, header
        self.lines: list = []
        self.stream = cuda.stream()
        self.timer = NumbaEventTimer(self.stream) if backend.is_gpu() else WallTimer()
        self.torch, self.torch_device, self.no_torch = load_torch()
        self.failed: list = []

    def out(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def save(self) -> None:
        if self.write:
            with open(self.write, "w", encoding="utf-8") as file:
                file.write("\n".join(self.header + self.lines) + "\n")

    def torch_label(self) -> str:
        return "torch" if self.torch_device == "cuda" else "torch(cpu)"

    def random(self, n: int, seed: int, low=-1.0, high=1.0) -> np.ndarray:
        values = np.random.default_rng(seed).random(n, dtype=np.float32)
        return values * np.float32(high - low) + np.float32(low)

    def to_device(self, host: np.ndarray):
        array = cuda.to_device(host, stream=self.stream)
        self.stream.synchronize()
        return array

    def copy_stat(self, n: int) -> Stat:
        """The reference: a device-to-device copy of ``n`` float32 elements on the same stream."""
        src, dst = cuda.device_array(n, np.float32, stream=self.stream), cuda.device_array(n, np.float32,
                                                                                           stream=self.stream)
        get_kernel("fill", "cuda")(src, 1.0, stream=self.stream)
        return measure(lambda: dst.copy_to_device(src, stream=self.stream), self.timer, self.sizes)

    # --- sections ------------------------------------------------------------------

    def elementwise(self) -> None:
        self.out("== elementwise (float32): bandwidth vs a device-to-device copy of one operand "
                 f"(target >= {BANDWIDTH_TARGET:.2f}) ==")
        self.out("   bytes = inputs read + output written; the copy's = its read + its write; "
                 "ms = best and median per call; /torch = pyflow's time / torch's")
        if self.torch is None:
            self.out(f"   torch: skipped: {self.no_torch}")
        t = self.torch_label()
        self.out(f"   {'op':<10}{'MB/operand':>10} {'best ms':>9} {'med ms':>9} {'GB/s':>8} {'copy GB/s':>10} "
                 f"{'/copy':>6} {'host us':>8} {t + ' ms':>11} {'/' + t:>11}")
        checks = {"add": np.add, "mul": np.multiply, "relu": lambda a: np.maximum(a, 0), "exp": np.exp}
        torch_ops = {"add": lambda a, b, o: self.torch.add(a, b, out=o),
                     "mul": lambda a, b, o: self.torch.mul(a, b, out=o),
                     "relu": lambda a, o: self.torch.clamp(a, min=0.0, out=o),
                     "exp": lambda a, o: self.torch.exp(a, out=o)}
        worst = math.inf
        for n in self.sizes.elementwise:
            copy = self.copy_stat(n)
            copy_bw = 2 * n * 4 / copy.best
            hosts = [self.random(n, 1), self.random(n, 2)]
            xs = [self.to_device(h) for h in hosts]
            out = cuda.device_array(n, np.float32, stream=self.stream)
            tx = [self.torch.from_numpy(h).to(self.torch_device) for h in hosts] if self.torch else None
            tout = self.torch.empty(n, dtype=self.torch.float32, device=self.torch_device) if self.torch else None
            for op, arity in (("add", 2), ("mul", 2), ("relu", 1), ("exp", 1)):
                kernel, inputs = get_kernel(op, "cuda"), xs[:arity]
                stat = measure(lambda: kernel(out, *inputs, stream=self.stream), self.timer, self.sizes)
                self._check_prefix(op, out, checks[op](*[h[:4096] for h in hosts[:arity]]))
                bw = (arity + 1) * n * 4 / stat.best
                worst = min(worst, bw / copy_bw)
                ref = ""
                if self.torch is not None:
                    fn, targs = torch_ops[op], tx[:arity]
                    tstat = measure(lambda: fn(*targs, tout), torch_timer(self.torch, self.torch_device), self.sizes)
                    ref = f"{tstat.best * 1e3:11.3f} {stat.best / tstat.best:11.2f}"
                self.out(f"   {op:<10}{n * 4 / MB:>10.3g} {ms(stat)} {bw / 1e9:8.1f} {copy_bw / 1e9:10.1f} "
                         f"{bw / copy_bw:6.2f} {stat.host * 1e6:8.1f} {ref}")
            # the strided kernel: relu of a transposed square view (reads with a stride, writes densely)
            side = math.isqrt(n)
            square = xs[0][:side * side].reshape(side, side)
            dense = cuda.device_array((side, side), np.float32, stream=self.stream)
            stat = measure(transposed_relu(square, dense, self.stream), self.timer, self.sizes)
            want = np.maximum(hosts[0][:side * side].reshape(side, side).T[:4], 0)
            if not np.array_equal(dense[:4].copy_to_host(), want):
                raise AssertionError("relu(x.T): wrong result")
            bw = 2 * side * side * 4 / stat.best
            self.out(f"   {'relu(x.T)':<10}{side * side * 4 / MB:>10.3g} {ms(stat)} {bw / 1e9:8.1f} "
                     f"{copy_bw / 1e9:10.1f} {bw / copy_bw:6.2f} {stat.host * 1e6:8.1f}  (strided kernel)")
            xs = out = tx = tout = square = dense = None   # free the device arrays before the next size
        self.out(f"   worst contiguous op / copy = {worst:.2f} ({self._verdict(worst >= BANDWIDTH_TARGET)} the "
                 f">= {BANDWIDTH_TARGET:.2f} target)")

    def reduce(self) -> None:
        self.out(f"== reduce_sum (float32): bytes read / time vs the same copy (target >= {BANDWIDTH_TARGET:.2f}) ==")
        if self.torch is None:
            self.out(f"   torch: skipped: {self.no_torch}")
        t = self.torch_label()
        self.out(f"   {'case':<22}{'MB':>8} {'best ms':>9} {'med ms':>9} {'GB/s':>8} {'copy GB/s':>10} "
                 f"{'/copy':>6} {'host us':>8} {t + ' ms':>11} {'/' + t:>11}")
        kernel, row = get_kernel("reduce_sum", "cuda"), self.sizes.row
        for n in self.sizes.reduce:
            copy = self.copy_stat(n)
            copy_bw = 2 * n * 4 / copy.best
            host = self.random(n, 3, 0.0, 1.0)
            x = self.to_device(host)
            tx = self.torch.from_numpy(host).to(self.torch_device) if self.torch else None
            cases = [("all (two-pass)", x, cuda.device_array((), np.float32, stream=self.stream), None,
                      host.astype(np.float64).sum(keepdims=False),
                      (lambda: self.torch.sum(tx)) if self.torch else None)]
            rows = n // row
            if rows > 1:
                xr = x.reshape(rows, row)
                tout = self.torch.empty(rows, dtype=self.torch.float32, device=self.torch_device) if self.torch \
                    else None
                cases.append((f"rows of {row} ({rows} rows)", xr, cuda.device_array(rows, np.float32,
                                                                                     stream=self.stream), 1,
                              host.reshape(rows, row).astype(np.float64).sum(axis=1),
                              (lambda: self.torch.sum(tx.view(rows, row), dim=1, out=tout)) if self.torch else None))
            for name, xin, out, axis, want, tfn in cases:
                stat = measure(lambda: kernel(out, xin, axis=axis, stream=self.stream), self.timer, self.sizes)
                got = out.copy_to_host()
                if not np.allclose(got, want, rtol=1e-3):
                    raise AssertionError(f"reduce_sum {name}: wrong result")
                bw = n * 4 / stat.best
                ref = ""
                if tfn is not None:
                    tstat = measure(tfn, torch_timer(self.torch, self.torch_device), self.sizes)
                    ref = f"{tstat.best * 1e3:11.3f} {stat.best / tstat.best:11.2f}"
                self.out(f"   {name:<22}{n * 4 / MB:>8.3g} {ms(stat)} {bw / 1e9:8.1f} {copy_bw / 1e9:10.1f} "
                         f"{bw / copy_bw:6.2f} {stat.host * 1e6:8.1f} {ref}")

    def matmul(self) -> None:
        self.out(f"== matmul (square float32): time vs cuBLAS through torch.matmul (target <= {MATMUL_TARGET:g}x) "
                 "and cupy.matmul ==")
        cp, no_cupy = load_cupy()
        if self.torch is None:
            self.out(f"   torch: skipped: {self.no_torch}")
        else:
            tf32 = self.torch.backends.cuda.matmul.allow_tf32 if self.torch_device == "cuda" else "n/a"
            self.out(f"   torch on {self.torch_device} (allow_tf32={tf32})")
        if cp is None:
            self.out(f"   cupy: skipped: {no_cupy}")
        else:
            self.out(f"   cupy {cp.__version__} (CUPY_TF32={os.environ.get('CUPY_TF32', 'unset: off')})")
        t = self.torch_label()
        self.out(f"   {'n':>6} {'best ms':>9} {'med ms':>9} {'TFLOP/s':>8} {t + ' ms':>11} {'TFLOP/s':>8} "
                 f"{'/' + t:>11} {'cupy ms':>9} {'/cupy':>7} {'max rel err':>12}")
        kernel = get_kernel("matmul", "cuda")
        worst = 0.0
        for n in self.sizes.matmul:
            ha, hb = self.random(n * n, 4).reshape(n, n), self.random(n * n, 5).reshape(n, n)
            a, b = self.to_device(ha), self.to_device(hb)
            out = cuda.device_array((n, n), np.float32, stream=self.stream)
            stat = measure(lambda: kernel(out, a, b, stream=self.stream), self.timer, self.sizes)
            flops = 2 * n ** 3
            row = f"   {n:>6} {ms(stat)} {flops / stat.best / 1e12:8.2f}"
            if self.torch is not None:
                ta, tb = (self.torch.from_numpy(h).to(self.torch_device) for h in (ha, hb))
                tout = self.torch.empty((n, n), dtype=self.torch.float32, device=self.torch_device)
                tstat = measure(lambda: self.torch.matmul(ta, tb, out=tout), torch_timer(self.torch, self.torch_device),
                                self.sizes)
                ratio = stat.best / tstat.best
                worst = max(worst, ratio)
                err = float(np.abs(out.copy_to_host() - tout.cpu().numpy()).max() / np.abs(tout.cpu().numpy()).max())
                row += f" {tstat.best * 1e3:11.3f} {flops / tstat.best / 1e12:8.2f} {ratio:11.2f}"
                ta = tb = tout = None   # free the device arrays before the next size
            else:
                err = float(np.abs(out.copy_to_host() - ha @ hb).max() / np.abs(ha @ hb).max())
                row += f" {'':>11} {'':>8} {'':>11}"
            if cp is not None:
                ca, cb = cp.asarray(ha), cp.asarray(hb)
                cout = cp.empty((n, n), dtype=cp.float32)
                cstat = measure(lambda: cp.matmul(ca, cb, out=cout), CupyEventTimer(cp), self.sizes)
                row += f" {cstat.best * 1e3:9.3f} {stat.best / cstat.best:7.2f}"
                ca = cb = cout = None   # free the device arrays before the next size
            else:
                row += f" {'':>9} {'':>7}"
            if err > 1e-3:
                raise AssertionError(f"matmul {n}: max relative error {err:.2e} against the reference")
            self.out(row + f" {err:12.1e}")
            a = b = out = None   # free the device arrays before the next size
        if self.torch is not None:
            self.out(f"   worst pyflow/{t} = {worst:.2f} ({self._verdict(worst <= MATMUL_TARGET)} the "
                     f"<= {MATMUL_TARGET:g}x target)")

    def barriers(self) -> None:
        n = self.sizes.barriers
        threads = self.sizes.barrier_threads
        self.out(f"== barriers: cost per barrier, ({n} barriers - none) / {n}; grid.sync() vs group_barrier ==")
        counter = cuda.to_device(np.zeros(1, np.int64), stream=self.stream)
        state = cuda.to_device(np.zeros(4, np.int64), stream=self.stream)
        self.stream.synchronize()
        grid_args, group_args = (np.int64(n), counter), (state, np.int64(n), np.int64(1), counter)
        limit = min(cooperative_grid_limit(grid_barriers, grid_args, threads),
                    cooperative_grid_limit(group_barriers, group_args, threads))
        if backend.is_gpu():
            sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
            grids = sorted({min(sms, limit), limit})
        else:
            grids = [min(2, limit)]
        self.out(f"   {threads} threads per block; co-resident limit {limit} blocks")
        self.out(f"   {'barrier':<28}{'blocks':>7} {'us/barrier':>11} {'median':>8} {'empty launch us':>16} "
                 f"{'/grid.sync':>11}")
        for blocks in grids:
            blocks -= blocks % 2     # two groups of equal size
            if blocks < 2:
                self.out(f"   skipped: {blocks + blocks % 2} co-resident block(s): two groups need two")
                continue
            cases = [("grid.sync()", grid_barriers, lambda k: (np.int64(k), counter)),
                     ("group_barrier, 1 group", group_barriers, lambda k: (state, np.int64(k), np.int64(1), counter)),
                     ("group_barrier, 2 groups", group_barriers,
                      lambda k: (state, np.int64(k), np.int64(2), counter))]
            base = None
            for name, kernel, args in cases:
                launch = kernel[blocks, threads, self.stream]
                empty = measure(lambda: launch(*args(0)), self.timer, self.sizes)
                full = measure(lambda: launch(*args(n)), self.timer, self.sizes)
                if int(counter.copy_to_host()[0]) != n:
                    raise AssertionError(f"{name}: the kernel did not finish its {n} barriers")
                per = Stat((full.best - empty.best) / n, (full.median - empty.median) / n, 0.0)
                base = base or per
                ratio = f"{per.best / base.best:11.2f}" if base.best > 0 else f"{'n/a':>11}"
                self.out(f"   {name:<28}{blocks:>7} {per.best * 1e6:11.3f} {per.median * 1e6:8.3f} "
                         f"{empty.best * 1e6:16.1f} {ratio}")

    def eager(self) -> None:
        self.out("== eager ops on cuda through the VM: x + y, relu, x * y, exp(-x) in turn ==")
        if self.torch is None:
            self.out(f"   torch: skipped: {self.no_torch}")
        t = self.torch_label()
        self.out(f"   {'case':<36}{'ops':>7} {'us/op best':>11} {'median':>8} {'ops/s':>10} {'/' + t:>11}")
        repeats = max(1, min(3, self.sizes.repeats))

        def best_of(fn, *args):
            runs = [fn(*args) for _ in range(repeats)]
            return min(runs), statistics.median(runs)

        for label, n_ops, size in (("16 elements", self.sizes.small_ops, 16),
                                   (f"{self.sizes.large} elements", self.sizes.large_ops, self.sizes.large)):
            pyflow_chain(min(n_ops, 50), size)      # warm up: compile the kernels, fill the allocator's cache
            threaded = best_of(pyflow_chain, n_ops, size)
            with flow.vm.sync_mode():
                pyflow_chain(min(n_ops, 50), size)
                stepped = best_of(pyflow_chain, n_ops, size)
            reference = None
            if self.torch is not None:
                torch_chain(self.torch, self.torch_device, min(n_ops, 50), size)
                reference = best_of(torch_chain, self.torch, self.torch_device, n_ops, size)
            rows = [(f"pyflow threaded VM, {label}", threaded), (f"pyflow step-through, {label}", stepped)]
            if reference is not None:
                rows.append((f"{t}, {label}", reference))
            for name, (best, median) in rows:
                ratio = f"{best / reference[0]:11.2f}" if reference is not None else ""
                self.out(f"   {name:<36}{n_ops:>7} {best / n_ops * 1e6:11.2f} {median / n_ops * 1e6:8.2f} "
                         f"{n_ops / best:10.0f} {ratio}")

    @staticmethod
    def _verdict(ok: bool) -> str:
        if not backend.is_gpu():
            return "simulator: no verdict on"
        return "meets" if ok else "MISSES"

    def _check_prefix(self, op, out, want) -> None:
        got = out[:len(want)].copy_to_host()
        if not np.allclose(got, want, rtol=1e-5, atol=1e-6):
            raise AssertionError(f"{op}: wrong result")


# --- kernels for the barrier section ------------------------------------------------------


@jit
def grid_barriers(n, counter):
    """``n`` grid barriers; numba launches a kernel that grid-syncs cooperatively (all blocks co-resident)."""
    for _ in range(n):
        cuda.cg.this_grid().sync()
    if cuda.grid(1) == 0:
        counter[0] = n


@jit
def group_barriers(state, n, groups, counter):
    """``n`` ``group_barrier`` s in each of ``groups`` equal groups of blocks (counters ``state[2g:2g + 2]``).

    One grid barrier first, as in Cocktailer's kernels: it makes the launch cooperative, so
    every block is co-resident and the groups' spinning cannot starve a block not yet started.
    """
    cuda.cg.this_grid().sync()
    members = cuda.gridDim.x // groups
    slot = 2 * (cuda.blockIdx.x // members)
    for _ in range(n):
        group_barrier(state, slot, members)
    if cuda.grid(1) == 0:
        counter[0] = n


# --- eager chains ------------------------------------------------------------------------


def pyflow_chain(n_ops: int, size: int) -> float:
    """Seconds for ``n_ops`` eager ops on ``device="cuda"``, until the device has finished them."""
    x = flow.tensor(np.full(size, 0.5, np.float32), device="cuda")
    y = flow.tensor(np.full(size, 0.25, np.float32), device="cuda")
    flow.sync()
    start = time.perf_counter()
    for i in range(n_ops):
        step = i % 4
        x = x + y if step == 0 else flow.relu(x) if step == 1 else x * y if step == 2 else flow.exp(-x)
    flow.sync()          # waits for the device work too
    return time.perf_counter() - start


def torch_chain(torch, device: str, n_ops: int, size: int) -> float:
    x = torch.full((size,), 0.5, device=device)
    y = torch.full((size,), 0.25, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for i in range(n_ops):
        step = i % 4
        x = x + y if step == 0 else torch.relu(x) if step == 1 else x * y if step == 2 else torch.exp(-x)
    sync()
    return time.perf_counter() - start


# --- main ------------------------------------------------------------------------------


def header(args, sizes: Sizes) -> list:
    command = " ".join([os.path.basename(sys.executable), *sys.argv])
    lines = [f"# benchmarks/bench_kernels.py; command: {command}",
             f"# device: {device_line()}",
             f"# backend: {backend.describe()}",
             f"# machine: {os.cpu_count()}-core {platform.machine()}, Python {platform.python_version()}, "
             f"numpy {np.__version__}, numba {_version('numba')}, numba-cuda {_version('numba_cuda')}, "
             f"torch {_version('torch')}, cupy {_version('cupy')}; "
             f"date: {datetime.datetime.now().isoformat(timespec='seconds')}",
             f"# sizes: {'--tiny' if args.tiny else 'full'}; warmup {sizes.warmup}, repeats {sizes.repeats}"]
    if not backend.is_gpu():
        lines.append("# SIMULATOR RUN: every time below is Python threads' wall time and every ratio is "
                     "meaningless; it only shows that each section runs.")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true",
                        help="every section at tiny sizes with few repeats (the simulator: under a minute)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, of {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--repeats", type=int, help="timed batches per case (default: 10, --tiny 2)")
    parser.add_argument("--write", help="also write the table to this file, with a header (device, date, command)")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    sizes = TINY if args.tiny else FULL
    if args.repeats:
        sizes = dataclasses.replace(sizes, repeats=args.repeats)
    if not args.tiny and not backend.is_gpu():
        print("note: full sizes in the simulator take hours; use --tiny there", file=sys.stderr)
    bench = Bench(sizes, args.tiny, args.write, header(args, sizes))
    for line in bench.header:
        print(line, flush=True)
    for section in sections:
        start = time.perf_counter()
        try:
            getattr(bench, section)()
        except Exception as error:   # noqa: BLE001 - report, go on with the other sections
            traceback.print_exc()
            bench.failed.append(section)
            bench.out(f"   section {section} FAILED: {type(error).__name__}: {error}")
        bench.out(f"   ({section}: {time.perf_counter() - start:.1f} s)")
        bench.save()
    if bench.failed:
        bench.out(f"FAILED sections: {', '.join(bench.failed)}")
        bench.save()
    flow.vm.shutdown()
    return 1 if bench.failed else 0


if __name__ == "__main__":
    sys.exit(main())
