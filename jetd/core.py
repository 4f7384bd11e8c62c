"""The sans-IO core of jetd: registry, routing, fetch fan-out and output queues.

Nothing here touches a socket, a loop or a clock. The IO layer (:mod:`jetd.server`)
creates a :class:`Connection` per accepted peer with :meth:`Daemon.connect`, feeds it
bytes with :meth:`Daemon.receive_data`, calls :meth:`Daemon.tick` with the monotonic time
now and then, and after each loop turn writes out what :meth:`Daemon.take_dirty` names:
``conn.out`` (a list of byte pieces to join and write) or, for a connection whose
transport is paused, the local queue drained with :meth:`Connection.take_pending`.

Slow consumers (PROTOCOL.md 10.8): while a connection is paused its fetches are
*parked*, out of the fetch index, so a change costs a paused peer nothing. While any
fetch is parked, a change stores one sequence number under its key in one daemon-wide
dict (a single store per change, however many peers are paused). A parked connection
catches up on one key before that key's FETCH_REMOVE and before the answer to its own
SET_STATE or NOTIFY_STATE of that key (PROTOCOL.md 10.5), and on every key changed
after its mark when its queue has drained: that catch-up is queued like any other
output, under the hard limit, and the fetches are live again once it is written.

The hot paths work on the received bytes directly with precompiled ``struct`` objects:
a routed request is forwarded as a new 9-byte head plus a slice of the received frame;
a state change is encoded once as (head, slice) and every fetcher gets
``head + its 4-byte fetch id + slice`` as three list appends (PROTOCOL.md 7.2 layout).
Anything the fast checks doubt goes to :func:`jetwire.decode_body`, which names the
exact fault.
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Optional

from sortedcontainers import SortedList

from jetwire import (
    FEATURE_CONFLATION,
    PROTOCOL_MAJOR,
    Close,
    EventCode,
    Function,
    Info,
    RemoteProtocolError,
    Status,
    decode_body,
    encode,
)
from jetwire.codec import is_utf8
from jetwire.codes import MIN_PEER_MAX_BODY
from jetwire.log import LogKind, conn_close_data, conn_name_data, conn_open_data

from .config import Config

__all__ = ["Connection", "Daemon", "Fetch", "FetchRegistry", "Route", "RouteTable", "StateRegistry"]

log = logging.getLogger("jetd")

# Frame heads (PROTOCOL.md 3, 4): type:u8 | length:u32, then id/function or code.
_HDR = struct.Struct(">BI")
_HDR_FROM = _HDR.unpack_from
_HDR_PACK = _HDR.pack
_ID_HEAD = struct.Struct(">BII")  # type, length, id: a REQUEST/RESPONSE head minus its last byte
_ID_HEAD_PACK = _ID_HEAD.pack
_RESP_HEAD = struct.Struct(">BIIB")  # type, length, id, status
_RESP_HEAD_PACK = _RESP_HEAD.pack
_EVT_HEAD = struct.Struct(">BIB")  # type, length, code
_EVT_HEAD_PACK = _EVT_HEAD.pack
_U16 = struct.Struct(">H")
_U16_FROM = _U16.unpack_from
_U32 = struct.Struct(">I")
_U32_FROM = _U32.unpack_from
_U32_PACK = _U32.pack
_ID_BYTE_FROM = struct.Struct(">IB").unpack_from
_VHEAD_FROM = struct.Struct(">BI").unpack_from

_REQUEST, _RESPONSE, _EVENT, _INFO = 1, 2, 3, 4
_FETCH_ADD = EventCode.FETCH_ADD.value
_FETCH_CHANGE = EventCode.FETCH_CHANGE.value
_FETCH_REMOVE = EventCode.FETCH_REMOVE.value
# Plain ints for the codes the hot paths compare: an IntEnum member costs several times
# a small int in a comparison.
_SET_STATE = Function.SET_STATE.value
_EV_SET_STATE = EventCode.SET_STATE.value
_EV_NOTIFY_STATE = EventCode.NOTIFY_STATE.value
_EV_CLOSE = EventCode.CLOSE.value
_NONE_VALUE = b"\x00\x00\x00\x00\x00"  # PROTOCOL.md 10.3: empty OK to a set -> NONE
_MAX_STATUS = max(Status)

# PROTOCOL.md 5.3 per vtype byte: fixed width (>= 0), opaque (-1), STRING (-2), reserved (-3).
_OPAQUE, _UTF8, _RESERVED = -1, -2, -3
_VTYPE_CHECK = [
    {0: 0, 1: 1, 2: 8, 3: 8, 4: _UTF8}.get(t, _OPAQUE if 5 <= t <= 8 or t >= 0x80 else _RESERVED)
    for t in range(256)
]

_ROUTE_PACK = struct.Struct(">IIIIBH").pack  # JETLOG.md 4: ROUTE data up to the key bytes
_ROUTE_KIND = LogKind.ROUTE.value
_FRAME_IN = LogKind.FRAME_IN.value
_FRAME_OUT = LogKind.FRAME_OUT.value

LogHook = Callable[[int, int, bytes], None]
"""``hook(conn_id, kind, data)``: append one event-log record (the writer stamps it)."""


def _value_ok(buf: bytes, off: int, end: int) -> bool:
    """True if ``buf[off:end]`` is exactly one well-formed Value (PROTOCOL.md 5.3)."""
    if end - off < 5:
        return False
    vtype, n = _VHEAD_FROM(buf, off)
    if off + 5 + n != end:
        return False
    check = _VTYPE_CHECK[vtype]
    if check >= 0:
        return n == check and (vtype != 1 or buf[off + 5] < 2)
    if check == _OPAQUE:
        return True
    if check == _UTF8:
        return is_utf8(buf[off + 5 : end])
    return False


def _key_value_end(buf: bytes, off: int, end: int) -> int:
    """Offset where the key of a ``Key, Value`` payload at ``off`` ends, or -1 if the
    payload is not well formed. The key's UTF-8 is not checked here: a key found in the
    registry was checked when it was added, so only unknown keys need the check."""
    if end - off < 7:
        return -1
    klen: int = _U16_FROM(buf, off)[0]
    kend = off + 2 + klen
    if klen == 0 or not _value_ok(buf, kend, end):
        return -1
    return kend


def _key_only_end(buf: bytes, off: int, end: int) -> bool:
    """True if ``buf[off:end]`` is exactly one non-empty str16 (UTF-8 checked later)."""
    return end - off >= 3 and off + 2 + _U16_FROM(buf, off)[0] == end


def _str16_ok(buf: bytes, off: int, end: int) -> bool:
    return end - off >= 2 and off + 2 + _U16_FROM(buf, off)[0] == end and is_utf8(buf[off + 2 : end])


def _response(rid: int, status: Status, message: str) -> bytes:
    raw = message.encode("utf-8")[:0xFFFF]
    return _RESP_HEAD_PACK(_RESPONSE, 7 + len(raw), rid, status) + _U16.pack(len(raw)) + raw


def _ok(rid: int) -> bytes:
    return _RESP_HEAD_PACK(_RESPONSE, 5, rid, 0)


def _close_frame(status: Status, message: str) -> bytes:
    return encode(Close(status, message))


def _why_malformed(ftype: int, body: bytes) -> tuple[Status, str]:
    """The status and reason jetwire gives for a body the fast checks rejected."""
    try:
        decode_body(ftype, body)
    except RemoteProtocolError as exc:
        return exc.status, exc.message
    return Status.MALFORMED, "malformed body"  # pragma: no cover - fast path is stricter only on keys


# --- registries ---------------------------------------------------------------------


class StateRegistry:
    """States and methods by key bytes, with a sorted index of state keys.

    ``states`` maps a key to its owner; the cached value lives in the owner's
    ``Connection.states`` as the ``Key, Value`` payload exactly as on the wire
    (u16 klen | key | Value), so a fetch event is a head, a fetch id and that payload,
    and a state costs two dict entries and two bytes objects (PROTOCOL.md 10.4 cache).

    PROTOCOL.md 5.2: keys sort by their UTF-8 bytes, so the index holds ``bytes`` and a
    prefix fetch is one range scan: O(log n + matches), never a walk over all states.
    """

    __slots__ = ("index", "methods", "states")

    def __init__(self) -> None:
        self.states: dict[bytes, Connection] = {}
        self.methods: dict[bytes, Connection] = {}
        self.index: SortedList = SortedList()

    def add_state(self, key: bytes, kv: bytes, owner: Connection) -> None:
        """Register ``key`` owned by ``owner`` with its ``Key, Value`` payload ``kv``."""
        self.states[key] = owner
        owner.states[key] = kv
        self.index.add(key)

    def remove_state(self, key: bytes) -> bytes:
        """Forget ``key``; returns its last ``Key, Value`` payload (the caller fans out
        FETCH_REMOVE and then drops the key's cached fetch targets)."""
        owner = self.states.pop(key)
        self.index.remove(key)
        return owner.states.pop(key)

    def matching(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(key, ``Key, Value`` payload) of the states whose key starts with ``prefix``,
        in byte order of key."""
        states = self.states
        for key in self.index.irange(minimum=prefix):
            if not key.startswith(prefix):
                return
            yield key, states[key].states[key]


class Fetch:
    """One fetch: its daemon-unique id (and that id packed once), its connection and prefix."""

    __slots__ = ("conn", "fid", "fid_bytes", "prefix")

    def __init__(self, fid: int, conn: Connection, prefix: bytes) -> None:
        self.fid = fid
        self.fid_bytes = _U32_PACK(fid)
        self.conn = conn
        self.prefix = prefix


class FetchRegistry:
    """Fetches indexed by prefix: a change of key K visits only the prefixes of K that
    some fetch uses, found by slicing K at each distinct prefix length in use (usually
    one or two), so its cost follows the fetches it matches, not all fetches."""

    __slots__ = ("_length_counts", "by_prefix", "cache", "generation", "lengths")

    def __init__(self) -> None:
        self.by_prefix: dict[bytes, dict[int, Fetch]] = {}
        self.lengths: list[int] = []
        self._length_counts: dict[int, int] = {}
        self.generation = 0  # bumped by every add/remove: invalidates cached targets
        # key -> (generation, targets); Daemon.receive_data reads it inline.
        self.cache: dict[bytes, tuple[int, list[Fetch]]] = {}

    def targets(self, key: bytes) -> list[Fetch]:
        """Every fetch matching ``key``, as one list cached per key until the set of
        fetches changes: a stream of changes to one key (the common case) pays for
        the prefix walk once. Keys without fetchers are not cached (no memory cost)."""
        cached = self.cache.get(key)
        if cached is not None and cached[0] == self.generation:
            return cached[1]
        found = [fetch for group in self.groups(key) for fetch in group.values()]
        if found:
            self.cache[key] = (self.generation, found)
        elif cached is not None:
            del self.cache[key]
        return found

    def forget(self, key: bytes) -> None:
        """Drop the cached targets of a key that no longer exists."""
        self.cache.pop(key, None)

    def add(self, fetch: Fetch) -> None:
        """Index a new fetch under its prefix."""
        self.generation += 1
        self.by_prefix.setdefault(fetch.prefix, {})[fetch.fid] = fetch
        n = len(fetch.prefix)
        count = self._length_counts.get(n, 0)
        self._length_counts[n] = count + 1
        if count == 0:
            self.lengths = sorted(self._length_counts)

    def remove(self, fetch: Fetch) -> None:
        """Drop a fetch (UNFETCH or its connection closed)."""
        self.generation += 1
        group = self.by_prefix[fetch.prefix]
        del group[fetch.fid]
        if not group:
            del self.by_prefix[fetch.prefix]
        n = len(fetch.prefix)
        count = self._length_counts[n] - 1
        if count:
            self._length_counts[n] = count
        else:
            del self._length_counts[n]
            self.lengths = sorted(self._length_counts)

    def groups(self, key: bytes) -> list[dict[int, Fetch]]:
        """The groups of fetches (one per matching prefix) that match ``key``."""
        found = []
        by_prefix = self.by_prefix
        klen = len(key)
        for n in self.lengths:
            if n > klen:
                break
            group = by_prefix.get(key[:n])
            if group:
                found.append(group)
        return found


class Route:
    """A request routed to an owner (PROTOCOL.md 10.3), waiting for its answer."""

    __slots__ = ("deadline", "done", "function", "key", "oid", "owner", "requester", "rid")

    def __init__(self, requester: Connection, rid: int, owner: Connection, oid: int, function: int, key: bytes,
                 deadline: float) -> None:
        self.requester = requester
        self.rid = rid
        self.owner = owner
        self.oid = oid
        self.function = function
        self.key = key  # PROTOCOL.md 10.5: a parked requester catches up on it before the answer
        self.deadline = deadline
        self.done = False


class RouteTable:
    """Routed requests: per-owner maps (``Connection.routes``) of the daemon-chosen ids,
    plus one FIFO of all routes for timeouts.

    The route timeout is the same for every route, so creation order is deadline order
    and the FIFO's head is always the next to expire; answered routes are dropped from
    the head lazily, which keeps the FIFO short when owners answer in order.
    """

    __slots__ = ("fifo", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.fifo: deque[Route] = deque()

    def open(self, requester: Connection, rid: int, owner: Connection, function: int, key: bytes,
             now: float) -> Route:
        """Pick an id distinct from every other request pending at ``owner``."""
        routes = owner.routes
        oid = owner.next_route_id
        while oid in routes:
            oid = (oid + 1) & 0xFFFF_FFFF
        owner.next_route_id = (oid + 1) & 0xFFFF_FFFF
        route = Route(requester, rid, owner, oid, function, key, now + self.timeout)
        routes[oid] = route
        fifo = self.fifo
        while fifo and fifo[0].done:
            fifo.popleft()
        fifo.append(route)
        return route

    def expired(self, now: float) -> Iterator[Route]:
        """Pop and yield the routes whose deadline has passed."""
        fifo = self.fifo
        while fifo:
            route = fifo[0]
            if route.done:
                fifo.popleft()
            elif route.deadline <= now:
                fifo.popleft()
                route.done = True
                del route.owner.routes[route.oid]
                yield route
            else:
                return


# --- connections --------------------------------------------------------------------

class Connection:
    """One peer's connection as the core sees it.

    ``out`` collects byte pieces to write at the end of the loop turn. While ``paused``
    (its transport is above the soft limit, or older output still waits) frames go to
    ``pending`` instead, and its fetches are ``parked``: their changes are held back
    as keys changed after ``mark`` (PROTOCOL.md 10.8, see the module docstring).
    """

    __slots__ = (
        "address",
        "caught",
        "close_at",
        "close_reason",
        "close_status",
        "closed",
        "closing",
        "conn_id",
        "fetches",
        "io",
        "mark",
        "max_body",
        "methods",
        "name",
        "need",
        "next_route_id",
        "out",
        "parked",
        "paused",
        "pending",
        "pending_size",
        "rest",
        "rest_len",
        "routes",
        "slow_since",
        "states",
        "transport_size",
        "violations",
    )

    def __init__(self, conn_id: int, address: str) -> None:
        self.conn_id = conn_id
        self.address = address
        self.name = ""
        self.out: list[bytes] = []
        self.paused = False
        self.parked = False  # its fetches are in Daemon.parked_fetches, not Daemon.fetches
        self.mark = 0  # parked: the changes up to this sequence number are queued already
        self.caught: dict[bytes, int] = {}  # parked: keys caught up on one by one since, and when
        self.pending: deque[bytes] = deque()
        self.pending_size = 0
        self.transport_size = 0  # bytes the transport buffers; set by the IO layer
        self.slow_since: Optional[float] = None
        self.closing = False  # CLOSE queued (or peer gone): read nothing more
        self.closed = False  # torn down: its states, methods, fetches, routes are gone
        self.close_status = Status.OK
        self.close_reason = ""
        self.close_at = -1
        self.states: dict[bytes, bytes] = {}  # its states: key -> Key, Value payload
        self.methods: set[bytes] = set()
        self.fetches: dict[int, Fetch] = {}
        self.routes: dict[int, Route] = {}  # routed to this connection, by our id
        self.next_route_id = 1
        self.rest: list[bytes] = []  # an incomplete frame's bytes
        self.rest_len = 0
        self.need = 5
        self.violations = 0
        self.io: object = None  # the IO layer's handle (a protocol object)
        # PROTOCOL.md 3: the largest body this peer accepts; until its INFO says
        # otherwise we assume it accepts what we do.
        self.max_body = 0xFFFF_FFFF

    @property
    def label(self) -> str:
        """``#id name@address`` for log lines."""
        return f"#{self.conn_id} {self.name or '-'}@{self.address}"

    @property
    def queued(self) -> int:
        """Bytes waiting for this peer: in the transport plus in the local queue."""
        return self.transport_size + self.pending_size

    def enqueue(self, frame: bytes) -> None:
        """Queue a frame locally (paused mode)."""
        self.pending.append(frame)
        self.pending_size += len(frame)

    def take_pending(self, budget: int) -> list[bytes]:
        """Pop queued frames, in order, up to about ``budget`` bytes (at least one)."""
        taken: list[bytes] = []
        size = 0
        pending = self.pending
        while pending and size < budget:
            frame = pending.popleft()
            taken.append(frame)
            size += len(frame)
        self.pending_size -= size
        return taken


@dataclass
class DaemonStats:
    """Counters for logs and benchmarks (logged at shutdown and on SIGUSR1)."""

    connections: int = 0
    frames_in: int = 0
    routed: int = 0
    fanout_events: int = 0
    parked: int = 0  # times a connection's fetches were parked (PROTOCOL.md 10.8)
    caught_up: int = 0  # FETCH_CHANGE events a parked connection got late, with the latest value
    overloaded: int = 0
    violations: int = 0

    def summary(self) -> str:
        """One log line: ``name=value`` for every counter."""
        return " ".join(f"{name}={value}" for name, value in vars(self).items())


# --- the daemon ---------------------------------------------------------------------


class Daemon:
    """The registry and router. Feed it bytes per connection; it fills output queues.

    Args:
        config: limits and policies (:class:`jetd.config.Config`).
        log_hook: called as ``hook(conn_id, kind, data)`` for every event-log record
            (JETLOG.md 4), or None when no event log is kept.
    """

    def __init__(self, config: Config, log_hook: Optional[LogHook] = None) -> None:
        self.config = config
        self.registry = StateRegistry()
        self.fetches = FetchRegistry()
        # PROTOCOL.md 10.8: the fetches of paused connections, for their ADD/REMOVE events.
        self.parked_fetches = FetchRegistry()
        self._parked = 0  # how many fetches are parked
        # While any is parked: key -> sequence number of its last change (self._seq).
        self._changed: dict[bytes, int] = {}
        self._seq = 0
        self.routes = RouteTable(config.route_timeout)
        self.connections: dict[int, Connection] = {}
        self.dirty: list[Connection] = []
        self.slow: set[Connection] = set()
        self.stats = DaemonStats()
        self.now = 0.0
        self._log = log_hook
        self._log_events = log_hook is not None and config.log_events
        self._next_conn_id = 1
        self._next_fetch_id = 1  # PROTOCOL.md 10.5: jetd counts from 1, never reuses
        self._to_close: list[Connection] = []
        self._max_body = config.max_body
        self._small_body_peers = 0  # peers whose INFO announced a max_body below ours
        self._max_key = config.max_key_length
        self.info_frame = encode(Info(config.name, config.max_body, FEATURE_CONFLATION))
        self._shutdown_frame = _close_frame(Status.OK, "shutting down")
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
        }

    # --- connection lifecycle ---------------------------------------------------------

    def connect(self, address: str, now: float) -> Connection:
        """A peer connected: returns its Connection with INFO queued (PROTOCOL.md 10.1).

        Beyond ``max_connections`` the connection gets INFO then CLOSE LIMIT_EXCEEDED
        (PROTOCOL.md 10.7) and is marked closing.
        """
        self.now = now
        conn = Connection(self._next_conn_id, address)
        self._next_conn_id += 1
        self.connections[conn.conn_id] = conn
        self.stats.connections += 1
        if self._log is not None:
            self._log(conn.conn_id, LogKind.CONN_OPEN, conn_open_data(address))
        self._send(conn, self.info_frame)
        log.info("open %s", conn.label)
        if len(self.connections) > self.config.max_connections:
            message = f"too many connections (max {self.config.max_connections})"
            self._close_with(conn, Status.LIMIT_EXCEEDED, message, _close_frame(Status.LIMIT_EXCEEDED, message))
            self._finish_closes()
        return conn

    def disconnect(self, conn: Connection, now: float, reason: str = "peer disconnected") -> None:
        """The peer's connection is gone (EOF, reset, or we closed it)."""
        self.now = now
        if not conn.closing:
            conn.closing = True
            conn.close_reason = reason
            self._to_close.append(conn)
        self._finish_closes()
        self.connections.pop(conn.conn_id, None)
        self.slow.discard(conn)

    def shutdown(self, now: float) -> None:
        """PROTOCOL.md 10.9: CLOSE (OK, "shutting down") to every peer."""
        self.now = now
        for conn in list(self.connections.values()):
            if not conn.closing:
                self._close_with(conn, Status.OK, "shutting down", self._shutdown_frame)
        self._finish_closes()

    def internal_error(self, conn: Connection, now: float) -> None:
        """A bug surfaced while handling ``conn``'s bytes: CLOSE (INTERNAL) it."""
        self.now = now
        conn.rest = []
        self._close_with(conn, Status.INTERNAL, "internal error", _close_frame(Status.INTERNAL, "internal error"))
        self._finish_closes()

    def take_dirty(self) -> list[Connection]:
        """Connections with output (or a close) to act on; clears the list."""
        dirty = self.dirty
        self.dirty = []
        return dirty

    # --- clock --------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Expire routes (PROTOCOL.md 10.3 route timeout) and slow consumers stuck past
        the deadline (PROTOCOL.md 10.8)."""
        self.now = now
        for route in self.routes.expired(now):
            requester = route.requester
            self._violation(route.owner, f"routed request id {route.oid} not answered within the route timeout")
            if not requester.closed:
                self._send(requester, _response(route.rid, Status.TIMEOUT, "the owner did not answer in time"))
        deadline = self.config.slow_deadline
        for conn in list(self.slow):
            if conn.slow_since is not None and now - conn.slow_since > deadline:
                self._overload(conn, f"output stuck above the soft limit for more than {deadline:g} s")
        self._finish_closes()

    # --- flow control (called by the IO layer) -------------------------------------------

    def pause(self, conn: Connection, transport_size: int) -> None:
        """The transport's buffer went above the soft limit: queue locally from now on,
        and park the connection's fetches (PROTOCOL.md 10.8)."""
        conn.transport_size = transport_size
        if not conn.paused:
            conn.paused = True
            conn.slow_since = self.now
            self.slow.add(conn)
            if not conn.closed and not conn.parked:
                self._park(conn)
            log.debug("slow %s: %d bytes in the transport, queueing locally", conn.label, transport_size)

    def drained(self, conn: Connection) -> bool:
        """The local queue is empty and the transport below its low mark again.

        If keys changed while the connection was parked, their latest values are queued
        first (PROTOCOL.md 10.8), like any output above the soft limit, and it stays
        paused: returns False, and the IO layer writes the queue and calls again. Returns
        True once the connection is live again (False too if it was closed)."""
        if conn.closing:
            return False
        if conn.parked:
            if self._seq != conn.mark:
                self._catch_up(conn)
                self._finish_closes()
                if conn.pending or conn.closing:
                    return False
            self._unpark(conn)
        conn.paused = False
        conn.transport_size = 0
        conn.slow_since = None
        self.slow.discard(conn)
        log.debug("drained %s", conn.label)
        return True

    def _park(self, conn: Connection) -> None:
        conn.parked = True
        conn.mark = self._seq
        live, parked = self.fetches, self.parked_fetches
        for fetch in conn.fetches.values():
            live.remove(fetch)
            parked.add(fetch)
        self._parked += len(conn.fetches)
        self.stats.parked += 1

    def _unpark(self, conn: Connection) -> None:
        conn.parked = False
        conn.caught.clear()
        live, parked = self.fetches, self.parked_fetches
        for fetch in conn.fetches.values():
            parked.remove(fetch)
            live.add(fetch)
        self._unparked(len(conn.fetches))

    def _unparked(self, count: int) -> None:
        self._parked -= count
        if not self._parked:
            self._changed.clear()

    def _catch_up(self, conn: Connection) -> None:
        """Queue for parked ``conn`` a FETCH_CHANGE with the latest value per (fetch, key)
        changed since its mark and not caught up on one by one since (PROTOCOL.md 10.8);
        CLOSE it above the hard limit."""
        mark = conn.mark
        conn.mark = self._seq
        caught = conn.caught
        states = self.registry.states
        sent = 0
        for key, changed in self._changed.items():
            if changed > mark and changed > caught.get(key, 0):
                owner = states.get(key)
                if owner is not None:
                    sent += self._catch_up_key(conn, key, owner.states[key])
                    if conn.closing:
                        break
        caught.clear()
        self.stats.caught_up += sent
        if conn.pending_size + conn.transport_size > self.config.hard_limit:
            self._overload(conn, "output above the hard limit")

    def _catch_up_on(self, conn: Connection, key: bytes, kv: bytes) -> None:
        """Parked ``conn`` catches up on ``key`` alone (its value ``kv``), if it changed
        since the connection's mark and since it last caught up on it."""
        changed = self._changed.get(key, 0)
        if changed > conn.mark and changed > conn.caught.get(key, 0) and not conn.closing:
            conn.caught[key] = self._seq
            self.stats.caught_up += self._catch_up_key(conn, key, kv)

    def _catch_up_key(self, conn: Connection, key: bytes, kv: bytes) -> int:
        """Queue for parked ``conn`` (so paused: only a closing one is not, and it is not
        caught up) the FETCH_CHANGE of ``key`` (value ``kv``) for each of its fetches that
        matches; returns how many."""
        body_length = 5 + len(kv)
        if self._too_large_for(conn, body_length):
            self._event_too_large(conn, body_length)
            return 0
        head = _EVT_HEAD_PACK(_EVENT, body_length, _FETCH_CHANGE)
        log = self._log if self._log_events else None
        sent = 0
        for fetch in conn.fetches.values():
            if key.startswith(fetch.prefix):
                frame = head + fetch.fid_bytes + kv
                conn.enqueue(frame)
                if log is not None:
                    log(conn.conn_id, _FRAME_OUT, frame)
                sent += 1
        return sent

    # --- receiving ----------------------------------------------------------------------

    def receive_data(self, conn: Connection, data: bytes, now: float) -> None:
        """Process the bytes a peer sent: every complete frame, in order (PROTOCOL.md 10.1)."""
        if conn.closing:
            return
        self.now = now
        if conn.rest:
            conn.rest.append(data)
            conn.rest_len += len(data)
            if conn.rest_len < conn.need:
                return
            buf = b"".join(conn.rest)
            conn.rest = []
            conn.rest_len = 0
        else:
            buf = data
        n = len(buf)
        pos = 0
        max_body = self._max_body
        logger = self._log
        states = self.registry.states
        fetches = self.fetches
        targets_cache = fetches.cache
        dirty = self.dirty
        plain_fanout = not self._log_events
        # Only an INFO changes _small_body_peers while frames are read (closes are
        # torn down after the loop), so it is refreshed after each INFO.
        inline_fanout = plain_fanout and not self._small_body_peers
        # Fetches are parked or unparked only by the IO layer and by other frames' slow
        # paths, so this is read again after each of those.
        parked = self._parked
        changed = self._changed
        # Routed SET_STATE requests and their OK answers also have fast paths below; the
        # event log (ROUTE and FRAME_OUT records) takes the careful ones.
        fast_route = logger is None
        open_route = self.routes.open
        max_pending = self.config.max_pending_per_owner
        frames = 0
        routed = 0
        fanned = 0
        while n - pos >= 5:
            ftype, length = _HDR_FROM(buf, pos)
            if not 1 <= ftype <= 4 or length > max_body:
                # PROTOCOL.md 9.2: checked before buffering any of the body.
                if logger is not None:
                    logger(conn.conn_id, _FRAME_IN, buf[pos : pos + 5])
                if ftype < 1 or ftype > 4:
                    self._fatal(conn, Status.MALFORMED, f"unknown frame type 0x{ftype:02X}")
                else:
                    self._fatal(conn, Status.TOO_LARGE, f"body of {length} bytes exceeds max_body {max_body}")
                break
            end = pos + 5 + length
            if end > n:
                conn.need = 5 + length
                break
            if logger is not None:
                logger(conn.conn_id, _FRAME_IN, buf[pos:end])
            frames += 1
            if ftype == _REQUEST:
                # PROTOCOL.md 10.3: a well-formed SET_STATE with a fixed-width or opaque
                # value, for a live owner with room for it, is routed right here. The
                # key/value check is written out here and in the two branches below on
                # purpose: a helper call per frame costs what these fast paths save.
                if fast_route and length >= 12 and buf[pos + 9] == _SET_STATE:
                    (klen,) = _U16_FROM(buf, pos + 10)
                    kend = pos + 12 + klen
                    if klen and kend + 5 <= end:
                        vtype, vn = _VHEAD_FROM(buf, kend)
                        check = _VTYPE_CHECK[vtype]
                        if kend + 5 + vn == end and (
                            check == _OPAQUE or (vn == check and (vtype != 1 or buf[kend + 5] < 2))
                        ):
                            key = buf[pos + 12 : kend]
                            owner = states.get(key)
                            if (
                                owner is not None
                                and not owner.paused
                                and not owner.closed
                                and len(owner.routes) < max_pending
                                and length <= owner.max_body
                            ):
                                route = open_route(conn, _U32_FROM(buf, pos + 5)[0], owner, _SET_STATE, key, now)
                                routed += 1
                                out = owner.out
                                if not out:
                                    dirty.append(owner)
                                out.append(_ID_HEAD_PACK(_REQUEST, length, route.oid))
                                out.append(buf[pos + 9 : end])
                                pos = end
                                continue
                self._request(conn, buf, pos, end)
            elif ftype == _RESPONSE:
                # PROTOCOL.md 10.3: an owner's OK with a fixed-width or opaque value goes
                # back to a live requester under its own id right here.
                if fast_route and length >= 10 + 5 and buf[pos + 9] == 0:
                    vtype, vn = _VHEAD_FROM(buf, pos + 10)
                    check = _VTYPE_CHECK[vtype]
                    if pos + 15 + vn == end and (
                        check == _OPAQUE or (vn == check and (vtype != 1 or buf[pos + 15] < 2))
                    ):
                        oid = _U32_FROM(buf, pos + 5)[0]
                        answered = conn.routes.get(oid)
                        if answered is not None:
                            requester = answered.requester
                            if not requester.paused and not requester.closed and length <= requester.max_body:
                                del conn.routes[oid]
                                answered.done = True
                                out = requester.out
                                if not out:
                                    dirty.append(requester)
                                out.append(_ID_HEAD_PACK(_RESPONSE, length, answered.rid))
                                out.append(buf[pos + 9 : end])
                                pos = end
                                continue
                self._response(conn, buf, pos, end)
            elif ftype == _EVENT:
                # The owner's NOTIFY_STATE event is the busiest frame of all: a
                # well-formed one with a fixed-width or opaque value, from the owner,
                # is applied right here; anything else takes the careful path.
                if end - pos >= 13 and buf[pos + 5] == 4:
                    (klen,) = _U16_FROM(buf, pos + 6)
                    kend = pos + 8 + klen
                    if klen and kend + 5 <= end:
                        vtype, vn = _VHEAD_FROM(buf, kend)
                        check = _VTYPE_CHECK[vtype]
                        if kend + 5 + vn == end and (
                            check == _OPAQUE or (vn == check and (vtype != 1 or buf[kend + 5] < 2))
                        ):
                            key = buf[pos + 8 : kend]
                            if states.get(key) is conn and length + 4 <= max_body:
                                kv = conn.states[key] = buf[pos + 6 : end]
                                if parked:
                                    # PROTOCOL.md 10.8: the change is held for parked fetches.
                                    seq = self._seq = self._seq + 1
                                    changed[key] = seq
                                if fetches.lengths:
                                    cached = targets_cache.get(key)
                                    if cached is not None and cached[0] == fetches.generation:
                                        targets = cached[1]
                                    else:
                                        targets = fetches.targets(key)
                                    if not targets:
                                        pass
                                    elif inline_fanout:
                                        # _fanout inlined: head + fetch id + kv per fetcher
                                        # (live fetches only: a paused peer's are parked).
                                        head = _EVT_HEAD_PACK(_EVENT, 5 + len(kv), _FETCH_CHANGE)
                                        for fetch in targets:
                                            out = fetch.conn.out
                                            if not out:
                                                dirty.append(fetch.conn)
                                            out.append(head)
                                            out.append(fetch.fid_bytes)
                                            out.append(kv)
                                        fanned += len(targets)
                                    else:
                                        self._fanout(key, _FETCH_CHANGE, kv)
                                pos = end
                                if conn.closing:  # it fetches its own states and overflowed
                                    break
                                continue
                self._event(conn, buf, pos, end)
            else:
                self._info(conn, buf, pos, end)
                inline_fanout = plain_fanout and not self._small_body_peers
            parked = self._parked
            pos = end
            if conn.closing:
                break
        else:
            conn.need = 5
        self.stats.frames_in += frames
        self.stats.fanout_events += fanned
        self.stats.routed += routed
        if pos < n and not conn.closing:
            rest = buf[pos:] if pos else buf
            conn.rest = [rest]
            conn.rest_len = len(rest)
        if self._to_close:
            self._finish_closes()

    # --- sending ------------------------------------------------------------------------

    def _send(self, conn: Connection, frame: bytes) -> None:
        """Queue one (non fan-out) frame for ``conn`` and log it."""
        if conn.closed:
            return
        if self._small_body_peers and len(frame) - 5 > conn.max_body:
            # PROTOCOL.md 3: never send a body above the max_body the peer announced.
            body_length = len(frame) - 5
            if frame[0] == _RESPONSE:
                message = f"the answer of {body_length} bytes exceeds your max_body {conn.max_body}"
                frame = _response(_U32_FROM(frame, 5)[0], Status.TOO_LARGE, message)
            else:
                message = f"a frame of {body_length} bytes exceeds your max_body {conn.max_body}"
                self._close_with(conn, Status.TOO_LARGE, message, _close_frame(Status.TOO_LARGE, message))
                return
        if conn.paused:
            if not self._enqueue(conn, frame):
                return
        else:
            out = conn.out
            if not out:
                self.dirty.append(conn)
            out.append(frame)
        if self._log is not None:
            self._log(conn.conn_id, _FRAME_OUT, frame)

    def _enqueue(self, conn: Connection, frame: bytes) -> bool:
        """Queue ``frame`` for paused ``conn``; above the hard limit CLOSE the peer
        instead. Returns True if the frame is queued (JETLOG.md 4: only those are logged)."""
        conn.enqueue(frame)
        if conn.pending_size + conn.transport_size > self.config.hard_limit:
            self._overload(conn, "output above the hard limit")
            return False
        return True

    def _fanout(self, key: bytes, code: int, kv: bytes) -> None:
        """Send one fetch event for ``key`` to every matching fetch: the frame is
        encoded once as (head, kv); each fetcher gets head + its fetch id + kv."""
        body_length = 5 + len(kv)
        if self._parked:
            if code == _FETCH_CHANGE:
                self._seq += 1
                self._changed[key] = self._seq
            else:
                self._fanout_parked(key, code, kv)
        if not self.fetches.lengths:
            return
        targets = self.fetches.targets(key)
        if not targets:
            return
        head = _EVT_HEAD_PACK(_EVENT, body_length, code)
        dirty = self.dirty
        careful = self._small_body_peers > 0
        for fetch in targets:
            conn = fetch.conn
            if careful and body_length > conn.max_body:
                self._event_too_large(conn, body_length)
            else:
                out = conn.out
                if not out:
                    dirty.append(conn)
                out.append(head)
                out.append(fetch.fid_bytes)
                out.append(kv)
        self.stats.fanout_events += len(targets)
        if self._log_events and self._log is not None:
            for fetch in targets:
                self._log(fetch.conn.conn_id, _FRAME_OUT, head + fetch.fid_bytes + kv)

    def _event_too_large(self, conn: Connection, body_length: int) -> None:
        """A fetch event does not fit the fetcher's announced max_body: rather than lose
        it silently, the fetcher is closed with TOO_LARGE."""
        message = f"a fetch event of {body_length} bytes exceeds your max_body {conn.max_body}"
        self._close_with(conn, Status.TOO_LARGE, message, _close_frame(Status.TOO_LARGE, message))

    def _too_large_for(self, conn: Connection, body_length: int) -> bool:
        """True if ``conn`` announced a max_body below ``body_length`` (PROTOCOL.md 3)."""
        return self._small_body_peers > 0 and body_length > conn.max_body

    def _fanout_parked(self, key: bytes, code: int, kv: bytes) -> None:
        """A FETCH_ADD or FETCH_REMOVE for the parked fetches of ``key``: queued in
        order, after the changes held back (PROTOCOL.md 10.8: never conflated)."""
        # Not the cached targets: ADD and REMOVE are rare, and a cache entry would keep
        # closed connections alive until the key is removed.
        targets = [fetch for group in self.parked_fetches.groups(key) for fetch in group.values()]
        body_length = 5 + len(kv)
        head = _EVT_HEAD_PACK(_EVENT, body_length, code)
        for fetch in targets:
            conn = fetch.conn
            if conn.closing:
                continue  # its CLOSE is queued: nothing may follow it
            if self._too_large_for(conn, body_length):
                self._event_too_large(conn, body_length)
                continue
            if code == _FETCH_REMOVE:
                # The key's held-back change first (kv is its last value), for all of the
                # connection's fetches at once.
                self._catch_up_on(conn, key, kv)
                if conn.closing:
                    continue
            frame = head + fetch.fid_bytes + kv
            if self._enqueue(conn, frame) and self._log_events and self._log is not None:
                self._log(conn.conn_id, _FRAME_OUT, frame)
        self.stats.fanout_events += len(targets)
        if code == _FETCH_REMOVE:
            # Every parked fetch of the key is caught up on it now.
            self._changed.pop(key, None)

    def _reply(self, conn: Connection, rid: int, status: Status, message: str) -> None:
        self._send(conn, _response(rid, status, message))

    # --- closing ------------------------------------------------------------------------

    def _violation(self, conn: Connection, message: str) -> None:
        conn.violations += 1
        self.stats.violations += 1
        # One line per violation, but a peer flooding bad frames cannot flood the log.
        if conn.violations <= 10:
            log.info("violation by %s: %s", conn.label, message)
        elif conn.violations == 11:
            log.info("violation by %s: further violations are not logged", conn.label)

    def _fatal(self, conn: Connection, status: Status, message: str) -> None:
        """PROTOCOL.md 9.2, 9.3: CLOSE with ``status`` and disconnect; read nothing more."""
        self._violation(conn, message)
        self._close_with(conn, status, message, _close_frame(status, message))

    def _close_with(self, conn: Connection, status: Status, message: str, frame: bytes) -> None:
        if conn.closing:
            return
        conn.closing = True
        conn.close_status = status
        conn.close_reason = message
        if conn.paused:
            conn.enqueue(frame)
            conn.close_at = len(conn.pending)
        else:
            if not conn.out:
                self.dirty.append(conn)
            conn.out.append(frame)
            conn.close_at = len(conn.out)
        if self._log is not None:
            self._log(conn.conn_id, _FRAME_OUT, frame)
        self._to_close.append(conn)

    def _overload(self, conn: Connection, reason: str) -> None:
        """PROTOCOL.md 10.8: drop what is queued, CLOSE (OVERLOADED), disconnect."""
        if conn.closing:
            return
        self.stats.overloaded += 1
        log.info("overloaded %s: %s (%d bytes queued)", conn.label, reason, conn.queued)
        conn.pending.clear()
        conn.pending_size = 0
        conn.paused = False  # the CLOSE goes straight to the transport
        conn.out.clear()
        self._close_with(conn, Status.OVERLOADED, reason, _close_frame(Status.OVERLOADED, reason))

    def _finish_closes(self) -> None:
        while self._to_close:
            conn = self._to_close.pop()
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
        # It no longer counts against max_connections, even while the IO layer lingers
        # on its socket (jetd.server.PeerProtocol.hang_up).
        self.connections.pop(conn.conn_id, None)
        if conn.max_body < self._max_body:
            self._small_body_peers -= 1
        for route in conn.routes.values():
            route.done = True
            if not route.requester.closed:
                self._reply(route.requester, route.rid, Status.OWNER_GONE, "the owner disconnected")
        conn.routes.clear()
        # Its own fetches go first (nobody else can tell): nothing, not even the
        # FETCH_REMOVE of its own states, may follow its CLOSE.
        fetches = self.parked_fetches if conn.parked else self.fetches
        for fetch in conn.fetches.values():
            fetches.remove(fetch)
        if conn.parked:
            conn.parked = False
            self._unparked(len(conn.fetches))
        conn.fetches.clear()
        registry = self.registry
        for key in sorted(conn.states):
            self._fanout(key, _FETCH_REMOVE, registry.remove_state(key))
            self.fetches.forget(key)
        for key in conn.methods:
            del registry.methods[key]
        conn.methods.clear()
        self.slow.discard(conn)
        # The IO layer closes the transport after the flush; being listed twice is harmless
        # (and cheaper than searching the list when thousands of peers go at once).
        self.dirty.append(conn)
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
            self._fatal(conn, Status.MALFORMED, f"REQUEST body of {end - pos - 5} bytes has no readable id")
            return
        if end - pos < 10:
            rid = _U32_FROM(buf, pos + 5)[0]
            self._violation(conn, "REQUEST without function")
            self._reply(conn, rid, Status.MALFORMED, "REQUEST body is shorter than id and function")
            return
        rid, function = _ID_BYTE_FROM(buf, pos + 5)
        handler = self._request_handlers.get(function)
        if handler is None:
            self._violation(conn, f"unknown function 0x{function:02X}")
            self._reply(conn, rid, Status.UNKNOWN_FUNCTION, f"unknown function 0x{function:02X}")
            return
        handler(conn, buf, pos, end, rid)

    def _malformed(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        """PROTOCOL.md 9.1: a bad body with a readable id: MALFORMED, stay connected."""
        status, message = _why_malformed(_REQUEST, buf[pos + 5 : end])
        self._violation(conn, message)
        self._reply(conn, rid, status, message)

    def _unknown_key(self, conn: Connection, key: bytes, rid: Optional[int], kind: str) -> Optional[str]:
        """Reply for a key that is neither where it was looked for: MALFORMED if it is not
        UTF-8, TOO_LARGE above the key limit, else NOT_FOUND or WRONG_KIND. Returns the
        reason (for a fire-and-forget event, where nobody is answered)."""
        if not is_utf8(key):
            message, status = "key is not valid UTF-8", Status.MALFORMED
        elif len(key) > self._max_key:
            message, status = f"key of {len(key)} bytes exceeds the limit of {self._max_key}", Status.TOO_LARGE
        elif kind == "state" and key in self.registry.methods:
            message, status = "the key is a method", Status.WRONG_KIND
        elif kind == "method" and key in self.registry.states:
            message, status = "the key is a state", Status.WRONG_KIND
        else:
            message, status = f"no such {kind}", Status.NOT_FOUND
        if rid is not None:
            self._reply(conn, rid, status, message)
        return message

    def _check_new_key(self, conn: Connection, key: bytes, rid: int) -> bool:
        if len(key) > self._max_key:
            self._reply(conn, rid, Status.TOO_LARGE, f"key of {len(key)} bytes exceeds the limit of {self._max_key}")
        elif key in self.registry.states or key in self.registry.methods:
            self._reply(conn, rid, Status.ALREADY_EXISTS, "the key is taken")
        elif not is_utf8(key):
            self._reply(conn, rid, Status.MALFORMED, "key is not valid UTF-8")
        elif len(conn.states) + len(conn.methods) >= self.config.max_states_per_connection:
            self._reply(
                conn,
                rid,
                Status.LIMIT_EXCEEDED,
                f"at most {self.config.max_states_per_connection} states and methods per connection",
            )
        else:
            return True
        return False

    def _add_state(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        kend = _key_value_end(buf, pos + 10, end)
        if kend < 0:
            return self._malformed(conn, buf, pos, end, rid)
        key = buf[pos + 12 : kend]
        if not self._check_new_key(conn, key, rid):
            return None
        kv = buf[pos + 10 : end]
        self.registry.add_state(key, kv, conn)
        # PROTOCOL.md 10.5: the fetch events a request causes go out before its OK.
        self._fanout(key, _FETCH_ADD, kv)
        self._send(conn, _ok(rid))
        return None

    def _remove_state(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        if not _key_only_end(buf, pos + 10, end):
            return self._malformed(conn, buf, pos, end, rid)
        key = buf[pos + 12 : end]
        if not self._removable(conn, key, rid, self.registry.states, "state"):
            return None
        kv = self.registry.remove_state(key)
        self._fanout(key, _FETCH_REMOVE, kv)  # PROTOCOL.md 10.5: before the OK
        self.fetches.forget(key)
        self._send(conn, _ok(rid))
        return None

    def _removable(self, conn: Connection, key: bytes, rid: int, owners: dict[bytes, Connection], kind: str) -> bool:
        """True if ``conn`` owns ``key`` in ``owners``; else answers NOT_FOUND or NOT_OWNER."""
        owner = owners.get(key)
        if owner is None:
            self._unknown_key(conn, key, rid, kind)
            return False
        if owner is not conn:
            self._reply(conn, rid, Status.NOT_OWNER, f"only the owner may remove a {kind}")
            return False
        return True

    def _add_method(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        if not _key_only_end(buf, pos + 10, end):
            return self._malformed(conn, buf, pos, end, rid)
        key = buf[pos + 12 : end]
        if not self._check_new_key(conn, key, rid):
            return None
        self.registry.methods[key] = conn
        conn.methods.add(key)
        self._send(conn, _ok(rid))
        return None

    def _remove_method(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        if not _key_only_end(buf, pos + 10, end):
            return self._malformed(conn, buf, pos, end, rid)
        key = buf[pos + 12 : end]
        if not self._removable(conn, key, rid, self.registry.methods, "method"):
            return None
        del self.registry.methods[key]
        conn.methods.discard(key)
        self._send(conn, _ok(rid))
        return None

    def _route_request(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        """PROTOCOL.md 10.3: SET_STATE / CALL_METHOD to the owner under our own id."""
        kend = _key_value_end(buf, pos + 10, end)
        if kend < 0:
            return self._malformed(conn, buf, pos, end, rid)
        key = buf[pos + 12 : kend]
        function = buf[pos + 9]
        owner: Optional[Connection]
        if function == _SET_STATE:
            owner = self.registry.states.get(key)
            kind = "state"
        else:
            owner = self.registry.methods.get(key)
            kind = "method"
        if owner is None:
            self._unknown_key(conn, key, rid, kind)
            return None
        if len(owner.routes) >= self.config.max_pending_per_owner:
            return self._reply(
                conn,
                rid,
                Status.LIMIT_EXCEEDED,
                f"the owner has {self.config.max_pending_per_owner} requests pending",
            )
        if self._small_body_peers and end - pos - 5 > owner.max_body:
            return self._reply(
                conn, rid, Status.TOO_LARGE, f"the owner accepts bodies of at most {owner.max_body} bytes"
            )
        route = self.routes.open(conn, rid, owner, function, key, self.now)
        self.stats.routed += 1
        head = _ID_HEAD_PACK(_REQUEST, end - pos - 5, route.oid)
        tail = buf[pos + 9 : end]
        if self._log is not None:
            # JETLOG.md 4 ROUTE, packed here from the key bytes (route_data would need a str).
            self._log(
                conn.conn_id,
                _ROUTE_KIND,
                _ROUTE_PACK(conn.conn_id, rid, owner.conn_id, route.oid, function, len(key)) + key,
            )
            self._send(owner, head + tail)
        elif owner.paused or owner.closed:
            self._send(owner, head + tail)
        else:
            out = owner.out
            if not out:
                self.dirty.append(owner)
            out.append(head)
            out.append(tail)
        return None

    def _notify(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        kend = _key_value_end(buf, pos + 10, end)
        if kend < 0:
            return self._malformed(conn, buf, pos, end, rid)
        key = buf[pos + 12 : kend]
        owner = self.registry.states.get(key)
        if owner is None:
            self._unknown_key(conn, key, rid, "state")
            return None
        if owner is not conn:
            return self._reply(conn, rid, Status.NOT_OWNER, "only the owner may notify")
        kv = conn.states[key] = buf[pos + 10 : end]
        self._fanout(key, _FETCH_CHANGE, kv)  # PROTOCOL.md 10.5: before the OK
        if conn.parked:
            self._catch_up_on(conn, key, kv)  # it fetches its own state: the change first
        self._send(conn, _ok(rid))
        return None

    def _fetch(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        if not _str16_ok(buf, pos + 10, end):
            return self._malformed(conn, buf, pos, end, rid)
        if len(conn.fetches) >= self.config.max_fetches_per_connection:
            return self._reply(
                conn,
                rid,
                Status.LIMIT_EXCEEDED,
                f"at most {self.config.max_fetches_per_connection} fetches per connection",
            )
        prefix = buf[pos + 12 : end]
        fetch = Fetch(self._next_fetch_id, conn, prefix)
        self._next_fetch_id += 1
        # PROTOCOL.md 10.5: the OK first, then FETCH_ADD in byte order of key, then live.
        self._send(conn, _RESP_HEAD_PACK(_RESPONSE, 9, rid, 0) + fetch.fid_bytes)
        fid_bytes = fetch.fid_bytes
        log_events = self._log_events and self._log is not None
        careful = self._small_body_peers > 0
        for _key, kv in self.registry.matching(prefix):
            head = _EVT_HEAD_PACK(_EVENT, 5 + len(kv), _FETCH_ADD)
            if careful and 5 + len(kv) > conn.max_body:
                self._event_too_large(conn, 5 + len(kv))
                return None
            if conn.paused:
                if not self._enqueue(conn, head + fid_bytes + kv):
                    return None
            else:
                out = conn.out
                out.append(head)
                out.append(fid_bytes)
                out.append(kv)
            if log_events and self._log is not None:
                self._log(conn.conn_id, _FRAME_OUT, head + fid_bytes + kv)
        conn.fetches[fetch.fid] = fetch
        if conn.parked:
            self.parked_fetches.add(fetch)
            self._parked += 1
        else:
            self.fetches.add(fetch)
        return None

    def _unfetch(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        if end - pos != 14:
            return self._malformed(conn, buf, pos, end, rid)
        fid = _U32_FROM(buf, pos + 10)[0]
        if fid not in conn.fetches:
            return self._reply(conn, rid, Status.NOT_FOUND, f"no fetch {fid} on this connection")
        fetch = conn.fetches.pop(fid)
        if conn.parked:
            self.parked_fetches.remove(fetch)
            self._unparked(1)
        else:
            self.fetches.remove(fetch)
        self._send(conn, _ok(rid))
        return None

    def _get(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        if not _key_only_end(buf, pos + 10, end):
            return self._malformed(conn, buf, pos, end, rid)
        key = buf[pos + 12 : end]
        owner = self.registry.states.get(key)
        if owner is None:
            self._unknown_key(conn, key, rid, "state")
            return None
        value = owner.states[key][2 + len(key) :]
        self._send(conn, _RESP_HEAD_PACK(_RESPONSE, 5 + len(value), rid, 0) + value)
        return None

    def _response(self, conn: Connection, buf: bytes, pos: int, end: int) -> None:
        """An owner's answer to a routed request (PROTOCOL.md 10.3, 9.3)."""
        if end - pos < 9:
            self._violation(conn, "RESPONSE without a readable id dropped")
            return
        oid = _U32_FROM(buf, pos + 5)[0]
        route = conn.routes.pop(oid, None)
        if route is None:
            # Late (after TIMEOUT), or invented: dropped (PROTOCOL.md 9.3).
            self._violation(conn, f"dropped response id {oid}: nothing pending under that id")
            return
        route.done = True
        requester = route.requester
        if requester.closed:
            return  # PROTOCOL.md 10.3: requester gone, the answer is dropped
        rid = route.rid
        if requester.parked and route.function == _SET_STATE:
            # PROTOCOL.md 10.5: the change its set caused before the answer.
            owner = self.registry.states.get(route.key)
            if owner is not None:
                self._catch_up_on(requester, route.key, owner.states[route.key])
        if end - pos >= 10:
            status = buf[pos + 9]
            if status == 0:
                rest = end - pos - 10
                if rest == 0 and route.function == _SET_STATE:
                    self._send(requester, _RESP_HEAD_PACK(_RESPONSE, 10, rid, 0) + _NONE_VALUE)
                    return
                if rest >= 5 and _value_ok(buf, pos + 10, end):
                    self._send(requester, _ID_HEAD_PACK(_RESPONSE, end - pos - 5, rid) + buf[pos + 9 : end])
                    return
            elif status <= _MAX_STATUS and _str16_ok(buf, pos + 10, end):
                self._send(requester, _ID_HEAD_PACK(_RESPONSE, end - pos - 5, rid) + buf[pos + 9 : end])
                return
        self._violation(conn, f"malformed RESPONSE to routed request {oid}")
        self._reply(requester, rid, Status.MALFORMED, "the owner answered with a malformed response")

    def _event(self, conn: Connection, buf: bytes, pos: int, end: int) -> None:
        """PROTOCOL.md 7.1, 9.3: fire-and-forget requests and CLOSE; anything bad closes."""
        if end - pos < 6:
            return self._fatal(conn, Status.MALFORMED, "EVENT body is empty")
        code = buf[pos + 5]
        if code in (3, 4, 5):
            kend = _key_value_end(buf, pos + 6, end)
            if kend < 0:
                status, message = _why_malformed(_EVENT, buf[pos + 5 : end])
                return self._fatal(conn, status, message)
            key = buf[pos + 8 : kend]
            if code == _EV_NOTIFY_STATE:
                state_owner = self.registry.states.get(key)
                if state_owner is not conn:
                    reason = self._unknown_key(conn, key, None, "state") if state_owner is None else "not the owner"
                    return self._drop_event(conn, code, key, reason)
                if end - pos - 1 > self._max_body:
                    # Its FETCH_CHANGE (body 4 bytes longer) would exceed the max_body we
                    # announced to the fetchers (PROTOCOL.md 3); the fast path's bound too.
                    return self._fatal(
                        conn, Status.TOO_LARGE, f"NOTIFY_STATE event too large to fetch (max_body {self._max_body})"
                    )
                kv = conn.states[key] = buf[pos + 6 : end]
                self._fanout(key, _FETCH_CHANGE, kv)
                return None
            registry = self.registry
            owner: Optional[Connection] = (registry.states if code == _EV_SET_STATE else registry.methods).get(key)
            if owner is None:
                reason = self._unknown_key(conn, key, None, "state" if code == 3 else "method")
                return self._drop_event(conn, code, key, reason)
            if self._too_large_for(owner, end - pos - 5):
                return self._drop_event(conn, code, key, f"the owner accepts at most {owner.max_body} bytes")
            # PROTOCOL.md 7.1: forwarded as the very same EVENT frame.
            self._send(owner, buf[pos:end])
            return None
        if code == _EV_CLOSE:
            if end - pos < 7 or buf[pos + 6] > _MAX_STATUS or not _str16_ok(buf, pos + 7, end):
                return self._fatal(conn, Status.MALFORMED, "malformed CLOSE")
            # PROTOCOL.md 7.3: treated like a disconnect; nothing is sent back.
            conn.closing = True
            conn.close_reason = "peer sent CLOSE"
            conn.close_at = len(conn.pending) if conn.paused else len(conn.out)
            self._to_close.append(conn)
            return None
        if code in (_FETCH_ADD, _FETCH_CHANGE, _FETCH_REMOVE):
            return self._fatal(conn, Status.MALFORMED, "fetch events may not be sent to the daemon")
        return self._fatal(conn, Status.UNKNOWN_FUNCTION, f"unknown event code 0x{code:02X}")

    def _drop_event(self, conn: Connection, code: int, key: bytes, reason: Optional[str]) -> None:
        """PROTOCOL.md 7.1: a fire-and-forget request that cannot be carried out is dropped."""
        if reason == "key is not valid UTF-8":
            return self._fatal(conn, Status.MALFORMED, "event key is not valid UTF-8")
        self._violation(conn, f"dropped {EventCode(code).name} event for {key!r}: {reason}")
        return None

    def _info(self, conn: Connection, buf: bytes, pos: int, end: int) -> None:
        """PROTOCOL.md 4.4, 9.2: a peer names itself; a bad INFO is fatal."""
        try:
            info = decode_body(_INFO, buf[pos + 5 : end])
        except RemoteProtocolError as exc:
            return self._fatal(conn, Status.MALFORMED, f"malformed INFO: {exc.message}")
        assert isinstance(info, Info)
        if info.major != PROTOCOL_MAJOR:
            return self._fatal(conn, Status.MALFORMED, f"unsupported protocol major version {info.major}")
        if info.max_body < MIN_PEER_MAX_BODY:
            return self._fatal(
                conn, Status.MALFORMED, f"max_body {info.max_body} is below {MIN_PEER_MAX_BODY}: no answer fits"
            )
        conn.name = info.name
        was_small = conn.max_body < self._max_body
        conn.max_body = info.max_body
        self._small_body_peers += (conn.max_body < self._max_body) - was_small
        if self._log is not None:
            self._log(conn.conn_id, LogKind.CONN_NAME, conn_name_data(info.name))
        log.debug("name %s", conn.label)
        return None
