"""Query fetches and one-shot queries in the sans-IO core (PROTOCOL.md 14), checked
against an oracle that recomputes every answer from the states: the filter life cycle,
sorted windows applied from their events, methods, nodes, slow consumers, limits."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from inmemory import MemoryPeers

from jetd.config import Config
from jetd.core import Connection
from jetd.core import Daemon
from jetwire import FEATURE_QUERIES
from jetwire import QUERY_METHODS
from jetwire import QUERY_NODES
from jetwire import SORT_DESCENDING
from jetwire import Action
from jetwire import AddMethod
from jetwire import AddState
from jetwire import EntryKind
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchMethod
from jetwire import FetchNode
from jetwire import FetchQuery
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import FetchUnmatch
from jetwire import FetchWindow
from jetwire import FilterOp
from jetwire import NotifyState
from jetwire import PathMatcher
from jetwire import PathOp
from jetwire import Query
from jetwire import QueryEntry
from jetwire import QueryOnce
from jetwire import RemoveMethod
from jetwire import RemoveState
from jetwire import Response
from jetwire import SortBy
from jetwire import Status
from jetwire import Unfetch
from jetwire import Value
from jetwire import ValueFilter
from jetwire import ValueType
from jetwire import encode


class Harness(MemoryPeers):
    """A Daemon with in-memory peers that announces queries (INFO minor 3)."""

    def __init__(self, **settings: object) -> None:
        super().__init__(Daemon(Config(**settings)))  # type: ignore[arg-type]

    def connect(self, address: str = "mem") -> Connection:
        conn = super().connect(address)
        info = self.infos[conn.conn_id]
        assert info.features & FEATURE_QUERIES and info.minor == 3
        return conn


def player(gender: str, score: Any) -> Value:
    return Value(ValueType.JSON, json.dumps({"gender": gender, "score": score}).encode())


FEMALE = ValueFilter(FilterOp.EQ, Value.of("female"), "gender")
PLAYERS = PathMatcher(PathOp.STARTS_WITH, ("players/",))


def top(n: int, *, start: int = 1) -> Query:
    return Query((PLAYERS,), (FEMALE,), SortBy.FIELD, "score", SORT_DESCENDING, start, start + n - 1)


def oracle_window(states: dict[str, Value], query_from: int, query_to: int) -> list[tuple[str, Value]]:
    rows = []
    for key, value in states.items():
        doc = json.loads(value.data)
        if key.startswith("players/") and doc.get("gender") == "female" and "score" in doc:
            # PROTOCOL.md 14.1, order across types: null < numbers < strings.
            score = doc["score"]
            rank = 0 if score is None else 3 if isinstance(score, str) else 2
            rows.append(((rank, score, key.encode()), key, value))
    rows.sort(reverse=True)
    return [(key, value) for _, key, value in rows[query_from - 1 : query_to]]


class WindowView:
    """A receiver that applies FETCH_WINDOW events to an array (PROTOCOL.md 14.2)."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.rows: list[tuple[str, Value]] = []
        self.updates = 0

    def apply(self, event: FetchWindow) -> None:
        self.updates += 1
        rows = self.rows + [("", Value.of(None))] * max(0, event.size - len(self.rows))
        indexes = [e.index for e in event.entries]
        assert indexes == sorted(indexes)
        for entry in event.entries:
            assert self.start <= entry.index < self.start + event.size
            rows[entry.index - self.start] = (entry.key, entry.value)
        self.rows = rows[: event.size]


