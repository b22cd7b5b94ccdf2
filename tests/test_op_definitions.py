"""Every op's definition is complete, and every SBP signature it declares is true.

An ``OpDef`` must say how the op splits (``sbp_signatures``: a rule, or
``BROADCAST_ONLY``) and how it differentiates (``backward``: a rule, or
``NO_BACKWARD``); ``register_op`` refuses one that leaves either out.

A signature is a claim: "run the op on each rank's pieces laid out so, and the
pieces of the result are laid out so".  The property test checks the claim the
way the global interpreter relies on it, on small random inputs with numpy:
lay each input out over n ranks as the signature says (S(d): the balanced
slices of ``pyflow.framework.sbp.piece_slices``; B: the whole; P: random parts
that sum to the whole), run the op eagerly on every rank's pieces, put the
results together as the output SBP says (S: concatenate, P: sum, B: every rank
holds the whole) and compare with the op on the whole inputs.  A wrong
signature fails it: ``test_the_check_catches_a_wrong_signature`` shows it does
for a few (a nonlinear op keeping partial sums, a max of a split dim giving
partial sums, a matmul's partial products called whole...).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.framework.interpreter import apply
from pyflow.framework.op_registry import (BROADCAST_ONLY, NO_BACKWARD, OP_REGISTRY, SETS_LAYOUT, UNDECLARED, OpDef,
                                          TensorMeta, get_op, register_op)
from pyflow.framework.sbp import B, P, S, Signature, piece_slices
from pyflow.framework.views import WHOLE, reshape_attrs
from pyflow.ops.elementwise import BINARY_OPS, COMPARISONS, FLOAT_UNARY, LOGICAL_OPS, UNARY_OPS
from pyflow.ops.reduce import REDUCE_OPS

get_op("add")   # loads every op definition


# --- the registry: every op declares both ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(OP_REGISTRY))
def test_every_op_declares_its_sbp_signatures_and_its_backward(name):
    op = OP_REGISTRY[name]
    assert op.sbp_signatures in (BROADCAST_ONLY, SETS_LAYOUT) or callable(op.sbp_signatures), op.sbp_signatures
    assert op.backward is NO_BACKWARD or callable(op.backward), op.backward


def _same_shape(inputs, attrs):
    return [TensorMeta(inputs[0].shape, inputs[0].dtype)]


@pytest.mark.parametrize("field, value", [("sbp_signatures", UNDECLARED), ("backward", UNDECLARED),
                                          ("sbp_signatures", None), ("backward", None)])
def test_registering_an_op_that_leaves_a_field_undeclared_raises_naming_both(field, value):
    declared = {"sbp_signatures": BROADCAST_ONLY, "backward": NO_BACKWARD, field: value}
    op = OpDef("test_half_defined", _same_shape, kernel="", **declared)
    try:
        with pytest.raises(ValueError, match=f"op 'test_half_defined': {field} is"):
            register_op(op)
    finally:
        OP_REGISTRY.pop("test_half_defined", None)


def test_an_op_declaring_both_registers():
    op = OpDef("test_fully_defined", _same_shape, kernel="", sbp_signatures=BROADCAST_ONLY, backward=NO_BACKWARD)
    try:
        assert register_op(op) is OP_REGISTRY["test_fully_defined"] and not op.differentiable
    finally:
        OP_REGISTRY.pop("test_fully_defined", None)


# --- inputs for each op with SBP rules ---------------------------------------------------------------------
# A case: (inputs, attrs); an input is a numpy array, or a Python float where the op takes a scalar.


def _broadcast_operand(data, out: tuple) -> tuple:
    """A shape that broadcasts to ``out``: a suffix of it, some dims 1."""
    kept = data.draw(st.integers(0, len(out)), label="operand dims")
    return tuple(data.draw(st.sampled_from((1, n)), label="dim") for n in out[len(out) - kept:])


def _values(rng, shape, kind: str) -> np.ndarray:
    return np.asarray(_draw_values(rng, shape, kind))   # (numpy gives a 0-d draw as a numpy scalar)


def _draw_values(rng, shape, kind: str):
    if kind == "float":
        return rng.uniform(-3.0, 3.0, shape)
    if kind == "positive":
        return rng.uniform(0.5, 2.0, shape)
    if kind == "nonzero":   # a divisor
        return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    if kind == "ties":   # small integers as floats: comparisons see equal values
        return rng.integers(-2, 3, shape).astype(np.float64)
    if kind == "int":
        return rng.integers(-8, 9, shape)
    return rng.random(shape) < 0.5   # "bool"


def _scalar(rng, kind: str) -> float:
    return float(_values(rng, (), kind))


# the kinds of each op's operands
_KINDS = {**{name: ("float",) for name in FLOAT_UNARY + ("neg", "abs", "relu", "floor", "ceil", "round", "sign",
                                                          "isnan", "isinf")},
          "logical_not": ("bool",), "bitwise_not": ("int",),
          **{name: ("float", "float") for name in ("add", "sub", "mul", "max", "min")},
          **{name: ("float", "nonzero") for name in ("div", "floor_divide", "remainder")},
          "pow": ("positive", "float"),
          **{name: ("int", "int") for name in ("bitwise_and", "bitwise_or", "bitwise_xor")},
          **{name: ("ties", "ties") for name in COMPARISONS},
          **{name: ("bool", "bool") for name in LOGICAL_OPS}}
assert set(_KINDS) == set(UNARY_OPS + BINARY_OPS + COMPARISONS + LOGICAL_OPS)


def _elementwise_case(data, rng, name):
    kinds = _KINDS[name]
    out = tuple(data.draw(st.lists(st.integers(1, 4), max_size=3), label="shape"))
    if len(kinds) == 1:
        return [_values(rng, out, kinds[0])], {}
    scalar_at = data.draw(st.sampled_from((None, 0, 1)) if kinds[0] == "float" else st.just(None), label="scalar")
    shapes = [out, _broadcast_operand(data, out)]
    if data.draw(st.booleans(), label="swap"):
        shapes.reverse()
    inputs = [_scalar(rng, kind) if k == scalar_at else _values(rng, shape, kind)
              for k, (shape, kind) in enumerate(zip(shapes, kinds))]
    return inputs, {}


def _where_case(data, rng, name):
    out = tuple(data.draw(st.lists(st.integers(1, 4), max_size=3), label="shape"))
    shapes = [out, _broadcast_operand(data, out), _broadcast_operand(data, out)]
    cond, a, b = data.draw(st.permutations(shapes), label="which has the output's shape")
    b = _scalar(rng, "float") if data.draw(st.booleans(), label="scalar b") else _values(rng, b, "float")
    return [_values(rng, cond, "bool"), _values(rng, a, "float"), b], {}


def _clamp_case(data, rng, name):
    shape = tuple(data.draw(st.lists(st.integers(1, 4), max_size=3), label="shape"))
    bounds = data.draw(st.sampled_from((("min",), ("max",), ("min", "max"))), label="bounds")
    inputs = [_values(rng, shape, "float")]
    for kind in bounds:
        low = -1.0 if kind == "min" else 1.0
        inputs.append(low if data.draw(st.booleans(), label="scalar bound") else
                      low + 0.5 * _values(rng, _broadcast_operand(data, shape), "float"))
    return inputs, {"bounds": bounds}


def _one_input_case(kind):
    def case(data, rng, name):
        shape = tuple(data.draw(st.lists(st.integers(1, 4), max_size=3), label="shape"))
        return [_values(rng, shape, kind)], {}
    return case


def _cast_case(data, rng, name):
    shape = tuple(data.draw(st.lists(st.integers(1, 4), max_size=3), label="shape"))
    source = data.draw(st.sampled_from((np.float32, np.float64, np.int64)), label="from")
    # into a floating dtype cast declares (P,) -> P, a copy of a partial sum; into an integer one it must
    # not (int(0.6) + int(0.6) != int(1.2)), and the test would catch it if it did
    target = data.draw(st.sampled_from(("float32", "float64", "int64")), label="to")
    x = _values(rng, shape, "int" if source == np.int64 else "float").astype(source)
    return [x], {"dtype": target}


def _matmul_case(data, rng, name):
    m, k, n = (data.draw(st.integers(1, 4), label="m, k, n") for _ in range(3))
    batch = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2), label="batch"))
    a = batch + (m, k) if data.draw(st.booleans(), label="a batched") else (m, k)
    b = _broadcast_operand(data, batch) + (k, n)
    if data.draw(st.integers(0, 4), label="a vector") == 0:
        a = (k,)
    return [_values(rng, a, "float"), _values(rng, b, "float")], {}


def _reduction_case(data, rng, name):
    shape = tuple(data.draw(st.lists(st.integers(1, 4), max_size=3), label="shape"))
    ndim = len(shape)
    if name in ("argmax", "argmin"):
        axis = data.draw(st.none() | st.integers(-ndim, ndim - 1) if ndim else st.none(), label="axis")
    else:
        axis = data.draw(st.none() | st.integers(-ndim, ndim - 1) | st.lists(st.integers(0, ndim - 1), unique=True)
                         .map(tuple) if ndim else st.none(), label="axis")
    return [_values(rng, shape, "float")], {"axis": axis, "keepdims": data.draw(st.booleans(), label="keepdims")}


def _softmax_case(data, rng, name):
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3), label="shape"))
    return [_values(rng, shape, "float")], {"axis": data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")}


def _view_case(data, rng, name):
    """A view op's normalized attrs, as the Tensor methods give them (``pyflow/framework/views.py``)."""
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3), label="shape"))
    ndim = len(shape)
    if name == "permute":
        attrs = {"dims": tuple(data.draw(st.permutations(range(ndim)), label="dims"))}
    elif name == "narrow":
        d = data.draw(st.integers(0, ndim - 1), label="dim")
        start = data.draw(st.integers(0, shape[d]), label="start")
        attrs = {"dim": d, "start": start, "length": data.draw(st.integers(0, shape[d] - start), label="length")}
    elif name == "squeeze":
        shape = tuple(data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=4), label="shape"))
        attrs = {"dims": tuple(d for d, n in enumerate(shape) if n == 1 and data.draw(st.booleans(), label="drop"))}
    elif name == "unsqueeze":
        attrs = {"dim": data.draw(st.integers(0, ndim), label="dim")}
    else:   # expand: new leading dims, size-1 dims stretched, the others kept (-1)
        lead = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2), label="lead"))
        shape = tuple(n if n > 1 or not data.draw(st.booleans(), label="stretch") else 1 for n in shape)
        attrs = {"sizes": lead + tuple(-1 if n > 1 else data.draw(st.integers(1, 3), label="to") for n in shape)}
    return [_values(rng, shape, "float")], attrs


