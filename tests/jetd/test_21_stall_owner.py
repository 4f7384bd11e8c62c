"""A closed owner's states go in slices (issue 29, PROTOCOL.md 10.6): the FETCH_REMOVEs
of 3,000 states are cut by the clock, other peers are answered in between, each fetch
gets every FETCH_REMOVE once in byte order of key; meanwhile a routed SET_STATE to one of
those states is answered OWNER_GONE, and a peer adding one of the keys takes it over at
once (its FETCH_REMOVE first, then the FETCH_ADD). Sans-IO with the fake clock of
test_18: counts and order only."""

from __future__ import annotations

from test_18_clock_slices import ClockHarness

from jetwire import AddState
from jetwire import FetchAdd
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Message
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value

N = 3000
TAKEN = f"k{N - 1:05d}"  # the last key in byte order: still there after the first slices


def test_a_closed_owners_states_are_removed_in_slices() -> None:
    h = ClockHarness(0.0004)  # a 1 ms slice is over at the third reading of the clock
    owner, fetcher, other = h.connect(), h.connect(), h.connect()
    h.send_all(owner, *(AddState(i + 1, f"k{i:05d}", Value.of(i)) for i in range(N)))
    h.send_all(fetcher, FetchStates(1, "k"))
    assert fetcher.delivery is None
    h.recv(fetcher)
    h.daemon.disconnect(owner, h.now)
    events: list[Message] = list(h.recv(fetcher))
    per_call = [len(events)]
    answers: list[Response] = []
    rid = 100
    for turn in range(10_000):
        if not h.daemon.has_work:
            break
        rid += 1
        # Between two slices: a GET is answered; a routed SET to the gone owner's state
        # is answered OWNER_GONE (not routed to nobody); in the second turn another
        # peer adds a key that is still there.
        h.send(other, GetState(rid, "k00001"), SetState(rid + 50_000, TAKEN, Value.of(-1)))
        if turn == 1:
            h.send(other, AddState(9, TAKEN, Value.of("mine")))
        got = [m for m in h.recv(other) if isinstance(m, Response)]
        assert got, "the other peer is answered between two slices"
        answers += got
        h.work()
        new = h.recv(fetcher)
        per_call.append(len(new))
        events += new
    # Before the fix all 3,000 FETCH_REMOVEs went out in the disconnect call.
    assert per_call[0] < N // 4 and len([n for n in per_call if n]) >= 4
    removes = [e.key for e in events if isinstance(e, FetchRemove)]
    assert sorted(removes) == [f"k{i:05d}" for i in range(N)]  # each once
    others = [k for k in removes if k != TAKEN]
    assert others == sorted(others)  # byte order of key
    adds = [(i, e) for i, e in enumerate(events) if isinstance(e, FetchAdd)]
    assert [(e.key, e.value) for _, e in adds] == [(TAKEN, Value.of("mine"))]
    assert events.index(next(e for e in events if isinstance(e, FetchRemove) and e.key == TAKEN)) < adds[0][0]
    sets = [a for a in answers if a.id > 50_000]
    assert sets and all(a.status in (Status.OWNER_GONE, Status.OK) for a in sets)
    assert sets[0].status == Status.OWNER_GONE
    assert [a.status for a in answers if a.id == 9] == [Status.OK]
    assert set(h.daemon.registry.states) == {TAKEN.encode()} | {k for k in h.daemon.registry.states if k.startswith(b"$jet/")}
