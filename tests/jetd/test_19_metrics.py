"""19-metrics: the daemon's own states under ``$jet/`` (PROTOCOL.md 16, issue 33), in the
core with a fake clock and through real TCP against a real jetd."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jetd.metrics import DAEMON_KEY
from jetd.metrics import MAX_NEW_PEERS_PER_TICK
from jetd.metrics import OWNED_LISTED
from jetwire import AddMethod
from jetwire import AddState
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Message
from jetwire import NotifyState
from jetwire import PathMatcher
from jetwire import PathOp
from jetwire import Query
from jetwire import QueryEntry
from jetwire import QueryOnce
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from tests.conftest import DaemonProcess
from tests.jetd.jetd_testlib import RawPeer
from tests.jetd.test_00_core import Harness
from tests.jetd.test_14_security import login
from tests.jetd.test_14_security import write_users

WAIT = 15.0  # the states change once a second; generous for a busy machine

DAEMON_FIELDS = {
    "version", "uptime_s", "connections", "authenticated", "states", "methods", "fetches", "query_groups",
    "frames_in", "frames_out", "bytes_in", "bytes_out", "routed", "route_timeouts", "route_p50_ms",
    "route_p99_ms", "owners_gone", "slow_pauses", "slow_closes", "budget_closes", "auth_failures", "log_bytes",
    "fsync_p99_ms", "fsync_errors", "rss_bytes",
}
PEER_FIELDS = {"id", "name", "address", "transport", "user", "states", "methods", "owned", "fetches",
               "queued_bytes", "paused"}


def v(x: Any) -> Value:
    return Value.of(x)


def doc(message: Message) -> dict[str, Any]:
    value = message.value
    assert value.vtype == 0x05, value  # JSON
    document = value.data if isinstance(value.data, dict) else json.loads(value.data)
    assert isinstance(document, dict)
    return document


def ask(peer: RawPeer, make: Callable[[int], Message]) -> Response:
    """Send a request and return its answer, skipping the fetch events before it."""
    rid = peer.next_id()
    peer.send(make(rid))
    answer, _ = peer.recv_until(lambda m: isinstance(m, Response) and m.id == rid, WAIT)
    assert isinstance(answer, Response)
    return answer


def until(peer: RawPeer, test: Callable[[Message], bool]) -> Message:
    message, _ = peer.recv_until(test, WAIT)
    return message


# --- in the core, with a fake clock -------------------------------------------------------


def test_states_appear_on_the_first_tick_and_peers_come_and_go() -> None:
    h = Harness()
    owner = h.connect("owner")
    h.send(owner, AddState(1, "a/x", v(1)), AddMethod(2, "a/m"))
    h.tick(0.1)
    registry = h.daemon.registry
    assert registry.value(DAEMON_KEY) is not None
    key = f"$jet/peers/{owner.conn_id}".encode()
    assert key in registry.states
    h.send(owner, GetState(3, key.decode()))
    answer = h.recv(owner)[-1]
    assert isinstance(answer, Response) and answer.status == Status.OK
    assert answer.value is not None
    peer = doc(answer)
    assert set(peer) >= PEER_FIELDS
    assert peer["address"] == "mem:owner" and peer["owned"] == ["a/m", "a/x"] and peer["states"] == 1
    h.daemon.disconnect(owner, h.now)
    h.tick(1.0)
    assert key not in registry.states


def test_unwatched_states_are_encoded_at_most_every_ten_seconds() -> None:
    h = Harness()
    h.tick(0.1)
    registry = h.daemon.registry
    first = registry.value(DAEMON_KEY)
    h.daemon.stats.routed += 1  # a change nobody watches
    h.tick(1.5)
    assert registry.value(DAEMON_KEY) is first
    h.tick(10.0)
    second = registry.value(DAEMON_KEY)
    assert second is not first
    watcher = h.connect("watcher")
    h.send(watcher, FetchStates(1, "$jet/daemon"))
    assert isinstance(h.recv(watcher)[-1], FetchAdd)
    h.daemon.stats.routed += 1
    h.tick(1.0)
    changes = h.recv(watcher)
    assert len(changes) == 1 and isinstance(changes[0], FetchChange) and doc(changes[0])["routed"] == 2
    h.tick(0.5)  # at most once a second
    assert h.recv(watcher) == []


def test_owned_lists_the_first_keys_only() -> None:
    h = Harness()
    owner = h.connect("many")
    h.send(owner, *(AddState(i + 1, f"k/{i:03}", v(i)) for i in range(OWNED_LISTED + 5)))
    h.tick(0.1)
    value = h.daemon.registry.value(f"$jet/peers/{owner.conn_id}".encode())
    assert value is not None
    document = json.loads(value[value.index(b"{"):])
    assert document["owned"] == [f"k/{i:03}" for i in range(OWNED_LISTED)] and document["states"] == OWNED_LISTED + 5


def test_a_set_event_for_a_daemon_state_is_dropped() -> None:
    h = Harness()
    h.tick(0.1)
    before = h.daemon.registry.value(DAEMON_KEY)
    peer = h.connect("p")
    h.send(peer, SetState(None, "$jet/daemon", v(1)))  # fire-and-forget (PROTOCOL.md 7.1)
    assert h.daemon.registry.value(DAEMON_KEY) is before
    owner = h.daemon.metrics.owner
    assert not owner.out and not owner.pending and not peer.closing and peer.violations == 1


def test_a_storm_of_connections_is_published_over_several_ticks() -> None:
    h = Harness(max_connections=MAX_NEW_PEERS_PER_TICK + 100)
    for _ in range(MAX_NEW_PEERS_PER_TICK + 10):
        h.daemon.connect("mem:storm", h.now)
    h.tick(0.1)
    published = [k for k in h.daemon.registry.states if k.startswith(b"$jet/peers/")]
    assert len(published) == MAX_NEW_PEERS_PER_TICK
    h.tick(1.0)
    published = [k for k in h.daemon.registry.states if k.startswith(b"$jet/peers/")]
    assert len(published) == MAX_NEW_PEERS_PER_TICK + 10


def test_a_fetch_of_everything_does_not_see_jet() -> None:
    h = Harness()
    owner = h.connect("o")
    h.send(owner, AddState(1, "a", v(1)))
    h.tick(0.1)
    fetcher = h.connect("f")
    h.send(fetcher, FetchStates(1, ""), FetchStates(2, "$"))
    answers = h.recv(fetcher)
    everything, dollar = (m.fetch_id for m in answers if isinstance(m, Response))
    keys = {(m.fetch_id, m.key) for m in answers if isinstance(m, FetchAdd)}
    assert (everything, "a") in keys and not any(k.startswith("$jet/") for f, k in keys if f == everything)
    assert (dollar, "$jet/daemon") in keys
    h.daemon.stats.routed += 5
    h.tick(1.0)
    assert {m.fetch_id for m in h.recv(fetcher)} == {dollar}


def test_the_fast_latency_table_agrees_with_bisect() -> None:
    import random
    from bisect import bisect_right

    from jetd.base import ROUTE_BUCKETS
    from jetd.base import RouteTimes

    times, expected = RouteTimes(5.0), [0] * (len(ROUTE_BUCKETS) + 1)
    rng = random.Random(33)
    for _ in range(20_000):
        latency = rng.choice([rng.uniform(0, 0.2), rng.uniform(0, 0.001), rng.choice(ROUTE_BUCKETS) * 1.001,
                              rng.choice(ROUTE_BUCKETS) * 0.999, rng.uniform(0.1, 6.0)])
        times.observe_ok(latency - 5.0)  # the deadline is the start plus the 5 s timeout
        expected[bisect_right(ROUTE_BUCKETS, latency)] += 1
    assert times.ok == expected
    cumulative, total = times.histogram(0)
    assert cumulative[-1] == 20_000 and total > 0


# --- a real jetd over TCP -----------------------------------------------------------------


def test_daemon_and_peer_states_arrive_by_fetch_and_change(jetd: DaemonProcess) -> None:
    with RawPeer(jetd.address, "watcher") as watcher, RawPeer(jetd.address, "boiler") as owner:
        response = watcher.request(lambda i: FetchStates(i, "$jet/"))
        assert response.status == Status.OK
        daemon = doc(until(watcher, lambda m: isinstance(m, (FetchAdd, FetchChange)) and m.key == "$jet/daemon"))
        assert set(daemon) >= DAEMON_FIELDS
        assert set(daemon["connections"]) >= {"tcp", "tls", "websocket"}
        before = daemon["states"]
        assert owner.request(lambda i: AddState(i, "plant/t", v(20.5))).status == Status.OK
        owner_id = None

        def owner_seen(m: Message) -> bool:
            return isinstance(m, (FetchAdd, FetchChange)) and m.key.startswith("$jet/peers/") and doc(m)["name"] == "boiler" \
                and doc(m)["states"] == 1

        peer = doc(until(watcher, owner_seen))
        assert set(peer) >= PEER_FIELDS and peer["owned"] == ["plant/t"] and peer["transport"] == "tcp"
        owner_id = peer["id"]
        changed = until(watcher, lambda m: isinstance(m, FetchChange) and m.key == "$jet/daemon"
                        and doc(m)["states"] > before)
        assert doc(changed)["connections"]["tcp"] >= 2
        owner.close()
        gone = until(watcher, lambda m: isinstance(m, FetchRemove) and m.key == f"$jet/peers/{owner_id}")
        assert gone is not None
        got = ask(watcher, lambda i: GetState(i, "$jet/daemon"))
        assert got.status == Status.OK and set(doc(got)) >= DAEMON_FIELDS


def test_no_peer_may_add_or_set_under_jet(jetd: DaemonProcess) -> None:
    with RawPeer(jetd.address, "squatter") as peer:
        for make in (lambda i: AddState(i, "$jet/mine", v(1)), lambda i: AddMethod(i, "$jet/call"),
                     lambda i: AddState(i, "$jet/daemon", v(1))):
            refused = peer.request(make)
            assert refused.status == Status.NOT_AUTHORIZED and "$jet/" in (refused.message or ""), refused
        response = peer.request(lambda i: FetchStates(i, "$jet/daemon"))
        until(peer, lambda m: isinstance(m, FetchAdd))  # the daemon's state exists
        refused = ask(peer, lambda i: SetState(i, "$jet/daemon", v({"states": 0})))
        assert refused.status == Status.NOT_AUTHORIZED, refused
        assert ask(peer, lambda i: NotifyState(i, "$jet/daemon", v(1))).status == Status.NOT_OWNER
        assert response.status == Status.OK
        # Still connected and served.
        assert ask(peer, lambda i: AddState(i, "jet/fine", v(1))).status == Status.OK


def test_queries_see_jet_only_when_they_name_it(jetd: DaemonProcess) -> None:
    with RawPeer(jetd.address, "asker") as peer:
        assert peer.request(lambda i: FetchStates(i, "$jet/daemon")).status == Status.OK
        until(peer, lambda m: isinstance(m, FetchAdd))

        def entries(query: Query) -> list[str]:
            rid = peer.next_id()
            peer.send(QueryOnce(rid, query))
            done, before = peer.recv_until(lambda m: isinstance(m, Response) and m.id == rid, WAIT)
            assert isinstance(done, Response) and done.status == Status.OK, done
            return [m.key for m in before if isinstance(m, QueryEntry)]

        assert "$jet/daemon" in entries(Query((PathMatcher(PathOp.STARTS_WITH, ("$jet/",)),)))
        assert not [k for k in entries(Query((PathMatcher(PathOp.CONTAINS, ("daemon",)),))) if k.startswith("$jet")]


def test_a_user_without_read_on_jet_sees_none_of_it(start_jetd: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    users = {
        "plant": {"password": "p-pw", "read": ["plant/"]},
        "ops": {"password": "o-pw", "read": ["$jet/", "plant/"]},
        "all": {"password": "a-pw", "read": [""]},
    }
    daemon = start_jetd("--auth", str(write_users(tmp_path / "users.toml", users)), "--auth-failure-delay", "0.1")
    ops = login(daemon, "ops", "o-pw")
    plant = login(daemon, "plant", "p-pw")
    everything = login(daemon, "all", "a-pw")
    with ops, plant, everything:
        assert ops.request(lambda i: FetchStates(i, "$jet/")).status == Status.OK
        peer = doc(until(ops, lambda m: isinstance(m, (FetchAdd, FetchChange)) and m.key.startswith("$jet/peers/")
                         and doc(m)["user"] == "plant"))
        assert peer["user"] == "plant"
        refused = plant.request(lambda i: FetchStates(i, "$jet/"))
        assert refused.status == Status.NOT_AUTHORIZED
        assert ask(plant, lambda i: GetState(i, "$jet/daemon")).status == Status.NOT_AUTHORIZED
        fetched = plant.request(lambda i: FetchStates(i, ""))
        assert fetched.status == Status.OK
        # A user who reads everything fetches everything but $jet/, unless it asks for it.
        assert everything.request(lambda i: FetchStates(i, "")).status == Status.OK
        assert ask(everything, lambda i: FetchStates(i, "$jet/daemon")).status == Status.OK
        add = until(everything, lambda m: isinstance(m, FetchAdd))
        assert add.key == "$jet/daemon"  # type: ignore[attr-defined]
        daemon_doc = doc(until(ops, lambda m: isinstance(m, FetchChange) and m.key == "$jet/daemon"
                               and doc(m)["authenticated"] >= 3))
        assert daemon_doc["authenticated"] >= 3
        plant.nothing_within(0.3)
