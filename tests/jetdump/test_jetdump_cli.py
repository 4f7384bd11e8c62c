"""jetdump's command line: every input kind, every output mode, filters, stats, damaged
input and exit statuses."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import pytest
from jdhelpers import CONVERSATION
from jdhelpers import jet_frames
from jdhelpers import jetdump_json
from jdhelpers import run_jetdump

import tools.jetdump as package
from jetwire import Close
from jetwire import FetchChange
from jetwire import GetState
from jetwire import Info
from jetwire import Request
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import encode
from jetwire.schema import dissect
from tools.jetdump.synth import CaptureWriter
from tools.jetdump.synth import TcpSession

CLIENT = ("10.0.0.1", 50000)
SERVER = ("10.0.0.2", 11124)

SET = encode(SetState(7, "a/b", Value.of(42)))
NOT_FOUND = encode(Response(7, Status.NOT_FOUND, message="no such state"))
CHANGE = encode(FetchChange(3, "plant/temp", Value.of(21.5)))
BAD_FUNCTION = bytes.fromhex("01 00000006 00000009 77 00")
CLOSE = encode(Close(Status.OK, "shutting down"))


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def write_conversation(path: Path, *, pcapng: bool = False) -> None:
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f, pcapng=pcapng), CLIENT, SERVER)
        session.handshake()
        for direction, message in CONVERSATION:
            session.send(direction, encode(message), dt=0.001)
        session.close()


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    path = tmp_path / "conversation.pcap"
    write_conversation(path)
    return path


# --- inputs -----------------------------------------------------------------------------


def test_raw_file_summary_lines(tmp_path: Path) -> None:
    raw = tmp_path / "stream.bin"
    raw.write_bytes(SET + NOT_FOUND + CHANGE + BAD_FUNCTION + CLOSE[:9])
    result = run_jetdump("--raw", str(raw))
    assert result.returncode == 0, result.stderr
    out = lines(result.stdout)
    assert out[0].endswith('REQUEST id=7 SET_STATE key="a/b" INT64 42')
    assert out[1].endswith('RESPONSE id=7 NOT_FOUND "no such state"')
    assert out[2].endswith('EVENT FETCH_CHANGE fid=3 key="plant/temp" FLOAT64 21.5')
    assert "MALFORMED REQUEST: unknown function 0x77 [01 00 00 00 06 00 00 00 09 77 00]" in out[3]
    # The stream ends inside the CLOSE frame: 9 of its 22 bytes are there.
    assert "TRUNCATED EVENT: stream ends inside a frame: 9 of 22 bytes present" in out[4]
    assert [line.split()[0] for line in out] == ["1", "2", "3", "4", "5"]


def test_raw_from_stdin() -> None:
    result = run_jetdump("--raw", "-", stdin=SET)
    assert result.returncode == 0
    assert 'SET_STATE key="a/b" INT64 42' in result.stdout


def test_hex_on_command_line_and_stdin() -> None:
    spaced = " ".join(f"{b:02x}" for b in CHANGE)
    by_args = run_jetdump("--hex", spaced[:20], spaced[20:])
    by_stdin = run_jetdump("--hex", stdin=("0x" + CHANGE.hex(":")).encode())
    for result in (by_args, by_stdin):
        assert result.returncode == 0, result.stderr
        assert 'EVENT FETCH_CHANGE fid=3 key="plant/temp" FLOAT64 21.5' in result.stdout


def test_bad_hex_is_unreadable_input() -> None:
    result = run_jetdump("--hex", "01 zz")
    assert result.returncode == 1
    assert "not hexadecimal" in result.stderr


def test_pcap_and_pcapng_give_the_same_frames(tmp_path: Path, capture: Path) -> None:
    pcapng = tmp_path / "conversation.pcapng"
    write_conversation(pcapng, pcapng=True)
    a = run_jetdump(str(capture), "--no-notes")
    b = run_jetdump(str(pcapng), "--no-notes")
    assert a.returncode == b.returncode == 0

    def untimed(text: str) -> list[str]:
        return [line.split(None, 2)[2] for line in lines(text)]

    # pcap stores microseconds, pcapng here nanoseconds: only the time column differs.
    assert untimed(a.stdout) == untimed(b.stdout)
    out = lines(a.stdout)
    assert len(out) == len(CONVERSATION)
    assert "10.0.0.2:11124 → 10.0.0.1:50000" in out[0] and 'INFO "jetd"' in out[0]
    # The response shows the request it answers and the round trip (1 ms per packet here).
    assert re.search(r'RESPONSE id=5 NOT_FOUND "no such state"  \[answers #15 GET_STATE, 1\.000 ms\]', a.stdout)


def test_port_option_selects_streams(tmp_path: Path) -> None:
    path = tmp_path / "port.pcap"
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f), CLIENT, ("10.0.0.2", 7000))
        session.handshake()
        session.send(0, SET)  # client first, no INFO: a plausible frame makes it jet
        session.close()
    assert "SET_STATE" in run_jetdump(str(path)).stdout
    assert lines(run_jetdump(str(path), "--no-heuristic").stdout) == []
    assert "SET_STATE" in run_jetdump(str(path), "--no-heuristic", "--port", "7000").stdout


def test_missing_and_unrecognised_inputs_exit_non_zero(tmp_path: Path, capture: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not a capture\n")
    missing = run_jetdump(str(tmp_path / "nope.pcap"))
    assert missing.returncode == 1 and "no such file" in missing.stderr
    unrecognised = run_jetdump(str(text))
    assert unrecognised.returncode == 1 and "not a pcap/pcapng capture or jet event log" in unrecognised.stderr
    # A readable input next to an unreadable one is still shown; the status says something failed.
    mixed = run_jetdump(str(capture), str(text), "--no-notes")
    assert mixed.returncode == 1 and len(lines(mixed.stdout)) == len(CONVERSATION)
    nothing = run_jetdump()
    assert nothing.returncode == 1 and "no input" in nothing.stderr
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    assert run_jetdump(str(empty_dir)).returncode == 1


@pytest.mark.parametrize("pcapng", [False, True])
def test_truncated_capture_is_reported_not_fatal(tmp_path: Path, pcapng: bool) -> None:
    whole = tmp_path / ("c.pcapng" if pcapng else "c.pcap")
    write_conversation(whole, pcapng=pcapng)
    data = whole.read_bytes()
    cut = tmp_path / ("cut.pcapng" if pcapng else "cut.pcap")
    cut.write_bytes(data[: len(data) * 2 // 3])
    result = run_jetdump(str(cut))
    assert result.returncode == 0, result.stderr
    assert "capture truncated" in result.stdout
    frames = [line for line in lines(result.stdout) if line.split()[0].isdigit()]
    assert 5 < len(frames) < len(CONVERSATION)


def test_gap_inside_a_frame_resumes_at_the_next_frame(tmp_path: Path) -> None:
    path = tmp_path / "gap.pcap"
    big = encode(SetState(1, "k", Value.of("x" * 100)))
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f), CLIENT, SERVER)
        session.handshake()
        session.send(0, SET + big[:30])
        session.skip(0, 40)  # 40 bytes of the big frame never captured
        session.send(0, big[70:] + CHANGE)
        session.close()
    result = run_jetdump(str(path))
    out = lines(result.stdout)
    assert result.returncode == 0
    assert "SET_STATE" in out[0]
    assert "gap: 40 byte(s) missing at stream offset 58" in out[1]
    assert f"TRUNCATED REQUEST: gap in the capture: 30 of {len(big)} bytes present" in out[2]
    assert "FETCH_CHANGE" in out[3]


def test_gap_across_a_frame_boundary_resynchronises_at_the_next_frame(tmp_path: Path) -> None:
    path = tmp_path / "gap2.pcap"
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f), CLIENT, SERVER)
        session.handshake()
        session.send(0, SET + CHANGE[:10])
        session.skip(0, len(CHANGE) - 10 + 3)  # the rest of CHANGE and 3 bytes of the next
        session.send(0, SET[3:] + SET)
        session.send(1, NOT_FOUND, ack=len(SET))  # the other direction is unaffected
        session.close()
    result = run_jetdump(str(path))
    out = lines(result.stdout)
    # The hole stays open until the server acknowledges the bytes after it (its FIN): its
    # response, which acknowledges only the first SET, comes first.
    assert "NOT_FOUND" in out[1]
    assert "gap: 28 byte(s) missing at stream offset 38" in out[2]
    assert "TRUNCATED EVENT: gap in the capture: 10 of 35 bytes present" in out[3]
    skipped = len(SET) - 3
    assert f"decoding resumes at stream offset {38 + 28 + skipped}, the next plausible frame ({skipped} byte(s)" in out[4]
    assert 'REQUEST id=7 SET_STATE key="a/b"' in out[5]
    # NOT_FOUND answered the first SET id=7; the one after the gap has no answer.
    assert "frame #4: request id 7 was never answered" in out[6]
    assert len(out) == 7


def test_gap_notes_carry_the_time_of_the_loss(tmp_path: Path) -> None:
    """A hole 10 s into the capture, which goes on until 100 s: the gap and the frame it
    cut are reported at 10 s, not at the end."""
    path = tmp_path / "gap3.pcap"
    big = encode(SetState(1, "k", Value.of("x" * 100)))
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f), CLIENT, SERVER, ts=1000.0)
        session.handshake()
        session.send(0, SET + big[:30], dt=1)
        session.skip(0, 200)  # the rest of big and more: the boundary is lost
        session.send(0, SET, dt=9)  # held behind the hole from t=1010
        session.send(1, NOT_FOUND, dt=90)
        session.close()
    objs = jetdump_json(str(path))
    gap = next(o for o in objs if o.get("note") == "gap")
    truncated = next(o for o in objs if o.get("kind") == "truncated")
    assert gap["timestamp"] == pytest.approx(1010.0003, abs=1e-3)
    assert truncated["timestamp"] == pytest.approx(1010.0003, abs=1e-3)
    assert any(o.get("note") == "resync" for o in objs)


def test_a_client_first_stream_that_is_not_jet_is_skipped_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "http.pcap"
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f), CLIENT, ("10.0.0.2", 8080))
        session.handshake()
        session.send(0, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        session.send(1, b"HTTP/1.1 200 OK\r\n\r\n")
        session.close()
    out = lines(run_jetdump(str(path)).stdout)
    assert len(out) == 1
    assert "stream 0 10.0.0.1:50000 ↔ 10.0.0.2:8080 skipped: neither direction starts with an INFO" in out[0]
    assert "47 45 54 20" in out[0]


def test_longer_info_of_a_later_minor_version_still_marks_a_stream(tmp_path: Path) -> None:
    """Protocol 1.1 may add fields after INFO's name: the heuristic still takes the stream."""
    info = encode(Info("jetd"))
    longer = bytes([info[0]]) + (int.from_bytes(info[1:5], "big") + 6).to_bytes(4, "big") + info[5:] + b"\x00" * 6
    path = tmp_path / "info11.pcap"
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f), CLIENT, ("10.0.0.2", 7001))
        session.handshake()
        session.send(1, longer)
        session.send(0, SET)
        session.close()
    out = lines(run_jetdump(str(path), "--no-notes").stdout)
    assert "SET_STATE" in out[-1]


