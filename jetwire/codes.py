"""Numeric codes of the jet wire format, version 1 (spec/PROTOCOL.md)."""

from __future__ import annotations

from enum import IntEnum
from typing import Final

__all__ = [
    "APP_VALUE_TYPE_MIN",
    "DEFAULT_MAX_BODY",
    "EVENT_FUNCTIONS",
    "FEATURE_AUTH_REQUIRED",
    "FEATURE_CONFLATION",
    "FEATURE_DAEMON_STATES",
    "FEATURE_LIMITS",
    "FEATURE_QUERIES",
    "FIXED_VALUE_WIDTHS",
    "HEADER_SIZE",
    "MATCH_IGNORE_CASE",
    "MATCH_NOT",
    "MEDIA_TYPES",
    "MIN_PEER_MAX_BODY",
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "QUERY_METHODS",
    "QUERY_NODES",
    "SINGLE_OPERAND_OPS",
    "SORT_DESCENDING",
    "Action",
    "EntryKind",
    "EventCode",
    "FilterOp",
    "FrameType",
    "Function",
    "PathOp",
    "SortBy",
    "Status",
    "TypeCode",
    "ValueType",
    "is_known_value_type",
]


PROTOCOL_MAJOR: Final = 1  # PROTOCOL.md 2: major version; a mismatch is fatal
PROTOCOL_MINOR: Final = 3  # PROTOCOL.md 2: minor versions only add, never change (1.1: sections 14, 15; 1.2: 4.4.1; 1.3: 16)

HEADER_SIZE: Final = 5  # PROTOCOL.md 3: type:u8 | length:u32
DEFAULT_MAX_BODY: Final = 1024 * 1024  # PROTOCOL.md 3: announced in INFO, 1 MiB unless configured
MIN_PEER_MAX_BODY: Final = 64  # PROTOCOL.md 4.4: a smaller max_body in a peer's INFO is MALFORMED


class FrameType(IntEnum):
    """Frame ``type`` byte (PROTOCOL.md 3)."""

    REQUEST = 0x01  # PROTOCOL.md 4.1
    RESPONSE = 0x02  # PROTOCOL.md 4.2
    EVENT = 0x03  # PROTOCOL.md 4.3
    INFO = 0x04  # PROTOCOL.md 4.4


class Function(IntEnum):
    """REQUEST ``function`` byte; the starred ones double as EVENT codes (PROTOCOL.md 6)."""

    ADD_STATE = 0x01  # PROTOCOL.md 6.1
    REMOVE_STATE = 0x02  # PROTOCOL.md 6.2
    SET_STATE = 0x03  # PROTOCOL.md 6.3, also an EVENT code
    NOTIFY_STATE = 0x04  # PROTOCOL.md 6.4, also an EVENT code
    CALL_METHOD = 0x05  # PROTOCOL.md 6.5, also an EVENT code
    ADD_METHOD = 0x06  # PROTOCOL.md 6.6
    REMOVE_METHOD = 0x07  # PROTOCOL.md 6.7
    FETCH_STATES = 0x08  # PROTOCOL.md 6.8
    UNFETCH = 0x09  # PROTOCOL.md 6.9
    GET_STATE = 0x0A  # PROTOCOL.md 6.10
    FETCH_QUERY = 0x0B  # PROTOCOL.md 14.3 (protocol 1.1)
    QUERY_ONCE = 0x0C  # PROTOCOL.md 14.4 (protocol 1.1)
    AUTHENTICATE = 0x10  # PROTOCOL.md 6.12, 15 (protocol 1.1)


class EventCode(IntEnum):
    """EVENT ``code`` byte (PROTOCOL.md 7)."""

    SET_STATE = 0x03  # PROTOCOL.md 7.1: fire-and-forget set
    NOTIFY_STATE = 0x04  # PROTOCOL.md 7.1: fire-and-forget notify
    CALL_METHOD = 0x05  # PROTOCOL.md 7.1: fire-and-forget call
    FETCH_ADD = 0x81  # PROTOCOL.md 7.2
    FETCH_CHANGE = 0x82  # PROTOCOL.md 7.2
    FETCH_REMOVE = 0x83  # PROTOCOL.md 7.2
    FETCH_UNMATCH = 0x84  # PROTOCOL.md 14.2 (1.1): still there, no longer matching
    FETCH_METHOD = 0x85  # PROTOCOL.md 14.2 (1.1)
    FETCH_NODE = 0x86  # PROTOCOL.md 14.2 (1.1)
    FETCH_WINDOW = 0x87  # PROTOCOL.md 14.2 (1.1): positions of a sorted window
    QUERY_ENTRY = 0x88  # PROTOCOL.md 14.4 (1.1): one entry of a QUERY_ONCE answer
    CLOSE = 0xF0  # PROTOCOL.md 7.3


class Status(IntEnum):
    """RESPONSE and CLOSE ``status`` byte (PROTOCOL.md 8)."""

    OK = 0x00
    NOT_FOUND = 0x01
    ALREADY_EXISTS = 0x02
    NOT_OWNER = 0x03
    REJECTED = 0x04
    TIMEOUT = 0x05
    OWNER_GONE = 0x06
    MALFORMED = 0x07
    UNKNOWN_FUNCTION = 0x08
    TOO_LARGE = 0x09
    LIMIT_EXCEEDED = 0x0A
    WRONG_KIND = 0x0B
    INTERNAL = 0x0C
    OVERLOADED = 0x0D
    AUTH_FAILED = 0x0E  # PROTOCOL.md 15.2 (protocol 1.1)
    NOT_AUTHORIZED = 0x0F  # PROTOCOL.md 15.3 (protocol 1.1)
    INVALID_QUERY = 0x10  # PROTOCOL.md 14.6 (protocol 1.1)


