"""Cocktailer: host vs compiled executor (vs PyTorch eager on a GPU): the paper's models, random programs.

    python benchmarks/bench_cocktailer.py                 # simulator: counts only
    PYFLOW_CUDA=gpu python benchmarks/bench_cocktailer.py --warmup 100 --repeats 100
    PYFLOW_CUDA=gpu python benchmarks/bench_cocktailer.py --sections lstm,rae,counts

``--sections`` picks what runs, in the order given: ``counts`` (every count below, at the
simulator's sizes) and the GPU timing rows ``lstm``, ``rae``, ``nasrnn`` (with Attention),
``seq2seq`` and ``cnn`` (BlockDrop, SkipNet); ``timing`` is all five.  The default is
``counts`` in the simulator and ``timing,counts`` on a GPU: the timing table is the point of a
GPU run, and the counts, many small kernels each compiled on first use, took a whole 3-minute
budget there (first GPU session, 2026-11-28).

Per call, for each model and executor it prints ``launches``, ``host_syncs`` and
``barriers`` (what the executors count; the ratio host/compiled is the point of
seed 001).  The RAE also runs with recursion unroll (``optimize_recursion.unroll_recursion``:
the root's two subtrees at once on two block groups), where ``barriers`` is what
block 0 waited at, the critical path; over a 127-node tree it runs unrolled 0 to 3
levels deep (nested block groups), beside what ``mode="auto"``'s cost model picks.
LSTM and NASRNN are then called with ``pyflow.Tensor`` s: the same counts, plus the VM instructions per call (one: the
whole program is one instruction), and the models are called with tensors three
times: the first call uploads the weights (host-to-device copies), the later ones
copy nothing.  In the simulator that is all: simulated time means nothing.

On a real GPU it also times, at batch 1 and 64, the artifact's sizes (LSTM 10
layers, hidden 256, seq 64; RAE Linear(1024 -> 512) + tanh over a 127-node tree;
NASRNN hidden 256, seq 1000; Attention 12 heads x 64, a KV cache of 64, 32 steps;
Seq2seq LSTM 256, vocabulary 3797, at most 50 steps, forced to the artifact's sentences;
BlockDrop ResNet-32 on 32 x 32 images with a random policy; SkipNet ResNet-101 on
224 x 224, batch 1 only as in the artifact, forced actions running about 70% of
its gated blocks), the compiled executor against the host executor and against
PyTorch eager on the same GPU (the same model written as a Python loop of torch
ops, as the artifact's baselines are; ``nn.LSTM``'s cuDNN kernel is printed as a separate reference).
Inputs live on the device; each timed call ends with a synchronisation (the
compiled executor reads back its status word).  Targets: compiled >= 3x faster
than the host executor and >= 1.5x faster than PyTorch eager at batch 1.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import traceback

import numpy as np

import pyflow.cocktailer as ck
from pyflow.cocktailer.optimize_recursion import unroll_recursion
from pyflow.cocktailer.random_programs import build, inputs, random_description
from pyflow.kernels import backend
from pyflow.kernels.backend import cuda
from pyflow.models import NASRNN, RAE, Attention, BlockDrop, Seq2seq, SkipNet, StackedLSTM


def balanced_tree(leaves: int):
    """Tables of a balanced binary tree with ``leaves`` leaves (2 * leaves - 1 nodes), root 0."""
    left, right, is_leaf = [], [], []

    def grow(k):
        i = len(is_leaf)
        is_leaf.append(int(k == 1))
        left.append(0)
        right.append(0)
        if k > 1:
            left[i] = grow(k // 2)
            right[i] = grow(k - k // 2)
        return i

    grow(leaves)
    return (np.array(left, np.int64), np.array(right, np.int64), np.array(is_leaf, np.int64))


def rae_unrolled(rae: RAE, nodes: int, depth: int = 1) -> ck.Compiled:
    """The RAE with recursion unroll ``depth`` levels: the root's two subtrees at once on two block groups,
    their subtrees on halves of those, ... (depth 0: the program as traced)."""
    program = rae.program(nodes)
    program = unroll_recursion(program, depth).program if depth else program
    return ck.compile(program, mode="compiled", **rae.options)


def counts_row(name: str, host, compiled) -> str:
    h, c = host.last_stats, compiled.last_stats
    return (f"{name:<34} host: {h.launches:6d} launches {h.host_syncs:5d} syncs | compiled: {c.launches:3d} launch "
            f"{c.host_syncs:3d} syncs {c.barriers:6d} barriers | launches host/compiled = "
            f"{h.launches / max(c.launches, 1):.0f}")


def counts(sizes: dict) -> None:
    """Launches, host syncs and barriers per call, host vs compiled executor."""
    print("== per-call counts (host executor vs compiled executor) ==")
    rng = np.random.default_rng(0)
    lstm = StackedLSTM(sizes["input"], sizes["hidden"], sizes["layers"], **sizes["options"])
    x = rng.standard_normal((sizes["seq"], sizes["batch"], sizes["input"])).astype(np.float32)
    out_h = lstm(x, mode="host")
    host = lstm.last_compiled
    out_c = lstm(x, mode="compiled")
    assert all(np.array_equal(a, b) for a, b in zip((out_h[0], *out_h[1]), (out_c[0], *out_c[1])))
    print(counts_row(f"LSTM L{sizes['layers']} H{sizes['hidden']} seq{sizes['seq']} b{sizes['batch']}",
                     host, lstm.last_compiled))

    rae = RAE(sizes["dim"], **sizes["options"])
    left, right, is_leaf = balanced_tree(sizes["leaves"])
    inp = rng.standard_normal((len(left), sizes["dim"])).astype(np.float32)
    a = rae(left, right, is_leaf, inp, mode="host")
    host = rae.last_compiled
    b = rae(left, right, is_leaf, inp, mode="compiled")
    assert np.array_equal(a, b)
    print(counts_row(f"RAE dim{sizes['dim']} {len(left)} nodes", host, rae.last_compiled))
    unrolled = rae_unrolled(rae, len(left))
    tables = rae.check_tree(left, right, is_leaf, inp, 0)
    assert np.array_equal(a, unrolled(*tables[:4], rae.weight, rae.bias, tables[4]))
    print(counts_row(f"RAE dim{sizes['dim']} {len(left)} nodes, rec. unroll", host, unrolled)
          + "  (block 0's barriers: its group walks the left subtree)")

    rae_depth_counts(sizes)
    nasrnn_attention_counts(sizes)
    seq2seq_counts(sizes)
    cnn_counts(sizes)

    r = random.Random(0)
    totals = {"host": [0, 0], "compiled": [0, 0, 0]}
    for k in range(sizes["random"]):
        desc = random_description(r, depth=3)
        args = inputs(2, 4, 3, seed=k)
        program = ck.trace(build(desc), *args, chunk=4, tile=4, name=f"random{k}")
        host = ck.compile(program, mode="host", threads=4)
        compiled = ck.compile(program, mode="compiled", threads=4)
        assert np.array_equal(host(*args), compiled(*args))
        totals["host"][0] += host.last_stats.launches
        totals["host"][1] += host.last_stats.host_syncs
        s = compiled.last_stats
        totals["compiled"] = [t + v for t, v in zip(totals["compiled"], (s.launches, s.host_syncs, s.barriers))]
    h, c = totals["host"], totals["compiled"]
    print(f"{sizes['random']} random programs (depth 3), total: host {h[0]} launches {h[1]} syncs | compiled "
          f"{c[0]} launches {c[1]} syncs {c[2]} barriers | launches host/compiled = {h[0] / max(c[0], 1):.1f}")
    tensor_counts(sizes)


def rae_depth_counts(sizes: dict) -> None:
    """The RAE over the artifact's largest tree (127 nodes) with recursion unroll 0-3 levels deep (nested block
    groups), and the depth mode="auto" picks by its cost model."""
    dim, leaves = sizes["dim"], sizes["rae_leaves"]
    rae = RAE(dim, **sizes["options"])
    left, right, is_leaf = balanced_tree(leaves)
    inp = np.random.default_rng(2).standard_normal((len(left), dim)).astype(np.float32)
    want = rae(left, right, is_leaf, inp, mode="host")
    host = rae.last_compiled
    tables = rae.check_tree(left, right, is_leaf, inp, 0)
    args = (*tables[:4], rae.weight, rae.bias, tables[4])
    print(f"== RAE dim{dim} {len(left)} nodes: recursion unroll depth (block 0's barriers: grid + group barriers "
          "on its path, the critical path) ==")
    for depth in range(4):
        c = rae_unrolled(rae, len(left), depth)
        assert np.array_equal(c(*args), want)
        grid = c.kernels[0].grid([], c.executor.options, c.program.name)
        print(counts_row(f"RAE {len(left)} nodes, unroll depth {depth}", host, c) + f"  grid {grid} blocks")
    auto = rae.compiled_for(len(left), "auto")
    assert np.array_equal(auto(*args), want)
    for note in auto.schedule.optimizations:
        if note.name.startswith("recursion unroll"):
            print(f"  cost model:{note}")
    print(f"  mode='auto': {auto.last_stats}")


def tensor_counts(sizes: dict) -> None:
    """Per call through ``pyflow.Tensor`` s on "cuda": the call is ONE VM instruction (``cocktailer/launch.py``);
    its launches and host syncs happen inside it.  Every input is a tensor already, so nothing else is issued."""
    import pyflow as flow

    print("== per-call counts through pyflow.Tensors (cuda): one VM instruction per call ==")
    rng = np.random.default_rng(0)
    lstm = StackedLSTM(sizes["input"], sizes["hidden"], sizes["layers"], **sizes["options"])
    nasrnn = NASRNN(sizes["input"], sizes["hidden"], **sizes["options"])
    x = rng.standard_normal((sizes["seq"], sizes["batch"], sizes["input"])).astype(np.float32)
    models = [(f"LSTM L{sizes['layers']} H{sizes['hidden']} seq{sizes['seq']} b{sizes['batch']}", lstm,
               lstm.program_inputs(x)),
              (f"NASRNN H{sizes['hidden']} seq{sizes['seq']} b{sizes['batch']}", nasrnn, nasrnn.program_inputs(x))]
    for name, model, arrays in models:
        row = []
        for mode in ("host", "compiled"):
            compiled = model.compiled_for(sizes["seq"], sizes["batch"], mode)
            want = compiled(*arrays)
            tensors = [flow.tensor(a, device="cuda") for a in arrays]
            flow.sync()
            with flow.trace() as tracer:
                got = compiled(*tensors)
            got = got if isinstance(got, tuple) else (got,)
            want = want if isinstance(want, tuple) else (want,)
            assert all(np.array_equal(g.numpy(), w) for g, w in zip(got, want))
            s = compiled.last_stats
            row.append(f"{mode}: {s.launches:5d} launch(es) {s.host_syncs:4d} syncs {len(tracer.records)} VM instr.")
        print(f"{name:<34} " + " | ".join(row))
    upload_counts(sizes)


def upload_counts(sizes: dict) -> None:
    """A model called with tensors keeps its weights on the device (``models/device_weights.py``): the first call
    uploads each (a ``tensor`` VM instruction: a host-to-device copy), later calls only run the program."""
    import gc

    import pyflow as flow

    print("== model calls with pyflow.Tensors (cuda): host-to-device uploads per call (weights stay on the device) ==")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((sizes["seq"], sizes["batch"], sizes["input"])).astype(np.float32)
    left, right, is_leaf = balanced_tree(sizes["leaves"])
    inp = rng.standard_normal((len(left), sizes["dim"])).astype(np.float32)
    models = [(f"LSTM L{sizes['layers']} H{sizes['hidden']} seq{sizes['seq']} b{sizes['batch']}",
               StackedLSTM(sizes["input"], sizes["hidden"], sizes["layers"], **sizes["options"]), (x,)),
              (f"RAE dim{sizes['dim']} {len(left)} nodes", RAE(sizes["dim"], **sizes["options"]),
               (left, right, is_leaf, inp)),
              (f"NASRNN H{sizes['hidden']} seq{sizes['seq']} b{sizes['batch']}",
               NASRNN(sizes["input"], sizes["hidden"], **sizes["options"]), (x,))]
    for name, model, arrays in models:
        tensors = [flow.tensor(a, device="cuda") for a in arrays]
        want = model(*arrays)
        row = []
        for call in range(1, 4):
            gc.collect()
            flow.sync()
            with flow.trace() as tracer:
                got = model(*tensors)
            names = [r.name for r in tracer.records]
            assert np.array_equal((got[0] if isinstance(got, tuple) else got).numpy(),
                                  want[0] if isinstance(want, tuple) else want)
            row.append(f"call {call}: {names.count('tensor'):2d} uploads "
                       f"{sum(n.startswith('cocktailer[') for n in names)} program instr.")
        print(f"{name:<34} " + " | ".join(row))


def attention_inputs(rng, batch: int, heads: int, head_size: int, cache: int, start: int):
    """The artifact's Attention inputs: a token, caches random in the first ``start`` rows, zeros after."""
    x = rng.standard_normal((batch, heads, 1, head_size)).astype(np.float32)
    k, v = (np.zeros((batch, heads, cache, head_size), np.float32) for _ in range(2))
    k[:, :, :start] = rng.standard_normal((batch, heads, start, head_size))
    v[:, :, :start] = rng.standard_normal((batch, heads, start, head_size))
    return x, k, v


