"""Area 06: owner disconnect (PROTOCOL.md 10.6) and requester gone (10.3)."""

from __future__ import annotations

from jetd_testlib import RawPeer
from jetd_testlib import routed_set
from jetd_testlib import v

from jetwire import AddMethod
from jetwire import AddState
from jetwire import CallMethod
from jetwire import Close
from jetwire import FetchAdd
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import GetState
from jetwire import NotifyState
from jetwire import Response
from jetwire import SetState
from jetwire import Status


def test_owner_disconnect_cleans_everything(jetd):
    owner = RawPeer(jetd.address, "owner")
    client = RawPeer(jetd.address, "client")
    for key in ("b", "a", "c"):
        owner.request(lambda rid, key=key: AddState(rid, key, v(key)))
    owner.request(lambda rid: AddMethod(rid, "m"))
    owner.send(NotifyState(None, "b", v("last")))
    fid = client.request(lambda rid: FetchStates(rid, "")).fetch_id
    assert client.recv_n(3) == [FetchAdd(fid, "a", v("a")), FetchAdd(fid, "b", v("last")), FetchAdd(fid, "c", v("c"))]
    client.send(SetState(10, "a", v(1)), CallMethod(11, "m", v(2)))
    owner.recv_n(2)  # both routed, never answered
    owner.close()
    got = client.recv_n(5)
    # PROTOCOL.md 10.6 order: OWNER_GONE first, then FETCH_REMOVE in key order with the last value.
    assert sorted((m.id, m.status) for m in got[:2]) == [(10, Status.OWNER_GONE), (11, Status.OWNER_GONE)]
    assert got[2:] == [FetchRemove(fid, "a", v("a")), FetchRemove(fid, "b", v("last")), FetchRemove(fid, "c", v("c"))]
    assert client.request(lambda rid: GetState(rid, "a")).status == Status.NOT_FOUND
    assert client.request(lambda rid: CallMethod(rid, "m", v(1))).status == Status.NOT_FOUND
    # The keys are free again.
    assert client.request(lambda rid: AddMethod(rid, "m")).ok


def test_owner_close_event_is_a_disconnect(jetd):
    owner = RawPeer(jetd.address)
    client = RawPeer(jetd.address)
    owner.request(lambda rid: AddState(rid, "k", v(1)))
    owner.send(Close(Status.OK, "bye"))
    owner.expect_eof()
    assert client.request(lambda rid: GetState(rid, "k")).status == Status.NOT_FOUND


def test_requester_gone_answer_dropped(jetd):
    owner, client, routed = routed_set(jetd.address)
    client.close()
    owner.send(Response(routed.id, Status.OK, v(2)))
    # The daemon drops the answer and goes on serving the owner.
    assert owner.request(lambda rid: GetState(rid, "k")).value == v(1)


def test_fetcher_disconnect_drops_its_fetches(jetd):
    owner = RawPeer(jetd.address)
    f = RawPeer(jetd.address)
    owner.request(lambda rid: AddState(rid, "k", v(1)))
    f.request(lambda rid: FetchStates(rid, ""))
    f.close()
    owner.send(*(NotifyState(None, "k", v(i)) for i in range(50)))
    assert owner.request(lambda rid: GetState(rid, "k")).value == v(49)
