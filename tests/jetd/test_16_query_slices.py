"""A large query does not stall other peers (PROTOCOL.md 14.5): a new group is seeded, and
an unsorted fetch's initial entries are sent, in slices from ``Daemon.work``, with other
peers served in between, and the view stays exact (PROTOCOL.md 10.5, 14.3) whatever
changes between the slices. Checked in the sans-IO core against an oracle."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from test_15_query_core import FEMALE
from test_15_query_core import PLAYERS
from test_15_query_core import Harness
from test_15_query_core import WindowView
from test_15_query_core import oracle_window
from test_15_query_core import player
from test_15_query_core import top

from jetwire import QUERY_METHODS
from jetwire import QUERY_NODES
from jetwire import AddMethod
from jetwire import AddState
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchMethod
from jetwire import FetchNode
from jetwire import FetchQuery
from jetwire import FetchRemove
from jetwire import FetchUnmatch
from jetwire import FetchWindow
from jetwire import GetState
from jetwire import Message
from jetwire import NotifyState
from jetwire import PathMatcher
from jetwire import PathOp
from jetwire import Query
from jetwire import QueryEntry
from jetwire import QueryOnce
from jetwire import RemoveMethod
from jetwire import RemoveState
from jetwire import Response
from jetwire import Value
from jetwire import encode

N = 6000  # well above one slice of seeding (1,024) and of initial entries (2,048)


def _fill(h: Harness, n: int = N) -> tuple[Any, dict[str, Value]]:
    owner = h.connect()
    states = {f"players/{i:05d}": player("female" if i % 3 else "male", i % 500) for i in range(n)}
    h.send(owner, *(AddState(i, k, v) for i, (k, v) in enumerate(states.items())))
    h.recv(owner)
    return owner, states


def _females(states: dict[str, Value]) -> dict[str, Value]:
    return {k: v for k, v in states.items() if k.startswith("players/") and json.loads(v.data)["gender"] == "female"}


def test_other_peers_are_answered_while_a_large_query_is_seeded() -> None:
    h = Harness()
    _owner, _states = _fill(h)
    fan, health = h.connect(), h.connect()
    h.send(fan, FetchQuery(1, top(10)))
    [ok] = h.recv(fan)
    assert isinstance(ok, Response) and ok.fetch_id is not None
    assert fan.stalled  # the seeding goes on in slices
    # Another peer's request is answered before the query's first entry.
    h.send(health, GetState(7, "players/00001"))
    [answer] = h.recv(health)
    assert isinstance(answer, Response) and answer.id == 7 and answer.value is not None
    slices = 0
    events: list[Message] = []
    while fan.delivery is not None:
        h.daemon.work(0.0)
        events += h.recv(fan)
        slices += 1
    assert slices >= N // 1024
    [window] = events
    assert isinstance(window, FetchWindow) and window.size == 10


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**32), st.booleans(), st.booleans())
def test_views_stay_exact_whatever_changes_between_slices(seed: int, sorted_query: bool, shared: bool) -> None:
    """Adds, notifies and removes land between the slices of a new query fetch (and of a
    second fetch of the same query that joins the seeding group): each view, rebuilt
    from its events alone, equals the oracle at the end."""
    rng = random.Random(seed)
    h = Harness()
    owner, states = _fill(h)
    fan = h.connect()
    query = top(7, start=3) if sorted_query else Query((PLAYERS,), (FEMALE,))
    h.send(fan, FetchQuery(1, query))
    fids = [h.recv(fan)[0].fetch_id]  # type: ignore[attr-defined]
    joiner = h.connect()
    if shared:
        h.send(joiner, FetchQuery(1, query))
        fids.append(h.recv(joiner)[0].fetch_id)  # type: ignore[attr-defined]
    conns = [fan, joiner] if shared else [fan]
    windows = {fid: WindowView(3) for fid in fids}
    views: dict[int, dict[str, Value]] = {fid: {} for fid in fids}
    step = 100_000

    def apply(events: list[Message]) -> None:
        for event in events:
            if isinstance(event, FetchWindow):
                windows[event.fetch_id].apply(event)
            elif isinstance(event, FetchAdd):
                assert event.key not in views[event.fetch_id], "ADD of a key the view has"
                views[event.fetch_id][event.key] = event.value
            elif isinstance(event, FetchChange):
                assert event.key in views[event.fetch_id], "CHANGE of a key the view lacks"
                views[event.fetch_id][event.key] = event.value
            elif isinstance(event, (FetchUnmatch, FetchRemove)):
                assert views[event.fetch_id].pop(event.key) is not None

    for _ in range(400):
        if all(conn.delivery is None for conn in conns) and rng.random() < 0.7:
            break
        for _change in range(rng.randrange(4)):
            step += 1
            key = f"players/{rng.randrange(N + 200):05d}"
            if key in states and rng.random() < 0.2:
                del states[key]
                h.send(owner, RemoveState(step, key))
            else:
                value = player(rng.choice(["female", "male"]), rng.randrange(600))
                known = key.encode() in h.daemon.registry.states
                states[key] = value
                h.send(owner, NotifyState(step, key, value) if known else AddState(step, key, value))
            h.recv(owner)
        h.daemon.work(0.0)
        for conn in conns:
            apply(h.recv(conn))
    for _ in range(200):
        h.daemon.work(0.0)
        for conn in conns:
            apply(h.recv(conn))
        if all(conn.delivery is None for conn in conns):
            break
    assert all(conn.delivery is None and not conn.stalled for conn in conns)
    for fid in fids:
        if sorted_query:
            assert windows[fid].rows == oracle_window(states, 3, 9)
        else:
            assert views[fid] == _females(states)


def test_initial_entries_come_in_key_order_with_methods_and_nodes_between() -> None:
    h = Harness()
    owner, _states = _fill(h, 5000)
    h.send(owner, AddMethod(1, "players/01234/kick"), AddMethod(2, "players/04999/zz"))
    h.recv(owner)
    fan = h.connect()
    everything = Query((PathMatcher(PathOp.STARTS_WITH, ("players/",)),), flags=QUERY_METHODS | QUERY_NODES)
    h.send(fan, FetchQuery(1, everything))
    events = h.recv(fan)[1:]
    while fan.delivery is not None:
        h.daemon.work(0.0)
        events += h.recv(fan)
    # Between slices nothing changed: one entry per state, method and node, in key order.
    keys = [(e.key, 0 if isinstance(e, FetchNode) else 1) for e in events]  # type: ignore[attr-defined]
    assert keys == sorted(keys)
    assert sum(isinstance(e, FetchAdd) for e in events) == 5000
    assert [e.key for e in events if isinstance(e, FetchMethod)] == ["players/01234/kick", "players/04999/zz"]
    assert [e.key for e in events if isinstance(e, FetchNode)] == ["players/01234", "players/04999"]


def test_a_method_added_ahead_of_the_slices_is_listed_once() -> None:
    h = Harness()
    owner, _states = _fill(h, 5000)
    fan = h.connect()
    h.send(fan, FetchQuery(1, Query((PathMatcher(PathOp.STARTS_WITH, ("players/",)),), flags=QUERY_METHODS)))
    [ok] = h.recv(fan)
    events: list[Message] = []
    fetch = fan.query_fetches[ok.fetch_id]  # type: ignore[attr-defined]
    while fetch.cursor is None:  # the group is seeded, and the first slice is out
        h.daemon.work(0.0)
        events += h.recv(fan)
    assert "00000" < fetch.cursor.decode() < "players/04000"
    h.send(owner, AddMethod(1, "players/04000/late"), AddMethod(2, "players/00000/early"))
    h.recv(owner)
    h.send(owner, RemoveMethod(3, "players/00000/early"))
    h.recv(owner)
    while fan.delivery is not None:
        h.daemon.work(0.0)
        events += h.recv(fan)
    methods = [(e.key, e.action) for e in events if isinstance(e, FetchMethod)]
    # "late" is above the cursor: listed once in its place; "early" was passed: its add
    # and remove are held and follow the last initial entry.
    assert methods == [("players/04000/late", 1), ("players/00000/early", 1), ("players/00000/early", 2)]
    assert isinstance(events[-1], FetchMethod) and events[-1].key == "players/00000/early"


@pytest.mark.parametrize("sorted_query", [False, True])
def test_query_once_over_many_states_is_answered_in_slices(sorted_query: bool) -> None:
    h = Harness()
    _owner, states = _fill(h)
    asker, health = h.connect(), h.connect()
    query = top(20, start=5) if sorted_query else Query((PLAYERS,), (FEMALE,))
    h.send(asker, QueryOnce(9, query))
    messages = h.recv(asker)
    assert asker.stalled
    h.send(health, GetState(1, "players/00002"))
    assert isinstance(h.recv(health)[0], Response)
    while asker.delivery is not None:
        h.daemon.work(0.0)
        messages += h.recv(asker)
    *entries, ok = messages
    assert isinstance(ok, Response) and ok.id == 9 and ok.ok
    got = [(e.key, e.value) for e in entries if isinstance(e, QueryEntry)]
    assert len(got) == len(entries)
    if sorted_query:
        assert got == oracle_window(states, 5, 24)
    else:
        assert got == sorted(_females(states).items())
    # The one-shot group is gone once answered.
    assert not h.daemon.queries.index.by_signature


def test_a_closing_fetcher_drops_its_seeding_group() -> None:
    h = Harness()
    _fill(h)
    fan = h.connect()
    h.send(fan, FetchQuery(1, top(10)), QueryOnce(2, top(10)))
    h.recv(fan)
    assert fan.stalled and h.daemon.queries.index.by_signature
    h.daemon.disconnect(fan, 0.0, "test")
    assert not h.daemon.queries.index.by_signature
    h.daemon.work(0.0)  # nothing left to do, and no error


def test_a_window_above_the_fetchers_max_body_is_split_not_fatal() -> None:
    """PROTOCOL.md 14.2: a FETCH_WINDOW that would exceed the receiver's max_body goes
    as several, each with the window's size; applied in turn they give the window."""
    from jetwire import Info

    h = Harness()
    owner, states = _fill(h, 300)
    fan = h.connect()
    h.send(fan, Info("small", 256))
    h.send(fan, FetchQuery(1, top(20)))
    ok, *events = h.recv(fan)
    assert isinstance(ok, Response) and ok.ok and not fan.closing
    assert len(events) > 1 and all(isinstance(e, FetchWindow) and e.size == 20 for e in events)
    assert all(len(encode(e)) - 5 <= 256 for e in events)
    view = WindowView(1)
    for event in events:
        view.apply(event)  # type: ignore[arg-type]
    assert view.rows == oracle_window(states, 1, 20)
    # A change that moves every row is split the same way.
    states["players/00001"] = player("female", 10_000)
    h.send(owner, NotifyState(None, "players/00001", states["players/00001"]))
    h.recv(owner)
    events = h.recv(fan)
    assert len(events) > 1 and not fan.closing
    for event in events:
        view.apply(event)  # type: ignore[arg-type]
    assert view.rows == oracle_window(states, 1, 20)
