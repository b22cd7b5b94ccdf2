"""Cocktailer traces flow ops (issue 30): ``flow.relu(x)``, ``x + y``, ``x.sum(-1)`` inside ``ck.trace``.

A program written with flow ops is lowered through each op's uTask lowering
(``OpDef.utask_lowering``, ``pyflow/cocktailer/lowerings.py``) into the very program its twin
builds by calling the uOperator builders of ``ops.py`` directly (what the ``cocktailer`` ops,
Cocktailer's own op language before issue 30, were): the same uOperators (names, device
functions, uTask counts, arguments), so the same listing, the same launches / syncs /
barriers, the same values.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
import pyflow.cocktailer as ck
import pyflow.nn.functional as F
from pyflow.cocktailer.ir import UOperator
from pyflow.cocktailer import conv_ops, ops
from pyflow.cocktailer.model_ops import batched_matmul, scaled_softmax_rows
from pyflow.errors import ShapeError
from pyflow.framework.op_registry import get_op

pytestmark = pytest.mark.sim_tier("threads")

# one step of a random program: (flow op, its uOperator builder); operands are the two latest values
UNARY = {"tanh": (flow.tanh, functools.partial(ops.unary, "tanh")),
         "sigmoid": (flow.sigmoid, functools.partial(ops.unary, "sigmoid")),
         "relu": (flow.relu, functools.partial(ops.unary, "relu")),
         "neg": (lambda x: -x, functools.partial(ops.unary, "neg"))}
BINARY = {"add": (lambda a, b: a + b, functools.partial(ops.binary, "add")),
          "sub": (lambda a, b: a - b, functools.partial(ops.binary, "sub")),
          "mul": (lambda a, b: a * b, functools.partial(ops.binary, "mul")),
          "maximum": (flow.maximum, functools.partial(ops.binary, "maximum")),
          "matmul": (lambda a, b: a @ b, ops.matmul),
          "row": (lambda a, b: a + b[0], lambda a, b: ops.binary("add", a, b[0]))}
FINAL = {"sum": (lambda x: x.sum(-1), ops.sum_rows), "amax": (lambda x: flow.amax(x, -1), ops.max_rows),
         "softmax": (lambda x: flow.softmax(x, -1), ops.softmax_rows), "none": (lambda x: x, lambda x: x)}


def program_of(steps, final, which):
    """The random program, written with flow ops (``which`` 0) or with the builders (1)."""
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
def test_flow_ops_trace_to_the_program_of_their_builders(steps, final, rows, seed):
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


def test_flow_ops_with_control_flow_give_the_program_of_their_builders():
    def with_flow(h0, xs, w):
        def step(t, h):
            return flow.tanh(h @ w + xs[t])
        h = ck.for_loop(xs.shape[0], step, h0)
        return ck.cond(h.sum().item() > 0, lambda: flow.relu(h), lambda: -h)

    def with_ck(h0, xs, w):
        def step(t, h):
            return ops.unary("tanh", ops.binary("add", ops.matmul(h, w), xs[t]))
        h = ck.for_loop(xs.shape[0], step, h0)
        return ck.cond(ops.sum_rows(h.reshape(h.ref.size)).item() > 0, lambda: ops.unary("relu", h),
                       lambda: ops.unary("neg", h))

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


def test_clone_is_a_copy_uoperator_that_a_program_may_update():
    """``x.clone()`` (the ``contiguous`` op) is a value of its own: an input's clone may be updated in place."""
    def fn(x, v):
        return ck.update(x.clone(), 1, v)

    program = ck.trace(fn, ck.spec(3, 4), ck.spec(4), chunk=4, tile=4)
    # the clone, update's row write, the output's copy
    assert [op[1] for op in operators(program)] == ["identity_map", "copy_utask", "copy_utask"]
    x, v = np.arange(12, dtype=np.float32).reshape(3, 4), np.full(4, -1, np.float32)
    expected = x.copy()
    expected[1] = v
    for mode in ("host", "compiled"):
        np.testing.assert_array_equal(ck.compile(program, mode=mode, threads=4)(x, v), expected)
    with pytest.raises(ck.TraceError, match=r"update: program inputs are read-only; update a copy \(x.clone\(\)\)"):
        ck.trace(lambda x, v: ck.update(x, 1, v), ck.spec(3, 4), ck.spec(4))


def test_cocktailers_own_op_language_is_gone():
    """Programs are written with flow ops; Cocktailer keeps only what no flow op says (issue 30)."""
    for name in ("linear", "tanh", "sigmoid", "relu", "exp", "add", "sub", "mul", "maximum", "sum_rows",
                 "softmax_rows", "cat", "zeros", "copy", "matmul", "max_rows", "neg"):
        assert not hasattr(ck, name), name
    assert {"trace", "spec", "for_loop", "while_loop", "cond", "function", "lstm_cell", "update"} <= set(ck.__all__)


def test_an_op_without_a_lowering_is_an_error_naming_it():
    assert get_op("cumsum").utask_lowering is None
    with pytest.raises(ck.TraceError, match="op 'cumsum' has no uTask lowering: it cannot run inside a persistent"):
        ck.trace(lambda x: flow.cumsum(x, 0), ck.spec(2, 4))