def nasrnn_attention_counts(sizes: dict) -> None:
    """The count rows of NASRNN and Attention (issue 17)."""
    rng = np.random.default_rng(2)
    nasrnn = NASRNN(sizes["input"], sizes["hidden"], **sizes["options"])
    x = rng.standard_normal((sizes["seq"], sizes["batch"], sizes["input"])).astype(np.float32)
    a = nasrnn(x, mode="host")
    host = nasrnn.last_compiled
    assert np.array_equal(a, nasrnn(x, mode="compiled"))
    print(counts_row(f"NASRNN H{sizes['hidden']} seq{sizes['seq']} b{sizes['batch']}", host, nasrnn.last_compiled))
    heads, head_size, cache, start = sizes["heads"], sizes["head_size"], sizes["cache"], sizes["start"]
    attention = Attention(heads, head_size, start, **sizes["options"])
    inputs = attention_inputs(rng, sizes["batch"], heads, head_size, cache, start)
    a = attention(*inputs, mode="host")
    host = attention.last_compiled
    assert all(np.array_equal(p, q) for p, q in zip(a, attention(*inputs, mode="compiled")))
    print(counts_row(f"Attention {heads}x{head_size} S{cache} {cache - start} steps b{sizes['batch']}", host,
                     attention.last_compiled))


