"""Global tensors: placement, SBP, local <-> global, and the eager boxing chain (seeds 000 §3, 004).

The central property: for random logical tensors (uneven and zero-size ones
included), random placements (1 to 4 ranks, 1-D and 2-D, cpu and cuda) and
random SBPs, converting keeps the logical value (``numpy()`` on every rank),
and every rank's piece is its balanced slice (S), the whole (B), or a share of
a sum (P).  Chains of three random conversions round-trip.  Eager boxing runs
the one boxing chain's plan (``pyflow/distributed/boxing_chain/``): each builder
is the one chosen for its case and eager runs its plan keeping the value, and P
layouts follow OneFlow's rules.
Bad placements and SBPs are errors at the call, on every rank.
"""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import env
from pyflow.distributed.boxing import plan_for
from pyflow.distributed.boxing_chain import CHAIN
from pyflow.distributed.boxing_steps import Layout
from pyflow.errors import AxisError, DeviceError, RankError, ShapeError
from pyflow.framework.sbp import balanced_split, piece_slices
from tests.helpers_devices import EMULATED_STREAMS

run = flow.distributed.run
S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum


# --- placement and SBP ------------------------------------------------------------------------------------


def in_world(n, fn):
    """``fn()`` as rank 0 of a world of ``n`` (placements check their ranks against the world)."""
    with env.bound(env.RankContext(rank=0, world_size=n)):
        return fn()


def test_placements_sort_their_ranks_and_compare_by_value():
    def body():
        a, b = flow.placement("cuda", [0, 2, 1, 3]), flow.placement("cuda", [3, 2, 1, 0])
        grid = flow.placement("cpu", [[0, 1], [2, 3]])
        return a, b, grid, flow.placement.all("cuda")
    a, b, grid, everyone = in_world(4, body)
    assert a == b == everyone and hash(a) == hash(b) and a.ranks == [0, 1, 2, 3]
    assert a != grid and grid.hierarchy == (2, 2) and grid.ranks == [[0, 1], [2, 3]]
    assert a.type == "cuda" and repr(a) == 'placement(type="cuda", ranks=[0, 1, 2, 3])'
    assert [a.parallel_id(r) for r in range(4)] == [0, 1, 2, 3]


@pytest.mark.parametrize("make, error", [
    (lambda: flow.placement("tpu", [0]), DeviceError),
    (lambda: flow.placement("cuda", [0, 4]), DeviceError),
    (lambda: flow.placement("cuda", [1, 1]), DeviceError),
    (lambda: flow.placement("cuda", []), DeviceError),
    (lambda: flow.placement("cuda", [[0, 1], [2]]), DeviceError),
    (lambda: flow.placement("cuda", [0.5]), DeviceError),
    (lambda: flow.sbp.split(1.0), AxisError),
    (lambda: flow.sbp.split(-1), AxisError),
], ids=["type", "outside-the-world", "duplicate", "empty", "ragged", "float-rank", "float-dim", "negative-dim"])
def test_bad_placements_and_sbps_are_errors_at_the_call(make, error):
    with pytest.raises(error):
        in_world(4, make)


def test_sbp_values_print_as_oneflow_and_broadcast_is_also_callable():
    assert (repr(S(1)), repr(B), repr(P)) == ("sbp.split(dim=1)", "sbp.broadcast", "sbp.partial_sum")
    assert B() is B and P() is P and S(0) == S(0) != S(1)


@given(total=st.integers(0, 40), parts=st.integers(1, 8))
def test_the_balanced_splitter_covers_in_order_with_the_first_parts_one_longer(total, parts):
    bounds = balanced_split(total, parts)
    assert bounds[0][0] == 0 and bounds[-1][1] == total and len(bounds) == parts
    sizes = [b - a for a, b in bounds]
    assert all(b[1] == c[0] for b, c in zip(bounds, bounds[1:]))
    assert sizes == sorted(sizes, reverse=True) and max(sizes) - min(sizes) <= 1


# --- local -> global ---------------------------------------------------------------------------------------


