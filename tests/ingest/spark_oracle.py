"""The test oracle for the derived tables: how jet-ingest computed them until the
incremental pipeline (tools/ingest/derive.py), with Spark SQL from all of ``frames``.

Kept because it says the same thing a second, independent way (window functions and
joins over whole histories, not a sequential merge of pieces); tests/ingest/test_spark.py
demands that both give the same rows. It took 24 s of a 2M-record ingest's 55 s.

Every function takes the frames DataFrame (the ``jetlog`` schema plus ``run_ns``, the
daemon run a segment belongs to: connection ids and request ids are only unique within
a run, JETLOG.md 3) and returns a DataFrame; ``requests`` and ``state_changes`` also
take the :func:`request_exchanges` of it, which both need, if already computed. Order
inside a run is ``seq`` (segment, offset): records are appended in the order the daemon
handled them (JETLOG.md 6).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import Window
from pyspark.sql import functions as F

__all__ = ["connections", "request_exchanges", "requests", "state_changes", "with_seq"]

_SEQ_SHIFT = 1 << 40  # offsets stay far below 1 TiB per segment


def with_seq(frames: DataFrame) -> DataFrame:
    """Add ``seq``: a total order of a run's records (segment first, then offset)."""
    return frames.withColumn("seq", F.col("segment") * F.lit(_SEQ_SHIFT) + F.col("offset"))


def _date(col: str) -> Any:
    # A date, not a formatted string: the same partition directories (date=YYYY-MM-DD),
    # which Spark reads back as dates either way, at a fraction of the cost per row.
    return F.to_date(F.col(col))


_STATE_OPS = ("ADD_STATE", "NOTIFY_STATE", "REMOVE_STATE")
_REQ, _ROUTE, _RESP = 0, 1, 2  # `tag` of a row in request_exchanges' sort


