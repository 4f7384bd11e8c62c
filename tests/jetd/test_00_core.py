"""The sans-IO core without sockets: a Daemon and in-memory connections (h11's
ConnectionPair idea), the registries, the conflating queue, and the fast body checks
against jetwire's decoder."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from inmemory import MemoryPeers

from jetd.config import Config
from jetd.core import Connection
from jetd.core import Daemon
from jetd.core import Fetch
from jetd.core import FetchRegistry
from jetd.core import RouteTable
from jetd.core import StateRegistry
from jetd.frames import key_value_end
from jetd.frames import value_ok
from jetwire import AddMethod
from jetwire import AddState
from jetwire import CallMethod
from jetwire import Close
from jetwire import Decoder
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Info
from jetwire import Message
from jetwire import NotifyState
from jetwire import RemoteProtocolError
from jetwire import RemoveState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import decode_body
from jetwire import encode
from jetwire.codec import is_utf8


class Harness(MemoryPeers):
    """A Daemon with in-memory peers whose IO layer runs the pending work after every
    read: ``send(conn, *msgs)`` then ``recv(conn)``."""

    def __init__(self, **settings: object) -> None:
        super().__init__(Daemon(Config(**settings)))  # type: ignore[arg-type]
        self.written: dict[int, list[bytes]] = {}  # what the "IO layer" wrote per connection

    def connect(self, name: str = "") -> Connection:  # type: ignore[override]
        return super().connect(f"mem:{name}")

    def send(self, conn: Connection, *messages: Message) -> None:
        super().send(conn, *messages)
        self.pump()

    def pump(self) -> None:
        """What the IO layer does after a read: write out (here: the output stays in
        ``conn.out`` for recv, but counts as written), then run the pending work until
        there is none."""
        self._write()
        while self.daemon.has_work:
            self.daemon.work(self.now)
            self._write()

    def _write(self) -> None:
        for conn in self.daemon.take_dirty():
            self.written.setdefault(conn.conn_id, []).extend(conn.out)
            conn.out.clear()

    def output(self, conn: Connection) -> bytes:
        self.pump()
        return b"".join(self.written.pop(conn.conn_id, []))


def v(x: object) -> Value:
    return Value.of(x)  # type: ignore[arg-type]


def test_route_and_fetch_through_the_core():
    h = Harness()
    owner, client = h.connect("o"), h.connect("c")
    h.send(owner, AddState(1, "a", v(1)))
    assert h.recv(owner) == [Response(1, Status.OK)]
    h.send(client, FetchStates(2, ""), SetState(3, "a", v(5)))
    ok, add = h.recv(client)
    fid = ok.fetch_id
    assert add == FetchAdd(fid, "a", v(1))
    routed = h.recv(owner)
    assert len(routed) == 1 and routed[0].key == "a"
    h.send(owner, NotifyState(None, "a", v(5)), Response(routed[0].id, Status.OK, v(5)))
    assert h.recv(client) == [FetchChange(fid, "a", v(5)), Response(3, Status.OK, v(5))]
    assert h.daemon.stats.routed == 1


def test_fan_out_events_are_right_for_every_value_length():
    # The inlined fan-out takes an event's head from a table below 1,024 bytes of key and
    # value and packs it above, and (compiled) keeps each fetch's head and id joined from
    # one change to the next: lengths that cross the table's end and come back.
    h = Harness()
    owner, first, second = h.connect("o"), h.connect("a"), h.connect("b")
    h.send(owner, AddState(1, "k", v(b"")))
    h.recv(owner)
    fids = []
    for conn in (first, second):
        h.send(conn, FetchStates(2, ""))
        ok, _ = h.recv(conn)
        fids.append(ok.fetch_id)
    # key and value = 2 + 1 + 5 + n bytes: n = 1015 is the table's last entry, 1016 the first packed
    sizes = [0, 1015, 1016, 1015, 3000, 1016, 7, 7, 4000, 0]
    h.send(owner, *(NotifyState(None, "k", v(bytes([i % 256]) * n)) for i, n in enumerate(sizes)))
    for conn, fid in zip((first, second), fids, strict=True):
        assert h.recv(conn) == [FetchChange(fid, "k", v(bytes([i % 256]) * n)) for i, n in enumerate(sizes)]


def test_route_timeout_driven_by_now():
    h = Harness(route_timeout=2.0)
    owner, client = h.connect(), h.connect()
    h.send(owner, AddState(1, "a", v(1)))
    h.recv(owner)
    h.send(client, SetState(9, "a", v(2)))
    routed = h.recv(owner)[0]
    h.tick(1.9)
    assert h.recv(client) == []
    h.tick(0.2)
    [answer] = h.recv(client)
    assert (answer.id, answer.status) == (9, Status.TIMEOUT)
    h.send(owner, Response(routed.id, Status.OK, v(2)))  # late: dropped
    assert h.recv(client) == []
    assert owner.routes == {}


def test_route_ids_skip_ids_in_use_and_wrap():
    table = RouteTable(5.0)
    owner, requester = Connection(1, "o"), Connection(2, "r")
    owner.next_route_id = 0xFFFF_FFFE
    first = table.open(requester, 1, owner, 3, b"k", 0.0)
    second = table.open(requester, 2, owner, 3, b"k", 0.0)
    third = table.open(requester, 3, owner, 3, b"k", 0.0)
    assert [first.oid, second.oid, third.oid] == [0xFFFF_FFFE, 0xFFFF_FFFF, 0]
    owner.next_route_id = 0xFFFF_FFFF  # in use: skipped
    assert table.open(requester, 4, owner, 3, b"k", 0.0).oid == 1
    assert [r.oid for r in table.expired(10.0)] == [0xFFFF_FFFE, 0xFFFF_FFFF, 0, 1]


def test_state_registry_prefix_scan_is_a_range():
    registry = StateRegistry()
    owner = Connection(1, "o")
    for key in (b"b", b"a/2", b"a/1", b"a", b"a0", b"\xc3\xa9"):
        registry.add_state(key, b"kv:" + key, owner)
    assert [k for k, _ in registry.matching(b"a/")] == [b"a/1", b"a/2"]
    assert [k for k, _ in registry.matching(b"")] == [b"a", b"a/1", b"a/2", b"a0", b"b", b"\xc3\xa9"]
    assert [k for k, _ in registry.matching(b"c")] == []
    assert registry.remove_state(b"a/1") == b"kv:a/1"
    assert list(registry.matching(b"a/")) == [(b"a/2", b"kv:a/2")]
    assert set(owner.states) == {b"b", b"a/2", b"a", b"a0", b"\xc3\xa9"}


def test_fetch_registry_visits_only_matching_prefixes():
    registry = FetchRegistry()
    conn = Connection(1, "c")
    fetches = [Fetch(i, conn, p) for i, p in enumerate([b"", b"plant/", b"plant/line3/", b"other/", b"plant/"], 1)]
    for fetch in fetches:
        registry.add(fetch)
    # 1000 fetches on unrelated prefixes of an existing length do not add matches.
    for i in range(1000):
        registry.add(Fetch(100 + i, conn, b"zz%04d" % i))
    matched = sorted(f.fid for g in registry.groups(b"plant/line3/temp") for f in g.values())
    assert matched == [1, 2, 3, 5]
    registry.remove(fetches[1])
    matched = sorted(f.fid for g in registry.groups(b"plant/x") for f in g.values())
    assert matched == [1, 5]
    assert registry.lengths == [0, 6, 12]


def test_parked_fetches_get_latest_values_in_order():
    # PROTOCOL.md 10.8: changes held back per (fetch, key), latest value, never reordered
    # against ADD/REMOVE of the same key, nor after a response they precede (10.5).
    h = Harness()
    owner, slow = h.connect(), h.connect()
    h.send(owner, AddState(1, "k", v(0)), AddState(2, "j", v(0)))
    h.recv(owner)
    h.send(slow, FetchStates(1, ""), FetchStates(2, "k"))
    f7, f8 = h.recv(slow)[0::3]
    f7, f8 = f7.fetch_id, f8.fetch_id
    h.daemon.pause(slow, 1 << 20)
    h.send(owner, NotifyState(None, "k", v(1)), NotifyState(None, "j", v(1)), NotifyState(None, "k", v(2)))
    assert not slow.pending and h.recv(slow) == []  # a paused peer costs nothing per change
    h.send(owner, RemoveState(3, "k"))
    h.send(owner, AddState(4, "k", v(5)), NotifyState(None, "k", v(6)), NotifyState(None, "k", v(7)))
    h.send(slow, GetState(9, "j"))
    h.send(owner, NotifyState(None, "j", v(8)))
    assert h.drain(slow) == [
        FetchChange(f7, "k", v(2)),  # the key's change before its REMOVE
        FetchChange(f8, "k", v(2)),
        FetchRemove(f7, "k", v(2)),
        FetchRemove(f8, "k", v(2)),
        FetchAdd(f7, "k", v(5)),
        FetchAdd(f8, "k", v(5)),
        Response(9, Status.OK, v(1)),
        FetchChange(f7, "j", v(8)),  # the rest when it drains, in order of first change
        FetchChange(f7, "k", v(7)),
        FetchChange(f8, "k", v(7)),
    ]
    assert h.daemon.stats.caught_up == 5 and h.daemon.stats.parked == 1
    # Live again: every change goes straight out.
    h.send(owner, NotifyState(None, "j", v(9)))
    assert h.recv(slow) == [FetchChange(f7, "j", v(9))]
    assert h.daemon.subscriptions.changed == {}


def test_paused_connection_conflates_and_hard_limit_overloads():
    h = Harness(soft_limit=100, hard_limit=2000)
    owner, slow = h.connect(), h.connect()
    h.send(owner, AddState(1, "a", v(0)), AddState(2, "b", v(0)))
    h.recv(owner)
    h.send(slow, FetchStates(1, ""))
    fid = h.recv(slow)[0].fetch_id
    h.daemon.pause(slow, 150)
    h.send(owner, *(NotifyState(None, "a", v(i)) for i in range(100)), NotifyState(None, "b", v(7)))
    assert h.drain(slow) == [FetchChange(fid, "a", v(99)), FetchChange(fid, "b", v(7))]
    assert h.daemon.stats.caught_up == 2
    # Non-conflatable events pile up until the hard limit: CLOSE OVERLOADED.
    h.daemon.pause(slow, 150)
    for i in range(100):
        h.send(owner, AddState(10 + i, f"n{i}", v(b"x" * 50)))
    assert slow.closed
    [close] = h.recv(slow)
    assert close == Close(Status.OVERLOADED, "output above the hard limit")
    h.send(owner, NotifyState(None, "a", v(1)))  # nothing more for it
    assert h.recv(slow) == []
    assert h.daemon.subscriptions.parked == 0 and h.daemon.subscriptions.changed == {}


def test_parked_peer_gets_the_change_it_caused_before_the_answer():
    # PROTOCOL.md 10.5 with 10.8: a parked requester's own set, and a parked owner's own
    # NOTIFY_STATE request, are answered after their change; other changes wait for the drain.
    h = Harness()
    owner, slow = h.connect(), h.connect()
    h.send(owner, AddState(1, "k", v(0)), AddState(2, "j", v(0)), FetchStates(3, "k"))
    own_fid = h.recv(owner)[2].fetch_id
    h.send(slow, FetchStates(1, ""))
    fid = h.recv(slow)[0].fetch_id
    h.daemon.pause(slow, 1 << 20)
    h.daemon.pause(owner, 1 << 20)
    h.send(owner, NotifyState(None, "j", v(1)))
    h.send(slow, SetState(5, "k", v(3)))
    h.send(owner, NotifyState(None, "k", v(3)), Response(1, Status.OK, v(3)), NotifyState(7, "k", v(4)))
    decoder = Decoder()
    decoder.receive_data(b"".join(owner.take_pending(1 << 20)))
    assert list(decoder.messages()) == [
        SetState(1, "k", v(3)), FetchChange(own_fid, "k", v(4)), Response(7, Status.OK)]
    decoder = Decoder()
    decoder.receive_data(b"".join(slow.take_pending(1 << 20)))
    assert list(decoder.messages()) == [FetchChange(fid, "k", v(3)), Response(5, Status.OK, v(3))]
    assert h.drain(slow) == [FetchChange(fid, "j", v(1)), FetchChange(fid, "k", v(4))]


def test_catch_up_on_drain_is_bounded_by_the_hard_limit():
    # 10 fetches x 100 changed keys held back are ~61 kB: the catch-up is queued like any
    # output above the soft limit, so the hard limit still closes the peer.
    h = Harness(hard_limit=20_000)
    owner, slow = h.connect(), h.connect()
    h.send(owner, *(AddState(i, f"k{i:03d}", v(0)) for i in range(1, 101)))
    h.send(slow, *(FetchStates(i, "") for i in range(1, 11)))
    h.recv(owner)
    h.recv(slow)
    h.daemon.pause(slow, 100)
    h.send(owner, *(NotifyState(None, f"k{i:03d}", v(b"z" * 40)) for i in range(1, 101)))
    assert not h.daemon.drained(slow)
    assert slow.closed and h.recv(slow) == [Close(Status.OVERLOADED, "output above the hard limit")]
    assert h.daemon.subscriptions.parked == 0 and h.daemon.subscriptions.changed == {}


def test_a_close_during_the_catch_up_tears_the_connection_down():
    h = Harness()
    owner, slow = h.connect(), h.connect()
    h.send(slow, Info("slow", 64))  # accepts bodies of at most 64 bytes
    h.send(owner, AddState(1, "k", v(0)))
    h.send(slow, FetchStates(2, ""))
    h.recv(owner)
    h.recv(slow)
    h.daemon.pause(slow, 100)
    h.send(owner, NotifyState(None, "k", v(b"x" * 100)))  # held back: too large for it
    assert not h.daemon.drained(slow)
    assert slow.closed
    # Still paused: the IO layer writes the queue, which ends with the CLOSE.
    assert h.drain(slow) == [Close(Status.TOO_LARGE, "a fetch event of 113 bytes exceeds your max_body 64")]
    h.send(owner, NotifyState(None, "k", v(1)))
    assert slow.out == [] and not slow.pending


def test_closed_parked_connections_are_not_kept_alive():
    import gc

    h = Harness()
    owner = h.connect()
    for i in range(5):
        slow = h.connect(f"slow{i}")
        h.send(slow, FetchStates(1, ""))
        h.recv(slow)
        h.daemon.pause(slow, 100)
        h.send(owner, AddState(100 + i, f"k{i}", v(i)))  # a FETCH_ADD to the parked fetch
        h.daemon.disconnect(slow, h.now)
    del slow
    h.recv(owner)
    h.daemon.take_dirty()
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is Connection and o.closed]


def test_slow_deadline_overloads():
    h = Harness(soft_limit=100, slow_deadline=3.0)
    slow = h.connect()
    h.daemon.pause(slow, 150)
    h.tick(2.0)
    assert not slow.closing
    h.tick(1.5)
    assert slow.closed and h.recv(slow)[0].status == Status.OVERLOADED


def test_teardown_order_and_nothing_after_close():
    h = Harness()
    owner, client = h.connect(), h.connect()
    h.send(owner, AddState(1, "z", v(1)), AddState(2, "y", v(2)))
    h.recv(owner)
    h.send(client, FetchStates(1, ""), SetState(2, "y", v(3)))
    fid = h.recv(client)[0].fetch_id
    h.recv(owner)
    # A fatal frame from the owner: CLOSE is the last thing it gets.
    h.daemon.receive_data(owner, b"\x07\x00\x00\x00\x00" + encode(AddState(3, "x", v(1))), h.now)
    assert h.recv(owner) == [Close(Status.MALFORMED, "unknown frame type 0x07")]
    assert h.recv(client) == [
        Response(2, Status.OWNER_GONE, message="the owner disconnected"),
        FetchRemove(fid, "y", v(2)),
        FetchRemove(fid, "z", v(1)),
    ]
    h.daemon.disconnect(owner, h.now)
    assert h.daemon.registry.states == {}


def test_shutdown_closes_everyone_ok():
    h = Harness()
    peers = [h.connect() for _ in range(3)]
    h.daemon.shutdown(h.now)
    for peer in peers:
        assert h.recv(peer) == [Close(Status.OK, "shutting down")]
        assert peer.closed


def test_fetch_ids_never_reused():
    h = Harness()
    a, b = h.connect(), h.connect()
    seen = []
    for conn in (a, b, a):
        h.send(conn, FetchStates(1, "p"))
        seen.append(h.recv(conn)[0].fetch_id)
        h.send(conn, __import__("jetwire").Unfetch(2, seen[-1]))
        h.recv(conn)
    assert seen == [1, 2, 3]


def test_remove_state_fans_out_last_value():
    h = Harness()
    owner, f = h.connect(), h.connect()
    h.send(owner, AddState(1, "k", v(1)), NotifyState(None, "k", v(2)))
    h.recv(owner)
    h.send(f, FetchStates(1, "k"))
    fid = h.recv(f)[0].fetch_id
    h.send(owner, RemoveState(2, "k"))
    assert h.recv(f) == [FetchRemove(fid, "k", v(2))]


# --- the fast body checks agree with jetwire's decoder ---------------------------------------


def _kv_payload_accepted_by_jetwire(payload: bytes) -> bool:
    body = struct.pack(">IB", 1, 3) + payload  # SET_STATE request body
    try:
        decode_body(1, body)
    except RemoteProtocolError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(
    key=st.binary(min_size=0, max_size=6),
    vtype=st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0x7F, 0x80, 0xFF]),
    data=st.binary(max_size=10),
    length_delta=st.sampled_from([0, 0, 0, -1, 1]),
    trailing=st.binary(max_size=2),
)
def test_fast_key_value_check_matches_jetwire(key, vtype, data, length_delta, trailing):
    n = max(0, len(data) + length_delta)
    payload = struct.pack(">H", len(key)) + key + struct.pack(">BI", vtype, n) + data + trailing
    body = struct.pack(">IB", 1, 3) + payload
    kend = key_value_end(body, 5, len(body))
    # The daemon checks a key's UTF-8 when it is not registered (see _unknown_key).
    fast = kend >= 0 and is_utf8(body[7:kend])
    assert fast == _kv_payload_accepted_by_jetwire(payload)




@settings(max_examples=300, deadline=None)
@given(value=st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=20), st.binary(max_size=20)))
def test_value_check_accepts_every_valid_value(value):
    raw = encode(Response(1, Status.OK, Value.of(value)))[10:]
    assert value_ok(raw, 0, len(raw))


def test_owner_fetching_itself_is_held_back_then_overflows_when_it_drains():
    h = Harness(soft_limit=100, hard_limit=1000)
    owner = h.connect()
    h.send(owner, AddState(1, "a", v(0)), FetchStates(2, ""))
    h.recv(owner)
    h.daemon.pause(owner, 150)
    # On the notify fast path its own change is held back, not queued: it costs nothing.
    h.send(owner, NotifyState(None, "a", v(b"x" * 1200)), AddState(3, "b", v(1)))
    assert not owner.closed and owner.pending_size < 100
    # Draining, the catch-up is queued and goes over the hard limit.
    owner.take_pending(1 << 20)
    assert not h.daemon.drained(owner)
    assert owner.closed
    assert h.recv(owner) == [Close(Status.OVERLOADED, "output above the hard limit")]


def test_fetch_targets_cache_follows_fetch_changes():
    h = Harness()
    owner, f = h.connect(), h.connect()
    h.send(owner, AddState(1, "k", v(0)))
    h.recv(owner)
    h.send(owner, NotifyState(None, "k", v(1)))  # no fetchers yet: nothing cached
    h.send(f, FetchStates(1, "k"))
    first = h.recv(f)[0].fetch_id
    h.recv(f)
    h.send(owner, NotifyState(None, "k", v(2)))
    assert h.recv(f) == [FetchChange(first, "k", v(2))]
    h.send(f, FetchStates(2, ""))
    second = h.recv(f)[0].fetch_id
    h.send(owner, NotifyState(None, "k", v(3)))
    assert sorted(m.fetch_id for m in h.recv(f)) == [first, second]
    h.send(f, __import__("jetwire").Unfetch(3, first))
    h.recv(f)
    h.send(owner, NotifyState(None, "k", v(4)))
    assert h.recv(f) == [FetchChange(second, "k", v(4))]


# --- no input crashes the core, and its indexes stay consistent ------------------------------

_KEYS = ["a", "a/b", "b", "\u00e9"]
_message = st.one_of(
    st.builds(AddState, st.integers(0, 3), st.sampled_from(_KEYS), st.sampled_from([v(1), v("x"), v(None)])),
    st.builds(RemoveState, st.integers(0, 3), st.sampled_from(_KEYS)),
    st.builds(SetState, st.one_of(st.none(), st.integers(0, 3)), st.sampled_from(_KEYS), st.just(v(2))),
    st.builds(NotifyState, st.one_of(st.none(), st.integers(0, 3)), st.sampled_from(_KEYS), st.just(v(3))),
    st.builds(FetchStates, st.integers(0, 3), st.sampled_from(["", "a", "b", "zz"])),
    st.builds(__import__("jetwire").Unfetch, st.integers(0, 3), st.integers(0, 6)),
    st.builds(Response, st.integers(0, 6), st.sampled_from([Status.OK, Status.REJECTED])),
    st.builds(__import__("jetwire").AddMethod, st.integers(0, 3), st.sampled_from(_KEYS)),
    st.builds(__import__("jetwire").CallMethod, st.integers(0, 3), st.sampled_from(_KEYS), st.just(v(0))),
)
_step = st.tuples(
    st.integers(0, 2),  # which connection
    st.one_of(_message.map(encode), st.binary(max_size=12)),  # a message or raw bytes
    st.sampled_from(["send", "send", "send", "tick", "pause", "drain", "disconnect"]),
)


def _apply_step(h: Harness, conn: Connection, data: bytes, action: str) -> None:
    """One step of a random run: bytes from a peer, the clock, or the IO layer's flow control."""
    if action == "send":
        h.daemon.receive_data(conn, data, h.now)
    elif action == "tick":
        h.tick(0.6)
    elif action == "pause" and not conn.closing:
        h.daemon.pause(conn, 100)
    elif action == "drain" and conn.paused and not conn.closing:
        conn.take_pending(1 << 30)  # written; drained() may queue its catch-up for the next drain
        h.daemon.drained(conn)
    elif action == "disconnect":
        h.daemon.disconnect(conn, h.now)


