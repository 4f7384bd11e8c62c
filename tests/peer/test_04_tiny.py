"""peer.tiny: spec vectors, agreement with jetwire, and the real jetd."""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

import pytest

import jetwire
from peer import Peer
from peer import tiny
from peer.tiny import TinyError
from peer.tiny import TinyPeer

VECTORS = Path(__file__).resolve().parents[2] / "spec" / "vectors"
TINY_SOURCE = Path(tiny.__file__)


def _load(name: str) -> list[dict]:
    path = VECTORS / name
    if not path.exists():
        return []
    return json.loads(path.read_text())["vectors"]


VALID = _load("frames-valid.json")
INVALID = _load("frames-invalid.json")


def test_tiny_imports_only_the_standard_library():
    tree = ast.parse(TINY_SOURCE.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0] if node.level == 0 else "relative")
    # ssl is imported when the platform has it (PROTOCOL.md 15.6: TLS is optional there).
    assert imported <= {"__future__", "json", "select", "socket", "struct", "time", "typing", "collections", "contextlib",
                        "ssl"}
    assert "threading" not in imported and "asyncio" not in imported


def _tiny_never_receives(vector: dict) -> bool:
    message = vector["message"]
    return message.get("function") in ("FETCH_QUERY", "QUERY_ONCE") or message.get("code") == "FETCH_WINDOW"


@pytest.mark.skipif(not VALID, reason="spec/vectors/frames-valid.json not present")
@pytest.mark.parametrize("vector", VALID, ids=[v["name"] for v in VALID])
def test_valid_vectors_decode_and_reencode(vector):
    if _tiny_never_receives(vector):
        pytest.skip("tiny sends its queries pre-encoded and never receives FETCH_WINDOW")
    frame = bytes.fromhex(vector["hex"])
    message = tiny.decode_frame(frame)
    assert tiny.encode_frame(message) == frame
    expected = vector["message"]
    assert message["type"] == {"REQUEST": 1, "RESPONSE": 2, "EVENT": 3, "INFO": 4}[expected["type"]]
    code = expected.get("function") or expected.get("code")
    if code is not None:
        names = {"FETCH_ADD": 0x81, "FETCH_CHANGE": 0x82, "FETCH_REMOVE": 0x83, "CLOSE": 0xF0}
        names.update(FETCH_UNMATCH=0x84, FETCH_METHOD=0x85, FETCH_NODE=0x86, QUERY_ENTRY=0x88)
        number = names.get(code) or getattr(tiny, code)
        assert message.get("function", message.get("code")) == number
    if expected["type"] == "RESPONSE" or expected.get("code") == "CLOSE":
        assert tiny.STATUS_NAMES[message["status"]] == expected["status"]
    for field in ("id", "key", "prefix", "fetch_id", "name", "max_body", "message"):
        if field in expected:
            assert message[field] == expected[field], field
    if "value" in expected:
        assert message["value"] == (expected["value"]["vtype"], bytes.fromhex(expected["value"]["hex"]))


@pytest.mark.skipif(not INVALID, reason="spec/vectors/frames-invalid.json not present")
@pytest.mark.parametrize("vector", INVALID, ids=[v["name"] for v in INVALID])
def test_invalid_vectors_rejected_like_the_spec_says(vector):
    if vector["name"].startswith(("fetch_query_", "query_once_", "fetch_window_")):
        pytest.skip("tiny never receives query requests nor FETCH_WINDOW (PROTOCOL.md 14)")
    data = bytes.fromhex(vector["hex"])
    expected = vector["error"]
    max_body = vector.get("max_body", tiny.DEFAULT_MAX_BODY)
    with pytest.raises(TinyError) as info:
        # Stream semantics: the first frame as its header delimits it.
        _, length = tiny._HEAD.unpack_from(data)
        tiny.decode_frame(data[: 5 + length], max_body)
    assert info.value.status_name == expected["status"]
    assert info.value.fatal == expected["fatal"]
    assert info.value.request_id == expected["request_id"]


def _random_value(rng: random.Random) -> object:
    choice = rng.randrange(9)
    if choice == 0:
        return None
    if choice == 1:
        return rng.random() < 0.5
    if choice == 2:
        return rng.randrange(-(2**63), 2**63)
    if choice == 3:
        return rng.uniform(-1e9, 1e9)
    if choice == 4:
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x100, 0xD7FF)])) for _ in range(rng.randrange(20)))
    if choice == 5:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(30)))
    if choice == 6:
        return {"a": [rng.randrange(100), "x"], "b": None}
    if choice == 7:
        return [rng.random(), True]
    return jetwire.Value(rng.choice([7, 8, 0x80, 0xFF]), bytes(rng.randrange(256) for _ in range(5)))


