"""A NOTIFY_STATE event's fan-out to many fetches is sliced by the clock (issue 29,
jetd/subscriptions.py ``fan_live``): past a slice the rest waits for the owner's next
turn of ``Daemon.work``, the owner's later frames wait behind it, other peers are
answered in between, and every fetch still gets every change of the key once, in order.
Sans-IO with a fake clock (test_18): slice counts and order, never wall-clock time."""

from __future__ import annotations

import pytest
from test_18_clock_slices import ClockHarness

from jetd.connection import Connection
from jetd.scheduler import DEFAULT_FAN_CHUNK
from jetd.scheduler import DEFAULT_FAN_STRIDE
from jetwire import AddState
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Info
from jetwire import Message
from jetwire import NotifyState
from jetwire import Response
from jetwire import Unfetch
from jetwire import Value

CONNS = 40
PER_CONN = 100  # 4,000 fetches of "k": far more than a slice of 0.4 ms clock steps


def _setup(h: ClockHarness, conns: int = CONNS, per_conn: int = PER_CONN) -> tuple[Connection, list[Connection], dict[int, int]]:
    """An owner of "k0" (value 0) and ``conns`` fetchers of ``per_conn`` fetches each;
    returns the owner, the fetchers, and fetch id -> its fetcher's conn_id."""
    owner = h.connect()
    h.send(owner, AddState(1, "k0", Value.of(0)))
    h.recv(owner)
    fetchers = [h.connect() for _ in range(conns)]
    fids: dict[int, int] = {}
    for conn in fetchers:
        h.send(conn, *(FetchStates(i + 1, "k") for i in range(per_conn)))
        for message in h.recv(conn):
            if isinstance(message, Response):
                assert message.status == 0
                fids[message.fetch_id] = conn.conn_id  # type: ignore[assignment]
    assert len(fids) == conns * per_conn
    return owner, fetchers, fids


def _changes(h: ClockHarness, fetchers: list[Connection], seen: dict[int, list[Message]]) -> int:
    """Collect the fetchers' events per fetch id; returns how many arrived."""
    got = 0
    for conn in fetchers:
        for message in h.recv(conn):
            if isinstance(message, (FetchChange, FetchRemove, FetchAdd)):
                seen.setdefault(message.fetch_id, []).append(message)
                got += 1
    return got


def _run(h: ClockHarness, fetchers: list[Connection], seen: dict[int, list[Message]]) -> list[int]:
    """Turns of Daemon.work until nothing is left; the events each turn delivered."""
    per_turn = []
    for _ in range(10_000):
        if not h.daemon.has_work:
            return per_turn
        h.work()
        per_turn.append(_changes(h, fetchers, seen))
    raise AssertionError("the fan-out never ended")


@pytest.mark.parametrize("value", [Value.of(1), Value.of("one")], ids=["fast-path", "careful-path"])
def test_a_fan_out_to_many_fetches_is_sliced_and_nothing_is_lost_or_reordered(value: Value) -> None:
    h = ClockHarness(0.0004)  # a 1 ms slice is over at the third reading of the clock
    owner, fetchers, fids = _setup(h)
    other = h.connect()
    # Two changes and the owner's own GET, in one read.
    h.send(owner, NotifyState(None, "k0", value), NotifyState(None, "k0", Value.of(2)), GetState(9, "k0"))
    seen: dict[int, list[Message]] = {}
    first = _changes(h, fetchers, seen)
    total = len(fids)
    assert DEFAULT_FAN_STRIDE <= first < total, "the first slice sends part of the fan-out"
    assert all(m.value == value for ms in seen.values() for m in ms)  # type: ignore[attr-defined]
    # The owner's next frames wait behind the fan-out it caused (PROTOCOL.md 10.5).
    assert owner.stalled and h.recv(owner) == []
    # Another peer is answered between two slices, from the cache (the new value).
    h.send(other, GetState(7, "k0"))
    [answer] = h.recv(other)
    assert isinstance(answer, Response) and answer.value == value
    per_turn = [first, *_run(h, fetchers, seen)]
    # Every fetch got both changes, exactly once, in order.
    assert sorted(seen) == sorted(fids)
    for fid, events in seen.items():
        assert [(type(e), e.value) for e in events] == [(FetchChange, value), (FetchChange, Value.of(2))], fid  # type: ignore[attr-defined]
    assert sum(per_turn) == 2 * total
    assert len(per_turn) >= 2 * total // (4 * DEFAULT_FAN_STRIDE), per_turn
    assert max(per_turn) <= 4 * DEFAULT_FAN_STRIDE
    assert h.daemon.scheduler.slices_cut >= len(per_turn) - 2
    # Only then the owner's GET: its answer has the second value.
    [own] = h.recv(owner)
    assert isinstance(own, Response) and own.id == 9 and own.value == Value.of(2)
    assert not owner.stalled and not h.daemon.subscriptions.fanning


