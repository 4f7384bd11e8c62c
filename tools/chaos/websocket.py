"""WebSocket attackers for chaos (issue 29): peers that upgrade on jetd's HTTP listener
and then write WebSocket frames by hand, so that they can stop in the middle of one."""

from __future__ import annotations

import select
import socket
import ssl
import struct
import time
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple
from typing import Optional

from websockets.client import ClientProtocol
from websockets.frames import Frame
from websockets.frames import Opcode
from websockets.http11 import Response as HttpResponse
from websockets.protocol import CONNECTING
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from jetwire import Close
from jetwire import Decoder
from jetwire import Message

from .harness import Daemon
from .harness import NeedsOwnDaemon
from .harness import stdout_line

WEB_LINE_TIMEOUT = 15.0
_MASKED_BINARY_64 = struct.Struct(">BBQ4s")  # FIN + binary, mask bit + 64-bit length, mask key


class WebAddress(NamedTuple):
    """Where a daemon's HTTP listener is, and whether it speaks TLS (``web on https://``:
    jetd serves its web port over TLS when it has a certificate)."""

    host: str
    port: int
    tls: bool


def web_address(daemon: Daemon) -> WebAddress:
    """The HTTP listener of a daemon chaos started with ``--http-port 0``: its second
    stdout line, ``web on http://HOST:PORT/`` (or ``https://``)."""
    proc = daemon.proc
    if proc is None or proc.stdout is None:
        raise NeedsOwnDaemon("needs a daemon chaos starts (its HTTP port)")
    line = stdout_line(proc, WEB_LINE_TIMEOUT)
    if not line.endswith(b"\n"):
        raise RuntimeError("jetd printed no 'web on' line")
    text = line.decode().strip()
    scheme, _, rest = text.removeprefix("web on ").partition("://")
    if scheme not in ("http", "https"):
        raise RuntimeError(f"not a 'web on' line: {text!r}")
    host, _, port = rest.rstrip("/").rpartition(":")
    return WebAddress(host.strip("[]"), int(port), scheme == "https")


class RawWsPeer:
    """A jet peer over WebSocket whose frames are written by hand. What the daemon sends
    is parsed by websockets' sans-IO client; the jet messages are kept in ``messages``
    and the jet CLOSE, if any, in ``close_frame``."""

    def __init__(self, web: tuple[str, int], timeout: float = 10.0, early: bytes = b"", tls: bool = False) -> None:
        """Upgrade; ``early``: bytes sent right behind the request, in the same write;
        ``tls``: over TLS (wss), the daemon's certificate not checked (an attacker's view)."""
        self.sock = socket.create_connection(web, timeout=timeout)
        if tls:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            self.sock = context.wrap_socket(self.sock, server_hostname=web[0])
        scheme = "wss" if tls else "ws"
        self.proto = ClientProtocol(parse_uri(f"{scheme}://{web[0]}:{web[1]}/jet"), subprotocols=[Subprotocol("jet")],
                                    max_size=None)
        self.proto.send_request(self.proto.connect())
        self.sock.sendall(b"".join(self.proto.data_to_send()) + early)
        self.decoder = Decoder(max_body=64 << 20)
        self.messages: list[Message] = []
        self.close_frame: Optional[Close] = None
        self.eof = False
        while self.proto.state is CONNECTING:
            if not self.read():
                raise ConnectionError("no answer to the WebSocket handshake")

    def read(self) -> bool:
        """One read (blocking up to the socket's timeout); False at the end."""
        try:
            data = self.sock.recv(1 << 16)
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
            data = b""
        if not data:
            self.eof = True
            return False
        self.proto.receive_data(data)
        for event in self.proto.events_received():
            if isinstance(event, HttpResponse):
                if event.status_code != 101:
                    raise ConnectionError(f"handshake refused: HTTP {event.status_code}")
            elif isinstance(event, Frame) and event.opcode in (Opcode.BINARY, Opcode.CONT):
                self.decoder.receive_data(bytes(event.data))
                for message in self.decoder.messages():
                    self.messages.append(message)
                    if isinstance(message, Close):
                        self.close_frame = message
        return True

    def send_frame_start(self, announced: int, sent: int, timeout: float) -> bool:
        """A binary frame header announcing ``announced`` payload bytes, then ``sent`` of
        them (mask 0). False if the daemon hung up or did not take them in time."""
        header = _MASKED_BINARY_64.pack(0x82, 0x80 | 127, announced, b"\0\0\0\0")
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(header + bytes(sent))
        except OSError:
            return False
        return True

    def close(self) -> None:
        self.sock.close()


def ws_closures(peers: Sequence[RawWsPeer], timeout: float) -> Counter[str]:
    """Read what the daemon sends for ``timeout`` (or until every connection ended);
    how each ended: ``CLOSE <STATUS>``, ``EOF without CLOSE`` or ``still open``."""
    deadline = time.monotonic() + timeout
    for peer in peers:
        peer.sock.settimeout(1.0)
    while time.monotonic() < deadline:
        live = [peer.sock for peer in peers if not peer.eof]
        if not live:
            break
        ready = select.select(live, [], [], min(0.2, max(0.0, deadline - time.monotonic())))[0]
        for peer in peers:
            if peer.sock in ready:
                peer.read()
    return Counter(
        (f"CLOSE {p.close_frame.status.name}" if p.close_frame else "EOF without CLOSE") if p.eof else "still open"
        for p in peers
    )