def _reshape_case(data, rng, name):
    """``view`` as ``x.reshape`` gives it: adjacent dims merged (or, swapped, one dim cut into several),
    maybe a size-1 dim put in; attrs from ``reshape_attrs``, kept dims -1."""
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4), label="shape"))
    cuts = sorted(data.draw(st.sets(st.integers(1, len(shape) - 1)), label="cuts")) if len(shape) > 1 else []
    bounds = [0, *cuts, len(shape)]
    merged = [int(np.prod(shape[a:b])) for a, b in zip(bounds, bounds[1:])]
    if data.draw(st.booleans(), label="a size-1 dim"):
        merged.insert(data.draw(st.integers(0, len(merged)), label="at"), 1)
    shape, new_shape = (tuple(merged), shape) if data.draw(st.booleans(), label="swap") else (shape, tuple(merged))
    return [_values(rng, shape, "float")], reshape_attrs(shape, new_shape)


def _index_case(data, rng, name):
    """``dim_gather`` (x, index) or ``scatter_add`` (target, index, source): an index no longer than the
    input in the other dims (sometimes shorter: a split there does not carry over)."""
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3), label="shape"))
    axis = data.draw(st.integers(0, len(shape) - 1), label="axis")
    index_shape = tuple(data.draw(st.integers(1, 4), label="along the axis") if d == axis else
                        n if data.draw(st.booleans(), label="as long") else data.draw(st.integers(1, n), label="size")
                        for d, n in enumerate(shape))
    index = rng.integers(0, shape[axis], index_shape)
    if name == "dim_gather":
        return [_values(rng, shape, "float"), index], {"axis": axis}
    return [_values(rng, shape, "float"), index, _values(rng, index_shape, "float")], {"axis": axis}


