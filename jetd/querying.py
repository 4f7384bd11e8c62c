"""FETCH_QUERY and QUERY_ONCE in the daemon (PROTOCOL.md 14): the requests, the events a
change causes for query fetches, methods and nodes, and slow consumers of query fetches.

The engine (:mod:`jetd.query`) decides what matches and where; this module turns that
into frames. It hooks into the rest of the core at a few points only: the fan-out of a
state change (``_query_state``), methods added and removed (``_query_method``), UNFETCH,
a connection's teardown, and the catch-up of a paused connection (section 10.8).

Slow consumers (PROTOCOL.md 14.3): while a connection is paused, the FETCH_CHANGE events
of its unsorted query fetches are held per (fetch, key) and the window updates of its
sorted ones are reduced to "dirty"; on draining, the held keys get one FETCH_CHANGE
with the latest value and a dirty window one FETCH_WINDOW listing every position. Every
other event is queued in order (it is never held back).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from jetwire import EntryKind, FetchQuery, Function, QueryOnce, RemoteProtocolError, Status, decode_body
from jetwire.codes import EventCode

from .base import DaemonBase
from .connection import Connection
from .frames import (
    EVENT,
    EVT_HEAD_PACK,
    FETCH_ADD,
    FETCH_CHANGE,
    FETCH_REMOVE,
    FRAME_OUT,
    REQUEST,
    RESP_HEAD_PACK,
    RESPONSE,
    U16,
    U32_PACK,
    ok_frame,
)
from .query import (
    BEYOND,
    CompiledQuery,
    Extractor,
    NodeIndex,
    QueryError,
    QueryGroup,
    QueryIndex,
    QueryLimits,
    compile_query,
    window_update,
)

__all__ = ["QueryFetch", "QueryHandlers"]

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


class QueryFetch:
    """One FETCH_QUERY: its id, connection, group, 0-based window ``low``..``high``
    and current ``size`` (sorted), and what is held while the connection is paused."""

    __slots__ = ("conn", "dirty", "fid", "fid_bytes", "group", "held", "high", "low", "size")

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


class QueryHandlers(DaemonBase):
    """The query requests and the query side of fan-out (see the module docstring)."""

    queries: QueryIndex
    nodes: Optional[NodeIndex]

    # --- requests -------------------------------------------------------------------------

    def _compile_request(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> Optional[CompiledQuery]:
        """Decode and compile a FETCH_QUERY / QUERY_ONCE; answers the error and returns
        None if it cannot run (PROTOCOL.md 14.5, 14.6)."""
        config = self.config
        if end - pos - 10 > config.max_query_size:
            self._reply(conn, rid, Status.TOO_LARGE, f"query of {end - pos - 10} bytes exceeds {config.max_query_size}")
            return None
        try:
            request = decode_body(REQUEST, buf[pos + 5 : end])
        except RemoteProtocolError as exc:
            self._violation(conn, exc.message)
            self._reply(conn, rid, exc.status, exc.message)
            return None
        assert isinstance(request, (FetchQuery, QueryOnce))
        limits = QueryLimits(config.max_query_terms, config.max_window, config.max_field_depth)
        try:
            return compile_query(request.query, limits)
        except QueryError as exc:
            self._reply(conn, rid, exc.status, exc.message)
            return None

    def _fetch_query(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        """FETCH_QUERY (PROTOCOL.md 14.3): the OK, the initial entries, then live."""
        compiled = self._compile_request(conn, buf, pos, end, rid)
        if compiled is None:
            return
        if len(conn.fetches) + len(conn.query_fetches) >= self.config.max_fetches_per_connection:
            self._reply(
                conn,
                rid,
                Status.LIMIT_EXCEEDED,
                f"at most {self.config.max_fetches_per_connection} fetches per connection",
            )
            return
        group, new = self.queries.group_for(compiled)
        if new:
            group.seed(self.registry.matching(compiled.prefix))
            if compiled.nodes and self.nodes is None:
                registry = self.registry
                self.nodes = NodeIndex([*registry.states, *registry.methods])
        fetch = QueryFetch(self._next_fetch_id, conn, group)
        self._next_fetch_id += 1
        self._send(conn, RESP_HEAD_PACK(RESPONSE, 9, rid, 0) + fetch.fid_bytes)
        group.fetches[fetch.fid] = fetch
        conn.query_fetches[fetch.fid] = fetch
        if compiled.sorted and fetch.high > group.reach:
            group.set_reach(fetch.high)
        if compiled.sorted:
            fetch.size = max(0, min(fetch.high, len(group) - 1) - fetch.low + 1)
            self._send_window(fetch, fetch.low, fetch.low + fetch.size - 1)
            return
        for kind, key, kv in self._entries_in_key_order(group):
            if kind == EntryKind.STATE:
                frame = EVT_HEAD_PACK(EVENT, 5 + len(kv), FETCH_ADD) + fetch.fid_bytes + kv
            else:
                code = FETCH_NODE if kind == EntryKind.NODE else FETCH_METHOD
                frame = EVT_HEAD_PACK(EVENT, 8 + len(key), code) + fetch.fid_bytes + bytes((ADD,)) + kv[: 2 + len(key)]
            if not self._query_emit(conn, frame):
                return

    def _query_once(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        """QUERY_ONCE (PROTOCOL.md 14.4): QUERY_ENTRY per entry, then the OK."""
        compiled = self._compile_request(conn, buf, pos, end, rid)
        if compiled is None:
            return
        # A shared sorted group keeps only what its fetches' windows reach in order.
        group = None if compiled.sorted else self.queries.by_signature.get(compiled.signature)
        if group is None:
            group = QueryGroup(compiled)
            group.seed(self.registry.matching(compiled.prefix))
        head = U32_PACK(rid)
        states = self.registry.states
        if compiled.sorted:
            query = compiled.query
            last = min(query.window_to, len(group))
            for position in range(query.window_from - 1, last):
                key = group.at(position)
                self._query_entry(conn, head, EntryKind.STATE, states[key].states[key])
                if conn.closing:
                    return
        else:
            for kind, _key, kv in self._entries_in_key_order(group):
                self._query_entry(conn, head, kind, kv)
                if conn.closing:
                    return
        self._send(conn, ok_frame(rid))

    def _query_entry(self, conn: Connection, head: bytes, kind: int, kv: bytes) -> None:
        frame = EVT_HEAD_PACK(EVENT, 6 + len(kv), QUERY_ENTRY) + head + bytes((kind,)) + kv
        self._query_emit(conn, frame)

    def _entries_in_key_order(self, group: QueryGroup) -> list[tuple[int, bytes, bytes]]:
        """(kind, key, Key-Value payload) of the group's entries in byte order of key,
        a node before a state or method of the same key (PROTOCOL.md 14.3, 14.4). Method
        and node entries carry a NONE value."""
        compiled = group.compiled
        matched = group.matched
        entries = [
            (_ENTRY_AFTER, key, EntryKind.STATE, kv) for key, kv in self.registry.matching(compiled.prefix) if key in matched
        ]
        if compiled.methods or compiled.nodes:
            match_key = compiled.match_key
            if compiled.methods:
                entries.extend(
                    (_ENTRY_AFTER, key, EntryKind.METHOD, U16.pack(len(key)) + key + NONE_VALUE)
                    for key in self.registry.methods
                    if match_key(key)
                )
            if compiled.nodes:
                # A one-shot query may ask for nodes while no fetch keeps them counted.
                nodes = self.nodes or NodeIndex([*self.registry.states, *self.registry.methods])
                entries.extend(
                    (_NODE_FIRST, key, EntryKind.NODE, U16.pack(len(key)) + key + NONE_VALUE)
                    for key in nodes.counts
                    if match_key(key)
                )
            entries.sort(key=lambda entry: (entry[1], entry[0]))
        return [(kind, key, kv) for _, key, kind, kv in entries]

    def _unfetch_query(self, conn: Connection, fid: int) -> bool:
        """UNFETCH of a query fetch; False if ``fid`` is not one of ``conn``'s."""
        fetch = conn.query_fetches.pop(fid, None)
        if fetch is None:
            return False
        self._query_drop(fetch)
        return True

    def _query_drop(self, fetch: QueryFetch) -> None:
        group = fetch.group
        del group.fetches[fetch.fid]
        if group.order is not None:
            group.set_reach(max((f.high for f in group.fetches.values()), default=-1))
        if not group.fetches:
            self.queries.drop(group)
            if self.nodes is not None and not self.queries.node_groups:
                self.nodes = None

    def _query_teardown(self, conn: Connection) -> None:
        """A closing connection's query fetches end (PROTOCOL.md 10.6)."""
        for fetch in conn.query_fetches.values():
            self._query_drop(fetch)
        conn.query_fetches.clear()

    # --- output -----------------------------------------------------------------------------

    def _query_emit(self, conn: Connection, frame: bytes) -> bool:
        """Queue one query event for ``conn``; False if it could not be (closed, closing,
        over its max_body: closed TOO_LARGE, or over the hard limit)."""
        if conn.closing:
            return False
        if self._small_body_peers and len(frame) - 5 > conn.max_body:
            self._event_too_large(conn, len(frame) - 5)
            return False
        if conn.paused:
            if not self._enqueue(conn, frame):
                return False
        else:
            out = conn.out
            if not out:
                self.dirty.append(conn)
            out.append(frame)
        self.stats.fanout_events += 1
        if self._log_events and self._log is not None:
            self._log(conn.conn_id, FRAME_OUT, frame)
        return True

    def _send_window(self, fetch: QueryFetch, first: int, last: int) -> None:
        """FETCH_WINDOW with the entries at 0-based positions first..last and the size."""
        group = fetch.group
        states = self.registry.states
        parts = [fetch.fid_bytes, U32_PACK(fetch.size), U16.pack(max(0, last - first + 1))]
        for position in range(first, last + 1):
            key = group.at(position)
            parts.append(U32_PACK(position + 1))
            parts.append(states[key].states[key])
        body = b"".join(parts)
        self._query_emit(fetch.conn, EVT_HEAD_PACK(EVENT, 1 + len(body), FETCH_WINDOW) + body)

    # --- changes ----------------------------------------------------------------------------

    def _query_state(self, key: bytes, code: int, kv: bytes) -> None:
        """A state was added (FETCH_ADD), changed (FETCH_CHANGE) or removed (FETCH_REMOVE):
        the query fetches' events (PROTOCOL.md 14.2), and nodes created or deleted."""
        nodes = self.nodes
        if nodes is not None and code == FETCH_ADD:
            for node in nodes.add(key):
                self._query_key_event(self.queries.node_groups, FETCH_NODE, ADD, node)
        queries = self.queries
        cached = queries.cache.get(key)
        groups = cached[1] if cached is not None and cached[0] == queries.generation else queries.targets(key)
        extractor: Optional[Extractor] = None
        for group in groups:
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
                    if update is None or fetch.conn.closing:
                        continue
                    fetch.size = update[2]
                    if fetch.conn.paused:
                        fetch.dirty = True  # PROTOCOL.md 14.3: sent whole on draining
                    else:
                        self._send_window(fetch, update[0], update[1])
        if code == FETCH_REMOVE:
            self.queries.forget(key)
            if nodes is not None:
                for node in nodes.remove(key):
                    self._query_key_event(self.queries.node_groups, FETCH_NODE, REMOVE, node)

    def _query_kv_event(self, fetch: QueryFetch, event: int, head: bytes, key: bytes, kv: bytes) -> None:
        conn = fetch.conn
        if conn.closing:
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
                    self._query_emit(fetch.conn, head + fetch.fid_bytes + frame_tail)

    def _query_method(self, key: bytes, added: bool) -> None:
        """A method was added or removed: FETCH_METHOD, and nodes (PROTOCOL.md 14.2)."""
        nodes = self.nodes
        if added:
            if nodes is not None:
                for node in nodes.add(key):
                    self._query_key_event(self.queries.node_groups, FETCH_NODE, ADD, node)
            self._query_key_event(self.queries.method_groups, FETCH_METHOD, ADD, key)
        else:
            self._query_key_event(self.queries.method_groups, FETCH_METHOD, REMOVE, key)
            if nodes is not None:
                for node in nodes.remove(key):
                    self._query_key_event(self.queries.node_groups, FETCH_NODE, REMOVE, node)

    # --- slow consumers (PROTOCOL.md 10.8, 14.3) ----------------------------------------------

    def _query_catch_up(self, conn: Connection) -> bool:
        """Queue what ``conn``'s query fetches held while it was paused; True if anything
        was queued (the connection then stays paused until that is written)."""
        queued = False
        states = self.registry.states
        for fetch in list(conn.query_fetches.values()):
            if conn.closing:
                break
            if fetch.held:
                held = fetch.held
                fetch.held = {}
                head_code = EVT_HEAD_PACK
                for key in held:
                    owner = states.get(key)
                    if owner is not None and key in fetch.group.matched:
                        kv = owner.states[key]
                        self._query_emit(conn, head_code(EVENT, 5 + len(kv), FETCH_CHANGE) + fetch.fid_bytes + kv)
                        queued = True
            if fetch.dirty:
                fetch.dirty = False
                self._send_window(fetch, fetch.low, fetch.low + fetch.size - 1)
                queued = True
        self.stats.caught_up += queued
        return queued

    def _query_release(self, conn: Connection, key: bytes) -> None:
        """Before the answer to a paused connection's own request on ``key``: its held
        change of ``key`` and its dirty windows go first (PROTOCOL.md 10.8)."""
        for fetch in conn.query_fetches.values():
            if key in fetch.held:
                del fetch.held[key]
                kv = self.registry.states[key].states[key] if key in self.registry.states else None
                if kv is not None and key in fetch.group.matched:
                    self._query_emit(conn, EVT_HEAD_PACK(EVENT, 5 + len(kv), FETCH_CHANGE) + fetch.fid_bytes + kv)
            if fetch.dirty and key in fetch.group.matched:
                fetch.dirty = False
                self._send_window(fetch, fetch.low, fetch.low + fetch.size - 1)


QUERY_FUNCTIONS = (Function.FETCH_QUERY.value, Function.QUERY_ONCE.value)