def request_exchanges(frames: DataFrame) -> DataFrame:
    """Every request a peer sent with what answered it, and the owner's side of every ROUTE.

    One window sort per (run, connection, side) over the REQUEST and RESPONSE frames and
    two copies of each ROUTE record (JETLOG.md 4): one under the requester's connection
    and id, one under the owner's. PROTOCOL.md 4.1: the ids of a connection's pending
    requests are distinct, so in (id, seq) order a request is followed by its ROUTE if
    it was routed (JETLOG.md 4: after the requester's FRAME_IN, before the response),
    then by its response; and a ROUTE's owner copy by the request the daemon sent the
    owner, then by the owner's answer. Returns rows of two ``role`` s:

    - "request": a REQUEST a peer sent the daemon (FRAME_IN), its ROUTE (``route_seq``,
      ``owner_conn``, ``owner_request_id``) and its response (``resp_seq``, ``resp_ns``,
      ``status``, ``message``, ``resp_value_type``, ``resp_value_text``);
    - "route": a ROUTE (``seq``) with the owner's side: ``owner_name``, ``o_seq``,
      ``o_req_ns``, ``o_resp_ns``, ``owner_status``.

    Only what the derived tables use goes through the sort: keys and values only on the
    requester's side, a value's bytes only for state operations.
    """
    is_in = F.col("kind") == "FRAME_IN"
    is_out = F.col("kind") == "FRAME_OUT"
    is_req, is_resp = F.col("msg_type") == "REQUEST", F.col("msg_type") == "RESPONSE"
    owner_side = (is_out & is_req) | (is_in & is_resp)
    peer_req = is_in & is_req
    peer_resp = is_out & is_resp
    is_route = (F.col("kind") == "ROUTE") & F.col("route_owner_id").isNotNull()
    no_long, no_str = F.lit(None).cast("long"), F.lit(None).cast("string")

    def view(conn: Any, side: Any, rid: Any, tag: Any, owner: tuple[Any, Any] = (no_long, no_long),
             **cols: Any) -> Any:
        fields = {c: cols.get(c, no_str) for c in ("function", "key", "value_type", "value_text", "status", "text")}
        return F.struct(conn.alias("conn_id"), side.alias("side"), rid.alias("request_id"), tag.alias("tag"),
                        *[v.alias(k) for k, v in fields.items()],
                        cols.get("value", F.lit(None).cast("binary")).alias("value"),
                        owner[0].alias("owner_conn"), owner[1].alias("owner_request_id"))

    message = view(
        F.col("conn_id"), owner_side, F.col("request_id"), F.when(is_req, F.lit(_REQ)).otherwise(F.lit(_RESP)),
        function=F.when(peer_req, F.col("function")), key=F.when(peer_req, F.col("key")),
        value=F.when(peer_req & F.col("function").isin(*_STATE_OPS), F.col("value")),
        value_type=F.when(~owner_side, F.col("value_type")), value_text=F.when(~owner_side, F.col("value_text")),
        status=F.col("status"), text=F.when(peer_resp, F.col("text")),
    )
    # A ROUTE twice: under the requester's connection and id, and under the owner's.
    owner = (F.col("route_owner_conn"), F.col("route_owner_id"))
    route_copies = F.array(
        view(F.col("route_requester_conn"), F.lit(False), F.col("route_requester_id"), F.lit(_ROUTE), owner),
        view(F.col("route_owner_conn"), F.lit(True), F.col("route_owner_id"), F.lit(_ROUTE), owner),
    )
    wanted = F.col("frame_error").isNull() & F.col("request_id").isNotNull() & (peer_req | peer_resp | owner_side)
    rows = frames.filter(wanted | is_route).select(
        "run_ns", "daemon", "seq", "ts_ns", "ts", F.when(~is_route, F.col("peer_name")).alias("peer_name"),
        F.inline(F.when(is_route, route_copies).otherwise(F.array(message))),
    )
    w = Window.partitionBy("run_ns", "conn_id", "side").orderBy("request_id", "seq")
    ahead = ("tag", "request_id", "seq", "ts_ns", "status", "text", "value_type", "value_text", "peer_name",
             "owner_conn", "owner_request_id")
    rows = rows.select("*", *[F.lead(c, n).over(w).alias(f"n{n}_{c}") for n in (1, 2) for c in ahead])

    def is_next(n: int, tag: int) -> Any:
        return (F.col(f"n{n}_request_id") == F.col("request_id")) & (F.col(f"n{n}_tag") == F.lit(tag))

    request_row = (F.col("tag") == _REQ) & ~F.col("side")
    route_row = (F.col("tag") == _ROUTE) & F.col("side")
    routed = request_row & is_next(1, _ROUTE)
    resp_at = F.when(request_row & is_next(1, _RESP), F.lit(1)).when(routed & is_next(2, _RESP), F.lit(2))
    sent = route_row & is_next(1, _REQ)  # the owner copy: the request sent to the owner ...
    owner_answered = sent & is_next(2, _RESP)  # ... and the owner's answer

    def resp(c: str) -> Any:
        return F.when(resp_at == 1, F.col(f"n1_{c}")).when(resp_at == 2, F.col(f"n2_{c}"))

    return rows.filter(request_row | route_row).select(
        "run_ns", "daemon", "conn_id", "peer_name", "request_id", "function", "key", "value_type", "value",
        "value_text", "seq", "ts_ns", "ts",
        F.when(routed, F.col("n1_seq")).alias("route_seq"),
        F.when(routed, F.col("n1_owner_conn")).alias("owner_conn"),
        F.when(routed, F.col("n1_owner_request_id")).alias("owner_request_id"),
        resp("seq").alias("resp_seq"), resp("ts_ns").alias("resp_ns"), resp("status").alias("status"),
        resp("text").alias("message"), resp("value_type").alias("resp_value_type"),
        resp("value_text").alias("resp_value_text"),
        F.when(sent, F.col("n1_peer_name")).alias("owner_name"), F.when(sent, F.col("n1_seq")).alias("o_seq"),
        F.when(sent, F.col("n1_ts_ns")).alias("o_req_ns"), F.when(owner_answered, F.col("n2_ts_ns")).alias("o_resp_ns"),
        F.when(owner_answered, F.col("n2_status")).alias("owner_status"),
        F.when(request_row, F.lit("request")).otherwise(F.lit("route")).alias("role"),
    )


