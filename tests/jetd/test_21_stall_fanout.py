"""The fan-out of a *request* to many fetches is sliced too (issue 29): ADD_STATE's
FETCH_ADD, NOTIFY_STATE's FETCH_CHANGE and REMOVE_STATE's FETCH_REMOVE go out a slice at
a time, other peers are answered in between, and the request's OK follows the last
event (PROTOCOL.md 10.5, "Events before the OK"). Sans-IO with the fake clock of
test_18: counts and order only."""

from __future__ import annotations

import pytest
from test_18_clock_slices import ClockHarness
from test_20_sched_fanout import CONNS
from test_20_sched_fanout import PER_CONN
from test_20_sched_fanout import _changes
from test_20_sched_fanout import _setup

from jetwire import AddState
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchRemove
from jetwire import GetState
from jetwire import Message
from jetwire import NotifyState
from jetwire import RemoveState
from jetwire import Response
from jetwire import Value

CASES = {
    "ADD_STATE": (AddState(77, "k1", Value.of(5)), FetchAdd, "k1"),
    "NOTIFY_STATE": (NotifyState(77, "k0", Value.of(5)), FetchChange, "k0"),
    "REMOVE_STATE": (RemoveState(77, "k0"), FetchRemove, "k0"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_requests_fan_out_is_sliced_and_its_ok_follows_the_last_event(case: str) -> None:
    request, event_type, key = CASES[case]
    h = ClockHarness(0.0004)  # a 1 ms slice is over at the third reading of the clock
    owner, fetchers, fids = _setup(h)
    other = h.connect()
    h.send(owner, request, GetState(78, "k0"))
    seen: dict[int, list[Message]] = {}
    per_call = [_changes(h, fetchers, seen)]
    owner_got = h.recv(owner)
    ok_turn = 0 if owner_got else -1
    for turn in range(1, 10_000):
        if not h.daemon.has_work:
            break
        h.send(other, GetState(9, "k0" if case != "REMOVE_STATE" else "nothing"))
        assert isinstance(h.recv(other)[0], Response)  # answered between any two slices
        h.work()
        per_call.append(_changes(h, fetchers, seen))
        got = h.recv(owner)
        if got and ok_turn < 0:
            ok_turn = turn
        owner_got += got
    total = CONNS * PER_CONN
    # Before the fix the first call sent all 4,000 events.
    assert per_call[0] < total // 2
    assert len([n for n in per_call if n]) >= 4
    # Every fetch got the event once; the OK (then the GET's answer) came in the turn
    # the last events went out, never before.
    assert sorted(seen) == sorted(fids)
    assert all(len(events) == 1 and isinstance(events[0], event_type) and events[0].key == key
               for events in seen.values())
    last_events_turn = max(i for i, n in enumerate(per_call) if n)
    assert ok_turn == last_events_turn
    answers = [m for m in owner_got if isinstance(m, Response)]
    assert [a.id for a in answers] == [77, 78] and answers[0].status == 0
