"""Area 14, the sans-IO core: initial adds in slices (PROTOCOL.md 10.5 "initial adds over
time"), the output budget within one read (10.8), route timeouts in slices. The IO
loop is played by hand here, one Daemon.work slice at a time, with changes between."""

from __future__ import annotations

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from test_00_core import Harness
from test_00_core import _View
from test_00_core import v

from jetd.core import Connection
from jetwire import AddState
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Message
from jetwire import NotifyState
from jetwire import RemoveState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import encode


def _feed(h: Harness, conn: Connection, *messages: Message) -> None:
    """Bytes in, output "written", but no pending work run (unlike Harness.send)."""
    h.daemon.receive_data(conn, b"".join(encode(m) for m in messages), h.now)
    h._write()


def _slice(h: Harness) -> None:
    """One turn of the IO loop's pending work."""
    if h.daemon.has_work:
        h.daemon.work(h.now)
    h._write()


def _recv(h: Harness, conn: Connection) -> list[Message]:
    """What was written to ``conn``, without running the pending work (unlike
    Harness.recv)."""
    h._write()
    return h.decode(conn, b"".join(h.written.pop(conn.conn_id, [])))


def test_changes_during_a_sliced_fetch_keep_its_order():
    h = Harness()
    h.daemon.scheduler.delivery_slice = 3
    owner, fetcher = h.connect("owner"), h.connect("fetcher")
    h.send(owner, *(AddState(i + 1, f"k{i}", v(i)) for i in range(0, 10, 2)))  # k0 k2 k4 k6 k8
    h.recv(owner)
    _feed(h, fetcher, FetchStates(1, "k"), GetState(2, "k0"))
    first = _recv(h, fetcher)
    fid = first[0].fetch_id  # type: ignore[attr-defined]
    assert first[1:] == [FetchAdd(fid, "k0", v(0)), FetchAdd(fid, "k2", v(2)), FetchAdd(fid, "k4", v(4))]
    assert fetcher.stalled  # the GET waits for the last initial add
    # Changes while k0..k4 are delivered and k6, k8 are not:
    _feed(h, owner, NotifyState(None, "k2", v(20)))  # delivered: held, sent after the adds
    _feed(h, owner, NotifyState(None, "k6", v(60)))  # not yet: its add carries the value
    _feed(h, owner, RemoveState(20, "k8"))  # not yet: never added
    _feed(h, owner, AddState(21, "k1", v(1)))  # below the cursor: a live ADD afterwards
    _feed(h, owner, AddState(22, "k7", v(7)))  # above: an initial add in its place
    _feed(h, owner, RemoveState(23, "k0"))  # delivered: held REMOVE
    assert _recv(h, fetcher) == []
    _slice(h)
    assert _recv(h, fetcher) == [
        FetchAdd(fid, "k6", v(60)),
        FetchAdd(fid, "k7", v(7)),
        # the last initial add, then what was held, in order, then the GET's answer
        FetchChange(fid, "k2", v(20)),
        FetchAdd(fid, "k1", v(1)),
        FetchRemove(fid, "k0", v(0)),
        Response(2, Status.NOT_FOUND, message="no such state"),
    ]
    assert not fetcher.stalled and h.daemon.subscriptions.delivering.by_prefix == {}
    # Live now: changes go straight out.
    _feed(h, owner, NotifyState(None, "k7", v(70)))
    assert _recv(h, fetcher) == [FetchChange(fid, "k7", v(70))]


_step = st.one_of(
    st.tuples(st.just("slice"), st.just(""), st.just(0)),
    st.tuples(st.sampled_from(["add", "remove", "notify"]), st.sampled_from([f"k{i:02d}" for i in range(24)]),
              st.integers(0, 9)),
)