def _check_invariants(daemon: Daemon) -> None:
    registry = daemon.registry
    assert list(registry.table.index) == sorted(registry.states)
    for key, owner in registry.states.items():
        assert not owner.closed and key in owner.states
    for key, owner in registry.methods.items():
        assert not owner.closed and key in owner.methods
    live = [c for c in daemon.connections.values() if not c.closed]
    # Every fetch is indexed exactly once: live, or parked while its connection is paused.
    indexed = {id(f): f for g in daemon.subscriptions.fetches.by_prefix.values() for f in g.values()}
    parked = {id(f): f for g in daemon.subscriptions.parked_fetches.by_prefix.values() for f in g.values()}
    assert not indexed.keys() & parked.keys()
    assert all(not f.conn.paused and not f.conn.parked for f in indexed.values())
    assert all(f.conn.parked for f in parked.values())
    assert len(indexed) + len(parked) == sum(len(c.fetches) for c in live)
    assert daemon.subscriptions.parked == len(parked)
    assert daemon.subscriptions.parked or not daemon.subscriptions.changed
    for conn in live:
        assert conn.pending_size == sum(map(len, conn.pending))
        assert conn.parked == (conn.paused and not conn.closing) or conn.closing
        for oid, route in conn.routes.items():
            assert route.owner is conn and route.oid == oid and not route.done


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(_step, max_size=40))
def test_any_input_keeps_the_core_consistent(steps):
    h = Harness(soft_limit=64, hard_limit=600, max_pending_per_owner=3, route_timeout=1.0)
    conns = [h.connect(str(i)) for i in range(3)]
    saw_close: set[int] = set()
    for which, data, action in steps:
        _apply_step(h, conns[which], data, action)
        if action == "disconnect":
            conns[which] = h.connect("again")
        _check_invariants(h.daemon)
        # Whatever went out decodes as valid jet, and nothing follows a CLOSE.
        for peer in conns:
            for message in h.recv(peer):
                assert peer.conn_id not in saw_close, message
                if isinstance(message, Close):
                    saw_close.add(peer.conn_id)


