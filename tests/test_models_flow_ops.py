"""The models written with flow ops (issue 30) trace to the programs their cocktailer-op versions did.

NASRNN (``(c + m).sum()``, ``flow.zeros``) and RAE (``flow.cat``, ``flow.tanh`` inside a recursive
function uTask) against twins written here as the models were before, with Cocktailer's own op
language, spelled now as the uOperator builders (``ops.py``) those ops were: the same statements
(uOperators with their device functions, uTask counts, arguments, reads and writes, in the same
control-flow tree), so the same launches, host syncs, barriers and values.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyflow.cocktailer as ck
from pyflow.cocktailer import ops
from pyflow.cocktailer.ir import StmtBlock, UOperator
from pyflow.cocktailer.model_ops import batched_matmul, nasrnn_cell, scaled_softmax_rows
from pyflow.models import NASRNN, RAE, Attention, StackedLSTM

pytestmark = pytest.mark.sim_tier("threads")
TINY = {"threads": 4, "chunk": 4, "tile": 4}


def statements(block: StmtBlock, out: list) -> list:
    """The statement tree, flattened: each UOperator with all it says, each other statement by kind."""
    for item in block.items:
        if isinstance(item, UOperator):
            out.append((item.name, item.fn_name, item.count, repr(item.args), repr(item.reads), repr(item.writes)))
        else:
            out.append(type(item).__name__)
            for value in vars(item).values():
                if isinstance(value, StmtBlock):
                    statements(value, out)
    return out


def same_program(a, b) -> None:
    assert a.listing() == b.listing()
    assert statements(a.body, []) == statements(b.body, [])
    assert [statements(f.body, []) for f in a.functions] == [statements(f.body, []) for f in b.functions]
    assert [(x.name, x.size) for x in a.buffers] == [(x.name, x.size) for x in b.buffers]


def same_run(a, b, args) -> None:
    runs = []
    for program in (a, b):
        compiled = ck.compile(program, mode="compiled", threads=4, blocks=2)
        runs.append((compiled(*args), compiled.last_stats))
    for got, want in zip(*(r[0] if isinstance(r[0], tuple) else (r[0],) for r in runs)):
        np.testing.assert_array_equal(got, want)
    assert runs[0][1] == runs[1][1]


def test_nasrnn_with_flow_ops_is_the_program_of_cocktailer_ops():
    seq, batch, model = 3, 2, NASRNN(3, 5, **TINY)

    def nasrnn(inputs, weight_ih, weight_hh):   # nasrnn.py before issue 30
        def step(t, c, m):
            hh = batched_matmul(m, weight_hh)
            ih = batched_matmul(inputs[t], weight_ih)
            return nasrnn_cell(ih, hh, c)

        c, m = ck.for_loop(seq, step, ops.zeros(batch, 5), ops.zeros(batch, 5))
        return ops.sum_rows(ops.binary("add", c, m).reshape(batch * 5))

    twin = ck.trace(nasrnn, ck.spec(seq, batch, 3), *(ck.spec(s) for s in model.parameter_shapes().values()),
                    chunk=4, tile=4, name=f"nasrnn_s{seq}_b{batch}")
    program = model.program(seq, batch)
    same_program(program, twin)
    x = np.random.default_rng(0).standard_normal((seq, batch, 3)).astype(np.float32)
    same_run(program, twin, (x, model.weight_ih, model.weight_hh))


def test_rae_with_flow_ops_is_the_program_of_cocktailer_ops():
    dim, nodes, model = 4, 3, RAE(4, **TINY)

    def rae_program(left, right, is_leaf, inp, weight, bias, root):   # rae.py before issue 30
        @ck.function(returns=ck.spec(dim))
        def rae(node):
            def inner():
                children = ops.cat([rae(left[node].item()), rae(right[node].item())])
                return ops.unary("tanh", ops.linear(children, weight, bias))

            return ck.cond(is_leaf[node].item(), lambda: inp[node], inner)

        return rae(root.item())

    index = ck.spec(nodes, dtype="int64")
    twin = ck.trace(rae_program, index, index, index, ck.spec(nodes, dim), ck.spec(dim, 2 * dim), ck.spec(dim),
                    ck.spec(1, dtype="int64"), chunk=4, tile=4, name=f"rae_d{dim}_n{nodes}")
    program = model.program(nodes)
    same_program(program, twin)
    tree = (np.array([1, 0, 0]), np.array([2, 0, 0]), np.array([0, 1, 1]))   # node 0 joins leaves 1 and 2
    inp = np.random.default_rng(1).standard_normal((nodes, dim)).astype(np.float32)
    same_run(program, twin, (*tree, inp, model.weight, model.bias, np.array([0])))


def test_attention_with_flow_ops_is_the_program_of_cocktailer_ops():
    """``x @ w`` broadcast over the batch, ``k @ q.transpose(-1, -2)``, ``softmax(s * scale, -1)``."""
    batch, seq_len, model = 2, 4, Attention(2, 4, 2, **TINY)
    nh, d, start, scale = 2, 4, 2, model.scale

    def attention(x, k, v, weight_q, weight_k, weight_v, weight_o):   # attention.py before issue 30
        def step(i, x, k, v):
            gen_id = i + start
            q = batched_matmul(x, weight_q)
            k = batched_matmul(x, weight_k, into=k, at=gen_id)
            v = batched_matmul(x, weight_v, into=v, at=gen_id)
            scores = batched_matmul(k, q, transpose_b=True)
            attn = scaled_softmax_rows(scores.reshape(batch, nh, 1, seq_len), scale)
            x = batched_matmul(batched_matmul(attn, v), weight_o, into=x)
            return x, k, v

        x, k, v = ck.for_loop(seq_len - start, step, x, k, v)
        return k, v, x

    token, cache, weight = ck.spec(batch, nh, 1, d), ck.spec(batch, nh, seq_len, d), ck.spec(nh, d, d)
    twin = ck.trace(attention, token, cache, cache, weight, weight, weight, weight, chunk=4, tile=4,
                    name=f"attention_b{batch}_s{seq_len}")
    program = model.program(batch, seq_len)
    same_program(program, twin)
    rng = np.random.default_rng(2)
    x, kv = rng.standard_normal((batch, nh, 1, d)), rng.standard_normal((batch, nh, seq_len, d))
    same_run(program, twin, [a.astype(np.float32) for a in (x, kv, kv)] + list(model.weights))


def test_lstm_with_flow_linear_is_the_program_of_cocktailer_ops():
    """``F.linear(x, w, b)`` (``x.matmul(w.T) + b``) is one linear uOperator, in a loop, twice a layer."""
    seq, batch, model = 2, 2, StackedLSTM(3, 4, 2, **TINY)

    def lstm(x, h0, c0, w_ih_first, w_ih_rest, w_hh, b_ih, b_hh):   # lstm.py before issue 30
        def step(t, h, c, out):
            layer_in = x[t]
            for k in range(2):
                gh = ops.linear(h[k], w_hh[k], b_hh[k])
                gx = ops.linear(layer_in, w_ih_first if k == 0 else w_ih_rest[k - 1], b_ih[k])
                h_k, c_k = ck.lstm_cell(gx, gh, c[k])
                h, c = ck.update(h, k, h_k), ck.update(c, k, c_k)
                layer_in = h_k
            return h, c, ck.update(out, t, layer_in)

        h, c, out = ck.for_loop(seq, step, h0, c0, ops.zeros(seq, batch, 4))
        return out, h, c

    specs = [ck.spec(seq, batch, 3), ck.spec(2, batch, 4), ck.spec(2, batch, 4)] + \
        [ck.spec(w.shape) for w in model._weights()]
    twin = ck.trace(lstm, *specs, chunk=4, tile=4, name=f"lstm_l2_s{seq}_b{batch}")
    same_program(model.program(seq, batch), twin)
