"""jetd's HTTP listener: WebSocket peers on ``/jet`` and the web console (PROTOCOL.md 13).

A thin shell around the same sans-IO core as :mod:`jetd.server`, in the shape of that
module's ``PeerProtocol``. One :class:`WebProtocol` per HTTP connection speaks HTTP and
WebSocket through the sans-IO ``websockets.server.ServerProtocol`` (handshake, control
frames, parsing and unmasking); a plain ``GET`` of another path is answered with a static
file (the console, the JavaScript library) and the connection closes.

Once upgraded, the connection is an ordinary peer of :class:`jetd.core.Daemon`: the
payloads of the binary messages it receives go to ``Daemon.receive_data`` as the byte
stream of PROTOCOL.md 3 (13.2), and its ``transport`` is a :class:`WebSocketTransport`,
an adapter that gives ``Server.flush`` and the slow-consumer machinery the asyncio
transport they expect: ``write`` sends the bytes as binary messages (at most 1 MiB each,
13.2), and flow control (``pause_reading``, ``get_write_buffer_size``...) is the TCP
transport's. The adapter writes the message header itself, two to ten bytes, rather than
going through ``ServerProtocol.send_binary``, which copies the payload into a new frame
object per write: that is the daemon's hot path (BENCHMARKS.md, WebSocket).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import email.utils
import hashlib
import json
import logging
import mimetypes
import re
import socket
import struct
import sys
import weakref
from collections.abc import Generator
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from typing import Optional
from typing import cast

from websockets.datastructures import Headers
from websockets.exceptions import InvalidMessage
from websockets.frames import Frame
from websockets.frames import Opcode
from websockets.http11 import Request
from websockets.http11 import Response
from websockets.protocol import OPEN
from websockets.protocol import SEND_EOF
from websockets.server import ServerProtocol
from websockets.streams import StreamReader
from websockets.typing import Subprotocol

from jetwire import Status

from .config import Config
from .config import entry_host_name
from .config import host_name
from .connection import Connection
from .metrics import exposition
from .server import FLUSH_AFTER_READ
from .server import PeerShell
from .server import Server

__all__ = ["SUBPROTOCOL", "WS_FRAME_LIMIT", "WebListener", "WebProtocol", "WebSocketTransport", "start_web"]

log = logging.getLogger("jetd")
# websockets logs every open and close at INFO; jetd logs its peers itself.
_ws_log = logging.getLogger("jetd.websocket")
_ws_log.setLevel(logging.WARNING)

SUBPROTOCOL = Subprotocol("jet")  # PROTOCOL.md 13.1
WS_PATH = "/jet"  # PROTOCOL.md 13.1
WS_FRAME_LIMIT = 1 << 20  # PROTOCOL.md 13.2: the message bound, both directions
# Bytes a connection may send before its request is complete: websockets alone allows 128
# header lines of 8 KiB (about 1 MiB, held for the handshake timeout, per connection).
MAX_HTTP_REQUEST = 32 * 1024
TIMEOUT_LOG_INTERVAL = 1.0  # seconds between two log lines about handshake timeouts
TEXT_MESSAGE = "text messages are not jet: frames travel in binary messages"  # PROTOCOL.md 13.4
CLOSE_NORMAL = 1000
MAX_CONTROL_FRAME = 2 + 4 + 125  # RFC 6455 5.5: header, mask, at most 125 bytes of payload
CLOSE_UNSUPPORTED_DATA = 1003

STATIC_DIR = Path(__file__).resolve().parent / "static"
_HTTP_REQUEST_LINE = re.compile(rb"[A-Z]+ \S")  # a method and a target: an HTTP request's start
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")  # PROTOCOL.md 13.3: always allowed as Host
# PROTOCOL.md 13.3: on every response. The console loads only its own files (no inline
# script or style) and talks to its own listener; no page of jetd may be framed.
SECURITY_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
        "form-action 'self'; object-src 'none'; frame-ancestors 'none'",
    ),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Content-Type-Options", "nosniff"),
)
_SECURITY_LINES = b"".join(b"%s: %s\r\n" % (n.encode(), v.encode()) for n, v in SECURITY_HEADERS)

_H7 = struct.Struct(">BB").pack
_H16 = struct.Struct(">BBH").pack
_H64 = struct.Struct(">BBQ").pack
_FIN_BINARY = 0x82


def _binary_header(n: int) -> bytes:
    """RFC 6455 5.2: FIN, opcode 2, no mask (a server never masks), payload length ``n``."""
    if n < 126:
        return _H7(_FIN_BINARY, n)
    if n < 65536:
        return _H16(_FIN_BINARY, 126, n)
    return _H64(_FIN_BINARY, 127, n)


def library_path() -> Optional[Path]:
    """Where the JavaScript peer library ``jet.js`` is: ``js/`` of a checkout, or what
    ``pip install`` put in ``<prefix>/share/jet/js`` (pyproject data-files)."""
    for candidate in (
        Path(__file__).resolve().parent.parent / "js" / "jet.js",
        Path(sys.prefix) / "share" / "jet" / "js" / "jet.js",
    ):
        if candidate.is_file():
            return candidate
    return None


class WebSocketTransport:
    """The transport a WebSocket peer's connection has, as ``Server.flush``, the core's
    flow control and :meth:`WebProtocol.drain` see it: duck-typed like the asyncio
    transport of ``jetd.server.PeerProtocol``."""

    __slots__ = ("_proto", "_raw", "_ws")

    def __init__(self, proto: WebProtocol, raw: asyncio.Transport) -> None:
        # The shell holds this transport: a strong reference back would make a cycle per
        # WebSocket peer, which jetd.gcpolicy's frozen heap would keep forever (issue 29).
        self._proto = weakref.ref(proto)
        self._ws = proto.ws
        self._raw = raw

    def write(self, data: bytes) -> None:
        """Send ``data`` (jet bytes) as binary messages of at most 1 MiB (PROTOCOL.md 13.2)."""
        if self._ws.state is not OPEN:
            return  # a WebSocket close frame went out: nothing may follow it
        n = len(data)
        raw = self._raw
        if n <= 4096:
            raw.write(_binary_header(n) + data)
        elif n <= WS_FRAME_LIMIT:
            raw.writelines((_binary_header(n), data))
        else:
            view = memoryview(data)
            pieces: list[Any] = []
            for start in range(0, n, WS_FRAME_LIMIT):
                chunk = view[start : start + WS_FRAME_LIMIT]
                pieces.append(_binary_header(len(chunk)))
                pieces.append(chunk)
            raw.writelines(pieces)

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size()

    def pause_reading(self) -> None:
        if not self._raw.is_closing():
            self._raw.pause_reading()

    def resume_reading(self) -> None:
        if not self._raw.is_closing():
            self._raw.resume_reading()

    def is_closing(self) -> bool:
        return self._raw.is_closing() or self._ws.state is not OPEN

    def can_write_eof(self) -> bool:
        return False  # PROTOCOL.md 13.4: the WebSocket closing handshake replaces it

    def write_eof(self) -> None:
        raise NotImplementedError("a WebSocket peer is closed with hang_up()")

    def close(self) -> None:
        proto = self._proto()
        if proto is not None:
            proto.hang_up()

    def abort(self) -> None:
        self._raw.abort()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._raw.get_extra_info(name, default)


class WebProtocol(PeerShell):
    """One HTTP connection: a static file, a refused handshake, or a WebSocket peer."""

    transport_name = "websocket"  # $jet/peers/<id> and /metrics (jetd.metrics.transport_of)

    def __init__(self, listener: WebListener) -> None:
        super().__init__(listener.server)
        self.listener = listener
        self.ws = _SecureServerProtocol(
            subprotocols=[SUBPROTOCOL], max_size=(None, WS_FRAME_LIMIT), logger=_ws_log
        )
        self.text_message = False  # a fragmented text message is being received
        self.close_code = CLOSE_NORMAL
        self.address = "?"
        self.refused = False  # answered 503 on arrival: nothing it sends is read
        self.request_bytes = 0  # received before the request was complete
        self.answered_invalid = False  # a request websockets could not parse was answered 400
        self.request_start = b""  # the first bytes received (is it HTTP at all?)
        self.held = 0  # bytes of a WebSocket frame under assembly, charged to the core
        self.discarding = False  # closed mid-frame: what the peer still sends is dropped unparsed

    # --- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.address = self.prepare(transport)
        server = self.server
        self.listener.connections.add(self)
        # Until it is a peer, the connection counts against the same limits as peers
        # (PROTOCOL.md 10.7, 13.1): max_connections and the file descriptors jetd can
        # hold. One is let through even when the peers alone fill the limit, so that a
        # WebSocket peer learns of it as a TCP peer does (INFO, CLOSE LIMIT_EXCEEDED).
        # TLS handshakes in progress count too (Server.over_limit, the one count).
        server.http_waiting.add(self)
        reason = server.over_limit(one_through=True)
        if reason is not None:
            self._refuse(reason)
        else:
            self.abort_handle = server.loop.call_later(server.config.http_handshake_timeout, self._handshake_timeout)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.abort_handle is not None and self.conn is None and not self.hung_up:
            # Still waiting for the whole request (the handshake timer runs).
            if not self.request_start:
                self.request_start = data[:16]
            self.request_bytes += len(data)
            if self.request_bytes > MAX_HTTP_REQUEST:
                self.abort_handle.cancel()
                self.abort_handle = None
                self._refuse(f"HTTP request longer than {MAX_HTTP_REQUEST} bytes", 431, "Request Header Fields Too Large")
                return
        if self.hung_up:
            self.heard = True
        if self.discarding:
            return
        ws = self.ws
        ws.receive_data(data)
        events = ws.events_received()
        conn = self.conn
        if conn is not None and conn.closing and self._drop_frame_under_assembly():
            return
        # PROTOCOL.md 10.7, 13.2: the bytes of a WebSocket frame still incomplete count
        # against the input budget and the frame timeout like an incomplete jet frame.
        # Charged before the complete frames are fed, so that no byte counts twice.
        held = ws.held if conn is not None and not conn.closing else 0
        if held or self.held:
            self._hold(held)
        if events:
            self._handle(events, len(data))
            conn = self.conn
            if conn is not None and not conn.closing and (self.held or ws.held):
                # Feeding may have finished a jet frame and stopped the frame clock: the
                # WebSocket frame under assembly keeps it running. And a frame that came
                # with the handshake is charged from the upgrade on.
                self._hold(ws.held)
        elif (self.conn is None and isinstance(ws.handshake_exc, InvalidMessage) and not self.answered_invalid
              and _HTTP_REQUEST_LINE.match(self.request_start)):
            self._invalid_request(ws.handshake_exc)
        self._write_ws_output()
        if ws.parser_exc is not None and self.conn is not None and not self.conn.closing:
            # Bad WebSocket framing or a frame above the bound: websockets closed the
            # WebSocket with its status (PROTOCOL.md 13.4); the peer is gone for the core.
            self._disconnect(f"WebSocket protocol error: {ws.parser_exc}")

    def eof_received(self) -> bool:
        if self.refused:
            return False
        self.ws.receive_eof()
        self._write_ws_output()
        if self.hung_up or self.conn is None:
            return False
        # PROTOCOL.md 10.6: gone for the registry; what was produced for it still goes
        # nowhere (a WebSocket cannot write after the peer's end), so close.
        self._disconnect("peer closed its side")
        return False

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.listener.connections.discard(self)
        self.server.http_waiting.discard(self)
        if self.conn is not None:
            self.detach(exc)
        elif self.abort_handle is not None:
            self.abort_handle.cancel()

    # --- what Server.flush calls ----------------------------------------------------------

    def hang_up(self) -> None:
        """End the connection once its CLOSE is written (PROTOCOL.md 13.4): the WebSocket
        closing handshake, then :meth:`PeerShell.linger` until the peer's close frame."""
        raw = self.raw
        if raw is None or raw.is_closing() or self.hung_up:
            return
        self.hung_up = True
        if self.conn is not None:
            self._drop_frame_under_assembly()
        ws = self.ws
        if ws.state is OPEN:
            ws.send_close(self.close_code)
            self._write_ws_output()
            self.linger()
            return
        if not ws.eof_sent:
            raw.close()
        if self.abort_handle is not None:
            self.abort_handle.cancel()
        self.abort_handle = self.server.loop.call_later(self.server.config.shutdown_grace, raw.abort)

    # --- internals ------------------------------------------------------------------------

    def _handle(self, events: list[Any], nbytes: int) -> None:
        server = self.server
        daemon = server.daemon
        stream: list[bytes] = []
        for event in events:
            if isinstance(event, Request):
                self._request(event)
                continue
            conn = self.conn
            if conn is None or conn.closing:
                continue
            opcode = event.opcode
            if opcode is Opcode.BINARY or (opcode is Opcode.CONT and not self.text_message):
                data = event.data
                stream.append(data if type(data) is bytes else bytes(data))
            elif opcode is Opcode.TEXT or opcode is Opcode.CONT:
                self.text_message = not event.fin
                self._feed(stream)
                stream = []
                # PROTOCOL.md 13.4: CLOSE (MALFORMED), then WebSocket status 1003.
                self.close_code = CLOSE_UNSUPPORTED_DATA
                daemon.protocol_error(conn, Status.MALFORMED, TEXT_MESSAGE, server.loop.time())
            elif opcode is Opcode.CLOSE:
                self._feed(stream)
                stream = []
                code = self.ws.close_rcvd.code if self.ws.close_rcvd is not None else "none"
                self._disconnect(f"peer closed the WebSocket ({code})")
        if stream:
            self._feed(stream)
        if nbytes >= FLUSH_AFTER_READ:
            server.flush_after_read(self)
        else:
            server.schedule_flush()

    def _drop_frame_under_assembly(self) -> bool:
        """The core is done with this peer: a data frame it is still sending would be
        dropped once complete, so drop it now, and all the peer sends after it (a frame
        is up to 1 MiB, PROTOCOL.md 13.2: lingering peers must not hold that each).
        PeerShell.linger ends the connection. True if there was such a frame."""
        ws = self.ws
        if ws.held <= MAX_CONTROL_FRAME:
            return False  # nothing, or what may be the peer's close frame
        self.discarding = True
        ws.reader.buffer.clear()
        return True

    def frame_held(self) -> int:
        return self.held

    def _hold(self, held: int) -> None:
        """Tell the core how many bytes websockets holds in an incomplete frame; past the
        input budget the core closes the peer (CLOSE LIMIT_EXCEEDED, PROTOCOL.md 13.4)."""
        assert self.conn is not None
        self.held = held
        if not self.charge_transport():  # with what TLS holds of it, if any (PROTOCOL.md 15.6)
            self.held = 0

    def _feed(self, stream: list[bytes]) -> None:
        if stream:
            self.feed(stream[0] if len(stream) == 1 else b"".join(stream))

    def _disconnect(self, reason: str) -> None:
        conn = self.conn
        if conn is None:
            return
        server = self.server
        server.daemon.disconnect(conn, server.loop.time(), reason)
        server.schedule_flush()

    def _write_ws_output(self) -> None:
        raw = self.raw
        if raw is None:
            return
        for chunk in self.ws.data_to_send():
            if chunk is SEND_EOF or chunk == b"":
                if raw.is_closing():
                    continue
                if raw.can_write_eof():
                    raw.write_eof()
                else:
                    raw.close()
            elif not raw.is_closing():
                raw.write(chunk)

    def _handshake_timeout(self) -> None:
        self.abort_handle = None
        if self.conn is None and self.raw is not None:
            self.listener.handshake_timed_out(self.address)
            self.raw.abort()

    def _refuse(self, reason: str, status: int = 503, phrase: str = "Service Unavailable") -> None:
        """Over the limits: 503 (or ``status``) and close, logged like a refused peer."""
        self.refused = True
        self.server.refused(f"web {self.address}", reason)
        raw = self.raw
        if raw is None:
            return
        body = f"{reason}\n".encode()
        raw.write(
            b"HTTP/1.1 %d %s\r\nConnection: close\r\nRetry-After: 1\r\n%s"
            b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n\r\n%s"
            % (status, phrase.encode(), _SECURITY_LINES, len(body), body)
        )
        raw.close()
        # A client that does not read its 503 must not hold the descriptor for long.
        self.abort_handle = self.server.loop.call_later(self.server.config.shutdown_grace, raw.abort)

    def _request(self, request: Request) -> None:
        """An HTTP request: the WebSocket endpoint, or a static file."""
        ws = self.ws
        if self.abort_handle is not None:
            self.abort_handle.cancel()
            self.abort_handle = None
        path = request.path.partition("?")[0]
        host_error = self.listener.check_host(request.headers)
        if host_error is not None:
            status, reason = host_error
            log.info("web %s: refused: %s", self.address, reason)
            phrase = "Forbidden" if status == 403 else "Bad Request"
            self._send_response(_plain(status, phrase, f"{phrase}: {reason}\n"))
            self._close_soon()
            return
        if path == WS_PATH:
            origin_error = self.listener.check_origin(request.headers)
            if origin_error is not None:
                log.info("web %s: refused: %s", self.address, origin_error)
                response = ws.reject(403, f"Forbidden: {origin_error}\n")
            elif ws.eof_sent:
                response = ws.reject(400, "Bad Request: bytes after the handshake that are not WebSocket frames\n")
            else:
                response = ws.accept(request)
            if response.status_code != 101:
                _secure(response.headers)
            self._send_response(response)
            self._write_ws_output()
            if response.status_code == 101:
                self._open()
                return
            if ws.handshake_exc is not None and origin_error is None:
                log.info("web %s: handshake refused: %s", self.address, ws.handshake_exc)
            self._close_soon()
            return
        if path == "/metrics" and request.method in ("GET", "HEAD") and self.listener.metrics_login_needed():
            self._metrics_login(request)
            return
        self._send_response(self.listener.static_response(request, path))
        self._close_soon()

    def _metrics_login(self, request: Request) -> None:
        """Issue 33: under --auth without --metrics-public, /metrics answers a user whose
        ``read`` covers ``$jet/`` (the right to watch the daemon's own states, PROTOCOL.md
        16), named with HTTP Basic credentials: 401 without them, 403 with wrong ones or
        without the right. The password check (argon2id) runs off the loop, one at a time
        (503 while one runs); a user's last good password is remembered as its SHA-256
        until the users file is reloaded, so a scraper costs one check, not one a scrape."""
        listener = self.listener
        credentials = _basic_credentials(request.headers.get("Authorization", ""))
        if credentials is None:
            self._answer_metrics(_plain(401, "Unauthorized", "/metrics needs a user with read on $jet/\n",
                                        {"WWW-Authenticate": 'Basic realm="jetd metrics", charset="UTF-8"'}))
            return
        user, password = credentials
        access = self.server.daemon.access
        assert access is not None
        digest = hashlib.sha256(password.encode()).digest()
        if listener.metrics_logins.get(user) == (access, digest):
            self._answer_metrics(listener.metrics_response(request, user))
            return
        if listener.metrics_checking:
            self._answer_metrics(_plain(503, "Service Unavailable", "a password check is under way; retry\n",
                                        {"Retry-After": "1"}))
            return
        listener.metrics_checking = True

        def checked(done: asyncio.Future[bool]) -> None:
            listener.metrics_checking = False
            good = not done.cancelled() and done.exception() is None and done.result()
            if good:
                listener.metrics_logins[user] = (access, digest)
            else:
                log.info("web %s: /metrics: authentication failed for %r", self.address, user)
            if self.raw is not None and not self.raw.is_closing():
                self._answer_metrics(listener.metrics_response(request, user) if good
                                     else _plain(403, "Forbidden", "wrong user or password\n"))

        self.server.loop.run_in_executor(None, access.verify, user, password).add_done_callback(checked)

    def _answer_metrics(self, response: Response) -> None:
        self._send_response(response)
        self._write_ws_output()  # when answered later, no data_received writes it
        self._close_soon()

    def _send_response(self, response: Response) -> None:
        """Send the answer to the request. websockets parses what follows a request as
        WebSocket frames: bytes that are not (a pipelined second request) make it give
        up and end the output before the answer, and its send_response would then fail
        an assertion. The answer is written ahead of that end instead."""
        if not self.ws.eof_sent:
            self.ws.send_response(response)
        elif self.raw is not None and not self.raw.is_closing():
            self.raw.write(response.serialize())

    def _invalid_request(self, exc: InvalidMessage) -> None:
        """websockets gave up on a request that began like HTTP (a GET with a body,
        HTTP/2.0) and only ends the output: say why with a 400 before that end. Bytes
        that are not HTTP at all (a TLS ClientHello) still get only the close."""
        self.answered_invalid = True
        why = str(exc.__cause__ or exc)[:200]
        log.info("web %s: refused: not a valid HTTP request: %s", self.address, why)
        raw = self.raw
        if raw is not None and not raw.is_closing():
            raw.write(_plain(400, "Bad Request", f"Bad Request: not a valid HTTP request ({why})\n").serialize())

    def _close_soon(self) -> None:
        """After a plain HTTP response (or a refused handshake) the connection ends: a
        client that neither reads it nor closes is cut off after the handshake timeout."""
        raw = self.raw
        if raw is not None:
            self.abort_handle = self.server.loop.call_later(self.server.config.http_handshake_timeout, raw.abort)

    def _open(self) -> None:
        """The handshake succeeded: from now on this is a peer (PROTOCOL.md 13.1)."""
        raw = self.raw
        assert raw is not None
        self.server.http_waiting.discard(self)  # counted as a peer from now on
        self.transport = cast(asyncio.Transport, WebSocketTransport(self, raw))
        self.attach(f"ws:{self.address}")


