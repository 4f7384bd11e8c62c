"""The two wire dialects the daemon benchmark speaks: jet (binary, via jetwire) and classic JSON Jet.

A :class:`Dialect` builds request bytes and hands out small stateful scanners for the
hot paths. The scanners look at frame headers only (and, for jet's fetch events, at byte
counts), so that the load generator spends far less CPU per message than the daemon.

Classic JSON Jet as node-jet 3.0.17 speaks it (``lib/1_socket/message-socket.js``,
``lib/2_jsonrpc``, ``lib/3_jet/daemon``): each message is a u32 big-endian length and a
JSON-RPC object; methods ``add``, ``change``, ``set``, ``fetch`` (params ``id`` chosen by
the client, ``path`` rules), ``unfetch``, ``info``; fetch events arrive as
``{"method": FETCH_ID, "params": {"path", "event": "Add"|"Change"|"Remove", "value"}}``.
node-jet drops a ``change`` whose value equals the cached one, so every value sent here
differs from the previous one of its key.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Protocol

from jetwire import AddState
from jetwire import FetchChange
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Info
from jetwire import NotifyState
from jetwire import SetState
from jetwire import Value
from jetwire import encode

_HEADER = struct.Struct(">BI")
_U32 = struct.Struct(">I")
_EVENT_HEAD = struct.Struct(">BIB")  # type, length, event code
_HEADER_FROM = _HEADER.unpack_from
_U32_FROM = _U32.unpack_from
_U16_FROM = struct.Struct(">H").unpack_from
_REQUEST, _RESPONSE, _EVENT, _INFO = 1, 2, 3, 4
_SET_STATE, _NOTIFY_STATE = 3, 4
_FETCH_ADD, _FETCH_CHANGE = 0x81, 0x82


class BenchError(RuntimeError):
    """The daemon answered something the benchmark did not expect."""


class ResponseScanner(Protocol):
    """Counts the responses in a byte stream, skipping everything else."""

    ok: int
    errors: int
    first_error: bytes

    def feed(self, data: bytes) -> None:
        """Scan more received bytes."""


class EventCounter(Protocol):
    """Counts the fetch events a fetcher receives."""

    events: int
    answered: bool

    def feed(self, data: bytes) -> None:
        """Scan more received bytes."""


class OwnerAnswerer(Protocol):
    """An owner that answers every routed SET with NOTIFY then OK (PROTOCOL.md 10.3)."""

    answered: int

    def feed(self, data: bytes) -> bytes:
        """Scan received bytes; return the bytes to send back."""


class Dialect(Protocol):
    """What a workload needs from a wire protocol."""

    name: str

    def hello(self, name: str) -> bytes:
        """Bytes a peer sends right after connecting."""

    def greets(self) -> bool:
        """True if the daemon sends a frame first on every connection."""

    def add_states(self, first_id: int, keys: Sequence[str], values: Sequence[int]) -> bytes:
        """ADD_STATE requests with consecutive ids."""

    def set_state(self, request_id: int, key: str, value: int) -> bytes:
        """One SET_STATE request."""

    def info_request(self, request_id: int) -> bytes:
        """A request with an answer and no side effect (to prove a connection is set up)."""

    def fetch_all(self, request_id: int, tag: str) -> bytes:
        """A fetch of every state."""

    def notify_block(self, keys: Sequence[str], value: int) -> bytes:
        """One change notification per key, all with ``value``."""

    def response_scanner(self) -> ResponseScanner:
        """A fresh response counter."""

    def event_counter(self, key_example: str) -> EventCounter:
        """A fresh fetch-event counter for events on keys as long as ``key_example``."""

    def owner_answerer(self) -> OwnerAnswerer:
        """A fresh owner for routed sets."""


# --- jet (binary) -------------------------------------------------------------------


class _JetResponses:
    """Header scan over a jet stream, counting RESPONSE frames by status."""

    def __init__(self) -> None:
        self.ok = 0
        self.errors = 0
        self.first_error = b""
        self._rest = b""

    def feed(self, data: bytes) -> None:
        buf = self._rest + data if self._rest else data
        pos = 0
        limit = len(buf) - 5
        while pos <= limit:
            ftype, length = _HEADER_FROM(buf, pos)
            end = pos + 5 + length
            if end > len(buf):
                break
            if ftype == _RESPONSE:
                if buf[pos + 9] == 0:
                    self.ok += 1
                else:
                    self.errors += 1
                    if not self.first_error:
                        self.first_error = bytes(buf[pos:end])
            pos = end
        self._rest = buf[pos:]


class _JetEventCounter:
    """Counts a jet fetcher's events without parsing them.

    Until the fetch's OK response, frames are walked one by one (the daemon's INFO, the
    response). After it every frame is a FETCH_ADD or FETCH_CHANGE of the same size
    (keys of one length, INT64 values), so the count is bytes / size; the first frame
    boundary of every chunk is checked to really start a fetch event.
    """

    def __init__(self, event_size: int) -> None:
        self.events = 0
        self.answered = False
        self._size = event_size
        self._offset = 0  # bytes of the current event frame already received
        self._rest = b""

    def feed(self, data: bytes) -> None:
        if not self.answered:
            buf = self._rest + data
            pos = 0
            while len(buf) - pos >= 5:
                ftype, length = _HEADER_FROM(buf, pos)
                if len(buf) - pos < 5 + length:
                    break
                if ftype == _RESPONSE:
                    if buf[pos + 9] != 0:
                        raise BenchError(f"fetch refused: {buf[pos : pos + 5 + length]!r}")
                    self.answered = True
                    pos += 5 + length
                    break
                if ftype == _EVENT:
                    raise BenchError("fetch event before the fetch's response")
                pos += 5 + length
            self._rest = buf[pos:] if not self.answered else b""
            if not self.answered:
                return
            data = buf[pos:]
        size = self._size
        boundary = (size - self._offset) % size
        if boundary + 5 < len(data) and (data[boundary] != _EVENT or data[boundary + 5] not in (_FETCH_ADD, _FETCH_CHANGE)):
            raise BenchError(f"not a fetch event of {size} bytes at a frame boundary: {data[boundary : boundary + 16]!r}")
        total = self._offset + len(data)
        self.events += total // size
        self._offset = total % size


class _JetOwner:
    """Answers routed SET_STATE requests: NOTIFY_STATE event with the value, then OK with it."""

    def __init__(self) -> None:
        self.answered = 0
        self._rest = b""

    def feed(self, data: bytes) -> bytes:
        buf = self._rest + data if self._rest else data
        out: list[bytes] = []
        pos = 0
        limit = len(buf) - 5
        event_head = _EVENT_HEAD.pack
        header = _HEADER.pack
        while pos <= limit:
            ftype, length = _HEADER_FROM(buf, pos)
            end = pos + 5 + length
            if end > len(buf):
                break
            if ftype == _REQUEST and buf[pos + 9] == _SET_STATE:
                payload = buf[pos + 10 : end]
                value = payload[2 + _U16_FROM(payload, 0)[0] :]
                out.append(event_head(_EVENT, 1 + len(payload), _NOTIFY_STATE))
                out.append(payload)
                out.append(header(_RESPONSE, 5 + len(value)))
                out.append(buf[pos + 5 : pos + 9])
                out.append(b"\x00")
                out.append(value)
                self.answered += 1
            pos = end
        self._rest = buf[pos:]
        return b"".join(out)


class JetDialect:
    """jet wire protocol v1 (spec/PROTOCOL.md), encoded with jetwire."""

    name = "jet"

    def hello(self, name: str) -> bytes:
        return encode(Info(name=name))

    def greets(self) -> bool:
        return True

    def add_states(self, first_id: int, keys: Sequence[str], values: Sequence[int]) -> bytes:
        return b"".join(
            encode(AddState(first_id + i, key, Value.of(value))) for i, (key, value) in enumerate(zip(keys, values, strict=True))
        )

    def set_state(self, request_id: int, key: str, value: int) -> bytes:
        return encode(SetState(request_id, key, Value.of(value)))

    def info_request(self, request_id: int) -> bytes:
        # GET_STATE of a key nobody added: a NOT_FOUND answer without side effects.
        return encode(GetState(request_id, "bench/none"))

    def fetch_all(self, request_id: int, tag: str) -> bytes:
        return encode(FetchStates(request_id, ""))

    def notify_block(self, keys: Sequence[str], value: int) -> bytes:
        # PROTOCOL.md 7.1: the fire-and-forget form, as an owner pushing data would use.
        return b"".join(encode(NotifyState(None, key, Value.of(value))) for key in keys)

    def response_scanner(self) -> ResponseScanner:
        return _JetResponses()

    def event_counter(self, key_example: str) -> EventCounter:
        return _JetEventCounter(len(encode(FetchChange(1, key_example, Value.of(0)))))

    def owner_answerer(self) -> OwnerAnswerer:
        return _JetOwner()


# --- classic JSON Jet (node-jet 3) ---------------------------------------------------


def _json_frame(obj: object) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return _U32.pack(len(body)) + body


class _JsonScan:
    """Splits a u32-length-prefixed stream into message bodies."""

    def __init__(self) -> None:
        self._rest = b""

    def split(self, data: bytes) -> list[bytes]:
        buf = self._rest + data if self._rest else data
        out = []
        pos = 0
        limit = len(buf) - 4
        while pos <= limit:
            end = pos + 4 + _U32_FROM(buf, pos)[0]
            if end > len(buf):
                break
            out.append(buf[pos + 4 : end])
            pos = end
        self._rest = buf[pos:]
        return out


class _JsonResponses(_JsonScan):
    def __init__(self) -> None:
        super().__init__()
        self.ok = 0
        self.errors = 0
        self.first_error = b""

    def feed(self, data: bytes) -> None:
        for body in self.split(data):
            # node-jet writes responses as {"id":..,"result":..} / {"id":..,"error":..}.
            if body.startswith(b'{"id"') and b'"method"' not in body:
                if b'"error"' in body:
                    self.errors += 1
                    if not self.first_error:
                        self.first_error = body
                else:
                    self.ok += 1


class _JsonEventCounter(_JsonScan):
    def __init__(self) -> None:
        super().__init__()
        self.events = 0
        self.answered = False

    def feed(self, data: bytes) -> None:
        for body in self.split(data):
            if body.startswith(b'{"method"'):
                self.events += 1
            elif body.startswith(b'{"id"'):
                if b'"error"' in body:
                    raise BenchError(f"fetch refused: {body[:200]!r}")
                self.answered = True


class _JsonOwner(_JsonScan):
    def __init__(self) -> None:
        super().__init__()
        self.answered = 0

    def feed(self, data: bytes) -> bytes:
        out = []
        for body in self.split(data):
            if b'"method":"set"' not in body:
                continue  # answers to our own change requests
            message = json.loads(body)
            params = message["params"]
            out.append(_json_frame({"id": "c", "method": "change", "params": params}))
            out.append(_json_frame({"id": message["id"], "result": params["value"]}))
            self.answered += 1
        return b"".join(out)


class JsonJetDialect:
    """Classic JSON Jet as spoken by node-jet 3."""

    name = "json"

    def hello(self, name: str) -> bytes:
        return b""

    def greets(self) -> bool:
        return False

    def add_states(self, first_id: int, keys: Sequence[str], values: Sequence[int]) -> bytes:
        return b"".join(
            _json_frame({"id": first_id + i, "method": "add", "params": {"path": key, "value": value}})
            for i, (key, value) in enumerate(zip(keys, values, strict=True))
        )

    def set_state(self, request_id: int, key: str, value: int) -> bytes:
        return _json_frame({"id": request_id, "method": "set", "params": {"path": key, "value": value}})

    def info_request(self, request_id: int) -> bytes:
        # A node-jet peer asks for info right after connecting (lib/3_jet/peer/index.js).
        return _json_frame({"id": request_id, "method": "info", "params": {}})

    def fetch_all(self, request_id: int, tag: str) -> bytes:
        # An empty path rule object matches every path (lib/3_jet/daemon/path_matcher.js).
        return _json_frame({"id": request_id, "method": "fetch", "params": {"id": tag, "path": {}}})

    def notify_block(self, keys: Sequence[str], value: int) -> bytes:
        return b"".join(
            _json_frame({"id": "n", "method": "change", "params": {"path": key, "value": value}}) for key in keys
        )

    def response_scanner(self) -> ResponseScanner:
        return _JsonResponses()

    def event_counter(self, key_example: str) -> EventCounter:
        return _JsonEventCounter()

    def owner_answerer(self) -> OwnerAnswerer:
        return _JsonOwner()


def dialect_for(kind: str) -> Dialect:
    """The dialect daemon ``kind`` speaks."""
    return JetDialect() if kind == "jetd" else JsonJetDialect()
