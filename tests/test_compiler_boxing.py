"""Compile-time boxing (seed 004): the SubTskGphBuilder chain of ``pyflow/compiler/boxing/``.

The central property: for random logical tensors (uneven, zero-size and 0-d
ones included), random placements (ranks 0..3, cpu or cuda, 1-D and 2-D
hierarchies) and random nd-SBPs, the boxing graph run by the numpy reference
interpreter turns the producer's pieces into pieces that are the consumer
layout's slices (B copies equal; P pieces summing to the value), and every
piece equals what pyflow's eager boxing produces, P layouts included.  Each
builder is the one chosen for its case and emits the expected node kinds; every
node runs where its inputs are, only comm_net crosses ranks, only copy crosses
device types, and no node is dead.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import env
from pyflow.compiler.boxing import build_boxing, evaluate
from pyflow.device import ep
from pyflow.distributed.boxing_chain import CHAIN, NODE_KINDS
from pyflow.distributed.boxing_steps import Layout
from pyflow.errors import CompileError
from pyflow.framework.placement import placement
from pyflow.framework.sbp import piece_slices

S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
WORLD = 4


def in_world(fn):
    """``fn()`` as rank 0 of a world of 4 (placements check their ranks against the world)."""
    with env.bound(env.RankContext(rank=0, world_size=WORLD)):
        return fn()


def layout(kind, ranks, *sbp) -> Layout:
    return Layout(placement(kind, ranks), tuple(sbp))


# --- strategies and checks -----------------------------------------------------------------------------------------


# hypothesis's simplest draw is the first of a list: the richest cases come first
SUBSETS = [sorted(c) for n in range(WORLD, 0, -1) for c in itertools.combinations(range(WORLD), n)]
SIDES = st.sampled_from([3, 5, 4, 2, 1, 0])  # zero-size in one draw of six, uneven splits often


@st.composite
def layout_specs(draw, ndim: int, like=None):
    """(device type, ranks (nested for 2-D), sbp); ``like``: keep its ranks and hierarchy, change the SBP a little."""
    options = [S(d) for d in range(ndim)] + [P, B]
    kind = draw(st.sampled_from(["cuda", "cpu"]))
    if like is not None:
        sbp, axis = list(like[2]), draw(st.integers(0, len(like[2]) - 1))
        sbp[axis] = draw(st.sampled_from([s for s in options if s != sbp[axis]]))
        return kind, like[1], tuple(sbp)
    ranks = draw(st.sampled_from(SUBSETS))
    shapes = (["2x2"] if len(ranks) == 4 else []) + ["flat"] + (["row", "column"] if len(ranks) > 1 else [])
    how = draw(st.sampled_from(shapes))
    nested = {"flat": ranks, "2x2": [ranks[:2], ranks[2:]], "row": [ranks], "column": [[r] for r in ranks]}[how]
    axes = 1 if how == "flat" else 2
    return kind, nested, tuple(draw(st.sampled_from(options)) for _ in range(axes))


@st.composite
def edges(draw, min_dims: int = 0):
    """(shape, src spec, dst spec): half the consumers share the producer's ranks and hierarchy."""
    shape = tuple(draw(st.lists(SIDES, min_size=min_dims, max_size=3)))
    src = draw(layout_specs(len(shape)))
    dst = draw(layout_specs(len(shape), like=None if draw(st.booleans()) else src))
    return shape, src, dst


def coords_of(lay: Layout, pid: int) -> tuple:
    return lay.placement.coordinates(pid)


