"""Area 03: FETCH_STATES, initial adds in key byte order, live events, UNFETCH (PROTOCOL.md 10.5)."""

from __future__ import annotations

from jetd_testlib import RawPeer
from jetd_testlib import fetching
from jetd_testlib import v

from jetwire import AddMethod
from jetwire import AddState
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import NotifyState
from jetwire import RemoveState
from jetwire import Response
from jetwire import Status
from jetwire import Unfetch


def test_ok_first_then_adds_in_byte_order_then_live(jetd):
    owner = RawPeer(jetd.address)
    keys = ["p/b", "p/a", "p/\u00e9", "p/Z", "q/x", "p", "p/a/1", "p/\U0001f600"]
    for key in keys:
        assert owner.request(lambda rid, key=key: AddState(rid, key, v(key))).ok
    owner.request(lambda rid: AddMethod(rid, "p/method"))
    fetcher = RawPeer(jetd.address)
    fetcher.send(FetchStates(1, "p/"))
    ok = fetcher.recv()
    assert ok.id == 1 and ok.status == Status.OK and ok.fetch_id is not None
    fid = ok.fetch_id
    expected = sorted((k for k in keys if k.startswith("p/")), key=lambda k: k.encode())
    adds = fetcher.recv_n(len(expected))
    assert adds == [FetchAdd(fid, k, v(k)) for k in expected]
    owner.request(lambda rid: AddState(rid, "p/new", v(1)))
    owner.request(lambda rid: AddState(rid, "x/other", v(1)))
    owner.send(NotifyState(None, "p/new", v(2)), NotifyState(None, "x/other", v(2)))
    owner.request(lambda rid: RemoveState(rid, "p/new"))
    assert fetcher.recv_n(3) == [
        FetchAdd(fid, "p/new", v(1)),
        FetchChange(fid, "p/new", v(2)),
        FetchRemove(fid, "p/new", v(2)),
    ]
    fetcher.nothing_within(0.1)


def test_fetch_ids_unique_and_overlapping_fetches(jetd):
    owner = RawPeer(jetd.address)
    owner.request(lambda rid: AddState(rid, "a/b/c", v(1)))
    f1 = RawPeer(jetd.address)
    f2 = RawPeer(jetd.address)
    ids = []
    for prefix in ("", "a/", "a/b/"):
        response = f1.request(lambda rid, prefix=prefix: FetchStates(rid, prefix))
        ids.append(response.fetch_id)
        assert f1.recv() == FetchAdd(response.fetch_id, "a/b/c", v(1))
    other = f2.request(lambda rid: FetchStates(rid, "a"))
    f2.recv()
    ids.append(other.fetch_id)
    assert len(set(ids)) == 4 and min(ids) >= 1
    owner.send(NotifyState(None, "a/b/c", v(5)))
    got = f1.recv_n(3)
    assert sorted(m.fetch_id for m in got) == sorted(ids[:3])
    assert all(isinstance(m, FetchChange) and m.value == v(5) for m in got)
    assert f2.recv() == FetchChange(other.fetch_id, "a/b/c", v(5))
    # UNFETCH stops exactly one of them; ids are never reused.
    assert f1.request(lambda rid: Unfetch(rid, ids[0])) .status == Status.OK
    assert f1.request(lambda rid: Unfetch(rid, ids[0])).status == Status.NOT_FOUND
    assert f2.request(lambda rid: Unfetch(rid, ids[1])).status == Status.NOT_FOUND  # not its fetch
    owner.send(NotifyState(None, "a/b/c", v(6)))
    got = f1.recv_n(2)
    assert sorted(m.fetch_id for m in got) == sorted(ids[1:3])
    again = f1.request(lambda rid: FetchStates(rid, "zzz"))
    assert again.fetch_id > max(ids)


def test_unfetch_then_nothing(jetd):
    owner, f, fid = fetching(jetd.address, "k", 0, "")
    f.send(Unfetch(2, fid))
    owner.send(*(NotifyState(None, "k", v(i)) for i in range(100)))
    assert f.recv() == Response(2, Status.OK)
    f.nothing_within(0.2)


def test_fetch_large_number_of_states(jetd):
    owner = RawPeer(jetd.address)
    owner.send(*(AddState(i, f"s/{i:05d}", v(i)) for i in range(1, 5001)))
    owner.recv_n(5000)
    f = RawPeer(jetd.address)
    fid = f.request(lambda rid: FetchStates(rid, "s/")).fetch_id
    adds = f.recv_n(5000)
    assert [a.key for a in adds] == [f"s/{i:05d}" for i in range(1, 5001)]
    assert all(a.fetch_id == fid for a in adds)
