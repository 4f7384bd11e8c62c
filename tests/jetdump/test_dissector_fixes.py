"""jet.lua defects from issue 18, each reproduced with real tshark: the INFO version is
checked, state is keyed by TCP stream (a reused 4-tuple decodes), and the Info column
does not double when tshark dissects twice (-2)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from jdhelpers import LUA
from jdhelpers import TSHARK

from jetwire import GetState
from jetwire import Info
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import encode
from tools.jetdump.synth import CaptureWriter
from tools.jetdump.synth import TcpSession

pytestmark = [pytest.mark.tshark, pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")]
CLIENT = ("127.0.0.1", 40001)
SERVER = ("127.0.0.1", 11124)


@contextlib.contextmanager
def session_capture(capture: Path) -> Iterator[TcpSession]:
    """A pcap at ``capture`` with one TCP connection from CLIENT to SERVER: handshake
    done on entry, closed (FIN) on exit."""
    with open(capture, "wb") as f:
        session = TcpSession(CaptureWriter(f), CLIENT, SERVER)
        session.handshake()
        yield session
        session.close()


def tshark_fields(capture: Path, *fields: str, extra: tuple[str, ...] = ()) -> list[list[str]]:
    assert TSHARK is not None
    args = [str(TSHARK), *extra, "-X", f"lua_script:{LUA}", "-r", str(capture), "-T", "fields", "-E", "occurrence=a"]
    for name in fields:
        args += ["-e", name]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Lua" not in result.stderr, result.stderr
    return [line.split("\t") for line in result.stdout.splitlines()]


def test_info_of_another_major_version_is_malformed(tmp_path: Path) -> None:
    info2 = bytearray(encode(Info("jetd", features=1)))
    info2[5] = 2  # major 2 (PROTOCOL.md 2: fatal)
    capture = tmp_path / "major2.pcap"
    with session_capture(capture) as session:
        session.send(1, bytes(encode(Info("jetd", features=1))))
        session.send(1, bytes(info2))
    rows = [row for row in tshark_fields(capture, "frame.number", "jet.malformed", "_ws.col.Info") if row[1] or "INFO" in row[2]]
    assert len(rows) == 2, rows
    assert rows[0][1] == "" and rows[1][1] != ""
    assert "major" in rows[1][1] and "MALFORMED" in rows[1][2]


def test_a_reused_four_tuple_decodes_again(tmp_path: Path) -> None:
    """The first connection loses its frame boundary; the second, on the same addresses
    and ports, is another TCP stream and decodes from its start."""
    capture = tmp_path / "reused.pcap"
    with open(capture, "wb") as f:
        writer = CaptureWriter(f)
        first = TcpSession(writer, CLIENT, SERVER)
        first.handshake()
        first.send(1, encode(Info("jetd", features=1)))
        first.send(0, b"\x09\x00\x00\x00\x01\xff")  # unknown frame type: boundary lost
        first.close()
        second = TcpSession(writer, CLIENT, SERVER, isn=(90_000, 70_000), ts=first.tick(1.0))
        second.handshake()
        second.send(1, encode(Info("jetd", features=1)))
        second.send(0, encode(GetState(7, "plant/temp")))
        second.send(1, encode(Response(7, Status.NOT_FOUND, message="no such state")))
        second.close()
    rows = tshark_fields(capture, "tcp.stream", "jet.type", "jet.id", "_ws.col.Info")
    second_stream = [row for row in rows if row[0] == "1" and row[1]]
    assert [row[1] for row in second_stream] == ["4", "1", "2"], rows
    assert not any("lost frame boundary" in row[3] for row in rows if row[0] == "1"), rows


def test_info_column_is_not_doubled_by_two_passes(tmp_path: Path) -> None:
    capture = tmp_path / "two-pass.pcap"
    with session_capture(capture) as session:
        # One jet packet only: the last one pass 1 saw is the first one pass 2 sees.
        session.send(0, encode(SetState(1, "a", Value.of(1))) + encode(SetState(2, "b", Value.of(2))))
    one = tshark_fields(capture, "frame.number", "_ws.col.Info")
    two = tshark_fields(capture, "frame.number", "_ws.col.Info", extra=("-2",))
    assert one == two
    both = [row[1] for row in two if "SET_STATE" in row[1]]
    assert len(both) == 1 and both[0].count("SET_STATE") == 2, two


def test_response_time_is_jet_time_in_seconds(tmp_path: Path) -> None:
    """As dns.time and http.time: `jet.time`, a relative time, next to jet.rtt_ms."""
    capture = tmp_path / "rtt.pcap"
    with session_capture(capture) as session:
        session.send(1, encode(Info("jetd", features=3)))
        session.send(0, encode(GetState(3, "k")))
        session.tick(0.25)
        session.send(1, encode(Response(3, Status.NOT_FOUND, message="no such state")))
    rows = [row for row in tshark_fields(capture, "jet.time", "jet.rtt_ms") if row[0]]
    assert len(rows) == 1, rows
    assert abs(float(rows[0][0]) - float(rows[0][1]) / 1000) < 1e-6 and float(rows[0][0]) > 0.25
    assert rows == [row for row in tshark_fields(capture, "jet.time", "jet.rtt_ms", extra=("-Y", "jet.time > 0.2")) if row[0]]


def test_colouring_rules_are_valid_display_filters(tmp_path: Path) -> None:
    """Every rule of tools/wireshark/jet.colorfilters is a display filter that tshark (with
    jet.lua loaded) accepts, in the @name@filter@[bg][fg] format of Wireshark's files."""
    rules = LUA.with_name("jet.colorfilters").read_text().splitlines()
    rules = [line for line in rules if line.startswith("@")]
    assert len(rules) >= 5
    capture = tmp_path / "colours.pcap"
    with session_capture(capture) as session:
        session.send(1, encode(Info("jetd", features=3)))
        session.send(0, encode(GetState(3, "k")))
        session.send(1, encode(Response(3, Status.NOT_FOUND, message="no such state")))
    matched = {}
    for rule in rules:
        _, name, expression, colours = rule.split("@")
        assert colours.count("[") == 2, rule
        rows = tshark_fields(capture, "frame.number", extra=("-Y", expression))
        matched[name] = len(rows)
    assert matched["jet error response"] == 1 and matched["jet INFO"] == 1 and matched["jet"] == 3, matched


