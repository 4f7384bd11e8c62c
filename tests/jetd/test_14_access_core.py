"""14-security in the sans-IO core (no sockets): the AUTHENTICATE state machine with a
deferred password check, delays driven by ``now``, permission changes on a paused
(parked) fetcher, and the no-auth configuration paying nothing."""

from __future__ import annotations

from collections.abc import Callable

from inmemory import MemoryPeers

from jetd.access import Access
from jetd.config import Config
from jetd.connection import Connection
from jetd.core import Daemon
from jetd.users import Grants
from jetd.users import User
from jetd.users import UsersFile
from jetwire import AddState
from jetwire import Authenticate
from jetwire import Close
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Message
from jetwire import NotifyState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value


def cheap_hash(password: str) -> str:
    from argon2 import PasswordHasher

    return PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1).hash(password)


def make_access(viewer_read: list[str], anonymous: Grants | None = None) -> Access:
    users = UsersFile()
    users.anonymous = anonymous or Grants()
    users.users["owner"] = User(password=cheap_hash("o"), own=["p/"], read=["p/"], write=["p/"])
    users.users["viewer"] = User(password=cheap_hash("v"), read=viewer_read)
    return Access(users)


class Harness(MemoryPeers):
    """A Daemon with in-memory peers; password checks are deferred until ``finish_checks``
    (as the IO layer runs them in a thread)."""

    def __init__(self, access: Access | None, **settings: object) -> None:
        super().__init__(Daemon(Config(**settings), access=access))  # type: ignore[arg-type]
        self.jobs: list[tuple[Callable[[], bool], Callable[[bool], None]]] = []
        self.daemon.auth.offload = lambda job, done: self.jobs.append((job, done))
        self.run = 0  # checks run by finish_checks

    def output(self, conn: Connection) -> bytes:
        return super().output(conn) + b"".join(conn.take_pending(1 << 40))

    def finish_checks(self) -> int:
        """Run the checks started so far (not those they start in turn); how many."""
        jobs, self.jobs = self.jobs, []
        for job, done in jobs:
            self.run += 1
            done(job())
        self.work()
        return len(jobs)

    def work(self) -> None:
        """The scheduler's turns until no work is left (the IO layer's ``run_work``):
        ended checks are acted on there."""
        for _ in range(10_000):  # bounded: a bug must fail the test, not hang it
            if not self.daemon.has_work:
                return
            self.daemon.work(self.now)
        raise AssertionError("the core's work never ended")

    def login(self, conn: Connection, user: str, password: str) -> None:
        self.send(conn, Authenticate(999, user, password))
        self.finish_checks()
        assert self.recv(conn)[-1] == Response(999, Status.OK)


def f(x: float) -> Value:
    return Value.of(float(x))


def test_frames_behind_authenticate_wait_for_its_check() -> None:
    h = Harness(make_access(["p/"]))
    owner = h.connect()
    h.send(owner, Authenticate(1, "owner", "o"), AddState(2, "p/a", f(1)), GetState(3, "p/a"))
    assert h.recv(owner) == []  # nothing read past AUTHENTICATE while the check runs
    assert owner.held and len(owner.rest) > 0
    h.send(owner, GetState(4, "p/a"))  # more bytes arrive meanwhile: buffered too
    h.finish_checks()
    assert h.recv(owner) == [
        Response(1, Status.OK), Response(2, Status.OK), Response(3, value=f(1)), Response(4, value=f(1))
    ]


def test_failures_are_answered_after_the_delay_and_the_fifth_closes() -> None:
    h = Harness(make_access(["p/"]), auth_failure_delay=0.5)
    conn = h.connect()
    for attempt in range(1, 6):
        h.send(conn, Authenticate(attempt, "owner", "bad"), GetState(100 + attempt, "p/a"))
        h.finish_checks()
        h.tick(0.4)
        assert h.recv(conn) == []  # not before the delay; the GET waits behind it
        h.tick(0.2)
        answers = h.recv(conn)
        assert answers[0] == Response(attempt, Status.AUTH_FAILED, message="authentication failed")
        if attempt < 5:
            assert answers[1:] == [Response(100 + attempt, Status.NOT_AUTHORIZED, message="authentication required")]
        else:
            assert answers[1:] == [Close(Status.AUTH_FAILED, "too many failed authentications")]
    assert conn.closed


