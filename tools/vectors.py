"""Generate the golden vectors in ``spec/vectors/`` (see spec/vectors/README.md).

The frame bytes are built here from the language-neutral JSON form of each vector by a
small builder of our own (plain ``struct``), not by :mod:`jetwire`, so that the vectors
check the codec instead of echoing it. The examples printed in spec/PROTOCOL.md and
spec/JETLOG.md are included and the generator fails if it does not reproduce them
byte for byte.

    python -m tools.vectors            # (re)write spec/vectors/*.json
    python -m tools.vectors --check    # exit 1 if the checked-in files are stale

The module also offers the JSON-form conversions the tests and other tools use:
:func:`message_to_json`, :func:`message_from_json`, :func:`value_to_json`,
:func:`value_from_json`, :func:`error_to_json`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

from jetwire import FETCH_EVENT_CLASSES
from jetwire import REQUEST_CLASSES
from jetwire import Authenticate
from jetwire import Close
from jetwire import EventCode
from jetwire import FetchEvent
from jetwire import FetchMethod
from jetwire import FetchNode
from jetwire import FetchQuery
from jetwire import FetchStates
from jetwire import FetchWindow
from jetwire import FrameType
from jetwire import Function
from jetwire import Info
from jetwire import KeyRequest
from jetwire import KeyValueRequest
from jetwire import Message
from jetwire import PathMatcher
from jetwire import Query
from jetwire import QueryEntry
from jetwire import QueryOnce
from jetwire import RemoteProtocolError
from jetwire import Request
from jetwire import Response
from jetwire import Status
from jetwire import Unfetch
from jetwire import Value
from jetwire import ValueFilter
from jetwire import ValueType
from jetwire import WindowEntry
from jetwire.codes import Action
from jetwire.codes import EntryKind
from jetwire.codes import FilterOp
from jetwire.codes import PathOp
from jetwire.codes import SortBy

VECTORS_DIR = Path(__file__).resolve().parent.parent / "spec" / "vectors"
FORMAT = "jet-vectors/1"
DEFAULT_MAX_BODY = 1024 * 1024  # PROTOCOL.md 3, restated so the builder stays independent

JsonObj = dict[str, Any]

# --- the JSON form (spec/vectors/README.md) -------------------------------------------


def value_to_json(value: Value) -> JsonObj:
    """The JSON form of a Value: ``type`` name, ``vtype`` byte, ``hex`` data, plus an
    informational reading (``bool``/``int``/``float``/``text``) for the simple types."""
    vtype = value.vtype
    try:
        name = ValueType(vtype).name
    except ValueError:
        name = "APPLICATION"
    out: JsonObj = {"type": name, "vtype": vtype, "hex": value.data.hex()}
    if vtype == ValueType.BOOL:
        out["bool"] = value.data == b"\x01"
    elif vtype == ValueType.INT64:
        out["int"] = str(struct.unpack(">q", value.data)[0])
    elif vtype == ValueType.FLOAT64:
        x = struct.unpack(">d", value.data)[0]
        out["float"] = float_text(x)
        out["float_hex"] = float_hex(x)
    elif vtype in (ValueType.STRING, ValueType.JSON):
        # JSON data is carried opaquely (PROTOCOL.md 5.3): it may not even be UTF-8.
        with contextlib.suppress(UnicodeDecodeError):
            out["text"] = value.data.decode("utf-8")
    return out


def float_text(x: float) -> str:
    """The shortest decimal that reads back as ``x``, written as ECMAScript's
    Number::toString writes it (ECMA-262, 6.1.6.1.20): ``22.5``, ``1e+21``, ``5e-324``,
    ``1.7976931348623157e+308``; except ``-0`` for negative zero; ``Infinity``,
    ``-Infinity`` and ``NaN`` (every NaN) for the rest. Language-neutral: spec/vectors/README.md."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    sign = "-" if x < 0 else ""
    # repr gives the shortest round-trip digits (David Gay's / Ryu's answer); only its
    # layout is Python's, so take the digits and the exponent out of it.
    mantissa, _, exp_text = repr(abs(x)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    exp = int(exp_text) if exp_text else 0
    # x = 0.DIGITS * 10**n; for 0.00DIGITS, n counts the zeros after the point, negatively.
    n = exp - (len(fraction) - len(fraction.lstrip("0"))) if whole == "0" else exp + len(whole)
    digits = digits.rstrip("0") or "0"
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    e = n - 1
    return sign + digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))


def float_hex(x: float) -> str:
    """C99's ``%a`` form, normalised to a leading 1 even for subnormals, with trailing
    zero digits dropped (``0x1.68p+4``, ``0x1p-1074`` for the smallest subnormal, ``0x0p+0``);
    ``Infinity``, ``-Infinity``, ``NaN`` otherwise."""
    if math.isnan(x) or math.isinf(x):
        return float_text(x)
    text = x.hex()  # e.g. -0x1.6800000000000p+4, 0x0.0000000000001p-1022
    sign = "-" if text.startswith("-") else ""
    mantissa, _, exponent = text.lstrip("-")[2:].partition("p")
    lead, _, fraction = mantissa.partition(".")
    if lead == "0" and fraction.strip("0"):
        # A subnormal: normalise to a leading 1 (0x1p-1074), so that there is one form.
        bits = int(fraction, 16)
        shift = bits.bit_length() - 1
        exp = int(exponent) - 52 + shift
        rest = bits - (1 << shift)
        fraction = format(rest << (52 - shift), "013x") if shift else ""
        lead, exponent = "1", f"{exp:+d}"
    fraction = fraction.rstrip("0")
    return f"{sign}0x{lead}{'.' + fraction if fraction else ''}p{exponent}"


def value_from_json(obj: JsonObj) -> Value:
    """Inverse of :func:`value_to_json` (only ``vtype`` and ``hex`` are normative)."""
    return Value(int(obj["vtype"]), bytes.fromhex(obj["hex"]))



# --- protocol 1.1 queries (PROTOCOL.md 14): JSON form, builder, vectors ----------------------

_QUERY_FUNCTIONS = {"FETCH_QUERY": FetchQuery, "QUERY_ONCE": QueryOnce}
_QUERY_EVENTS = ("FETCH_METHOD", "FETCH_NODE", "FETCH_WINDOW", "QUERY_ENTRY")


def query_to_json(query: Query) -> JsonObj:
    """The JSON form of a Query (PROTOCOL.md 14.1); codes by name, flags as bytes."""
    return {
        "flags": query.flags,
        "matchers": [
            {"op": PathOp(m.op).name, "flags": m.flags, "operands": list(m.operands)} for m in query.matchers
        ],
        "filters": [
            {"op": FilterOp(f.op).name, "flags": f.flags, "field": f.field, "value": value_to_json(f.operand)}
            for f in query.filters
        ],
        "sort_by": SortBy(query.sort_by).name,
        "sort_flags": query.sort_flags,
        "sort_field": query.sort_field,
        "from": query.window_from,
        "to": query.window_to,
    }


def query_from_json(obj: JsonObj) -> Query:
    """Inverse of :func:`query_to_json`."""
    return Query(
        tuple(PathMatcher(PathOp[m["op"]], tuple(m["operands"]), m["flags"]) for m in obj["matchers"]),
        tuple(
            ValueFilter(FilterOp[f["op"]], value_from_json(f["value"]), f["field"], f["flags"])
            for f in obj["filters"]
        ),
        SortBy[obj["sort_by"]],
        obj["sort_field"],
        obj["sort_flags"],
        obj["from"],
        obj["to"],
        obj["flags"],
    )


def _query_message_to_json(message: Message) -> JsonObj | None:
    if isinstance(message, (FetchQuery, QueryOnce)):
        return {
            "type": "REQUEST",
            "id": message.id,
            "function": message.function.name,
            "query": query_to_json(message.query),
        }
    if isinstance(message, (FetchMethod, FetchNode)):
        code = "FETCH_METHOD" if isinstance(message, FetchMethod) else "FETCH_NODE"
        return {
            "type": "EVENT",
            "code": code,
            "fetch_id": message.fetch_id,
            "action": Action(message.action).name,
            "key": message.key,
        }
    if isinstance(message, FetchWindow):
        return {
            "type": "EVENT",
            "code": "FETCH_WINDOW",
            "fetch_id": message.fetch_id,
            "size": message.size,
            "entries": [{"index": e.index, "key": e.key, "value": value_to_json(e.value)} for e in message.entries],
        }
    if isinstance(message, QueryEntry):
        return {
            "type": "EVENT",
            "code": "QUERY_ENTRY",
            "request_id": message.id,
            "kind": EntryKind(message.kind).name,
            "key": message.key,
            "value": value_to_json(message.value),
        }
    return None


def _query_message_from_json(obj: JsonObj) -> Message | None:
    if obj["type"] == "REQUEST" and obj["function"] in _QUERY_FUNCTIONS:
        return _QUERY_FUNCTIONS[obj["function"]](obj["id"], query_from_json(obj["query"]))
    if obj["type"] != "EVENT" or obj["code"] not in _QUERY_EVENTS:
        return None
    code = obj["code"]
    if code in ("FETCH_METHOD", "FETCH_NODE"):
        cls = FetchMethod if code == "FETCH_METHOD" else FetchNode
        return cls(obj["fetch_id"], Action[obj["action"]], obj["key"])
    if code == "FETCH_WINDOW":
        entries = tuple(WindowEntry(e["index"], e["key"], value_from_json(e["value"])) for e in obj["entries"])
        return FetchWindow(obj["fetch_id"], obj["size"], entries)
    return QueryEntry(obj["request_id"], EntryKind[obj["kind"]], obj["key"], value_from_json(obj["value"]))


def _build_query(obj: JsonObj) -> bytes:
    """PROTOCOL.md 14.1, from the JSON form, with plain struct (independent of jetwire)."""
    out = _u8(obj["flags"]) + _u8(len(obj["matchers"]))
    for m in obj["matchers"]:
        out += _u8(PathOp[m["op"]]) + _u8(m["flags"]) + _u8(len(m["operands"]))
        out += b"".join(_str16(text) for text in m["operands"])
    out += _u8(len(obj["filters"]))
    for f in obj["filters"]:
        out += _u8(FilterOp[f["op"]]) + _u8(f["flags"]) + _str16(f["field"]) + _value(f["value"])
    out += _u8(SortBy[obj["sort_by"]]) + _u8(obj["sort_flags"]) + _str16(obj["sort_field"])
    return out + _u32(obj["from"]) + _u32(obj["to"])