def test_scoreboard_window_follows_score_changes() -> None:
    h = Harness()
    owner, fan = h.connect(), h.connect()
    states = {f"players/p{i}": player("female" if i % 2 else "male", i) for i in range(30)}
    h.send(owner, *(AddState(i, k, v) for i, (k, v) in enumerate(states.items())))
    h.recv(owner)
    h.send(fan, FetchQuery(1, top(5)))
    ok, initial = h.recv(fan)
    assert isinstance(ok, Response) and ok.fetch_id is not None
    assert isinstance(initial, FetchWindow) and initial.size == 5
    view = WindowView(1)
    view.apply(initial)
    assert view.rows == oracle_window(states, 1, 5)
    # A score change below the window sends nothing; one into it lists the shifted rows only.
    states["players/p1"] = player("female", 2)
    h.send(owner, NotifyState(None, "players/p1", states["players/p1"]))
    assert h.recv(fan) == []
    states["players/p1"] = player("female", 28)
    h.send(owner, NotifyState(None, "players/p1", states["players/p1"]))
    [event] = h.recv(fan)
    assert isinstance(event, FetchWindow) and [e.index for e in event.entries] == [2, 3, 4, 5]
    view.apply(event)
    assert view.rows == oracle_window(states, 1, 5)
    # A male player never shows; a female who stops matching leaves.
    states["players/p29"] = player("male", 100)
    h.send(owner, NotifyState(4, "players/p29", states["players/p29"]))
    for message in h.recv(fan):
        view.apply(message)  # type: ignore[arg-type]
    assert view.rows == oracle_window(states, 1, 5)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 6), st.integers(1, 6), st.booleans())
def test_windows_and_filters_match_the_oracle(seed: int, start: int, length: int, pause: bool) -> None:
    """Random adds, notifies (scores, genders, non-numbers) and removes: every window
    view and every filtered unsorted view equals the oracle after each change."""
    rng = random.Random(seed)
    h = Harness()
    owner, fan = h.connect(), h.connect()
    h.send(fan, FetchQuery(1, top(length, start=start)), FetchQuery(2, Query((PLAYERS,), (FEMALE,))))
    first = h.recv(fan)
    window_fid, plain_fid = first[0].fetch_id, first[2].fetch_id  # type: ignore[attr-defined]
    view = WindowView(start)
    view.apply(first[1])  # type: ignore[arg-type]
    plain: dict[str, Value] = {}
    states: dict[str, Value] = {}
    paused = False
    for step in range(60):
        key = f"players/{rng.randrange(12)}"
        roll = rng.random()
        if key in states and roll < 0.15:
            del states[key]
            h.send(owner, RemoveState(step, key))
        else:
            score: Any = rng.choice([rng.randrange(8), rng.random() * 8, "x", None])
            value = player(rng.choice(["female", "female", "male"]), score)
            states[key] = value
            h.send(owner, NotifyState(step, key, value) if _known(h, key) else AddState(step, key, value))
        h.recv(owner)
        if paused and step % 17 == 11:
            events = h.drain(fan)
            paused = False
        elif paused:
            continue
        else:
            events = h.recv(fan)  # the IO layer writes out a turn's output before it pauses
        for event in events:
            if isinstance(event, FetchWindow):
                assert event.fetch_id == window_fid
                view.apply(event)
            elif isinstance(event, FetchAdd):
                assert event.fetch_id == plain_fid and event.key not in plain
                plain[event.key] = event.value
            elif isinstance(event, FetchChange):
                assert event.key in plain
                plain[event.key] = event.value
            elif isinstance(event, (FetchUnmatch, FetchRemove)):
                assert plain.pop(event.key) is not None
        assert view.rows == oracle_window(states, start, start + length - 1)
        females = {k: v for k, v in states.items() if json.loads(v.data)["gender"] == "female"}
        assert plain == females
        if pause and step % 17 == 3:
            h.daemon.pause(fan, 1 << 20)
            paused = True


def _known(h: Harness, key: str) -> bool:
    return key.encode() in h.daemon.registry.states


