"""Area 08: the limits of PROTOCOL.md 10.7, each as a flag."""

from __future__ import annotations

import struct

from jetd_testlib import RawPeer
from jetd_testlib import v

from jetwire import AddMethod
from jetwire import AddState
from jetwire import CallMethod
from jetwire import FetchChange
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Info
from jetwire import NotifyState
from jetwire import Response
from jetwire import SetState
from jetwire import Status


def test_max_body_close_too_large(start_jetd):
    daemon = start_jetd("--max-body", "64")
    peer = RawPeer(daemon.address)
    assert peer.request(lambda rid: AddState(rid, "k", v("x" * 40))).ok
    # Only the header of the oversized frame is sent: the daemon must not wait for the body.
    peer.send_raw(struct.pack(">BI", 1, 65))
    peer.expect_close(Status.TOO_LARGE)


def test_max_key_length_too_large_response(start_jetd):
    daemon = start_jetd("--max-key-length", "8")
    peer = RawPeer(daemon.address)
    assert peer.request(lambda rid: AddState(rid, "12345678", v(1))).ok
    assert peer.request(lambda rid: AddState(rid, "123456789", v(1))).status == Status.TOO_LARGE
    assert peer.request(lambda rid: AddMethod(rid, "123456789")).status == Status.TOO_LARGE
    assert peer.request(lambda rid: GetState(rid, "123456789")).status == Status.TOO_LARGE
    assert peer.request(lambda rid: GetState(rid, "12345678")).ok


def test_max_connections_info_then_close(start_jetd):
    daemon = start_jetd("--max-connections", "2")
    a = RawPeer(daemon.address)
    b = RawPeer(daemon.address)
    c = RawPeer(daemon.address)  # INFO read in the constructor
    c.expect_close(Status.LIMIT_EXCEEDED)
    a.close()
    # A slot is free again once a peer left.
    for _ in range(50):
        d = RawPeer(daemon.address)
        try:
            if d.request(lambda rid: GetState(rid, "x")).status == Status.NOT_FOUND:
                break
        except Exception:
            d.close()
    else:
        raise AssertionError("no slot freed")
    assert b.request(lambda rid: GetState(rid, "x")).status == Status.NOT_FOUND


def test_max_states_per_connection(start_jetd):
    daemon = start_jetd("--max-states-per-connection", "3")
    peer = RawPeer(daemon.address)
    assert peer.request(lambda rid: AddState(rid, "a", v(1))).ok
    assert peer.request(lambda rid: AddMethod(rid, "b")).ok
    assert peer.request(lambda rid: AddState(rid, "c", v(1))).ok
    assert peer.request(lambda rid: AddState(rid, "d", v(1))).status == Status.LIMIT_EXCEEDED
    assert peer.request(lambda rid: AddMethod(rid, "e")).status == Status.LIMIT_EXCEEDED
    other = RawPeer(daemon.address)  # the limit is per connection
    assert other.request(lambda rid: AddState(rid, "d", v(1))).ok


def test_max_fetches_per_connection(start_jetd):
    daemon = start_jetd("--max-fetches-per-connection", "2")
    peer = RawPeer(daemon.address)
    assert peer.request(lambda rid: FetchStates(rid, "a")).ok
    assert peer.request(lambda rid: FetchStates(rid, "b")).ok
    assert peer.request(lambda rid: FetchStates(rid, "c")).status == Status.LIMIT_EXCEEDED


def test_max_pending_per_owner(start_jetd):
    daemon = start_jetd("--max-pending-per-owner", "3")
    owner = RawPeer(daemon.address)
    client = RawPeer(daemon.address)
    owner.request(lambda rid: AddState(rid, "k", v(0)))
    owner.request(lambda rid: AddMethod(rid, "m"))
    client.send(SetState(1, "k", v(1)), SetState(2, "k", v(2)), CallMethod(3, "m", v(3)), SetState(4, "k", v(4)))
    over = client.recv()
    assert over.id == 4 and over.status == Status.LIMIT_EXCEEDED
    routed = owner.recv_n(3)
    owner.send(Response(routed[0].id, Status.OK, v(1)))
    assert client.recv() == Response(1, Status.OK, v(1))
    client.send(SetState(5, "k", v(5)))  # room again
    assert isinstance(owner.recv(), SetState)


def test_peer_max_body_is_respected(start_jetd):
    daemon = start_jetd("--max-body", "4096")
    owner = RawPeer(daemon.address)
    owner.request(lambda rid: AddState(rid, "big", v(b"x" * 2000)))
    owner.request(lambda rid: AddState(rid, "small", v(1)))
    small = RawPeer(daemon.address)
    small.send(Info("tiny", max_body=1000))
    # A GET whose answer would not fit: TOO_LARGE instead of an oversized frame.
    assert small.request(lambda rid: GetState(rid, "big")).status == Status.TOO_LARGE
    assert small.request(lambda rid: GetState(rid, "small")).ok
    # A set routed to an owner that cannot take it: TOO_LARGE for the requester.
    small.request(lambda rid: AddState(rid, "mine", v(0)))
    assert owner.request(lambda rid: SetState(rid, "mine", v(b"y" * 1500))).status == Status.TOO_LARGE
    # A fetch event that does not fit: the fetcher is closed TOO_LARGE, never sent it.
    small.send(FetchStates(99, ""))
    ok = small.recv()
    assert ok.id == 99 and ok.ok
    small.expect_close(Status.TOO_LARGE)
    assert owner.request(lambda rid: GetState(rid, "small")).ok
    # PROTOCOL.md 6.4: a NOTIFY event whose FETCH_CHANGE would exceed our own max_body is
    # accepted (event body 1 + 2 + 5 + 5 + 4083 = 4096 fits; its FETCH_CHANGE is 4100);
    # only a fetcher that announced less than 4100 is closed, one that announced more gets it.
    bigger = RawPeer(daemon.address)
    bigger.send(Info("bigger", max_body=8192))
    fid = bigger.request(lambda rid: FetchStates(rid, "small")).fetch_id
    bigger.recv()  # its initial add
    owner.send(NotifyState(None, "small", v(b"z" * 4083)))
    change = bigger.recv()
    assert change == FetchChange(fid, "small", v(b"z" * 4083)), change
    got = owner.request(lambda rid: GetState(rid, "small"))
    assert got.ok and got.value == v(b"z" * 4083)
