"""A WebSocket frame under assembly is charged to the one input budget (issue 29,
PROTOCOL.md 10.7, 13.2, 13.4): its bytes count against ``--max-input-buffer`` and its
first byte starts the ``--frame-timeout`` clock, as for an incomplete frame over TCP.

The attackers speak WebSocket by hand (websockets' sans-IO client for the handshake and
what the daemon sends, raw bytes for the frame they never finish), against a real jetd on
127.0.0.1. The tests assert closes and memory, not timings.
"""

from __future__ import annotations

import select
import struct
import sys
import time
from pathlib import Path
from typing import Union

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jetd"))

from jetd_testlib import rss_kib
from jetd_testlib import v
from webtest import WsPeer
from webtest import start_web_jetd

from jetwire import AddState
from jetwire import Close
from jetwire import Decoder
from jetwire import GetState
from jetwire import Info
from jetwire import Response
from jetwire import Status
from jetwire import encode
from tools.chaos.websocket import RawWsPeer

MiB = 1 << 20
WAIT = 30.0  # generous: the machine is shared
_MASKED_BINARY_64 = struct.Struct(">BBQ4s")


def open_peer(web: tuple[str, int], early: bytes = b"") -> RawWsPeer:
    """A hand-written WebSocket peer (tools.chaos's) that has read the daemon's INFO;
    ``early``: bytes sent right behind the upgrade request, in the same write."""
    peer = RawWsPeer(web, WAIT, early)
    while not peer.messages:
        assert peer.read(), "no INFO"
    assert isinstance(peer.messages.pop(0), Info)
    return peer


def status(peer: RawWsPeer) -> Union[str, Status]:
    """The CLOSE status the daemon sent, or "open"."""
    if peer.close_frame is not None:
        return peer.close_frame.status
    assert not peer.eof, f"the connection ended without CLOSE: {peer.messages}"
    return "open"


def settle(peers: list[RawWsPeer], ended: int, timeout: float = WAIT) -> list[Union[str, Status]]:
    """Read what the daemon sends until ``ended`` connections have ended (or ``timeout``
    passed, which the caller's assertions then show); returns each one's status."""
    deadline = time.monotonic() + timeout
    while sum(peer.eof for peer in peers) < ended and time.monotonic() < deadline:
        ready = select.select([peer.sock for peer in peers if not peer.eof], [], [], 0.2)[0]
        for peer in peers:
            if peer.sock in ready:
                peer.read()
    return [status(peer) for peer in peers]


def test_frames_under_assembly_are_charged_to_the_input_budget(start_jetd):
    # The attack scaled down: 16 connections each announce a 1 MiB WebSocket
    # frame and send all of it but one byte. The budget (2.5 MiB, all connections
    # together) holds two of them; every other one gets CLOSE LIMIT_EXCEEDED.
    count, budget = 16, 5 * MiB // 2
    daemon = start_web_jetd(start_jetd, "--max-input-buffer", str(budget), "--frame-timeout", "600",
                            "--shutdown-grace", "1")
    peers = [open_peer(daemon.web) for _ in range(count)]
    before = rss_kib(daemon.proc.pid)
    try:
        for peer in peers:
            peer.send_frame_start(MiB, MiB - 1, WAIT)
        outcomes = settle(peers, count - 2)
        closed = [o for o in outcomes if o != "open"]
        assert set(closed) == {Status.LIMIT_EXCEEDED}, outcomes
        # 2 x (1 MiB + 13) fit in 2.5 MiB, a third does not: exactly two are held.
        assert outcomes.count("open") == 2, outcomes
        # Memory: what the budget allows, not what was announced (16 MiB). The closed
        # connections' buffers go with them (each was aborted after the grace).
        growth = 0
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            growth = rss_kib(daemon.proc.pid) - before
            if growth < 6 * 1024:
                break
            time.sleep(0.2)
        assert growth < 6 * 1024, f"RSS grew {growth} KiB for {count} MiB announced"
        # The daemon is fine and the budget is free again once the held ones are gone.
        for peer in peers:
            peer.close()
        ws = WsPeer(daemon.web)
        big = b"x" * (MiB - 100)
        assert ws.request(lambda rid: AddState(rid, "big", v(big)), timeout=WAIT).status == Status.OK
        ws.close()
    finally:
        for peer in peers:
            peer.close()


def test_a_frame_not_completed_within_the_frame_timeout_closes(start_jetd):
    daemon = start_web_jetd(start_jetd, "--frame-timeout", "1")
    peers = [open_peer(daemon.web) for _ in range(3)]
    # A frame begun in the same write as the handshake (its header alone, and more).
    peers += [open_peer(daemon.web, _MASKED_BINARY_64.pack(0x82, 0x80 | 127, 1000, b"\0\0\0\0") + bytes(n))
              for n in (0, 10)]
    try:
        peers[0].send_frame_start(64 * 1024, 1000, WAIT)  # a frame begun
        peers[1].send_frame_start(MiB, 0, WAIT)  # only its header
        # A whole jet frame, then a WebSocket frame that carries the next jet frame's start.
        frame = encode(GetState(1, "k"))
        header = _MASKED_BINARY_64.pack(0x82, 0x80 | 127, len(frame), b"\0\0\0\0")
        peers[2].sock.sendall(header + frame)
        peers[2].send_frame_start(100, 10, WAIT)
        assert settle(peers, 5) == [Status.TIMEOUT] * 5
        assert isinstance(peers[2].messages[0], Response) and peers[2].messages[0].status == Status.NOT_FOUND
    finally:
        for peer in peers:
            peer.close()