def test_fatal_header_error_stops_only_that_direction(tmp_path: Path) -> None:
    raw = tmp_path / "fatal.bin"
    raw.write_bytes(SET + b"\x09\x00\x00\x00\x01\xff" + SET)
    out = lines(run_jetdump("--raw", str(raw)).stdout)
    assert "MALFORMED 0x09: unknown frame type 0x09" in out[1]
    assert "decoding of this direction stopped at stream offset 28" in out[2]
    assert len(out) == 3
    oversized = run_jetdump("--max-body", "16", "--raw", str(raw))
    assert "exceeds the maximum of 16" in oversized.stdout


def test_bad_event_body_resumes_at_next_frame() -> None:
    bad_event = bytes.fromhex("03 0000000d 03 0001 6b 01 00000001 07 000000")
    result = run_jetdump("--hex", (bad_event + SET).hex())
    out = lines(result.stdout)
    assert "MALFORMED EVENT" in out[0]
    assert "SET_STATE" in out[1]


# --- outputs ----------------------------------------------------------------------------


def test_verbose_tree_offsets_come_from_the_schema() -> None:
    result = run_jetdump("-V", "--hex", SET.hex())
    tree = [line for line in result.stdout.splitlines() if line.startswith("    [")]
    fields, error = dissect(SET)
    assert error is None
    assert len(tree) == len(fields)
    for line, field in zip(tree, fields, strict=True):
        assert re.match(rf"\s+\[\s*{field.offset} \+{field.length}\s*\] {field.name}: ", line), line
    assert "value: 42  (00 00 00 00 00 00 00 2a)" in result.stdout