def test_filter_life_cycle_events_and_reasons() -> None:
    h = Harness()
    owner, fan = h.connect(), h.connect()
    h.send(owner, AddState(1, "players/a", player("male", 1)))
    h.send(fan, FetchQuery(2, Query((PLAYERS,), (ValueFilter(FilterOp.GE, Value.of(10), "score"),))))
    [ok] = h.recv(fan)
    fid = ok.fetch_id  # type: ignore[attr-defined]
    steps = [
        (NotifyState(3, "players/a", player("male", 12)), FetchAdd),
        (NotifyState(4, "players/a", player("male", 15)), FetchChange),
        (NotifyState(5, "players/a", player("male", "high")), FetchUnmatch),  # a string never orders
        (NotifyState(6, "players/a", player("male", 11)), FetchAdd),
        (RemoveState(7, "players/a"), FetchRemove),
    ]
    for request, expected in steps:
        h.send(owner, request)
        [event] = h.recv(fan)
        assert type(event) is expected and event.fetch_id == fid  # type: ignore[attr-defined]
    h.recv(owner)


def test_events_a_request_causes_precede_its_response() -> None:
    h = Harness()
    owner = h.connect()
    h.send(owner, FetchQuery(1, Query((PLAYERS,))), AddState(2, "players/x", player("f", 1)))
    messages = h.recv(owner)
    assert [type(m) for m in messages] == [Response, FetchAdd, Response]


def test_methods_and_nodes() -> None:
    h = Harness()
    owner, fan = h.connect(), h.connect()
    h.send(owner, AddState(1, "plant/line1/temp", Value.of(1)), AddMethod(2, "plant/reset"))
    h.recv(owner)
    query = Query((PathMatcher(PathOp.STARTS_WITH, ("plant",)),), flags=QUERY_METHODS | QUERY_NODES)
    h.send(fan, FetchQuery(3, query))
    ok, *initial = h.recv(fan)
    fid = ok.fetch_id  # type: ignore[attr-defined]
    assert initial == [
        FetchNode(fid, Action.ADD, "plant"),
        FetchNode(fid, Action.ADD, "plant/line1"),
        FetchAdd(fid, "plant/line1/temp", Value.of(1)),
        FetchMethod(fid, Action.ADD, "plant/reset"),
    ]
    h.send(owner, AddState(4, "plant/line2/temp", Value.of(2)))
    assert h.recv(fan) == [FetchNode(fid, Action.ADD, "plant/line2"), FetchAdd(fid, "plant/line2/temp", Value.of(2))]
    h.send(owner, RemoveState(5, "plant/line1/temp"), RemoveMethod(6, "plant/reset"))
    assert h.recv(fan) == [
        FetchRemove(fid, "plant/line1/temp", Value.of(1)),
        FetchNode(fid, Action.REMOVE, "plant/line1"),
        FetchMethod(fid, Action.REMOVE, "plant/reset"),
    ]
    # The owner leaves: its last state goes, and with it every node.
    h.daemon.disconnect(owner, 0.0)
    assert h.recv(fan) == [
        FetchRemove(fid, "plant/line2/temp", Value.of(2)),
        FetchNode(fid, Action.REMOVE, "plant/line2"),
        FetchNode(fid, Action.REMOVE, "plant"),
    ]
    h.send(fan, Unfetch(7, fid))
    assert h.recv(fan) == [Response(7)]
    assert not h.daemon.queries.index and h.daemon.queries.nodes is None


def test_query_once_answers_entries_then_ok() -> None:
    h = Harness()
    owner, asker = h.connect(), h.connect()
    h.send(owner, *(AddState(i, f"players/p{i}", player("female", i)) for i in range(5)), AddMethod(9, "players/kick"))
    h.recv(owner)
    h.send(asker, QueryOnce(1, Query((PLAYERS,), flags=QUERY_METHODS | QUERY_NODES)))
    messages = h.recv(asker)
    assert messages[-1] == Response(1)
    entries = [(m.kind, m.key) for m in messages[:-1]]  # type: ignore[attr-defined]
    assert entries == [(EntryKind.METHOD, "players/kick")] + [(EntryKind.STATE, f"players/p{i}") for i in range(5)]
    h.send(asker, QueryOnce(2, top(2)))
    messages = h.recv(asker)
    assert [m.key for m in messages[:-1]] == ["players/p4", "players/p3"]  # type: ignore[attr-defined]
    assert all(isinstance(m, QueryEntry) and m.id == 2 for m in messages[:-1])
    assert not h.daemon.queries.index  # nothing kept


