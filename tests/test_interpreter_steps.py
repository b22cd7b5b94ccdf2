"""The eager interpreter's named steps (``pyflow/framework/interpreter.py``, seed 002).

* **One prologue**: ``infer_logical`` (type promotion, then the op's shape and dtype
  inference) is what the local interpreter, the global one and nn.Graph's tracer
  run first: the same call is rejected with the same text by all three (nn.Graph
  adds the user's line in ``build``).
* **apply, step by step**: ``infer`` -> ``make_outputs`` -> ``build_op_call`` inside
  a PhysicalRun computes what ``apply`` computes (tutorial 03 calls them so);
  ``check_out`` refuses a bad ``out=`` before anything is issued.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyflow as flow
from pyflow import nn
from pyflow.errors import DTypeError, ShapeError
from pyflow.framework import interpreter
from pyflow.framework.op_registry import TensorMeta, get_op


def test_infer_logical_promotes_then_infers() -> None:
    dtypes, metas = interpreter.infer_logical(get_op("add"), [flow.ones(2, 3, dtype=flow.int32), 2.5], {})
    assert dtypes == [np.dtype("float32"), np.dtype("float32")]
    assert metas == [TensorMeta((2, 3), np.dtype("float32"))]


def _message(call) -> str:
    with pytest.raises(ShapeError) as error:
        call()
    return str(error.value)


def test_every_interpreter_rejects_a_bad_call_with_the_same_text() -> None:
    x, y = flow.ones(2, 3), flow.ones(4)
    local = _message(lambda: x + y)
    assert local.endswith("[op 'add', inputs: float32[2, 3] on cpu:0; float32[4] on cpu:0]")
    assert _message(lambda: interpreter.infer_logical(get_op("add"), [x, y], {})) == local
    check = local.split(" [op ")[0]   # the op's own words, before the account of the call

    where, B = flow.placement("cpu", [0]), flow.sbp.broadcast
    global_ = _message(lambda: x.to_global(where, B) + y.to_global(where, B))
    assert global_.startswith(check + " [op 'add', inputs: float32[2, 3] on placement(")

    class Graph(nn.Graph):
        def build(self, a, b):
            return a + b

    traced = _message(lambda: Graph()(x, y))
    assert traced.startswith(check + " [op 'add' in nn.Graph build at test_interpreter_steps.py:")


def test_apply_step_by_step_computes_what_apply_computes() -> None:
    x, y = flow.tensor([[1.0, -2.0], [3.0, -4.0]]), flow.tensor([10.0, 20.0])
    op = get_op("add")
    inferred = interpreter.infer(op, [x, y], {})
    outputs = interpreter.make_outputs(inferred)
    flow.vm.run(lambda builder: interpreter.build_op_call(builder, [x, y], outputs, inferred, {}))
    np.testing.assert_array_equal(outputs[0].numpy(), (x + y).numpy())


def test_check_out_refuses_before_anything_is_issued() -> None:
    x = flow.tensor([1, 2])
    inferred = interpreter.infer(get_op("add"), [x, 0.5], {})
    with pytest.raises(DTypeError, match="can't be cast to the output"):
        interpreter.check_out([x], inferred)
    assert x._version == 0
