"""The declarative construct schema of every jet frame: the source of truth.

Each body ends in ``Terminated``; every code byte is checked explicitly (construct's
``Enum`` would let unknown values through). The fast codec in :mod:`jetwire.codec` is
proven equal to this schema by the tests.

:func:`parse_frame` and :func:`build_frame` work on whole frames; :func:`dissect` returns
every field with its byte offset and length, for tools such as jetdump.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from construct import Adapter
from construct import Array
from construct import Bytes
from construct import Check
from construct import Construct
from construct import ConstructError
from construct import Container
from construct import FixedSized
from construct import GreedyBytes
from construct import IfThenElse
from construct import Int8ub
from construct import Int16ub
from construct import Int32ub
from construct import Optional
from construct import Rebuild
from construct import StringEncoded
from construct import Struct
from construct import Subconstruct
from construct import Switch
from construct import Terminated
from construct import ValidationError
from construct import stream_tell
from construct import this

from .codes import FIXED_VALUE_WIDTHS
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
from .codes import is_known_value_type
from .errors import RemoteProtocolError

__all__ = ["BODIES", "FRAME", "Field", "build_frame", "dissect", "parse_body", "parse_frame"]


class Code(Adapter):  # type: ignore[misc]
    """A u8 code checked against an IntEnum (construct's Enum accepts any value)."""

    def __init__(self, enum: type[IntEnum], accept: Callable[[int], bool] | None = None) -> None:
        super().__init__(Int8ub)
        self.enum = enum
        self.accept = accept

    def _decode(self, obj: int, context: Any, path: str) -> Any:
        try:
            return self.enum(obj)
        except ValueError:
            if self.accept is not None and self.accept(obj):
                return obj
            raise ValidationError(f"unknown {self.enum.__name__} 0x{obj:02X}", path=path) from None

    def _encode(self, obj: Any, context: Any, path: str) -> int:
        if isinstance(obj, str):
            return int(self.enum[obj])
        return int(obj)


class Verify(Check):  # type: ignore[misc]
    """``Check`` with a plain Python predicate that also survives ``compile()``.

    construct's compiler writes a Check's lambda into its generated source as its repr
    (a syntax error); a construct whose ``_emitparse`` raises NotImplementedError is
    linked into the compiled parser as an instance instead.
    """

    def _emitparse(self, code: Any) -> str:
        raise NotImplementedError

    def _emitbuild(self, code: Any) -> str:
        raise NotImplementedError


class PySwitch(Switch):  # type: ignore[misc]
    """``Switch`` on a plain Python function, linked (not inlined) by ``compile()``."""

    def _emitparse(self, code: Any) -> str:
        raise NotImplementedError

    def _emitbuild(self, code: Any) -> str:
        raise NotImplementedError


class Located(Subconstruct):  # type: ignore[misc]
    """Records (name, offset, length, value) of the field it wraps into the ``_fields``
    parse parameter, when given; otherwise transparent."""

    def __init__(self, name: str, subcon: Construct) -> None:
        super().__init__(subcon)
        self.field_name = name

    def _parse(self, stream: Any, context: Any, path: str) -> Any:
        start = stream_tell(stream, path)
        obj = self.subcon._parsereport(stream, context, path)
        sink = context._params.get("_fields")
        if sink is not None:
            sink.append((self.field_name, start, stream_tell(stream, path) - start, obj))
        return obj


def _f(name: str, subcon: Construct) -> Construct:
    return name / Located(name, subcon)


def _utf8_len(field: str) -> Callable[[Any], int]:
    return lambda ctx: len(ctx[field].encode("utf-8"))


def _str16(name: str, *, min_len: int = 0) -> tuple[Construct, ...]:
    """``name_length:u16 | name:UTF-8`` as two flat fields (PROTOCOL.md 5.1)."""
    length = f"{name}_length"
    fields: list[Construct] = [_f(length, Rebuild(Int16ub, _utf8_len(name)))]
    if min_len:
        fields.append(Verify(lambda ctx: ctx[length] >= min_len))
    fields.append(_f(name, StringEncoded(Bytes(lambda ctx: ctx[length]), "utf8")))
    return tuple(fields)


def _value_ok(ctx: Any) -> bool:
    """PROTOCOL.md 5.3: fixed widths, BOOL 0/1, STRING valid UTF-8."""
    vtype = int(ctx.value_type)
    data = ctx.value
    width = FIXED_VALUE_WIDTHS.get(vtype)
    if width is not None and len(data) != width:
        return False
    if vtype == ValueType.BOOL and data not in (b"\x00", b"\x01"):
        return False
    if vtype == ValueType.STRING:
        data.decode("utf-8")  # UnicodeDecodeError becomes MALFORMED in _protocol_error
    return True


VALUE_FIELDS: tuple[Construct, ...] = (
    _f("value_type", Code(ValueType, accept=is_known_value_type)),
    _f("value_length", Rebuild(Int32ub, lambda ctx: len(ctx.value))),
    _f("value", Bytes(this.value_length)),
    Verify(_value_ok),
)
KEY_FIELDS = _str16("key", min_len=1)

KEY_VALUE = Struct(*KEY_FIELDS, *VALUE_FIELDS)
KEY_ONLY = Struct(*KEY_FIELDS)
FETCH_EVENT = Struct(_f("fetch_id", Int32ub), *KEY_FIELDS, *VALUE_FIELDS)

# PROTOCOL.md 14.1: the Query of FETCH_QUERY and QUERY_ONCE (protocol 1.1).
PATH_MATCHER = Struct(
    _f("op", Code(PathOp)),
    _f("flags", Int8ub),
    _f("count", Rebuild(Int8ub, lambda ctx: len(ctx.operands))),
    "operands" / Array(this.count, Struct(*_str16("operand"))),
)
VALUE_FILTER = Struct(
    _f("op", Code(FilterOp)),
    _f("flags", Int8ub),
    *_str16("field"),
    *VALUE_FIELDS,
)
QUERY = Struct(
    _f("flags", Int8ub),
    _f("matcher_count", Rebuild(Int8ub, lambda ctx: len(ctx.matchers))),
    "matchers" / Array(this.matcher_count, PATH_MATCHER),
    _f("filter_count", Rebuild(Int8ub, lambda ctx: len(ctx.filters))),
    "filters" / Array(this.filter_count, VALUE_FILTER),
    _f("sort_by", Code(SortBy)),
    _f("sort_flags", Int8ub),
    *_str16("sort_field"),
    _f("from", Int32ub),
    _f("to", Int32ub),
)
FETCH_KEY_EVENT = Struct(_f("fetch_id", Int32ub), _f("action", Code(Action)), *KEY_FIELDS)
WINDOW_ENTRY = Struct(_f("index", Int32ub), *KEY_FIELDS, *VALUE_FIELDS)
FETCH_WINDOW = Struct(
    _f("fetch_id", Int32ub),
    _f("size", Int32ub),
    _f("entry_count", Rebuild(Int16ub, lambda ctx: len(ctx.entries))),
    "entries" / Array(this.entry_count, WINDOW_ENTRY),
)
QUERY_ENTRY = Struct(_f("request_id", Int32ub), _f("kind", Code(EntryKind)), *KEY_FIELDS, *VALUE_FIELDS)

REQUEST_PAYLOADS = {
    Function.ADD_STATE: KEY_VALUE,
    Function.REMOVE_STATE: KEY_ONLY,
    Function.SET_STATE: KEY_VALUE,
    Function.NOTIFY_STATE: KEY_VALUE,
    Function.CALL_METHOD: KEY_VALUE,
    Function.ADD_METHOD: KEY_ONLY,
    Function.REMOVE_METHOD: KEY_ONLY,
    Function.FETCH_STATES: Struct(*_str16("prefix")),
    Function.UNFETCH: Struct(_f("fetch_id", Int32ub)),
    Function.GET_STATE: KEY_ONLY,
    Function.FETCH_QUERY: QUERY,
    Function.QUERY_ONCE: QUERY,
    Function.AUTHENTICATE: Struct(*_str16("user", min_len=1), *_str16("password")),
}

REQUEST_BODY = Struct(
    _f("id", Int32ub),
    _f("function", Code(Function)),
    "payload" / Switch(this.function, {int(k): v for k, v in REQUEST_PAYLOADS.items()}),
    Terminated,
)


def _remaining(ctx: Any) -> int:
    stream = ctx._io
    position = stream.tell()
    end = stream.seek(0, 2)
    stream.seek(position)
    return int(end - position)


def _ok_shape(ctx: Any) -> str:
    """PROTOCOL.md 4.2: an OK payload is empty, a fetch_id, or a Value, told apart by
    its length (0, 4, >= 5) when parsing, by its fields when building."""
    if ctx._parsing:
        size = _remaining(ctx)
        return {0: "empty", 4: "fetch_id"}.get(size, "value" if size >= 5 else "bad")
    payload = ctx.payload or {}
    if "value" in payload:
        return "value"
    return "fetch_id" if "fetch_id" in payload else "empty"


OK_PAYLOAD = PySwitch(
    _ok_shape,
    {
        "empty": Struct(),
        "fetch_id": Struct(_f("fetch_id", Int32ub)),
        "value": Struct(*VALUE_FIELDS),
        "bad": Verify(lambda ctx: False),
    },
)

RESPONSE_BODY = Struct(
    _f("id", Int32ub),
    _f("status", Code(Status)),
    "payload" / IfThenElse(this.status == Status.OK, OK_PAYLOAD, Struct(*_str16("message"))),
    Terminated,
)

EVENT_PAYLOADS = {
    EventCode.SET_STATE: KEY_VALUE,
    EventCode.NOTIFY_STATE: KEY_VALUE,
    EventCode.CALL_METHOD: KEY_VALUE,
    EventCode.FETCH_ADD: FETCH_EVENT,
    EventCode.FETCH_CHANGE: FETCH_EVENT,
    EventCode.FETCH_REMOVE: FETCH_EVENT,
    EventCode.FETCH_UNMATCH: FETCH_EVENT,
    EventCode.FETCH_METHOD: FETCH_KEY_EVENT,
    EventCode.FETCH_NODE: FETCH_KEY_EVENT,
    EventCode.FETCH_WINDOW: FETCH_WINDOW,
    EventCode.QUERY_ENTRY: QUERY_ENTRY,
    EventCode.CLOSE: Struct(_f("status", Code(Status)), *_str16("message")),
}

EVENT_BODY = Struct(
    _f("code", Code(EventCode)),
    "payload" / Switch(this.code, {int(k): v for k, v in EVENT_PAYLOADS.items()}),
    Terminated,
)

INFO_BODY = Struct(
    _f("major", Int8ub),
    # PROTOCOL.md 2, 9.2: an INFO of another major version is rejected on receipt; it
    # can still be built, so that tests can send one.
    Verify(lambda ctx: not ctx._parsing or ctx.major == PROTOCOL_MAJOR),
    _f("minor", Int8ub),
    _f("max_body", Int32ub),
    _f("features", Int32ub),
    *_str16("name"),
    # PROTOCOL.md 4.4.1 (1.2): the limits extension, then bytes a later minor may append.
    "limits"
    / Optional(Struct(_f("max_key_length", Int16ub), _f("route_timeout_ms", Int32ub), "later" / GreedyBytes)),
    Terminated,
)

BODIES: dict[int, Construct] = {
    FrameType.REQUEST: REQUEST_BODY,
    FrameType.RESPONSE: RESPONSE_BODY,
    FrameType.EVENT: EVENT_BODY,
    FrameType.INFO: INFO_BODY,
}

FRAME = Struct(
    _f("type", Code(FrameType)),
    _f("length", Rebuild(Int32ub, lambda ctx: len(BODIES[ctx.type].build(ctx.body)))),
    "body" / FixedSized(this.length, Switch(this.type, {int(k): v for k, v in BODIES.items()})),
    Terminated,
)


def _protocol_error(exc: Exception) -> RemoteProtocolError:
    if isinstance(exc, RemoteProtocolError):
        return exc
    return RemoteProtocolError(f"{type(exc).__name__}: {exc}")


def parse_body(frame_type: int, body: bytes) -> Container:
    """Parse one body with the schema.

    Raises:
        RemoteProtocolError: for anything the schema rejects (wrapping ConstructError,
            struct.error and UnicodeDecodeError).
    """
    schema = BODIES.get(frame_type)
    if schema is None:
        raise RemoteProtocolError(f"unknown frame type 0x{frame_type:02X}", fatal=True)
    try:
        return schema.parse(body)
    except (ConstructError, struct.error, UnicodeDecodeError, ValueError) as exc:
        raise _protocol_error(exc) from None


def parse_frame(frame: bytes, *, max_body: int | None = None) -> Container:
    """Parse exactly one whole frame (header included) with the schema.

    Args:
        frame: the frame's bytes, header included, nothing after it.
        max_body: when given, a ``length`` above it is rejected (TOO_LARGE) before the
            body is looked at, as a receiver must (PROTOCOL.md 3).

    Returns:
        The parsed container: ``type``, ``length`` and ``body`` with the body's fields.

    Raises:
        RemoteProtocolError: as :func:`parse_body`, also for a short or lying header.
    """
    if max_body is not None and len(frame) >= HEADER_SIZE:
        length = struct.unpack_from(">I", frame, 1)[0]
        if length > max_body:
            raise RemoteProtocolError(
                f"body of {length} bytes exceeds the maximum of {max_body}",
                Status.TOO_LARGE,
                frame_type=frame[0],
                fatal=True,
            )
    try:
        return FRAME.parse(frame)
    except (ConstructError, struct.error, UnicodeDecodeError, ValueError) as exc:
        raise _protocol_error(exc) from None


def build_frame(obj: dict[str, Any]) -> bytes:
    """Build a whole frame from a container as :func:`parse_frame` returns it."""
    return bytes(FRAME.build(obj))


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a frame: its schema name, absolute byte offset and length, value."""

    name: str
    offset: int
    length: int
    value: Any


def dissect(frame: bytes) -> tuple[list[Field], RemoteProtocolError | None]:
    """Every field of ``frame`` with its offset and length, in wire order.

    Returns the fields read (all of them, or those before the fault) and the error, if
    any: a tool can show how far a malformed frame parsed.
    """
    fields: list[Field] = []
    if len(frame) < HEADER_SIZE:
        if frame:
            fields.append(Field("type", 0, 1, frame[0]))
        return fields, RemoteProtocolError(
            f"frame of {len(frame)} bytes is shorter than the 5-byte header", fatal=True
        )
    ftype, length = struct.unpack_from(">BI", frame, 0)
    try:
        type_value: Any = FrameType(ftype)
    except ValueError:
        type_value = ftype
    fields.append(Field("type", 0, 1, type_value))
    fields.append(Field("length", 1, 4, length))
    schema = BODIES.get(ftype)
    if schema is None:
        return fields, RemoteProtocolError(f"unknown frame type 0x{ftype:02X}", fatal=True)
    body = frame[HEADER_SIZE : HEADER_SIZE + length]
    if len(body) < length:
        return fields, RemoteProtocolError(
            f"truncated: {len(body)} of {length} body bytes present", fatal=True
        )
    sink: list[tuple[str, int, int, Any]] = []
    error = None
    try:
        schema.parse(body, _fields=sink)
    except (ConstructError, struct.error, UnicodeDecodeError, ValueError) as exc:
        error = _protocol_error(exc)
    fields.extend(Field(name, HEADER_SIZE + offset, size, value) for name, offset, size, value in sink)
    return fields, error
