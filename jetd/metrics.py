"""The metrics part: the daemon's own figures, as live states under the reserved prefix
``$jet/`` (PROTOCOL.md 16) and for ``/metrics`` (Prometheus, :mod:`jetd.web`).

:class:`Metrics` gathers its figures from what the other parts keep anyway (the
counters in :class:`jetd.base.DaemonStats`, the route latencies in
:class:`jetd.base.RouteTimes`, the sizes of the registry, the fetch index, the query
groups, each :class:`Connection`), once a second from :meth:`Metrics.tick` (the
dispatcher's periodic tick, which brings the time: the core reads no clock) and on a
scrape: nothing of it runs per frame.

It owns the daemon's own states: ``$jet/daemon`` and one ``$jet/peers/<id>`` per
connection, owned by :attr:`Metrics.owner`, a connection that is never a peer (id 0,
``paused``: nothing is ever written to it). The registry publishes and withdraws them
(:meth:`jetd.registry.Registry.publish`), so fetches, queries and GET_STATE see them
like any state, under the ``read`` rules of PROTOCOL.md 15. A state nobody fetches
(no fetch whose prefix covers it, no query group, nothing parked or being delivered) is
re-encoded at most every :data:`DEFAULT_UNWATCHED_INTERVAL` seconds instead of every
second: a daemon nobody watches pays for one small comparison per peer a second.
"""

from __future__ import annotations

import heapq
import json
import os
import resource
import struct
import sys
from collections.abc import Callable
from itertools import accumulate
from itertools import chain
from typing import TYPE_CHECKING
from typing import Any
from typing import Optional

from jetwire import EventCode
from jetwire import Function
from jetwire import Status

from .base import ROUTE_BUCKETS
from .base import DaemonStats
from .base import FrameCounts
from .base import RouteTimes
from .config import Config
from .connection import Connection
from .eventlog import FSYNC_BUCKETS
from .registry import RESERVED_PREFIX

if TYPE_CHECKING:
    from .eventlog import EventLogStats
    from .querying import Queries
    from .registry import Registry
    from .scheduler import Scheduler
    from .subscriptions import Subscriptions

__all__ = [
    "DAEMON_KEY",
    "DEFAULT_PUBLISH_INTERVAL",
    "DEFAULT_UNWATCHED_INTERVAL",
    "OWNED_LISTED",
    "PEERS_PREFIX",
    "RESERVED_PREFIX",
    "Metrics",
    "resident_bytes",
]

DAEMON_KEY = b"$jet/daemon"
PEERS_PREFIX = b"$jet/peers/"
DEFAULT_PUBLISH_INTERVAL = 1.0  # seconds between two updates of one state, at the most often
DEFAULT_UNWATCHED_INTERVAL = 10.0  # the same for a state nobody fetches
OWNED_LISTED = 20  # PROTOCOL.md 16: the first keys a peer owns, in $jet/peers/<id>
# New $jet/peers/<id> states encoded per tick at most (a storm of connections is spread
# over the next seconds instead of stalling one tick).
MAX_NEW_PEERS_PER_TICK = 1000
TRANSPORTS = ("tcp", "tls", "websocket")

_U16 = struct.Struct(">H")
_VALUE_HEAD = struct.Struct(">BI")
_JSON = 0x05  # PROTOCOL.md 5.3


def json_kv(key: bytes, document: dict[str, Any]) -> bytes:
    """The ``Key, Value`` payload (PROTOCOL.md 5.2, 5.3) of ``key`` with ``document`` as JSON."""
    data = json.dumps(document, separators=(",", ":"), allow_nan=False).encode()
    return _U16.pack(len(key)) + key + _VALUE_HEAD.pack(_JSON, len(data)) + data


def resident_bytes() -> int:
    """The process's resident memory in bytes (``/proc/self/statm``; elsewhere the peak,
    from ``getrusage``)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def transport_of(conn: Connection) -> str:
    """``tcp``, ``tls`` or ``websocket``: what carries ``conn`` (asked of its IO shell)."""
    io = conn.io
    name = getattr(io, "transport_name", None)
    if isinstance(name, str):
        return name
    raw = getattr(io, "raw", None)
    if raw is not None and raw.get_extra_info("ssl_object") is not None:
        return "tls"
    return "tcp"


def quantile_ms(counts: list[int], q: float, bounds: tuple[float, ...] = ROUTE_BUCKETS) -> float:
    """The upper bound, in ms, of the bucket holding quantile ``q`` of a histogram's
    (unsummed) ``counts`` over ``bounds``; 0 when it is empty."""
    total = sum(counts)
    if not total:
        return 0.0
    rank = q * total
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank and count:
            bound = bounds[index] if index < len(bounds) else bounds[-1]
            return round(bound * 1000, 3)
    return round(bounds[-1] * 1000, 3)


def fsync_p99_ms(log_stats: EventLogStats) -> float:
    """p99 of the event log's group-commit fsyncs since the start (bucket upper bound)."""
    return quantile_ms(list(log_stats.sync_buckets), 0.99, FSYNC_BUCKETS)