def requests(frames: DataFrame, exchanges: DataFrame | None = None) -> DataFrame:
    """Every SET_STATE and CALL_METHOD request (the REQUEST form; PROTOCOL.md 6.3, 6.5).

    Routed ones (JETLOG.md 4 ROUTE) carry the owner, the owner's id, the owner's own
    status and latency. ``latency_ns`` is the requester's request FRAME_IN to the
    response FRAME_OUT to the requester. ``exchanges``: :func:`request_exchanges` of
    ``frames``, if already computed.
    """
    ex = exchanges if exchanges is not None else request_exchanges(frames)
    peer = ex.filter((F.col("role") == "request") & F.col("function").isin("SET_STATE", "CALL_METHOD")).drop(
        "owner_name", "o_seq", "o_req_ns", "o_resp_ns", "owner_status", "role")
    owner = ex.filter(F.col("role") == "route").select(
        F.col("run_ns").alias("o_run"), F.col("seq").alias("o_route_seq"), "owner_name", "o_req_ns", "o_resp_ns",
        "owner_status",
    )
    joined = peer.join(owner, (peer.run_ns == owner.o_run) & (peer.route_seq == owner.o_route_seq), "left")
    latency = F.col("resp_ns") - F.col("ts_ns")
    return joined.select(
        "run_ns", "daemon", "ts", "ts_ns",
        F.col("conn_id").alias("requester_conn"), F.col("peer_name").alias("requester_name"), "request_id",
        "function", "key", F.substring_index("key", "/", 1).alias("key_prefix"), "value_type",
        F.col("value_text").alias("argument_text"), F.col("route_seq").isNotNull().alias("routed"),
        "owner_conn", "owner_name", "owner_request_id", F.coalesce("status", F.lit("UNANSWERED")).alias("status"),
        "message", "owner_status", F.col("resp_value_type").alias("result_type"),
        F.col("resp_value_text").alias("result_text"), latency.alias("latency_ns"),
        (latency / F.lit(1e6)).alias("latency_ms"), (F.col("o_resp_ns") - F.col("o_req_ns")).alias("owner_latency_ns"),
        _date("ts").alias("date"),
    )


def state_changes(frames: DataFrame, exchanges: DataFrame | None = None) -> DataFrame:
    """The timeline of every state: one row per change, with the value before and after.

    Changes (PROTOCOL.md 10.4): ADD_STATE, NOTIFY_STATE (request answered OK, or an
    EVENT from the owner, PROTOCOL.md 7.1), REMOVE_STATE answered OK, and DISCONNECT:
    the owner's connection closed while it owned the state (PROTOCOL.md 10.6).
    ``exchanges``: :func:`request_exchanges` of ``frames``, if already computed.
    """
    cols = ["run_ns", "daemon", "key", "conn_id", "peer_name", "function", "value_type", "value", "value_text",
            "seq", "ts_ns", "ts"]
    ex = exchanges if exchanges is not None else request_exchanges(frames)
    ops = ex.filter(
        (F.col("role") == "request") & F.col("function").isin(*_STATE_OPS) & (F.col("status") == "OK")
    ).select(*cols)
    # A state's lives, from its few ADDs and REMOVEs: each ADD starts one, owned by the
    # ADD's connection, which lasts until the next ADD or REMOVE of the key.
    wl = Window.partitionBy("run_ns", "key").orderBy("seq")
    lives = ops.filter(F.col("function") != "NOTIFY_STATE").select(
        "run_ns", "daemon", "key", "function", F.col("conn_id").alias("owner"), F.col("peer_name").alias("owner_name"),
        F.col("seq").alias("add_seq"), F.lead("seq").over(wl).alias("end_seq"),
    ).filter(F.col("function") == "ADD_STATE").select(
        "run_ns", "daemon", "key", "owner", "owner_name", "add_seq", "end_seq",
    )
    # PROTOCOL.md 7.1: a fire-and-forget NOTIFY counts only from the owner, while it owns the state.
    events = frames.filter(
        (F.col("kind") == "FRAME_IN") & (F.col("msg_type") == "EVENT") & (F.col("function") == "NOTIFY_STATE")
        & F.col("frame_error").isNull()
    ).select(*cols)
    owned = events.join(
        lives.select(F.col("run_ns").alias("l_run"), F.col("key").alias("l_key"), "owner", "add_seq", "end_seq"),
        (events.run_ns == F.col("l_run")) & (events.key == F.col("l_key")) & (events.conn_id == F.col("owner"))
        & (events.seq > F.col("add_seq")) & (F.col("end_seq").isNull() | (events.seq < F.col("end_seq"))),
        "left_semi",
    )
    closes = frames.filter(F.col("kind") == "CONN_CLOSE").select(
        F.col("run_ns").alias("c_run"), F.col("conn_id").alias("c_conn"), F.col("seq").alias("c_seq"),
        F.col("ts_ns").alias("c_ns"), F.col("ts").alias("c_ts"),
    )
    gone = lives.join(
        closes,
        (lives.run_ns == closes.c_run) & (lives.owner == closes.c_conn) & (closes.c_seq > lives.add_seq)
        & (lives.end_seq.isNull() | (lives.end_seq > closes.c_seq)),
    ).select(
        "run_ns", "daemon", "key", F.col("owner").alias("conn_id"), F.col("owner_name").alias("peer_name"),
        F.lit("DISCONNECT").alias("function"), F.lit(None).cast("string").alias("value_type"),
        F.lit(None).cast("binary").alias("value"), F.lit(None).cast("string").alias("value_text"),
        F.col("c_seq").alias("seq"), F.col("c_ns").alias("ts_ns"), F.col("c_ts").alias("ts"),
    )
    removal = F.col("function").isin("REMOVE_STATE", "DISCONNECT")
    changes = ops.unionByName(owned.select(*cols)).unionByName(gone.select(*cols))
    changes = changes.select(
        *[c for c in cols if c not in ("value_type", "value", "value_text")],
        *[F.when(~removal, F.col(c)).alias(c) for c in ("value_type", "value", "value_text")],
    )
    wk = Window.partitionBy("run_ns", "key").orderBy("seq")
    return changes.select(
        "run_ns", "daemon", "ts", "ts_ns", "key",
        F.regexp_replace("function", "_STATE$", "").alias("change"),
        F.col("conn_id").alias("owner_conn"), F.col("peer_name").alias("owner_name"),
        F.lag("value_type").over(wk).alias("type_before"), F.lag("value_text").over(wk).alias("value_before"),
        F.lag("value").over(wk).alias("bytes_before"),
        F.col("value_type").alias("type_after"), F.col("value_text").alias("value_after"),
        F.col("value").alias("bytes_after"), "seq", F.lit(None).cast("string").alias("history"),
        _date("ts").alias("date"),
    )


