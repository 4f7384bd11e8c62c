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

Each responsibility lives in its own module, mixed into :class:`Daemon`:

- :mod:`jetd.registry`: states and methods, who owns them, the cached values;
- :mod:`jetd.routes`: routed SET_STATE/CALL_METHOD, owners' answers, route timeouts;
- :mod:`jetd.subscriptions`: fetches, fan-out, slow consumers (parking);
- :mod:`jetd.access`: users, permissions and authentication (PROTOCOL.md 15);
- :mod:`jetd.base`: the shared state, output queues and closing;
- :mod:`jetd.frames`: the frame layouts and quick checks of the hot paths.

This module keeps the connection life cycle and :meth:`Daemon.receive_data`, which cuts
frames and dispatches them. Its hot paths work on the received bytes directly: a routed
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

from jetwire import (
    FEATURE_AUTH_REQUIRED,
    FEATURE_CONFLATION,
    FEATURE_LIMITS,
    FEATURE_QUERIES,
    PROTOCOL_MAJOR,
    EventCode,
    Function,
    Info,
    RemoteProtocolError,
    Status,
    decode_body,
    encode,
)
from jetwire.codec import NATIVE
from jetwire.codes import MIN_PEER_MAX_BODY
from jetwire.log import LogKind, conn_close_data, conn_name_data, conn_open_data

from .access import AUTHENTICATE, Access, AccessControl, Offload
from .base import DaemonStats, Output
from .config import Config
from .connection import Connection
from .frames import (
    CALL_METHOD,
    CHANGE_HEADS,
    CHANGE_HEADS_BELOW,
    DAEMON_EVENTS,
    EV_CLOSE,
    EV_NOTIFY_STATE,
    EV_SET_STATE,
    EVENT,
    EVT_HEAD_PACK,
    FETCH_CHANGE,
    FETCH_REMOVE,
    FRAME_IN,
    HDR_FROM,
    ID_BYTE_FROM,
    ID_HEAD_PACK,
    INFO,
    KNOWN_STATUSES,
    OPAQUE,
    REQUEST,
    RESPONSE,
    SET_STATE,
    U32_FROM,
    VHEAD_FROM,
    VTYPE_CHECK,
    LogHook,
    close_frame,
    key_value_end,
    str16_ok,
    why_malformed,
)
from .query import QueryIndex
from .registry import StateRegistry
from .routes import Route, RouteTable
from .subscriptions import Delivery, Fetch, FetchRegistry

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


