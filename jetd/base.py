"""The output side every part of the daemon's core writes through: :class:`Output`.

It owns the per-connection output queues' bookkeeping (which connections have output,
``dirty``), the budget of each (PROTOCOL.md 10.8), and closing (a CLOSE frame, then the
connection is torn down by the dispatcher, :mod:`jetd.core`, after the frame that caused
it). Every part (:mod:`jetd.registry`, :mod:`jetd.routes`, :mod:`jetd.subscriptions`,
:mod:`jetd.querying`, :mod:`jetd.access`) is handed the one ``Output`` and calls it; none
queues bytes any other way, except the dispatcher's and the fan-out's inlined hot paths,
which append to ``conn.out`` and ``Output.dirty`` directly (ARCHITECTURE.md).
"""

from __future__ import annotations

import dataclasses
import logging
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from typing import Final
from typing import Optional

from jetwire import Status

from .config import Config
from .connection import Connection
from .frames import FRAME_OUT
from .frames import REQUEST
from .frames import RESPONSE
from .frames import U32_FROM
from .frames import LogHook
from .frames import close_frame
from .frames import response_frame
from .frames import why_malformed

__all__ = ["ROUTE_BUCKETS", "Clock", "DaemonStats", "FrameCounts", "Output", "RouteTimes"]

log = logging.getLogger("jetd")


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
    initial_adds: int = 0  # FETCH_ADD events of new fetches (PROTOCOL.md 10.5)
    violations: int = 0
    # Issue 33 (jetd.metrics reads them once a second, and on a scrape of /metrics):
    bytes_in: int = 0  # bytes fed to receive_data
    bytes_out: int = 0  # bytes written to transports (the IO layer counts them)
    frames_out: int = 0  # frames queued by Output (answers, closes), fan-out and routing not included
    route_timeouts: int = 0  # routed requests answered TIMEOUT (PROTOCOL.md 10.3)
    owners_gone: int = 0  # routed requests answered OWNER_GONE (PROTOCOL.md 10.6)
    slow_closes: int = 0  # slow consumers closed past slow_deadline (PROTOCOL.md 10.8)
    input_overflows: int = 0  # closed for passing max_input_buffer (PROTOCOL.md 10.7)
    auth_failures_gone: int = 0  # failed AUTHENTICATEs of connections already gone

    def summary(self) -> str:
        """One log line: ``name=value`` for every counter."""
        # dataclasses.asdict, not vars(): compiled (mypyc) the instance has no __dict__.
        return " ".join(f"{name}={value}" for name, value in dataclasses.asdict(self).items())


# Upper bounds (seconds) of the routed-request latency histogram (issue 33, /metrics).
ROUTE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


# Final: compiled (mypyc), a plain module constant is a dict lookup on every use; this
# one was a third of observe_ok's cost (BENCHMARKS.md, issue 28).
TABLE_STEP: Final = 0.00005  # seconds: RouteTimes.observe_ok's lookup table's step (every bound is a multiple)
TABLE_STEPS_PER_SECOND: Final = 20000.0
TABLE_STEPS: Final = 2000  # the table covers 0 to 100 ms; above it, bisect


