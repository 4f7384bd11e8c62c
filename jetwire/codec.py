"""The fast codec: precompiled ``struct`` encode/decode and the sans-IO stream decoder.

This module is the hot path. :mod:`jetwire.schema` (construct) is the declarative
source of truth; tests prove the two agree on every vector and on generated messages.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from collections.abc import Iterator
from typing import TYPE_CHECKING
from typing import Any
from typing import Final
from typing import Optional

from .codes import DEFAULT_MAX_BODY
from .codes import HEADER_SIZE
from .codes import PROTOCOL_MAJOR
from .codes import Action
from .codes import EntryKind
from .codes import EventCode
from .codes import FilterOp
from .codes import FrameType
from .codes import Function
from .codes import PathOp
from .codes import SortBy
from .codes import Status
from .codes import ValueType
from .errors import LocalProtocolError
from .errors import RemoteProtocolError
from .messages import AddMethod
from .messages import AddState
from .messages import Authenticate
from .messages import CallMethod
from .messages import Close
from .messages import FetchAdd
from .messages import FetchChange
from .messages import FetchEvent
from .messages import FetchKeyEvent
from .messages import FetchMethod
from .messages import FetchNode
from .messages import FetchQuery
from .messages import FetchRemove
from .messages import FetchStates
from .messages import FetchUnmatch
from .messages import FetchWindow
from .messages import GetState
from .messages import Info
from .messages import Message
from .messages import NotifyState
from .messages import PathMatcher
from .messages import Query
from .messages import QueryEntry
from .messages import QueryOnce
from .messages import RemoveMethod
from .messages import RemoveState
from .messages import Request
from .messages import Response
from .messages import SetState
from .messages import Unfetch
from .messages import ValueFilter
from .messages import WindowEntry
from .values import _SET_DATA as _V_DATA
from .values import _SET_VTYPE as _V_TYPE
from .values import Value
from .values import _trusted as _make_value

if TYPE_CHECKING:
    # A protocol: bytes, bytearray, memoryview... Compiled (mypyc), it is checked as
    # ``object``, so receive_data's own check answers other types in both builds alike.
    from typing_extensions import Buffer

__all__ = ["Decoder", "decode_body", "decode_frame", "encode", "frame_size", "is_utf8", "query_bytes"]

_HEADER: Final = struct.Struct(">BI")
_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_ID_BYTE: Final = struct.Struct(">IB")  # REQUEST id|function, RESPONSE id|status
_VALUE_HEAD: Final = struct.Struct(">BI")
_INFO_HEAD: Final = struct.Struct(">BBII")
_INFO_LIMITS: Final = struct.Struct(">HI")
_REQ_KEY: Final = struct.Struct(">BIIBH")  # header + id + function + key length
_EVT_KEY: Final = struct.Struct(">BIBH")  # header + code + key length
_EVT_FID_KEY: Final = struct.Struct(">BIBIH")  # header + code + fetch_id + key length
_RESP_HEAD: Final = struct.Struct(">BIIB")  # header + id + status

_REQUEST: Final = FrameType.REQUEST
_RESPONSE: Final = FrameType.RESPONSE
_EVENT: Final = FrameType.EVENT
_INFO: Final = FrameType.INFO

# Frozen dataclasses are slow to build through __init__ (object.__setattr__ per
# field); the decoder fills the slots directly, skipping only that indirection.
_new = object.__new__


def _slot_setters(cls: type, *names: str) -> tuple[Callable[[object, object], None], ...]:
    return tuple(getattr(cls, name).__set__ for name in names)


_R_ID, _R_STATUS, _R_VALUE, _R_FID, _R_MESSAGE = _slot_setters(
    Response, "id", "status", "value", "fetch_id", "message"
)


def _make_response(
    rid: int, status: Status, value: Optional[Value], fetch_id: Optional[int], message: str
) -> Response:
    # Every routed set or call ends in one of these: skip the frozen __init__ (see above).
    response = _new(Response)
    _R_ID(response, rid)
    _R_STATUS(response, status)
    _R_VALUE(response, value)
    _R_FID(response, fetch_id)
    _R_MESSAGE(response, message)
    return response



# PROTOCOL.md 5.3: fixed widths; BOOL additionally 0x00/0x01; STRING valid UTF-8.
_WIDTH: Final = {0: 0, 1: 1, 2: 8, 3: 8}
_RESERVED_VTYPES: Final = frozenset(range(0x09, 0x80))
# Per type byte: the fixed width, or _OPAQUE for data carried without looking inside,
# or _CHECKED for STRING (UTF-8) and the reserved types (the careful path decides).
_OPAQUE: Final = -1
_CHECKED: Final = -2
_FAST_WIDTH: Final = [
    _WIDTH.get(t, _OPAQUE if t in (5, 6, 7, 8) or t >= 0x80 else _CHECKED) for t in range(256)
]
# Decoder.messages(): the width of the types whose data needs no look inside (NONE,
# INT64, FLOAT64), _OPAQUE as above, _CHECKED for BOOL, STRING and the reserved types.
_PLAIN_WIDTH: Final = [_CHECKED if t == 1 else w for t, w in enumerate(_FAST_WIDTH)]
_TWO_U32: Final = struct.Struct(">II")
_U16_FROM: Final = _U16.unpack_from
_U32_FROM: Final = _U32.unpack_from
_VALUE_HEAD_FROM: Final = _VALUE_HEAD.unpack_from
_ID_BYTE_FROM: Final = _ID_BYTE.unpack_from
_HEADER_FROM: Final = _HEADER.unpack_from


def _compiled() -> bool:
    return not hasattr(_compiled, "__code__")  # a mypyc function has no Python code object


# True when jet's compiled modules (jetwire._pure.COMPILED_MODULES, which are built,
# installed and, with JET_PURE_PYTHON=1, set aside together) run compiled by mypyc
# (issue 19). Their per-record loops (jetd's frame loop, the event-log walk) then read
# integers byte by byte, which mypyc turns into native loads (17 ns for a frame head,
# against 141 ns for a struct call); interpreted, the same reads cost 301 ns against
# 126 ns, so the pure-Python build keeps struct (BENCHMARKS.md, "Ninth session").
NATIVE: Final = _compiled()

Parser = Callable[[bytes, int, int, Optional[int], int], Message]


def is_utf8(data: bytes) -> bool:
    """True if ``data`` is valid UTF-8 (PROTOCOL.md 5.1: keys, names, STRING values)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _bad(message: str, rid: Optional[int], ftype: int) -> RemoteProtocolError:
    # PROTOCOL.md 9: a bad REQUEST with a readable id is answered (9.1) and a bad
    # RESPONSE is answered or dropped (9.3): the connection stays up. A REQUEST without
    # a readable id (9.1), any bad EVENT (9.3) and any bad INFO (9.2) close it.
    # Every caller has the whole body in hand: the frame boundary held (resumable).
    fatal = rid is None and ftype != _RESPONSE
    return RemoteProtocolError(
        message, Status.MALFORMED, request_id=rid, frame_type=ftype, fatal=fatal, resumable=True
    )