class Daemon(AccessControl):
    """The registry and router. Feed it bytes per connection; it fills output queues.

    Args:
        config: limits and policies (:class:`jetd.config.Config`).
        log_hook: called as ``hook(conn_id, kind, data)`` for every event-log record
            (JETLOG.md 4), or None when no event log is kept.
        access: the loaded users file when authentication is on (PROTOCOL.md 15), else
            None: then nothing is checked.

    Attributes:
        offload: set by the IO layer to run password checks off the loop (see
            :data:`jetd.access.Offload`); None runs them inline.
    """

    def __init__(self, config: Config, log_hook: Optional[LogHook] = None, access: Optional[Access] = None) -> None:
        self.config = config
        self.stats = DaemonStats()
        self.out = Output(config, self.stats, log_hook)
        self.out.end_delivery = self._end_delivery
        self.access = access
        self.offload: Optional[Offload] = None
        self._auth_answers: deque[tuple[float, Connection, int, bytes]] = deque()  # delayed AUTH_FAILED
        self._auth_deadlines: deque[tuple[float, Connection]] = deque()  # auth timeout, in connect order
        self.registry = StateRegistry()
        self.fetches = FetchRegistry()
        # PROTOCOL.md 10.8: the fetches of paused connections, for their ADD/REMOVE events.
        self.parked_fetches = FetchRegistry()
        self.queries = QueryIndex()  # PROTOCOL.md 14 (jetd.querying)
        self.nodes = None
        self._parked = 0  # how many fetches are parked
        # While any is parked: key -> sequence number of its last change (self._seq).
        self._changed: dict[bytes, int] = {}
        self._seq = 0
        # PROTOCOL.md 10.5: new fetches whose initial adds are under way (Delivery).
        self.delivering = FetchRegistry()
        self._delivering = 0
        # Stalled connections that may go on (Daemon.work): a delivery, or held input.
        self.ready: list[Connection] = []
        self._expiring = False  # more route timeouts are due than one slice answers
        # PROTOCOL.md 10.7, input side: unprocessed bytes of all connections, the
        # connections with an incomplete frame (and since when), and the connections
        # yet to send a first frame (by deadline: the same timeout for all).
        self.input_buffered = 0
        self.partial: dict[Connection, float] = {}
        self._silent: deque[tuple[float, Connection]] = deque()
        self.routes = RouteTable(config.route_timeout)
        self.connections: dict[int, Connection] = {}
        self.slow: set[Connection] = set()
        self.now = 0.0
        self._log = log_hook
        self._log_events = log_hook is not None and config.log_events
        self._next_conn_id = 1
        self._next_fetch_id = 1  # PROTOCOL.md 10.5: jetd counts from 1, never reuses
        self._max_key = config.max_key_length
        features = FEATURE_CONFLATION | FEATURE_QUERIES | FEATURE_LIMITS
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
            Function.ADD_STATE.value: self._add_state,
            Function.REMOVE_STATE.value: self._remove_state,
            Function.SET_STATE.value: self._route_request,
            Function.NOTIFY_STATE.value: self._notify,
            Function.CALL_METHOD.value: self._route_request,
            Function.ADD_METHOD.value: self._add_method,
            Function.REMOVE_METHOD.value: self._remove_method,
            Function.FETCH_STATES.value: self._fetch,
            Function.UNFETCH.value: self._unfetch,
            Function.GET_STATE.value: self._get,
            Function.FETCH_QUERY.value: self._fetch_query,
            Function.QUERY_ONCE.value: self._query_once,
            Function.AUTHENTICATE.value: self._authenticate,
        }

    # --- connection lifecycle ---------------------------------------------------------

    def connect(self, address: str, now: float, refuse: Optional[str] = None) -> Connection:
        """A peer connected: returns its Connection with INFO queued (PROTOCOL.md 10.1).

        Beyond ``max_connections``, or when the IO layer says ``refuse`` (a reason: it is
        out of file descriptors), the connection gets INFO then CLOSE LIMIT_EXCEEDED
        (PROTOCOL.md 10.7) and is marked closing.
        """
        self.now = now
        conn = Connection(self._next_conn_id, address)
        self._next_conn_id += 1
        self.connections[conn.conn_id] = conn
        self.stats.connections += 1
        if self._log is not None:
            self._log(conn.conn_id, LogKind.CONN_OPEN, conn_open_data(address))
        self.out.send(conn, self.info_frame)
        if self.config.first_frame_timeout > 0:
            self._silent.append((now + self.config.first_frame_timeout, conn))
        self._access_on_connect(conn)
        log.info("open %s", conn.label)
        if refuse is not None or len(self.connections) > self.config.max_connections:
            message = refuse or f"too many connections (max {self.config.max_connections})"
            self.out.close_with(conn, Status.LIMIT_EXCEEDED, message, close_frame(Status.LIMIT_EXCEEDED, message))
            self._finish_closes()
        return conn

    def disconnect(self, conn: Connection, now: float, reason: str = "peer disconnected") -> None:
        """The peer's connection is gone (EOF, reset, or we closed it)."""
        self.now = now
        if not conn.closing:
            conn.closing = True
            conn.close_reason = reason
            self.out.to_close.append(conn)
        self._finish_closes()
        self.connections.pop(conn.conn_id, None)
        self.slow.discard(conn)

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
        self.now = now
        for conn in list(self.connections.values()):
            if not conn.closing:
                if conn.paused:
                    self.out.drop_output(conn)
                self._end_delivery(conn)
                self.out.close_with(conn, Status.OK, "shutting down", self._shutdown_frame)
        self._finish_closes()

    def internal_error(self, conn: Connection, now: float) -> None:
        """A bug surfaced while handling ``conn``'s bytes: CLOSE (INTERNAL) it."""
        self.now = now
        self._drop_input(conn)
        self.out.close_with(conn, Status.INTERNAL, "internal error", close_frame(Status.INTERNAL, "internal error"))
        self._finish_closes()

    def protocol_error(self, conn: Connection, status: Status, message: str, now: float) -> None:
        """The IO layer found the peer breaking the protocol below the frames (a text
        message on a WebSocket, PROTOCOL.md 13.4): CLOSE (``status``) it."""
        self.now = now
        self.out.fatal(conn, status, message)
        self._finish_closes()

    def take_dirty(self) -> list[Connection]:
        """Connections with output (or a close) to act on; clears the list. Their
        output is about to be written: their budget starts over, and a stalled one may
        go on in the next :meth:`work` (unless the write pauses its transport)."""
        dirty = self.out.take_dirty()
        ready = self.ready
        for conn in dirty:
            conn.out_size = 0
            if conn.stalled:
                ready.append(conn)
        return dirty

    @property
    def has_work(self) -> bool:
        """True while :meth:`work` has something to do."""
        return bool(self.ready) or self._expiring

    def work(self, now: float) -> list[Connection]:
        """One slice of the pending work: route timeouts beyond the last slice, the
        next slice of initial adds of each ready connection, then its held input.
        Returns the connections that caught up: the IO layer may read them again."""
        self.now = now
        if self._expiring:
            self._expire_routes(now)
        ready = self.ready
        self.ready = []
        resumed: list[Connection] = []
        budget = self.out.out_budget
        for conn in ready:
            if conn.closing or not conn.stalled or conn.paused or conn.out_size > budget:
                continue  # a write, drained() or take_dirty() brings it back
            try:
                if self._go_on(conn, now):
                    resumed.append(conn)
            except Exception:
                # As in the IO layer: a bug must cost one connection, never the daemon.
                log.exception("internal error on %s", conn.label)
                self.internal_error(conn, now)
        self._finish_closes()
        return resumed

    def _go_on(self, conn: Connection, now: float) -> bool:
        """The next slice of ``conn``'s delivery, then its held input; True if it
        caught up (its input may be read again)."""
        delivery = conn.delivery  # a local: the calls below change conn.delivery
        if delivery is not None:
            if delivery.for_query:
                self._query_deliver(conn)
            else:
                self._deliver(conn)
            if conn.delivery is not None or conn.closing:
                return False
        conn.stalled = False
        if conn.rest:
            self.receive_data(conn, b"", now)
            if conn.closing or conn.stalled:
                return False
            if conn.rest:
                self.partial[conn] = now  # an incomplete frame: its clock starts now
        if conn.at_eof:
            self.disconnect(conn, now, "peer closed its side")
            return False
        return True

    def _drop_input(self, conn: Connection) -> None:
        self.input_buffered -= len(conn.rest)
        conn.rest = bytearray()
        self.partial.pop(conn, None)

    # --- clock --------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Expire routes (PROTOCOL.md 10.3 route timeout) and slow consumers stuck past
        the deadline (PROTOCOL.md 10.8)."""
        self.now = now
        self._expire_routes(now)
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
        if self.access is not None:
            self._tick_access(now)
        deadline = self.config.slow_deadline
        for conn in list(self.slow):
            if conn.slow_since is not None and now - conn.slow_since > deadline:
                self.out.overload(conn, f"output stuck above the soft limit for more than {deadline:g} s")
        self._finish_closes()

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
        self.out.violation(conn, message)
        self._drop_input(conn)
        self.out.close_with(conn, Status.LIMIT_EXCEEDED, message, close_frame(Status.LIMIT_EXCEEDED, message))

    # --- receiving ----------------------------------------------------------------------

    def receive_data(self, conn: Connection, data: bytes, now: float) -> None:
        """Process the bytes a peer sent: every complete frame, in order (PROTOCOL.md 10.1).

        Stops early, keeping the rest, when the connection's output passes its budget
        or a fetch of it delivers initial adds in slices (PROTOCOL.md 10.5, 10.8): then
        ``conn.stalled`` is set and :meth:`work` goes on later."""
        if conn.closing:
            return
        self.now = now
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
        pos = 0
        max_body = self.out.max_body
        logger = self._log
        states = self.registry.states
        methods = self.registry.methods
        fetches = self.fetches
        # The fetch index changes only in other frames' slow paths: read again after each.
        fetch_lengths = fetches.lengths
        generation = fetches.generation
        targets_cache = fetches.cache
        dirty = self.out.dirty
        plain_fanout = not self._log_events
        # Only an INFO changes _small_body_peers while frames are read (closes are
        # torn down after the loop), so it is refreshed after each INFO.
        inline_fanout = plain_fanout and not self.out.small_body_peers
        # Fetches are parked or unparked only by the IO layer and by other frames' slow
        # paths, so this is read again after each of those.
        parked = self._parked
        changed = self._changed
        delivering = self._delivering  # read again where parked is
        # PROTOCOL.md 14: query groups, if any, see every change (a plain dict: its truth
        # test costs nothing, where QueryIndex.__bool__ would be a call per frame).
        query_groups = self.queries.by_signature
        # Routed SET_STATE and CALL_METHOD requests and their OK answers also have fast paths below; the
        # event log (ROUTE and FRAME_OUT records) takes the careful ones.
        fast_route = logger is None
        open_route = self.routes.open
        max_pending = self.config.max_pending_per_owner
        # PROTOCOL.md 15.3: the keys this connection may write (jetd.access); None: all.
        writable = conn.writable
        # Compiled, integers are read byte by byte (native loads); interpreted, the 4-byte
        # ones by struct (cheaper there). Both forms stand side by side: jetwire.codec.NATIVE.
        native = NATIVE
        frames = 0
        routed = 0
        fanned = 0
        while n - pos >= 5:
            if native:
                ftype = buf[pos]
                length = buf[pos + 1] << 24 | buf[pos + 2] << 16 | buf[pos + 3] << 8 | buf[pos + 4]
            else:
                ftype, length = HDR_FROM(buf, pos)
            if not 1 <= ftype <= 4 or length > max_body:
                # PROTOCOL.md 9.2: checked before buffering any of the body.
                if logger is not None:
                    logger(conn.conn_id, FRAME_IN, buf[pos : pos + 5])
                if ftype < 1 or ftype > 4:
                    self.out.fatal(conn, Status.MALFORMED, f"unknown frame type 0x{ftype:02X}")
                else:
                    self.out.fatal(conn, Status.TOO_LARGE, f"body of {length} bytes exceeds max_body {max_body}")
                break
            end = pos + 5 + length
            if end > n:
                conn.need = 5 + length
                break
            if logger is not None and not (ftype == REQUEST and length >= 5 and buf[pos + 9] == AUTHENTICATE):
                # JETLOG.md 4: an AUTHENTICATE is recorded when it is answered, without its
                # password (jetd.access).
                logger(conn.conn_id, FRAME_IN, buf[pos:end])
            frames += 1
            if ftype == REQUEST:
                # PROTOCOL.md 10.3: a well-formed SET_STATE or CALL_METHOD with a
                # fixed-width or opaque value, for a live owner with room for it, is routed
                # right here. The key/value check is written out here and in the two
                # branches below on purpose: a helper call per frame costs what these fast
                # paths save.
                function = buf[pos + 9] if fast_route and length >= 12 else 0
                if function in (SET_STATE, CALL_METHOD):
                    klen = buf[pos + 10] << 8 | buf[pos + 11]  # as cheap as struct, interpreted
                    kend = pos + 12 + klen
                    if klen and kend + 5 <= end:
                        if native:
                            vtype = buf[kend]
                            vn = buf[kend + 1] << 24 | buf[kend + 2] << 16 | buf[kend + 3] << 8 | buf[kend + 4]
                        else:
                            vtype, vn = VHEAD_FROM(buf, kend)
                        check = VTYPE_CHECK[vtype]
                        if kend + 5 + vn == end and (
                            check == OPAQUE or (vn == check and (vtype != 1 or buf[kend + 5] < 2))
                        ):
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
                                rid = (
                                    buf[pos + 5] << 24 | buf[pos + 6] << 16 | buf[pos + 7] << 8 | buf[pos + 8]
                                    if native
                                    else U32_FROM(buf, pos + 5)[0]
                                )
                                route = open_route(conn, rid, owner, function, key, now)
                                routed += 1
                                out = owner.out
                                if not out:
                                    dirty.append(owner)
                                out.append(ID_HEAD_PACK(REQUEST, length, route.oid))
                                out.append(buf[pos + 9 : end])
                                pos = end
                                continue
                self._request(conn, buf, pos, end)
            elif ftype == RESPONSE:
                # PROTOCOL.md 10.3: an owner's OK with a fixed-width or opaque value goes
                # back to a live requester under its own id right here.
                if fast_route and length >= 10 + 5 and buf[pos + 9] == 0:
                    if native:
                        vtype = buf[pos + 10]
                        vn = buf[pos + 11] << 24 | buf[pos + 12] << 16 | buf[pos + 13] << 8 | buf[pos + 14]
                    else:
                        vtype, vn = VHEAD_FROM(buf, pos + 10)
                    check = VTYPE_CHECK[vtype]
                    if pos + 15 + vn == end and (
                        check == OPAQUE or (vn == check and (vtype != 1 or buf[pos + 15] < 2))
                    ):
                        oid = (
                            buf[pos + 5] << 24 | buf[pos + 6] << 16 | buf[pos + 7] << 8 | buf[pos + 8]
                            if native
                            else U32_FROM(buf, pos + 5)[0]
                        )
                        answered = conn.routes.get(oid)
                        if answered is not None:
                            requester = answered.requester
                            if not requester.paused and not requester.closed and length <= requester.max_body:
                                del conn.routes[oid]
                                answered.done = True
                                out = requester.out
                                if not out:
                                    dirty.append(requester)
                                out.append(ID_HEAD_PACK(RESPONSE, length, answered.rid))
                                out.append(buf[pos + 9 : end])
                                pos = end
                                continue
                self._response(conn, buf, pos, end)
            elif ftype == EVENT:
                # The owner's NOTIFY_STATE event is the busiest frame of all: a
                # well-formed one with a fixed-width or opaque value, from the owner,
                # is applied right here; anything else takes the careful path.
                if end - pos >= 13 and buf[pos + 5] == 4:
                    klen = buf[pos + 6] << 8 | buf[pos + 7]
                    kend = pos + 8 + klen
                    if klen and kend + 5 <= end:
                        if native:
                            vtype = buf[kend]
                            vn = buf[kend + 1] << 24 | buf[kend + 2] << 16 | buf[kend + 3] << 8 | buf[kend + 4]
                        else:
                            vtype, vn = VHEAD_FROM(buf, kend)
                        check = VTYPE_CHECK[vtype]
                        if kend + 5 + vn == end and (
                            check == OPAQUE or (vn == check and (vtype != 1 or buf[kend + 5] < 2))
                        ):
                            key = buf[pos + 8 : kend]
                            if states.get(key) is conn and length + 4 <= max_body:
                                kv = conn.states[key] = buf[pos + 6 : end]
                                if parked:
                                    # PROTOCOL.md 10.8: the change is held for parked fetches.
                                    seq = self._seq = self._seq + 1
                                    changed[key] = seq
                                if delivering:
                                    self._hold(key, FETCH_CHANGE, kv)  # PROTOCOL.md 10.5
                                if fetch_lengths:
                                    cached = targets_cache.get(key)
                                    if cached is not None and cached[0] == generation:
                                        targets = cached[1]
                                    else:
                                        targets = fetches.targets(key)
                                    if not targets:
                                        pass
                                    elif inline_fanout:
                                        # _fanout inlined: head + fetch id + kv per fetcher
                                        # (live fetches only: a paused peer's are parked).
                                        size = len(kv)
                                        head = (
                                            CHANGE_HEADS[size]
                                            if size < CHANGE_HEADS_BELOW
                                            else EVT_HEAD_PACK(EVENT, 5 + size, FETCH_CHANGE)
                                        )
                                        if native:
                                            # Two pieces per event: the fetch keeps its head
                                            # and id joined (a quarter off 50 fetchers,
                                            # compiled; interpreted, the attribute reads cost
                                            # more than the third append they save).
                                            for fetch in targets:
                                                out = fetch.conn.out
                                                if not out:
                                                    dirty.append(fetch.conn)
                                                if fetch.change_head is not head:
                                                    fetch.change_head = head
                                                    fetch.change_prefix = head + fetch.fid_bytes
                                                out.append(fetch.change_prefix)
                                                out.append(kv)
                                        else:
                                            for fetch in targets:
                                                out = fetch.conn.out
                                                if not out:
                                                    dirty.append(fetch.conn)
                                                out.append(head)
                                                out.append(fetch.fid_bytes)
                                                out.append(kv)
                                        fanned += len(targets)
                                    else:
                                        self._fanout(key, FETCH_CHANGE, kv)
                                        pos = end
                                        if conn.closing:
                                            break
                                        continue
                                if query_groups:
                                    self._query_state(key, FETCH_CHANGE, kv)
                                pos = end
                                if conn.closing:  # it fetches its own states and overflowed
                                    break
                                continue
                self._event(conn, buf, pos, end)
            else:
                self._info(conn, buf, pos, end)
                inline_fanout = plain_fanout and not self.out.small_body_peers
            parked = self._parked
            delivering = self._delivering
            fetch_lengths = fetches.lengths
            generation = fetches.generation
            writable = conn.writable  # AUTHENTICATE may have changed it
            pos = end
            if conn.closing or conn.stalled or conn.held:
                # PROTOCOL.md 10.8: its output is past the budget (or paused, or a
                # fetch's adds are still under way): the rest of its input waits. 14.2:
                # so does it while its AUTHENTICATE is answered (held, not stalled).
                conn.stalled = conn.stalled and not conn.closing
                conn.need = 5
                break
        else:
            conn.need = 5
        self.stats.frames_in += frames
        self.stats.fanout_events += fanned
        self.stats.routed += routed
        if frames:
            conn.heard = True
        if pos < n and not conn.closing:
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
        self._end_delivery(conn)
        conn.stalled = False
        # It no longer counts against max_connections, even while the IO layer lingers
        # on its socket (jetd.server.PeerProtocol.hang_up).
        self.connections.pop(conn.conn_id, None)
        if conn.max_body < self.out.max_body:
            self.out.small_body_peers -= 1
        for route in conn.routes.values():
            route.done = True
            if not route.requester.closed:
                self.out.reply(route.requester, route.rid, Status.OWNER_GONE, "the owner disconnected")
        conn.routes.clear()
        # Its own fetches go first (nobody else can tell): nothing, not even the
        # FETCH_REMOVE of its own states, may follow its CLOSE.
        fetches = self.parked_fetches if conn.parked else self.fetches
        for fetch in conn.fetches.values():
            fetches.remove(fetch)
        if conn.query_fetches:
            self._query_teardown(conn)
        if conn.parked:
            conn.parked = False
            self._unparked(len(conn.fetches))
        conn.fetches.clear()
        registry = self.registry
        for key in sorted(conn.states):
            self._fanout(key, FETCH_REMOVE, registry.remove_state(key))
            self.fetches.forget(key)
        for key in conn.methods:
            del registry.methods[key]
            if self.queries:
                self._query_method(key, False)
        conn.methods.clear()
        self.slow.discard(conn)
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
        if code in (3, 4, 5):
            kend = key_value_end(buf, pos + 6, end)
            if kend < 0:
                status, message = why_malformed(EVENT, buf[pos + 5 : end])
                return self.out.fatal(conn, status, message)
            key = buf[pos + 8 : kend]
            if code == EV_NOTIFY_STATE:
                state_owner = self.registry.states.get(key)
                if state_owner is not conn:
                    reason = self._unknown_key(conn, key, None, "state") if state_owner is None else "not the owner"
                    return self._drop_event(conn, code, key, reason)
                # PROTOCOL.md 6.4: its FETCH_CHANGE may be up to 4 bytes above our
                # max_body; _fanout closes only the fetchers that announced less.
                kv = conn.states[key] = buf[pos + 6 : end]
                self._fanout(key, FETCH_CHANGE, kv)
                return None
            if conn.writable is not None and not self._may_write(conn, key):
                # PROTOCOL.md 15.3: dropped and logged, like any event not carried out.
                return self._drop_event(conn, code, key, f"not authorized: write (user {conn.user or 'anonymous'})")
            registry = self.registry
            owner: Optional[Connection] = (registry.states if code == EV_SET_STATE else registry.methods).get(key)
            if owner is None:
                reason = self._unknown_key(conn, key, None, "state" if code == 3 else "method")
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
        was_small = conn.max_body < self.out.max_body
        conn.max_body = info.max_body
        self.out.small_body_peers += (conn.max_body < self.out.max_body) - was_small
        if self._log is not None:
            self._log(conn.conn_id, LogKind.CONN_NAME, conn_name_data(info.name))
        log.debug("name %s", conn.label)
        if info.features & FEATURE_LIMITS:
            self.out.send(conn, self._limits_info_frame)
        return None