def test_large_messages_within_the_budget_pass(start_jetd):
    # 1.5 MiB of budget: a frame of almost 1 MiB in one message, and one cut in pieces
    # (a fragmented message, and messages that split it anywhere), one after the other.
    daemon = start_web_jetd(start_jetd, "--max-input-buffer", str(3 * MiB // 2), "--frame-timeout", "600")
    ws = WsPeer(daemon.web, max_size=None)
    value = b"y" * (MiB - 1000)
    assert ws.request(lambda rid: AddState(rid, "a", v(value)), timeout=WAIT).status == Status.OK
    frame = encode(AddState(2, "b", v(value)))
    ws.ws.send([frame[:1], frame[1 : 300_000], frame[300_000:]])  # one message, three fragments
    assert ws.recv(WAIT) == Response(2, Status.OK)
    frame = encode(AddState(3, "c", v(value))) + encode(GetState(4, "a"))
    for start in range(0, len(frame), 333_333):
        ws.ws.send(frame[start : start + 333_333])
    assert ws.recv(WAIT) == Response(3, Status.OK)
    got = ws.recv(WAIT)
    assert isinstance(got, Response) and got.status == Status.OK and got.value == v(value)
    ws.close()


# --- the dispatcher's side, without sockets (Daemon.transport_holds) -----------------


class _Core:
    """A Daemon with in-memory peers; what it queues for a peer is decoded by ``recv``."""

    def __init__(self, **settings: object) -> None:
        from jetd.config import Config
        from jetd.core import Daemon

        self.daemon = Daemon(Config(**settings))  # type: ignore[arg-type]
        self.decoders: dict[int, Decoder] = {}

    def connect(self):  # type: ignore[no-untyped-def]
        conn = self.daemon.connect("mem:ws", 0.0)
        self.decoders[conn.conn_id] = Decoder(max_body=1 << 30)
        assert isinstance(self.recv(conn)[0], Info)
        return conn

    def recv(self, conn) -> list[object]:  # type: ignore[no-untyped-def]
        for dirty in self.daemon.take_dirty():
            self.decoders[dirty.conn_id].receive_data(b"".join(dirty.out))
            dirty.out.clear()
        return list(self.decoders[conn.conn_id].messages())


def test_transport_holds_is_charged_like_an_incomplete_frame():
    core = _Core(max_body=1000, max_input_buffer=3000, frame_timeout=5.0)
    daemon = core.daemon
    a, b = core.connect(), core.connect()
    daemon.receive_data(a, encode(GetState(1, "k"))[:7], 0.0)  # a jet frame begun: 7 bytes
    assert daemon.input_buffered == 7
    assert daemon.transport_holds(a, 1000, 1.0) and daemon.transport_holds(b, 1500, 1.0)
    assert daemon.input_buffered == 2507
    assert daemon.transport_holds(b, 1400, 2.0) and daemon.input_buffered == 2407  # less held
    # b's frame grows past the budget: b is closed as a TCP peer would be, its bytes freed.
    assert not daemon.transport_holds(b, 2000, 3.0)
    closes = [m for m in core.recv(b) if isinstance(m, Close)]
    assert [c.status for c in closes] == [Status.LIMIT_EXCEEDED]
    assert "input buffer limit reached" in closes[0].message
    assert daemon.input_buffered == 1007 and b.closing
    assert not daemon.transport_holds(b, 10, 3.0)  # a closed peer is charged nothing more
    assert daemon.input_buffered == 1007
    # a's frame clock started with its jet frame at 0.0: the WebSocket frame keeps it.
    daemon.tick(4.9)
    assert not a.closing
    daemon.tick(5.1)
    assert [m.status for m in core.recv(a) if isinstance(m, Close)] == [Status.TIMEOUT]
    assert daemon.input_buffered == 0


def test_a_complete_websocket_frame_stops_its_clock():
    core = _Core(frame_timeout=5.0)
    daemon = core.daemon
    conn = core.connect()
    assert daemon.transport_holds(conn, 14, 0.0)  # a header alone
    assert daemon.transport_holds(conn, 0, 4.0)  # complete (and fed: nothing left)
    daemon.tick(100.0)
    assert not conn.closing and daemon.input_buffered == 0
    assert daemon.transport_holds(conn, 50, 100.0)
    daemon.tick(105.1)
    assert [m.status for m in core.recv(conn) if isinstance(m, Close)] == [Status.TIMEOUT]
    assert daemon.input_buffered == 0