def test_tiny_and_jetwire_agree_on_generated_messages():
    rng = random.Random(4)
    for _ in range(400):
        value = _random_value(rng)
        key = rng.choice(["k", "plant/line3/temp", "ü/ß", "x" * 300])
        rid = rng.randrange(2**32)
        wire_value = jetwire.Value.of(value)
        tiny_value = tiny.to_value(tiny.Raw(wire_value.vtype, wire_value.data) if isinstance(value, jetwire.Value) else value)
        assert tiny_value == (wire_value.vtype, wire_value.data)
        pairs = [
            (jetwire.SetState(rid, key, wire_value), {"type": 1, "id": rid, "function": 3, "key": key, "value": tiny_value}),
            (jetwire.SetState(None, key, wire_value), {"type": 3, "code": 3, "key": key, "value": tiny_value}),
            (jetwire.GetState(rid, key), {"type": 1, "id": rid, "function": 10, "key": key}),
            (jetwire.Response(rid, jetwire.Status.OK, wire_value), {"type": 2, "id": rid, "status": 0, "value": tiny_value}),
            (jetwire.FetchChange(rid, key, wire_value), {"type": 3, "code": 0x82, "fetch_id": rid, "key": key, "value": tiny_value}),
        ]
        for message, tiny_form in pairs:
            frame = jetwire.encode(message)
            assert tiny.encode_frame(tiny_form) == frame
            assert tiny.decode_frame(frame) == tiny_form
        if not isinstance(value, (jetwire.Value, float)):
            assert tiny.from_value(*tiny_value) == wire_value.to_python()


def test_tiny_against_jetd(jetd):
    with TinyPeer(jetd.host, jetd.port, name="tiny", timeout=5) as device, Peer(jetd.host, jetd.port) as app:
        assert device.info is not None and device.info["name"] == "jetd"
        seen = []
        device.add_state("dev/level", 3, on_set=lambda v: max(0, min(int(v), 10)))
        device.add_state("dev/ro", "fixed")
        device.add_method("dev/sum", lambda args: sum(args))

        def refuse(value):
            raise TinyError(tiny.REJECTED, "never")

        device.add_state("dev/no", 0, on_set=refuse)
        fid = device.fetch("dev/", lambda kind, key, value: seen.append((kind, key, value)))
        # The initial adds follow the OK; none is lost.
        assert sorted(k for _, k, _ in seen) == ["dev/level", "dev/no", "dev/ro"]

        # The device answers routed requests while it polls: run app requests as futures.
        future = app.set_future("dev/level", 42)
        while not future.done():
            device.poll(0.05)
        assert future.result() == 10
        future = app.call_future("dev/sum", [1, 2, 3])
        while not future.done():
            device.poll(0.05)
        assert future.result() == 6
        for key, error in (("dev/ro", "REJECTED"), ("dev/no", "REJECTED")):
            future = app.set_future(key, 1)
            while not future.done():
                device.poll(0.05)
            with pytest.raises(Exception, match=error):
                future.result()
        device.notify("dev/level", 7)
        device.notify("dev/level", 8, wait=False)
        assert device.get("dev/level") == 8
        assert app.get("dev/level") == 8
        assert ("change", "dev/level", 10) in seen and ("change", "dev/level", 8) in seen

        # The device as a client of the app.
        app.add_state("app/mode", "auto", on_set=lambda v: v.upper())
        app.add_method("app/echo", lambda x: x)
        assert device.set("app/mode", "manual") == "MANUAL"
        assert device.call("app/echo", {"a": [1]}) == {"a": [1]}
        assert device.get("app/mode") == "MANUAL"
        with pytest.raises(TinyError) as info:
            device.get("nope")
        assert info.value.status_name == "NOT_FOUND"
        device.unfetch(fid)
        device.remove_state("dev/ro")
        device.remove_method("dev/sum")
        with pytest.raises(Exception, match="NOT_FOUND"):
            app.get("dev/ro")
        assert device.poll(0.01) >= 0


def test_tiny_sees_daemon_shutdown(start_jetd):
    daemon = start_jetd()
    device = TinyPeer(daemon.host, daemon.port, timeout=5)
    daemon.stop()
    with pytest.raises(TinyError, match=r"shutting down|closed"):
        for _ in range(50):
            device.poll(0.1)
    assert device.closed


def test_tiny_path_matchers_and_one_shot_queries(jetd):
    # PROTOCOL.md 14: tiny sends path-matcher queries (no filters, no sort).
    with TinyPeer(jetd.host, jetd.port, name="tiny", timeout=5) as device, Peer(jetd.host, jetd.port) as app:
        app.add_state("plant/line1/temp", 21)
        app.add_state("plant/line1/TEST", 0)
        app.add_method("plant/line1/reset", lambda _: None)
        entries = device.query("plant/", [tiny.matcher(tiny.CONTAINS, "test", negate=True, ignore_case=True)],
                               methods=True, nodes=True)
        assert entries == [("node", "plant/line1", None), ("method", "plant/line1/reset", None),
                           ("state", "plant/line1/temp", 21)]
        seen = []
        device.fetch("", lambda kind, key, value: seen.append((kind, key, value)),
                     [tiny.matcher(tiny.ENDS_WITH, "/temp")])
        assert seen == [("add", "plant/line1/temp", 21)]
        with pytest.raises(TinyError) as info:
            device.query(matchers=[(tiny.EQUALS, 0, ("a", "b"))])
        assert info.value.status_name == "INVALID_QUERY"