_BIG = b"x" * 80  # above the smallest max_body a peer may announce (64)
# Requesters' sets use ids far from the owner's route ids (1, 2, ...), so a mixed-up id shows.
_set = st.builds(SetState, st.integers(100, 103), st.sampled_from([*_KEYS, "zz"]),
                 st.sampled_from([v(2), v(True), v(_BIG), v("s"), v(None)]))
_METHODS = ["m/a", "m/b"]
_call = st.builds(CallMethod, st.integers(100, 103), st.sampled_from([*_METHODS, "zz"]),
                  st.sampled_from([v(2), v(False), v(_BIG), v("s"), v(None)]))
_answer = st.one_of(
    st.builds(Response, st.integers(1, 4), st.just(Status.OK), st.sampled_from([v(7), v(False), v(_BIG), None, v("t")])),
    st.builds(Response, st.integers(1, 4), st.just(Status.REJECTED), message=st.just("no")),
    st.builds(NotifyState, st.one_of(st.none(), st.integers(0, 3)), st.sampled_from(_KEYS), st.just(v(3))),
)
_info = st.builds(__import__("jetwire").Info, st.just("p"), st.sampled_from([64, 1 << 20]))


def _frames(messages: st.SearchStrategy[Message]) -> st.SearchStrategy[bytes]:
    # Now and then a message with its last byte changed: the fast checks must refuse it.
    return st.one_of(messages.map(encode), messages.map(encode), messages.map(encode),
                     messages.map(lambda m: encode(m)[:-1] + b"\x02"))


