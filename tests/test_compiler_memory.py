"""The compiler's memory planner (seed 004, ``pyflow.compiler.memory``), as a specification.

* Every algorithm's plan is valid on random op DAGs and on arbitrary random lifetimes: every
  regst placed at an aligned offset inside its block, no two regsts alive at the same time
  overlapping (``MemoryPlan.check``, itself checked against a brute-force pair scan), and no
  block below the lower bound (itself checked against a brute-force scan over time).
* ``best`` is exactly the smallest single algorithm, per device.
* Hand-made cases with a known optimum, the module's worked example, alignment, empty regsts,
  several devices.
* ``check`` catches broken placements (a regst moved onto one alive at the same time, a
  missing, misaligned or out-of-block regst).
* to_dict / from_dict round-trip through JSON; report() and log(); clear errors.
* ``bottom_up`` (pyflow's algorithm): valid on random branchy DAGs of 50-250 ops (hypothesis),
  deterministic, exact on the hand-made cases, and within 2% of the lower bound on fixed random
  DAGs of 200-500 ops where OneFlow's eight greedy algorithms miss by 3-13%.
* Quality guard: on typical random DAGs (200 ops, log-uniform sizes) best <= 1.02 x the lower
  bound (the benchmark's target; benchmarks/bench_memory_plan.py measures 1,000-10,000 ops).
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyflow.compiler.memory import (ALGORITHMS, MemoryPlan, MemoryPlanError, MemRequest, draw,
                                    lower_bound, plan_memory, requests_for_chain)
from pyflow.errors import ArgumentTypeError

DEVICE = "rank0/cuda:0"


# --- workloads --------------------------------------------------------------------------------


@st.composite
def dag_requests(draw_, device: str = DEVICE, first_id: int = 0):
    """A random op DAG in topological order: op i reads 0-3 earlier ops; its output lives
    from i to its last reader (or just i, if none)."""
    n = draw_(st.integers(1, 30))
    sizes = draw_(st.lists(st.integers(0, 5000), min_size=n, max_size=n))
    consumers = [[] for _ in range(n)]
    for child in range(1, n):
        for parent in draw_(st.lists(st.integers(0, child - 1), max_size=3, unique=True)):
            consumers[parent].append(child)
    return requests_for_chain(device, sizes, consumers, first_id=first_id)


@st.composite
def interval_requests(draw_):
    """Arbitrary lifetimes (not from a DAG) on one or two devices."""
    rows = draw_(st.lists(st.tuples(st.sampled_from(["cuda:0", "cuda:1"]), st.integers(0, 4096),
                                    st.integers(0, 20), st.integers(1, 12)), min_size=1, max_size=40))
    return [MemRequest(i, dev, size, start, start + length) for i, (dev, size, start, length) in enumerate(rows)]


def branchy_dag(n: int, seed: int) -> list[MemRequest]:
    """The benchmark's branchy shape: 1-3 parents among the last 50 ops, 2% also read any earlier op."""
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(np.log(1024), np.log(16 << 20), n)).astype(np.int64).tolist()
    consumers = [[] for _ in range(n)]
    for child in range(1, n):
        parents = set(rng.integers(max(0, child - 50), child, size=int(rng.integers(1, 4))).tolist())
        if rng.random() < 0.02:
            parents.add(int(rng.integers(0, child)))
        for parent in parents:
            consumers[parent].append(child)
    return requests_for_chain(DEVICE, sizes, consumers)


def random_dag(n: int, seed: int) -> list[MemRequest]:
    """A "typical" DAG: 1-3 readers' worth of parents from the last 30 ops, sizes log-uniform 1 KiB-16 MiB."""
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(np.log(1024), np.log(16 << 20), n)).astype(np.int64).tolist()
    consumers = [[] for _ in range(n)]
    for child in range(1, n):
        for parent in set(rng.integers(max(0, child - 30), child, size=int(rng.integers(1, 4))).tolist()):
            consumers[parent].append(child)
    return requests_for_chain(DEVICE, sizes, consumers)


# --- brute-force references ---------------------------------------------------------------------


