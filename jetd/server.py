"""The thin asyncio/uvloop layer around :class:`jetd.core.Daemon`.

One :class:`PeerProtocol` per TCP connection feeds the bytes it reads to the core and
asks for one flush per loop turn: every connection that got output during the turn gets
exactly one ``transport.write`` (PROTOCOL.md says nothing about it; NOTES.md measured
one write per frame as several times slower). Flow control: the transport's high-water
mark is the soft limit of PROTOCOL.md 10.8; above it the core queues locally (and
holds the peer's changes back, to send their latest values), reading from that peer
pauses, and the queue drains when the transport calls ``resume_writing``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import logging
import signal
import socket
import ssl
import sys
import time
from collections.abc import Callable
from typing import Any, Optional, cast

from .access import Access
from .config import Config, ConfigError
from .core import Connection, Daemon
from .eventlog import EventLog
from .tls import certificate_user, server_context
from .users import UsersFileError
from .web import WebListener, start_web

__all__ = ["PeerProtocol", "Server", "new_event_loop", "serve"]

log = logging.getLogger("jetd")

LINGER_QUIET = 0.2  # hang_up: seconds without input after which the socket is closed
# Password checks (argon2id: ~64 MiB and a fraction of a second each) run on this many
# threads at most, which bounds their memory and leaves the loop its core.
PASSWORD_CHECK_THREADS = 2
DRAIN_CHUNK = 256 * 1024  # bytes handed to a paused transport per write while draining
# libuv reads up to 32 times per readiness event, so one loop turn can bring megabytes;
# after a read this large we flush at once, which bounds what one turn queues per peer
# (input chunk times fan-out) and lets the soft limit act close to its value.
FLUSH_AFTER_READ = 32 * 1024


class PeerProtocol(asyncio.Protocol):
    """One peer connection: bytes in to the core, flow-control callbacks to the core."""

    __slots__ = ("abort_handle", "conn", "heard", "hung_up", "server", "transport", "write_paused")

    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: Optional[asyncio.Transport] = None
        self.conn: Optional[Connection] = None
        self.write_paused = False
        self.abort_handle: Optional[asyncio.TimerHandle] = None
        self.hung_up = False
        self.heard = False  # input arrived since the last linger check

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = transport = cast(asyncio.Transport, transport)
        server = self.server
        soft = server.config.soft_limit
        # NOTES.md: uvloop's default low-water mark is tiny; set both marks explicitly.
        transport.set_write_buffer_limits(high=soft, low=soft // 4)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        server.protocols.add(self)
        self.conn = server.daemon.connect(address, server.loop.time())
        self.conn.io = self
        user = certificate_user(transport.get_extra_info("ssl_object"))
        if user is not None:
            server.daemon.authenticate_certificate(self.conn, user)  # PROTOCOL.md 14.6
        server.schedule_flush()

    def data_received(self, data: bytes) -> None:
        if self.hung_up:
            self.heard = True  # after our CLOSE: read only so that closing sends no RST (hang_up)
            return
        server = self.server
        eventlog = server.eventlog
        if eventlog is not None:
            eventlog.turn_ns = time.time_ns()  # one timestamp for the records of this read
        try:
            server.daemon.receive_data(self.conn, data, server.loop.time())  # type: ignore[arg-type]
        except Exception:
            # A bug in the core must cost one connection, never the daemon.
            log.exception("internal error on %s", self.conn.label if self.conn else "?")
            if self.conn is not None:
                server.daemon.internal_error(self.conn, server.loop.time())
        finally:
            if eventlog is not None:
                eventlog.turn_ns = 0
        if self.conn is not None and self.conn.held:
            server.hold(self)  # PROTOCOL.md 14.2: read nothing while AUTHENTICATE is answered
        if len(data) >= FLUSH_AFTER_READ:
            server.flush()
        elif not server.flush_scheduled:
            server.flush_scheduled = True
            server.loop.call_soon(server.flush)

    def eof_received(self) -> bool:
        if self.hung_up:
            return False  # both sides are done: the transport closes
        # The peer will send nothing more: it is gone for the registry (PROTOCOL.md
        # 10.6), but the answers already produced for it still go out before we close.
        server = self.server
        if self.conn is not None:
            server.daemon.disconnect(self.conn, server.loop.time(), "peer closed its side")
            server.schedule_flush()
        return True

    def connection_lost(self, exc: Optional[Exception]) -> None:
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
        daemon = self.server.daemon
        while True:
            while conn.pending and not self.write_paused:
                transport.write(b"".join(conn.take_pending(DRAIN_CHUNK)))
            if self.write_paused or not conn.paused or conn.closing:
                break
            if daemon.drained(conn):
                transport.resume_reading()
                break
        # A CLOSE (OVERLOADED) from the catch-up, and what a live connection got, go out.
        self.server.schedule_flush()

    def hang_up(self) -> None:
        """End the connection once the queued bytes (its CLOSE last) are written.

        A lingering close: we half-close (FIN after the last byte) and read, dropping it,
        whatever the peer still sends until it closes its side. Closing a socket whose
        input was not all read makes the kernel answer with RST, and a RST can destroy
        the CLOSE frame in the peer's receive buffer before the peer reads it: exactly
        what a peer that sent an oversize frame (PROTOCOL.md 9.2) would do. The socket is
        closed when the peer closes its side, or once everything is written and nothing
        arrived for LINGER_QUIET seconds; a peer that takes longer than the shutdown
        grace is aborted."""
        transport = self.transport
        if transport is None or transport.is_closing() or self.hung_up:
            return
        self.hung_up = True
        if transport.can_write_eof():
            transport.write_eof()
            transport.resume_reading()
            self.server.loop.call_later(LINGER_QUIET, self._linger)
        else:
            transport.close()
        if self.abort_handle is None:
            self.abort_handle = self.server.loop.call_later(self.server.config.shutdown_grace, transport.abort)


    def _linger(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.heard or transport.get_write_buffer_size():
            self.heard = False
            self.server.loop.call_later(LINGER_QUIET, self._linger)
        else:
            transport.close()


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
        self.ssl_context = ssl_context
        self.daemon = Daemon(config, eventlog.append if eventlog is not None else None, access)
        self.daemon.offload = self._offload
        # PeerProtocol or jetd.web.WebProtocol: reading paused while AUTHENTICATE is answered.
        self.held: set[Any] = set()
        self._checks: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self.protocols: set[PeerProtocol] = set()
        self.flush_scheduled = False
        self.all_closed = asyncio.Event()
        self.server: Optional[asyncio.AbstractServer] = None
        self._tick_handle: Optional[asyncio.TimerHandle] = None
        self.tick_interval = min(0.1, config.route_timeout / 10)

    async def start(self) -> tuple[str, int]:
        """Listen; returns the (host, port) actually bound."""
        self.server = await self.loop.create_server(
            lambda: PeerProtocol(self),
            self.config.host,
            self.config.port,
            backlog=1024,
            reuse_address=True,
            ssl=self.ssl_context,
        )
        port = self.server.sockets[0].getsockname()[1]
        self._tick_handle = self.loop.call_later(self.tick_interval, self._tick)
        return self.config.host, port

    # --- authentication (PROTOCOL.md 14.2) -------------------------------------------------

    def _offload(self, job: Callable[[], bool], done: Callable[[bool, float], None]) -> None:
        """Run a password check (argon2: slow on purpose) in a thread, then its outcome
        on the loop: other connections are not held up."""

        def finished(future: asyncio.Future[bool]) -> None:
            try:
                ok = future.result()
            except Exception:
                log.exception("internal error while checking a password")
                ok = False
            try:
                done(ok, self.loop.time())
            except Exception:
                log.exception("internal error after checking a password")
            self._release_held()
            self.flush()

        if self._checks is None:
            self._checks = concurrent.futures.ThreadPoolExecutor(PASSWORD_CHECK_THREADS, "jetd-password")
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
            if transport is not None and not transport.is_closing() and not proto.write_paused:
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

    def schedule_flush(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write each connection's output of this loop turn with one write."""
        self.flush_scheduled = False
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
                transport.write(b"".join(out) if len(out) > 1 else out[0])
                out.clear()
            if conn.closed:
                if conn.pending:
                    # A fatal close while paused: what was queued before the CLOSE goes too.
                    transport.write(b"".join(conn.take_pending(1 << 62)))
                proto.hang_up()

    def _tick(self) -> None:
        try:
            self.daemon.tick(self.loop.time())
            if self.held:
                self._release_held()
            self.flush()
            if self.eventlog is not None:
                self.eventlog.flush()  # a quiet daemon's records reach the file within a tick
        except Exception:  # a bug here must not stop the clock for everyone
            log.exception("internal error in the periodic tick")
        self._tick_handle = self.loop.call_later(self.tick_interval, self._tick)

    async def shutdown(self) -> None:
        """PROTOCOL.md 10.9: stop accepting, CLOSE (OK) to every peer, hang up."""
        if self.server is not None:
            self.server.close()
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