def _parse_value(buf: bytes, off: int, end: int, rid: Optional[int], ftype: int) -> Value:
    """Parse a Value that must fill ``buf[off:end]`` exactly."""
    if end - off < 5:
        raise _bad("value truncated: need 5 header bytes", rid, ftype)
    vtype, n = _VALUE_HEAD_FROM(buf, off)
    stop = off + 5 + n
    if stop != end:
        if stop > end:
            raise _bad(f"value length {n} runs past the body end", rid, ftype)
        raise _bad(f"{end - stop} trailing byte(s) after the value", rid, ftype)
    data = buf[off + 5 : stop]
    if vtype in _WIDTH:
        if n != _WIDTH[vtype]:
            raise _bad(f"{ValueType(vtype).name} value must be {_WIDTH[vtype]} bytes, got {n}", rid, ftype)
        if vtype == 1 and data[0] > 1:
            raise _bad(f"BOOL value must be 0x00 or 0x01, got 0x{data[0]:02X}", rid, ftype)
    elif vtype == 4:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _bad(f"STRING value is not valid UTF-8 ({exc.reason})", rid, ftype) from None
    elif vtype in _RESERVED_VTYPES:
        raise _bad(f"reserved value type 0x{vtype:02X}", rid, ftype)
    return _make_value(vtype, data)


def _parse_str16(buf: bytes, off: int, end: int, what: str, rid: Optional[int], ftype: int) -> tuple[str, int]:
    if end - off < 2:
        raise _bad(f"{what} length truncated", rid, ftype)
    (n,) = _U16_FROM(buf, off)
    stop = off + 2 + n
    if stop > end:
        raise _bad(f"{what} length {n} runs past the body end", rid, ftype)
    try:
        text = buf[off + 2 : stop].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(f"{what} is not valid UTF-8 ({exc.reason})", rid, ftype) from None
    return text, stop


def _parse_key(buf: bytes, off: int, end: int, rid: Optional[int], ftype: int) -> tuple[str, int]:
    if end - off >= 2 and _U16_FROM(buf, off)[0] == 0:
        raise _bad("empty key", rid, ftype)
    return _parse_str16(buf, off, end, "key", rid, ftype)


def _end(off: int, end: int, rid: Optional[int], ftype: int) -> None:
    if off != end:
        raise _bad(f"{end - off} trailing byte(s)", rid, ftype)


def _key_value_parser(cls: type, lead_name: str) -> Parser:
    """Key, Value payload parser for ``cls``; ``lead`` fills the field ``lead_name``
    (the request id, None for the EVENT form, or a fetch event's fetch id)."""
    set_lead, set_key, set_value = _slot_setters(cls, lead_name, "key", "value")
    lead_is_id = lead_name == "id"

    def parse(buf: bytes, off: int, end: int, lead: Any, ftype: int) -> Message:
        # The common, valid case in one pass; anything doubtful goes to the careful
        # parsers below, which name the exact fault.
        if end - off >= 7:
            (n,) = _U16_FROM(buf, off)
            kstop = off + 2 + n
            if n and kstop + 5 <= end:
                vtype, vn = _VALUE_HEAD_FROM(buf, kstop)
                if kstop + 5 + vn == end:
                    width = _FAST_WIDTH[vtype]
                    if width >= 0:
                        plain = vn == width and (vtype != 1 or buf[kstop + 5] < 2)
                    elif width == _OPAQUE:
                        plain = True
                    else:
                        plain = vtype == 4 and is_utf8(buf[kstop + 5 : end])
                    if plain:
                        try:
                            key = buf[off + 2 : kstop].decode("utf-8")
                        except UnicodeDecodeError:
                            pass
                        else:
                            value = _new(Value)
                            _V_TYPE(value, vtype)
                            _V_DATA(value, buf[kstop + 5 : end])
                            msg: Message = _new(cls)
                            set_lead(msg, lead)
                            set_key(msg, key)
                            set_value(msg, value)
                            return msg
        rid = lead if lead_is_id else None
        key, off = _parse_key(buf, off, end, rid, ftype)
        return cls(lead, key, _parse_value(buf, off, end, rid, ftype))  # type: ignore[no-any-return]

    return parse


def _key_only_parser(cls: type) -> Parser:
    def parse(buf: bytes, off: int, end: int, rid: Optional[int], ftype: int) -> Message:
        key, off = _parse_key(buf, off, end, rid, ftype)
        _end(off, end, rid, ftype)
        return cls(rid, key)  # type: ignore[no-any-return]

    return parse


def _parse_fetch(buf: bytes, off: int, end: int, rid: Optional[int], ftype: int) -> Message:
    prefix, off = _parse_str16(buf, off, end, "prefix", rid, ftype)
    _end(off, end, rid, ftype)
    return FetchStates(rid, prefix)


def _parse_authenticate(buf: bytes, off: int, end: int, rid: Optional[int], ftype: int) -> Message:
    # PROTOCOL.md 6.12: user (1 <= n), password (may be empty).
    if end - off >= 2 and _U16_FROM(buf, off)[0] == 0:
        raise _bad("empty user", rid, ftype)
    user, off = _parse_str16(buf, off, end, "user", rid, ftype)
    password, off = _parse_str16(buf, off, end, "password", rid, ftype)
    _end(off, end, rid, ftype)
    return Authenticate(rid, user, password)


def _parse_unfetch(buf: bytes, off: int, end: int, rid: Optional[int], ftype: int) -> Message:
    if end - off != 4:
        raise _bad(f"UNFETCH payload must be 4 bytes, got {end - off}", rid, ftype)
    return Unfetch(rid, _U32_FROM(buf, off)[0])


_PATH_OPS: Final = {int(op): op for op in PathOp}
_FILTER_OPS: Final = {int(op): op for op in FilterOp}
_SORT_BYS: Final = {int(op): op for op in SortBy}
_ACTIONS: Final = {int(a): a for a in Action}
_ENTRY_KINDS: Final = {int(k): k for k in EntryKind}


def _parse_value_at(buf: bytes, off: int, end: int, rid: Optional[int], ftype: int) -> tuple[Value, int]:
    """Parse a Value at ``off`` that need not end the body: (value, offset after it)."""
    if end - off < 5:
        raise _bad("value truncated: need 5 header bytes", rid, ftype)
    n = _U32_FROM(buf, off + 1)[0]
    stop = off + 5 + n
    if stop > end:
        raise _bad(f"value length {n} runs past the body end", rid, ftype)
    return _parse_value(buf, off, stop, rid, ftype), stop


def _u8_at(buf: bytes, off: int, end: int, what: str, rid: Optional[int], ftype: int) -> int:
    if off >= end:
        raise _bad(f"{what} truncated", rid, ftype)
    return buf[off]