class ValueType(IntEnum):
    """Value ``vtype`` byte (PROTOCOL.md 5.3); 0x80..0xFF are application-defined."""

    NONE = 0x00  # n = 0
    BOOL = 0x01  # n = 1, 0x00 or 0x01
    INT64 = 0x02  # n = 8, two's complement
    FLOAT64 = 0x03  # n = 8, IEEE 754 binary64
    STRING = 0x04  # text/plain; charset=utf-8
    JSON = 0x05  # application/json
    BYTES = 0x06  # application/octet-stream
    CBOR = 0x07  # application/cbor
    MSGPACK = 0x08  # application/msgpack


APP_VALUE_TYPE_MIN = 0x80  # PROTOCOL.md 5.3: 0x80..0xFF carried opaquely

# PROTOCOL.md 5.3: media type of each standard value type.
MEDIA_TYPES: dict[int, str] = {
    ValueType.NONE: "",
    ValueType.BOOL: "",
    ValueType.INT64: "",
    ValueType.FLOAT64: "",
    ValueType.STRING: "text/plain; charset=utf-8",
    ValueType.JSON: "application/json",
    ValueType.BYTES: "application/octet-stream",
    ValueType.CBOR: "application/cbor",
    ValueType.MSGPACK: "application/msgpack",
}

# PROTOCOL.md 5.3: exact data length of the fixed-width value types.
FIXED_VALUE_WIDTHS: dict[int, int] = {
    ValueType.NONE: 0,
    ValueType.BOOL: 1,
    ValueType.INT64: 8,
    ValueType.FLOAT64: 8,
}

# PROTOCOL.md 7.1: functions that may also travel as a fire-and-forget EVENT.
EVENT_FUNCTIONS = frozenset({Function.SET_STATE, Function.NOTIFY_STATE, Function.CALL_METHOD})

FEATURE_CONFLATION = 0x0000_0001  # PROTOCOL.md 4.4, 10.8: may conflate FETCH_CHANGE
FEATURE_QUERIES = 0x0000_0002  # PROTOCOL.md 4.4, 14: answers FETCH_QUERY and QUERY_ONCE
FEATURE_AUTH_REQUIRED = 0x0000_0004  # PROTOCOL.md 4.4, 15: permissions are enforced
FEATURE_LIMITS = 0x0000_0008  # PROTOCOL.md 4.4.1: limits announced on request (daemon) / asked for (peer)
FEATURE_DAEMON_STATES = 0x0000_0010  # PROTOCOL.md 16: the daemon publishes its own states under $jet/


class PathOp(IntEnum):
    """PathMatcher ``op`` (PROTOCOL.md 14.1)."""

    STARTS_WITH = 0x01
    ENDS_WITH = 0x02
    CONTAINS = 0x03
    EQUALS = 0x04
    EQUALS_ONE_OF = 0x05  # one or more operands
    CONTAINS_ALL_OF = 0x06  # one or more operands


class FilterOp(IntEnum):
    """ValueFilter ``op`` (PROTOCOL.md 14.1)."""

    EQ = 0x01
    NE = 0x02
    LT = 0x03
    LE = 0x04
    GT = 0x05
    GE = 0x06
    IS_TYPE = 0x07  # operand: INT64 type code (TypeCode)


class SortBy(IntEnum):
    """Query ``sort_by`` (PROTOCOL.md 14.1)."""

    NONE = 0x00
    KEY = 0x01
    VALUE = 0x02
    FIELD = 0x03


class TypeCode(IntEnum):
    """IS_TYPE operand and rank of the order across types (PROTOCOL.md 14.1)."""

    NULL = 0
    BOOL = 1
    NUMBER = 2
    STRING = 3
    BYTES = 4
    ARRAY = 5
    OBJECT = 6


class Action(IntEnum):
    """FETCH_METHOD / FETCH_NODE ``action`` (PROTOCOL.md 14.2)."""

    ADD = 0x01
    REMOVE = 0x02


class EntryKind(IntEnum):
    """QUERY_ENTRY ``kind`` (PROTOCOL.md 14.4)."""

    STATE = 0x01
    METHOD = 0x02
    NODE = 0x03


QUERY_METHODS = 0x01  # PROTOCOL.md 14.1 query flags: include method entries
QUERY_NODES = 0x02  # PROTOCOL.md 14.1 query flags: include node entries
MATCH_NOT = 0x01  # PROTOCOL.md 14.1 matcher flags
MATCH_IGNORE_CASE = 0x02
SORT_DESCENDING = 0x01  # PROTOCOL.md 14.1 sort flags
SINGLE_OPERAND_OPS = frozenset({PathOp.STARTS_WITH, PathOp.ENDS_WITH, PathOp.CONTAINS, PathOp.EQUALS})


def is_known_value_type(vtype: int) -> bool:
    """True for the standard value types and the application range (PROTOCOL.md 5.3)."""
    return vtype <= ValueType.MSGPACK or vtype >= APP_VALUE_TYPE_MIN
