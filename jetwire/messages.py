"""Typed jet messages: one frozen, slotted dataclass per message (PROTOCOL.md 4, 6, 7).

A message never holds more than the wire carries. Requests whose function may also
travel as a fire-and-forget EVENT (SET_STATE, NOTIFY_STATE, CALL_METHOD; PROTOCOL.md
7.1) take ``id=None`` for that form.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import ClassVar
from typing import Optional

from .codes import DEFAULT_MAX_BODY
from .codes import MATCH_IGNORE_CASE
from .codes import MATCH_NOT
from .codes import PROTOCOL_MAJOR
from .codes import PROTOCOL_MINOR
from .codes import QUERY_METHODS
from .codes import QUERY_NODES
from .codes import SORT_DESCENDING
from .codes import Action
from .codes import EntryKind
from .codes import EventCode
from .codes import FilterOp
from .codes import Function
from .codes import PathOp
from .codes import SortBy
from .codes import Status
from .values import Value

__all__ = [
    "FETCH_EVENT_CLASSES",
    "REQUEST_CLASSES",
    "AddMethod",
    "AddState",
    "Authenticate",
    "CallMethod",
    "Close",
    "FetchAdd",
    "FetchChange",
    "FetchEvent",
    "FetchKeyEvent",
    "FetchMethod",
    "FetchNode",
    "FetchQuery",
    "FetchRemove",
    "FetchStates",
    "FetchUnmatch",
    "FetchWindow",
    "GetState",
    "Info",
    "KeyRequest",
    "KeyValueRequest",
    "Message",
    "NotifyState",
    "PathMatcher",
    "Query",
    "QueryEntry",
    "QueryOnce",
    "RemoveMethod",
    "RemoveState",
    "Request",
    "Response",
    "SetState",
    "Unfetch",
    "ValueFilter",
    "WindowEntry",
]



@dataclass(frozen=True, slots=True)
class Message:
    """Base of every jet message."""


@dataclass(frozen=True, slots=True)
class Info(Message):
    """INFO (PROTOCOL.md 4.4): who is speaking and the largest body it accepts.

    ``max_key_length`` and ``route_timeout_ms`` are the limits extension (4.4.1), which a
    daemon sends only to a peer that set FEATURE_LIMITS in its own INFO: both are None
    without it, both set with it.
    """

    name: str = ""
    max_body: int = DEFAULT_MAX_BODY
    features: int = 0
    major: int = PROTOCOL_MAJOR
    minor: int = PROTOCOL_MINOR
    max_key_length: Optional[int] = None
    route_timeout_ms: Optional[int] = None


@dataclass(frozen=True, slots=True)
class Request(Message):
    """Base of the REQUEST messages (PROTOCOL.md 4.1); ``id`` is chosen by the sender."""

    function: ClassVar[Function]
    id: Optional[int]


@dataclass(frozen=True, slots=True)
class KeyValueRequest(Request):
    """Base of the requests whose body is a key and a value (PROTOCOL.md 6.1, 6.3-6.5)."""

    key: str
    value: Value


@dataclass(frozen=True, slots=True)
class KeyRequest(Request):
    """Base of the requests whose body is a key alone (PROTOCOL.md 6.2, 6.6, 6.7, 6.10)."""

    key: str


@dataclass(frozen=True, slots=True)
class AddState(KeyValueRequest):
    """ADD_STATE (PROTOCOL.md 6.1): register a state owned by the sender."""

    function: ClassVar[Function] = Function.ADD_STATE


@dataclass(frozen=True, slots=True)
class RemoveState(KeyRequest):
    """REMOVE_STATE (PROTOCOL.md 6.2)."""

    function: ClassVar[Function] = Function.REMOVE_STATE


@dataclass(frozen=True, slots=True)
class SetState(KeyValueRequest):
    """SET_STATE (PROTOCOL.md 6.3); ``id=None`` is the fire-and-forget EVENT form."""

    function: ClassVar[Function] = Function.SET_STATE


@dataclass(frozen=True, slots=True)
class NotifyState(KeyValueRequest):
    """NOTIFY_STATE (PROTOCOL.md 6.4), owner only; ``id=None`` is the EVENT form."""

    function: ClassVar[Function] = Function.NOTIFY_STATE


@dataclass(frozen=True, slots=True)
class CallMethod(KeyValueRequest):
    """CALL_METHOD (PROTOCOL.md 6.5); ``id=None`` is the fire-and-forget EVENT form."""

    function: ClassVar[Function] = Function.CALL_METHOD


@dataclass(frozen=True, slots=True)
class AddMethod(KeyRequest):
    """ADD_METHOD (PROTOCOL.md 6.6)."""

    function: ClassVar[Function] = Function.ADD_METHOD


@dataclass(frozen=True, slots=True)
class RemoveMethod(KeyRequest):
    """REMOVE_METHOD (PROTOCOL.md 6.7)."""

    function: ClassVar[Function] = Function.REMOVE_METHOD


@dataclass(frozen=True, slots=True)
class FetchStates(Request):
    """FETCH_STATES (PROTOCOL.md 6.8); an empty ``prefix`` matches every state."""

    function: ClassVar[Function] = Function.FETCH_STATES
    prefix: str


@dataclass(frozen=True, slots=True)
class Unfetch(Request):
    """UNFETCH (PROTOCOL.md 6.9)."""

    function: ClassVar[Function] = Function.UNFETCH
    fetch_id: int


@dataclass(frozen=True, slots=True)
class GetState(KeyRequest):
    """GET_STATE (PROTOCOL.md 6.10): the daemon answers from its cache."""

    function: ClassVar[Function] = Function.GET_STATE


@dataclass(frozen=True, slots=True)
class PathMatcher:
    """One path matcher of a query (PROTOCOL.md 14.1): ``op`` with its ``operands``;
    ``flags`` holds MATCH_NOT and MATCH_IGNORE_CASE."""

    op: PathOp
    operands: tuple[str, ...]
    flags: int = 0

    @property
    def negated(self) -> bool:
        return bool(self.flags & MATCH_NOT)

    @property
    def ignore_case(self) -> bool:
        return bool(self.flags & MATCH_IGNORE_CASE)


@dataclass(frozen=True, slots=True)
class ValueFilter:
    """One value filter of a query (PROTOCOL.md 14.1): ``op`` on the value at ``field``
    (empty: the value itself) against ``operand``."""

    op: FilterOp
    operand: Value
    field: str = ""
    flags: int = 0


@dataclass(frozen=True, slots=True)
class Query:
    """A query (PROTOCOL.md 14.1), field for field as on the wire.

    ``window_from``/``window_to`` are the 1-based window of a sorted query (0, 0 when
    ``sort_by`` is NONE); ``flags`` holds QUERY_METHODS and QUERY_NODES.
    """

    matchers: tuple[PathMatcher, ...] = ()
    filters: tuple[ValueFilter, ...] = ()
    sort_by: SortBy = SortBy.NONE
    sort_field: str = ""
    sort_flags: int = 0
    window_from: int = 0
    window_to: int = 0
    flags: int = 0

    @property
    def descending(self) -> bool:
        return bool(self.sort_flags & SORT_DESCENDING)

    @property
    def methods(self) -> bool:
        return bool(self.flags & QUERY_METHODS)

    @property
    def nodes(self) -> bool:
        return bool(self.flags & QUERY_NODES)


@dataclass(frozen=True, slots=True)
class FetchQuery(Request):
    """FETCH_QUERY (PROTOCOL.md 14.3, protocol 1.1): a fetch of ``query``."""

    function: ClassVar[Function] = Function.FETCH_QUERY
    query: Query


@dataclass(frozen=True, slots=True)
class QueryOnce(Request):
    """QUERY_ONCE (PROTOCOL.md 14.4, protocol 1.1): ``query`` answered once."""

    function: ClassVar[Function] = Function.QUERY_ONCE
    query: Query


@dataclass(frozen=True, slots=True)
class Authenticate(Request):
    """AUTHENTICATE (PROTOCOL.md 6.12, 15.2): authenticate the connection as ``user``.

    The ``repr`` masks the password, so that logs of messages never show it.
    """

    function: ClassVar[Function] = Function.AUTHENTICATE
    user: str
    password: str = field(repr=False)

    def __repr__(self) -> str:
        return f"Authenticate(id={self.id!r}, user={self.user!r}, password='********')"


@dataclass(frozen=True, slots=True)
class Response(Message):
    """RESPONSE (PROTOCOL.md 4.2).

    With status OK at most one of ``value`` (SET_STATE, CALL_METHOD, GET_STATE) and
    ``fetch_id`` (FETCH_STATES) is set; otherwise ``message`` says what went wrong.
    """

    id: int
    status: Status = Status.OK
    value: Optional[Value] = None
    fetch_id: Optional[int] = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == Status.OK


@dataclass(frozen=True, slots=True)
class FetchEvent(Message):
    """Base of FETCH_ADD / FETCH_CHANGE / FETCH_REMOVE (PROTOCOL.md 7.2)."""

    code: ClassVar[EventCode]
    fetch_id: int
    key: str
    value: Value


@dataclass(frozen=True, slots=True)
class FetchAdd(FetchEvent):
    """A state matching the fetch exists (initially, or was added)."""

    code: ClassVar[EventCode] = EventCode.FETCH_ADD


@dataclass(frozen=True, slots=True)
class FetchChange(FetchEvent):
    """A state matching the fetch has a new value."""

    code: ClassVar[EventCode] = EventCode.FETCH_CHANGE


@dataclass(frozen=True, slots=True)
class FetchRemove(FetchEvent):
    """A state matching the fetch is gone; ``value`` is its last cached value."""

    code: ClassVar[EventCode] = EventCode.FETCH_REMOVE


@dataclass(frozen=True, slots=True)
class FetchUnmatch(FetchEvent):
    """The state still exists but no longer matches the fetch's query; ``value`` is its
    new value (PROTOCOL.md 14.2)."""

    code: ClassVar[EventCode] = EventCode.FETCH_UNMATCH


@dataclass(frozen=True, slots=True)
class FetchKeyEvent(Message):
    """Base of FETCH_METHOD / FETCH_NODE (PROTOCOL.md 14.2): ``action`` on ``key``."""

    code: ClassVar[EventCode]
    fetch_id: int
    action: Action
    key: str


@dataclass(frozen=True, slots=True)
class FetchMethod(FetchKeyEvent):
    """A method matching the fetch was added or removed."""

    code: ClassVar[EventCode] = EventCode.FETCH_METHOD


@dataclass(frozen=True, slots=True)
class FetchNode(FetchKeyEvent):
    """A node (hierarchy level) matching the fetch appeared or disappeared."""

    code: ClassVar[EventCode] = EventCode.FETCH_NODE


@dataclass(frozen=True, slots=True)
class WindowEntry:
    """The state at 1-based position ``index`` of a sorted fetch (PROTOCOL.md 14.2)."""

    index: int
    key: str
    value: Value


@dataclass(frozen=True, slots=True)
class FetchWindow(Message):
    """FETCH_WINDOW (PROTOCOL.md 14.2): the positions of a sorted window that changed,
    and how many entries the window holds now."""

    code: ClassVar[EventCode] = EventCode.FETCH_WINDOW
    fetch_id: int
    size: int
    entries: tuple[WindowEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class QueryEntry(Message):
    """QUERY_ENTRY (PROTOCOL.md 14.4): one entry of the answer to QUERY_ONCE ``id``."""

    code: ClassVar[EventCode] = EventCode.QUERY_ENTRY
    id: int
    kind: EntryKind
    key: str
    value: Value


@dataclass(frozen=True, slots=True)
class Close(Message):
    """CLOSE (PROTOCOL.md 7.3): the sender closes the connection right after."""

    status: Status = Status.OK
    message: str = ""


REQUEST_CLASSES: dict[int, type[Request]] = {
    cls.function: cls
    for cls in (
        AddState,
        RemoveState,
        SetState,
        NotifyState,
        CallMethod,
        AddMethod,
        RemoveMethod,
        FetchStates,
        Unfetch,
        GetState,
        FetchQuery,
        QueryOnce,
        Authenticate,
    )
}

FETCH_EVENT_CLASSES: dict[int, type[FetchEvent]] = {
    cls.code: cls for cls in (FetchAdd, FetchChange, FetchRemove, FetchUnmatch)
}
