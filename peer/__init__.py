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

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        NotJetDaemon,
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

# Imported on first use (PEP 562): `import peer.tiny` or the `jet` command line must not
# pay for asyncio and jetwire when they do not need them.
_WHERE = {
    "AlreadyExists": "errors",
    "AuthFailed": "errors",
    "ConnectionClosed": "errors",
    "DEFAULT_PORT": "aio",
    "DEFAULT_TIMEOUT": "aio",
    "EventKind": "aio",
    "Fetch": "aio",
    "FetchEvent": "aio",
    "Internal": "errors",
    "InvalidQuery": "errors",
    "LimitExceeded": "errors",
    "Malformed": "errors",
    "Method": "aio",
    "NotAuthorized": "errors",
    "NotFound": "errors",
    "NotJetDaemon": "errors",
    "NotOwner": "errors",
    "Overloaded": "errors",
    "OwnerGone": "errors",
    "Peer": "sync",
    "PeerAsync": "aio",
    "PeerError": "errors",
    "QueryResult": "aio",
    "Rejected": "errors",
    "State": "aio",
    "SyncFetch": "sync",
    "SyncMethod": "sync",
    "SyncState": "sync",
    "Timeout": "errors",
    "TooLarge": "errors",
    "UnknownFunction": "errors",
    "WindowRow": "aio",
    "WrongKind": "errors",
    "error_for_status": "errors",
    "field": "query",
    "key": "query",
    "value": "query",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'peer' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


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
    "NotJetDaemon",
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