@settings(max_examples=300, deadline=None)
@given(initial=st.sets(st.integers(0, 23), max_size=24), steps=st.lists(_step, max_size=40))
def test_a_sliced_fetch_ends_with_the_exact_view(initial, steps):
    # PROTOCOL.md 10.5: whatever changes while the adds go out in slices, the fetcher's
    # initial adds come in key order before any other event, each (fetch, key) goes ADD,
    # CHANGE..., REMOVE, and its final view is exactly the states.
    h = Harness()
    h.daemon.scheduler.delivery_slice = 2
    owner, fetcher = h.connect("owner"), h.connect("fetcher")
    truth = {}
    for i in sorted(initial):
        h.send(owner, AddState(100 + i, f"k{i:02d}", v(i)))
        truth[f"k{i:02d}"] = v(i)
    h.recv(owner)
    view = _View()
    view.fetch_rids[1] = "k"
    _feed(h, fetcher, FetchStates(1, "k"))
    messages = _recv(h, fetcher)
    for rid, (action, key, n) in enumerate(steps, 1000):
        if action == "slice":
            _slice(h)
        elif action == "add":
            _feed(h, owner, AddState(rid, key, v(n)))
            truth.setdefault(key, v(n))
        elif action == "remove":
            _feed(h, owner, RemoveState(rid, key))
            truth.pop(key, None)
        else:
            _feed(h, owner, NotifyState(None, key, v(n)))
            if key in truth:
                truth[key] = v(n)
        messages += _recv(h, fetcher)
    while h.daemon.has_work:
        _slice(h)
    messages += _recv(h, fetcher)
    for message in messages:
        view.apply(message)
    [fid] = view.views
    assert view.views[fid] == truth
    # The initial adds come right after the OK, in key order, before any other event.
    initial = messages[1 : 1 + h.daemon.stats.initial_adds]
    assert all(isinstance(m, FetchAdd) for m in initial), initial
    keys = [m.key for m in initial]  # type: ignore[attr-defined]
    assert keys == sorted(set(keys)), keys


def _greedy(gets: int) -> tuple[Harness, Connection]:
    """Soft limit 4 KiB: a peer sends ``gets`` GETs of a 1 KiB state in one read."""
    h = Harness(soft_limit=4096, hard_limit=65536)
    owner, greedy = h.connect("owner"), h.connect("greedy")
    h.send(owner, AddState(1, "big", v(b"x" * 1024)))
    h.recv(owner)
    h.daemon.receive_data(greedy, b"".join(encode(GetState(i, "big")) for i in range(gets)), h.now)
    return h, greedy


def test_output_budget_stalls_a_pipelining_peer_within_one_read():
    # PROTOCOL.md 10.8: 50 GETs of a 1 KiB state in one read, soft limit 4 KiB: the peer's
    # input stops after about 4 answers, and goes on, in order, as its output is written.
    h, greedy = _greedy(50)
    assert greedy.stalled and greedy.out_size <= 4096 + 1100
    assert len(greedy.rest) > 40 * len(encode(GetState(1, "big")))
    assert h.daemon.input_buffered == len(greedy.rest)
    answers = h.recv(greedy)  # the harness writes and runs the pending work until done
    assert [a.id for a in answers] == list(range(50))  # type: ignore[attr-defined]
    assert not greedy.stalled and h.daemon.input_buffered == 0


def test_route_timeouts_expire_in_slices():
    h = Harness(route_timeout=1.0)
    h.daemon.scheduler.expire_slice = 10
    owner, requester = h.connect("owner"), h.connect("requester")
    h.send(owner, AddState(1, "r", v(0)))
    h.recv(owner)
    _feed(h, requester, *(SetState(i, "r", v(i)) for i in range(35)))
    h.now += 2
    h.daemon.tick(h.now)
    h._write()
    assert len(_recv(h, requester)) == 10 and h.daemon.has_work
    _slice(h)
    _slice(h)
    _slice(h)
    answers = _recv(h, requester)
    assert [a.id for a in answers] == list(range(10, 35))  # type: ignore[attr-defined]
    assert all(a.status == Status.TIMEOUT for a in answers)  # type: ignore[attr-defined]
    assert not h.daemon.has_work



def test_end_of_input_while_stalled_waits_for_the_held_frames():
    # The peer shut down its sending side while its input was held: every frame it sent
    # is still answered, then it is gone (PROTOCOL.md 10.6).
    h, greedy = _greedy(20)
    assert greedy.stalled
    h.daemon.end_of_input(greedy, h.now)
    assert not greedy.closing
    answers = h.recv(greedy)
    assert [a.id for a in answers] == list(range(20))  # type: ignore[attr-defined]
    assert greedy.closed and greedy.close_reason == "peer closed its side"
