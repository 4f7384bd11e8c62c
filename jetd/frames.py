"""The frame layouts and checks the daemon's hot paths share (PROTOCOL.md 3-5).

Precompiled ``struct`` objects and plain-int codes: the core works on received bytes
directly, and anything these quick checks doubt goes to :func:`jetwire.decode_body`,
which names the exact fault (:func:`why_malformed`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

from jetwire import Close
from jetwire import EventCode
from jetwire import Function
from jetwire import RemoteProtocolError
from jetwire import Status
from jetwire import decode_body
from jetwire import encode
from jetwire.codec import is_utf8
from jetwire.log import LogKind

# Every constant here is Final: compiled, mypyc inlines the literal ones and reads the
# others from C statics; a plain module global would be a dict lookup at each use.

# The struct functions typed: what they read is int, so that compiled code uses it natively.
_Read1 = Callable[[bytes, int], tuple[int]]
_Read2 = Callable[[bytes, int], tuple[int, int]]
_Pack = Callable[..., bytes]

# Frame heads (PROTOCOL.md 3, 4): type:u8 | length:u32, then id/function or code.
HDR: Final = struct.Struct(">BI")
HDR_FROM: Final[_Read2] = HDR.unpack_from
HDR_PACK: Final[_Pack] = HDR.pack
ID_HEAD: Final = struct.Struct(">BII")  # type, length, id: a REQUEST/RESPONSE head minus its last byte
ID_HEAD_PACK: Final[_Pack] = ID_HEAD.pack
RESP_HEAD: Final = struct.Struct(">BIIB")  # type, length, id, status
RESP_HEAD_PACK: Final[_Pack] = RESP_HEAD.pack
EVT_HEAD: Final = struct.Struct(">BIB")  # type, length, code
EVT_HEAD_PACK: Final[_Pack] = EVT_HEAD.pack
U16: Final = struct.Struct(">H")
U16_FROM: Final[_Read1] = U16.unpack_from
U32: Final = struct.Struct(">I")
U32_FROM: Final[_Read1] = U32.unpack_from
U32_PACK: Final[_Pack] = U32.pack
ID_BYTE_FROM: Final[_Read2] = struct.Struct(">IB").unpack_from
VHEAD_FROM: Final[_Read2] = struct.Struct(">BI").unpack_from

REQUEST: Final = 1
RESPONSE: Final = 2
EVENT: Final = 3
INFO: Final = 4
FETCH_ADD: Final = EventCode.FETCH_ADD.value
FETCH_CHANGE: Final = EventCode.FETCH_CHANGE.value
FETCH_REMOVE: Final = EventCode.FETCH_REMOVE.value
# Plain ints for the codes the hot paths compare: an IntEnum member costs several times
# a small int in a comparison.
SET_STATE: Final = Function.SET_STATE.value
CALL_METHOD: Final = Function.CALL_METHOD.value
EV_SET_STATE: Final = EventCode.SET_STATE.value
EV_NOTIFY_STATE: Final = EventCode.NOTIFY_STATE.value
EV_CLOSE: Final = EventCode.CLOSE.value
NONE_VALUE: Final = b"\x00\x00\x00\x00\x00"  # PROTOCOL.md 10.3: empty OK to a set -> NONE
KNOWN_STATUSES: Final = frozenset(int(s) for s in Status)  # PROTOCOL.md 8: the codes are not contiguous
# PROTOCOL.md 9.3: fetch events (1.0 and 1.1) only the daemon sends.
DAEMON_EVENTS: Final = frozenset({FETCH_ADD, FETCH_CHANGE, FETCH_REMOVE, *range(0x84, 0x89)})

# PROTOCOL.md 5.3 per vtype byte: fixed width (>= 0), opaque (-1), STRING (-2), reserved (-3).
OPAQUE: Final = -1
UTF8: Final = -2
RESERVED: Final = -3
VTYPE_CHECK: Final = [
    {0: 0, 1: 1, 2: 8, 3: 8, 4: UTF8}.get(t, OPAQUE if 5 <= t <= 8 or t >= 0x80 else RESERVED)
    for t in range(256)
]

# A FETCH_CHANGE event's head (type, length, code) per key-and-value length below
# CHANGE_HEADS_BELOW: one list index per fan-out instead of a pack (the fetch id follows).
CHANGE_HEADS_BELOW: Final = 1024
CHANGE_HEADS: Final = [EVT_HEAD_PACK(EVENT, 5 + n, FETCH_CHANGE) for n in range(CHANGE_HEADS_BELOW)]


ROUTE_PACK: Final = struct.Struct(">IIIIBH").pack  # JETLOG.md 4: ROUTE data up to the key bytes
ROUTE_KIND: Final = LogKind.ROUTE.value
FRAME_IN: Final = LogKind.FRAME_IN.value
FRAME_OUT: Final = LogKind.FRAME_OUT.value

LogHook = Callable[[int, int, bytes], None]
"""``hook(conn_id, kind, data)``: append one event-log record (the writer stamps it)."""


def value_ok(buf: bytes, off: int, end: int) -> bool:
    """True if ``buf[off:end]`` is exactly one well-formed Value (PROTOCOL.md 5.3)."""
    if end - off < 5:
        return False
    vtype, n = VHEAD_FROM(buf, off)
    if off + 5 + n != end:
        return False
    check = VTYPE_CHECK[vtype]
    if check >= 0:
        return n == check and (vtype != 1 or buf[off + 5] < 2)
    if check == OPAQUE:
        return True
    if check == UTF8:
        return is_utf8(buf[off + 5 : end])
    return False


def key_value_end(buf: bytes, off: int, end: int) -> int:
    """Offset where the key of a ``Key, Value`` payload at ``off`` ends, or -1 if the
    payload is not well formed. The key's UTF-8 is not checked here: a key found in the
    registry was checked when it was added, so only unknown keys need the check."""
    if end - off < 7:
        return -1
    klen: int = U16_FROM(buf, off)[0]
    kend = off + 2 + klen
    if klen == 0 or not value_ok(buf, kend, end):
        return -1
    return kend


def key_only_end(buf: bytes, off: int, end: int) -> bool:
    """True if ``buf[off:end]`` is exactly one non-empty str16 (UTF-8 checked later)."""
    return end - off >= 3 and off + 2 + U16_FROM(buf, off)[0] == end


def str16_ok(buf: bytes, off: int, end: int) -> bool:
    return end - off >= 2 and off + 2 + U16_FROM(buf, off)[0] == end and is_utf8(buf[off + 2 : end])


def response_frame(rid: int, status: Status, message: str) -> bytes:
    raw = message.encode("utf-8")[:0xFFFF]
    return RESP_HEAD_PACK(RESPONSE, 7 + len(raw), rid, status) + U16.pack(len(raw)) + raw


def ok_frame(rid: int) -> bytes:
    return RESP_HEAD_PACK(RESPONSE, 5, rid, 0)


def close_frame(status: Status, message: str) -> bytes:
    return encode(Close(status, message))


def why_malformed(ftype: int, body: bytes) -> tuple[Status, str]:
    """The status and reason jetwire gives for a body the fast checks rejected."""
    try:
        decode_body(ftype, body)
    except RemoteProtocolError as exc:
        return exc.status, exc.message
    return Status.MALFORMED, "malformed body"  # pragma: no cover - fast path is stricter only on keys
