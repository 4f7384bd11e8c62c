"""WebSocket peers (PROTOCOL.md 13) against a real jetd on 127.0.0.1: routing and fetch
across transports, slow consumers, origins, text messages, limits and closing."""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.exceptions import InvalidStatus
from websockets.frames import Opcode
from websockets.protocol import OPEN
from websockets.protocol import Protocol
from websockets.protocol import Side

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jetd"))

from jetd_testlib import RawPeer
from jetd_testlib import v
from webtest import WsPeer
from webtest import start_web_jetd

from jetwire import AddMethod
from jetwire import AddState
from jetwire import CallMethod
from jetwire import Close
from jetwire import Decoder
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Info
from jetwire import NotifyState
from jetwire import RemoveState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import encode


def test_ws_and_tcp_peers_route_and_fetch_through_each_other(start_jetd):
    daemon = start_web_jetd(start_jetd)
    tcp = RawPeer(daemon.address, "tcp")
    ws = WsPeer(daemon.web, "ws")
    # A WS fetcher sees a TCP owner's state; a TCP fetcher sees a WS owner's.
    ws_fid = ws.request(lambda rid: FetchStates(rid, "tcp/")).fetch_id
    tcp_fid = tcp.request(lambda rid: FetchStates(rid, "ws/")).fetch_id
    assert tcp.request(lambda rid: AddState(rid, "tcp/temp", v(21.5))).status == Status.OK
    assert ws.recv() == FetchAdd(ws_fid, "tcp/temp", v(21.5))
    assert ws.request(lambda rid: AddState(rid, "ws/mode", v("auto"))).status == Status.OK
    assert tcp.recv() == FetchAdd(tcp_fid, "ws/mode", v("auto"))

    # WS client -> TCP owner: the set is routed, the owner notifies then answers.
    rid = ws.next_id()
    ws.send(SetState(rid, "tcp/temp", v(30.0)))
    routed = tcp.recv()
    assert isinstance(routed, SetState) and routed.key == "tcp/temp" and routed.value == v(30.0)
    tcp.send(NotifyState(None, "tcp/temp", v(25.0)), Response(routed.id, Status.OK, v(25.0)))
    assert ws.recv() == FetchChange(ws_fid, "tcp/temp", v(25.0))  # PROTOCOL.md 10.3: before the OK
    assert ws.recv() == Response(rid, Status.OK, v(25.0))

    # TCP client -> WS owner, through a call answered by the WS peer.
    assert ws.request(lambda r: AddMethod(r, "ws/double")).status == Status.OK
    rid = tcp.next_id()
    tcp.send(CallMethod(rid, "ws/double", v(21)))
    call = ws.recv()
    assert isinstance(call, CallMethod) and call.value == v(21)
    ws.send(Response(call.id, Status.OK, v(42)))
    assert tcp.recv() == Response(rid, Status.OK, v(42))
    assert tcp.request(lambda r: GetState(r, "ws/mode")).value == v("auto")

    # The WS owner leaves with a WebSocket close: its state goes (PROTOCOL.md 10.6, 13.4).
    ws.close()
    assert tcp.recv() == FetchRemove(tcp_fid, "ws/mode", v("auto"))
    assert tcp.request(lambda r: GetState(r, "ws/mode")).status == Status.NOT_FOUND
    daemon.stop()
    assert "close #2 ws@ws:127.0.0.1:" in daemon.stderr()  # WebSocket peers are labelled ws:


def test_a_large_frame_spans_messages_and_messages_hold_many_frames(start_jetd):
    daemon = start_web_jetd(start_jetd, "--max-body", str(4 << 20))
    ws = WsPeer(daemon.web, max_size=None)
    ws.send(Info("big", 8 << 20))
    big = v(os.urandom(3 << 20))  # 3 MiB: the daemon sends it in messages of at most 1 MiB
    frame = encode(AddState(1, "big", big))
    # Our side: the frame cut in three messages, the last also holding two more frames.
    ws.ws.send(frame[:1000])
    rest = frame[1000:] + encode(GetState(2, "big")) + encode(GetState(3, "nope"))
    for start in range(0, len(rest), 1 << 20):
        ws.ws.send(rest[start : start + (1 << 20)])
    sizes = []
    messages = []
    decoder = Decoder(max_body=8 << 20)
    while len(messages) < 3:
        data = ws.ws.recv(5)
        sizes.append(len(data))
        decoder.receive_data(data)
        messages.extend(decoder.messages())
    assert messages == [Response(1, Status.OK), Response(2, Status.OK, big), messages[2]]
    assert messages[2].status == Status.NOT_FOUND
    assert max(sizes) <= 1 << 20 and len(sizes) >= 3, sizes  # PROTOCOL.md 13.2
    ws.close()


