"""Typed jet messages: one frozen, slotted dataclass per message (PROTOCOL.md 4, 6, 7).

A message never holds more than the wire carries. Requests whose function may also
travel as a fire-and-forget EVENT (SET_STATE, NOTIFY_STATE, CALL_METHOD; PROTOCOL.md
7.1) take ``id=None`` for that form.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from .codes import DEFAULT_MAX_BODY, PROTOCOL_MAJOR, PROTOCOL_MINOR, EventCode, Function, Status
from .values import Value


@dataclass(frozen=True, slots=True)
class Message:
    """Base of every jet message."""


@dataclass(frozen=True, slots=True)
class Info(Message):
    """INFO (PROTOCOL.md 4.4): who is speaking and the largest body it accepts."""

    name: str = ""
    max_body: int = DEFAULT_MAX_BODY
    features: int = 0
    major: int = PROTOCOL_MAJOR
    minor: int = PROTOCOL_MINOR


@dataclass(frozen=True, slots=True)
class Request(Message):
    """Base of the REQUEST messages (PROTOCOL.md 4.1); ``id`` is chosen by the sender."""

    function: ClassVar[Function]
    id: Optional[int]


@dataclass(frozen=True, slots=True)
class AddState(Request):
    """ADD_STATE (PROTOCOL.md 6.1): register a state owned by the sender."""

    function: ClassVar[Function] = Function.ADD_STATE
    key: str
    value: Value


@dataclass(frozen=True, slots=True)
class RemoveState(Request):
    """REMOVE_STATE (PROTOCOL.md 6.2)."""

    function: ClassVar[Function] = Function.REMOVE_STATE
    key: str


@dataclass(frozen=True, slots=True)
class SetState(Request):
    """SET_STATE (PROTOCOL.md 6.3); ``id=None`` is the fire-and-forget EVENT form."""

    function: ClassVar[Function] = Function.SET_STATE
    key: str
    value: Value


@dataclass(frozen=True, slots=True)
class NotifyState(Request):
    """NOTIFY_STATE (PROTOCOL.md 6.4), owner only; ``id=None`` is the EVENT form."""

    function: ClassVar[Function] = Function.NOTIFY_STATE
    key: str
    value: Value


@dataclass(frozen=True, slots=True)
class CallMethod(Request):
    """CALL_METHOD (PROTOCOL.md 6.5); ``id=None`` is the fire-and-forget EVENT form."""

    function: ClassVar[Function] = Function.CALL_METHOD
    key: str
    value: Value


@dataclass(frozen=True, slots=True)
class AddMethod(Request):
    """ADD_METHOD (PROTOCOL.md 6.6)."""

    function: ClassVar[Function] = Function.ADD_METHOD
    key: str


@dataclass(frozen=True, slots=True)
class RemoveMethod(Request):
    """REMOVE_METHOD (PROTOCOL.md 6.7)."""

    function: ClassVar[Function] = Function.REMOVE_METHOD
    key: str


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
class GetState(Request):
    """GET_STATE (PROTOCOL.md 6.10): the daemon answers from its cache."""

    function: ClassVar[Function] = Function.GET_STATE
    key: str


@dataclass(frozen=True, slots=True)
class Authenticate(Request):
    """AUTHENTICATE (PROTOCOL.md 6.12, 14.2): authenticate the connection as ``user``.

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
        Authenticate,
    )
}

FETCH_EVENT_CLASSES: dict[int, type[FetchEvent]] = {
    cls.code: cls for cls in (FetchAdd, FetchChange, FetchRemove)
}