def random_pieces(lay: Layout, logical: np.ndarray, seed: int) -> list:
    """The producer's pieces of ``logical``: slices; B copies equal; P pieces random, summing to the value."""
    rng = np.random.default_rng(seed)
    place = lay.placement

    def key(pid):  # pieces along a B axis are copies of coordinate 0's
        return tuple(0 if s.is_broadcast else c for s, c in zip(lay.sbp, coords_of(lay, pid)))

    groups: dict = {}
    for k in sorted({key(p) for p in range(place.parallel_num)}):  # pieces that sum to one region
        groups.setdefault(tuple(c for s, c in zip(lay.sbp, k) if not s.is_partial), []).append(k)
    made = {}
    for keys in groups.values():
        part = logical[piece_slices(logical.shape, lay.sbp, place.hierarchy, keys[0])]
        rest = [rng.integers(-5, 6, part.shape).astype(logical.dtype) for _ in keys[1:]]
        made[keys[0]] = part - sum(rest, np.zeros_like(part))
        made.update(zip(keys[1:], rest))
    return [made[key(p)] for p in range(place.parallel_num)]


def check_pieces(lay: Layout, logical: np.ndarray, pieces: list) -> None:
    """Each piece is its slice (S/B); along B axes the copies are equal; the P pieces sum to the value."""
    place, partial = lay.placement, any(s.is_partial for s in lay.sbp)
    total = np.zeros_like(logical)
    for pid, piece in enumerate(pieces):
        coords = coords_of(lay, pid)
        region = piece_slices(logical.shape, lay.sbp, place.hierarchy, coords)
        assert piece.shape == logical[region].shape, f"piece {pid}: {piece.shape}, slice {region}"
        zeroed = tuple(0 if s.is_broadcast else c for s, c in zip(lay.sbp, coords))
        twin = pieces[int(np.ravel_multi_index(zeroed, place.hierarchy))]
        np.testing.assert_array_equal(piece, twin, err_msg=f"piece {pid} differs from its B twin")
        if not partial:
            np.testing.assert_array_equal(piece, logical[region], err_msg=f"piece {pid}")
        elif zeroed == coords:
            total[region] += piece
    if partial:
        np.testing.assert_array_equal(total, logical, err_msg="the P pieces do not sum to the value")


def build_and_run(shape, src_spec, dst_spec, dtype=np.float64, seed=0):
    def body():
        src, dst = layout(src_spec[0], src_spec[1], *src_spec[2]), layout(dst_spec[0], dst_spec[1], *dst_spec[2])
        logical = np.random.default_rng(seed).integers(-9, 10, shape).astype(dtype)
        pieces = random_pieces(src, logical, seed)
        g = build_boxing(src, dst, shape, dtype)
        return src, dst, logical, pieces, g, evaluate(g, pieces)
    return in_world(body)


# --- the property: the value is kept, every piece is its slice -----------------------------------------------------


@settings(max_examples=300)
@given(edge=edges(), dtype=st.sampled_from([np.float32, np.int64]))
def test_every_edge_keeps_the_logical_value_and_every_piece_is_its_slice(edge, dtype):
    shape, src_spec, dst_spec = edge
    _, dst, logical, _, g, result = build_and_run(shape, src_spec, dst_spec, dtype)
    assert len(result) == dst.placement.parallel_num and all(r.dtype == np.dtype(dtype) for r in result)
    check_pieces(dst, logical, result)


@settings(max_examples=60)
@given(edge=edges(min_dims=1))
def test_every_piece_equals_eager_boxing_piece_for_piece(edge):
    """Eager boxing (in-process ranks) from the same producer pieces: the same consumer pieces, P layouts too."""
    shape, (skind, sranks, ssbp), (dkind, dranks, dsbp) = edge
    src, dst, logical, pieces, g, result = build_and_run(shape, (skind, sranks, ssbp), (dkind, dranks, dsbp))

    def body():
        rank, where = flow.env.get_rank(), placement(skind, sranks)
        local = pieces[where.parallel_id(rank)] if where.has(rank) else np.zeros(shape)
        x = flow.tensor(local).to_global(where, ssbp)
        return x.to_global(placement(dkind, dranks), dsbp).to_local().numpy()

    eager = flow.distributed.run(body, world_size=WORLD)
    for j, rank in enumerate(dst.placement.flat_ranks):
        np.testing.assert_array_equal(result[j], eager[rank], err_msg=f"{g.builder}: dst piece {j} on rank {rank}")