def _parse_query(buf: bytes, off: int, end: int, rid: Optional[int], ftype: int) -> Query:
    """PROTOCOL.md 14.1: a Query filling ``buf[off:end]``; unknown codes are MALFORMED
    (the semantic checks, INVALID_QUERY, are the daemon's)."""
    flags = _u8_at(buf, off, end, "query flags", rid, ftype)
    count = _u8_at(buf, off + 1, end, "matcher count", rid, ftype)
    off += 2
    matchers = []
    for _ in range(count):
        if end - off < 3:
            raise _bad("path matcher truncated", rid, ftype)
        op = _PATH_OPS.get(buf[off])
        if op is None:
            raise _bad(f"unknown path matcher op 0x{buf[off]:02X}", rid, ftype)
        mflags, n = buf[off + 1], buf[off + 2]
        off += 3
        operands = []
        for _ in range(n):
            text, off = _parse_str16(buf, off, end, "matcher operand", rid, ftype)
            operands.append(text)
        matchers.append(PathMatcher(op, tuple(operands), mflags))
    count = _u8_at(buf, off, end, "filter count", rid, ftype)
    off += 1
    filters = []
    for _ in range(count):
        if end - off < 2:
            raise _bad("value filter truncated", rid, ftype)
        fop = _FILTER_OPS.get(buf[off])
        if fop is None:
            raise _bad(f"unknown value filter op 0x{buf[off]:02X}", rid, ftype)
        fflags = buf[off + 1]
        field, off = _parse_str16(buf, off + 2, end, "filter field", rid, ftype)
        operand, off = _parse_value_at(buf, off, end, rid, ftype)
        filters.append(ValueFilter(fop, operand, field, fflags))
    if end - off < 2:
        raise _bad("sort truncated", rid, ftype)
    sort_by = _SORT_BYS.get(buf[off])
    if sort_by is None:
        raise _bad(f"unknown sort_by 0x{buf[off]:02X}", rid, ftype)
    sort_flags = buf[off + 1]
    sort_field, off = _parse_str16(buf, off + 2, end, "sort field", rid, ftype)
    if end - off != 8:
        raise _bad(f"window must be 8 bytes and end the query, got {end - off}", rid, ftype)
    window_from, window_to = _TWO_U32.unpack_from(buf, off)
    return Query(tuple(matchers), tuple(filters), sort_by, sort_field, sort_flags, window_from, window_to, flags)


def _parse_fetch_query(buf: bytes, off: int, end: int, rid: Optional[int], ftype: int) -> Message:
    return FetchQuery(rid, _parse_query(buf, off, end, rid, ftype))


def _parse_query_once(buf: bytes, off: int, end: int, rid: Optional[int], ftype: int) -> Message:
    return QueryOnce(rid, _parse_query(buf, off, end, rid, ftype))


_REQUEST_PARSERS: dict[int, Parser] = {
    Function.FETCH_QUERY: _parse_fetch_query,
    Function.QUERY_ONCE: _parse_query_once,
    Function.ADD_STATE: _key_value_parser(AddState, "id"),
    Function.REMOVE_STATE: _key_only_parser(RemoveState),
    Function.SET_STATE: _key_value_parser(SetState, "id"),
    Function.NOTIFY_STATE: _key_value_parser(NotifyState, "id"),
    Function.CALL_METHOD: _key_value_parser(CallMethod, "id"),
    Function.ADD_METHOD: _key_only_parser(AddMethod),
    Function.REMOVE_METHOD: _key_only_parser(RemoveMethod),
    Function.FETCH_STATES: _parse_fetch,
    Function.UNFETCH: _parse_unfetch,
    Function.GET_STATE: _key_only_parser(GetState),
    Function.AUTHENTICATE: _parse_authenticate,
}

_EVENT_REQUEST_PARSERS: dict[int, Parser] = {
    code: _REQUEST_PARSERS[code]
    for code in (Function.SET_STATE, Function.NOTIFY_STATE, Function.CALL_METHOD)
}


def _fetch_event_parser(cls: type) -> Callable[[bytes, int, int], Message]:
    parse_rest = _key_value_parser(cls, "fetch_id")

    def parse(buf: bytes, off: int, end: int) -> Message:
        if end - off < 4:
            raise _bad("fetch_id truncated", None, _EVENT)
        return parse_rest(buf, off + 4, end, _U32_FROM(buf, off)[0], _EVENT)

    return parse


_FETCH_EVENT_RAW_PARSERS: dict[int, Parser] = {
    EventCode.FETCH_ADD: _key_value_parser(FetchAdd, "fetch_id"),
    EventCode.FETCH_CHANGE: _key_value_parser(FetchChange, "fetch_id"),
    EventCode.FETCH_REMOVE: _key_value_parser(FetchRemove, "fetch_id"),
    EventCode.FETCH_UNMATCH: _key_value_parser(FetchUnmatch, "fetch_id"),
}

# Decoder.messages() builds the common key/value messages inline. Per function or
# event code: (class, setter of its lead field, of ``key``, of ``value``).
_Builder = tuple[type, Callable[[object, object], None], Callable[[object, object], None], Callable[[object, object], None]]


def _builder(cls: type, lead_name: str) -> _Builder:
    return (cls, *_slot_setters(cls, lead_name, "key", "value"))  # type: ignore[return-value]


_INLINE_REQUESTS: dict[int, _Builder] = {
    cls.function: _builder(cls, "id") for cls in (AddState, SetState, NotifyState, CallMethod)
}
_INLINE_FETCH_EVENTS: dict[int, _Builder] = {
    cls.code: _builder(cls, "fetch_id") for cls in (FetchAdd, FetchChange, FetchRemove, FetchUnmatch)
}
# The same, indexed by the code byte (a list index is cheaper than a dict lookup).
_INLINE_REQUEST_TABLE: list[Optional[_Builder]] = [_INLINE_REQUESTS.get(code) for code in range(256)]
_INLINE_FETCH_EVENT_TABLE: list[Optional[_Builder]] = [_INLINE_FETCH_EVENTS.get(code) for code in range(256)]

_FETCH_EVENT_PARSERS: dict[int, Callable[[bytes, int, int], Message]] = {
    EventCode.FETCH_ADD: _fetch_event_parser(FetchAdd),
    EventCode.FETCH_CHANGE: _fetch_event_parser(FetchChange),
    EventCode.FETCH_REMOVE: _fetch_event_parser(FetchRemove),
    EventCode.FETCH_UNMATCH: _fetch_event_parser(FetchUnmatch),
}