def _build_query_message(obj: JsonObj) -> bytes | None:
    if obj["type"] == "REQUEST" and obj["function"] in _QUERY_FUNCTIONS:
        return _frame(1, _u32(obj["id"]) + _u8(Function[obj["function"]]) + _build_query(obj["query"]))
    if obj["type"] != "EVENT" or obj["code"] not in _QUERY_EVENTS:
        return None
    code = obj["code"]
    head = _u8(EventCode[code])
    if code in ("FETCH_METHOD", "FETCH_NODE"):
        return _frame(3, head + _u32(obj["fetch_id"]) + _u8(Action[obj["action"]]) + _str16(obj["key"]))
    if code == "FETCH_WINDOW":
        body = head + _u32(obj["fetch_id"]) + _u32(obj["size"]) + _u16(len(obj["entries"]))
        for e in obj["entries"]:
            body += _u32(e["index"]) + _str16(e["key"]) + _value(e["value"])
        return _frame(3, body)
    return _frame(
        3, head + _u32(obj["request_id"]) + _u8(EntryKind[obj["kind"]]) + _str16(obj["key"]) + _value(obj["value"])
    )


def _schema_query_to_json(payload: Any) -> JsonObj:
    return {
        "flags": payload.flags,
        "matchers": [
            {"op": PathOp(int(m.op)).name, "flags": m.flags, "operands": [o.operand for o in m.operands]}
            for m in payload.matchers
        ],
        "filters": [
            {"op": FilterOp(int(f.op)).name, "flags": f.flags, "field": f.field, "value": _schema_value_to_json(f)}
            for f in payload.filters
        ],
        "sort_by": SortBy(int(payload.sort_by)).name,
        "sort_flags": payload.sort_flags,
        "sort_field": payload.sort_field,
        "from": payload["from"],
        "to": payload.to,
    }


def _query_container_to_json(ftype: FrameType, body: Any) -> JsonObj | None:
    if ftype not in (FrameType.REQUEST, FrameType.EVENT):
        return None
    payload = body.payload
    if ftype == FrameType.REQUEST and int(body.function) in (Function.FETCH_QUERY, Function.QUERY_ONCE):
        name = Function(int(body.function)).name
        return {"type": "REQUEST", "id": body.id, "function": name, "query": _schema_query_to_json(payload)}
    if ftype != FrameType.EVENT or EventCode(int(body.code)).name not in _QUERY_EVENTS:
        return None
    code = EventCode(int(body.code)).name
    if code in ("FETCH_METHOD", "FETCH_NODE"):
        action = Action(int(payload.action)).name
        return {"type": "EVENT", "code": code, "fetch_id": payload.fetch_id, "action": action, "key": payload.key}
    if code == "FETCH_WINDOW":
        entries = [{"index": e.index, "key": e.key, "value": _schema_value_to_json(e)} for e in payload.entries]
        return {"type": "EVENT", "code": code, "fetch_id": payload.fetch_id, "size": payload.size, "entries": entries}
    return {
        "type": "EVENT",
        "code": code,
        "request_id": payload.request_id,
        "kind": EntryKind(int(payload.kind)).name,
        "key": payload.key,
        "value": _schema_value_to_json(payload),
    }


def _value_container(value: JsonObj) -> JsonObj:
    return {"value_type": value["vtype"], "value": bytes.fromhex(value["hex"])}


def _query_json_to_container(obj: JsonObj) -> JsonObj | None:
    if obj["type"] == "REQUEST" and obj["function"] in _QUERY_FUNCTIONS:
        q = obj["query"]
        payload = {
            "flags": q["flags"],
            "matchers": [
                {"op": PathOp[m["op"]], "flags": m["flags"], "operands": [{"operand": o} for o in m["operands"]]}
                for m in q["matchers"]
            ],
            "filters": [
                {"op": FilterOp[f["op"]], "flags": f["flags"], "field": f["field"], **_value_container(f["value"])}
                for f in q["filters"]
            ],
            "sort_by": SortBy[q["sort_by"]],
            "sort_flags": q["sort_flags"],
            "sort_field": q["sort_field"],
            "from": q["from"],
            "to": q["to"],
        }
        body = {"id": obj["id"], "function": Function[obj["function"]], "payload": payload}
        return {"type": FrameType.REQUEST, "body": body}
    if obj["type"] != "EVENT" or obj["code"] not in _QUERY_EVENTS:
        return None
    code = obj["code"]
    if code in ("FETCH_METHOD", "FETCH_NODE"):
        payload = {"fetch_id": obj["fetch_id"], "action": Action[obj["action"]], "key": obj["key"]}
    elif code == "FETCH_WINDOW":
        entries = [{"index": e["index"], "key": e["key"], **_value_container(e["value"])} for e in obj["entries"]]
        payload = {"fetch_id": obj["fetch_id"], "size": obj["size"], "entries": entries}
    else:
        payload = {
            "request_id": obj["request_id"],
            "kind": EntryKind[obj["kind"]],
            "key": obj["key"],
            **_value_container(obj["value"]),
        }
    return {"type": FrameType.EVENT, "body": {"code": EventCode[code], "payload": payload}}


def _scoreboard_query() -> JsonObj:
    return {
        "flags": 0,
        "matchers": [{"op": "STARTS_WITH", "flags": 0, "operands": ["players/"]}],
        "filters": [{"op": "EQ", "flags": 0, "field": "gender", "value": _v("STRING", b"female")}],
        "sort_by": "FIELD",
        "sort_flags": 1,
        "sort_field": "score",
        "from": 1,
        "to": 10,
    }


def _every_operator_query() -> JsonObj:
    matchers = [
        {"op": op.name, "flags": flags, "operands": ["a", "b"] if op in (PathOp.EQUALS_ONE_OF, PathOp.CONTAINS_ALL_OF) else ["x/"]}
        for op, flags in zip(PathOp, (0, 1, 2, 3, 0, 2), strict=True)
    ]
    operands = [_v("NONE", b""), _v("BOOL", b"\x01"), _v("INT64", _i64(-3)), _v("FLOAT64", _f64(2.5)),
                _v("STRING", "é".encode()), _v("BYTES", b"\x00\xff"), _v("INT64", _i64(6))]
    filters = [
        {"op": op.name, "flags": 0, "field": field, "value": value}
        for op, field, value in zip(FilterOp, ("", "a", "a.b", "tags.0", "x", "é.z", "o"), operands, strict=True)
    ]
    return {"flags": 3, "matchers": matchers, "filters": filters, "sort_by": "NONE", "sort_flags": 0,
            "sort_field": "", "from": 0, "to": 0}


def query_valid_vectors() -> list[tuple[str, str, JsonObj, str]]:
    """(name, section, fields, description) of the valid vectors of protocol 1.1 queries."""
    scoreboard = _scoreboard_query()
    empty = {"flags": 0, "matchers": [], "filters": [], "sort_by": "NONE", "sort_flags": 0,
             "sort_field": "", "from": 0, "to": 0}
    by_key = dict(empty, sort_by="KEY", **{"from": 11, "to": 20})
    entry_value = _v("JSON", b'{"s":9}')
    return [
        ("request_fetch_query_scoreboard", "14.1", {"type": "REQUEST", "id": 11, "function": "FETCH_QUERY", "query": scoreboard}, "female top ten by score"),
        ("request_fetch_query_empty", "14.1", {"type": "REQUEST", "id": 1, "function": "FETCH_QUERY", "query": empty}, "no matcher: every state"),
        ("request_fetch_query_every_operator", "14.1", {"type": "REQUEST", "id": 2, "function": "FETCH_QUERY", "query": _every_operator_query()}, "every matcher op and flag, every filter op"),
        ("request_query_once_by_key", "14.4", {"type": "REQUEST", "id": 3, "function": "QUERY_ONCE", "query": by_key}, "positions 11..20 by key"),
        ("event_fetch_unmatch", "14.2", {"type": "EVENT", "code": "FETCH_UNMATCH", "fetch_id": 9, "key": "players/ann", "value": entry_value}, ""),
        ("event_fetch_method_add", "14.2", {"type": "EVENT", "code": "FETCH_METHOD", "fetch_id": 9, "action": "ADD", "key": "plant/reset"}, ""),
        ("event_fetch_node_remove", "14.2", {"type": "EVENT", "code": "FETCH_NODE", "fetch_id": 9, "action": "REMOVE", "key": "plant/line3"}, ""),
        ("event_fetch_window_spec_example", "14.2", {"type": "EVENT", "code": "FETCH_WINDOW", "fetch_id": 7, "size": 10, "entries": [{"index": 3, "key": "players/ann", "value": entry_value}]}, "the example printed in PROTOCOL.md 14.2"),
        ("event_fetch_window_empty", "14.2", {"type": "EVENT", "code": "FETCH_WINDOW", "fetch_id": 7, "size": 0, "entries": []}, "the window emptied"),
        ("event_fetch_window_two", "14.2", {"type": "EVENT", "code": "FETCH_WINDOW", "fetch_id": 7, "size": 2, "entries": [{"index": 1, "key": "b", "value": _v("INT64", _i64(2))}, {"index": 2, "key": "a", "value": _v("NONE", b"")}]}, ""),
        ("event_query_entry_state", "14.4", {"type": "EVENT", "code": "QUERY_ENTRY", "request_id": 12, "kind": "STATE", "key": "players/bob", "value": _v("INT64", _i64(42))}, "the example printed in PROTOCOL.md 14.4"),
        ("event_query_entry_node", "14.4", {"type": "EVENT", "code": "QUERY_ENTRY", "request_id": 12, "kind": "NODE", "key": "players", "value": _v("NONE", b"")}, ""),
    ]


def query_invalid_vectors() -> list[tuple[str, str, bytes, str, str]]:
    """(name, section, frame, description, kind) of invalid 1.1 query frames; kind is
    ``request`` (id 5, MALFORMED, not fatal) or ``event`` (MALFORMED, fatal)."""
    empty_tail = _u8(0) + _u8(0) + _str16("") + _u32(0) + _u32(0)

    def fq(payload: bytes) -> bytes:
        return _frame(1, _u32(5) + _u8(0x0B) + payload)

    return [
        ("fetch_query_unknown_matcher_op", "14.1", fq(_u8(0) + _u8(1) + _u8(0x07) + _u8(0) + _u8(1) + _str16("a") + _u8(0) + empty_tail), "path matcher op 0x07 is not defined", "request"),
        ("fetch_query_unknown_filter_op", "14.1", fq(_u8(0) + _u8(0) + _u8(1) + _u8(0x08) + _u8(0) + _str16("") + _raw_value(0, b"") + empty_tail), "value filter op 0x08 is not defined", "request"),
        ("fetch_query_unknown_sort_by", "14.1", fq(_u8(0) + _u8(0) + _u8(0) + _u8(4) + _u8(0) + _str16("") + _u32(0) + _u32(0)), "sort_by 0x04 is not defined", "request"),
        ("fetch_query_truncated_window", "14.1", fq(_u8(0) + _u8(0) + _u8(0) + _u8(0) + _u8(0) + _str16("") + _u32(0)), "the window needs 8 bytes", "request"),
        ("fetch_query_trailing_byte", "14.1", fq(_u8(0) + _u8(0) + _u8(0) + empty_tail + b"\x00"), "nothing may follow the window", "request"),
        ("fetch_query_missing_matcher", "14.1", fq(_u8(0) + _u8(2) + _u8(1) + _u8(0) + _u8(1) + _str16("a") + _u8(0) + empty_tail), "two matchers announced, one present", "request"),
        ("query_once_bad_operand_value", "14.1", _frame(1, _u32(5) + _u8(0x0C) + _u8(0) + _u8(0) + _u8(1) + _u8(1) + _u8(0) + _str16("") + _raw_value(2, b"\x00") + empty_tail), "an INT64 operand of 1 byte", "request"),
        ("fetch_window_entry_truncated", "14.2", _frame(3, _u8(0x87) + _u32(7) + _u32(1) + _u16(1) + _u32(1) + _str16("k")), "the entry's value is missing", "event"),
        ("fetch_window_empty_key", "14.2", _frame(3, _u8(0x87) + _u32(7) + _u32(1) + _u16(1) + _u32(1) + _u16(0) + _raw_value(0, b"")), "keys are never empty", "event"),
        ("fetch_method_unknown_action", "14.2", _frame(3, _u8(0x85) + _u32(7) + _u8(3) + _str16("k")), "action 0x03 is not defined", "event"),
        ("query_entry_unknown_kind", "14.4", _frame(3, _u8(0x88) + _u32(7) + _u8(4) + _str16("k") + _raw_value(0, b"")), "kind 0x04 is not defined", "event"),
        ("fetch_node_trailing_byte", "14.2", _frame(3, _u8(0x86) + _u32(7) + _u8(1) + _str16("k") + b"\x00"), "nothing may follow the key", "event"),
    ]


