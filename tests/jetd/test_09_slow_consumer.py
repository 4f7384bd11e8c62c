"""Area 09: slow consumers (PROTOCOL.md 10.8): conflation above the soft limit, CLOSE
OVERLOADED above the hard limit or past the deadline; other peers unaffected."""

from __future__ import annotations

import threading
import time

from jetd_testlib import RawPeer
from jetd_testlib import rss_kib
from jetd_testlib import v

from jetwire import AddState
from jetwire import Close
from jetwire import Decoder
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchStates
from jetwire import NotifyState
from jetwire import RemoveState
from jetwire import Status
from jetwire import encode

KEYS = 100
VALUE_SIZE = 600
ROUNDS = 1600  # KEYS * ROUNDS notifies of ~640 bytes: ~100 MB to every fetcher


def _value(key: int, round_: int):
    return v(round_.to_bytes(4, "big") + bytes([key % 256]) * VALUE_SIZE)


class Drainer(threading.Thread):
    """Reads a socket as fast as it can, keeping the raw bytes to decode later."""

    def __init__(self, peer: RawPeer, expected_bytes: int, keep_only_last: bool = False) -> None:
        super().__init__(daemon=True)
        self.peer = peer
        self.expected = expected_bytes
        self.chunks: list[bytes] = []
        self.received = 0
        self.keep_only_last = keep_only_last

    def run(self) -> None:
        sock = self.peer.sock
        sock.settimeout(20)
        while self.received < self.expected:
            try:
                data = sock.recv(1 << 20)
            except OSError:  # timeout or reset: the test's assertions tell what happened
                return
            if not data:
                return
            self.chunks.append(data)
            if self.keep_only_last:
                del self.chunks[:-1]
            self.received += len(data)


def test_conflation_keeps_latest_values_and_others_get_everything(start_jetd):
    # Default soft limit (4 MiB); a hard limit far below what a non-conflating daemon would queue.
    daemon = start_jetd("--hard-limit", str(24 << 20), "--log-level", "DEBUG")
    owner = RawPeer(daemon.address, "owner")
    owner.send(*(AddState(k + 1, f"s/{k:03d}", _value(k, 0)) for k in range(KEYS)))
    owner.recv_n(KEYS)
    slow = RawPeer(daemon.address, "slow", rcvbuf=4096)
    slow_fid = slow.request(lambda rid: FetchStates(rid, "s/")).fetch_id
    slow.recv_n(KEYS)
    fast = RawPeer(daemon.address, "fast")
    fast_fid = fast.request(lambda rid: FetchStates(rid, "s/")).fetch_id
    fast.recv_n(KEYS)

    per_event = len(encode(FetchChange(fast_fid, "s/000", _value(0, 1))))
    drainer = Drainer(fast, per_event * KEYS * ROUNDS, keep_only_last=True)
    drainer.start()
    rss_before = rss_kib(daemon.proc.pid)
    started = time.monotonic()
    for r in range(1, ROUNDS + 1):
        owner.send(*(NotifyState(None, f"s/{k:03d}", _value(k, r)) for k in range(KEYS)))
        if r % 25 == 0:
            # Pace the owner to the fast fetcher (at most ~3 MB ahead, under the 4 MiB
            # soft limit) so that a busy test machine cannot make *it* a slow consumer;
            # the slow one still has all 100 MB flow past it.
            deadline = time.monotonic() + 20
            while drainer.received < per_event * KEYS * (r - 25) and time.monotonic() < deadline:
                time.sleep(0.001)
    drainer.join(30)
    elapsed = time.monotonic() - started
    rss_after = rss_kib(daemon.proc.pid)
    assert drainer.received == per_event * KEYS * ROUNDS, "the fast fetcher must get every change"
    # The slow peer's backlog is bounded by conflation, not by the 38 MB that flowed.
    assert rss_after - rss_before < 16 * 1024, (rss_before, rss_after)
    decoder = Decoder()
    decoder.receive_data(drainer.chunks[-1][-per_event:])
    assert decoder.next_message() == FetchChange(fast_fid, f"s/{KEYS - 1:03d}", _value(KEYS - 1, ROUNDS))

    # The slow peer reads now: per key the rounds only increase and end at the latest.
    latest = {}
    events = 0
    while len(latest) < KEYS or any(r != ROUNDS for r in latest.values()):
        message = slow.recv(timeout=10)
        assert isinstance(message, FetchChange) and message.fetch_id == slow_fid, message
        round_ = int.from_bytes(message.value.data[:4], "big")
        assert round_ > latest.get(message.key, 0), "changes of one key must stay in order"
        latest[message.key] = round_
        events += 1
    assert events < KEYS * ROUNDS, "some changes were conflated"
    slow.nothing_within(0.2)
    print(f"{per_event * KEYS * ROUNDS / 1e6:.0f} MB of changes per fetcher in {elapsed:.2f} s;"
          f" slow peer got {events} of {KEYS * ROUNDS} events; RSS {rss_before} -> {rss_after} KiB")
    daemon.stop()
    log = daemon.stderr()
    assert "slow #2 slow@" in log
    assert "fast@" not in "".join(line for line in log.splitlines() if " slow #" in line)


