"""Area 14, output side (PROTOCOL.md 10.8 output budget, 7.3/10.9 CLOSE delivery): a
peer that pipelines requests with big answers and does not read costs the daemon about
the soft limit plus one answer, stalls nobody, and gets its CLOSE on overload and on
shutdown."""

from __future__ import annotations

import signal
import socket
import time

import pytest
from hostile_lib import Discard
from hostile_lib import HealthPeer
from hostile_lib import health_bound
from hostile_lib import peak_rss_growth_kib
from hostile_lib import read_slowly_until_close
from jetd_testlib import RawPeer
from jetd_testlib import rss_kib
from jetd_testlib import v

from jetwire import AddState
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Response
from jetwire import Status
from jetwire import encode

MIB = 1 << 20
SOFT = 1 * MIB
HARD = 8 * MIB
BIG = MIB - 64  # a state value just under max_body (1 MiB)
ALLOWANCE_KIB = 24 * 1024  # interpreter, kernel-side copies, allocator slack


def _big_state(address: tuple[str, int]) -> RawPeer:
    owner = RawPeer(address, "owner")
    response = owner.request(lambda rid: AddState(rid, "big", v(b"x" * BIG)))
    assert response.status == Status.OK
    return owner


def _asks_300_big(address: tuple[str, int]) -> RawPeer:
    """A peer with a 4 KiB receive buffer that sends 300 GETs of "big" in one write."""
    slow = RawPeer(address, "slow", rcvbuf=4096)
    slow.send_raw(b"".join(encode(GetState(i + 1, "big")) for i in range(300)))
    return slow


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_get_flood_is_bounded_by_the_output_budget(start_jetd, loop):
    # Issue 12 item 1: 400 GETs of a 1 MiB state in one 5 KB write, never read: 415 MB
    # queued before; now about the soft limit plus one answer.
    daemon = start_jetd("--soft-limit", str(SOFT), "--hard-limit", str(HARD), "--loop", loop)
    owner = _big_state(daemon.address)
    health = HealthPeer(daemon.address)
    health.start()
    before = rss_kib(daemon.proc.pid)
    attackers = [RawPeer(daemon.address, f"flood{i}") for i in range(2)]
    for attacker in attackers:
        attacker.send_raw(b"".join(encode(GetState(i + 1, "big")) for i in range(400)))
    growth = peak_rss_growth_kib(daemon.proc.pid, before, 2.0)
    worst = health.finish()
    print(f"GET flood: RSS +{growth // 1024} MiB, health peer worst {worst * 1000:.0f} ms")
    # Each attacker: soft limit + one answer in the transport (plus what the kernel took).
    assert growth < 2 * (SOFT + MIB) // 1024 + ALLOWANCE_KIB, f"RSS grew {growth} KiB"
    bound = health_bound()
    assert worst < bound, f"the health peer waited {worst * 1000:.0f} ms (bound {bound * 1000:.0f} ms at this load)"
    # The attacker's answers are owed to it, not dropped: reading now, it gets all 400.
    answer = encode(Response(400, Status.OK, v(b"x" * BIG)))
    reader = Discard(attackers[0].sock, 400 * len(answer))
    reader.start()
    reader.join(30)
    assert reader.received == 400 * len(answer) and reader.tail == answer[-4096:], reader.received
    owner.close()


def test_fetch_flood_is_bounded_by_the_output_budget(start_jetd):
    # Issue 12 item 1: FETCH_STATES("") many times over 4 KiB states, never read.
    daemon = start_jetd("--soft-limit", str(SOFT), "--hard-limit", str(HARD))
    owner = RawPeer(daemon.address, "owner")
    owner.send(*(AddState(i + 1, f"s/{i:04d}", v(b"y" * 4096)) for i in range(500)))
    owner.recv_n(500, timeout=20)
    health = HealthPeer(daemon.address)
    health.start()
    before = rss_kib(daemon.proc.pid)
    attacker = RawPeer(daemon.address, "fetch-flood", rcvbuf=4096)
    attacker.send_raw(b"".join(encode(FetchStates(i + 1, "")) for i in range(100)))  # ~200 MB of adds
    growth = peak_rss_growth_kib(daemon.proc.pid, before, 2.0)
    worst = health.finish()
    print(f"FETCH flood: RSS +{growth // 1024} MiB, health peer worst {worst * 1000:.0f} ms")
    assert growth < (SOFT + MIB) // 1024 + ALLOWANCE_KIB, f"RSS grew {growth} KiB"
    bound = health_bound()
    assert worst < bound, f"the health peer waited {worst * 1000:.0f} ms (bound {bound * 1000:.0f} ms at this load)"


