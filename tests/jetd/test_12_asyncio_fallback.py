"""Area 12: the plain asyncio loop (--loop asyncio) runs the same daemon."""

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


def test_asyncio_loop_routes_and_fetches(start_jetd):
    daemon = start_jetd("--loop", "asyncio", "--log-level", "DEBUG")
    owner = RawPeer(daemon.address)
    client = RawPeer(daemon.address)
    owner.request(lambda rid: AddState(rid, "k", v(1)))
    fid = client.request(lambda rid: FetchStates(rid, "")).fetch_id
    assert client.recv() == FetchAdd(fid, "k", v(1))
    client.send(SetState(4, "k", v(2)))
    routed = owner.recv()
    owner.send(NotifyState(None, "k", v(2)), Response(routed.id, Status.OK, v(2)))
    assert client.recv() == FetchChange(fid, "k", v(2))
    assert client.recv() == Response(4, Status.OK, v(2))
    daemon.stop()
    assert "loop asyncio" in daemon.stderr()


def test_uvloop_is_the_default(jetd):
    jetd.stop()
    assert "loop uvloop" in jetd.stderr()


def _asyncio(start_jetd):
    return lambda *args, **kwargs: start_jetd("--loop", "asyncio", *args, **kwargs)


def test_asyncio_loop_flow_control_conflation(start_jetd):
    # The same slow-consumer scenario as area 09: asyncio's transports pause and resume
    # writing at other moments than uvloop's, so flow control is checked on both.
    import test_09_slow_consumer as slow

    slow.test_conflation_keeps_latest_values_and_others_get_everything(_asyncio(start_jetd))


def test_asyncio_loop_hard_limit(start_jetd):
    import test_09_slow_consumer as slow

    slow.test_hard_limit_closes_overloaded(_asyncio(start_jetd))
