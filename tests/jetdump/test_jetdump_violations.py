"""Protocol violations jetdump flags (a ``violation`` note after the frame), requests
never answered, and a routed request traced end to end from an event log."""

from __future__ import annotations

from pathlib import Path

from jdhelpers import jetdump_json, run_jetdump
from test_jetdump_logs import segment

from jetwire import FetchChange, GetState, Info, Response, SetState, Status, Value, encode
from tools.jetdump.synth import CaptureWriter, TcpSession

CLIENT = ("10.0.0.1", 50000)
SERVER = ("10.0.0.2", 11124)


def notes(objs: list[dict]) -> list[str]:  # type: ignore[type-arg]
    return [o["text"] for o in objs if o["record"] == "note"]


def capture(path: Path, conversation: list[tuple[int, bytes]], *, handshake: bool = True) -> Path:
    with open(path, "wb") as f:
        session = TcpSession(CaptureWriter(f), CLIENT, SERVER)
        if handshake:
            session.handshake()
        for direction, payload in conversation:
            session.send(direction, payload, dt=0.001)
        session.close()
    return path


def test_violations_in_a_capture(tmp_path: Path) -> None:
    path = capture(tmp_path / "v.pcap", [
        (1, encode(Info("jetd", max_body=20))),
        (0, encode(Info("peer"))),
        (0, encode(FetchChange(3, "a", Value.of(1)))),  # frame 3: only the daemon sends these
        (0, encode(GetState(1, "a"))),  # frame 4
        (0, encode(GetState(1, "b"))),  # frame 5: id 1 still pending
        (1, encode(Response(1, Status.NOT_FOUND))),  # frame 6 answers #5
        (1, encode(Response(99, Status.OK))),  # frame 7: nothing asked
        (0, encode(GetState(2, "c"))),  # frame 8
        (1, encode(Response(2, Status.TIMEOUT))),  # frame 9
        (1, encode(Response(2, Status.OK))),  # frame 10: after the TIMEOUT
        (0, encode(SetState(3, "k", Value.of("x" * 20)))),  # frame 11: body above 20
        (0, encode(GetState(4, "never"))),  # frame 12: never answered
    ])
    texts = notes(jetdump_json(str(path)))
    assert "frame #3: a peer sent FetchChange (FETCH_CHANGE): only the daemon sends fetch events" in texts
    assert "frame #5: duplicate request id 1: frame #4 with this id is still pending" in texts
    assert "frame #7: unsolicited response: no request id 99 is pending on this stream" in texts
    assert "frame #10: late response: request id 2 was already answered TIMEOUT (frame #9)" in texts
    assert any(t.startswith("frame #11: body of ") and "above the max_body 20 its receiver announced" in t
               for t in texts)
    assert "frame #12: request id 4 was never answered" in texts
    assert "frame #11: request id 3 was never answered" in texts
    # Violations pass filters (never hidden); --no-notes drops them.
    filtered = notes(jetdump_json(str(path), "--key", "zzz"))
    assert any("unsolicited response" in t for t in filtered)
    assert notes(jetdump_json(str(path), "--no-notes")) == []


def test_a_capture_joined_mid_stream_does_not_cry_unsolicited(tmp_path: Path) -> None:
    path = capture(tmp_path / "mid.pcap", [(1, encode(Response(7, Status.OK)))], handshake=False)
    assert notes(jetdump_json(str(path))) == []


def test_routed_request_traced_end_to_end(tmp_path: Path) -> None:
    """conn 7's SET (t=2 ms) is routed to owner conn 3 (leg sent t=4, answered t=5) and
    answered to conn 7 at t=6: 4 ms end to end, 1 ms the owner's, 3 ms the daemon's."""
    path = tmp_path / "jet-x-000000.jetlog"
    path.write_bytes(segment())
    objs = jetdump_json(str(path))
    answer = next(o for o in objs if o["record"] == "frame" and o["stream"] == 7 and o["direction"] == 1)
    route = answer["route"]
    assert route["owner"] == "c3" and route["owner_id"] == 1
    assert (route["leg_request"], route["leg_response"]) == (2, 3)
    assert abs(route["owner_ms"] - 1.0) < 1e-3 and abs(route["daemon_ms"] - 3.0) < 1e-3
    assert abs(answer["rtt_ms"] - 4.0) < 1e-3
    text = run_jetdump(str(path)).stdout
    assert "[routed via c3 #2/#3: owner 1.000 ms, daemon 3.000 ms]" in text
