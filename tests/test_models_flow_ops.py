"""The models written with flow ops (issue 30) trace to the programs their cocktailer-op versions did.

NASRNN (``(c + m).sum()``, ``flow.zeros``) and RAE (``flow.cat``, ``flow.tanh`` inside a recursive
function uTask) against twins written here with the cocktailer ops the models used before: the
same statements (uOperators with their device functions, uTask counts, arguments, reads and
writes, in the same control-flow tree), so the same launches, host syncs, barriers and values.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyflow.cocktailer as ck
from pyflow.cocktailer.ir import StmtBlock, UOperator
from pyflow.cocktailer.model_ops import batched_matmul, nasrnn_cell
from pyflow.models import NASRNN, RAE

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
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]


def test_nasrnn_with_flow_ops_is_the_program_of_cocktailer_ops():
    seq, batch, model = 3, 2, NASRNN(3, 5, **TINY)

    def nasrnn(inputs, weight_ih, weight_hh):   # nasrnn.py before issue 30
        def step(t, c, m):
            hh = batched_matmul(m, weight_hh)
            ih = batched_matmul(inputs[t], weight_ih)
            return nasrnn_cell(ih, hh, c)

        c, m = ck.for_loop(seq, step, ck.zeros(batch, 5), ck.zeros(batch, 5))
        return ck.sum_rows(ck.add(c, m).reshape(batch * 5))

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
                children = ck.cat([rae(left[node].item()), rae(right[node].item())])
                return ck.tanh(ck.linear(children, weight, bias))

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