class WebListener:
    """The HTTP listener: its socket, its connections, the origin policy and the files."""

    def __init__(self, server: Server, ssl: Any = None) -> None:
        self.server = server
        self.config = server.config
        # The hook for TLS (wss, PROTOCOL.md 13.3 same origin with https): an SSLContext.
        self.ssl = ssl
        self.scheme = "https" if ssl is not None else "http"
        self.origins = self.config.allowed_origins()
        self.hosts = allowed_hosts(self.config)
        self.connections: set[WebProtocol] = set()
        self.sockets: list[socket.socket] = []
        self._timeouts = 0  # handshake timeouts not logged yet
        # /metrics under --auth (issue 33): one password check at a time, and each user's
        # last good password (SHA-256) with the users file it was checked against.
        self.metrics_checking = False
        self.metrics_logins: dict[str, tuple[object, bytes]] = {}
        self._timeouts_logged = -TIMEOUT_LOG_INTERVAL
        self.files: dict[str, Path] = {
            "/": STATIC_DIR / "index.html",
            "/index.html": STATIC_DIR / "index.html",
            "/console.js": STATIC_DIR / "console.js",
            "/console.css": STATIC_DIR / "console.css",
            # The console's plot: uPlot, vendored unchanged with its licence (static/vendor/uplot).
            "/vendor/uplot/uPlot.esm.js": STATIC_DIR / "vendor" / "uplot" / "uPlot.esm.js",
            "/vendor/uplot/uPlot.min.css": STATIC_DIR / "vendor" / "uplot" / "uPlot.min.css",
            "/vendor/uplot/LICENSE": STATIC_DIR / "vendor" / "uplot" / "LICENSE",
        }
        library = library_path()
        if library is not None:
            self.files["/jet.js"] = library

    async def start(self) -> tuple[str, int]:
        """Listen; returns the (host, port) actually bound."""
        config = self.config
        host = config.http_host if config.http_host is not None else config.host
        port = config.http_port if config.http_port is not None else 0
        # jetd.server's accept loop: the same connection count and TLS handshake clock.
        self.sockets = self.server.add_listener(host, port, lambda: WebProtocol(self), self.ssl, _refusal)
        return host, self.sockets[0].getsockname()[1]

    def close(self) -> None:
        """Stop accepting; drop connections still in their HTTP phase (peers are closed
        by ``Server.shutdown`` like every other peer)."""
        self.server.stop_listening(self.sockets)
        if self._timeouts:
            log.warning(
                "web: closed %d more connection(s) without a complete HTTP request since the last report",
                self._timeouts,
            )
            self._timeouts = 0
        for proto in list(self.connections):
            if proto.conn is None and proto.raw is not None:
                proto.raw.abort()

    def handshake_timed_out(self, address: str) -> None:
        """Log a connection closed for sending no whole request in time; at most one line
        a second, with a count (a flood of idle connections must not flood the log)."""
        self._timeouts += 1
        now = self.server.loop.time()
        if now - self._timeouts_logged >= TIMEOUT_LOG_INTERVAL:
            log.warning(
                "web: closed %d connection(s) without a complete HTTP request within %g s, last from %s",
                self._timeouts,
                self.config.http_handshake_timeout,
                address,
            )
            self._timeouts = 0
            self._timeouts_logged = now

    def check_host(self, headers: Headers) -> Optional[tuple[int, str]]:
        """PROTOCOL.md 13.3: None if the request's ``Host`` is on the allow-list, else the
        HTTP status to refuse it with (400 malformed, 403 not allowed) and why."""
        values = headers.get_all("Host")
        if len(values) != 1:
            return 400, "a request needs exactly one Host header" if values else "a request needs a Host header"
        name = host_name(values[0])
        if name is None:
            return 400, f"the Host header {values[0][:100]!r} is not a host name or address"
        if "*" in self.hosts or name in self.hosts:
            return None
        return 403, (
            f"host {name[:100]!r} is not allowed (the listen address, localhost, 127.0.0.1, [::1], "
            "the hosts of --http-origins and --http-hosts are)"
        )

    def check_origin(self, headers: Headers) -> Optional[str]:
        """PROTOCOL.md 13.3: None if the handshake's Origin is allowed, else why not."""
        origins = headers.get_all("Origin")
        if not origins:
            return None  # a program, not a browser page
        if len(origins) > 1:
            return "more than one Origin header"
        origin = origins[0].rstrip("/").lower()
        if "*" in self.origins or origin in self.origins:
            return None
        host = headers.get("Host")
        if host is not None and origin == f"{self.scheme}://{host.lower()}":
            return None
        return f"origin {origins[0]!r} is not allowed (same origin or --http-origins)"

    def metrics_login_needed(self) -> bool:
        """Does /metrics need a user (issue 33: --auth without --metrics-public)?"""
        return self.server.daemon.access is not None and not self.config.metrics_public

    def metrics_response(self, request: Request, user: Optional[str]) -> Response:
        """/metrics for ``user`` (None: exposed to anyone): 403 if it may not read ``$jet/``."""
        access = self.server.daemon.access
        refused = access is not None and not self.config.metrics_public and (
            user is None or not access.permissions(user).read.matches(b"$jet/daemon"))
        if refused:
            return _plain(403, "Forbidden", f"user {user!r} has no read on $jet/\n")
        body = exposition(self.server.daemon.metrics, self.server.loop.time())
        return _response(200, "OK", METRICS_CONTENT_TYPE, body, request.method)

    def static_response(self, request: Request, path: str) -> Response:
        """A file of the console, the JavaScript library, or the registry as JSON."""
        if request.method not in ("GET", "HEAD"):
            return _plain(405, "Method Not Allowed", "only GET\n", {"Allow": "GET, HEAD"})
        if path == "/metrics":
            # Issue 33: as /registry.json, not to anyone under --auth (metrics_response).
            return self.metrics_response(request, None)
        if path == "/registry.json":
            if self.server.daemon.access is not None:
                # PROTOCOL.md 15.3: the registry names every key and owner, to anyone who asks.
                return _plain(403, "Forbidden", "the registry is not served with --auth\n")
            return _response(200, "OK", "application/json", self.registry_json(), request.method)
        file = self.files.get(path)
        if file is None:
            return _plain(404, "Not Found", f"no such page: {path}\n")
        try:
            body = file.read_bytes()
        except OSError as exc:
            log.error("web: cannot read %s: %s", file, exc)
            return _plain(500, "Internal Server Error", "cannot read the file\n")
        kind = mimetypes.guess_type(file.name)[0] or ("text/plain" if file.name == "LICENSE" else "application/octet-stream")
        if kind.startswith("text/") or kind.endswith("javascript"):
            kind += "; charset=utf-8"
        response = _response(200, "OK", kind, body, request.method)
        if path == "/jet.js":
            # PROTOCOL.md 13.3: pages of the allowed origins may import the library from
            # jetd (a module script is fetched with CORS); no other file is for them.
            response.headers["Vary"] = "Origin"
            origins = request.headers.get_all("Origin")  # a browser sends one; two: none allowed
            if "*" in self.origins:
                response.headers["Access-Control-Allow-Origin"] = "*"
            elif len(origins) == 1 and origins[0].rstrip("/").lower() in self.origins:
                response.headers["Access-Control-Allow-Origin"] = origins[0]
        return response

    def registry_json(self) -> bytes:
        """What the protocol cannot tell a peer (PROTOCOL.md 6.8: methods are never fetched,
        and no function names an owner): every method and the owner of every key, for
        the console. ``{"peers": {conn_id: label}, "states": [[key, conn_id]...],
        "methods": [...]}``."""
        registry = self.server.daemon.registry
        peers: dict[int, Connection] = {}

        def listing(table: Iterable[tuple[bytes, Connection]]) -> list[list[Any]]:
            rows = []
            for key, owner in table:
                peers[owner.conn_id] = owner
                rows.append([key.decode("utf-8", "replace"), owner.conn_id])
            return rows

        document = {
            "states": listing(registry.states.items()),
            "methods": listing(registry.methods.items()),
            "peers": {str(cid): {"name": c.name, "address": c.address} for cid, c in peers.items()},
        }
        return json.dumps(document, separators=(",", ":")).encode()