_route_step = st.one_of(
    st.tuples(st.integers(0, 2), _frames(_set), st.just("send")),  # peer 0 owns every key
    st.tuples(st.integers(0, 2), _frames(_call), st.just("send")),  # ... and every method
    st.tuples(st.just(0), _frames(_answer), st.just("send")),
    st.tuples(st.integers(0, 2), _frames(_info), st.just("send")),
    st.tuples(st.integers(0, 2), st.just(b""), st.sampled_from(["tick", "pause", "drain", "disconnect"])),
)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(_route_step, min_size=4, max_size=40))
def test_fast_paths_answer_like_the_careful_paths(steps):
    # With an event-log hook the core takes its careful paths for routed sets and calls
    # and their answers; without, its inlined fast paths. Peers must not be able to tell.
    settings = {"max_pending_per_owner": 3, "route_timeout": 1.0}
    fast, careful = Harness(**settings), Harness(**settings)
    careful.daemon = Daemon(Config(**settings), lambda *record: None)  # type: ignore[arg-type]
    pairs = [[h.connect(str(i)) for h in (fast, careful)] for i in range(3)]
    for h, owner in zip((fast, careful), pairs[0], strict=True):
        h.send(owner, *(AddState(i, key, v(0)) for i, key in enumerate(_KEYS)))
        h.send(owner, *(AddMethod(10 + i, key) for i, key in enumerate(_METHODS)))
    for which, data, action in steps:
        for h, conn in zip((fast, careful), pairs[which], strict=True):
            _apply_step(h, conn, data, action)
        if action == "disconnect":
            pairs[which] = [h.connect("again") for h in (fast, careful)]
        for f_conn, c_conn in pairs:
            assert list(f_conn.pending) == list(c_conn.pending)
            assert fast.recv(f_conn) == careful.recv(c_conn)
    assert fast.daemon.stats.routed == careful.daemon.stats.routed