def _name(codes: type[Function] | type[EventCode], code: int) -> str:
    try:
        return codes(code).name
    except ValueError:
        return f"0x{code:02X}"


class _Peer:
    """What was last published for one connection."""

    __slots__ = ("fields", "key", "published_at", "transport")

    def __init__(self, key: bytes, transport: str) -> None:
        self.key = key
        self.transport = transport
        self.fields: Optional[tuple[Any, ...]] = None
        self.published_at = 0.0


class Metrics:
    """The metrics part (see the module docstring).

    Args:
        config: the daemon's settings.
        stats: the daemon's counters.
        route_times: the routed-request latencies.
        frame_counts: frames received by function and event code.
        connections: the dispatcher's connections by id (read, never changed).

    Set by the IO layer: ``log_stats``, the event log's counters (None: no event log),
    and ``version``; ``resident`` may be replaced (tests).
    """

    registry: Registry  # wired by jetd.core.Daemon: publish and withdraw its states
    subscriptions: Subscriptions  # who fetches what (is a state watched?)
    queries: Queries  # query groups (they may match any key)
    scheduler: Scheduler  # issue 29: the $jet/peers updates of one interval go in slices

    def __init__(self, config: Config, stats: DaemonStats, route_times: RouteTimes, frame_counts: FrameCounts,
                 connections: dict[int, Connection]) -> None:
        self.config = config
        self.stats = stats
        self.route_times = route_times
        self.frame_counts = frame_counts
        self.connections = connections
        # The owner of $jet/: never a peer, and nothing is ever sent to it (a request
        # routed to it could never be answered: the router refuses them, the dispatcher
        # drops events for it). Paused, so that no fast path takes it for a live owner.
        self.owner = Connection(0, "jetd")
        self.owner.name = "jetd"
        self.owner.paused = True
        self.log_stats: Optional[EventLogStats] = None
        self.version = ""
        self.resident: Callable[[], int] = resident_bytes
        self.interval = DEFAULT_PUBLISH_INTERVAL
        self.unwatched_interval = DEFAULT_UNWATCHED_INTERVAL
        self.started: Optional[float] = None
        self._next_at = 0.0
        self._peers: dict[int, _Peer] = {}
        # Issue 29: the connections whose $jet/peers state this interval's sync has yet
        # to bring up to date (gone ones first), handled a slice per tick.
        self._gone: list[int] = []
        self._todo: list[int] = []
        self._daemon_fields: Optional[tuple[Any, ...]] = None
        self._daemon_at = 0.0
        self._route_seen: list[int] = [0] * (len(ROUTE_BUCKETS) + 1)
        self._route_recent = (0.0, 0.0)  # p50, p99 (ms) of the routes answered in the last interval
        # Issue 29: the longest call into the core (seconds) since the last interval, kept
        # by jetd.core.Daemon (note_call), and the figure of the last interval (ms).
        self.call_max = 0.0
        self.longest_call_ms = 0.0

    # --- figures ------------------------------------------------------------------------

    def transport_counts(self) -> dict[tuple[str, bool], int]:
        """Connections by (transport, authenticated)."""
        counts: dict[tuple[str, bool], int] = {}
        peers = self._peers
        for conn in self.connections.values():
            if conn.closing:
                continue
            peer = peers.get(conn.conn_id)
            transport = peer.transport if peer is not None else transport_of(conn)
            index = (transport, conn.user is not None)
            counts[index] = counts.get(index, 0) + 1
        return counts

    def fetch_count(self) -> int:
        """Live fetches and query fetches of every connection."""
        return sum(len(conn.fetches) + len(conn.query_fetches) for conn in self.connections.values())

    def auth_failures(self) -> int:
        """Failed AUTHENTICATEs since the start (PROTOCOL.md 15.2)."""
        live = sum(conn.auth_failures for conn in self.connections.values())
        return self.stats.auth_failures_gone + live

    def daemon_figures(self, now: float) -> dict[str, Any]:
        """The document of ``$jet/daemon`` (PROTOCOL.md 16), at ``now``."""
        stats = self.stats
        by_transport = dict.fromkeys(TRANSPORTS, 0)
        authenticated = 0
        for (transport, is_user), count in self.transport_counts().items():
            by_transport[transport] = by_transport.get(transport, 0) + count
            authenticated += count if is_user else 0
        log_stats = self.log_stats
        p50, p99 = self._route_recent
        return {
            "version": self.version,
            "uptime_s": round(now - self.started, 1) if self.started is not None else 0.0,
            "connections": by_transport,
            "authenticated": authenticated,
            "states": len(self.registry.states),
            "methods": len(self.registry.methods),
            "fetches": self.fetch_count(),
            "query_groups": len(self.queries.index.by_signature),
            "frames_in": stats.frames_in,
            "frames_out": self.frames_out(),
            "bytes_in": stats.bytes_in,
            "bytes_out": stats.bytes_out,
            "routed": stats.routed,
            "route_timeouts": stats.route_timeouts,
            "route_p50_ms": p50,
            "route_p99_ms": p99,
            "owners_gone": stats.owners_gone,
            "slow_pauses": stats.parked,
            "slow_closes": stats.slow_closes,
            "budget_closes": self.budget_closes(),
            "auth_failures": self.auth_failures(),
            "log_bytes": log_stats.bytes if log_stats is not None else 0,
            "fsync_p99_ms": fsync_p99_ms(log_stats) if log_stats is not None else 0.0,
            "fsync_errors": log_stats.failures if log_stats is not None else 0,
            "rss_bytes": self.resident(),
            "longest_call_ms": self.longest_call_ms,
        }

    def frames_in(self) -> dict[tuple[str, str], int]:
        """Frames received by (frame type, function or event name): ``("request",
        "SET_STATE")``, ``("event", "NOTIFY_STATE")``, ``("response", "")``, ``("info", "")``.
        A code the protocol does not know is named by its number."""
        counts = self.frame_counts
        found: dict[tuple[str, str], int] = {}
        careful = 0
        for code, (slow, fast) in enumerate(zip(counts.requests, counts.fast_routed, strict=True)):
            if slow or fast:
                found["request", _name(Function, code)] = slow + fast
                careful += slow + fast
        for code, count in enumerate(counts.events):
            if count:
                found["event", _name(EventCode, code)] = count
                careful += count
        responses = self.route_times.answers_in + self.route_times.fast_ok()
        found["response", ""] = responses
        found["info", ""] = counts.infos
        # The fast path's NOTIFY_STATE events are what no handler counted.
        fast_notify = self.stats.frames_in - careful - responses - counts.infos
        if fast_notify > 0:
            notify = ("event", "NOTIFY_STATE")
            found[notify] = found.get(notify, 0) + fast_notify
        return found

    def frames_out(self) -> int:
        """Frames queued for peers: answers and closes, fetch events and initial adds,
        routed requests (the answers to them are counted as answers)."""
        stats = self.stats
        return stats.frames_out + stats.fanout_events + stats.initial_adds + stats.routed

    def budget_closes(self) -> int:
        """Peers closed for a budget: output above the hard limit (OVERLOADED, the slow
        consumers past their deadline not included) or input above max_input_buffer."""
        stats = self.stats
        return stats.overloaded - stats.slow_closes + stats.input_overflows

    def peer_figures(self, conn: Connection, transport: str) -> dict[str, Any]:
        """The document of ``$jet/peers/<id>`` (PROTOCOL.md 16)."""
        owned = heapq.nsmallest(OWNED_LISTED, chain(conn.states, conn.methods))
        return {
            "id": conn.conn_id,
            "name": conn.name,
            "address": conn.address,
            "transport": transport,
            "user": conn.user,
            "states": len(conn.states),
            "methods": len(conn.methods),
            "owned": [key.decode("utf-8", "replace") for key in owned],
            "fetches": len(conn.fetches) + len(conn.query_fetches),
            "queued_bytes": conn.queued,
            "paused": conn.paused,
        }

    # --- the live states ------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Called with every tick of the dispatcher; at most once per ``interval`` it
        brings ``$jet/`` up to date: a state per new connection, none for a gone one,
        and the changed ones re-published. The peers' states go in slices of the
        scheduler (issue 29, PROTOCOL.md 16.3): what a slice leaves waits for the next ticks."""
        if self.started is None:
            self.started = now
        if now < self._next_at:
            if self._gone or self._todo:
                self._sync_slice(now)
            return
        self._next_at = now + self.interval
        self._recent_routes()
        self.longest_call_ms = round(self.call_max * 1000, 1)
        self.call_max = 0.0
        self._sync_peers(now)
        self._publish_daemon(now)

    def _watched(self, key: bytes) -> bool:
        """Would a change of ``key`` reach anybody now? (False may be wrong only
        for a GET_STATE, which then reads a value up to ``unwatched_interval`` old.)"""
        subscriptions = self.subscriptions
        return bool(
            subscriptions.parked
            or subscriptions.delivering_count
            or self.queries.index.by_signature
            or subscriptions.fetches.groups(key)
        )

    def _due(self, key: bytes, published_at: float, now: float) -> bool:
        return now - published_at >= self.unwatched_interval or self._watched(key)

    def _sync_peers(self, now: float) -> None:
        """Start this interval's sync (the rest of the last one's is folded in)."""
        peers = self._peers
        live = self.connections
        self._gone = [cid for cid in peers if cid not in live or live[cid].closing]
        self._todo = [cid for cid, conn in live.items() if not conn.closing]
        self._sync_slice(now)

    def _sync_slice(self, now: float) -> None:
        """One slice of the sync: withdraw gone peers' states, then publish new and
        changed ones, until the scheduler says the slice is over (at least one each
        call, so that the sync always ends)."""
        peers = self._peers
        live = self.connections
        registry = self.registry
        spend = self.scheduler.spend
        # A state costs tens of microseconds (a JSON document and its fan-out): the
        # clock is read after each one.
        cost = self.scheduler.check_every
        gone = self._gone
        while gone:
            peer = peers.pop(gone.pop(), None)
            if peer is not None:
                registry.withdraw(peer.key)
                if spend(cost):
                    return
        todo = self._todo
        new = 0
        while todo:
            conn_id = todo.pop()
            conn = live.get(conn_id)
            if conn is None or conn.closing:
                continue
            peer = peers.get(conn_id)
            if peer is None:
                if new >= MAX_NEW_PEERS_PER_TICK:
                    continue
                new += 1
                peer = peers[conn_id] = _Peer(PEERS_PREFIX + str(conn_id).encode(), transport_of(conn))
            fields = (conn.name, conn.user, len(conn.states), len(conn.methods),
                      len(conn.fetches) + len(conn.query_fetches), conn.queued, conn.paused)
            if fields == peer.fields or (peer.fields is not None and not self._due(peer.key, peer.published_at, now)):
                continue
            peer.fields = fields
            peer.published_at = now
            registry.publish(self.owner, peer.key, json_kv(peer.key, self.peer_figures(conn, peer.transport)))
            if spend(cost):
                return

    def _publish_daemon(self, now: float) -> None:
        figures = self.daemon_figures(now)
        # Published while it changes: the uptime alone is no change.
        fields = tuple(value for name, value in figures.items() if name != "uptime_s")
        if fields == self._daemon_fields:
            return
        if self._daemon_fields is not None and not self._due(DAEMON_KEY, self._daemon_at, now):
            return
        self._daemon_fields = fields
        self._daemon_at = now
        self.registry.publish(self.owner, DAEMON_KEY, json_kv(DAEMON_KEY, figures))

    def _recent_routes(self) -> None:
        """p50 and p99 of the routes answered OK since the last interval."""
        counts = self.route_times.ok
        recent = [count - before for count, before in zip(counts, self._route_seen, strict=True)]
        self._route_seen = list(counts)
        if any(recent):
            self._route_recent = (quantile_ms(recent, 0.5), quantile_ms(recent, 0.99))
        else:
            self._route_recent = (0.0, 0.0)


# --- /metrics: Prometheus' text exposition format ------------------------------------------


def exposition(metrics: Metrics, now: float) -> bytes:
    """The figures of ``metrics`` at ``now`` in Prometheus' text format (version 0.0.4),
    written by prometheus-client's own ``generate_latest`` from a collector that reads
    them at this scrape (nothing is kept between scrapes)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(metrics, now))
    return generate_latest(registry)


