"""The queries part: FETCH_QUERY and QUERY_ONCE in the daemon (PROTOCOL.md 14): the
requests, the events a change causes for query fetches, methods and nodes, and slow
consumers of query fetches.

:class:`Queries` owns the query groups (:class:`jetd.query.QueryIndex`, with their
sorted windows) and the node counts. It reads states through the registry part, takes
fetch ids from the subscriptions part (one sequence for both kinds), and wakes
connections whose initial entries go on through the scheduler.

The engine (:mod:`jetd.query`) decides what matches and where; this module turns that
into frames. It hooks into the rest of the core at a few points only: the fan-out of a
state change (``state_changed``), methods added and removed (``method_changed``), UNFETCH,
a connection's teardown, and the catch-up of a paused connection (section 10.8).

Slow consumers (PROTOCOL.md 14.3): while a connection is paused, the FETCH_CHANGE events
of its unsorted query fetches are held per (fetch, key) and the window updates of its
sorted ones are reduced to "dirty"; on draining, the held keys get one FETCH_CHANGE
with the latest value and a dirty window one FETCH_WINDOW listing every position. Every
other event is queued in order (it is never held back).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from typing import Any
from typing import Optional

from jetwire import EntryKind
from jetwire import FetchQuery
from jetwire import Function
from jetwire import QueryOnce
from jetwire import RemoteProtocolError
from jetwire import Status
from jetwire import decode_body
from jetwire.codes import EventCode

from .base import DaemonStats
from .base import Output
from .config import Config
from .connection import Connection
from .frames import EVENT
from .frames import EVT_HEAD_PACK
from .frames import FETCH_ADD
from .frames import FETCH_CHANGE
from .frames import FETCH_REMOVE
from .frames import FRAME_OUT
from .frames import REQUEST
from .frames import RESP_HEAD_PACK
from .frames import RESPONSE
from .frames import U16
from .frames import U32_PACK
from .frames import LogHook
from .frames import ok_frame
from .query import BEYOND
from .query import CompiledQuery
from .query import Extractor
from .query import NodeIndex
from .query import QueryError
from .query import QueryGroup
from .query import QueryIndex
from .query import QueryLimits
from .query import compile_query
from .query import restrict
from .query import window_update
from .registry import RESERVED_PREFIX
from .scheduler import Scheduler

if TYPE_CHECKING:
    from .access import AccessControl
    from .registry import Registry
    from .subscriptions import Subscriptions

__all__ = ["Queries", "QueryDelivery", "QueryFetch"]

log = logging.getLogger("jetd")

FETCH_UNMATCH = EventCode.FETCH_UNMATCH.value
FETCH_METHOD = EventCode.FETCH_METHOD.value
FETCH_NODE = EventCode.FETCH_NODE.value
FETCH_WINDOW = EventCode.FETCH_WINDOW.value
QUERY_ENTRY = EventCode.QUERY_ENTRY.value
ADD, REMOVE = 1, 2
NONE_VALUE = b"\x00\x00\x00\x00\x00"
# Initial and one-shot entries sort by key, a node before a state or method of the same key.
_NODE_FIRST, _ENTRY_AFTER = 0, 1


def _by_key(entry: tuple[int, bytes]) -> tuple[bytes, int]:
    """Byte order of key, a node before a state or method of the same key."""
    kind, key = entry
    return key, 0 if kind == EntryKind.NODE else 1


class QueryFetch:
    """One FETCH_QUERY: its id, connection, group, 0-based window ``low``..``high``
    and current ``size`` (sorted), and what is held while the connection is paused."""

    __slots__ = (
        "backlog",
        "backlog_size",
        "conn",
        "cursor",
        "dirty",
        "fid",
        "fid_bytes",
        "group",
        "held",
        "high",
        "low",
        "pending",
        "size",
        "stale_first",
        "stale_last",
    )

    def __init__(self, fid: int, conn: Connection, group: QueryGroup) -> None:
        self.fid = fid
        self.fid_bytes = U32_PACK(fid)
        self.conn = conn
        self.group = group
        query = group.compiled.query
        self.low = query.window_from - 1
        self.high = query.window_to - 1
        self.size = 0
        self.held: dict[bytes, None] = {}  # unsorted, paused: keys whose FETCH_CHANGE is held
        self.dirty = False  # sorted, paused: the window changed since it was last sent
        # Sorted, its window updates deferred to a later slice (Queries.refresh_windows):
        # the positions they touched (first > last: the size alone); None: none deferred.
        self.stale_first: Optional[int] = None
        self.stale_last = -1
        # Until its initial entries are out (QueryDelivery) the fetch is ``pending``: an
        # unsorted one has delivered the keys up to ``cursor`` (None: none yet), and the
        # events of those keys wait in ``backlog`` (PROTOCOL.md 10.5, 14.3).
        self.pending = True
        self.cursor: Optional[bytes] = None
        self.backlog: list[bytes] = []
        self.backlog_size = 0


class QueryDelivery:
    """A FETCH_QUERY's initial entries, or a QUERY_ONCE's answer, under way in slices
    (PROTOCOL.md 14.5: one large query must not stall other peers). First the group is
    seeded, a slice of states at a time, if it is new; then a sorted query sends its
    window, an unsorted one its entries in byte order of key, a slice at a time. The
    connection's input stalls meanwhile, as for FETCH_STATES (PROTOCOL.md 10.5).

    ``fetch`` is the FETCH_QUERY's fetch, or None for a QUERY_ONCE, whose answer needs
    ``head`` (its request id, packed), ``rid`` and its own ``cursor``."""

    __slots__ = ("cursor", "fetch", "group", "head", "nodes", "rid")

    for_query = True

    def __init__(self, group: QueryGroup, fetch: Optional[QueryFetch], rid: int) -> None:
        self.group = group
        self.fetch = fetch
        self.rid = rid
        self.head = U32_PACK(rid)
        self.cursor: Optional[bytes] = None  # QUERY_ONCE: the entries up to here are sent
        self.nodes: Optional[NodeIndex] = None  # QUERY_ONCE asking for nodes no fetch keeps


class Queries:
    """The queries part (see the module docstring)."""

    subscriptions: Subscriptions  # wired by jetd.core.Daemon: fetch ids
    access: AccessControl  # read (PROTOCOL.md 15.3)

    def __init__(self, config: Config, out: Output, stats: DaemonStats, log_hook: Optional[LogHook],
                 registry: Registry, scheduler: Scheduler) -> None:
        self.config = config
        self.out = out
        self.stats = stats
        self._log = log_hook
        self._log_events = log_hook is not None and config.log_events
        self.registry = registry
        self.scheduler = scheduler
        self.index = QueryIndex()  # PROTOCOL.md 14: the query groups
        self.nodes: Optional[NodeIndex] = None  # counted only while a fetch asks for nodes
        # Sorted fetches whose window updates wait for a slice (issue 29), per connection,
        # both in the order they became stale: refresh_windows takes them round-robin.
        self.stale: dict[Connection, dict[QueryFetch, None]] = {}

    def teardown(self, conn: Connection) -> None:
        """A closing connection's query fetches end (PROTOCOL.md 10.6)."""
        if conn.query_fetches:
            self._query_teardown(conn)

    # --- requests -------------------------------------------------------------------------

    def _compile_request(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> Optional[CompiledQuery]:
        """Decode and compile a FETCH_QUERY / QUERY_ONCE; answers the error and returns
        None if it cannot run (PROTOCOL.md 14.5, 14.6)."""
        config = self.config
        if end - pos - 10 > config.max_query_size:
            self.out.reply(conn, rid, Status.TOO_LARGE, f"query of {end - pos - 10} bytes exceeds {config.max_query_size}")
            return None
        try:
            request = decode_body(REQUEST, buf[pos + 5 : end])
        except RemoteProtocolError as exc:
            self.out.violation(conn, exc.message)
            self.out.reply(conn, rid, exc.status, exc.message)
            return None
        assert isinstance(request, (FetchQuery, QueryOnce))
        limits = QueryLimits(config.max_query_terms, config.max_window, config.max_field_depth)
        try:
            compiled = compile_query(request.query, limits)
        except QueryError as exc:
            self.out.reply(conn, rid, exc.status, exc.message)
            return None
        if not compiled.prefix.startswith(b"$"):
            # PROTOCOL.md 16.1: a query that names no prefix of $jet/ sees none of it.
            inner = compiled.match_key
            compiled.match_key = lambda key: not (key.startswith(RESERVED_PREFIX) or key == b"$jet") and inner(key)
        perms = conn.perms
        if perms is None or perms.read.everything:
            return compiled
        # PROTOCOL.md 15.4: a query sees only the keys its connection may read; refused
        # if it could see none.
        readable = perms.read.narrow(compiled.prefix)
        if not readable:
            self.access.not_authorized(conn, rid, "read", compiled.prefix)
            return None
        return compiled if readable == (compiled.prefix,) else restrict(compiled, readable)

    def fetch_query(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        """FETCH_QUERY (PROTOCOL.md 14.3): the OK, the initial entries, then live."""
        compiled = self._compile_request(conn, buf, pos, end, rid)
        if compiled is None:
            return
        if len(conn.fetches) + len(conn.query_fetches) >= self.config.max_fetches_per_connection:
            self.out.reply(
                conn,
                rid,
                Status.LIMIT_EXCEEDED,
                f"at most {self.config.max_fetches_per_connection} fetches per connection",
            )
            return
        group, _new = self.index.group_for(compiled)
        if compiled.nodes and self.nodes is None:
            self.nodes = NodeIndex(self.registry.all_keys())
        fetch = QueryFetch(self.subscriptions.new_fetch_id(), conn, group)
        self.out.send(conn, RESP_HEAD_PACK(RESPONSE, 9, rid, 0) + fetch.fid_bytes)
        group.fetches[fetch.fid] = fetch
        conn.query_fetches[fetch.fid] = fetch
        if compiled.sorted and fetch.high > group.reach:
            group.set_reach(fetch.high)
        conn.delivery = QueryDelivery(group, fetch, rid)
        self.deliver(conn)

    def query_once(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        """QUERY_ONCE (PROTOCOL.md 14.4): QUERY_ENTRY per entry, then the OK."""
        compiled = self._compile_request(conn, buf, pos, end, rid)
        if compiled is None:
            return
        group, _new = self.index.group_for(compiled)
        group.onces += 1
        delivery = QueryDelivery(group, None, rid)
        if compiled.sorted:
            # A shared sorted group keeps in order only what its windows reach.
            group.once_reach = max(group.once_reach, compiled.query.window_to - 1)
            if group.once_reach > group.reach:
                group.set_reach(group.once_reach)
        if compiled.nodes and self.nodes is None:
            delivery.nodes = NodeIndex(self.registry.all_keys())
        conn.delivery = delivery
        self.deliver(conn)

    # --- initial entries in slices (PROTOCOL.md 10.5, 14.5) ---------------------------------

    def deliver(self, conn: Connection) -> None:
        """One slice of ``conn``'s QueryDelivery: of the group's seeding, else of its
        entries. Leaves ``conn`` stalled while there is more (Daemon.work goes on)."""
        delivery = conn.delivery
        assert isinstance(delivery, QueryDelivery)
        group = delivery.group
        fetch = delivery.fetch
        if group.seeding:
            group.seed(self.registry.matching_after(group.compiled.prefix, group.seed_cursor),
                       self.scheduler.seed_slice, self.scheduler.spend)
            if group.seeding:
                return self._query_later(conn)
        query = group.compiled.query
        if group.order is not None:
            if fetch is not None:
                fetch.size = max(0, min(fetch.high, len(group) - 1) - fetch.low + 1)
                fetch.pending = False
                self._send_window(fetch, fetch.low, fetch.low + fetch.size - 1)
                self.scheduler.spend(fetch.size)  # issue 29: the rows count against the slice
            else:
                registry = self.registry
                for position in range(query.window_from - 1, min(query.window_to, len(group))):
                    key = group.at(position)
                    kv = registry.value(key)
                    assert kv is not None  # a group holds only keys of states (jetd.query)
                    self._query_entry(conn, delivery.head, EntryKind.STATE, kv)
                    if conn.closing:
                        return None
                self.out.send(conn, ok_frame(delivery.rid))
                self.scheduler.spend(max(0, min(query.window_to, len(group)) - query.window_from + 1))
            return self._query_delivered(conn)
        after = delivery.cursor if fetch is None else fetch.cursor
        entries, upto = self._entries_after(group, after, delivery.nodes)
        for kind, key, kv in entries:
            if fetch is None:
                self._query_entry(conn, delivery.head, kind, kv)
            elif kind == EntryKind.STATE:
                self._query_emit(conn, EVT_HEAD_PACK(EVENT, 5 + len(kv), FETCH_ADD) + fetch.fid_bytes + kv)
            else:
                code = FETCH_NODE if kind == EntryKind.NODE else FETCH_METHOD
                frame = EVT_HEAD_PACK(EVENT, 8 + len(key), code) + fetch.fid_bytes + bytes((ADD,)) + kv[: 2 + len(key)]
                self._query_emit(conn, frame)
            if conn.closing:
                return None
        if upto is not None:
            if fetch is None:
                delivery.cursor = upto
            else:
                fetch.cursor = upto
            return self._query_later(conn)
        if fetch is None:
            self.out.send(conn, ok_frame(delivery.rid))
        else:
            backlog = fetch.backlog
            fetch.backlog = []
            fetch.backlog_size = 0
            fetch.pending = False
            fetch.cursor = None
            for frame in backlog:
                if not self._query_emit(conn, frame):
                    break
        return self._query_delivered(conn)

    def _query_later(self, conn: Connection) -> None:
        """More slices to go: ``conn`` stalls, and comes back to Daemon.work with its
        output written (take_dirty), or at once if it has none."""
        conn.stalled = True
        if not conn.out and not conn.paused:
            self.scheduler.wake(conn)

    def _query_delivered(self, conn: Connection) -> None:
        delivery = conn.delivery
        assert isinstance(delivery, QueryDelivery)
        conn.delivery = None
        if delivery.fetch is None:
            self._once_done(delivery.group)

    def _once_done(self, group: QueryGroup) -> None:
        """A QUERY_ONCE answer on ``group`` ended (answered, or its connection closed)."""
        group.onces -= 1
        if not group.onces:
            group.once_reach = -1
            if group.order is not None and group.fetches:
                group.set_reach(max(f.high for f in group.fetches.values()))
        if not group.fetches and not group.onces:
            self._query_forget_group(group)

    def end_delivery(self, conn: Connection) -> None:
        """The connection closes with its QueryDelivery under way: a FETCH_QUERY's fetch
        ends with the connection's other fetches (``_query_teardown``)."""
        delivery = conn.delivery
        assert isinstance(delivery, QueryDelivery)
        conn.delivery = None
        if delivery.fetch is None:
            self._once_done(delivery.group)

    def _query_entry(self, conn: Connection, head: bytes, kind: int, kv: bytes) -> None:
        frame = EVT_HEAD_PACK(EVENT, 6 + len(kv), QUERY_ENTRY) + head + bytes((kind,)) + kv
        self._query_emit(conn, frame)

    def _entries_after(
        self, group: QueryGroup, after: Optional[bytes], nodes: Optional[NodeIndex]
    ) -> tuple[list[tuple[int, bytes, bytes]], Optional[bytes]]:
        """The next slice of an unsorted group's entries above key ``after`` (None: from
        the start), as (kind, key, Key-Value payload) in byte order of key, a node before
        a state or method of the same key (PROTOCOL.md 14.3, 14.4); method and node
        entries carry a NONE value. Also the last key the slice covers, or None if it
        is the last slice. At most a slice of states (by the clock, at most ``delivery_slice``,
        jetd.scheduler), plus the methods and nodes between."""
        compiled = group.compiled
        matched = group.matched
        entries: list[tuple[int, bytes, int, bytes]] = []
        upto: Optional[bytes] = None
        scheduler = self.scheduler
        limit = scheduler.delivery_slice
        for taken, (key, kv) in enumerate(self.registry.matching_after(compiled.prefix, after)):
            if taken == limit or (taken and not taken & 15 and scheduler.spend(16)):
                break
            upto = key
            if key in matched:
                entries.append((_ENTRY_AFTER, key, EntryKind.STATE, kv))
        else:
            upto = None  # the states are done: every method and node above ``after`` too
        if compiled.methods or compiled.nodes:
            match_key = compiled.match_key

            def covered(key: bytes) -> bool:
                return (after is None or key > after) and (upto is None or key <= upto) and match_key(key)

            if compiled.methods:
                entries.extend(
                    (_ENTRY_AFTER, key, EntryKind.METHOD, U16.pack(len(key)) + key + NONE_VALUE)
                    for key in self.registry.method_keys()
                    if covered(key)
                )
            if compiled.nodes:
                node_index = nodes or self.nodes
                assert node_index is not None
                entries.extend(
                    (_NODE_FIRST, key, EntryKind.NODE, U16.pack(len(key)) + key + NONE_VALUE)
                    for key in node_index.counts
                    if covered(key)
                )
            entries.sort(key=lambda entry: (entry[1], entry[0]))
        return [(kind, key, kv) for _, key, kind, kv in entries], upto

    def unfetch(self, conn: Connection, fid: int) -> bool:
        """UNFETCH of a query fetch; False if ``fid`` is not one of ``conn``'s."""
        fetch = conn.query_fetches.pop(fid, None)
        if fetch is None:
            return False
        self._query_drop(fetch)
        return True

    def _query_drop(self, fetch: QueryFetch) -> None:
        self._unstale(fetch)
        group = fetch.group
        del group.fetches[fetch.fid]
        if group.order is not None:
            group.set_reach(max((f.high for f in group.fetches.values()), default=group.once_reach))
        if not group.fetches and not group.onces:
            self._query_forget_group(group)

    def _query_forget_group(self, group: QueryGroup) -> None:
        self.index.drop(group)
        if self.nodes is not None and not self.index.node_groups:
            self.nodes = None

    def _query_teardown(self, conn: Connection) -> None:
        """A closing connection's query fetches end (PROTOCOL.md 10.6)."""
        for fetch in conn.query_fetches.values():
            self._query_drop(fetch)
        conn.query_fetches.clear()
        self.stale.pop(conn, None)

    # --- changes of permissions (PROTOCOL.md 15.5) -----------------------------------------

    def permissions_changed(self, conn: Connection) -> None:
        """``conn``'s permissions changed: each query fetch whose readable keys changed
        moves to the group of its query under the new ones, and is brought in line at
        once: an unsorted one gets FETCH_REMOVE (FETCH_METHOD, FETCH_NODE REMOVE) for what
        it had and may no longer read, then the adds of what it may read now, each in byte
        order of key; a sorted one gets its whole window. A fetch still receiving its
        initial entries gets these for the keys it has already been sent, after them."""
        perms = conn.perms
        for fid in sorted(conn.query_fetches):
            fetch = conn.query_fetches[fid]
            old = fetch.group
            base = old.compiled.base
            if perms is None or perms.read.everything:
                compiled = base
            else:
                readable = perms.read.narrow(base.prefix)
                compiled = base if readable == (base.prefix,) else restrict(base, readable)
            if compiled.signature == old.compiled.signature:
                continue
            group, _new = self.index.group_for(compiled)
            if group.seeding:
                group.seed(self.registry.matching_after(compiled.prefix, group.seed_cursor))
            del old.fetches[fid]
            group.fetches[fid] = fetch
            fetch.group = group
            if group.order is not None and fetch.high > group.reach:
                group.set_reach(fetch.high)
            delivery = conn.delivery
            if isinstance(delivery, QueryDelivery) and delivery.fetch is fetch:
                delivery.group = group
            if old.order is not None:
                old.set_reach(max((f.high for f in old.fetches.values()), default=old.once_reach))
            if not old.fetches and not old.onces:
                self._query_forget_group(old)
            if fetch.pending and fetch.cursor is None:
                continue  # nothing sent yet: its initial entries come from the new group
            if group.order is not None:
                fetch.size = max(0, min(fetch.high, len(group) - 1) - fetch.low + 1)
                self._unstale(fetch)  # the whole window follows
                if conn.paused:
                    fetch.dirty = True
                else:
                    self._send_window(fetch, fetch.low, fetch.low + fetch.size - 1)
                continue
            bound = fetch.cursor if fetch.pending else None
            before = self._entry_keys(old, bound)
            after = self._entry_keys(group, bound)
            gone = sorted(before - after, key=_by_key)
            frames = [self._entry_frame(fetch, kind, key, REMOVE) for kind, key in gone]
            frames += [self._entry_frame(fetch, kind, key, ADD) for kind, key in sorted(after - before, key=_by_key)]
            for _kind, key in gone:
                fetch.held.pop(key, None)  # its FETCH_REMOVE carries the latest value
            for frame in frames:
                if fetch.pending:
                    fetch.backlog.append(frame)
                    fetch.backlog_size += len(frame)
                elif not self._query_emit(conn, frame):
                    return

    def _entry_keys(self, group: QueryGroup, bound: Optional[bytes]) -> set[tuple[int, bytes]]:
        """(kind, key) of the group's entries, those up to ``bound`` if given."""
        compiled = group.compiled
        keys = {(EntryKind.STATE.value, key) for key in group.matched}
        if compiled.methods:
            keys.update((EntryKind.METHOD.value, key) for key in self.registry.method_keys() if compiled.match_key(key))
        if compiled.nodes and self.nodes is not None:
            keys.update((EntryKind.NODE.value, key) for key in self.nodes.counts if compiled.match_key(key))
        if bound is not None:
            keys = {entry for entry in keys if entry[1] <= bound}
        return keys

    def _entry_frame(self, fetch: QueryFetch, kind: int, key: bytes, action: int) -> bytes:
        """The event that adds (ADD) or removes (REMOVE) one entry of an unsorted fetch."""
        if kind == EntryKind.STATE:
            kv = self.registry.value(key)
            assert kv is not None
            code = FETCH_ADD if action == ADD else FETCH_REMOVE
            return EVT_HEAD_PACK(EVENT, 5 + len(kv), code) + fetch.fid_bytes + kv
        code = FETCH_NODE if kind == EntryKind.NODE else FETCH_METHOD
        return EVT_HEAD_PACK(EVENT, 8 + len(key), code) + fetch.fid_bytes + bytes((action,)) + U16.pack(len(key)) + key

    # --- output -----------------------------------------------------------------------------

    def _query_emit(self, conn: Connection, frame: bytes) -> bool:
        """Queue one query event for ``conn``; False if it could not be (closed, closing,
        over its max_body: closed TOO_LARGE, or over the hard limit)."""
        if conn.closing:
            return False
        if self.out.small_body_peers and len(frame) - 5 > conn.max_body:
            self.out.event_too_large(conn, len(frame) - 5)
            return False
        if conn.paused:
            if not self.out.enqueue(conn, frame):
                return False
        else:
            out = conn.out
            if not out:
                self.out.dirty.append(conn)
            out.append(frame)
        self.stats.fanout_events += 1
        if self._log_events and self._log is not None:
            self._log(conn.conn_id, FRAME_OUT, frame)
        return True

    def _send_window(self, fetch: QueryFetch, first: int, last: int) -> None:
        """FETCH_WINDOW with the entries at 0-based positions first..last and the size;
        split into several, each with the size, where one would exceed the receiver's
        max_body or the daemon's own (PROTOCOL.md 14.2)."""
        group = fetch.group
        registry = self.registry
        conn = fetch.conn
        room = min(conn.max_body, self.out.max_body) - 11  # code, fetch_id, size, count
        head = fetch.fid_bytes + U32_PACK(fetch.size)
        entries: list[bytes] = []
        length = 0
        for position in range(first, last + 1):
            key = group.at(position)
            kv = registry.value(key)
            assert kv is not None
            entry = U32_PACK(position + 1) + kv
            if entries and length + len(entry) > room:
                self._window_event(conn, head, entries, length)
                entries = []
                length = 0
            entries.append(entry)
            length += len(entry)
        self._window_event(conn, head, entries, length)

    def _window_event(self, conn: Connection, head: bytes, entries: list[bytes], length: int) -> None:
        body_length = 3 + len(head) + length  # code, head, count, entries
        frame = EVT_HEAD_PACK(EVENT, body_length, FETCH_WINDOW) + head + U16.pack(len(entries)) + b"".join(entries)
        self._query_emit(conn, frame)

    # --- changes ----------------------------------------------------------------------------

    def state_changed(self, key: bytes, code: int, kv: bytes) -> None:
        """A state was added (FETCH_ADD), changed (FETCH_CHANGE) or removed (FETCH_REMOVE):
        the query fetches' events (PROTOCOL.md 14.2), and nodes created or deleted."""
        if not self.index.by_signature:
            return
        nodes = self.nodes
        if nodes is not None and code == FETCH_ADD:
            for node in nodes.add(key):
                self._query_key_event(self.index.node_groups, FETCH_NODE, ADD, node)
        queries = self.index
        cached = queries.cache.get(key)
        groups = cached[1] if cached is not None and cached[0] == queries.generation else queries.targets(key)
        extractor: Optional[Extractor] = None
        scheduler = self.scheduler
        for group in groups:
            if group.seeding:
                cursor = group.seed_cursor
                if cursor is None or key > cursor:
                    continue  # the seeding gets there later (PROTOCOL.md 14.5)
            compiled = group.compiled
            if code == FETCH_REMOVE:
                entry: Any = None
            elif compiled.needs_value:
                if extractor is None:
                    klen = len(key)
                    extractor = Extractor(kv[2 + klen], kv[7 + klen :])
                entry = compiled.evaluate(key, extractor)
            else:
                entry = compiled.evaluate(key, None)
            previous, old, new = group.update(key, entry)
            if group.seeding:
                continue  # no fetch of it has its initial entries yet
            if group.order is None:
                if entry is None:
                    if previous is None:
                        continue
                    event = FETCH_REMOVE if code == FETCH_REMOVE else FETCH_UNMATCH
                else:
                    event = FETCH_CHANGE if previous is not None else FETCH_ADD
                head = EVT_HEAD_PACK(EVENT, 5 + len(kv), event)
                for fetch in group.fetches.values():
                    self._query_kv_event(fetch, event, head, key, kv)
            elif old != BEYOND:
                count = len(group)
                for fetch in group.fetches.values():
                    update = window_update(old, new, count, fetch.low, fetch.high, fetch.size)
                    if update is None or fetch.conn.closing or fetch.pending:
                        continue  # a pending fetch's window is sent whole when it is ready
                    fetch.size = update[2]
                    if fetch.conn.paused:
                        fetch.dirty = True  # PROTOCOL.md 14.3: sent whole on draining
                    elif fetch.stale_first is not None or (
                        # Never the windows of the connection whose request this is: they
                        # precede its answer (PROTOCOL.md 10.8).
                        fetch.conn is not scheduler.current and scheduler.spend(update[1] - update[0] + 1)
                    ):
                        self._defer_window(fetch, update[0], update[1])  # PROTOCOL.md 14.5
                    else:
                        self._send_window(fetch, update[0], update[1])
        if code == FETCH_REMOVE:
            self.index.forget(key)
            if nodes is not None:
                for node in nodes.remove(key):
                    self._query_key_event(self.index.node_groups, FETCH_NODE, REMOVE, node)

    # --- window updates in slices (PROTOCOL.md 14.5, issue 29) --------------------------

    def _defer_window(self, fetch: QueryFetch, first: int, last: int) -> None:
        """The slice is over: ``fetch``'s update of positions first..last waits for
        :meth:`refresh_windows`, joined to those already waiting."""
        if fetch.stale_first is None:
            fetch.stale_first = 1 << 62
            fetch.stale_last = -1
            conn = fetch.conn
            waiting = self.stale.get(conn)
            if waiting is None:
                waiting = self.stale[conn] = {}
            waiting[fetch] = None
        if first <= last:
            fetch.stale_first = min(fetch.stale_first, first)
            fetch.stale_last = max(fetch.stale_last, last)
        if fetch.conn is self.scheduler.current:
            self._flush_window(fetch)

    def _unstale(self, fetch: QueryFetch) -> None:
        """``fetch`` no longer waits (sent whole, or gone)."""
        if fetch.stale_first is None:
            return
        fetch.stale_first = None
        waiting = self.stale.get(fetch.conn)
        if waiting is not None:
            waiting.pop(fetch, None)
            if not waiting:
                del self.stale[fetch.conn]

    def _flush_window(self, fetch: QueryFetch) -> None:
        """Send ``fetch``'s waiting update: the positions it touched, with the values
        and size of now (PROTOCOL.md 14.5)."""
        first = fetch.stale_first
        last = fetch.stale_last
        self._unstale(fetch)
        if first is None or fetch.conn.closing:
            return
        if fetch.conn.paused:
            fetch.dirty = True  # PROTOCOL.md 14.3: sent whole on draining
            return
        self._send_window(fetch, first, min(last, fetch.low + fetch.size - 1))

    def flush_windows(self, conn: Connection) -> None:
        """Before a response to ``conn``: its waiting window updates go first
        (PROTOCOL.md 10.8: the events a request causes precede its response)."""
        waiting = self.stale.get(conn)
        if waiting is not None:
            for fetch in list(waiting):
                self._flush_window(fetch)

    def refresh_windows(self) -> None:
        """One slice of waiting window updates, a fetch at a time, round-robin across
        connections (from :meth:`jetd.core.Daemon.work`)."""
        stale = self.stale
        scheduler = self.scheduler
        while stale:
            conn = next(iter(stale))
            waiting = stale.pop(conn)
            fetch = next(iter(waiting))
            if len(waiting) > 1:
                stale[conn] = waiting  # behind the other connections
            cost = fetch.stale_last - (fetch.stale_first or 0) + 1
            self._flush_window(fetch)
            if scheduler.spend(max(1, cost)):
                return

    def _query_kv_event(self, fetch: QueryFetch, event: int, head: bytes, key: bytes, kv: bytes) -> None:
        conn = fetch.conn
        if conn.closing:
            return
        if fetch.pending:
            self._query_backlog(fetch, key, head + fetch.fid_bytes + kv)
            return
        if conn.paused:
            if event == FETCH_CHANGE:
                fetch.held[key] = None  # PROTOCOL.md 14.3: the latest value on draining
                return
            # ADD, UNMATCH and REMOVE carry the latest value: a held change is dropped.
            fetch.held.pop(key, None)
        self._query_emit(conn, head + fetch.fid_bytes + kv)

    def _query_key_event(self, groups: list[QueryGroup], code: int, action: int, key: bytes) -> None:
        """FETCH_METHOD / FETCH_NODE ``action`` on ``key`` to the fetches of ``groups``
        whose path matchers match it."""
        frame_tail = bytes((action,)) + U16.pack(len(key)) + key
        head = EVT_HEAD_PACK(EVENT, 5 + len(frame_tail), code)
        for group in groups:
            if group.compiled.match_key(key):
                for fetch in group.fetches.values():
                    if fetch.pending:
                        self._query_backlog(fetch, key, head + fetch.fid_bytes + frame_tail)
                    else:
                        self._query_emit(fetch.conn, head + fetch.fid_bytes + frame_tail)

    def _query_backlog(self, fetch: QueryFetch, key: bytes, frame: bytes) -> None:
        """An event for a fetch whose initial entries are under way (PROTOCOL.md 10.5):
        kept to follow the last of them if they have passed ``key``; else nothing, since
        the entry of ``key``, if any, will carry its state of that moment."""
        cursor = fetch.cursor
        if cursor is None or key > cursor or fetch.conn.closing:
            return
        fetch.backlog.append(frame)
        fetch.backlog_size += len(frame)
        conn = fetch.conn
        # PROTOCOL.md 10.8: held events are output owed to the peer like any other.
        if fetch.backlog_size + conn.queued + conn.out_size > self.config.hard_limit:
            self.out.overload(conn, "output above the hard limit")

    def method_changed(self, key: bytes, added: bool) -> None:
        """A method was added or removed: FETCH_METHOD, and nodes (PROTOCOL.md 14.2)."""
        if not self.index.by_signature:
            return
        nodes = self.nodes
        if added:
            if nodes is not None:
                for node in nodes.add(key):
                    self._query_key_event(self.index.node_groups, FETCH_NODE, ADD, node)
            self._query_key_event(self.index.method_groups, FETCH_METHOD, ADD, key)
        else:
            self._query_key_event(self.index.method_groups, FETCH_METHOD, REMOVE, key)
            if nodes is not None:
                for node in nodes.remove(key):
                    self._query_key_event(self.index.node_groups, FETCH_NODE, REMOVE, node)

    # --- slow consumers (PROTOCOL.md 10.8, 14.3) ----------------------------------------------

    def catch_up(self, conn: Connection) -> bool:
        """Queue what ``conn``'s query fetches held while it was paused; True if anything
        was queued (the connection then stays paused until that is written). Whole
        windows past the slice wait for :meth:`refresh_windows` (issue 29)."""
        queued = False
        registry = self.registry
        for fetch in list(conn.query_fetches.values()):
            if conn.closing:
                break
            if fetch.held:
                held = fetch.held
                fetch.held = {}
                head_code = EVT_HEAD_PACK
                for key in held:
                    kv = registry.value(key)
                    if kv is not None and key in fetch.group.matched:
                        self._query_emit(conn, head_code(EVENT, 5 + len(kv), FETCH_CHANGE) + fetch.fid_bytes + kv)
                        queued = True
            if fetch.dirty:
                fetch.dirty = False
                if fetch.stale_first is None and not self.scheduler.spend(fetch.size):
                    self._send_window(fetch, fetch.low, fetch.low + fetch.size - 1)
                    queued = True
                else:  # the slice is over: the whole window waits for a later one
                    self._defer_window(fetch, fetch.low, fetch.low + fetch.size - 1)
        self.stats.caught_up += queued
        return queued

    def release(self, conn: Connection, key: bytes) -> None:
        """Before the answer to a paused connection's own request on ``key``: its held
        change of ``key`` and its dirty windows go first (PROTOCOL.md 10.8)."""
        for fetch in conn.query_fetches.values():
            if key in fetch.held:
                del fetch.held[key]
                kv = self.registry.value(key)
                if kv is not None and key in fetch.group.matched:
                    self._query_emit(conn, EVT_HEAD_PACK(EVENT, 5 + len(kv), FETCH_CHANGE) + fetch.fid_bytes + kv)
            if fetch.dirty and key in fetch.group.matched:
                fetch.dirty = False
                self._unstale(fetch)
                self._send_window(fetch, fetch.low, fetch.low + fetch.size - 1)


QUERY_FUNCTIONS = (Function.FETCH_QUERY.value, Function.QUERY_ONCE.value)