def _parse_fetch_key_event(cls: type) -> Callable[[bytes, int, int], Message]:
    def parse(buf: bytes, off: int, end: int) -> Message:
        if end - off < 5:
            raise _bad("fetch_id and action truncated", None, _EVENT)
        fid = _U32_FROM(buf, off)[0]
        action = _ACTIONS.get(buf[off + 4])
        if action is None:
            raise _bad(f"unknown action 0x{buf[off + 4]:02X}", None, _EVENT)
        key, stop = _parse_key(buf, off + 5, end, None, _EVENT)
        _end(stop, end, None, _EVENT)
        return cls(fid, action, key)  # type: ignore[no-any-return]

    return parse


def _parse_fetch_window(buf: bytes, off: int, end: int) -> Message:
    if end - off < 10:
        raise _bad("FETCH_WINDOW head truncated", None, _EVENT)
    fid, size = _TWO_U32.unpack_from(buf, off)
    (count,) = _U16_FROM(buf, off + 8)
    off += 10
    entries = []
    for _ in range(count):
        if end - off < 4:
            raise _bad("window entry truncated", None, _EVENT)
        index = _U32_FROM(buf, off)[0]
        key, off = _parse_key(buf, off + 4, end, None, _EVENT)
        value, off = _parse_value_at(buf, off, end, None, _EVENT)
        entries.append(WindowEntry(index, key, value))
    _end(off, end, None, _EVENT)
    return FetchWindow(fid, size, tuple(entries))


def _parse_query_entry(buf: bytes, off: int, end: int) -> Message:
    if end - off < 5:
        raise _bad("QUERY_ENTRY head truncated", None, _EVENT)
    rid = _U32_FROM(buf, off)[0]
    kind = _ENTRY_KINDS.get(buf[off + 4])
    if kind is None:
        raise _bad(f"unknown entry kind 0x{buf[off + 4]:02X}", None, _EVENT)
    key, off = _parse_key(buf, off + 5, end, None, _EVENT)
    return QueryEntry(rid, kind, key, _parse_value(buf, off, end, None, _EVENT))


_QUERY_EVENT_PARSERS: dict[int, Callable[[bytes, int, int], Message]] = {
    EventCode.FETCH_METHOD: _parse_fetch_key_event(FetchMethod),
    EventCode.FETCH_NODE: _parse_fetch_key_event(FetchNode),
    EventCode.FETCH_WINDOW: _parse_fetch_window,
    EventCode.QUERY_ENTRY: _parse_query_entry,
}

_STATUSES: Final = {int(s): s for s in Status}
_OK: Final = Status.OK


def _decode_request(buf: bytes, off: int, end: int) -> Message:
    if end - off < 5:
        rid = _U32_FROM(buf, off)[0] if end - off >= 4 else None
        raise _bad(f"REQUEST body of {end - off} bytes is shorter than id and function", rid, _REQUEST)
    rid, function = _ID_BYTE_FROM(buf, off)
    parser = _REQUEST_PARSERS.get(function)
    if parser is None:
        raise RemoteProtocolError(
            f"unknown function 0x{function:02X}",
            Status.UNKNOWN_FUNCTION,
            request_id=rid,
            frame_type=_REQUEST,
        )
    return parser(buf, off + 5, end, rid, _REQUEST)


def _decode_response(buf: bytes, off: int, end: int) -> Message:
    if end - off < 5:
        rid = _U32_FROM(buf, off)[0] if end - off >= 4 else None
        raise _bad(f"RESPONSE body of {end - off} bytes is shorter than id and status", rid, _RESPONSE)
    rid, status_byte = _ID_BYTE_FROM(buf, off)
    status = _STATUSES.get(status_byte)
    if status is None:
        raise _bad(f"unknown status 0x{status_byte:02X}", rid, _RESPONSE)
    off += 5
    rest = end - off
    if status is _OK:
        # PROTOCOL.md 4.2: the three OK payload shapes have disjoint lengths.
        if rest == 0:
            return _make_response(rid, _OK, None, None, "")
        if rest == 4:
            return _make_response(rid, _OK, None, _U32_FROM(buf, off)[0], "")
        if rest < 4:
            raise _bad(f"OK payload of {rest} bytes is neither empty, fetch_id nor Value", rid, _RESPONSE)
        return _make_response(rid, _OK, _parse_value(buf, off, end, rid, _RESPONSE), None, "")
    message, off = _parse_str16(buf, off, end, "message", rid, _RESPONSE)
    _end(off, end, rid, _RESPONSE)
    return _make_response(rid, status, None, None, message)


def _decode_event(buf: bytes, off: int, end: int) -> Message:
    if end == off:
        raise _bad("EVENT body is empty", None, _EVENT)
    code = buf[off]
    fetch_parser = _FETCH_EVENT_PARSERS.get(code)
    if fetch_parser is not None:
        return fetch_parser(buf, off + 1, end)
    request_parser = _EVENT_REQUEST_PARSERS.get(code)
    if request_parser is not None:
        return request_parser(buf, off + 1, end, None, _EVENT)
    query_parser = _QUERY_EVENT_PARSERS.get(code)
    if query_parser is not None:
        return query_parser(buf, off + 1, end)
    if code == EventCode.CLOSE:
        if end - off < 2:
            raise _bad("CLOSE status truncated", None, _EVENT)
        status = _STATUSES.get(buf[off + 1])
        if status is None:
            raise _bad(f"unknown status 0x{buf[off + 1]:02X}", None, _EVENT)
        message, off = _parse_str16(buf, off + 2, end, "message", None, _EVENT)
        _end(off, end, None, _EVENT)
        return Close(status, message)
    # PROTOCOL.md 9.3: an unknown event code cannot be answered; the connection closes.
    raise RemoteProtocolError(
        f"unknown event code 0x{code:02X}",
        Status.UNKNOWN_FUNCTION,
        frame_type=_EVENT,
        fatal=True,
        resumable=True,
    )


def _decode_info(buf: bytes, off: int, end: int) -> Message:
    if end - off < 12:
        raise _bad(f"INFO body of {end - off} bytes is shorter than its fixed part", None, _INFO)
    major, minor, max_body, features = _INFO_HEAD.unpack_from(buf, off)
    if major != PROTOCOL_MAJOR:
        # PROTOCOL.md 2, 9.2: another major version is fatal (CLOSE MALFORMED).
        raise _bad(f"INFO announces protocol major version {major}, not {PROTOCOL_MAJOR}", None, _INFO)
    name, off = _parse_str16(buf, off + 10, end, "name", None, _INFO)
    if off == end:
        return Info(name, max_body, features, major, minor)
    # PROTOCOL.md 4.4.1: the limits extension; bytes after the fields known are ignored.
    if end - off < 6:
        raise _bad(f"{end - off} bytes after the INFO name: the limits extension takes 6", None, _INFO)
    max_key_length, route_timeout_ms = _INFO_LIMITS.unpack_from(buf, off)
    return Info(name, max_body, features, major, minor, max_key_length, route_timeout_ms)