@pytest.mark.parametrize(
    ("settings", "query", "status"),
    [
        ({}, Query((PathMatcher(PathOp.EQUALS, ("a", "b")),)), Status.INVALID_QUERY),
        ({"max_query_terms": 2}, Query((PathMatcher(PathOp.EQUALS_ONE_OF, ("a", "b")),)), Status.LIMIT_EXCEEDED),
        ({"max_query_size": 20}, Query((PathMatcher(PathOp.EQUALS, ("a" * 20,)),)), Status.TOO_LARGE),
        ({"max_window": 5}, top(6), Status.LIMIT_EXCEEDED),
    ],
)
def test_bad_queries_get_a_clear_error_and_the_connection_stays(settings: dict[str, int], query: Query, status: Status) -> None:
    h = Harness(**settings)
    conn = h.connect()
    h.send(conn, FetchQuery(1, query), QueryOnce(2, query), FetchStates(3, ""))
    first, second, third = h.recv(conn)
    assert first.status == second.status == status and first.message  # type: ignore[attr-defined]
    assert third.ok  # type: ignore[attr-defined]


def test_malformed_query_is_answered_malformed() -> None:
    h = Harness()
    conn = h.connect()
    frame = bytearray(encode(FetchQuery(1, Query((PLAYERS,)))))
    frame[11 + 1] = 0x09  # unknown path matcher op
    h.daemon.receive_data(conn, bytes(frame), 0.0)
    [answer] = h.recv(conn)
    assert answer.status == Status.MALFORMED and "op" in answer.message  # type: ignore[attr-defined]


def test_query_fetches_count_against_the_fetch_limit() -> None:
    h = Harness(max_fetches_per_connection=2)
    conn = h.connect()
    h.send(conn, FetchStates(1, ""), FetchQuery(2, Query()), FetchQuery(3, Query()), FetchStates(4, "x"))
    answers = [m for m in h.recv(conn) if isinstance(m, Response)]
    assert [a.status for a in answers] == [Status.OK, Status.OK, Status.LIMIT_EXCEEDED, Status.LIMIT_EXCEEDED]


def test_paused_sorted_fetch_catches_up_with_one_whole_window() -> None:
    h = Harness()
    owner, fan = h.connect(), h.connect()
    states = {f"players/p{i}": player("female", i) for i in range(10)}
    h.send(owner, *(AddState(i, k, v) for i, (k, v) in enumerate(states.items())))
    h.send(fan, FetchQuery(1, top(3)))
    view = WindowView(1)
    view.apply(h.recv(fan)[1])  # type: ignore[arg-type]
    h.daemon.pause(fan, 1 << 20)
    for i in range(200):
        key = f"players/p{i % 10}"
        states[key] = player("female", (i * 7) % 23)
        h.send(owner, NotifyState(None, key, states[key]))
    assert not fan.pending  # nothing queued per change while paused
    [event] = h.drain(fan)
    assert isinstance(event, FetchWindow) and [e.index for e in event.entries] == [1, 2, 3]
    view.apply(event)
    assert view.rows == oracle_window(states, 1, 3)


def test_two_fetchers_of_one_query_share_one_group() -> None:
    h = Harness()
    a, b = h.connect(), h.connect()
    h.send(a, FetchQuery(1, top(10)))
    h.send(b, FetchQuery(1, top(5, start=3)))
    assert len(h.daemon.queries.index.by_signature) == 1
    h.daemon.disconnect(a, 0.0)
    h.send(b, Unfetch(2, h.recv(b)[0].fetch_id))  # type: ignore[attr-defined]
    assert not h.daemon.queries.index
