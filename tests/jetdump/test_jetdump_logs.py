"""jetdump on jet event logs (spec/JETLOG.md): built with jetwire.log and written by a
real jetd started with --log-dir."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jdhelpers import jet_frames
from jdhelpers import jetdump_json
from jdhelpers import run_jetdump

from jetwire import AddState
from jetwire import Decoder
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Info
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import encode
from jetwire.log import LogHeader
from jetwire.log import LogKind
from jetwire.log import conn_close_data
from jetwire.log import conn_open_data
from jetwire.log import encode_header
from jetwire.log import encode_record
from jetwire.log import route_data

T0 = 1_700_000_000_000_000_000
SET = encode(SetState(5, "plant/temp", Value.of(22.5)))
ROUTED = encode(SetState(1, "plant/temp", Value.of(22.5)))
OWNER_OK = encode(Response(1, Status.OK, Value.of(22.5)))
REQUESTER_OK = encode(Response(5, Status.OK, Value.of(22.5)))


# conn 3 and conn 7 connect; conn 7 sets plant/temp, owned by conn 3: the daemon routes it.
ROUTED_SET = [
    (3, LogKind.CONN_OPEN, conn_open_data("127.0.0.1:50001")),
    (7, LogKind.CONN_OPEN, conn_open_data("127.0.0.1:50002")),
    (7, LogKind.FRAME_IN, SET),
    (0, LogKind.ROUTE, route_data(7, 5, 3, 1, 0x03, "plant/temp")),
    (3, LogKind.FRAME_OUT, ROUTED),
]
CLOSED = (7, LogKind.CONN_CLOSE, conn_close_data(Status.OK, "peer closed"))


def log_segment(records: list[tuple[int, LogKind, bytes]], segment_no: int = 0, t0: int = T0) -> bytes:
    """A segment of ``records`` (conn id, kind, data), one millisecond apart from ``t0``."""
    out = encode_header(LogHeader("jetd", t0, segment_no))
    for i, (conn, kind, data) in enumerate(records):
        out += encode_record(t0 + i * 1_000_000, conn, kind, data)
    return out


def segment(segment_no: int = 0, *, t0: int = T0) -> bytes:
    """conn 7 sets a state owned by conn 3; the daemon routes it and answers."""
    records = [*ROUTED_SET, (3, LogKind.FRAME_IN, OWNER_OK), (7, LogKind.FRAME_OUT, REQUESTER_OK), CLOSED]
    return log_segment(records, segment_no, t0)


def test_log_segment_frames_notes_and_matching(tmp_path: Path) -> None:
    path = tmp_path / "jet-20231114T221320-1-000000.jetlog"
    path.write_bytes(segment())
    result = run_jetdump(str(path))
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "c7 → jetd  REQUEST id=5 SET_STATE key=\"plant/temp\" FLOAT64 22.5" in text
    assert "jetd → c3  REQUEST id=1 SET_STATE" in text
    assert "c3 → jetd  RESPONSE id=1 OK FLOAT64 22.5  [answers #2 SET_STATE, 1.000 ms]" in text
    assert "jetd → c7  RESPONSE id=5 OK FLOAT64 22.5  [answers #1 SET_STATE, 4.000 ms]" in text
    assert "connection opened from 127.0.0.1:50002" in text
    assert "routed SET_STATE key='plant/temp': c7 id=5 -> c3 id=1" in text
    assert "connection closed: OK 'peer closed'" in text
    frames = jet_frames(jetdump_json(str(path)))
    assert [(f["stream"], f["direction"]) for f in frames] == [(7, 0), (3, 1), (3, 0), (7, 1)]
    assert frames[0]["timestamp"] == pytest.approx(T0 / 1e9 + 0.002, abs=1e-6)


def test_directory_glob_and_runs(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "jet-a-000000.jetlog").write_bytes(segment(0))
    (logs / "jet-a-000001.jetlog").write_bytes(segment(1, t0=T0 + 10**9))
    (logs / "jet-b-000000.jetlog").write_bytes(segment(0, t0=T0 + 2 * 10**9))  # a second daemon run
    (logs / "README").write_text("not a log")
    by_dir = jet_frames(jetdump_json(str(logs)))
    by_glob = jet_frames(jetdump_json(str(logs / "jet-a-*.jetlog")))
    assert len(by_dir) == 12 and len(by_glob) == 8
    # Segment 1 continues run 0's connection ids; the second run's are kept apart.
    assert sorted({f["stream"] for f in by_dir}) == [3, 7, 1_000_003, 1_000_007]
    assert {f["src"] for f in by_dir if f["stream"] == 1_000_007 and f["direction"] == 0} == {"r1c7"}


def test_damaged_and_truncated_log(tmp_path: Path) -> None:
    data = bytearray(segment())
    header_size = len(encode_header(LogHeader("jetd", T0, 0)))
    first = len(encode_record(0, 3, LogKind.CONN_OPEN, conn_open_data("127.0.0.1:50001")))
    data[header_size + first + 12] ^= 0xFF  # damage the second record's body: its CRC fails
    path = tmp_path / "damaged.jetlog"
    path.write_bytes(bytes(data[:-7]))  # and cut the last record short
    result = run_jetdump(str(path))
    assert result.returncode == EXIT_DAMAGED, result.stderr
    assert f"damage at offset {header_size + first}" in result.stdout
    assert "ends inside a record at offset" in result.stdout
    assert "SET_STATE" in result.stdout and "answers #1" in result.stdout


def test_unreadable_logs(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jetlog"
    data = bytearray(segment())
    data[9] = 7  # version 7
    bad.write_bytes(bytes(data))
    result = run_jetdump(str(bad))
    assert result.returncode == 1 and "unsupported jet log version 7" in result.stderr
    cut = tmp_path / "cut.jetlog"
    cut.write_bytes(segment()[:20])
    result = run_jetdump(str(cut))
    assert result.returncode == EXIT_DAMAGED and "damaged segment header: ends after 20 of" in result.stderr
    # Damage and an unreadable input together: the unreadable one decides the status.
    assert run_jetdump(str(cut), str(bad)).returncode == 1
    assert run_jetdump(str(tmp_path / "nothing-*.jetlog")).returncode == 1


EXIT_DAMAGED = 3  # tools/jetdump/README.md: decoded, but some input was damaged


@pytest.mark.parametrize("cut", [0, 5, 20, -1])
def test_segment_cut_inside_its_header_is_reported_and_skipped(tmp_path: Path, cut: int) -> None:
    # A daemon killed right after it created a segment leaves its header cut short
    # (0 bytes, inside the magic, or inside the name and CRC).
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "jet-a-000000.jetlog").write_bytes(segment(0))
    header_size = len(encode_header(LogHeader("jetd", T0, 1)))
    (logs / "jet-a-000001.jetlog").write_bytes(segment(1)[: cut % header_size])
    (logs / "jet-a-000002.jetlog").write_bytes(segment(2, t0=T0 + 10**9))
    result = run_jetdump(str(logs))
    assert result.returncode == EXIT_DAMAGED, result.stderr
    assert result.stdout.count("REQUEST id=5 SET_STATE") == 2  # both sound segments are decoded
    message = f"jet-a-000001.jetlog: damaged segment header: ends after {cut % header_size} of "
    assert message in result.stderr and "segment skipped" in result.stderr
    assert message in result.stdout  # and in place, as a note between the segments
    notes = [r for r in jetdump_json(str(logs), returncode=EXIT_DAMAGED) if r["record"] == "note"]
    assert [n["note"] for n in notes if "000001" in n["text"]] == ["log-damage"]


def test_segment_header_crc_mismatch_is_damage_not_unreadable(tmp_path: Path) -> None:
    data = bytearray(segment(1))
    data[14] ^= 0x01  # created_ns: only the header CRC can tell
    (tmp_path / "jet-a-000001.jetlog").write_bytes(bytes(data))
    (tmp_path / "jet-a-000002.jetlog").write_bytes(segment(2))
    result = run_jetdump(str(tmp_path))
    assert result.returncode == EXIT_DAMAGED, result.stderr
    assert "jet-a-000001.jetlog: damaged segment header: header CRC mismatch; segment skipped" in result.stderr
    assert result.stdout.count("REQUEST id=5 SET_STATE") == 1
    # Damaged records are damaged input too; a truncated last record is not (JETLOG.md 5).
    damaged = bytearray(segment())
    damaged[len(encode_header(LogHeader("jetd", T0, 0))) + 12] ^= 0xFF
    (tmp_path / "jet-a-000001.jetlog").write_bytes(bytes(damaged))
    assert run_jetdump(str(tmp_path)).returncode == EXIT_DAMAGED
    (tmp_path / "jet-a-000001.jetlog").write_bytes(segment()[:-7])
    assert run_jetdump(str(tmp_path)).returncode == 0


def test_log_of_a_real_jetd(tmp_path: Path, start_jetd: Callable[..., Any]) -> None:
    log_dir = tmp_path / "jetd-logs"
    daemon = start_jetd("--log-dir", str(log_dir), "--log-fsync", "always")
    with socket.create_connection((daemon.host, daemon.port), timeout=5) as sock:
        sock.sendall(encode(Info("log-test")) + encode(AddState(1, "log/x", Value.of(1))))
        sock.sendall(encode(FetchStates(2, "log/")) + encode(GetState(3, "log/nope")))
        decoder = Decoder()
        answered: set[int] = set()
        deadline = time.monotonic() + 5
        while answered != {1, 2, 3} and time.monotonic() < deadline:
            decoder.receive_data(sock.recv(65536))
            answered |= {m.id for m in decoder.messages() if isinstance(m, Response)}
    assert answered == {1, 2, 3}
    assert daemon.stop() == 0
    result = run_jetdump(str(log_dir))
    assert result.returncode == 0, result.stderr
    assert 'REQUEST id=1 ADD_STATE key="log/x" INT64 1' in result.stdout
    assert 'RESPONSE id=3 NOT_FOUND' in result.stdout and "answers #" in result.stdout
    assert "peer named itself 'log-test'" in result.stdout
    frames = jet_frames(jetdump_json(str(log_dir)))
    assert all(f["kind"] == "frame" for f in frames)
    assert {f["type"] for f in frames} >= {"INFO", "REQUEST", "RESPONSE"}


def _two_keys_segment() -> bytes:
    """Two routed sets, plant/temp (OK) and plant/boiler (REJECTED), and connection notes."""
    other = encode(SetState(6, "plant/boiler", Value.of(1)))
    other_routed = encode(SetState(2, "plant/boiler", Value.of(1)))
    records = [
        *ROUTED_SET,
        (7, LogKind.FRAME_IN, other),
        (0, LogKind.ROUTE, route_data(7, 6, 3, 2, 0x03, "plant/boiler")),
        (3, LogKind.FRAME_OUT, other_routed),
        (3, LogKind.FRAME_IN, OWNER_OK),
        (3, LogKind.FRAME_IN, encode(Response(2, Status.REJECTED, message="no"))),
        (7, LogKind.FRAME_OUT, REQUESTER_OK),
        (7, LogKind.FRAME_OUT, encode(Response(6, Status.REJECTED, message="no"))),
        CLOSED,
    ]
    return log_segment(records)


def test_filters_keep_only_the_notes_about_selected_frames(tmp_path: Path) -> None:
    path = tmp_path / "jet-x-000000.jetlog"
    path.write_bytes(_two_keys_segment())
    by_key = jetdump_json(str(path), "--key", "plant/boiler")
    notes = [o for o in by_key if o["record"] == "note"]
    assert [n["text"] for n in notes] == ["routed SET_STATE key='plant/boiler': c7 id=6 -> c3 id=2"]
    assert len(jet_frames(by_key)) == 4
    by_status = jetdump_json(str(path), "--status", "REJECTED")
    assert [o["record"] for o in by_status] == ["frame", "frame"]  # no connection or routing notes
    plain = jetdump_json(str(path))
    assert sum(o["record"] == "note" for o in plain) == 6
    assert all(o["record"] == "frame" for o in jetdump_json(str(path), "--no-notes"))
    assert len(jetdump_json(str(path), "--no-notes")) == 8
    # Several streams: with commas or repeated.
    both = jet_frames(jetdump_json(str(path), "--stream", "3,7"))
    assert len(both) == 8
    assert jet_frames(jetdump_json(str(path), "--stream", "3", "--stream", "7")) == both
    assert {f["stream"] for f in jet_frames(jetdump_json(str(path), "--stream", "3"))} == {3}


def test_stats_count_a_routed_request_once_with_its_legs_apart(tmp_path: Path) -> None:
    import json

    path = tmp_path / "jet-x-000000.jetlog"
    path.write_bytes(_two_keys_segment())
    result = run_jetdump("--stats", "--json", str(path))
    report = json.loads(result.stdout)
    assert report["functions"] == {"SET_STATE": 4}  # two requests, two answers to c7
    assert report["statuses"] == {"OK": 1, "REJECTED": 1}
    assert report["legs"]["functions"] == {"SET_STATE": 4} and report["legs"]["statuses"] == {"OK": 1, "REJECTED": 1}
    assert report["latency_ms"]["SET_STATE"]["count"] == 2
    assert report["keys"]["plant/boiler"] == {"requests": 1, "events": 0, "errors": 1,
                                              "latency_ms": report["keys"]["plant/boiler"]["latency_ms"]}
    assert report["keys"]["plant/boiler"]["latency_ms"]["p50"] == pytest.approx(6.0, abs=1e-3)
    assert report["peers"]["c7"]["requests"] == 2 and report["peers"]["c7"]["errors"] == 1
    assert report["peers"]["c3"]["requests"] == 0
    assert report["unanswered"]["count"] == 0
