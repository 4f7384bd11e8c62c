"""Generate ``spec/conformance/13-malformed-vectors.json`` from ``spec/vectors/frames-invalid.json``.

Every invalid frame vector becomes a case that sends it to the daemon and checks the
daemon's answer per PROTOCOL.md 9: a REQUEST with a readable id gets an error RESPONSE
and the connection stays usable (9.1); a fatal fault gets CLOSE and a disconnect, and
a valid request sent in the same write is not answered (9.2 "MUST NOT read further
frames"); a bad EVENT or INFO gets CLOSE (9.3, 2); a bad RESPONSE is dropped unless it
answers a routed request, which then fails with MALFORMED (9.3).

What the daemon sees is decided by running the vector through :mod:`jetwire`'s stream
decoder with the vector's ``max_body`` (a vector that assumes another ``max_body`` than
the daemon announces is SKIPPED at run time). Run ``python -m tools.conformance.vectors``
after the vectors change; a test checks the committed file is current.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from jetwire import Decoder
from jetwire import FrameType
from jetwire import Info
from jetwire import decode_body
from jetwire.errors import RemoteProtocolError

from .cases import default_case_dir

VECTORS = Path(__file__).resolve().parents[2] / "spec" / "vectors" / "frames-invalid.json"
OUTPUT_NAME = "13-malformed-vectors.json"
PROBE_ID = 0x0C0FFEE

QUOTE_9_1 = (
    "When a REQUEST body is at least 4 bytes long but otherwise invalid (unknown function, truncated or "
    "lying lengths, empty key, bad UTF-8, a bad value, trailing bytes), the daemon MUST answer a RESPONSE "
    "with that id and status MALFORMED (UNKNOWN_FUNCTION for an unknown function code, TOO_LARGE for a key "
    "above its key limit), skip the frame, and keep the connection open."
)
QUOTE_9_1_SHORT = (
    "A REQUEST body shorter than 4 bytes has no readable id: the daemon MUST send CLOSE (MALFORMED) and "
    "close the connection."
)
QUOTE_9_2 = "It MUST NOT read further frames from that connection."
QUOTE_3_TOO_LARGE = (
    "A receiver MUST check `length` against its `max_body` as soon as the 5 header bytes are complete, "
    "before it buffers or allocates anything for the body; a larger `length` is a fatal error (status "
    "TOO_LARGE, section 9.2)."
)
QUOTE_9_3_EVENT = (
    "An EVENT has no id, so a bad EVENT cannot be answered. The daemon sends CLOSE and closes the "
    "connection when a peer sends it:"
)
QUOTE_9_3_NO_ID = (
    "A malformed RESPONSE whose id cannot be read (a body under 4 bytes) is dropped and SHOULD be logged."
)
QUOTE_9_3_UNMATCHED = (
    "A RESPONSE whose id matches nothing pending (late, after TIMEOUT, or invented) is dropped and SHOULD "
    "be logged."
)
QUOTE_9_3_ROUTED = (
    "A malformed RESPONSE from an owner whose id is readable and matches a routed request answers the "
    "requester with MALFORMED (message: the owner answered with a malformed response); the owner's "
    "connection stays open."
)
QUOTE_2 = (
    "A peer or daemon that receives an INFO (section 4.4) with a major version other than 1 MUST send "
    "CLOSE (status MALFORMED, section 7.3) and close the connection."
)
QUOTE_3_SPLIT = "A receiver MUST accept frames split across any number of reads and several frames in one read."

_PROBE = {"msg": "GET_STATE", "id": PROBE_ID, "key": "probe"}
_PROBE_ANSWER = {"msg": "RESPONSE", "id": PROBE_ID, "status": "NOT_FOUND"}
_PROBE_HEX = "010000000c" + f"{PROBE_ID:08x}" + "0a" + "0005" + b"probe".hex()


def _probe_steps(conn: str = "a") -> list[dict[str, Any]]:
    """The connection is still usable: a GET_STATE of an unknown key is answered."""
    return [
        {"op": "send", "conn": conn, "message": _PROBE},
        {"op": "expect", "conn": conn, "message": _PROBE_ANSWER},
    ]


def _simulate(data: bytes, max_body: int) -> tuple[list[dict[str, Any]], bool, list[str]]:
    """What a conforming daemon answers to ``data``: (expected messages, closed, notes)."""
    decoder = Decoder(max_body=max_body)
    decoder.receive_data(data)
    expected: list[dict[str, Any]] = []
    notes: list[str] = []
    while True:
        try:
            frame = decoder.next_frame()
        except RemoteProtocolError as exc:  # unknown type or over max_body: PROTOCOL.md 9.2
            expected.append({"msg": "CLOSE", "status": exc.status.name})
            notes.append("fatal header")
            return expected, True, notes
        if frame is None:
            if decoder.buffered:
                notes.append(f"{decoder.buffered} byte(s) of an incomplete frame left")
            return expected, False, notes
        ftype, body = frame
        try:
            message = decode_body(ftype, body)
        except RemoteProtocolError as exc:
            if ftype == FrameType.REQUEST:
                if exc.request_id is None:  # PROTOCOL.md 9.1: no readable id
                    expected.append({"msg": "CLOSE", "status": "MALFORMED"})
                    return expected, True, notes
                expected.append({"msg": "RESPONSE", "id": exc.request_id, "status": exc.status.name})
                continue
            if ftype == FrameType.RESPONSE:  # PROTOCOL.md 9.3: nothing routed here, dropped
                notes.append("response dropped")
                continue
            expected.append({"msg": "CLOSE", "status": exc.status.name})  # EVENT or INFO: 9.3 / 9.2
            return expected, True, notes
        if isinstance(message, Info) and message.major != 1:  # PROTOCOL.md 2
            expected.append({"msg": "CLOSE", "status": "MALFORMED"})
            return expected, True, notes
        if isinstance(message, Info) and message.max_body < 64:  # PROTOCOL.md 4.4, a peer's INFO
            expected.append({"msg": "CLOSE", "status": "MALFORMED"})
            return expected, True, notes
        raise ValueError(f"vector decodes to a valid {type(message).__name__}: not a malformed input")


def _section_and_quote(vector: dict[str, Any], first: dict[str, Any]) -> tuple[str, str]:
    error = vector.get("error", {})
    if first.get("msg") == "RESPONSE":
        return "9.1", QUOTE_9_1
    status = first.get("status")
    frame_type = error.get("frame_type")
    if status == "TOO_LARGE":
        return "3", QUOTE_3_TOO_LARGE
    if vector["name"].startswith("info_major"):
        return "2", QUOTE_2
    if frame_type == "REQUEST":
        return "9.1", QUOTE_9_1_SHORT
    if frame_type == "EVENT":
        return "9.3", QUOTE_9_3_EVENT
    return "9.2", QUOTE_9_2


def case_for_vector(vector: dict[str, Any], default_max_body: int) -> list[dict[str, Any]]:
    """The case(s) for one invalid vector (two for a RESPONSE with a readable id)."""
    name = vector["name"]
    data = bytes.fromhex(vector["hex"])
    max_body = int(vector.get("max_body", default_max_body))
    requires = [f"max_body == {max_body}"] if "max_body" in vector else []
    expected, closed, notes = _simulate(data, max_body)
    base: dict[str, Any] = {
        "title": f"{vector['description']} (vector {name})",
        "requirement": "MUST",
        "notes": f"generated from spec/vectors/frames-invalid.json vector {name!r} "
        f"(section {vector.get('section')}); " + "; ".join(notes),
    }
    if requires:
        base["requires"] = requires
    cases = []
    if data[:1] == b"\x02" and not expected:
        # A RESPONSE from a peer with nothing routed to it: dropped (SHOULD be logged).
        unreadable = vector.get("error", {}).get("request_id") is None
        cases.append({
            "id": f"vector.{name}",
            **base,
            "section": "9.3",
            "quote": QUOTE_9_3_NO_ID if unreadable else QUOTE_9_3_UNMATCHED,
            "steps": [
                {"op": "connect", "conn": "a"},
                {"op": "send", "conn": "a", "hex": vector["hex"], "note": f"vector {name}"},
                {"op": "expect_silence", "conn": "a", "seconds": 0.2},
                *_probe_steps(),
            ],
        })
        if not unreadable and len(data) >= 9:
            cases.append(_routed_response_case(vector, base))
        return cases
    if not expected:
        section, quote = "3", QUOTE_3_SPLIT
    else:
        section, quote = _section_and_quote(vector, expected[0])
    steps: list[dict[str, Any]] = [{"op": "connect", "conn": "a"}]
    if closed:
        # PROTOCOL.md 9.2: a valid request right behind the fatal fault must not be answered.
        steps.append({"op": "send", "conn": "a", "hex": vector["hex"] + _PROBE_HEX,
                      "note": f"vector {name}, then a valid GET_STATE that must not be answered"})
        if expected[:-1]:
            steps.append({"op": "expect", "conn": "a", "messages": expected[:-1]})
        steps.append({"op": "expect_close", "conn": "a", "status": expected[-1]["status"]})
    else:
        steps.append({"op": "send", "conn": "a", "hex": vector["hex"], "note": f"vector {name}"})
        if expected:
            steps.append({"op": "expect", "conn": "a", "messages": expected})
            steps.extend(_probe_steps())
        else:
            # An incomplete frame: the daemon waits for the rest, and neither answers nor closes.
            steps.append({"op": "expect_silence", "conn": "a", "seconds": 0.3})
    cases.append({"id": f"vector.{name}", **base, "section": section, "quote": quote, "steps": steps})
    return cases


def _routed_response_case(vector: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The owner answers a routed SET_STATE with this malformed RESPONSE (its id replaced)."""
    data = bytes.fromhex(vector["hex"])
    body_rest = data[9:].hex()
    length = int.from_bytes(data[1:5], "big")
    frame: dict[str, Any] = {"type": "RESPONSE", "body": [{"u32": "$rid"}, *([body_rest] if body_rest else [])]}
    if length != len(data) - 5:
        frame["length"] = length
    return {
        "id": f"vector.{vector['name']}.routed",
        **base,
        "title": f"owner answers a routed set with: {vector['description']} (vector {vector['name']})",
        "section": "9.3",
        "quote": QUOTE_9_3_ROUTED,
        "steps": [
            {"op": "connect", "conn": "owner"},
            {"op": "connect", "conn": "client"},
            {"op": "send", "conn": "owner", "message": {"msg": "ADD_STATE", "id": 1, "key": "s",
                                                         "value": {"INT64": 1}}},
            {"op": "expect", "conn": "owner", "message": {"msg": "RESPONSE", "id": 1, "status": "OK"}},
            {"op": "send", "conn": "client", "message": {"msg": "SET_STATE", "id": 7, "key": "s",
                                                          "value": {"INT64": 2}}},
            {"op": "expect", "conn": "owner", "message": {"msg": "SET_STATE", "id": "?rid", "key": "s",
                                                           "value": {"INT64": 2}}},
            {"op": "send", "conn": "owner", "frame": frame, "note": f"vector {vector['name']} with the routed id"},
            {"op": "expect", "conn": "client", "message": {"msg": "RESPONSE", "id": 7, "status": "MALFORMED"}},
            *_probe_steps("owner"),
        ],
    }


