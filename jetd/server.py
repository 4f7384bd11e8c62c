"""The thin asyncio/uvloop layer around :class:`jetd.core.Daemon`.

One :class:`PeerProtocol` per TCP connection feeds the bytes it reads to the core and
asks for one flush per loop turn: every connection that got output during the turn gets
exactly one ``transport.write`` (PROTOCOL.md says nothing about it; NOTES.md measured
one write per frame as several times slower). Flow control: the transport's high-water
mark is the soft limit of PROTOCOL.md 10.8; above it the core queues locally (and
holds the peer's changes back, to send their latest values), reading from that peer
pauses, and the queue drains when the transport calls ``resume_writing``.

A connection the core leaves ``stalled`` (its output is past the budget of PROTOCOL.md
10.8, or one of its fetches is delivering initial adds in slices) is not read from; the
pending work of the core runs one slice per loop turn (``Server.run_work`` via
``call_soon``), so that I/O of other peers gets in between, and the connections that
caught up are read again.

The event log (JETLOG.md 6): with ``--log-fsync always`` every write to a transport, and
every hang-up, goes through the durable gate (:meth:`Server.send`): it is held until the
group commit that covers the records appended before it is written and fsynced, and only
one commit is in flight at a time, so the output of the turns that run meanwhile shares
the next one. The loop never waits for the writer: when the bytes not yet written (and
the output held for them) pass ``log_writer_backlog``, reading from every peer pauses
until the writer has brought them below half of it.

When the log cannot be written (JETLOG.md 6.5), ``--log-on-error`` decides: ``refuse``
answers every request INTERNAL until the log writes again (the core's ``refusing``),
``continue`` goes on without it, ``stop`` closes every peer and makes jetd exit 1. With
``always``, output held for records that were lost is never sent: its connections are
closed INTERNAL instead (continue: it is sent, as promised by that setting). The server
asks the log to try again every ``RETRY_INTERVAL`` seconds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import fcntl
import ipaddress
import logging
import os
import resource
import select
import socket
import ssl
import struct
import sys
import termios
import time
from collections.abc import Callable
from typing import Any
from typing import Optional
from typing import cast

from jetwire import Status

from .access import Access
from .config import Config
from .core import Connection
from .core import Daemon
from .eventlog import RETRY_INTERVAL
from .eventlog import EventLog
from .frames import close_frame
from .tls import TLS_READ_CHUNK
from .tls import TlsInput
from .tls import certificate_user
from .tls import ssl_protocol
from .tls import tls_buffered
from .users import UsersFileError

__all__ = ["PeerProtocol", "PeerShell", "Server", "new_event_loop"]

log = logging.getLogger("jetd")

LINGER_QUIET = 0.2  # hang_up: seconds without input after which the socket is closed
LINGER_MAX = 60.0  # hang_up: seconds a peer that still reads its last bytes is given at most
POLL_GONE = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR  # jetd.access peer_gone
DRAIN_CHUNK = 256 * 1024  # bytes handed to a paused transport per write while draining
# libuv reads up to 32 times per readiness event, so one loop turn can bring megabytes;
# after a read this large we flush at once, which bounds what one turn queues per peer
# (input chunk times fan-out) and lets the soft limit act close to its value.
FLUSH_AFTER_READ = 32 * 1024
# File descriptors kept free beyond the connections, for the event log and the loop; a
# connection that would eat into them is accepted only to be told CLOSE LIMIT_EXCEEDED.
FD_MARGIN = 16
REFUSED_LOG_INTERVAL = 1.0  # seconds between "refused" log lines (with a count)
# PROTOCOL.md 15.6: a connection refused on a TLS listener before its handshake gets this
# record, a fatal internal_error alert (type 21, version 3.3, length 2, level 2, code 80),
# and a close: never jet bytes in plaintext, which a TLS client cannot read.
TLS_REFUSAL_ALERT = b"\x15\x03\x03\x00\x02\x02\x50"
ACCEPT_BATCH = 64  # connections accepted per readiness event of a listening socket
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
# JETLOG.md 6.3: with always, input pauses while the records appended since the commit in
# flight was handed over pass this many bytes, and resumes when the next commit is handed
# over, so that a group commit stays short: an answer waits for the commit in flight,
# then its own, each of about this size at most.
GATED_BACKLOG = 1024 * 1024
BACKLOG_LOG_EVERY = 10.0  # JETLOG.md 6.3: seconds between log lines about input paused for the writer


class Listening:
    """One listening socket and what becomes of a connection it accepts: ``make_shell``
    builds its :class:`PeerShell`, ``ssl_context`` turns TLS on, and ``refusal(reason)``
    is what a connection refused for lack of a descriptor is sent before its close."""

    __slots__ = ("make_shell", "refusal", "sock", "ssl_context")

    def __init__(self, sock: socket.socket, make_shell: Callable[[], PeerShell],
                 ssl_context: Optional[ssl.SSLContext], refusal: Callable[[str], bytes]) -> None:
        self.sock = sock
        self.make_shell = make_shell
        self.ssl_context = ssl_context
        self.refusal = refusal


# The durable gate's unit: one write to a transport, then maybe a hang-up (its CLOSE is in
# the write). ``data`` may be empty.
_Action = tuple["PeerShell", bytes, bool]


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard limit; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, wanted)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft


def unsent_bytes(transport: asyncio.BaseTransport) -> int:
    """Bytes the transport still holds plus those its socket has not had acknowledged
    yet (Linux TIOCOUTQ; 0 where that cannot be asked)."""
    size = cast(asyncio.WriteTransport, transport).get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is None:
        return size
    try:
        return size + int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0])
    except (OSError, ValueError, AttributeError):
        return size


def open_fds() -> int:
    """File descriptors this process has open (Linux: /proc/self/fd; else a guess)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 16