def test_local_to_global_concatenates_splits_takes_rank_0_for_b_and_sums_p():
    def body():
        r = flow.env.get_rank()
        local = flow.tensor(np.full((2, 3), float(r + 1), np.float32))
        p = flow.placement("cpu", [0, 1, 2])
        return [local.to_global(p, sbp).numpy() for sbp in (S(0), S(1), B, P)]

    s0, s1, b, p = run(body, world_size=3)[2]
    np.testing.assert_array_equal(s0, np.repeat([1.0, 2.0, 3.0], 2)[:, None] * np.ones((1, 3)))
    np.testing.assert_array_equal(s1, np.repeat([[1.0, 2.0, 3.0]], 3, axis=1).reshape(1, 9).repeat(2, 0))
    np.testing.assert_array_equal(b, np.ones((2, 3)))
    np.testing.assert_array_equal(p, np.full((2, 3), 6.0))


def test_local_pieces_that_cannot_form_a_logical_tensor_raise_on_every_rank_and_the_ranks_go_on():
    def body():
        r = flow.env.get_rank()
        rows = [1, 2, 2][r]  # balanced split of 5 rows over 3 is 2, 2, 1: not 1, 2, 2
        p = flow.placement("cpu", [0, 1, 2])
        try:
            flow.ones(rows, 2).to_global(p, S(0))
        except ShapeError as error:
            message = str(error)
        else:
            message = None
        ok = flow.ones([2, 2, 1][r], 2).to_global(p, S(0)).numpy().shape  # balanced: fine
        return message, ok

    for message, ok in run(body, world_size=3):
        assert message is not None and "balanced split" in message and "[[1, 2], [2, 2], [2, 2]]" in message
        assert ok == (5, 2)


# --- the property: boxing keeps the logical value, pieces are their slices -------------------------------------


@st.composite
def layouts(draw, world: int, ndim: int):
    ranks = sorted(draw(st.sets(st.integers(0, world - 1), min_size=1)))
    kind = draw(st.sampled_from(["cpu", "cuda"]))
    if len(ranks) == 4 and draw(st.booleans()):
        hierarchy_ranks, axes = [ranks[:2], ranks[2:]], 2
    else:
        hierarchy_ranks, axes = ranks, 1
    options = [B, P] + [S(d) for d in range(ndim)]
    sbp = tuple(draw(st.sampled_from(options)) for _ in range(axes))
    return kind, hierarchy_ranks, sbp


def _piece_report(x):
    """(rank, coordinates or None, the local piece) for the checks in the main thread."""
    info, rank = x._global, flow.env.get_rank()
    coords = info.placement.coordinates(info.placement.parallel_id(rank)) if info.placement.has(rank) else None
    return rank, coords, x.to_local().numpy()


def check_pieces(reports, logical, kind, ranks, sbp):
    hierarchy = (2, 2) if isinstance(ranks[0], list) else (len(ranks),)
    total = np.zeros_like(logical, dtype=np.float64)
    p_axes = [a for a, s in enumerate(sbp) if s.is_partial]
    for rank, coords, piece in reports:
        if coords is None:
            assert piece.size == 0, f"rank {rank} is outside the placement but holds {piece.shape}"
            continue
        region = piece_slices(logical.shape, sbp, hierarchy, coords)
        assert piece.shape == logical[region].shape, f"rank {rank}: piece {piece.shape}, slice {region}"
        if not p_axes:
            np.testing.assert_array_equal(piece, logical[region], err_msg=f"rank {rank}")
        elif all(c == 0 for a, c in enumerate(coords) if sbp[a].is_broadcast):
            total[region] += piece
    if p_axes:
        np.testing.assert_allclose(total, logical, rtol=1e-5, err_msg="the P pieces do not sum to the value")


