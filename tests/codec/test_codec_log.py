"""The event-log codec (spec/JETLOG.md): vectors, round trips, truncation, damage."""

from __future__ import annotations

import io
from typing import Any

import pytest

from jetwire import LocalProtocolError
from jetwire import RemoteProtocolError
from jetwire import Status
from jetwire.log import Corruption
from jetwire.log import LogHeader
from jetwire.log import LogHeaderIncomplete
from jetwire.log import LogKind
from jetwire.log import LogReader
from jetwire.log import LogRecord
from jetwire.log import Truncation
from jetwire.log import conn_close_data
from jetwire.log import conn_name_data
from jetwire.log import conn_open_data
from jetwire.log import conn_snapshot_data
from jetwire.log import decode_header
from jetwire.log import encode_header
from jetwire.log import encode_record
from jetwire.log import iter_log
from jetwire.log import parse_record_data
from jetwire.log import route_data
from tools.vectors import load
from tools.vectors import log_item_to_json

LOG = load("jetlog.json")


def read_all(chunks: list[bytes], **kwargs: Any) -> list[Any]:
    reader = LogReader(**kwargs)
    items: list[Any] = []
    for chunk in chunks:
        reader.feed(chunk)
        items.extend(reader.items())
    reader.feed_eof()
    items.extend(reader.items())
    return items


@pytest.mark.parametrize("vector", LOG["files"], ids=[f["name"] for f in LOG["files"]])
def test_log_vector_in_any_chunking(vector: dict[str, Any]) -> None:
    data = bytes.fromhex(vector["hex"])
    splits = [[data], [data[i : i + 1] for i in range(len(data))]]
    splits += [[data[:cut], data[cut:]] for cut in range(len(data) + 1)]
    for chunks in splits:
        assert [log_item_to_json(item) for item in read_all(chunks)] == vector["items"]
    for chunk_size in (1, 7, 1 << 20):
        got = [log_item_to_json(i) for i in iter_log(io.BytesIO(data), chunk_size=chunk_size)]
        assert got == vector["items"]


@pytest.mark.parametrize("vector", LOG["invalid_files"], ids=[f["name"] for f in LOG["invalid_files"]])
def test_invalid_log_files_are_rejected(vector: dict[str, Any]) -> None:
    data = bytes.fromhex(vector["hex"])
    with pytest.raises(RemoteProtocolError):
        list(iter_log(io.BytesIO(data)))
    with pytest.raises(RemoteProtocolError):
        read_all([data[i : i + 1] for i in range(len(data))])


def _sample_log() -> tuple[bytes, list[int], LogHeader]:
    header = LogHeader("jetd-ü", 1_700_000_000_000_000_000, 7)
    records = [
        encode_record(1, 1, LogKind.CONN_OPEN, conn_open_data("[::1]:4711")),
        encode_record(2, 1, LogKind.CONN_NAME, conn_name_data("sensor")),
        encode_record(3, 1, LogKind.FRAME_IN, bytes.fromhex("0100000009000000090900000003")),
        encode_record(4, 0, LogKind.ROUTE, route_data(1, 9, 2, 1, 3, "plant/temp")),
        encode_record(5, 2, LogKind.CONN_SNAPSHOT, conn_snapshot_data("10.0.0.1:1", "")),
        encode_record(6, 1, LogKind.FRAME_OUT, b""),
        encode_record(2**64 - 1, 2**32 - 1, LogKind.CONN_CLOSE, conn_close_data(Status.OVERLOADED, "slow")),
    ]
    head = encode_header(header)
    starts = []
    offset = len(head)
    for record in records:
        starts.append(offset)
        offset += len(record)
    expected = LogHeader(header.name, header.created_ns, 7, version=1, size=len(head))  # no run_ns: version 1
    return head + b"".join(records), starts, expected


def test_round_trip_every_kind() -> None:
    data, starts, header = _sample_log()
    items = read_all([data])
    assert items[0] == header
    records = items[1:]
    assert [r.offset for r in records] == starts
    assert all(isinstance(r, LogRecord) for r in records)
    assert parse_record_data(records[0].kind, records[0].data) == {"address": "[::1]:4711"}
    assert parse_record_data(records[1].kind, records[1].data) == {"name": "sensor"}
    assert parse_record_data(records[3].kind, records[3].data) == {
        "requester_conn": 1,
        "requester_id": 9,
        "owner_conn": 2,
        "owner_id": 1,
        "function": 3,
        "key": "plant/temp",
    }
    assert parse_record_data(records[4].kind, records[4].data) == {"address": "10.0.0.1:1", "name": ""}
    assert records[6].ts_ns == 2**64 - 1 and records[6].conn_id == 2**32 - 1
    assert parse_record_data(records[6].kind, records[6].data) == {"status": Status.OVERLOADED, "reason": "slow"}


