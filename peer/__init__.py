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

from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from .aio import DEFAULT_PORT
    from .aio import DEFAULT_TIMEOUT
    from .aio import EventKind
    from .aio import Fetch
    from .aio import FetchEvent
    from .aio import Method
    from .aio import PeerAsync
    from .aio import QueryResult
    from .aio import State
    from .aio import WindowRow
    from .errors import AlreadyExists
    from .errors import AuthFailed
    from .errors import ConnectionClosed
    from .errors import Internal
    from .errors import InvalidQuery
    from .errors import LimitExceeded
    from .errors import Malformed
    from .errors import NotAuthorized
    from .errors import NotFound
    from .errors import NotJetDaemon
    from .errors import NotOwner
    from .errors import Overloaded
    from .errors import OwnerGone
    from .errors import PeerError
    from .errors import Rejected
    from .errors import Timeout
    from .errors import TooLarge
    from .errors import UnknownFunction
    from .errors import WrongKind
    from .errors import error_for_status
    from .query import field
    from .query import key
    from .query import value
    from .sync import Peer
    from .sync import SyncFetch
    from .sync import SyncMethod
    from .sync import SyncState

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