@settings(max_examples=25)
@given(data=st.data())
def test_boxing_keeps_the_logical_value_and_every_piece_is_its_slice(data):
    world = data.draw(st.integers(1, 4), label="world")
    shape = tuple(data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=2), label="shape"))
    src = data.draw(layouts(world, len(shape)), label="src")
    dst = data.draw(layouts(world, len(shape)), label="dst")
    logical = np.random.default_rng(7).integers(-9, 9, shape).astype(np.float32)

    def body():
        x = flow.tensor(logical, placement=flow.placement(src[0], src[1]), sbp=src[2])
        y = x.to_global(flow.placement(dst[0], dst[1]), dst[2])
        return _piece_report(x), _piece_report(y), y.numpy(), y.shape, y.sbp

    results = run(body, world_size=world)
    for _, _, value, y_shape, y_sbp in results:
        np.testing.assert_array_equal(value, logical)
        assert y_shape == logical.shape and y_sbp == dst[2]
    check_pieces([r[0] for r in results], logical, *src)
    check_pieces([r[1] for r in results], logical, *dst)


@settings(max_examples=10)
@given(data=st.data())
def test_three_random_conversions_round_trip(data):
    world = data.draw(st.integers(2, 4), label="world")
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=2), label="shape"))
    chain = [data.draw(layouts(world, len(shape)), label=f"layout {i}") for i in range(4)]
    logical = np.random.default_rng(3).standard_normal(shape).astype(np.float32)

    def body():
        x = flow.tensor(logical, placement=flow.placement(chain[0][0], chain[0][1]), sbp=chain[0][2])
        y = x
        for kind, ranks, sbp in chain[1:] + chain[:1]:
            y = y.to_global(flow.placement(kind, ranks), sbp)
        return y.numpy(), _piece_report(y), y.placement == x.placement and y.sbp == x.sbp

    results = run(body, world_size=world)
    for value, _, same in results:
        np.testing.assert_allclose(value, logical, rtol=1e-5)
        assert same
    check_pieces([r[1] for r in results], logical, *chain[0])


def test_the_same_placement_and_sbp_return_the_same_tensor():
    def body():
        x = flow.ones(4, placement=flow.placement("cpu", [0, 1]), sbp=S(0))
        return x.to_global(flow.placement("cpu", [0, 1]), S(0)) is x and x.to_global(sbp=(S(0),)) is x

    assert run(body, world_size=2) == [True, True]


# --- the chain: which builder boxes which pair ---------------------------------------------------------------------


def _layout(kind, ranks, *sbp):
    return Layout(flow.placement(kind, ranks), tuple(sbp))


CHOICES = [  # src, dst, the plan's builder (shape (4, 6)); every builder of the chain has a case
    (("cuda", [0, 1], S(0)), ("cuda", [0, 1], S(0)), "one_to_one"),
    (("cuda", [0, 1], S(0)), ("cpu", [0, 1], S(0)), "one_to_one"),
    (("cuda", [0, 1, 2, 3], B), ("cpu", [3], S(0)), "b21"),
    (("cuda", [0, 1], P), ("cuda", [0, 1], B), "collective_boxing(all_reduce)"),
    (("cuda", [0, 1], P), ("cuda", [0, 1], S(1)), "collective_boxing(reduce_scatter)"),
    (("cuda", [0, 1], S(1)), ("cuda", [0, 1], B), "collective_boxing(all_gather)"),
    (("cuda", [0, 1], S(0)), ("cuda", [0, 1], S(1)), "collective_boxing(all_to_all)"),
    (("cuda", [0, 1, 2], P), ("cuda", [1], B), "collective_boxing(reduce)"),
    (("cuda", [0], B), ("cuda", [0, 1, 2, 3], B), "collective_boxing(broadcast)"),
    (("cuda", [0, 1], B), ("cuda", [0, 1], S(0)), "slice_boxing(B2S)"),
    (("cuda", [0, 1], S(0)), ("cuda", [0, 1], P), "slice_boxing(S2P)"),
    (("cuda", [0, 1], S(0)), ("cpu", [0, 1], B), "slice_boxing(S2B)"),
    (("cuda", [0, 1], S(0)), ("cuda", [2, 3], S(1)), "slice_boxing(S2S)"),
    (("cuda", [0, 1, 2, 3], S(0)), ("cpu", [3], B), "slice_boxing(S2B)"),
    (("cuda", [[0, 1], [2, 3]], P, P), ("cuda", [[0, 1], [2, 3]], B, B), "dim_reduce(collective_boxing(all_reduce))"),
    (("cuda", [[0, 1], [2, 3]], S(0), B), ("cuda", [[0, 1], [2, 3]], S(0), S(1)), "intra_group(slice_boxing(B2S))"),
    (("cuda", [[0, 1], [2, 3]], B, S(1)), ("cuda", [[0, 1], [2, 3]], S(0), S(1)), "inter_group(slice_boxing(B2S))"),
    (("cpu", [0], B), ("cpu", [1, 2, 3], B), "naive_b2b"),
    (("cuda", [0, 1], B), ("cuda", [0, 1], P), "naive_b2p"),
    (("cuda", [[0, 1], [2, 3]], S(0), S(0)), ("cuda", [[0, 1], [2, 3]], B, S(0)), "naive"),
]


