"""SBP signatures (seed 004): the cheapest of an op's signatures for given inputs (the cost model).

An op on global tensors runs piece by piece on every rank, which is right only
for some combinations of input and output SBPs: its **signatures**
(``Signature`` in ``pyflow/framework/sbp.py``).  Every op declares its own, next
to the op (``OpDef.sbp_signatures``, OneFlow's ``GetSbpFn``), or says it has
none but the all-broadcast one (``BROADCAST_ONLY``), which every op has.  The
families:

* elementwise (broadcasting; ``pyflow/ops/elementwise.py``, ``contiguous`` in
  ``copy.py``): the inputs split along the same output dim give an output split
  there (an input broadcast along that dim stays B); linear ops keep partial
  sums: ``add``/``sub`` (P, P) -> P, ``mul`` (P, B) -> P and (B, P) -> P,
  ``div`` (P, B) -> P, ``neg``, ``cast``, ``contiguous`` P -> P;
* ``matmul`` (2-D; ``linalg.py``): (S0, B) -> S0, (B, S1) -> S1, (S1, S0) -> P,
  (P, B) -> P, (B, P) -> P, (B, B) -> B; batched: a batch dim split on both inputs;
* reductions (``reduce.py``): a kept dim's split stays a split; ``sum`` over a
  split dim gives P; ``sum`` and ``mean`` keep P;
* ``softmax``/``log_softmax`` (``reduce.py``): a split along another dim;
* views (``views.py``): a split of a dim the view keeps moves with it, P stays P;
  ``dim_gather``/``scatter_add`` (``movement.py``): a split of a dim besides the axis.

This module keeps only the choice.  On an N-D hierarchy each axis picks its own
1-D signature.  The interpreter keeps the candidates that split no dim shorter
than the ranks along that axis, and takes the cheapest by the cost model
(SEMANTICS §4): per input, with T its logical bytes and n the ranks on the axis,
moving it to the signature's SBP costs 0 if equal, 1 for B -> S, T(n-1)/n for
S(i) -> S(j), T(n-1) for S -> B and P -> S, 2T(n-1) for P -> B, and a
prohibitive cost to *make* a P.  Ties go to the earlier candidate.

>>> [str(sig) for sig in candidates("matmul", [(4, 3), (3, 2)], [(4, 2)], {})]
['(S(0), B) -> S(0)', '(B, S(1)) -> S(1)', '(S(1), S(0)) -> P', '(P, B) -> P', '(B, P) -> P', '(B, B) -> B']
"""

from __future__ import annotations

import itertools
import math

from pyflow.errors import ArgumentTypeError
from pyflow.framework.op_registry import BROADCAST_ONLY, SETS_LAYOUT, get_op
from pyflow.framework.sbp import B, SbpParallel, Signature

__all__ = ["candidates", "choose_signature", "transfer_cost"]

PROHIBITIVE = 1e18


def candidates(name: str, shapes: list, out_shapes: list, attrs: dict) -> list:
    """The 1-D signatures of op ``name`` (``shapes``: the inputs' logical shapes, None for scalars):
    the op's own (``OpDef.sbp_signatures``), then the all-B one, last so the others win at equal cost.
    """
    declared = get_op(name).sbp_signatures
    if declared is SETS_LAYOUT:   # to_global: no signature to choose, its attrs name the output's layout
        raise ArgumentTypeError(f"op {name!r} is itself a change of layout and is not run by interpreter.apply; "
                                "call x.to_global(placement, sbp), which boxes the tensor")
    found = [] if declared is BROADCAST_ONLY else declared(shapes, out_shapes, attrs)
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
