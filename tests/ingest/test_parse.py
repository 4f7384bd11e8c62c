"""JVM-free tests of the vectorised event-log parser (tools/ingest/parse.py).

The oracle is jetwire: logs are written with ``jetwire.log``'s writer, and every row is
checked against ``jetwire.log.iter_log`` + ``jetwire.decode_frame`` reading the same
bytes.
"""

from __future__ import annotations

import io
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from jetwire import AddMethod
from jetwire import AddState
from jetwire import CallMethod
from jetwire import Close
from jetwire import FetchAdd
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Info
from jetwire import NotifyState
from jetwire import RemoveState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Unfetch
from jetwire import Value
from jetwire import ValueType
from jetwire import decode_frame
from jetwire import encode
from jetwire.log import Corruption
from jetwire.log import LogHeader
from jetwire.log import LogKind
from jetwire.log import LogRecord
from jetwire.log import Truncation
from jetwire.log import conn_close_data
from jetwire.log import conn_name_data
from jetwire.log import conn_open_data
from jetwire.log import conn_snapshot_data
from jetwire.log import encode_header
from jetwire.log import encode_record
from jetwire.log import iter_log
from jetwire.log import route_data
from tools.ingest.parse import ARROW_SCHEMA
from tools.ingest.parse import JetlogError
from tools.ingest.parse import SegmentHeader
from tools.ingest.parse import read_segment

T0 = 1_767_225_600_000_000_000

FRAMES = [
    (1, LogKind.FRAME_IN, encode(Info(name="owner"))),
    (1, LogKind.FRAME_IN, encode(AddState(1, "plant/temp", Value.of(21)))),
    (1, LogKind.FRAME_OUT, encode(Response(1))),
    (1, LogKind.FRAME_IN, encode(AddMethod(2, "plant/reset"))),
    (2, LogKind.FRAME_IN, encode(FetchStates(1, ""))),
    (2, LogKind.FRAME_OUT, encode(Response(1, fetch_id=7))),
    (2, LogKind.FRAME_OUT, encode(FetchAdd(7, "plant/temp", Value.of(21)))),
    (2, LogKind.FRAME_IN, encode(SetState(5, "plant/temp", Value.of(22.5)))),
    (0, LogKind.ROUTE, route_data(2, 5, 1, 9, 3, "plant/temp")),
    (1, LogKind.FRAME_OUT, encode(SetState(9, "plant/temp", Value.of(22.5)))),
    (1, LogKind.FRAME_IN, encode(NotifyState(None, "plant/temp", Value.of(True)))),
    (1, LogKind.FRAME_IN, encode(Response(9, Status.REJECTED, message="too hot"))),
    (2, LogKind.FRAME_OUT, encode(Response(5, Status.REJECTED, message="too hot"))),
    (2, LogKind.FRAME_IN, encode(CallMethod(6, "plant/reset", Value.of({"a": [1, 2]})))),
    (2, LogKind.FRAME_IN, encode(CallMethod(None, "plant/reset", Value(ValueType.CBOR, b"\xa0")))),
    (2, LogKind.FRAME_IN, encode(GetState(8, "plant/temp"))),
    (2, LogKind.FRAME_OUT, encode(Response(8, value=Value.of("naïve ✓")))),
    (2, LogKind.FRAME_IN, encode(Unfetch(10, 7))),
    (1, LogKind.FRAME_IN, encode(RemoveState(3, "plant/temp"))),
    (2, LogKind.FRAME_OUT, encode(FetchRemove(7, "plant/temp", Value.of(-(2**63))))),
    (2, LogKind.FRAME_OUT, encode(Close(Status.OVERLOADED, "slow"))),
    (2, LogKind.FRAME_OUT, encode(Response(11, value=Value.of(None)))),
]


def build_log(records: list[tuple[int, int, bytes]] | None = None, *, name: str = "jetd", segment: int = 0) -> bytes:
    """A segment with CONN_OPEN/NAME/SNAPSHOT/CLOSE around ``records`` (default FRAMES)."""
    recs: list[tuple[int, int, bytes]] = [
        (1, LogKind.CONN_OPEN, conn_open_data("127.0.0.1:40001")),
        (2, LogKind.CONN_SNAPSHOT, conn_snapshot_data("127.0.0.1:40002", "client")),
        *(records if records is not None else FRAMES),
        (2, LogKind.CONN_NAME, conn_name_data("client-2")),
        (2, LogKind.FRAME_IN, encode(GetState(12, "x"))),
        (1, LogKind.CONN_CLOSE, conn_close_data(Status.OK, "bye")),
    ]
    out = [encode_header(LogHeader(name, T0, segment))]
    out += [encode_record(T0 + i * 1000, conn, kind, data) for i, (conn, kind, data) in enumerate(recs)]
    return b"".join(out)


def read(path: Path, **kw: Any) -> list[dict[str, Any]]:
    kw.setdefault("truncated_row", True)  # as the jetlog source reads
    batches = list(read_segment(str(path), **kw))
    for batch in batches:
        assert batch.schema.equals(ARROW_SCHEMA)
    return pa.Table.from_batches(batches, ARROW_SCHEMA).to_pylist()


def oracle(data: bytes) -> list[Any]:
    return list(iter_log(io.BytesIO(data)))


