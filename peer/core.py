"""The sans-IO core of the jet peers: what a peer knows, with no socket, loop or thread.

:class:`peer.PeerAsync` (and through it the blocking :class:`peer.Peer`, which wraps it
on a loop thread) keeps here everything that is bookkeeping rather than I/O:

- the values and events handed to the application (:class:`FetchEvent`,
  :class:`WindowRow`, :class:`QueryResult`) and the mapping of values both ways;
- :class:`RequestTable`: request ids, requests in flight, their deadlines (the clock is
  passed in as ``now``; the table says when the one timer of the shell must fire),
  and the decoding of a RESPONSE into a result or a typed error;
- :func:`fetch_event` and :func:`query_result`: which fetch or query a message belongs
  to and what it means;
- :class:`SortedWindow`: the window of a sorted fetch, kept from FETCH_WINDOW;
- :class:`KnownEntries`: what a fetch has told the application, so that a fetch restored
  after a reconnect reports only the difference;
- :func:`error_answer`: the RESPONSE an owner sends when its handler refuses or fails;
- what a peer accepts from the daemon and what it answers to the rest
  (:func:`unsupported_version`, :func:`limits_follow`, :func:`refuse_unexpected`,
  :func:`answer_bad_request`), and :func:`encode_checked` for what it sends.

Waiters (what the shell resolves when a request ends: an ``asyncio.Future`` in
:mod:`peer.aio`) are opaque here. ``peer/tiny.py`` keeps its own copy of the little of
this it needs: it must stay one self-contained stdlib module.
"""

from __future__ import annotations

import heapq
import logging
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from typing import Generic
from typing import Optional
from typing import TypeVar

from jetwire import FEATURE_LIMITS
from jetwire import HEADER_SIZE
from jetwire import PROTOCOL_MAJOR
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchMethod
from jetwire import FetchNode
from jetwire import FetchRemove
from jetwire import FetchUnmatch
from jetwire import FetchWindow
from jetwire import FrameType
from jetwire import Info
from jetwire import LocalProtocolError
from jetwire import Message
from jetwire import QueryEntry
from jetwire import RemoteProtocolError
from jetwire import Response
from jetwire import Status
from jetwire import Value
from jetwire import ValueType
from jetwire import encode
from jetwire.codes import Action
from jetwire.codes import EntryKind
from jetwire.values import PythonValue

from .errors import Internal
from .errors import Malformed
from .errors import PeerError
from .errors import Timeout
from .errors import TooLarge
from .errors import error_for_status

__all__ = [
    "MAX_ERROR_MESSAGE",
    "NONE",
    "Converter",
    "EventKind",
    "FetchEvent",
    "KnownEntries",
    "QueryResult",
    "RequestTable",
    "SortedWindow",
    "WindowRow",
    "answer_bad_request",
    "as_value",
    "convert_empty",
    "convert_fetch_id",
    "convert_raw",
    "convert_value",
    "encode_checked",
    "error_answer",
    "fetch_event",
    "handler_name",
    "limits_follow",
    "query_result",
    "refuse_unexpected",
    "to_python",
    "unmappable_result",
    "unsupported_version",
]

log = logging.getLogger("peer")

MAX_ERROR_MESSAGE = 1000  # characters of a handler's error message sent on the wire


# --- values and events -----------------------------------------------------------------


class EventKind(StrEnum):
    """What a fetch event says happened to a state (PROTOCOL.md 7.2, 10.5)."""

    ADD = "add"
    CHANGE = "change"
    REMOVE = "remove"
    UNMATCH = "unmatch"  # PROTOCOL.md 14.2: still there, no longer matching the query
    WINDOW = "window"  # a sorted fetch's window changed: see FetchEvent.rows
    METHOD_ADD = "method_add"
    METHOD_REMOVE = "method_remove"
    NODE_ADD = "node_add"
    NODE_REMOVE = "node_remove"


def to_python(raw: Value) -> PythonValue:
    """``raw`` mapped to Python; a JSON value that does not parse raises :class:`Malformed`."""
    try:
        return raw.to_python()
    except RemoteProtocolError as exc:
        raise Malformed(exc.message) from None