def test_what_a_lowering_cannot_do_is_refused_and_inference_errors_stay_flows():
    cases = [(lambda x: flow.softmax(x, 0), "op 'softmax': over dim 0"),
             (lambda x: x.unsqueeze(0).permute(2, 0, 1), "op 'permute': its result over \\[1, 2, 4\\] is not contiguous"),
             (lambda x: x.T, "op 'output': reads a transpose \\(w.T\\), which no buffer holds"),
             (lambda x: flow.relu(x.T), "op 'relu': reads a transpose"),
             (lambda x: (x * 2.0).sum(-1), "op 'reduce_sum': reads x \\* a Python number"),
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


def same_programs(fn_flow, fn_ck, args) -> None:
    """Traced with flow ops and with the builders: the same uOperators, the same values and stats."""
    programs = [ck.trace(fn, *args, chunk=4, tile=4, name="p") for fn in (fn_flow, fn_ck)]
    assert programs[0].listing() == programs[1].listing()
    assert operators(programs[0]) == operators(programs[1])
    runs = []
    for program in programs:
        compiled = ck.compile(program, mode="compiled", threads=4, blocks=2)
        runs.append((compiled(*args), compiled.last_stats))
    for got, want in zip(*(r[0] if isinstance(r[0], tuple) else (r[0],) for r in runs)):
        np.testing.assert_array_equal(got, want)
    assert runs[0][1] == runs[1][1]


@settings(max_examples=8, deadline=None)
@given(lead=st.sampled_from([(), (3,), (2, 2)]), k=st.integers(1, 5), n=st.integers(1, 5), bias=st.booleans(),
       spelling=st.sampled_from(["F.linear", "x @ w.T + b", "b + x @ w.t()"]), seed=st.integers(0, 2**16))
def test_linear_is_the_one_linear_uoperator(lead, k, n, bias, spelling, seed):
    """``F.linear`` is ``x.matmul(w.T) + b``: three flow ops, lowered to ONE linear uOperator (``ops.linear``)."""
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(lead + (k,)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)]
    args += [rng.standard_normal(n).astype(np.float32)] if bias else []
    flow_fn = {"F.linear": lambda x, w, b=None: F.linear(x, w, b), "x @ w.T + b": lambda x, w, b=None: x @ w.T if b is None else x @ w.T + b,
               "b + x @ w.t()": lambda x, w, b=None: x @ w.t() if b is None else b + x @ w.t()}[spelling]
    same_programs(flow_fn, lambda x, w, b=None: ops.linear(x, w, b), args)


def test_the_product_before_a_fused_bias_is_stale_and_other_adds_do_not_fuse():
    def reuses(x, w, b):
        y = x @ w.T
        return (y + b) + y

    with pytest.raises(ck.TraceError, match="updated in place by its bias add, fused into the matmul"):
        ck.trace(reuses, ck.spec(2, 4), ck.spec(3, 4), ck.spec(3))

    def later(x, w, b):   # the bias add is not the next statement: a linear, then its own add
        y = x @ w.T
        r = flow.relu(x)
        return y + b, r

    program = ck.trace(later, ck.spec(2, 4), ck.spec(3, 4), ck.spec(3), chunk=4, tile=4)
    assert [op[1] for op in operators(program)][:3] == ["linear_t4_float32", "relu_map", "add_zip_rows"]


@settings(max_examples=6, deadline=None)
@given(b=st.integers(1, 2), m=st.integers(1, 3), k=st.integers(1, 4), n=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_broadcast_matmul_and_batched_transpose_are_the_bmm_uoperator(b, m, k, n, seed):
    rng = np.random.default_rng(seed)
    args = (rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((2, k, n)).astype(np.float32),
            rng.standard_normal((b, 2, m, n)).astype(np.float32))
    same_programs(lambda x, w, y: (x @ w) @ y.transpose(-1, -2),
                  lambda x, w, y: batched_matmul(batched_matmul(x, w), y, transpose_b=True), args)


@settings(max_examples=6, deadline=None)
@given(rows=st.integers(1, 3), width=st.integers(1, 6), scale=st.floats(-4, 4), seed=st.integers(0, 2**16))
def test_softmax_of_a_scaled_tensor_is_the_scaled_softmax_uoperator(rows, width, scale, seed):
    x = np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)
    same_programs(lambda x: flow.softmax(scale * x, -1), lambda x: scaled_softmax_rows(x, scale), (x,))


@settings(max_examples=6, deadline=None)
@given(size=st.integers(3, 6), kernel=st.integers(1, 3), stride=st.integers(1, 2), padding=st.integers(0, 1),
       seed=st.integers(0, 2**16))
def test_conv2d_and_pools_are_the_resnet_uoperators(size, kernel, stride, padding, seed):
    rng = np.random.default_rng(seed)
    args = (rng.standard_normal((1, 2, size, size)).astype(np.float32),
            rng.standard_normal((3, 2, kernel, kernel)).astype(np.float32))

    def with_flow(x, w):
        y = F.conv2d(x, w, stride=stride, padding=padding)
        return F.max_pool2d(y, 2, 1, 1), F.avg_pool2d(y, (1, 1))

    def with_ck(x, w):
        y = conv_ops.conv2d(x, w, stride=stride, padding=padding)
        return conv_ops.max_pool2d(y, 2, 1, 1), conv_ops.avg_pool2d(y, 1)

    same_programs(with_flow, with_ck, args)
    with pytest.raises(ck.TraceError, match="op 'conv2d': a bias has no uTask lowering"):
        ck.trace(lambda x, w, b: F.conv2d(x, w, b), *args, ck.spec(3))
    with pytest.raises(ck.TraceError, match="op 'max_pool2d': kernel_size \\(2, 1\\) has no uTask lowering"):
        ck.trace(lambda x: F.max_pool2d(x, (2, 1)), args[0])