def test_hexdump_beside_the_tree() -> None:
    result = run_jetdump("-x", "--hex", SET.hex())
    assert "    0000  01 00 00 00 17 00 00 00  07 03 00 03 61 2f 62 02   ............a/b." in result.stdout
    assert "    0010  00 00 00 08 00 00 00 00  00 00 00 2a" in result.stdout


def test_json_fields_and_documented_names(capture: Path) -> None:
    objs = jetdump_json(str(capture))
    frames = jet_frames(objs)
    assert len(frames) == len(CONVERSATION)
    doc = package.__doc__ or ""
    for obj in objs:
        for name in obj:
            assert re.search(rf"\b{re.escape(name)}\b", doc), f"JSON field {name} is not documented"
    set_state = next(f for f in frames if f.get("function") == "SET_STATE" and f["type"] == "REQUEST")
    assert set_state["key"] == "plant/temp" and set_state["value_type"] == "FLOAT64" and set_state["value"] == 22.5
    assert set_state["offsets"]["key"] == [12, 10]
    assert set_state["src"] == "10.0.0.1:50000" and set_state["stream"] == 0
    call = next(f for f in frames if f.get("function") == "CALL_METHOD")
    assert call["value"] == [1, 2]
    cbor = next(f for f in frames if f.get("key") == "plant/cbor")
    assert "value" not in cbor and cbor["value_hex"] == "a1616101"
    answered = next(f for f in frames if f["type"] == "RESPONSE" and f["id"] == 5)
    assert answered["request"] == {"frame": 15, "function": "GET_STATE", "key": "plant/missing"}
    assert answered["rtt_ms"] == pytest.approx(1.0, abs=1e-3)
    # Relative times count from the capture's first packet (the SYN), as Wireshark's do.
    assert frames[0]["time"] == pytest.approx(0.0012, abs=1e-6)
    assert frames[1]["time"] - frames[0]["time"] == pytest.approx(0.001, abs=1e-6)