def expected_row(rec: LogRecord) -> dict[str, Any]:
    """What the parser must say about a record, derived from jetwire's decoder."""
    want: dict[str, Any] = {"offset": rec.offset, "ts_ns": rec.ts_ns, "conn_id": rec.conn_id,
                            "kind": LogKind(rec.kind).name, "size": len(rec.data)}
    if rec.kind in (LogKind.FRAME_IN, LogKind.FRAME_OUT):
        msg = decode_frame(rec.data)
        want["direction"] = "in" if rec.kind == LogKind.FRAME_IN else "out"
        want["key"] = getattr(msg, "key", getattr(msg, "prefix", None))
        want["request_id"] = getattr(msg, "id", None)
        value = getattr(msg, "value", None)
        want["value"] = value.data if value is not None else None
        want["value_type"] = ValueType(value.vtype).name if value is not None else None
        want["fetch_id"] = getattr(msg, "fetch_id", None)
        if isinstance(msg, Response):
            want["status"] = msg.status.name
            want["text"] = msg.message if msg.status != Status.OK else None
        if isinstance(msg, Close):
            want["status"] = msg.status.name
            want["text"] = msg.message
        if isinstance(msg, Info):
            want["text"] = msg.name
        want["frame_error"] = None
    return want


def test_round_trip_matches_jetwire(tmp_path: Path) -> None:
    data = build_log()
    path = tmp_path / "a.jetlog"
    path.write_bytes(data)
    rows = read(path)
    records = [item for item in oracle(data) if isinstance(item, LogRecord)]
    assert len(rows) == len(records) == len(FRAMES) + 5
    for row, rec in zip(rows, records, strict=True):
        for col, value in expected_row(rec).items():
            assert row[col] == value, (col, row, rec)
        assert row["file"] == str(path) and row["daemon"] == "jetd" and row["segment"] == 0
        assert row["corrupt"] is None
        assert row["ts"].timestamp() == pytest.approx(rec.ts_ns / 1e9)


def test_decoded_fields(tmp_path: Path) -> None:
    path = tmp_path / "a.jetlog"
    path.write_bytes(build_log())
    rows = read(path)
    by_text = {(r["kind"], r["msg_type"], r["function"], r["value_text"]) for r in rows}
    assert ("FRAME_IN", "REQUEST", "ADD_STATE", "21") in by_text
    assert ("FRAME_IN", "REQUEST", "SET_STATE", "22.5") in by_text
    assert ("FRAME_IN", "EVENT", "NOTIFY_STATE", "true") in by_text
    assert ("FRAME_IN", "REQUEST", "CALL_METHOD", '{"a":[1,2]}') in by_text
    assert ("FRAME_IN", "EVENT", "CALL_METHOD", None) in by_text  # CBOR has no text form
    assert ("FRAME_OUT", "RESPONSE", None, "naïve ✓") in by_text
    assert ("FRAME_OUT", "EVENT", "FETCH_REMOVE", str(-(2**63))) in by_text
    route = next(r for r in rows if r["kind"] == "ROUTE")
    assert (route["route_requester_conn"], route["route_requester_id"], route["route_owner_conn"],
            route["route_owner_id"], route["function"], route["key"]) == (2, 5, 1, 9, "SET_STATE", "plant/temp")
    close = next(r for r in rows if r["kind"] == "CONN_CLOSE")
    assert (close["status"], close["text"]) == ("OK", "bye")
    assert next(r for r in rows if r["kind"] == "CONN_OPEN")["address"] == "127.0.0.1:40001"
    # Peer names follow INFO, CONN_SNAPSHOT and CONN_NAME within the segment.
    assert rows[0]["peer_name"] is None  # conn 1 opened, not yet named
    assert {r["peer_name"] for r in rows if r["conn_id"] == 1 and r["offset"] > rows[2]["offset"]} == {"owner"}
    conn2 = [r["peer_name"] for r in rows if r["conn_id"] == 2]
    assert conn2[0] == "client" and conn2[-1] == "client-2"


def test_crc_damage_is_reported_and_resynced(tmp_path: Path) -> None:
    data = bytearray(build_log())
    records = [item for item in oracle(bytes(data)) if isinstance(item, LogRecord)]
    victim = records[5]
    data[victim.offset + 10 + 3] ^= 0xFF  # a ts_ns byte: only the CRC can tell
    path = tmp_path / "a.jetlog"
    path.write_bytes(bytes(data))
    rows = read(path)
    bad = [r for r in rows if r["corrupt"]]
    assert len(bad) == 1
    assert bad[0]["offset"] == victim.offset
    assert bad[0]["corrupt"].startswith("record CRC mismatch")
    assert bad[0]["size"] == records[6].offset - victim.offset
    assert [r["offset"] for r in rows if not r["corrupt"]] == [r.offset for r in records if r is not victim]
    assert [r["offset"] for r in read(path, mode="DROPMALFORMED")] == [r.offset for r in records if r is not victim]
    with pytest.raises(JetlogError, match="CRC mismatch at offset"):
        read(path, mode="FAILFAST")


def test_mid_file_garbage_matches_jetwire_reader(tmp_path: Path) -> None:
    clean = build_log()
    records = [item for item in oracle(clean) if isinstance(item, LogRecord)]
    cut = records[10].offset
    data = clean[:cut] + b"\x00JR garbage \xff" * 7 + clean[cut:]
    path = tmp_path / "a.jetlog"
    path.write_bytes(data)
    rows = read(path)
    damage = [r for r in rows if r["corrupt"]]
    corruption = [item for item in oracle(data) if isinstance(item, Corruption)]
    assert [(d["offset"], d["size"]) for d in damage] == [(c.offset, c.length) for c in corruption]
    assert len([r for r in rows if not r["corrupt"]]) == len(records)


def test_lying_length_is_damage_without_allocation(tmp_path: Path) -> None:
    clean = build_log()
    records = [item for item in oracle(clean) if isinstance(item, LogRecord)]
    data = bytearray(clean)
    data[records[3].offset + 2 : records[3].offset + 6] = b"\xff\xff\xff\xf0"
    path = tmp_path / "a.jetlog"
    path.write_bytes(bytes(data))
    rows = read(path)
    damage = [r for r in rows if r["corrupt"]]
    assert len(damage) == 1 and damage[0]["corrupt"].startswith("implausible record length 4294967280")
    assert len(rows) == len(records)  # one record lost, replaced by one damage row


