"""tshark with tools/wireshark/jet.lua and jetdump --json must agree field by field on
every frame: synthetic captures with segmentation, retransmissions, overlaps and
out-of-order segments, a heuristic (non-default port) stream, and a real jetd session
captured on loopback."""

from __future__ import annotations

import random
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jdhelpers import CONVERSATION
from jdhelpers import LUA
from jdhelpers import TSHARK
from jdhelpers import jet_frames
from jdhelpers import jetdump_json
from jdhelpers import loopback_capture
from jdhelpers import normalise_jetdump
from jdhelpers import tshark_pdus

from jetwire import AddState
from jetwire import Decoder
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Info
from jetwire import Message
from jetwire import Request
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


def bursts(conversation: list[tuple[int, Message]]) -> list[tuple[int, bytes]]:
    """Consecutive frames of one direction joined into one burst of bytes."""
    out: list[tuple[int, bytes]] = []
    for direction, message in conversation:
        frame = encode(message)
        if out and out[-1][0] == direction:
            out[-1] = (direction, out[-1][1] + frame)
        else:
            out.append((direction, frame))
    return out


def chunks(data: bytes, sizes: list[int]) -> list[bytes]:
    out, pos, i = [], 0, 0
    while pos < len(data):
        size = sizes[i % len(sizes)]
        out.append(data[pos : pos + size])
        pos += size
        i += 1
    return out


def write_segmented(path: Path, *, pcapng: bool = False, server: tuple[str, int] = SERVER) -> None:
    """Frames split across segments (down to 1 byte) and several frames per segment."""
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f, pcapng=pcapng), CLIENT, server)
        session.handshake()
        for i, (direction, data) in enumerate(bursts(CONVERSATION)):
            # The daemon's INFO arrives whole, as from a real daemon: Wireshark's
            # heuristic looks at one segment at a time.
            sizes = [len(data)] if i == 0 else [1, 4, 60, 3, 200, 17, 2]
            for piece in chunks(data, sizes):
                session.send(direction, piece)
        session.close()


