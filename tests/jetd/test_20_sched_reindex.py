"""A reloaded users file (SIGHUP, PROTOCOL.md 15.5) is brought into force a slice of
connections at a time (issue 29, ``AccessControl.reindex_slice``): other peers are
served in between; a connection's own frames are always handled under the new
permissions (it jumps the queue); once the reload is done no fetch gets an event it may
no longer read, and each got exactly one FETCH_REMOVE. Sans-IO with a fake clock."""

from __future__ import annotations

from test_18_clock_slices import FakeClock

from jetd.access import REINDEX_SLICE
from jetd.access import Access
from jetd.config import Config
from jetd.connection import Connection
from jetd.core import Daemon
from jetd.users import Grants
from jetd.users import UsersFile
from jetwire import AddState
from jetwire import Decoder
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Message
from jetwire import NotifyState
from jetwire import Response
from jetwire import Status
from jetwire import Value
from jetwire import encode

VIEWERS = 300


def anonymous_reads(*prefixes: str) -> Access:
    users = UsersFile()
    users.anonymous = Grants(own=["p/"], read=list(prefixes), write=["p/"])
    return Access(users)


class ReloadHarness:
    def __init__(self, step: float) -> None:
        self.clock = FakeClock(step)
        self.daemon = Daemon(Config(), access=anonymous_reads("p/"), clock=self.clock)
        self.decoders: dict[int, Decoder] = {}

    def connect(self) -> Connection:
        conn = self.daemon.connect("mem", self.clock.t)
        self.decoders[conn.conn_id] = Decoder(max_body=1 << 30)
        self.recv(conn)
        return conn

    def send(self, conn: Connection, *messages: Message) -> None:
        self.daemon.receive_data(conn, b"".join(encode(m) for m in messages), self.clock.t)

    def recv(self, conn: Connection) -> list[Message]:
        self.daemon.take_dirty()
        data = b"".join(conn.out) + b"".join(conn.take_pending(1 << 40))
        conn.out.clear()
        decoder = self.decoders[conn.conn_id]
        decoder.receive_data(data)
        return list(decoder.messages())


def _setup(h: ReloadHarness) -> tuple[Connection, list[Connection]]:
    owner = h.connect()
    h.send(owner, AddState(1, "p/a", Value.of(1)), AddState(2, "p/b", Value.of(2)))
    h.recv(owner)
    viewers = [h.connect() for _ in range(VIEWERS)]
    for conn in viewers:
        h.send(conn, FetchStates(1, "p/"))
        ok, *adds = h.recv(conn)
        assert isinstance(ok, Response) and [a.key for a in adds if isinstance(a, FetchAdd)] == ["p/a", "p/b"]
    return owner, viewers


def test_a_reload_is_brought_into_force_in_slices_and_ends_consistent() -> None:
    h = ReloadHarness(0.0004)  # a 1 ms slice is over at the third reading of the clock
    owner, viewers = _setup(h)
    h.daemon.set_access(anonymous_reads("p/b"), h.clock.t)
    events: dict[int, list[Message]] = {c.conn_id: h.recv(c) for c in viewers}
    first = sum(1 for ms in events.values() if ms)
    assert 1 <= first < VIEWERS, "the first slice brings part of the connections in line"
    assert h.daemon.has_work and h.daemon.auth.reindex
    # A connection not reached yet: its own request is handled under the new permissions,
    # after its fetch was brought in line.
    late = viewers[-1]
    h.send(late, GetState(7, "p/a"))
    late_got = h.recv(late)
    assert [type(m) for m in late_got] == [FetchRemove, Response]
    assert isinstance(late_got[1], Response) and late_got[1].status == Status.NOT_AUTHORIZED
    events[late.conn_id] += late_got[:1]
    # Meanwhile the others are served: the owner's change reaches those not reached yet
    # (still under the old permissions), not those already in line.
    h.send(owner, NotifyState(None, "p/a", Value.of(10)))
    assert h.recv(owner) == []
    turns = [first]
    for _ in range(10_000):
        if not h.daemon.has_work:
            break
        h.daemon.work(h.clock.t)
        turns.append(sum(1 for c in viewers if (got := h.recv(c)) and not events[c.conn_id].extend(got)))
    assert not h.daemon.auth.reindex
    assert len(turns) >= 3, turns
    assert h.daemon.scheduler.slices_cut >= len(turns) - 2
    for conn in viewers:
        got = events[conn.conn_id]
        # Exactly one FETCH_REMOVE of p/a, and after it nothing of p/a.
        removes = [i for i, m in enumerate(got) if isinstance(m, FetchRemove)]
        assert len(removes) == 1 and got[removes[0]].key == "p/a", got  # type: ignore[attr-defined]
        assert all(m.key != "p/a" for m in got[removes[0] + 1 :]), got  # type: ignore[attr-defined]
        # A change before the remove carries the value the remove has.
        assert all(m.value == Value.of(10) for m in got if isinstance(m, FetchChange))  # type: ignore[attr-defined]
    # After the reload: nobody gets p/a, everybody gets p/b.
    h.send(owner, NotifyState(None, "p/a", Value.of(11)), NotifyState(None, "p/b", Value.of(22)))
    after = {c.conn_id: h.recv(c) for c in viewers}
    for _ in range(10_000):  # the fan-out to 300 fetches is sliced too
        if not h.daemon.has_work:
            break
        h.daemon.work(h.clock.t)
        for conn in viewers:
            after[conn.conn_id] += h.recv(conn)
    for conn in viewers:
        assert [(type(m), m.key) for m in after[conn.conn_id]] == [(FetchChange, "p/b")]  # type: ignore[attr-defined]


def test_without_the_clock_a_slice_is_its_item_ceiling() -> None:
    h = ReloadHarness(0.0)  # the clock stands still: only the item ceiling cuts
    _owner, viewers = _setup(h)
    h.daemon.set_access(anonymous_reads("p/b"), h.clock.t)
    got = [[type(m) for m in h.recv(c)] for c in viewers]
    first = REINDEX_SLICE - 1  # the owner connected first, and counts too
    assert got == [[FetchRemove]] * first + [[]] * (VIEWERS - first)
    assert h.daemon.has_work
    h.daemon.work(h.clock.t)
    assert [[type(m) for m in h.recv(c)] for c in viewers[first:]] == [[FetchRemove]] * (VIEWERS - first)
    assert not h.daemon.has_work