class _Collector:
    """A custom collector (prometheus-client's ``Collector`` protocol): every family is
    built at scrape time from the daemon's counters."""

    def __init__(self, metrics: Metrics, now: float) -> None:
        self.metrics = metrics
        self.now = now

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily
        from prometheus_client.core import GaugeMetricFamily
        from prometheus_client.core import HistogramMetricFamily

        m = self.metrics
        stats = m.stats
        connections = GaugeMetricFamily("jetd_connections", "Connected peers by transport and authentication",
                                        labels=["transport", "authenticated"])
        counts = m.transport_counts()
        for transport in TRANSPORTS:
            for is_user in (False, True):
                connections.add_metric([transport, "true" if is_user else "false"], counts.get((transport, is_user), 0))
        yield connections
        frames_in = CounterMetricFamily("jetd_frames_in", "Frames received, by frame type and function or event",
                                        labels=["frame", "function"])
        for (frame, name), count in sorted(m.frames_in().items()):
            frames_in.add_metric([frame, name], count)
        yield frames_in
        out = CounterMetricFamily("jetd_frames_out", "Frames queued for peers, by kind", labels=["kind"])
        out.add_metric(["answer"], stats.frames_out)
        out.add_metric(["fetch_event"], stats.fanout_events + stats.initial_adds)
        out.add_metric(["routed_request"], stats.routed)
        yield out
        yield _counter("jetd_bytes_in", "Bytes received from peers", stats.bytes_in)
        yield _counter("jetd_bytes_out", "Bytes written to peers", stats.bytes_out)
        latency = HistogramMetricFamily("jetd_route_latency_seconds",
                                        "Time from a routed SET_STATE/CALL_METHOD to its answer, by status",
                                        labels=["status"])
        route_times = m.route_times
        for status in sorted(route_times.counts):
            cumulative, total = route_times.histogram(status)
            buckets = [(repr(bound), count) for bound, count in zip(ROUTE_BUCKETS, cumulative, strict=False)]
            buckets.append(("+Inf", cumulative[-1]))
            latency.add_metric([_name_status(status)], buckets, total)
        yield latency
        yield _counter("jetd_routed", "Requests routed to owners", stats.routed)
        yield _counter("jetd_route_timeouts", "Routed requests answered TIMEOUT", stats.route_timeouts)
        yield _counter("jetd_owners_gone", "Routed requests answered OWNER_GONE", stats.owners_gone)
        yield _counter("jetd_slow_pauses", "Times a slow consumer's fetches were parked", stats.parked)
        yield _counter("jetd_slow_closes", "Slow consumers closed past the deadline", stats.slow_closes)
        yield _counter("jetd_budget_closes", "Peers closed for an input or output budget", m.budget_closes())
        yield _counter("jetd_auth_failures", "AUTHENTICATE answered AUTH_FAILED", m.auth_failures())
        log_stats = m.log_stats
        yield _counter("jetd_event_log_bytes", "Bytes handed to the event log", log_stats.bytes if log_stats else 0)
        fsync = HistogramMetricFamily("jetd_event_log_fsync_seconds", "Time of the event log's group-commit fsyncs")
        if log_stats is not None:
            cumulative = list(accumulate(log_stats.sync_buckets))
            buckets = [(repr(bound), count) for bound, count in zip(FSYNC_BUCKETS, cumulative, strict=False)]
            fsync.add_metric([], [*buckets, ("+Inf", cumulative[-1])], log_stats.sync_seconds)
        yield fsync
        yield _counter("jetd_event_log_errors", "Times the event log stopped on an error",
                       log_stats.failures if log_stats else 0)
        yield _gauge("jetd_states", "States in the registry", len(m.registry.states))
        yield _gauge("jetd_methods", "Methods in the registry", len(m.registry.methods))
        yield _gauge("jetd_fetches", "Live fetches and query fetches", m.fetch_count())
        yield _gauge("jetd_query_groups", "Distinct live queries", len(m.queries.index.by_signature))
        yield _gauge("jetd_resident_memory_bytes", "Resident memory of the daemon", m.resident())
        yield _gauge("jetd_longest_call_seconds",
                     "The longest call into the daemon's core (one read, work turn, tick or disconnect) in the last second",
                     m.longest_call_ms / 1000)
        started = m.started
        yield _gauge("jetd_uptime_seconds", "Seconds since the daemon started", self.now - started if started else 0.0)


def _counter(name: str, documentation: str, value: float) -> Any:
    from prometheus_client.core import CounterMetricFamily

    return CounterMetricFamily(name, documentation, value=value)


def _gauge(name: str, documentation: str, value: float) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(name, documentation, value=value)


def _name_status(status: int) -> str:
    try:
        return Status(status).name
    except ValueError:
        return f"0x{status:02X}"
