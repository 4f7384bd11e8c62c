"""Render frame records: one summary line, the ``-V`` field tree, the ``-x`` hex dump, JSON.

The summary path works from the fast codec's messages only; the field tree and JSON
take every field with its byte offset and length from the construct schema
(:func:`jetwire.schema.dissect`), the single source of truth for body layouts.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from typing import Any
from typing import Optional

from jetwire import Authenticate
from jetwire import Close
from jetwire import EntryKind
from jetwire import EventCode
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchMethod
from jetwire import FetchNode
from jetwire import FetchQuery
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import FetchUnmatch
from jetwire import FetchWindow
from jetwire import FrameType
from jetwire import Function
from jetwire import Info
from jetwire import Message
from jetwire import Query
from jetwire import QueryEntry
from jetwire import QueryOnce
from jetwire import Request
from jetwire import Response
from jetwire import Status
from jetwire import Unfetch
from jetwire import Value
from jetwire import ValueType
from jetwire.messages import REQUEST_CLASSES
from jetwire.schema import dissect

from .dissector import MALFORMED
from .dissector import OK
from .dissector import FrameRecord
from .dissector import NoteRecord
from .dissector import Record
from .dissector import RouteTrace

SUMMARY_TEXT_LIMIT = 60  # characters of a string/JSON value shown in a summary line
SUMMARY_HEX_LIMIT = 24  # bytes of an opaque value shown in a summary line
PROBLEM_HEX_LIMIT = 48  # bytes of a malformed frame shown in its summary line

_INT64 = struct.Struct(">q").unpack
_FLOAT64 = struct.Struct(">d").unpack

TYPE_NAMES = {int(t): t.name for t in FrameType}
FUNCTION_NAMES = {int(f): f.name for f in Function}
EVENT_NAMES = {int(c): c.name for c in EventCode}
ENTRY_KIND_NAMES = {int(k): k.name for k in EntryKind}
STATUS_NAMES = {int(s): s.name for s in Status}
VALUE_TYPE_NAMES = {int(v): v.name for v in ValueType}
# Schema field names that JSON shows under another name (the JSON names are stable).
JSON_NAMES = {"kind": "entry_kind"}
# Fields whose values are codes, shown by name (``0xNN`` for a code the spec lacks).
CODE_NAMES = {
    "type": TYPE_NAMES, "function": FUNCTION_NAMES, "code": EVENT_NAMES, "status": STATUS_NAMES,
    "value_type": VALUE_TYPE_NAMES, "entry_kind": ENTRY_KIND_NAMES,
}


def code_name(names: dict[int, str], code: int) -> str:
    """The enum name of ``code``, or ``0xNN`` for a code the spec does not define."""
    return names.get(code) or f"0x{code:02X}"


_QUOTED: dict[str, str] = {}  # quote() of recent keys: a bus has few keys, each seen often
_QUOTED_MAX = 4096


def quote(text: str, limit: int = SUMMARY_TEXT_LIMIT) -> str:
    """Quote text for one line; control and escape characters never reach the terminal."""
    if limit == SUMMARY_TEXT_LIMIT:
        quoted = _QUOTED.get(text)
        if quoted is None:
            if len(_QUOTED) >= _QUOTED_MAX:
                _QUOTED.clear()
            quoted = _QUOTED[text] = _quote(text, limit)
        return quoted
    return _quote(text, limit)


def _quote(text: str, limit: int) -> str:
    if len(text) > limit:
        text = text[:limit] + "…"
    if text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return json.dumps(text, ensure_ascii=False)


def value_summary(value: Value) -> str:
    """``INT64 42``, ``FLOAT64 21.5``, ``STRING "off"``, ``BYTES 3 bytes 6f6666``."""
    vtype = value.vtype
    data = value.data
    if vtype == 2:
        return f"INT64 {_INT64(data)[0]}"
    if vtype == 3:
        return f"FLOAT64 {_FLOAT64(data)[0]!r}"
    if vtype == 1:
        return "BOOL true" if data == b"\x01" else "BOOL false"
    if vtype == 0:
        return "NONE"
    if vtype == 4:
        return "STRING " + quote(data.decode("utf-8", "replace"))
    if vtype == 5:
        return "JSON " + _one_line(data.decode("utf-8", "replace"))
    name = code_name(VALUE_TYPE_NAMES, vtype)
    shown = data[:SUMMARY_HEX_LIMIT].hex()
    more = "…" if len(data) > SUMMARY_HEX_LIMIT else ""
    return f"{name} {len(data)} bytes {shown}{more}"


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > SUMMARY_TEXT_LIMIT:
        text = text[:SUMMARY_TEXT_LIMIT] + "…"
    return text if text.isprintable() else json.dumps(text)[1:-1]


# Summarizers are built per message class with the function or code name already in
# place: enum ``.name`` is a descriptor call, and this runs once per frame.


def _key_only(name: str) -> Callable[[Any], str]:
    def summary(m: Any) -> str:
        return f"REQUEST id={m.id} {name} key={quote(m.key)}"

    return summary


def _key_value(name: str, *, fetch: bool = False) -> Callable[[Any], str]:
    """A request with a key and a value, or its fire-and-forget EVENT (PROTOCOL.md 7.1);
    ``fetch``: a fetch event, which names its fetch id (7.2)."""
    quoted = _QUOTED

    def summary(m: Any) -> str:
        key = quoted.get(m.key) or quote(m.key)
        if fetch:
            return f"EVENT {name} fid={m.fetch_id} key={key} {value_summary(m.value)}"
        if m.id is None:
            return f"EVENT {name} key={key} {value_summary(m.value)}"
        return f"REQUEST id={m.id} {name} key={key} {value_summary(m.value)}"

    return summary


def query_summary(query: Query) -> str:
    """PROTOCOL.md 14.1 in one line: ``starts_with('players/') gender==STRING 'female'
    sort=FIELD:score desc 1..10``."""
    parts = []
    for matcher in query.matchers:
        flags = ("not " if matcher.negated else "") + ("icase " if matcher.ignore_case else "")
        parts.append(f"{flags}{matcher.op.name.lower()}({', '.join(quote(text) for text in matcher.operands)})")
    for value_filter in query.filters:
        target = value_filter.field or "value"
        parts.append(f"{target} {value_filter.op.name} {value_summary(value_filter.operand)}")
    if query.sort_by:
        target = query.sort_field if query.sort_field else query.sort_by.name
        parts.append(f"sort={target}{' desc' if query.descending else ''} {query.window_from}..{query.window_to}")
    if query.methods:
        parts.append("+methods")
    if query.nodes:
        parts.append("+nodes")
    return " ".join(parts) or "(everything)"


def _query_request(m: Any) -> str:
    return f"REQUEST id={m.id} {m.function.name} {query_summary(m.query)}"


def _key_event(name: str) -> Callable[[Any], str]:
    def summary(m: Any) -> str:
        return f"EVENT {name} fid={m.fetch_id} {m.action.name} key={quote(m.key)}"

    return summary


def _window(m: Any) -> str:
    rows = " ".join(f"#{e.index}={quote(e.key)}" for e in m.entries[:4])
    more = f" …+{len(m.entries) - 4}" if len(m.entries) > 4 else ""
    return f"EVENT FETCH_WINDOW fid={m.fetch_id} size={m.size} {rows}{more}".rstrip()


def _query_entry(m: Any) -> str:
    return f"EVENT QUERY_ENTRY id={m.id} {m.kind.name} key={quote(m.key)} {value_summary(m.value)}"


def _fetch(m: Any) -> str:
    return f"REQUEST id={m.id} FETCH_STATES prefix={quote(m.prefix)}"


def _unfetch(m: Any) -> str:
    return f"REQUEST id={m.id} UNFETCH fid={m.fetch_id}"


MASK = "********"  # PROTOCOL.md 6.12: jetdump never shows a password


def _authenticate(m: Any) -> str:
    return f"REQUEST id={m.id} AUTHENTICATE user={quote(m.user)} password={MASK}"


def _response(m: Any) -> str:
    if m.status:
        return f"RESPONSE id={m.id} {STATUS_NAMES[m.status]} {quote(m.message)}"
    if m.value is not None:
        return f"RESPONSE id={m.id} OK {value_summary(m.value)}"
    if m.fetch_id is not None:
        return f"RESPONSE id={m.id} OK fid={m.fetch_id}"
    return f"RESPONSE id={m.id} OK"


def _close(m: Any) -> str:
    return f"EVENT CLOSE {STATUS_NAMES[m.status]} {quote(m.message)}"


def _info(m: Any) -> str:
    text = f"INFO {quote(m.name)} v{m.major}.{m.minor} max_body={m.max_body} features=0x{m.features:08X}"
    if m.max_key_length is not None:  # PROTOCOL.md 4.4.1
        text += f" max_key_length={m.max_key_length} route_timeout_ms={m.route_timeout_ms}"
    return text


SUMMARIZERS: dict[type, Callable[[Any], str]] = {
    FetchAdd: _key_value("FETCH_ADD", fetch=True),
    FetchChange: _key_value("FETCH_CHANGE", fetch=True),
    FetchRemove: _key_value("FETCH_REMOVE", fetch=True),
    FetchUnmatch: _key_value("FETCH_UNMATCH", fetch=True),
    FetchMethod: _key_event("FETCH_METHOD"),
    FetchNode: _key_event("FETCH_NODE"),
    FetchWindow: _window,
    QueryEntry: _query_entry,
    FetchQuery: _query_request,
    QueryOnce: _query_request,
    Response: _response,
    Close: _close,
    Info: _info,
    FetchStates: _fetch,
    Unfetch: _unfetch,
    Authenticate: _authenticate,
}
for _cls in REQUEST_CLASSES.values():
    if _cls not in SUMMARIZERS:
        _fields = getattr(_cls, "__dataclass_fields__", {})
        SUMMARIZERS[_cls] = (_key_value if "value" in _fields else _key_only)(_cls.function.name)


def message_summary(message: Message) -> str:
    """The one-line summary of a decoded message (no frame number, time or addresses)."""
    return SUMMARIZERS[type(message)](message)


def problem_summary(record: FrameRecord) -> str:
    """``MALFORMED REQUEST id=7: reason [bytes]`` / ``TRUNCATED RESPONSE: ...``."""
    tname = code_name(TYPE_NAMES, record.frame_type) if record.frame_type is not None else "?"
    raw = record.raw or b""
    shown = raw[:PROBLEM_HEX_LIMIT].hex(" ")
    more = " …" if len(raw) > PROBLEM_HEX_LIMIT else ""
    label = "MALFORMED" if record.kind == MALFORMED else "TRUNCATED"
    return f"{label} {tname}: {record.error} [{shown}{more}]"


def response_suffix(record: FrameRecord) -> str:
    """``  [answers #5 SET_STATE "a/b", 0.123 ms]`` for a matched response."""
    request = record.request
    if request is None:
        return ""
    text = f"  [answers #{request.number} {code_name(FUNCTION_NAMES, request.function)}"
    if record.rtt is not None:
        text += f", {record.rtt * 1000:.3f} ms"
    return text + "]"


class LineFormatter:
    """Formats summary lines; knows the stream labels and the time origin."""

    def __init__(self, labels: dict[int, tuple[str, str]], first_ts: Callable[[], Optional[float]]) -> None:
        self.labels = labels
        self._first_ts = first_ts

    def where(self, stream: Optional[int], direction: Optional[int]) -> str:
        if stream is None:
            return "-"
        labels = self.labels.get(stream, (f"s{stream}:a", f"s{stream}:b"))
        if direction is None:
            return f"{labels[0]} ↔ {labels[1]}"
        return f"{labels[direction]} → {labels[1 - direction]}"

    def rel(self, ts: Optional[float]) -> float:
        first = self._first_ts()
        return ts - first if ts is not None and first is not None else 0.0

    def line(self, record: Record) -> str:
        """One summary line."""
        return self.lines([record])[0]

    def lines(self, records: list[Record]) -> list[str]:
        """Summary lines of many records: the hot path of the default output, with the
        per-stream labels cached and everything looked up once."""
        out: list[str] = []
        append = out.append
        first = self._first_ts()
        places: dict[int, str] = {}  # by stream * 2 + direction (no tuple per frame)
        summarizers = SUMMARIZERS
        function_names = FUNCTION_NAMES
        for record in records:
            if type(record) is NoteRecord:
                ts = record.ts
                rel = ts - first if ts is not None and first is not None else 0.0
                append(f"{'':>7} {rel:>11.6f}  {self.where(record.stream, record.direction)}  -- {record.text}")
                continue
            # One unpacking instead of eight attribute reads (this runs once per frame).
            fr: FrameRecord = record  # type: ignore[assignment]
            (number, ts, stream, direction, _offset, message, _raw, _kind, _error, _ftype, _size, _announced,
             request, rtt, _fatal, packet, route) = fr
            rel = ts - first if ts is not None and first is not None else 0.0
            place = places.get(stream * 2 + direction)
            if place is None:
                place = places[stream * 2 + direction] = self.where(stream, direction)
            if message is not None:
                text = summarizers[type(message)](message)
                if request is not None:
                    # response_suffix(), inlined: half of the frames are answers.
                    function = function_names.get(request.function) or f"0x{request.function:02X}"
                    if rtt is None:
                        text = f"{text}  [answers #{request.number} {function}]"
                    else:
                        text = f"{text}  [answers #{request.number} {function}, {rtt * 1000:.3f} ms]"
                if route is not None:
                    text += route_suffix(route, self.labels)
            else:
                text = problem_summary(fr) + response_suffix(fr)
            # %-formatting: the same text as f"{number:>7} {rel:>11.6f}", measured about
            # twice as fast (an f-string format spec goes through format() per field).
            if packet is None:
                append("%7d %11.6f  %s  %s" % (number, rel, place, text))  # noqa: UP031
            else:  # the capture's packet number, to find the frame in Wireshark
                append("%7d %11.6f  pkt %-5d %s  %s" % (number, rel, packet, place, text))  # noqa: UP031
        return out


# --- the field tree and JSON ----------------------------------------------------------


def _field_value(name: str, value: Any) -> Any:
    """A dissected field's value as JSON: enum names for codes, text for strings."""
    names = CODE_NAMES.get(name)
    if names is not None:
        return code_name(names, int(value))
    if isinstance(value, bytes):
        return value.hex()
    return int(value) if isinstance(value, int) else value


def decode_value(vtype: int, data: bytes) -> tuple[bool, Any]:
    """The Python/JSON form of a value's data where its type allows: (ok, value).

    NONE -> null, BOOL, INT64, FLOAT64 (NaN and infinities as the strings "NaN",
    "Infinity", "-Infinity"), STRING -> text, JSON -> the parsed document. BYTES,
    CBOR, MSGPACK and application types are not decoded (their hex is in value_hex).
    """
    try:
        if vtype == 0 and not data:
            return True, None
        if vtype == 1 and len(data) == 1 and data[0] < 2:
            return True, data == b"\x01"
        if vtype == 2 and len(data) == 8:
            return True, _INT64(data)[0]
        if vtype == 3 and len(data) == 8:
            number = _FLOAT64(data)[0]
            if math.isfinite(number):
                return True, number
            return True, "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")
        if vtype == 4:
            return True, data.decode("utf-8")
        if vtype == 5:
            return True, json.loads(data)
    except (UnicodeDecodeError, ValueError):
        pass
    return False, None


