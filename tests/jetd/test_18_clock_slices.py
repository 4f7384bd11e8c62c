"""Slices of work end by the clock (issue 29, jetd/scheduler.py): with a fake clock, a
slice of initial adds, of a query's seeding or of route timeouts ends once the clock
passes the bound, long before the item ceiling; ``Daemon.work`` serves the woken
connections round-robin, one turn lasting about a slice; and no work is lost or
duplicated: every view stays exact. Sans-IO: the clock is the only time source."""

from __future__ import annotations

import json

import pytest
from test_15_query_core import PLAYERS, WindowView, oracle_window, player, top

from jetd.config import Config
from jetd.connection import Connection
from jetd.core import Daemon
from jetd.scheduler import DEFAULT_CHECK_EVERY, Scheduler
from jetwire import (
    AddState,
    Decoder,
    FetchAdd,
    FetchQuery,
    FetchStates,
    FetchWindow,
    GetState,
    Message,
    NotifyState,
    Query,
    Response,
    SetState,
    Status,
    Value,
    encode,
)


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


class ClockHarness:
    """A Daemon driven by a fake clock, with in-memory peers (as test_15's Harness)."""

    def __init__(self, step: float, **settings: object) -> None:
        self.clock = FakeClock(step)
        self.daemon = Daemon(Config(**settings), clock=self.clock)  # type: ignore[arg-type]
        self.decoders: dict[int, Decoder] = {}

    def connect(self) -> Connection:
        conn = self.daemon.connect("mem", self.clock.t)
        self.decoders[conn.conn_id] = Decoder(max_body=1 << 30)
        self.recv(conn)
        return conn

    def send(self, conn: Connection, *messages: Message) -> None:
        self.daemon.receive_data(conn, b"".join(encode(m) for m in messages), self.clock.t)

    def work(self) -> None:
        self.daemon.work(self.clock.t)

    def recv(self, conn: Connection) -> list[Message]:
        self.daemon.take_dirty()
        data = b"".join(conn.out)
        conn.out.clear()
        decoder = self.decoders[conn.conn_id]
        decoder.receive_data(data)
        return list(decoder.messages())


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
    h.send(owner, *(AddState(i + 1, k, val) for i, (k, val) in enumerate(states.items())))
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
    h.send(owner, *(AddState(i + 1, k, val) for i, (k, val) in enumerate(states.items())))
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
