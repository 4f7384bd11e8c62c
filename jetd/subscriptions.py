"""The subscriptions part: fetches, the prefix index, fan-out of fetch events, and
parking the fetches of slow consumers (PROTOCOL.md 6.8, 6.9, 7.2, 10.5, 10.8).

:class:`Subscriptions` owns the fetch indexes (live, parked, delivering), the change
sequence of parked fetches, the fetch ids and the set of slow connections. It reads
states through the registry part, hands query fetches their share through the queries
part, and wakes connections whose delivery goes on through the scheduler.

Slow consumers (PROTOCOL.md 10.8): while a connection is paused its fetches are
*parked*, out of the fetch index, so a change costs a paused peer nothing. While any
fetch is parked, a change stores one sequence number under its key in one daemon-wide
dict (a single store per change, however many peers are paused). A parked connection
catches up on one key before that key's FETCH_REMOVE and before the answer to its own
SET_STATE or NOTIFY_STATE of that key (PROTOCOL.md 10.5), and on every key changed
after its mark when its queue has drained: that catch-up is queued like any other
output, under the hard limit, and the fetches are live again once it is written.

Initial adds (PROTOCOL.md 10.5) are delivered in slices (:class:`Delivery`): a few
thousand per loop turn and never past the connection's output budget, so that one
fetch of a million states neither stalls the other peers nor queues gigabytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from collections.abc import Iterator
from typing import TYPE_CHECKING
from typing import Optional

from jetwire import Status

from .base import Clock
from .base import DaemonStats
from .base import Output
from .config import Config
from .connection import Connection
from .frames import CHANGE_HEADS
from .frames import CHANGE_HEADS_BELOW
from .frames import EVENT
from .frames import EVT_HEAD_PACK
from .frames import FETCH_ADD
from .frames import FETCH_CHANGE
from .frames import FETCH_REMOVE
from .frames import FRAME_OUT
from .frames import RESP_HEAD_PACK
from .frames import RESPONSE
from .frames import U32_FROM
from .frames import U32_PACK
from .frames import LogHook
from .frames import ok_frame
from .frames import str16_ok
from .registry import RESERVED_PREFIX
from .registry import reserved_hidden
from .scheduler import DEFAULT_FAN_CHUNK
from .scheduler import DEFAULT_FAN_STRIDE
from .scheduler import Scheduler

if TYPE_CHECKING:
    from .access import AccessControl
    from .access import Permissions
    from .querying import Queries
    from .registry import Registry

__all__ = ["Delivery", "FanOut", "Fetch", "FetchRegistry", "Subscriptions"]

log = logging.getLogger("jetd")

InitialSource = Callable[[Optional[bytes]], Iterator[tuple[bytes, bytes]]]
"""``source(after)``: (key, ``Key, Value`` payload) of the states a new fetch matches,
in byte order of key, above ``after`` (all if None)."""


class Fetch:
    """One fetch: its daemon-unique id (and that id packed once), its connection and prefix.

    ``prefixes`` are what the fetch index files it under: ``(prefix,)``, or with
    permissions (PROTOCOL.md 15.4) the disjoint prefixes its connection may read within
    ``prefix`` (:meth:`jetd.access.PrefixSet.narrow`), possibly none.
    """

    __slots__ = ("change_head", "change_prefix", "conn", "fid", "fid_bytes", "prefix", "prefixes")

    def __init__(self, fid: int, conn: Connection, prefix: bytes, prefixes: Optional[tuple[bytes, ...]] = None) -> None:
        self.fid = fid
        self.fid_bytes = U32_PACK(fid)
        # The last FETCH_CHANGE head the fan-out used (one of jetd.frames.CHANGE_HEADS)
        # and that head followed by this fetch's id: two pieces per event, not three.
        self.change_head = b""
        self.change_prefix = b""
        self.conn = conn
        self.prefix = prefix
        self.prefixes = (prefix,) if prefixes is None else prefixes


class Delivery:
    """A new fetch whose initial adds (PROTOCOL.md 10.5) are being delivered in slices.

    Each slice reads a fresh iterator from ``source(cursor)`` (the registry may change
    between slices) and queues FETCH_ADD events up to the slice size or the output
    budget. Until the last one the fetch is not live: it sits in ``Daemon.delivering``,
    and a fetch event for a key at or below ``cursor`` (already added) is kept in
    ``held``, to follow the last initial add in the order it happened; a key above
    ``cursor`` needs nothing, since its FETCH_ADD, if it still matches when the slice
    gets there, carries the value of that moment. The connection's input stalls
    meanwhile (PROTOCOL.md 10.5: nothing it asks next is answered in between).

    A fetch whose adds come in another order than key order (a query) supplies its own
    ``source`` and must keep ``cursor`` meaning "every key <= cursor is delivered".
    """

    __slots__ = ("cursor", "fetch", "held", "held_size", "source")

    for_query = False  # jetd.querying.QueryDelivery is the other kind

    def __init__(self, fetch: Fetch, source: InitialSource) -> None:
        self.fetch = fetch
        self.source = source
        self.cursor: Optional[bytes] = None  # the last key added
        self.held: list[bytes] = []
        self.held_size = 0


class FanOut:
    """The rest of an owner's fan-out to many fetches, past a slice (issue 29): the
    fetch event ``code`` (FETCH_CHANGE of a NOTIFY_STATE; FETCH_ADD of an ADD_STATE;
    FETCH_REMOVE of a REMOVE_STATE) of ``kv`` (body ``body_length``, frame head
    ``head``) for ``targets[next:]``, the live fetches the change matched. It waits in
    ``Subscriptions.fanning`` under its owner, whose input stalls until it is done, so
    no later change of the key (only the owner changes it) overtakes it; ``reply``, the
    request's OK, goes to the owner after the last slice (PROTOCOL.md 10.5: the events
    a request causes precede its OK)."""

    __slots__ = ("body_length", "generation", "head", "key", "kv", "next", "reply", "targets")

    def __init__(self, key: bytes, code: int, kv: bytes, targets: list[Fetch], generation: int) -> None:
        self.key = key
        # The live index's generation when the change was made: while it stands, no
        # target has gone, been parked or narrowed (each changes the index).
        self.generation = generation
        self.kv = kv
        self.body_length = 5 + len(kv)
        size = len(kv)
        # The shared heads of the inline fan-out: each fetch keeps its head + id joined
        # for the head it last saw (fan_change), so it is not joined again per event.
        self.head = (CHANGE_HEADS[size] if code == FETCH_CHANGE and size < CHANGE_HEADS_BELOW
                     else EVT_HEAD_PACK(EVENT, self.body_length, code))
        self.targets = targets  # the index's cached list: read, never changed
        self.next = 0
        self.reply: Optional[bytes] = None


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
        """Index a new fetch under its prefixes (disjoint: a key matches one at most)."""
        self.generation += 1
        for prefix in fetch.prefixes:
            self.by_prefix.setdefault(prefix, {})[fetch.fid] = fetch
            n = len(prefix)
            count = self._length_counts.get(n, 0)
            self._length_counts[n] = count + 1
            if count == 0:
                self.lengths = sorted(self._length_counts)

    def remove(self, fetch: Fetch) -> None:
        """Drop a fetch (UNFETCH or its connection closed)."""
        self.generation += 1
        for prefix in fetch.prefixes:
            group = self.by_prefix[prefix]
            del group[fetch.fid]
            if not group:
                del self.by_prefix[prefix]
            n = len(prefix)
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
            if n == 0 and key.startswith(RESERVED_PREFIX):
                continue  # PROTOCOL.md 16.1: the empty prefix does not match $jet/
            group = by_prefix.get(key[:n])
            if group:
                found.append(group)
        return found


class Subscriptions:
    """The subscriptions part (see the module docstring): FETCH_STATES and UNFETCH,
    fan-out, and the flow control of slow consumers.

    Published read-only for the dispatcher's inlined NOTIFY fan-out: ``fetches`` (the
    live index), ``parked`` (how many fetches are parked) and ``delivering_count``;
    a change while ``parked`` goes through :meth:`note_change`, while
    ``delivering_count`` through :meth:`hold`.
    """

    queries: Queries  # wired by jetd.core.Daemon: the query side of every change
    access: AccessControl  # read (PROTOCOL.md 15.3)

    def __init__(self, config: Config, out: Output, clock: Clock, stats: DaemonStats, log_hook: Optional[LogHook],
                 registry: Registry, scheduler: Scheduler) -> None:
        self.config = config
        self.out = out
        self.clock = clock
        self.stats = stats
        self._log = log_hook
        self._log_events = log_hook is not None and config.log_events
        self.registry = registry
        self.scheduler = scheduler
        self.fetches = FetchRegistry()
        # PROTOCOL.md 10.8: the fetches of paused connections, for their ADD/REMOVE events.
        self.parked_fetches = FetchRegistry()
        self.parked = 0  # how many fetches are parked
        # While any is parked: key -> sequence number of its last change (self.seq).
        self.changed: dict[bytes, int] = {}
        self.seq = 0
        # PROTOCOL.md 10.5: new fetches whose initial adds are under way (Delivery).
        self.delivering = FetchRegistry()
        self.delivering_count = 0
        self.slow: set[Connection] = set()  # paused connections (PROTOCOL.md 10.8 deadline)
        # Issue 29: owners whose NOTIFY_STATE fan-out goes on in later slices (FanOut).
        self.fanning: dict[Connection, FanOut] = {}
        self.next_fetch_id = 1  # PROTOCOL.md 10.5: jetd counts from 1, never reuses

    def new_fetch_id(self) -> int:
        """The id of a new fetch, plain or query (PROTOCOL.md 10.5)."""
        fid = self.next_fetch_id
        self.next_fetch_id += 1
        return fid

    def note_change(self, key: bytes) -> None:
        """PROTOCOL.md 10.8: ``key`` changed while fetches are parked."""
        self.seq += 1
        self.changed[key] = self.seq

    def forget(self, key: bytes) -> None:
        """``key`` is gone: drop its cached fetch targets."""
        self.fetches.forget(key)

    def stuck(self, now: float, deadline: float) -> list[Connection]:
        """PROTOCOL.md 10.8: the paused connections paused for more than ``deadline``."""
        return [c for c in self.slow if c.slow_since is not None and now - c.slow_since > deadline]

    def gone(self, conn: Connection) -> None:
        """``conn``'s transport is gone: it is no longer a slow consumer."""
        self.slow.discard(conn)

    def drop_fetches(self, conn: Connection) -> None:
        """A closing connection's plain fetches end (PROTOCOL.md 10.6). The rest of a
        fan-out it owes others goes out first, whole: their FETCH_CHANGE precedes the
        FETCH_REMOVE of its states."""
        rest = self.fanning.pop(conn, None)
        if rest is not None:
            self._fan_slice(rest, False)
        fetches = self.parked_fetches if conn.parked else self.fetches
        for fetch in conn.fetches.values():
            fetches.remove(fetch)
        if conn.parked:
            conn.parked = False
            self._unparked(len(conn.fetches))
        conn.fetches.clear()
        self.slow.discard(conn)

    # --- flow control (called by the IO layer) -------------------------------------------

    def pause(self, conn: Connection, transport_size: int) -> None:
        """The transport's buffer went above the soft limit: queue locally from now on,
        and park the connection's fetches (PROTOCOL.md 10.8)."""
        conn.transport_size = transport_size
        if not conn.paused:
            conn.paused = True
            conn.slow_since = self.clock.now
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
        if conn.query_fetches and self.queries.catch_up(conn):
            # PROTOCOL.md 14.3: held query events first; called again once written.
            return False
        if conn.parked:
            if self.seq != conn.mark:
                self._catch_up(conn)
                if conn.pending or conn.closing:
                    return False
            self._unpark(conn)
        conn.paused = False
        conn.transport_size = 0
        conn.slow_since = None
        self.slow.discard(conn)
        if conn.stalled:
            self.scheduler.wake(conn)  # its delivery or held input goes on (Daemon.work)
        log.debug("drained %s", conn.label)
        return True

    def _park(self, conn: Connection) -> None:
        conn.parked = True
        conn.mark = self.seq
        live, parked = self.fetches, self.parked_fetches
        for fetch in conn.fetches.values():
            live.remove(fetch)
            parked.add(fetch)
        self.parked += len(conn.fetches)
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
        self.parked -= count
        if not self.parked:
            self.changed.clear()

    def _catch_up(self, conn: Connection) -> None:
        """Queue for parked ``conn`` a FETCH_CHANGE with the latest value per (fetch, key)
        changed since its mark and not caught up on one by one since (PROTOCOL.md 10.8);
        CLOSE it above the hard limit."""
        mark = conn.mark
        conn.mark = self.seq
        caught = conn.caught
        registry = self.registry
        sent = 0
        for key, changed in self.changed.items():
            if changed > mark and changed > caught.get(key, 0):
                kv = registry.value(key)
                if kv is not None:
                    sent += self._catch_up_key(conn, key, kv)
                    if conn.closing:
                        break
        caught.clear()
        self.stats.caught_up += sent
        if conn.pending_size + conn.transport_size > self.config.hard_limit:
            self.out.overload(conn, "output above the hard limit")

    def catch_up_on(self, conn: Connection, key: bytes, kv: bytes) -> None:
        """Parked ``conn`` catches up on ``key`` alone (its value ``kv``), if it changed
        since the connection's mark and since it last caught up on it."""
        if conn.query_fetches:
            self.queries.release(conn, key)
        changed = self.changed.get(key, 0)
        if changed > conn.mark and changed > conn.caught.get(key, 0) and not conn.closing:
            conn.caught[key] = self.seq
            self.stats.caught_up += self._catch_up_key(conn, key, kv)

    def _catch_up_key(self, conn: Connection, key: bytes, kv: bytes) -> int:
        """Queue for parked ``conn`` (so paused: only a closing one is not, and it is not
        caught up) the FETCH_CHANGE of ``key`` (value ``kv``) for each of its fetches that
        matches; returns how many."""
        body_length = 5 + len(kv)
        if self.out.too_large_for(conn, body_length):
            self.out.event_too_large(conn, body_length)
            return 0
        head = EVT_HEAD_PACK(EVENT, body_length, FETCH_CHANGE)
        log = self._log if self._log_events else None
        sent = 0
        for fetch in conn.fetches.values():
            if key.startswith(fetch.prefixes) and not reserved_hidden(fetch.prefixes[0], key):
                frame = head + fetch.fid_bytes + kv
                conn.enqueue(frame)
                if log is not None:
                    log(conn.conn_id, FRAME_OUT, frame)
                sent += 1
        return sent

    def fan_change(self, targets: list[Fetch], head: bytes, kv: bytes) -> None:
        """The FETCH_CHANGE of ``kv`` (its frame head ``head``) to the live fetches
        ``targets``, two pieces per event: the fetch keeps its head and id joined (a
        quarter off 50 fetchers, compiled). The dispatcher's NOTIFY fast path calls it
        when compiled (PROTOCOL.md 7.2, 10.5)."""
        dirty = self.out.dirty
        for fetch in targets:
            out = fetch.conn.out
            if not out:
                dirty.append(fetch.conn)
            if fetch.change_head is not head:
                fetch.change_head = head
                fetch.change_prefix = head + fetch.fid_bytes
            out.append(fetch.change_prefix)
            out.append(kv)

    def fanout(self, key: bytes, code: int, kv: bytes, owner: Optional[Connection] = None,
               reply: Optional[bytes] = None) -> None:
        """Send one fetch event for ``key`` to every matching fetch: the frame is
        encoded once as (head, kv); each fetcher gets head + its fetch id + kv. With
        ``owner`` (the connection whose ADD_STATE, NOTIFY_STATE or REMOVE_STATE this
        is), a fan-out to many live fetches is sliced (:meth:`fan_live`); ``reply``
        (the request's OK, for ``owner``) follows the last event (PROTOCOL.md 10.5)."""
        self.queries.state_changed(key, code, kv)  # PROTOCOL.md 14.2 (jetd.querying)
        if self.delivering_count:
            self.hold(key, code, kv)
        if self.parked:
            if code == FETCH_CHANGE:
                self.note_change(key)
            else:
                self._fanout_parked(key, code, kv)
        if self.fetches.lengths:
            targets = self.fetches.targets(key)
            if targets:
                self.fan_live(key, code, kv, targets, owner, reply)
                return
        if reply is not None and owner is not None:
            self.out.send(owner, reply)

    def fan_live(self, key: bytes, code: int, kv: bytes, targets: list[Fetch], owner: Optional[Connection] = None,
                 reply: Optional[bytes] = None) -> None:
        """The fetch event of ``key`` (value ``kv``) to the live fetches ``targets``.

        Issue 29: with an ``owner`` (a NOTIFY_STATE event) and more than
        ``DEFAULT_FAN_CHUNK`` targets, the fan-out is counted against the slice
        (:meth:`jetd.scheduler.Scheduler.spend`, ``DEFAULT_FAN_STRIDE`` at a time); past the slice the
        rest waits in ``fanning`` and the owner is ``stalled``: its next frames wait
        too (PROTOCOL.md 10.5), and :meth:`fan_on` goes on in its next turn."""
        if owner is not None and len(targets) > DEFAULT_FAN_CHUNK:
            rest = FanOut(key, code, kv, targets, self.fetches.generation)
            if not self._fan_slice(rest, True):
                rest.reply = reply
                self.fanning[owner] = rest
                owner.stalled = True
                self.scheduler.wake(owner)
            elif reply is not None:
                self.out.send(owner, reply)
            return
        body_length = 5 + len(kv)
        head = EVT_HEAD_PACK(EVENT, body_length, code)
        dirty = self.out.dirty
        # PROTOCOL.md 6.4: after a NOTIFY_STATE event the event can be 4 bytes above ours.
        careful = self.out.small_body_peers > 0 or body_length > self.out.max_body
        for fetch in targets:
            conn = fetch.conn
            if careful and body_length > conn.max_body:
                self.out.event_too_large(conn, body_length)
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
                self._log(fetch.conn.conn_id, FRAME_OUT, head + fetch.fid_bytes + kv)
        if reply is not None and owner is not None:
            self.out.send(owner, reply)

    def fan_on(self, owner: Connection) -> bool:
        """The next slice of ``owner``'s waiting fan-out (:meth:`jetd.core.Daemon.work`);
        True once it is done (then its input may go on), else it is woken again."""
        rest = self.fanning[owner]
        if self._fan_slice(rest, True):
            del self.fanning[owner]
            if rest.reply is not None:
                self.out.send(owner, rest.reply)  # PROTOCOL.md 10.5: after its events
            return True
        self.scheduler.wake(owner)
        return False

    def _fan_slice(self, rest: FanOut, bounded: bool) -> bool:
        """Send ``rest``'s event to its next targets, until the slice is over if
        ``bounded`` (at least one stride), else to all; True once every target is done.

        While the live index is as it was when the change was made, the chunks go out
        as the dispatcher's inline fan-out does. Else each target is checked: between
        two slices it may have gone: its connection closing (nothing may follow its
        CLOSE), the fetch ended (nothing after UNFETCH's OK) or narrowed by new
        permissions so that it no longer reads the key (its FETCH_REMOVE went out): it
        gets nothing. A target whose connection was paused meanwhile (its fetches
        parked after this change was made) gets the event queued, under the hard limit
        (PROTOCOL.md 10.8): its catch-up covers only the changes after."""
        targets = rest.targets
        key, head, kv, body_length = rest.key, rest.head, rest.kv, rest.body_length
        out = self.out
        dirty = out.dirty
        scheduler = self.scheduler
        careful = out.small_body_peers > 0 or body_length > out.max_body
        log_out = self._log if self._log_events else None
        total = len(targets)
        i = rest.next
        limit = min(total, i + scheduler.fan_slice) if bounded else total
        sent = 0
        same = not careful and log_out is None and self.fetches.generation == rest.generation
        while i < limit:
            stop = min(i + DEFAULT_FAN_STRIDE, limit)
            if same:
                self.fan_change(targets[i:stop], head, kv)
                sent += stop - i
                i = stop
                if bounded and scheduler.spend(DEFAULT_FAN_STRIDE):
                    break
                continue
            for index in range(i, stop):
                fetch = targets[index]
                conn = fetch.conn
                if conn.closing or conn.fetches.get(fetch.fid) is not fetch or not key.startswith(fetch.prefixes):
                    continue
                if careful and body_length > conn.max_body:
                    out.event_too_large(conn, body_length)
                    continue
                sent += 1
                if conn.paused:
                    frame = head + fetch.fid_bytes + kv
                    if out.enqueue(conn, frame) and log_out is not None:
                        log_out(conn.conn_id, FRAME_OUT, frame)
                    continue
                queue = conn.out
                if not queue:
                    dirty.append(conn)
                queue.append(head)
                queue.append(fetch.fid_bytes)
                queue.append(kv)
                if log_out is not None:
                    log_out(conn.conn_id, FRAME_OUT, head + fetch.fid_bytes + kv)
            i = stop
            if bounded and scheduler.spend(DEFAULT_FAN_STRIDE):
                break
        rest.next = i
        self.stats.fanout_events += sent
        return i >= total


    def _fanout_parked(self, key: bytes, code: int, kv: bytes) -> None:
        """A FETCH_ADD or FETCH_REMOVE for the parked fetches of ``key``: queued in
        order, after the changes held back (PROTOCOL.md 10.8: never conflated)."""
        # Not the cached targets: ADD and REMOVE are rare, and a cache entry would keep
        # closed connections alive until the key is removed.
        targets = [fetch for group in self.parked_fetches.groups(key) for fetch in group.values()]
        body_length = 5 + len(kv)
        head = EVT_HEAD_PACK(EVENT, body_length, code)
        for fetch in targets:
            conn = fetch.conn
            if conn.closing:
                continue  # its CLOSE is queued: nothing may follow it
            if self.out.too_large_for(conn, body_length):
                self.out.event_too_large(conn, body_length)
                continue
            if code == FETCH_REMOVE:
                # The key's held-back change first (kv is its last value), for all of the
                # connection's fetches at once.
                self.catch_up_on(conn, key, kv)
                if conn.closing:
                    continue
            frame = head + fetch.fid_bytes + kv
            if self.out.enqueue(conn, frame) and self._log_events and self._log is not None:
                self._log(conn.conn_id, FRAME_OUT, frame)
        self.stats.fanout_events += len(targets)
        if code == FETCH_REMOVE:
            # Every parked fetch of the key is caught up on it now.
            self.changed.pop(key, None)

    def fetch(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        if not str16_ok(buf, pos + 10, end):
            return self.out.malformed(conn, buf, pos, end, rid)
        if len(conn.fetches) + len(conn.query_fetches) >= self.config.max_fetches_per_connection:
            return self.out.reply(
                conn,
                rid,
                Status.LIMIT_EXCEEDED,
                f"at most {self.config.max_fetches_per_connection} fetches per connection",
            )
        prefix = buf[pos + 12 : end]
        perms = conn.perms
        if perms is None:
            fetch = Fetch(self.new_fetch_id(), conn, prefix)
        else:
            # PROTOCOL.md 15.4: indexed under the prefixes it may read, which filters
            # every event at no cost per event; refused if it could deliver nothing.
            readable = perms.read.narrow(prefix)
            if not readable:
                return self.access.not_authorized(conn, rid, "read", prefix)
            fetch = Fetch(self.new_fetch_id(), conn, prefix, readable)
        # PROTOCOL.md 10.5: the OK first, then FETCH_ADD in byte order of key, then live.
        self.out.send(conn, RESP_HEAD_PACK(RESPONSE, 9, rid, 0) + fetch.fid_bytes)
        registry = self.registry
        self._start_delivery(conn, fetch, lambda after: registry.matching_any_after(fetch.prefixes, after))
        return None

    # --- initial adds in slices (PROTOCOL.md 10.5) --------------------------------------

    def _start_delivery(self, conn: Connection, fetch: Fetch, source: InitialSource) -> None:
        """Deliver ``fetch``'s initial adds from ``source``: the first slice now, the
        others from :meth:`jetd.core.Daemon.work` while the connection's input stalls."""
        conn.delivery = Delivery(fetch, source)
        self.delivering.add(fetch)
        self.delivering_count += 1
        self.deliver(conn)

    def deliver(self, conn: Connection) -> None:
        """Queue one slice of ``conn``'s initial adds; after the last one, the events
        held meanwhile, and the fetch is live. Stops early (and ``conn`` stays
        stalled) while the connection is paused or past its output budget."""
        delivery = conn.delivery
        assert isinstance(delivery, Delivery)
        fid_bytes = delivery.fetch.fid_bytes
        log_out = self._log if self._log_events else None
        budget = self.out.out_budget
        scheduler = self.scheduler
        limit = scheduler.delivery_slice
        out = conn.out
        added = 0
        for sent, (key, kv) in enumerate(delivery.source(delivery.cursor)):
            # The slice ends by the clock or the count (jetd.scheduler), checked every 16
            # states (a call per state would cost more than the check).
            if sent >= limit or conn.paused or conn.out_size > budget or (
                    sent and not sent & 15 and scheduler.spend(16)):
                self.stats.initial_adds += sent
                conn.stalled = True
                return
            body_length = 5 + len(kv)
            if self.out.too_large_for(conn, body_length):
                self.out.event_too_large(conn, body_length)
                return
            head = EVT_HEAD_PACK(EVENT, body_length, FETCH_ADD)
            if not out:
                self.out.dirty.append(conn)
            out.append(head)
            out.append(fid_bytes)
            out.append(kv)
            conn.out_size += 5 + body_length
            delivery.cursor = key
            if log_out is not None:
                log_out(conn.conn_id, FRAME_OUT, head + fid_bytes + kv)
            added = sent + 1
        self.stats.initial_adds += added
        self._finish_delivery(conn)

    def _finish_delivery(self, conn: Connection) -> None:
        delivery = conn.delivery
        assert isinstance(delivery, Delivery)
        fetch = delivery.fetch
        self.end_delivery(conn)
        log_out = self._log if self._log_events else None
        for frame in delivery.held:
            if conn.paused:
                if not self.out.enqueue(conn, frame):
                    return
            else:
                if not conn.out:
                    self.out.dirty.append(conn)
                conn.out.append(frame)
                conn.out_size += len(frame)
            if log_out is not None:
                log_out(conn.conn_id, FRAME_OUT, frame)
        conn.fetches[fetch.fid] = fetch
        if conn.parked:
            self.parked_fetches.add(fetch)
            self.parked += 1
        else:
            self.fetches.add(fetch)

    def end_delivery(self, conn: Connection) -> None:
        """Forget ``conn``'s delivery (finished, or the connection is closing)."""
        delivery = conn.delivery
        if delivery is None:
            return
        if delivery.for_query:
            self.queries.end_delivery(conn)
            return
        assert isinstance(delivery, Delivery)
        conn.delivery = None
        self.delivering.remove(delivery.fetch)
        self.delivering_count -= 1

    def hold(self, key: bytes, code: int, kv: bytes) -> None:
        """A fetch event of ``key`` for the fetches still delivering initial adds that
        have added ``key`` already: kept until their last initial add (see Delivery)."""
        body_length = 5 + len(kv)
        targets = [fetch for group in self.delivering.groups(key) for fetch in group.values()]
        for fetch in targets:
            conn = fetch.conn
            delivery = conn.delivery
            if not isinstance(delivery, Delivery) or delivery.cursor is None or key > delivery.cursor or conn.closing:
                continue
            if self.out.too_large_for(conn, body_length):
                self.out.event_too_large(conn, body_length)
                continue
            frame = EVT_HEAD_PACK(EVENT, body_length, code) + fetch.fid_bytes + kv
            delivery.held.append(frame)
            delivery.held_size += len(frame)
            # PROTOCOL.md 10.8: held events are output owed to the peer like any other.
            if delivery.held_size + conn.queued + conn.out_size > self.config.hard_limit:
                self.out.overload(conn, "output above the hard limit")

    def unfetch(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        if end - pos != 14:
            return self.out.malformed(conn, buf, pos, end, rid)
        fid = U32_FROM(buf, pos + 10)[0]
        if conn.query_fetches and self.queries.unfetch(conn, fid):
            self.out.send(conn, ok_frame(rid))
            return None
        if fid not in conn.fetches:
            return self.out.reply(conn, rid, Status.NOT_FOUND, f"no fetch {fid} on this connection")
        fetch = conn.fetches.pop(fid)
        if conn.parked:
            self.parked_fetches.remove(fetch)
            self._unparked(1)
        else:
            self.fetches.remove(fetch)
        self.out.send(conn, ok_frame(rid))
        return None

    # --- changes of permissions (PROTOCOL.md 15.5, called by jetd.access) ----------------

    def narrow_delivery(self, conn: Connection, perms: Permissions) -> None:
        """``conn``'s permissions changed: its fetch still delivering initial adds reads
        under the new ones from here on."""
        registry = self.registry
        delivery = conn.delivery
        if isinstance(delivery, Delivery):
            # A fetch still delivering its initial adds in slices (PROTOCOL.md 10.5): the
            # keys up to its cursor were added; the changes for them go after its last
            # add, with the events held meanwhile; the keys above come from the new
            # prefixes as the delivery goes on.
            fetch = delivery.fetch
            narrowed = perms.read.narrow(fetch.prefix)
            if narrowed != fetch.prefixes:
                cursor = delivery.cursor
                if cursor is not None:
                    old = {k: kv for k, kv in registry.matching_any(fetch.prefixes) if k <= cursor}
                    new = {k: kv for k, kv in registry.matching_any(narrowed) if k <= cursor}
                    for code, keys, values in ((FETCH_REMOVE, old.keys() - new.keys(), old),
                                               (FETCH_ADD, new.keys() - old.keys(), new)):
                        for key in sorted(keys):
                            kv = values[key]
                            frame = EVT_HEAD_PACK(EVENT, 5 + len(kv), code) + fetch.fid_bytes + kv
                            delivery.held.append(frame)
                            delivery.held_size += len(frame)
                self.delivering.remove(fetch)
                fetch.prefixes = narrowed
                self.delivering.add(fetch)

    def narrow_fetches(self, conn: Connection, perms: Permissions) -> None:
        """``conn``'s permissions changed: each of its fetches gets FETCH_REMOVE for what
        it may no longer read and FETCH_ADD for what it may read now, in byte order of key."""
        registry = self.registry
        for fid in sorted(conn.fetches):
            fetch = conn.fetches[fid]
            narrowed = perms.read.narrow(fetch.prefix)
            if narrowed == fetch.prefixes:
                continue
            old = dict(registry.matching_any(fetch.prefixes))
            new = dict(registry.matching_any(narrowed))
            index = self.parked_fetches if conn.parked else self.fetches
            for key in sorted(old.keys() - new.keys()):
                kv = old[key]
                if conn.parked:
                    self.catch_up_on(conn, key, kv)  # PROTOCOL.md 10.8: its change first
                self.out.send(conn, EVT_HEAD_PACK(EVENT, 5 + len(kv), FETCH_REMOVE) + fetch.fid_bytes + kv)
            index.remove(fetch)
            fetch.prefixes = narrowed
            index.add(fetch)
            for key in sorted(new.keys() - old.keys()):
                kv = new[key]
                self.out.send(conn, EVT_HEAD_PACK(EVENT, 5 + len(kv), FETCH_ADD) + fetch.fid_bytes + kv)
            if conn.closing:
                return
