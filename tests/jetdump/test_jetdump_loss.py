"""Issue 32: loss in a capture is reported as a gap, never blamed on the peers.

The sequence numbers of a later segment, a FIN or the other side's ACK say how many
bytes were sent that the capture lacks: jetdump reports a gap with its byte count, time
and packet, and no violation that the gap can explain (an unsolicited response whose
request was lost, a request whose answer was lost). Also: packets cut by the snaplen are
said, a frame cut by a gap keeps the packet number of its own stream, and a TLS
handshake on a jet port is said to look like TLS."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jdhelpers import LUA
from jdhelpers import TSHARK
from jdhelpers import jet_frames
from jdhelpers import jetdump_json
from jdhelpers import loopback_capture
from jdhelpers import run_jetdump

from jetwire import AddState
from jetwire import Decoder
from jetwire import GetState
from jetwire import Info
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import encode
from tools.jetdump.synth import CaptureWriter
from tools.jetdump.synth import TcpSession

CLIENT = ("127.0.0.1", 40001)
SERVER = ("127.0.0.1", 11124)
DUMPCAP = shutil.which("dumpcap")
EDITCAP = shutil.which("editcap")
TIMEOUT = 60


def notes(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["record"] == "note" and o["note"] == kind]


def blamed(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Notes that blame a peer: protocol violations and requests never answered."""
    return [o for o in objs if o["record"] == "note" and o["note"] in ("violation", "unanswered")]


def lua_rows(capture: Path, *extra: str) -> list[list[str]]:
    """tshark with jet.lua: frame number, jet.gap and the expert messages of each packet
    that has a jet frame or a gap (no Lua error allowed)."""
    assert TSHARK is not None
    result = subprocess.run(
        [TSHARK, *extra, "-X", f"lua_script:{LUA}", "-r", str(capture), "-T", "fields", "-e", "frame.number",
         "-e", "jet.gap", "-e", "_ws.expert.message", "-Y", "jet || jet.gap"],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0 and "Lua" not in result.stderr, result.stderr
    assert "Lua Error" not in result.stdout, result.stdout
    return [row.split("\t") for row in result.stdout.splitlines()]


def lua_gap_bytes(rows: list[list[str]]) -> int:
    return sum(int(size) for row in rows for size in row[1].split(",") if size)


# --- a real jetd session on loopback, three segments deleted with editcap ------------------


def _capture_session(path: Path, port: int) -> None:
    """dumpcap on lo while a peer talks to jetd: INFO, 6 ADD_STATE, a SET_STATE nobody owns
    and a GET_STATE, each answered before the next; then the peer closes."""
    assert DUMPCAP is not None
    with loopback_capture(path, port, DUMPCAP), socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        decoder = Decoder()

        def answer() -> None:
            while True:
                data = sock.recv(65536)
                assert data, "jetd closed the connection"
                decoder.receive_data(data)
                if any(isinstance(m, (Response, Info)) for m in decoder.messages()):
                    return

        sock.sendall(encode(Info("loss-test")))
        answer()
        requests = [AddState(i, f"loss/{i}", Value.of(i)) for i in range(1, 7)]
        for request in [*requests, SetState(7, "loss/none", Value.of(1)), GetState(8, "loss/1")]:
            sock.sendall(encode(request))
            answer()
        sock.close()
        time.sleep(0.3)  # the FINs are captured


def _data_segments_before_fin(path: Path) -> tuple[list[int], int]:
    """The packet numbers of the data segments before the first FIN, and their bytes."""
    assert TSHARK is not None
    rows = subprocess.run(
        [TSHARK, "-r", str(path), "-T", "fields", "-e", "frame.number", "-e", "tcp.len", "-e", "tcp.flags.fin"],
        capture_output=True, text=True, timeout=TIMEOUT, check=True,
    ).stdout.split("\n")
    data: list[tuple[int, int]] = []
    for row in rows:
        if not row.strip():
            continue
        number, length, fin = row.split("\t")
        if fin in ("1", "True"):
            break
        if int(length):
            data.append((int(number), int(length)))
    return [n for n, _ in data], sum(size for _, size in data[-3:])


@pytest.mark.skipif(DUMPCAP is None or EDITCAP is None or TSHARK is None, reason="needs dumpcap, editcap, tshark")
def test_segments_deleted_before_a_fin_are_a_gap_not_violations(
    tmp_path: Path, start_jetd: Callable[..., Any]
) -> None:
    daemon = start_jetd()
    whole = tmp_path / "session.pcapng"
    _capture_session(whole, daemon.port)
    segments, lost_bytes = _data_segments_before_fin(whole)
    assert len(segments) >= 18, segments  # INFO x2 and 8 request/response pairs
    cut = tmp_path / "lost.pcapng"
    subprocess.run([str(EDITCAP), str(whole), str(cut), *map(str, segments[-3:])],
                   check=True, timeout=TIMEOUT, capture_output=True)
    port = str(daemon.port)
    # The whole capture: nothing to report.
    objs = jetdump_json("--port", port, str(whole))
    assert blamed(objs) == [], blamed(objs)
    if notes(objs, "gap"):  # the kernel dropped packets of the capture itself (a busy machine)
        pytest.skip(f"the capture itself lost packets: {notes(objs, 'gap')}")
    # Three segments deleted: gaps whose sizes add up to the deleted bytes, no blame.
    objs = jetdump_json("--port", port, str(cut))
    gaps = notes(objs, "gap")
    assert gaps, objs
    assert sum(int(g["text"].split()[1]) for g in gaps) == lost_bytes
    assert all(g["packet"] >= segments[-3] for g in gaps)  # (numbered in the cut capture)
    assert blamed(objs) == [], blamed(objs)
    frames = jet_frames(objs)
    assert len(frames) == 2 + 2 * 8 - 3  # INFO x2, 8 request/response pairs; 3 frames lost
    stats = run_jetdump("--stats", "--port", port, str(cut)).stdout
    assert "never answered" not in stats
    # jet.lua in tshark says the same: gaps as expert info, no violation (also with -2).
    for passes in ((), ("-2",)):
        rows = lua_rows(cut, "-o", f"jet.port:{port}", *passes)
        assert "violation" not in repr(rows).lower() and "never answered" not in repr(rows), rows
        assert lua_gap_bytes(rows) == lost_bytes, rows
    # The same session captured with a snaplen of 80 bytes (editcap -s keeps each packet's
    # length on the wire): both tools say the packets were cut, and count the same gaps.
    snapped = tmp_path / "snap80.pcapng"
    subprocess.run([str(EDITCAP), "-s", "80", str(whole), str(snapped)], check=True, timeout=TIMEOUT, capture_output=True)
    objs = jetdump_json("--port", port, str(snapped))
    assert notes(objs, "snaplen") and blamed(objs) == [], objs
    snapped_bytes = sum(int(g["text"].split()[1]) for g in notes(objs, "gap"))
    assert snapped_bytes > 0
    rows = lua_rows(snapped, "-o", f"jet.port:{port}")
    assert lua_gap_bytes(rows) == snapped_bytes and "snaplen cut this packet" in repr(rows), rows


# --- synthetic captures -------------------------------------------------------------------

SET = encode(SetState(1, "a/b", Value.of(1)))
OK = encode(Response(1, Status.OK, Value.of(1)))
GET = encode(GetState(2, "a/b"))
GOT = encode(Response(2, Status.OK, Value.of(1)))
INFO = encode(Info("jetd"))
PEER_INFO = encode(Info("peer"))


def write_session(path: Path, steps: list[tuple[int, bytes | int]], *, snaplen: int = 65535,
                  close: bool = True) -> None:
    """One TCP session from its handshake to its FINs (unless not ``close``): each step
    is (direction, bytes) for a segment, or (direction, n) for n bytes sent but never
    captured."""
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f, snaplen=snaplen), CLIENT, SERVER)
        session.handshake()
        for direction, step in steps:
            if isinstance(step, int):
                session.skip(direction, step)
            else:
                session.send(direction, step)
        if close:
            session.close()