# --- slow consumers: what a fetcher sees is right however it is paused -------------------

_SLOW_KEYS = ["a", "a/1", "b"]
_slow_step = st.one_of(
    st.tuples(st.sampled_from(["notify", "notify_request", "add"]), st.sampled_from(_SLOW_KEYS), st.integers(0, 9)),
    st.tuples(st.just("remove"), st.sampled_from(_SLOW_KEYS), st.just(0)),
    st.tuples(st.just("fetch"), st.sampled_from(["", "a", "a/", "b", "c"]), st.integers(0, 1)),
    # Peers are paused more often than drained, so that most steps meet a paused one.
    st.tuples(st.sampled_from(["unfetch", "pause", "pause", "drain"]), st.just(""), st.integers(0, 1)),
)


class _View:
    """A fetcher's picture of the states, built from the events it receives. Checks as
    it goes that each (fetch, key) goes ADD, CHANGE..., REMOVE, ADD, ..., that nothing
    arrives for a fetch after its UNFETCH is answered, and PROTOCOL.md 10.5: when an
    OK to a NOTIFY_STATE request arrives, its change has arrived at every matching fetch."""

    def __init__(self) -> None:
        self.fetch_rids: dict[int, bytes] = {}  # FETCH_STATES request id -> prefix
        self.unfetch_rids: dict[int, int] = {}  # UNFETCH request id -> fetch id
        self.notify_rids: dict[int, tuple[str, Value]] = {}
        self.prefixes: dict[int, str] = {}  # live fetch id -> prefix
        self.views: dict[int, dict[str, Value]] = {}

    def apply(self, message: Message) -> None:
        if isinstance(message, Response):
            rid, ok = message.id, message.status == Status.OK
            if rid in self.fetch_rids:
                prefix = self.fetch_rids.pop(rid)
                if ok:
                    self.prefixes[message.fetch_id] = prefix
                    self.views[message.fetch_id] = {}
            elif rid in self.unfetch_rids:
                assert ok, message
                del self.prefixes[self.unfetch_rids.pop(rid)]
            elif rid in self.notify_rids:
                key, value = self.notify_rids.pop(rid)
                for fid, prefix in self.prefixes.items():
                    if ok and key.startswith(prefix):
                        assert self.views[fid].get(key) == value, (fid, key)
            return
        assert message.fetch_id in self.prefixes, message  # type: ignore[attr-defined]
        view = self.views[message.fetch_id]  # type: ignore[attr-defined]
        key = message.key  # type: ignore[attr-defined]
        if isinstance(message, FetchAdd):
            assert key not in view, message
            view[key] = message.value
        elif isinstance(message, FetchChange):
            assert key in view, message
            view[key] = message.value
        else:
            assert isinstance(message, FetchRemove) and view.pop(key) == message.value, message


