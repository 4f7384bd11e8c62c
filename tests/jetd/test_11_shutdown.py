"""Area 11: SIGTERM/SIGINT: stop accepting, CLOSE (OK, "shutting down") to all, exit 0."""

from __future__ import annotations

import signal
import socket
import time

import pytest
from jetd_testlib import RawPeer
from jetd_testlib import v

from jetwire import AddState
from jetwire import FetchStates
from jetwire import NotifyState
from jetwire import Status


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_closes_peers_and_exits_zero(start_jetd, tmp_path, sig):
    daemon = start_jetd("--log-dir", str(tmp_path / "log"))
    owner = RawPeer(daemon.address)
    fetcher = RawPeer(daemon.address)
    owner.request(lambda rid: AddState(rid, "k", v(1)))
    fetcher.request(lambda rid: FetchStates(rid, ""))
    fetcher.recv()
    started = time.monotonic()
    daemon.proc.send_signal(sig)
    for peer in (owner, fetcher):
        close = peer.expect_close(Status.OK)
        assert close.message == "shutting down"
    assert daemon.proc.wait(10) == 0
    assert time.monotonic() - started < 10
    with pytest.raises(OSError):
        socket.create_connection(daemon.address, timeout=1).close()


def test_shutdown_with_a_peer_that_never_reads(start_jetd):
    daemon = start_jetd("--soft-limit", "65536", "--shutdown-grace", "1")
    owner = RawPeer(daemon.address)
    owner.request(lambda rid: AddState(rid, "k", v(b"x" * 1000)))
    stuck = RawPeer(daemon.address, rcvbuf=4096)
    stuck.send(FetchStates(1, ""))
    owner.send(*(NotifyState(None, "k", v(b"%d" % i + b"x" * 1000)) for i in range(2000)))
    time.sleep(0.3)
    started = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(10) == 0
    assert time.monotonic() - started < 5
    stuck.close()