def frame_fields(record: FrameRecord) -> tuple[dict[str, Any], dict[str, list[int]], Optional[str]]:
    """Every field of the frame from the schema: (values by name, [offset, length] by
    name, schema error or None)."""
    fields, error = dissect(record.raw or b"")
    values: dict[str, Any] = {}
    offsets: dict[str, list[int]] = {}
    for field in fields:
        # QUERY_ENTRY's entry kind is "entry_kind": "kind" is the record's (frame,
        # malformed or truncated), documented and stable.
        name = JSON_NAMES.get(field.name, field.name)
        values[name] = MASK if name == "password" else _field_value(name, field.value)
        offsets[name] = [field.offset, field.length]
        if field.name == "value":
            vtype = next((f.value for f in fields if f.name == "value_type"), None)
            if vtype is not None:
                ok, decoded = decode_value(int(vtype), field.value)
                if ok:
                    values["value"] = decoded
                else:
                    del values["value"]
                values["value_hex"] = field.value.hex()
    return values, offsets, error.message if error is not None else None


LAYOUT_CACHE_SIZE = 4096  # frame layouts remembered by the --json fast path

_layouts: dict[tuple[Any, ...], tuple[tuple[str, int, int], ...]] = {}


def _text(values: dict[str, Any], shape: list[Any], name: str, text: str) -> None:
    values[f"{name}_length"] = size = len(text.encode("utf-8"))
    values[name] = text
    shape.append(size)