@settings(max_examples=500, deadline=None)
@given(steps=st.lists(_slow_step, max_size=40))
def test_paused_fetchers_always_end_up_with_the_latest_values(steps):
    # Peer 0 owns the states and fetches too; peer 1 only fetches. Either may be paused and
    # drained at any point (PROTOCOL.md 10.8).
    from jetwire import Unfetch

    h = Harness()
    peers = [h.connect("owner"), h.connect("other")]
    owner = peers[0]
    views = [_View(), _View()]
    truth: dict[str, Value] = {}

    def deliver(i: int) -> None:
        messages = h.drain(peers[i]) if peers[i].paused else h.recv(peers[i])
        for message in messages:
            views[i].apply(message)

    for rid, (action, arg, n) in enumerate(steps, 1):
        if action == "add":
            h.send(owner, AddState(rid, arg, v(n)))
            truth.setdefault(arg, v(n))
        elif action == "remove":
            h.send(owner, RemoveState(rid, arg))
            truth.pop(arg, None)
        elif action.startswith("notify"):
            if action == "notify_request":
                views[0].notify_rids[rid] = (arg, v(n))
            h.send(owner, NotifyState(rid if action == "notify_request" else None, arg, v(n)))
            if arg in truth:
                truth[arg] = v(n)
        elif action == "fetch":
            views[n].fetch_rids[rid] = arg
            h.send(peers[n], FetchStates(rid, arg))
        elif action == "unfetch":
            live = sorted(set(views[n].prefixes) - set(views[n].unfetch_rids.values()))
            if live:
                views[n].unfetch_rids[rid] = live[0]
                h.send(peers[n], Unfetch(rid, live[0]))
        elif action == "pause":
            h.daemon.pause(peers[n], 1 << 20)
        elif action == "drain":
            deliver(n)
        for i in (0, 1):
            if not peers[i].paused:
                deliver(i)
        _check_invariants(h.daemon)
    for i in (0, 1):
        deliver(i)
        assert not views[i].fetch_rids and not views[i].unfetch_rids and not views[i].notify_rids
        for fid, prefix in views[i].prefixes.items():
            assert views[i].views[fid] == {k: val for k, val in truth.items() if k.startswith(prefix)}


