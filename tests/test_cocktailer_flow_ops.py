"""Cocktailer traces flow ops (issue 30): ``flow.relu(x)``, ``x + y``, ``x.sum(-1)`` inside ``ck.trace``.

A program written with flow ops is lowered through each op's uTask lowering
(``OpDef.utask_lowering``, ``pyflow/cocktailer/lowerings.py``) into the very program the
``cocktailer`` ops build: the same uOperators (names, device functions, uTask counts,
arguments), so the same listing, the same launches / syncs / barriers, the same values.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
import pyflow.cocktailer as ck
from pyflow.cocktailer.ir import UOperator
from pyflow.errors import ShapeError
from pyflow.framework.op_registry import get_op

pytestmark = pytest.mark.sim_tier("threads")

# one step of a random program: (flow op, cocktailer op); operands are the two latest values
UNARY = {"tanh": (flow.tanh, ck.tanh), "sigmoid": (flow.sigmoid, ck.sigmoid), "relu": (flow.relu, ck.relu),
         "neg": (lambda x: -x, ck.neg)}
BINARY = {"add": (lambda a, b: a + b, ck.add), "sub": (lambda a, b: a - b, ck.sub),
          "mul": (lambda a, b: a * b, ck.mul), "maximum": (flow.maximum, ck.maximum),
          "matmul": (lambda a, b: a @ b, ck.matmul), "row": (lambda a, b: a + b[0], lambda a, b: ck.add(a, b[0]))}
FINAL = {"sum": (lambda x: x.sum(-1), ck.sum_rows), "amax": (lambda x: flow.amax(x, -1), ck.max_rows),
         "softmax": (lambda x: flow.softmax(x, -1), ck.softmax_rows), "none": (lambda x: x, lambda x: x)}


def program_of(steps, final, which):
    """The random program, written with flow ops (``which`` 0) or cocktailer ops (1)."""
    def fn(x, y, w):
        values = [x, y]
        for kind, name in steps:
            table = UNARY if kind == "unary" else BINARY
            op = table[name][which]
            operands = (values[-1],) if kind == "unary" else \
                (values[-1], w if name == "matmul" else values[-2])
            values.append(op(*operands))
        return FINAL[final][which](values[-1])
    return fn


def operators(program) -> list:
    """Every UOperator of the body, as what decides the emitted program."""
    return [(item.name, item.fn_name, item.count, repr(item.args)) for item in program.body.items
            if isinstance(item, UOperator)]


steps = st.lists(st.one_of(st.tuples(st.just("unary"), st.sampled_from(sorted(UNARY))),
                           st.tuples(st.just("binary"), st.sampled_from(sorted(BINARY)))), min_size=1, max_size=5)


@settings(max_examples=8, deadline=None)
@given(steps=steps, final=st.sampled_from(sorted(FINAL)), rows=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_flow_ops_trace_to_the_program_of_cocktailer_ops(steps, final, rows, seed):
    rng = np.random.default_rng(seed)
    args = (rng.standard_normal((rows, 4)).astype(np.float32), rng.standard_normal((rows, 4)).astype(np.float32),
            rng.standard_normal((4, 4)).astype(np.float32) / 2)
    flow_program = ck.trace(program_of(steps, final, 0), *args, chunk=4, tile=4, name="p")
    ck_program = ck.trace(program_of(steps, final, 1), *args, chunk=4, tile=4, name="p")
    assert flow_program.listing() == ck_program.listing()
    assert operators(flow_program) == operators(ck_program)
    runs = []
    for program in (flow_program, ck_program):
        compiled = ck.compile(program, mode="compiled", threads=4, blocks=2)
        runs.append((compiled(*args), compiled.last_stats))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]


def test_flow_ops_with_control_flow_give_the_program_of_cocktailer_ops():
    def with_flow(h0, xs, w):
        def step(t, h):
            return flow.tanh(h @ w + xs[t])
        h = ck.for_loop(xs.shape[0], step, h0)
        return ck.cond(h.sum().item() > 0, lambda: flow.relu(h), lambda: -h)

    def with_ck(h0, xs, w):
        def step(t, h):
            return ck.tanh(ck.add(ck.matmul(h, w), xs[t]))
        h = ck.for_loop(xs.shape[0], step, h0)
        return ck.cond(ck.sum_rows(h.reshape(h.ref.size)).item() > 0, lambda: ck.relu(h), lambda: ck.neg(h))

    rng = np.random.default_rng(0)
    args = (rng.standard_normal((2, 4)).astype(np.float32), rng.standard_normal((3, 2, 4)).astype(np.float32),
            rng.standard_normal((4, 4)).astype(np.float32))
    programs = [ck.trace(fn, *args, chunk=4, tile=4, name="p") for fn in (with_flow, with_ck)]
    assert programs[0].listing() == programs[1].listing()
    values = [ck.compile(p, mode="compiled", threads=4, blocks=2)(*args) for p in programs]
    np.testing.assert_array_equal(values[0], values[1])


def test_zeros_cat_views_and_keepdim_take_the_ops_inference():
    def fn(x):
        z = flow.zeros(2, 4)
        both = flow.cat([x, z])                       # (4, 4)
        top = both.narrow(0, 0, 2).reshape(8)         # views: no uOperator
        return both.sum(-1, keepdim=True), top.unsqueeze(0)

    program = ck.trace(fn, ck.spec(2, 4), chunk=4, tile=4)
    assert [op[0] for op in operators(program)] == ["zeros", "copy", "copy", "sum_rows", "copy", "copy"]
    assert [tuple(o.shape) for o in program.outputs] == [(4, 1), (1, 8)]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    summed, top = ck.compile(program, mode="host", threads=4)(x)
    np.testing.assert_array_equal(summed[:, 0], [6, 22, 0, 0])
    np.testing.assert_array_equal(top, x.reshape(1, 8))


def test_an_op_without_a_lowering_is_an_error_naming_it():
    assert get_op("cumsum").utask_lowering is None
    with pytest.raises(ck.TraceError, match="op 'cumsum' has no uTask lowering: it cannot run inside a persistent"):
        ck.trace(lambda x: flow.cumsum(x, 0), ck.spec(2, 4))


def test_what_a_lowering_cannot_do_is_refused_and_inference_errors_stay_flows():
    cases = [(lambda x: flow.softmax(x, 0), "op 'softmax': over dim 0"),
             (lambda x: x.permute(1, 0), "op 'permute': its result over \\[2, 4\\] is not contiguous"),
             (lambda x: x + 1.0, "op 'add': a Python number as an operand has no uTask lowering"),
             (lambda x: x.add_(x), "op 'add': writing into existing tensors"),
             (lambda x: flow.tensor([1.0]) + x, "is a tensor from outside the program")]
    for fn, message in cases:
        with pytest.raises(ck.TraceError, match=message):
            ck.trace(fn, ck.spec(2, 4))
    with pytest.raises(ShapeError, match="in cocktailer.trace"):   # the op's own inference, at the call
        ck.trace(lambda x: x @ x, ck.spec(2, 4))
    with pytest.raises(ck.TraceError, match="has no value while the program is traced"):
        ck.trace(lambda x: x if x.sum() else x, ck.spec(2, 4))


def test_traced_tensors_are_flow_tensors_and_stay_checked():
    seen = []

    def fn(x):
        seen.append((isinstance(x, flow.Tensor), x.size(), x.ndim))
        return flow.relu(x)

    ck.trace(fn, ck.spec(2, 3))
    assert seen == [(True, (2, 3), 2)]
    kept = []
    ck.trace(lambda x: kept.append(x) or x, ck.spec(2))
    with pytest.raises(ck.TraceError, match="belongs to another trace"):
        ck.trace(lambda y: kept[0] + y, ck.spec(2))
