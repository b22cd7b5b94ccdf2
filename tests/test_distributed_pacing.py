"""What keeps an MPI rank off the other ranks' cores: the comm-net thread's pacing and the launcher's BLAS threads.

Properties (no MPI needed): between polls the comm-net thread always *sleeps* (it never spins: a spin
took 4-14 ms of CPU per data-parallel step from the ranks' compute), 20 us right after progress, never
longer than 0.5 ms, never more than a quarter of the time already waited (beyond the first 20 us), and
the longer nothing progressed the longer; the launcher gives N ranks on C cores C // N BLAS threads
each (at least 1), in every BLAS variable the user did not set, and keeps the ones they did.
"""

from __future__ import annotations

import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyflow.distributed import launch, mpi_commnet
from pyflow.distributed.mpi_commnet import CommNet


def _sleeps(monkeypatch, since_progress: list) -> list:
    """What ``CommNet._pace`` does after each time since progress, as the comm-net module's ``time`` and
    ``os`` see it: ``("sleep", seconds)`` or ``("spin",)`` (``sched_yield``)."""
    did = []
    monkeypatch.setattr(mpi_commnet, "time", types.SimpleNamespace(sleep=lambda s: did.append(("sleep", s))))
    monkeypatch.setattr(mpi_commnet, "os", types.SimpleNamespace(sched_yield=lambda: did.append(("spin",))),
                        raising=False)
    for since in since_progress:
        CommNet._pace(since)
    return did


@given(st.lists(st.floats(min_value=0.0, max_value=5.0), min_size=1, max_size=30))
def test_the_comm_net_thread_sleeps_between_polls_with_a_back_off(since_progress):
    with pytest.MonkeyPatch.context() as monkeypatch:
        did = _sleeps(monkeypatch, since_progress)
    assert [kind for kind, *_ in did] == ["sleep"] * len(since_progress)   # one sleep per poll, never a spin
    asked = [seconds for _, seconds in did]
    for since, sleep in zip(since_progress, asked):
        assert mpi_commnet._POLL_SECONDS <= sleep <= mpi_commnet._NAP_SECONDS
        assert sleep <= max(mpi_commnet._POLL_SECONDS, since * mpi_commnet._BACKOFF)
    ordered = sorted(zip(since_progress, asked))
    assert all(a[1] <= b[1] for a, b in zip(ordered, ordered[1:]))   # waited longer: sleeps no shorter


def test_the_pacing_ends_at_the_bounds():
    assert mpi_commnet._POLL_SECONDS == 2e-5 and mpi_commnet._NAP_SECONDS == 5e-4
    with pytest.MonkeyPatch.context() as monkeypatch:
        did = _sleeps(monkeypatch, [0.0, 1e-5, 1e-3, 10.0])
    assert did == [("sleep", 2e-5), ("sleep", 2e-5), ("sleep", 2.5e-4), ("sleep", 5e-4)]


def test_fine_timer_answers_a_bool():
    assert mpi_commnet._fine_timer() in (True, False)


@given(st.integers(1, 64), st.integers(1, 256),
       st.dictionaries(st.sampled_from(launch.BLAS_VARIABLES), st.sampled_from(["1", "3", "8"]), max_size=3))
def test_the_launcher_gives_each_rank_its_share_of_the_cores_as_blas_threads(per_node, cores, user_set):
    got = launch.blas_environment(per_node, environ=user_set, cores=cores)
    assert set(got) == set(launch.BLAS_VARIABLES) - set(user_set)   # the user's settings win
    assert all(value == str(max(1, cores // per_node)) for value in got.values())
    assert all(int(value) * min(per_node, cores) <= cores for value in got.values())   # no core oversubscribed
