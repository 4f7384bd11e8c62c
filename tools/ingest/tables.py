"""The derived warehouse tables, computed with Spark from the ``frames`` table.

Every function takes the frames DataFrame (and, optionally, the precomputed
:func:`request_pairs` of it with both sides, ``daemon_side=None``, which two of them need) (the ``jetlog`` schema plus ``run_ns``, the
daemon run a segment belongs to: connection ids and request ids are only unique within
a run, JETLOG.md 3) and returns a DataFrame. Order inside a run is ``seq`` (segment,
offset): records are appended in the order the daemon handled them (JETLOG.md 6).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

__all__ = ["connections", "request_pairs", "requests", "state_changes", "with_seq"]

_SEQ_SHIFT = 1 << 40  # offsets stay far below 1 TiB per segment


def with_seq(frames: DataFrame) -> DataFrame:
    """Add ``seq``: a total order of a run's records (segment first, then offset)."""
    return frames.withColumn("seq", F.col("segment") * F.lit(_SEQ_SHIFT) + F.col("offset"))


def _date(col: str) -> Any:
    # A date, not a formatted string: the same partition directories (date=YYYY-MM-DD),
    # which Spark reads back as dates either way, at a fraction of the cost per row.
    return F.to_date(F.col(col))


def request_pairs(frames: DataFrame, *, daemon_side: bool | None = False) -> DataFrame:
    """Each REQUEST with the RESPONSE that answered it on the same connection.

    Peer side (default): requests the daemon received (FRAME_IN) and its responses
    (FRAME_OUT). Daemon side: requests the daemon routed to owners (FRAME_OUT) and the
    owners' answers (FRAME_IN). ``daemon_side=None``: both, from one sort, told apart
    by a boolean ``daemon_side`` column. PROTOCOL.md 4.1: the ids of a connection's
    pending requests are distinct, so the next row with the same (connection, id) after
    a request is its response.
    """
    is_in = F.col("kind") == "FRAME_IN"
    is_out = F.col("kind") == "FRAME_OUT"
    is_req, is_resp = F.col("msg_type") == "REQUEST", F.col("msg_type") == "RESPONSE"
    peer = (is_in & is_req) | (is_out & is_resp)
    daemon = (is_out & is_req) | (is_in & is_resp)
    wanted = {False: peer, True: daemon, None: peer | daemon}[daemon_side]
    base = frames.filter(F.col("frame_error").isNull() & F.col("request_id").isNotNull())
    both = base.filter(wanted).select(
        "run_ns", "daemon", "conn_id", "request_id", "seq", "ts_ns", "ts", "peer_name", "msg_type", "function",
        "key", "value_type", "value", "value_text", "status", "text", daemon.alias("daemon_side"),
    )
    # One window partition per connection, ordered by (side, id, seq): the next row is
    # the same one a partition per (connection, side, id) would give when its side and
    # id are the same. (Millions of two-row window partitions cost several times more.)
    w = Window.partitionBy("run_ns", "conn_id").orderBy("daemon_side", "request_id", "seq")
    nxt = {c: F.lead(c).over(w) for c in (
        "daemon_side", "request_id", "msg_type", "seq", "ts_ns", "status", "text", "value_type", "value_text")}
    paired = both.select(
        "*", *[expr.alias(f"next_{c}") for c, expr in nxt.items()]
    ).filter(F.col("msg_type") == "REQUEST")
    answered = ((F.col("next_msg_type") == "RESPONSE") & (F.col("next_request_id") == F.col("request_id"))
                & (F.col("next_daemon_side") == F.col("daemon_side")))

    def resp(c: str) -> Any:
        return F.when(answered, F.col(f"next_{c}"))

    return paired.select(
        "run_ns", "daemon", "conn_id", "peer_name", "request_id", "function", "key", "value_type", "value",
        "value_text", F.col("seq").alias("req_seq"), F.col("ts_ns").alias("req_ns"), F.col("ts").alias("req_ts"),
        resp("seq").alias("resp_seq"), resp("ts_ns").alias("resp_ns"), resp("status").alias("status"),
        resp("text").alias("message"), resp("value_type").alias("resp_value_type"),
        resp("value_text").alias("resp_value_text"), "daemon_side",
    )


