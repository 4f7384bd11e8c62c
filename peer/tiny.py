"""A tiny jet peer: one module, standard library only, no threads, no asyncio.

It shares no code with ``jetwire`` on purpose: copy this one file to a device and it
speaks the jet wire protocol v1 (spec/PROTOCOL.md) by itself. For the same reason it
keeps its own small copy of what :mod:`peer.core` does for the other two peers (request
ids, pending requests, answers to handler errors). Everything happens in the
caller's thread: a request blocks until its response arrives, and while it waits (or
in :meth:`TinyPeer.poll`) incoming frames are processed: routed sets and calls are
answered by your handlers, fetch events go to your callbacks.

    peer = TinyPeer("127.0.0.1", 11124, name="sensor")
    peer.add_state("dev/led", False, on_set=lambda v: bool(v))
    peer.fetch("plant/", lambda kind, key, value: print(kind, key, value))
    while True:
        peer.poll(1.0)
        peer.notify("dev/uptime", time.monotonic())

Values: None, bool, int (INT64), float, str, bytes, dict/list (JSON) map both ways; any
other value type arrives as a :class:`Raw` ``(vtype, data)`` and may be sent as one.

Security (PROTOCOL.md 15): ``TinyPeer(..., user="dev7", password="...")`` authenticates
right after connecting; ``ssl=True`` (or an ``ssl.SSLContext``) speaks TLS where the
platform has the ``ssl`` module.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import struct
import time
from collections.abc import Callable
from typing import Any
from typing import NamedTuple
from typing import Optional

try:  # not every platform that runs this file has it (PROTOCOL.md 15.6: TLS is optional)
    import ssl as _ssl
except ImportError:  # pragma: no cover
    _ssl = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_MAX_BODY",
    "DEFAULT_TIMEOUT",
    "NotJetDaemon",
    "Raw",
    "TinyError",
    "TinyPeer",
    "decode_frame",
    "describe_first_bytes",
    "encode_frame",
    "matcher",
    "query_bytes",
]

DEFAULT_MAX_BODY = 1 << 20  # PROTOCOL.md 3
DEFAULT_TIMEOUT = 10.0

# PROTOCOL.md 3, 4: frame types
REQUEST, RESPONSE, EVENT, INFO = 1, 2, 3, 4
# PROTOCOL.md 6: functions (SET/NOTIFY/CALL double as event codes, 7.1)
ADD_STATE, REMOVE_STATE, SET_STATE, NOTIFY_STATE, CALL_METHOD = 1, 2, 3, 4, 5
ADD_METHOD, REMOVE_METHOD, FETCH_STATES, UNFETCH, GET_STATE = 6, 7, 8, 9, 10
FETCH_QUERY, QUERY_ONCE = 0x0B, 0x0C  # PROTOCOL.md 14 (protocol 1.1)
AUTHENTICATE = 0x10  # PROTOCOL.md 6.12 (protocol 1.1)
# PROTOCOL.md 7: event codes
FETCH_ADD, FETCH_CHANGE, FETCH_REMOVE, CLOSE = 0x81, 0x82, 0x83, 0xF0
FETCH_UNMATCH, FETCH_METHOD, FETCH_NODE, QUERY_ENTRY = 0x84, 0x85, 0x86, 0x88  # PROTOCOL.md 14.2, 14.4
# PROTOCOL.md 14.1: path matcher ops and flags (tiny supports path matchers only)
STARTS_WITH, ENDS_WITH, CONTAINS, EQUALS, EQUALS_ONE_OF, CONTAINS_ALL_OF = 1, 2, 3, 4, 5, 6
MATCH_NOT, MATCH_IGNORE_CASE = 0x01, 0x02
QUERY_METHODS, QUERY_NODES = 0x01, 0x02
_ENTRY_KINDS = {1: "state", 2: "method", 3: "node"}
# PROTOCOL.md 8: statuses (0x0E..0x10: protocol 1.1)
STATUS_NAMES = ["OK", "NOT_FOUND", "ALREADY_EXISTS", "NOT_OWNER", "REJECTED", "TIMEOUT", "OWNER_GONE", "MALFORMED", "UNKNOWN_FUNCTION", "TOO_LARGE", "LIMIT_EXCEEDED", "WRONG_KIND", "INTERNAL", "OVERLOADED", "AUTH_FAILED", "NOT_AUTHORIZED", "INVALID_QUERY"]
AUTH_FAILED, NOT_AUTHORIZED = 0x0E, 0x0F  # PROTOCOL.md 15
OK, NOT_FOUND, REJECTED, TIMEOUT, MALFORMED, UNKNOWN_FUNCTION, TOO_LARGE, INTERNAL = 0, 1, 4, 5, 7, 8, 9, 12
# PROTOCOL.md 5.3: value types
V_NONE, V_BOOL, V_INT64, V_FLOAT64, V_STRING, V_JSON, V_BYTES = 0, 1, 2, 3, 4, 5, 6
_FIXED = {V_NONE: 0, V_BOOL: 1, V_INT64: 8, V_FLOAT64: 8}
_KINDS = {FETCH_ADD: "add", FETCH_CHANGE: "change", FETCH_REMOVE: "remove", FETCH_UNMATCH: "unmatch"}
_KEYED = (ADD_STATE, REMOVE_STATE, SET_STATE, NOTIFY_STATE, CALL_METHOD, ADD_METHOD, REMOVE_METHOD, GET_STATE)
_WITH_VALUE = (ADD_STATE, SET_STATE, NOTIFY_STATE, CALL_METHOD)

_HEAD = struct.Struct(">BI")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_VHEAD = struct.Struct(">BI")
_INFO = struct.Struct(">BBII")
_LIMITS = struct.Struct(">HI")


class Raw(NamedTuple):
    """A value with no natural Python form (CBOR, MSGPACK, 0x80..0xFF): type and bytes."""

    vtype: int
    data: bytes


class TinyError(Exception):
    """A failed request, a refused set (raise it from a handler), or bad bytes.

    Attributes:
        status: status code (PROTOCOL.md 8); ``status_name`` is its name.
        message: human-readable reason.
        request_id: for malformed input, the id if it was readable.
        fatal: for malformed input, True if the stream cannot go on (PROTOCOL.md 9.2).
    """

    def __init__(self, status: int, message: str = "", *, request_id: Optional[int] = None, fatal: bool = False):
        self.status = status
        known = 0 <= status < len(STATUS_NAMES) and STATUS_NAMES[status]
        self.status_name = STATUS_NAMES[status] if known else f"0x{status:02X}"
        self.message = message
        self.request_id = request_id
        self.fatal = fatal
        super().__init__(f"{self.status_name}: {message}")


class NotJetDaemon(TinyError):
    """The server is not a jet daemon: its first bytes cannot begin the INFO a daemon
    sends at once (PROTOCOL.md 4.4), or it sent nothing at all.

    Attributes:
        seen: the first bytes it sent (empty if none).
        tls: True if they look like TLS records, or if it closed without a word when
            we spoke plain TCP (what a TLS listener does): connect with TLS.
    """

    def __init__(self, message: str, seen: bytes = b"", tls: bool = False):
        # PROTOCOL.md 11.1: an INFO header with a length beyond reason is TOO_LARGE.
        super().__init__(TOO_LARGE if seen[:1] == bytes((INFO,)) else MALFORMED, message, fatal=True)
        self.seen = seen
        self.tls = tls


_TLS_RECORD_TYPES = (0x14, 0x15, 0x16, 0x17)  # change_cipher_spec, alert, handshake, application_data
_INFO_BODY_MIN = 12  # PROTOCOL.md 4.4: major, minor, max_body, features, name length
_INFO_BODY_MAX = 1 << 24  # far above any INFO: name <= 65535 bytes, extensions a few bytes


def describe_first_bytes(head: bytes) -> Optional[str]:
    """What the first bytes a server sent say it is, if they cannot begin a jet
    daemon's first frame; None while they still may (or there are none).

    A daemon's first frame is INFO (PROTOCOL.md 4.4); a RESPONSE, EVENT or REQUEST
    header is left to the first-frame rule of PROTOCOL.md 11.1.
    """
    if not head:
        return None
    first = head[0]
    if first in _TLS_RECORD_TYPES and (len(head) < 2 or head[1] == 3):
        return f"it speaks TLS (its first bytes are a TLS record: {head[:8].hex(' ')})"
    if first in (REQUEST, RESPONSE, EVENT):
        return None
    if first == INFO:
        if len(head) < 5:
            return None
        length = _U32.unpack_from(head, 1)[0]
        if _INFO_BODY_MIN <= length <= _INFO_BODY_MAX:
            return None
    return f"it sent {_show_bytes(head)}"


def closed_without_a_word(address: str, used_tls: bool) -> str:
    """Why a server closed the connection before a single byte, as far as one can tell."""
    if used_tls:
        return f"{address} closed the connection without sending anything: not a jet daemon"
    return (
        f"{address} closed the connection without sending anything, as a TLS listener does to a peer "
        "that does not speak TLS (a jet daemon sends its INFO at once): it looks like a TLS port"
    )


def _show_bytes(head: bytes) -> str:
    if head.startswith(b"HTTP/"):
        line = head.split(b"\r\n", 1)[0].split(b"\n", 1)[0]
        return f"an HTTP answer ({line.decode('ascii', 'replace')!r}): an HTTP server"
    text = head[:48]
    if all(32 <= byte < 127 or byte in (9, 10, 13) for byte in text):
        return f"text {text.decode('ascii')!r}"
    return f"the bytes {text[:16].hex(' ')}"


# --- values -------------------------------------------------------------------------


def to_value(obj: Any) -> tuple[int, bytes]:
    """Map a Python object to ``(vtype, data)`` (PROTOCOL.md 5.3). Raises ValueError."""
    if isinstance(obj, Raw):
        return obj.vtype, bytes(obj.data)
    if obj is None:
        return V_NONE, b""
    if obj is True or obj is False:
        return V_BOOL, b"\x01" if obj else b"\x00"
    if isinstance(obj, int):
        if not -(2**63) <= obj < 2**63:
            raise ValueError(f"int {obj} does not fit INT64")
        return V_INT64, _I64.pack(obj)
    if isinstance(obj, float):
        return V_FLOAT64, _F64.pack(obj)
    if isinstance(obj, str):
        return V_STRING, obj.encode("utf-8")
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return V_BYTES, bytes(obj)
    if isinstance(obj, (dict, list)):
        return V_JSON, json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    raise ValueError(f"no jet value type for {type(obj).__name__}")


def from_value(vtype: int, data: bytes) -> Any:
    """Map ``(vtype, data)`` to Python; the inverse of :func:`to_value`."""
    if vtype == V_NONE:
        return None
    if vtype == V_BOOL:
        return data == b"\x01"
    if vtype == V_INT64:
        return _I64.unpack(data)[0]
    if vtype == V_FLOAT64:
        return _F64.unpack(data)[0]
    if vtype == V_STRING:
        return data.decode("utf-8")
    if vtype == V_BYTES:
        return data
    if vtype == V_JSON:
        try:
            return json.loads(data)
        except ValueError as exc:
            raise TinyError(MALFORMED, f"JSON value does not parse: {exc}") from None
    return Raw(vtype, data)


def _pack_value(value: tuple[int, bytes]) -> bytes:
    vtype, data = value
    if not 0 <= vtype <= 0xFF or 0x09 <= vtype < 0x80:
        raise ValueError(f"reserved value type 0x{vtype:02X}")
    if vtype in _FIXED and len(data) != _FIXED[vtype]:
        raise ValueError(f"value type 0x{vtype:02X} needs {_FIXED[vtype]} bytes")
    return _VHEAD.pack(vtype, len(data)) + data


def _str16(text: str, key: bool = False) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > 0xFFFF or (key and not raw):
        raise ValueError(f"{'key' if key else 'string'} must be {int(key)}..65535 UTF-8 bytes")
    return _U16.pack(len(raw)) + raw


# --- frames -------------------------------------------------------------------------


def encode_frame(msg: dict[str, Any]) -> bytes:
    """Encode one frame from its dict form (the form :func:`decode_frame` returns).

    Raises:
        ValueError: for a message the protocol cannot carry.
    """
    kind = msg["type"]
    if kind == INFO:
        body = _INFO.pack(msg.get("major", 1), msg.get("minor", 0), msg["max_body"], msg.get("features", 0))
        body += _str16(msg.get("name", ""))
        if "max_key_length" in msg:  # PROTOCOL.md 4.4.1: the limits extension
            body += _LIMITS.pack(msg["max_key_length"], msg["route_timeout_ms"])
    elif kind == REQUEST or (kind == EVENT and msg["code"] in (SET_STATE, NOTIFY_STATE, CALL_METHOD)):
        function = msg["function"] if kind == REQUEST else msg["code"]
        body = (_U32.pack(msg["id"]) + bytes((function,))) if kind == REQUEST else bytes((function,))
        if function in _KEYED:
            body += _str16(msg["key"], key=True)
            if function in _WITH_VALUE:
                body += _pack_value(msg["value"])
        elif function == FETCH_STATES:
            body += _str16(msg["prefix"])
        elif function == UNFETCH:
            body += _U32.pack(msg["fetch_id"])
        elif function in (FETCH_QUERY, QUERY_ONCE):
            body += msg["query"]  # bytes, from query_bytes()
        elif function == AUTHENTICATE:
            body += _str16(msg["user"], key=True) + _str16(msg["password"])
        else:
            raise ValueError(f"unknown function 0x{function:02X}")
    elif kind == RESPONSE:
        body = _U32.pack(msg["id"]) + bytes((msg["status"],))
        if msg["status"] != OK:
            body += _str16(msg.get("message", ""))
        elif msg.get("value") is not None:
            body += _pack_value(msg["value"])
        elif msg.get("fetch_id") is not None:
            body += _U32.pack(msg["fetch_id"])
    elif kind == EVENT and msg["code"] in _KINDS:
        body = bytes((msg["code"],)) + _U32.pack(msg["fetch_id"]) + _str16(msg["key"], key=True)
        body += _pack_value(msg["value"])
    elif kind == EVENT and msg["code"] == CLOSE:
        body = bytes((CLOSE, msg["status"])) + _str16(msg.get("message", ""))
    elif kind == EVENT and msg["code"] in (FETCH_METHOD, FETCH_NODE):
        body = bytes((msg["code"],)) + _U32.pack(msg["fetch_id"]) + bytes((msg["action"],)) + _str16(msg["key"], key=True)
    elif kind == EVENT and msg["code"] == QUERY_ENTRY:
        body = bytes((QUERY_ENTRY,)) + _U32.pack(msg["id"]) + bytes((msg["kind"],)) + _str16(msg["key"], key=True)
        body += _pack_value(msg["value"])
    else:
        raise ValueError(f"cannot encode {msg!r}")
    return _HEAD.pack(kind, len(body)) + body


class _Reader:
    """Cursor over one body; every failure is a TinyError carrying what is known."""

    def __init__(self, body: bytes, ftype: int, rid: Optional[int] = None, fatal: bool = False):
        self.body, self.pos, self.ftype, self.rid, self.fatal = body, 0, ftype, rid, fatal

    def fail(self, text: str, status: int = MALFORMED) -> TinyError:
        return TinyError(status, text, request_id=self.rid, fatal=self.fatal)

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.body):
            raise self.fail(f"{what} truncated")
        chunk = self.body[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u32(self, what: str) -> int:
        return int(_U32.unpack(self.take(4, what))[0])

    def str16(self, what: str, key: bool = False) -> str:
        n = _U16.unpack(self.take(2, what))[0]
        if key and n == 0:
            raise self.fail("empty key")
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None

    def value(self) -> tuple[int, bytes]:
        vtype, n = _VHEAD.unpack(self.take(5, "value header"))
        if self.pos + n != len(self.body):
            raise self.fail("value length does not end at the body end")
        data = self.take(n, "value")
        if 0x09 <= vtype < 0x80:
            raise self.fail(f"reserved value type 0x{vtype:02X}")
        if vtype in _FIXED and n != _FIXED[vtype]:
            raise self.fail(f"value type 0x{vtype:02X} needs {_FIXED[vtype]} bytes")
        if vtype == V_BOOL and data[0] > 1:
            raise self.fail("BOOL byte must be 0 or 1")
        if vtype == V_STRING:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                raise self.fail("STRING value is not valid UTF-8") from None
        return vtype, data

    def end(self) -> None:
        if self.pos != len(self.body):
            raise self.fail(f"{len(self.body) - self.pos} trailing byte(s)")


def decode_body(ftype: int, body: bytes) -> dict[str, Any]:
    """Decode one frame body into its dict form. Raises :class:`TinyError` (MALFORMED,
    UNKNOWN_FUNCTION) with ``request_id`` and ``fatal`` set as PROTOCOL.md 9 says."""
    if ftype in (REQUEST, RESPONSE):
        if len(body) < 5:
            rid = _U32.unpack_from(body)[0] if len(body) >= 4 else None
            # PROTOCOL.md 9.1 / 9.3: a REQUEST without a readable id is fatal, such a
            # RESPONSE is only dropped.
            fatal = rid is None and ftype == REQUEST
            raise TinyError(MALFORMED, f"body of {len(body)} bytes has no id and code", request_id=rid, fatal=fatal)
        rid, code = _U32.unpack_from(body)[0], body[4]
        r = _Reader(body, ftype, rid)
        r.pos = 5
        if ftype == RESPONSE:
            if code >= len(STATUS_NAMES) or not STATUS_NAMES[code]:
                raise r.fail(f"unknown status 0x{code:02X}")
            msg: dict[str, Any] = {"type": RESPONSE, "id": rid, "status": code}
            rest = len(body) - 5
            if code != OK:
                msg["message"] = r.str16("message")
            elif rest == 4:
                msg["fetch_id"] = r.u32("fetch_id")
            elif 0 < rest < 4:
                raise r.fail(f"OK payload of {rest} bytes")
            elif rest:
                msg["value"] = r.value()
            r.end()
            return msg
        return _decode_call(r, code, {"type": REQUEST, "id": rid, "function": code})
    if ftype == EVENT:
        r = _Reader(body, ftype, None, fatal=True)
        code = r.u8("event code")
        if code in _KINDS:
            fid = r.u32("fetch_id")
            key = r.str16("key", key=True)
            return {"type": EVENT, "code": code, "fetch_id": fid, "key": key, "value": r.value()}
        if code == CLOSE:
            status = r.u8("status")
            if status >= len(STATUS_NAMES) or not STATUS_NAMES[status]:
                raise r.fail(f"unknown status 0x{status:02X}")
            msg = {"type": EVENT, "code": CLOSE, "status": status, "message": r.str16("message")}
            r.end()
            return msg
        if code in (SET_STATE, NOTIFY_STATE, CALL_METHOD):
            return _decode_call(r, code, {"type": EVENT, "code": code})
        if code in (FETCH_METHOD, FETCH_NODE):
            fid = r.u32("fetch_id")
            action = r.u8("action")
            if action not in (1, 2):
                raise r.fail(f"unknown action 0x{action:02X}")
            msg = {"type": EVENT, "code": code, "fetch_id": fid, "action": action, "key": r.str16("key", key=True)}
            r.end()
            return msg
        if code == QUERY_ENTRY:
            rid = r.u32("request id")
            kind = r.u8("kind")
            if kind not in _ENTRY_KINDS:
                raise r.fail(f"unknown entry kind 0x{kind:02X}")
            key = r.str16("key", key=True)
            return {"type": EVENT, "code": code, "id": rid, "kind": kind, "key": key, "value": r.value()}
        raise r.fail(f"unknown event code 0x{code:02X}", UNKNOWN_FUNCTION)
    if ftype == INFO:
        r = _Reader(body, ftype, None, fatal=True)
        major, minor, max_body, features = _INFO.unpack(r.take(10, "INFO"))
        msg = {"type": INFO, "major": major, "minor": minor, "max_body": max_body, "features": features}
        msg["name"] = r.str16("name")
        if r.pos < len(body):
            # PROTOCOL.md 4.4.1: the limits extension; bytes after the fields known are ignored.
            msg["max_key_length"], msg["route_timeout_ms"] = _LIMITS.unpack(r.take(6, "INFO limits extension"))
        else:
            r.end()
        if major != 1:
            raise r.fail(f"unsupported major version {major}")
        return msg
    raise TinyError(MALFORMED, f"unknown frame type 0x{ftype:02X}", fatal=True)


def _decode_call(r: _Reader, code: int, msg: dict[str, Any]) -> dict[str, Any]:
    if code in _KEYED:
        msg["key"] = r.str16("key", key=True)
        if code in _WITH_VALUE:
            msg["value"] = r.value()
    elif code == FETCH_STATES:
        msg["prefix"] = r.str16("prefix")
    elif code == UNFETCH:
        msg["fetch_id"] = r.u32("fetch_id")
    elif code == AUTHENTICATE:
        msg["user"] = r.str16("user", key=True)
        msg["password"] = r.str16("password")
    else:
        raise r.fail(f"unknown function 0x{code:02X}", UNKNOWN_FUNCTION)
    r.end()
    return msg


def decode_frame(frame: bytes, max_body: int = DEFAULT_MAX_BODY) -> dict[str, Any]:
    """Decode exactly one complete frame (header included). Raises :class:`TinyError`."""
    if len(frame) < 5:
        raise TinyError(MALFORMED, "frame shorter than its header", fatal=True)
    ftype, length = _HEAD.unpack_from(frame)
    if ftype not in (REQUEST, RESPONSE, EVENT, INFO):
        raise TinyError(MALFORMED, f"unknown frame type 0x{ftype:02X}", fatal=True)
    if length > max_body:
        raise TinyError(TOO_LARGE, f"body of {length} bytes exceeds {max_body}", fatal=True)
    if len(frame) != 5 + length:
        raise TinyError(MALFORMED, f"frame of {len(frame)} bytes, header says {5 + length}", fatal=True)
    return decode_body(ftype, frame[5:])


def matcher(op: int, *operands: str, negate: bool = False, ignore_case: bool = False) -> tuple[int, int, tuple[str, ...]]:
    """A path matcher (PROTOCOL.md 14.1): ``matcher(ENDS_WITH, "/temp")``."""
    return op, (MATCH_NOT if negate else 0) | (MATCH_IGNORE_CASE if ignore_case else 0), operands


def query_bytes(prefix: str = "", matchers: Any = (), flags: int = 0) -> bytes:
    """A Query (PROTOCOL.md 14.1) of path matchers only: no filter, no sort."""
    every = ([(STARTS_WITH, 0, (prefix,))] if prefix else []) + list(matchers)
    out = bytes((flags, len(every)))
    for op, mflags, operands in every:
        out += bytes((op, mflags, len(operands))) + b"".join(_str16(text) for text in operands)
    return out + bytes((0, 0, 0)) + _U16.pack(0) + _U32.pack(0) + _U32.pack(0)


# --- the peer -----------------------------------------------------------------------

Handler = Callable[[Any], Any]
FetchCallback = Callable[[str, str, Any], Any]


class TinyPeer:
    """A blocking, single-threaded jet peer.

    Args:
        host, port: the daemon's address.
        name: sent in this peer's INFO.
        timeout: seconds to connect and the default wait for every response.
        info_timeout: seconds to wait for the daemon's INFO, which a daemon sends at
            once (default, and at most: ``timeout``); a server silent that long is
            reported as :class:`NotJetDaemon`.
        max_body: the largest body accepted (checked before buffering it).
        user, password: authenticate as ``user`` right after connecting (PROTOCOL.md 15.2).
        ssl: True (system CAs) or an ``ssl.SSLContext``: TLS (PROTOCOL.md 15.6).

    Raises:
        OSError: the connection failed (ssl.SSLError included).
        NotJetDaemon: the server sent bytes that cannot begin a daemon's INFO, closed
            without a word, or sent nothing within ``info_timeout``.
        TinyError: the daemon sent a bad INFO; AUTH_FAILED.
        RuntimeError: ``ssl`` asked for on a platform without the ssl module.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 11124,
        *,
        name: str = "tiny",
        timeout: float = DEFAULT_TIMEOUT,
        max_body: int = DEFAULT_MAX_BODY,
        user: Optional[str] = None,
        password: str = "",
        ssl: Any = None,
        info_timeout: Optional[float] = None,
    ) -> None:
        self.timeout = timeout
        self.max_body = max_body
        self.info: Optional[dict[str, Any]] = None
        self.closed = False
        self.on_set: dict[str, Optional[Handler]] = {}
        self.methods: dict[str, Handler] = {}
        self.fetches: dict[int, FetchCallback] = {}
        self._entries: dict[int, list[tuple[str, str, Any]]] = {}  # QUERY_ONCE id -> entries so far
        self._buf = b""
        self._responses: dict[int, dict[str, Any]] = {}
        self._pending: set[int] = set()  # ids of our requests still unanswered
        self._next_id = 0
        self._fetch_waiting: Optional[tuple[int, FetchCallback]] = None
        self._address = f"{host}:{port}"
        self._head = b""  # the daemon's first bytes, until its INFO: is it a jet daemon at all?
        sock = socket.create_connection((host, port), timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl:
            if _ssl is None:
                sock.close()
                raise RuntimeError("TLS asked for, but this platform has no ssl module")
            context = _ssl.create_default_context() if ssl is True else ssl
            try:
                sock = context.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        self._sock = sock
        self._tls = bool(ssl)
        self._send(encode_frame({"type": INFO, "max_body": max_body, "name": name}))
        wait = timeout if info_timeout is None else min(info_timeout, timeout)
        deadline = time.monotonic() + wait
        while self.info is None:
            try:
                pumped = self._pump(deadline - time.monotonic())
            except NotJetDaemon:
                raise
            except TinyError as exc:
                if self._head or not self.closed:
                    raise
                # Closed before a single byte: a daemon sends INFO first, even to refuse.
                raise NotJetDaemon(closed_without_a_word(self._address, self._tls), tls=not self._tls) from exc
            if not pumped and time.monotonic() >= deadline:
                self.close()
                if not self._head:
                    raise NotJetDaemon(
                        f"{self._address} sent nothing in {wait:g} s (a jet daemon sends its INFO at once): "
                        "not a jet daemon, or a stuck one"
                    )
                raise TinyError(TIMEOUT, "no INFO from the daemon")
        if user is not None:
            try:
                self._request({"function": AUTHENTICATE, "user": user, "password": password})
            except BaseException:
                self.close()
                raise

    # -- transport --

    def _send(self, frame: bytes) -> None:
        if self.closed:
            raise TinyError(MALFORMED, "connection closed")
        info = self.info
        if info is not None and len(frame) - 5 > info["max_body"]:
            raise TinyError(TOO_LARGE, f"body of {len(frame) - 5} bytes exceeds the daemon's {info['max_body']}")
        self._sock.sendall(frame)

    def _pump(self, timeout: float) -> int:
        """Wait up to ``timeout`` for bytes, then process every complete frame."""
        if self.closed:
            raise TinyError(MALFORMED, "connection closed")
        # TLS may hold decrypted bytes that select() cannot see.
        buffered = getattr(self._sock, "pending", None)
        if buffered is not None and buffered():
            readable: Any = True
        else:
            readable, _, _ = select.select([self._sock], [], [], max(timeout, 0.0))
        if readable:
            try:
                chunk = self._sock.recv(65536)
            except OSError as exc:
                self.close()
                raise TinyError(MALFORMED, f"connection lost: {exc}") from None
            if not chunk:
                self.close()
                raise TinyError(MALFORMED, "connection closed by the daemon")
            if self.info is None and len(self._head) < 64:
                self._head += chunk[: 64 - len(self._head)]
                foreign = describe_first_bytes(self._head)
                if foreign is not None:
                    self._fail(NotJetDaemon(f"{self._address} is not a jet daemon: {foreign}", self._head,
                                            tls=self._head[0] in _TLS_RECORD_TYPES))
            self._buf += chunk
        count = 0
        while len(self._buf) >= 5:
            ftype, length = _HEAD.unpack_from(self._buf)
            if length > self.max_body:  # PROTOCOL.md 3: checked before buffering the body
                self._fail(TinyError(TOO_LARGE, f"body of {length} bytes exceeds {self.max_body}", fatal=True))
            if len(self._buf) < 5 + length:
                break
            body, self._buf = self._buf[5 : 5 + length], self._buf[5 + length :]
            try:
                msg = decode_body(ftype, body)
            except TinyError as exc:
                if exc.fatal:
                    self._fail(exc)
                if ftype == REQUEST and exc.request_id is not None:
                    self._answer_error(exc.request_id, exc.status, exc.message)
                elif ftype == RESPONSE and exc.request_id in self._pending:
                    # PROTOCOL.md 11.1: fail that request at once rather than at its timeout.
                    rid = exc.request_id
                    self._responses[rid] = {"type": RESPONSE, "id": rid, "status": MALFORMED, "message": exc.message}
                continue
            self._handle(msg)
            count += 1
        return count

    def _fail(self, exc: TinyError) -> None:
        with contextlib.suppress(OSError):
            self._sock.sendall(encode_frame({"type": EVENT, "code": CLOSE, "status": exc.status, "message": exc.message}))
        self.close()
        raise exc

    def poll(self, timeout: float = 0.0) -> int:
        """Process incoming frames, waiting at most ``timeout`` seconds for the first.

        Returns:
            The number of frames processed.

        Raises:
            TinyError: the connection closed or the daemon sent bad bytes.
        """
        return self._pump(timeout)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if not self.closed:
            self.closed = True
            self._sock.close()

    def __enter__(self) -> TinyPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- dispatch --

    def _handle(self, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        if self.info is None and kind != INFO:
            # PROTOCOL.md 11.1: the daemon's first frame is INFO; anything else is fatal.
            self._fail(TinyError(MALFORMED, "the daemon's first frame is not INFO", fatal=True))
        if kind == RESPONSE:
            if msg["id"] not in self._pending:
                return  # PROTOCOL.md 11.1: a RESPONSE matching nothing pending is dropped
            self._responses[msg["id"]] = msg
            waiting = self._fetch_waiting
            if waiting is not None and waiting[0] == msg["id"] and "fetch_id" in msg:
                # PROTOCOL.md 10.5: the initial adds follow this OK, maybe in the same
                # read: register before the next frame is handled, so none is missed.
                self.fetches[msg["fetch_id"]] = waiting[1]
        elif kind == INFO:
            self.info = msg
        elif kind == EVENT and msg["code"] in _KINDS:
            callback = self.fetches.get(msg["fetch_id"])
            if callback is not None:
                callback(_KINDS[msg["code"]], msg["key"], from_value(*msg["value"]))
        elif kind == EVENT and msg["code"] in (FETCH_METHOD, FETCH_NODE):
            callback = self.fetches.get(msg["fetch_id"])
            if callback is not None:
                what = "method" if msg["code"] == FETCH_METHOD else "node"
                callback(f"{what}_{'add' if msg['action'] == 1 else 'remove'}", msg["key"], None)
        elif kind == EVENT and msg["code"] == QUERY_ENTRY:
            collected = self._entries.get(msg["id"])
            if collected is not None:
                collected.append((_ENTRY_KINDS[msg["kind"]], msg["key"], from_value(*msg["value"])))
        elif kind == EVENT and msg["code"] == CLOSE:
            self.close()
            raise TinyError(msg["status"], f"daemon closed the connection: {msg['message']}")
        elif msg.get("function", msg.get("code")) in (SET_STATE, CALL_METHOD):
            self._serve(msg)
        elif kind == REQUEST:
            self._answer_error(msg["id"], UNKNOWN_FUNCTION, "a peer serves only set and call")

    def _serve(self, msg: dict[str, Any]) -> None:
        rid, key = msg.get("id"), msg["key"]
        is_set = msg.get("function", msg.get("code")) == SET_STATE
        try:
            if is_set:
                if key not in self.on_set:
                    raise TinyError(NOT_FOUND, f"no state {key!r} here")
                handler = self.on_set[key]
                if handler is None:
                    raise TinyError(REJECTED, f"state {key!r} is read-only")
                outcome = handler(from_value(*msg["value"]))
                value = msg["value"] if outcome is None else to_value(outcome)
                # PROTOCOL.md 10.3: NOTIFY the complete new value first, then OK with it.
                frames = encode_frame({"type": EVENT, "code": NOTIFY_STATE, "key": key, "value": value})
            else:
                if key not in self.methods:
                    raise TinyError(NOT_FOUND, f"no method {key!r} here")
                value = to_value(self.methods[key](from_value(*msg["value"])))
                frames = b""
        except TinyError as exc:
            return self._answer_error(rid, exc.status, exc.message)
        except Exception as exc:
            return self._answer_error(rid, INTERNAL, f"handler failed: {type(exc).__name__}: {exc}")
        if rid is not None:
            frames += encode_frame({"type": RESPONSE, "id": rid, "status": OK, "value": value})
        self._send(frames)

    def _answer_error(self, rid: Optional[int], status: int, message: str) -> None:
        if rid is not None and not self.closed:
            self._send(encode_frame({"type": RESPONSE, "id": rid, "status": status, "message": message[:1000]}))

    # -- requests --

    def _request(self, msg: dict[str, Any], timeout: Optional[float] = None, shape: str = "empty") -> dict[str, Any]:
        """Send a request and wait for its answer; ``shape`` is the OK payload the
        function calls for: "empty", "value" (empty means NONE), "fetch_id" or "any"."""
        self._next_id = rid = (self._next_id + 1) & 0xFFFFFFFF
        msg["type"], msg["id"] = REQUEST, rid
        self._send(encode_frame(msg))
        self._pending.add(rid)
        try:
            deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
            while rid not in self._responses:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TinyError(TIMEOUT, "no response in time (peer timeout)")
                self._pump(remaining)
        finally:
            self._pending.discard(rid)
        response = self._responses.pop(rid)
        if response["status"] != OK:
            raise TinyError(response["status"], response["message"])
        got = "fetch_id" if "fetch_id" in response else "value" if "value" in response else "empty"
        if shape != "any" and got != shape and not (shape == "value" and got == "empty"):
            # PROTOCOL.md 11.1: a RESPONSE of the wrong shape fails the request.
            raise TinyError(MALFORMED, f"an OK with {got} where the function calls for {shape}")
        return response

    def add_state(self, key: str, value: Any, on_set: Optional[Handler] = None) -> None:
        """Add a state (PROTOCOL.md 6.1). ``on_set(value)`` returns the value to keep
        (None: the requested one) or raises ``TinyError(REJECTED, why)``; without it
        the state is read-only. Raises TinyError."""
        self.on_set[key] = on_set
        try:
            self._request({"function": ADD_STATE, "key": key, "value": to_value(value)})
        except BaseException:
            del self.on_set[key]
            raise

    def notify(self, key: str, value: Any, wait: bool = True) -> None:
        """Announce a state's new value (PROTOCOL.md 6.4); ``wait=False`` sends the
        fire-and-forget EVENT form. Raises TinyError."""
        if wait:
            self._request({"function": NOTIFY_STATE, "key": key, "value": to_value(value)})
        else:
            self._send(encode_frame({"type": EVENT, "code": NOTIFY_STATE, "key": key, "value": to_value(value)}))

    def remove_state(self, key: str) -> None:
        """Remove a state this peer owns (PROTOCOL.md 6.2). Raises TinyError."""
        self.on_set.pop(key, None)
        self._request({"function": REMOVE_STATE, "key": key})

    def add_method(self, key: str, handler: Handler) -> None:
        """Add a method; ``handler(args)`` returns the result. Raises TinyError."""
        self.methods[key] = handler
        try:
            self._request({"function": ADD_METHOD, "key": key})
        except BaseException:
            del self.methods[key]
            raise

    def remove_method(self, key: str) -> None:
        """Remove a method this peer owns (PROTOCOL.md 6.7). Raises TinyError."""
        self.methods.pop(key, None)
        self._request({"function": REMOVE_METHOD, "key": key})

    def set(self, key: str, value: Any, timeout: Optional[float] = None) -> Any:
        """Set a state; return the value now in effect (PROTOCOL.md 6.3). Raises TinyError."""
        response = self._request({"function": SET_STATE, "key": key, "value": to_value(value)}, timeout, "value")
        return from_value(*response["value"]) if "value" in response else None

    def call(self, key: str, args: Any = None, timeout: Optional[float] = None) -> Any:
        """Call a method; return its result (PROTOCOL.md 6.5). Raises TinyError."""
        response = self._request({"function": CALL_METHOD, "key": key, "value": to_value(args)}, timeout, "value")
        return from_value(*response["value"]) if "value" in response else None

    def get_raw(self, key: str) -> Raw:
        """The cached value as sent, ``Raw(vtype, data)`` (PROTOCOL.md 6.10). Raises TinyError."""
        response = self._request({"function": GET_STATE, "key": key}, shape="value")
        return Raw(*response.get("value", (V_NONE, b"")))

    def set_raw(self, key: str, value: Any, timeout: Optional[float] = None) -> Raw:
        """As :meth:`set`, the value in effect as sent. Raises TinyError."""
        response = self._request({"function": SET_STATE, "key": key, "value": to_value(value)}, timeout, "value")
        return Raw(*response.get("value", (V_NONE, b"")))

    def call_raw(self, key: str, args: Any = None, timeout: Optional[float] = None) -> Raw:
        """As :meth:`call`, the result as sent. Raises TinyError."""
        response = self._request({"function": CALL_METHOD, "key": key, "value": to_value(args)}, timeout, "value")
        return Raw(*response.get("value", (V_NONE, b"")))

    def get(self, key: str) -> Any:
        """Return the daemon's cached value of a state (PROTOCOL.md 6.10). Raises TinyError."""
        response = self._request({"function": GET_STATE, "key": key}, shape="value")
        return from_value(*response["value"]) if "value" in response else None

    def fetch(
        self, prefix: str, callback: FetchCallback, matchers: Any = (), methods: bool = False, nodes: bool = False
    ) -> int:
        """Fetch states by key prefix; ``callback(kind, key, value)`` gets every event,
        kind being "add", "change" or "remove". With ``matchers`` (see :func:`matcher`),
        ``methods`` or ``nodes`` it is a query fetch (protocol 1.1), whose kinds also
        include "method_add", "method_remove", "node_add", "node_remove" (value None).
        Returns the fetch id. Raises TinyError."""
        self._fetch_waiting = (self._next_id + 1) & 0xFFFFFFFF, callback
        try:
            if matchers or methods or nodes:
                flags = (QUERY_METHODS if methods else 0) | (QUERY_NODES if nodes else 0)
                request = {"function": FETCH_QUERY, "query": query_bytes(prefix, matchers, flags)}
            else:
                request = {"function": FETCH_STATES, "prefix": prefix}
            response = self._request(request, shape="fetch_id")
        finally:
            self._fetch_waiting = None
        return int(response["fetch_id"])

    def query(
        self, prefix: str = "", matchers: Any = (), methods: bool = False, nodes: bool = False
    ) -> list[tuple[str, str, Any]]:
        """One-shot query (QUERY_ONCE, PROTOCOL.md 14.4): ``[(kind, key, value), ...]`` in
        byte order of key, kind "state", "method" or "node". Raises TinyError."""
        rid = (self._next_id + 1) & 0xFFFFFFFF
        self._entries[rid] = []
        flags = (QUERY_METHODS if methods else 0) | (QUERY_NODES if nodes else 0)
        try:
            self._request({"function": QUERY_ONCE, "query": query_bytes(prefix, matchers, flags)})
            return self._entries[rid]
        finally:
            self._entries.pop(rid, None)

    def unfetch(self, fetch_id: int) -> None:
        """End a fetch (PROTOCOL.md 6.9). Raises TinyError."""
        self.fetches.pop(fetch_id, None)
        self._request({"function": UNFETCH, "fetch_id": fetch_id})