def _handshake(web, *, origin: Optional[str] = None, protocol: Optional[str] = "jet", rcvbuf: Optional[int] = None,
               path: str = "/jet"):
    """A raw WebSocket client handshake; returns (socket, status, bytes after the headers)."""
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(5)
    sock.connect(web)
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [f"GET {path} HTTP/1.1", f"Host: {web[0]}:{web[1]}", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
    if origin is not None:
        lines.append(f"Origin: {origin}")
    if protocol is not None:
        lines.append(f"Sec-WebSocket-Protocol: {protocol}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, head
        head += chunk
    head, _, rest = head.partition(b"\r\n\r\n")
    return sock, int(head.split()[1]), rest


def _client_frame(payload: bytes, opcode: int = 2, fin: bool = True) -> bytes:
    """A masked client frame (RFC 6455 5.2)."""
    mask = os.urandom(4)
    n = len(payload)
    first = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        head = first + bytes([0x80 | n])
    elif n < 65536:
        head = first + bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head = first + bytes([0x80 | 127]) + n.to_bytes(8, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class RawWsReader:
    """Reads server frames from a raw socket with websockets' sans-IO parser."""

    def __init__(self, sock: socket.socket, rest: bytes) -> None:
        self.sock = sock
        self.ws = Protocol(Side.CLIENT, state=OPEN, max_size=None)
        self.decoder = Decoder(max_body=64 << 20)
        self.close_code: Optional[int] = None
        self.eof = False
        if rest:
            self._feed(rest)

    def _feed(self, data: bytes) -> None:
        if not data:
            self.eof = True
            self.ws.receive_eof()
            return
        self.ws.receive_data(data)
        for frame in self.ws.events_received():
            if frame.opcode is Opcode.BINARY or frame.opcode is Opcode.CONT:
                self.decoder.receive_data(frame.data)
            elif frame.opcode is Opcode.CLOSE:
                self.close_code = self.ws.close_rcvd.code if self.ws.close_rcvd else None
        for out in self.ws.data_to_send():
            if out:
                self.sock.sendall(out)

    def recv(self, timeout: float = 10):
        deadline = time.monotonic() + timeout
        while True:
            message = self.decoder.next_message()
            if message is not None:
                return message
            if self.eof:
                return None
            assert time.monotonic() < deadline, "no message"
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(1 << 20)
            except ConnectionResetError:
                data = b""
            self._feed(data)

    def until_eof(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not self.eof:
            assert time.monotonic() < deadline, "no EOF"
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            self._feed(self.sock.recv(1 << 20))


def test_ws_peer_that_never_reads_is_a_slow_consumer(start_jetd):
    """PROTOCOL.md 10.8 over WebSocket: parked above the soft limit, CLOSE OVERLOADED above
    the hard limit; the owner is not held up."""
    # A long shutdown grace: the slow peer reads its CLOSE only after the whole churn.
    daemon = start_web_jetd(start_jetd, "--soft-limit", str(64 << 10), "--hard-limit", str(1 << 20),
                            "--shutdown-grace", "30", "--log-level", "DEBUG")
    owner = RawPeer(daemon.address, "owner")
    sock, status, rest = _handshake(daemon.web, rcvbuf=4096)
    assert status == 101
    sock.sendall(_client_frame(encode(Info("slow")) + encode(FetchStates(1, ""))))
    time.sleep(0.2)  # let the fetch be made before the churn starts (not a synchronisation: see below)
    churn = []
    for i in range(3000):
        churn.append(AddState(2 * i + 1, f"c/{i}", v(b"x" * 1000)))
        churn.append(RemoveState(2 * i + 2, f"c/{i}"))
    for start in range(0, len(churn), 500):
        owner.send(*churn[start : start + 500])
    answers = owner.recv_n(len(churn), timeout=30)
    assert all(a.status == Status.OK for a in answers)  # the owner never waited for the slow peer
    # Reading now, the slow peer finds CLOSE (OVERLOADED) after what was in flight, then
    # the WebSocket close frame.
    reader = RawWsReader(sock, rest)
    seen = []
    while True:
        message = reader.recv(20)
        assert message is not None, f"no CLOSE before EOF after {len(seen)} messages: {daemon.stderr()[-3000:]}"
        if isinstance(message, Close):
            break
        seen.append(message)
    assert message.status == Status.OVERLOADED, message
    assert isinstance(seen[0], Info) and isinstance(seen[1], Response) and seen[1].fetch_id is not None
    reader.until_eof()
    assert reader.close_code == 1000
    daemon.stop()
    log = daemon.stderr()
    assert "slow #2 slow@ws:127.0.0.1:" in log
    assert "overloaded #2 slow@ws:127.0.0.1:" in log


def test_origin_policy(start_jetd):
    daemon = start_web_jetd(start_jetd, "--http-origins", "http://app.example:8000, https://other.example")
    host, port = daemon.web
    # Same origin (a page served by this listener), an allowed one, and a program (no Origin).
    for origin in (f"http://{host}:{port}", "http://app.example:8000", "https://OTHER.example/", None):
        kwargs = {"origin": origin} if origin is not None else {}
        peer = WsPeer(daemon.web, "ok", **kwargs)
        assert peer.request(lambda rid: GetState(rid, "x")).status == Status.NOT_FOUND
        peer.close()
    for origin in ("http://evil.example", f"https://{host}:{port}", "http://app.example:8001", "null"):
        with pytest.raises(InvalidStatus) as refused:
            WsPeer(daemon.web, origin=origin)
        assert refused.value.response.status_code == 403
        assert b"not allowed" in refused.value.response.body
    # Two Origin headers are refused too, and a refused handshake gets no jet byte.
    sock, status, rest = _handshake(daemon.web, origin="http://evil.example")
    assert status == 403 and b"\x04\x00" not in rest
    sock.close()
    daemon.stop()
    log = daemon.stderr()
    assert log.count("refused: origin") == 5
    assert log.count("open #") == 4  # only the accepted handshakes became peers


def test_any_origin_with_star(start_jetd):
    daemon = start_web_jetd(start_jetd, "--http-origins", "*")
    WsPeer(daemon.web, origin="http://anything.example").close()


def test_handshake_needs_the_jet_subprotocol(start_jetd):
    daemon = start_web_jetd(start_jetd)
    for protocol in (None, "chat"):
        sock, status, rest = _handshake(daemon.web, protocol=protocol)
        assert status == 400, (protocol, status)
        assert b"subprotocol" in rest
        sock.close()


def test_text_message_closes_malformed_then_1003(start_jetd):
    daemon = start_web_jetd(start_jetd)
    owner = RawPeer(daemon.address, "owner")
    fid = owner.request(lambda rid: FetchStates(rid, "")).fetch_id
    ws = WsPeer(daemon.web, "texter")
    assert ws.request(lambda rid: AddState(rid, "t/k", v(1))).status == Status.OK
    assert owner.recv() == FetchAdd(fid, "t/k", v(1))
    ws.ws.send('{"method": "set"}')  # a text message, e.g. classic JSON Jet
    close = ws.expect_close(Status.MALFORMED)
    assert "text messages" in close.message
    with pytest.raises(ConnectionClosed):
        ws.recv()
    assert ws.ws.close_code == 1003
    assert owner.recv() == FetchRemove(fid, "t/k", v(1))  # its state is gone (PROTOCOL.md 10.6)


def test_frame_above_the_message_bound_closes_1009(start_jetd):
    daemon = start_web_jetd(start_jetd)
    sock, status, rest = _handshake(daemon.web)
    assert status == 101
    reader = RawWsReader(sock, rest)
    assert isinstance(reader.recv(), Info)
    sock.sendall(_client_frame(b"\x00" * ((1 << 20) + 1)))  # PROTOCOL.md 13.2: 1 MiB at most
    reader.until_eof()
    assert reader.close_code == 1009
    owner = RawPeer(daemon.address, "after")  # the daemon is fine
    assert owner.request(lambda rid: GetState(rid, "x")).status == Status.NOT_FOUND


def test_jet_close_from_peer_and_shutdown_close(start_jetd):
    daemon = start_web_jetd(start_jetd)
    tcp = RawPeer(daemon.address, "watcher")
    fid = tcp.request(lambda rid: FetchStates(rid, "")).fetch_id
    leaving = WsPeer(daemon.web, "leaving")
    leaving.request(lambda rid: AddState(rid, "l", v(True)))
    assert tcp.recv() == FetchAdd(fid, "l", v(True))
    leaving.send(Close(Status.OK, "bye"))  # PROTOCOL.md 7.3: a disconnect
    assert tcp.recv() == FetchRemove(fid, "l", v(True))
    with pytest.raises(ConnectionClosed):
        leaving.recv()
    assert leaving.ws.close_code == 1000
    staying = WsPeer(daemon.web, "staying")
    assert daemon.stop() == 0
    staying.expect_close(Status.OK)  # PROTOCOL.md 10.9
    with pytest.raises(ConnectionClosed):
        staying.recv()
    assert staying.ws.close_code == 1000


def test_static_files_and_bad_requests(start_jetd):
    import http.client

    daemon = start_web_jetd(start_jetd)
    host, port = daemon.web
    conn = http.client.HTTPConnection(host, port, timeout=5)
    conn.request("GET", "/")
    page = conn.getresponse()
    assert page.status == 200 and page.getheader("Content-Type").startswith("text/html")
    assert b"<html" in page.read().lower()
    for path, status in (("/jet.js", 200), ("/registry.json", 200), ("/../etc/passwd", 404), ("/nope", 404)):
        conn = http.client.HTTPConnection(host, port, timeout=5)
        conn.request("GET", path)
        response = conn.getresponse()
        assert response.status == status, path
    conn = http.client.HTTPConnection(host, port, timeout=5)
    conn.request("POST", "/", body=b"")
    assert conn.getresponse().status == 405
    # A connection that never sends a request costs nothing lasting (handshake timeout),
    # and garbage gets no answer but a close.
    sock = socket.create_connection((host, port), timeout=5)
    sock.sendall(b"\x16\x03\x01 not http\r\n\r\n")
    assert sock.recv(100) == b""
    assert RawPeer(daemon.address).request(lambda rid: GetState(rid, "x")).status == Status.NOT_FOUND


def test_same_limits_as_tcp(start_jetd):
    daemon = start_web_jetd(start_jetd, "--max-connections", "2", "--max-body", "1000")
    tcp = RawPeer(daemon.address, "tcp")
    # max_body (PROTOCOL.md 3): a header announcing more is fatal, over WebSocket too.
    big = WsPeer(daemon.web, "big")
    big.ws.send(bytes([1]) + (1001).to_bytes(4, "big"))
    assert "exceeds max_body" in big.expect_close(Status.TOO_LARGE).message
    # max_connections (PROTOCOL.md 10.7) counts WebSocket peers with TCP ones.
    second = WsPeer(daemon.web, "second")
    third = WsPeer(daemon.web)  # INFO, then CLOSE LIMIT_EXCEEDED
    third.expect_close(Status.LIMIT_EXCEEDED)
    assert second.request(lambda rid: GetState(rid, "x")).status == Status.NOT_FOUND
    assert tcp.request(lambda rid: GetState(rid, "x")).status == Status.NOT_FOUND


def test_event_log_records_websocket_peers(start_jetd, tmp_path):
    from jetwire.log import LogKind
    from jetwire.log import LogRecord
    from jetwire.log import iter_log
    from jetwire.log import parse_record_data

    daemon = start_web_jetd(start_jetd, "--log-dir", str(tmp_path / "log"), "--log-fsync", "always")
    ws = WsPeer(daemon.web, "logged")
    assert ws.request(lambda rid: AddState(rid, "k", v(1))).status == Status.OK
    ws.close()
    assert daemon.stop() == 0
    records = []
    for segment in sorted((tmp_path / "log").glob("jet-*.jetlog")):
        with open(segment, "rb") as stream:
            records += [i for i in iter_log(stream) if isinstance(i, LogRecord)]
    opens = [parse_record_data(r.kind, r.data) for r in records if r.kind == LogKind.CONN_OPEN]
    assert [o["address"].startswith("ws:127.0.0.1:") for o in opens] == [True]  # JETLOG.md 4
    assert any(r.kind == LogKind.FRAME_IN and r.data.startswith(b"\x01") for r in records)


def _http_reply(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything the daemon sends until it closes (b"" for a close without a word)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_http_phase_connections_are_bounded(start_jetd):
    """Connections to the HTTP port that never finish their request count against
    max_connections (with the peers), are refused beyond it with 503 and a log line, and
    are closed after the handshake timeout, with a log line."""
    daemon = start_web_jetd(start_jetd, "--max-connections", "3", "--http-handshake-timeout", "1.5")
    started = time.monotonic()
    idle = [socket.create_connection(daemon.web, timeout=5) for _ in range(3)]
    try:
        idle[0].sendall(b"GET /jet HTTP/1.1\r\nHost: x\r\n")  # an unfinished request
        # The fourth is over the limit: refused at once, not left waiting.
        with socket.create_connection(daemon.web, timeout=5) as fourth:
            reply = _http_reply(fourth)
        assert reply.startswith(b"HTTP/1.1 503 "), reply
        assert b"too many connections" in reply
        assert time.monotonic() - started < 1.5, "refused only at the handshake timeout"
        # They count with the peers: a TCP peer is refused too (PROTOCOL.md 10.7).
        tcp = RawPeer(daemon.address, "tcp")
        assert isinstance(tcp.recv(), Close)
        # After the handshake timeout, the daemon closes them.
        for sock in idle:
            assert _http_reply(sock) == b""
        assert time.monotonic() - started >= 1.4
        # A request that never ends is cut off at 32 KiB, not held until the timeout.
        with socket.create_connection(daemon.web, timeout=5) as endless:
            with contextlib.suppress(OSError):
                endless.sendall(b"GET /jet HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 300) for i in range(120)))
            reply = _http_reply(endless)
        assert reply.startswith(b"HTTP/1.1 431 ") and b"HTTP request longer than 32768 bytes" in reply, reply
        # And the room is free again.
        _a_peer_gets_in(daemon.web)
    finally:
        for sock in idle:
            sock.close()
    daemon.stop()
    log = daemon.stderr()
    assert "too many connections (max 3)" in log and "refused" in log
    assert "without a complete HTTP request within 1.5 s" in log


def _a_peer_gets_in(web: tuple[str, int]) -> None:
    """A WebSocket peer connects and is answered."""
    peer = WsPeer(web, "after")
    assert peer.request(lambda rid: GetState(rid, "x")).status == Status.NOT_FOUND
    peer.close()


def test_http_connections_beyond_the_fd_limit_get_503(start_jetd, tmp_path):
    """PROTOCOL.md 10.7, 13.1: with a descriptor limit below max_connections, connections to
    the HTTP port that jetd cannot keep are answered 503 and logged, not left unaccepted."""
    limit = 64
    (tmp_path / "sitecustomize.py").write_text(
        f"import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))\n"
    )
    repo = Path(__file__).resolve().parents[2]
    daemon = start_web_jetd(start_jetd, env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{repo}"})
    socks = [socket.create_connection(daemon.web, timeout=5) for _ in range(limit + 16)]
    try:
        for sock in socks[-16:]:
            reply = _http_reply(sock, timeout=5)
            assert reply.startswith(b"HTTP/1.1 503 ") and b"out of file descriptors" in reply, reply
        # A WebSocket peer gets in once they are gone.
        for sock in socks:
            sock.close()
        time.sleep(0.3)
        _a_peer_gets_in(daemon.web)
    finally:
        for sock in socks:
            sock.close()
    daemon.stop()
    assert "refused" in daemon.stderr() and "out of file descriptors" in daemon.stderr()