def requests(frames: DataFrame, pairs: DataFrame | None = None) -> DataFrame:
    """Every SET_STATE and CALL_METHOD request (the REQUEST form; PROTOCOL.md 6.3, 6.5).

    Routed ones (JETLOG.md 4 ROUTE) carry the owner, the owner's id, the owner's own
    status and latency. ``latency_ns`` is the requester's request FRAME_IN to the
    response FRAME_OUT to the requester.
    """
    pairs = pairs if pairs is not None else request_pairs(frames, daemon_side=None)
    peer = pairs.filter(~F.col("daemon_side") & F.col("function").isin("SET_STATE", "CALL_METHOD")).drop(
        "daemon_side")
    owner = pairs.filter(F.col("daemon_side")).select(
        F.col("run_ns").alias("o_run"), F.col("conn_id").alias("o_conn"), F.col("request_id").alias("o_id"),
        F.col("peer_name").alias("owner_name"), F.col("req_seq").alias("o_seq"), F.col("req_ns").alias("o_req_ns"),
        F.col("resp_ns").alias("o_resp_ns"), F.col("status").alias("owner_status"),
    )
    routes = frames.filter(F.col("kind") == "ROUTE").select(
        F.col("run_ns").alias("rt_run"), F.col("route_requester_conn").alias("r_conn"), F.col("route_requester_id").alias("r_id"),
        F.col("route_owner_conn").alias("owner_conn"), F.col("route_owner_id").alias("owner_request_id"),
        F.col("seq").alias("route_seq"),
    )
    # JETLOG.md 4: ROUTE follows the requester's FRAME_IN and precedes its response.
    cond = (
        (peer.run_ns == routes.rt_run) & (peer.conn_id == routes.r_conn) & (peer.request_id == routes.r_id)
        & (routes.route_seq > peer.req_seq) & (peer.resp_seq.isNull() | (routes.route_seq < peer.resp_seq))
    )
    routed = peer.join(routes, cond, "left").drop("rt_run")
    # ... and precedes the FRAME_OUT of the routed request to the owner.
    ocond = (
        (routed.run_ns == owner.o_run) & (routed.owner_conn == owner.o_conn)
        & (routed.owner_request_id == owner.o_id) & (owner.o_seq > routed.route_seq)
    )
    joined = routed.join(owner, ocond, "left").drop("o_run")
    first = Window.partitionBy("run_ns", "conn_id", "req_seq").orderBy(F.col("o_seq").asc_nulls_last())
    joined = joined.withColumn("_n", F.row_number().over(first)).filter(F.col("_n") == 1)
    latency = F.col("resp_ns") - F.col("req_ns")
    return joined.select(
        "run_ns", "daemon", F.col("req_ts").alias("ts"), F.col("req_ns").alias("ts_ns"),
        F.col("conn_id").alias("requester_conn"), F.col("peer_name").alias("requester_name"), "request_id",
        "function", "key", F.substring_index("key", "/", 1).alias("key_prefix"), "value_type",
        F.col("value_text").alias("argument_text"), F.col("route_seq").isNotNull().alias("routed"),
        "owner_conn", "owner_name", "owner_request_id", F.coalesce("status", F.lit("UNANSWERED")).alias("status"),
        "message", "owner_status", F.col("resp_value_type").alias("result_type"),
        F.col("resp_value_text").alias("result_text"), latency.alias("latency_ns"),
        (latency / F.lit(1e6)).alias("latency_ms"), (F.col("o_resp_ns") - F.col("o_req_ns")).alias("owner_latency_ns"),
        _date("req_ts").alias("date"),
    )


