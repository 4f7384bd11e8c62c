"""jet peers: :class:`PeerAsync` (asyncio), :class:`Peer` (blocking, thread-safe), the
standalone :mod:`peer.tiny`, and the ``jet`` command line (:mod:`peer.cli`).

    >>> import asyncio
    >>> from peer import PeerAsync
    >>> async def main():
    ...     async with await PeerAsync.connect("127.0.0.1", 11124) as p:
    ...         print(await p.get("plant/temp"))

Every error a peer raises for a failed request is a :class:`PeerError` (a
:class:`jetwire.JetError`) with a subclass per status of PROTOCOL.md 8.
"""

from __future__ import annotations

from .aio import (
    DEFAULT_PORT,
    DEFAULT_TIMEOUT,
    EventKind,
    Fetch,
    FetchEvent,
    Method,
    PeerAsync,
    QueryResult,
    State,
    WindowRow,
)
from .errors import (
    AlreadyExists,
    AuthFailed,
    ConnectionClosed,
    Internal,
    InvalidQuery,
    LimitExceeded,
    Malformed,
    NotAuthorized,
    NotFound,
    NotOwner,
    Overloaded,
    OwnerGone,
    PeerError,
    Rejected,
    Timeout,
    TooLarge,
    UnknownFunction,
    WrongKind,
    error_for_status,
)
from .query import field, key, value
from .sync import Peer, SyncFetch, SyncMethod, SyncState

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_TIMEOUT",
    "AlreadyExists",
    "AuthFailed",
    "ConnectionClosed",
    "EventKind",
    "Fetch",
    "FetchEvent",
    "Internal",
    "InvalidQuery",
    "LimitExceeded",
    "Malformed",
    "Method",
    "NotAuthorized",
    "NotFound",
    "NotOwner",
    "Overloaded",
    "OwnerGone",
    "Peer",
    "PeerAsync",
    "PeerError",
    "QueryResult",
    "Rejected",
    "State",
    "SyncFetch",
    "SyncMethod",
    "SyncState",
    "Timeout",
    "TooLarge",
    "UnknownFunction",
    "WindowRow",
    "WrongKind",
    "error_for_status",
    "field",
    "key",
    "value",
]