def artifact_std(batch: int, max_length: int, vocab: int, shortest: int = 10) -> np.ndarray:
    """The artifact's Seq2seq benchmark input: row ``b`` forced to ``1, 2, ..., l - 1, EOS`` (then EOS), where
    ``l = min(max(b, shortest), max_length)``, by 1e6 at those tokens (its ``gen_mask_from_sequence``); ids past
    the vocabulary wrap around, skipping EOS."""
    std = np.zeros((max_length, batch, vocab), np.float32)
    for b in range(batch):
        length = min(max(b, shortest), max_length)
        sentence = [1 + (t - 1) % (vocab - 1) for t in range(1, length)] + [0] * (max_length - length + 1)
        std[np.arange(max_length), b, sentence] = 1e6
    return std


def seq2seq_counts(sizes: dict) -> None:
    """The count row of Seq2seq (issue 17): a while loop whose trip count the forced sentences decide."""
    rng = np.random.default_rng(3)
    H, V, L, B = sizes["hidden"], sizes["vocab"], sizes["max_length"], sizes["batch"]
    seq2seq = Seq2seq(H, V, L, **sizes["options"])
    std = artifact_std(B, L, V, shortest=sizes["sentence"])
    encoder_output = rng.standard_normal((L, B, H)).astype(np.float32)
    h, c = (rng.standard_normal((B, H)).astype(np.float32) for _ in range(2))
    a = seq2seq(encoder_output, std, h, c, mode="host")
    host = seq2seq.last_compiled
    b = seq2seq(encoder_output, std, h, c, mode="compiled")
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    print(counts_row(f"Seq2seq H{H} V{V} max{L} {seq2seq.last_steps} steps b{B}", host, seq2seq.last_compiled))


