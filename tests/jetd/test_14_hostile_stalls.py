"""Area 14, latency (issue 12 item 4): one request must not stall the other peers. The
initial adds of big fetches (PROTOCOL.md 10.5) and a burst of route timeouts (10.3) go
out in slices; a health peer's set-and-get rounds never wait more than 250 ms (scaled
by the load of a busy machine, hostile_lib.health_bound)."""

from __future__ import annotations

import signal
import time

from hostile_lib import Discard
from hostile_lib import HealthPeer
from hostile_lib import health_bound
from jetd_testlib import RawPeer
from jetd_testlib import v

from jetwire import AddState
from jetwire import FetchAdd
from jetwire import FetchStates
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import encode

STATES = 50_000


def test_big_fetches_do_not_stall_other_peers(start_jetd):
    daemon = start_jetd()
    owner = RawPeer(daemon.address, "owner")
    batch = 5_000
    for start in range(0, STATES, batch):
        owner.send_raw(b"".join(encode(AddState(i + 1, f"s/{i:06d}", v(i))) for i in range(start, start + batch)))
    for _ in range(STATES):
        assert owner.recv(timeout=20).status == Status.OK  # type: ignore[attr-defined]
    health = HealthPeer(daemon.address)
    health.start()
    time.sleep(0.2)
    fetcher = RawPeer(daemon.address, "fetcher")
    fetches = 8  # 400,000 initial adds asked for in one write
    per_add = len(encode(FetchAdd(1, "s/000000", v(0))))
    per_ok = len(encode(Response(1, Status.OK, fetch_id=1)))
    reader = Discard(fetcher.sock, fetches * (per_ok + STATES * per_add))
    reader.start()
    fetcher.send_raw(b"".join(encode(FetchStates(i + 1, "s/")) for i in range(fetches)))
    reader.join(60)
    worst = health.finish()
    print(f"big fetches: health peer worst {worst * 1000:.0f} ms")
    assert reader.received == fetches * (per_ok + STATES * per_add), reader.received
    bound = health_bound()
    assert worst < bound, f"the health peer waited {worst * 1000:.0f} ms (bound {bound * 1000:.0f} ms at this load)"
    owner.close()


def test_route_timeout_burst_does_not_stall_other_peers(start_jetd):
    routes = 200_000
    daemon = start_jetd("--route-timeout", "3", "--max-pending-per-owner", str(routes))
    owner = RawPeer(daemon.address, "silent-owner")
    owner.request(lambda rid: AddState(rid, "r", v(0)))
    set_size = len(encode(SetState(1, "r", v(1))))
    owner_reader = Discard(owner.sock, routes * set_size)  # takes the routed sets, answers none
    owner_reader.start()
    requester = RawPeer(daemon.address, "requester")
    timeout_answer = len(encode(Response(1, Status.TIMEOUT, message="the owner did not answer in time")))
    requester_reader = Discard(requester.sock, routes * timeout_answer)
    requester_reader.start()
    requester.send_raw(b"".join(encode(SetState(i + 1, "r", v(i))) for i in range(routes)))
    owner_reader.join(30)
    assert owner_reader.received == routes * set_size
    # Every route is pending now; freeze the daemon past the route timeout so that all of
    # them expire in one tick when it goes on.
    health = HealthPeer(daemon.address)
    health.measuring.clear()
    health.start()
    daemon.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(3.2)
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
    health.measuring.set()
    requester_reader.join(30)
    time.sleep(0.3)
    worst = health.finish()
    print(f"route timeout burst: health peer worst {worst * 1000:.0f} ms")
    assert requester_reader.received == routes * timeout_answer, requester_reader.received
    bound = health_bound()
    assert worst < bound, f"the health peer waited {worst * 1000:.0f} ms (bound {bound * 1000:.0f} ms at this load)"
    owner.close()
