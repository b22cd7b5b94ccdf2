"""A plain script is a world of one rank, as in OneFlow: global tensors on ``placement(..., [0])`` work without
``flow.distributed.run`` (they raised ``AttributeError: 'NoneType' object has no attribute 'next_seq'``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.distributed import SoloTransport
from pyflow.distributed.transport import CollectiveDesc
from pyflow.errors import DeviceError, DistributedError

S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(1, 4), cols=st.integers(1, 3), src=st.sampled_from(["S0", "S1", "B", "P"]),
       dst=st.sampled_from(["S0", "S1", "B", "P"]))
def test_global_tensors_box_and_compute_in_a_plain_script(rows, cols, src, dst):
    sbps = {"S0": S(0), "S1": S(1), "B": B, "P": P}
    a = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    where = flow.placement("cpu", [0])
    x = flow.tensor(a, placement=where, sbp=sbps[src])
    y = x.to_global(where, sbps[dst])
    assert y.sbp == (sbps[dst],) and y.placement == where
    np.testing.assert_array_equal(y.numpy(), a)
    np.testing.assert_array_equal((y * 2 + 1).sum(dim=0).numpy(), (a * 2 + 1).sum(axis=0))
    np.testing.assert_array_equal(flow.zeros(rows).to_global(where, B).numpy(), np.zeros(rows))


def test_a_placement_or_a_collective_beyond_rank_0_is_a_clear_error():
    with pytest.raises(DeviceError, match="outside the world of 1"):
        flow.ones(2, placement=flow.placement("cpu", [0, 1]), sbp=B)
    with pytest.raises(DistributedError, match="world of one"):
        SoloTransport().exchange((0, 1), 0, CollectiveDesc("all_reduce", (2,), "float32"), np.zeros(2))


def test_the_solo_transport_hands_out_copies_and_delivers_to_itself():
    t = SoloTransport()
    payload = np.arange(3.0)
    (got,) = t.exchange((0,), t.next_seq((0,)), CollectiveDesc("exchange"), payload)
    got[0] = 99.0
    assert payload[0] == 0.0
    t.send(np.ones(2), 0, tag=7)
    np.testing.assert_array_equal(t.recv(0, 7), np.ones(2))
    with pytest.raises(DistributedError, match="no one else"):
        t.recv(1, 8)


def test_an_nn_graph_on_global_tensors_runs_in_a_plain_script():
    where = flow.placement("cpu", [0])
    linear = flow.nn.Linear(3, 2)
    linear.to_global(where, B)

    class Forward(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.linear = linear

        def build(self, x):
            return self.linear(x).relu()

    x = flow.tensor(np.ones((4, 3), np.float32), placement=where, sbp=S(0))
    want = linear(x).relu().numpy()
    np.testing.assert_allclose(Forward()(x).numpy(), want, rtol=1e-6)