def write_damaged_order(path: Path) -> None:
    """Retransmissions, overlaps and out-of-order segments in both directions."""
    rng = random.Random(5)
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f), CLIENT, SERVER)
        session.handshake()
        for direction, data in bursts(CONVERSATION):
            pieces = chunks(data, [9, 30, 5, 70, 13])
            start = session.next[direction] - session.isn[direction] - 1
            offsets = []
            pos = start
            for piece in pieces:
                offsets.append(pos)
                pos += len(piece)
            order = list(range(len(pieces)))
            for i in range(0, len(order) - 1, 3):
                order[i], order[i + 1] = order[i + 1], order[i]  # out of order
            for i in order:
                session.send(direction, pieces[i], at=offsets[i], advance=False)
                if rng.random() < 0.3:
                    session.send(direction, pieces[i], at=offsets[i], advance=False)  # retransmission
                if rng.random() < 0.2 and i + 1 < len(pieces):
                    # overlap: the tail of this piece and the head of the next one
                    tail = pieces[i][len(pieces[i]) // 2 :] + pieces[i + 1][:3]
                    session.send(direction, tail, at=offsets[i] + len(pieces[i]) // 2, advance=False)
            session.next[direction] = session.isn[direction] + 1 + pos
        session.close()


def assert_agree(capture: Path, *jetdump_args: str, tshark_args: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Compare every frame: fields, stream, timestamp, response matching."""
    pdus = tshark_pdus(capture, *tshark_args)
    frames = jet_frames(jetdump_json(str(capture), *jetdump_args))
    assert len(frames) == len(pdus) > 0, (len(frames), len(pdus))
    by_number = {frame["frame"]: i for i, frame in enumerate(frames)}
    for pdu, frame in zip(pdus, frames, strict=True):
        assert pdu["stream"] == frame["stream"]
        assert pdu["timestamp"] == pytest.approx(frame["timestamp"], abs=2e-6)
        assert pdu["time"] == pytest.approx(frame["time"], abs=2e-6)
        got = {k: v for k, v in pdu["fields"].items() if k not in ("kind", "error", "response_to", "rtt_ms", "time", "request_function")}
        if frame["kind"] == "frame":
            assert "kind" not in pdu["fields"], (pdu, frame)
            assert got == normalise_jetdump(frame), (pdu, frame)
        else:
            assert pdu["fields"].get("kind") in ("malformed", "truncated"), (pdu, frame)
            for name in ("type", "length", "id"):
                if name in got:
                    assert got[name] == normalise_jetdump(frame).get(name), (name, pdu, frame)
        if "request" in frame:
            request_pdu = pdus[by_number[frame["request"]["frame"]]]
            assert pdu["fields"]["response_to"] == request_pdu["packet"]
            assert pdu["fields"]["rtt_ms"] == pytest.approx(frame["rtt_ms"], abs=1e-3)
        else:
            assert "response_to" not in pdu["fields"]
    return frames


def test_segmented_pcap_agrees(tmp_path: Path) -> None:
    capture = tmp_path / "segmented.pcap"
    write_segmented(capture)
    frames = assert_agree(capture)
    assert len(frames) == len(CONVERSATION)
    assert all(frame["kind"] == "frame" for frame in frames)
    assert sum("request" in frame for frame in frames) >= 10


def test_segmented_pcapng_agrees(tmp_path: Path) -> None:
    capture = tmp_path / "segmented.pcapng"
    write_segmented(capture, pcapng=True)
    assert len(assert_agree(capture)) == len(CONVERSATION)


def test_retransmissions_and_reordering_agree(tmp_path: Path) -> None:
    capture = tmp_path / "damaged-order.pcap"
    write_damaged_order(capture)
    frames = assert_agree(capture)
    # Every frame exactly once, in order, despite duplicates and reordering.
    assert [f["type"] for f in frames] == [wire_type(m) for _, m in CONVERSATION]
    assert [f.get("key") or f.get("prefix") or f.get("message") or f.get("name") for f in frames] == [
        getattr(m, "key", None) or getattr(m, "prefix", None) or getattr(m, "message", None) or getattr(m, "name", None)
        for _, m in CONVERSATION
    ]


def wire_type(message: Message) -> str:
    if isinstance(message, Info):
        return "INFO"
    if isinstance(message, Response):
        return "RESPONSE"
    if isinstance(message, Request) and message.id is not None:
        return "REQUEST"
    return "EVENT"


def test_heuristic_stream_on_another_port_agrees(tmp_path: Path) -> None:
    capture = tmp_path / "heuristic.pcap"
    write_segmented(capture, server=("127.0.0.1", 40999))
    frames = assert_agree(capture, "--port", "1")
    assert len(frames) == len(CONVERSATION)
    # Without the heuristic, jetdump ignores the stream.
    assert jet_frames(jetdump_json(str(capture), "--port", "1", "--no-heuristic")) == []


def test_malformed_frames_agree(tmp_path: Path) -> None:
    good = encode(SetState(1, "a", Value.of(1)))
    bad = [
        b"\x01\x00\x00\x00\x06\x00\x00\x00\x02\x77\x00",  # unknown function
        b"\x01\x00\x00\x00\x07\x00\x00\x00\x03\x0a\x00\x00",  # empty key
        b"\x03\x00\x00\x00\x0d\x03\x00\x01k\x01\x00\x00\x00\x01\x07\x00\x00\x00",  # bad BOOL + trailing
        b"\x02\x00\x00\x00\x07\x00\x00\x00\x04\x00\x01\x02",  # OK payload of 2 bytes
        b"\x01\x00\x00\x00\x09\x00\x00\x00\x05\x02\x00\x02\xff\xfe",  # key not UTF-8
    ]
    capture = tmp_path / "malformed.pcap"
    with open(capture, "wb") as f:
        session = TcpSession(CaptureWriter(f), CLIENT, SERVER)
        session.handshake()
        session.send(0, good + b"".join(bad[:3]))
        session.send(0, bad[3] + bad[4][:6])
        session.send(0, bad[4][6:] + good)
        session.close()
    frames = assert_agree(capture)
    assert [f["kind"] for f in frames] == ["frame"] + ["malformed"] * 5 + ["frame"]


def _drive_jetd(host: str, port: int) -> int:
    """A short session of raw frames against a real jetd; returns frames received."""
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(encode(Info("capture-test")))
        sock.sendall(encode(AddState(1, "cap/temp", Value.of(20.5))))
        sock.sendall(encode(FetchStates(2, "cap/")) + encode(GetState(3, "cap/temp")))
        sock.sendall(encode(SetState(4, "cap/missing", Value.of(1))))
        # Answer the routed set the daemon sends us for our own state.
        sock.sendall(encode(SetState(5, "cap/temp", Value.of(21.0))))
        decoder = Decoder()
        received = 0
        deadline = time.monotonic() + 5
        answered = set()
        while time.monotonic() < deadline and not {1, 2, 3, 4, 5} <= answered:
            decoder.receive_data(sock.recv(65536))
            for message in decoder.messages():
                received += 1
                if isinstance(message, SetState) and message.id is not None:
                    sock.sendall(encode(Response(message.id, Status.OK, message.value)))
                elif isinstance(message, Response):
                    answered.add(message.id)
    return received


def test_real_jetd_session_captured_on_loopback_agrees(tmp_path: Path, start_jetd: Callable[..., Any]) -> None:
    daemon = start_jetd()
    capture = tmp_path / "live.pcapng"
    with loopback_capture(capture, daemon.port, str(TSHARK)):
        received = _drive_jetd(daemon.host, daemon.port)
        assert received >= 6
    # Both decode by port: under load the capture may start after the first INFO, which
    # the dissector's heuristic (a stream that begins with INFO) would need.
    frames = assert_agree(capture, "--port", str(daemon.port), tshark_args=("-o", f"jet.port:{daemon.port}"))
    summary = [(f["type"], f.get("function") or f.get("code") or f.get("status")) for f in frames]
    assert ("INFO", None) in summary
    assert ("REQUEST", "ADD_STATE") in summary
    assert ("RESPONSE", "NOT_FOUND") in summary
    assert any(f.get("request", {}).get("function") == "SET_STATE" for f in frames)
    # A well-behaved session has no protocol violation (jet.lua's expert warnings), also
    # with two passes (-2: requests never answered).
    for passes in ((), ("-2",)):
        flagged = subprocess.run([str(TSHARK), *passes, "-X", f"lua_script:{LUA}", "-o", f"jet.port:{daemon.port}",
                                  "-r", str(capture), "-Y", "jet.violation"], capture_output=True, text=True, timeout=60)
        assert flagged.returncode == 0 and flagged.stdout.strip() == "", flagged.stdout + flagged.stderr


@pytest.mark.parametrize(
    ("bad", "expert", "reason"),
    [
        (b"\x09\x00\x00\x00\x01\xff", "jet.unknown_type", "unknown frame type 0x09"),
        (b"\x01\x7f\x00\x00\x00" + b"\x00" * 20, "jet.oversized", "exceeds the maximum"),
    ],
)
def test_lost_frame_boundary_agrees(tmp_path: Path, bad: bytes, expert: str, reason: str) -> None:
    """An unknown type or an absurd length loses the frame boundary: both tools report
    the bad frame, decode nothing more in that direction, and go on in the other."""
    good = encode(SetState(1, "a", Value.of(1)))
    capture = tmp_path / "lost.pcap"
    with open(capture, "wb") as f:
        session = TcpSession(CaptureWriter(f), CLIENT, SERVER)
        session.handshake()
        session.send(0, good + bad)
        session.send(0, good)  # after the lost boundary: not framed
        session.send(1, encode(Response(1, Status.OK, Value.of(1))))
        session.close()
    frames = jet_frames(jetdump_json(str(capture), "--max-body", str(64 * 1024 * 1024)))
    assert [(f["direction"], f["kind"]) for f in frames] == [(0, "frame"), (0, "malformed"), (1, "frame")]
    assert reason in frames[1]["error"]
    result = subprocess.run(
        [str(TSHARK), "-o", "tcp.reassemble_out_of_order:TRUE", "-X", f"lua_script:{LUA}", "-r", str(capture),
         "-T", "fields", "-E", "occurrence=a", "-e", "frame.number", "-e", "jet.type", "-e", "jet.malformed",
         "-e", "_ws.expert.message", "-Y", "jet"],
        capture_output=True, text=True, timeout=60,
    )
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert len(rows) == 3, rows
    assert rows[0][1].split(",")[0] == "1" and reason in rows[0][2]  # good frame, then the bad one
    assert "frame boundary was lost" in rows[1][3]
    assert rows[2][1] == "2" and rows[2][2] == ""
    expert_rows = subprocess.run(
        [str(TSHARK), "-X", f"lua_script:{LUA}", "-r", str(capture), "-Y", expert],
        capture_output=True, text=True, timeout=60,
    ).stdout.splitlines()
    assert len(expert_rows) == 1


def test_info_limits_extension_agrees(tmp_path: Path) -> None:
    """PROTOCOL.md 4.4.1: the daemon's second INFO, with its limits, decodes alike in
    jet.lua and jetdump; a short extension is malformed in both."""
    conversation: list[tuple[int, Message]] = [
        (1, Info("jetd", features=0xB)),
        (0, Info("sensor-7", features=0x8)),
        (0, GetState(1, "plant/temp")),
        (1, Info("jetd", features=0xB, max_key_length=1024, route_timeout_ms=5000)),
        (1, Response(1, Status.NOT_FOUND, message="no such state")),
    ]
    capture = tmp_path / "limits.pcap"
    with open(capture, "wb") as f:
        session = TcpSession(CaptureWriter(f), CLIENT, SERVER)
        session.handshake()
        for direction, data in bursts(conversation):
            session.send(direction, data)
        short = encode(Info("jetd", features=0xB))
        short = short[:1] + (len(short) - 5 + 3).to_bytes(4, "big") + short[5:] + b"\x04\x00\x00"
        session.send(1, short)
        session.close()
    frames = assert_agree(capture)
    limits = [frame for frame in frames if frame["kind"] == "frame" and frame.get("max_key_length") is not None]
    assert len(limits) == 1 and limits[0]["route_timeout_ms"] == 5000
    assert frames[-1]["kind"] != "frame"  # the short extension