def cnn_counts(sizes: dict) -> None:
    """The count rows of BlockDrop and SkipNet (issue 17): branches on device values, per block."""
    rng = np.random.default_rng(4)
    layers, width, image, batch = sizes["bd_layers"], sizes["bd_width"], sizes["bd_image"], sizes["batch"]
    blockdrop = BlockDrop(layers, 10, width=width, image_size=image, **sizes["options"])
    x = rng.standard_normal((batch, 3, image, image)).astype(np.float32)
    probs = rng.random((batch, blockdrop.num_blocks)).astype(np.float32) * 0.6   # some blocks nobody runs
    a = blockdrop(x, probs, mode="host")
    host = blockdrop.last_compiled
    assert np.array_equal(a, blockdrop(x, probs, mode="compiled"))
    run = int((probs >= 0.5).any(axis=0).sum())
    print(counts_row(f"BlockDrop {','.join(map(str, layers))} w{width} s{image} {run}/{blockdrop.num_blocks} run "
                     f"b{batch}", host, blockdrop.last_compiled))
    layers, width, image = sizes["sk_layers"], sizes["sk_width"], sizes["sk_image"]
    skipnet = SkipNet(layers, image, 10, width=width, **sizes["options"])
    x = rng.standard_normal((1, 3, image, image)).astype(np.float32)
    state = np.zeros((1, 1, skipnet.hidden_dim), np.float32)
    actions = np.arange(skipnet.num_blocks - 1) % 2   # every other gated block runs
    a = skipnet(x, state, state, actions, mode="host")
    host = skipnet.last_compiled
    assert all(np.array_equal(p, q) for p, q in zip(a, skipnet(x, state, state, actions, mode="compiled")))
    print(counts_row(f"SkipNet {','.join(map(str, layers))} w{width} s{image} {actions.sum()}/{len(actions)} run b1",
                     host, skipnet.last_compiled))


def timed(fn, warmup: int, repeats: int) -> float:
    """Median seconds per call of ``fn`` (which must synchronise)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


GPU_OPTIONS = {"threads": 256, "chunk": 256, "tile": 16}


def lstm_latency(warmup: int, repeats: int, opts: dict) -> None:
    """GPU rows for the LSTM (10 layers, hidden 256, seq 64), batch 1 and 64, with cuDNN's as a reference."""
    import torch

    dev = torch.device("cuda")
    L, H, S = 10, 256, 64
    for batch in (1, 64):
        lstm = StackedLSTM(H, H, L, **opts)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((S, batch, H)).astype(np.float32)
        dev_args = [cuda.to_device(a) for a in lstm.program_inputs(x)]
        results = {}
        for mode in ("compiled", "host"):
            c = lstm.compiled_for(S, batch, mode)
            results[mode] = timed(lambda c=c: (c(*dev_args, to_host=False), cuda.synchronize()), warmup, repeats)
        sd = {k: torch.tensor(v, device=dev) for k, v in lstm.state_dict().items()}
        xt = torch.tensor(x, device=dev)

        def torch_loop():
            with torch.no_grad():
                inp = xt
                for layer in range(L):
                    h = torch.zeros(batch, H, device=dev)
                    c = torch.zeros(batch, H, device=dev)
                    outs = []
                    for t in range(S):
                        gates = (inp[t] @ sd[f"weight_ih_l{layer}"].T + sd[f"bias_ih_l{layer}"]
                                 + h @ sd[f"weight_hh_l{layer}"].T + sd[f"bias_hh_l{layer}"])
                        i, f, g, o = gates.chunk(4, 1)
                        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                        h = torch.sigmoid(o) * torch.tanh(c)
                        outs.append(h)
                    inp = torch.stack(outs)
                torch.cuda.synchronize()

        results["torch eager (loop)"] = timed(torch_loop, warmup, repeats)
        cudnn = torch.nn.LSTM(H, H, L).to(dev)

        def torch_cudnn():
            with torch.no_grad():
                cudnn(xt)
            torch.cuda.synchronize()

        results["torch nn.LSTM (cuDNN, reference)"] = timed(torch_cudnn, warmup, repeats)
        report(f"LSTM L{L} H{H} seq{S} batch {batch}", results)