def test_json_of_problem_frames(tmp_path: Path) -> None:
    objs = jetdump_json("--hex", (BAD_FUNCTION + CLOSE[:9]).hex())
    bad, truncated = objs
    assert bad["kind"] == "malformed" and bad["error"] == "unknown function 0x77"
    assert bad["bytes"] == BAD_FUNCTION.hex() and bad["id"] == 9
    assert truncated["kind"] == "truncated" and truncated["announced"] == 22 and truncated["size"] == 9


def expected_frames(keep: Callable[[str, Optional[str], Optional[str], Optional[str], Optional[str]], bool]) -> set[int]:
    """Frame numbers of CONVERSATION that ``keep(type, function, status, key)`` selects,
    computed from the messages themselves (responses inherit their request's function
    and key)."""
    pending: dict[tuple[int, int], tuple[str, Optional[str]]] = {}
    selected = set()
    for number, (direction, message) in enumerate(CONVERSATION, 1):
        key = getattr(message, "key", None)
        status = None
        if isinstance(message, Info):
            ftype, function = "INFO", None
        elif isinstance(message, Response):
            ftype, status = "RESPONSE", message.status.name
            function, key = pending.pop((1 - direction, message.id), (None, None))
        elif isinstance(message, Request):
            ftype = "REQUEST" if message.id is not None else "EVENT"
            function = message.function.name
            if message.id is not None:
                pending[(direction, message.id)] = (function, key)
        elif isinstance(message, Close):
            ftype, function, status = "EVENT", "CLOSE", message.status.name
        else:
            ftype, function = "EVENT", message.code.name  # type: ignore[attr-defined]
        if keep(ftype, function, status, key, None):
            selected.add(number)
    return selected


