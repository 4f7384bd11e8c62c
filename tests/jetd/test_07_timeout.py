"""Area 07: route timeout (PROTOCOL.md 10.3): TIMEOUT, late answer dropped and logged."""

from __future__ import annotations

import time

from jetd_testlib import RawPeer
from jetd_testlib import v

from jetwire import AddMethod
from jetwire import AddState
from jetwire import CallMethod
from jetwire import GetState
from jetwire import Response
from jetwire import SetState
from jetwire import Status


def test_timeout_then_late_answer_dropped(start_jetd):
    daemon = start_jetd("--route-timeout", "0.3")
    owner = RawPeer(daemon.address, "slowpoke")
    client = RawPeer(daemon.address)
    owner.request(lambda rid: AddState(rid, "k", v(1)))
    started = time.monotonic()
    client.send(SetState(3, "k", v(2)))
    routed = owner.recv()
    answer = client.recv(timeout=10)  # generous: a busy machine may run the timer late
    elapsed = time.monotonic() - started
    assert answer.id == 3 and answer.status == Status.TIMEOUT
    assert elapsed >= 0.25, elapsed  # not before --route-timeout (less the timer's resolution)
    owner.send(Response(routed.id, Status.OK, v(2)))
    client.nothing_within(0.3)
    assert owner.request(lambda rid: GetState(rid, "k")).value == v(1)
    daemon.stop()
    assert "dropped response" in daemon.stderr()


def test_answered_routes_do_not_time_out(start_jetd):
    daemon = start_jetd("--route-timeout", "0.3")
    owner = RawPeer(daemon.address)
    client = RawPeer(daemon.address)
    owner.request(lambda rid: AddMethod(rid, "m"))
    for i in range(5):
        client.send(CallMethod(i, "m", v(i)))
        routed = owner.recv()
        owner.send(Response(routed.id, Status.OK, v(i)))
        assert client.recv() == Response(i, Status.OK, v(i))
    client.nothing_within(0.6)


def test_default_timeout_is_five_seconds_not_sooner(jetd):
    owner = RawPeer(jetd.address)
    client = RawPeer(jetd.address)
    owner.request(lambda rid: AddMethod(rid, "m"))
    client.send(CallMethod(1, "m", v(0)))
    owner.recv()
    client.nothing_within(1.0)