def test_truncation_at_every_offset(tmp_path: Path) -> None:
    data = build_log(FRAMES[6:14])  # every record kind, a few of each, ~700 bytes
    records = [item for item in oracle(data) if isinstance(item, LogRecord)]
    header_size = records[0].offset
    path = tmp_path / "a.jetlog"
    for cut in range(len(data) + 1):
        path.write_bytes(data[:cut])
        stats: dict[str, object] = {}
        rows = read(path, stats=stats)
        whole = [r for r in records if r.offset + 10 + 13 + len(r.data) <= cut]
        assert [r["offset"] for r in rows if r["kind"] != "TRUNCATED"] == [r.offset for r in whole], cut
        assert all(r["corrupt"] is None for r in rows if r["kind"] != "TRUNCATED"), cut
        tail_rows = [(r["offset"], r["size"]) for r in rows if r["kind"] == "TRUNCATED"]
        if cut >= header_size:
            done = whole[-1].offset + 23 + len(whole[-1].data) if whole else header_size
            assert stats["end"] == done, cut
            tail = [item for item in oracle(data[:cut]) if isinstance(item, Truncation)]
            if tail:
                assert stats["truncated"] == (tail[0].offset, tail[0].present, tail[0].needed), cut
                assert tail_rows == [(tail[0].offset, tail[0].present)], cut
                # JETLOG.md 5: a reader MUST report it; FAILFAST fails on it.
                with pytest.raises(JetlogError, match="truncated record"):
                    read(path, mode="FAILFAST")
            else:
                assert stats["truncated"] is None and tail_rows == [], cut
                read(path, mode="FAILFAST")


def test_bad_utf8(tmp_path: Path) -> None:
    bad_key_frame = bytearray(encode(GetState(4, "abc")))
    bad_key_frame[-2] = 0xFF  # key "a\xffc"
    bad_string = bytearray(encode(SetState(5, "k", Value.of("xyz"))))
    bad_string[-1] = 0xC3  # truncated 2-byte sequence
    bad_json = bytearray(encode(SetState(6, "k", Value(ValueType.JSON, b'"ok"'))))
    bad_json[-2] = 0xFE  # JSON is carried opaquely: no error, just no text
    recs = [
        (3, LogKind.FRAME_IN, bytes(bad_key_frame)),
        (3, LogKind.FRAME_IN, bytes(bad_string)),
        (3, LogKind.FRAME_IN, bytes(bad_json)),
        (3, LogKind.CONN_NAME, b"\x00\x02\xc3\x28"),
    ]
    path = tmp_path / "a.jetlog"
    path.write_bytes(build_log(recs))
    rows = {r["request_id"] if r["kind"] != "CONN_NAME" else "name": r for r in read(path) if r["conn_id"] == 3}
    assert rows[4]["frame_error"] == "text is not valid UTF-8" and rows[4]["key"] is None
    assert rows[5]["frame_error"] == "text is not valid UTF-8" and rows[5]["value_text"] is None
    assert rows[5]["value"] == bytes(bad_string[-3:])
    assert rows[6]["frame_error"] is None and rows[6]["value_text"] is None
    assert rows["name"]["corrupt"] == "bad record data: text is not valid UTF-8"
    assert all(r["corrupt"] is None for r in read(path, mode="DROPMALFORMED"))
    with pytest.raises(JetlogError, match="not valid UTF-8"):
        read(path, mode="FAILFAST")


def test_malformed_frames_stay_rows(tmp_path: Path) -> None:
    cases = {
        b"\x09\x00\x00\x00\x00": "unknown frame type",
        b"\x01\x00\x00\x00\x05\x00\x00\x00\x01\x42": "unknown function",
        b"\x01\x00\x00": "frame shorter than its 5-byte header",
        b"\x01\x00\x00\x00\x09\x00\x00\x00\x01\x0a\x00\x05ab": "str16 or value length runs past the frame, or trailing bytes",
        b"\x01\x00\x00\x00\x07\x00\x00\x00\x01\x0a\x00\x00": "empty key",
        b"\x02\x00\x00\x00\x07\x00\x00\x00\x01\x00\x00\x00": "invalid OK payload length",
        b"\x03\x00\x00\x00\x0c\x04\x00\x01k\x06\x00\x00\x00\x09\x00\x00\x00": "str16 or value length runs past the frame, or trailing bytes",
        b"\x03\x00\x00\x00\x09\x04\x00\x01k\x09\x00\x00\x00\x00": "reserved value type",
        b"\x03\x00\x00\x00\x0a\x04\x00\x01k\x01\x00\x00\x00\x01\x02": "value has the wrong width or byte for its type",
        b"\x03\x00\x00\x00\x01\x77": "unknown event code",
        b"\x02\x00\x00\x00\x0b\x00\x00\x00\x01\x00\x00\x00\x00\x00\x07": "frame length field disagrees with the record",
    }
    path = tmp_path / "a.jetlog"
    path.write_bytes(build_log([(4, LogKind.FRAME_IN, frame) for frame in cases]))
    rows = [r for r in read(path, mode="FAILFAST") if r["conn_id"] == 4]
    assert [r["frame_error"] for r in rows] == list(cases.values())


