"""``flow.zeros/ones/full(..., placement=, sbp=)`` send nothing (issue 31): each rank fills its own piece.

Every rank knows a constant, so, as OneFlow's global constant op, no rank needs parallel_id 0's data:
the pieces are the ones ``flow.tensor(np.full(...), placement=, sbp=)`` makes (which broadcasts
parallel_id 0's data), with no collective.  A partial sum of a nonzero value is filled B, then boxed
on the rank (coordinate 0 of each P axis keeps the value, the others hold zeros).  Counts only.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import pyflow as flow

S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum

RANKS = {1: [0, 1], 2: [[0, 1], [2, 3]]}   # a 1-D and a 2-D placement, by their number of axes


def _sbp(draw, ndim: int):
    return draw(st.sampled_from([B, P] + [S(d) for d in range(ndim)]))


@st.composite
def _cases(draw):
    """(placement axes, shape, sbp per axis, the creation function's name, its fill value)."""
    axes = draw(st.sampled_from(sorted(RANKS)))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    sbp = tuple(_sbp(draw, len(shape)) for _ in range(axes))
    kind = draw(st.sampled_from(["zeros", "ones", "full"]))
    value = {"zeros": 0.0, "ones": 1.0}[kind] if kind != "full" else draw(st.sampled_from([0.0, -2.5, 7.0]))
    return axes, shape, sbp, kind, value


def _make(kind: str, shape: tuple, value, placement, sbp):
    if kind == "full":
        return flow.full(shape, value, placement=placement, sbp=sbp)
    return getattr(flow, kind)(*shape, placement=placement, sbp=sbp)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_cases())
@example(case=(2, (3, 5), (P, S(1)), "full", 7.0))   # a P axis beside a split one: filled (B, S(1)), not (B, B)
@example(case=(2, (3, 5), (S(0), P), "ones", 1.0))
def test_a_global_constant_is_filled_on_each_rank_with_nothing_sent(case):
    axes, shape, sbp, kind, value = case
    world = 2 if axes == 1 else 4

    def per_rank():
        placement = flow.placement("cpu", RANKS[axes])
        with flow.trace() as tracer:
            made = _make(kind, shape, value, placement, sbp)
            piece = made.to_local().numpy()
        sent = sum(record.name == "collective" for record in tracer.records)
        broadcast_then_boxed = flow.tensor(np.full(shape, value, np.float32), placement=placement, sbp=sbp)
        return (sent, tuple(made.sbp), made.dtype, tuple(made.shape), piece, broadcast_then_boxed.to_local().numpy(),
                made.numpy())

    for sent, made_sbp, dtype, made_shape, piece, expected_piece, logical in flow.distributed.run(
            per_rank, world_size=world, timeout=120):
        assert sent == 0, sent
        assert made_sbp == sbp and made_shape == shape and dtype == np.float32
        np.testing.assert_array_equal(piece, expected_piece)
        np.testing.assert_array_equal(logical, flow.full(shape, value, dtype=flow.float32).numpy())


def test_a_global_constant_checks_its_layout_and_arguments():
    placement = flow.placement("cpu", [0])
    with pytest.raises(flow.errors.ShapeError, match="zeros"):
        flow.zeros(2, 3, placement=placement, sbp=S(2))
    with pytest.raises(flow.errors.ArgumentTypeError, match="ones: a global tensor needs both"):
        flow.ones(2, placement=placement)
    with pytest.raises(flow.errors.ArgumentTypeError, match="not both"):
        flow.full((2,), 1.0, device="cpu", placement=placement, sbp=B)