def _slice_case(data, rng, name):
    """``slice_view``'s index as ``x[...]`` gives it (an int, a (start, stop, step) slice, ``WHOLE``, or a
    new dim per item); ``slice_update``'s (no new dims, an int a length-1 slice) with a value of the region's
    shape."""
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3), label="shape"))
    index = []
    for n in shape:
        kind = data.draw(st.sampled_from(["int", "slice", "whole", "new"] if name == "slice_view" else
                                          ["int", "slice", "whole"]), label="kind")
        if kind == "new":
            index.append(None)
        if kind == "int":
            k = data.draw(st.integers(0, n - 1), label="int")
            index.append(k if name == "slice_view" else (k, k + 1, 1))
        elif kind == "whole":
            index.append(WHOLE)
        elif kind == "slice":
            start, stop = sorted(data.draw(st.lists(st.integers(0, n), min_size=2, max_size=2), label="bounds"))
            index.append((start, stop, data.draw(st.integers(1, 3), label="step")))
    x = _values(rng, shape, "float")
    if name == "slice_view":
        return [x], {"index": tuple(index)}
    region = x[tuple(slice(*item) for item in index)].shape
    return [x, _values(rng, region, "float")], {"index": tuple(index)}


CASES = {**{name: _elementwise_case for name in _KINDS}, "where": _where_case, "clamp": _clamp_case,
         "cast": _cast_case, "contiguous": _one_input_case("float"), "matmul": _matmul_case,
         **{name: _reduction_case for name in REDUCE_OPS}, "softmax": _softmax_case, "log_softmax": _softmax_case,
         **{name: _view_case for name in ("permute", "narrow", "squeeze", "unsqueeze", "expand")},
         "view": _reshape_case, "dim_gather": _index_case, "scatter_add": _index_case,
         "slice_view": _slice_case, "slice_update": _slice_case}