def rae_latency(warmup: int, repeats: int, opts: dict) -> None:
    """GPU rows for the RAE (Linear(1024 -> 512) + tanh over a 127-node tree), batch 1, recursion unroll 0-3."""
    import torch

    dev = torch.device("cuda")
    dim, leaves = 512, 64
    rae = RAE(dim, **opts)
    left, right, is_leaf = balanced_tree(leaves)
    rng = np.random.default_rng(1)
    inp = rng.standard_normal((len(left), dim)).astype(np.float32)
    tables = rae.check_tree(left, right, is_leaf, inp, 0)
    dev_args = [cuda.to_device(a) for a in (*tables[:4], rae.weight, rae.bias, tables[4])]
    results = {}
    runs = {mode: rae.compiled_for(len(left), mode) for mode in ("compiled", "host")}
    for depth in (1, 2, 3):
        runs[f"compiled + recursion unroll x{depth}"] = rae_unrolled(rae, len(left), depth)
    for name, c in runs.items():
        results[name] = timed(lambda c=c: (c(*dev_args, to_host=False), cuda.synchronize()), warmup, repeats)
    w, b, xt = (torch.tensor(a, device=dev) for a in (rae.weight, rae.bias, inp))

    def torch_rae():
        def rec(n):
            if is_leaf[n]:
                return xt[n]
            return torch.tanh(w @ torch.cat([rec(left[n]), rec(right[n])]) + b)

        with torch.no_grad():
            rec(0)
        torch.cuda.synchronize()

    results["torch eager (recursion)"] = timed(torch_rae, warmup, repeats)
    report(f"RAE dim {dim}, {len(left)} nodes, batch 1", results)


def torch_nasrnn(torch, weight_ih, weight_hh, inputs):
    """The artifact's NasRNN forward as a Python loop of torch ops (its PyTorch baseline); returns sum(c + m)."""
    c = torch.zeros(inputs.shape[1], weight_hh.shape[-1], device=inputs.device)
    m = torch.zeros_like(c)
    acts = (torch.sigmoid, torch.relu, torch.sigmoid, torch.relu, torch.tanh, torch.sigmoid, torch.tanh, torch.sigmoid)
    for t in range(inputs.shape[0]):
        ih, hh = torch.matmul(inputs[t], weight_ih), torch.matmul(m, weight_hh)
        l1 = [act(ih[g] + hh[g]) for g, act in enumerate(acts)]
        c = torch.tanh(torch.tanh(l1[0] * l1[1]) + c) * torch.tanh(l1[2] + l1[3])
        m = torch.tanh(c * torch.tanh(torch.tanh(l1[4] * l1[5]) + torch.sigmoid(l1[6] + l1[7])))
    return torch.sum(c + m)


def torch_attention(torch, weights, x, k, v, start: int, scale: float = 0.125):
    """The artifact's Attention forward as a Python loop of torch ops (its PyTorch baseline); returns (k, v, x)."""
    w_q, w_k, w_v, w_o = weights
    k, v = k + 0.0, v + 0.0
    for gen_id in range(start, k.shape[2]):
        q = torch.matmul(x, w_q)
        k[:, :, gen_id, :] = torch.matmul(x, w_k)[:, :, 0]
        v[:, :, gen_id, :] = torch.matmul(x, w_v)[:, :, 0]
        attn = torch.softmax(torch.matmul(k, q.transpose(2, 3)).transpose(2, 3) * scale, dim=3)
        x = torch.matmul(torch.matmul(attn, v), w_o)
    return k, v, x