@pytest.mark.parametrize("src, dst, builder", CHOICES, ids=[f"{b}-{i}" for i, (_, _, b) in enumerate(CHOICES)])
def test_each_builder_is_the_one_chosen_for_its_case(src, dst, builder):
    assert in_world(4, lambda: plan_for(_layout(*src), _layout(*dst), (4, 6)).builder) == builder


CASES_BY_BUILDER = {b.split("(")[0] for _, _, b in CHOICES}


def test_every_builder_of_the_chain_has_a_case():
    assert {b.name for b in CHAIN.builders} == CASES_BY_BUILDER


@pytest.mark.parametrize("src, dst, builder", CHOICES[1:], ids=[f"{b}-{i}" for i, (_, _, b) in enumerate(CHOICES[1:])])
def test_each_builder_keeps_the_value(src, dst, builder):
    logical = np.arange(24, dtype=np.float32).reshape(4, 6)

    def body():
        x = flow.tensor(logical, placement=flow.placement(src[0], src[1]), sbp=tuple(src[2:]))
        y = x.to_global(flow.placement(dst[0], dst[1]), tuple(dst[2:]))
        return y.numpy(), _piece_report(y)

    results = run(body, world_size=4)
    for value, _ in results:
        np.testing.assert_array_equal(value, logical)
    check_pieces([r[1] for r in results], logical, dst[0], dst[1], tuple(dst[2:]))


def test_eager_boxing_runs_on_each_rank_exactly_the_plans_nodes_of_that_rank(monkeypatch):
    """One chain: the nodes eager boxing runs are the plan nn.Graph makes tasks of, rank by rank."""
    from pyflow.distributed import boxing

    ran, rounds, watching = [], [], set()       # watching: the ranks inside the to_global under test
    run_node, exchange_round = boxing.run_node, boxing.exchange_round

    def recording_node(node, args, ctx):
        if ctx.rank in watching:
            ran.append((ctx.rank, node.kind, node.rank, node.device))
        return run_node(node, args, ctx)

    def recording_round(moves, sends, ctx):
        if ctx.rank in watching:
            rounds.append((ctx.rank, tuple(index for index, _ in moves)))
        return exchange_round(moves, sends, ctx)

    monkeypatch.setattr(boxing, "run_node", recording_node)
    monkeypatch.setattr(boxing, "exchange_round", recording_round)
    src, dst = ("cuda", [0, 1, 2], S(0)), ("cpu", [1, 2, 3], S(1))

    def body():
        x = flow.tensor(np.arange(24.0).reshape(4, 6), placement=flow.placement(*src[:2]), sbp=src[2])
        watching.add(flow.env.get_rank())
        y = x.to_global(flow.placement(*dst[:2]), dst[2])
        watching.discard(flow.env.get_rank())
        return y.to_local().numpy()

    pieces = run(body, world_size=4)
    np.testing.assert_array_equal(np.concatenate(pieces[1:], axis=1), np.arange(24.0).reshape(4, 6))
    plan = in_world(4, lambda: plan_for(_layout(*src), _layout(*dst), (4, 6)))
    comm = tuple(i for i, n in enumerate(plan.nodes) if n.kind == "comm_net")
    expected = [(n.rank, n.kind, n.rank, n.device) for n in plan.nodes if n.kind != "comm_net"]
    assert plan.builder == "slice_boxing(S2S)" and comm
    assert sorted(ran) == sorted(expected)
    assert sorted(rounds) == [(r, comm) for r in range(4)]   # every move in one round, on every rank