@pytest.mark.parametrize(
    ("option", "keep"),
    [
        (["--key", "plant/te"], lambda t, f, s, k, _: bool(k and k.startswith("plant/te"))),
        (["--function", "get_state"], lambda t, f, s, k, _: f == "GET_STATE"),
        (["--type", "EVENT"], lambda t, f, s, k, _: t == "EVENT"),
        (["--type", "INFO"], lambda t, f, s, k, _: t == "INFO"),
        (["--status", "REJECTED"], lambda t, f, s, k, _: s == "REJECTED"),
        (["--function", "FETCH_CHANGE"], lambda t, f, s, k, _: f == "FETCH_CHANGE"),
        (["--function", "SET_STATE", "--type", "RESPONSE"], lambda t, f, s, k, _: f == "SET_STATE" and t == "RESPONSE"),
    ],
)
def test_filters(capture: Path, option: list[str], keep: Callable[..., bool]) -> None:
    frames = jet_frames(jetdump_json(str(capture), *option))
    expected = expected_frames(keep)
    assert expected
    assert {f["frame"] for f in frames} == expected


def test_stream_filter_and_stream_numbers(tmp_path: Path) -> None:
    path = tmp_path / "two.pcap"
    with open(path, "wb") as f:
        writer = CaptureWriter(f)
        first = TcpSession(writer, CLIENT, SERVER)
        second = TcpSession(writer, ("10.0.0.3", 50001), SERVER, ts=1_700_000_000.5)
        first.handshake()
        second.handshake()
        first.send(0, SET)
        second.send(0, encode(GetState(1, "other")))
        first.close()
        second.close()
    frames = jet_frames(jetdump_json(str(path), "--stream", "1"))
    assert [f.get("key") for f in frames] == ["other"]
    assert frames[0]["stream"] == 1


def test_unknown_filter_name_is_a_usage_error(capture: Path) -> None:
    result = run_jetdump(str(capture), "--function", "FROB")
    assert result.returncode == 2 and "not one of" in result.stderr


def test_stats(capture: Path) -> None:
    types = Counter(
        "INFO" if isinstance(m, Info) else "RESPONSE" if isinstance(m, Response)
        else "REQUEST" if isinstance(m, Request) and m.id is not None else "EVENT"
        for _, m in CONVERSATION
    )
    text = run_jetdump("--stats", str(capture))
    assert text.returncode == 0
    assert re.search(rf"REQUEST\s+{types['REQUEST']}\n", text.stdout)
    assert "request/response latency (ms), as the requester sees it:" in text.stdout
    report = json.loads(run_jetdump("--stats", "--json", str(capture)).stdout)
    assert report["frames"] == len(CONVERSATION)
    assert report["types"] == dict(types)
    # The daemon's SET_STATE id=900 to this peer (the owner) and its answer are the legs
    # of a routed request: counted apart, not as the peer's own requests.
    statuses = Counter(m.status.name for d, m in CONVERSATION if isinstance(m, (Response, Close)) and d == 1)
    assert report["statuses"] == dict(statuses)
    assert report["legs"]["functions"] == {"SET_STATE": 2} and report["legs"]["statuses"] == {"OK": 1}
    assert report["legs"]["latency_ms"]["SET_STATE"]["count"] == 1
    assert report["functions"]["FETCH_ADD"] == 1 and report["functions"]["GET_STATE"] == 2
    assert report["functions"]["SET_STATE"] == 3  # the peer's own set (id 3), its answer, a set event
    latency = report["latency_ms"]
    assert latency["GET_STATE"] == pytest.approx({"count": 1, "p50": 1.0, "p90": 1.0, "p99": 1.0, "max": 1.0}, abs=1e-3)
    assert latency["ALL"]["count"] == types["RESPONSE"] - 1
    # Per key and per peer; requests never answered (ids 9-15: no response in CONVERSATION).
    assert report["keys"]["plant/temp"]["requests"] == 3  # ADD_STATE, SET_STATE, NOTIFY_STATE
    assert report["keys"]["plant/reset"]["errors"] == 1  # CALL_METHOD REJECTED
    assert report["peers"]["10.0.0.1:50000"]["requests"] == sum(
        1 for d, m in CONVERSATION if d == 0 and isinstance(m, Request) and m.id is not None)
    unanswered = {u["frame"] for u in report["unanswered"]["first"]}
    assert report["unanswered"]["count"] == len(unanswered) == 7
    assert "unanswered requests: 7" in text.stdout and "keys (top 20" in text.stdout
    assert sum(s["bytes"] for s in report["streams"]) == sum(len(encode(m)) for _, m in CONVERSATION)