_BODY_DECODERS: dict[int, Callable[[bytes, int, int], Message]] = {
    FrameType.REQUEST: _decode_request,
    FrameType.RESPONSE: _decode_response,
    FrameType.EVENT: _decode_event,
    FrameType.INFO: _decode_info,
}


def decode_body(frame_type: int, body: bytes) -> Message:
    """Decode one frame body whose type byte is already known.

    Raises:
        RemoteProtocolError: for anything the spec does not allow; ``fatal`` is set for
            an unknown frame type.
    """
    decoder = _BODY_DECODERS.get(frame_type)
    if decoder is None:
        raise RemoteProtocolError(
            f"unknown frame type 0x{frame_type:02X}", Status.MALFORMED, frame_type=frame_type, fatal=True
        )
    body = bytes(body)
    return decoder(body, 0, len(body))


def frame_size(data: bytes, offset: int = 0) -> Optional[int]:
    """Total size (header + body) of the frame starting at ``offset``, or None if the
    header is not complete yet."""
    if len(data) - offset < HEADER_SIZE:
        return None
    length: int = _HEADER.unpack_from(data, offset)[1]
    return HEADER_SIZE + length


def decode_frame(frame: bytes, *, max_body: Optional[int] = None) -> Message:
    """Decode exactly one complete frame (header included).

    Args:
        frame: the frame's bytes, header included, nothing after it.
        max_body: when given, a ``length`` above it is rejected (TOO_LARGE, fatal)
            before the body is looked at (PROTOCOL.md 3).

    Returns:
        The decoded message.

    Raises:
        RemoteProtocolError: if ``frame`` is not exactly one valid frame.
    """
    if type(frame) is not bytes:
        frame = bytes(frame)  # the parsers slice values and keys out of it
    size = len(frame)
    if size >= 10:
        # The common case first, parsed in place (no body copy): a sound header and the
        # key/value requests and fetch events that make up most of the traffic.
        ftype, length = _HEADER_FROM(frame, 0)
        if length == size - HEADER_SIZE and (max_body is None or length <= max_body):
            if ftype == 1:
                rid, function = _ID_BYTE_FROM(frame, 5)
                parser = _REQUEST_PARSERS.get(function)
                if parser is not None:
                    return parser(frame, 10, size, rid, 1)
            elif ftype == 3:
                fetch_parser = _FETCH_EVENT_RAW_PARSERS.get(frame[5])
                if fetch_parser is not None:
                    return fetch_parser(frame, 10, size, _U32_FROM(frame, 6)[0], 3)
            elif ftype == 2 and size >= 15 and frame[9] == 0:
                # An OK response carrying a value of a fixed width or an opaque type
                # (PROTOCOL.md 4.2: a payload of 5 bytes or more is one Value).
                vtype, vn = _VALUE_HEAD_FROM(frame, 10)
                if 15 + vn == size:
                    width = _FAST_WIDTH[vtype]
                    if (width == vn and (vtype != 1 or frame[15] < 2)) or width == _OPAQUE:
                        value = _new(Value)
                        _V_TYPE(value, vtype)
                        _V_DATA(value, frame[15:])
                        return _make_response(_U32_FROM(frame, 5)[0], _OK, value, None, "")
            body_decoder = _BODY_DECODERS.get(ftype)
            if body_decoder is not None:
                return body_decoder(frame, HEADER_SIZE, size)
    if size < HEADER_SIZE:
        raise RemoteProtocolError(
            f"frame of {len(frame)} bytes is shorter than the 5-byte header", fatal=True
        )
    ftype, length = _HEADER.unpack_from(frame, 0)
    if max_body is not None and length > max_body:
        raise RemoteProtocolError(
            f"body of {length} bytes exceeds the maximum of {max_body}",
            Status.TOO_LARGE,
            frame_type=ftype,
            fatal=True,
        )
    if length != len(frame) - HEADER_SIZE:
        raise RemoteProtocolError(
            f"length field says {length} body bytes, frame has {len(frame) - HEADER_SIZE}",
            frame_type=ftype,
            fatal=True,
        )
    return decode_body(ftype, frame[HEADER_SIZE:])


# --- encoding -----------------------------------------------------------------------


def _key_bytes(key: str) -> bytes:
    try:
        raw = key.encode("utf-8")
    except (UnicodeEncodeError, AttributeError) as exc:
        raise LocalProtocolError(f"key must be a str encodable as UTF-8: {exc}") from None
    if not raw or len(raw) > 0xFFFF:
        raise LocalProtocolError(f"key must be 1..65535 UTF-8 bytes, got {len(raw)}")
    return raw


def _str16_bytes(text: str, what: str) -> bytes:
    try:
        raw = text.encode("utf-8")
    except (UnicodeEncodeError, AttributeError) as exc:
        raise LocalProtocolError(f"{what} must be a str encodable as UTF-8: {exc}") from None
    if len(raw) > 0xFFFF:
        raise LocalProtocolError(f"{what} must be at most 65535 UTF-8 bytes, got {len(raw)}")
    return raw


def _value_of(value: object) -> Value:
    if type(value) is not Value:
        raise LocalProtocolError(f"value must be a jetwire.Value, got {type(value).__name__}")
    return value


def _encode_key_value(msg: SetState) -> bytes:
    kb = _key_bytes(msg.key)
    value = _value_of(msg.value)
    data = value.data
    klen = len(kb)
    if msg.id is None:
        if msg.function not in (Function.SET_STATE, Function.NOTIFY_STATE, Function.CALL_METHOD):
            raise LocalProtocolError(f"{msg.function.name} needs an id: it has no EVENT form")
        head = _EVT_KEY.pack(_EVENT, 1 + 2 + klen + 5 + len(data), msg.function, klen)
    else:
        head = _REQ_KEY.pack(_REQUEST, 4 + 1 + 2 + klen + 5 + len(data), msg.id, msg.function, klen)
    return b"".join((head, kb, _VALUE_HEAD.pack(value.vtype, len(data)), data))


def _encode_key_only(msg: RemoveState) -> bytes:
    kb = _key_bytes(msg.key)
    return _REQ_KEY.pack(_REQUEST, 7 + len(kb), msg.id, msg.function, len(kb)) + kb


def _encode_fetch(msg: FetchStates) -> bytes:
    pb = _str16_bytes(msg.prefix, "prefix")
    return _REQ_KEY.pack(_REQUEST, 7 + len(pb), msg.id, msg.function, len(pb)) + pb


def _encode_authenticate(msg: Authenticate) -> bytes:
    ub = _str16_bytes(msg.user, "user")
    if not ub:
        raise LocalProtocolError("user must not be empty")  # PROTOCOL.md 6.12
    pb = _str16_bytes(msg.password, "password")
    return b"".join(
        (_REQ_KEY.pack(_REQUEST, 9 + len(ub) + len(pb), msg.id, msg.function, len(ub)), ub, _U16.pack(len(pb)), pb)
    )