class _HasRaw:
    """What the events below share: ``raw`` as received, ``value`` its Python form."""

    __slots__ = ()
    raw: Value

    @property
    def value(self) -> PythonValue:
        """The Python form of ``raw`` (:class:`Malformed` for JSON that does not parse)."""
        return to_python(self.raw)


@dataclass(frozen=True, slots=True)
class WindowRow(_HasRaw):
    """One row of a sorted fetch's window: its 1-based ``index`` in the whole order."""

    index: int
    key: str
    raw: Value


@dataclass(frozen=True, slots=True)
class QueryResult(_HasRaw):
    """One entry of a one-shot query (PROTOCOL.md 14.4): ``kind`` is ``state``,
    ``method`` or ``node``; ``raw`` is NONE for methods and nodes."""

    kind: str
    key: str
    raw: Value


@dataclass(frozen=True, slots=True)
class FetchEvent(_HasRaw):
    """One fetch event: ``kind``, ``key``, and the value as received (``raw``).

    ``value`` maps ``raw`` to Python when read (see :func:`jetwire.to_python`); for a
    JSON value that does not parse, reading ``value`` raises :class:`Malformed`.
    """

    kind: EventKind
    key: str
    raw: Value
    rows: tuple[WindowRow, ...] = ()  # WINDOW: the whole window after the update, in order


_INT64 = struct.Struct(">q").pack
_FLOAT64 = struct.Struct(">d").pack
_new_value = object.__new__
_set_vtype = Value.__dict__["vtype"].__set__  # the slot descriptors
_set_data = Value.__dict__["data"].__set__


def as_value(obj: Any) -> Value:
    """Value.of, with a fast path for the scalars a hot loop sends.

    ``Value.of`` re-validates data it just produced (about 3 us for an int here); for
    int and float the bytes are valid by construction, so the slots are filled
    directly, as jetwire's own decoder does. Everything else goes through Value.of.

    Raises:
        LocalProtocolError: ``obj`` has no jet mapping.
    """
    kind = type(obj)
    if kind is Value:
        return obj  # type: ignore[no-any-return]
    if kind is float:
        vtype, data = ValueType.FLOAT64, _FLOAT64(obj)
    elif kind is int and -(2**63) <= obj < 2**63:
        vtype, data = ValueType.INT64, _INT64(obj)
    else:
        return Value.of(obj)
    value = _new_value(Value)
    _set_vtype(value, vtype)
    _set_data(value, data)
    return value


NONE = Value(ValueType.NONE)


# --- responses into results ------------------------------------------------------------

Converter = Callable[[Response], Any]


def convert_empty(response: Response) -> None:
    """The result of an OK that must carry nothing (ADD_STATE, NOTIFY_STATE, ...)."""
    if response.value is not None or response.fetch_id is not None:
        # PROTOCOL.md 11.1: a RESPONSE of the wrong shape fails the request.
        raise Malformed("an OK with a payload where the function calls for an empty one")
    return None


def convert_value(response: Response) -> PythonValue:
    """The result of an OK carrying a value, mapped to Python (SET, CALL, GET)."""
    if response.fetch_id is not None:
        raise Malformed("an OK with a fetch_id where the function calls for a value")  # PROTOCOL.md 11.1
    if response.value is None:
        # PROTOCOL.md 6.3: an empty OK to a set means NONE.
        return None
    return to_python(response.value)


def convert_raw(response: Response) -> Value:
    """Like :func:`convert_value`, the :class:`jetwire.Value` unmapped."""
    if response.fetch_id is not None:
        raise Malformed("an OK with a fetch_id where the function calls for a value")  # PROTOCOL.md 11.1
    if response.value is None:
        return Value.of(None)
    return response.value


def convert_fetch_id(response: Response) -> int:
    """The fetch id of an OK to FETCH_STATES or FETCH_QUERY."""
    if response.fetch_id is None or response.value is not None:
        raise Malformed("FETCH_STATES answered OK without a fetch_id")
    return response.fetch_id


W = TypeVar("W")

_Entry = tuple[W, Converter, Optional[float]]  # waiter, converter, own timeout or None


