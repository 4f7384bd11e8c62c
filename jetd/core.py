"""The sans-IO core of jetd: a thin frame dispatcher over the daemon's parts.

Nothing here touches a socket, a loop or a clock. The IO layer (:mod:`jetd.server`)
creates a :class:`Connection` per accepted peer with :meth:`Daemon.connect`, feeds it
bytes with :meth:`Daemon.receive_data`, calls :meth:`Daemon.tick` with the monotonic time
now and then, and after each loop turn writes out what :meth:`Daemon.take_dirty` names:
``conn.out`` (a list of byte pieces to join and write) or, for a connection whose
transport is paused, the local queue drained with :meth:`Connection.take_pending`.
While :attr:`Daemon.has_work` (a fetch's initial adds, input held back while a peer's
output drains, a burst of route timeouts) it calls :meth:`Daemon.work` once per loop
turn; a connection left ``stalled`` by :meth:`Daemon.receive_data` must not be read
from until :meth:`Daemon.work` returns it.

``Daemon`` is composed of parts, each an object with its own state and a few methods,
created and wired here (ARCHITECTURE.md):

- :mod:`jetd.base`: :class:`Output`, the output queues, budgets and closing;
- :mod:`jetd.registry`: states and methods, who owns them, the cached values;
- :mod:`jetd.routes`: routed SET_STATE/CALL_METHOD, owners' answers, route timeouts;
- :mod:`jetd.subscriptions`: fetches, fan-out, slow consumers (parking);
- :mod:`jetd.querying`: query fetches and QUERY_ONCE (PROTOCOL.md 14);
- :mod:`jetd.access`: users, permissions and authentication (PROTOCOL.md 15);
- :mod:`jetd.scheduler`: which stalled connection's sliced work goes on next;
- :mod:`jetd.frames`: the frame layouts and quick checks of the hot paths.

This module is the dispatcher: the connection life cycle and :meth:`Daemon.receive_data`,
which cuts frames and hands each to the part it is for. Its hot paths work on the received bytes directly: a routed
request is forwarded as a new 9-byte head plus a slice of the received frame; a state
change is encoded once as (head, slice) and every fetcher gets
``head + its 4-byte fetch id + slice`` as three list appends (PROTOCOL.md 7.2 layout).
Those paths are written inline on purpose (a call per frame costs what they save);
anything the fast checks doubt goes the careful way through the handlers.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Optional

from jetwire import FEATURE_AUTH_REQUIRED
from jetwire import FEATURE_CONFLATION
from jetwire import FEATURE_DAEMON_STATES
from jetwire import FEATURE_LIMITS
from jetwire import FEATURE_QUERIES
from jetwire import PROTOCOL_MAJOR
from jetwire import EventCode
from jetwire import Function
from jetwire import Info
from jetwire import RemoteProtocolError
from jetwire import Status
from jetwire import decode_body
from jetwire import encode
from jetwire.codec import NATIVE
from jetwire.codes import MIN_PEER_MAX_BODY
from jetwire.log import LogKind
from jetwire.log import conn_close_data
from jetwire.log import conn_name_data
from jetwire.log import conn_open_data

from .access import AUTHENTICATE
from .access import Access
from .access import AccessControl
from .base import Clock
from .base import DaemonStats
from .base import FrameCounts
from .base import Output
from .base import RouteTimes
from .config import Config
from .connection import Connection
from .frames import CALL_METHOD
from .frames import CHANGE_HEADS
from .frames import CHANGE_HEADS_BELOW
from .frames import DAEMON_EVENTS
from .frames import EV_CLOSE
from .frames import EV_NOTIFY_STATE
from .frames import EV_SET_STATE
from .frames import EVENT
from .frames import EVT_HEAD_PACK
from .frames import FETCH_CHANGE
from .frames import FRAME_IN
from .frames import HDR_FROM
from .frames import ID_BYTE_FROM
from .frames import ID_HEAD_PACK
from .frames import INFO
from .frames import KNOWN_STATUSES
from .frames import OPAQUE
from .frames import REQUEST
from .frames import RESPONSE
from .frames import SET_STATE
from .frames import U32_FROM
from .frames import VHEAD_FROM
from .frames import VTYPE_CHECK
from .frames import LogHook
from .frames import close_frame
from .frames import key_value_end
from .frames import str16_ok
from .frames import why_malformed
from .metrics import Metrics
from .querying import Queries
from .registry import Registry
from .registry import StateRegistry
from .routes import Route
from .routes import Router
from .routes import RouteTable
from .scheduler import DEFAULT_FAN_CHUNK
from .scheduler import Scheduler
from .subscriptions import Delivery
from .subscriptions import Fetch
from .subscriptions import FetchRegistry
from .subscriptions import Subscriptions

__all__ = [
    "Connection",
    "Daemon",
    "DaemonStats",
    "Delivery",
    "Fetch",
    "FetchRegistry",
    "Route",
    "RouteTable",
    "StateRegistry",
]

log = logging.getLogger("jetd")


class Daemon:
    """The registry and router. Feed it bytes per connection; it fills output queues.

    Args:
        config: limits and policies (:class:`jetd.config.Config`).
        log_hook: called as ``hook(conn_id, kind, data)`` for every event-log record
            (JETLOG.md 4), or None when no event log is kept.
        access: the loaded users file when authentication is on (PROTOCOL.md 15), else
            None: then nothing is checked.
        clock: the IO layer's monotonic time source, on the time base of the ``now`` it
            passes in; the scheduler reads it to end slices of work after about 1 ms
            (:mod:`jetd.scheduler`). None: slices are counted in items only.

    Attributes:
        registry, router, subscriptions, queries, auth, scheduler, out: the parts
            (see the module docstring); the IO layer sets ``auth.offload`` to run
            password checks off the loop (:data:`jetd.access.Offload`).
    """

    def __init__(self, config: Config, log_hook: Optional[LogHook] = None, access: Optional[Access] = None,
                 clock: Optional[Callable[[], float]] = None) -> None:
        self.config = config
        self.stats = DaemonStats()
        self.clock = Clock()
        self.out = Output(config, self.stats, log_hook)
        self.scheduler = Scheduler(clock=clock)
        self.registry = Registry(config, self.out)
        self.subscriptions = Subscriptions(config, self.out, self.clock, self.stats, log_hook, self.registry,
                                           self.scheduler)
        self.queries = Queries(config, self.out, self.stats, log_hook, self.registry, self.scheduler)
        self.router = Router(config, self.out, self.clock, self.stats, log_hook, self.registry, self.scheduler)
        self.auth = AccessControl(config, self.out, self.clock, log_hook, access)
        self.route_times = RouteTimes(config.route_timeout)
        self.frame_counts = FrameCounts()
        self.connections: dict[int, Connection] = {}
        self.metrics = Metrics(config, self.stats, self.route_times, self.frame_counts, self.connections)
        # The calls that go across parts, wired once (each part declares what it calls).
        self.registry.subscriptions = self.subscriptions
        self.registry.queries = self.queries
        self.registry.access = self.auth
        self.subscriptions.queries = self.queries
        self.subscriptions.access = self.auth
        self.queries.subscriptions = self.subscriptions
        self.queries.access = self.auth
        self.router.subscriptions = self.subscriptions
        self.router.queries = self.queries
        self.router.access = self.auth
        self.router.route_times = self.route_times
        self.metrics.registry = self.registry
        self.metrics.subscriptions = self.subscriptions
        self.metrics.queries = self.queries
        self.metrics.scheduler = self.scheduler
        self.auth.subscriptions = self.subscriptions
        self.auth.queries = self.queries
        self.out.end_delivery = self.subscriptions.end_delivery
        self.auth.resume = self._resume_held
        # PROTOCOL.md 10.7, input side: unprocessed bytes of all connections, the
        # connections with an incomplete frame (and since when), and the connections
        # yet to send a first frame (by deadline: the same timeout for all).
        self.input_buffered = 0
        self.partial: dict[Connection, float] = {}
        # Bytes a transport holds for a connection before they are jet bytes (a WebSocket
        # frame under assembly): in input_buffered too (transport_holds).
        self.transport_held: dict[Connection, int] = {}
        # And TLS handshakes in progress, by the IO layer's key (handshake_holds).
        self.handshake_held: dict[object, int] = {}
        self._silent: deque[tuple[float, Connection]] = deque()
        self._log = log_hook
        self._log_events = log_hook is not None and config.log_events
        # JETLOG.md 6.5 (--log-on-error refuse): while the event log cannot be written,
        # the message every request is answered INTERNAL with; None: work as usual.
        self.refusing: Optional[str] = None
        self._next_conn_id = 1
        features = FEATURE_CONFLATION | FEATURE_QUERIES | FEATURE_LIMITS | FEATURE_DAEMON_STATES
        features |= FEATURE_AUTH_REQUIRED if access is not None else 0
        self.info_frame = encode(Info(config.name, config.max_body, features))
        # PROTOCOL.md 4.4.1: the same INFO with the limits extension, for peers that ask.
        route_timeout_ms = min(round(config.route_timeout * 1000), 0xFFFF_FFFF)
        self._limits_info_frame = encode(
            Info(config.name, config.max_body, features, max_key_length=config.max_key_length,
                 route_timeout_ms=route_timeout_ms)
        )
        self._shutdown_frame = close_frame(Status.OK, "shutting down")
        self._request_handlers: dict[int, Callable[[Connection, bytes, int, int, int], None]] = {
            # PROTOCOL.md 6: each function, and the part that answers it.
            Function.ADD_STATE.value: self.registry.add_state,
            Function.REMOVE_STATE.value: self.registry.remove_state,
            Function.SET_STATE.value: self.router.route_request,
            Function.NOTIFY_STATE.value: self.registry.notify,
            Function.CALL_METHOD.value: self.router.route_request,
            Function.ADD_METHOD.value: self.registry.add_method,
            Function.REMOVE_METHOD.value: self.registry.remove_method,
            Function.FETCH_STATES.value: self.subscriptions.fetch,
            Function.UNFETCH.value: self.subscriptions.unfetch,
            Function.GET_STATE.value: self.registry.get,
            Function.FETCH_QUERY.value: self.queries.fetch_query,
            Function.QUERY_ONCE.value: self.queries.query_once,
            Function.AUTHENTICATE.value: self.auth.authenticate,
        }

    @property
    def access(self) -> Optional[Access]:
        """The users file in use, or None when authentication is off."""
        return self.auth.access

    @property
    def now(self) -> float:
        """The time of the last call from the IO layer."""
        return self.clock.now

    # --- connection lifecycle ---------------------------------------------------------

    def connect(self, address: str, now: float, refuse: Optional[str] = None) -> Connection:
        """A peer connected: returns its Connection with INFO queued (PROTOCOL.md 10.1).

        Beyond ``max_connections``, or when the IO layer says ``refuse`` (a reason: it is
        out of file descriptors), the connection gets INFO then CLOSE LIMIT_EXCEEDED
        (PROTOCOL.md 10.7) and is marked closing.
        """
        self.clock.now = now
        conn = Connection(self._next_conn_id, address)
        self._next_conn_id += 1
        self.connections[conn.conn_id] = conn
        self.stats.connections += 1
        if self._log is not None:
            self._log(conn.conn_id, LogKind.CONN_OPEN, conn_open_data(address))
        self.out.send(conn, self.info_frame)
        if self.config.first_frame_timeout > 0:
            self._silent.append((now + self.config.first_frame_timeout, conn))
        self.auth.on_connect(conn)
        log.info("open %s", conn.label)
        if refuse is not None or len(self.connections) > self.config.max_connections:
            message = refuse or f"too many connections (max {self.config.max_connections})"
            self.out.close_with(conn, Status.LIMIT_EXCEEDED, message, close_frame(Status.LIMIT_EXCEEDED, message))
            self._finish_closes()
        return conn

    def disconnect(self, conn: Connection, now: float, reason: str = "peer disconnected") -> None:
        """The peer's connection is gone (EOF, reset, or we closed it)."""
        self.clock.now = now
        self.scheduler.begin(now)
        if not conn.closing:
            conn.closing = True
            conn.close_reason = reason
            self.out.to_close.append(conn)
        self._finish_closes()
        self.connections.pop(conn.conn_id, None)
        self.subscriptions.gone(conn)
        self.note_call(now)

    def note_call(self, now: float) -> None:
        """A call from the IO layer that began at ``now`` ends: the longest of the last
        second is ``longest_call_ms`` in ``$jet/daemon`` and /metrics (PROTOCOL.md 16.2,
        issue 29). One reading of the clock (none without one)."""
        clock = self.scheduler.clock
        if clock is not None:
            took = clock() - now
            metrics = self.metrics
            if took > metrics.call_max:
                metrics.call_max = took

    def end_of_input(self, conn: Connection, now: float) -> None:
        """The peer closed its sending side: it is gone (PROTOCOL.md 10.6) once the
        frames it sent are processed; a stalled connection goes when it catches up."""
        if (conn.stalled or conn.held) and not conn.closing:
            conn.at_eof = True  # held: PROTOCOL.md 15.2, its AUTHENTICATE is being answered
            return
        self.disconnect(conn, now, "peer closed its side")

    def shutdown(self, now: float) -> None:
        """PROTOCOL.md 10.9: CLOSE (OK, "shutting down") to every peer. A slow peer's
        locally queued output is dropped first (PROTOCOL.md 7.3): it would keep the
        CLOSE from it until the grace runs out."""
        self.clock.now = now
        for conn in list(self.connections.values()):
            if not conn.closing:
                if conn.paused:
                    self.out.drop_output(conn)
                self.subscriptions.end_delivery(conn)
                self.out.close_with(conn, Status.OK, "shutting down", self._shutdown_frame)
        self._finish_closes()

    def internal_error(self, conn: Connection, now: float, message: str = "internal error") -> None:
        """A bug surfaced while handling ``conn``'s bytes (or, JETLOG.md 6.5, its answers
        were lost with the event log): CLOSE (INTERNAL) it."""
        self.clock.now = now
        self._drop_input(conn)
        self.out.close_with(conn, Status.INTERNAL, message, close_frame(Status.INTERNAL, message))
        self._finish_closes()

    def protocol_error(self, conn: Connection, status: Status, message: str, now: float) -> None:
        """The IO layer found the peer breaking the protocol below the frames (a text
        message on a WebSocket, PROTOCOL.md 13.4): CLOSE (``status``) it."""
        self.clock.now = now
        self.out.fatal(conn, status, message)
        self._finish_closes()

    def take_dirty(self) -> list[Connection]:
        """Connections with output (or a close) to act on; clears the list. Their
        output is about to be written: their budget starts over, and a stalled one may
        go on in the next :meth:`work` (unless the write pauses its transport)."""
        dirty = self.out.take_dirty()
        scheduler = self.scheduler
        for conn in dirty:
            conn.out_size = 0
            if conn.stalled:
                scheduler.wake(conn)
        return dirty

    @property
    def has_work(self) -> bool:
        """True while :meth:`work` has something to do."""
        return (self.scheduler.has_work or self.router.expiring or bool(self.queries.stale) or bool(self.auth.reindex)
                or bool(self.auth.completed) or bool(self.registry.leaving))

    def work(self, now: float) -> list[Connection]:
        """One turn of the pending work: route timeouts beyond the last slice, the
        next slice of initial adds of each ready connection (then its held input),
        round-robin until the turn's time is up, then a slice of deferred window updates
        of sorted query fetches, one of the password checks that ended in their
        threads (their answers) and one of connections waiting for a reload's
        permissions. Returns the connections that caught up: the IO layer
        may read them again."""
        self.clock.now = now
        scheduler = self.scheduler
        scheduler.begin(now)
        if self.router.expiring:
            self.router.expire(now)
        ready = scheduler.take()
        resumed: list[Connection] = []
        budget = self.out.out_budget
        # One turn lasts about a slice (jetd.scheduler): the connections not reached go
        # first in the next turn, after the IO layer has served the sockets.
        turn_end = now + scheduler.slice_seconds
        served = False
        fanning = self.subscriptions.fanning
        for index, conn in enumerate(ready):
            if conn.closing or not conn.stalled:
                continue
            blocked = conn.paused or conn.out_size > budget
            if blocked and not (fanning and conn in fanning):
                continue  # a write, drained() or take_dirty() brings it back
            if served and scheduler.over(turn_end):
                scheduler.put_back(ready[index:])
                break
            served = True
            scheduler.restart()
            try:
                if blocked:
                    # Issue 29: the events it owes others do not wait for its own output;
                    # its input does (a write or drained() wakes it once the fan-out is done).
                    self.subscriptions.fan_on(conn)
                elif self._go_on(conn, now):
                    resumed.append(conn)
            except Exception:
                # As in the IO layer: a bug must cost one connection, never the daemon.
                log.exception("internal error on %s", conn.label)
                self.internal_error(conn, now)
        if self.queries.stale:
            # Window updates deferred by full slices (PROTOCOL.md 14.5): one slice a turn.
            scheduler.restart()
            self.queries.refresh_windows()
        if self.auth.completed:
            # Password checks that ended in their threads: their answers (PROTOCOL.md 15.2).
            scheduler.restart()
            self.auth.finish_checks(scheduler, now)
        if self.auth.reindex:
            # A reload's new permissions, a slice of connections a turn (PROTOCOL.md 15.5).
            scheduler.restart()
            self.auth.reindex_slice(scheduler)
        if self.registry.leaving:
            # Closed owners' states, a slice a turn (PROTOCOL.md 10.6).
            scheduler.restart()
            self.registry.leave_slice(scheduler.spend)
        self._finish_closes()
        self.note_call(now)
        return resumed

    def _go_on(self, conn: Connection, now: float) -> bool:
        """The next slice of ``conn``'s delivery, then its held input; True if it
        caught up (its input may be read again)."""
        fanning = self.subscriptions.fanning
        if fanning and conn in fanning and not self.subscriptions.fan_on(conn):
            return False  # issue 29: its NOTIFY_STATE's fan-out goes on first
        delivery = conn.delivery  # a local: the calls below change conn.delivery
        if delivery is not None:
            if delivery.for_query:
                self.queries.deliver(conn)
            else:
                self.subscriptions.deliver(conn)
            if conn.delivery is not None or conn.closing:
                return False
        conn.stalled = False
        if conn.rest:
            self.receive_data(conn, b"", now)
            if conn.closing or conn.stalled:
                return False
            if conn.rest or conn in self.transport_held:
                self.partial[conn] = now  # an incomplete frame: its clock starts now
        if conn.at_eof:
            self.disconnect(conn, now, "peer closed its side")
            return False
        return True

    # --- what the IO layer tells the parts ---------------------------------------------

    def pause(self, conn: Connection, transport_size: int) -> None:
        """The transport's buffer went above the soft limit (PROTOCOL.md 10.8): see
        :meth:`jetd.subscriptions.Subscriptions.pause`."""
        self.subscriptions.pause(conn, transport_size)

    def drained(self, conn: Connection) -> bool:
        """The transport drained: see :meth:`jetd.subscriptions.Subscriptions.drained`."""
        self.scheduler.restart()  # the catch-up's whole windows are sliced work (issue 29)
        live = self.subscriptions.drained(conn)
        self._finish_closes()
        return live

    def set_access(self, access: Access, now: float) -> None:
        """A newly loaded users file (SIGHUP, PROTOCOL.md 15.5): see
        :meth:`jetd.access.AccessControl.set_access`."""
        self.clock.now = now
        self.scheduler.begin(now)
        self.auth.set_access(access, list(self.connections.values()))
        self.auth.reindex_slice(self.scheduler)  # the rest in later turns (issue 29)
        self._finish_closes()
        log.info("users file %s loaded: %d users, %d groups", access.source, len(access.users.users),
                 len(access.users.groups))

    def authenticate_certificate(self, conn: Connection, user: str) -> None:
        """PROTOCOL.md 15.6: a verified client certificate names ``user`` (the IO layer
        calls this right after :meth:`connect`)."""
        self.auth.authenticate_certificate(conn, user)

    def _resume_held(self, conn: Connection, now: float) -> None:
        """Read on after an AUTHENTICATE was answered (PROTOCOL.md 15.2): the frames that
        arrived meanwhile, and the end of input, if the peer closed its side meanwhile."""
        if conn.rest and not conn.closing:
            self.receive_data(conn, b"", now)
        if conn in self.transport_held and not (conn.closing or conn.stalled or conn.held):
            self.partial.setdefault(conn, now)  # PROTOCOL.md 10.7: read again, so clocked again
        if conn.at_eof and not (conn.closing or conn.stalled or conn.held):
            self.disconnect(conn, now, "peer closed its side")

    def transport_holds(self, conn: Connection, held: int, now: float, clocked: bool = True) -> bool:
        """The IO layer holds ``held`` bytes of ``conn``'s input that are not jet bytes yet
        (a WebSocket frame under assembly, PROTOCOL.md 13.2; TLS records not yet
        decrypted, 15.6). They are charged to the same budget as an incomplete frame over
        TCP (PROTOCOL.md 10.7): they count against ``max_input_buffer``, and while there
        are any the ``frame_timeout`` clock runs (from when they began, unless the
        connection is stalled or held, or not ``clocked``: the IO layer is not reading
        it). Call it after each read with what is held then, 0 included.

        Returns False if ``conn`` is closing: already, or now because ``held`` would pass
        the budget (CLOSE LIMIT_EXCEEDED, as a TCP peer's input would)."""
        if conn.closing:
            return False
        transport_held = self.transport_held
        more = held - transport_held.get(conn, 0)
        if more > 0 and self.input_buffered + more > self.config.max_input_buffer:
            self._input_overflow(conn, more)
            self._finish_closes()
            return False
        self.input_buffered += more
        if held:
            transport_held[conn] = held
            if clocked and not (conn.stalled or conn.held or conn in self.partial):
                self.partial[conn] = now  # PROTOCOL.md 10.7: frame_timeout from its first bytes
        elif more:
            del transport_held[conn]
            if not conn.rest:
                self.partial.pop(conn, None)
        return True

    def handshake_holds(self, handshake: object, held: int) -> bool:
        """A TLS handshake in progress (PROTOCOL.md 15.6), not a connection yet, has sent
        ``held`` bytes in all. How many of them the SSL layer still holds cannot be
        asked, so all are charged to ``max_input_buffer`` until the handshake ends (the IO
        layer calls this with 0 then); its time limit is ``tls_handshake_timeout``.

        Returns False, charging nothing, if they would pass the budget: the IO layer
        closes the handshake (a close, never plaintext)."""
        charged = self.handshake_held.get(handshake, 0)
        more = held - charged
        if more > 0 and self.input_buffered + more > self.config.max_input_buffer:
            log.warning("input buffer full: a TLS handshake in progress would add %d bytes to %d: closed",
                        more, self.input_buffered)
            self.stats.input_overflows += 1
            self.input_buffered -= self.handshake_held.pop(handshake, 0)
            return False
        self.input_buffered += more
        if held:
            self.handshake_held[handshake] = held
        else:
            self.handshake_held.pop(handshake, None)
        return True

    def _drop_input(self, conn: Connection) -> None:
        self.input_buffered -= len(conn.rest) + self.transport_held.pop(conn, 0)
        conn.rest = bytearray()
        self.partial.pop(conn, None)

    # --- clock --------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Expire routes (PROTOCOL.md 10.3 route timeout) and slow consumers stuck past
        the deadline (PROTOCOL.md 10.8)."""
        self.clock.now = now
        self.scheduler.begin(now)
        self.router.expire(now)
        if self.partial:
            limit = self.config.frame_timeout
            for conn, since in list(self.partial.items()):
                if now - since > limit:
                    self._input_timeout(conn, f"frame not completed within {limit:g} s")
        silent = self._silent
        while silent and silent[0][0] <= now:
            conn = silent.popleft()[1]
            if not conn.closing and not conn.heard:
                self._input_timeout(conn, f"no frame within {self.config.first_frame_timeout:g} s of connecting")
        if self.auth.access is not None:
            self.auth.tick(now)
        deadline = self.config.slow_deadline
        for conn in self.subscriptions.stuck(now, deadline):
            if not conn.closing:
                self.stats.slow_closes += 1
            self.out.overload(conn, f"output stuck above the soft limit for more than {deadline:g} s")
        self.metrics.tick(now)  # PROTOCOL.md 16: $jet/, at most once a second
        self._finish_closes()
        self.note_call(now)

    def _input_timeout(self, conn: Connection, message: str) -> None:
        """PROTOCOL.md 10.7: a peer too slow to send a frame is closed TIMEOUT."""
        self.out.violation(conn, message)
        self._drop_input(conn)
        self.out.close_with(conn, Status.TIMEOUT, message, close_frame(Status.TIMEOUT, message))

    def _input_overflow(self, conn: Connection, more: int) -> None:
        """PROTOCOL.md 10.7: ``more`` unprocessed bytes would pass max_input_buffer."""
        limit = self.config.max_input_buffer
        message = f"input buffer limit reached ({limit} bytes unprocessed on all connections)"
        log.warning("input buffer full: %s would add %d bytes to %d", conn.label, more, self.input_buffered)
        self.stats.input_overflows += 1
        self.out.violation(conn, message)
        self._drop_input(conn)
        self.out.close_with(conn, Status.LIMIT_EXCEEDED, message, close_frame(Status.LIMIT_EXCEEDED, message))

    # --- receiving ----------------------------------------------------------------------

    def receive_data(self, conn: Connection, data: bytes, now: float) -> None:
        """Process the bytes a peer sent: every complete frame, in order (PROTOCOL.md 10.1).

        Stops early, keeping the rest, when the connection's output passes its budget
        or a fetch of it delivers initial adds in slices (PROTOCOL.md 10.5, 10.8): then
        ``conn.stalled`` is set and :meth:`work` goes on later."""
        self.clock.now = now
        reindex = self.auth.reindex
        if reindex and conn in reindex:
            self.auth.reindex_one(conn)  # PROTOCOL.md 15.5: its frames under the new permissions
            self._finish_closes()  # (its catch-up may have overflowed)
        if conn.closing:
            return
        self.stats.bytes_in += len(data)
        self.scheduler.begin(now, conn)  # its own window updates are not deferred
        rest = conn.rest
        had_rest = bool(rest)
        # PROTOCOL.md 15.2: while its AUTHENTICATE is being answered (``held``) a
        # connection's input waits like a stalled one's; jetd.access releases it.
        if had_rest or conn.stalled or conn.held:
            if data:
                if self.input_buffered + len(data) > self.config.max_input_buffer:
                    self._input_overflow(conn, len(data))
                    self._finish_closes()
                    return
                rest += data
                self.input_buffered += len(data)
                if conn.stalled or conn.held or len(rest) < conn.need:
                    return
            elif conn.stalled or conn.held or len(rest) < conn.need:
                return
            buf = bytes(rest)
            self.input_buffered -= len(rest)
            conn.rest = bytearray()
            had_rest = True
        else:
            buf = data
        n = len(buf)
        pos = self._frames(conn, buf, now) if self.refusing is None else self._refuse_frames(conn, buf)
        if pos < n and not conn.closing:
            # PROTOCOL.md 10.7: the rest (an incomplete frame, or input held back) counts
            # against max_input_buffer.
            left = n - pos
            if self.input_buffered + left > self.config.max_input_buffer:
                self._input_overflow(conn, left)
            else:
                conn.rest = bytearray(buf[pos:] if pos else buf)
                self.input_buffered += left
                if conn.stalled or conn.held:
                    self.partial.pop(conn, None)  # we stopped reading it: no clock
                else:
                    self.partial[conn] = now  # PROTOCOL.md 10.7: frame_timeout from now
        elif had_rest:
            self.partial.pop(conn, None)
        if self.out.to_close:
            self._finish_closes()
        self.note_call(now)

    # The frame loop, per frame in the order of PROTOCOL.md: the header (9.2: a bad type
    # or a body above max_body is fatal before any of the body is buffered); then the
    # three busiest frames, when they pass the fast check, are carried out right here: a
    # routed SET_STATE/CALL_METHOD (10.3), an owner's OK to it (10.3), an owner's
    # NOTIFY_STATE event with its fan-out (7.2, 10.5). Everything else, and anything the
    # fast check doubts, goes the careful way: _request, Router.response, _event, _info.
    #
    # The fast check is written once: a ``Key, Value`` payload (for an answer, a Value)
    # with a fixed-width or opaque value that ends the frame; a string value, whose UTF-8
    # must be checked, takes the careful way. These paths are inlined on purpose (a call
    # per frame costs what they save: BENCHMARKS.md); they read the parts' published
    # indexes and change a part's state only through its methods, the output queues
    # excepted (ARCHITECTURE.md).

    def _frames(self, conn: Connection, buf: bytes, now: float) -> int:
        """Cut ``buf`` into frames, hand each to its part (PROTOCOL.md 3, 10.1; see above); returns where the rest starts."""
        n, pos = len(buf), 0
        max_body = self.out.max_body
        logger = self._log
        states = self.registry.states
        methods = self.registry.methods
        subscriptions = self.subscriptions
        fetches = subscriptions.fetches
        # Read again after each careful frame (which may change them): the fetch index,
        # parking, deliveries; small_body_peers changes only with an INFO.
        fetch_lengths = fetches.lengths
        generation = fetches.generation
        targets_cache = fetches.cache
        dirty = self.out.dirty
        plain_fanout = not self._log_events
        inline_fanout = plain_fanout and not self.out.small_body_peers
        parked = subscriptions.parked
        delivering = subscriptions.delivering_count
        fan_chunk = DEFAULT_FAN_CHUNK  # more targets than this: a sliced fan-out (issue 29)
        # PROTOCOL.md 14: the query groups (a dict: its truth test is no call per frame).
        query_groups = self.queries.index.by_signature
        # Connections with window updates waiting (issue 29): their answers go the careful
        # way, after those updates (Router.response). A dict mutated in place: no call.
        stale_windows = self.queries.stale
        fast_route = logger is None  # logged (ROUTE, FRAME_OUT records): the careful way
        open_route = self.router.table.open
        max_pending = self.config.max_pending_per_owner
        writable = conn.writable  # PROTOCOL.md 15.3: the keys it may write; None: all
        native = NATIVE  # compiled, integers are read byte by byte (native loads); interpreted, by struct
        frames = routed = fanned = routed_sets = 0  # routed_sets: issue 33, frames in by function
        # Issue 33: the fast OKs' latency, observed once per run of OKs with one deadline
        # (a pipelined batch's): interpreted, a call per OK cost routed SET 10% (issue 28).
        route_times, ok_deadline, ok_run = self.route_times, 0.0, 0
        while n - pos >= 5:
            # --- the header (PROTOCOL.md 3, 9.2) ------------------------------------------
            if native:
                ftype = buf[pos]
                length = buf[pos + 1] << 24 | buf[pos + 2] << 16 | buf[pos + 3] << 8 | buf[pos + 4]
            else:
                ftype, length = HDR_FROM(buf, pos)
            if not 1 <= ftype <= 4 or length > max_body:
                self._bad_header(conn, buf, pos, ftype, length)
                break
            end = pos + 5 + length
            if end > n:
                conn.need = 5 + length
                break
            if logger is not None:
                self._log_frame_in(conn, buf, pos, end)
            frames += 1
            # --- the fast check: where the payload starts, and whether it is plain ----------
            fast = 0  # the frame's type while it may take a fast path, else 0: the careful way
            if ftype == EVENT:
                if length >= 8 and buf[pos + 5] == 4:  # EV_NOTIFY_STATE
                    kend = pos + 8 + (buf[pos + 6] << 8 | buf[pos + 7])
                    if kend > pos + 8 and kend + 5 <= end:
                        vat, fast = kend, EVENT  # vat: where the value starts
            elif ftype == REQUEST:
                function = buf[pos + 9] if fast_route and length >= 12 else 0
                if function in (SET_STATE, CALL_METHOD):
                    kend = pos + 12 + (buf[pos + 10] << 8 | buf[pos + 11])
                    if kend > pos + 12 and kend + 5 <= end:
                        vat, fast = kend, REQUEST
            elif ftype == RESPONSE and fast_route and length >= 15 and buf[pos + 9] == 0:
                vat, fast = pos + 10, RESPONSE
            if fast:
                if native:
                    vtype = buf[vat]
                    vn = buf[vat + 1] << 24 | buf[vat + 2] << 16 | buf[vat + 3] << 8 | buf[vat + 4]
                else:
                    vtype, vn = VHEAD_FROM(buf, vat)
                check = VTYPE_CHECK[vtype]
                if not (vat + 5 + vn == end and (check == OPAQUE or (vn == check and (vtype != 1 or buf[vat + 5] < 2)))):
                    fast = 0
            if fast == EVENT:  # --- the fast paths ------------------------------
                # PROTOCOL.md 7.2, 10.5: the owner's NOTIFY_STATE event, the busiest frame
                # of all: the cached value, then a FETCH_CHANGE to every matching fetch.
                key = buf[pos + 8 : kend]
                if states.get(key) is conn and length + 4 <= max_body:
                    kv = conn.states[key] = buf[pos + 6 : end]
                    if parked:
                        subscriptions.note_change(key)  # PROTOCOL.md 10.8: held for parked fetches
                    if delivering:
                        subscriptions.hold(key, FETCH_CHANGE, kv)  # PROTOCOL.md 10.5
                    if fetch_lengths:
                        cached = targets_cache.get(key)
                        if cached is not None and cached[0] == generation:
                            targets = cached[1]
                        else:
                            targets = fetches.targets(key)
                        if not targets:
                            pass
                        elif inline_fanout and (count := len(targets)) <= fan_chunk:
                            # Subscriptions.fanout inlined: head + fetch id + kv per fetcher
                            # (live fetches only: a paused peer's are parked).
                            size = len(kv)
                            if size < CHANGE_HEADS_BELOW:
                                head = CHANGE_HEADS[size]
                            else:
                                head = EVT_HEAD_PACK(EVENT, 5 + size, FETCH_CHANGE)
                            if native:
                                # Compiled, a native call per change costs nothing next to
                                # the loop; interpreted, a call costs a tenth of a change.
                                subscriptions.fan_change(targets, head, kv)
                            else:
                                for fetch in targets:
                                    out = fetch.conn.out
                                    if not out:
                                        dirty.append(fetch.conn)
                                    out.append(head)
                                    out.append(fetch.fid_bytes)
                                    out.append(kv)
                            fanned += count
                        else:  # the careful way; many targets: sliced, conn may stall (issue 29)
                            subscriptions.fan_live(key, FETCH_CHANGE, kv, targets, conn)
                    if query_groups:
                        self.queries.state_changed(key, FETCH_CHANGE, kv)
                    pos = end
                    if conn.closing or conn.stalled:  # its own fetch overflowed; the fan-out waits
                        conn.need = 5
                        break
                    continue
            elif fast == REQUEST:
                # PROTOCOL.md 10.3: routed to a live owner with room for it, under our own id.
                key = buf[pos + 12 : kend]
                owner = (states if function == SET_STATE else methods).get(key)
                if (
                    owner is not None
                    and (writable is None or key in writable)
                    and not owner.paused
                    and not owner.closed
                    and len(owner.routes) < max_pending
                    and length <= owner.max_body
                ):
                    rid = (buf[pos + 5] << 24 | buf[pos + 6] << 16 | buf[pos + 7] << 8 | buf[pos + 8]
                           if native else U32_FROM(buf, pos + 5)[0])
                    route = open_route(conn, rid, owner, function, key, now)
                    routed += 1
                    routed_sets += function == SET_STATE
                    out = owner.out
                    if not out:
                        dirty.append(owner)
                    out.append(ID_HEAD_PACK(REQUEST, length, route.oid))
                    out.append(buf[pos + 9 : end])
                    pos = end
                    continue
            elif fast:
                # PROTOCOL.md 10.3: an owner's OK goes back to a live requester under its id.
                oid = (buf[pos + 5] << 24 | buf[pos + 6] << 16 | buf[pos + 7] << 8 | buf[pos + 8]
                       if native else U32_FROM(buf, pos + 5)[0])
                answered = conn.routes.get(oid)
                if answered is not None:
                    requester = answered.requester
                    if (not requester.paused and not requester.closed and length <= requester.max_body
                            and not (stale_windows and requester in stale_windows)):
                        del conn.routes[oid]
                        answered.done = True
                        if answered.deadline != ok_deadline:
                            route_times.observe_ok(now - ok_deadline, ok_run)
                            ok_deadline, ok_run = answered.deadline, 0
                        ok_run += 1
                        out = requester.out
                        if not out:
                            dirty.append(requester)
                        out.append(ID_HEAD_PACK(RESPONSE, length, answered.rid))
                        out.append(buf[pos + 9 : end])
                        pos = end
                        continue
            # --- the careful way -------------------------------------------------------------
            if ftype == REQUEST:
                self._request(conn, buf, pos, end)
            elif ftype == RESPONSE:
                self.router.response(conn, buf, pos, end)
            elif ftype == EVENT:
                self._event(conn, buf, pos, end)
            else:
                self._info(conn, buf, pos, end)
                inline_fanout = plain_fanout and not self.out.small_body_peers
            parked = subscriptions.parked
            delivering = subscriptions.delivering_count
            fetch_lengths = fetches.lengths
            generation = fetches.generation
            writable = conn.writable  # AUTHENTICATE may have changed it
            pos = end
            if conn.closing or conn.stalled or conn.held:
                # PROTOCOL.md 10.8: output past the budget (or paused, or a delivery under
                # way): the rest of its input waits; 15.2: so it does while held.
                conn.stalled = conn.stalled and not conn.closing
                conn.need = 5
                break
            if self.scheduler.spent():  # issue 29: the slice is over
                self._next_turn(conn)
                break
        else:
            conn.need = 5
        self._count_frames(conn, frames, fanned, routed, routed_sets, now - ok_deadline, ok_run)
        return pos

    def _count_frames(self, conn: Connection, frames: int, fanned: int, routed: int, routed_sets: int,
                      since_deadline: float, ok_run: int) -> None:
        """What one call of :meth:`_frames` did, counted once for the call (issue 33: the
        fast paths' frames by function, and the last run of OKs' latency)."""
        self.stats.frames_in += frames
        self.stats.fanout_events += fanned
        self.stats.routed += routed
        if routed:
            self.frame_counts.count_fast_routed(routed_sets, routed - routed_sets)
        if ok_run:
            self.route_times.observe_ok(since_deadline, ok_run)
        if frames:
            conn.heard = True

    def _next_turn(self, conn: Connection) -> None:
        """Issue 29: the slice is over after one of ``conn``'s frames (each careful frame
        counts as an item, and work that grows, such as a sorted window's rows, counts
        its items): the rest of its input waits for its next turn of :meth:`work`, and
        other peers are served in between."""
        conn.stalled = True
        conn.need = 5
        if not conn.out and not conn.paused:
            self.scheduler.wake(conn)  # else take_dirty() wakes it once its output is written

    def _refuse_frames(self, conn: Connection, buf: bytes) -> int:
        """JETLOG.md 6.5, while ``refusing``: every REQUEST is answered INTERNAL and
        nothing is carried out (events and answers are dropped: a routed request whose
        answer is dropped gets TIMEOUT); an INFO is taken as usual (it changes nothing
        but the connection). Returns where the unprocessed rest starts."""
        n = len(buf)
        pos = 0
        message = self.refusing or ""
        while n - pos >= 5:
            ftype, length = HDR_FROM(buf, pos)
            if not 1 <= ftype <= 4 or length > self.out.max_body:
                self._bad_header(conn, buf, pos, ftype, length)
                break
            end = pos + 5 + length
            if end > n:
                conn.need = 5 + length
                break
            self._log_frame_in(conn, buf, pos, end)
            if ftype == REQUEST:
                if length < 4:
                    self.out.fatal(conn, Status.MALFORMED, f"REQUEST body of {length} bytes has no readable id")
                    break
                self.out.reply(conn, U32_FROM(buf, pos + 5)[0], Status.INTERNAL, message)
            elif ftype == INFO:
                self._info(conn, buf, pos, end)
            pos = end
            if conn.closing:
                break
        else:
            conn.need = 5
        return pos

    def _finish_closes(self) -> None:
        """Tear down the connections closed since the last call (after the frame that
        closed them: PROTOCOL.md 10.6)."""
        to_close = self.out.to_close
        while to_close:
            conn = to_close.pop()
            if not conn.closed:
                self._teardown(conn)

    def _teardown(self, conn: Connection) -> None:
        """PROTOCOL.md 10.6, in this order: pending routes answered OWNER_GONE, states
        removed (FETCH_REMOVE, byte order of key), methods removed, fetches ended;
        answers owed to it are dropped later because it is ``closed``."""
        # Nothing may follow the CLOSE frame (PROTOCOL.md 7.3).
        if conn.close_at >= 0:
            if conn.paused:
                while len(conn.pending) > conn.close_at:
                    conn.pending_size -= len(conn.pending.pop())
            else:
                del conn.out[conn.close_at :]
        conn.closed = True
        self._drop_input(conn)
        self.subscriptions.end_delivery(conn)
        conn.stalled = False
        # It no longer counts against max_connections, even while the IO layer lingers
        # on its socket (jetd.server.PeerProtocol.hang_up).
        self.connections.pop(conn.conn_id, None)
        self.out.forget_peer(conn)
        self.stats.auth_failures_gone += conn.auth_failures
        self.router.drop_owner(conn)
        # Its own fetches go first (nobody else can tell): nothing, not even the
        # FETCH_REMOVE of its own states, may follow its CLOSE.
        self.subscriptions.drop_fetches(conn)
        self.queries.teardown(conn)
        # Its states: a slice now, the rest in the next turns of work() (issue 29).
        self.registry.drop_owner(conn, self.scheduler.spend)
        # The IO layer closes the transport after the flush; being listed twice is harmless
        # (and cheaper than searching the list when thousands of peers go at once).
        self.out.dirty.append(conn)
        if self._log is not None:
            self._log(conn.conn_id, LogKind.CONN_CLOSE, conn_close_data(conn.close_status, conn.close_reason))
        log.info(
            "close %s: %s%s",
            conn.label,
            conn.close_reason or "closed",
            f" ({conn.violations} violations)" if conn.violations > 10 else "",
        )

    # --- frames -------------------------------------------------------------------------

    def _bad_header(self, conn: Connection, buf: bytes, pos: int, ftype: int, length: int) -> None:
        """PROTOCOL.md 9.2: an unknown frame type, or a body above max_body, is fatal."""
        if self._log is not None:
            self._log(conn.conn_id, FRAME_IN, buf[pos : pos + 5])
        if ftype < 1 or ftype > 4:
            self.out.fatal(conn, Status.MALFORMED, f"unknown frame type 0x{ftype:02X}")
        else:
            self.out.fatal(conn, Status.TOO_LARGE, f"body of {length} bytes exceeds max_body {self.out.max_body}")

    def _log_frame_in(self, conn: Connection, buf: bytes, pos: int, end: int) -> None:
        """JETLOG.md 4: FRAME_IN; an AUTHENTICATE is recorded when it is answered, without
        its password (jetd.access)."""
        if self._log is not None and not (buf[pos] == REQUEST and end - pos >= 10 and buf[pos + 9] == AUTHENTICATE):
            self._log(conn.conn_id, FRAME_IN, buf[pos:end])

    def _request(self, conn: Connection, buf: bytes, pos: int, end: int) -> None:
        if end - pos < 9:
            # PROTOCOL.md 9.1: no readable id -> CLOSE.
            self.out.fatal(conn, Status.MALFORMED, f"REQUEST body of {end - pos - 5} bytes has no readable id")
            return
        if end - pos < 10:
            rid = U32_FROM(buf, pos + 5)[0]
            self.out.violation(conn, "REQUEST without function")
            self.out.reply(conn, rid, Status.MALFORMED, "REQUEST body is shorter than id and function")
            return
        rid, function = ID_BYTE_FROM(buf, pos + 5)
        self.frame_counts.requests[function] += 1
        perms = conn.perms
        if perms is not None and perms.nothing and function != AUTHENTICATE:
            # PROTOCOL.md 15.2: without any permission only AUTHENTICATE is answered.
            if conn.user is None:
                message = "authentication required"
            else:
                message = f"not authorized: user {conn.user} has no permissions"
            self.out.reply(conn, rid, Status.NOT_AUTHORIZED, message)
            return
        handler = self._request_handlers.get(function)
        if handler is None:
            self.out.violation(conn, f"unknown function 0x{function:02X}")
            self.out.reply(conn, rid, Status.UNKNOWN_FUNCTION, f"unknown function 0x{function:02X}")
            return
        handler(conn, buf, pos, end, rid)


    def _event(self, conn: Connection, buf: bytes, pos: int, end: int) -> None:
        """PROTOCOL.md 7.1, 9.3: fire-and-forget requests and CLOSE; anything bad closes."""
        if end - pos < 6:
            return self.out.fatal(conn, Status.MALFORMED, "EVENT body is empty")
        code = buf[pos + 5]
        self.frame_counts.events[code] += 1
        if code in (3, 4, 5):
            kend = key_value_end(buf, pos + 6, end)
            if kend < 0:
                status, message = why_malformed(EVENT, buf[pos + 5 : end])
                return self.out.fatal(conn, status, message)
            key = buf[pos + 8 : kend]
            if code == EV_NOTIFY_STATE:
                state_owner = self.registry.state_owner(key)
                if state_owner is not conn:
                    reason = self.registry.unknown_key(conn, key, None, "state") if state_owner is None else "not the owner"
                    return self._drop_event(conn, code, key, reason)
                # PROTOCOL.md 6.4: its FETCH_CHANGE may be up to 4 bytes above our
                # max_body; Subscriptions.fanout closes only the fetchers that announced less.
                kv = conn.states[key] = buf[pos + 6 : end]
                self.subscriptions.fanout(key, FETCH_CHANGE, kv, conn)  # may stall conn (issue 29)
                return None
            if conn.writable is not None and not self.auth.may_write(conn, key):
                # PROTOCOL.md 15.3: dropped and logged, like any event not carried out.
                return self._drop_event(conn, code, key, f"not authorized: write (user {conn.user or 'anonymous'})")
            registry = self.registry
            owner = registry.state_owner(key) if code == EV_SET_STATE else registry.method_owner(key)
            if owner is self.metrics.owner:  # PROTOCOL.md 16: the daemon's own states are read-only
                return self._drop_event(conn, code, key, "reserved for the daemon's own states")
            if owner is None:
                reason = registry.unknown_key(conn, key, None, "state" if code == 3 else "method")
                return self._drop_event(conn, code, key, reason)
            if self.out.too_large_for(owner, end - pos - 5):
                return self._drop_event(conn, code, key, f"the owner accepts at most {owner.max_body} bytes")
            # PROTOCOL.md 7.1: forwarded as the very same EVENT frame.
            self.out.send(owner, buf[pos:end])
            return None
        if code == EV_CLOSE:
            if end - pos < 7 or buf[pos + 6] not in KNOWN_STATUSES or not str16_ok(buf, pos + 7, end):
                return self.out.fatal(conn, Status.MALFORMED, "malformed CLOSE")
            # PROTOCOL.md 7.3: treated like a disconnect; nothing is sent back.
            conn.closing = True
            conn.close_reason = "peer sent CLOSE"
            conn.close_at = len(conn.pending) if conn.paused else len(conn.out)
            self.out.to_close.append(conn)
            return None
        if code in DAEMON_EVENTS:
            return self.out.fatal(conn, Status.MALFORMED, "fetch events may not be sent to the daemon")
        return self.out.fatal(conn, Status.UNKNOWN_FUNCTION, f"unknown event code 0x{code:02X}")

    def _drop_event(self, conn: Connection, code: int, key: bytes, reason: Optional[str]) -> None:
        """PROTOCOL.md 7.1: a fire-and-forget request that cannot be carried out is dropped."""
        if reason == "key is not valid UTF-8":
            return self.out.fatal(conn, Status.MALFORMED, "event key is not valid UTF-8")
        self.out.violation(conn, f"dropped {EventCode(code).name} event for {key!r}: {reason}")
        return None

    def _info(self, conn: Connection, buf: bytes, pos: int, end: int) -> None:
        """PROTOCOL.md 4.4, 9.2: a peer names itself; a bad INFO is fatal."""
        self.frame_counts.infos += 1
        try:
            info = decode_body(INFO, buf[pos + 5 : end])
        except RemoteProtocolError as exc:
            return self.out.fatal(conn, Status.MALFORMED, f"malformed INFO: {exc.message}")
        assert isinstance(info, Info)
        if info.major != PROTOCOL_MAJOR:
            return self.out.fatal(conn, Status.MALFORMED, f"unsupported protocol major version {info.major}")
        if info.max_body < MIN_PEER_MAX_BODY:
            return self.out.fatal(
                conn, Status.MALFORMED, f"max_body {info.max_body} is below {MIN_PEER_MAX_BODY}: no answer fits"
            )
        conn.name = info.name
        self.out.set_peer_max_body(conn, info.max_body)
        if self._log is not None:
            self._log(conn.conn_id, LogKind.CONN_NAME, conn_name_data(info.name))
        log.debug("name %s", conn.label)
        if info.features & FEATURE_LIMITS:
            self.out.send(conn, self._limits_info_frame)
        return None
