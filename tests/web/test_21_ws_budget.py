"""The WebSocket side of the one input budget (issue 29, PROTOCOL.md 10.7, 13.2, 13.4),
beyond test_07: a frame header announcing more than the whole budget, a jet frame cut
into a fragmented message of many WebSocket frames, and a ping flood from a peer that
reads nothing. Hand-written WebSocket peers (tools.chaos's) against a real jetd on
127.0.0.1; the tests assert closes, byte counts and memory, never timings.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jetd"))

from jetd_testlib import rss_kib
from jetd_testlib import v
from test_07_input_budget import open_peer
from test_07_input_budget import settle
from webtest import start_web_jetd

from jetwire import AddState
from jetwire import Status
from jetwire import encode

KiB = 1024
WAIT = 30.0  # generous: the machine is shared
BUDGET = 256 * KiB  # --max-input-buffer of these tests
SMALL = ("--max-body", str(64 * KiB), "--max-input-buffer", str(BUDGET), "--frame-timeout", "600",
         "--shutdown-grace", "1")


def ws_frame(opcode: int, payload: bytes, fin: bool) -> bytes:
    """A masked client frame (mask 0, so the payload goes as it is)."""
    first = (0x80 if fin else 0) | opcode
    if len(payload) < 126:
        return struct.pack(">BB4s", first, 0x80 | len(payload), b"\0\0\0\0") + payload
    return struct.pack(">BBH4s", first, 0x80 | 126, len(payload), b"\0\0\0\0") + payload


def test_a_frame_announcing_more_than_the_budget_closes_once_its_bytes_pass_it(start_jetd):
    """One frame header announcing 1 MiB (the frame bound, four times the budget): jetd
    takes its bytes as they come, charged, and closes the peer LIMIT_EXCEEDED once they
    pass 256 KiB, not when 1 MiB has arrived (and not never)."""
    daemon = start_web_jetd(start_jetd, *SMALL)
    peer = open_peer(daemon.web)
    try:
        peer.send_frame_start(1 << 20, 512 * KiB, WAIT)  # False once jetd hung up: fine
        assert settle([peer], 1) == [Status.LIMIT_EXCEEDED]
    finally:
        peer.close()
    assert daemon.stop() == 0
    assert "input_overflows=1" in daemon.stderr()


def test_a_jet_frame_in_a_fragmented_message_is_charged(start_jetd):
    """Six peers each send the first 58 KiB of a 60 KB jet frame as one fragmented
    WebSocket message (a binary frame, then continuation frames of 4 KiB, never the
    last): every fragment reaches the core at once, which holds the jet frame as it would
    over TCP. 6 x 58 KiB against 256 KiB: at most four fit, at least two are closed."""
    daemon = start_web_jetd(start_jetd, *SMALL)
    frame = encode(AddState(1, "big", v("x" * 60_000)))[: 58 * KiB]
    pieces = [frame[start:start + 4 * KiB] for start in range(0, len(frame), 4 * KiB)]
    message = ws_frame(0x2, pieces[0], False) + b"".join(ws_frame(0x0, piece, False) for piece in pieces[1:])
    peers = [open_peer(daemon.web) for _ in range(6)]
    try:
        for peer in peers:
            peer.sock.settimeout(WAIT)
            with contextlib.suppress(OSError):  # closed already
                peer.sock.sendall(message)
        outcomes = settle(peers, 2)
        assert outcomes.count(Status.LIMIT_EXCEEDED) >= 2, outcomes
        assert set(outcomes) <= {Status.LIMIT_EXCEEDED, "open"}, outcomes
    finally:
        for peer in peers:
            peer.close()


def test_a_ping_flood_from_a_peer_that_reads_nothing_is_not_read_on(start_jetd):
    """Pings of 125 bytes as fast as the socket takes them, the pongs never read: once
    the pongs back up jetd stops reading the peer (flow control, as for a jet peer that
    reads nothing), so the flood stops at the kernel's buffers, and jetd's memory grows
    by about the soft limit, not by what the peer would send (32 MB)."""
    daemon = start_web_jetd(start_jetd, "--soft-limit", str(256 * KiB))
    peer = open_peer(daemon.web)
    peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    before = rss_kib(daemon.proc.pid)
    batch = ws_frame(0x9, bytes(125), True) * 1000
    limit = 32 * 1000 * 1000
    sent = 0
    peer.sock.settimeout(5.0)  # a send that takes nothing for this long: jetd stopped reading
    try:
        deadline = time.monotonic() + 120
        while sent < limit and time.monotonic() < deadline:
            try:
                peer.sock.sendall(batch)
            except TimeoutError:
                break
            sent += len(batch)
        growth = rss_kib(daemon.proc.pid) - before
    finally:
        peer.close()
    assert sent < limit, f"jetd read {sent} bytes of pings whose pongs were never read"
    assert growth < 16 * 1024, f"RSS grew {growth} KiB"