class RequestTable(Generic[W]):
    """Requests in flight: ids, waiters, deadlines, answers. No clock of its own.

    The shell keeps one timer, armed at :attr:`timer_at` (which :meth:`open` may move
    earlier and :meth:`expire` returns); when it fires, the shell calls :meth:`expire`
    with the current time and fails the waiters it returns.

    Requests with the default timeout have deadlines in request order, so a deque
    serves them (a timer per request costs more than the rest of a request's
    bookkeeping); requests with their own timeout go to a heap.
    """

    def __init__(self, default_timeout: float) -> None:
        if default_timeout <= 0:
            raise ValueError("timeout must be positive")
        self.default_timeout = default_timeout
        self.pending: dict[int, _Entry[W]] = {}
        self._last_id = 0
        self._in_order: deque[tuple[float, int, W]] = deque()
        self._by_time: list[tuple[float, int, int, W]] = []
        self._sequence = 0
        self.timer_at: Optional[float] = None  # when the shell's timer fires, if armed

    def __len__(self) -> int:
        return len(self.pending)

    def __contains__(self, rid: int) -> bool:
        return rid in self.pending

    @property
    def last_id(self) -> int:
        """The id :meth:`open` gave last."""
        return self._last_id

    def open(self, waiter: W, convert: Converter, now: float, timeout: Optional[float] = None) -> int:
        """Record a request sent at ``now`` under a new id, and return the id (PROTOCOL.md
        5: ids are u32 and wrap; one still in flight is skipped). None for ``timeout``
        is the default.

        When the shell's one timer must fire earlier, :attr:`timer_at` changed: the
        shell compares it with the time it armed.
        """
        pending = self.pending
        rid = self._last_id
        while True:
            rid = (rid + 1) & 0xFFFF_FFFF
            if rid not in pending:
                break
        self._last_id = rid
        pending[rid] = (waiter, convert, timeout)
        if timeout is None:
            deadline = now + self.default_timeout
            in_order = self._in_order
            in_order.append((deadline, rid, waiter))
            while pending.get(in_order[0][1], _MISSING)[0] is not in_order[0][2]:
                in_order.popleft()  # answered already
        else:
            deadline = now + timeout
            by_time = self._by_time
            self._sequence += 1
            heapq.heappush(by_time, (deadline, self._sequence, rid, waiter))
            if len(by_time) > 64 + 2 * len(pending):
                # Answered requests leave their deadline behind: drop them now and then.
                self._by_time = by_time = [item for item in by_time if _live(pending, item[2], item[3])]
                heapq.heapify(by_time)
        at = self.timer_at
        if at is None or deadline < at:
            self.timer_at = deadline
        return rid

    def pop(self, rid: int) -> Optional[_Entry[W]]:
        """Forget request ``rid``; its entry (waiter, converter, timeout), or None."""
        return self.pending.pop(rid, None)

    def answer(self, response: Response) -> Optional[tuple[W, bool, Any]]:
        """Take the request ``response`` answers and decode its outcome.

        Returns:
            None for an unknown id (late after a timeout); else the waiter and either
            (True, result) or (False, the typed :class:`PeerError` to raise).
        """
        entry = self.pending.pop(response.id, None)
        if entry is None:
            return None
        if response.status is Status.OK:
            try:
                return entry[0], True, entry[1](response)
            except PeerError as exc:
                return entry[0], False, exc
        return entry[0], False, error_for_status(response.status, response.message)

    def expire(self, now: float) -> tuple[list[tuple[W, Timeout]], Optional[float]]:
        """Take the requests whose deadline is not after ``now``.

        Returns:
            Their waiters with the Timeout to fail each with, and the time the shell's
            timer must fire at next (None: no request waits).
        """
        pending = self.pending
        expired: list[tuple[W, Timeout]] = []
        in_order = self._in_order
        while in_order:
            deadline, rid, waiter = in_order[0]
            if not _live(pending, rid, waiter):
                in_order.popleft()
            elif deadline <= now:
                in_order.popleft()
                del pending[rid]
                expired.append((waiter, Timeout(f"no response within {self.default_timeout:g} s (peer timeout)")))
            else:
                break
        by_time = self._by_time
        while by_time:
            deadline, _, rid, waiter = by_time[0]
            if not _live(pending, rid, waiter):
                heapq.heappop(by_time)
            elif deadline <= now:
                heapq.heappop(by_time)
                delay = pending.pop(rid)[2]
                expired.append((waiter, Timeout(f"no response within {delay:g} s (peer timeout)")))
            else:
                break
        firsts = [queue[0][0] for queue in (in_order, by_time) if queue]
        self.timer_at = min(firsts) if firsts else None
        return expired, self.timer_at

    def take_all(self) -> list[W]:
        """Forget every request (the link is gone); their waiters, to fail."""
        waiters = [entry[0] for entry in self.pending.values()]
        self.pending = {}
        self._in_order.clear()
        self._by_time = []
        self.timer_at = None
        return waiters


