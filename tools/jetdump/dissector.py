"""Turn input events into numbered frame records: framing, errors, request matching.

Each direction of a stream has its own :class:`jetwire.Decoder` (the fast codec). The
bytes not yet consumed are shadowed here so that a malformed or truncated frame can be
shown with its bytes. The decoders do not latch on fatal errors (``latch_fatal=False``):
after any error whose frame boundary held (``exc.resumable``: a bad body, even a bad
EVENT or INFO that would close a connection, PROTOCOL.md 9.3) the bad frame has been
consumed whole and decoding resumes at the next frame; after one that lost it (unknown
type, a length above the maximum; PROTOCOL.md 9.2) the direction cannot be framed and is
not decoded further. After a capture gap whose frame boundary is unknown, decoding
resumes at the next plausible frame: one that decodes whole and is followed by a
plausible header.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any
from typing import NamedTuple
from typing import Optional
from typing import Union

from jetwire import Decoder
from jetwire import FrameType
from jetwire import Info
from jetwire import Message
from jetwire import RemoteProtocolError
from jetwire import Request
from jetwire import Response
from jetwire import decode_frame
from jetwire import messages as _messages
from jetwire.codes import HEADER_SIZE
from jetwire.codes import Status
from jetwire.messages import REQUEST_CLASSES

from .events import Data
from .events import DataBatch
from .events import DataTuple
from .events import End
from .events import Event
from .events import FrameBatch
from .events import FrameTuple
from .events import Gap
from .events import Note
from .events import Open
from .events import Origin
from .events import WholeFrame

DEFAULT_MAX_BODY = 64 * 1024 * 1024  # accept what any daemon may be configured to carry
DEFAULT_MAX_PENDING = 100_000  # requests remembered per dump while waiting for their response
LOST_BOUNDARY_BYTES = 256  # bytes kept from a frame whose header lost the boundary
RESYNC_WINDOW = 1 << 20  # bytes searched for a frame header after a gap before older ones are dropped
RESYNC_WAIT = 64 * 1024  # a candidate frame after a gap is waited for only up to this length

_HEADER = struct.Struct(">BI")
_U32 = struct.Struct(">I")
REQUEST_TYPES = frozenset(REQUEST_CLASSES.values())
# Events only the daemon sends (PROTOCOL.md 7.2, 14.2): a peer sending one violates the protocol.
DAEMON_EVENTS = frozenset(
    cls for cls in vars(_messages).values()
    if isinstance(cls, type) and issubclass(cls, Message)
    and str(getattr(getattr(cls, "code", None), "name", "")).startswith(("FETCH_", "QUERY_"))
)
# What a daemon routes to an owner under its own id (PROTOCOL.md 10.3): --trace links them.
ROUTED_TYPES = frozenset({_messages.SetState, _messages.CallMethod})
CHECKED = DAEMON_EVENTS | {Info}  # frames the violation checks look at beyond requests/responses
# What Dissector._frame does with a frame, by its message class (0: nothing more).
ROLE_REQUEST, ROLE_RESPONSE, ROLE_CHECKED = 1, 2, 3
ROLES: dict[type, int] = {
    **dict.fromkeys(REQUEST_TYPES, ROLE_REQUEST), Response: ROLE_RESPONSE, **dict.fromkeys(CHECKED, ROLE_CHECKED),
}
TIMEOUT = Status.TIMEOUT
TLS_HANDSHAKE = 0x16  # the first byte of a TLS ClientHello or ServerHello record
MAX_UNANSWERED_NOTES = 100  # individual notes of requests never answered; then one summary
new_tuple = tuple.__new__

# Frame record kinds.
OK = "frame"
MALFORMED = "malformed"
TRUNCATED = "truncated"


class FrameRecord(NamedTuple):
    """One frame seen in the input, good or bad.

    Attributes:
        number: 1-based frame number over the whole input (stable under filters).
        ts: capture/log time in seconds since the epoch, or None (raw and hex input).
        stream: stream (connection) number.
        direction: 0 from the connection's opener, 1 towards it.
        offset: byte offset of the frame in its direction of the stream (for event
            logs: the record's offset in its file).
        message: the decoded message, or None for a malformed/truncated frame.
        raw: the frame's bytes: always for problems (after a lost frame boundary, the
            first LOST_BOUNDARY_BYTES from the bad header on); for good frames only when
            the renderer needs them.
        kind: OK, MALFORMED or TRUNCATED.
        error: why the frame is malformed or truncated.
        frame_type: the type byte when readable.
        size: the frame's length in bytes as present (header included).
        announced: for TRUNCATED, the length the header announced (header included),
            or None when not even the header is complete.
        request: for a RESPONSE, the request it answers (when in view).
        rtt: seconds from that request to this response, when both have timestamps.
        fatal: True when decoding of this direction stopped after this frame.
        route: for the answer to a routed request (event logs, whose ROUTE records link
            the legs): the owner's leg and the split of the time between daemon and owner.
        packet: the capture's packet number (1-based, as Wireshark counts) of the packet
            that completed the frame; None for logs, raw bytes and the tap.
    """

    number: int
    ts: Optional[float]
    stream: int
    direction: int
    offset: int
    message: Optional[Message]
    raw: Optional[bytes]
    kind: str
    error: Optional[str]
    frame_type: Optional[int]
    size: int
    announced: Optional[int]
    request: Optional[RequestSeen]
    rtt: Optional[float]
    fatal: bool = False
    packet: Optional[int] = None
    route: Optional[RouteTrace] = None


class RequestSeen(NamedTuple):
    """A request remembered until its response comes."""

    number: int
    function: int
    key: Optional[str]
    ts: Optional[float]


class RouteTrace(NamedTuple):
    """A routed request end to end (PROTOCOL.md 7): requester -> daemon -> owner -> back.

    Attributes:
        owner_stream: the owner's stream; owner_id: the id the daemon gave the leg.
        leg_request: frame number of the daemon's request to the owner (None if unseen).
        leg_response: frame number of the owner's answer (None if unseen).
        owner_time: seconds from the daemon's request to the owner's answer.
        daemon_time: the rest of the requester's round trip: the daemon's own time.
        inferred: 0 when the event log's ROUTE record links the legs; in a capture
            (``--trace``), how many requests with the same function and key were waiting
            when the daemon's request was matched to the oldest (1: no doubt).
    """

    owner_stream: int
    owner_id: int
    leg_request: Optional[int]
    leg_response: Optional[int]
    owner_time: Optional[float]
    daemon_time: Optional[float]
    inferred: int = 0


class NoteRecord(NamedTuple):
    """A line about the input that is not a frame (gap, stream stopped, log damage)."""

    ts: Optional[float]
    stream: Optional[int]
    direction: Optional[int]
    kind: str
    text: str
    about: Optional[tuple[int, int]] = None  # (stream, request id) of the request it is about
    packet: Optional[int] = None  # the capture packet that showed it (a gap: the loss)


Record = Union[FrameRecord, NoteRecord]


class _Half:
    """One direction of a stream."""

    __slots__ = ("base", "decoder", "origin", "packet", "resync", "scan", "scan_base", "scan_from", "scan_skipped",
                 "shadow", "skip", "stopped")

    def __init__(self, max_body: int) -> None:
        self.decoder = Decoder(max_body=max_body, latch_fatal=False)
        self.origin = 0  # stream offset of the decoder's first byte
        self.shadow = bytearray()  # bytes fed but not consumed; stream offset ``base``
        self.base = 0
        self.stopped = False
        self.skip = 0  # bytes to drop: the rest of a frame a gap cut through
        self.resync = False  # after a gap: looking for the next plausible frame header
        self.scan = bytearray()  # bytes searched while resync; stream offset ``scan_base``
        self.scan_base = 0
        self.scan_from = 0  # offset in ``scan`` to search from
        self.scan_skipped = 0  # bytes after the gap dropped so far
        self.packet: Optional[int] = None  # the last capture packet with bytes in ``shadow``


def _plausible_header(buf: bytearray, at: int, max_body: int) -> bool:
    return 1 <= buf[at] <= 4 and _U32.unpack_from(buf, at + 1)[0] <= max_body


def _find_frame(buf: bytearray, start: int, max_body: int, *, final: bool = False) -> tuple[Optional[int], int]:
    """Search ``buf`` from ``start`` for the first offset where a whole valid frame starts
    that is followed by a plausible header or by the end of ``buf``.

    Returns (that offset or None, where to search from when more bytes arrive). A
    plausible header whose frame has not fully arrived is waited for (unless ``final``),
    but only while no complete frame is found after it.
    """
    limit = len(buf) - HEADER_SIZE
    waiting: Optional[int] = None
    at = start
    while at <= limit:
        if 1 <= buf[at] <= 4:
            (length,) = _U32.unpack_from(buf, at + 1)
            end = at + HEADER_SIZE + length
            if length <= max_body:
                if end > len(buf):
                    if waiting is None and not final and length <= RESYNC_WAIT:
                        waiting = at
                else:
                    try:
                        decode_frame(bytes(buf[at:end]))
                    except RemoteProtocolError:
                        pass
                    else:
                        if end + HEADER_SIZE > len(buf) or _plausible_header(buf, end, max_body):
                            return at, at
        at += 1
    if waiting is not None:
        return None, waiting
    return None, max(start, limit + 1)


class Dissector:
    """Feed it :mod:`~tools.jetdump.events`; it appends records to :attr:`out`.

    Args:
        keep_raw: keep every good frame's bytes in its record (for ``-V``, ``-x``,
            ``--json``); problems always keep theirs.
        max_body: largest body accepted before a frame is reported TOO_LARGE and its
            direction stopped (PROTOCOL.md 3: checked before buffering).
        max_pending: requests remembered while waiting for responses (oldest dropped).
    """

    def __init__(
        self,
        *,
        keep_raw: bool = False,
        max_body: int = DEFAULT_MAX_BODY,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self.keep_raw = keep_raw
        self.max_body = max_body
        self.max_pending = max_pending
        self.out: list[Record] = []
        self.labels: dict[int, tuple[str, str]] = {}
        self.number = 0
        self.first_ts: Optional[float] = None
        self.packet: Optional[int] = None  # the capture packet being decoded
        self._halves: dict[tuple[int, int], _Half] = {}
        self._pending: dict[tuple[int, int, int], RequestSeen] = {}
        self.complete: set[int] = set()  # streams held from their start
        self.limits: dict[tuple[int, int], int] = {}  # max_body for frames of (stream, direction)
        self.timed_out: dict[tuple[int, int, int], int] = {}  # requests answered TIMEOUT -> that answer
        self.leg_of: dict[tuple[int, int], tuple[int, int]] = {}  # owner (stream, id) -> requester's
        self.routes: dict[tuple[int, int], list[Any]] = {}  # requester (stream, id) -> trace so far
        self.violations = 0
        # (stream, direction) -> the frame count at its last gap: a request sent up to
        # then may have had its answer in the lost bytes, and a response after a gap in
        # the other direction may answer a request that was lost (issue 32).
        self.gapped: dict[tuple[int, int], int] = {}
        # --trace on a capture: link the daemon's request to an owner with the oldest
        # waiting request of the same function and key (PROTOCOL.md 10.3: it forwards
        # in the order it receives them); nothing in a capture links them for certain.
        self.infer_routes = False
        self._waiting: dict[tuple[int, Optional[str]], deque[tuple[int, int]]] = {}
        self._waiting_of: dict[tuple[int, int], tuple[int, Optional[str]]] = {}

    def unanswered(self) -> list[tuple[int, int, int, RequestSeen]]:
        """Requests still waiting for a response: (stream, direction, id, request), in
        the order they were sent (at most ``max_pending``, the newest)."""
        return [(stream, direction, rid, seen) for (stream, direction, rid), seen in self._pending.items()]

    # --- events -------------------------------------------------------------------

    def event(self, event: Event) -> None:
        """Process one input event."""
        if type(event) is DataBatch:  # nearly everything of a capture
            self.data_batch(event.items)
        elif type(event) is Data:
            self.data(event.stream, event.direction, event.ts, event.data, event.packet)
        elif type(event) is FrameBatch:  # nearly everything of an event log
            self.whole_frames(event.frames)
        elif isinstance(event, Data):
            self.data(event.stream, event.direction, event.ts, event.data, event.packet)
        elif isinstance(event, WholeFrame):
            self.whole_frame(event.stream, event.direction, event.ts, event.frame, event.where)
        elif isinstance(event, Open):
            self.labels[event.stream] = event.labels
            if event.complete:
                self.complete.add(event.stream)
        elif isinstance(event, Gap):
            self.gap(event.stream, event.direction, event.ts, event.size, event.packet)
        elif isinstance(event, End):
            self.end(event.stream, event.direction, event.ts)
        elif isinstance(event, Origin):
            self._first(event.ts)
        elif isinstance(event, Note):
            self._first(event.ts)
            self.out.append(NoteRecord(event.ts, event.stream, None, event.kind, event.text, event.about))
            if event.route_to is not None and event.about is not None:
                # PROTOCOL.md 7: the daemon forwards the request to the owner under its own id.
                self.leg_of[event.route_to] = event.about
                self.routes[event.about] = [event.route_to[0], event.route_to[1], None, None, None]
                if len(self.routes) > self.max_pending:
                    del self.routes[next(iter(self.routes))]
                if len(self.leg_of) > self.max_pending:
                    del self.leg_of[next(iter(self.leg_of))]

    def _first(self, ts: Optional[float]) -> None:
        if self.first_ts is None and ts is not None:
            self.first_ts = ts

    def _half(self, stream: int, direction: int) -> _Half:
        half = self._halves.get((stream, direction))
        if half is None:
            half = self._halves[(stream, direction)] = _Half(self.max_body)
        return half

    def data(self, stream: int, direction: int, ts: Optional[float], data: bytes,
             packet: Optional[int] = None) -> None:
        """In-order bytes of one direction (``packet``: the capture packet they end in)."""
        self.packet = packet
        if self.first_ts is None:
            self._first(ts)
        half = self._halves.get((stream, direction)) or self._half(stream, direction)
        if half.stopped:
            return
        if half.resync:
            self._resync(half, stream, direction, ts, data)
            return
        if half.skip:
            cut = min(half.skip, len(data))
            half.skip -= cut
            half.base += cut
            data = data[cut:]
            if not data:
                return
        if not half.shadow:
            # The common case on a capture: the packet starts at a frame boundary and
            # holds whole frames; they are decoded in place, without the stream decoder.
            done = self._whole_frames_of(half, stream, direction, ts, data, packet)
            if done == len(data):
                return
            if done:
                data = data[done:]
        half.shadow += data
        half.packet = packet  # the last packet with bytes of the frame being assembled
        decoder = half.decoder
        decoder.receive_data(data)
        keep_raw = self.keep_raw
        shadow = half.shadow
        base = half.base
        origin = half.origin
        start = origin + decoder.consumed
        while True:
            try:
                for message in decoder.messages():
                    end = origin + decoder.consumed
                    self._frame(stream, direction, ts, start, message,
                                bytes(shadow[start - base : end - base]) if keep_raw else None,
                                shadow[start - base], end - start, packet)
                    start = end
                break
            except RemoteProtocolError as exc:
                if not exc.resumable:
                    self._fatal(half, stream, direction, ts, start, exc)
                    return
                # The bad frame was consumed whole (its header was sound), even when the
                # error is fatal for a connection (PROTOCOL.md 9.3: a bad EVENT or INFO):
                # the decoder does not latch (latch_fatal=False) and a dump goes on at
                # the next frame.
                end = origin + decoder.consumed
                self._malformed(stream, direction, ts, start, bytes(shadow[start - base : end - base]), exc)
                start = end
        consumed = origin + decoder.consumed
        del shadow[: consumed - base]
        half.base = consumed

    def data_batch(self, items: list[DataTuple]) -> None:
        """Many :meth:`data` calls. A packet that starts at a frame boundary goes
        straight to :meth:`_whole_frames_of` (the common case of request/response
        traffic: the per-packet path is what limits a capture with one frame per
        packet, BENCHMARKS.md); the rest of it, and anything else, through :meth:`data`."""
        halves = self._halves
        if items and self.first_ts is None:
            self._first(items[0][2])
        for stream, direction, ts, chunk, packet in items:
            half = halves.get((stream, direction))
            if half is not None and not (half.shadow or half.stopped or half.skip or half.resync):
                done = self._whole_frames_of(half, stream, direction, ts, chunk, packet)
                if done == len(chunk):
                    continue
                chunk = chunk[done:]
            self.data(stream, direction, ts, chunk, packet)

    def _whole_frames_of(self, half: _Half, stream: int, direction: int, ts: Optional[float], data: bytes,
                         packet: Optional[int]) -> int:
        """Decode the whole, valid frames at the start of ``data`` (the direction has no
        bytes buffered); returns how many bytes they took. The first frame that is cut
        short, too large or does not decode is left to the stream decoder, which reports
        it exactly as before. Measured 2x faster than the stream decoder on a capture
        with one frame per packet (BENCHMARKS.md)."""
        size = len(data)
        max_body = self.max_body
        keep_raw = self.keep_raw
        origin = half.origin + half.decoder.consumed  # stream offset of data[0]
        off = 0
        while off + HEADER_SIZE <= size:
            # Byte reads: native when compiled (see capture.py).
            length = data[off + 1] << 24 | data[off + 2] << 16 | data[off + 3] << 8 | data[off + 4]
            end = off + HEADER_SIZE + length
            if end > size or length > max_body:
                break
            frame = data if off == 0 and end == size else data[off:end]
            try:
                message = decode_frame(frame)
            except RemoteProtocolError:
                break
            self._frame(stream, direction, ts, origin + off, message, frame if keep_raw else None,
                        data[off], end - off, packet)
            off = end
        if off:
            # The stream decoder skips what was decoded here: its next byte is data[off].
            half.origin += off
            half.base += off
        return off

    def _frame(self, stream: int, direction: int, ts: Optional[float], offset: int, message: Message,
               raw: Optional[bytes], frame_type: int, size: int, packet: Optional[int]) -> None:
        """Number one well-formed frame, match it and append its record: the one place
        every good frame passes, whatever the input. What a frame's class does is looked
        up in ROLES: a response takes its request (PROTOCOL.md 4.2: it echoes the id), a
        request is remembered until answered, an INFO or a daemon-only event is checked.
        Anything that needs a closer look goes to the checks below (the slow path)."""
        number = self.number = self.number + 1
        cls = type(message)
        role = ROLES.get(cls, 0)
        pending = self._pending
        request = rtt = None
        if role == ROLE_RESPONSE:
            request = pending.pop((stream, 1 - direction, message.id), None)  # type: ignore[attr-defined]
            if request is not None and ts is not None and request.ts is not None:
                rtt = ts - request.ts
        # tuple.__new__ skips the NamedTuple's Python-level __new__ (once per frame).
        self.out.append(new_tuple(FrameRecord, (
            number, ts, stream, direction, offset, message, raw,
            OK, None, frame_type, size, None, request, rtt, False, packet, None,
        )))
        if role == ROLE_RESPONSE:
            if (request is None or message.status == TIMEOUT  # type: ignore[attr-defined]
                    or self.infer_routes or self.leg_of or self.routes):
                self.check_response(ts, stream, direction, number, message, request)  # type: ignore[arg-type]
        elif role == ROLE_REQUEST:
            rid: Optional[int] = message.id  # type: ignore[attr-defined]
            if rid is not None:  # else fire-and-forget: an EVENT (PROTOCOL.md 7.1)
                ident = (stream, direction, rid)
                earlier = pending.get(ident)
                if len(pending) >= self.max_pending:
                    del pending[next(iter(pending))]
                pending[ident] = new_tuple(RequestSeen, (number, cls.function, getattr(message, "key", None), ts))  # type: ignore[attr-defined]
                if earlier is not None:
                    self.check_duplicate(ts, stream, direction, number, rid, earlier)
                elif self.infer_routes and cls in ROUTED_TYPES:
                    self.route_seen(stream, direction, message)  # type: ignore[arg-type]
        elif role == ROLE_CHECKED:
            self.check_other(ts, stream, direction, number, message)
        if self.limits:
            limit = self.limits.get((stream, direction))
            if limit is not None and size - HEADER_SIZE > limit:
                self.check_limit(ts, stream, direction, number, size - HEADER_SIZE)

    # --- protocol checks (the slow path: called only when something needs a look) -----

    def violation(self, ts: Optional[float], stream: int, direction: int, number: int, text: str,
                  about: Optional[tuple[int, int]] = None) -> None:
        """Report that frame ``number`` breaks the protocol (a ``violation`` note after it)."""
        self.violations += 1
        self.out.append(NoteRecord(ts, stream, direction, "violation", f"frame #{number}: {text}", about))

    def explained_by_gap(self, stream: int, direction: int, number: int) -> bool:
        """True when the answer to request frame ``number``, sent in ``direction``, may
        be in bytes the input lacks: the other direction had a gap after it."""
        return self.gapped.get((stream, 1 - direction), -1) >= number

    def check_duplicate(self, ts: Optional[float], stream: int, direction: int, number: int, rid: int,
                        earlier: RequestSeen) -> None:
        """A request id reused while a request with it is pending (PROTOCOL.md 4.1)."""
        if not self.explained_by_gap(stream, direction, earlier.number):
            self.violation(ts, stream, direction, number, f"duplicate request id {rid}: "
                           f"frame #{earlier.number} with this id is still pending", (stream, rid))

    def route_seen(self, stream: int, direction: int, message: Request) -> None:
        """--trace on a capture (see ``infer_routes``): a peer's SET_STATE or CALL_METHOD
        waits to be routed; the daemon's request to an owner takes the oldest waiting one
        of the same function and key, from another stream."""
        key = (message.function, getattr(message, "key", None))
        rid: Optional[int] = message.id
        if rid is None:
            return  # an event: never routed as a request
        if direction == 0:
            self._waiting.setdefault(key, deque()).append((stream, rid))
            self._waiting_of[(stream, rid)] = key
            if len(self._waiting_of) > self.max_pending:
                self._forget_waiting(next(iter(self._waiting_of)))
            return
        if (stream, rid) in self.leg_of:
            return  # an event log's ROUTE record linked it already
        waiting = self._waiting.get(key)
        if not waiting:
            return
        candidates = len(waiting)
        for requester in waiting:
            if requester[0] != stream:
                break
        else:
            return
        self._forget_waiting(requester)
        self.leg_of[(stream, rid)] = requester
        self.routes[requester] = [stream, rid, None, None, None, candidates]
        if len(self.routes) > self.max_pending:
            del self.routes[next(iter(self.routes))]
        if len(self.leg_of) > self.max_pending:
            del self.leg_of[next(iter(self.leg_of))]

    def _forget_waiting(self, requester: tuple[int, int]) -> None:
        key = self._waiting_of.pop(requester, None)
        if key is not None:
            waiting = self._waiting[key]
            waiting.remove(requester)
            if not waiting:
                del self._waiting[key]

    def check_response(self, ts: Optional[float], stream: int, direction: int, number: int,
                       message: Response, request: Optional[RequestSeen]) -> None:
        """A response that matched nothing, answered TIMEOUT, or ends a routed leg."""
        rid = message.id
        if direction == 1 and self._waiting_of:
            self._forget_waiting((stream, rid))  # answered without being routed
        if request is None:
            late = self.timed_out.get((stream, 1 - direction, rid))
            if late is not None:
                self.violation(ts, stream, direction, number,
                               f"late response: request id {rid} was already answered TIMEOUT (frame #{late})")
            elif stream in self.complete and (stream, 1 - direction) not in self.gapped:
                # (After a gap in the other direction the request may have been lost.)
                self.violation(ts, stream, direction, number,
                               f"unsolicited response: no request id {rid} is pending on this stream")
            return
        if message.status == TIMEOUT:
            self.timed_out[(stream, 1 - direction, rid)] = number
            if len(self.timed_out) > self.max_pending:
                del self.timed_out[next(iter(self.timed_out))]
        requester = self.leg_of.get((stream, rid)) if direction == 0 else None
        if requester is not None:  # the owner answered the daemon's leg
            trace = self.routes.get(requester)
            if trace is not None:
                trace[2] = request.number
                trace[3] = number
                trace[4] = ts - request.ts if ts is not None and request.ts is not None else None
            return
        if direction == 1:
            trace = self.routes.pop((stream, rid), None)
            if trace is not None:
                record = self.out[-1]
                if type(record) is FrameRecord and record.number == number:
                    owner_time = trace[4]
                    daemon_time = record.rtt - owner_time if record.rtt is not None and owner_time is not None else None
                    self.out[-1] = record._replace(route=RouteTrace(
                        trace[0], trace[1], trace[2], trace[3], owner_time, daemon_time,
                        trace[5] if len(trace) > 5 else 0))
                if trace[3] is not None:
                    self.leg_of.pop((trace[0], trace[1]), None)

    def check_other(self, ts: Optional[float], stream: int, direction: int, number: int, message: Message) -> None:
        """INFO (its max_body limits the other direction) and daemon-only events."""
        if type(message) is Info:
            self.limits[(stream, 1 - direction)] = message.max_body
        elif direction == 0 and stream in self.complete:
            self.violation(ts, stream, direction, number,
                           f"a peer sent {type(message).__name__} ({message.code.name}): "  # type: ignore[attr-defined]
                           "only the daemon sends fetch events")

    def check_limit(self, ts: Optional[float], stream: int, direction: int, number: int, body: int) -> None:
        limit = self.limits[(stream, direction)]
        self.violation(ts, stream, direction, number,
                       f"body of {body} bytes is above the max_body {limit} its receiver announced in INFO")

    def finish(self) -> None:
        """The input ended: requests never answered are reported (PROTOCOL.md 5: every
        request gets exactly one response), on streams held from their start."""
        unanswered = [(stream, direction, rid, seen) for stream, direction, rid, seen in self.unanswered()
                      if stream in self.complete and not self.explained_by_gap(stream, direction, seen.number)]
        for stream, direction, rid, seen in unanswered[:MAX_UNANSWERED_NOTES]:
            self.out.append(NoteRecord(seen.ts, stream, direction, "unanswered",
                                       f"frame #{seen.number}: request id {rid} was never answered", (stream, rid)))
        if len(unanswered) > MAX_UNANSWERED_NOTES:
            self.out.append(NoteRecord(None, None, None, "unanswered",
                                       f"{len(unanswered) - MAX_UNANSWERED_NOTES} more request(s) never answered"))

    def _malformed(
        self, stream: int, direction: int, ts: Optional[float], offset: int, raw: bytes, exc: RemoteProtocolError
    ) -> None:
        self.number += 1
        request = None
        # PROTOCOL.md 9.1: a malformed REQUEST with a readable id still gets a response.
        if exc.request_id is not None and raw[0] == FrameType.REQUEST:
            function = raw[9] if len(raw) > 9 else 0
            self._pending[(stream, direction, exc.request_id)] = RequestSeen(self.number, function, None, ts)
        elif exc.request_id is not None and raw[0] == FrameType.RESPONSE:
            request = self._pending.pop((stream, 1 - direction, exc.request_id), None)
        self.out.append(
            FrameRecord(
                self.number, ts, stream, direction, offset, None, raw, MALFORMED, exc.message,
                raw[0] if raw else None, len(raw), None, request, None, False, self.packet,
            )
        )

    def _fatal(
        self, half: _Half, stream: int, direction: int, ts: Optional[float], start: int, exc: RemoteProtocolError
    ) -> None:
        half.stopped = True
        raw = bytes(half.shadow[start - half.base : start - half.base + LOST_BOUNDARY_BYTES])
        self.number += 1
        error = exc.message
        if len(raw) >= 3 and raw[0] == TLS_HANDSHAKE and raw[1] == 3 and raw[2] <= 4:
            # A TLS record (type 22, version 3.x) where a jet frame should start: a TLS
            # client on a plaintext port, or TLS traffic captured on a jet port.
            error = f"looks like TLS (a TLS handshake record, {raw[:3].hex(' ')}), not jet: {error}"
        self.out.append(
            FrameRecord(
                self.number, ts, stream, direction, start, None, raw, MALFORMED, error,
                raw[0] if raw else None, len(raw), None, None, None, True, self.packet,
            )
        )
        self.out.append(
            NoteRecord(ts, stream, direction, "stopped",
                       f"decoding of this direction stopped at stream offset {start}: the frame boundary is lost")
        )
        half.shadow.clear()

    def gap(self, stream: int, direction: int, ts: Optional[float], size: int, packet: Optional[int] = None) -> None:
        """``size`` bytes of the direction were never seen; ``packet`` showed it."""
        self._first(ts)
        self.gapped[(stream, direction)] = self.number
        half = self._half(stream, direction)
        if half.stopped:
            return
        at = half.scan_base + len(half.scan) if half.resync else half.base + len(half.shadow)
        partial = bytes(half.shadow)
        text = f"gap: {size} byte(s) missing at stream offset {at}"
        if packet is not None:
            text += f" (shown by packet {packet})"
        if len(partial) >= HEADER_SIZE:
            _ftype, length = _HEADER.unpack_from(partial, 0)
            frame_end = half.base + HEADER_SIZE + length
            if length <= self.max_body and frame_end >= at + size:
                # The gap lies inside one frame whose header we have: its length tells
                # where the next frame starts, so decoding can resume there.
                self.out.append(NoteRecord(ts, stream, direction, "gap", text, None, packet))
                self._truncated(half, stream, direction, ts, partial, HEADER_SIZE + length, "gap in the capture")
                half.decoder = Decoder(max_body=self.max_body, latch_fatal=False)
                half.origin = frame_end
                half.shadow.clear()
                half.skip = frame_end - (at + size)
                half.base = at + size
                return
        self.out.append(NoteRecord(ts, stream, direction, "gap", text, None, packet))
        if partial:
            announced = HEADER_SIZE + _HEADER.unpack_from(partial, 0)[1] if len(partial) >= HEADER_SIZE else None
            self._truncated(half, stream, direction, ts, partial, announced, "gap in the capture")
        # The next frame boundary is unknown: search the bytes after the gap for the next
        # plausible frame header (as the event-log reader does after damage, JETLOG.md 5).
        half.shadow.clear()
        if half.resync:  # a second gap before a frame was found: start the search after it
            half.scan_skipped += len(half.scan)
            half.scan_base += len(half.scan) + size
            half.scan.clear()
        else:
            half.resync = True
            half.scan_base = at + size
            half.scan_skipped = 0
        half.scan_from = 0
        half.skip = 0

    def _resync(self, half: _Half, stream: int, direction: int, ts: Optional[float], data: bytes) -> None:
        """Bytes after a gap whose frame boundary is unknown: decoding resumes at the first
        offset where a whole frame decodes and is followed by another plausible header
        (or by the end of what has arrived)."""
        scan = half.scan
        scan += data
        found, half.scan_from = _find_frame(scan, half.scan_from, self.max_body)
        if found is None:
            if len(scan) > RESYNC_WINDOW:  # bounded: bytes that cannot start a frame are dropped
                drop = min(half.scan_from, len(scan) - HEADER_SIZE)
                del scan[:drop]
                half.scan_base += drop
                half.scan_from -= drop
                half.scan_skipped += drop
            return
        skipped = half.scan_skipped + found
        rest = bytes(scan[found:])
        at = half.scan_base + found
        scan.clear()
        half.resync = False
        half.decoder = Decoder(max_body=self.max_body, latch_fatal=False)
        half.origin = half.base = at
        half.shadow.clear()
        self.out.append(NoteRecord(ts, stream, direction, "resync",
                                   f"decoding resumes at stream offset {at}, the next plausible frame "
                                   f"({skipped} byte(s) after the gap skipped)"))
        self.data(stream, direction, ts, rest, self.packet)

    def _truncated(
        self, half: _Half, stream: int, direction: int, ts: Optional[float], partial: bytes,
        announced: Optional[int], why: str,
    ) -> None:
        self.number += 1
        total = f"{announced}" if announced is not None else "at least 5 (header incomplete)"
        request = rtt = None
        if len(partial) >= 9 and partial[0] == FrameType.RESPONSE:
            # PROTOCOL.md 4.2: the id is readable, so the request it answers is known.
            request = self._pending.pop((stream, 1 - direction, _U32.unpack_from(partial, 5)[0]), None)
            if request is not None and ts is not None and request.ts is not None:
                rtt = ts - request.ts
        self.out.append(
            FrameRecord(
                self.number, ts, stream, direction, half.base, None, partial, TRUNCATED,
                f"{why}: {len(partial)} of {total} bytes present",
                partial[0], len(partial), announced, request, rtt, False, half.packet,
            )
        )

    def end(self, stream: int, direction: int, ts: Optional[float]) -> None:
        """The direction ended: a frame left incomplete is reported truncated."""
        half = self._halves.get((stream, direction))
        if half is None or half.stopped:
            return
        if half.resync and half.scan:
            # The last chance: a frame whose header was waited for never completed.
            found, _ = _find_frame(half.scan, 0, self.max_body, final=True)
            if found is not None:
                half.scan_from = found
                self._resync(half, stream, direction, ts, b"")
                self.end(stream, direction, ts)
                return
        if half.resync:
            lost = half.scan_skipped + len(half.scan)
            if lost:  # (nothing came after the gap: nothing to say beyond the gap)
                self.out.append(NoteRecord(ts, stream, direction, "stopped",
                                           f"no plausible frame in the {lost} byte(s) after the gap "
                                           f"at stream offset {half.scan_base - half.scan_skipped}"))
            half.stopped = True
            return
        if half.shadow:
            partial = bytes(half.shadow)
            announced = HEADER_SIZE + _HEADER.unpack_from(partial, 0)[1] if len(partial) >= HEADER_SIZE else None
            self._truncated(half, stream, direction, ts, partial, announced, "stream ends inside a frame")
            half.shadow.clear()
        half.stopped = True

    def whole_frames(self, frames: list[FrameTuple]) -> None:
        """Many frames recorded whole, in order: a valid frame goes straight to
        :meth:`_frame`; anything else through :meth:`whole_frame`."""
        self.packet = None
        if frames and self.first_ts is None:
            self._first(frames[0][2])
        keep_raw = self.keep_raw
        for stream, direction, ts, frame, where in frames:
            try:
                message = decode_frame(frame)
            except RemoteProtocolError:
                self.whole_frame(stream, direction, ts, frame, where)
                continue
            self._frame(stream, direction, ts, where, message, frame if keep_raw else None, frame[0], len(frame), None)

    def whole_frame(self, stream: int, direction: int, ts: Optional[float], frame: bytes, where: int) -> None:
        """One frame recorded whole (event log): decoded on its own."""
        self.packet = None
        if self.first_ts is None:
            self._first(ts)
        try:
            decode_frame(frame)  # errors are shown here; a good frame goes the common way
        except RemoteProtocolError as exc:
            if len(frame) >= HEADER_SIZE:
                (length,) = struct.unpack_from(">I", frame, 1)
                if length > len(frame) - HEADER_SIZE:
                    # JETLOG.md 4: a frame the daemon could not read whole is logged as read.
                    self.number += 1
                    self.out.append(
                        FrameRecord(
                            self.number, ts, stream, direction, where, None, frame,
                            TRUNCATED, f"recorded frame is incomplete: {len(frame)} of {HEADER_SIZE + length} bytes present",
                            frame[0], len(frame), HEADER_SIZE + length, None, None,
                        )
                    )
                    return
            self._malformed(stream, direction, ts, where, frame, exc)
            return
        self.whole_frames([(stream, direction, ts, frame, where)])