def test_auth_timeout_spares_authenticated_and_waiting_connections() -> None:
    h = Harness(make_access(["p/"]), auth_timeout=10.0)
    idle, authed, waiting = h.connect(), h.connect(), h.connect()
    h.login(authed, "viewer", "v")
    h.send(waiting, Authenticate(1, "viewer", "v"))  # its check is still running at the deadline
    h.tick(10.5)
    assert h.recv(idle) == [Close(Status.NOT_AUTHORIZED, "not authenticated within the auth timeout")]
    assert not authed.closing and not waiting.closing
    h.finish_checks()
    assert h.recv(waiting) == [Response(1, Status.OK)]
    h.tick(11)
    assert not waiting.closing


def test_reload_on_a_parked_fetcher_keeps_order() -> None:
    """A paused fetcher's held-back change of a key comes before the key's FETCH_REMOVE
    when a reload takes the key away (PROTOCOL.md 10.8, 15.5)."""
    h = Harness(make_access(["p/a", "p/b"]))
    owner, viewer = h.connect(), h.connect()
    h.login(owner, "owner", "o")
    h.login(viewer, "viewer", "v")
    h.send(owner, AddState(1, "p/a", f(1)), AddState(2, "p/b", f(2)), AddState(3, "p/c", f(3)))
    h.send(viewer, FetchStates(4, "p/"))
    ok, *adds = h.recv(viewer)
    fid = ok.fetch_id  # type: ignore[attr-defined]
    assert adds == [FetchAdd(fid, "p/a", f(1)), FetchAdd(fid, "p/b", f(2))]
    h.daemon.pause(viewer, Config().soft_limit)
    h.send(owner, NotifyState(None, "p/a", f(10)), NotifyState(None, "p/c", f(30)))
    h.daemon.set_access(make_access(["p/b", "p/c"]), h.now)
    assert h.recv(viewer) == [
        FetchChange(fid, "p/a", f(10)),  # the change it missed, before the key goes
        FetchRemove(fid, "p/a", f(10)),
        FetchAdd(fid, "p/c", f(30)),
    ]
    h.send(owner, NotifyState(None, "p/a", f(11)), NotifyState(None, "p/c", f(31)))
    caught_up: list[Message] = []
    while not h.daemon.drained(viewer):  # the IO layer writes the catch-up, then asks again
        caught_up += h.recv(viewer)
    assert caught_up + h.recv(viewer) == [FetchChange(fid, "p/c", f(31))]
    h.send(owner, NotifyState(None, "p/a", f(12)), NotifyState(None, "p/c", f(32)))
    assert h.recv(viewer) == [FetchChange(fid, "p/c", f(32))]


def test_write_cache_follows_reloads() -> None:
    h = Harness(make_access(["p/"]))
    owner, viewer = h.connect(), h.connect()
    h.login(owner, "owner", "o")
    h.login(viewer, "viewer", "v")
    h.send(owner, AddState(1, "p/a", f(1)))
    h.recv(owner)
    h.send(viewer, SetState(2, "p/a", f(2)))
    assert h.recv(viewer) == [Response(2, Status.NOT_AUTHORIZED, message="not authorized: write p/a")]
    assert viewer.writable == set()  # a denied key is not cached: the careful path checks it
    granted = make_access(["p/"])
    granted.users.users["viewer"].write = ["p/a"]
    h.daemon.set_access(Access(granted.users), h.now)
    assert viewer.writable == set()  # the cache starts over
    h.send(viewer, SetState(3, "p/a", f(3)), SetState(4, "p/a", f(4)))  # careful path, then the fast one
    routed = h.recv(owner)
    assert [m.key for m in routed] == ["p/a", "p/a"]  # type: ignore[attr-defined]
    assert viewer.writable == {b"p/a"}
    # A user removed from the file keeps the connection, with no permissions.
    h.daemon.set_access(Access(UsersFile()), h.now)
    h.send(viewer, GetState(5, "p/a"))
    assert h.recv(viewer) == [Response(5, Status.NOT_AUTHORIZED, message="not authorized: user viewer has no permissions")]


