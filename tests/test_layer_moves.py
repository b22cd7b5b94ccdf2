"""What moved so that imports point down the layers (issue 30, tests/test_layers.py) still works for users.

* grad mode's flag is the framework's; ``flow.no_grad()`` (autograd) sets it;
* ``x.data = y`` is framework's (``Module.to()`` uses it), not nn's ``set_data``;
* the registry holds what ``import pyflow`` registered: it imports no op definitions on lookup;
* ``flow.nn.Graph`` is handed to nn by ``pyflow/__init__`` (graph sits above nn);
* the models hand their programs to Cocktailer's PTX check (``pyflow.models.compile_check``);
* ``Tensor.over_blob``: the public way the runtime and nn.Graph make tensors over given memory.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import pyflow as flow
from pyflow.framework import grad_mode
from pyflow.framework.op_registry import OP_REGISTRY, get_op
from pyflow.framework.tensor import Tensor


def test_no_grad_sets_the_framework_flag_per_thread():
    seen = []
    with flow.no_grad():
        assert not grad_mode.is_grad_enabled()
        other = threading.Thread(target=lambda: seen.append(grad_mode.is_grad_enabled()))
        other.start()
        other.join(timeout=30)
        with flow.enable_grad():
            assert grad_mode.is_grad_enabled()
    assert seen == [True] and grad_mode.is_grad_enabled()
    with flow.set_grad_enabled(False):
        assert not flow.is_grad_enabled() and not grad_mode.is_grad_enabled()
    assert flow.autograd.is_grad_enabled is grad_mode.is_grad_enabled


def test_fill_diagonal_asks_the_framework_flag():
    x = flow.zeros(3, 3, requires_grad=True)
    with pytest.raises(flow.errors.AutogradError, match="requires grad"):
        x.fill_diagonal_(1.0)
    with flow.no_grad():
        x.fill_diagonal_(1.0)
    assert grad_mode.requires_grad(x) and x.numpy().trace() == 3.0


def test_setting_data_keeps_the_object_and_its_autograd_state():
    p = flow.nn.Parameter(flow.zeros(2))
    same = p
    p.data = flow.ones(3, dtype=flow.float64)
    assert p is same and p.requires_grad and p.is_leaf and p.dtype == np.float64
    assert p.numpy().tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(flow.errors.ArgumentTypeError):
        p.data = [1.0, 2.0]


def test_module_to_keeps_parameter_objects():
    model = flow.nn.Linear(2, 2)
    before = list(model.parameters())
    model.double()
    assert [id(p) for p in model.parameters()] == [id(p) for p in before]
    assert all(p.dtype == np.float64 and p.requires_grad for p in before)


def test_the_registry_holds_every_op_after_import_pyflow_and_names_them_on_a_miss():
    assert {"relu", "matmul", "adam_update", "neg"} <= set(OP_REGISTRY)
    assert get_op("relu").name == "relu"
    with pytest.raises(KeyError, match="no op 'no_such_op'; registered ops: .*relu"):
        get_op("no_such_op")


def test_nn_graph_is_the_graph_layers_class():
    import pyflow.graph
    import pyflow.nn as nn
    from pyflow.nn import Graph

    assert Graph is nn.Graph is flow.nn.Graph is pyflow.graph.Graph
    assert nn.graph.GraphModule is pyflow.graph.GraphModule


def test_the_models_hand_their_programs_to_cocktailers_check():
    from pyflow.cocktailer import compile_check as cocktailer_check
    from pyflow.models import compile_check as models_check

    own = [label for label, _, _ in cocktailer_check.examples()]
    models = [label for label, _, _ in models_check.examples()]
    assert models == ["nasrnn", "attention", "seq2seq", "blockdrop", "skipnet"]
    assert not set(models) & set(own) and len(own) + len(models) == 15   # test_ptx's "15/15"
    if not flow.is_gpu():
        assert models_check.run(["nasrnn"]) == 2   # the simulator cannot compile PTX: says so


def test_over_blob_shares_memory_but_not_the_version_counter():
    x = flow.arange(6, dtype=flow.float32)
    y = Tensor.over_blob(x._blob, x._handle)
    assert y is not x and y._versions is not x._versions
    y.add_(1)
    assert x.numpy().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0] and x._version == 0 and y._version == 1