# --- OneFlow's P layouts --------------------------------------------------------------------------------------------


def _pieces_of(src_ranks, src_sbp, dst_ranks, dst_sbp, world=4):
    logical = np.arange(1, 17, dtype=np.float32).reshape(4, 4)

    def body():
        x = flow.tensor(logical, placement=flow.placement("cpu", src_ranks), sbp=src_sbp)
        return x.to_global(flow.placement("cpu", dst_ranks), dst_sbp).to_local().numpy()

    return logical, run(body, world_size=world)


def test_b_to_p_and_one_to_p_keep_the_value_on_the_first_rank_and_zeros_elsewhere():
    for src_ranks in ([0, 1, 2, 3], [2], [1, 3]):
        logical, pieces = _pieces_of(src_ranks, B, [1, 2, 3], P)
        np.testing.assert_array_equal(pieces[1], logical)
        for r in (2, 3):
            np.testing.assert_array_equal(pieces[r], np.zeros((4, 4)))
        assert pieces[0].size == 0


def test_s_to_p_on_one_placement_keeps_each_slice_in_place():
    logical, pieces = _pieces_of([0, 1], S(0), [0, 1], P)
    np.testing.assert_array_equal(pieces[0], np.where(np.arange(4)[:, None] < 2, logical, 0))
    np.testing.assert_array_equal(pieces[1], np.where(np.arange(4)[:, None] >= 2, logical, 0))


def test_s_to_p_across_placements_sends_slice_i_to_the_same_rank_or_to_parallel_id_i_mod_m():
    logical, pieces = _pieces_of([0, 1, 3], S(1), [2, 3], P)
    cols = [(0, 2), (2, 3), (3, 4)]  # the balanced split of 4 columns over 3 ranks
    expected = {2: np.zeros((4, 4)), 3: np.zeros((4, 4))}
    for parallel_id, (rank, (lo, hi)) in enumerate(zip([0, 1, 3], cols)):
        target = rank if rank in (2, 3) else [2, 3][parallel_id % 2]
        expected[target][:, lo:hi] = logical[:, lo:hi]
    for r in (2, 3):
        np.testing.assert_array_equal(pieces[r], expected[r])


# --- collectives on delayed streams, and what a missing wait does ------------------------------------------------------


def _cuda_program(seed):
    rng = np.random.default_rng(seed)
    logical = rng.standard_normal((4, 3)).astype(np.float32)

    def body():
        p = flow.placement("cuda", [0, 1])
        x = flow.tensor(logical, placement=p, sbp=S(0)) * 2.0   # a kernel writes each piece
        y = x.to_global(sbp=B) + 1.0                            # d2h, all-gather, h2d, a kernel
        return y.numpy()

    return logical * 2 + 1, body


def test_collectives_between_kernels_give_the_right_answer_under_random_stream_delays():
    for seed in range(6):
        expected, body = _cuda_program(seed)
        with flow.device.ep.emulation(max_delay=0.002, seed=seed):
            for value in run(body, world_size=2):
                np.testing.assert_allclose(value, expected, rtol=1e-6)