def nasrnn_attention_latency(warmup: int, repeats: int, opts: dict) -> None:
    """GPU rows for NASRNN (hidden 256, seq 1000) and Attention (12 x 64, cache 64, 32 steps), batch 1 and 64."""
    import torch

    dev = torch.device("cuda")
    H, S = 256, 1000
    heads, head_size, cache, start = 12, 64, 64, 32
    for batch in (1, 64):
        rng = np.random.default_rng(0)
        nasrnn = NASRNN(H, H, **opts)
        x = rng.standard_normal((S, batch, H)).astype(np.float32)
        dev_args = [cuda.to_device(a) for a in nasrnn.program_inputs(x)]
        results = {}
        for mode in ("compiled", "host"):
            c = nasrnn.compiled_for(S, batch, mode)
            results[mode] = timed(lambda c=c: (c(*dev_args, to_host=False), cuda.synchronize()), warmup, repeats)
        w_ih, w_hh, xt = (torch.tensor(a, device=dev) for a in (nasrnn.weight_ih, nasrnn.weight_hh, x))

        def nasrnn_eager():
            with torch.no_grad():
                torch_nasrnn(torch, w_ih, w_hh, xt)
            torch.cuda.synchronize()

        results["torch eager (loop)"] = timed(nasrnn_eager, warmup, repeats)
        report(f"NASRNN H{H} seq{S} batch {batch}", results)

        attention = Attention(heads, head_size, start, **opts)
        inputs = attention_inputs(rng, batch, heads, head_size, cache, start)
        dev_args = [cuda.to_device(a) for a in attention.program_inputs(*inputs)]
        results = {}
        for mode in ("compiled", "host"):
            c = attention.compiled_for(batch, cache, mode)
            results[mode] = timed(lambda c=c: (c(*dev_args, to_host=False), cuda.synchronize()), warmup, repeats)
        weights = [torch.tensor(w, device=dev) for w in attention.weights]
        tensors = [torch.tensor(a, device=dev) for a in inputs]

        def attention_eager():
            with torch.no_grad():
                torch_attention(torch, weights, *tensors, start)
            torch.cuda.synchronize()

        results["torch eager (loop)"] = timed(attention_eager, warmup, repeats)
        report(f"Attention {heads}x{head_size} cache {cache}, {cache - start} steps, batch {batch}", results)


def torch_seq2seq(torch, model: Seq2seq, std, h, c):
    """The artifact's AttnDecoderRNN forward as a Python loop of torch ops (its PyTorch baseline): the
    condition is read on the host every step (``bool(...)``, as its TorchScript variant does)."""
    w_ih, w_hh, b_ih, b_hh, out_w, out_b, emb = (torch.tensor(w, device=std.device) for w in model._weights())
    batch, L = std.shape[1], model.max_length
    output_all = torch.zeros(L, batch, dtype=torch.int64, device=std.device)
    output = torch.full((batch,), 1, dtype=torch.int64, device=std.device)
    step, cond = 0, True
    while cond:
        x = emb[output]
        ih, hh = torch.matmul(x, w_ih), torch.matmul(h, w_hh)
        z = [(ih[g] + b_ih[g]) + (hh[g] + b_hh[g]) for g in range(4)]
        c = torch.sigmoid(z[1]) * c + torch.sigmoid(z[0]) * torch.tanh(z[2])
        h = torch.sigmoid(z[3]) * torch.tanh(c)
        output = (h @ out_w.T + out_b + std[step]).argmax(1)
        output_all[step] = output
        step += 1
        cond = bool(torch.max(output) > 0) and step < L
    return output_all, h


def seq2seq_latency(warmup: int, repeats: int, opts: dict) -> None:
    """GPU rows for Seq2seq (LSTM 256, vocabulary 3797, at most 50 steps), batch 1 and 64."""
    import torch

    dev = torch.device("cuda")
    H, V, L = 256, 3797, 50
    for batch in (1, 64):
        rng = np.random.default_rng(0)
        seq2seq = Seq2seq(H, V, L, **opts)
        std = artifact_std(batch, L, V)
        encoder_output = rng.standard_normal((L, batch, H)).astype(np.float32)
        h, c = (rng.standard_normal((batch, H)).astype(np.float32) for _ in range(2))
        dev_args = [cuda.to_device(a) for a in seq2seq.program_inputs(encoder_output, std, h, c)]
        results = {}
        for mode in ("compiled", "host"):
            run = seq2seq.compiled_for(batch, mode)
            results[mode] = timed(lambda run=run: (run(*dev_args, to_host=False), cuda.synchronize()), warmup, repeats)
        std_t, h_t, c_t = (torch.tensor(a, device=dev) for a in (std, h, c))

        def seq2seq_eager():
            with torch.no_grad():
                torch_seq2seq(torch, seq2seq, std_t, h_t, c_t)
            torch.cuda.synchronize()

        results["torch eager (loop, host reads cond)"] = timed(seq2seq_eager, warmup, repeats)
        seq2seq(encoder_output, std, h, c)   # for last_steps, in the row's name
        report(f"Seq2seq H{H} V{V} max {L}, {seq2seq.last_steps} steps, batch {batch}", results)


def _torch_conv_bn(torch, p, x, conv: str, bn: str, stride: int = 1, padding: int = 0, relu: bool = False):
    """``bn(conv(x))`` in eval mode from the state dict ``p`` (torch tensors), then ReLU if ``relu``."""
    F = torch.nn.functional
    y = F.batch_norm(F.conv2d(x, p[f"{conv}.weight"], stride=stride, padding=padding), p[f"{bn}.running_mean"],
                     p[f"{bn}.running_var"], p[f"{bn}.weight"], p[f"{bn}.bias"], training=False, eps=1e-5)
    return torch.relu(y) if relu else y


