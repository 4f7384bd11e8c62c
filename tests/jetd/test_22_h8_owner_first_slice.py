"""A closed owner's first slice is bounded too (issue 29, PROTOCOL.md 10.6): its keys are
put in byte order a run at a time, each run counted by the scheduler, instead of all of
them heapified in the call that closes it; the FETCH_REMOVEs still go out in byte order
of key, each once. Sans-IO with the fake clock of test_18 (it cannot see the C sort, so
the test reads how many keys the registry has put in order after each call)."""

from __future__ import annotations

from itertools import pairwise

from test_18_clock_slices import ClockHarness

from jetwire import AddState
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import Message
from jetwire import Value

N = 8192  # 8 runs of jetd.registry.LEAVE_RUN


def test_a_closed_owners_keys_are_ordered_in_slices() -> None:
    h = ClockHarness(0.0004)  # a 1 ms slice is over at the third reading of the clock
    owner, fetcher = h.connect(), h.connect()
    # Added in an order that is not byte order, so that the runs must be merged.
    h.send_all(owner, *(AddState(i + 1, f"k{(i * 7919) % N:05d}", Value.of(i)) for i in range(N)))
    h.send_all(fetcher, FetchStates(1, "k"))
    h.recv(fetcher)
    h.daemon.disconnect(owner, h.now)
    registry = h.daemon.registry
    # Before the fix the first call heapified all N keys (``leaving`` held a plain list).
    ordered = [registry.leaving[owner].sorted]
    assert 0 < ordered[0] <= N // 2
    events: list[Message] = list(h.recv(fetcher))
    for _ in range(10_000):
        if not h.daemon.has_work:
            break
        h.work()
        events += h.recv(fetcher)
        if owner in registry.leaving:
            ordered.append(registry.leaving[owner].sorted)
    steps = [b - a for a, b in pairwise(ordered)]
    assert max(steps) <= N // 2 and ordered[-1] == N
    removes = [e.key for e in events if isinstance(e, FetchRemove)]
    assert removes == sorted(f"k{i:05d}" for i in range(N))  # each once, in byte order
    assert not registry.leaving