# Prometheus' text exposition format (what prometheus_client.CONTENT_TYPE_LATEST names).
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _basic_credentials(header: str) -> Optional[tuple[str, str]]:
    """(user, password) of an ``Authorization: Basic`` header (RFC 7617), or None."""
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep and user else None


def _response(status: int, phrase: str, kind: str, body: bytes, method: str = "GET") -> Response:
    headers = Headers(
        [
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Connection", "close"),
            ("Content-Type", kind),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-cache"),
        ]
    )
    _secure(headers)
    return Response(status, phrase, headers, b"" if method == "HEAD" else body)


def _refusal(reason: str) -> bytes:
    """Out of descriptors at accept (jetd.server): an HTTP 503 like :meth:`WebProtocol._refuse`."""
    body = f"{reason}\n".encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n%s"
            b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n\r\n%s"
            % (_SECURITY_LINES, len(body), body))


def _secure(headers: Headers) -> None:
    """Add the headers every page of jetd carries (PROTOCOL.md 13.3)."""
    for name, value in SECURITY_HEADERS:
        headers[name] = value


class _FrameReader(StreamReader):
    """websockets' stream reader, also counting the bytes the parser has taken of the
    frame it is parsing (its header, read piece by piece: a frame whose header alone has
    arrived leaves the buffer empty, but it has begun)."""

    def __init__(self) -> None:
        super().__init__()
        self.frame_bytes = 0

    def read_exact(self, n: int) -> Generator[None, None, bytearray]:
        data = yield from super().read_exact(n)
        self.frame_bytes += n
        return data