def test_protocol_1_1_requests_are_known_functions(tmp_path: Path) -> None:
    # Issue 15: a 1.1 log (queries, authentication) must not turn its requests into
    # "unknown function" rows; they carry their function's name.
    from jetwire import Authenticate
    from jetwire import FetchQuery
    from jetwire import Query
    from jetwire import QueryOnce

    frames = [encode(FetchQuery(1, Query())), encode(QueryOnce(2, Query())), encode(Authenticate(3, "u", "********"))]
    path = tmp_path / "a.jetlog"
    path.write_bytes(build_log([(4, LogKind.FRAME_IN, frame) for frame in frames]))
    rows = [r for r in read(path, mode="FAILFAST") if r["conn_id"] == 4]
    assert [(r["function"], r["frame_error"]) for r in rows] == [
        ("FETCH_QUERY", None), ("QUERY_ONCE", None), ("AUTHENTICATE", None)]


def test_protocol_1_1_payloads_fill_the_columns(tmp_path: Path) -> None:
    """Issue 15: the 1.1 events and AUTHENTICATE go into the columns as 1.0 frames do:
    FETCH_UNMATCH as FETCH_CHANGE; FETCH_METHOD and FETCH_NODE with fetch_id, key and
    the action in ``text``; QUERY_ENTRY with its request id, key, value and the entry
    kind in ``text``; FETCH_WINDOW with its fetch_id; AUTHENTICATE with the user in
    ``text`` and never the password."""
    from jetwire import Action
    from jetwire import Authenticate
    from jetwire import EntryKind
    from jetwire import FetchMethod
    from jetwire import FetchNode
    from jetwire import FetchUnmatch
    from jetwire import FetchWindow
    from jetwire import QueryEntry
    from jetwire import WindowEntry

    frames = [
        (LogKind.FRAME_OUT, encode(FetchUnmatch(5, "plant/t", Value.of(3)))),
        (LogKind.FRAME_OUT, encode(FetchMethod(5, Action.ADD, "plant/reset"))),
        (LogKind.FRAME_OUT, encode(FetchNode(5, Action.REMOVE, "plant"))),
        (LogKind.FRAME_OUT, encode(QueryEntry(9, EntryKind.STATE, "plant/t", Value.of(2.5)))),
        (LogKind.FRAME_OUT, encode(FetchWindow(6, 2, (WindowEntry(1, "a", Value.of(1)), WindowEntry(2, "b", Value.of(2)))))),
        (LogKind.FRAME_IN, encode(Authenticate(3, "operator", "s3cret-pw"))),
    ]
    path = tmp_path / "a.jetlog"
    path.write_bytes(build_log([(4, kind, frame) for kind, frame in frames]))
    rows = [r for r in read(path, mode="FAILFAST") if r["conn_id"] == 4]
    got = [(r["function"], r["fetch_id"], r["request_id"], r["key"], r["value_text"], r["text"], r["frame_error"])
           for r in rows]
    assert got == [
        ("FETCH_UNMATCH", 5, None, "plant/t", "3", None, None),
        ("FETCH_METHOD", 5, None, "plant/reset", None, "ADD", None),
        ("FETCH_NODE", 5, None, "plant", None, "REMOVE", None),
        ("QUERY_ENTRY", None, 9, "plant/t", "2.5", "STATE", None),
        ("FETCH_WINDOW", 6, None, None, None, None, None),
        ("AUTHENTICATE", None, 3, None, None, "operator", None),
    ]
    assert all(b"s3cret" not in repr(r).encode() for r in rows)
    # A broken layout is still a frame error, not a row with half its columns.
    bad = encode(FetchMethod(5, Action.ADD, "plant/reset"))[:-1]
    bad = bad[:1] + (len(bad) - 5).to_bytes(4, "big") + bad[5:]
    path.write_bytes(build_log([(4, LogKind.FRAME_OUT, bad)]))
    [row] = [r for r in read(path) if r["conn_id"] == 4]
    assert row["frame_error"] is not None and row["function"] == "FETCH_METHOD"


def test_unknown_kinds_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "a.jetlog"
    path.write_bytes(build_log([(1, 0x42, b"future"), (1, LogKind.FRAME_IN, encode(GetState(1, "k")))]))
    rows = read(path)
    assert "0x42" not in {r["kind"] for r in rows}
    assert any(r["key"] == "k" for r in rows)


@pytest.mark.parametrize("damage", ["magic", "version", "crc", "short"])
def test_bad_header(tmp_path: Path, damage: str) -> None:
    data = bytearray(build_log())
    if damage == "magic":
        data[1] = ord("X")
    elif damage == "version":
        data[9] = 3
        data[38:42] = zlib.crc32(bytes(data[:38])).to_bytes(4, "big")
    elif damage == "crc":
        data[20] ^= 1
    path = tmp_path / "a.jetlog"
    path.write_bytes(bytes(data[:20]) if damage == "short" else bytes(data))
    if damage == "short":  # a file still being created: nothing yet, never an error
        assert read(path) == [] and read(path, mode="FAILFAST") == []
        return
    rows = read(path)
    assert len(rows) == 1 and rows[0]["corrupt"].startswith("bad segment header")
    assert read(path, mode="DROPMALFORMED") == []
    with pytest.raises(JetlogError):
        read(path, mode="FAILFAST")


def test_chunks_at_every_split_yield_each_record_once(tmp_path: Path) -> None:
    data = build_log()
    path = tmp_path / "a.jetlog"
    path.write_bytes(data)
    whole = read(path)
    for split in range(0, len(data) + 1, 7):
        rows = read(path, start=0, stop=split) + read(path, start=split)
        assert rows == whole, split


