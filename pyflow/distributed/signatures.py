"""SBP signatures (seed 004): which layouts an op can run on, and the cheapest one for given inputs.

An op on global tensors runs piece by piece on every rank, which is right only
for some combinations of input and output SBPs: its **signatures**.  Every op
has the all-broadcast one (every rank computes the whole result).  Families:

* elementwise (broadcasting): the inputs split along the same output dim give
  an output split there (an input broadcast along that dim stays B); linear ops
  keep partial sums: ``add``/``sub`` (P, P) -> P, ``mul`` (P, B) -> P and
  (B, P) -> P, ``div`` (P, B) -> P, ``neg`` P -> P;
* ``matmul`` (2-D): (S0, B) -> S0, (B, S1) -> S1, (S1, S0) -> P, (P, B) -> P,
  (B, P) -> P, (B, B) -> B; batched: a batch dim split on both inputs;
* reductions: a kept dim's split stays a split; ``sum`` over a split dim gives
  P; ``sum`` and ``mean`` keep P;
* ``softmax``/``log_softmax``: a split along another dim.

On an N-D hierarchy each axis picks its own 1-D signature.  The interpreter
keeps the candidates that split no dim shorter than the ranks along that axis,
and takes the cheapest by the cost model (SEMANTICS §4): per input, with T its
logical bytes and n the ranks on the axis, moving it to the signature's SBP
costs 0 if equal, 1 for B -> S, T(n-1)/n for S(i) -> S(j), T(n-1) for S -> B and
P -> S, 2T(n-1) for P -> B, and a prohibitive cost to *make* a P.  Ties go to
the earlier candidate.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from pyflow.framework.sbp import SbpParallel
from pyflow.kernels.layout import normalize_axes

__all__ = ["Signature", "candidates", "choose_signature", "transfer_cost"]

S = lambda d: SbpParallel("split", d)  # noqa: E731 - the seeds' notation
B = SbpParallel("broadcast")
P = SbpParallel("partial_sum")

ELEMENTWISE = {"neg", "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "sin", "cos", "floor", "ceil", "round",
               "sign", "isnan", "isinf", "logical_not", "bitwise_not", "add", "sub", "mul", "div", "max", "min", "pow",
               "eq", "ne", "lt", "le", "gt", "ge", "floor_divide", "remainder", "bitwise_and", "bitwise_or",
               "bitwise_xor", "logical_and", "logical_or", "logical_xor", "where", "cast", "contiguous", "clamp"}
REDUCTIONS = {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "argmax", "argmin"}
_PARTIAL_RULES = {  # which inputs may be P (the rest B): linear ops
    "add": [(P, P)], "sub": [(P, P)], "mul": [(P, B), (B, P)], "div": [(P, B)], "neg": [(P,)],
    "contiguous": [(P,)], "cast": [(P,)],   # a copy of a partial sum is one (autograd clones gradients)
}
PROHIBITIVE = 1e18


@dataclasses.dataclass(frozen=True)
class Signature:
    """One SBP per input (None for a Python scalar) and one per output, on one hierarchy axis
    (or, for an N-D hierarchy, a tuple of those per input and output)."""

    inputs: tuple
    outputs: tuple

    def __str__(self) -> str:
        def text(s):
            if s is None:
                return "-"
            if isinstance(s, SbpParallel):
                return s.short()
            return s[0].short() if len(s) == 1 else "(" + ", ".join(x.short() for x in s) + ")"
        outs = ", ".join(text(s) for s in self.outputs)
        return f"({', '.join(text(s) for s in self.inputs)}) -> {outs if len(self.outputs) == 1 else f'({outs})'}"


def _elementwise(name, shapes, out_shapes) -> list:
    (out,) = out_shapes
    found = []
    for d in range(len(out)):
        ins = []
        for shape in shapes:
            if shape is None:
                ins.append(None)
                continue
            k = d - (len(out) - len(shape))  # the input's own dim aligned with output dim d
            ins.append(S(k) if k >= 0 and shape[k] == out[d] and out[d] != 1 else B)
        if any(s is not None and s.is_split for s in ins):
            found.append(Signature(tuple(ins), (S(d),)))
    for rule in _PARTIAL_RULES.get(name, []):  # a Python scalar is the same on every rank: a B
        if len(rule) == len(shapes) and all(s is not None or r.is_broadcast for s, r in zip(shapes, rule)):
            found.append(Signature(tuple(None if s is None else r for s, r in zip(shapes, rule)), (P,)))
    return found


def _matmul(shapes, out_shapes) -> list:
    a, b = shapes
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return []
    if len(a) == 2 and len(b) == 2:
        return [Signature((S(0), B), (S(0),)), Signature((B, S(1)), (S(1),)), Signature((S(1), S(0)), (P,)),
                Signature((P, B), (P,)), Signature((B, P), (P,))]
    (out,) = out_shapes
    found = []
    for d in range(len(out) - 2):  # batch dims split alike on both
        ka, kb = d - (len(out) - len(a)), d - (len(out) - len(b))
        sa = S(ka) if ka >= 0 and a[ka] == out[d] and out[d] != 1 else B
        sb = S(kb) if kb >= 0 and b[kb] == out[d] and out[d] != 1 else B
        if sa.is_split or sb.is_split:
            found.append(Signature((sa, sb), (S(d),)))
    return found


def _reduction(name, shape, attrs) -> list:
    axes = normalize_axes(attrs.get("axis"), len(shape), name)
    axes = tuple(range(len(shape))) if axes is None else tuple(axes)
    keep = attrs.get("keepdims", False)
    found = []
    for d in range(len(shape)):
        if d in axes:
            if name == "reduce_sum":
                found.append(Signature((S(d),), (P,)))
        else:
            out_d = d if keep else d - sum(1 for a in axes if a < d)
            found.append(Signature((S(d),), (S(out_d),)))
    if name in ("reduce_sum", "reduce_mean"):
        found.append(Signature((P,), (P,)))
    return found


def _softmax(shape, attrs) -> list:
    axis = attrs.get("axis", -1) % max(len(shape), 1)
    return [Signature((S(d),), (S(d),)) for d in range(len(shape)) if d != axis]


def candidates(name: str, shapes: list, out_shapes: list, attrs: dict) -> list:
    """The 1-D signatures of op ``name`` (``shapes``: the inputs' logical shapes, None for scalars).

    The all-B signature comes last: the others are tried first at equal cost.
    """
    if name in ELEMENTWISE and len(out_shapes) == 1:
        found = _elementwise(name, shapes, out_shapes)
    elif name == "matmul":
        found = _matmul(shapes, out_shapes)
    elif name in REDUCTIONS and shapes[0] is not None:
        found = _reduction(name, shapes[0], attrs)
    elif name in ("softmax", "log_softmax"):
        found = _softmax(shapes[0], attrs)
    else:
        found = []
    all_b = Signature(tuple(None if s is None else B for s in shapes), tuple(B for _ in out_shapes))
    return found + [all_b]


def transfer_cost(src: SbpParallel, dst: SbpParallel, nbytes: int, n: int) -> float:
    """What moving one input from ``src`` to ``dst`` on an axis of ``n`` ranks costs (SEMANTICS §4)."""
    if src == dst or n == 1:
        return 0.0
    if dst.is_partial:
        return PROHIBITIVE
    if src.is_broadcast:
        return 1.0
    if src.is_split and dst.is_split:
        return nbytes * (n - 1) / n
    if src.is_partial and dst.is_broadcast:
        return 2.0 * nbytes * (n - 1)
    return float(nbytes * (n - 1))  # S -> B, P -> S


def _splits_fit(sig: Signature, shapes: list, n: int) -> bool:
    return all(s is None or not s.is_split or shape[s.dim] >= n for s, shape in zip(sig.inputs, shapes))


def choose_signature(name: str, shapes: list, dtypes: list, out_shapes: list, attrs: dict, current: list,
                     hierarchy: tuple) -> Signature:
    """The cheapest N-D signature for inputs now laid out as ``current`` (an N-D SBP tuple per input).

    Returns a Signature whose inputs and outputs are N-D SBP tuples (one entry per hierarchy axis).
    """
    one_d = candidates(name, shapes, out_shapes, attrs)
    per_axis = [[sig for sig in one_d if _splits_fit(sig, shapes, n)] for n in hierarchy]
    best, best_cost = None, None
    for combo in itertools.product(*per_axis):
        cost = 0.0
        for a, (sig, n) in enumerate(zip(combo, hierarchy)):
            for s, shape, dtype, now in zip(sig.inputs, shapes, dtypes, current):
                if s is not None:
                    cost += transfer_cost(now[a], s, math.prod(shape) * dtype.itemsize, n)
        if best_cost is None or cost < best_cost:
            best, best_cost = combo, cost
    ins = tuple(None if shapes[i] is None else tuple(sig.inputs[i] for sig in best) for i in range(len(shapes)))
    outs = tuple(tuple(sig.outputs[j] for sig in best) for j in range(len(out_shapes)))
    return Signature(ins, outs)