def test_every_op_with_sbp_rules_has_inputs_in_the_property_test():
    with_rules = {name for name, op in OP_REGISTRY.items() if callable(op.sbp_signatures)}
    assert with_rules == set(CASES)


def test_only_to_global_sets_its_own_layout():
    """``SETS_LAYOUT`` is no way out of declaring signatures: only the change of layout itself says it."""
    assert {name for name, op in OP_REGISTRY.items() if op.sbp_signatures is SETS_LAYOUT} == {"to_global"}


# --- the check: pieces in, pieces out, equal to the whole ------------------------------------------------


def _run(name, inputs, attrs) -> list:
    tensors = [flow.tensor(np.array(x, order="C"), device="cpu") if isinstance(x, np.ndarray) else x
               for x in inputs]
    return [out.numpy() for out in apply(name, tensors, **attrs)]


def _lay_out(x, sbp, n: int, rng) -> list:
    """The piece of ``x`` each of ``n`` ranks holds under ``sbp``."""
    if sbp is None or sbp.is_broadcast:   # (None: a Python scalar, the same everywhere)
        return [x] * n
    if sbp.is_split:
        return [x[piece_slices(x.shape, (sbp,), (n,), (r,))] for r in range(n)]
    assert x.dtype.kind in "fi", f"a partial sum of {x.dtype}"
    parts = [(rng.uniform(-1.0, 1.0, x.shape) if x.dtype.kind == "f" else rng.integers(-3, 4, x.shape))
             .astype(x.dtype) for _ in range(n - 1)]
    return parts + [np.asarray(x - sum(parts))]