def test_a_record_across_its_chunks_end_is_read_whole_by_that_chunk(tmp_path: Path) -> None:
    # A chunk of a mapped segment is walked over a copy of its bytes that reaches
    # max_record past the chunk's end, not the whole file: a record the chain reaches
    # before the cut but that ends after it must still be whole in that copy. That
    # happens when the cut is a false sync point inside a record's body: here a record
    # of an unknown kind (skipped by the reader, JETLOG.md 4) whose data is two valid
    # records.
    inner = encode_record(T0, 9, LogKind.FRAME_IN, encode(GetState(1, "a"))) * 2
    outer = encode_record(T0, 9, 200, inner)
    data = build_log() + outer + encode_record(T0, 9, LogKind.FRAME_IN, encode(GetState(2, "b")))
    path = tmp_path / "a.jetlog"
    path.write_bytes(data)
    at = len(data) - len(outer) - len(encode_record(T0, 9, LogKind.FRAME_IN, encode(GetState(2, "b"))))
    whole = read(path, max_record=len(outer))
    assert not any(r["corrupt"] for r in whole) and at not in [r["offset"] for r in whole]
    before = read(path, start=0, stop=at + 1, max_record=len(outer))  # ends at the false sync point
    assert before == [r for r in whole if r["offset"] < at]


def test_small_batches_and_many_records(tmp_path: Path) -> None:
    from tools.ingest.synth import write_synthetic_log

    path = tmp_path / "a.jetlog"
    count = write_synthetic_log(str(path), 2000)
    rows = read(path, batch_rows_max=333)
    assert len(rows) == count
    assert [r["offset"] for r in rows] == sorted(r["offset"] for r in rows)
    assert {r["peer_name"] for r in rows if r["conn_id"] in (1, 2, 3) and r["kind"] == "FRAME_OUT"} == {
        "owner", "client", "fetcher"}
    sets = [r for r in rows if r["function"] == "SET_STATE" and r["direction"] == "in"]
    assert len(sets) == 2000 - 200
    assert all(r["frame_error"] is None and r["corrupt"] is None for r in rows)


@pytest.mark.parametrize("high", [65535, 65536 + 3, 2**32 - 1])
def test_peer_names_follow_connections_of_any_id(tmp_path: Path, high: int) -> None:
    # Ids below 65536 take a faster sort than the rest; both must track names alike
    # (65536 + 3 is 3 in 16 bits).
    records = [
        (high, LogKind.FRAME_IN, encode(GetState(1, "a"))),
        (3, LogKind.CONN_NAME, conn_name_data("three")),
        (high, LogKind.CONN_NAME, conn_name_data("high")),
        (3, LogKind.FRAME_IN, encode(GetState(2, "b"))),
        (high, LogKind.FRAME_IN, encode(GetState(3, "c"))),
        (high, LogKind.CONN_NAME, conn_name_data("high-2")),
        (3, LogKind.FRAME_IN, encode(GetState(4, "d"))),
        (high, LogKind.FRAME_IN, encode(GetState(5, "e"))),
    ]
    path = tmp_path / "a.jetlog"
    path.write_bytes(build_log(records))
    # One batch, and a batch per row (names then come from the rows before the batch).
    for rows in (1 << 15, 1):
        got = [(r["conn_id"], r["key"], r["peer_name"]) for r in read(path, batch_rows_max=rows)
               if r["function"] == "GET_STATE"]
        assert got[:5] == [(high, "a", None), (3, "b", "three"), (high, "c", "high"), (3, "d", "three"),
                           (high, "e", "high-2")], rows


def test_pieces_out_of_file_order_are_refused() -> None:
    # A column's pieces are cut from the file in order; out of order, they are refused
    # rather than read from the wrong bytes.
    import numpy as np

    from tools.ingest.parse import _var_array

    a = np.frombuffer(b"abcdefgh", dtype=np.uint8)
    valid = np.array([True, True])
    assert _var_array(a, np.array([0, 4]), np.array([2, 3]), valid, pa.string()).to_pylist() == ["ab", "efg"]
    assert _var_array(a, np.array([0, 4]), np.array([2, 3]), np.array([False, True]),
                      pa.string()).to_pylist() == [None, "efg"]
    with pytest.raises(ValueError, match="increasing order"):
        _var_array(a, np.array([4, 0]), np.array([2, 3]), valid, pa.string())
    with pytest.raises(ValueError, match="increasing order"):
        _var_array(a, np.array([0, 1]), np.array([3, 3]), valid, pa.string())


def test_bad_mode(tmp_path: Path) -> None:
    path = tmp_path / "a.jetlog"
    path.write_bytes(build_log())
    with pytest.raises(ValueError, match="mode"):
        read(path, mode="LENIENT")


def test_resume_offset_is_where_a_chunked_read_ends(tmp_path: Path) -> None:
    """jet-ingest records a file's resume offset without re-reading what it wrote: it
    must equal the end of the last row a chunked read of the same bytes yields."""
    import random

    from tools.ingest.parse import read_header
    from tools.ingest.parse import resume_offset
    from tools.ingest.source import plan_ranges
    from tools.ingest.synth import write_synthetic_log

    whole = tmp_path / "whole.jetlog"
    write_synthetic_log(str(whole), 60)
    data = whole.read_bytes()
    header = read_header(data)
    assert header is not None
    path = tmp_path / "a.jetlog"
    rng = random.Random(6)

    def last_row_end(limit: int, chunk: int) -> int:
        ends = [header.size]
        for part in plan_ranges([(str(path), 0, limit)], chunk, 0):
            for _, start, stop, lim in part:
                for b in read_segment(str(path), start, stop, limit=lim):
                    for off, kind, size in zip(*(b.column(c).to_pylist() for c in ("offset", "kind", "size")),
                                               strict=True):
                        # JETLOG.md 3; damage ends after what it skipped; a truncated
                        # record is read again once complete.
                        ends.append({"CORRUPT": off + size, "TRUNCATED": off}.get(kind, off + 23 + size))
        return max(ends)

    for trial in range(60):
        damaged = bytearray(data[: rng.randrange(header.size, len(data) + 1)])
        if trial % 2 and len(damaged) > header.size + 50:  # damage, or a length that runs past the end
            for _ in range(rng.randrange(1, 4)):
                damaged[rng.randrange(header.size, len(damaged))] ^= rng.randrange(1, 256)
        path.write_bytes(damaged)
        for chunk in (997, 1 << 25):
            assert resume_offset(str(path), 0, len(damaged), chunk) == last_row_end(len(damaged), chunk), (trial, chunk)