def test_colour_only_when_asked_or_on_a_terminal(capture: Path) -> None:
    plain = run_jetdump(str(capture))
    assert "\x1b[" not in plain.stdout
    coloured = run_jetdump("--color", "always", str(capture))
    assert "\x1b[" in coloured.stdout
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured.stdout) == plain.stdout


def test_control_characters_never_reach_the_terminal() -> None:
    nasty = encode(SetState(1, "evil\x1b[2Jkey", Value.of("\x07bell")))
    result = run_jetdump("--hex", nasty.hex())
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert '"evil\\u001b[2Jkey"' in result.stdout


def test_info_summary() -> None:
    result = run_jetdump("--hex", encode(Info("jetd", features=1)).hex())
    assert 'INFO "jetd" v1.3 max_body=1048576 features=0x00000001' in result.stdout  # protocol 1.3
    limits = run_jetdump("--hex", encode(Info("jetd", features=8, max_key_length=300, route_timeout_ms=2500)).hex())
    assert "features=0x00000008 max_key_length=300 route_timeout_ms=2500" in limits.stdout  # PROTOCOL.md 4.4.1


def test_json_fast_path_equals_the_schema_path(capture: Path) -> None:
    """--json takes values from the fast codec and offsets from a per-shape cache of the
    schema's dissection; on every frame it must equal dissecting that frame."""
    from tools.jetdump.dissector import Dissector
    from tools.jetdump.dissector import FrameRecord
    from tools.jetdump.render import fast_frame_fields
    from tools.jetdump.render import frame_fields

    dissector = Dissector(keep_raw=True)
    data = b"".join(encode(m) for _, m in CONVERSATION)
    for size in (len(data), 7):  # whole, and in small chunks (different record timing)
        for start in range(0, len(data), size):
            dissector.data(0, 0, None, data[start : start + size])
    records = [r for r in dissector.out if isinstance(r, FrameRecord)]
    assert len(records) == 2 * len(CONVERSATION)
    for record in records:
        assert fast_frame_fields(record) == frame_fields(record), record.message


def test_several_captures_number_their_streams_apart(tmp_path: Path, capture: Path) -> None:
    second = tmp_path / "second.pcapng"
    write_conversation(second, pcapng=True)
    frames = jet_frames(jetdump_json(str(capture), str(second)))
    assert len(frames) == 2 * len(CONVERSATION)
    assert [f["stream"] for f in frames] == [0] * len(CONVERSATION) + [1] * len(CONVERSATION)
    assert [f["frame"] for f in frames] == list(range(1, 2 * len(CONVERSATION) + 1))


def test_authenticate_is_shown_with_its_password_masked() -> None:
    """PROTOCOL.md 6.12: jetdump decodes AUTHENTICATE but never shows the password."""
    from jetwire import Authenticate

    frame = encode(Authenticate(11, "alice", "s3cr3t"))
    result = run_jetdump("--hex", frame.hex())
    assert 'REQUEST id=11 AUTHENTICATE user="alice" password=********' in result.stdout
    assert "s3cr3t" not in result.stdout
    objs = jetdump_json("--hex", frame.hex())
    shown = json.dumps(objs)
    assert "s3cr3t" not in shown
    fields = next(o for o in objs if o.get("function") == "AUTHENTICATE")
    assert fields["user"] == "alice" and fields["password"] == "********" and fields["password_length"] == 6


def test_frames_show_the_capture_packet_number(tmp_path: Path) -> None:
    """Packets 1-3 are the handshake; a frame split over two packets is shown with the
    packet that completes it (as Wireshark shows a reassembled PDU)."""
    path = tmp_path / "packets.pcap"
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f), CLIENT, SERVER)
        session.handshake()
        session.send(0, SET)  # packet 4
        session.send(0, CHANGE[:7])  # packet 5
        session.send(0, CHANGE[7:] + SET)  # packet 6
        session.close()
    frames = jet_frames(jetdump_json(str(path)))
    assert [f["packet"] for f in frames] == [4, 6, 6]
    out = lines(run_jetdump(str(path)).stdout)
    assert "pkt 4 " in out[0] and "pkt 6 " in out[1]
