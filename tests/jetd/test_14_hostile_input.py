"""Area 14, input side (PROTOCOL.md 10.7): incomplete frames cost about their size, are
bounded across all connections, and must be completed in time; a new connection may be
given a time to send its first frame."""

from __future__ import annotations

import socket
import struct
import time

from jetd_testlib import RawPeer
from jetd_testlib import rss_kib
from jetd_testlib import v

from jetwire import GetState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import encode

KIB = 1 << 10
MIB = 1 << 20


def _head(length: int) -> bytes:
    return struct.pack(">BI", 1, length)  # a REQUEST of ``length`` body bytes


def test_incomplete_frames_are_closed_after_the_frame_timeout(start_jetd):
    # Issue 12 item 2: all but the last byte of a 1 MiB frame was held forever.
    daemon = start_jetd("--frame-timeout", "1")
    before = rss_kib(daemon.proc.pid)
    peers = [RawPeer(daemon.address, f"partial{i}") for i in range(16)]
    started = time.monotonic()
    for peer in peers:
        peer.send_raw(_head(MIB) + b"\x00" * (MIB - 1))
    time.sleep(0.5)
    growth = rss_kib(daemon.proc.pid) - before
    # About their size: 16 MiB held, not multiples of it.
    assert growth < 16 * 1024 * 1.3 + 8 * 1024, f"RSS grew {growth} KiB for 16 MiB of partial frames"
    for peer in peers:
        close = peer.expect_close(Status.TIMEOUT, timeout=10)
        assert close.message == "frame not completed within 1 s", close
    assert time.monotonic() - started < 6
    # A frame that completes in time is processed as usual.
    patient = RawPeer(daemon.address, "patient")
    frame = encode(GetState(1, "nothing"))
    patient.send_raw(frame[:7])
    time.sleep(0.5)
    patient.send_raw(frame[7:])
    answer = patient.recv()
    assert isinstance(answer, Response) and answer.status == Status.NOT_FOUND


def test_trickled_frames_cost_about_their_size(start_jetd):
    # Issue 12 item 2: 2-byte reads cost ~28 bytes of RSS per byte received. Many
    # connections take turns, so that each read the daemon does brings 2 bytes.
    daemon = start_jetd()
    peers = [RawPeer(daemon.address, f"trickle{i}") for i in range(128)]
    for peer in peers:
        peer.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each send its own segment
        peer.send_raw(_head(MIB))
    time.sleep(0.3)
    before = rss_kib(daemon.proc.pid)
    rounds = 512
    for _ in range(rounds):
        for peer in peers:
            peer.sock.send(b"\x00\x01")
    time.sleep(0.5)
    growth = rss_kib(daemon.proc.pid) - before
    trickled = len(peers) * rounds * 2 // KIB
    print(f"RSS grew {growth} KiB for {trickled} KiB trickled")
    assert growth < 2 * trickled + 512, f"RSS grew {growth} KiB for {trickled} KiB trickled"


def test_input_buffer_limit_across_connections(start_jetd):
    daemon = start_jetd("--max-body", str(256 * KIB), "--max-input-buffer", str(MIB))
    body = 220 * KIB
    frame = encode(SetState(7, "k", v(b"z" * (body - 13))))
    assert len(frame) == 5 + body
    peers = [RawPeer(daemon.address, f"holder{i}") for i in range(4)]
    for peer in peers:
        peer.send_raw(frame[:-1])  # 4 x 220 KiB held: under 1 MiB
    time.sleep(0.3)
    late = RawPeer(daemon.address, "late")
    late.send_raw(frame[:-1])  # 1100 KiB: over the limit
    close = late.expect_close(Status.LIMIT_EXCEEDED)
    assert close.message.startswith("input buffer limit reached"), close
    # The others are still there, and their frames complete.
    for peer in peers:
        peer.send_raw(frame[-1:])
        answer = peer.recv()
        assert isinstance(answer, Response) and answer.id == 7 and answer.status == Status.NOT_FOUND, answer
    assert "input buffer full" in daemon.stderr()


def test_first_frame_timeout(start_jetd):
    daemon = start_jetd("--first-frame-timeout", "0.5")
    silent = RawPeer(daemon.address)
    half = RawPeer(daemon.address)
    half.send_raw(_head(10)[:3])
    talker = RawPeer(daemon.address, "talker")
    for peer in (silent, half):
        close = peer.expect_close(Status.TIMEOUT, timeout=5)
        assert close.message == "no frame within 0.5 s of connecting", close
    answer = talker.request(lambda rid: GetState(rid, "x"))
    assert answer.status == Status.NOT_FOUND
