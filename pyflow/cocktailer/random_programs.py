"""Random Cocktailer programs: a description format, the traceable program, and its numpy twin.

Used by the property tests (``tests/test_cocktailer.py`` draws descriptions with
hypothesis) and by ``benchmarks/bench_cocktailer.py`` (draws them with
``random_description``).  A description is a list of statements over one carried
state ``h`` (batch, hidden)::

    ("op", kind)                          kind in OPS
    ("for", trip, device, body)           trip 0-2; device: read trips[trip] on the device
    ("while", limit, device, body)        count up to limit (or trips[limit] on the device)
    ("cond", "flag" | "sign", k, then, else)   on flags[k], or on sum(h) > 0

Program inputs: ``h0, xs (steps, batch, hidden), w (hidden, hidden), b (hidden,),
trips (3,) int64, flags (3,) int64, one (1,)`` (``inputs`` makes them).  The program is
written with flow ops, as Tensor methods and operators (``(h @ w.T + b).tanh()``,
``h.softmax(-1)``): this package sits below the public ``pyflow`` API it would import.
"""

from __future__ import annotations

import random

import numpy as np

import pyflow.cocktailer as ck
from pyflow.framework.creation import zeros

__all__ = ["OPS", "build", "inputs", "numpy_twin", "random_description"]

OPS = ("linear_tanh", "add_x", "softmax", "square_mix", "relu_sub")


def build(desc):
    """The traceable program for ``desc`` (and its numpy twin below)."""

    def run_stmts(stmts, h, env):
        for s in stmts:
            h = run_stmt(s, h, env)
        return h

    def run_stmt(s, h, env):
        kind = s[0]
        if kind == "op":
            return apply_op(s[1], h, env)
        if kind == "for":
            _, trip, device, body = s
            n = env["trips"][trip].item() if device else trip

            def step(i, h):
                return run_stmts(body, h, dict(env, i=i))

            return ck.for_loop(n, step, h)
        if kind == "while":
            _, limit, device, body = s
            lim = env["trips"][limit].item() if device else limit

            def test(h, count):
                return count[0].item() < lim

            def step(h, count):
                return run_stmts(body, h, env), count + env["one"]

            h, _ = ck.while_loop(test, step, h, zeros(1), max_iters=5)
            return h
        _, pred_kind, k, then, orelse = s
        if pred_kind == "flag":
            pred = env["flags"][k].item()
        else:
            pred = h.reshape(1, -1).sum(-1).item() > 0
        return ck.cond(pred, lambda h: run_stmts(then, h, env), lambda h: run_stmts(orelse, h, env), h)

    def apply_op(kind, h, env):
        if kind == "linear_tanh":
            return (h @ env["w"].T + env["b"]).tanh()
        if kind == "add_x":
            return h + env["xs"][env.get("i", 0)]
        if kind == "softmax":
            return h.softmax(-1)
        if kind == "square_mix":
            return h * h - h.tanh()
        return (h - env["b"]).relu()

    def program(h0, xs, w, b, trips, flags, one):
        env = {"xs": xs, "w": w, "b": b, "trips": trips, "flags": flags, "one": one}
        return run_stmts(desc, h0, env)

    return program


def numpy_twin(desc, h0, xs, w, b, trips, flags):
    """The same program interpreted with numpy (float64 scalars aside, the reference values)."""

    def softmax(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def run_stmts(stmts, h, i):
        for s in stmts:
            h = run_stmt(s, h, i)
        return h

    def run_stmt(s, h, i):
        kind = s[0]
        if kind == "op":
            op = s[1]
            if op == "linear_tanh":
                return np.tanh(h @ w.T + b).astype(np.float32)
            if op == "add_x":
                return (h + xs[i]).astype(np.float32)
            if op == "softmax":
                return softmax(h).astype(np.float32)
            if op == "square_mix":
                return (h * h - np.tanh(h)).astype(np.float32)
            return np.maximum(h - b, 0).astype(np.float32)
        if kind == "for":
            _, trip, device, body = s
            for j in range(int(trips[trip]) if device else trip):
                h = run_stmts(body, h, j)
            return h
        if kind == "while":
            _, limit, device, body = s
            for _ in range(int(trips[limit]) if device else limit):
                h = run_stmts(body, h, i)
            return h
        _, pred_kind, k, then, orelse = s
        pred = bool(flags[k]) if pred_kind == "flag" else h.sum() > 0
        return run_stmts(then if pred else orelse, h, i)

    return run_stmts(desc, h0, 0)


def inputs(batch, hidden, steps, seed):
    rng = np.random.default_rng(seed)
    h0 = rng.standard_normal((batch, hidden)).astype(np.float32)
    xs = rng.standard_normal((steps, batch, hidden)).astype(np.float32)
    w = (rng.standard_normal((hidden, hidden)) * 0.5).astype(np.float32)
    b = rng.standard_normal(hidden).astype(np.float32)
    trips = rng.integers(0, 3, size=3).astype(np.int64)
    flags = rng.integers(0, 2, size=3).astype(np.int64)
    one = np.ones(1, np.float32)
    return h0, xs, w, b, trips, flags, one


def random_description(rng: random.Random, depth: int = 3, max_len: int = 3) -> list:
    """A random description: like the tests' hypothesis strategy, from a ``random.Random``."""
    def stmts(d):
        out = []
        for _ in range(rng.randint(1, max_len if d else 2)):
            kind = rng.choice(["op", "op", "for", "while", "cond"]) if d else "op"
            if kind == "op":
                out.append(("op", rng.choice(OPS)))
            elif kind in ("for", "while"):
                out.append((kind, rng.randint(0, 2), rng.random() < 0.5, stmts(d - 1)))
            else:
                out.append(("cond", rng.choice(["flag", "sign"]), rng.randint(0, 2), stmts(d - 1), stmts(d - 1)))
        return out

    return stmts(depth)
