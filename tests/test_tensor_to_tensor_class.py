"""``x.to(flow.Tensor)`` is ``x`` (issue 35).

OneFlow's graphs hand out proxies of their modules and parameters; ``proxy.to(flow.Tensor)`` is the
eager tensor behind one (``Proxy.to`` in python/oneflow/nn/graph/proxy.py), and OneFlow's graph tests
read trained weights that way: ``graph.linear.weight.to(flow.Tensor).numpy()``.  pyflow's graph members
are the tensors themselves, so the class asks for no change (it raised ``DTypeError ... object``).
"""

from __future__ import annotations

import numpy as np
import pytest

import pyflow as flow
from pyflow.errors import DTypeError


@pytest.mark.parametrize("dtype", [flow.float32, flow.int64, flow.bool])
def test_to_the_tensor_class_is_the_tensor_itself(dtype):
    x = flow.ones(2, 3, dtype=dtype)
    assert x.to(flow.Tensor) is x
    copied = x.to(flow.Tensor, copy=True)
    assert copied is not x and np.array_equal(copied.numpy(), x.numpy())
    assert x.to(flow.Tensor, flow.float64).dtype == flow.float64   # with a dtype too: that dtype


def test_oneflows_graph_test_idiom_reads_the_trained_weight():
    """OneFlow's ``test_graph_linear_train``: the weight read after a graph call is the updated one."""
    flow.manual_seed(0)
    linear = flow.nn.Linear(3, 2)
    sgd = flow.optim.SGD(linear.parameters(), lr=0.1)

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.linear = linear
            self.add_optimizer(sgd)

        def build(self, x):
            loss = self.linear(x).sum()
            loss.backward()
            return loss

    g = Train()
    before = linear.weight.numpy()
    g(flow.ones(4, 3))
    after = g.linear.weight.to(flow.Tensor).numpy()
    np.testing.assert_allclose(after, before - 0.1 * 4.0, rtol=1e-6)   # d(sum)/dw = 4 per entry


def test_another_class_is_still_refused():
    with pytest.raises(DTypeError):
        flow.ones(2).to(flow.nn.Parameter)