class _SecureServerProtocol(ServerProtocol):
    """websockets' server side, whose own refusals (414, 431: a line over its limit,
    answered before jetd sees a request) carry the headers of every page as well
    (PROTOCOL.md 13.3), and which tells how many bytes of an incomplete WebSocket frame
    it holds (:attr:`held`, PROTOCOL.md 10.7, 13.2)."""

    reader: _FrameReader

    def parse(self) -> Generator[None]:
        # Runs first inside ServerProtocol.__init__, before any byte is fed.
        self.reader = _FrameReader()
        yield from super().parse()

    def recv_frame(self, frame: Frame) -> None:
        self.reader.frame_bytes = 0  # the frame is complete: the next one has not begun
        super().recv_frame(frame)

    @property
    def held(self) -> int:
        """Bytes received of WebSocket frames not yet complete (header included)."""
        reader = self.reader
        return reader.frame_bytes + len(reader.buffer)

    def send_response(self, response: Response) -> None:
        if response.status_code != 101 and "X-Frame-Options" not in response.headers:
            _secure(response.headers)
        super().send_response(response)


def allowed_hosts(config: Config) -> frozenset[str]:
    """PROTOCOL.md 13.3: the names a request's ``Host`` may give: the listen address, the
    localhost names, ``--http-hosts`` and the hosts of ``--http-origins`` (``*`` in
    ``--http-hosts``: any)."""
    names = set(LOCAL_HOSTS)
    listen = config.http_host if config.http_host is not None else config.host
    for entry in (listen, *config.allowed_hosts()):
        if entry == "*":
            names.add("*")
            continue
        name = entry_host_name(entry)
        if name is not None:
            names.add(name)
    for origin in config.allowed_origins():
        _, sep, authority = origin.partition("://")
        name = host_name(authority) if sep else None
        if name is not None:
            names.add(name)
    return frozenset(names)


def _plain(status: int, phrase: str, text: str, extra: Optional[dict[str, str]] = None) -> Response:
    response = _response(status, phrase, "text/plain; charset=utf-8", text.encode())
    for name, value in (extra or {}).items():
        response.headers[name] = value
    return response


async def start_web(server: Server, ssl: Any = None) -> tuple[WebListener, str]:
    """Start the HTTP listener of ``server`` (``config.http_port``); returns it and the
    line ``web on http://HOST:PORT/`` to print and log.

    Raises:
        OSError: the port cannot be bound.
    """
    listener = WebListener(server, ssl)
    host, port = await listener.start()
    shown = f"[{host}]" if ":" in host else host
    return listener, f"web on {listener.scheme}://{shown}:{port}/"