# --- OneFlow's P layouts (SEMANTICS §4a), without running eager boxing ---------------------------------------------


def pieces_of(src_spec, dst_spec, shape=(4, 4)):
    src, dst, logical, _, g, result = build_and_run(shape, src_spec, dst_spec)
    return logical, dict(zip(dst.placement.flat_ranks, result)), g


def test_b_to_p_and_one_to_p_keep_the_value_on_the_first_consumer_rank_and_zeros_elsewhere():
    for src_ranks in ([0, 1, 2, 3], [2], [1, 3]):
        logical, pieces, g = pieces_of(("cpu", src_ranks, (B,)), ("cpu", [1, 2, 3], (P,)))
        np.testing.assert_array_equal(pieces[1], logical, err_msg=g.builder)
        for r in (2, 3):
            np.testing.assert_array_equal(pieces[r], np.zeros((4, 4)))


def test_s_to_p_keeps_each_slice_in_place_or_sends_slice_i_to_consumer_i_mod_m():
    logical, pieces, g = pieces_of(("cuda", [0, 1], (S(0),)), ("cpu", [0, 1], (P,)))
    np.testing.assert_array_equal(pieces[0], np.where(np.arange(4)[:, None] < 2, logical, 0))
    np.testing.assert_array_equal(pieces[1], np.where(np.arange(4)[:, None] >= 2, logical, 0))
    logical, pieces, g = pieces_of(("cpu", [0, 1, 3], (S(1),)), ("cpu", [2, 3], (P,)))
    expected = {2: np.zeros((4, 4)), 3: np.zeros((4, 4))}
    for parallel_id, (rank, (lo, hi)) in enumerate(zip([0, 1, 3], [(0, 2), (2, 3), (3, 4)])):
        expected[rank if rank in (2, 3) else [2, 3][parallel_id % 2]][:, lo:hi] = logical[:, lo:hi]
    for r in (2, 3):
        np.testing.assert_array_equal(pieces[r], expected[r], err_msg=g.builder)


def test_2d_b_to_p_inside_rows_keeps_the_value_on_each_rows_first_rank():
    logical, pieces, g = pieces_of(("cuda", [[0, 1], [2, 3]], (S(0), B)), ("cuda", [[0, 1], [2, 3]], (S(0), P)))
    assert g.builder == "intra_group(naive_b2p)"
    np.testing.assert_array_equal(pieces[0], logical[:2])
    np.testing.assert_array_equal(pieces[2], logical[2:])
    assert not pieces[1].any() and not pieces[3].any()


# --- the chain: which builder takes which edge, and what it emits --------------------------------------------------