class PeerShell(asyncio.Protocol):
    """What every transport shell does for the core, whatever carries the bytes.

    A shell attaches a :class:`Connection` to its peer, feeds it what the peer sent,
    passes the transport's flow control on (PROTOCOL.md 10.8) and hangs up once the
    CLOSE is written. ``transport`` is what ``Server.flush`` writes the core's output
    to; ``raw`` is the socket's own transport (the same object for TCP; for WebSocket,
    :mod:`jetd.web` puts a framing adapter in ``transport``).
    """

    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: Optional[asyncio.Transport] = None
        self.raw: Optional[asyncio.Transport] = None
        self.conn: Optional[Connection] = None
        self.write_paused = False
        self.abort_handle: Optional[asyncio.TimerHandle] = None
        self.hung_up = False
        self.heard = False  # input arrived since the last linger check
        self.linger_left = 0  # bytes still to write at the last linger check
        self.linger_until = 0.0  # the latest a lingering peer is given, however it reads
        # TLS (PROTOCOL.md 15.6): the socket's protocol under the SSL layer, the bytes the
        # handshake got (all charged while it runs), and those the SSL layer held at the
        # last charge (issue 29: one input budget, TLS included).
        self.tls_input: Optional[TlsInput] = None
        self.handshake_bytes = 0
        self.tls_held = 0

    def prepare(self, transport: asyncio.BaseTransport) -> str:
        """Set up a new socket transport; returns the peer's ``host:port``."""
        # Its TLS handshake (if any) is done: from now on it counts as what it becomes.
        self.server.end_handshake(self)
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.raw = raw = cast(asyncio.Transport, transport)
        soft = self.server.config.soft_limit
        # NOTES.md: uvloop's default low-water mark is tiny; set both marks explicitly.
        raw.set_write_buffer_limits(high=soft, low=soft // 4)
        if self.tls_input is not None:
            # What the SSL layer reads while we do not is charged (charge_transport): keep
            # it small, as the kernel holds the rest for a TCP peer.
            cast(Any, raw).set_read_buffer_limits(high=TLS_READ_CHUNK, low=TLS_READ_CHUNK // 4)
        sock = raw.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = raw.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    def attach(self, address: str) -> None:
        """The peer is a peer from now on: a Connection in the core, INFO queued."""
        server = self.server
        # Beyond the limits (Server.over_limit, the one count): INFO, CLOSE LIMIT_EXCEEDED,
        # rather than let accept() fail silently for the next ones (PROTOCOL.md 10.7).
        refuse = server.over_limit(joining=1)
        server.protocols.add(self)
        self.conn = server.daemon.connect(address, server.loop.time(), refuse)
        self.conn.io = self
        if self.conn.closing:
            server.refused(address, self.conn.close_reason)
        elif self.raw is not None:
            # PROTOCOL.md 15.6: a verified client certificate (TCP or wss) names the user.
            user = certificate_user(self.raw.get_extra_info("ssl_object"))
            if user is not None:
                server.daemon.authenticate_certificate(self.conn, user)
        server.schedule_flush()

    def frame_held(self) -> int:
        """Bytes of a frame of the transport's own under assembly (jetd.web: WebSocket)."""
        return 0

    def charge_transport(self) -> bool:
        """PROTOCOL.md 10.7, 15.6: charge the core's input budget with what the transports
        hold of this peer's input: the frame under assembly (:meth:`frame_held`) and the
        TLS records the SSL layer has not decrypted yet. Those records wait only while we
        do not read the peer (a slow consumer, a held AUTHENTICATE): no frame clock for
        them then. Returns False if the peer is closing (now, for passing the budget)."""
        conn = self.conn
        if conn is None:
            return True
        server = self.server
        frame = self.frame_held()
        raw = self.raw
        tls = tls_buffered(raw) if self.tls_input is not None and raw is not None and not raw.is_closing() else 0
        self.tls_held = tls
        clocked = frame > 0 or raw is None or cast(Any, raw).is_reading()
        if not server.daemon.transport_holds(conn, frame + tls, server.loop.time(), clocked):
            self.tls_held = 0
            server.schedule_flush()
            return False
        return True

    def tls_settled(self) -> None:
        """After the SSL layer took a read (TlsInput): charge what it holds now."""
        raw = self.raw
        if self.conn is not None and raw is not None and (self.tls_held or tls_buffered(raw)):
            self.charge_transport()

    def feed(self, data: bytes) -> None:
        """Hand the core the jet bytes the peer sent."""
        server = self.server
        conn = self.conn
        if conn is None:
            return
        if self.tls_held:
            # Reading again after a pause: the SSL layer handed on what it held.
            self.charge_transport()
        eventlog = server.eventlog
        if eventlog is not None:
            eventlog.turn_ns = time.time_ns()  # one timestamp for the records of this read
        try:
            server.daemon.receive_data(conn, data, server.loop.time())
        except Exception:
            # A bug in the core must cost one connection, never the daemon.
            log.exception("internal error on %s", conn.label)
            server.daemon.internal_error(conn, server.loop.time())
        finally:
            if eventlog is not None:
                eventlog.turn_ns = 0
        if conn.stalled and self.transport is not None:
            # PROTOCOL.md 10.8: its output is past the budget; read on once it caught up.
            self.transport.pause_reading()
        if conn.held:
            server.hold(self)  # PROTOCOL.md 15.2: read nothing while AUTHENTICATE is answered

    def flush_after_read(self, nbytes: int) -> None:
        server = self.server
        if nbytes >= FLUSH_AFTER_READ:
            server.flush_after_read(self)
        elif not server.flush_scheduled:
            server.flush_scheduled = True
            server.loop.call_soon(server.flush)

    def detach(self, exc: Optional[Exception]) -> None:
        """The socket is gone: so is the peer, for the core (PROTOCOL.md 10.6)."""
        server = self.server
        server.protocols.discard(self)
        if self.abort_handle is not None:
            self.abort_handle.cancel()
        if self.conn is not None:
            reason = f"connection lost: {exc}" if exc is not None else "peer disconnected"
            server.daemon.disconnect(self.conn, server.loop.time(), reason)
            self.conn.io = None
            server.schedule_flush()
        if not server.protocols:
            server.all_closed.set()

    def pause_writing(self) -> None:
        self.write_paused = True
        transport = self.transport
        if self.conn is not None and transport is not None:
            self.server.daemon.pause(self.conn, transport.get_write_buffer_size())
            # A peer that does not read gets no more of our attention either.
            if not transport.is_closing():
                transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.drain()

    def drain(self) -> None:
        """Hand the locally queued frames to the transport until it pauses again; once
        all are written, the core queues the changes it held back (PROTOCOL.md 10.8),
        which are written the same way, and then the connection is live again."""
        conn = self.conn
        transport = self.transport
        if conn is None or transport is None or transport.is_closing():
            return
        server = self.server
        daemon = server.daemon
        held = False
        while True:
            while conn.pending and not self.write_paused:
                if not server.send(self, b"".join(conn.take_pending(DRAIN_CHUNK))):
                    held = True  # JETLOG.md 6.1: the server drains on once the chunk is durable
                    break
            if held or self.write_paused or not conn.paused or conn.closing:
                break
            if daemon.drained(conn):
                if not conn.stalled and not conn.held:  # else run_work / the release resumes it
                    transport.resume_reading()
                break
        # A CLOSE (OVERLOADED) from the catch-up, and what a live connection got, go out.
        server.schedule_flush()

    def hang_up(self) -> None:
        """End the connection once the queued bytes (its CLOSE last) are written."""
        raise NotImplementedError

    def linger(self) -> None:
        """Keep reading (and dropping) what the peer still sends after our last bytes,
        and close once everything is written, the peer's kernel has acknowledged it, and
        the peer was quiet for LINGER_QUIET (closing with unread input makes the kernel
        send RST, which discards what our kernel still had to send and can destroy the
        CLOSE in the peer's receive buffer before the peer reads it).

        PROTOCOL.md 7.3, 10.8: bytes already handed to the transport cannot be taken
        back, so a slow peer that still reads (what is left to write shrinks) keeps the
        shutdown grace from its last progress, up to LINGER_MAX in all (its memory is
        bounded: only the transport's buffer is left);
        a peer that reads nothing is aborted after the shutdown grace."""
        raw = self.raw
        if raw is None or raw.is_closing():
            return
        loop = self.server.loop
        config = self.server.config
        raw.resume_reading()
        self.linger_left = unsent_bytes(raw)
        self.linger_until = loop.time() + max(LINGER_MAX, config.shutdown_grace)
        loop.call_later(LINGER_QUIET, self._linger)
        if self.abort_handle is not None:
            self.abort_handle.cancel()
        self.abort_handle = loop.call_later(config.shutdown_grace, raw.abort)

    def _linger(self) -> None:
        raw = self.raw
        if raw is None or raw.is_closing():
            return
        left = unsent_bytes(raw)
        if not (self.heard or left):
            raw.close()
            return
        self.heard = False
        loop = self.server.loop
        if left < self.linger_left and loop.time() < self.linger_until:
            # It reads on: the grace runs from now (no later than linger_until).
            if self.abort_handle is not None:
                self.abort_handle.cancel()
            grace = min(self.server.config.shutdown_grace, self.linger_until - loop.time())
            self.abort_handle = loop.call_later(grace, raw.abort)
        self.linger_left = left
        loop.call_later(LINGER_QUIET, self._linger)


class PeerProtocol(PeerShell):
    """One TCP peer: the socket's bytes are the jet byte stream (PROTOCOL.md 3)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        address = self.prepare(transport)
        self.transport = self.raw
        self.attach(address)

    def data_received(self, data: bytes) -> None:
        if self.hung_up:
            self.heard = True  # after our CLOSE: read only so that closing sends no RST (hang_up)
            return
        self.feed(data)
        self.flush_after_read(len(data))

    def eof_received(self) -> bool:
        if self.hung_up:
            return False  # both sides are done: the transport closes
        # The peer will send nothing more: it is gone for the registry (PROTOCOL.md
        # 10.6), but the answers already produced for it still go out before we close.
        server = self.server
        if self.conn is not None:
            server.daemon.end_of_input(self.conn, server.loop.time())
            server.schedule_flush()
        return True

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.detach(exc)

    def hang_up(self) -> None:
        """A lingering close (PROTOCOL.md 7.3): half-close (FIN after the last byte) and
        read until the peer closes its side, or :meth:`PeerShell.linger` gives up."""
        transport = self.transport
        if transport is None or transport.is_closing() or self.hung_up:
            return
        self.hung_up = True
        if transport.can_write_eof():
            transport.write_eof()
            self.linger()
        else:
            transport.close()
            if self.abort_handle is None:
                self.abort_handle = self.server.loop.call_later(self.server.config.shutdown_grace, transport.abort)


def peer_gone(conn: Connection) -> bool:
    """PROTOCOL.md 15.2: True (and the connection aborted) when the peer of ``conn``, whose
    reading is paused behind its AUTHENTICATE, has ended its input: its FIN waits unread,
    which poll's POLLRDHUP sees behind any unread bytes."""
    transport = getattr(conn.io, "raw", None)
    if transport is None:
        return False
    if transport.is_closing():
        return True
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | POLL_GONE)
    if not any(events & POLL_GONE for _fd, events in poller.poll(0)):
        return False
    transport.abort()
    return True


class Server:
    """The listening socket, the core, the per-turn flush and the clock."""

    def __init__(
        self,
        config: Config,
        loop: asyncio.AbstractEventLoop,
        eventlog: Optional[EventLog] = None,
        access: Optional[Access] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        self.config = config
        self.loop = loop
        self.eventlog = eventlog
        # PROTOCOL.md 15.6: one SSLContext (jetd.tls) for the TCP and WebSocket listeners.
        self.ssl_context = ssl_context
        # The scheduler ends slices of work by the loop's clock (jetd.scheduler, issue 29).
        self.daemon = Daemon(config, eventlog.append if eventlog is not None else None, access, clock=loop.time)
        self.daemon.auth.offload = self._offload
        self.daemon.auth.peer_gone = peer_gone
        # PeerShells whose reading is paused while their AUTHENTICATE is answered.
        self.held: set[Any] = set()
        self._checks: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self.protocols: set[PeerShell] = set()
        # jetd.web connections that are not peers yet (HTTP request, static file, refusal).
        self.http_waiting: set[Any] = set()
        self.flush_scheduled = False
        self.all_closed = asyncio.Event()
        self.listeners: list[Listening] = []
        # PROTOCOL.md 10.7, 15.6: connections whose TLS handshake is in progress (either
        # listener), with the task that runs it and its time-out; they count like peers
        # (over_limit).
        self.handshaking: dict[PeerShell, tuple[asyncio.Task[Any], asyncio.TimerHandle]] = {}
        self.tls_port: Optional[int] = None  # the --tls-port listener's port, once listening
        self.refused_total = 0  # connections refused since start (any listener)
        self.tls_timeouts_total = 0  # TLS handshakes closed for --tls-handshake-timeout
        self._tls_timeouts = 0  # not logged yet
        self._tls_timeouts_logged = -REFUSED_LOG_INTERVAL
        # The classic trick: a descriptor held in reserve, closed to accept (and tell
        # CLOSE LIMIT_EXCEEDED) a connection when accept() fails for lack of one.
        self._reserve_fd = -1
        self._tick_handle: Optional[asyncio.TimerHandle] = None
        self.tick_interval = min(0.1, config.route_timeout / 10)
        self.work_scheduled = False
        self.fd_limit = 1 << 30
        self.fd_budget = 1 << 30  # connections (lingering ones too) before we refuse
        self._refused = 0
        self._refused_logged = 0.0
        # JETLOG.md 6.1, the durable gate (``always`` only): output of the turns since the
        # last commit, and the one commit in flight with its output.
        self.gated = eventlog is not None and eventlog.fsync == "always"
        self._held: list[_Action] = []
        self._held_drains: set[PeerShell] = set()  # their drain stopped at a chunk in _held
        # The commit in flight: (seq, EventLog.appended then, its output, its drains).
        self._in_flight: Optional[tuple[int, int, list[_Action], set[PeerShell]]] = None
        self._held_bytes = 0  # in _held and in flight
        self._durable_mark = 0  # EventLog.appended when the last completed commit was handed over
        self._commit_mark = 0  # EventLog.appended when the last commit was handed over
        # JETLOG.md 6.3: reading from peers paused while the writer is behind.
        self.input_paused = False
        self.input_pauses = 0
        self._pauses_unlogged = 0
        self._pause_logged_at = -BACKLOG_LOG_EVERY
        self._pause_logged = False  # this pause's line was logged: log its end too
        self._backlog_check_scheduled = False
        self._backlog_limit = config.log_writer_backlog
        # JETLOG.md 6.5: the log cannot be written (seen by the loop), and what to do then.
        self.on_log_error = config.log_error_policy()
        self.log_down = False
        self._retry_at = 0.0
        # Set by jetd.launch: ends the daemon (exit 1) for --log-on-error stop.
        self.stop_for_log: Optional[Callable[[], None]] = None

    async def start(self) -> tuple[str, int]:
        """Listen; returns the (host, port) actually bound."""
        self.fd_limit = raise_fd_limit(self.config.max_connections + open_fds() + FD_MARGIN)
        self.fd_budget = self.fd_limit - open_fds() - FD_MARGIN
        if self.fd_budget < self.config.max_connections:
            log.warning(
                "file descriptor limit %d allows about %d connections, below max_connections %d: "
                "the others get CLOSE LIMIT_EXCEEDED (raise it with ulimit -n)",
                self.fd_limit,
                max(self.fd_budget, 0),
                self.config.max_connections,
            )
        tls_port = self.config.tls_port
        sockets = self.add_listener(self.config.host, self.config.port, lambda: PeerProtocol(self),
                                    self.ssl_context if tls_port is None else None, self._jet_refusal)
        if tls_port is not None and self.ssl_context is not None:
            # PROTOCOL.md 15.6: --tls-port, TLS peers on a port of their own beside the plain one.
            tls_sockets = self.add_listener(self.config.host, tls_port, lambda: PeerProtocol(self),
                                            self.ssl_context, self._jet_refusal)
            self.tls_port = tls_sockets[0].getsockname()[1]
        self._reserve_fd = _open_reserve()
        port = sockets[0].getsockname()[1]
        self._tick_handle = self.loop.call_later(self.tick_interval, self._tick)
        return self.config.host, port

    def add_listener(self, host: str, port: int, make_shell: Callable[[], PeerShell],
                     ssl_context: Optional[ssl.SSLContext], refusal: Callable[[str], bytes]) -> list[socket.socket]:
        """Listen on ``host:port`` (jetd.web's HTTP listener too): every listener accepts
        through :meth:`_accept`, so that one count (:meth:`over_limit`) and one handshake
        clock cover them all. ``refusal``: see :class:`Listening` (with TLS, the alert
        instead: PROTOCOL.md 15.6). Returns the sockets.

        Raises:
            OSError: the address cannot be resolved or bound.
        """
        sockets = listen(host, port)
        for sock in sockets:
            entry = Listening(sock, make_shell, ssl_context, refusal if ssl_context is None else _tls_refusal)
            self.listeners.append(entry)
            self.loop.add_reader(sock.fileno(), self._accept, entry)
        return sockets

    def over_limit(self, joining: int = 0, one_through: bool = False) -> Optional[str]:
        """PROTOCOL.md 10.7, 13.1, 15.6: why a connection is refused now, or None.

        The one count of what connections hold, whatever their transport: peers (for
        descriptors, those still lingering after their CLOSE too), connections in their
        HTTP phase (jetd.web) and TLS handshakes in progress, plus ``joining`` not counted
        in any of these yet. ``one_through``: a connection that is not a peer yet is let
        through when it is the only one waiting and the peers alone fill
        ``max_connections``, so that it learns of the limit as a peer (INFO, CLOSE
        LIMIT_EXCEEDED); the descriptor budget lets nobody through.
        """
        waiting = len(self.http_waiting) + len(self.handshaking) + joining
        if len(self.protocols) + waiting > self.fd_budget:
            return f"too many connections (out of file descriptors: limit {self.fd_limit})"
        if len(self.daemon.connections) + waiting > self.config.max_connections and not (one_through and waiting <= 1):
            return f"too many connections (max {self.config.max_connections})"
        return None

    def _accept(self, listener: Listening) -> None:
        """Accept what is pending on ``listener`` (our own accept loop, so that running
        out of descriptors is seen: the loops' own drop such connections silently)."""
        for _ in range(ACCEPT_BATCH):
            try:
                sock, address = listener.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in OUT_OF_RESOURCES:
                    self._refuse_one(listener, exc)
                    continue
                if exc.errno == errno.ECONNABORTED:
                    continue
                log.warning("accept failed: %s", exc)
                return
            sock.setblocking(False)
            if listener.ssl_context is None:
                self.loop.create_task(self._connect(sock, listener.make_shell()))
                continue
            # PROTOCOL.md 15.6: a TLS handshake is a connection from accept() on; beyond the
            # limits it is refused before it begins, with an alert, not with jet bytes.
            reason = self.over_limit(joining=1, one_through=True)
            if reason is not None:
                _refuse_socket(sock, TLS_REFUSAL_ALERT)
                self.refused(f"{address[0]}:{address[1]}", reason)
                continue
            shell = listener.make_shell()
            task = self.loop.create_task(self._handshake(sock, shell, listener.ssl_context))
            # On the loop's clock, like every other timeout of jetd; the count lets go of
            # the handshake at that very moment, not once the loop has closed its socket.
            expiry = self.loop.call_later(self.config.tls_handshake_timeout, self._handshake_expired, shell)
            self.handshaking[shell] = (task, expiry)

    async def _connect(self, sock: socket.socket, shell: PeerShell) -> None:
        try:
            await self.loop.connect_accepted_socket(lambda: shell, sock)
        except OSError as exc:
            log.info("accepted connection lost before it started: %s", exc)
            sock.close()

    async def _handshake(self, sock: socket.socket, shell: PeerShell, context: ssl.SSLContext) -> None:
        """Run a TLS handshake for ``shell``, counted in ``handshaking`` until the shell's
        ``connection_made`` (:meth:`end_handshake`), its failure, or its time-out
        (:meth:`_handshake_expired`, which cancels this)."""
        # The loops' own handshake clock only backs ours up (both close the socket when
        # the task is cancelled).
        backstop = 2 * self.config.tls_handshake_timeout
        loop = self.loop
        waiter: asyncio.Future[Any] = loop.create_future()
        # The loop's own SSL protocol, under which TlsInput counts what the peer sends
        # (issue 29: the handshake's bytes are charged to the input budget).
        shell.tls_input = tls_input = TlsInput(ssl_protocol(loop, shell, context, waiter, backstop),
                                               lambda nbytes: self._tls_admit(shell, nbytes), shell.tls_settled)
        transport: Optional[asyncio.Transport] = None
        try:
            transport = (await loop.connect_accepted_socket(lambda: tls_input, sock))[0]
            await waiter
        except OSError as exc:
            log.info("TLS handshake failed: %s", exc)
            if transport is None:
                sock.close()
            else:
                transport.abort()
        except asyncio.CancelledError:
            if transport is not None:
                transport.abort()  # the handshake expired: a close, never plaintext
            raise
        except Exception:
            # A bug here must cost this connection only, and not leave its socket open.
            log.exception("internal error in a TLS handshake")
            if transport is None:
                sock.close()
            else:
                transport.abort()
        finally:
            self.end_handshake(shell)

    def _tls_admit(self, shell: PeerShell, nbytes: int) -> bool:
        """TlsInput: may the SSL layer of ``shell`` take ``nbytes`` more? During the
        handshake all its bytes are charged to the input budget (Daemon.handshake_holds);
        one that would pass it is closed. After it, always: charge_transport charges
        what the SSL layer then holds."""
        if shell not in self.handshaking:
            return True
        shell.handshake_bytes += nbytes
        if self.daemon.handshake_holds(shell, shell.handshake_bytes):
            return True
        self.end_handshake(shell)
        return False

    def end_handshake(self, shell: PeerShell) -> None:
        """``shell`` is no longer a handshake in progress (it is a connection now, or gone)."""
        entry = self.handshaking.pop(shell, None)
        if entry is not None:
            entry[1].cancel()
        if shell.handshake_bytes:
            shell.handshake_bytes = 0
            self.daemon.handshake_holds(shell, 0)

    def _handshake_expired(self, shell: PeerShell) -> None:
        """PROTOCOL.md 15.6: a handshake not completed within ``--tls-handshake-timeout`` is
        closed (cancelling its task closes its socket, in asyncio and uvloop alike). Logged
        at most once a second, with a count (a flood of idle connections must not flood the
        log)."""
        entry = self.handshaking.pop(shell, None)
        if entry is None:
            return
        entry[0].cancel()
        self.tls_timeouts_total += 1
        self._tls_timeouts += 1
        now = self.loop.time()
        if now - self._tls_timeouts_logged >= REFUSED_LOG_INTERVAL:
            log.warning("closed %d connection(s) whose TLS handshake was not completed within %g s",
                        self._tls_timeouts, self.config.tls_handshake_timeout)
            self._tls_timeouts = 0
            self._tls_timeouts_logged = now

    def _jet_refusal(self, reason: str) -> bytes:
        return self.daemon.info_frame + close_frame(Status.LIMIT_EXCEEDED, reason)

    def _refuse_one(self, listener: Listening, exc: OSError) -> None:
        """accept() failed for lack of a descriptor: with the reserve one, accept the
        connection, tell it (jet TCP: INFO and CLOSE LIMIT_EXCEEDED; TLS: an alert) and
        close it (PROTOCOL.md 10.7, 15.6)."""
        reason = f"too many connections (out of file descriptors: limit {self.fd_limit})"
        if self._reserve_fd < 0:
            self._reserve_fd = _open_reserve()
            self.refused("?", f"accept failed: {exc.strerror}")
            return
        os.close(self._reserve_fd)
        self._reserve_fd = -1
        try:
            sock, address = listener.sock.accept()
        except OSError:
            pass
        else:
            _refuse_socket(sock, listener.refusal(reason))
            self.refused(f"{address[0]}:{address[1]}", reason)
        self._reserve_fd = _open_reserve()

    def stop_listening(self, sockets: Optional[list[socket.socket]] = None) -> None:
        """Stop accepting on ``sockets`` (default: every listener); handshakes in progress
        on them end too."""
        for listener in [entry for entry in self.listeners if sockets is None or entry.sock in sockets]:
            self.loop.remove_reader(listener.sock.fileno())
            listener.sock.close()
            self.listeners.remove(listener)
        if sockets is not None:
            return
        for task, expiry in self.handshaking.values():
            task.cancel()
            expiry.cancel()
        if self._tls_timeouts:
            log.warning("closed %d more connection(s) whose TLS handshake was not completed within %g s",
                        self._tls_timeouts, self.config.tls_handshake_timeout)
            self._tls_timeouts = 0
        if self._refused:
            log.warning("refused %d more connection(s) since the last report", self._refused)
            self._refused = 0
        if self._reserve_fd >= 0:
            os.close(self._reserve_fd)
            self._reserve_fd = -1

    def refused(self, address: str, reason: str) -> None:
        """Log a refused connection; at most one line a second, with a count."""
        self.refused_total += 1
        self._refused += 1
        now = self.loop.time()
        if now - self._refused_logged >= REFUSED_LOG_INTERVAL:
            log.warning("refused %d connection(s), last from %s: %s", self._refused, address, reason)
            self._refused = 0
            self._refused_logged = now

    # --- authentication (PROTOCOL.md 15.2) -------------------------------------------------

    def _offload(self, job: Callable[[], bool], done: Callable[[bool], None]) -> None:
        """Run a password check (argon2: slow on purpose) in a thread: other connections
        are not held up. Its outcome is handed to the core on the loop and acted on in
        the next turn of the core's work (``run_work``), like all deferred work."""

        def finished(future: asyncio.Future[bool]) -> None:
            if future.cancelled():
                return  # closing down
            try:
                ok = future.result()
            except Exception:
                log.exception("internal error while checking a password")
                ok = False
            done(ok)
            self.schedule_work()

        if self._checks is None:
            # As many threads as checks may run at once (PasswordChecks.at_once, one core
            # left to the loop): each check runs on its one thread (jetd.users.verify_password).
            self._checks = concurrent.futures.ThreadPoolExecutor(self.daemon.auth.checks.at_once, "jetd-password")
        self.loop.run_in_executor(self._checks, job).add_done_callback(finished)

    def hold(self, proto: Any) -> None:
        """Stop reading from ``proto`` until its AUTHENTICATE is answered (again, if the
        drain of its output resumed reading meanwhile)."""
        if proto.transport is not None and not proto.transport.is_closing():
            self.held.add(proto)
            proto.transport.pause_reading()

    def _release_held(self) -> None:
        for proto in [p for p in self.held if p.conn is None or not p.conn.held]:
            self.held.discard(proto)
            transport = proto.transport
            conn = proto.conn
            if (
                transport is not None
                and not transport.is_closing()
                and not proto.write_paused
                and not proto.hung_up
                and (conn is None or not conn.stalled)  # else run_work resumes it
            ):
                transport.resume_reading()

    def reload_access(self) -> None:
        """SIGHUP: re-read the users file; keep the old one if the new one does not load."""
        if self.config.auth is None:
            log.warning("SIGHUP ignored: jetd runs without --auth")
            return
        try:
            access = Access.load(self.config.auth)
        except UsersFileError as exc:
            log.error("users file not reloaded, the old one stays in force: %s", exc)
            return
        self.daemon.set_access(access, self.loop.time())
        self.flush()

    def schedule_work(self) -> None:
        if not self.work_scheduled:
            self.work_scheduled = True
            self.loop.call_soon(self.run_work)

    def run_work(self) -> None:
        """One slice of the core's pending work (initial adds, held input, route
        timeouts); then read again from the connections that caught up, and flush
        (which schedules the next slice, after the loop has polled for I/O)."""
        self.work_scheduled = False
        checks_done = bool(self.daemon.auth.completed)
        try:
            resumed = self.daemon.work(self.loop.time())
        except Exception:  # a bug here must not stop the daemon
            log.exception("internal error in pending work")
            resumed = []
        if checks_done and self.held:
            self._release_held()  # the connections whose AUTHENTICATE was answered
        for conn in resumed:
            proto: Any = conn.io
            if proto is None or proto.transport is None or proto.hung_up or proto.write_paused or conn.held:
                continue
            if not proto.transport.is_closing():
                proto.transport.resume_reading()
        self.flush()

    def schedule_flush(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write each connection's output of this loop turn with one write; with
        ``always``, hold it (and the hang-ups) for the next group commit, which is handed
        over at once unless one is in flight (JETLOG.md 6.1)."""
        self.flush_scheduled = False
        gated = self.gated
        stats = self.daemon.stats
        for conn in self.daemon.take_dirty():
            proto: Any = conn.io
            out = conn.out
            if proto is None or proto.transport is None or proto.transport.is_closing():
                out.clear()
                if conn.closed:
                    conn.pending.clear()  # nobody will write it: free it now
                continue
            transport = proto.transport
            if out:
                data = b"".join(out) if len(out) > 1 else out[0]
                out.clear()
                stats.bytes_out += len(data)  # issue 33 (jetd.metrics)
                if gated:
                    self._hold(proto, data, False)
                else:
                    transport.write(data)
            if conn.closed:
                if conn.pending:
                    # A fatal close while paused: what was queued before the CLOSE goes too.
                    data = b"".join(conn.take_pending(1 << 62))
                    if gated:
                        self._hold(proto, data, False)
                    else:
                        transport.write(data)
                if gated:
                    self._hold(proto, b"", True)
                else:
                    proto.hang_up()
        eventlog = self.eventlog
        if eventlog is not None:
            if gated:
                self._commit()
                if self.input_paused or self._over_backlog():
                    self._schedule_backlog_check()
            elif self.input_paused or eventlog.over_backlog:
                self._schedule_backlog_check()
        if self.daemon.has_work:
            self.schedule_work()

    # --- the event log: durable gate and writer backlog (JETLOG.md 6) ---------------------

    def _hold(self, proto: PeerShell, data: bytes, hang_up: bool) -> None:
        """With ``always``: write ``data`` (then hang up) once the next commit is durable."""
        self._held.append((proto, data, hang_up))
        self._held_bytes += len(data)

    def send(self, proto: PeerShell, data: bytes) -> bool:
        """Write ``data`` to ``proto``'s transport, through the durable gate with
        ``always``. Returns True if written now, False if held for the next group commit
        (the server calls ``proto.drain()`` again once it is out)."""
        transport = proto.transport
        self.daemon.stats.bytes_out += len(data)  # issue 33 (jetd.metrics)
        if not self.gated:
            if transport is not None:
                transport.write(data)
            return True
        self._hold(proto, data, False)
        self._held_drains.add(proto)
        self.schedule_flush()
        return False

    def _commit(self) -> None:
        """Hand the records and output gathered so far to the writer as one group commit,
        unless one is in flight (its completion hands the next)."""
        eventlog = self.eventlog
        if self._in_flight is not None or eventlog is None or not (self._held or eventlog.pending):
            return
        self._in_flight = (eventlog.commit(), eventlog.appended, self._held, self._held_drains)
        self._commit_mark = eventlog.appended
        self._held = []
        self._held_drains = set()

    def log_progress(self) -> None:
        """The writer made progress (called in the loop, from the writer's signal):
        release the output of a completed commit, hand over the next, and resume input
        if the backlog is low again."""
        eventlog = self.eventlog
        if eventlog is None:
            return
        if (eventlog.failed is not None) != self.log_down:
            self._log_health(eventlog)
        in_flight = self._in_flight
        if in_flight is not None and eventlog.durable >= in_flight[0]:
            self._in_flight = None
            self._durable_mark = in_flight[1]
            self._release(in_flight[2], in_flight[3])
            self._commit()
        elif in_flight is not None and eventlog.lost >= in_flight[0]:
            self._in_flight = None
            self._durable_mark = in_flight[1]
            if self.on_log_error == "continue":
                self._release(in_flight[2], in_flight[3])
            else:
                self._drop_lost(in_flight[2])
            self._commit()
        if self.input_paused or self._over_backlog():
            self.check_backlog()

    def _log_health(self, eventlog: EventLog) -> None:
        """JETLOG.md 6.5: the log stopped or resumed (the writer logged it): act on
        ``--log-on-error``."""
        failed = eventlog.failed
        policy = self.on_log_error
        if failed is not None:
            self.log_down = True
            self._retry_at = self.loop.time() + RETRY_INTERVAL
            actions = self._held
            self._held, self._held_drains = [], set()
            if self._in_flight is not None:
                actions = self._in_flight[2] + actions
                self._in_flight = None
            if policy == "stop":
                self._stop_for_log(actions, failed)
                return
            was_gated = self.gated
            self.gated = False  # meanwhile nothing is durable: nothing waits to be
            if policy == "continue":
                self._release(actions, set())
            else:
                # With always, output the core produced and nobody flushed yet (a read
                # earlier in this loop iteration), or queued for a slow peer, followed
                # records that are lost just the same: dropped with the held output.
                if was_gated:
                    actions += [(p, b"", False) for p in self.protocols if p.conn is not None and (p.conn.out or p.conn.pending)]
                self._drop_lost(actions)
                self.daemon.refusing = f"event log cannot be written: {failed}"
            self._held_bytes = 0
            self.flush()
        else:
            self.log_down = False
            self.daemon.refusing = None
            self.gated = eventlog.fsync == "always"
            eventlog.forget_losses()
            self._durable_mark = self._commit_mark = eventlog.appended
            self._held_bytes = 0

    def _drop_lost(self, actions: list[_Action]) -> None:
        """JETLOG.md 6.5: output whose records were lost is never sent; its connections
        are closed INTERNAL (their peers cannot know what became of their requests)."""
        now = self.loop.time()
        seen: set[PeerShell] = set()
        for proto, data, _hang_up in actions:
            self._held_bytes -= len(data)
            if proto in seen:
                continue
            seen.add(proto)
            conn = proto.conn
            if conn is not None and not conn.closed:
                conn.out.clear()
                conn.take_pending(1 << 62)
                self.daemon.internal_error(conn, now, "event log cannot be written: answers lost")
            elif proto.transport is not None and not proto.transport.is_closing():
                proto.hang_up()
        self.schedule_flush()

    def _stop_for_log(self, actions: list[_Action], failed: str) -> None:
        """--log-on-error stop: nothing held is sent; every peer gets CLOSE (INTERNAL) and
        jetd exits 1."""
        self._held_bytes = 0
        self.gated = False
        now = self.loop.time()
        message = f"event log cannot be written: {failed}"
        for proto in list(self.protocols):
            conn = proto.conn
            if conn is not None and not conn.closed:
                conn.out.clear()
                conn.take_pending(1 << 62)
                self.daemon.internal_error(conn, now, message)
        log.error("event log cannot be written: stopping (--log-on-error stop)")
        if self.stop_for_log is not None:
            self.stop_for_log()
        self.flush()
        # Connections closed before, whose CLOSE was in the output dropped: hang up.
        for proto, _data, _hang_up in actions:
            if (proto.conn is None or proto.conn.closed) and proto.transport is not None and not proto.transport.is_closing():
                proto.hang_up()

    def _release(self, actions: list[_Action], drains: set[PeerShell]) -> None:
        """Write durable output to the transports, in the order it was produced; the
        connections whose drain stopped at a chunk of it drain on."""
        size = 0
        for proto, data, hang_up in actions:
            size += len(data)
            transport = proto.transport
            if transport is None or transport.is_closing():
                continue
            if data:
                transport.write(data)
            if hang_up:
                proto.hang_up()
        self._held_bytes -= size
        for proto in drains:
            if not proto.write_paused:
                proto.drain()

    def flush_after_read(self, proto: PeerShell) -> None:
        """flush() right after a large read; a peer whose read took the event log over its
        backlog limit stops being read at once (libuv reads a socket up to 32 times per
        loop iteration: megabytes), the others after this iteration (JETLOG.md 6.3)."""
        self.flush()
        if self.eventlog is not None and (self.input_paused or self._over_backlog()):
            if not self.input_paused:
                self._enter_pause(self._backlog())
            transport = proto.transport
            if transport is not None and not proto.hung_up and not transport.is_closing():
                transport.pause_reading()
            self._schedule_backlog_check()

    def _schedule_backlog_check(self) -> None:
        # After every read of this loop iteration: pausing input from within one peer's
        # read would starve the peers whose reads come after it in the iteration.
        if not self._backlog_check_scheduled:
            self._backlog_check_scheduled = True
            self.loop.call_soon(self.check_backlog)

    def _backlog(self) -> int:
        """Bytes not yet written (with always: not yet durable, and output held)."""
        eventlog = self.eventlog
        if eventlog is None:
            return 0
        if self.gated:
            return eventlog.appended - self._durable_mark + self._held_bytes
        return eventlog.backlog

    def _next_commit_size(self) -> int:
        """With always: bytes of records appended since the last commit was handed over."""
        eventlog = self.eventlog
        return 0 if eventlog is None else eventlog.appended - self._commit_mark

    def _over_backlog(self) -> bool:
        if self.gated and self._next_commit_size() > GATED_BACKLOG:
            return True
        return self._backlog() > self._backlog_limit

    def _backlog_low(self, backlog: int) -> bool:
        if self.gated and self._next_commit_size() > GATED_BACKLOG // 2:
            return False
        return backlog <= self._backlog_limit // 2

    def check_backlog(self) -> None:
        """JETLOG.md 6.3: pause reading from every peer while the bytes not yet written
        (and the output held for them) are above ``log_writer_backlog``; resume below
        half of it. Rate-limited log lines."""
        self._backlog_check_scheduled = False
        eventlog = self.eventlog
        if eventlog is None:
            return
        backlog = self._backlog()
        limit = self._backlog_limit
        if self._over_backlog():
            if not self.input_paused:
                self._enter_pause(backlog)
            # Every flush while paused: connections made since, and any that another
            # path resumed (a drain), are paused again.
            for proto in self.protocols:
                transport = proto.transport
                if transport is not None and not proto.hung_up and not transport.is_closing():
                    transport.pause_reading()
            if not self.gated:  # (with always, each completed commit wakes the loop anyway)
                eventlog.notify_below = limit // 2
                eventlog.flush()  # what the loop still holds counts too: let the writer have it
        elif self.input_paused and self._backlog_low(backlog):
            self.input_paused = False
            eventlog.notify_below = -1
            for proto in self.protocols:
                transport = proto.transport
                conn = proto.conn
                if transport is None or proto.hung_up or transport.is_closing() or proto.write_paused:
                    continue
                if conn is not None and (conn.paused or conn.closing):
                    continue  # a slow consumer: its drain resumes it (PROTOCOL.md 10.8)
                transport.resume_reading()
            if self._pause_logged:
                self._pause_logged = False
                log.info("event log: writer caught up (%d bytes not yet written): reading from peers resumed", backlog)

    def _enter_pause(self, backlog: int) -> None:
        self.input_paused = True
        self.input_pauses += 1
        now = self.loop.time()
        if now - self._pause_logged_at >= BACKLOG_LOG_EVERY:
            log.warning(
                "event log: %d bytes not yet %s (limit %d%s): reading from peers paused%s",
                backlog,
                "durable" if self.gated else "written",
                self._backlog_limit,
                f", {GATED_BACKLOG} per group commit" if self.gated else "",
                f" ({self._pauses_unlogged} more pauses since the last line)" if self._pauses_unlogged else "",
            )
            self._pause_logged_at = now
            self._pauses_unlogged = 0
            self._pause_logged = True
        else:
            self._pauses_unlogged += 1

    def _tick(self) -> None:
        try:
            self.daemon.tick(self.loop.time())
            if self.held:
                self._release_held()
            self.flush()
            eventlog = self.eventlog
            if eventlog is not None:
                # A quiet daemon's records reach the file within a tick (JETLOG.md 6.2).
                if self.gated:
                    self._commit()
                else:
                    eventlog.flush()
                if (eventlog.failed is not None) != self.log_down:
                    self._log_health(eventlog)
                if self.log_down and self.loop.time() >= self._retry_at:
                    self._retry_at = self.loop.time() + RETRY_INTERVAL
                    eventlog.retry()  # JETLOG.md 6.5
                if self.input_paused or self._over_backlog():
                    self.check_backlog()
        except Exception:  # a bug here must not stop the clock for everyone
            log.exception("internal error in the periodic tick")
        self._tick_handle = self.loop.call_later(self.tick_interval, self._tick)

    async def shutdown(self) -> None:
        """PROTOCOL.md 10.9: stop accepting, CLOSE (OK) to every peer, hang up."""
        self.stop_listening()
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        self.daemon.shutdown(self.loop.time())
        self.flush()
        if self._checks is not None:
            self._checks.shutdown(wait=False, cancel_futures=True)
        if self.protocols:
            try:
                await asyncio.wait_for(self.all_closed.wait(), self.config.shutdown_grace + 1)
            except TimeoutError:
                for proto in list(self.protocols):
                    if proto.transport is not None:
                        proto.transport.abort()
                await asyncio.sleep(0)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name, or every interface ("" / "0.0.0.0" are not loopback either)


def _warn_exposed(config: Config) -> None:
    """Say it loudly when jetd listens beyond this machine without protection (its TCP
    listener, or its HTTP listener for WebSocket peers)."""
    hosts = [config.host]
    if config.http_port is not None:
        hosts.append(config.http_host or config.host)
    exposed = next((host for host in hosts if not _is_loopback(host)), None)
    if exposed is None:
        return
    if config.auth is None:
        print(
            f"jetd: WARNING: listening on {exposed} (not loopback) without --auth: "
            "anyone who can reach this port can read, set, call and register any key",
            file=sys.stderr,
        )
    if config.tls_cert is None:
        print(
            f"jetd: WARNING: listening on {exposed} (not loopback) without TLS "
            "(--tls-cert/--tls-key): data and passwords travel in clear text",
            file=sys.stderr,
        )
    elif config.tls_port is not None and not _is_loopback(config.host):
        print(
            f"jetd: WARNING: plain TCP on {config.host} port {config.port} (not loopback) beside "
            "--tls-port: data and passwords sent to that port travel in clear text",
            file=sys.stderr,
        )


def _tls_refusal(_reason: str) -> bytes:
    return TLS_REFUSAL_ALERT


def _refuse_socket(sock: socket.socket, data: bytes) -> None:
    """Send ``data`` on a socket that never became a connection, and close it. What the
    client sent already (a ClientHello) is read first: closing with unread input would
    reset the connection, which can destroy ``data`` before the client reads it."""
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.recv(1 << 16)
        if data:
            sock.send(data)
        sock.shutdown(socket.SHUT_WR)
    sock.close()


def _open_reserve() -> int:
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return -1


def listen(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for every address ``host`` resolves to (like
    ``loop.create_server``); with port 0, all on the port the first one got.

    Raises:
        OSError: the address cannot be resolved or bound.
    """
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    listeners: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            listeners.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(listeners) > 1:
                address = (address[0], listeners[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(1024)
            sock.setblocking(False)
    except (OSError, socket.gaierror):
        for sock in listeners:
            sock.close()
        raise
    return listeners


def _threadsafe(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> Callable[[], None]:
    """A function for another thread that runs ``callback`` in ``loop`` soon."""

    def wake() -> None:
        loop.call_soon_threadsafe(callback)

    return wake


def new_event_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A new loop: uvloop for ``uvloop``, asyncio's for ``asyncio``, and for ``auto``
    uvloop when importable, else asyncio's.

    Raises:
        ImportError: for ``uvloop`` when uvloop is not installed.
    """
    if kind in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()