def message_to_json(message: Message) -> JsonObj:
    """The JSON form of a decoded jetwire message."""
    query_form = _query_message_to_json(message)
    if query_form is not None:
        return query_form
    if isinstance(message, Info):
        return {
            "type": "INFO",
            "major": message.major,
            "minor": message.minor,
            "max_body": message.max_body,
            "features": message.features,
            "name": message.name,
            **(
                {}
                if message.max_key_length is None
                else {"max_key_length": message.max_key_length, "route_timeout_ms": message.route_timeout_ms}
            ),
        }
    if isinstance(message, Response):
        out: JsonObj = {"type": "RESPONSE", "id": message.id, "status": Status(message.status).name}
        if message.status != Status.OK:
            out["message"] = message.message
        elif message.value is not None:
            out["payload"] = "value"
            out["value"] = value_to_json(message.value)
        elif message.fetch_id is not None:
            out["payload"] = "fetch_id"
            out["fetch_id"] = message.fetch_id
        else:
            out["payload"] = "empty"
        return out
    if isinstance(message, Close):
        return {"type": "EVENT", "code": "CLOSE", "status": Status(message.status).name, "message": message.message}
    if isinstance(message, FetchEvent):
        return {
            "type": "EVENT",
            "code": message.code.name,
            "fetch_id": message.fetch_id,
            "key": message.key,
            "value": value_to_json(message.value),
        }
    if not isinstance(message, Request):
        raise TypeError(f"no JSON form for {message!r}")
    function = message.function.name
    out = {"type": "REQUEST", "id": message.id, "function": function} if message.id is not None else {
        "type": "EVENT",
        "code": function,
    }
    if isinstance(message, KeyValueRequest):
        out["key"] = message.key
        out["value"] = value_to_json(message.value)
    elif isinstance(message, KeyRequest):
        out["key"] = message.key
    elif isinstance(message, FetchStates):
        out["prefix"] = message.prefix
    elif isinstance(message, Unfetch):
        out["fetch_id"] = message.fetch_id
    elif isinstance(message, Authenticate):
        out["user"] = message.user
        out["password"] = message.password
    return out


_REQUEST_CLASSES = {cls.function.name: cls for cls in REQUEST_CLASSES.values()}
_FETCH_EVENT_CLASSES = {cls.code.name: cls for cls in FETCH_EVENT_CLASSES.values()}


def message_from_json(obj: JsonObj) -> Message:
    """Inverse of :func:`message_to_json`."""
    query_message = _query_message_from_json(obj)
    if query_message is not None:
        return query_message
    kind = obj["type"]
    if kind == "INFO":
        return Info(
            obj["name"], obj["max_body"], obj["features"], obj["major"], obj["minor"],
            obj.get("max_key_length"), obj.get("route_timeout_ms"),
        )
    if kind == "RESPONSE":
        status = Status[obj["status"]]
        if status != Status.OK:
            return Response(obj["id"], status, message=obj["message"])
        if obj["payload"] == "value":
            return Response(obj["id"], status, value=value_from_json(obj["value"]))
        if obj["payload"] == "fetch_id":
            return Response(obj["id"], status, fetch_id=obj["fetch_id"])
        return Response(obj["id"], status)
    if kind == "EVENT":
        code = obj["code"]
        if code == "CLOSE":
            return Close(Status[obj["status"]], obj["message"])
        if code in _FETCH_EVENT_CLASSES:
            return _FETCH_EVENT_CLASSES[code](obj["fetch_id"], obj["key"], value_from_json(obj["value"]))
        event_cls = _REQUEST_CLASSES[code]
        if not issubclass(event_cls, KeyValueRequest):  # PROTOCOL.md 7.1
            raise ValueError(f"{code} has no EVENT form")
        return event_cls(None, obj["key"], value_from_json(obj["value"]))
    cls = _REQUEST_CLASSES[obj["function"]]
    if issubclass(cls, KeyValueRequest):
        return cls(obj["id"], obj["key"], value_from_json(obj["value"]))
    if issubclass(cls, KeyRequest):
        return cls(obj["id"], obj["key"])
    if cls is FetchStates:
        return FetchStates(obj["id"], obj["prefix"])
    if cls is Authenticate:
        return Authenticate(obj["id"], obj["user"], obj["password"])
    return Unfetch(obj["id"], obj["fetch_id"])


def error_to_json(exc: RemoteProtocolError) -> JsonObj:
    """The JSON form of a decoding error: what a vector's ``error`` must equal."""
    try:
        frame_type: Any = FrameType(exc.frame_type).name if exc.frame_type is not None else None
    except ValueError:
        frame_type = exc.frame_type
    return {
        "status": Status(exc.status).name,
        "fatal": exc.fatal,
        "request_id": exc.request_id,
        "frame_type": frame_type,
    }


def _schema_value_to_json(payload: Any) -> JsonObj:
    return value_to_json(_RawValue(int(payload.value_type), bytes(payload.value)))  # type: ignore[arg-type]


def container_to_json(frame: Any) -> JsonObj:
    """The JSON form of a frame as :func:`jetwire.schema.parse_frame` returns it."""
    ftype = FrameType(int(frame.type))
    body = frame.body
    query_form = _query_container_to_json(ftype, body)
    if query_form is not None:
        return query_form
    if ftype == FrameType.INFO:
        return {
            "type": "INFO",
            "major": body.major,
            "minor": body.minor,
            "max_body": body.max_body,
            "features": body.features,
            "name": body.name,
            **(
                {}
                if body.limits is None
                else {"max_key_length": body.limits.max_key_length, "route_timeout_ms": body.limits.route_timeout_ms}
            ),
        }
    if ftype == FrameType.RESPONSE:
        status = Status(int(body.status))
        out: JsonObj = {"type": "RESPONSE", "id": body.id, "status": status.name}
        payload = body.payload
        if status != Status.OK:
            out["message"] = payload.message
        elif "value_type" in payload:
            out.update(payload="value", value=_schema_value_to_json(payload))
        elif "fetch_id" in payload:
            out.update(payload="fetch_id", fetch_id=payload.fetch_id)
        else:
            out["payload"] = "empty"
        return out
    payload = body.payload
    if ftype == FrameType.REQUEST:
        out = {"type": "REQUEST", "id": body.id, "function": Function(int(body.function)).name}
    else:
        out = {"type": "EVENT", "code": EventCode(int(body.code)).name}
    for name in ("status", "message", "fetch_id", "prefix", "key", "user", "password"):
        if name in payload:
            out[name] = Status(int(payload.status)).name if name == "status" else payload[name]
    if "value_type" in payload:
        out["value"] = _schema_value_to_json(payload)
    return out


def json_to_container(obj: JsonObj) -> JsonObj:
    """The input :func:`jetwire.schema.build_frame` takes for a message's JSON form."""
    query_container = _query_json_to_container(obj)
    if query_container is not None:
        return query_container
    kind = obj["type"]
    payload: JsonObj = {}
    for name in ("fetch_id", "prefix", "key", "message", "user", "password"):
        if name in obj:
            payload[name] = obj[name]
    if "value" in obj:
        payload["value_type"] = obj["value"]["vtype"]
        payload["value"] = bytes.fromhex(obj["value"]["hex"])
    if kind == "INFO":
        body = {name: obj[name] for name in ("major", "minor", "max_body", "features", "name")}
        body["limits"] = (
            {"max_key_length": obj["max_key_length"], "route_timeout_ms": obj["route_timeout_ms"], "later": b""}
            if "max_key_length" in obj
            else None
        )
        return {"type": FrameType.INFO, "body": body}
    if kind == "RESPONSE":
        if obj["status"] == "OK":
            payload.pop("message", None)
        return {"type": FrameType.RESPONSE, "body": {"id": obj["id"], "status": Status[obj["status"]], "payload": payload}}
    if kind == "REQUEST":
        return {
            "type": FrameType.REQUEST,
            "body": {"id": obj["id"], "function": Function[obj["function"]], "payload": payload},
        }
    if obj["code"] == "CLOSE":
        payload["status"] = Status[obj["status"]]
    return {"type": FrameType.EVENT, "body": {"code": EventCode[obj["code"]], "payload": payload}}


def log_item_to_json(item: Any) -> JsonObj:
    """The JSON form of one item a :class:`jetwire.log.LogReader` yields (jetlog.json)."""
    from jetwire.log import Corruption
    from jetwire.log import LogHeader
    from jetwire.log import LogRecord
    from jetwire.log import Truncation
    from jetwire.log import parse_record_data

    if isinstance(item, LogHeader):
        return {
            "item": "header",
            "name": item.name,
            "created_ns": item.created_ns,
            "segment": item.segment,
            "version": item.version,
            "flags": item.flags,
            "size": item.size,
            "run_ns": item.run_ns,
        }
    if isinstance(item, LogRecord):
        out: JsonObj = {
            "item": "record",
            "offset": item.offset,
            "ts_ns": item.ts_ns,
            "conn_id": item.conn_id,
            "kind": item.kind,
            "kind_name": LOG_KINDS.get(item.kind),
            "data_hex": item.data.hex(),
        }
        if item.kind in (3, 4, 5, 6, 7, 8):
            fields = parse_record_data(item.kind, item.data)
            if "status" in fields:
                fields["status"] = Status(int(fields["status"])).name  # type: ignore[call-overload]
            out["fields"] = fields
        return out
    if isinstance(item, Corruption):
        return {"item": "corruption", "offset": item.offset, "length": item.length}
    if isinstance(item, Truncation):
        return {"item": "truncation", "offset": item.offset, "present": item.present, "needed": item.needed}
    raise TypeError(f"not a log item: {item!r}")