def test_truncation_at_every_offset_is_clean() -> None:
    """Cut anywhere after the header: the complete records, then one Truncation (or
    nothing, at a record boundary); never an exception. Cut inside the header: the
    typed error JETLOG.md 2 asks for."""
    data, starts, header = _sample_log()
    bounds = [*starts, len(data)]
    for cut in range(len(data) + 1):
        if cut < header.size:
            with pytest.raises(RemoteProtocolError):
                read_all([data[:cut]])
            continue
        items = read_all([data[:cut]])
        complete = [b for b in bounds[1:] if b <= cut]
        assert items[0] == header
        assert [r.offset for r in items[1 : 1 + len(complete)]] == starts[: len(complete)]
        tail = items[1 + len(complete) :]
        if cut in bounds:
            assert tail == []
        else:
            start = max(s for s in starts if s <= cut)
            needed = (bounds[bounds.index(start) + 1] - start) if cut - start >= 10 else 10
            assert tail == [Truncation(start, cut - start, needed)]
        # The older API: drain items, then finish() returns the same report.
        reader = LogReader()
        reader.feed(data[:cut])
        assert len(list(reader.items())) == 1 + len(complete)
        assert reader.finish() == (tail[0] if tail else None)


@pytest.mark.parametrize("mask", [0x01, 0xFF])
def test_damage_anywhere_in_a_middle_record_resyncs_at_the_next(mask: int) -> None:
    data, starts, header = _sample_log()
    victim = 3
    start, stop = starts[victim], starts[victim + 1]
    for position in range(start, stop):
        damaged = bytearray(data)
        damaged[position] ^= mask
        items = read_all([bytes(damaged)])
        assert items[0] == header
        offsets = [i.offset for i in items[1:] if isinstance(i, LogRecord)]
        assert offsets == [s for s in starts if s != start], position
        reports = [i for i in items if isinstance(i, Corruption)]
        assert [(r.offset, r.length) for r in reports] == [(start, stop - start)], position


def test_oversized_record_length_is_damage_and_not_buffered() -> None:
    data, starts, _ = _sample_log()
    reader = LogReader(max_record=64)
    big = b"JR" + (2**32 - 1).to_bytes(4, "big") + b"\x00" * 4
    reader.feed(data[: starts[1]] + big + data[starts[1] :])
    reader.feed_eof()
    items = list(reader.items())
    assert Corruption(starts[1], len(big), "implausible record length 4294967295") in items
    assert sum(isinstance(i, LogRecord) for i in items) == len(starts)