def connections(frames: DataFrame) -> DataFrame:
    """One row per connection of a run: opened/closed, address, name, traffic each way."""
    # Strings are kept out of the aggregation over every record: with only fixed-width
    # buffers Spark aggregates by hashing; a string buffer makes it sort all records.
    c = frames.filter(F.col("conn_id") > 0)
    is_in = F.col("kind") == "FRAME_IN"
    is_out = F.col("kind") == "FRAME_OUT"
    keys = ["run_ns", "conn_id"]
    traffic = c.groupBy("run_ns", "daemon", "conn_id").agg(
        F.min(F.when(F.col("kind") == "CONN_OPEN", F.col("ts"))).alias("opened"),
        F.min(F.when(F.col("kind") == "CONN_SNAPSHOT", F.col("ts"))).alias("first_snapshot"),
        F.min("ts").alias("first_seen"),
        F.min(F.when(F.col("kind") == "CONN_CLOSE", F.col("ts"))).alias("closed"),
        F.sum(is_in.cast("long")).alias("frames_in"),
        F.sum(is_out.cast("long")).alias("frames_out"),
        F.sum(F.when(is_in, F.col("size")).otherwise(0)).alias("bytes_in"),
        F.sum(F.when(is_out, F.col("size")).otherwise(0)).alias("bytes_out"),
    )
    # The last name: per (connection, name) the last record carrying it (few groups).
    named = c.filter(F.col("peer_name").isNotNull()).groupBy("run_ns", "conn_id", "peer_name").agg(
        F.max("seq").alias("name_seq"))
    names = named.groupBy(*keys).agg(F.max_by("peer_name", "name_seq").alias("name"))
    # Address and close status from the few connection records.
    conn_recs = c.filter(F.col("kind").isin("CONN_OPEN", "CONN_SNAPSHOT", "CONN_CLOSE"))
    is_close = F.col("kind") == "CONN_CLOSE"
    texts = conn_recs.groupBy(*keys).agg(
        F.min_by("address", F.when(~is_close, F.col("seq"))).alias("address"),
        F.min_by("status", F.when(is_close, F.col("seq"))).alias("close_status"),
        F.min_by("text", F.when(is_close, F.col("seq"))).alias("close_reason"),
    )
    agg = traffic.join(names, keys, "left").join(texts, keys, "left")
    opened = F.coalesce("opened", "first_snapshot", "first_seen")
    return agg.withColumn("opened_at", opened).select(
        "run_ns", "daemon", "conn_id", F.col("opened_at").alias("opened"), "closed", "address", "name",
        "close_status", "close_reason",
        (F.col("closed").cast("double") - F.col("opened_at").cast("double")).alias("duration_s"),
        "frames_in", "frames_out", "bytes_in", "bytes_out", F.lit(None).cast("string").alias("history"),
        _date("opened_at").alias("date"),
    )
