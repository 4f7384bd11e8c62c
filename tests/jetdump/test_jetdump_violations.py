"""Protocol violations jetdump flags (a ``violation`` note after the frame), requests
never answered, and a routed request traced end to end from an event log."""

from __future__ import annotations

from pathlib import Path

from jdhelpers import jetdump_json
from jdhelpers import run_jetdump
from test_jetdump_logs import segment

from jetwire import FetchChange
from jetwire import GetState
from jetwire import Info
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import encode
from tools.jetdump.synth import CaptureWriter
from tools.jetdump.synth import TcpSession

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


def test_routed_requests_traced_in_a_capture_with_trace(tmp_path: Path) -> None:
    """--trace on a capture: the daemon's SET_STATE to the owner is linked to the oldest
    waiting SET_STATE of the same key (PROTOCOL.md 10.3: it forwards in arrival order);
    a request answered without routing (NOT_FOUND) is not waiting any more; two
    requesters on one key at once are linked in order and the output says it inferred."""
    base = 1_700_000_000.0
    path = tmp_path / "routed.pcap"
    with open(path, "wb") as f:
        writer = CaptureWriter(f)
        owner = TcpSession(writer, ("10.0.0.9", 40000), SERVER)
        c1 = TcpSession(writer, ("10.0.0.1", 40001), SERVER)
        c2 = TcpSession(writer, ("10.0.0.2", 40002), SERVER)

        def at(session: TcpSession, ms: float, direction: int, message: object) -> None:
            session.ts = base + ms / 1000
            session.send(direction, encode(message), dt=0)  # type: ignore[arg-type]

        for i, session in enumerate((owner, c1, c2)):
            session.ts = base + i / 1000
            session.handshake()
            at(session, 1 + i, 0, Info("peer"))
            at(session, 1.5 + i, 1, Info("jetd"))
        at(owner, 5, 0, SetState(1, "k", Value.of(0)))  # answered by the daemon itself: never waiting after
        at(owner, 6, 1, Response(1, Status.NOT_FOUND))
        at(c1, 10, 0, SetState(5, "k", Value.of(1)))
        at(owner, 11, 1, SetState(1, "k", Value.of(1)))  # the daemon's leg, under its own id
        at(owner, 13, 0, Response(1, Status.OK, Value.of(1)))
        at(c1, 14, 1, Response(5, Status.OK, Value.of(1)))
        at(c1, 20, 0, SetState(6, "nokey", Value.of(1)))
        at(c1, 21, 1, Response(6, Status.NOT_FOUND))
        at(c1, 30, 0, SetState(7, "k", Value.of(2)))
        at(c2, 30.5, 0, SetState(3, "k", Value.of(3)))
        at(owner, 31, 1, SetState(2, "k", Value.of(2)))
        at(owner, 32, 1, SetState(3, "k", Value.of(3)))
        at(owner, 33, 0, Response(2, Status.OK, Value.of(2)))
        at(owner, 34, 0, Response(3, Status.OK, Value.of(3)))
        at(c1, 35, 1, Response(7, Status.OK, Value.of(2)))
        at(c2, 36, 1, Response(3, Status.OK, Value.of(3)))
    plain = jetdump_json(str(path))
    assert not any("route" in o for o in plain if o["record"] == "frame")  # without --trace: nothing inferred
    objs = jetdump_json(str(path), "--trace")
    answers = {(o["stream"], o["id"]): o for o in objs
               if o["record"] == "frame" and o["direction"] == 1 and o.get("type") == "RESPONSE"}
    owner_stream = next(o["stream"] for o in objs if o["record"] == "frame" and o.get("id") == 1
                        and o.get("type") == "REQUEST" and o["direction"] == 0 and o.get("key") == "k")
    streams = sorted({o["stream"] for o in objs if o["record"] == "frame"} - {owner_stream})
    first = answers[(streams[0], 5)]["route"]
    assert first["owner_stream"] == owner_stream and first["owner_id"] == 1 and first["inferred"] == 1
    assert abs(first["owner_ms"] - 2.0) < 1e-3 and abs(first["daemon_ms"] - 2.0) < 1e-3
    assert "route" not in answers[(streams[0], 6)]  # NOT_FOUND: never routed
    second, third = answers[(streams[0], 7)]["route"], answers[(streams[1], 3)]["route"]
    assert (second["owner_id"], second["inferred"]) == (2, 2)  # oldest of two waiting on "k"
    assert (third["owner_id"], third["inferred"]) == (3, 1)
    assert abs(second["owner_ms"] - 2.0) < 1e-3 and abs(third["owner_ms"] - 2.0) < 1e-3
    text = run_jetdump(str(path), "--trace").stdout
    assert "inferred: oldest of 2 waiting on this key]" in text
