"""The routes part: SET_STATE and CALL_METHOD routed to owners and their answers back,
with the route timeout (PROTOCOL.md 10.3).

:class:`Router` owns the :class:`RouteTable` (the pending routes, in deadline order; each
owner's ``Connection.routes`` by the daemon-chosen id). It asks the registry part who
owns a key, the access part whether a peer may write it, and the subscriptions part to
catch a parked requester up before its answer."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING
from typing import Optional

from jetwire import Status

from .base import Clock
from .base import DaemonStats
from .base import Output
from .base import RouteTimes
from .config import Config
from .connection import Connection
from .frames import ID_HEAD_PACK
from .frames import KNOWN_STATUSES
from .frames import NONE_VALUE
from .frames import REQUEST
from .frames import RESP_HEAD_PACK
from .frames import RESPONSE
from .frames import ROUTE_KIND
from .frames import ROUTE_PACK
from .frames import SET_STATE
from .frames import U32_FROM
from .frames import LogHook
from .frames import key_value_end
from .frames import response_frame
from .frames import str16_ok
from .frames import value_ok
from .scheduler import Scheduler

if TYPE_CHECKING:
    from .access import AccessControl
    from .querying import Queries
    from .registry import Registry
    from .subscriptions import Subscriptions

__all__ = ["Route", "RouteTable", "Router"]


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


class Router:
    """The routes part (see the module docstring)."""

    subscriptions: Subscriptions  # wired by jetd.core.Daemon: catch-up before an answer
    queries: Queries  # wired by jetd.core.Daemon: waiting window updates before an answer
    access: AccessControl  # write (PROTOCOL.md 15.3)
    route_times: RouteTimes  # wired by jetd.core.Daemon: latency by status (issue 33)

    def __init__(self, config: Config, out: Output, clock: Clock, stats: DaemonStats, log_hook: Optional[LogHook],
                 registry: Registry, scheduler: Scheduler) -> None:
        self.config = config
        self.out = out
        self.clock = clock
        self.stats = stats
        self._log = log_hook
        self.registry = registry
        self.scheduler = scheduler
        self.table = RouteTable(config.route_timeout)
        self.expiring = False  # more route timeouts are due than one slice answers

    def expire(self, now: float) -> None:
        """PROTOCOL.md 10.3: answer TIMEOUT for the routes past their deadline, at most a
        slice of them (by the clock, at most Scheduler.expire_slice); ``expiring`` says
        whether more are due:
        between slices the loop serves other peers (Daemon.work goes on with the rest)."""
        scheduler = self.scheduler
        limit = scheduler.expire_slice
        for expired, route in enumerate(self.table.expired(now), 1):
            requester = route.requester
            self.stats.route_timeouts += 1
            self.route_times.observe(Status.TIMEOUT, now - route.deadline)
            self.out.violation(route.owner, f"routed request id {route.oid} not answered within the route timeout")
            if not requester.closed:
                self.out.send(requester, response_frame(route.rid, Status.TIMEOUT, "the owner did not answer in time"))
            if expired >= limit or scheduler.spent():
                self.expiring = True
                return
        self.expiring = False

    def drop_owner(self, conn: Connection) -> None:
        """PROTOCOL.md 10.6: a closing owner's pending routes are answered OWNER_GONE."""
        now = self.clock.now
        for route in conn.routes.values():
            route.done = True
            self.stats.owners_gone += 1
            self.route_times.observe(Status.OWNER_GONE, now - route.deadline)
            if not route.requester.closed:
                self.out.reply(route.requester, route.rid, Status.OWNER_GONE, "the owner disconnected")
        conn.routes.clear()

    def route_request(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        """PROTOCOL.md 10.3: SET_STATE / CALL_METHOD to the owner under our own id."""
        kend = key_value_end(buf, pos + 10, end)
        if kend < 0:
            return self.out.malformed(conn, buf, pos, end, rid)
        key = buf[pos + 12 : kend]
        if conn.writable is not None and not self.access.may_write(conn, key):
            return self.access.not_authorized(conn, rid, "write", key)  # PROTOCOL.md 15.3
        function = buf[pos + 9]
        owner: Optional[Connection]
        if function == SET_STATE:
            owner = self.registry.state_owner(key)
            kind = "state"
        else:
            owner = self.registry.method_owner(key)
            kind = "method"
        if owner is None:
            self.registry.unknown_key(conn, key, rid, kind)
            return None
        if owner.conn_id == 0:  # PROTOCOL.md 16: the daemon's own states ($jet/) are read-only
            return self.registry.reserved(conn, rid, key)
        if owner.closed:  # PROTOCOL.md 10.6: gone, its states removed in slices (issue 29)
            self.stats.owners_gone += 1
            return self.out.reply(conn, rid, Status.OWNER_GONE, "the owner disconnected")
        if len(owner.routes) >= self.config.max_pending_per_owner:
            return self.out.reply(
                conn,
                rid,
                Status.LIMIT_EXCEEDED,
                f"the owner has {self.config.max_pending_per_owner} requests pending",
            )
        if self.out.small_body_peers and end - pos - 5 > owner.max_body:
            return self.out.reply(
                conn, rid, Status.TOO_LARGE, f"the owner accepts bodies of at most {owner.max_body} bytes"
            )
        route = self.table.open(conn, rid, owner, function, key, self.clock.now)
        self.stats.routed += 1
        head = ID_HEAD_PACK(REQUEST, end - pos - 5, route.oid)
        tail = buf[pos + 9 : end]
        if self._log is not None:
            # JETLOG.md 4 ROUTE, packed here from the key bytes (route_data would need a str).
            self._log(
                conn.conn_id,
                ROUTE_KIND,
                ROUTE_PACK(conn.conn_id, rid, owner.conn_id, route.oid, function, len(key)) + key,
            )
            self.out.send(owner, head + tail)
        elif owner.paused or owner.closed:
            self.out.send(owner, head + tail)
        else:
            out = owner.out
            if not out:
                self.out.dirty.append(owner)
            out.append(head)
            out.append(tail)
        return None

    def response(self, conn: Connection, buf: bytes, pos: int, end: int) -> None:
        """An owner's answer to a routed request (PROTOCOL.md 10.3, 9.3)."""
        if end - pos < 9:
            self.out.violation(conn, "RESPONSE without a readable id dropped")
            return
        oid = U32_FROM(buf, pos + 5)[0]
        route = conn.routes.pop(oid, None)
        if route is None:
            # Late (after TIMEOUT), or invented: dropped (PROTOCOL.md 9.3).
            self.out.violation(conn, f"dropped response id {oid}: nothing pending under that id")
            return
        route.done = True
        self.route_times.answers_in += 1
        self.route_times.observe(buf[pos + 9] if end - pos >= 10 else Status.MALFORMED, self.clock.now - route.deadline)
        requester = route.requester
        if requester.closed:
            return  # PROTOCOL.md 10.3: requester gone, the answer is dropped
        rid = route.rid
        if requester in self.queries.stale:
            self.queries.flush_windows(requester)  # PROTOCOL.md 10.8: the events before the answer
        if requester.parked and route.function == SET_STATE:
            # PROTOCOL.md 10.5: the change its set caused before the answer.
            kv = self.registry.value(route.key)
            if kv is not None:
                self.subscriptions.catch_up_on(requester, route.key, kv)
        if end - pos >= 10:
            status = buf[pos + 9]
            if status == 0:
                rest = end - pos - 10
                if rest == 0 and route.function == SET_STATE:
                    self.out.send(requester, RESP_HEAD_PACK(RESPONSE, 10, rid, 0) + NONE_VALUE)
                    return
                if rest >= 5 and value_ok(buf, pos + 10, end):
                    self.out.send(requester, ID_HEAD_PACK(RESPONSE, end - pos - 5, rid) + buf[pos + 9 : end])
                    return
            elif status in KNOWN_STATUSES and str16_ok(buf, pos + 10, end):
                self.out.send(requester, ID_HEAD_PACK(RESPONSE, end - pos - 5, rid) + buf[pos + 9 : end])
                return
        self.out.violation(conn, f"malformed RESPONSE to routed request {oid}")
        self.out.reply(requester, rid, Status.MALFORMED, "the owner answered with a malformed response")