def _encode_unfetch(msg: Unfetch) -> bytes:
    return _HEADER.pack(_REQUEST, 9) + _ID_BYTE.pack(msg.id, msg.function) + _U32.pack(msg.fetch_id)


def _encode_response(msg: Response) -> bytes:
    if msg.status not in _STATUSES:
        raise LocalProtocolError(f"unknown status {msg.status!r}")  # PROTOCOL.md 8
    if msg.status == Status.OK:
        if msg.message:
            raise LocalProtocolError("an OK response carries no message")
        if msg.value is not None:
            if msg.fetch_id is not None:
                raise LocalProtocolError("an OK response carries a value or a fetch_id, not both")
            value = _value_of(msg.value)
            data = value.data
            return b"".join(
                (
                    _RESP_HEAD.pack(_RESPONSE, 10 + len(data), msg.id, 0),
                    _VALUE_HEAD.pack(value.vtype, len(data)),
                    data,
                )
            )
        if msg.fetch_id is not None:
            return _RESP_HEAD.pack(_RESPONSE, 9, msg.id, 0) + _U32.pack(msg.fetch_id)
        return _RESP_HEAD.pack(_RESPONSE, 5, msg.id, 0)
    if msg.value is not None or msg.fetch_id is not None:
        raise LocalProtocolError(f"a {Status(msg.status).name} response carries only a message")
    mb = _str16_bytes(msg.message, "message")
    return b"".join((_RESP_HEAD.pack(_RESPONSE, 7 + len(mb), msg.id, msg.status), _U16.pack(len(mb)), mb))


def _encode_fetch_event(msg: FetchEvent) -> bytes:
    kb = _key_bytes(msg.key)
    value = _value_of(msg.value)
    data = value.data
    klen = len(kb)
    return b"".join(
        (
            _EVT_FID_KEY.pack(_EVENT, 1 + 4 + 2 + klen + 5 + len(data), msg.code, msg.fetch_id, klen),
            kb,
            _VALUE_HEAD.pack(value.vtype, len(data)),
            data,
        )
    )


def query_bytes(query: Query) -> bytes:
    """The wire form of ``query`` (PROTOCOL.md 14.1), without any frame around it.

    Raises:
        LocalProtocolError: for a count, code or operand that does not fit its field.
    """
    if type(query) is not Query:
        raise LocalProtocolError(f"query must be a jetwire.Query, got {type(query).__name__}")
    if len(query.matchers) > 0xFF or len(query.filters) > 0xFF:
        raise LocalProtocolError("a query has at most 255 matchers and 255 filters")
    parts = [bytes((query.flags, len(query.matchers)))]
    for matcher in query.matchers:
        if len(matcher.operands) > 0xFF:
            raise LocalProtocolError("a path matcher has at most 255 operands")
        parts.append(bytes((int(matcher.op), matcher.flags, len(matcher.operands))))
        for text in matcher.operands:
            raw = _str16_bytes(text, "matcher operand")
            parts.append(_U16.pack(len(raw)) + raw)
    parts.append(bytes((len(query.filters),)))
    for value_filter in query.filters:
        raw = _str16_bytes(value_filter.field, "filter field")
        operand = _value_of(value_filter.operand)
        parts.append(bytes((int(value_filter.op), value_filter.flags)) + _U16.pack(len(raw)) + raw)
        parts.append(_VALUE_HEAD.pack(operand.vtype, len(operand.data)) + operand.data)
    raw = _str16_bytes(query.sort_field, "sort field")
    parts.append(bytes((int(query.sort_by), query.sort_flags)) + _U16.pack(len(raw)) + raw)
    parts.append(_TWO_U32.pack(query.window_from, query.window_to))
    return b"".join(parts)


def _encode_query_request(msg: FetchQuery) -> bytes:
    body = query_bytes(msg.query)
    return _HEADER.pack(_REQUEST, 5 + len(body)) + _ID_BYTE.pack(msg.id, msg.function) + body


def _encode_fetch_key_event(msg: FetchKeyEvent) -> bytes:
    kb = _key_bytes(msg.key)
    head = _HEADER.pack(_EVENT, 1 + 4 + 1 + 2 + len(kb)) + bytes((msg.code,))
    return head + _U32.pack(msg.fetch_id) + bytes((Action(msg.action),)) + _U16.pack(len(kb)) + kb


def _encode_fetch_window(msg: FetchWindow) -> bytes:
    if len(msg.entries) > 0xFFFF:
        raise LocalProtocolError("a FETCH_WINDOW carries at most 65535 entries")
    parts = [bytes((EventCode.FETCH_WINDOW,)), _TWO_U32.pack(msg.fetch_id, msg.size), _U16.pack(len(msg.entries))]
    for entry in msg.entries:
        kb = _key_bytes(entry.key)
        value = _value_of(entry.value)
        parts.append(_U32.pack(entry.index) + _U16.pack(len(kb)) + kb)
        parts.append(_VALUE_HEAD.pack(value.vtype, len(value.data)) + value.data)
    body = b"".join(parts)
    return _HEADER.pack(_EVENT, len(body)) + body


def _encode_query_entry(msg: QueryEntry) -> bytes:
    kb = _key_bytes(msg.key)
    value = _value_of(msg.value)
    body = b"".join(
        (
            bytes((EventCode.QUERY_ENTRY,)),
            _U32.pack(msg.id),
            bytes((EntryKind(msg.kind),)),
            _U16.pack(len(kb)),
            kb,
            _VALUE_HEAD.pack(value.vtype, len(value.data)),
            value.data,
        )
    )
    return _HEADER.pack(_EVENT, len(body)) + body


def _encode_close(msg: Close) -> bytes:
    mb = _str16_bytes(msg.message, "message")
    return b"".join(
        (_HEADER.pack(_EVENT, 4 + len(mb)), bytes((EventCode.CLOSE, Status(msg.status))), _U16.pack(len(mb)), mb)
    )


def _encode_info(msg: Info) -> bytes:
    nb = _str16_bytes(msg.name, "name")
    limits = b""
    if msg.max_key_length is not None or msg.route_timeout_ms is not None:
        # PROTOCOL.md 4.4.1: both or neither.
        if msg.max_key_length is None or msg.route_timeout_ms is None:
            raise LocalProtocolError("the INFO limits extension needs max_key_length and route_timeout_ms")
        limits = _INFO_LIMITS.pack(msg.max_key_length, msg.route_timeout_ms)
    return b"".join(
        (
            _HEADER.pack(_INFO, 12 + len(nb) + len(limits)),
            _INFO_HEAD.pack(msg.major, msg.minor, msg.max_body, msg.features),
            _U16.pack(len(nb)),
            nb,
            limits,
        )
    )