CHOICES = [  # src, dst, shape, builder, node kinds (exactly)
    (("cuda", [0, 1], S(0)), ("cuda", [0, 1], S(0)), (4, 6), "one_to_one", set()),
    (("cuda", [0, 1], S(0)), ("cpu", [0, 1], S(0)), (4, 6), "one_to_one", {"copy"}),
    (("cuda", [0, 1], P), ("cuda", [2, 3], P), (4, 6), "one_to_one", {"copy", "comm_net"}),
    (("cuda", [0], S(1)), ("cpu", [3], B), (4, 6), "one_to_one", {"copy", "comm_net"}),
    (("cuda", [0, 1, 2, 3], B), ("cuda", [2], B), (4, 6), "b21", set()),
    (("cuda", [0, 1, 2, 3], B), ("cpu", [3], S(0)), (4, 6), "b21", {"copy"}),
    (("cuda", [0, 1], P), ("cuda", [0, 1], B), (4, 6), "collective_boxing(all_reduce)", {"collective"}),
    (("cpu", [0, 1, 2], P), ("cpu", [0, 1, 2], S(1)), (4, 5), "collective_boxing(reduce_scatter)", {"collective"}),
    (("cuda", [0, 1], S(0)), ("cuda", [0, 1], B), (3, 6), "collective_boxing(all_gather)", {"collective"}),
    (("cuda", [0, 1, 2], S(0)), ("cuda", [0, 1, 2], S(1)), (4, 7), "collective_boxing(all_to_all)", {"collective"}),
    (("cuda", [0, 1, 2], P), ("cuda", [1], B), (4, 6), "collective_boxing(reduce)", {"collective"}),
    (("cpu", [2], S(0)), ("cpu", [0, 1, 2, 3], B), (4, 6), "collective_boxing(broadcast)", {"collective"}),
    (("cpu", [0, 1], S(0)), ("cpu", [2, 3], B), (4, 6), "slice_boxing(S2B)", {"comm_net", "concat"}),
    (("cpu", [0, 1], S(0)), ("cpu", [1, 2, 3], S(1)), (4, 6), "slice_boxing(S2S)", {"slice", "comm_net", "concat"}),
    (("cpu", [0, 1], P), ("cpu", [2, 3], S(0)), (4, 6), "slice_boxing(P2S)", {"slice", "comm_net", "add"}),
    (("cuda", [0, 1], P), ("cuda", [1, 2], B), (4, 6), "slice_boxing(P2B)", {"copy", "comm_net", "add"}),
    (("cpu", [0, 1], B), ("cpu", [1, 2, 3], S(0)), (4, 6), "slice_boxing(B2S)", {"slice", "comm_net"}),
    (("cpu", [0, 1, 2], S(0)), ("cpu", [1, 2], P), (4, 6), "slice_boxing(S2P)", {"comm_net", "zeros", "concat"}),
    (("cuda", [[0, 1], [2, 3]], P, P), ("cuda", [[0, 1], [2, 3]], B, B), (4, 6),
     "dim_reduce(collective_boxing(all_reduce))", {"collective"}),
    (("cuda", [[0, 1], [2, 3]], S(0), B), ("cuda", [[0, 1], [2, 3]], S(0), S(1)), (4, 6),
     "intra_group(slice_boxing(B2S))", {"slice"}),
    (("cuda", [[0, 1], [2, 3]], B, S(1)), ("cuda", [[0, 1], [2, 3]], S(0), S(1)), (4, 6),
     "inter_group(slice_boxing(B2S))", {"slice"}),
    (("cpu", [0], B), ("cpu", [1, 2, 3], B), (4, 6), "naive_b2b", {"comm_net"}),
    (("cpu", [0, 1], B), ("cpu", [2, 3], P), (4, 6), "naive_b2p", {"comm_net", "zeros"}),
    (("cpu", [[0, 1], [2, 3]], S(0), S(0)), ("cpu", [[0, 1], [2, 3]], S(1), S(0)), (4, 6), "naive",
     {"slice", "comm_net", "assemble"}),
    (("cpu", [0, 1], P), ("cpu", [1, 2], P), (4, 6), "naive", {"comm_net", "add", "zeros"}),
    (("cpu", [0, 1, 2], S(0)), ("cpu", [2, 3], B), (2, 6), "naive", {"comm_net", "assemble"}),
]


@pytest.mark.parametrize("src, dst, shape, builder, kinds", CHOICES,
                         ids=[f"{c[3]}-{i}" for i, c in enumerate(CHOICES)])
def test_each_builder_is_the_one_chosen_for_its_case_and_emits_its_node_kinds(src, dst, shape, builder, kinds):
    _, dst_layout, logical, _, g, result = build_and_run(shape, (src[0], src[1], src[2:]), (dst[0], dst[1], dst[2:]))
    assert g.builder == builder, str(g)
    assert {n.kind for n in g.nodes} == kinds, str(g)
    check_pieces(dst_layout, logical, result)


def test_every_builder_of_the_chain_has_a_case():
    assert {b.name for b in CHAIN.builders} == {c[3].split("(")[0] for c in CHOICES}


