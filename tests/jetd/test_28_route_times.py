"""RouteTimes (jetd/base.py, issue 28): the fast path counts OKs of one bucket in a row
in a native integer; every reader (``ok``, ``fast_ok``, ``histogram``) sees them all. The
frame loop hands over the OKs of one deadline in a row at once (a pipelined batch's):
the histogram is the same as one observation per OK."""

from __future__ import annotations

import random
from bisect import bisect_right

from inmemory import MemoryPeers

from jetd.base import ROUTE_BUCKETS
from jetd.base import RouteTimes
from jetd.config import Config
from jetd.core import Daemon
from jetwire import AddState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value


def test_runs_of_one_bucket_are_counted_whatever_reads_them() -> None:
    times, expected = RouteTimes(5.0), [0] * (len(ROUTE_BUCKETS) + 1)
    rng = random.Random(28)
    for round_ in range(2_000):
        latency = rng.choice([rng.uniform(0, 0.2), rng.uniform(0, 0.001), rng.uniform(0.1, 6.0),
                              rng.choice(ROUTE_BUCKETS) * rng.choice([0.999, 1.001])])
        for _ in range(rng.choice([1, 1, 2, 7, 300])):  # runs, some past CPython's cached ints
            times.observe_ok(latency - 5.0)  # the deadline is the start plus the 5 s timeout
            expected[bisect_right(ROUTE_BUCKETS, latency)] += 1
        if round_ % 3 == 0:
            times.observe(0, latency - 5.0)  # the careful way's OK, between fast ones
            expected[bisect_right(ROUTE_BUCKETS, latency)] += 1
        reader = rng.randrange(4)
        if reader == 0:
            assert times.ok == expected
        elif reader == 1:
            assert times.fast_ok() == sum(expected) - times.careful_ok
        elif reader == 2:
            assert times.histogram(0)[0][-1] == sum(expected)
    assert times.ok == expected
    assert times.histogram(0)[0][-1] == sum(expected)


def test_a_run_is_seen_before_any_other_bucket_comes() -> None:
    times = RouteTimes(1.0)
    for _ in range(1_000):
        times.observe_ok(0.00002 - 1.0)  # 20 us: the first bucket
    assert times.fast_ok() == 1_000
    assert times.ok[0] == 1_000
    cumulative, total = times.histogram(0)
    assert cumulative[0] == 1_000 and cumulative[-1] == 1_000
    assert abs(total - 0.02) < 1e-9


def test_a_count_observes_like_that_many_single_calls() -> None:
    one, many = RouteTimes(5.0), RouteTimes(5.0)
    for latency, count in [(0.0003, 7), (0.0003, 1), (0.2, 300), (0.00002, 0), (6.0, 2), (0.0003, 4)]:
        many.observe_ok(latency - 5.0, count)
        for _ in range(count):
            one.observe_ok(latency - 5.0)
    assert many.ok == one.ok and many.fast_ok() == one.fast_ok() == 314
    assert abs(many.histogram(0)[1] - one.histogram(0)[1]) < 1e-9


def test_oks_answered_in_one_read_are_timed_from_each_request() -> None:
    """Three pipelined batches of SETs, sent at 0 s, 0.002 s and 0.035 s, answered
    together at 0.041 s, in an order that mixes the batches: each OK counts in the
    bucket of its own request's wait (41, 39 and 6 ms)."""
    peers = MemoryPeers(Daemon(Config()))
    owner, client = peers.connect(), peers.connect()
    peers.send(owner, AddState(1, "a", Value.of(0)))
    peers.recv(owner)
    routed: list[int] = []
    for start, batch in [(0.0, 5), (0.002, 3), (0.035, 4)]:
        peers.now = start
        peers.send(client, *(SetState(100 + len(routed) + i, "a", Value.of(i)) for i in range(batch)))
        requests = peers.recv(owner)
        assert all(isinstance(r, SetState) for r in requests) and len(requests) == batch
        routed += [r.id for r in requests if isinstance(r, SetState) and r.id is not None]
    peers.now = 0.041
    order = routed[8:10] + routed[:5] + routed[5:8] + routed[10:]  # runs of 2, 5, 3, 2
    peers.send(owner, *(Response(oid, Status.OK, Value.of(1)) for oid in order))
    assert len(peers.recv(client)) == 12
    times = peers.daemon.route_times
    assert times.fast_ok() == 12 and times.careful_ok == 0
    cumulative, total = times.histogram(0)
    bucket = {b: i for i, b in enumerate(ROUTE_BUCKETS)}
    assert cumulative[bucket[0.005]] == 0
    assert cumulative[bucket[0.01]] == 4  # the last batch: 6 ms
    assert cumulative[bucket[0.025]] == 4
    assert cumulative[bucket[0.05]] == 12  # 39 and 41 ms
    assert abs(total - (5 * 0.041 + 3 * 0.039 + 4 * 0.006)) < 1e-9
