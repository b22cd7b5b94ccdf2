"""CPU twins against plain numpy on large inputs: the price of pyflow's checks and layout.

Each CPU kernel in ``pyflow.kernels`` is a numpy call plus shape/dtype checks.  For
large inputs the checks should cost nothing, so the ratio twin / numpy should be
about 1.0.  Each case is timed as the best of ``--repeats`` runs, twin and numpy
alternating.

    python benchmarks/bench_cpu_twins.py [--repeats 5] [--scale 1.0]

``--scale`` multiplies the input sizes (0.1 for a quick look).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pyflow.kernels.registry import get_kernel


def _rand(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def cases(scale: float):
    """(label, pyflow call, numpy call): both compute the same result into ``out``."""
    n = max(1, int(4_000_000 * scale))
    x, y = _rand(n), _rand(n, seed=1)
    out = np.empty(n, np.float32)
    xt = _rand(int(2000 * scale**0.5), int(2000 * scale**0.5)).T  # a transposed view
    out_t = np.empty(xt.shape, np.float32)
    yield "exp (4M float32)", lambda: get_kernel("exp", "cpu")(out, x), lambda: np.exp(x, out=out)
    yield "add (4M float32)", lambda: get_kernel("add", "cpu")(out, x, y), lambda: np.add(x, y, out=out)
    yield "mul, transposed input", lambda: get_kernel("mul", "cpu")(out_t, xt, xt), lambda: np.multiply(xt, xt, out=out_t)
    yield "relu (4M float32)", lambda: get_kernel("relu", "cpu")(out, x), lambda: np.maximum(x, np.float32(0), out=out)
    yield ("sigmoid (4M float32)", lambda: get_kernel("sigmoid", "cpu")(out, x),
           lambda: np.exp(-np.logaddexp(0, -x), out=out))
    mask = x > 0
    yield ("where (4M float32)", lambda: get_kernel("where", "cpu")(out, mask, x, y),
           lambda: np.copyto(out, np.where(mask, x, y)))
    out64 = np.empty(n, np.float64)
    yield ("cast float32->float64", lambda: get_kernel("cast", "cpu")(out64, x),
           lambda: np.copyto(out64, x, casting="unsafe"))
    side = int(2000 * scale**0.5)
    grid = _rand(side, side)
    rows_out = np.empty(side, np.float32)
    yield ("reduce_sum over rows", lambda: get_kernel("reduce_sum", "cpu")(rows_out, grid, axis=1),
           lambda: np.sum(grid, axis=1, out=rows_out))
    arg_out = np.empty(side, np.int64)
    yield ("argmax over columns", lambda: get_kernel("argmax", "cpu")(arg_out, grid, axis=0),
           lambda: np.argmax(grid, axis=0, out=arg_out))
    soft = np.empty_like(grid)

    def numpy_softmax():
        shifted = grid - grid.max(axis=1, keepdims=True)
        e = np.exp(shifted)
        soft[...] = e / e.sum(axis=1, keepdims=True)
    yield "softmax rows", lambda: get_kernel("softmax", "cpu")(soft, grid, axis=1), numpy_softmax
    m = max(8, int(512 * scale**(1 / 3)))
    a, b, prod = _rand(m, m), _rand(m, m, seed=2), np.empty((m, m), np.float32)
    yield (f"matmul {m}x{m}", lambda: get_kernel("matmul", "cpu")(prod, a, b.T),
           lambda: np.matmul(a, b.T, out=prod))
    parts = [_rand(n // 4, seed=i) for i in range(4)]
    cat = np.empty(4 * (n // 4), np.float32)
    yield ("concat 4 parts", lambda: get_kernel("concat", "cpu")(cat, parts, axis=0),
           lambda: np.concatenate(parts, axis=0, out=cat))
    table, idx = _rand(50_000, 64), np.random.default_rng(3).integers(0, 50_000, max(1, int(20_000 * scale)))
    looked_up = np.empty((idx.size, 64), np.float32)
    yield ("gather (embedding)", lambda: get_kernel("gather", "cpu")(looked_up, table, idx),
           lambda: np.take(table, idx, axis=0, out=looked_up))
    images, weight = _rand(4, 16, 32, 32), _rand(32, 16, 3, 3, seed=4)
    conv_out = np.empty((4, 32, 32, 32), np.float32)

    def numpy_conv():
        padded = np.pad(images, ((0, 0), (0, 0), (1, 1), (1, 1)))
        windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
        conv_out[...] = np.einsum("nchwij,ocij->nohw", windows, weight, optimize=True)
    yield ("conv2d 3x3 (4x16x32x32)", lambda: get_kernel("conv2d", "cpu")(conv_out, images, weight, None, padding=1),
           numpy_conv)


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    print(f"{'case':<28} {'pyflow cpu':>12} {'numpy':>12} {'ratio':>7}")
    ratios = []
    for label, ours, reference in cases(args.scale):
        ours(), reference()  # warm up
        t_ours, t_ref = best_of(ours, args.repeats), best_of(reference, args.repeats)
        ratios.append(t_ours / t_ref)
        print(f"{label:<28} {t_ours * 1e3:>9.3f} ms {t_ref * 1e3:>9.3f} ms {t_ours / t_ref:>7.3f}")
    geo = float(np.exp(np.mean(np.log(ratios))))
    print(f"geometric mean ratio pyflow/numpy = {geo:.3f} (target ~1.0)")


if __name__ == "__main__":
    main()