def test_srt_and_tree_statistics(tmp_path: Path) -> None:
    """`tshark -z jet,srt` (service response time per function) and `-z jet,tree`."""
    capture = tmp_path / "stats.pcap"
    with session_capture(capture) as session:
        session.send(1, encode(Info("jetd", features=3)))
        for rid, delay in ((1, 0.1), (2, 0.2)):
            session.send(0, encode(GetState(rid, "k")))
            session.tick(delay)
            session.send(1, encode(Response(rid, Status.NOT_FOUND, message="no such state")))
        session.send(0, encode(SetState(3, "k", Value.of(1))))
        session.tick(0.3)
        session.send(1, encode(Response(3, Status.OK, Value.of(1))))
    assert TSHARK is not None
    result = subprocess.run(
        [str(TSHARK), "-q", "-X", f"lua_script:{LUA}", "-z", "jet,srt", "-z", "jet,tree", "-r", str(capture)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0 and "Lua" not in result.stderr, result.stderr
    # srt rows: name, calls, min, max, avg, sum (seconds); tree rows: name, count, percent.
    srt = [row for row in result.stdout.splitlines() if row.startswith(("GET_STATE ", "SET_STATE "))]
    assert len(srt) == 2, result.stdout
    get, set_ = (row.split() for row in srt)
    assert get[1] == "2" and abs(float(get[2]) - 0.1) < 0.01 and abs(float(get[3]) - 0.2) < 0.01
    assert set_[1] == "1" and abs(float(set_[4]) - 0.3) < 0.01
    tree = {row.split()[0]: row.split()[1] for row in result.stdout.splitlines() if row.startswith("  ")}
    assert tree["REQUEST"] == "3" and tree["RESPONSE"] == "3" and tree["NOT_FOUND"] == "2" and tree["INFO"] == "1"


def test_every_truncated_body_is_malformed_never_a_lua_error(tmp_path: Path) -> None:
    """Bodies cut at every length (REQUEST under 4 bytes, RESPONSE under 5, a cut fetch
    id, ...): the dissection tree (-V), not only stderr, shows no Lua error, and each
    frame agrees with jetdump (decoded, or malformed in both)."""
    from test_jetdump_tshark import assert_agree

    from jetwire import FetchStates

    whole = [
        encode(GetState(1, "plant/temp")),
        encode(SetState(2, "k", Value.of(1.5))),
        encode(Response(3, Status.OK, Value.of(1))),
        encode(Response(4, Status.OK, fetch_id=7)),
        encode(FetchStates(5, "p/")),
    ]
    capture = tmp_path / "short.pcap"
    with session_capture(capture) as session:
        session.send(1, encode(Info("jetd", features=3)))
        for n, frame in enumerate(whole):
            for cut in range(5, len(frame)):
                body = frame[5:cut]
                session.send(n % 2, frame[:1] + len(body).to_bytes(4, "big") + body)
    assert TSHARK is not None
    tree = subprocess.run([str(TSHARK), "-V", "-X", f"lua_script:{LUA}", "-r", str(capture)],
                          capture_output=True, text=True, timeout=60)
    assert tree.returncode == 0
    assert "lua error" not in (tree.stdout + tree.stderr).lower()
    frames = assert_agree(capture)
    assert sum(frame["kind"] != "frame" for frame in frames) >= 40


def test_protocol_violations_are_expert_warnings(tmp_path: Path) -> None:
    """As jetdump flags them: a duplicate pending request id, a body above the receiver's
    announced max_body, and a fetch event sent by a peer (jet.violation, WARN)."""
    from jetwire import FetchAdd

    capture = tmp_path / "violations.pcap"
    with session_capture(capture) as session:
        session.send(1, encode(Info("jetd", features=3)))
        session.send(0, encode(Info("small-peer", max_body=64)))
        session.send(0, encode(GetState(1, "k")))
        session.send(0, encode(GetState(1, "k")))  # id 1 is still pending
        session.send(1, encode(Response(1, Status.NOT_FOUND, message="no such state")))
        session.send(1, encode(Response(1, Status.NOT_FOUND, message="no such state")))
        session.send(1, encode(SetState(9, "k", Value.of("x" * 100))))  # above the peer's 64
        session.send(0, encode(Response(9, Status.OK)))
        session.send(0, encode(FetchAdd(3, "k", Value.of(1))))  # only the daemon sends these
    rows = tshark_fields(capture, "frame.number", "_ws.expert.message", extra=("-Y", "jet.violation"))
    texts = " | ".join(row[1] for row in rows)
    assert "duplicate request id 1" in texts, rows
    assert "above the receiver's announced max_body 64" in texts, rows
    assert "a peer sent FETCH_ADD" in texts, rows
    assert len(rows) == 3, rows
    # The same with two passes: found once, shown once.
    two = tshark_fields(capture, "frame.number", "_ws.expert.message", extra=("-2", "-Y", "jet.violation"))
    assert two == rows


def test_structured_values_go_to_wiresharks_own_dissectors(tmp_path: Path) -> None:
    """JSON, CBOR and MessagePack values are dissected by Wireshark's json, cbor and
    msgpack dissectors (their fields filter jet values); the columns stay jet's, and a
    JSON value that does not parse is no Lua error."""
    import cbor2
    import msgpack

    from jetwire import ValueType

    values = [
        Value(ValueType.JSON, b'{"temp": 21.5, "unit": "C"}'),
        Value(ValueType.CBOR, cbor2.dumps({"temp": 42})),
        Value(ValueType.MSGPACK, msgpack.packb({"unit": "K"})),
        Value(ValueType.JSON, b'{"broken": '),
    ]
    capture = tmp_path / "structured.pcap"
    with session_capture(capture) as session:
        session.send(0, encode(Info("peer")))
        session.send(1, encode(Info("jetd", features=1)))
        for i, value in enumerate(values):
            session.send(0, encode(SetState(i + 1, f"plant/v{i}", value)))
    rows = tshark_fields(capture, "jet.id", "json.value.number", "cbor.type.uint", "msgpack.string",
                         "_ws.col.Protocol", "_ws.col.Info")
    by_id = {row[0]: row for row in rows if row[0]}
    assert by_id["1"][1] == "21.5"
    assert by_id["2"][2] == "42"
    assert "unit" in by_id["3"][3] and "K" in by_id["3"][3]
    assert "4" in by_id  # the broken JSON: shown, no Lua error (tshark_fields checks stderr)
    for row in by_id.values():
        assert row[4] == "JET" and "SET_STATE" in row[5], row


def test_unsolicited_late_and_unanswered_are_violations(tmp_path: Path) -> None:
    """An answer nobody asked for, an owner's answer after the daemon's announced route
    timeout (the requester got TIMEOUT), and, with two passes (-2), a request that is
    never answered in the capture."""
    from jetwire import FEATURE_LIMITS
    from jetwire import CallMethod

    owner_addr = ("127.0.0.1", 40002)
    capture = tmp_path / "late.pcap"
    with open(capture, "wb") as f:
        writer = CaptureWriter(f)
        client = TcpSession(writer, CLIENT, SERVER)
        owner = TcpSession(writer, owner_addr, SERVER)
        for session in (client, owner):
            session.handshake()
        client.send(0, encode(Info("client")))
        client.send(1, encode(Info("jetd", features=1)))
        owner.send(0, encode(Info("owner", features=FEATURE_LIMITS)))
        owner.send(1, encode(Info("jetd", features=1)))
        owner.send(1, encode(Info("jetd", features=1 | FEATURE_LIMITS, max_key_length=1024, route_timeout_ms=500)))
        client.send(0, encode(CallMethod(7, "svc", Value.of(1))))
        owner.send(1, encode(CallMethod(1, "svc", Value.of(1))))  # routed to the owner
        client.ts = owner.ts = client.ts + 0.6
        client.send(1, encode(Response(7, Status.TIMEOUT, message="the owner did not answer within 500 ms")))
        owner.send(0, encode(Response(1, Status.OK, Value.of(2))))  # late
        client.send(1, encode(Response(8, Status.OK)))  # unsolicited: the client asked nothing with id 8
        client.send(0, encode(GetState(9, "k")))  # never answered
        client.close()
        owner.close()
    one = " | ".join(row[1] for row in tshark_fields(capture, "frame.number", "_ws.expert.message",
                                                       extra=("-Y", "jet.violation")))
    assert "late answer" in one and "route timeout of 500 ms" in one, one
    assert "unsolicited response: no request 8" in one, one
    assert "never answered" not in one  # one pass cannot know
    two = " | ".join(row[1] for row in tshark_fields(capture, "frame.number", "_ws.expert.message",
                                                       extra=("-2", "-Y", "jet.violation")))
    assert "request 9 never answered in this capture" in two, two
    assert two.count("never answered") == 1, two


def test_field_titles_say_what_they_are() -> None:
    """Issue 18: a title names its field without the tree around it (not a bare "Key",
    "Index" or "Action"), and no two fields share a title."""
    assert TSHARK is not None
    result = subprocess.run([str(TSHARK), "-G", "fields", "-X", f"lua_script:{LUA}"],
                            capture_output=True, text=True, timeout=60)
    fields = [line.split("\t") for line in result.stdout.splitlines() if line.startswith("F\t")]
    titles = {row[2]: row[1] for row in fields if row[2].startswith("jet.")}
    assert len(titles) > 60, titles
    vague = {"Key", "Prefix", "Field", "Index", "Action", "Operand", "User", "Message", "Status",
             "Function", "Malformed", "Truncated", "Window size", "Entry count", "Value filter", "Window from"}
    assert not [name for name, title in titles.items() if title in vague or title.isupper()], titles
    assert len(set(titles.values())) == len(titles), titles