def state_changes(frames: DataFrame, pairs: DataFrame | None = None) -> DataFrame:
    """The timeline of every state: one row per change, with the value before and after.

    Changes (PROTOCOL.md 10.4): ADD_STATE, NOTIFY_STATE (request answered OK, or an
    EVENT from the owner, PROTOCOL.md 7.1), REMOVE_STATE answered OK, and DISCONNECT:
    the owner's connection closed while it owned the state (PROTOCOL.md 10.6).
    """
    pairs = (pairs if pairs is not None else request_pairs(frames)).filter(
        ~F.col("daemon_side") & F.col("function").isin("ADD_STATE", "NOTIFY_STATE", "REMOVE_STATE")
        & (F.col("status") == "OK")
    ).select("run_ns", "daemon", "key", "conn_id", "peer_name", "function", "value_type", "value", "value_text",
             F.col("req_seq").alias("seq"), F.col("req_ns").alias("ts_ns"), F.col("req_ts").alias("ts"),
             F.lit(True).alias("answered"))
    events = frames.filter(
        (F.col("kind") == "FRAME_IN") & (F.col("msg_type") == "EVENT") & (F.col("function") == "NOTIFY_STATE")
        & F.col("frame_error").isNull()
    ).select("run_ns", "daemon", "key", "conn_id", "peer_name", "function", "value_type", "value", "value_text",
             "seq", "ts_ns", "ts", F.lit(False).alias("answered"))
    ops = pairs.unionByName(events)
    # One sort per (run, key) serves all three: a life starts at each ADD; its owner is
    # the ADD's connection; a REMOVE before this row and after that ADD ended the life.
    w = Window.partitionBy("run_ns", "key").orderBy("seq")
    is_add = F.col("function") == "ADD_STATE"
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    last_remove = F.max(F.when(F.col("function") == "REMOVE_STATE", F.col("seq"))).over(before)
    last_add = F.max(F.when(is_add, F.col("seq"))).over(w)
    ops = ops.select(
        "*",
        F.sum(is_add.cast("int")).over(w).alias("life"),
        F.last(F.when(is_add, F.col("conn_id")), ignorenulls=True).over(w).alias("owner"),
        F.when(last_remove > last_add, 1).otherwise(0).alias("removed_before"),
    )
    # PROTOCOL.md 7.1: a fire-and-forget NOTIFY from anyone but the owner is dropped.
    ops = ops.filter(
        F.col("answered") | ((F.col("life") > 0) & (F.col("conn_id") == F.col("owner")) & (F.col("removed_before") == 0))
    )
    lives = ops.groupBy("run_ns", "daemon", "key", "life").agg(
        F.first("owner").alias("owner"),
        F.first("peer_name").alias("owner_name"),
        F.min(F.when(F.col("function") == "ADD_STATE", F.col("seq"))).alias("add_seq"),
        F.min(F.when(F.col("function") == "REMOVE_STATE", F.col("seq"))).alias("remove_seq"),
    ).filter(F.col("add_seq").isNotNull())
    closes = frames.filter(F.col("kind") == "CONN_CLOSE").select(
        F.col("run_ns").alias("c_run"), F.col("conn_id").alias("c_conn"), F.col("seq").alias("c_seq"),
        F.col("ts_ns").alias("c_ns"), F.col("ts").alias("c_ts"),
    )
    gone = lives.join(
        closes,
        (lives.run_ns == closes.c_run) & (lives.owner == closes.c_conn) & (closes.c_seq > lives.add_seq)
        & (lives.remove_seq.isNull() | (lives.remove_seq > closes.c_seq)),
    ).select(
        "run_ns", "daemon", "key", F.col("owner").alias("conn_id"), F.col("owner_name").alias("peer_name"),
        F.lit("DISCONNECT").alias("function"), F.lit(None).cast("string").alias("value_type"),
        F.lit(None).cast("binary").alias("value"), F.lit(None).cast("string").alias("value_text"),
        F.col("c_seq").alias("seq"), F.col("c_ns").alias("ts_ns"), F.col("c_ts").alias("ts"),
    )
    cols = ["run_ns", "daemon", "key", "conn_id", "peer_name", "function", "value_type", "value", "value_text",
            "seq", "ts_ns", "ts"]
    removal = F.col("function").isin("REMOVE_STATE", "DISCONNECT")
    changes = ops.select(*cols).unionByName(gone.select(*cols))
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
        F.col("value").alias("bytes_after"), "seq", _date("ts").alias("date"),
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
        "frames_in", "frames_out", "bytes_in", "bytes_out", _date("opened_at").alias("date"),
    )