def _lost_request(path: Path) -> None:
    """The SET_STATE segment is lost; the daemon's answer acknowledges its bytes (and the
    peer's INFO is there, so that jet.lua holds the whole stream in view)."""
    write_session(path, [(1, INFO), (0, PEER_INFO), (0, len(SET)), (1, OK), (0, GET), (1, GOT)])


def test_a_lost_request_is_a_gap_before_its_answer_not_an_unsolicited_response(tmp_path: Path) -> None:
    path = tmp_path / "lost-request.pcap"
    _lost_request(path)
    objs = jetdump_json(str(path))
    assert blamed(objs) == [], blamed(objs)
    gap = notes(objs, "gap")
    at = len(PEER_INFO)
    assert len(gap) == 1 and gap[0]["text"].startswith(f"gap: {len(SET)} byte(s) missing at stream offset {at}")
    assert gap[0]["packet"] == 6 and gap[0]["direction"] == 0  # the answer's packet showed it
    order = [o.get("note") or o.get("type") for o in objs]
    assert order.index("gap") < order.index("RESPONSE")  # reported before the answer
    assert [f.get("request", {}).get("function") for f in jet_frames(objs)][-1] == "GET_STATE"


def test_a_lost_answer_is_a_gap_not_a_request_never_answered(tmp_path: Path) -> None:
    path = tmp_path / "lost-answer.pcap"
    # The answer is never captured; the same id again is fine: the first was answered.
    write_session(path, [(1, INFO), (0, SET), (1, len(OK)), (0, SET), (1, OK)])
    objs = jetdump_json(str(path))
    assert blamed(objs) == [], blamed(objs)
    assert len(notes(objs, "gap")) == 1


