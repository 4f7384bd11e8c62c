"""Slices of work end by the clock (issue 29, jetd/scheduler.py): with a fake clock, a
slice of initial adds, of a query's seeding or of route timeouts ends once the clock
passes the bound, long before the item ceiling; ``Daemon.work`` serves the woken
connections round-robin, one turn lasting about a slice; and no work is lost or
duplicated: every view stays exact. Sans-IO: the clock is the only time source."""

from __future__ import annotations

import json

import pytest
from inmemory import MemoryPeers
from test_15_query_core import PLAYERS
from test_15_query_core import WindowView
from test_15_query_core import oracle_window
from test_15_query_core import player
from test_15_query_core import top

from jetd.config import Config
from jetd.connection import Connection
from jetd.core import Daemon
from jetd.scheduler import DEFAULT_CHECK_EVERY
from jetd.scheduler import Scheduler
from jetwire import AddState
from jetwire import FetchAdd
from jetwire import FetchQuery
from jetwire import FetchStates
from jetwire import FetchWindow
from jetwire import GetState
from jetwire import Message
from jetwire import NotifyState
from jetwire import Query
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value


class FakeClock:
    """A monotonic clock that moves ``step`` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.t = 100.0
        self.step = step
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        now = self.t
        self.t += self.step
        return now


class ClockHarness(MemoryPeers):
    """A Daemon driven by a fake clock, with in-memory peers; ``now`` is the clock's time."""

    def __init__(self, step: float, **settings: object) -> None:
        self.clock = FakeClock(step)
        super().__init__(Daemon(Config(**settings), clock=self.clock), self.clock.t)  # type: ignore[arg-type]

    @property  # type: ignore[override]
    def now(self) -> float:
        return self.clock.t

    @now.setter
    def now(self, value: float) -> None:
        self.clock.t = value

    def work(self) -> None:
        self.daemon.work(self.now)

    def send_all(self, conn: Connection, *messages: Message) -> list[Message]:
        """Send, then run turns of work until all of it is handled (past a slice the
        frame loop leaves the rest of a connection's input for its next turn, issue 29);
        returns what ``conn`` got."""
        self.send(conn, *messages)
        got: list[Message] = []
        for _ in range(100_000):
            got += self.recv(conn)  # the IO layer writes its output: it may go on
            if not conn.stalled:
                return got
            self.work()
        raise AssertionError("the connection never caught up")


def v(i: int) -> Value:
    return Value.of(i)


# --- the Scheduler alone --------------------------------------------------------------


def test_a_slice_ends_when_the_clock_passes_the_bound_reading_it_every_n_items() -> None:
    clock = FakeClock(0.0)
    scheduler = Scheduler(clock=clock, slice_seconds=0.001, check_every=4)
    scheduler.begin(clock.t)
    assert [scheduler.spent() for _ in range(12)] == [False] * 12  # the clock stands still
    assert clock.reads == 3  # read every 4th item only
    clock.t += 0.0009
    assert [scheduler.spent() for _ in range(4)] == [False] * 4
    clock.t += 0.0001  # the bound: the slice is over at the next reading
    assert [scheduler.spent() for _ in range(4)] == [False, False, False, True]
    assert scheduler.slices_cut == 1
    scheduler.restart()  # a new slice from the clock's now
    assert [scheduler.spent() for _ in range(8)] == [False] * 8


def test_without_a_clock_a_slice_is_counted_in_items_only() -> None:
    scheduler = Scheduler(check_every=1)
    scheduler.begin(0.0)
    assert not any(scheduler.spent() for _ in range(10_000))
    assert not scheduler.over(-1.0)


def test_put_back_goes_first_round_robin() -> None:
    scheduler = Scheduler()
    a, b, c = (Connection(i, f"mem:{i}") for i in range(3))
    scheduler.wake(a)
    scheduler.wake(b)
    taken = scheduler.take()
    scheduler.wake(c)  # woken meanwhile
    scheduler.put_back(taken[1:])  # ``b`` was not reached in this turn
    scheduler.wake(a)  # ``a`` has more: behind the others
    assert scheduler.take() == [b, c, a]