def _value(values: dict[str, Any], shape: list[Any], value: Value) -> None:
    data = value.data
    values["value_type"] = code_name(VALUE_TYPE_NAMES, value.vtype)
    values["value_length"] = len(data)
    ok, decoded = decode_value(value.vtype, data)
    if ok:
        values["value"] = decoded
    values["value_hex"] = data.hex()
    shape.append(len(data))


def message_fields(message: Message, raw: bytes) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The JSON field values of a decoded frame, from the fast codec's message, and the
    frame's *shape*: everything its field offsets depend on (message class, which
    optional parts are present, and the byte lengths of its variable parts)."""
    values: dict[str, Any] = {"type": code_name(TYPE_NAMES, raw[0]), "length": len(raw) - 5}
    shape: list[Any] = [type(message)]
    if isinstance(message, Request):
        shape.append(message.id is None)
        if message.id is None:
            values["code"] = message.function.name  # PROTOCOL.md 7.1: same code as the function
        else:
            values["id"] = message.id
            values["function"] = message.function.name
        if isinstance(message, FetchStates):
            _text(values, shape, "prefix", message.prefix)
        elif isinstance(message, Unfetch):
            values["fetch_id"] = message.fetch_id
        elif isinstance(message, Authenticate):
            _text(values, shape, "user", message.user)
            _text(values, shape, "password", message.password)
            values["password"] = MASK
        else:
            _text(values, shape, "key", message.key)  # type: ignore[attr-defined]
            value = getattr(message, "value", None)
            if value is not None:
                _value(values, shape, value)
    elif isinstance(message, Response):
        values["id"] = message.id
        values["status"] = code_name(STATUS_NAMES, message.status)
        shape.append(message.status == 0)
        if message.status:
            _text(values, shape, "message", message.message)
        elif message.value is not None:
            _value(values, shape, message.value)
        elif message.fetch_id is not None:
            values["fetch_id"] = message.fetch_id
            shape.append("fetch_id")
    elif isinstance(message, (FetchAdd, FetchChange, FetchRemove, FetchUnmatch)):
        values["code"] = EVENT_NAMES[message.code]
        values["fetch_id"] = message.fetch_id
        _text(values, shape, "key", message.key)
        _value(values, shape, message.value)
    elif isinstance(message, Close):
        values["code"] = "CLOSE"
        values["status"] = code_name(STATUS_NAMES, message.status)
        _text(values, shape, "message", message.message)
    elif isinstance(message, Info):
        values.update(major=message.major, minor=message.minor, max_body=message.max_body, features=message.features)
        if message.max_key_length is not None:  # PROTOCOL.md 4.4.1
            values.update(max_key_length=message.max_key_length, route_timeout_ms=message.route_timeout_ms)
        _text(values, shape, "name", message.name)
    return tuple(shape), values


def fast_frame_fields(record: FrameRecord) -> tuple[dict[str, Any], dict[str, list[int]], Optional[str]]:
    """:func:`frame_fields` for a well-formed frame without running the schema on every
    frame: values come from the fast codec's message (proven equal to the schema by the
    codec's tests), offsets from the schema's dissection of the first frame of the same
    shape. Frames the fast codec could not decode take the schema path."""
    message = record.message
    raw = record.raw
    if message is None or raw is None or isinstance(message, _NESTED):
        # Queries and windows nest lists: their layouts vary too much to cache.
        return frame_fields(record)
    shape, values = message_fields(message, raw)
    layout = _layouts.get(shape)
    if layout is None:
        fields, error = dissect(raw)
        if error is not None:
            return frame_fields(record)
        layout = tuple((field.name, field.offset, field.length) for field in fields)
        if len(_layouts) >= LAYOUT_CACHE_SIZE:
            _layouts.clear()
        _layouts[shape] = layout
    return values, {name: [offset, length] for name, offset, length in layout}, None


_NESTED = (FetchQuery, QueryOnce, FetchWindow, FetchMethod, FetchNode, QueryEntry)


def route_suffix(route: RouteTrace, labels: dict[int, tuple[str, str]]) -> str:
    """`` [routed via OWNER #a/#b: owner X ms, daemon Y ms]`` for a routed request's answer."""
    owner = labels.get(route.owner_stream, (f"stream {route.owner_stream}", ""))[0]
    legs = f"#{route.leg_request}/#{route.leg_response}" if route.leg_response is not None else "no answer seen"
    # A capture does not say which request the daemon routed (--trace infers it by key).
    how = "" if not route.inferred else (
        ", inferred" if route.inferred == 1 else f", inferred: oldest of {route.inferred} waiting on this key")
    if route.owner_time is None or route.daemon_time is None:
        return f"  [routed via {owner} {legs}{how}]"
    return (f"  [routed via {owner} {legs}: owner {route.owner_time * 1000:.3f} ms, "
            f"daemon {route.daemon_time * 1000:.3f} ms{how}]")


def json_record(record: Record, fmt: LineFormatter) -> dict[str, Any]:
    """The ``--json`` object of one record (field names documented in the package)."""
    if type(record) is NoteRecord:
        note = {
            "record": "note",
            "note": record.kind,
            "text": record.text,
            "stream": record.stream,
            "direction": record.direction,
            "time": round(fmt.rel(record.ts), 9) if record.ts is not None else None,
            "timestamp": record.ts,
        }
        if record.packet is not None:
            note["packet"] = record.packet
        return note
    fr: FrameRecord = record  # type: ignore[assignment]
    labels = fmt.labels.get(fr.stream, ("?", "?"))
    obj: dict[str, Any] = {
        "record": "frame",
        "frame": fr.number,
        "kind": fr.kind,
        "time": round(fmt.rel(fr.ts), 9) if fr.ts is not None else None,
        "timestamp": fr.ts,
        "stream": fr.stream,
        "direction": fr.direction,
        "src": labels[fr.direction],
        "dst": labels[1 - fr.direction],
        "stream_offset": fr.offset,
        "size": fr.size,
    }
    if fr.packet is not None:
        obj["packet"] = fr.packet
    if fr.route is not None:
        route = fr.route
        obj["route"] = {
            "owner_stream": route.owner_stream, "owner": fmt.labels.get(route.owner_stream, ("?", "?"))[0],
            "owner_id": route.owner_id, "leg_request": route.leg_request, "leg_response": route.leg_response,
            "owner_ms": round(route.owner_time * 1000, 6) if route.owner_time is not None else None,
            "daemon_ms": round(route.daemon_time * 1000, 6) if route.daemon_time is not None else None,
            "inferred": route.inferred,  # 0: linked by the event log; N: by key, oldest of N waiting
        }
    values, offsets, error = fast_frame_fields(fr)
    obj.update(values)
    obj["offsets"] = offsets
    if fr.kind != OK:
        obj["error"] = fr.error
        obj["bytes"] = (fr.raw or b"").hex()
        if fr.announced is not None:
            obj["announced"] = fr.announced
    elif error is not None:
        # The fast codec accepted what the schema rejects: a codec bug worth showing.
        obj["schema_error"] = error
    if fr.request is not None:
        obj["request"] = {
            "frame": fr.request.number,
            "function": code_name(FUNCTION_NAMES, fr.request.function),
            "key": fr.request.key,
        }
        obj["rtt_ms"] = round(fr.rtt * 1000, 6) if fr.rtt is not None else None
    return obj


def field_tree(record: FrameRecord) -> list[str]:
    """The ``-V`` tree lines: every field with ``[offset +length]``, from the schema."""
    fields, error = dissect(record.raw or b"")
    lines = []
    for field in fields:
        value = field.value
        name = JSON_NAMES.get(field.name, field.name)
        names = CODE_NAMES.get(name)
        if names is not None:
            shown = f"{code_name(names, int(value))} (0x{int(value):02X})"
        elif isinstance(value, bytes):
            vtype = next((int(f.value) for f in fields if f.name == "value_type"), -1)
            ok, decoded = decode_value(vtype, value)
            hex_text = value[:32].hex(" ") + (" …" if len(value) > 32 else "")
            shown = f"{json.dumps(decoded, ensure_ascii=False)[:200]}  ({hex_text})" if ok else hex_text
        elif isinstance(value, str):
            shown = quote(value, 200)
        elif field.name == "features":
            shown = f"0x{value:08X}" + (" (CONFLATION)" if value & 1 else "")
        else:
            shown = str(value)
        lines.append(f"    [{field.offset:>4} +{field.length:<4}] {name}: {shown}")
    if error is not None and record.kind == OK:
        lines.append(f"    schema error: {error.message}")
    elif record.kind != OK:
        lines.append(f"    [{record.kind}] {record.error}")
    return lines


def hex_dump(data: bytes) -> list[str]:
    """Classic 16-bytes-a-line hex dump with an ASCII column."""
    lines = []
    for off in range(0, len(data), 16):
        chunk = data[off : off + 16]
        hexpart = " ".join(f"{b:02x}" for b in chunk[:8]) + "  " + " ".join(f"{b:02x}" for b in chunk[8:])
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"    {off:04x}  {hexpart:<49}  {text}")
    return lines