@EMULATED_STREAMS   # a mutation check: only emulated streams take the delays that expose it
def test_without_soft_sync_waits_collectives_read_pieces_before_their_kernels_ran():
    from pyflow.vm.builder import InstructionsBuilder

    wrong = 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(InstructionsBuilder, "_soft_sync_between", lambda self, deps, src, dst: None)
        for seed in range(12):
            expected, body = _cuda_program(seed)
            with flow.device.ep.emulation(max_delay=0.003, seed=seed):
                try:
                    values = run(body, world_size=2)
                except RankError:
                    wrong += 1
                    continue
            wrong += any(not np.allclose(v, expected, rtol=1e-6) for v in values)
    assert wrong, "no wrong answer with SoftSyncStream's waits removed: the test cannot see a missing wait"


# --- printing ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ranks, sbp", [([0, 1, 2, 3], (S(0),)), ([[0, 1], [2, 3]], (S(0), P)), ([1, 2], (P,)),
                                        ([3], (B,))], ids=["1d", "2d", "partial", "one-rank"])
def test_any_global_tensor_prints_its_values_on_every_rank(ranks, sbp):
    logical = np.arange(6, dtype=np.float32).reshape(3, 2)

    def body():
        x = flow.tensor(logical, placement=flow.placement("cpu", ranks), sbp=sbp)
        return str(x), repr(x)

    for text, rep in run(body, world_size=4):
        assert "[[0., 1.]," in text and "[4., 5.]]" in text and "placement=" in text
        assert rep == text and f"sbp={tuple(sbp)}" in rep   # repr shows the values too, as PyTorch's


def test_a_0d_tensor_crosses_between_disjoint_placements_and_stays_0d():
    """The generic exchange once sent 0-d pieces as 1-d arrays (np.ascontiguousarray), failing the receiver."""
    def body():
        x = flow.tensor(3.5, placement=flow.placement("cpu", [0]), sbp=flow.sbp.broadcast)
        y = x.to_global(placement=flow.placement("cpu", [1]), sbp=flow.sbp.broadcast)
        return tuple(y.shape), y.numpy()

    for shape, value in flow.distributed.run(body, world_size=2):
        assert shape == () and value.shape == () and value == 3.5


@pytest.mark.parametrize("sbp, shapes", [("B", [[2], [3]]), ("B", [[2, 1], [2]]), ("P", [[2, 2], [2, 3]])])
def test_local_tensors_of_different_shapes_along_a_broadcast_or_partial_axis_are_refused_on_every_rank(sbp, shapes):
    """OneFlow's check_meta_consistency: to_global(B or P) from local tensors whose shapes differ per rank is an
    error on every rank (it gave every rank rank 0's tensor, silently)."""
    def body():
        x = flow.ones(*shapes[flow.env.get_rank()])
        with pytest.raises(ShapeError, match="must be|different numbers of dims|cannot form") as caught:
            x.to_global(flow.placement("cpu", [0, 1]), {"B": B, "P": P}[sbp])
        return str(caught.value)

    first, second = run(body, world_size=2)
    assert first == second   # the same report on every rank


def test_a_local_index_or_value_meeting_a_global_tensor_is_made_broadcast_so_the_ranks_agree():
    """Indexing a global tensor with a local index (or writing a local value into it) that differs per rank
    gave a "global" result whose ranks disagreed; now the local tensor is made global as to_global(B) makes it
    (rank 0's values, every rank's shape checked), so every rank computes the same logical tensor."""
    a = np.arange(8.0).reshape(4, 2)

    def body():
        r = flow.env.get_rank()
        x = flow.tensor(a, placement=flow.placement("cpu", [0, 1]), sbp=S(0))
        picked = x[flow.tensor([r, 3])]
        masked = x[flow.tensor([True, r == 1, False, True])]
        y = x.clone()
        y[flow.tensor([r])] = flow.tensor([[-1.0, -2.0 - r]])
        return picked.numpy(), masked.numpy(), y.numpy()

    results = run(body, world_size=2)
    for picked, masked, written in results:
        np.testing.assert_array_equal(picked, a[[0, 3]])
        np.testing.assert_array_equal(masked, a[[0, 3]])
        want = a.copy()
        want[0] = [-1.0, -2.0]
        np.testing.assert_array_equal(written, want)
