"""Many requests in one read are cut by the clock too (issue 29): the frame loop ends
once the slice is over, and the rest of the connection's input waits for its next turn
of ``Daemon.work``. A sorted window's rows count against the slice (jetd/querying.py),
so a peer that pipelines 20 FETCH_QUERYs of 200-row windows no longer has them all
answered in one call into the core: other peers are answered in between, and every
window still ends exact. Sans-IO with the fake clock of test_18: counts and order only.
"""

from __future__ import annotations

from test_15_query_core import WindowView
from test_15_query_core import oracle_window
from test_15_query_core import player
from test_15_query_core import top
from test_18_clock_slices import ClockHarness

from jetd.connection import Connection
from jetwire import AddState
from jetwire import FetchQuery
from jetwire import FetchWindow
from jetwire import GetState
from jetwire import QueryEntry
from jetwire import QueryOnce
from jetwire import Response
from jetwire import Value

N = 2000
FETCHES = 20
ROWS = 200


def _players(h: ClockHarness) -> tuple[Connection, dict[str, Value]]:
    owner = h.connect()
    states = {f"players/{i:05d}": player("female" if i % 3 else "male", (i * 7919) % 1000) for i in range(N)}
    h.send_all(owner, *(AddState(i + 1, k, val) for i, (k, val) in enumerate(states.items())))
    h.recv(owner)
    return owner, states


def _seeded(h: ClockHarness, conn: Connection) -> None:
    """One fetch of the query first, its group seeded to the end (in slices)."""
    h.send(conn, FetchQuery(1, top(ROWS)))
    for _ in range(10_000):
        if conn.delivery is None:
            break
        h.recv(conn)
        h.work()
    h.recv(conn)
    assert conn.delivery is None


def test_pipelined_window_fetches_are_answered_a_slice_at_a_time() -> None:
    h = ClockHarness(0.0004)  # a 1 ms slice is over at the third reading of the clock
    _owner, states = _players(h)
    fan, other = h.connect(), h.connect()
    _seeded(h, fan)
    h.send(fan, *(FetchQuery(i + 2, top(ROWS)) for i in range(FETCHES)))
    views: dict[int, WindowView] = {}
    answered: list[int] = []

    def take() -> int:
        got = 0
        for message in h.recv(fan):
            if isinstance(message, Response):
                assert message.status == 0 and message.fetch_id is not None
                views[message.fetch_id] = WindowView(1)
                got += 1
            elif isinstance(message, FetchWindow) and message.fetch_id in views:
                views[message.fetch_id].apply(message)  # (not the seeding fetch's)
        return got

    answered.append(take())
    for _ in range(1_000):
        if len(views) == FETCHES:
            break
        # Another peer is answered between any two turns.
        h.send(other, GetState(7, "players/00001"))
        [answer] = h.recv(other)
        assert isinstance(answer, Response) and answer.value == states["players/00001"]
        h.work()
        answered.append(take())
    assert sum(answered) == FETCHES
    # Before the fix all 20 windows (4,000 rows) went out in the first call.
    assert answered[0] < FETCHES // 2
    assert max(answered) <= 5
    expected = oracle_window(states, 1, ROWS)
    for view in views.values():
        assert view.rows == expected
    assert not fan.stalled and not fan.rest


def test_pipelined_sorted_query_once_answers_are_cut_by_the_clock() -> None:
    h = ClockHarness(0.0004)
    _owner, states = _players(h)
    fan = h.connect()
    _seeded(h, fan)  # the group stays (a fetch of it lives): QUERY_ONCE reads it
    h.send(fan, *(QueryOnce(i + 2, top(ROWS)) for i in range(FETCHES)))
    per_call: list[int] = []
    entries: dict[int, list[tuple[str, Value]]] = {}
    oks = 0
    for _ in range(1_000):
        done = 0
        for message in h.recv(fan):
            if isinstance(message, QueryEntry):
                entries.setdefault(message.id, []).append((message.key, message.value))
            elif isinstance(message, Response):
                assert message.status == 0
                done += 1
        per_call.append(done)
        oks += done
        if oks == FETCHES:
            break
        h.work()
    assert oks == FETCHES
    assert per_call[0] < FETCHES // 2 and max(per_call) <= 5
    expected = oracle_window(states, 1, ROWS)
    assert all(rows == expected for rows in entries.values()) and len(entries) == FETCHES