_MISSING: tuple[None, None, None] = (None, None, None)


def _live(pending: dict[int, _Entry[Any]], rid: int, waiter: Any) -> bool:
    return pending.get(rid, _MISSING)[0] is waiter


# --- messages into events --------------------------------------------------------------

_KINDS: dict[type, EventKind] = {
    FetchAdd: EventKind.ADD,
    FetchChange: EventKind.CHANGE,
    FetchRemove: EventKind.REMOVE,
    FetchUnmatch: EventKind.UNMATCH,
}
_KEY_EVENT_KINDS = {
    (FetchMethod, Action.ADD): EventKind.METHOD_ADD,
    (FetchMethod, Action.REMOVE): EventKind.METHOD_REMOVE,
    (FetchNode, Action.ADD): EventKind.NODE_ADD,
    (FetchNode, Action.REMOVE): EventKind.NODE_REMOVE,
}


def fetch_event(message: Message) -> Optional[tuple[int, EventKind, str, Value]]:
    """For a fetch event other than FETCH_WINDOW: (fetch id, kind, key, value); else None."""
    kind = _KINDS.get(type(message))
    if kind is not None:
        return message.fetch_id, kind, message.key, message.value  # type: ignore[attr-defined]
    if isinstance(message, (FetchMethod, FetchNode)):
        return message.fetch_id, _KEY_EVENT_KINDS[type(message), message.action], message.key, NONE
    return None


def query_result(message: QueryEntry) -> QueryResult:
    """One QUERY_ENTRY as the application sees it (PROTOCOL.md 14.4)."""
    return QueryResult(EntryKind(message.kind).name.lower(), message.key, message.value)


