"""What a compiled training step pays per act beyond its kernels, in counts and identities (issue 31; never times).

* A view task whose input is the same tensor at every call (a planned regst's memory, a variable: a weight's
  transpose) gives the view it made at its first act again: no Tensor, no EagerBlobObject per act, and the
  kernels' arrays of that blob are made once (``view_acts._reusing_views``).  A view of a call's input is made
  per call (the caller's tensors are not kept), and a view that had to copy is copied again.  Values stay
  eager's, bit for bit, while the parameters change in place under the kept views.
* With the timeline on (``nn.Graph``'s default), recording an act keeps a tuple: no ``ActRecord`` (a frozen
  dataclass) is made per act; ``timeline()`` makes them, with the same fields.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import nn
from pyflow.runtime.act import make_act
from pyflow.runtime.call import CallContext
from pyflow.runtime.timeline import ActRecord
from tests.helpers_training import assert_trains_like_eager


class _Train(nn.Graph):
    def __init__(self, model, opt, loss_fn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        return loss


def _mlp(widths: list, seed: int):
    flow.manual_seed(seed)
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    return model, flow.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), nn.CrossEntropyLoss()


def _view_tasks(plan, root_mem: str) -> list:
    """The view tasks of ``plan`` whose input regst is (an alias of) a regst of kind ``root_mem``."""
    found = []
    for task in plan.tasks.values():
        if task.op_type != "view":
            continue
        regst = plan.regsts[task.consumed["in_0"][0]]
        while regst.mem == "alias" and regst.alias_of is not None:
            regst = plan.regsts[regst.alias_of]
        if regst.mem == root_mem:
            found.append(task)
    return found


def test_a_view_of_a_variable_is_made_once_and_a_view_of_a_call_input_per_call():
    model, opt, loss_fn = _mlp([6, 8, 3], 0)
    g = _Train(model, opt, loss_fn)
    x, y = flow.ones(4, 6), flow.tensor(np.array([0, 1, 2, 0], np.int64))
    g(x, y).numpy()
    plan = g.plan
    (weight_view, *_) = _view_tasks(plan, "variable")   # a Linear's weight.T
    act = make_act(plan, weight_view)
    call = CallContext([], {})
    weight = model[0].weight
    first = act({"in_0": weight}, [None], 0, call)[0]
    assert act({"in_0": weight}, [None], 0, call)[0] is first   # before: a new Tensor at every act
    np.testing.assert_array_equal(first.numpy(), weight.numpy().T)
    other = flow.ones(*weight.shape)   # another tensor in the slot: its own view
    assert act({"in_0": other}, [None], 0, call)[0] is not first
    # a view of a call's input: no call's input is kept by the act
    call_input = flow.ones(2, 3)

    class Reshape(nn.Graph):
        def build(self, x):
            return x.reshape(3, 2) * 2

    r = Reshape()
    r(call_input).numpy()
    (input_view,) = _view_tasks(r.plan, "input")
    act = make_act(r.plan, input_view)
    assert act({"in_0": call_input}, [None], 0, call)[0] is not act({"in_0": call_input}, [None], 0, call)[0]


@settings(max_examples=6, deadline=None)
@given(widths=st.lists(st.integers(1, 6), min_size=3, max_size=4), seed=st.integers(0, 50),
       executor=st.sampled_from([None, "deterministic"]))
def test_kept_views_see_every_update_of_their_parameters(widths, seed, executor):
    """Three training steps of a random MLP as a Graph (the weights' transposes are kept views, the SGD updates
    write the weights in place under them) equal eager's, bit for bit, loss by loss and weight by weight."""
    rng = np.random.default_rng(seed)
    data = [(flow.tensor(rng.standard_normal((3, widths[0])).astype(np.float32)),
             flow.tensor(rng.integers(0, widths[-1], size=3).astype(np.int64))) for _ in range(3)]
    model, opt, loss_fn = _mlp(widths, seed)
    g = _Train(model, opt, loss_fn)
    g.executor = executor
    eager_model, eager_opt, _ = _mlp(widths, seed)
    assert_trains_like_eager(g, model, eager_model, eager_opt, loss_fn, data)


def test_recording_an_act_makes_no_act_record_until_the_timeline_is_read(monkeypatch):
    model, opt, loss_fn = _mlp([6, 8, 3], 1)
    g = _Train(model, opt, loss_fn)
    x, y = flow.ones(4, 6), flow.tensor(np.array([0, 1, 2, 0], np.int64))
    g(x, y).numpy()
    before = len(g.runtime.timeline())
    made = []
    init = ActRecord.__init__

    def counted(self, *args, **kwargs):
        made.append(1)
        init(self, *args, **kwargs)
    monkeypatch.setattr(ActRecord, "__init__", counted)
    g(x, y).numpy()
    g.runtime.wait_calls()
    assert not made, len(made)   # before: one ActRecord per act
    records = g.runtime.timeline()[before:]
    assert len(records) == len(g.runtime.plan.tasks) and all(isinstance(r, ActRecord) for r in records)
    matmul = next(r for r in records if r.op_name.startswith("matmul"))
    assert matmul.piece == (1, 0) and matmul.start <= matmul.end and matmul.consumed and matmul.produced
    assert any(run.task == "matmul" for run in matmul.device)   # when its kernel ran, as before
