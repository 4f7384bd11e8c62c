"""The thin asyncio/uvloop layer around :class:`jetd.core.Daemon`.

One :class:`PeerProtocol` per TCP connection feeds the bytes it reads to the core and
asks for one flush per loop turn: every connection that got output during the turn gets
exactly one ``transport.write`` (PROTOCOL.md says nothing about it; NOTES.md measured
one write per frame as several times slower). Flow control: the transport's high-water
mark is the soft limit of PROTOCOL.md 10.8; above it the core queues locally (and
holds the peer's changes back, to send their latest values), reading from that peer
pauses, and the queue drains when the transport calls ``resume_writing``.

The event log (JETLOG.md 6): with ``--log-fsync always`` every write to a transport, and
every hang-up, goes through the durable gate (:meth:`Server.send`): it is held until the
group commit that covers the records appended before it is written and fsynced, and only
one commit is in flight at a time, so the output of the turns that run meanwhile shares
the next one. The loop never waits for the writer: when the bytes not yet written (and
the output held for them) pass ``log_writer_backlog``, reading from every peer pauses
until the writer has brought them below half of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, Optional, cast

from .config import Config
from .core import Connection, Daemon
from .eventlog import EventLog

__all__ = ["PeerProtocol", "Server", "new_event_loop", "serve"]

log = logging.getLogger("jetd")

LINGER_QUIET = 0.2  # hang_up: seconds without input after which the socket is closed
DRAIN_CHUNK = 256 * 1024  # bytes handed to a paused transport per write while draining
# libuv reads up to 32 times per readiness event, so one loop turn can bring megabytes;
# after a read this large we flush at once, which bounds what one turn queues per peer
# (input chunk times fan-out) and lets the soft limit act close to its value.
FLUSH_AFTER_READ = 32 * 1024
# JETLOG.md 6.3: with always, input pauses while the records appended since the commit in
# flight was handed over pass this many bytes, and resumes when the next commit is handed
# over, so that a group commit stays short: an answer waits for the commit in flight,
# then its own, each of about this size at most.
GATED_BACKLOG = 1024 * 1024
BACKLOG_LOG_EVERY = 10.0  # JETLOG.md 6.3: seconds between log lines about input paused for the writer

# The durable gate's unit: one write to a transport, then maybe a hang-up (its CLOSE is in
# the write). ``data`` may be empty.
_Action = tuple["PeerProtocol", bytes, bool]


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
        if len(data) >= FLUSH_AFTER_READ:
            server.flush_after_read(self)
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
                transport.resume_reading()
                break
        # A CLOSE (OVERLOADED) from the catch-up, and what a live connection got, go out.
        server.schedule_flush()

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

    def __init__(self, config: Config, loop: asyncio.AbstractEventLoop, eventlog: Optional[EventLog] = None) -> None:
        self.config = config
        self.loop = loop
        self.eventlog = eventlog
        self.daemon = Daemon(config, eventlog.append if eventlog is not None else None)
        self.protocols: set[PeerProtocol] = set()
        self.flush_scheduled = False
        self.all_closed = asyncio.Event()
        self.server: Optional[asyncio.AbstractServer] = None
        self._tick_handle: Optional[asyncio.TimerHandle] = None
        self.tick_interval = min(0.1, config.route_timeout / 10)
        # JETLOG.md 6.1, the durable gate (``always`` only): output of the turns since the
        # last commit, and the one commit in flight with its output.
        self.gated = eventlog is not None and eventlog.fsync == "always"
        self._held: list[_Action] = []
        self._held_drains: set[PeerProtocol] = set()  # their drain stopped at a chunk in _held
        # The commit in flight: (seq, EventLog.appended then, its output, its drains).
        self._in_flight: Optional[tuple[int, int, list[_Action], set[PeerProtocol]]] = None
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

    async def start(self) -> tuple[str, int]:
        """Listen; returns the (host, port) actually bound."""
        self.server = await self.loop.create_server(
            lambda: PeerProtocol(self), self.config.host, self.config.port, backlog=1024, reuse_address=True
        )
        port = self.server.sockets[0].getsockname()[1]
        self._tick_handle = self.loop.call_later(self.tick_interval, self._tick)
        return self.config.host, port

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

    # --- the event log: durable gate and writer backlog (JETLOG.md 6) ---------------------

    def _hold(self, proto: PeerProtocol, data: bytes, hang_up: bool) -> None:
        """With ``always``: write ``data`` (then hang up) once the next commit is durable."""
        self._held.append((proto, data, hang_up))
        self._held_bytes += len(data)

    def send(self, proto: PeerProtocol, data: bytes) -> bool:
        """Write ``data`` to ``proto``'s transport, through the durable gate with
        ``always``. Returns True if written now, False if held for the next group commit
        (the server calls ``proto.drain()`` again once it is out)."""
        transport = proto.transport
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
        in_flight = self._in_flight
        if in_flight is not None and eventlog.durable >= in_flight[0]:
            self._in_flight = None
            self._durable_mark = in_flight[1]
            self._release(in_flight[2], in_flight[3])
            self._commit()
        if self.input_paused or self._over_backlog():
            self.check_backlog()

    def _release(self, actions: list[_Action], drains: set[PeerProtocol]) -> None:
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

    def flush_after_read(self, proto: PeerProtocol) -> None:
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
            self.flush()
            eventlog = self.eventlog
            if eventlog is not None:
                # A quiet daemon's records reach the file within a tick (JETLOG.md 6.2).
                if self.gated:
                    self._commit()
                else:
                    eventlog.flush()
                if self.input_paused or self._over_backlog():
                    self.check_backlog()
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
    eventlog: Optional[EventLog] = None
    if config.log_dir:
        eventlog = EventLog(
            config.log_dir,
            name=config.name,
            fsync=config.log_fsync,
            rotate_size=config.log_rotate_size,
            max_backlog=config.log_writer_backlog,
            max_bytes=config.log_max_bytes,
            max_age=config.log_max_age,
        )
        eventlog.open()
    server = Server(config, loop, eventlog)
    if eventlog is not None:
        eventlog.signal = _threadsafe(loop, server.log_progress)
    try:
        host, port = await server.start()
    except OSError as exc:
        if eventlog is not None:
            eventlog.close()
        print(f"jetd: cannot listen on {config.host}:{config.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: log.info("stats: %s", server.daemon.stats.summary()))
    print(f"jetd listening on {host}:{port}", flush=True)
    log.info(
        "listening on %s:%d (loop %s, event log %s)",
        host,
        port,
        type(loop).__module__.split(".")[0],
        eventlog.path if eventlog is not None else "off",
    )
    if ready is not None:
        ready.set_result((host, port))
    await stop.wait()
    log.info("shutting down: %d connections", len(server.protocols))
    await server.shutdown()
    if eventlog is not None:
        eventlog.close()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        loop.remove_signal_handler(sig)
    log.info("stopped; stats: %s", server.daemon.stats.summary())
    return 0


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
