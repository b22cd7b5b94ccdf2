"""The comm-net watchdog's divergence check (``CollectiveWatchdog.deadlock``) read in logical time: the control
messages a rank received and its own counts decide, with no MPI process started (the check is plain bookkeeping;
tests/test_mpi.py runs it in real jobs).  The stale-word case was found on a 16-core GPU machine under load:
rank 0 said twice "I wait at #2 of [0, 1] for rank 1"; rank 1 then reached #2, went on to #6 and waited there for
rank 0 within 1.5 s, and took rank 0's old word for a rank waiting elsewhere: a CollectiveMismatchError in
correct code."""

from __future__ import annotations

import collections

import pytest

from pyflow.distributed.mpi_commnet import CommNet, Operation
from pyflow.distributed.mpi_watchdog import CollectiveWatchdog
from pyflow.errors import CollectiveMismatchError

GROUP = (0, 1)


def _rank_one() -> CollectiveWatchdog:
    """The watchdog of rank 1 of 2, over a CommNet holding only the counts the divergence check reads."""
    net = CommNet.__new__(CommNet)
    net.rank, net.world_size = 1, 2
    net.started = collections.Counter()
    net.sent = collections.Counter()
    return CollectiveWatchdog(net)


def _rank_zero_waits(watch: CollectiveWatchdog, key: tuple, times: int = 2) -> None:
    for _ in range(times):   # rank 0's probes, every 0.5 s while it waits
        watch.hear(("waiting", 0, key, f"rank 0's wait at {key}", [1]))


def _waiting_at(key: tuple) -> Operation:
    return Operation(f"collective {key}", key=key)


def test_a_peer_waiting_elsewhere_for_a_collective_this_rank_has_not_reached_is_divergent_code():
    watch = _rank_one()
    watch.net.started[GROUP] = 2           # rank 1 ran #0 and #1 of the group, not #2
    _rank_zero_waits(watch, (GROUP, 2))
    error = watch.deadlock(_waiting_at(((0, 1, 2), 0)), [0], now=watch.peer_waits[0].since)
    assert isinstance(error, CollectiveMismatchError) and "ran different code" in str(error)


@pytest.mark.parametrize("joined", [4, 7])
def test_a_peer_word_about_a_collective_this_rank_has_since_joined_is_stale_not_divergent(joined):
    watch = _rank_one()
    _rank_zero_waits(watch, (GROUP, 2))   # said before rank 1 arrived at #2 ...
    watch.net.started[GROUP] = joined     # ... which rank 1 then joined, went on, and now waits at #joined-1
    assert watch.deadlock(_waiting_at((GROUP, joined - 1)), [0], now=watch.peer_waits[0].since) is None


def test_a_peer_waiting_for_a_message_counts_as_stale_once_this_rank_sends_it_another():
    watch = _rank_one()
    key = ("recv", 1, 5)                  # rank 0 waits for a message from rank 1 with tag 5
    _rank_zero_waits(watch, key)
    op = _waiting_at((GROUP, 0))
    now = watch.peer_waits[0].since
    assert isinstance(watch.deadlock(op, [0], now), CollectiveMismatchError)
    watch.net.sent[(0, 5)] += 1           # rank 1 sent rank 0 a message of that tag after the word
    assert watch.deadlock(op, [0], now) is None


def test_one_word_or_an_old_word_is_not_enough():
    watch = _rank_one()
    _rank_zero_waits(watch, (GROUP, 2), times=1)
    op = _waiting_at(((0, 1, 2), 0))
    assert watch.deadlock(op, [0], now=watch.peer_waits[0].since) is None      # one probe: maybe in passing
    _rank_zero_waits(watch, (GROUP, 2), times=1)
    assert watch.deadlock(op, [0], now=watch.peer_waits[0].since + 10) is None  # older than 1.5 s
