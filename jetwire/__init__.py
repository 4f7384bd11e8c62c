"""jetwire: the jet wire format v1 (spec/PROTOCOL.md) and event-log format (spec/JETLOG.md).

Pure and sans-IO: bytes in, typed messages out, and back. No sockets, no asyncio, no
clock.

    >>> from jetwire import Decoder, SetState, Value, encode
    >>> frame = encode(SetState(7, "plant/temp", Value.of(21.5)))
    >>> decoder = Decoder()
    >>> decoder.receive_data(frame)
    >>> decoder.next_message()
    SetState(id=7, key='plant/temp', value=Value(FLOAT64, 21.5))
"""

from __future__ import annotations

from .codec import Decoder, decode_body, decode_frame, encode, frame_size
from .codes import (
    DEFAULT_MAX_BODY,
    FEATURE_AUTH_REQUIRED,
    FEATURE_CONFLATION,
    HEADER_SIZE,
    PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
    EventCode,
    FrameType,
    Function,
    Status,
    ValueType,
)
from .errors import JetError, LocalProtocolError, ProtocolError, RemoteProtocolError
from .messages import (
    AddMethod,
    AddState,
    Authenticate,
    CallMethod,
    Close,
    FetchAdd,
    FetchChange,
    FetchEvent,
    FetchRemove,
    FetchStates,
    GetState,
    Info,
    Message,
    NotifyState,
    RemoveMethod,
    RemoveState,
    Request,
    Response,
    SetState,
    Unfetch,
)
from .values import Value, from_python, to_python

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MAX_BODY",
    "FEATURE_AUTH_REQUIRED",
    "FEATURE_CONFLATION",
    "HEADER_SIZE",
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "AddMethod",
    "AddState",
    "Authenticate",
    "CallMethod",
    "Close",
    "Decoder",
    "EventCode",
    "FetchAdd",
    "FetchChange",
    "FetchEvent",
    "FetchRemove",
    "FetchStates",
    "FrameType",
    "Function",
    "GetState",
    "Info",
    "JetError",
    "LocalProtocolError",
    "Message",
    "NotifyState",
    "ProtocolError",
    "RemoteProtocolError",
    "RemoveMethod",
    "RemoveState",
    "Request",
    "Response",
    "SetState",
    "Status",
    "Unfetch",
    "Value",
    "ValueType",
    "decode_body",
    "decode_frame",
    "encode",
    "frame_size",
    "from_python",
    "to_python",
]