def test_a_fan_out_to_a_chunk_of_fetches_goes_out_at_once() -> None:
    # The common case pays nothing: up to DEFAULT_FAN_CHUNK fetches, however slow the clock.
    h = ClockHarness(1.0)
    owner, fetchers, fids = _setup(h, conns=4, per_conn=DEFAULT_FAN_CHUNK // 4)
    h.send(owner, NotifyState(None, "k0", Value.of(1)), GetState(9, "k0"))
    seen: dict[int, list[Message]] = {}
    assert _changes(h, fetchers, seen) == len(fids) == DEFAULT_FAN_CHUNK
    assert not owner.stalled and not h.daemon.has_work
    assert [m.id for m in h.recv(owner)] == [9]  # type: ignore[attr-defined]


def test_fetches_gone_or_paused_between_slices() -> None:
    h = ClockHarness(0.0004)
    owner, fetchers, fids = _setup(h)
    h.send(owner, NotifyState(None, "k0", Value.of(1)))
    seen: dict[int, list[Message]] = {}
    _changes(h, fetchers, seen)
    # The last three fetchers are in the rest: one unfetches, one closes, one is paused.
    unfetcher, closer, slow = fetchers[-3:]
    mine = [fid for fid, cid in fids.items() if cid == unfetcher.conn_id]
    assert not any(fid in seen for fid in mine)
    h.send(unfetcher, Unfetch(99, mine[0]))
    assert [m.id for m in h.recv(unfetcher)] == [99]  # type: ignore[attr-defined]
    h.daemon.disconnect(closer, h.clock.t)
    h.daemon.pause(slow, 1 << 20)
    _run(h, fetchers, seen)
    assert mine[0] not in seen, "nothing after UNFETCH's OK"
    assert all(fid in seen for fid in mine[1:])
    assert not any(fid in seen for fid, cid in fids.items() if cid == closer.conn_id)
    # The paused fetcher's events wait in its queue (PROTOCOL.md 10.8) and arrive once drained.
    slow_fids = sorted(fid for fid, cid in fids.items() if cid == slow.conn_id)
    assert slow.pending and not any(fid in seen for fid in slow_fids)
    slow.out.extend(slow.pending)
    slow.pending.clear()
    slow.pending_size = 0
    h.daemon.drained(slow)
    _changes(h, [slow], seen)
    assert [fid for fid in slow_fids if [type(e) for e in seen.get(fid, [])] == [FetchChange]] == slow_fids


def test_an_owner_closing_mid_fan_out_sends_the_changes_before_the_removes() -> None:
    h = ClockHarness(0.0004)
    owner, fetchers, fids = _setup(h)
    h.send(owner, NotifyState(None, "k0", Value.of(1)))
    seen: dict[int, list[Message]] = {}
    _changes(h, fetchers, seen)
    assert h.daemon.subscriptions.fanning
    h.daemon.disconnect(owner, h.clock.t)
    _run(h, fetchers, seen)
    _changes(h, fetchers, seen)
    assert sorted(seen) == sorted(fids)
    for events in seen.values():
        assert [type(e) for e in events] == [FetchChange, FetchRemove]
    assert not h.daemon.subscriptions.fanning


def test_a_change_held_for_a_delivering_fetch_is_held_once_with_small_body_peers() -> None:
    # The NOTIFY fast path's careful branch (taken while a peer announced a small
    # max_body) held the change for fetches still receiving initial adds a second time.
    h = ClockHarness(0.0004)
    owner = h.connect()
    h.send_all(owner, *(AddState(i + 1, f"k{i:05d}", Value.of(i)) for i in range(3000)))
    h.recv(owner)
    small = h.connect()
    h.send(small, Info(max_body=100_000))
    h.recv(small)
    live, delivering = h.connect(), h.connect()
    h.send(live, FetchStates(1, "k"))
    for _ in range(10_000):
        h.recv(live)
        if live.delivery is None:
            break
        h.work()
    h.send(delivering, FetchStates(1, "k"))
    assert delivering.delivery is not None and delivering.delivery.cursor is not None  # type: ignore[attr-defined]
    assert delivering.delivery.cursor > b"k00001"  # type: ignore[attr-defined]
    h.send(owner, NotifyState(None, "k00001", Value.of(-1)))
    seen: dict[int, list[Message]] = {}
    _changes(h, [live, delivering], seen)
    for _ in range(10_000):
        if delivering.delivery is None:
            break
        h.work()
        _changes(h, [live, delivering], seen)
    changes = [(fid, e.key) for fid, events in seen.items() for e in events if isinstance(e, FetchChange)]
    assert len(changes) == 2 and len({fid for fid, _ in changes}) == 2, changes


def test_a_paused_owner_still_sends_the_rest_of_its_fan_out() -> None:
    # The events an owner owes others do not wait for its own output to drain; its next
    # frames do.
    h = ClockHarness(0.0004)
    owner, fetchers, fids = _setup(h)
    h.send(owner, NotifyState(None, "k0", Value.of(1)), GetState(9, "k0"))
    seen: dict[int, list[Message]] = {}
    _changes(h, fetchers, seen)
    h.daemon.pause(owner, 1 << 20)  # its transport is full
    _run(h, fetchers, seen)
    assert sorted(seen) == sorted(fids) and not h.daemon.subscriptions.fanning
    assert owner.stalled and not owner.pending and h.recv(owner) == []  # its GET waits
    assert h.daemon.drained(owner)
    h.work()
    [own] = h.recv(owner)
    assert isinstance(own, Response) and own.id == 9 and own.value == Value.of(1)