async def serve(config: Config, ready: Optional[asyncio.Future[tuple[str, int]]] = None) -> int:
    """Run jetd until SIGTERM or SIGINT; returns the exit code.

    Prints ``jetd listening on HOST:PORT`` as the first stdout line once listening.
    """
    loop = asyncio.get_running_loop()
    try:
        access = Access.load(config.auth) if config.auth is not None else None
        ssl_context = server_context(config)
    except (UsersFileError, ConfigError) as exc:
        print(f"jetd: error: {exc}", file=sys.stderr)
        return 2
    _warn_exposed(config)
    eventlog: Optional[EventLog] = None
    if config.log_dir:
        eventlog = EventLog(
            config.log_dir, name=config.name, fsync=config.log_fsync, rotate_size=config.log_rotate_size
        )
        eventlog.open()
    server = Server(config, loop, eventlog, access, ssl_context)
    try:
        host, port = await server.start()
    except OSError as exc:
        if eventlog is not None:
            eventlog.close()
        print(f"jetd: cannot listen on {config.host}:{config.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    web: Optional[WebListener] = None
    if config.http_port is not None:  # PROTOCOL.md 13: WebSocket peers and the console
        try:
            # The same TLS settings as the TCP listener (jetd.tls): wss and https.
            web, web_line = await start_web(server, server.ssl_context)
        except OSError as exc:
            await server.shutdown()
            if eventlog is not None:
                eventlog.close()
            where = f"{config.http_host or config.host}:{config.http_port}"
            print(f"jetd: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: log.info("stats: %s", server.daemon.stats.summary()))
    loop.add_signal_handler(signal.SIGHUP, server.reload_access)
    print(f"jetd listening on {host}:{port}", flush=True)
    log.info(
        "listening on %s:%d (loop %s, event log %s)",
        host,
        port,
        type(loop).__module__.split(".")[0],
        eventlog.path if eventlog is not None else "off",
    )
    if web is not None:
        print(web_line, flush=True)
        log.info("%s", web_line)
    if ready is not None:
        ready.set_result((host, port))
    await stop.wait()
    log.info("shutting down: %d connections", len(server.protocols))
    if web is not None:
        web.close()
    await server.shutdown()
    if eventlog is not None:
        eventlog.close()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP):
        loop.remove_signal_handler(sig)
    log.info("stopped; stats: %s", server.daemon.stats.summary())
    return 0


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