def test_without_auth_nothing_is_checked() -> None:
    h = Harness(None)
    conn = h.connect()
    assert conn.perms is None and conn.writable is None
    h.send(conn, Authenticate(1, "anyone", "x"), AddState(2, "any/key", f(1)))
    assert h.recv(conn) == [Response(1), Response(2)]
    assert conn.user is None and h.jobs == []


def test_reload_during_a_sliced_fetch_delivery() -> None:
    """A fetch still delivering its initial adds in slices (PROTOCOL.md 10.5) when a reload
    narrows its read: what the peer ends up with is exactly the readable states."""
    from jetd.scheduler import DEFAULT_DELIVERY_SLICE as DELIVERY_SLICE

    keys = [f"p/k{i:04d}" for i in range(DELIVERY_SLICE + 300)]
    h = Harness(make_access(["p/"]))
    owner, viewer = h.connect(), h.connect()
    h.login(owner, "owner", "o")
    h.login(viewer, "viewer", "v")
    h.send(owner, *(AddState(i, key, f(i)) for i, key in enumerate(keys)))
    h.recv(owner)
    h.send(viewer, FetchStates(1, "p/"))
    assert viewer.delivery is not None  # the first slice only: the rest comes from work()
    seen: dict[str, Value] = {}

    def apply(messages: list[Message]) -> None:
        for message in messages:
            if isinstance(message, FetchAdd):
                assert message.key not in seen
                seen[message.key] = message.value
            elif isinstance(message, FetchRemove):
                del seen[message.key]

    apply(h.recv(viewer)[1:])
    h.daemon.set_access(make_access(["p/k1", "p/k2"]), h.now)
    for _ in range(100):
        if viewer.delivery is None:
            break
        h.daemon.work(h.now)
        apply(h.recv(viewer))
    apply(h.recv(viewer))
    assert viewer.delivery is None
    assert sorted(seen) == [key for key in keys if key.startswith(("p/k1", "p/k2"))]
    h.send(owner, NotifyState(None, "p/k0001", f(-1)), NotifyState(None, "p/k1001", f(-2)))
    assert [(type(m), m.key) for m in h.recv(viewer)] == [(FetchChange, "p/k1001")]  # type: ignore[attr-defined]


def _query_access(viewer_read: list[str]) -> Access:
    access = make_access(viewer_read)
    access.users.users["owner"] = User(password=cheap_hash("o"), own=["p/", "q/"], read=[""], write=["p/"])
    return Access(access.users)