def test_the_lua_dissector_reports_a_lost_request_as_a_gap(tmp_path: Path) -> None:
    if TSHARK is None:
        pytest.skip("tshark is not installed")
    path = tmp_path / "lost-request.pcap"
    _lost_request(path)
    rows = lua_rows(path, "-2")
    assert [r[1] for r in rows if r[1]] == [str(len(SET))], rows
    assert "unsolicited" not in repr(rows) and "never answered" not in repr(rows), rows


def test_packets_cut_by_the_snaplen_are_said_and_their_tails_are_gaps(tmp_path: Path) -> None:
    path = tmp_path / "snaplen.pcap"
    big = encode(SetState(1, "k", Value.of("x" * 300)))
    write_session(path, [(0, big), (0, SET), (1, OK)], snaplen=200)  # 54 header bytes + 146 of big
    objs = jetdump_json(str(path))
    snaplen = notes(objs, "snaplen")
    assert len(snaplen) == 1 and "packet 4 was cut by the capture's snaplen" in snaplen[0]["text"], objs
    gap = notes(objs, "gap")
    assert len(gap) == 1 and gap[0]["text"].startswith(f"gap: {len(big) - 146} byte(s)"), gap
    frames = jet_frames(objs)
    assert [f["kind"] for f in frames] == ["truncated", "frame", "frame"]
    assert frames[0]["packet"] == 4
    assert blamed(objs) == [], blamed(objs)
    if TSHARK is not None:  # jet.lua: the same gap, on the cut packet
        rows = lua_rows(path)
        assert [(r[0], r[1]) for r in rows if r[1]] == [("4", str(len(big) - 146))], rows
        assert "snaplen cut this packet" in repr(rows), rows


def test_a_frame_cut_by_a_gap_keeps_its_own_streams_packet_number(tmp_path: Path) -> None:
    """A large response cut short by a gap, while another stream's packets are decoded:
    the TRUNCATED frame names the last packet of its own stream."""
    path = tmp_path / "two-streams.pcap"
    big = encode(Response(2, Status.OK, Value.of("y" * 5000)))
    with open(path, "wb") as f:
        writer = CaptureWriter(f)
        one = TcpSession(writer, CLIENT, SERVER)
        two = TcpSession(writer, ("127.0.0.1", 40002), SERVER)
        one.handshake()  # packets 1-3
        two.handshake()  # 4-6
        one.send(0, GET)  # 7
        one.send(1, big[:1000])  # 8: the last packet of the response captured
        one.skip(1, 1000)  # lost
        for _ in range(5):
            two.send(0, SET)  # 9, 11, ...
            two.send(1, OK)
        one.send(1, big[2000:], ack=None)
        two.close()
        one.close()
    objs = jetdump_json(str(path))
    truncated = [f for f in jet_frames(objs) if f["kind"] == "truncated"]
    assert len(truncated) == 1 and truncated[0]["stream"] == 0
    assert truncated[0]["packet"] == 8, truncated
    assert truncated[0]["request"]["function"] == "GET_STATE"  # its id is readable
    assert blamed(objs) == [], blamed(objs)


@pytest.mark.parametrize("shown_by", ["ack", "end"])
def test_frames_held_behind_a_gap_keep_their_own_packets(tmp_path: Path, shown_by: str) -> None:
    """A segment after a lost one waits for the hole; once the hole is a gap (the answer
    acknowledges it, or the capture ends), its frame is shown at its own packet (5)."""
    path = tmp_path / "held.pcap"
    steps: list[tuple[int, bytes | int]] = [(1, INFO), (0, len(SET)), (0, GET)]
    write_session(path, [*steps, (1, GOT)] if shown_by == "ack" else steps, close=shown_by == "ack")
    objs = jetdump_json(str(path))
    get = next(f for f in jet_frames(objs) if f.get("function") == "GET_STATE")
    assert get["packet"] == 5 and get["timestamp"] == pytest.approx(1_700_000_000.0005, abs=1e-6), get
    gap = notes(objs, "gap")
    assert len(gap) == 1 and gap[0]["packet"] == 5  # the first segment after the hole showed it
    # Answered (ack) or not: the capture holds the whole answer direction either way.
    assert [o["note"] for o in blamed(objs)] == ([] if shown_by == "ack" else ["unanswered"]), blamed(objs)


CLIENT_HELLO = bytes.fromhex("16030100c4010000c00303") + bytes(32) + bytes.fromhex("000004130113020100")


def test_a_tls_client_hello_on_a_jet_port_looks_like_tls(tmp_path: Path) -> None:
    path = tmp_path / "tls.pcap"
    write_session(path, [(0, CLIENT_HELLO)])
    frames = jet_frames(jetdump_json(str(path)))
    assert len(frames) == 1 and frames[0]["kind"] == "malformed"
    assert frames[0]["error"].startswith("looks like TLS"), frames[0]
    if TSHARK is not None:
        info = subprocess.run(
            [TSHARK, "-X", f"lua_script:{LUA}", "-r", str(path), "-Y", "jet", "-T", "fields", "-e", "jet.malformed"],
            capture_output=True, text=True, timeout=TIMEOUT,
        ).stdout
        assert "looks like TLS" in info, info