def test_a_piece_crosses_to_a_rank_once_and_cuda_pieces_cross_through_the_hosts():
    g = in_world(lambda: build_boxing(layout("cuda", [0, 1], S(0)), layout("cuda", [2, 3], B), (4, 6), np.float32))
    comm = [n for n in g.nodes if n.kind == "comm_net"]
    assert len(comm) == 4 and all(n.device == "cpu:0" for n in comm)
    assert sorted(n.attrs["direction"] for n in g.nodes if n.kind == "copy") == ["d2h"] * 2 + ["h2d"] * 4
    # each rank's pieces of a cuda placement live on its cuda:<local rank % GPUs> (placement.device): cuda:2
    # and cuda:3 on a machine with 4 GPUs or more, both on cuda:0 on a one-GPU machine
    gpus = ep.device_count("cuda")
    assert [(n.rank, n.device) for n in g.nodes if n.kind == "concat"] == [(2, f"cuda:{2 % gpus}"),
                                                                             (3, f"cuda:{3 % gpus}")]


# --- where nodes run -----------------------------------------------------------------------------------------------


def live_nodes(g) -> set:
    """The nodes an output needs, a collective's members counting as one."""
    members: dict = {}
    for i, n in enumerate(g.nodes):
        if n.kind == "collective":
            members.setdefault(n.attrs["collective_id"], set()).add(i)
    todo = [r[1] for r in g.outputs if r[0] == "node"]
    live = set()
    while todo:
        i = todo.pop()
        if i in live:
            continue
        live.add(i)
        todo += [r[1] for r in g.nodes[i].inputs if r[0] == "node"]
        if g.nodes[i].kind == "collective":
            todo += members[g.nodes[i].attrs["collective_id"]]
    return live


@settings(max_examples=200)
@given(edge=edges())
def test_every_node_runs_where_its_inputs_are_and_no_node_is_dead(edge):
    shape, src_spec, dst_spec = edge
    _, dst, _, _, g, _ = build_and_run(shape, src_spec, dst_spec)
    device_type = lambda device: device.split(":")[0]  # noqa: E731
    sent = set()
    for i, node in enumerate(g.nodes):
        assert node.kind in NODE_KINDS
        assert all(r[0] == "in" or r[1] < i for r in node.inputs), f"n{i} reads a later node"
        places = {g.where(r) for r in node.inputs}
        if node.kind == "comm_net":
            ((rank, device),) = places
            assert rank == node.attrs["src_rank"] != node.rank and device == node.device == "cpu:0"
            assert (node.inputs[0], node.rank) not in sent, "a piece crosses to one rank twice"
            sent.add((node.inputs[0], node.rank))
        elif node.kind == "copy":
            ((rank, device),) = places
            assert rank == node.rank and device_type(device) != device_type(node.device)
            assert node.attrs["direction"] == ("h2d" if device_type(device) == "cpu" else "d2h")
        else:
            assert places <= {(node.rank, node.device)}, f"n{i} {node} reads from {places}"
        if node.kind == "collective":
            assert node.rank in node.attrs["group"] and len(node.inputs) <= 1
    assert live_nodes(g) == set(range(len(g.nodes)))
    for j, ref in enumerate(g.outputs):
        rank = dst.placement.flat_ranks[j]
        assert g.where(ref) == (rank, str(dst.placement.device(rank)))


def test_the_reference_interpreter_rejects_a_node_that_reads_another_ranks_piece():
    g = in_world(lambda: build_boxing(layout("cpu", [0, 1], S(0)), layout("cpu", [2, 3], B), (4, 6), np.float64))
    pieces = [np.ones((2, 6)), np.ones((2, 6))]
    concat = next(n for n in g.nodes if n.kind == "concat")
    concat.rank = 1
    with pytest.raises(CompileError, match="reads"):
        in_world(lambda: evaluate(g, pieces))
    concat.rank = 2
    with pytest.raises(CompileError, match="source piece 1"):
        in_world(lambda: evaluate(g, [np.ones((2, 6)), np.ones((3, 6))]))
    concat.shape = (5, 6)
    with pytest.raises(CompileError, match="declared"):
        in_world(lambda: evaluate(g, pieces))