@pytest.mark.parametrize("settings", [{"slice_seconds": 0.0}, {"check_every": 0}])
def test_bad_settings_are_refused(settings: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Scheduler(**settings)  # type: ignore[arg-type]


# --- the daemon under a fake clock ------------------------------------------------------

N = 3000


def _fill(h: ClockHarness, n: int = N) -> tuple[Connection, dict[str, Value]]:
    owner = h.connect()
    states = {f"k{i:05d}": v(i) for i in range(n)}
    h.send_all(owner, *(AddState(i + 1, k, val) for i, (k, val) in enumerate(states.items())))
    h.recv(owner)
    return owner, states


def test_initial_adds_are_cut_by_the_clock_and_arrive_exactly_once_in_order() -> None:
    # Each reading moves the clock 0.4 ms: a 1 ms slice is over at the third reading,
    # after 3 x 32 states: far below the ceiling of 2,048 items.
    h = ClockHarness(0.0004)
    _owner, states = _fill(h)
    fetcher, other = h.connect(), h.connect()
    h.send(fetcher, FetchStates(1, "k"))
    events = h.recv(fetcher)
    assert isinstance(events[0], Response)
    fid = events[0].fetch_id
    adds = [e for e in events[1:] if isinstance(e, FetchAdd)]
    sizes = [len(adds)]
    while fetcher.delivery is not None:
        # Another peer is answered between any two slices.
        h.send(other, GetState(7, "k00001"))
        [answer] = h.recv(other)
        assert isinstance(answer, Response) and answer.value == v(1)
        h.work()
        got = [e for e in h.recv(fetcher) if isinstance(e, FetchAdd)]
        sizes.append(len(got))
        adds += got
    assert [(a.fetch_id, a.key, a.value) for a in adds] == [(fid, k, val) for k, val in states.items()]
    assert max(sizes) <= 4 * DEFAULT_CHECK_EVERY < h.daemon.scheduler.delivery_slice
    assert len(sizes) >= N // (4 * DEFAULT_CHECK_EVERY)
    assert h.daemon.scheduler.slices_cut >= len(sizes) - 1


def test_work_serves_woken_connections_round_robin_one_turn_a_slice() -> None:
    h = ClockHarness(0.0004)
    _owner, states = _fill(h)
    fetchers = [h.connect() for _ in range(3)]
    fids = {}
    adds: dict[int, list[FetchAdd]] = {}
    for conn in fetchers:
        h.send(conn, FetchStates(1, "k"))
        events = h.recv(conn)
        fids[conn.conn_id] = events[0].fetch_id  # type: ignore[attr-defined]
        adds[conn.conn_id] = [e for e in events[1:] if isinstance(e, FetchAdd)]
    order: list[int] = []
    for _ in range(10_000):
        if all(conn.delivery is None for conn in fetchers):
            break
        h.work()
        served = []
        for conn in fetchers:
            got = [e for e in h.recv(conn) if isinstance(e, FetchAdd)]
            if got:
                served.append(conn.conn_id)
                adds[conn.conn_id] += got
        assert len(served) == 1, "a turn of about one slice serves one connection"
        order += served
    ids = [conn.conn_id for conn in fetchers]
    # Round-robin: while all three have work, they take turns in the order they woke.
    assert order[:9] == ids * 3
    for conn in fetchers:
        assert [(a.fetch_id, a.key, a.value) for a in adds[conn.conn_id]] == [
            (fids[conn.conn_id], k, val) for k, val in states.items()
        ]


def _players(h: ClockHarness, n: int) -> tuple[Connection, dict[str, Value]]:
    owner = h.connect()
    states = {f"players/{i:05d}": player("female" if i % 3 else "male", (i * 7919) % 1000) for i in range(n)}
    h.send_all(owner, *(AddState(i + 1, k, val) for i, (k, val) in enumerate(states.items())))
    h.recv(owner)
    return owner, states


def test_seeding_a_sorted_query_is_cut_by_the_clock_and_the_window_stays_exact() -> None:
    h = ClockHarness(0.0004)
    owner, states = _players(h, N)
    fan, other = h.connect(), h.connect()
    h.send(fan, FetchQuery(1, top(20, start=2)))
    [ok] = h.recv(fan)
    assert isinstance(ok, Response) and ok.fetch_id is not None
    window = WindowView(2)
    slices = 0
    step = 100_000
    while fan.delivery is not None:
        # Changes land between the slices, on both sides of the seeding's cursor.
        for key in (f"players/{(slices * 37) % N:05d}", f"players/{N - 1 - slices % N:05d}"):
            step += 1
            states[key] = player("female", (slices * 131) % 1000)
            h.send(owner, NotifyState(step, key, states[key]))
            h.recv(owner)
        h.send(other, GetState(9, "players/00001"))
        assert isinstance(h.recv(other)[0], Response)
        h.work()
        for event in h.recv(fan):
            assert isinstance(event, FetchWindow)
            window.apply(event)
        slices += 1
    assert slices > N // h.daemon.scheduler.seed_slice + 5  # more slices than the item count makes
    assert window.rows == oracle_window(states, 2, 21)


def test_route_timeouts_are_answered_in_clock_slices() -> None:
    h = ClockHarness(0.0004, route_timeout=1.0)
    owner = h.connect()
    h.send(owner, AddState(1, "r", v(0)))
    h.recv(owner)
    requester = h.connect()
    n = 500
    h.send(requester, *(SetState(i + 1, "r", v(i)) for i in range(n)))
    h.recv(owner)  # the routed requests, never answered
    h.clock.t += 10.0
    h.daemon.tick(h.clock.t)
    answered = [m for m in h.recv(requester) if isinstance(m, Response)]
    assert 0 < len(answered) < n and h.daemon.has_work  # the burst is sliced
    turns = 1
    while h.daemon.has_work:
        h.work()
        answered += [m for m in h.recv(requester) if isinstance(m, Response)]
        turns += 1
    assert sorted(m.id for m in answered) == list(range(1, n + 1))
    assert all(m.status == Status.TIMEOUT for m in answered)
    assert turns > 2


def test_an_unsorted_query_s_entries_are_cut_by_the_clock() -> None:
    # An unsorted fetch query's initial entries go out one clock slice at a time, all of them.
    h = ClockHarness(0.0004)
    _owner, states = _players(h, N)
    fan = h.connect()
    h.send(fan, FetchQuery(1, Query((PLAYERS,))))
    events = h.recv(fan)
    turns = 0
    while fan.delivery is not None:
        h.work()
        events += h.recv(fan)
        turns += 1
    keys = [e.key for e in events if isinstance(e, FetchAdd)]
    assert keys == sorted(states) and turns > N // h.daemon.scheduler.delivery_slice + 5
    assert all(json.loads(e.value.data)["score"] >= 0 for e in events if isinstance(e, FetchAdd))


# --- window updates of sorted fetches after changes (the sorted-window stall) -----------


def _scoreboard(h: ClockHarness, fans: int, per_fan: int, n: int = 400) -> tuple[
        Connection, dict[str, Value], list[Connection], dict[int, WindowView]]:
    owner, states = _players(h, n)
    conns = [h.connect() for _ in range(fans)]
    views: dict[int, WindowView] = {}
    for conn in conns:
        for i in range(per_fan):
            h.send(conn, FetchQuery(i + 1, top(60, start=3)))
            events = h.recv(conn)
            while conn.delivery is not None or h.daemon.has_work:  # seeding, in slices
                h.work()
                events += h.recv(conn)
            assert isinstance(events[0], Response) and events[0].fetch_id is not None
            views[events[0].fetch_id] = view = WindowView(3)
            for event in events[1:]:
                assert isinstance(event, FetchWindow)
                view.apply(event)
    assert not h.daemon.has_work
    return owner, states, conns, views


def _apply(h: ClockHarness, conns: list[Connection], views: dict[int, WindowView]) -> dict[int, int]:
    """Apply what each connection received; the count of FETCH_WINDOW events per connection."""
    got = {}
    for conn in conns:
        events = h.recv(conn)
        for event in events:
            assert isinstance(event, FetchWindow)
            views[event.fetch_id].apply(event)
        got[conn.conn_id] = len(events)
    return got


def test_window_updates_beyond_the_slice_wait_for_later_slices_and_stay_exact() -> None:
    h = ClockHarness(0.0004)
    owner, states, conns, views = _scoreboard(h, fans=4, per_fan=5)
    # One read of the owner's: 60 changes, each moving an entry across the windows.
    changes = []
    for i in range(60):
        key = f"players/{(i * 37) % 400:05d}"
        states[key] = player("female", 2000 + i if i % 2 else -1)
        changes.append(NotifyState(None, key, states[key]))
    h.send(owner, *changes)
    h.recv(owner)
    first = _apply(h, conns, views)
    # The slice ended long before 60 changes x 20 windows were sent: the rest waits.
    assert h.daemon.has_work and h.daemon.queries.stale
    assert sum(first.values()) < 60 * 20
    turns = 0
    while h.daemon.has_work:
        h.work()
        _apply(h, conns, views)
        turns += 1
    assert turns >= 2
    expected = oracle_window(states, 3, 62)
    for fid, view in views.items():
        assert view.rows == expected, f"fetch {fid}"


def test_waiting_windows_go_out_round_robin_across_connections() -> None:
    h = ClockHarness(0.01)  # every reading of the clock ends the slice
    owner, states, conns, views = _scoreboard(h, fans=3, per_fan=3)
    h.daemon.scheduler.check_every = 1
    key = "players/00001"
    states[key] = player("female", 5000)  # to the top of every window
    h.send(owner, NotifyState(None, key, states[key]))
    _apply(h, conns, views)
    order = []
    while h.daemon.has_work:
        h.work()
        got = _apply(h, conns, views)
        order += [conn_id for conn_id, count in got.items() if count]
    ids = [conn.conn_id for conn in conns]
    # One fetch a turn, taking the connections in turn: no connection's second window
    # before every waiting connection had its first.
    assert len(order) >= 6
    assert order[:3] == sorted(order[:3], key=ids.index) and len(set(order[:3])) == 3
    expected = oracle_window(states, 3, 62)
    assert all(view.rows == expected for view in views.values())


@pytest.mark.parametrize("fast", [True, False], ids=["OK: the fast path", "REJECTED: the careful way"])
def test_a_requesters_waiting_windows_precede_its_answer(fast: bool) -> None:
    h = ClockHarness(0.01)
    owner, states, conns, views = _scoreboard(h, fans=2, per_fan=1)
    h.daemon.scheduler.check_every = 1
    other, requester = conns  # the group sends ``other``'s window first: the requester's waits
    key = "players/00002"
    h.send(requester, SetState(77, key, player("female", 7000)))
    [routed] = [m for m in h.recv(owner) if not isinstance(m, Response)]
    states[key] = player("female", 7000)
    # The owner's change: the slice is over at the first window, so the requester's
    # and the other's wait (the owner is the one whose frames these are).
    rid = routed.id  # type: ignore[attr-defined]
    answer = Response(rid, Status.OK, Value.of(1)) if fast else Response(rid, Status.REJECTED, message="no")
    h.send(owner, NotifyState(None, key, states[key]), answer)
    events = h.recv(requester)
    assert [type(e) for e in events] == [FetchWindow, Response], "the window first, then the answer"
    for event in events[:-1]:
        views[event.fetch_id].apply(event)  # type: ignore[attr-defined]
    _apply(h, [other], views)
    while h.daemon.has_work:
        h.work()
        _apply(h, [other], views)
    expected = oracle_window(states, 3, 62)
    assert all(view.rows == expected for view in views.values())


def test_an_owners_own_request_sees_its_windows_before_its_answer() -> None:
    h = ClockHarness(0.01)
    owner, states = _players(h, 400)
    h.send(owner, FetchQuery(1, top(60, start=3)))
    events = h.recv(owner)
    while owner.delivery is not None:
        h.work()
        events += h.recv(owner)
    view = WindowView(3)
    for event in events[1:]:
        view.apply(event)  # type: ignore[arg-type]
    h.daemon.scheduler.check_every = 1
    key = "players/00004"
    states[key] = player("female", 9000)
    h.send(owner, NotifyState(5, key, states[key]))
    events = h.recv(owner)
    assert [type(e) for e in events] == [FetchWindow, Response]
    view.apply(events[0])  # type: ignore[arg-type]
    assert view.rows == oracle_window(states, 3, 62)


def test_a_drained_connections_whole_windows_go_out_in_slices() -> None:
    h = ClockHarness(0.0004)
    owner, states, conns, views = _scoreboard(h, fans=1, per_fan=8)
    [fan] = conns
    h.daemon.pause(fan, 5 << 20)  # a slow reader (above the soft limit): its windows become dirty
    for i in range(20):
        key = f"players/{(i * 53) % 400:05d}"
        states[key] = player("female", 3000 + i)
        h.send(owner, NotifyState(None, key, states[key]))
    h.recv(owner)
    assert h.recv(fan) == []
    rounds = 0
    while True:
        # The IO layer: the connection drained; it writes what was queued, and calls again.
        live = h.daemon.drained(fan)
        decoder = h.decoders[fan.conn_id]
        decoder.receive_data(b"".join(fan.take_pending(1 << 30)))
        for event in decoder.messages():
            assert isinstance(event, FetchWindow)
            views[event.fetch_id].apply(event)
        while h.daemon.has_work:
            h.work()
        _apply(h, conns, views)
        rounds += 1
        if live:
            break
    assert rounds >= 3  # 8 whole windows of 60 entries take several slices
    expected = oracle_window(states, 3, 62)
    assert all(view.rows == expected for view in views.values())
