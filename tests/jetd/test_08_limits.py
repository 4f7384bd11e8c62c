"""Area 08: the limits of PROTOCOL.md 10.7, each as a flag."""

from __future__ import annotations

import struct

from jetd_testlib import RawPeer, v

from jetwire import (
    AddMethod,
    AddState,
    CallMethod,
    FetchStates,
    GetState,
    Response,
    SetState,
    Status,
)


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