def torch_blockdrop(torch, model: BlockDrop, p: dict, x, probs):
    """The artifact's BlockDrop ``forward_real`` as torch ops (its PyTorch baseline): each branch reads its
    count on the host."""
    F = torch.nn.functional
    policy = torch.where(probs < 0.5, torch.zeros_like(probs), torch.ones_like(probs)).t()
    x = _torch_conv_bn(torch, p, x, "conv1", "bn1", padding=1, relu=True)
    for k, (stage, i, _, _, stride) in enumerate(model.blocks()):
        residual = x
        if stride != 1:   # DownsampleB
            pooled = F.avg_pool2d(x, stride)
            residual = torch.cat((pooled, torch.zeros_like(pooled)), dim=1)
        if torch.sum(policy[k]) > 0.0:
            prefix, mask = f"blocks.{stage}.{i}", policy[k].view(-1, 1, 1, 1)
            fx = _torch_conv_bn(torch, p, x, f"{prefix}.conv1", f"{prefix}.bn1", stride, 1, relu=True)
            fx = torch.relu(residual + _torch_conv_bn(torch, p, fx, f"{prefix}.conv2", f"{prefix}.bn2", 1, 1))
            x = fx * mask + residual * (1.0 - mask)
        else:
            x = residual
    return F.linear(F.avg_pool2d(x, model.image_size // 4).flatten(1), p["fc.weight"], p["fc.bias"])


def torch_skipnet(torch, model: SkipNet, p: dict, x, ch, cc, control):
    """The artifact's SkipNet ``forward_fix`` as torch ops (its PyTorch baseline): the controller, then a host
    read of ``sum(mask + cond_control[j]) > 0`` per gated block."""
    F = torch.nn.functional
    H, batch, rnn = model.hidden_dim, x.shape[0], "control.rnn"

    def body(x, layer, stride):
        y = _torch_conv_bn(torch, p, x, f"{layer}.conv1", f"{layer}.bn1", relu=True)
        y = _torch_conv_bn(torch, p, y, f"{layer}.conv2", f"{layer}.bn2", stride, 1, relu=True)
        return _torch_conv_bn(torch, p, y, f"{layer}.conv3", f"{layer}.bn3")

    def controller(x, gate, ch, cc):
        feature = F.conv2d(F.avg_pool2d(x, x.shape[2]), p[f"{gate}.1.weight"], p[f"{gate}.1.bias"])
        ih = torch.matmul(feature.view(1, batch, H), p[f"{rnn}.weight_ih_l0_t"]) + p[f"{rnn}.bias_ih_l0_t"]
        hh = torch.matmul(ch, p[f"{rnn}.weight_hh_l0_t"]) + p[f"{rnn}.bias_hh_l0_t"]
        cc = torch.sigmoid(ih[1] + hh[1]) * cc + torch.sigmoid(ih[0] + hh[0]) * torch.tanh(ih[2] + hh[2])
        ch = torch.sigmoid(ih[3] + hh[3]) * torch.tanh(cc)
        prob = torch.sigmoid(F.conv2d(ch.view(batch, H, 1, 1), p["control.proj.weight"], p["control.proj.bias"]))
        return (prob.view(batch) > 0.5).to(x.dtype).view(batch, 1, 1, 1), ch, cc

    x = F.max_pool2d(_torch_conv_bn(torch, p, x, "conv1", "bn1", 2, 3, relu=True), 3, 2, 1)
    blocks = list(model.blocks())
    mask = None
    for j, (group, i, _, _, stride, has_ds) in enumerate(blocks):
        layer = f"group{group}_layer{i}"
        residual = _torch_conv_bn(torch, p, x, f"{layer}.downsample.0", f"{layer}.downsample.1", stride) \
            if has_ds else x
        if j == 0:
            x = torch.relu(body(x, layer, stride) + residual)
        elif torch.sum(mask + control[j - 1]) > 0.0:
            x = torch.relu(body(x, layer, stride) + residual)
            x = mask * x + (1.0 - mask) * residual
        else:
            x = residual
        if j + 1 < len(blocks):
            mask, ch, cc = controller(x, f"group{group}_gate{i}", ch, cc)
    return F.linear(F.avg_pool2d(x, model.pool_sizes[-1]).flatten(1), p["fc.weight"], p["fc.bias"]), ch, cc


def cnn_latency(warmup: int, repeats: int, opts: dict) -> None:
    """GPU rows for BlockDrop (ResNet-32, 32 x 32, batch 1 and 64) and SkipNet (ResNet-101, 224 x 224, batch 1)."""
    import torch

    dev = torch.device("cuda")
    rng = np.random.default_rng(0)
    blockdrop = BlockDrop((5, 5, 5), 10, **opts)
    p = {k: torch.tensor(np.asarray(v), device=dev) for k, v in blockdrop.state_dict().items()}
    for batch in (1, 64):
        x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
        probs = rng.random((batch, blockdrop.num_blocks)).astype(np.float32)
        dev_args = [cuda.to_device(a) for a in blockdrop.program_inputs(x, probs)]
        results = {}
        for mode in ("compiled", "host"):
            run = blockdrop.compiled_for(batch, mode)
            results[mode] = timed(lambda run=run: (run(*dev_args, to_host=False), cuda.synchronize()), warmup, repeats)
        xt, pt = torch.tensor(x, device=dev), torch.tensor(probs, device=dev)

        def blockdrop_eager():
            with torch.no_grad():
                torch_blockdrop(torch, blockdrop, p, xt, pt)
            torch.cuda.synchronize()

        results["torch eager (host reads each count)"] = timed(blockdrop_eager, warmup, repeats)
        run_blocks = int((probs >= 0.5).any(axis=0).sum())
        report(f"BlockDrop ResNet-32, {run_blocks}/15 blocks run, batch {batch}", results)

    skipnet = SkipNet(**opts)
    p = {k: torch.tensor(np.asarray(v), device=dev) for k, v in skipnet.state_dict().items()}
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    state = np.zeros((1, 1, skipnet.hidden_dim), np.float32)
    actions = (rng.random(skipnet.num_blocks - 1) < 0.7).astype(np.int64)
    dev_args = [cuda.to_device(a) for a in skipnet.program_inputs(x, state, state, actions)]
    results = {}
    for mode in ("compiled", "host"):
        run = skipnet.compiled_for(1, mode)
        results[mode] = timed(lambda run=run: (run(*dev_args, to_host=False), cuda.synchronize()), warmup, repeats)
    xt, st, ct = (torch.tensor(a, device=dev) for a in (x, state, dev_args[3].copy_to_host()))

    def skipnet_eager():
        with torch.no_grad():
            torch_skipnet(torch, skipnet, p, xt, st, st, ct)
        torch.cuda.synchronize()

    results["torch eager (host reads each test)"] = timed(skipnet_eager, warmup, repeats)
    report(f"SkipNet ResNet-101, {actions.sum()}/{len(actions)} gated blocks run, batch 1", results)


def report(name: str, results: dict) -> None:
    base = results["compiled"]
    print(f"{name}:")
    for key, seconds in results.items():
        print(f"  {key:<34} {seconds * 1e3:9.3f} ms   ({seconds / base:5.2f}x the compiled executor's time)")


SIM_SIZES = {"input": 4, "hidden": 4, "layers": 2, "seq": 4, "batch": 2, "dim": 4, "leaves": 8, "rae_leaves": 64,
             "random": 10,
             "heads": 2, "head_size": 4, "cache": 6, "start": 3, "vocab": 7, "max_length": 6, "sentence": 4,
             "bd_layers": (2, 2, 2), "bd_width": 2, "bd_image": 8, "sk_layers": (2, 2, 2, 2), "sk_width": 1,
             "sk_image": 32,
             "options": {"threads": 4, "chunk": 8, "tile": 4}}


# the GPU timing rows, in the order "timing" runs them
TIMING = {"lstm": lstm_latency, "rae": rae_latency, "nasrnn": nasrnn_attention_latency,
          "seq2seq": seq2seq_latency, "cnn": cnn_latency}
SECTIONS = ("counts", "timing", *TIMING)


def sections_to_run(text: str | None, gpu: bool) -> list:
    """The sections ``--sections`` names, in its order, ``timing`` spelled out; its default without it.

    >>> sections_to_run(None, gpu=False), sections_to_run(None, gpu=True)[:2]
    (['counts'], ['lstm', 'rae'])
    >>> sections_to_run("rae,counts,timing", gpu=True)
    ['rae', 'counts', 'lstm', 'nasrnn', 'seq2seq', 'cnn']
    """
    names = [n.strip() for n in (text or ("timing,counts" if gpu else "counts")).split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown or not names:
        raise ValueError(f"unknown section(s) {','.join(unknown) or '(none given)'}; choose from "
                         f"{','.join(SECTIONS)}")
    chosen = []
    for name in names:
        for section in TIMING if name == "timing" else (name,):
            if section not in chosen:
                chosen.append(section)
    return chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--sections", help=f"comma-separated, in the order to run: {', '.join(SECTIONS)} "
                                           "(default: counts in the simulator, timing,counts on a GPU)")
    args = parser.parse_args(argv)
    try:
        sections = sections_to_run(args.sections, backend.is_gpu())
    except ValueError as error:
        parser.error(str(error))
    print(f"backend: {backend.describe()}; sections: {','.join(sections)}")
    timed_sections = [s for s in sections if s in TIMING]
    if timed_sections and backend.is_gpu():
        import torch

        print(f"== GPU latency (median of {args.repeats} after {args.warmup} warm-up calls), device "
              f"{torch.cuda.get_device_name(0)} ==")
    failed = []
    for section in sections:
        if section == "counts":
            counts(SIM_SIZES)
        elif backend.is_gpu():
            try:   # one model's failure still leaves the others' rows (a GPU session is short)
                TIMING[section](args.warmup, args.repeats, GPU_OPTIONS)
            except Exception:
                traceback.print_exc()
                print(f"section {section}: FAILED (traceback above)", flush=True)
                failed.append(section)
    if not backend.is_gpu():
        skipped = f" ({','.join(timed_sections)} skipped)" if timed_sections else ""
        print(f"(no GPU: counts only{skipped}; simulated time is not a latency)")
    if failed:
        print(f"failed sections: {','.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
