"""``to_global`` between a 1-D and a 2-D placement inside nn.Graph (issues 33 and 35).

OneFlow's ``TestLazy1dTo2dGlobal`` (python/oneflow/test/graph/test_graph_lazy_1d_to_2d... in
Oneflow-Inc/oneflow) hung on 4 ranks: every rank finished its body, then waited in ``flow.sync()``
for ever.  Two causes, both fixed:

* a graph's global input (here the previous graph's output, written by its output critical section)
  was not read by the call's LaunchLazyJob, so the actors' first read of it put a RecordEvent on the
  critical-section stream, which could be queued behind the call's own output critical section,
  waiting for that very call (``pyflow/graph/graph.py``, ``_run``);
* a graph garbage-collected while its call was in flight closed its runtime on whatever thread the
  collection interrupted (a device worker), waiting for a call that needed that thread
  (``pyflow/runtime/live.py``, ``close_when_collected``).

The values are the eager ones, piece for piece, for every SBP pair of a 1-D placement (of all
ranks, or some) and a 2-D one, either way (hypothesis picks them; all 384 were run once).  A hang timeout of a few seconds turns any hang that is left into a
``RuntimeHangError`` report rather than a stuck test.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow

S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
SBP_1D = [S(0), S(1), B, P]
RANKS_1D, RANKS_2D = [0, 1, 2, 3], [[0, 1], [2, 3]]


@pytest.fixture(autouse=True)
def _short_hang_timeout(monkeypatch):
    monkeypatch.setenv("PYFLOW_HANG_TIMEOUT", "20")


def _lazy_1d_to_2d_body(device):
    """OneFlow's ``test_lazy_1d_to_2d_sbp`` (its placements written with ``ranks=``), three times over."""
    p1, p2 = flow.placement(device, ranks=RANKS_1D), flow.placement(device, ranks=RANKS_2D)

    class To2d(flow.nn.Module):
        def forward(self, x):
            return x.to_global(placement=p2, sbp=[B, B])

    class To1d(flow.nn.Module):
        def forward(self, x):
            return x.to_global(placement=p1, sbp=[B])

    class Wrap(flow.nn.Graph):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def build(self, x):
            return self.model(x)

    for _ in range(3):
        x = flow.zeros(4, 4, 4, 4, sbp=[B, B], placement=p2)
        x = x.to_global(placement=p1, sbp=[B])
        assert x.sbp == (B,) and x.placement == p1
        y = Wrap(To2d())(x)
        assert y.sbp == (B, B) and y.placement == p2
        z = Wrap(To1d())(y)
        assert z.sbp == x.sbp and z.placement == x.placement
    return z.to_local().numpy()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_oneflows_lazy_1d_to_2d_global_finishes_with_the_right_layouts(device):
    for piece in flow.distributed.run(_lazy_1d_to_2d_body, world_size=4, args=(device,)):
        np.testing.assert_array_equal(piece, np.zeros((4, 4, 4, 4), np.float32))


def _graph_vs_eager_body(logical, src, dst):
    """``x.to_global(dst)`` in a graph and eagerly: (logical value of the graph's, pieces equal?, layouts)."""
    src_p, dst_p = flow.placement("cpu", ranks=src[0]), flow.placement("cpu", ranks=dst[0])
    x = flow.tensor(logical, placement=src_p, sbp=src[1])

    class Box(flow.nn.Graph):
        def build(self, x):
            return x.to_global(placement=dst_p, sbp=dst[1])

    y = Box()(x)
    eager = x.to_global(placement=dst_p, sbp=dst[1])
    same = np.array_equal(y.to_local().numpy(), eager.to_local().numpy())
    return y.numpy(), same, (y.placement == dst_p, tuple(y.sbp) == tuple(dst[1]))


@st.composite
def one_d_two_d_pairs(draw):
    one = (draw(st.sampled_from([RANKS_1D, [0, 1], [1, 2, 3], [2]])), [draw(st.sampled_from(SBP_1D))])
    two = (RANKS_2D, [draw(st.sampled_from(SBP_1D)), draw(st.sampled_from(SBP_1D))])
    return (one, two) if draw(st.booleans()) else (two, one)


@settings(max_examples=12, deadline=None)
@given(one_d_two_d_pairs())
def test_to_global_between_1d_and_2d_placements_in_a_graph_gives_the_eager_pieces(pair):
    src, dst = pair
    logical = (np.arange(48, dtype=np.float32).reshape(4, 12) - 20) / 8
    for value, same, layouts in flow.distributed.run(_graph_vs_eager_body, world_size=4,
                                                     args=(logical, src, dst)):
        np.testing.assert_allclose(value, logical, rtol=1e-6)
        assert same and layouts == (True, True)