def test_slow_reader_closed_overloaded_gets_its_close(start_jetd):
    # Issue 12 item 5: closed OVERLOADED (stuck past the deadline) behind hundreds of MB
    # in the transport, the CLOSE never arrived; now it follows at most the budget.
    daemon = start_jetd("--soft-limit", str(SOFT), "--slow-deadline", "0.5", "--shutdown-grace", "3")
    owner, slow = _big_state(daemon.address), _asks_300_big(daemon.address)
    time.sleep(1.5)  # stuck above the soft limit past the deadline
    close, read = read_slowly_until_close(slow, rate=16 * MIB, timeout=10)
    assert close is not None, f"no CLOSE after {read} bytes"
    assert close.status == Status.OVERLOADED and "stuck" in close.message, close
    assert read < 32 * MIB, read
    owner.close()


def test_a_reader_slower_than_the_grace_still_gets_its_close(start_jetd):
    # Issue 12 item 5 (tools.chaos overload-close): the peer reads on all the time, but
    # what the transport and the kernel hold when it is closed OVERLOADED takes it far
    # longer than the shutdown grace; the grace runs from its last progress, so the
    # CLOSE arrives (before: reset once the grace ran out, no CLOSE).
    daemon = start_jetd("--soft-limit", str(SOFT), "--slow-deadline", "0.5", "--shutdown-grace", "1")
    owner, slow = _big_state(daemon.address), _asks_300_big(daemon.address)
    started = time.monotonic()
    close, read = read_slowly_until_close(slow, rate=MIB // 2, timeout=30)
    assert close is not None, f"no CLOSE after {read} bytes"
    assert close.status == Status.OVERLOADED, close
    assert time.monotonic() - started > 2, "the reader took longer than the grace (the point of the test)"
    owner.close()


def test_a_peer_that_stops_reading_is_aborted_after_the_grace(start_jetd):
    # PROTOCOL.md 7.3, 10.8: lingering is for peers that read; one that reads nothing
    # for the shutdown grace after its CLOSE was queued is cut off (its socket reset).
    daemon = start_jetd("--soft-limit", str(SOFT), "--slow-deadline", "0.5", "--shutdown-grace", "1")
    owner, slow = _big_state(daemon.address), _asks_300_big(daemon.address)
    time.sleep(3)  # closed OVERLOADED after 0.5 s, then 1 s of grace without reading
    close, read = read_slowly_until_close(slow, rate=16 * MIB, timeout=10)
    assert close is None and read < 8 * MIB, (close, read)
    owner.close()


def test_pipelining_peer_gets_its_close_at_shutdown(start_jetd):
    # Issue 12 item 5: at shutdown the CLOSE waited behind the queued answers and the
    # socket was aborted when the grace ran out.
    daemon = start_jetd("--soft-limit", str(SOFT), "--shutdown-grace", "3")
    owner, slow = _big_state(daemon.address), _asks_300_big(daemon.address)
    time.sleep(0.5)
    daemon.proc.send_signal(signal.SIGTERM)
    close, read = read_slowly_until_close(slow, rate=16 * MIB, timeout=10)
    assert close is not None, f"no CLOSE after {read} bytes"
    assert close.status == Status.OK and close.message == "shutting down", close
    assert daemon.proc.wait(10) == 0
    owner.close()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_half_closed_pipeline_gets_every_answer(start_jetd, loop):
    # PROTOCOL.md 10.8: the held input of a stalled peer is processed, in order, even when
    # the peer has shut down its sending side meanwhile; only then is it gone (10.6).
    daemon = start_jetd("--soft-limit", str(SOFT), "--loop", loop)
    owner = _big_state(daemon.address)
    peer = RawPeer(daemon.address, "pipeliner")
    peer.send_raw(b"".join(encode(GetState(i + 1, "big")) for i in range(20)))
    peer.sock.shutdown(socket.SHUT_WR)
    answer = encode(Response(20, Status.OK, v(b"x" * BIG)))
    reader = Discard(peer.sock)  # reads until the daemon closes
    reader.start()
    reader.join(30)
    assert reader.received == 20 * len(answer) and reader.tail == answer[-4096:], reader.received
    owner.close()
