"""RouteTimes (jetd/base.py, issue 28): the fast path counts OKs of one bucket in a row
in a native integer; every reader (``ok``, ``fast_ok``, ``histogram``) sees them all."""

from __future__ import annotations

import random
from bisect import bisect_right

from jetd.base import ROUTE_BUCKETS
from jetd.base import RouteTimes


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