class SortedWindow:
    """The window of a sorted fetch (PROTOCOL.md 14.2), starting at index ``start``."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.rows: list[WindowRow] = []

    def apply(self, message: FetchWindow) -> tuple[WindowRow, ...]:
        """Set the listed positions, cut to ``size``; return the whole window."""
        start = self.start
        rows = self.rows
        if len(rows) < message.size:
            rows.extend(WindowRow(start + i, "", NONE) for i in range(len(rows), message.size))
        for entry in message.entries:
            position = entry.index - start
            if 0 <= position < message.size:
                rows[position] = WindowRow(entry.index, entry.key, entry.value)
        del rows[message.size :]
        return tuple(rows)

    def clear(self) -> None:
        """Forget the rows: a restored fetch receives its whole window again."""
        self.rows.clear()


_GONE = frozenset((EventKind.REMOVE, EventKind.UNMATCH, EventKind.METHOD_REMOVE, EventKind.NODE_REMOVE))


class KnownEntries:
    """What a fetch has told the application, kept for a restore after a reconnect.

    PROTOCOL.md gives no end marker for a fetch's initial adds; the shell sends a
    barrier request after re-fetching and calls :meth:`end_restore` on its answer.
    """

    def __init__(self) -> None:
        self.values: dict[str, Value] = {}
        self._seen: Optional[set[str]] = None  # keys re-announced during a restore

    def begin_restore(self) -> None:
        """The fetch is being sent again: its adds re-announce what is known."""
        self._seen = set()

    def note(self, kind: EventKind, key: str, raw: Value) -> Optional[EventKind]:
        """Record an event; the kind to deliver it as, or None to deliver nothing."""
        if kind is EventKind.WINDOW:
            return kind
        values = self.values
        if self._seen is not None and kind is EventKind.ADD:
            self._seen.add(key)
            old = values.get(key)
            if old == raw:
                return None
            if old is not None:
                kind = EventKind.CHANGE
        if kind in _GONE:
            values.pop(key, None)
        else:
            values[key] = raw
        return kind

    def end_restore(self) -> list[tuple[str, Value]]:
        """The restore is complete: the entries that were not announced again are gone.

        Returns:
            (key, last value) of each, to deliver as REMOVE (:meth:`note` forgets them).
        """
        seen, self._seen = self._seen, None
        if seen is None:
            return []
        return [(key, raw) for key, raw in self.values.items() if key not in seen]


# --- the daemon's frames: what a peer accepts ------------------------------------------


def encode_checked(message: Message, info: Optional[Info]) -> bytes:
    """``message`` encoded, if its body fits the daemon's announced ``max_body``.

    Raises:
        TooLarge: PROTOCOL.md 3: never send a body above the receiver's max_body.
        LocalProtocolError: the message cannot be encoded (jetwire's checks).
    """
    frame = encode(message)
    if info is not None and len(frame) - HEADER_SIZE > info.max_body:
        raise TooLarge(f"body of {len(frame) - HEADER_SIZE} bytes exceeds the daemon's max_body {info.max_body}")
    return frame


def unsupported_version(info: Info) -> Optional[str]:
    """Why the link must close for this INFO (PROTOCOL.md 2: another major version is
    fatal), or None."""
    if info.major != PROTOCOL_MAJOR:
        return f"unsupported protocol version {info.major}.{info.minor}"
    return None


def limits_follow(info: Info) -> bool:
    """True for a 1.2 daemon's first INFO, sent before it read ours: its answer to our
    FEATURE_LIMITS, with the limits, follows (PROTOCOL.md 4.4.1)."""
    return bool(info.features & FEATURE_LIMITS) and info.max_key_length is None


def refuse_unexpected(message: Message) -> Optional[Response]:
    """The answer to a request a peer does not serve (PROTOCOL.md 6: a daemon routes
    only SET_STATE and CALL_METHOD to owners); None when it is no request."""
    rid = getattr(message, "id", None)
    if rid is None:
        return None
    return Response(rid, Status.UNKNOWN_FUNCTION, message="a peer serves only set and call")


def answer_bad_request(exc: RemoteProtocolError) -> Optional[Response]:
    """The answer to a REQUEST the decoder refused but could read the id of
    (PROTOCOL.md 9.1: answer it and keep going); None when the link must close instead
    (9.2, 9.3) or the bad frame is no request."""
    if exc.fatal or exc.request_id is None or exc.frame_type != FrameType.REQUEST:
        return None
    return Response(exc.request_id, exc.status, message=exc.message[:MAX_ERROR_MESSAGE])


# --- owner answers ---------------------------------------------------------------------


def handler_name(handler: Any) -> str:
    """How a handler is named in an error message."""
    if handler is None:
        return "handler"
    return str(getattr(handler, "__qualname__", None) or getattr(handler, "__name__", None) or "handler")


def error_answer(rid: Optional[int], exc: BaseException, handler: Any = None) -> Optional[Response]:
    """The RESPONSE an owner sends when a set or call handler raised ``exc``.

    A :class:`PeerError` with a status answers that status; anything else is INTERNAL
    (our documented choice: a handler that crashes is a bug at the owner, distinct from
    REJECTED, the owner refusing on purpose) and is logged. None for an EVENT
    (``rid`` None, PROTOCOL.md 7.1): nothing is answered.
    """
    if isinstance(exc, PeerError) and exc.status is not None and exc.status is not Status.OK:
        status, text = exc.status, exc.message
    else:
        status = Status.INTERNAL
        text = f"{handler_name(handler)} failed: {type(exc).__name__}: {exc}"
        log.error("%s", text, exc_info=exc)
    if rid is None:
        log.info("fire-and-forget request failed: %s %s", status.name, text)
        return None
    return Response(rid, status, message=text[:MAX_ERROR_MESSAGE])


def unmappable_result(handler: Any, exc: LocalProtocolError) -> PeerError:
    """The error answered when a handler returns a value with no jet mapping."""
    return Internal(f"{handler_name(handler)} returned an unmappable value: {exc.message}")