class RouteTimes:
    """How long routed requests took, from the request to its answer, by the answer's
    status (PROTOCOL.md 10.3): a histogram over :data:`ROUTE_BUCKETS` per status.

    A route stores only its deadline (its start plus the route timeout), so the
    histogram is kept on ``now - deadline``: ``shifted`` holds the bucket bounds minus
    the timeout, and ``sums`` the sums of ``now - deadline``; :meth:`histogram` adds the
    timeout back. The dispatcher's fast path (an owner's OK, jetd.core) calls
    :meth:`observe_ok`: below 100 ms a table lookup by 50 µs step, no ``bisect``
    (compiled, a ``bisect`` per answer cost W1 a third: BENCHMARKS.md), and the OKs of
    one bucket in a row are counted in a native integer (``run_length``), added to the
    bucket's list entry only when the bucket changes: a list entry past 256 is a new
    ``int`` object on every increment (issue 28: 29 ns a call before, 4 ns in a run).
    ``ok`` (the counts of OK answers per bucket) includes the run so far.
    """

    __slots__ = ("answers_in", "bucket_of", "careful_ok", "counts", "ok_counts", "ok_sum", "run_bucket",
                 "run_length", "shifted", "sums", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.shifted = [bound - timeout for bound in ROUTE_BUCKETS]
        # status -> counts per bucket (the last one: above every bound), unsummed.
        self.counts: dict[int, list[int]] = {}
        self.sums: dict[int, float] = {}
        self.ok_counts = self.counts_for(0)  # without the run in progress: read ``ok``
        self.ok_sum = 0.0  # the sums of OK answers (sums[0] is not used)
        self.careful_ok = 0  # OKs observed here; the rest of ``ok`` the fast path counted
        self.run_bucket = 0  # the bucket of the fast path's last OK
        self.run_length = 0  # OKs in a row in run_bucket, not yet in ok_counts
        # The bucket of a latency below 100 ms by its 50 us step: every bound below is a
        # multiple of the step, so the step's bucket is the first bound above its start.
        self.bucket_of = [bisect_right(ROUTE_BUCKETS, (step + 0.5) * TABLE_STEP) for step in range(TABLE_STEPS)]
        self.answers_in = 0  # RESPONSE frames the careful way took (jetd.routes)

    @property
    def ok(self) -> list[int]:
        """The counts of OK answers per bucket (the last: above every bound), unsummed."""
        self.ok_counts[self.run_bucket] += self.run_length
        self.run_length = 0
        return self.ok_counts

    def counts_for(self, status: int) -> list[int]:
        counts = self.counts.get(status)
        if counts is None:
            counts = self.counts[status] = [0] * (len(ROUTE_BUCKETS) + 1)
            self.sums[status] = 0.0
        return counts

    def observe_ok(self, since_deadline: float, count: int = 1) -> None:
        """``count`` OKs the dispatcher's fast path passed on, ``now - deadline`` after
        their deadline (0: none)."""
        if not count:
            return
        self.ok_sum += since_deadline * count
        step = int((since_deadline + self.timeout) * TABLE_STEPS_PER_SECOND)
        if 0 <= step < TABLE_STEPS:
            bucket = self.bucket_of[step]
        else:
            bucket = bisect_right(self.shifted, since_deadline)
        if bucket == self.run_bucket:
            self.run_length += count
        else:
            self.ok_counts[self.run_bucket] += self.run_length
            self.run_bucket = bucket
            self.run_length = count

    def observe(self, status: int, since_deadline: float) -> None:
        """One answer with ``status``, ``now - deadline`` seconds after the deadline."""
        if status == 0:
            self.ok_counts[bisect_right(self.shifted, since_deadline)] += 1
            self.ok_sum += since_deadline
            self.careful_ok += 1
            return
        self.counts_for(status)[bisect_right(self.shifted, since_deadline)] += 1
        self.sums[status] += since_deadline

    def fast_ok(self) -> int:
        """OKs the dispatcher's fast path passed on (frames in, /metrics)."""
        return sum(self.ok) - self.careful_ok

    def histogram(self, status: int) -> tuple[list[int], float]:
        """Cumulative counts per bucket (the last: all) and the sum of latencies, in seconds."""
        counts = self.ok if status == 0 else self.counts.get(status)
        if counts is None:
            return [0] * (len(ROUTE_BUCKETS) + 1), 0.0
        cumulative = list(accumulate(counts))
        total = self.ok_sum if status == 0 else self.sums[status]
        return cumulative, max(0.0, total + cumulative[-1] * self.timeout)


class FrameCounts:
    """Frames received, by function and event code (issue 33, /metrics): the careful
    way counts each in its handler; of the fast paths' frames only the routed requests
    are counted here (``fast_routed``, by function); their OKs are
    :meth:`RouteTimes.fast_ok` and their NOTIFY_STATE events what is left of
    :attr:`DaemonStats.frames_in` (:meth:`jetd.metrics.Metrics.frames_in`)."""

    __slots__ = ("events", "fast_routed", "infos", "requests")

    def __init__(self) -> None:
        self.requests = [0] * 256  # by function byte, the careful way
        self.fast_routed = [0] * 256  # by function byte, routed by the fast path
        self.events = [0] * 256  # by event code, the careful way
        self.infos = 0

    def count_fast_routed(self, sets: int, calls: int) -> None:
        """The fast path routed ``sets`` SET_STATE and ``calls`` CALL_METHOD (PROTOCOL.md 6)."""
        self.fast_routed[0x03] += sets
        self.fast_routed[0x05] += calls


class Clock:
    """The monotonic time of the event being handled, set by the dispatcher
    (:mod:`jetd.core`) at each entry from the IO layer (and by the access part when a
    password check run off the loop reports back) and read by the parts: the core never
    reads a clock itself (sans-IO)."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0


class Output:
    """Queues frames for peers, answers them, and closes them (see the module docstring).

    Args:
        config: the daemon's settings (max_body, soft and hard limits).
        stats: the daemon's counters (violations, overloads).
        log_hook: the event log's hook, or None.

    ``end_delivery`` is set by the dispatcher: dropping a connection's output ends its
    delivery of initial adds (jetd.subscriptions), which would otherwise go on queueing.
    """

    def __init__(self, config: Config, stats: DaemonStats, log_hook: Optional[LogHook]) -> None:
        self.config = config
        self.stats = stats
        self._log = log_hook
        self.max_body = config.max_body
        # PROTOCOL.md 10.8: the output budget; past it a connection's input stalls.
        self.out_budget = config.soft_limit
        # Published read-only (the fast paths test them inline): only this part changes them.
        self.small_body_peers = 0  # peers whose INFO announced a max_body below ours
        self.dirty: list[Connection] = []  # connections with output (or a close) to act on
        self.to_close: list[Connection] = []  # closing, to be torn down (jetd.core)
        self.end_delivery: Callable[[Connection], None] = _no_delivery

    def set_peer_max_body(self, conn: Connection, max_body: int) -> None:
        """PROTOCOL.md 3, 4.4: ``conn`` announced ``max_body`` in its INFO."""
        was_small = conn.max_body < self.max_body
        conn.max_body = max_body
        self.small_body_peers += (max_body < self.max_body) - was_small

    def forget_peer(self, conn: Connection) -> None:
        """``conn`` is torn down: its max_body no longer counts."""
        if conn.max_body < self.max_body:
            self.small_body_peers -= 1

    def take_dirty(self) -> list[Connection]:
        """The connections with output to write, and an empty list for the next turn."""
        dirty = self.dirty
        self.dirty = []
        return dirty

    # --- sending ------------------------------------------------------------------------

    def send(self, conn: Connection, frame: bytes) -> None:
        """Queue one (non fan-out) frame for ``conn`` and log it. Past the output budget
        the connection's input stalls (PROTOCOL.md 10.8: answers are never dropped, so
        the peer's further requests wait until it has read them)."""
        if conn.closed:
            return
        self.stats.frames_out += 1
        if (self.small_body_peers or len(frame) - 5 > self.max_body) and len(frame) - 5 > conn.max_body:
            # PROTOCOL.md 3: never send a body above the max_body the peer announced.
            body_length = len(frame) - 5
            if frame[0] == RESPONSE:
                message = f"the answer of {body_length} bytes exceeds your max_body {conn.max_body}"
                frame = response_frame(U32_FROM(frame, 5)[0], Status.TOO_LARGE, message)
            else:
                message = f"a frame of {body_length} bytes exceeds your max_body {conn.max_body}"
                self.close_with(conn, Status.TOO_LARGE, message, close_frame(Status.TOO_LARGE, message))
                return
        if conn.paused:
            if not self.enqueue(conn, frame):
                return
            if conn.pending_size > self.out_budget:
                conn.stalled = True
        else:
            out = conn.out
            if not out:
                self.dirty.append(conn)
            out.append(frame)
            conn.out_size += len(frame)
            if conn.out_size > self.out_budget:
                conn.stalled = True
        if self._log is not None:
            self._log(conn.conn_id, FRAME_OUT, frame)

    def enqueue(self, conn: Connection, frame: bytes) -> bool:
        """Queue ``frame`` for paused ``conn``; above the hard limit CLOSE the peer
        instead. Returns True if the frame is queued (JETLOG.md 4: only those are logged)."""
        conn.enqueue(frame)
        if conn.pending_size + conn.transport_size > self.config.hard_limit:
            self.overload(conn, "output above the hard limit")
            return False
        return True

    def reply(self, conn: Connection, rid: int, status: Status, message: str) -> None:
        self.send(conn, response_frame(rid, status, message))

    def event_too_large(self, conn: Connection, body_length: int) -> None:
        """A fetch event does not fit the fetcher's announced max_body: rather than lose
        it silently, the fetcher is closed with TOO_LARGE."""
        message = f"a fetch event of {body_length} bytes exceeds your max_body {conn.max_body}"
        self.close_with(conn, Status.TOO_LARGE, message, close_frame(Status.TOO_LARGE, message))

    def too_large_for(self, conn: Connection, body_length: int) -> bool:
        """True if ``conn`` announced a max_body below ``body_length`` (PROTOCOL.md 3).
        A fetch event may be 4 bytes above our own max_body (PROTOCOL.md 6.4), so a
        peer announcing ours may be too small for it too."""
        return (self.small_body_peers > 0 or body_length > self.max_body) and body_length > conn.max_body


    # --- closing ------------------------------------------------------------------------

    def violation(self, conn: Connection, message: str) -> None:
        conn.violations += 1
        self.stats.violations += 1
        # One line per violation, but a peer flooding bad frames cannot flood the log.
        if conn.violations <= 10:
            log.info("violation by %s: %s", conn.label, message)
        elif conn.violations == 11:
            log.info("violation by %s: further violations are not logged", conn.label)

    def fatal(self, conn: Connection, status: Status, message: str) -> None:
        """PROTOCOL.md 9.2, 9.3: CLOSE with ``status`` and disconnect; read nothing more."""
        self.violation(conn, message)
        self.close_with(conn, status, message, close_frame(status, message))

    def close_with(self, conn: Connection, status: Status, message: str, frame: bytes) -> None:
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
            self._log(conn.conn_id, FRAME_OUT, frame)
        self.to_close.append(conn)

    def overload(self, conn: Connection, reason: str) -> None:
        """PROTOCOL.md 10.8: drop what is queued, CLOSE (OVERLOADED), disconnect."""
        if conn.closing:
            return
        self.stats.overloaded += 1
        log.info("overloaded %s: %s (%d bytes queued)", conn.label, reason, conn.queued)
        self.drop_output(conn)
        self.close_with(conn, Status.OVERLOADED, reason, close_frame(Status.OVERLOADED, reason))

    def drop_output(self, conn: Connection) -> None:
        """PROTOCOL.md 7.3, 10.8: before a CLOSE the peer would only get after output it
        cannot take, drop that output (queued locally, not yet in the transport), so the
        CLOSE is next after what the transport already holds."""
        conn.pending.clear()
        conn.pending_size = 0
        conn.paused = False  # the CLOSE goes straight to the transport
        conn.out.clear()
        if conn.delivery is not None:
            self.end_delivery(conn)

    def malformed(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        """PROTOCOL.md 9.1: a bad body with a readable id: MALFORMED, stay connected."""
        status, message = why_malformed(REQUEST, buf[pos + 5 : end])
        self.violation(conn, message)
        self.reply(conn, rid, status, message)


def _no_delivery(conn: Connection) -> None:
    return None