def generate(vectors_path: Path = VECTORS) -> dict[str, Any]:
    """The case file for every invalid vector."""
    doc = json.loads(vectors_path.read_text(encoding="utf-8"))
    default_max_body = int(doc.get("default_max_body", 1 << 20))
    cases: list[dict[str, Any]] = []
    for vector in doc["vectors"]:
        cases.extend(case_for_vector(vector, default_max_body))
    for vector in doc.get("incomplete", []):
        if vector["hex"]:
            cases.extend(case_for_vector(vector, default_max_body))
    for vector in doc.get("daemon_only", []):
        cases.extend(case_for_vector(vector, default_max_body))
    return {
        "group": "13-malformed-vectors",
        "description": "GENERATED by `python -m tools.conformance.vectors` from spec/vectors/frames-invalid.json; "
        "do not edit by hand.",
        "cases": cases,
    }


def main() -> int:
    """Write the generated case file (or check it with ``--check``)."""
    target = default_case_dir() / OUTPUT_NAME
    text = json.dumps(generate(), indent=1, ensure_ascii=False) + "\n"
    if "--check" in sys.argv[1:]:
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current != text:
            print(f"{target} is out of date: run python -m tools.conformance.vectors", file=sys.stderr)
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    print(f"wrote {len(json.loads(text)['cases'])} cases to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