# --- an independent builder: JSON form -> bytes ------------------------------------------


def _u8(n: int) -> bytes:
    return struct.pack(">B", n)


def _u16(n: int) -> bytes:
    return struct.pack(">H", n)


def _u32(n: int) -> bytes:
    return struct.pack(">I", n)


def _str16(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _u16(len(raw)) + raw


def _value(obj: JsonObj) -> bytes:
    data = bytes.fromhex(obj["hex"])
    return _u8(obj["vtype"]) + _u32(len(data)) + data


def _frame(ftype: int, body: bytes) -> bytes:
    return _u8(ftype) + _u32(len(body)) + body


_PAYLOAD_FIELDS = {
    "ADD_STATE": "kv",
    "REMOVE_STATE": "k",
    "SET_STATE": "kv",
    "NOTIFY_STATE": "kv",
    "CALL_METHOD": "kv",
    "ADD_METHOD": "k",
    "REMOVE_METHOD": "k",
    "FETCH_STATES": "prefix",
    "UNFETCH": "fetch_id",
    "GET_STATE": "k",
    "AUTHENTICATE": "auth",
}


def _payload(name: str, obj: JsonObj) -> bytes:
    shape = _PAYLOAD_FIELDS[name]
    if shape == "kv":
        return _str16(obj["key"]) + _value(obj["value"])
    if shape == "k":
        return _str16(obj["key"])
    if shape == "prefix":
        return _str16(obj["prefix"])
    if shape == "auth":
        return _str16(obj["user"]) + _str16(obj["password"])
    return _u32(obj["fetch_id"])


def build(obj: JsonObj) -> bytes:
    """Build the frame bytes of a valid vector's JSON form (PROTOCOL.md 3-7, 14)."""
    query_frame = _build_query_message(obj)
    if query_frame is not None:
        return query_frame
    kind = obj["type"]
    if kind == "REQUEST":
        body = _u32(obj["id"]) + _u8(Function[obj["function"]]) + _payload(obj["function"], obj)
        return _frame(1, body)
    if kind == "RESPONSE":
        head = _u32(obj["id"]) + _u8(Status[obj["status"]])
        if obj["status"] != "OK":
            return _frame(2, head + _str16(obj["message"]))
        if obj["payload"] == "value":
            return _frame(2, head + _value(obj["value"]))
        if obj["payload"] == "fetch_id":
            return _frame(2, head + _u32(obj["fetch_id"]))
        return _frame(2, head)
    if kind == "EVENT":
        code = obj["code"]
        if code == "CLOSE":
            return _frame(3, _u8(0xF0) + _u8(Status[obj["status"]]) + _str16(obj["message"]))
        if code.startswith("FETCH_"):
            body = _u8(EventCode[code]) + _u32(obj["fetch_id"]) + _str16(obj["key"]) + _value(obj["value"])
            return _frame(3, body)
        return _frame(3, _u8(EventCode[code]) + _str16(obj["key"]) + _value(obj["value"]))
    body = (
        _u8(obj["major"]) + _u8(obj["minor"]) + _u32(obj["max_body"]) + _u32(obj["features"]) + _str16(obj["name"])
    )
    if "max_key_length" in obj:  # PROTOCOL.md 4.4.1
        body += struct.pack(">HI", obj["max_key_length"], obj["route_timeout_ms"])
    return _frame(4, body)


# --- valid vectors ------------------------------------------------------------------------


def _v(vtype: str | int, data: bytes) -> JsonObj:
    """A Value's JSON form from its type and data (informational fields included)."""
    code = ValueType[vtype] if isinstance(vtype, str) else vtype
    return value_to_json(_RawValue(code, data))  # type: ignore[arg-type]


class _RawValue:
    """Duck-typed stand-in for Value so the generator does not rely on Value's checks."""

    def __init__(self, vtype: int, data: bytes) -> None:
        self.vtype = vtype
        self.data = data


def _f64(x: float) -> bytes:
    return struct.pack(">d", x)


def _i64(n: int) -> bytes:
    return struct.pack(">q", n)


# PROTOCOL.md's printed examples: (vector name, section, fields, the hex as printed).
SPEC_EXAMPLES: list[tuple[str, str, JsonObj, str]] = [
    (
        "info_jetd_spec_example",
        "4.4",
        {"type": "INFO", "major": 1, "minor": 3, "max_body": 1048576, "features": 27, "name": "jetd"},
        "04 00 00 00 10 01 03 00 10 00 00 00 00 00 1b 00 04 6a 65 74 64",
    ),
    (
        "info_limits_spec_example",
        "4.4.1",
        {"type": "INFO", "major": 1, "minor": 3, "max_body": 1048576, "features": 27, "name": "jetd",
         "max_key_length": 1024, "route_timeout_ms": 5000},
        "04 00 00 00 16 01 03 00 10 00 00 00 00 00 1b 00 04 6a 65 74 64 04 00 00 00 13 88",
    ),
    (
        "request_add_state_spec_example",
        "6.1",
        {"type": "REQUEST", "id": 1, "function": "ADD_STATE", "key": "temp", "value": _v("INT64", _i64(21))},
        "01 00 00 00 18 00 00 00 01 01 00 04 74 65 6d 70 02 00 00 00 08 00 00 00 00 00 00 00 15",
    ),
    (
        "request_remove_state_spec_example",
        "6.2",
        {"type": "REQUEST", "id": 2, "function": "REMOVE_STATE", "key": "temp"},
        "01 00 00 00 0b 00 00 00 02 02 00 04 74 65 6d 70",
    ),
    (
        "request_set_state_spec_example",
        "6.3",
        {"type": "REQUEST", "id": 3, "function": "SET_STATE", "key": "temp", "value": _v("FLOAT64", _f64(22.5))},
        "01 00 00 00 18 00 00 00 03 03 00 04 74 65 6d 70 03 00 00 00 08 40 36 80 00 00 00 00 00",
    ),
    (
        "request_notify_state_spec_example",
        "6.4",
        {"type": "REQUEST", "id": 4, "function": "NOTIFY_STATE", "key": "temp", "value": _v("FLOAT64", _f64(22.5))},
        "01 00 00 00 18 00 00 00 04 04 00 04 74 65 6d 70 03 00 00 00 08 40 36 80 00 00 00 00 00",
    ),
    (
        "request_call_method_spec_example",
        "6.5",
        {"type": "REQUEST", "id": 5, "function": "CALL_METHOD", "key": "reset", "value": _v("JSON", b"[1,2]")},
        "01 00 00 00 16 00 00 00 05 05 00 05 72 65 73 65 74 05 00 00 00 05 5b 31 2c 32 5d",
    ),
    (
        "request_add_method_spec_example",
        "6.6",
        {"type": "REQUEST", "id": 6, "function": "ADD_METHOD", "key": "reset"},
        "01 00 00 00 0c 00 00 00 06 06 00 05 72 65 73 65 74",
    ),
    (
        "request_remove_method_spec_example",
        "6.7",
        {"type": "REQUEST", "id": 7, "function": "REMOVE_METHOD", "key": "reset"},
        "01 00 00 00 0c 00 00 00 07 07 00 05 72 65 73 65 74",
    ),
    (
        "request_fetch_states_spec_example",
        "6.8",
        {"type": "REQUEST", "id": 8, "function": "FETCH_STATES", "prefix": "plant/"},
        "01 00 00 00 0d 00 00 00 08 08 00 06 70 6c 61 6e 74 2f",
    ),
    (
        "request_unfetch_spec_example",
        "6.9",
        {"type": "REQUEST", "id": 9, "function": "UNFETCH", "fetch_id": 3},
        "01 00 00 00 09 00 00 00 09 09 00 00 00 03",
    ),
    (
        "request_get_state_spec_example",
        "6.10",
        {"type": "REQUEST", "id": 10, "function": "GET_STATE", "key": "temp"},
        "01 00 00 00 0b 00 00 00 0a 0a 00 04 74 65 6d 70",
    ),
    (
        "response_ok_empty_spec_example",
        "6.11",
        {"type": "RESPONSE", "id": 1, "status": "OK", "payload": "empty"},
        "02 00 00 00 05 00 00 00 01 00",
    ),
    (
        "response_ok_value_spec_example",
        "6.11",
        {"type": "RESPONSE", "id": 3, "status": "OK", "payload": "value", "value": _v("FLOAT64", _f64(22.5))},
        "02 00 00 00 12 00 00 00 03 00 03 00 00 00 08 40 36 80 00 00 00 00 00",
    ),
    (
        "response_ok_fetch_id_spec_example",
        "6.11",
        {"type": "RESPONSE", "id": 8, "status": "OK", "payload": "fetch_id", "fetch_id": 3},
        "02 00 00 00 09 00 00 00 08 00 00 00 00 03",
    ),
    (
        "response_not_found_spec_example",
        "6.11",
        {"type": "RESPONSE", "id": 2, "status": "NOT_FOUND", "message": "no such state"},
        "02 00 00 00 14 00 00 00 02 01 00 0d 6e 6f 20 73 75 63 68 20 73 74 61 74 65",
    ),
    (
        "request_authenticate_spec_example",
        "6.12",
        {"type": "REQUEST", "id": 11, "function": "AUTHENTICATE", "user": "alice", "password": "s3cr3t"},
        "01 00 00 00 14 00 00 00 0b 10 00 05 61 6c 69 63 65 00 06 73 33 63 72 33 74",
    ),
    (
        "response_auth_failed_spec_example",
        "6.11",
        {"type": "RESPONSE", "id": 11, "status": "AUTH_FAILED", "message": "authentication failed"},
        "02 00 00 00 1c 00 00 00 0b 0e 00 15 61 75 74 68 65 6e 74 69 63 61 74 69 6f 6e 20 66 61 69 6c 65 64",
    ),
    (
        "event_set_state_spec_example",
        "7.1",
        {"type": "EVENT", "code": "SET_STATE", "key": "temp", "value": _v("FLOAT64", _f64(22.5))},
        "03 00 00 00 14 03 00 04 74 65 6d 70 03 00 00 00 08 40 36 80 00 00 00 00 00",
    ),
    (
        "event_fetch_add_spec_example",
        "7.2",
        {"type": "EVENT", "code": "FETCH_ADD", "fetch_id": 3, "key": "plant/temp", "value": _v("INT64", _i64(21))},
        "03 00 00 00 1e 81 00 00 00 03 00 0a 70 6c 61 6e 74 2f 74 65 6d 70 02 00 00 00 08 00 00 00 00 00 00 00 15",
    ),
    (
        "event_fetch_change_spec_example",
        "7.2",
        {"type": "EVENT", "code": "FETCH_CHANGE", "fetch_id": 3, "key": "plant/temp", "value": _v("BOOL", b"\x01")},
        "03 00 00 00 17 82 00 00 00 03 00 0a 70 6c 61 6e 74 2f 74 65 6d 70 01 00 00 00 01 01",
    ),
    (
        "event_fetch_remove_spec_example",
        "7.2",
        {"type": "EVENT", "code": "FETCH_REMOVE", "fetch_id": 3, "key": "plant/temp", "value": _v("STRING", b"off")},
        "03 00 00 00 19 83 00 00 00 03 00 0a 70 6c 61 6e 74 2f 74 65 6d 70 04 00 00 00 03 6f 66 66",
    ),
    (
        "event_close_shutdown_spec_example",
        "7.3",
        {"type": "EVENT", "code": "CLOSE", "status": "OK", "message": "shutting down"},
        "03 00 00 00 11 f0 00 00 0d 73 68 75 74 74 69 6e 67 20 64 6f 77 6e",
    ),
]

_NAN_QUIET = bytes.fromhex("7ff8000000000000")
_NAN_PAYLOAD = bytes.fromhex("7ff0000000000001")  # signalling NaN: bits must survive untouched
_NAN_NEGATIVE = bytes.fromhex("fff8000000000000")

VALUE_CASES: list[tuple[str, JsonObj]] = [
    ("none", _v("NONE", b"")),
    ("bool_false", _v("BOOL", b"\x00")),
    ("bool_true", _v("BOOL", b"\x01")),
    ("int64_zero", _v("INT64", _i64(0))),
    ("int64_one", _v("INT64", _i64(1))),
    ("int64_minus_one", _v("INT64", _i64(-1))),
    ("int64_min", _v("INT64", _i64(-(2**63)))),
    ("int64_max", _v("INT64", _i64(2**63 - 1))),
    ("int64_above_2_53", _v("INT64", _i64(2**53 + 1))),
    ("float64_22_5", _v("FLOAT64", _f64(22.5))),
    ("float64_negative_zero", _v("FLOAT64", _f64(-0.0))),
    ("float64_inf", _v("FLOAT64", _f64(math.inf))),
    ("float64_negative_inf", _v("FLOAT64", _f64(-math.inf))),
    ("float64_nan_quiet", _v("FLOAT64", _NAN_QUIET)),
    ("float64_nan_negative", _v("FLOAT64", _NAN_NEGATIVE)),
    ("float64_nan_signalling_payload", _v("FLOAT64", _NAN_PAYLOAD)),
    ("float64_smallest_subnormal", _v("FLOAT64", _f64(5e-324))),
    ("float64_max", _v("FLOAT64", _f64(1.7976931348623157e308))),
    ("string_ascii", _v("STRING", b"running")),
    ("string_empty", _v("STRING", b"")),
    ("string_non_ascii", _v("STRING", "Größe 温度 ✓ 🌡".encode())),
    ("string_nul_byte", _v("STRING", b"a\x00b")),
    ("json_object", _v("JSON", b'{"a":[1,2.5,null,true],"b":"\xc3\xa9"}')),
    ("json_number", _v("JSON", b"42")),
    ("json_not_parsed_by_the_codec", _v("JSON", b"{not json")),
    ("bytes_binary", _v("BYTES", bytes(range(256)))),
    ("bytes_empty", _v("BYTES", b"")),
    ("bytes_invalid_utf8_is_fine", _v("BYTES", b"\xff\xfe\xc0\x80")),
    ("cbor_map", _v("CBOR", bytes.fromhex("a16174fb4036800000000000"))),  # {"t": 22.5}
    ("msgpack_map", _v("MSGPACK", bytes.fromhex("81a174cb4036800000000000"))),  # {"t": 22.5}
    ("application_0x80", _v(0x80, b"\x01\x02\x03")),
    ("application_0xff", _v(0xFF, b"\xff" * 4)),
    ("application_0x80_empty", _v(0x80, b"")),
    ("bytes_70000", _v("BYTES", bytes(i % 251 for i in range(70000)))),
]


def valid_vectors() -> list[JsonObj]:
    """Every valid vector, in a stable order."""
    out: list[JsonObj] = []

    def add(name: str, section: str, fields: JsonObj, description: str = "", **extra: Any) -> None:
        vector: JsonObj = {"name": name, "section": section}
        if description:
            vector["description"] = description
        vector.update(extra)
        vector["hex"] = build(fields).hex()
        vector["message"] = fields
        out.append(vector)

    for name, section, example, printed in SPEC_EXAMPLES:
        if build(example).hex() != printed.replace(" ", ""):
            raise SystemExit(f"vector {name} does not reproduce PROTOCOL.md {section}: {build(example).hex()}")
        add(name, section, example, f"the example printed in PROTOCOL.md {section}", spec_example=True)

    # PROTOCOL.md 6 and 7.1: every function as a REQUEST, the starred ones as EVENTs too.
    temp = "plant/line3/temp"
    for function, shape in _PAYLOAD_FIELDS.items():
        fields: JsonObj = {"type": "REQUEST", "id": 0x1000 + Function[function], "function": function}
        if shape == "kv":
            fields.update(key=temp, value=_v("FLOAT64", _f64(21.75)))
        elif shape == "k":
            fields["key"] = temp
        elif shape == "prefix":
            fields["prefix"] = "plant/line3/"
        elif shape == "auth":
            fields.update(user="operator", password="correct horse")
        else:
            fields["fetch_id"] = 77
        add(f"request_{function.lower()}", "6", fields)
    for function in ("SET_STATE", "NOTIFY_STATE", "CALL_METHOD"):
        add(
            f"event_{function.lower()}",
            "7.1",
            {"type": "EVENT", "code": function, "key": temp, "value": _v("INT64", _i64(-5))},
            "fire-and-forget form: no id, no response",
        )
    for code in ("FETCH_ADD", "FETCH_CHANGE", "FETCH_REMOVE"):
        add(
            f"event_{code.lower()}",
            "7.2",
            {"type": "EVENT", "code": code, "fetch_id": 0xFFFFFFFF, "key": temp, "value": _v("STRING", b"ok")},
        )

    # PROTOCOL.md 4.2 and 8: every status as a RESPONSE and inside CLOSE.
    add("response_ok_empty", "4.2", {"type": "RESPONSE", "id": 0, "status": "OK", "payload": "empty"})
    add(
        "response_ok_fetch_id",
        "4.2",
        {"type": "RESPONSE", "id": 0xFFFFFFFF, "status": "OK", "payload": "fetch_id", "fetch_id": 0xFFFFFFFF},
    )
    add(
        "response_ok_value_none",
        "4.2",
        {"type": "RESPONSE", "id": 12, "status": "OK", "payload": "value", "value": _v("NONE", b"")},
        "the smallest Value payload: 5 bytes",
    )
    for status in Status:
        if status == Status.OK:
            continue
        add(
            f"response_{status.name.lower()}",
            "8",
            {"type": "RESPONSE", "id": 100 + status, "status": status.name, "message": f"{status.name.lower()} here"},
        )
    add(
        "response_error_empty_message",
        "4.2",
        {"type": "RESPONSE", "id": 5, "status": "REJECTED", "message": ""},
    )
    add(
        "response_error_non_ascii_message",
        "5.1",
        {"type": "RESPONSE", "id": 6, "status": "REJECTED", "message": "Wert zu groß: 120 °C"},
    )
    for status in Status:
        add(
            f"close_{status.name.lower()}",
            "7.3",
            {"type": "EVENT", "code": "CLOSE", "status": status.name, "message": status.name.lower().replace("_", " ")},
        )
    add("close_empty_message", "7.3", {"type": "EVENT", "code": "CLOSE", "status": "MALFORMED", "message": ""})

    # PROTOCOL.md 5.3: every value type, as SET_STATE payloads and OK payloads.
    for index, (name, value) in enumerate(VALUE_CASES):
        add(
            f"value_{name}",
            "5.3",
            {"type": "REQUEST", "id": 200 + index, "function": "SET_STATE", "key": temp, "value": value},
        )
    for name in ("int64_min", "string_non_ascii", "application_0xff", "float64_nan_signalling_payload"):
        add(
            f"response_ok_value_{name}",
            "4.2",
            {"type": "RESPONSE", "id": 300, "status": "OK", "payload": "value", "value": dict(VALUE_CASES)[name]},
        )

    # PROTOCOL.md 4.4: INFO variants.
    add(
        "info_peer_no_features",
        "4.4",
        {"type": "INFO", "major": 1, "minor": 0, "max_body": 65536, "features": 0, "name": "sensor-7"},
    )
    add(
        "info_empty_name_max_u32",
        "4.4",
        {"type": "INFO", "major": 1, "minor": 0, "max_body": 0xFFFFFFFF, "features": 0, "name": ""},
    )
    add(
        "info_future_minor_and_reserved_features",
        "2",
        {"type": "INFO", "major": 1, "minor": 7, "max_body": 1048576, "features": 0xFFFFFFFF, "name": "jetd"},
        "a minor version only adds; reserved feature bits are ignored by receivers",
    )

    # PROTOCOL.md 6.12: AUTHENTICATE variants (protocol 1.1).
    add(
        "authenticate_empty_password",
        "6.12",
        {"type": "REQUEST", "id": 1, "function": "AUTHENTICATE", "user": "u", "password": ""},
        "an empty password is well formed (the daemon answers AUTH_FAILED unless it matches)",
    )
    add(
        "authenticate_non_ascii",
        "6.12",
        {"type": "REQUEST", "id": 2, "function": "AUTHENTICATE", "user": "jürgen", "password": "pässwört 🔑"},
    )
    add(
        "info_max_body_64",
        "4.4",
        {"type": "INFO", "major": 1, "minor": 2, "max_body": 64, "features": 0, "name": "tiny-sensor"},
        "the smallest max_body an INFO may announce",
    )
    add(
        "request_get_state_key_starts_with_bom",
        "5.1",
        {"type": "REQUEST", "id": 7, "function": "GET_STATE", "key": "\ufeffplant/temp"},
        "a key whose first character is U+FEFF (EF BB BF): a decoder MUST keep it; some UTF-8 "
        "decoders strip it as a byte order mark, which would name another key",
    )
    add(
        "info_limits_extremes",
        "4.4.1",
        {"type": "INFO", "major": 1, "minor": 2, "max_body": 65536, "features": 8, "name": "",
         "max_key_length": 65535, "route_timeout_ms": 0},
        "the limits extension after an empty name; route_timeout_ms 0: the daemon never answers TIMEOUT",
    )
    add(
        "info_peer_asks_for_limits",
        "4.4.1",
        {"type": "INFO", "major": 1, "minor": 2, "max_body": 1048576, "features": 8, "name": "sensor-7"},
        "a peer's INFO with LIMITS set: it asks the daemon for the limits extension",
    )
    add(
        "info_auth_required",
        "4.4",
        {"type": "INFO", "major": 1, "minor": 1, "max_body": 1048576, "features": 5, "name": "jetd"},
        "CONFLATION and AUTH_REQUIRED (protocol 1.1)",
    )

    # PROTOCOL.md 5.1, 5.2: keys and prefixes.
    add("fetch_empty_prefix", "6.8", {"type": "REQUEST", "id": 1, "function": "FETCH_STATES", "prefix": ""})
    add(
        "fetch_non_ascii_prefix",
        "6.8",
        {"type": "REQUEST", "id": 1, "function": "FETCH_STATES", "prefix": "anlage/größe"},
    )
    add("key_one_byte", "5.2", {"type": "REQUEST", "id": 1, "function": "GET_STATE", "key": "a"})
    add("key_non_ascii", "5.2", {"type": "REQUEST", "id": 1, "function": "GET_STATE", "key": "anlage/温度/🌡"})
    add("key_slash_only", "5.2", {"type": "REQUEST", "id": 1, "function": "GET_STATE", "key": "/"})
    add(
        "key_max_length",
        "5.2",
        {"type": "REQUEST", "id": 1, "function": "GET_STATE", "key": "k" * 65535},
        "the longest key the wire allows: 65535 bytes",
    )
    add(
        "key_max_length_multibyte",
        "5.2",
        {"type": "REQUEST", "id": 2, "function": "REMOVE_METHOD", "key": "é" * 32767 + "k"},
        "65535 bytes of 2-byte UTF-8 sequences and one ASCII byte",
    )
    add("unfetch_max_fetch_id", "6.9", {"type": "REQUEST", "id": 0, "function": "UNFETCH", "fetch_id": 0xFFFFFFFF})
    add(
        "request_id_max",
        "4.1",
        {"type": "REQUEST", "id": 0xFFFFFFFF, "function": "ADD_STATE", "key": "k", "value": _v("NONE", b"")},
    )
    add(
        "body_exactly_max_body",
        "3",
        {"type": "REQUEST", "id": 1, "function": "SET_STATE", "key": "k", "value": _v("BYTES", b"x" * 4)},
        "a 17-byte body with max_body 17 is accepted",
        max_body=17,
    )
    for name, section, fields, description in query_valid_vectors():
        add(name, section, fields, description)
    return out


# --- invalid and incomplete vectors ----------------------------------------------------------


def _err(status: str, *, fatal: bool, request_id: int | None, frame_type: str | int | None) -> JsonObj:
    return {"status": status, "fatal": fatal, "request_id": request_id, "frame_type": frame_type}


def _req(rid: int, function: int, payload: bytes) -> bytes:
    return _frame(1, _u32(rid) + _u8(function) + payload)


def _raw_value(vtype: int, data: bytes, n: int | None = None) -> bytes:
    return _u8(vtype) + _u32(len(data) if n is None else n) + data


def _key(raw: bytes, n: int | None = None) -> bytes:
    return _u16(len(raw) if n is None else n) + raw


def invalid_vectors() -> list[JsonObj]:
    """Every invalid vector: bytes that must produce the named error."""
    out: list[JsonObj] = []

    def add(name: str, section: str, data: bytes, error: JsonObj, description: str, **extra: Any) -> None:
        vector: JsonObj = {"name": name, "section": section, "description": description}
        vector.update(extra)
        vector["hex"] = data.hex()
        vector["error"] = error
        out.append(vector)

    def bad_request(name: str, section: str, data: bytes, description: str, rid: int, status: str = "MALFORMED") -> None:
        add(name, section, data, _err(status, fatal=False, request_id=rid, frame_type="REQUEST"), description)

    def bad_event(name: str, section: str, data: bytes, description: str, status: str = "MALFORMED") -> None:
        add(name, section, data, _err(status, fatal=True, request_id=None, frame_type="EVENT"), description)

    def bad_response(name: str, section: str, data: bytes, description: str, rid: int | None) -> None:
        add(name, section, data, _err("MALFORMED", fatal=False, request_id=rid, frame_type="RESPONSE"), description)

    def bad_info(name: str, section: str, data: bytes, description: str) -> None:
        add(name, section, data, _err("MALFORMED", fatal=True, request_id=None, frame_type="INFO"), description)

    temp = b"temp"
    f225 = _raw_value(3, _f64(22.5))
    set_payload = _key(temp) + f225

    # Frame header (PROTOCOL.md 3, 9.2).
    for ftype in (0x00, 0x05, 0x7F, 0xFF):
        add(
            f"frame_type_unknown_0x{ftype:02x}",
            "3",
            _frame(ftype, b"\x00\x00\x00\x01\x00"),
            _err("MALFORMED", fatal=True, request_id=None, frame_type=ftype),
            "an unknown frame type is fatal",
        )
    add(
        "frame_body_over_default_max",
        "3",
        _u8(1) + _u32(DEFAULT_MAX_BODY + 1),
        _err("TOO_LARGE", fatal=True, request_id=None, frame_type="REQUEST"),
        "the header alone announces 1 MiB + 1: rejected before any body byte arrives",
        max_body=DEFAULT_MAX_BODY,
    )
    add(
        "frame_body_length_u32_max",
        "3",
        _u8(3) + _u32(0xFFFFFFFF),
        _err("TOO_LARGE", fatal=True, request_id=None, frame_type="EVENT"),
        "a header announcing 2**32-1 body bytes",
        max_body=DEFAULT_MAX_BODY,
    )
    add(
        "frame_body_over_small_max",
        "3",
        _req(1, 3, _key(b"k") + _raw_value(6, b"x" * 5)),
        _err("TOO_LARGE", fatal=True, request_id=None, frame_type="REQUEST"),
        "an 18-byte body with max_body 17",
        max_body=17,
    )
    add(
        "frame_length_shorter_than_body",
        "3",
        _frame(1, _u32(3) + _u8(3) + set_payload)[:1] + _u32(19) + (_u32(3) + _u8(3) + set_payload),
        _err("MALFORMED", fatal=False, request_id=3, frame_type="REQUEST"),
        "length says 19 of 24 body bytes: the value runs past the body end (the last 5 bytes then start a new frame)",
    )

    # REQUEST bodies (PROTOCOL.md 4.1, 9.1).
    for n in (0, 1, 3):
        add(
            f"request_body_{n}_bytes",
            "9.1",
            _frame(1, b"\x00\x00\x00\x07"[:n]),
            _err("MALFORMED", fatal=True, request_id=None, frame_type="REQUEST"),
            "a REQUEST body under 4 bytes has no readable id: CLOSE",
        )
    bad_request("request_body_id_only", "9.1", _frame(1, _u32(7)), "id readable, function missing", 7)
    for function in (0x00, 0x0D, 0x80, 0xFF):
        bad_request(
            f"request_function_unknown_0x{function:02x}",
            "6",
            _req(9, function, set_payload),
            "answered UNKNOWN_FUNCTION; the connection stays up",
            9,
            "UNKNOWN_FUNCTION",
        )
    bad_request("request_truncated_in_key_length", "5.1", _req(3, 3, b"\x00"), "1 of 2 key-length bytes", 3)
    # AUTHENTICATE (PROTOCOL.md 6.12, protocol 1.1).
    bad_request("authenticate_empty_user", "6.12", _req(11, 0x10, _key(b"") + _key(b"pw")), "user of length 0", 11)
    bad_request(
        "authenticate_no_password", "6.12", _req(11, 0x10, _key(b"alice")), "the password's str16 is missing", 11
    )
    bad_request(
        "authenticate_trailing_byte", "6.12", _req(11, 0x10, _key(b"alice") + _key(b"pw") + b"\x00"), "one byte too many", 11
    )
    bad_request(
        "authenticate_password_bad_utf8", "6.12", _req(11, 0x10, _key(b"alice") + _key(b"\xff")), "invalid UTF-8", 11
    )
    bad_request(
        "authenticate_password_length_lies",
        "6.12",
        _req(11, 0x10, _key(b"alice") + _key(b"pw", 3)),
        "password length 3, 2 bytes",
        11,
    )
    bad_request("request_truncated_in_key", "5.2", _req(3, 3, _key(temp)[:4]), "key length 4, 2 key bytes", 3)
    bad_request("request_truncated_before_value", "5.3", _req(3, 3, _key(temp)), "SET_STATE without a value", 3)
    bad_request(
        "request_truncated_in_value_header", "5.3", _req(3, 3, _key(temp) + f225[:3]), "3 of 5 value-header bytes", 3
    )
    bad_request(
        "request_truncated_in_value_data", "5.3", _req(3, 3, _key(temp) + f225[:9]), "4 of 8 FLOAT64 bytes", 3
    )
    bad_request(
        "request_key_length_lies_long", "5.2", _req(3, 2, _key(temp, 5)), "key length 5, 4 bytes follow", 3
    )
    bad_request(
        "request_key_length_lies_long_with_value",
        "5.2",
        _req(3, 3, _key(temp, 200) + f225),
        "key length 200 runs past the body end",
        3,
    )
    bad_request(
        "request_key_length_lies_short",
        "5.2",
        _req(3, 3, _key(temp, 2) + f225),
        "key length 2: the value header is read from 'mp' and meets reserved type 0x6d",
        3,
    )
    bad_request(
        "request_value_length_lies_long",
        "5.3",
        _req(3, 3, _key(temp) + _raw_value(6, b"abc", 4)),
        "value length 4, 3 bytes follow",
        3,
    )
    bad_request(
        "request_value_length_u32_max",
        "5.3",
        _req(3, 3, _key(temp) + _raw_value(6, b"abc", 0xFFFFFFFF)),
        "value length 2**32-1 in a small body",
        3,
    )
    bad_request(
        "request_value_length_lies_short",
        "5.3",
        _req(3, 3, _key(temp) + _raw_value(6, b"abc", 2)),
        "value length 2, 3 bytes follow: a trailing byte",
        3,
    )
    bad_request("request_empty_key_get", "5.2", _req(4, 0x0A, _key(b"")), "an empty key", 4)
    bad_request("request_empty_key_add_state", "5.2", _req(4, 1, _key(b"") + f225), "an empty key", 4)
    bad_request("request_empty_key_add_method", "5.2", _req(4, 6, _key(b"")), "an empty key", 4)
    for label, raw in (
        ("byte_ff", b"te\xffmp"),
        ("overlong_nul", b"a\xc0\x80"),
        ("surrogate", b"\xed\xa0\x80"),
        ("truncated_sequence", b"temp\xe2\x82"),
        ("lone_continuation", b"\x80temp"),
    ):
        bad_request(f"request_key_bad_utf8_{label}", "5.1", _req(5, 3, _key(raw) + f225), "invalid UTF-8 in a key", 5)
    bad_request("request_key_only_bad_utf8", "5.1", _req(5, 0x0A, _key(b"\xfe")), "invalid UTF-8 in a key", 5)
    bad_request("request_prefix_bad_utf8", "5.1", _req(6, 8, _key(b"plant\xff")), "invalid UTF-8 in a prefix", 6)
    bad_request("request_prefix_length_lies", "5.1", _req(6, 8, _key(b"plant", 9)), "prefix length 9, 5 bytes", 6)
    bad_request("request_prefix_missing", "6.8", _req(6, 8, b""), "FETCH_STATES without its prefix length", 6)
    bad_request("request_unfetch_3_bytes", "6.9", _req(7, 9, b"\x00\x00\x03"), "UNFETCH payload must be 4 bytes", 7)
    bad_request("request_unfetch_5_bytes", "6.9", _req(7, 9, b"\x00\x00\x00\x03\x00"), "a trailing byte", 7)
    bad_request("request_trailing_after_key", "5.2", _req(8, 0x0A, _key(temp) + b"\x00"), "a trailing byte", 8)
    bad_request("request_trailing_after_value", "5.3", _req(8, 3, set_payload + b"\x00\x00"), "2 trailing bytes", 8)
    bad_request("request_trailing_after_prefix", "6.8", _req(8, 8, _key(b"p") + b"x"), "a trailing byte", 8)

    # Values (PROTOCOL.md 5.3), carried in SET_STATE requests.
    value_faults = [
        ("reserved_type_0x09", _raw_value(0x09, b""), "reserved value type 0x09"),
        ("reserved_type_0x7f", _raw_value(0x7F, b"abc"), "reserved value type 0x7F"),
        ("none_with_data", _raw_value(0, b"\x00"), "NONE with n = 1"),
        ("bool_length_0", _raw_value(1, b""), "BOOL with n = 0"),
        ("bool_length_2", _raw_value(1, b"\x00\x01"), "BOOL with n = 2"),
        ("bool_byte_0x02", _raw_value(1, b"\x02"), "BOOL byte 0x02"),
        ("bool_byte_0xff", _raw_value(1, b"\xff"), "BOOL byte 0xFF"),
        ("int64_length_7", _raw_value(2, b"\x00" * 7), "INT64 with n = 7"),
        ("int64_length_9", _raw_value(2, b"\x00" * 9), "INT64 with n = 9"),
        ("float64_length_9", _raw_value(3, b"\x00" * 9), "FLOAT64 with n = 9"),
        ("float64_length_4", _raw_value(3, b"\x00" * 4), "FLOAT64 with n = 4"),
        ("string_bad_utf8", _raw_value(4, b"caf\xe9"), "a Latin-1 STRING"),
        ("string_surrogate", _raw_value(4, b"\xed\xb0\x80"), "a UTF-8-encoded surrogate in a STRING"),
    ]
    for label, raw, description in value_faults:
        bad_request(f"value_{label}", "5.3", _req(10, 3, _key(temp) + raw), description, 10)

    # RESPONSE bodies (PROTOCOL.md 4.2, 9.3).
    for n in (0, 3):
        bad_response(
            f"response_body_{n}_bytes", "9.3", _frame(2, b"\x00\x00\x00\x02"[:n]), "no readable id: dropped", None
        )
    bad_response("response_body_id_only", "4.2", _frame(2, _u32(2)), "id readable, status missing", 2)
    for status in (0x11, 0x7F, 0xFF):
        bad_response(
            f"response_status_unknown_0x{status:02x}",
            "8",
            _frame(2, _u32(2) + _u8(status) + _key(b"")),
            "an unknown status is MALFORMED",
            2,
        )
    for n in (1, 2, 3):
        bad_response(
            f"response_ok_payload_{n}_bytes",
            "4.2",
            _frame(2, _u32(2) + b"\x00" + b"\x00" * n),
            "OK payloads of 1, 2 or 3 bytes have no shape",
            2,
        )
    bad_response(
        "response_ok_value_trailing",
        "4.2",
        _frame(2, _u32(2) + b"\x00" + _raw_value(6, b"ab") + b"\x00"),
        "a byte after the OK Value",
        2,
    )
    bad_response(
        "response_ok_value_length_lies",
        "4.2",
        _frame(2, _u32(2) + b"\x00" + _raw_value(6, b"ab", 7)),
        "value length 7, 2 bytes follow",
        2,
    )
    bad_response(
        "response_ok_value_bad",
        "5.3",
        _frame(2, _u32(2) + b"\x00" + _raw_value(1, b"\x02")),
        "an OK Value that is a BOOL byte 0x02",
        2,
    )
    bad_response(
        "response_ok_value_reserved_type",
        "5.3",
        _frame(2, _u32(2) + b"\x00" + _raw_value(0x10, b"")),
        "an OK Value of reserved type 0x10",
        2,
    )
    bad_response("response_error_no_message", "4.2", _frame(2, _u32(2) + b"\x01"), "message length missing", 2)
    bad_response(
        "response_error_message_length_lies",
        "5.1",
        _frame(2, _u32(2) + b"\x01" + _key(b"gone", 10)),
        "message length 10, 4 bytes follow",
        2,
    )
    bad_response(
        "response_error_message_bad_utf8",
        "5.1",
        _frame(2, _u32(2) + b"\x04" + _key(b"zu gro\xdf")),
        "invalid UTF-8 in a message",
        2,
    )
    bad_response(
        "response_error_trailing",
        "4.2",
        _frame(2, _u32(2) + b"\x04" + _key(b"no") + b"!"),
        "a byte after the message",
        2,
    )

    # EVENT bodies (PROTOCOL.md 4.3, 7, 9.3): every fault closes the connection.
    bad_event("event_body_empty", "4.3", _frame(3, b""), "no code byte")
    for code in (0x00, 0x01, 0x02, 0x06, 0x0A, 0x80, 0x89, 0xEF, 0xFF):
        bad_event(
            f"event_code_unknown_0x{code:02x}",
            "7",
            _frame(3, _u8(code) + set_payload),
            "not an event code (ADD_STATE and friends have no EVENT form)",
            "UNKNOWN_FUNCTION",
        )
    bad_event("event_set_empty_key", "5.2", _frame(3, b"\x03" + _key(b"") + f225), "an empty key")
    bad_event("event_set_bad_utf8_key", "5.1", _frame(3, b"\x03" + _key(b"\xc3") + f225), "invalid UTF-8 in a key")
    bad_event("event_set_truncated_value", "5.3", _frame(3, b"\x05" + _key(temp) + f225[:-1]), "7 of 8 bytes")
    bad_event("event_notify_int64_length_7", "5.3", _frame(3, b"\x04" + _key(temp) + _raw_value(2, b"\x00" * 7)), "INT64 with n = 7")
    bad_event("event_fetch_id_truncated", "7.2", _frame(3, b"\x82\x00\x00\x01"), "3 of 4 fetch_id bytes")
    bad_event("event_fetch_empty_key", "7.2", _frame(3, b"\x81" + _u32(1) + _key(b"") + f225), "an empty key")
    bad_event("event_fetch_missing_value", "7.2", _frame(3, b"\x83" + _u32(1) + _key(temp)), "no value")
    bad_event(
        "event_fetch_trailing", "7.2", _frame(3, b"\x82" + _u32(1) + set_payload + b"\x00"), "a trailing byte"
    )
    bad_event(
        "event_fetch_bool_length_2", "5.3", _frame(3, b"\x82" + _u32(1) + _key(temp) + _raw_value(1, b"\x01\x01")), "BOOL n = 2"
    )
    bad_event("event_close_no_status", "7.3", _frame(3, b"\xf0"), "CLOSE without its status")
    bad_event("event_close_no_message", "7.3", _frame(3, b"\xf0\x00"), "CLOSE without its message length")
    bad_event("event_close_unknown_status", "7.3", _frame(3, b"\xf0\x11" + _key(b"")), "status 0x11 is unknown")
    bad_event("event_close_bad_utf8", "7.3", _frame(3, b"\xf0\x07" + _key(b"\xff")), "invalid UTF-8 in a message")
    bad_event(
        "event_close_message_length_lies", "7.3", _frame(3, b"\xf0\x07" + _key(b"bye", 4)), "message length 4, 3 bytes"
    )
    bad_event("event_close_trailing", "7.3", _frame(3, b"\xf0\x00" + _key(b"bye") + b"\x00"), "a trailing byte")

    # INFO (PROTOCOL.md 2, 4.4, 9.2): every fault is fatal.
    info_head = _u8(1) + _u8(0) + _u32(DEFAULT_MAX_BODY) + _u32(0)
    bad_info("info_body_9_bytes", "4.4", _frame(4, info_head[:9]), "shorter than the fixed part")
    bad_info("info_name_missing", "4.4", _frame(4, info_head), "no name length")
    bad_info("info_name_bad_utf8", "4.4", _frame(4, info_head + _key(b"j\xe9td")), "invalid UTF-8 in the name")
    bad_info("info_name_length_lies", "4.4", _frame(4, info_head + _key(b"jetd", 5)), "name length 5, 4 bytes")
    bad_info("info_trailing", "4.4", _frame(4, info_head + _key(b"jetd") + b"\x00"), "a trailing byte")
    bad_info("info_limits_short", "4.4.1", _frame(4, info_head + _key(b"jetd") + b"\x04\x00\x00\x00\x13"),
             "5 bytes after the name: the limits extension takes 6")
    bad_info("info_major_2", "2", _frame(4, _u8(2) + info_head[1:] + _key(b"jetd")), "another major version")
    bad_info("info_major_0", "2", _frame(4, _u8(0) + info_head[1:] + _key(b"jetd")), "another major version")
    for name, section, data, description, kind in query_invalid_vectors():
        if kind == "request":
            bad_request(name, section, data, description, 5)
        else:
            bad_event(name, section, data, description)
    return out


def daemon_only_vectors() -> list[JsonObj]:
    """Frames that decode, but that a daemon receiving them from a peer MUST reject."""
    return [
        {
            "name": "info_max_body_63",
            "section": "4.4",
            "description": "a peer's INFO announcing max_body 63: below 64 no error response would fit",
            "hex": _frame(4, _u8(1) + _u8(2) + _u32(63) + _u32(0) + _key(b"sensor")).hex(),
            "error": _err("MALFORMED", fatal=True, request_id=None, frame_type="INFO"),
        }
    ]


def incomplete_vectors() -> list[JsonObj]:
    """Byte strings that are a proper prefix of a frame: a stream decoder waits for more
    and yields nothing; a whole-frame decoder rejects them (MALFORMED)."""
    full = build(SPEC_EXAMPLES[3][2])
    out: list[JsonObj] = []
    cases = [
        ("empty_input", b"", "nothing at all"),
        ("header_1_byte", full[:1], "only the type byte"),
        ("header_4_bytes", full[:4], "the length field is incomplete"),
        ("header_only", full[:5], "a header announcing 24 body bytes, none present"),
        ("body_missing_last_byte", full[:-1], "the frame's last byte is missing"),
        (
            "frame_length_longer_than_body",
            full[:1] + _u32(30) + full[5:],
            "length says 30, 24 body bytes present: the stream waits for 6 more",
        ),
        ("info_header_only", _u8(4) + _u32(12), "an INFO header, body missing"),
    ]
    for name, data, description in cases:
        out.append({"name": name, "section": "3", "description": description, "hex": data.hex()})
    return out


# --- the event log (JETLOG.md) ----------------------------------------------------------------

LOG_MAGIC = b"\x89JETLOG\n"


def _log_header(name: str, created_ns: int, segment: int, version: int = 1, flags: int = 0,
                run_ns: int = 0) -> bytes:
    head = LOG_MAGIC + struct.pack(">HHQI", version, flags, created_ns, segment)
    if version == 2:  # JETLOG.md 2: run_ns between segment and name
        head += struct.pack(">Q", run_ns)
    head += _str16(name)
    return head + _u32(zlib.crc32(head))


def _log_record(ts_ns: int, conn_id: int, kind: int, data: bytes) -> bytes:
    body = struct.pack(">QIB", ts_ns, conn_id, kind) + data
    length = _u32(len(body))
    return b"JR" + length + _u32(zlib.crc32(length + body)) + body


LOG_KINDS = {1: "FRAME_IN", 2: "FRAME_OUT", 3: "CONN_OPEN", 4: "CONN_CLOSE", 5: "CONN_NAME", 6: "CONN_SNAPSHOT", 7: "ROUTE", 8: "CONN_AUTH"}

JETLOG_HEADER_EXAMPLE = (
    "89 4a 45 54 4c 4f 47 0a 00 01 00 00 18 7a 46 c1 46 d5 80 00 00 00 00 03 00 04 6a 65 74 64 c6 4a 50 95"
)
JETLOG_HEADER_V2_EXAMPLE = (
    "89 4a 45 54 4c 4f 47 0a 00 02 00 00 18 7a 46 c1 46 d5 80 00 00 00 00 03 18 7a 46 97 5d ff 78 00 00 04 6a 65"
    " 74 64 ff d2 16 ef"
)
JETLOG_OPEN_EXAMPLE = (
    "4a 52 00 00 00 1e 9c 6d b0 15 18 7a 46 c1 4e 31 4d 15 00 00 00 07 03 00 0f 31 32 37 2e 30 2e 30 2e 31"
    " 3a 35 30 33 31 32"
)
JETLOG_FRAME_EXAMPLE = (
    "4a 52 00 00 00 1a fc e0 0e dc 18 7a 46 c1 4e 31 f5 df 00 00 00 07 01 01 00 00 00 08 00 00 00 05 0a 00 01 61"
)


def jetlog_vectors() -> JsonObj:
    """Whole segment files with the items a reader must produce, damaged ones included."""
    created = 0x187A46C146D58000
    header = _log_header("jetd", created, 3)
    if header.hex() != JETLOG_HEADER_EXAMPLE.replace(" ", ""):
        raise SystemExit(f"log header does not reproduce JETLOG.md 2: {header.hex()}")
    t0 = 0x187A46C14E314D15
    specs: list[tuple[int, int, int, bytes, JsonObj | None]] = [
        (t0, 7, 3, _str16("127.0.0.1:50312"), {"address": "127.0.0.1:50312"}),
        (0x187A46C14E31F5DF, 7, 1, _req(5, 0x0A, _key(b"a")), None),
        (t0 + 3000, 7, 5, _str16("sensor-7"), {"name": "sensor-7"}),
        (t0 + 4000, 7, 2, build(SPEC_EXAMPLES[11][2]), None),
        (
            t0 + 5000,
            0,
            7,
            struct.pack(">IIIIB", 7, 3, 9, 1, 3) + _str16("plant/temp"),
            {"requester_conn": 7, "requester_id": 3, "owner_conn": 9, "owner_id": 1, "function": 3, "key": "plant/temp"},
        ),
        (t0 + 6000, 9, 6, _str16("10.0.0.2:4711") + _str16("owner"), {"address": "10.0.0.2:4711", "name": "owner"}),
        (t0 + 7000, 7, 0x42, b"future kind", None),
        (t0 + 8000, 7, 4, _u8(7) + _str16("malformed frame"), {"status": "MALFORMED", "reason": "malformed frame"}),
    ]
    records = [_log_record(ts, conn, kind, data) for ts, conn, kind, data, _ in specs]
    if records[0].hex() != JETLOG_OPEN_EXAMPLE.replace(" ", ""):
        raise SystemExit(f"CONN_OPEN record does not reproduce JETLOG.md 4: {records[0].hex()}")
    if records[1].hex() != JETLOG_FRAME_EXAMPLE.replace(" ", ""):
        raise SystemExit(f"FRAME_IN record does not reproduce JETLOG.md 4: {records[1].hex()}")
    header_item: JsonObj = {
        "item": "header",
        "name": "jetd",
        "created_ns": created,
        "segment": 3,
        "version": 1,
        "flags": 0,
        "size": len(header),
        "run_ns": None,
    }
    record_items: list[JsonObj] = []
    offset = len(header)
    for (ts, conn, kind, data, fields), raw in zip(specs, records, strict=True):
        item: JsonObj = {
            "item": "record",
            "offset": offset,
            "ts_ns": ts,
            "conn_id": conn,
            "kind": kind,
            "kind_name": LOG_KINDS.get(kind),
            "data_hex": data.hex(),
        }
        if fields is not None:
            item["fields"] = fields
        record_items.append(item)
        offset += len(raw)
    whole = header + b"".join(records)
    files: list[JsonObj] = []

    def add(name: str, description: str, data: bytes, items: list[JsonObj]) -> None:
        files.append({"name": name, "section": "5", "description": description, "hex": data.hex(), "items": items})

    add("complete", "a header and one record of every kind (and one unknown kind)", whole, [header_item, *record_items])
    add("header_only", "a segment with no records yet", header, [header_item])
    run_ns = created - 180 * 10**9
    header_v2 = _log_header("jetd", created, 3, version=2, run_ns=run_ns)
    if header_v2.hex() != JETLOG_HEADER_V2_EXAMPLE.replace(" ", ""):
        raise SystemExit(f"version 2 log header does not reproduce JETLOG.md 2: {header_v2.hex()}")
    shift = len(header_v2) - len(header)
    add(
        "complete_v2",
        "the same records behind a version 2 header (section 2: run_ns)",
        header_v2 + b"".join(records),
        [
            {**header_item, "version": 2, "size": len(header_v2), "run_ns": run_ns},
            *[{**item, "offset": item["offset"] + shift} for item in record_items],
        ],
    )
    starts = [item["offset"] for item in record_items]
    last = starts[-1]
    last_len = len(records[-1])
    for cut in (1, 2, 6, 9, 10, 22, last_len - 1):
        add(
            f"truncated_last_record_at_{cut}",
            "the file ends inside the last record: stop cleanly and report it",
            whole[: last + cut],
            [
                header_item,
                *record_items[:-1],
                {"item": "truncation", "offset": last, "present": cut, "needed": last_len if cut >= 10 else 10},
            ],
        )
    # Damage in the middle of record 3 (index 2): each is reported from its offset, and the
    # reader resyncs at record 4 (JETLOG.md 5).
    third = starts[2]
    resync_at_fourth = [
        header_item,
        *record_items[:2],
        {"item": "corruption", "offset": third, "length": starts[3] - third},
        *record_items[3:],
    ]
    for name, description, at, patch in (
        ("crc_mismatch_in_middle", "a flipped bit inside record 3: reported from its offset, resync at record 4",
         14, bytes([whole[third + 14] ^ 0x01])),
        ("bad_marker_in_middle", "record 3's marker overwritten: resync at record 4", 0, b"\x00"),
        ("implausible_length_in_middle", "record 3's length field above the reader's maximum: resync at record 4",
         2, _u32(0x7FFF0000)),
        ("length_past_end_in_middle",
         "record 3's length points past the end of the file, yet valid records follow: damage, not truncation",
         2, _u32(len(whole))),
    ):
        add(name, description, whole[: third + at] + patch + whole[third + at + len(patch) :], resync_at_fourth)
    garbage = b"JR\x00\x00\x00\x20garbage-JR-garbage"
    add(
        "garbage_between_records",
        "junk (with false markers) inserted between records 1 and 2",
        whole[: starts[1]] + garbage + whole[starts[1] :],
        [
            header_item,
            record_items[0],
            {"item": "corruption", "offset": starts[1], "length": len(garbage)},
            *[{**item, "offset": item["offset"] + len(garbage)} for item in record_items[1:]],
        ],
    )
    damaged = bytearray(whole)
    damaged[last + 12] ^= 0xFF
    add(
        "crc_mismatch_last_record",
        "the last record is complete but corrupt: damage to the end of the file",
        bytes(damaged),
        [header_item, *record_items[:-1], {"item": "corruption", "offset": last, "length": last_len}],
    )
    errors: list[JsonObj] = []
    bad_magic = bytearray(whole)
    bad_magic[1] = ord("X")
    bad_crc = bytearray(whole)
    bad_crc[len(header) - 1] ^= 0x01
    bad_version = LOG_MAGIC + struct.pack(">HHQIQ", 3, 0, created, 3, created) + _str16("jetd")
    bad_version += _u32(zlib.crc32(bad_version))
    bad_name = LOG_MAGIC + struct.pack(">HHQI", 1, 0, created, 3) + _key(b"j\xffd")
    bad_name += _u32(zlib.crc32(bad_name))
    for name, description, data in (
        ("bad_magic", "not a jet log", bytes(bad_magic)),
        ("bad_header_crc", "the header CRC does not match", bytes(bad_crc)),
        ("bad_version", "format version 3", bad_version),
        ("bad_header_name_utf8", "the daemon name is not UTF-8", bad_name),
        ("ends_inside_header", "a file cut inside its header", header[:20]),
        ("ends_inside_header_v2", "a version 2 file cut inside its header", header_v2[:30]),
        ("empty_file", "no bytes at all", b""),
    ):
        errors.append({"name": name, "section": "2", "description": description, "hex": data.hex(), "error": True})
    return {"format": "jet-log-vectors/1", "files": files, "invalid_files": errors}


# --- writing and checking ---------------------------------------------------------------------


def generate() -> dict[str, str]:
    """File name -> JSON text of every vector file."""

    def dump(obj: JsonObj) -> str:
        return json.dumps(obj, indent=1, ensure_ascii=False) + "\n"

    return {
        "frames-valid.json": dump(
            {"format": FORMAT, "protocol": "1.3", "default_max_body": DEFAULT_MAX_BODY, "vectors": valid_vectors()}
        ),
        "frames-invalid.json": dump(
            {
                "format": FORMAT,
                "protocol": "1.3",
                "default_max_body": DEFAULT_MAX_BODY,
                "vectors": invalid_vectors(),
                "incomplete": incomplete_vectors(),
                "daemon_only": daemon_only_vectors(),
            }
        ),
        "jetlog.json": dump(jetlog_vectors()),
    }


def load(name: str) -> JsonObj:
    """Load one checked-in vector file (``frames-valid.json``, ``frames-invalid.json``,
    ``jetlog.json``)."""
    with open(VECTORS_DIR / name, encoding="utf-8") as handle:
        result: JsonObj = json.load(handle)
    return result


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` verify) the vector files; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the checked-in files are not current")
    parser.add_argument("--dir", type=Path, default=VECTORS_DIR, help="output directory")
    args = parser.parse_args(argv)
    stale = []
    for name, text in generate().items():
        path = args.dir / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            args.dir.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"stale vector files (run python -m tools.vectors): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