def _fits(signature, inputs, n: int) -> bool:
    """As the cost model: no candidate whose split dims are shorter than the ranks."""
    return all(s is None or not s.is_split or x.shape[s.dim] >= n for s, x in zip(signature.inputs, inputs))


def check_signature(name, inputs, attrs, signature, n: int, rng) -> None:
    """Running ``name`` piece by piece under ``signature`` on ``n`` ranks gives the op of the whole."""
    whole = _run(name, inputs, attrs)
    per_rank = list(zip(*(_lay_out(x, s, n, rng) for x, s in zip(inputs, signature.inputs))))
    outputs = [_run(name, list(pieces), attrs) for pieces in per_rank]
    for j, (sbp, expected) in enumerate(zip(signature.outputs, whole)):
        mine = [outs[j] for outs in outputs]
        if sbp.is_split:
            got = np.concatenate(mine, axis=sbp.dim)
        elif sbp.is_partial:
            got = sum(mine[1:], mine[0])
        else:
            for piece in mine[1:]:
                np.testing.assert_array_equal(piece, mine[0])
            got = mine[0]
        where = f"{name} {signature} on {n} ranks, attrs {attrs}, output {j}"
        assert got.shape == expected.shape and got.dtype == expected.dtype, where
        if expected.dtype.kind == "f":   # partial sums add in another order: rounding differs
            single = expected.dtype == np.float32 or any(getattr(x, "dtype", None) == np.float32 for x in inputs)
            tol = 1e-5 if single else 1e-9
            np.testing.assert_allclose(got, expected, rtol=tol, atol=tol, equal_nan=True, err_msg=where)
        else:
            np.testing.assert_array_equal(got, expected, err_msg=where)


# A wrong signature fails this test: checked by hand once by declaring relu (P,) -> P and reduce_max
# (S(d),) -> P over a reduced dim (both failed), and kept checked by the test below it.
@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_every_declared_signature_is_true(name, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    inputs, attrs = CASES[name](data, rng, name)
    shapes = [x.shape if isinstance(x, np.ndarray) else None for x in inputs]
    out_shapes = [out.shape for out in _run(name, inputs, attrs)]
    for signature in get_op(name).sbp_signatures(shapes, out_shapes, attrs):
        for n in (2, 3):
            if _fits(signature, inputs, n):
                check_signature(name, inputs, attrs, signature, n, rng)


@pytest.mark.parametrize("name, inputs, attrs, wrong", [
    ("relu", [np.linspace(-1.0, 1.0, 6)], {}, Signature((P,), (P,))),                  # not linear
    ("reduce_max", [np.arange(6.0).reshape(2, 3)], {"axis": 1}, Signature((S(1),), (P,))),   # max is no sum
    ("matmul", [np.ones((4, 3)), np.ones((3, 2))], {}, Signature((S(1), S(0)), (B,))),       # a partial product
    ("mul", [np.arange(4.0), np.arange(4.0)], {}, Signature((P, P), (P,))),                 # a product of sums
    ("softmax", [np.arange(8.0).reshape(2, 4)], {"axis": 1}, Signature((S(1),), (S(1),))),   # its own axis
    ("narrow", [np.arange(8.0).reshape(2, 4)], {"dim": 1, "start": 1, "length": 2},
     Signature((S(1),), (S(1),))),                                                       # a cut split dim
    ("slice_view", [np.arange(8.0).reshape(2, 4)], {"index": (WHOLE, (1, 4, 2))}, Signature((S(1),), (S(1),))),
    ("view", [np.arange(24.0).reshape(4, 6)], reshape_attrs((4, 6), (4, 2, 3)),
     Signature((S(0),), (S(1),))),                                                       # another dim
    ("dim_gather", [np.arange(8.0).reshape(4, 2), np.zeros((4, 2), np.int64)], {"axis": 0},
     Signature((S(0), S(0)), (S(0),))),                                                  # its own axis
])
def test_the_check_catches_a_wrong_signature(name, inputs, attrs, wrong):
    with pytest.raises(AssertionError):
        check_signature(name, inputs, attrs, wrong, 2, np.random.default_rng(0))
