"""The derived warehouse tables (``requests``, ``state_changes``, ``connections``) from
event-log records, with numpy and pyarrow: no JVM.

The work is split so that almost all of it runs next to the parser, in the Spark task
that read the records, and only what crosses a task or an ingest run reaches the driver:

- :func:`piece` takes the records of one contiguous byte range of one segment (the
  ``jetlog`` schema plus ``run_ns``) and returns what it can settle on its own: the
  requests whose request and response both lie in it, plus the *loose* exchange rows
  (requests still open at its end, responses and routes whose request lies before it),
  the state-change *candidates* and per-connection counters.
- :class:`Carry` is what an ingest run hands the next one: exchange rows of requests
  still open, state-change candidates held back behind them, every state's owner and
  last value, and every connection's counters.
- :func:`merge` pairs the loose rows of all pieces with the carried ones, folds the
  candidates into the state timelines, and totals the connections. It is proportional
  to state changes, connections and requests open at piece edges, not to records.

Pairing (JETLOG.md 4, PROTOCOL.md 4.1): the ids of a connection's pending requests are
distinct, so in (run, connection, side, id, seq) order a peer's REQUEST is followed by
its ROUTE if the daemon routed it, then by the response; and the owner's copy of a ROUTE
by the request the daemon sent the owner, then by the owner's answer. ``seq`` orders a
run's records: segment, then offset (JETLOG.md 6).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = [
    "CONNECTIONS_SCHEMA",
    "REQUESTS_SCHEMA",
    "STATE_CHANGES_SCHEMA",
    "TRAFFIC_SCHEMA",
    "Carry",
    "Merged",
    "Piece",
    "merge",
    "piece",
    "traffic",
    "with_history",
    "with_seq",
    "write_file",
    "write_partitioned",
]

SEQ_SHIFT = 1 << 40  # segment offsets stay far below 1 TiB
STATE_OPS = ("ADD_STATE", "NOTIFY_STATE", "REMOVE_STATE")
_REQ, _ROUTE, _RESP = 0, 1, 2
_TS = pa.timestamp("us", tz="UTC")
_DAY_NS = 86_400 * 10**9
_I64, _STR, _BIN, _BOOL = pa.int64(), pa.string(), pa.binary(), pa.bool_()

VIEW_SCHEMA = pa.schema([
    ("run_ns", _I64), ("daemon", _STR), ("seq", _I64), ("ts_ns", _I64), ("peer_name", _STR), ("conn_id", _I64),
    ("side", _BOOL), ("request_id", _I64), ("tag", pa.int8()), ("function", _STR), ("key", _STR),
    ("value_type", _STR), ("value", _BIN), ("value_text", _STR), ("status", _STR), ("text", _STR),
    ("owner_conn", _I64), ("owner_request_id", _I64),
])
"""An exchange row: a REQUEST or RESPONSE frame, or one of a ROUTE record's two copies
(``side`` False: under the requester's connection and id; True: under the owner's)."""

CANDIDATE_SCHEMA = pa.schema([
    ("run_ns", _I64), ("daemon", _STR), ("seq", _I64), ("ts_ns", _I64), ("key", _STR), ("conn_id", _I64),
    ("peer_name", _STR), ("op", _STR), ("value_type", _STR), ("value", _BIN), ("value_text", _STR),
])
"""A possible state change: ``op`` ADD_STATE/NOTIFY_STATE/REMOVE_STATE (a request the
daemon answered OK), EVENT (a NOTIFY_STATE event, which counts only from the owner),
CLOSE (a connection closed: its states go, PROTOCOL.md 10.6) or ROUTED (a SET_STATE the
daemon routed to ``conn_id``: not a change, evidence of the state's owner)."""

CONN_SCHEMA = pa.schema([
    ("run_ns", _I64), ("daemon", _STR), ("conn_id", _I64), ("open_ns", _I64), ("snapshot_ns", _I64),
    ("first_ns", _I64), ("close_ns", _I64), ("frames_in", _I64), ("frames_out", _I64), ("bytes_in", _I64),
    ("bytes_out", _I64), ("name", _STR), ("name_seq", _I64), ("address", _STR), ("address_seq", _I64),
    ("close_status", _STR), ("close_reason", _STR), ("close_seq", _I64), ("in_seq", _I64),
])
"""Counters of one connection over some records; any number of them add up (:func:`_total`).
``in_seq``: its last FRAME_IN."""

CLOSES_SCHEMA = pa.schema([("run_ns", _I64), ("conn_id", _I64), ("close_seq", _I64)])
OWNER_SCHEMA = pa.schema([("run_ns", _I64), ("key", _STR), ("conn_id", _I64), ("peer_name", _STR)])
LAST_SCHEMA = pa.schema([("run_ns", _I64), ("key", _STR), ("value_type", _STR), ("value_text", _STR),
                         ("value", _BIN)])

REQUESTS_SCHEMA = pa.schema([
    ("run_ns", _I64), ("daemon", _STR), ("ts", _TS), ("ts_ns", _I64), ("requester_conn", _I64),
    ("requester_name", _STR), ("request_id", _I64), ("function", _STR), ("key", _STR), ("key_prefix", _STR),
    ("value_type", _STR), ("argument_text", _STR), ("routed", _BOOL), ("owner_conn", _I64), ("owner_name", _STR),
    ("owner_request_id", _I64), ("status", _STR), ("message", _STR), ("owner_status", _STR),
    ("result_type", _STR), ("result_text", _STR), ("latency_ns", _I64), ("latency_ms", pa.float64()),
    ("owner_latency_ns", _I64),
])
STATE_CHANGES_SCHEMA = pa.schema([
    ("run_ns", _I64), ("daemon", _STR), ("ts", _TS), ("ts_ns", _I64), ("key", _STR), ("change", _STR),
    ("owner_conn", _I64), ("owner_name", _STR), ("type_before", _STR), ("value_before", _STR),
    ("bytes_before", _BIN), ("type_after", _STR), ("value_after", _STR), ("bytes_after", _BIN), ("seq", _I64),
    # null: the warehouse holds the run's whole history; else what is missing and what that
    # leaves underived (tools.ingest.warehouse.history_notes; set when committed)
    ("history", _STR),
])
TRAFFIC_SCHEMA = pa.schema([
    ("run_ns", _I64), ("daemon", _STR), ("second", _TS), ("error_status", _STR), ("records", _I64),
])
CONNECTIONS_SCHEMA = pa.schema([
    ("run_ns", _I64), ("daemon", _STR), ("conn_id", _I64), ("opened", _TS), ("closed", _TS), ("address", _STR),
    ("name", _STR), ("close_status", _STR), ("close_reason", _STR), ("duration_s", pa.float64()),
    ("frames_in", _I64), ("frames_out", _I64), ("bytes_in", _I64), ("bytes_out", _I64),
    ("history", _STR),  # as in STATE_CHANGES_SCHEMA: a connection opened before it was counted from there
])
"""The output tables' columns, in order; each is written partitioned by ``date`` (UTC)."""


# -- small helpers -------------------------------------------------------------------


def _mask(arr: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A boolean Arrow column as numpy, null as False."""
    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=bool)


def _eq(arr: pa.ChunkedArray, value: str) -> np.ndarray:
    return _mask(pc.equal(arr, value))


def _ints(arr: pa.ChunkedArray | pa.Array, null: int = -1) -> np.ndarray:
    return np.asarray(pc.fill_null(arr, null).to_numpy(zero_copy_only=False), dtype=np.int64)


def _keep(arr: pa.ChunkedArray, mask: np.ndarray) -> pa.ChunkedArray | pa.Array:
    """``arr`` where ``mask``, else null."""
    return pc.if_else(pa.array(mask, _BOOL), arr, pa.scalar(None, arr.type))


def _take(table: pa.Table, col: str, idx: np.ndarray) -> pa.Array:
    """``table[col]`` at ``idx``; -1 gives null."""
    return table.column(col).take(pa.array(idx, _I64, mask=idx < 0))


def _ts(ts_ns: pa.Array | pa.ChunkedArray) -> pa.Array:
    return pc.cast(pc.divide(ts_ns, 1000), _I64).cast(_TS) if len(ts_ns) else pa.array([], _TS)


def with_seq(frames: pa.Table) -> pa.Table:
    """Add ``seq``: a total order of a run's records (segment first, then offset)."""
    seq = pc.add(pc.multiply(frames.column("segment"), SEQ_SHIFT), frames.column("offset"))
    return frames.append_column("seq", seq)


def _empty(schema: pa.Schema) -> pa.Table:
    return schema.empty_table()


def _concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables([t.select(schema.names).cast(schema) for t in tables]) if tables else _empty(schema)


# -- pieces: what one task settles -----------------------------------------------------


def exchange_views(frames: pa.Table) -> pa.Table:
    """The exchange rows (:data:`VIEW_SCHEMA`) of records with ``run_ns`` and ``seq``.

    Only what the derived tables use is kept: keys and values on the requester's side,
    a value's bytes only for state operations.
    """
    kind, mt = frames.column("kind"), frames.column("msg_type")
    is_in, is_out = _eq(kind, "FRAME_IN"), _eq(kind, "FRAME_OUT")
    is_req, is_resp = _eq(mt, "REQUEST"), _eq(mt, "RESPONSE")
    owner_side = (is_out & is_req) | (is_in & is_resp)
    peer_req, peer_resp = is_in & is_req, is_out & is_resp
    sound = _mask(pc.is_null(frames.column("frame_error"))) & _mask(pc.is_valid(frames.column("request_id")))
    wanted = sound & (peer_req | peer_resp | owner_side)
    m = frames.filter(pa.array(wanted))
    side, preq, presp = owner_side[wanted], peer_req[wanted], peer_resp[wanted]
    state_op = _mask(pc.is_in(m.column("function"), pa.array(STATE_OPS)))
    n = m.num_rows
    msg = pa.table({
        "run_ns": m.column("run_ns"), "daemon": m.column("daemon"), "seq": m.column("seq"),
        "ts_ns": m.column("ts_ns"), "peer_name": m.column("peer_name"), "conn_id": m.column("conn_id"),
        "side": pa.array(side, _BOOL),
        "request_id": m.column("request_id"),
        "tag": pa.array(np.where(is_req[wanted], _REQ, _RESP).astype(np.int8)),
        "function": _keep(m.column("function"), preq), "key": _keep(m.column("key"), preq),
        "value_type": _keep(m.column("value_type"), ~side), "value": _keep(m.column("value"), preq & state_op),
        "value_text": _keep(m.column("value_text"), ~side), "status": m.column("status"),
        "text": _keep(m.column("text"), presp),
        "owner_conn": pa.nulls(n, _I64), "owner_request_id": pa.nulls(n, _I64),
    }, schema=VIEW_SCHEMA)
    r = frames.filter(pa.array(_eq(kind, "ROUTE") & _mask(pc.is_valid(frames.column("route_owner_id")))))
    copies = [msg]
    for owner_copy in (False, True):
        k = r.num_rows
        conn = r.column("route_owner_conn" if owner_copy else "route_requester_conn")
        rid = r.column("route_owner_id" if owner_copy else "route_requester_id")
        copies.append(pa.table({
            "run_ns": r.column("run_ns"), "daemon": r.column("daemon"), "seq": r.column("seq"),
            "ts_ns": r.column("ts_ns"), "peer_name": pa.nulls(k, _STR), "conn_id": conn,
            "side": pa.array(np.full(k, owner_copy), _BOOL), "request_id": rid,
            "tag": pa.array(np.full(k, _ROUTE, np.int8)),
            **{c: pa.nulls(k, VIEW_SCHEMA.field(c).type) for c in
               ("function", "key", "value_type", "value", "value_text", "status", "text")},
            "owner_conn": r.column("route_owner_conn"), "owner_request_id": r.column("route_owner_id"),
        }, schema=VIEW_SCHEMA))
    return pa.concat_tables(copies)


@dataclass
class _Paired:
    """Exchange rows in pairing order and, per REQUEST a peer sent, where its parts are
    (row indices; -1: none)."""

    views: pa.Table
    req: np.ndarray  # the request rows
    resp: np.ndarray  # its response
    route: np.ndarray  # its ROUTE (requester's copy)
    owner: np.ndarray  # that ROUTE's owner copy
    o_req: np.ndarray  # the request the daemon sent the owner
    o_resp: np.ndarray  # the owner's answer

    def rows(self, which: np.ndarray) -> np.ndarray:
        """Every exchange row of the requests ``which`` (a mask over ``req``)."""
        parts = [self.req[which]] + [a[which] for a in (self.resp, self.route, self.owner, self.o_req, self.o_resp)]
        out = np.zeros(self.views.num_rows, dtype=bool)
        for p in parts:
            out[p[p >= 0]] = True
        return out


def _pair(views: pa.Table) -> _Paired:
    n = views.num_rows
    run, conn, rid, seq = (_ints(views.column(c)) for c in ("run_ns", "conn_id", "request_id", "seq"))
    side = _mask(views.column("side"))
    order = np.lexsort((seq, rid, side, conn, run))
    views = views.take(pa.array(order))
    run, conn, rid, seq, side = run[order], conn[order], rid[order], seq[order], side[order]
    tag = np.asarray(views.column("tag").to_numpy(), dtype=np.int8)
    idx = np.arange(n, dtype=np.int64)

    def ahead(a: np.ndarray, k: int, fill: int | bool) -> np.ndarray:
        out = np.full(n, fill, dtype=a.dtype)
        if n > k:
            out[:-k] = a[k:]
        return out

    s1 = np.zeros(n, dtype=bool)  # row i + 1 is in row i's (run, connection, side, id)
    if n > 1:
        s1[:-1] = (run[1:] == run[:-1]) & (conn[1:] == conn[:-1]) & (side[1:] == side[:-1]) & (rid[1:] == rid[:-1])
    s2 = s1 & ahead(s1, 1, False)
    t1, t2 = ahead(tag, 1, -1), ahead(tag, 2, -1)
    request_row = (tag == _REQ) & ~side
    routed = request_row & s1 & (t1 == _ROUTE)
    resp = np.where(request_row & s1 & (t1 == _RESP), idx + 1, np.where(routed & s2 & (t2 == _RESP), idx + 2, -1))
    route = np.where(routed, idx + 1, -1)
    route_row = (tag == _ROUTE) & side
    sent = route_row & s1 & (t1 == _REQ)
    o_req_at = np.where(sent, idx + 1, -1)
    o_resp_at = np.where(sent & s2 & (t2 == _RESP), idx + 2, -1)
    # A ROUTE's two copies share (run, seq): requester copy first in (run, seq, side) order.
    r = np.flatnonzero(tag == _ROUTE)
    r = r[np.lexsort((side[r], seq[r], run[r]))]
    partner = np.full(n + 1, -1, dtype=np.int64)  # partner[-1] stays -1 for "no route"
    if len(r) > 1:
        a, b = r[:-1], r[1:]
        ok = (run[a] == run[b]) & (seq[a] == seq[b]) & ~side[a] & side[b]
        partner[a[ok]] = b[ok]
    req = np.flatnonzero(request_row)
    owner = partner[route[req]]
    o_req_at = np.append(o_req_at, -1)
    o_resp_at = np.append(o_resp_at, -1)
    return _Paired(views, req, resp[req], route[req], owner, o_req_at[owner], o_resp_at[owner])


def _answered(p: _Paired, which: np.ndarray) -> pa.Table:
    """One row per request in ``which`` (a mask over ``p.req``), with its parts' fields."""
    v = p.views
    i, r, ro, oq, oa = p.req[which], p.resp[which], p.route[which], p.o_req[which], p.o_resp[which]
    cols = {c: _take(v, c, i) for c in ("run_ns", "daemon", "seq", "ts_ns", "peer_name", "conn_id", "request_id",
                                         "function", "key", "value_type", "value", "value_text")}
    cols.update({
        "routed": pa.array(ro >= 0, _BOOL), "owner_conn": _take(v, "owner_conn", ro),
        "owner_request_id": _take(v, "owner_request_id", ro), "owner_name": _take(v, "peer_name", oq),
        "status": _take(v, "status", r), "message": _take(v, "text", r), "owner_status": _take(v, "status", oa),
        "result_type": _take(v, "value_type", r), "result_text": _take(v, "value_text", r),
        "resp_ns": _take(v, "ts_ns", r), "o_req_ns": _take(v, "ts_ns", oq), "o_resp_ns": _take(v, "ts_ns", oa),
    })
    return pa.table(cols)


def _requests(ans: pa.Table) -> pa.Table:
    """The ``requests`` rows (:data:`REQUESTS_SCHEMA`) of the SET_STATE and CALL_METHOD
    requests among ``ans``; unanswered ones have status UNANSWERED."""
    a = ans.filter(pc.is_in(ans.column("function"), pa.array(["SET_STATE", "CALL_METHOD"])))
    latency = pc.subtract(a.column("resp_ns"), a.column("ts_ns"))
    prefix = pc.list_element(pc.split_pattern(a.column("key"), "/", max_splits=1), 0) if a.num_rows else \
        pa.array([], _STR)
    return pa.table({
        "run_ns": a.column("run_ns"), "daemon": a.column("daemon"), "ts": _ts(a.column("ts_ns")),
        "ts_ns": a.column("ts_ns"), "requester_conn": a.column("conn_id"), "requester_name": a.column("peer_name"),
        "request_id": a.column("request_id"), "function": a.column("function"), "key": a.column("key"),
        "key_prefix": prefix, "value_type": a.column("value_type"), "argument_text": a.column("value_text"),
        "routed": a.column("routed"), "owner_conn": a.column("owner_conn"), "owner_name": a.column("owner_name"),
        "owner_request_id": a.column("owner_request_id"),
        "status": pc.fill_null(a.column("status"), "UNANSWERED"), "message": a.column("message"),
        "owner_status": a.column("owner_status"), "result_type": a.column("result_type"),
        "result_text": a.column("result_text"), "latency_ns": latency,
        "latency_ms": pc.divide(pc.cast(latency, pa.float64()), 1e6),
        "owner_latency_ns": pc.subtract(a.column("o_resp_ns"), a.column("o_req_ns")),
    }, schema=REQUESTS_SCHEMA)


def _op_candidates(ans: pa.Table) -> pa.Table:
    """State operations among answered requests that the daemon accepted (status OK)."""
    ok = ans.filter(pc.and_(pc.is_in(ans.column("function"), pa.array(STATE_OPS)),
                            pc.fill_null(pc.equal(ans.column("status"), "OK"), False)))
    return ok.append_column("op", ok.column("function")).select(CANDIDATE_SCHEMA.names).cast(CANDIDATE_SCHEMA)


def _record_candidates(frames: pa.Table) -> pa.Table:
    """NOTIFY_STATE events from peers (PROTOCOL.md 7.1), connection closes, and ROUTEs
    of SET_STATE: evidence of who owns a state (the daemon routes a set to its owner,
    PROTOCOL.md 10.3), for a history that lacks the state's ADD (a run read from a
    segment after its first: JETLOG.md 2)."""
    kind = frames.column("kind")
    event = (_eq(kind, "FRAME_IN") & _eq(frames.column("msg_type"), "EVENT")
             & _eq(frames.column("function"), "NOTIFY_STATE") & _mask(pc.is_null(frames.column("frame_error"))))
    close = _eq(kind, "CONN_CLOSE")
    routed = (_eq(kind, "ROUTE") & _eq(frames.column("function"), "SET_STATE")
              & _mask(pc.is_valid(frames.column("route_owner_conn"))))
    c = frames.filter(pa.array(event | close | routed))
    is_close, is_route = close[event | close | routed], routed[event | close | routed]
    valued = ~is_close & ~is_route
    return pa.table({
        "run_ns": c.column("run_ns"), "daemon": c.column("daemon"), "seq": c.column("seq"),
        "ts_ns": c.column("ts_ns"), "key": _keep(c.column("key"), ~is_close),
        "conn_id": pc.if_else(pa.array(is_route), c.column("route_owner_conn"), c.column("conn_id")),
        "peer_name": _keep(c.column("peer_name"), ~is_route),
        "op": pa.array(np.where(is_close, "CLOSE", np.where(is_route, "ROUTED", "EVENT")), _STR),
        "value_type": _keep(c.column("value_type"), valued), "value": _keep(c.column("value"), valued),
        "value_text": _keep(c.column("value_text"), valued),
    }, schema=CANDIDATE_SCHEMA)


def _conn_counters(frames: pa.Table) -> pa.Table:
    """Per (run, connection) counters of records (:data:`CONN_SCHEMA`): each record as
    counters of its own, added up by :func:`_total`."""
    f = frames.filter(pc.fill_null(pc.greater(frames.column("conn_id"), 0), False))
    kind, ts, size, seq = f.column("kind"), f.column("ts_ns"), f.column("size"), f.column("seq")
    is_in, is_out = _eq(kind, "FRAME_IN"), _eq(kind, "FRAME_OUT")
    is_open, is_snap, is_close = _eq(kind, "CONN_OPEN"), _eq(kind, "CONN_SNAPSHOT"), _eq(kind, "CONN_CLOSE")
    named = _mask(pc.is_valid(f.column("peer_name")))
    zero = pa.scalar(0, _I64)
    return _total([pa.table({
        "run_ns": f.column("run_ns"), "daemon": f.column("daemon"), "conn_id": f.column("conn_id"),
        "open_ns": _keep(ts, is_open), "snapshot_ns": _keep(ts, is_snap), "first_ns": ts,
        "close_ns": _keep(ts, is_close), "frames_in": pa.array(is_in.astype(np.int64)),
        "frames_out": pa.array(is_out.astype(np.int64)),
        "bytes_in": pc.if_else(pa.array(is_in), size, zero), "bytes_out": pc.if_else(pa.array(is_out), size, zero),
        "name": f.column("peer_name"), "name_seq": _keep(seq, named),
        "address": _keep(f.column("address"), is_open | is_snap), "address_seq": _keep(seq, is_open | is_snap),
        "close_status": _keep(f.column("status"), is_close), "close_reason": _keep(f.column("text"), is_close),
        "close_seq": _keep(seq, is_close), "in_seq": _keep(seq, is_in),
    })])


_MIN = ("open_ns", "snapshot_ns", "first_ns", "close_ns")
_SUM = ("frames_in", "frames_out", "bytes_in", "bytes_out")
_MAX = ("in_seq",)


def _add_up(t: pa.Table) -> pa.Table:
    """Per (run, daemon, connection): the earliest times and the sums of counts."""
    keys = ["run_ns", "daemon", "conn_id"]
    return t.group_by(keys, use_threads=False).aggregate(
        [(c, "min") for c in _MIN] + [(c, "sum") for c in _SUM] + [(c, "max") for c in _MAX]
    ).rename_columns([*keys, *_MIN, *_SUM, *_MAX])


def _one_per_conn(t: pa.Table, by: str, *, last: bool) -> pa.Table:
    """The row of ``t`` with the highest (``last``) or lowest ``by`` per (run, conn)."""
    run, conn, at = _ints(t.column("run_ns")), _ints(t.column("conn_id")), _ints(t.column(by))
    order = np.lexsort((-at if last else at, conn, run))
    first = np.ones(len(order), dtype=bool)
    if len(order) > 1:
        first[1:] = (run[order][1:] != run[order][:-1]) | (conn[order][1:] != conn[order][:-1])
    return t.take(pa.array(order[first]))


@dataclass
class Piece:
    """What :func:`piece` settles about a contiguous range of records, and what it leaves."""

    requests: pa.Table  # REQUESTS_SCHEMA: answered SET/CALL requests, final
    traffic: pa.Table  # TRAFFIC_SCHEMA, final (rows of one second may come from several pieces)
    loose: pa.Table  # VIEW_SCHEMA: exchange rows for :func:`merge`
    candidates: pa.Table  # CANDIDATE_SCHEMA
    conns: pa.Table  # CONN_SCHEMA


def piece(frames: pa.Table) -> Piece:
    """Settle what the records of one contiguous range of one segment can settle alone.

    ``frames``: the ``jetlog`` schema plus ``run_ns`` and ``seq`` (:func:`with_seq`).
    A request is settled here when its request and its response are both in range
    (every record between them then is too), unless the daemon sent it to an owner
    whose answer is not in range yet: an owner may answer after the requester was
    answered (a timeout, PROTOCOL.md 10.3), and that answer belongs to the row.
    """
    p = _pair(exchange_views(frames))
    done = (p.resp >= 0) & ~((p.o_req >= 0) & (p.o_resp < 0))
    ans = _answered(p, done)
    loose = p.views.filter(pa.array(~p.rows(done)))
    cands = pa.concat_tables([_op_candidates(ans), _record_candidates(frames)])
    return Piece(_requests(ans), traffic(frames), loose, cands, _conn_counters(frames))


def traffic(frames: pa.Table) -> pa.Table:
    """Records per (run, second, error status): the ``traffic`` rollup of ``frames``,
    which the report reads instead of every record. ``error_status``: the status of an
    error RESPONSE the daemon sent, null for every other record."""
    f = frames.filter(pc.is_valid(frames.column("ts_ns")))
    if not f.num_rows:
        return _empty(TRAFFIC_SCHEMA)
    status = f.column("status")
    error = _eq(f.column("kind"), "FRAME_OUT") & _eq(f.column("msg_type"), "RESPONSE") & ~_eq(status, "OK")
    t = pa.table({
        "run_ns": f.column("run_ns"), "daemon": f.column("daemon"),
        "second": pa.array(_ints(f.column("ts_ns")) // 10**9, _I64), "error_status": _keep(status, error),
    })
    agg = t.group_by(["run_ns", "daemon", "second", "error_status"], use_threads=False).aggregate(
        [([], "count_all")]).rename_columns(["run_ns", "daemon", "second", "error_status", "records"])
    seconds = pc.multiply(agg.column("second"), 10**6).cast(_TS)
    return agg.set_column(agg.schema.get_field_index("second"), "second", seconds).select(
        TRAFFIC_SCHEMA.names).cast(TRAFFIC_SCHEMA)


# -- the merge: what crosses pieces and ingest runs -------------------------------------


@dataclass
class Carry:
    """What one ingest run hands the next (all empty for a new warehouse)."""

    loose: pa.Table  # VIEW_SCHEMA: the exchange rows of requests still open
    held: pa.Table  # CANDIDATE_SCHEMA: candidates not yet settled (behind an open state op)
    owners: pa.Table  # OWNER_SCHEMA: each live state's owner
    last: pa.Table  # LAST_SCHEMA: each state's value after its last change
    conns: pa.Table  # CONN_SCHEMA: the counters of connections still open
    closes: pa.Table  # CLOSES_SCHEMA: when the closed requesters and owners of open requests closed

    NAMES = ("loose", "held", "owners", "last", "conns", "closes")
    SCHEMAS = (VIEW_SCHEMA, CANDIDATE_SCHEMA, OWNER_SCHEMA, LAST_SCHEMA, CONN_SCHEMA, CLOSES_SCHEMA)

    @classmethod
    def empty(cls) -> Carry:
        return cls(*[_empty(s) for s in cls.SCHEMAS])

    @classmethod
    def load(cls, directory: Path) -> Carry:
        return cls(*[pq.read_table(directory / f"{n}.parquet", schema=s) for n, s in zip(cls.NAMES, cls.SCHEMAS,
                                                                                          strict=True)])

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name in self.NAMES:
            write_file(getattr(self, name), directory / f"{name}.parquet")


@dataclass
class Merged:
    """The rows :func:`merge` settles, and the carry for the next run."""

    requests: pa.Table  # REQUESTS_SCHEMA: final rows
    pending: pa.Table  # REQUESTS_SCHEMA: requests still open (status UNANSWERED for now)
    state_changes: pa.Table  # STATE_CHANGES_SCHEMA
    connections: pa.Table  # CONNECTIONS_SCHEMA: connections closed, or of runs that ended: final
    open_connections: pa.Table  # CONNECTIONS_SCHEMA: the others, counted so far
    carry: Carry


def merge(carry: Carry, loose: list[pa.Table], candidates: list[pa.Table], conns: list[pa.Table],
          live_runs: Optional[set[int]] = None) -> Merged:
    """Settle what the pieces of an ingest run left, with what earlier runs carried.

    ``live_runs``: runs whose daemon may still write (the latest run of each daemon);
    requests still open in other runs are final, as are those whose requester has
    closed (unless their owner may still answer). ``None``: every run is live.
    """
    total = _total([carry.conns, *conns])
    t_run, t_conn = _ints(total.column("run_ns")).tolist(), _ints(total.column("conn_id")).tolist()
    closed = {(r, c): s for r, c, s in zip(t_run, t_conn, _ints(total.column("close_seq")).tolist(), strict=True)
              if s >= 0}
    closed.update(zip(zip(_ints(carry.closes.column("run_ns")).tolist(), _ints(carry.closes.column("conn_id")).tolist(),
                          strict=True), _ints(carry.closes.column("close_seq")).tolist(), strict=True))
    last_in: dict[int, int] = {}
    for r, s in zip(t_run, _ints(total.column("in_seq")).tolist(), strict=True):
        last_in[r] = max(s, last_in.get(r, s))
    p = _pair(_concat([carry.loose, *loose], VIEW_SCHEMA))
    run, conn, seq = (_ints(p.views.column(c)) for c in ("run_ns", "conn_id", "seq"))
    owner_conn = np.append(_ints(p.views.column("owner_conn")), -1)
    seq_at = np.append(seq, -1)
    req_run, req_conn, req_seq = run[p.req].tolist(), conn[p.req].tolist(), seq[p.req].tolist()
    live = np.array([live_runs is None or r in live_runs for r in req_run], dtype=bool)

    def after(ends: dict[tuple[int, int], int], conns: list[int], seqs: list[int]) -> np.ndarray:
        return np.array([ends.get((r, c), -1) > s for r, c, s in zip(req_run, conns, seqs, strict=True)], dtype=bool)

    # The owner may still answer: the daemon sent it the request, its answer is not in
    # yet, and it has not closed.
    owner_open = (p.o_req >= 0) & (p.o_resp < 0) & live & ~after(
        closed, owner_conn[p.route].tolist(), seq_at[p.o_req].tolist())
    requester_gone = after(closed, req_conn, req_seq)
    # The daemon answers ADD/NOTIFY/REMOVE itself before it reads the next frame of any
    # connection (JETLOG.md 4): past a later FRAME_IN, a missing answer will never be
    # read (its record was damaged).
    state_op = _mask(pc.is_in(p.views.column("function").take(pa.array(p.req, _I64)), pa.array(STATE_OPS)))
    skipped = state_op & (p.resp < 0) & np.array([last_in.get(r, -1) > s for r, s in zip(req_run, req_seq,
                                                                                          strict=True)], dtype=bool)
    settled = ((p.resp >= 0) | requester_gone | skipped | ~live) & ~owner_open
    waiting = ~settled
    ans = _answered(p, settled)
    pending = _answered(p, waiting)
    # Candidates behind a state operation still waiting for its answer are held back,
    # so every state's timeline is settled in order.
    held_from: dict[int, int] = {}
    wait_ops = pending.filter(pc.is_in(pending.column("function"), pa.array(STATE_OPS)))
    for r, s in zip(_ints(wait_ops.column("run_ns")).tolist(), _ints(wait_ops.column("seq")).tolist(), strict=True):
        held_from[r] = min(s, held_from.get(r, s))
    cands = _concat([carry.held, _op_candidates(ans), *candidates], CANDIDATE_SCHEMA)
    c_run, c_seq = _ints(cands.column("run_ns")), _ints(cands.column("seq"))
    hold = np.zeros(cands.num_rows, dtype=bool)
    for r, s in held_from.items():
        hold |= (c_run == r) & (c_seq >= s)
    changes, owners, last = _timeline(cands.filter(pa.array(~hold)), carry.owners, carry.last)
    # A connection is final once closed, or once its run can get no more records; only
    # open ones, and the states of live runs, are carried.
    gone = _mask(pc.is_valid(total.column("close_ns")))
    if live_runs is not None:
        gone |= ~_mask(pc.is_in(total.column("run_ns"), pa.array(sorted(live_runs), _I64)))
        owners, last = (t.filter(pc.is_in(t.column("run_ns"), pa.array(sorted(live_runs), _I64)))
                        for t in (owners, last))
    # The closes a request still open needs later: its requester's and its owner's.
    w_run = run[p.req][waiting].tolist()
    refs = {(r, c) for r, c in zip(w_run + w_run, conn[p.req][waiting].tolist() + owner_conn[p.route][waiting].tolist(),
                                   strict=True) if (r, c) in closed}
    closes = pa.table({"run_ns": [r for r, _ in refs], "conn_id": [c for _, c in refs],
                       "close_seq": [closed[k] for k in refs]}, schema=CLOSES_SCHEMA)
    new_carry = Carry(p.views.filter(pa.array(p.rows(waiting))), cands.filter(pa.array(hold)), owners, last,
                      total.filter(pa.array(~gone)), closes)
    return Merged(_requests(ans), _requests(pending), changes, _connections(total.filter(pa.array(gone))),
                  _connections(total.filter(pa.array(~gone))), new_carry)


_POINTS_SCHEMA = pa.schema([("run_ns", _I64), ("key", _STR), ("seq", _I64), ("owner", _I64)])


def _timeline(cands: pa.Table, owners: pa.Table, last: pa.Table) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Fold candidates into state changes with the value before and after each.

    ADD/NOTIFY/REMOVE requests the daemon accepted are changes (PROTOCOL.md 10.4); a
    NOTIFY event counts only from the state's owner (7.1); a connection's close removes
    every state it owned (10.6): a DISCONNECT change. Returns the changes and the new
    owners and last values.
    """
    cands = cands.take(pc.sort_indices(cands, [("run_ns", "ascending"), ("seq", "ascending")]))
    owner: dict[tuple[int, str], tuple[int, Optional[str]]] = {
        (r, k): (c, n) for r, k, c, n in zip(*(owners.column(x).to_pylist() for x in OWNER_SCHEMA.names),
                                             strict=True)}
    owned: dict[tuple[int, int], dict[str, None]] = {}
    for (r, k), (c, _) in owner.items():
        owned.setdefault((r, c), {})[k] = None
    # Ownership changes at ADDs, REMOVEs and closes only (few): a Python fold over those
    # records where it changed (``points``: run, key, seq, owner or -1). NOTIFY events
    # (most changes, from peers) are then checked against it with vector operations.
    points: dict[str, list[Any]] = {"run_ns": [], "key": [], "seq": [], "owner": []}

    def point(r: int, k: str, at: int, c: int) -> None:
        for col, v in (("run_ns", r), ("key", k), ("seq", at), ("owner", c)):
            points[col].append(v)

    for (r, k), (c, _) in owner.items():
        point(r, k, -1, c)  # before every candidate here
    ops = cands.column("op")
    is_event = _eq(ops, "EVENT")
    is_control = _mask(pc.is_in(ops, pa.array(["ADD_STATE", "REMOVE_STATE", "CLOSE"])))
    # A history that starts after a state's ADD (JETLOG.md 2: a run read from a later
    # segment, or --since) does not say who owns it. A routed SET or an accepted NOTIFY
    # request does (PROTOCOL.md 10.3, 7.1): the first such evidence of a state whose
    # owner is unknown there makes its sender the owner from then on, so that the
    # owner's NOTIFY events count. (With the whole history every state's owner is
    # known from its ADD: no evidence is used.)
    evidence = _eq(ops, "ROUTED") | _eq(ops, "NOTIFY_STATE")
    if evidence.any():
        known = pa.table(points, schema=_POINTS_SCHEMA)
        adds = cands.filter(pa.array(_eq(ops, "ADD_STATE") | _eq(ops, "REMOVE_STATE")))
        known = pa.concat_tables([known, pa.table({
            "run_ns": adds.column("run_ns"), "key": adds.column("key"), "seq": adds.column("seq"),
            "owner": pc.if_else(pc.equal(adds.column("op"), "ADD_STATE"), adds.column("conn_id"),
                                pa.scalar(-1, _I64))}, schema=_POINTS_SCHEMA)])
        at = np.flatnonzero(evidence)
        owners_then = _closed_to_none(_owner_at(known, cands.take(pa.array(at))), cands, at, _eq(ops, "CLOSE"))
        unknown = at[owners_then == -1]
        if len(unknown):
            runs, keys = _ints(cands.column("run_ns"))[unknown], cands.column("key").take(pa.array(unknown))
            codes = _ints(pc.dictionary_encode(keys).combine_chunks().indices if isinstance(keys, pa.ChunkedArray)
                          else pc.dictionary_encode(keys).indices)
            # cands are in (run, seq) order: the first row of each (run, key) is its first evidence
            _, first = np.unique(np.stack([runs, codes]), axis=1, return_index=True)
            is_control[unknown[first]] = True
    control = np.flatnonzero(is_control)
    keep = ~_eq(ops, "CLOSE") & ~_eq(ops, "ROUTED")
    gone: dict[str, list[Any]] = {c: [] for c in ("run_ns", "daemon", "owner_conn", "seq", "ts_ns", "owner_name",
                                                   "key")}

    if len(control):
        ctl = cands.take(pa.array(control)).select(["op", "run_ns", "daemon", "key", "conn_id", "peer_name", "seq",
                                                     "ts_ns"]).to_pylist()
        for row in ctl:
            r, k, c, at = row["run_ns"], row["key"], row["conn_id"], row["seq"]
            if row["op"] == "ADD_STATE":
                prev = owner.get((r, k))
                if prev is not None:
                    owned.get((r, prev[0]), {}).pop(k, None)
                owner[(r, k)] = (c, row["peer_name"])
                owned.setdefault((r, c), {})[k] = None
                point(r, k, at, c)
            elif row["op"] in ("ROUTED", "NOTIFY_STATE"):  # evidence of an owner unknown so far
                if (r, k) not in owner:
                    owner[(r, k)] = (c, row["peer_name"])
                    owned.setdefault((r, c), {})[k] = None
                    point(r, k, at, c)
            elif row["op"] == "REMOVE_STATE":
                prev = owner.pop((r, k), None)
                if prev is not None:
                    owned.get((r, prev[0]), {}).pop(k, None)
                point(r, k, at, -1)
            else:  # CLOSE
                for key in owned.pop((r, c), {}):
                    values: tuple[tuple[str, Any], ...] = (
                        ("run_ns", r), ("daemon", row["daemon"]), ("owner_conn", c), ("seq", at),
                        ("ts_ns", row["ts_ns"]), ("owner_name", owner.pop((r, key))[1] or row["peer_name"]),
                        ("key", key))
                    for col, v in values:
                        gone[col].append(v)
                    point(r, key, at, -1)
    if is_event.any():
        keep[is_event] = _owner_at(pa.table(points, schema=_POINTS_SCHEMA),
                                   cands.filter(pa.array(is_event))) == _ints(cands.column("conn_id"))[is_event]
    kept = cands.filter(pa.array(keep))
    removal = _mask(pc.is_in(kept.column("op"), pa.array(["REMOVE_STATE"])))
    change = pc.replace_substring_regex(pc.if_else(pc.equal(kept.column("op"), "EVENT"), "NOTIFY_STATE",
                                                   kept.column("op")), "_STATE$", "")
    rows = pa.table({
        "run_ns": kept.column("run_ns"), "daemon": kept.column("daemon"), "key": kept.column("key"),
        "change": change, "owner_conn": kept.column("conn_id"), "owner_name": kept.column("peer_name"),
        "value_type": _keep(kept.column("value_type"), ~removal),
        "value_text": _keep(kept.column("value_text"), ~removal), "value": _keep(kept.column("value"), ~removal),
        "seq": kept.column("seq"), "ts_ns": kept.column("ts_ns"),
    })
    if gone["key"]:
        n = len(gone["key"])
        rows = pa.concat_tables([rows, pa.table({
            **gone, "change": ["DISCONNECT"] * n, "value_type": pa.nulls(n, _STR), "value_text": pa.nulls(n, _STR),
            "value": pa.nulls(n, _BIN)}, schema=rows.schema)])
    # Before: the previous change of the same state, or its last value from earlier runs.
    rows = rows.take(pc.sort_indices(rows, [("run_ns", "ascending"), ("key", "ascending"), ("seq", "ascending")]))
    n = rows.num_rows
    run = _ints(rows.column("run_ns"))
    key_codes = _ints(pc.dictionary_encode(rows.column("key")).combine_chunks().indices) if n else run
    first = np.ones(n, dtype=bool)
    if n > 1:
        first[1:] = (run[1:] != run[:-1]) | (key_codes[1:] != key_codes[:-1])
    before_at = np.where(first, -1, np.arange(n) - 1)
    starts = rows.filter(pa.array(first)).select(["run_ns", "key"]).append_column(
        "at", pa.array(np.flatnonzero(first), _I64))
    if last.num_rows and starts.num_rows:
        ref = last.append_column("_at", pa.array(np.arange(last.num_rows) + n, _I64)).select(["run_ns", "key", "_at"])
        found = starts.join(ref, ["run_ns", "key"], join_type="left outer")
        before_at[_ints(found.column("at"))] = _ints(found.column("_at"))
    source = pa.concat_tables([rows.select(["value_type", "value_text", "value"]).cast(
        pa.schema([LAST_SCHEMA.field(c) for c in ("value_type", "value_text", "value")])),
        last.select(["value_type", "value_text", "value"])])
    before = {c: _take(source, c, before_at) for c in ("value_type", "value_text", "value")}
    out = pa.table({
        "run_ns": rows.column("run_ns"), "daemon": rows.column("daemon"), "ts": _ts(rows.column("ts_ns")),
        "ts_ns": rows.column("ts_ns"), "key": rows.column("key"), "change": rows.column("change"),
        "owner_conn": rows.column("owner_conn"), "owner_name": rows.column("owner_name"),
        "type_before": before["value_type"], "value_before": before["value_text"], "bytes_before": before["value"],
        "type_after": rows.column("value_type"), "value_after": rows.column("value_text"),
        "bytes_after": rows.column("value"), "seq": rows.column("seq"), "history": pa.nulls(n, _STR),
    }, schema=STATE_CHANGES_SCHEMA)
    # The new last values: each state's final row here, over the earlier ones.
    is_last = np.ones(n, dtype=bool)
    if n > 1:
        is_last[:-1] = first[1:]
    ends = rows.filter(pa.array(is_last)).select(["run_ns", "key", "value_type", "value_text", "value"])
    new_last = _upsert(last, ends.cast(LAST_SCHEMA), ["run_ns", "key"])
    # A state removed has no value: the next change's "before" is null with or without
    # its row, so only states that exist are kept.
    new_last = new_last.filter(pc.is_valid(new_last.column("value_type")))
    new_owners = pa.table({
        "run_ns": pa.array([r for r, _ in owner], _I64), "key": pa.array([k for _, k in owner], _STR),
        "conn_id": pa.array([c for c, _ in owner.values()], _I64),
        "peer_name": pa.array([nm for _, nm in owner.values()], _STR),
    }, schema=OWNER_SCHEMA)
    return out, new_owners, new_last


def with_history(rows: pa.Table, notes: dict[int, str]) -> pa.Table:
    """``rows`` (of :data:`STATE_CHANGES_SCHEMA` or :data:`CONNECTIONS_SCHEMA`) with
    ``history`` set from ``notes`` (run_ns -> note; runs without one: null)."""
    if not notes or not rows.num_rows:
        return rows
    runs = pa.array(sorted(notes), _I64)
    at = pc.index_in(rows.column("run_ns"), value_set=runs)
    column = pa.array([notes[r] for r in sorted(notes)], _STR).take(at)
    return rows.set_column(rows.schema.get_field_index("history"), "history", column)


def _closed_to_none(owners: np.ndarray, cands: pa.Table, at: np.ndarray, is_close: np.ndarray) -> np.ndarray:
    """``owners`` (the owner of the state of each candidate row ``at``, -1: none), with
    -1 where that owner closed before the row (PROTOCOL.md 10.6: its close removed the
    state). The ADD and REMOVE points say who owned a state, but a close removes every
    state its connection owned, which only the fold knows: without this, evidence after
    an owner's close (an accepted NOTIFY of a new owner whose ADD's answer was damaged)
    was taken for the closed owner's, and the answer depended on where a run began."""
    closes = np.flatnonzero(is_close)
    if not len(closes) or not len(at):
        return owners
    runs, conns, seqs = (_ints(cands.column(c)) for c in ("run_ns", "conn_id", "seq"))
    # (run, connection) as one integer: the run's index among the runs here, then the id.
    _, run_index = np.unique(np.concatenate([runs[closes], runs[at]]), return_inverse=True)
    close_keys = run_index[: len(closes)] << 32 | conns[closes]
    owner_keys = run_index[len(closes) :] << 32 | np.maximum(owners, 0)
    order = np.argsort(close_keys, kind="stable")
    sorted_keys, close_seqs = close_keys[order], seqs[closes][order]
    pos = np.minimum(np.searchsorted(sorted_keys, owner_keys), len(closes) - 1)
    closed = (owners >= 0) & (sorted_keys[pos] == owner_keys) & (close_seqs[pos] < seqs[at])
    return np.where(closed, -1, owners)


def _owner_at(points: pa.Table, events: pa.Table) -> np.ndarray:
    """The owner of each event's state just before it (-1: none), from ownership change
    ``points`` (run, key, seq, owner): an as-of lookup by (run, key), in ``seq`` order."""
    n_p, n_e = points.num_rows, events.num_rows
    codes = _ints(pc.dictionary_encode(pa.concat_arrays([
        points.column("key").combine_chunks(), events.column("key").combine_chunks().cast(_STR)])).indices)
    run = np.concatenate([_ints(points.column("run_ns")), _ints(events.column("run_ns"))])
    seq = np.concatenate([_ints(points.column("seq")), _ints(events.column("seq"))])
    is_point = np.arange(n_p + n_e) < n_p
    order = np.lexsort((~is_point, seq, codes, run))  # a point before an event at the same seq
    run, codes, is_point = run[order], codes[order], is_point[order]
    idx = np.arange(n_p + n_e)
    start = np.ones(n_p + n_e, dtype=bool)
    start[1:] = (run[1:] != run[:-1]) | (codes[1:] != codes[:-1])
    group_start = np.maximum.accumulate(np.where(start, idx, 0))
    last_point = np.maximum.accumulate(np.where(is_point, idx, -1))
    owner_sorted = np.concatenate([_ints(points.column("owner")), np.full(n_e, -1, np.int64)])[order]
    found = last_point >= group_start
    at = np.where(found, owner_sorted[np.maximum(last_point, 0)], -1)
    out = np.empty(n_e, dtype=np.int64)
    out[order[~is_point] - n_p] = at[~is_point]
    return out


def _upsert(old: pa.Table, new: pa.Table, keys: list[str]) -> pa.Table:
    """``old`` with the rows of ``new`` replacing those with the same ``keys``."""
    if not old.num_rows:
        return new
    if not new.num_rows:
        return old
    marked = new.select(keys).append_column("_new", pa.array(np.ones(new.num_rows, dtype=bool)))
    kept = old.join(marked, keys, join_type="left outer")
    kept = kept.filter(pc.is_null(kept.column("_new"))).select(old.schema.names)
    return pa.concat_tables([kept.cast(old.schema), new.cast(old.schema)])


def _total(parts: list[pa.Table]) -> pa.Table:
    """Add up connection counters (:data:`CONN_SCHEMA`) per (run, connection)."""
    t = _concat(parts, CONN_SCHEMA)
    agg = _add_up(t)
    # Name: the last record carrying one; address: the first OPEN/SNAPSHOT; close: the first CLOSE.
    for seq, cols, last in (("name_seq", ["name"], True), ("address_seq", ["address"], False),
                            ("close_seq", ["close_status", "close_reason"], False)):
        sub = t.filter(pc.is_valid(t.column(seq))).select(["run_ns", "conn_id", *cols, seq])
        agg = agg.join(_one_per_conn(sub, seq, last=last), ["run_ns", "conn_id"], join_type="left outer")
    return agg.select(CONN_SCHEMA.names).cast(CONN_SCHEMA)


def _connections(total: pa.Table) -> pa.Table:
    """The ``connections`` rows: opened is the CONN_OPEN, else the first snapshot, else
    the first record seen (a log that begins after the connection opened)."""
    opened = pc.coalesce(total.column("open_ns"), total.column("snapshot_ns"), total.column("first_ns"))
    o_us, c_us = pc.divide(opened, 1000), pc.divide(total.column("close_ns"), 1000)
    return pa.table({
        "run_ns": total.column("run_ns"), "daemon": total.column("daemon"), "conn_id": total.column("conn_id"),
        "opened": o_us.cast(_TS), "closed": c_us.cast(_TS), "address": total.column("address"),
        "name": total.column("name"), "close_status": total.column("close_status"),
        "close_reason": total.column("close_reason"),
        "duration_s": pc.divide(pc.cast(pc.subtract(c_us, o_us), pa.float64()), 1e6),
        "frames_in": total.column("frames_in"), "frames_out": total.column("frames_out"),
        "bytes_in": total.column("bytes_in"), "bytes_out": total.column("bytes_out"),
        "history": pa.nulls(total.num_rows, _STR),
    }, schema=CONNECTIONS_SCHEMA)


# -- files ---------------------------------------------------------------------------


def write_file(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` atomically (a retried task rewrites the same file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


TEST_COLUMN_ENV = "JET_INGEST_TEST_COLUMN"
_TEST_TYPES = {"string": (pa.string(), "written by a newer jet"), "long": (pa.int64(), 1)}


def with_test_column(name: str, table: pa.Table) -> pa.Table:
    """Tests of schema evolution: ``table`` (rows of table ``name``) as a jet with
    another schema would write it, when ``$JET_INGEST_TEST_COLUMN`` says so:
    ``TABLE:COLUMN:TYPE`` (``string`` or ``long``) adds ``COLUMN``, filled, to every row
    (or, if the table has it, changes its type), ``TABLE:-COLUMN`` drops it. Otherwise
    ``table`` unchanged."""
    spec = os.environ.get(TEST_COLUMN_ENV, "")
    if not spec.startswith(f"{name}:"):
        return table
    column, type_name = [*spec.split(":"), ""][1:3]
    if column.startswith("-"):
        return table.drop_columns([column[1:]])
    arrow_type, fill = _TEST_TYPES[type_name]
    if column in table.column_names:
        return table.set_column(table.column_names.index(column), column,
                                pc.cast(table.column(column), arrow_type))
    return table.append_column(column, pa.array([fill] * table.num_rows, arrow_type))


NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # Spark's directory for a null partition value


def write_partitioned(table: pa.Table, ts_ns: pa.ChunkedArray | pa.Array, directory: Path, name: str,
                      written: Optional[dict[str, int]] = None) -> int:
    """Write ``table`` under ``directory/date=YYYY-MM-DD/name`` by the UTC date of
    ``ts_ns`` (null: Spark's null partition), as Spark's ``partitionBy("date")`` lays
    it out. Returns the number of files; ``written``, if given, receives each file's
    path relative to ``directory`` and its rows."""
    if not table.num_rows:
        return 0
    table = with_test_column(directory.name, table)
    valid = _mask(pc.is_valid(ts_ns))
    days = np.where(valid, _ints(ts_ns, 0) // _DAY_NS, np.iinfo(np.int64).min)
    files = 0
    for day in np.unique(days):
        sel = days == day
        part = table if sel.all() else table.filter(pa.array(sel))
        label = NULL_PARTITION if day == np.iinfo(np.int64).min else str(np.datetime64(int(day), "D"))
        write_file(part, directory / f"date={label}" / name)
        if written is not None:
            written[f"date={label}/{name}"] = part.num_rows
        files += 1
    return files