_ENCODERS: dict[type, Callable[[Message], bytes]] = {
    AddState: _encode_key_value,  # type: ignore[dict-item]
    SetState: _encode_key_value,  # type: ignore[dict-item]
    NotifyState: _encode_key_value,  # type: ignore[dict-item]
    CallMethod: _encode_key_value,  # type: ignore[dict-item]
    RemoveState: _encode_key_only,  # type: ignore[dict-item]
    AddMethod: _encode_key_only,  # type: ignore[dict-item]
    RemoveMethod: _encode_key_only,  # type: ignore[dict-item]
    GetState: _encode_key_only,  # type: ignore[dict-item]
    FetchStates: _encode_fetch,  # type: ignore[dict-item]
    Unfetch: _encode_unfetch,  # type: ignore[dict-item]
    Authenticate: _encode_authenticate,  # type: ignore[dict-item]
    Response: _encode_response,  # type: ignore[dict-item]
    FetchAdd: _encode_fetch_event,  # type: ignore[dict-item]
    FetchChange: _encode_fetch_event,  # type: ignore[dict-item]
    FetchRemove: _encode_fetch_event,  # type: ignore[dict-item]
    FetchUnmatch: _encode_fetch_event,  # type: ignore[dict-item]
    FetchQuery: _encode_query_request,  # type: ignore[dict-item]
    QueryOnce: _encode_query_request,  # type: ignore[dict-item]
    FetchMethod: _encode_fetch_key_event,  # type: ignore[dict-item]
    FetchNode: _encode_fetch_key_event,  # type: ignore[dict-item]
    FetchWindow: _encode_fetch_window,  # type: ignore[dict-item]
    QueryEntry: _encode_query_entry,  # type: ignore[dict-item]
    Close: _encode_close,  # type: ignore[dict-item]
    Info: _encode_info,  # type: ignore[dict-item]
}


def encode(message: Message) -> bytes:
    """Encode one message as a complete frame (header included).

    Raises:
        LocalProtocolError: if the message cannot be sent as it is (empty or oversized
            key, id or fetch_id outside u32, a status/payload combination the spec
            forbids, a request without id that has no EVENT form).
    """
    encoder = _ENCODERS.get(type(message))
    if encoder is None:
        raise LocalProtocolError(f"not a jet message: {type(message).__name__}")
    if isinstance(message, Request) and message.id is None and not isinstance(
        message, (SetState, NotifyState, CallMethod)
    ):
        raise LocalProtocolError(f"{message.function.name} needs an id: it has no EVENT form")
    try:
        return encoder(message)
    except struct.error as exc:
        raise LocalProtocolError(f"{type(message).__name__}: field out of range ({exc})") from None
    except (ValueError, TypeError) as exc:
        raise LocalProtocolError(f"{type(message).__name__}: {exc}") from None


# --- the stream decoder -------------------------------------------------------------