def test_hard_limit_closes_overloaded(start_jetd):
    daemon = start_jetd("--soft-limit", str(64 << 10), "--hard-limit", str(1 << 20))
    owner = RawPeer(daemon.address, "owner")
    slow = RawPeer(daemon.address, "slow", rcvbuf=4096)
    slow.request(lambda rid: FetchStates(rid, ""))
    fast = RawPeer(daemon.address, "fast")
    fast_fid = fast.request(lambda rid: FetchStates(rid, ""))
    # ADD and REMOVE are never conflated: this backlog can only grow.
    churn = []
    for i in range(4000):
        churn.append(AddState(2 * i + 1, f"c/{i}", v(b"x" * 1000)))
        churn.append(RemoveState(2 * i + 2, f"c/{i}"))
    # Exactly what the fast fetcher is owed: an ADD and a REMOVE (with the last value) per key.
    owed_per_key = [2 * (5 + 1 + 4 + 2 + len(f"c/{i}") + 5 + 1000) for i in range(4000)]
    owed = sum(owed_per_key)
    drainer = Drainer(fast, owed)
    drainer.start()
    batch = 250  # keys per send: ~0.5 MB of events per fetcher, half its hard limit
    for start in range(0, 4000, batch):
        owner.send(*churn[2 * start:2 * (start + batch)])
        # Pace the owner to the fast fetcher, so that a busy test machine (the drainer is a
        # thread of this process) cannot make *it* overloaded; the slow one still has all
        # 8 MB flow past it.
        owed_so_far = sum(owed_per_key[:start + batch])
        deadline = time.monotonic() + 20
        while drainer.received < owed_so_far and drainer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.001)
    owner.recv_n(len(churn), timeout=20)
    # The slow peer is cut off: reading now, it finds CLOSE (OVERLOADED) after what was in flight.
    closing, _ = slow.recv_until(lambda m: isinstance(m, Close), timeout=20)
    assert closing is not None and closing.status == Status.OVERLOADED, closing
    drainer.join(30)  # it stops by itself once it has every byte it is owed
    fast.sock.shutdown(2)
    assert fast_fid is not None
    # The fast fetcher saw the whole churn (8000 events + responses), the owner is fine.
    decoder = Decoder()
    decoder.receive_data(b"".join(drainer.chunks))
    messages = list(decoder.messages())
    assert not any(isinstance(m, Close) for m in messages), "the fast fetcher must not be cut off"
    got = [m for m in messages if isinstance(m, FetchAdd)]
    assert len(got) == 4000
    daemon.stop()
    assert "overloaded #" in daemon.stderr()


def test_stuck_past_deadline_closes_overloaded(start_jetd):
    daemon = start_jetd("--soft-limit", str(64 << 10), "--slow-deadline", "0.5")
    owner = RawPeer(daemon.address, "owner")
    owner.request(lambda rid: AddState(rid, "k", v(b"")))
    slow = RawPeer(daemon.address, "slow", rcvbuf=4096)
    slow.request(lambda rid: FetchStates(rid, ""))
    slow.recv()
    started = time.monotonic()
    # Enough to fill the kernel buffers and pass the soft limit; conflation keeps it small.
    for _ in range(10):
        owner.send(*(NotifyState(None, "k", v(b"y" * 4000)) for _ in range(500)))
    time.sleep(1.2)
    closing, _ = slow.recv_until(lambda m: isinstance(m, Close), timeout=20)
    assert closing is not None and closing.status == Status.OVERLOADED
    assert "stuck" in closing.message
    assert time.monotonic() - started < 8