def aligned(size: int, alignment: int) -> int:
    return -(-size // alignment) * alignment


def brute_lower_bound(requests, alignment: int) -> dict[str, int]:
    bound = {}
    for r in requests:
        live = [sum(aligned(q.size, alignment) for q in requests
                    if q.device == r.device and q.start <= t < q.end) for t in range(r.start, r.end)]
        bound[r.device] = max(bound.get(r.device, 0), *live)
    return bound


def brute_overlaps(plan: MemoryPlan) -> list[tuple[int, int]]:
    """Every pair of regsts on one device, alive at the same time, whose bytes overlap."""
    pairs = []
    rs = plan.requests
    for i, a in enumerate(rs):
        for b in rs[i + 1:]:
            if a.device != b.device or not (a.start < b.end and b.start < a.end):
                continue
            a0, b0 = plan.offsets[a.regst_id], plan.offsets[b.regst_id]
            if plan.size_of(a) == 0 or plan.size_of(b) == 0:
                continue   # an empty byte range overlaps nothing (the formula below would say [256, 256) does)
            if a0 < b0 + plan.size_of(b) and b0 < a0 + plan.size_of(a):
                pairs.append((a.regst_id, b.regst_id))
    return pairs


def assert_valid(plan: MemoryPlan, requests, alignment: int) -> None:
    plan.check()
    assert not brute_overlaps(plan)
    assert {r.regst_id for r in requests} == set(plan.offsets)
    assert all(offset % alignment == 0 for offset in plan.offsets.values())
    bounds = brute_lower_bound(requests, alignment)
    for device, block in plan.block_sizes.items():
        assert block >= bounds[device]
        top = max(plan.offsets[r.regst_id] + plan.size_of(r) for r in requests if r.device == device)
        assert block == top  # the block is exactly as big as its highest regst


# --- properties ----------------------------------------------------------------------------------


@settings(max_examples=100)  # cheap: ~10 ms an example
@given(dag_requests(), st.sampled_from([1, 64, 512]))
def test_every_algorithm_gives_a_valid_plan_on_random_dags(requests, alignment):
    for algorithm in (*ALGORITHMS, "best"):
        assert_valid(plan_memory(requests, alignment=alignment, algorithm=algorithm), requests, alignment)


@settings(max_examples=100)  # cheap: ~10 ms an example
@given(interval_requests(), st.sampled_from([1, 256]))
def test_every_algorithm_gives_a_valid_plan_on_arbitrary_lifetimes(requests, alignment):
    for algorithm in (*ALGORITHMS, "best"):
        assert_valid(plan_memory(requests, alignment=alignment, algorithm=algorithm), requests, alignment)


@settings(max_examples=100)  # cheap: ~10 ms an example
@given(st.one_of(dag_requests(), interval_requests()))
def test_best_is_the_smallest_single_algorithm_per_device(requests):
    best = plan_memory(requests)
    singles = {name: plan_memory(requests, algorithm=name) for name in ALGORITHMS}
    for device, block in best.block_sizes.items():
        assert block == min(plan.block_sizes[device] for plan in singles.values())
        assert singles[best.algorithms[device]].block_sizes[device] == block


@settings(max_examples=100)  # cheap: ~10 ms an example
@given(st.one_of(dag_requests(), interval_requests()), st.sampled_from([1, 512]))
def test_lower_bound_is_the_most_bytes_alive_at_once(requests, alignment):
    assert lower_bound(requests, alignment=alignment) == brute_lower_bound(requests, alignment)


@settings(max_examples=100)  # cheap: ~10 ms an example
@given(st.one_of(dag_requests(), interval_requests()), st.data())
def test_check_agrees_with_a_brute_force_scan_on_arbitrary_offsets(requests, data):
    """Random (often invalid) placements: check() raises exactly when some live pair overlaps."""
    offsets = {r.regst_id: 256 * data.draw(st.integers(0, 6)) for r in requests}
    devices = {r.device for r in requests}
    blocks = {d: max(offsets[r.regst_id] + aligned(r.size, 256) for r in requests if r.device == d)
              for d in devices}
    plan = MemoryPlan(tuple(requests), 256, offsets, blocks, {d: "hand-made" for d in devices})
    if brute_overlaps(plan):
        with pytest.raises(MemoryPlanError, match="overlaps"):
            plan.check()
    else:
        plan.check()


@settings(max_examples=100)  # cheap: ~10 ms an example
@given(dag_requests(), st.data())
def test_check_catches_a_regst_moved_onto_one_alive_at_the_same_time(requests, data):
    plan = plan_memory(requests)
    pairs = [(a, b) for a in requests for b in requests
             if a.regst_id != b.regst_id and a.size and b.size and a.start < b.end and b.start < a.end]
    if not pairs:
        return
    a, b = data.draw(st.sampled_from(pairs))
    plan.offsets[b.regst_id] = plan.offsets[a.regst_id]  # the mutation
    plan.block_sizes[DEVICE] = max(plan.block_sizes[DEVICE], plan.offsets[b.regst_id] + plan.size_of(b))
    with pytest.raises(MemoryPlanError, match="overlaps"):
        plan.check()


def test_check_catches_missing_misaligned_and_out_of_block_regsts():
    requests = [MemRequest(0, DEVICE, 1000, 0, 2), MemRequest(1, DEVICE, 1000, 1, 3)]
    plan = plan_memory(requests)
    missing = MemoryPlan(plan.requests, 512, {0: 0}, dict(plan.block_sizes), dict(plan.algorithms))
    with pytest.raises(MemoryPlanError, match="regst 1 .* never placed"):
        missing.check()
    misaligned = MemoryPlan(plan.requests, 512, {0: 0, 1: 1000}, {DEVICE: 3000}, {})
    with pytest.raises(MemoryPlanError, match="multiple of the alignment 512"):
        misaligned.check()
    outside = MemoryPlan(plan.requests, 512, {0: 0, 1: 1024}, {DEVICE: 1024}, {})
    with pytest.raises(MemoryPlanError, match="runs past the block"):
        outside.check()


# --- hand-made cases ---------------------------------------------------------------------------


def test_worked_example_of_the_module_docstring():
    requests = [MemRequest(0, "cuda:0", 1024, 0, 2), MemRequest(1, "cuda:0", 512, 1, 3),
                MemRequest(2, "cuda:0", 1000, 2, 4)]
    plan = plan_memory(requests)
    assert plan.offsets == {0: 0, 1: 1024, 2: 0}
    assert plan.block_sizes == {"cuda:0": 1536} == lower_bound(requests)
    assert plan.algorithms == {"cuda:0": "mem_size_first"}  # OneFlow's default wins ties


@pytest.mark.parametrize("algorithm",
                         ["mem_size_first", "lifetime_first", "mem_volume_first", "bottom_up", "best"])
def test_a_chain_reuses_two_buffers_perfectly(algorithm):
    """Op i reads only op i - 1: two equal buffers, ping-pong, exactly the lower bound."""
    requests = requests_for_chain(DEVICE, [4096] * 50, [[i + 1] for i in range(49)] + [[]])
    plan = plan_memory(requests, algorithm=algorithm)
    assert plan.block_sizes[DEVICE] == lower_bound(requests)[DEVICE] == 2 * 4096
    assert set(plan.offsets.values()) == {0, 4096}


def test_training_pattern_stacks_activations_exactly():
    """Forward activations live until their backward op (nested lifetimes): the peak is at the
    turn (all activations + the first gradient), and OneFlow's default order stacks them with no
    gap (time_line, for one, does not)."""
    m, sizes = 6, [3072, 1024, 5120, 512, 2048, 4096]
    consumers = [[f + 1, 2 * m - 1 - f] for f in range(m - 1)] + [[m]]
    consumers += [[b + 1] for b in range(m, 2 * m - 1)] + [[]]
    requests = requests_for_chain(DEVICE, sizes + sizes[::-1], consumers)
    for algorithm in ("mem_size_first", "mem_size_first+compact", "lifetime_first", "bottom_up", "best"):
        plan = plan_memory(requests, algorithm=algorithm)
        plan.check()
        assert plan.block_sizes[DEVICE] == lower_bound(requests)[DEVICE] == sum(sizes) + sizes[-1], algorithm


def test_disjoint_lifetimes_share_offset_zero_and_overlapping_ones_stack():
    apart = [MemRequest(i, DEVICE, 512 * (i + 1), 2 * i, 2 * i + 2) for i in range(5)]
    plan = plan_memory(apart)
    assert set(plan.offsets.values()) == {0} and plan.block_sizes[DEVICE] == 512 * 5
    together = [MemRequest(i, DEVICE, 512 * (i + 1), 0, 3) for i in range(5)]
    assert plan_memory(together).block_sizes[DEVICE] == 512 * 15


def test_sizes_are_rounded_up_to_the_alignment():
    requests = [MemRequest(0, DEVICE, 1, 0, 2), MemRequest(1, DEVICE, 513, 0, 2)]
    plan = plan_memory(requests)
    assert plan.block_sizes[DEVICE] == 512 + 1024 == lower_bound(requests)[DEVICE]
    assert plan_memory(requests, alignment=1).block_sizes[DEVICE] == 514


def test_empty_regsts_take_no_room():
    requests = [MemRequest(0, DEVICE, 0, 0, 5), MemRequest(1, DEVICE, 100, 1, 3), MemRequest(2, DEVICE, 0, 2, 4)]
    plan = plan_memory(requests)
    plan.check()
    assert plan.offsets == {0: 0, 1: 0, 2: 0} and plan.block_sizes[DEVICE] == 512


def test_devices_are_planned_separately():
    requests = [MemRequest(0, "rank0/cuda:0", 1024, 0, 2), MemRequest(1, "rank0/cuda:1", 1024, 0, 2),
                MemRequest(2, "rank1/cuda:0", 2048, 0, 2)]
    plan = plan_memory(requests)
    assert plan.offsets == {0: 0, 1: 0, 2: 0}
    assert plan.block_sizes == {"rank0/cuda:0": 1024, "rank0/cuda:1": 1024, "rank1/cuda:0": 2048}
    assert [row["device"] for row in plan.report()] == sorted(plan.block_sizes)


@pytest.mark.parametrize("seed", range(5))
def test_typical_random_dags_come_within_two_percent_of_the_lower_bound(seed):
    requests = random_dag(200, seed)
    plan = plan_memory(requests)
    plan.check()
    (row,) = plan.report()
    assert row["ratio"] <= 1.02, row


@pytest.mark.parametrize("algorithm", ["mem_size_first", "bottom_up"])
def test_ten_thousand_requests_plan_in_seconds_not_minutes(algorithm):
    """A guard against an O(n^3) placement, not a benchmark (benchmarks/bench_memory_plan.py is)."""
    # branchy_dag(10_000, 2): bottom_up runs its whole search (20 decodes), ending at 1.0002
    requests = random_dag(10_000, 0) if algorithm == "mem_size_first" else branchy_dag(10_000, 2)
    began = time.perf_counter()
    plan = plan_memory(requests, algorithm=algorithm)
    assert time.perf_counter() - began < 15
    assert plan.report()[0]["ratio"] <= (1.10 if algorithm == "mem_size_first" else 1.02)


# --- bottom_up ---------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)  # ~0.1 s an example
@given(st.integers(0, 2**32 - 1), st.integers(50, 250))
def test_bottom_up_never_overlaps_live_regsts_on_random_branchy_dags(seed, n):
    requests = branchy_dag(n, seed)
    plan = plan_memory(requests, algorithm="bottom_up")
    plan.check()
    assert not brute_overlaps(plan)
    assert set(plan.offsets) == {r.regst_id for r in requests}
    assert plan.block_sizes[DEVICE] == max(plan.offsets[r.regst_id] + plan.size_of(r) for r in requests)
    assert plan.block_sizes[DEVICE] >= lower_bound(requests)[DEVICE]


# Random DAGs on which OneFlow's eight greedy algorithms (the best of them) miss the lower bound
# by 3-13% (measured: random 300/0 1.050, 300/1 1.049, 300/4 1.049, 500/2 1.069; branchy 200/2
# 1.063, 300/2 1.058, 500/2 1.127, 500/3 1.092).
HARD_DAGS = [(random_dag, 300, 0), (random_dag, 300, 1), (random_dag, 300, 4), (random_dag, 500, 2),
             (branchy_dag, 200, 2), (branchy_dag, 300, 2), (branchy_dag, 500, 2), (branchy_dag, 500, 3)]


@pytest.mark.parametrize("make, n, seed", HARD_DAGS, ids=lambda v: getattr(v, "__name__", v))
def test_bottom_up_comes_within_two_percent_of_the_lower_bound(make, n, seed):
    requests = make(n, seed)
    bound = lower_bound(requests)[DEVICE]
    greedy = min(plan_memory(requests, algorithm=name).block_sizes[DEVICE] for name in ALGORITHMS[:-1])
    assert greedy > 1.02 * bound  # the case is a hard one for OneFlow's algorithms
    plan = plan_memory(requests, algorithm="bottom_up")
    plan.check()
    assert plan.block_sizes[DEVICE] <= 1.02 * bound
    best = plan_memory(requests)
    assert best.block_sizes[DEVICE] == plan.block_sizes[DEVICE] and best.algorithms[DEVICE] == "bottom_up"


def test_bottom_up_is_deterministic():
    requests = branchy_dag(300, 2)
    first = plan_memory(requests, algorithm="bottom_up")
    again = plan_memory(list(requests), algorithm="bottom_up")
    assert first == again


# --- serialisation, reports, the log --------------------------------------------------------


@given(st.one_of(dag_requests(), interval_requests()))
def test_to_dict_round_trips_through_json(requests):
    plan = plan_memory(requests)
    again = MemoryPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    again.check()


def test_report_has_one_row_per_device_against_the_lower_bound():
    requests = random_dag(50, 1) + [MemRequest(1000, "rank0/cuda:1", 4096, 0, 1)]
    plan = plan_memory(requests)
    rows = {row["device"]: row for row in plan.report()}
    assert rows["rank0/cuda:1"] == {"device": "rank0/cuda:1", "planned_bytes": 4096, "lower_bound_bytes": 4096,
                                    "ratio": 1.0, "regst_num": 1, "algorithm": "mem_size_first"}
    row = rows[DEVICE]
    assert row["regst_num"] == 50 and row["lower_bound_bytes"] == lower_bound(requests)[DEVICE]
    assert row["ratio"] == row["planned_bytes"] / row["lower_bound_bytes"] >= 1.0
    assert row["algorithm"] in ALGORITHMS


def test_log_reads_like_oneflows_memory_log():
    requests = [MemRequest(7, DEVICE, 2_000_000, 0, 3), MemRequest(8, DEVICE, 1_000_000, 1, 2)]
    text = plan_memory(requests, alignment=1).log()
    lines = text.splitlines()
    # OneFlow's "MiB" is bytes / 10**6 (its B2MiB)
    assert lines[0].startswith(f"Device: {DEVICE} needs to allocate [ 3 MiB ] device memory.")
    assert "regst_num = 2" in lines[0] and "mem_size_first" in lines[0]
    assert "regst 7 ,size: 2 MiB (2000000 B) ,offset: 0 ,alloc_order: 0 ,free_order: 2 ,duration: 3" in lines[1]
    assert "regst 8 ,size: 1 MiB (1000000 B) ,offset: 2000000 ,alloc_order: 1 ,free_order: 1" in lines[2]


def test_requests_for_chain_lifetimes_run_from_producer_to_last_reader():
    requests = requests_for_chain("d", [10, 20, 30], [[2, 1], [], []], first_id=5)
    assert [(r.regst_id, r.start, r.end) for r in requests] == [(5, 0, 3), (6, 1, 2), (7, 2, 3)]
    with pytest.raises(MemoryPlanError, match="must come after its producer"):
        requests_for_chain("d", [10, 20], [[0], []])


def test_draw_puts_one_box_per_regst():
    pytest.importorskip("matplotlib", reason="draw() needs matplotlib axes (pip install matplotlib)")
    from matplotlib.figure import Figure

    requests = random_dag(20, 2)
    plan = plan_memory(requests)
    ax = Figure().add_subplot()
    draw(plan, requests, DEVICE, ax)
    boxes = [(p.get_x(), p.get_y(), p.get_width(), p.get_height()) for p in ax.patches]
    assert sorted(boxes) == sorted((r.start, plan.offsets[r.regst_id], r.end - r.start, plan.size_of(r))
                                   for r in requests if r.size)


# --- errors ------------------------------------------------------------------------------------


def test_bad_requests_are_refused_with_clear_errors():
    with pytest.raises(MemoryPlanError, match=r"lifetime \[3, 3\) is empty"):
        MemRequest(0, DEVICE, 10, 3, 3)
    with pytest.raises(MemoryPlanError, match="size -1 is negative"):
        MemRequest(0, DEVICE, -1, 0, 1)
    with pytest.raises(MemoryPlanError, match="start -2 is negative"):
        MemRequest(0, DEVICE, 1, -2, 1)
    with pytest.raises(ArgumentTypeError, match="size must be an int"):
        MemRequest(0, DEVICE, 1.5, 0, 1)
    with pytest.raises(ArgumentTypeError, match="device must be a non-empty str"):
        MemRequest(0, "", 1, 0, 1)
    assert MemRequest(np.int64(3), DEVICE, np.int32(4), 0, 1).size.__class__ is int


def test_bad_plan_arguments_are_refused_with_clear_errors():
    requests = [MemRequest(0, DEVICE, 10, 0, 1), MemRequest(0, DEVICE, 10, 1, 2)]
    with pytest.raises(MemoryPlanError, match="regst id 0 is requested twice"):
        plan_memory(requests)
    with pytest.raises(MemoryPlanError, match="unknown memory planning algorithm 'first_fit'.*mem_size_first"):
        plan_memory(requests[:1], algorithm="first_fit")
    with pytest.raises(MemoryPlanError, match="alignment must be a positive int"):
        plan_memory(requests[:1], alignment=0)
    with pytest.raises(ArgumentTypeError, match="takes MemRequest objects"):
        plan_memory([(0, DEVICE, 10, 0, 1)])
    assert issubclass(MemoryPlanError, ValueError)