class Decoder:
    """Sans-IO stream decoder: feed bytes in any chunking, pull complete messages.

    Usage::

        decoder = Decoder(max_body=1 << 20)
        decoder.receive_data(chunk)
        while (message := decoder.next_message()) is not None:
            ...

    Every body length is checked against ``max_body`` as soon as its header is
    complete, before the body is buffered (PROTOCOL.md 9.2).

    After a non-fatal :class:`RemoteProtocolError` (a bad REQUEST with a readable id,
    answer it with ``exc.status`` under ``exc.request_id``; a bad RESPONSE) the bad
    frame has been consumed and decoding may go on. After a fatal one (PROTOCOL.md 9.1
    short REQUEST, 9.2, 9.3 bad EVENT: send CLOSE with ``exc.status``) the decoder
    latches: every further call raises the same error and bytes fed afterwards are
    dropped, as a daemon must read nothing more from that connection.

    A tool that only reads (a dump, a log reader) can go past fatal errors whose frame
    boundary held (``exc.resumable``: a bad EVENT or INFO body, a short REQUEST) with
    ``latch_fatal=False``: the bad frame has then been consumed whole and decoding goes
    on at the next frame, exactly as after a non-fatal error. An error that lost the
    boundary (``exc.resumable`` False: an unknown frame type, a body over ``max_body``)
    latches either way, since nothing after it can be framed.

    :meth:`messages` is the fast way to drain a buffer (it parses key/value requests and
    fetch events inline); :meth:`next_message` is one call per message.

    Args:
        max_body: the largest body accepted (u32); a larger ``length`` is a fatal
            TOO_LARGE error raised from the 5 header bytes alone.
        latch_fatal: True (the default, for a peer or a daemon): stop at any fatal
            error. False: stop only when the frame boundary is lost (see above).

    Raises:
        LocalProtocolError: if ``max_body`` is not a u32.
    """

    __slots__ = ("_buf", "_chunks", "_dropped", "_error", "_extra", "_need", "_pos", "latch_fatal", "max_body")

    def __init__(self, *, max_body: int = DEFAULT_MAX_BODY, latch_fatal: bool = True) -> None:
        if not 0 <= max_body <= 0xFFFF_FFFF:
            raise LocalProtocolError(f"max_body must be within u32, got {max_body}")
        self.max_body = max_body
        self.latch_fatal = latch_fatal
        self._buf = b""
        self._pos = 0
        self._chunks: list[bytes] = []
        self._extra = 0  # bytes in _chunks
        self._need = HEADER_SIZE  # bytes from _pos needed before the next step can run
        self._error: Optional[RemoteProtocolError] = None
        self._dropped = 0  # bytes compacted away in front of _buf

    @property
    def consumed(self) -> int:
        """Bytes of the stream returned (or rejected) as complete frames so far."""
        return self._dropped + self._pos

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) - self._pos + self._extra

    def receive_data(self, data: Buffer) -> None:
        """Feed bytes received from the peer (any chunking; ``b""`` is ignored).

        After a fatal error the bytes are dropped: nothing more will be read from this
        stream (PROTOCOL.md 9.2), so nothing more is kept.

        Raises:
            LocalProtocolError: if ``data`` is not bytes-like.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            # bytes(5) would be five zero bytes: refuse instead of inventing data.
            raise LocalProtocolError(f"receive_data takes bytes, got {type(data).__name__}")
        if data and self._error is None:
            chunk = bytes(data)  # the caller may reuse its buffer
            self._chunks.append(chunk)
            self._extra += len(chunk)

    def _fill(self) -> bool:
        """Make at least ``_need`` bytes contiguous in ``_buf`` from ``_pos``."""
        have = len(self._buf) - self._pos
        if have >= self._need:
            return True
        if have + self._extra < self._need:
            return False
        self._dropped += self._pos
        self._chunks.insert(0, self._buf[self._pos :])
        self._buf = b"".join(self._chunks)
        self._pos = 0
        self._chunks.clear()
        self._extra = 0
        return True

    def _split(self) -> Optional[tuple[int, int, int]]:
        """Locate the next complete frame in ``_buf``: (type, body start, body end)."""
        if self._error is not None:
            raise self._error
        if not self._fill():
            return None
        pos = self._pos
        ftype, length = _HEADER_FROM(self._buf, pos)
        if ftype not in _BODY_DECODERS:
            self._error = RemoteProtocolError(
                f"unknown frame type 0x{ftype:02X}", Status.MALFORMED, frame_type=ftype, fatal=True
            )
            raise self._error
        if length > self.max_body:
            # PROTOCOL.md 9.2: checked before a single body byte is buffered for it.
            self._error = RemoteProtocolError(
                f"body of {length} bytes exceeds the maximum of {self.max_body}",
                Status.TOO_LARGE,
                frame_type=ftype,
                fatal=True,
            )
            raise self._error
        if pos + HEADER_SIZE + length > len(self._buf):
            self._need = HEADER_SIZE + length
            if not self._fill():
                return None
            pos = 0
        self._need = HEADER_SIZE
        end = pos + HEADER_SIZE + length
        self._pos = end
        return ftype, pos + HEADER_SIZE, end

    def next_frame(self) -> Optional[tuple[int, bytes]]:
        """Return the next complete ``(frame_type, body)``, or None if more bytes are needed.

        Only the header is checked: a known frame type and a body within ``max_body``.

        Raises:
            RemoteProtocolError: fatal, for an unknown frame type or an oversized body.
        """
        located = self._split()
        if located is None:
            return None
        ftype, start, end = located
        return ftype, self._buf[start:end]

    def next_message(self) -> Optional[Message]:
        """Return the next complete message, or None if more bytes are needed.

        Raises:
            RemoteProtocolError: for anything malformed (see the class docstring).
        """
        buf = self._buf
        pos = self._pos
        decoder = None
        if self._error is None and pos + HEADER_SIZE <= len(buf):
            # The next frame is often complete in the buffer already: skip the
            # bookkeeping of _split() then.
            ftype, length = _HEADER_FROM(buf, pos)
            end = pos + HEADER_SIZE + length
            if end <= len(buf) and length <= self.max_body:
                decoder = _BODY_DECODERS.get(ftype)
        if decoder is not None:
            self._pos = end
            start = pos + HEADER_SIZE
            try:
                # The bulk of the traffic skips one dispatch level.
                if ftype == 1 and length >= 5:
                    rid, function = _ID_BYTE_FROM(buf, start)
                    parser = _REQUEST_PARSERS.get(function)
                    if parser is not None:
                        return parser(buf, start + 5, end, rid, 1)
                elif ftype == 3 and length >= 5:
                    fetch_parser = _FETCH_EVENT_RAW_PARSERS.get(buf[start])
                    if fetch_parser is not None:
                        return fetch_parser(buf, start + 5, end, _U32_FROM(buf, start + 1)[0], 3)
            except RemoteProtocolError as exc:
                if exc.fatal and (self.latch_fatal or not exc.resumable):
                    self._error = exc  # PROTOCOL.md 9.3
                raise
        else:
            located = self._split()
            if located is None:
                return None
            ftype, start, end = located
            buf = self._buf
            decoder = _BODY_DECODERS[ftype]
        try:
            return decoder(buf, start, end)
        except RemoteProtocolError as exc:
            if exc.fatal and (self.latch_fatal or not exc.resumable):
                self._error = exc  # PROTOCOL.md 9.2, 9.3: nothing more is read
            raise

    def messages(self) -> Iterator[Message]:
        """Iterate over the complete messages buffered so far (the fast way to drain).

        Messages before a bad frame are yielded first; then the error is raised.
        """
        decoders = _BODY_DECODERS
        inline_requests = _INLINE_REQUEST_TABLE
        inline_fetch_events = _INLINE_FETCH_EVENT_TABLE
        req_head = _REQ_KEY.unpack_from
        evt_head = _EVT_FID_KEY.unpack_from
        frame_head = _HEADER_FROM
        value_head = _VALUE_HEAD_FROM
        plain_width = _PLAIN_WIDTH
        new = _new
        set_vtype = _V_TYPE
        set_vdata = _V_DATA
        max_body = self.max_body
        while self._error is None:
            buf = self._buf
            pos = self._pos
            size = len(buf)
            try:
                # Whole frames already contiguous in the buffer. Key/value REQUESTs and
                # fetch events (most of the traffic) are parsed right here with one
                # unpack for header + id/code + key length and one for the value head;
                # anything unusual or doubtful goes to the careful parsers, which name
                # the exact fault.
                while pos + 12 <= size:
                    ftype = buf[pos]
                    if ftype == 3:
                        _, length, code, lead, klen = evt_head(buf, pos)
                        build = inline_fetch_events[code]
                    elif ftype == 1:
                        _, length, lead, code, klen = req_head(buf, pos)
                        build = inline_requests[code]
                    else:
                        if ftype not in decoders:
                            break  # next_message() raises the fatal error
                        _, length = frame_head(buf, pos)
                        build = None
                    end = pos + 5 + length
                    if end > size or length > max_body:
                        break  # next_message() waits, or raises the fatal error
                    self._pos = end
                    if build is not None:
                        kstop = pos + 12 + klen
                        vstart = kstop + 5
                        if klen and vstart <= end:
                            vtype, vn = value_head(buf, kstop)
                            if vstart + vn == end:
                                width = plain_width[vtype]
                                data = buf[vstart:end]
                                # NONE, INT64, FLOAT64 of their width, or an opaque type:
                                # nothing to look at inside. BOOL and STRING are looked
                                # at here; anything else goes to the careful parser.
                                if (
                                    vn == width
                                    or width == _OPAQUE
                                    or (vtype == 1 and vn == 1 and data[0] < 2)
                                    or (vtype == 4 and is_utf8(data))
                                ):
                                    try:
                                        key = buf[pos + 12 : kstop].decode("utf-8")
                                    except UnicodeDecodeError:
                                        pass
                                    else:
                                        value = new(Value)
                                        set_vtype(value, vtype)
                                        set_vdata(value, data)
                                        cls, set_lead, set_key, set_value = build
                                        message: Message = new(cls)
                                        set_lead(message, lead)
                                        set_key(message, key)
                                        set_value(message, value)
                                        yield message
                                        # The caller pulled frames with next_message()
                                        # meanwhile: resync. (The buffer itself is only
                                        # replaced when the frame at ``end`` is incomplete,
                                        # which makes this loop stop there anyway.)
                                        if self._pos != end:
                                            break
                                        pos = end
                                        continue
                    yield decoders[ftype](buf, pos + HEADER_SIZE, end)
                    if self._pos != end:
                        break
                    pos = end
            except RemoteProtocolError as exc:
                if exc.fatal and (self.latch_fatal or not exc.resumable):
                    self._error = exc  # PROTOCOL.md 9.2, 9.3: nothing more is read
                raise
            pending = self.next_message()
            if pending is None:
                return
            yield pending
        raise self._error