# --- damage handling whatever the chunking (issue 13 items 2-4, JETLOG.md 5) ------------


def read_chunked(path: Path, chunk: int, **kw: Any) -> list[dict[str, Any]]:
    """Rows of ``path`` read as the ``jetlog`` source plans it: chunks of ``chunk`` bytes."""
    from tools.ingest.source import plan_ranges

    rows: list[dict[str, Any]] = []
    size = path.stat().st_size
    for part in plan_ranges([(str(path), 0, size)], chunk, 0):
        for _, start, stop, limit in part:
            rows += read(path, start=start, stop=stop, limit=limit, **kw)
    return rows


def _cut_at(records: list[LogRecord], i: int) -> int:
    """A chunk size whose first cut falls inside record ``i - 1``, so that record ``i``
    is the first record after the cut."""
    return records[i].offset - 3


def test_damage_in_the_first_record_after_a_cut_is_reported(tmp_path: Path) -> None:
    data = bytearray(build_log())
    records = [item for item in oracle(bytes(data)) if isinstance(item, LogRecord)]
    victim = records[8]
    data[victim.offset + 10 + 3] ^= 0xFF  # CRC mismatch
    path = tmp_path / "a.jetlog"
    path.write_bytes(bytes(data))
    chunk = _cut_at(records, 8)
    rows = read_chunked(path, chunk)
    assert [(r["offset"], r["size"]) for r in rows if r["corrupt"]] == [
        (victim.offset, records[9].offset - victim.offset)]
    assert [r["offset"] for r in rows if not r["corrupt"]] == [r.offset for r in records if r is not victim]
    with pytest.raises(JetlogError, match="CRC mismatch at offset"):
        read_chunked(path, chunk, mode="FAILFAST")


def test_valid_record_at_a_cut_survives_damage_in_the_next(tmp_path: Path) -> None:
    data = bytearray(build_log())
    records = [item for item in oracle(bytes(data)) if isinstance(item, LogRecord)]
    data[records[9].offset] = 0  # bad marker in the record after the one at the cut
    path = tmp_path / "a.jetlog"
    path.write_bytes(bytes(data))
    rows = read_chunked(path, _cut_at(records, 8))
    assert [r["offset"] for r in rows if not r["corrupt"]] == [r.offset for r in records if r is not records[9]]
    assert [r["offset"] for r in rows if r["corrupt"]] == [records[9].offset]


def test_valid_record_between_two_damaged_ones_is_kept(tmp_path: Path) -> None:
    data = bytearray(build_log())
    records = [item for item in oracle(bytes(data)) if isinstance(item, LogRecord)]
    for i in (5, 7):
        data[records[i].offset + 10 + 3] ^= 0xFF
    path = tmp_path / "a.jetlog"
    path.write_bytes(bytes(data))
    for rows in (read(path), read_chunked(path, _cut_at(records, 6))):
        assert [r["offset"] for r in rows if not r["corrupt"]] == [
            r.offset for i, r in enumerate(records) if i not in (5, 7)]
        assert [r["offset"] for r in rows if r["corrupt"]] == [records[5].offset, records[7].offset]


def test_truncated_tail_is_reported(tmp_path: Path) -> None:
    data = build_log()
    records = [item for item in oracle(data) if isinstance(item, LogRecord)]
    last = records[-1]
    path = tmp_path / "a.jetlog"
    for cut, needed in ((last.offset + 4, 10), (last.offset + 17, 23 + len(last.data))):
        path.write_bytes(data[:cut])
        rows = read(path)
        assert [r["offset"] for r in rows if r["kind"] != "TRUNCATED"] == [r.offset for r in records[:-1]]
        tail = [r for r in rows if r["kind"] == "TRUNCATED"]
        assert len(tail) == 1
        assert (tail[0]["offset"], tail[0]["size"]) == (last.offset, cut - last.offset)
        assert tail[0]["corrupt"] == f"truncated record: {cut - last.offset} of {needed} bytes present"
        assert [r for r in read(path, mode="DROPMALFORMED") if r["kind"] == "TRUNCATED"] == []
        with pytest.raises(JetlogError, match=f"truncated record at offset {last.offset}"):
            read(path, mode="FAILFAST")


def test_bad_header_row_says_the_whole_file_was_skipped(tmp_path: Path) -> None:
    data = bytearray(build_log())
    data[20] ^= 1
    path = tmp_path / "a.jetlog"
    path.write_bytes(bytes(data))
    for rows in (read(path), read_chunked(path, 100)):
        assert len(rows) == 1
        assert rows[0]["size"] == len(data)
        assert rows[0]["corrupt"] == f"bad segment header: jet log header CRC mismatch; skipped the whole file ({len(data)} bytes)"