def test_long_stream_in_small_chunks_keeps_offsets() -> None:
    """More than the reader's compaction threshold, fed in 64 KiB chunks."""
    head = encode_header(LogHeader("jetd", 0))
    record = encode_record(1, 1, LogKind.FRAME_IN, b"x" * 1000)
    data = head + record * 3000
    chunks = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    items = read_all(chunks)
    assert len(items) == 3001
    assert [r.offset for r in items[1:]] == [len(head) + i * len(record) for i in range(3000)]


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        (LogKind.CONN_OPEN, b"\x00\x02\xff\xfe"),
        (LogKind.CONN_OPEN, b"\x00\x05ab"),
        (LogKind.CONN_OPEN, b"\x00"),
        (LogKind.CONN_OPEN, b"\x00\x01ab"),
        (LogKind.CONN_CLOSE, b""),
        (LogKind.CONN_NAME, b"\x00\x01\xc0"),
        (LogKind.CONN_SNAPSHOT, b"\x00\x01a"),
        (LogKind.ROUTE, b"\x00" * 16),
        (LogKind.ROUTE, b"\x00" * 17 + b"\x00\x01\xff"),
        (LogKind.FRAME_IN, b""),
        (0x42, b""),
    ],
)
def test_bad_record_data_is_a_typed_error(kind: int, data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        parse_record_data(kind, data)


@pytest.mark.parametrize(
    "call",
    [
        lambda: encode_record(-1, 1, 1, b""),
        lambda: encode_record(1, 2**32, 1, b""),
        lambda: encode_record(1, 1, 256, b""),
        lambda: encode_record(1, 1, 1, "text"),
        lambda: encode_header(LogHeader("x" * 65536, 0)),
        lambda: encode_header(LogHeader("x", -1)),
        lambda: conn_open_data("\ud800"),
        lambda: conn_close_data(0x55, ""),
        lambda: route_data(1, 2, 3, 4, 256, "k"),
    ],
)
def test_encoding_misuse_is_a_local_error(call: Any) -> None:
    with pytest.raises(LocalProtocolError):
        call()


def read_with_tuples(chunks: list[bytes]) -> list[Any]:
    """Read as a bulk reader does: record_tuples(), then next_item() for the rest."""
    reader = LogReader()
    items: list[Any] = []

    def drain() -> None:
        while True:
            items.extend(LogRecord(*t) for t in reader.record_tuples())
            item = reader.next_item()
            if item is None:
                return
            items.append(item)

    for chunk in chunks:
        reader.feed(chunk)
        drain()
    reader.feed_eof()
    drain()
    return items


@pytest.mark.parametrize("vector", LOG["files"], ids=[f["name"] for f in LOG["files"]])
def test_record_tuples_then_next_item_read_what_items_reads(vector: dict[str, Any]) -> None:
    data = bytes.fromhex(vector["hex"])
    for chunks in ([data], [data[i : i + 1] for i in range(len(data))], [data[:40], data[40:]]):
        assert [log_item_to_json(item) for item in read_with_tuples(chunks)] == vector["items"]


def test_decode_header_of_every_vector_file() -> None:
    for vector in LOG["files"]:
        data = bytes.fromhex(vector["hex"])
        first = next(iter_log(io.BytesIO(data)))
        assert decode_header(data) == first, vector["name"]
        assert decode_header(bytearray(data)) == first
        assert decode_header(memoryview(data)[: first.size]) == first
        for cut in range(first.size):
            with pytest.raises(LogHeaderIncomplete) as info:
                decode_header(data[:cut])
            assert isinstance(info.value, RemoteProtocolError)
            assert cut < info.value.needed <= first.size


def test_decode_header_round_trip_and_errors() -> None:
    header = LogHeader("jetd-ü", 1_700_000_000_000_000_000, 7)
    raw = encode_header(header)
    assert decode_header(raw + b"JR...") == LogHeader(header.name, header.created_ns, 7, 1, size=len(raw))
    for vector in LOG["invalid_files"]:
        data = bytes.fromhex(vector["hex"])
        with pytest.raises(RemoteProtocolError):
            decode_header(data)
    bad_crc = raw[:-1] + bytes([raw[-1] ^ 1])
    with pytest.raises(RemoteProtocolError, match="CRC") as info:
        decode_header(bad_crc)
    assert not isinstance(info.value, LogHeaderIncomplete)
    with pytest.raises(RemoteProtocolError, match="magic"):
        decode_header(b"\x89JEX")
    with pytest.raises(RemoteProtocolError, match="version"):
        decode_header(raw[:8] + b"\x00\x03" + raw[10:])
    raw2 = encode_header(LogHeader("jetd", 5, 2, run_ns=4))
    with pytest.raises(RemoteProtocolError, match="version"):
        decode_header(raw2[:8] + b"\x00\x03" + raw2[10:])


def test_header_versions_1_and_2() -> None:
    """JETLOG.md 2: version 2 carries run_ns; readers accept both versions; a version-2
    header read as version 1 (the bytes after segment taken for the name) fails its CRC
    or its length, never passes as another header."""
    v1 = LogHeader("jetd", 1_700_000_000_000_000_000, 4, version=1)
    raw1 = encode_header(v1)
    assert len(raw1) == 34 and decode_header(raw1) == LogHeader("jetd", v1.created_ns, 4, 1, 0, 34, None)
    v2 = LogHeader("jetd", 1_700_000_000_000_000_000, 4, run_ns=1_699_999_000_000_000_000)
    raw2 = encode_header(v2)
    assert raw2[8:10] == b"\x00\x02" and raw2[24:32] == (1_699_999_000_000_000_000).to_bytes(8, "big")
    assert decode_header(raw2) == LogHeader("jetd", v2.created_ns, 4, 2, 0, 42, 1_699_999_000_000_000_000)
    assert decode_header(encode_header(LogHeader("jetd", 5))).run_ns == 5  # segment 0 starts its run
    assert decode_header(encode_header(LogHeader("jetd", 5, 1))).version == 1  # run unknown: never a wrong one
    as_v1 = raw2[:8] + b"\x00\x01" + raw2[10:]
    with pytest.raises(RemoteProtocolError):
        decode_header(as_v1 + bytes(70000))
    with pytest.raises(LocalProtocolError):
        encode_header(LogHeader("jetd", 5, version=3))


def test_resync_skips_a_candidate_not_followed_by_a_record() -> None:
    """JETLOG.md 5: inside damage, a CRC-valid record counts only when a marker (or the
    end) follows it; otherwise every "JR" in damaged bytes would cost a CRC."""
    header = encode_header(LogHeader("jetd", 1, 0))
    first = encode_record(10, 1, LogKind.FRAME_IN, b"a")
    lone = encode_record(11, 1, LogKind.FRAME_IN, b"lonely")  # valid CRC, garbage after it
    last = encode_record(12, 1, LogKind.FRAME_IN, b"b")
    damage = b"\x00\x01garbage" + lone + b"XY junk"
    data = header + first + damage + last
    items = list(iter_log(io.BytesIO(data)))
    records = [item for item in items if isinstance(item, LogRecord)]
    assert [r.ts_ns for r in records] == [10, 12]
    (corruption,) = [item for item in items if isinstance(item, Corruption)]
    assert corruption.offset == len(header) + len(first)
    assert corruption.length == len(damage)
