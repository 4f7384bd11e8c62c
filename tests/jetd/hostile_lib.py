"""Helpers for the hostile-peer tests (area 14): a health peer that measures how long
the daemon keeps everyone else waiting, a reader that empties a socket, and a reader
that takes its bytes slowly."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Optional

from jetd_testlib import RawPeer
from jetd_testlib import rss_kib
from jetd_testlib import v

from jetwire import AddState
from jetwire import Close
from jetwire import Decoder
from jetwire import GetState
from jetwire import Message
from jetwire import NotifyState
from jetwire import Response

HEALTH_PERIOD = 0.05  # seconds between the health peer's rounds
HEALTH_BOUND = 0.25  # the longest a round may take on a quiet 2-core machine


def health_bound() -> float:
    """HEALTH_BOUND scaled by how busy the machine is (the 1-minute load average per
    core, at least 1): a stall the tests look for is the whole job done in one go,
    seconds at these sizes, while other work on the machine only delays each round
    in proportion. The latency targets themselves live in the benchmarks
    (tools.bench.query_stall, tools.chaos), not here."""
    return HEALTH_BOUND * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


class HealthPeer(threading.Thread):
    """Owns a state; every 50 ms sets it (NOTIFY_STATE request) and reads it back
    (GET_STATE), and records how long each round waited for its two answers."""

    def __init__(self, address: tuple[str, int], key: str = "health") -> None:
        super().__init__(daemon=True)
        self.peer = RawPeer(address, "health")
        self.key = key
        self.peer.request(lambda rid: AddState(rid, key, v(0)))
        self.waits: list[float] = []
        self.stop_event = threading.Event()
        self.measuring = threading.Event()
        self.measuring.set()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        peer = self.peer
        n = 0
        try:
            while not self.stop_event.is_set():
                self.measuring.wait()
                n += 1
                rid = peer.next_id()
                started = time.monotonic()
                peer.send(NotifyState(rid, self.key, v(n)), GetState(rid + 1, self.key))
                peer.next_id()
                for expected in (rid, rid + 1):
                    message = peer.recv(timeout=30)
                    assert isinstance(message, Response) and message.id == expected, message
                self.waits.append(time.monotonic() - started)
                time.sleep(HEALTH_PERIOD)
        except BaseException as exc:  # reported by the test through check()
            self.error = exc

    def finish(self) -> float:
        """Stop; returns the longest wait (seconds) and fails on the peer's own error."""
        self.stop_event.set()
        self.measuring.set()
        self.join(35)
        if self.error is not None:
            raise AssertionError(f"health peer failed: {self.error!r}")
        assert self.waits, "the health peer made no round"
        self.peer.close()
        return max(self.waits)


class Discard(threading.Thread):
    """Reads a socket as fast as it can and drops the bytes (counting them)."""

    def __init__(self, sock: socket.socket, expected: Optional[int] = None) -> None:
        super().__init__(daemon=True)
        self.sock = sock
        self.expected = expected
        self.received = 0
        self.tail = b""

    def run(self) -> None:
        self.sock.settimeout(30)
        while self.expected is None or self.received < self.expected:
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            self.received += len(data)
            self.tail = (self.tail + data)[-4096:]


def read_slowly_until_close(peer: RawPeer, rate: float, timeout: float) -> tuple[Optional[Close], int]:
    """Read at about ``rate`` bytes/s until a CLOSE or EOF; returns (the CLOSE or None,
    bytes read)."""
    decoder = Decoder(max_body=64 << 20)
    sock = peer.sock
    sock.settimeout(timeout)
    chunk = 64 * 1024
    total = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = sock.recv(chunk)
        except (TimeoutError, ConnectionResetError):
            return None, total
        if not data:
            return None, total
        total += len(data)
        decoder.receive_data(data)
        message: Optional[Message]
        while (message := decoder.next_message()) is not None:
            if isinstance(message, Close):
                return message, total
        time.sleep(len(data) / rate)
    return None, total


def peak_rss_growth_kib(pid: int, before: int, seconds: float) -> int:
    """Sample RSS for ``seconds``; returns the peak growth over ``before`` (KiB)."""
    peak = before
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, rss_kib(pid))
        time.sleep(0.02)
    return peak - before