def test_queries_see_only_readable_keys() -> None:
    """PROTOCOL.md 15.4: a query (FETCH_QUERY, QUERY_ONCE) sees only the states, methods
    and nodes its connection may read, for its initial entries and every later event;
    one that could see nothing is refused, naming the permission."""
    from jetwire import QUERY_METHODS
    from jetwire import QUERY_NODES
    from jetwire import AddMethod
    from jetwire import FetchMethod
    from jetwire import FetchQuery
    from jetwire import PathMatcher
    from jetwire import PathOp
    from jetwire import Query
    from jetwire import QueryOnce
    from jetwire import SortBy

    h = Harness(_query_access(["p/a/", "p/c/"]))
    owner, viewer = h.connect(), h.connect()
    h.login(owner, "owner", "o")
    h.login(viewer, "viewer", "v")
    for i, key in enumerate(["p/a/1", "p/b/1", "p/c/1", "q/x"]):
        h.send(owner, AddState(i, key, f(i)))
    h.send(owner, AddMethod(10, "p/a/m"), AddMethod(11, "p/b/m"))
    h.recv(owner)
    everything = Query((PathMatcher(PathOp.STARTS_WITH, ("p/",)),), flags=QUERY_METHODS | QUERY_NODES)
    h.send(viewer, FetchQuery(1, everything))
    ok, *initial = h.recv(viewer)
    fid = ok.fetch_id  # type: ignore[attr-defined]
    assert [(type(m).__name__, m.key) for m in initial] == [  # type: ignore[attr-defined]
        ("FetchAdd", "p/a/1"), ("FetchMethod", "p/a/m"), ("FetchAdd", "p/c/1"),
    ]
    # No node shows: "p", "p/a" ... are not within "p/a/" or "p/c/". Live: only readable keys.
    h.send(owner, NotifyState(None, "p/b/1", f(20)), NotifyState(None, "p/a/1", f(21)), AddState(12, "p/c/2", f(22)))
    h.send(owner, AddMethod(13, "p/b/n"), AddMethod(14, "p/c/n"))
    h.recv(owner)
    assert h.recv(viewer) == [
        FetchChange(fid, "p/a/1", f(21)),
        FetchAdd(fid, "p/c/2", f(22)),
        FetchMethod(fid, 1, "p/c/n"),
    ]
    # A query with no prefix is limited to the readable prefixes; one-shot too, sorted.
    by_value = Query((PathMatcher(PathOp.ENDS_WITH, ("1",)),), sort_by=SortBy.VALUE, window_from=1, window_to=10)
    h.send(viewer, QueryOnce(2, by_value))
    *entries, done = h.recv(viewer)
    assert [(e.key, e.value) for e in entries] == [("p/c/1", f(2)), ("p/a/1", f(21))]  # type: ignore[attr-defined]
    assert done == Response(2, Status.OK)
    # A query that could see nothing is refused; the connection stays.
    h.send(viewer, FetchQuery(3, Query((PathMatcher(PathOp.STARTS_WITH, ("q/",)),))))
    assert h.recv(viewer) == [Response(3, Status.NOT_AUTHORIZED, message="not authorized: read q/")]
    # A user who may read everything runs the same query in a group of its own.
    h.send(owner, QueryOnce(4, by_value))
    assert [e.key for e in h.recv(owner)[:-1]] == ["p/c/1", "p/b/1", "p/a/1"]  # type: ignore[attr-defined]


def test_a_reload_brings_query_fetches_in_line() -> None:
    """PROTOCOL.md 15.5 for queries: an unsorted fetch gets FETCH_REMOVE for what it may
    no longer read, then FETCH_ADD for what it may read now; a sorted one its whole window."""
    from jetwire import FetchQuery
    from jetwire import FetchWindow
    from jetwire import PathMatcher
    from jetwire import PathOp
    from jetwire import Query
    from jetwire import SortBy

    h = Harness(_query_access(["p/a/", "p/c/"]))
    owner, viewer = h.connect(), h.connect()
    h.login(owner, "owner", "o")
    h.login(viewer, "viewer", "v")
    for i, key in enumerate(["p/a/1", "p/b/1", "p/c/1"]):
        h.send(owner, AddState(i, key, f(i)))
    h.recv(owner)
    plain = Query((PathMatcher(PathOp.STARTS_WITH, ("p/",)),))
    top = Query((PathMatcher(PathOp.STARTS_WITH, ("p/",)),), sort_by=SortBy.VALUE, window_from=1, window_to=2)
    h.send(viewer, FetchQuery(1, plain), FetchQuery(2, top))
    first = h.recv(viewer)
    fid, wid = first[0].fetch_id, first[3].fetch_id  # type: ignore[attr-defined]
    assert first[1:3] == [FetchAdd(fid, "p/a/1", f(0)), FetchAdd(fid, "p/c/1", f(2))]
    assert [(e.index, e.key) for e in first[4].entries] == [(1, "p/a/1"), (2, "p/c/1")]  # type: ignore[attr-defined]
    h.daemon.set_access(_query_access(["p/b/", "p/c/"]), h.now)
    events = h.recv(viewer)
    assert events[:2] == [FetchRemove(fid, "p/a/1", f(0)), FetchAdd(fid, "p/b/1", f(1))]
    [window] = events[2:]
    assert isinstance(window, FetchWindow) and window.fetch_id == wid and window.size == 2
    assert [(e.index, e.key) for e in window.entries] == [(1, "p/b/1"), (2, "p/c/1")]
    # Live events follow the new permissions.
    h.send(owner, NotifyState(None, "p/a/1", f(9)), NotifyState(None, "p/b/1", f(-1)))
    h.recv(owner)
    events = h.recv(viewer)
    assert events[0] == FetchChange(fid, "p/b/1", f(-1))
    assert all(getattr(e, "key", "") != "p/a/1" for e in events)