def reference_read(data: bytes, max_record: int = 1 << 16) -> tuple[list[int], list[tuple[int, int]], Any]:
    """JETLOG.md 5 read plainly, in one pass over the whole file, for the tests: the
    offsets of valid records, the damaged runs ``(offset, length)`` and the truncated
    tail ``(offset, present, needed)`` (or None)."""
    from jetwire.log import decode_header

    have = len(data)

    def u32(p: int) -> int:
        return int.from_bytes(data[p : p + 4], "big")

    def state(p: int) -> str:
        """ok, short (the file ends inside it, sound so far) or bad."""
        if data[p : p + 2] != b"JR"[: have - p]:
            return "bad"
        if have - p < 6:
            return "short"
        length = u32(p + 2)
        if not 13 <= length <= max_record:
            return "bad"
        if p + 10 + length > have:
            return "short"
        return "ok" if zlib.crc32(data[p + 2 : p + 6] + data[p + 10 : p + 10 + length]) == u32(p + 6) else "bad"

    def candidate(p: int) -> bool:
        if have - p < 10 or state(p) != "ok":
            return False
        after = p + 10 + u32(p + 2)
        return data[after : after + 2] == b"JR"[: have - after]

    pos = decode_header(data).size
    records: list[int] = []
    damage: list[tuple[int, int]] = []
    while pos < have:
        st = state(pos)
        if st == "ok":
            records.append(pos)
            pos += 10 + u32(pos + 2)
            continue
        nxt = next((c for c in range(pos + 1, have) if candidate(c)), have)
        if st == "short" and nxt == have:
            return records, damage, (pos, have - pos, 10 + (u32(pos + 2) if have - pos >= 10 else 0))
        damage.append((pos, nxt - pos))
        pos = nxt
    return records, damage, None


_CLEAN = build_log()
_HEADER_SIZE = len(encode_header(LogHeader("jetd", T0, 0)))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    flips=st.lists(st.tuples(st.integers(_HEADER_SIZE, len(_CLEAN) - 1), st.integers(1, 255)), max_size=4),
    garbage=st.lists(st.tuples(st.integers(_HEADER_SIZE, len(_CLEAN)), st.binary(max_size=30)), max_size=2),
    keep=st.integers(_HEADER_SIZE, len(_CLEAN) + 60),
    chunks=st.lists(st.integers(1, len(_CLEAN)), min_size=1, max_size=3),
)
def test_chunked_reads_equal_one_strict_read(
    tmp_path: Path, flips: list[tuple[int, int]], garbage: list[tuple[int, bytes]], keep: int, chunks: list[int]
) -> None:
    """Flip bytes, insert garbage (marker bytes likely), truncate, then read in random
    chunk sizes: valid records, damaged runs and the truncated tail are exactly what one
    plain whole-file read per JETLOG.md 5 finds, in every mode."""
    data = bytearray(_CLEAN)
    for off, xor in flips:
        data[off] ^= xor
    for off, junk in sorted(garbage, reverse=True):
        data[off:off] = junk.replace(b"\x00", b"JR")
    data = data[:keep]
    records, damage, tail = reference_read(bytes(data))
    path = tmp_path / "h.jetlog"
    path.write_bytes(bytes(data))
    for chunk in chunks:
        rows = read_chunked(path, chunk, max_record=1 << 16)
        assert sorted(r["offset"] for r in rows if r["kind"] not in ("CORRUPT", "TRUNCATED")) == records, chunk
        assert sorted((r["offset"], r["size"]) for r in rows if r["kind"] == "CORRUPT") == damage, chunk
        assert [(r["offset"], r["size"]) for r in rows if r["kind"] == "TRUNCATED"] == ([tail[:2]] if tail else [])
        dropped = read_chunked(path, chunk, max_record=1 << 16, mode="DROPMALFORMED")
        assert sorted(r["offset"] for r in dropped) == [
            r["offset"] for r in sorted(rows, key=lambda r: r["offset"]) if r["corrupt"] is None]
        if damage or tail:
            with pytest.raises(JetlogError):
                read_chunked(path, chunk, max_record=1 << 16, mode="FAILFAST")


@settings(max_examples=150, deadline=None)
@given(
    flips=st.lists(st.tuples(st.integers(_HEADER_SIZE, len(_CLEAN) - 1), st.integers(1, 255)), max_size=3),
    garbage=st.lists(st.tuples(st.integers(_HEADER_SIZE, len(_CLEAN)), st.binary(max_size=30)), max_size=2),
    keep=st.integers(_HEADER_SIZE, len(_CLEAN) + 60),
    start=st.integers(0, len(_CLEAN) + 60),
    until=st.integers(0, len(_CLEAN) + 60),
    max_record=st.sampled_from([13, 40, 1 << 16]),
    verify_crc=st.booleans(),
    window=st.sampled_from([1, 2, 7, 64, 4 << 20]),
)
def test_vectorised_walk_equals_the_record_walk(flips: list[tuple[int, int]], garbage: list[tuple[int, bytes]],
                                                 keep: int, start: int, until: int, max_record: int,
                                                 verify_crc: bool, window: int) -> None:
    """The interpreted build walks the chain of records with numpy; it must find the same
    records and stop at the same place as the walk the compiled build runs, from any
    position (marker or not), whatever the damage, and however it windows its search for
    markers (small windows cut markers in two)."""
    from tools.ingest.chain import walk
    from tools.ingest.parse import _walk_vectorised

    data = bytearray(_CLEAN)
    for off, xor in flips:
        data[off] ^= xor
    for off, junk in sorted(garbage, reverse=True):
        data[off:off] = junk.replace(b"\x00", b"JR")
    buf = bytes(data[:keep])
    # From every record start and from an arbitrary byte.
    for pos in [*(r.offset for r in oracle(buf) if isinstance(r, LogRecord)), start]:
        expected: list[int] = []
        stop = walk(buf, pos, until, max_record, verify_crc, expected)
        found, got = _walk_vectorised(buf, pos, until, max_record, verify_crc, window)
        assert (found.tolist(), got) == (expected, stop), pos


# --- segment identity, runs, gzip (issue 13 items 5 and 7) ----------------------------------