@given(kind=st.sampled_from(["STRING", "BYTES"]), extra=st.sampled_from([0, 1, 4]))
@settings(max_examples=30, deadline=None)
def test_notify_event_size_limit_is_the_same_on_both_paths(kind, extra):
    # PROTOCOL.md 6.4: a NOTIFY_STATE event up to max_body is accepted; its FETCH_CHANGE
    # (4 bytes longer) closes only a fetcher that announced a max_body below it; the
    # owner, a peer that announced enough and one that announced nothing get it. A
    # STRING takes the careful path, BYTES the fast one: both behave the same.
    h = Harness(max_body=64)
    owner, small, large, silent = h.connect(), h.connect(), h.connect(), h.connect()
    h.send(small, Info("small", 64))
    h.send(large, Info("large", 68))
    n = 64 - 4 - 9 + extra  # the FETCH_CHANGE body: code 1 + fid 4 + key "k" 3 + value head 5 + n
    value = v("x" * n) if kind == "STRING" else v(b"x" * n)
    empty = v("") if kind == "STRING" else v(b"")
    h.send(owner, AddState(1, "k", empty))
    h.send(owner, NotifyState(None, "k", value))  # no fetcher yet
    assert not owner.closing
    h.send(owner, NotifyState(None, "k", empty))
    fids = {}
    for peer in (small, large, silent):
        h.send(peer, FetchStates(1, "k"))
        fids[peer.conn_id] = h.recv(peer)[0].fetch_id
    h.send(owner, NotifyState(None, "k", value))
    assert not owner.closing
    assert h.recv(large) == [FetchChange(fids[large.conn_id], "k", value)]
    assert h.recv(silent) == [FetchChange(fids[silent.conn_id], "k", value)]
    if extra:
        assert small.closed
        [close] = h.recv(small)
        assert close == Close(Status.TOO_LARGE, f"a fetch event of {64 + extra} bytes exceeds your max_body 64")
    else:
        assert not small.closed and h.recv(small) == [FetchChange(fids[small.conn_id], "k", value)]
    # A new fetch of the state gets it as a FETCH_ADD under the same rule.
    late = h.connect()
    h.send(late, Info("late", 64))
    h.send(late, FetchStates(2, "k"))
    if extra:
        assert late.closed
    else:
        assert h.recv(late)[1] == FetchAdd(h.daemon.subscriptions.next_fetch_id - 1, "k", value)
