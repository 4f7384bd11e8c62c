"""Numeric codes of the jet wire format, version 1 (spec/PROTOCOL.md)."""

from __future__ import annotations

from enum import IntEnum

PROTOCOL_MAJOR = 1  # PROTOCOL.md 2: major version; a mismatch is fatal
PROTOCOL_MINOR = 1  # PROTOCOL.md 2: minor versions only add, never change (1.1: section 14)

HEADER_SIZE = 5  # PROTOCOL.md 3: type:u8 | length:u32
DEFAULT_MAX_BODY = 1024 * 1024  # PROTOCOL.md 3: announced in INFO, 1 MiB unless configured
MIN_PEER_MAX_BODY = 64  # PROTOCOL.md 4.4: a smaller max_body in a peer's INFO is MALFORMED


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
    # 0x0B..0x0F: reserved for the queries of protocol 1.1 (PROTOCOL.md 2, 6)
    AUTHENTICATE = 0x10  # PROTOCOL.md 6.12, 14 (protocol 1.1)


class EventCode(IntEnum):
    """EVENT ``code`` byte (PROTOCOL.md 7)."""

    SET_STATE = 0x03  # PROTOCOL.md 7.1: fire-and-forget set
    NOTIFY_STATE = 0x04  # PROTOCOL.md 7.1: fire-and-forget notify
    CALL_METHOD = 0x05  # PROTOCOL.md 7.1: fire-and-forget call
    FETCH_ADD = 0x81  # PROTOCOL.md 7.2
    FETCH_CHANGE = 0x82  # PROTOCOL.md 7.2
    FETCH_REMOVE = 0x83  # PROTOCOL.md 7.2
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
    AUTH_FAILED = 0x0E  # PROTOCOL.md 14.2 (protocol 1.1)
    NOT_AUTHORIZED = 0x0F  # PROTOCOL.md 14.3 (protocol 1.1)


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
# 0x0000_0002: reserved for the queries of protocol 1.1 (PROTOCOL.md 4.4)
FEATURE_AUTH_REQUIRED = 0x0000_0004  # PROTOCOL.md 4.4, 14: permissions are enforced


def is_known_value_type(vtype: int) -> bool:
    """True for the standard value types and the application range (PROTOCOL.md 5.3)."""
    return vtype <= ValueType.MSGPACK or vtype >= APP_VALUE_TYPE_MIN