def test_identity_comes_from_the_header_not_the_path(tmp_path: Path) -> None:
    from tools.ingest.parse import SegmentIdentity
    from tools.ingest.parse import read_file_header

    data = build_log(segment=4)
    a, b = tmp_path / "jet-x.jetlog", tmp_path / "archive" / "renamed.bin"
    b.parent.mkdir()
    a.write_bytes(data)
    b.write_bytes(data)
    ha, hb = read_file_header(str(a)), read_file_header(str(b))
    assert ha is not None and hb is not None
    crc = int.from_bytes(data[ha.size - 4 : ha.size], "big")
    assert ha.identity == hb.identity == SegmentIdentity("jetd", T0, 4, crc)
    other = tmp_path / "other.jetlog"
    other.write_bytes(build_log(segment=5))
    ho = read_file_header(str(other))
    assert ho is not None and ho.identity != ha.identity


def _v1_header(name: str, created: int, segment: int) -> SegmentHeader:
    return SegmentHeader(name, created, segment, 34, 1, None, 0)


def test_infer_runs() -> None:
    from tools.ingest.parse import infer_runs

    headers: dict[str, Any] = {
        "a0": _v1_header("jetd", 100, 0), "a1": _v1_header("jetd", 200, 1), "a2": _v1_header("jetd", 300, 2),
        "b0": _v1_header("jetd", 400, 0), "b1": _v1_header("jetd", 500, 1),
        "x3": _v1_header("other", 150, 3), "x4": _v1_header("other", 250, 4),  # run start not listed
        "v2": SegmentHeader("jetd", 600, 7, 42, 2, 50, 0), "bad": None,
    }
    assert infer_runs(headers) == {"a0": 100, "a1": 100, "a2": 100, "b0": 400, "b1": 400,
                                   "x3": 150, "x4": 150, "v2": 50}
    # A run recorded earlier (a warehouse's manifest) wins, and its later segments follow it.
    assert infer_runs(headers, lambda f, h: 90 if f == "x3" else None)["x4"] == 90


def test_run_ns_column_version_1_and_2(tmp_path: Path) -> None:
    from tools.ingest.parse import SOURCE_SCHEMA

    v2 = tmp_path / "v2.jetlog"
    v2.write_bytes(encode_header(LogHeader("jetd", T0, 3, run_ns=T0 - 5))
                   + encode_record(T0, 1, LogKind.CONN_OPEN, conn_open_data("a:1")))
    v1 = tmp_path / "v1.jetlog"
    v1.write_bytes(encode_header(LogHeader("jetd", T0, 3, version=1))
                   + encode_record(T0, 1, LogKind.CONN_OPEN, conn_open_data("a:1")))
    for path, inferred, want in ((v2, 7, T0 - 5), (v1, 7, 7), (v1, None, None)):
        batches = list(read_segment(str(path), add_run=True, run_ns=inferred))
        assert all(b.schema.equals(SOURCE_SCHEMA) for b in batches)
        assert [r["run_ns"] for b in batches for r in b.to_pylist()] == [want]


def test_gzip_segments_are_read(tmp_path: Path) -> None:
    import gzip

    data = build_log()
    plain, packed = tmp_path / "a.jetlog", tmp_path / "a.jetlog.gz"
    plain.write_bytes(data)
    packed.write_bytes(gzip.compress(data))
    assert [dict(r, file=None) for r in read(packed)] == [dict(r, file=None) for r in read(plain)]
    packed.write_bytes(gzip.compress(data)[:-20])  # cut short: loud, never skipped
    with pytest.raises(JetlogError, match="gzip"):
        read(packed)


def test_exact_start_reports_damage_right_at_a_resume_offset(tmp_path: Path) -> None:
    data = bytearray(build_log())
    records = [item for item in oracle(bytes(data)) if isinstance(item, LogRecord)]
    data[records[6].offset + 12] ^= 0xFF
    path = tmp_path / "a.jetlog"
    path.write_bytes(bytes(data))
    rows = read(path, start=records[6].offset, exact_start=True)
    assert rows[-1]["offset"] == records[6].offset and rows[-1]["kind"] == "CORRUPT"
    assert [r["offset"] for r in rows if r["kind"] != "CORRUPT"] == [r.offset for r in records[7:]]


def test_time_range_covers_exactly_the_records_in_range(tmp_path: Path) -> None:
    """Bisection over offsets (ts_ns never decreases in a segment): reading [start, stop)
    yields every record whose time is in range, damage or not, and little else."""
    import random

    from tools.ingest.parse import read_header
    from tools.ingest.parse import time_range
    from tools.ingest.synth import write_synthetic_log

    path = tmp_path / "a.jetlog"
    write_synthetic_log(str(path), 3000)
    data = bytearray(path.read_bytes())
    rng = random.Random(3)
    header = read_header(bytes(data))
    assert header is not None
    for _ in range(5):
        data[rng.randrange(header.size, len(data))] ^= 0xFF
    path.write_bytes(bytes(data))
    rows = [r for r in read(path) if r["ts_ns"] is not None]
    times = [r["ts_ns"] for r in rows]
    for _ in range(30):
        lo, hi = sorted(rng.sample(range(times[0] - 10, times[-1] + 10), 2))
        start, stop = time_range(bytes(data), header.size, lo, hi, grain=512)
        got = {r["offset"] for r in read(path, start=start, stop=stop, limit=stop)}
        want = {r["offset"] for r in rows if lo <= r["ts_ns"] <= hi}
        assert want <= got, (lo, hi)
        assert len(got) <= len(want) + 2 * 512 // 20 + 4, (lo, hi)  # a grain each side at most
    assert time_range(bytes(data), header.size, times[-1] + 1, None)[0] >= len(data) - (1 << 16) - 100
    assert time_range(bytes(data), header.size, None, times[0] - 1) == (header.size, header.size)
