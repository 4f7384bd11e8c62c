"""Area 04: SET_STATE routed to the owner under daemon ids (PROTOCOL.md 10.3)."""

from __future__ import annotations

from jetd_testlib import RawPeer
from jetd_testlib import v

from jetwire import AddState
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchStates
from jetwire import NotifyState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import ValueType


def test_set_routed_answered_under_requester_id(jetd):
    owner = RawPeer(jetd.address, "owner")
    client = RawPeer(jetd.address, "client")
    assert owner.request(lambda rid: AddState(rid, "temp", v(21))).ok
    client.send(SetState(77, "temp", v(22.5)))
    routed = owner.recv()
    assert isinstance(routed, SetState) and routed.key == "temp" and routed.value == v(22.5)
    # The owner notifies then answers with the value in effect (clamped).
    owner.send(NotifyState(None, "temp", v(22.0)), Response(routed.id, Status.OK, v(22.0)))
    answer = client.recv()
    assert answer == Response(77, Status.OK, v(22.0))
    assert owner.request(lambda rid: __import__("jetwire").GetState(rid, "temp")).value == v(22.0)


def test_fetch_change_before_ok_for_requester(jetd):
    owner = RawPeer(jetd.address, "owner")
    client = RawPeer(jetd.address, "client")
    owner.request(lambda rid: AddState(rid, "a/x", v(1)))
    fid = client.request(lambda rid: FetchStates(rid, "a/")).fetch_id
    assert client.recv() == FetchAdd(fid, "a/x", v(1))
    client.send(SetState(5, "a/x", v(2)))
    routed = owner.recv()
    owner.send(NotifyState(9, "a/x", v(2)), Response(routed.id, Status.OK, v(2)))
    assert owner.recv() == Response(9, Status.OK)
    # PROTOCOL.md 10.3 ordering: FETCH_CHANGE first, then the OK.
    assert client.recv() == FetchChange(fid, "a/x", v(2))
    assert client.recv() == Response(5, Status.OK, v(2))


def test_empty_ok_becomes_none_and_errors_pass_through(jetd):
    owner = RawPeer(jetd.address)
    client = RawPeer(jetd.address)
    owner.request(lambda rid: AddState(rid, "k", v("x")))
    client.send(SetState(1, "k", v("y")))
    routed = owner.recv()
    owner.send(Response(routed.id, Status.OK))
    assert client.recv() == Response(1, Status.OK, Value(ValueType.NONE))
    client.send(SetState(2, "k", v("bad")))
    routed = owner.recv()
    owner.send(Response(routed.id, Status.REJECTED, message="out of range"))
    assert client.recv() == Response(2, Status.REJECTED, message="out of range")


def test_daemon_ids_are_distinct_and_many_in_flight(jetd):
    owner = RawPeer(jetd.address)
    clients = [RawPeer(jetd.address) for _ in range(3)]
    owner.request(lambda rid: AddState(rid, "k", v(0)))
    for c in clients:  # every client uses the same ids
        c.send(*(SetState(i, "k", v(i)) for i in range(1, 51)))
    routed = owner.recv_n(150)
    ids = [m.id for m in routed]
    assert len(set(ids)) == 150
    # Answer in reverse order: every answer finds its requester and id.
    for m in reversed(routed):
        owner.send(Response(m.id, Status.OK, m.value))
    for c in clients:
        answers = c.recv_n(50)
        assert sorted(a.id for a in answers) == list(range(1, 51))
        assert all(a.value == v(a.id) for a in answers)


def test_owner_own_set_is_routed_to_it(jetd):
    owner = RawPeer(jetd.address)
    owner.request(lambda rid: AddState(rid, "self", v(1)))
    owner.send(SetState(40, "self", v(2)))
    routed = owner.recv()
    assert isinstance(routed, SetState) and routed.value == v(2)
    owner.send(Response(routed.id, Status.OK, v(2)))
    assert owner.recv() == Response(40, Status.OK, v(2))


def test_set_errors_from_daemon(jetd):
    peer = RawPeer(jetd.address)
    assert peer.request(lambda rid: SetState(rid, "missing", v(1))).status == Status.NOT_FOUND
    peer.request(lambda rid: __import__("jetwire").AddMethod(rid, "m"))
    assert peer.request(lambda rid: SetState(rid, "m", v(1))).status == Status.WRONG_KIND


def test_set_event_forwarded_as_event(jetd):
    owner = RawPeer(jetd.address)
    client = RawPeer(jetd.address)
    owner.request(lambda rid: AddState(rid, "e", v(0)))
    client.send(SetState(None, "e", v(3)), SetState(None, "nope", v(1)))
    assert owner.recv() == SetState(None, "e", v(3))
    # The event for an unknown key is dropped, the connection stays up.
    assert client.request(lambda rid: __import__("jetwire").GetState(rid, "e")).value == v(0)
    owner.nothing_within(0.2)
