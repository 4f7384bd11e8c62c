"""The asyncio jet peer: :class:`PeerAsync`.

A thin :class:`asyncio.Protocol` feeds received bytes to :class:`jetwire.Decoder` and
writes frames built by :func:`jetwire.encode`; everything else is bookkeeping of
requests in flight, owned states and methods, and fetches, most of it in the sans-IO
:mod:`peer.core` (request ids and deadlines, responses into results, fetch events,
sorted windows, restore bookkeeping). This module adds the futures, the one timer, the
tasks of async handlers and the reconnect loop. It runs on whatever event loop the
application runs (uvloop included); it never installs one itself.

Example::

    async with await PeerAsync.connect("127.0.0.1", 11124, name="demo") as peer:
        temp = await peer.add_state("plant/temp", 21.5, on_set=lambda v: min(v, 30.0))
        print(await peer.set("plant/temp", 42.0))   # 30.0: the owner clamped it
        async for event in peer.fetch("plant/"):
            print(event.kind, event.key, event.value)

Requests that need no bookkeeping of their own (:meth:`PeerAsync.set`,
:meth:`PeerAsync.call`, :meth:`PeerAsync.get`, :meth:`State.notify`) are plain methods
returning an :class:`asyncio.Future`: ``await`` them like coroutines, or collect many
and ``asyncio.gather`` them to pipeline without creating a task per request.

Back-pressure: sending never blocks. Requests awaited one by one cannot outrun the
socket, but a loop that fires thousands of requests (or ``*_nowait`` events) without
awaiting them queues them in the transport's buffer; ``await peer.drain()`` every so
often waits until the socket has taken them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import logging
import random
import ssl as ssl_module
from collections import deque
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Generator
from functools import partial
from typing import TYPE_CHECKING
from typing import Any
from typing import Optional
from typing import TypedDict
from typing import Union

from jetwire import DEFAULT_MAX_BODY
from jetwire import FEATURE_LIMITS
from jetwire import AddMethod
from jetwire import AddState
from jetwire import Authenticate
from jetwire import CallMethod
from jetwire import Close
from jetwire import Decoder
from jetwire import FetchQuery
from jetwire import FetchStates
from jetwire import FetchWindow
from jetwire import FrameType
from jetwire import GetState
from jetwire import Info
from jetwire import LocalProtocolError
from jetwire import Message
from jetwire import NotifyState
from jetwire import Query
from jetwire import QueryEntry
from jetwire import QueryOnce
from jetwire import RemoteProtocolError
from jetwire import RemoveMethod
from jetwire import RemoveState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Unfetch
from jetwire import Value
from jetwire import encode
from jetwire.values import PythonValue

from .core import MAX_ERROR_MESSAGE
from .core import NONE
from .core import Converter
from .core import EventKind
from .core import FetchEvent
from .core import KnownEntries
from .core import QueryResult
from .core import RequestTable
from .core import SortedWindow
from .core import WindowRow
from .core import answer_bad_request
from .core import as_value
from .core import convert_empty
from .core import convert_fetch_id
from .core import convert_raw
from .core import convert_value
from .core import encode_checked
from .core import error_answer
from .core import fetch_event
from .core import limits_follow
from .core import query_result
from .core import refuse_unexpected
from .core import to_python
from .core import unmappable_result
from .core import unsupported_version
from .errors import ConnectionClosed
from .errors import Malformed
from .errors import NotAuthorized
from .errors import NotFound
from .errors import NotJetDaemon
from .errors import Overloaded
from .errors import PeerError
from .errors import Rejected
from .errors import Timeout
from .errors import describe_tls_failure
from .errors import error_for_status
from .query import QueryOptions
from .query import build_query
from .query import is_plain_prefix
from .tiny import INFO as INFO_FRAME
from .tiny import closed_without_a_word
from .tiny import describe_first_bytes

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.12

__all__ = [
    "DEFAULT_FETCH_QUEUE",
    "DEFAULT_PORT",
    "DEFAULT_RECONNECT_MAX_DELAY",
    "DEFAULT_RECONNECT_MIN_DELAY",
    "DEFAULT_TIMEOUT",
    "ConnectOptions",
    "EventKind",
    "Fetch",
    "FetchEvent",
    "Method",
    "PeerAsync",
    "QueryResult",
    "State",
    "WindowRow",
]

log = logging.getLogger("peer")

# DEFAULT_TIMEOUT is longer than jetd's default route timeout (5 s, PROTOCOL.md 10.3), so
# that a routed request normally fails with the daemon's TIMEOUT, which names the cause.
from .defaults import DEFAULT_PORT  # noqa: E402
from .defaults import DEFAULT_TIMEOUT  # noqa: E402

DEFAULT_RECONNECT_MIN_DELAY = 0.05
DEFAULT_RECONNECT_MAX_DELAY = 2.0
DEFAULT_FETCH_QUEUE = 100_000  # events an `async for` consumer may fall behind
DEFAULT_WRITE_HIGH_WATER = 4 * 1024 * 1024



class ConnectOptions(TypedDict, total=False):
    """The keyword arguments of :meth:`PeerAsync.connect` and :class:`peer.Peer`
    (documented at :meth:`PeerAsync.connect`; defaults in :class:`PeerAsync`)."""

    name: Optional[str]
    timeout: float
    reconnect: bool
    reconnect_min_delay: float
    reconnect_max_delay: float
    max_body: int
    fetch_queue: int
    user: Optional[str]
    password: Optional[str]
    ssl: Union[ssl_module.SSLContext, bool, None]
    info_timeout: Optional[float]


OnSet = Callable[[Any], Any]
MethodHandler = Callable[[Any], Any]
OnEvent = Callable[["FetchEvent"], Any]

_BARRIER_KEY = "\x00peer/restore-barrier"
_as_value = as_value  # the name tests and tools knew it by


def _connect_error(exc: OSError, host: str = "") -> str:
    """Why a connection could not be made, said so that the user knows what to do."""
    if isinstance(exc, ConnectionRefusedError) or exc.errno == errno.ECONNREFUSED:
        return "is jetd running? (connection refused)"
    if isinstance(exc, ssl_module.SSLError):
        return describe_tls_failure(exc, host)
    return exc.strerror or str(exc)


class State:
    """A state this peer owns, returned by :meth:`PeerAsync.add_state`.

    Attributes:
        key: the state's key.
        on_set: the set handler, or None for a read-only state.
    """

    def __init__(self, peer: PeerAsync, key: str, raw: Value, on_set: Optional[OnSet]) -> None:
        self._peer = peer
        self.key = key
        self.raw = raw
        self.on_set = on_set
        self.removed = False
        # Set when a reconnect could not re-add the state (e.g. AlreadyExists).
        self.restore_error: Optional[BaseException] = None

    @property
    def value(self) -> PythonValue:
        """The current value (as last added or notified), mapped to Python."""
        return to_python(self.raw)

    def notify(self, value: Any, *, timeout: Optional[float] = None) -> asyncio.Future[None]:
        """Announce a new complete value (NOTIFY_STATE request, PROTOCOL.md 6.4).

        Returns:
            A future resolved when the daemon confirms.

        Raises:
            LocalProtocolError: if ``value`` has no jet mapping (raised at once).
            PeerError: (from the future) NotFound, NotOwner, Timeout, ConnectionClosed.
        """
        raw = as_value(value)
        self._check_live()
        self.raw = raw
        return self._peer._request(NotifyState, (self.key, raw), convert_empty, timeout)

    def notify_nowait(self, value: Any) -> None:
        """Announce a new value as a fire-and-forget EVENT (PROTOCOL.md 7.1); no error is
        ever reported for it."""
        raw = as_value(value)
        self._check_live()
        self.raw = raw
        self._peer._send_event(NotifyState(None, self.key, raw))

    async def remove(self, *, timeout: Optional[float] = None) -> None:
        """Remove the state (REMOVE_STATE, PROTOCOL.md 6.2); it will not be restored.

        Raises:
            PeerError: NotFound, NotOwner, Timeout, ConnectionClosed.
        """
        self._check_live()
        self.removed = True
        if self._peer._states.get(self.key) is self:
            del self._peer._states[self.key]
        await self._peer._request(RemoveState, (self.key,), convert_empty, timeout)

    def _check_live(self) -> None:
        if self.removed:
            why = f" (lost on reconnect: {self.restore_error})" if self.restore_error else ""
            raise LocalProtocolError(f"state {self.key!r} was removed{why}")

    def __repr__(self) -> str:
        return f"<State {self.key!r} = {self.raw!r}{' removed' if self.removed else ''}>"


class Method:
    """A method this peer owns, returned by :meth:`PeerAsync.add_method`."""

    def __init__(self, peer: PeerAsync, key: str, handler: MethodHandler) -> None:
        self._peer = peer
        self.key = key
        self.handler = handler
        self.removed = False
        self.restore_error: Optional[BaseException] = None

    async def remove(self, *, timeout: Optional[float] = None) -> None:
        """Remove the method (REMOVE_METHOD, PROTOCOL.md 6.7); it will not be restored.

        Raises:
            PeerError: NotFound, NotOwner, Timeout, ConnectionClosed.
        """
        if self.removed:
            raise LocalProtocolError(f"method {self.key!r} was removed")
        self.removed = True
        if self._peer._methods.get(self.key) is self:
            del self._peer._methods[self.key]
        await self._peer._request(RemoveMethod, (self.key,), convert_empty, timeout)

    def __repr__(self) -> str:
        return f"<Method {self.key!r}{' removed' if self.removed else ''}>"


class Fetch:
    """A fetch of every state whose key starts with ``prefix`` (PROTOCOL.md 6.8, 10.5).

    Returned by :meth:`PeerAsync.fetch`. It is awaitable (``await`` it to wait for the
    daemon's OK; it returns itself), an async iterator of :class:`FetchEvent` when made
    without a callback, and an async context manager that unfetches on exit.

    Events are delivered from the moment the OK is processed: the initial FETCH_ADDs
    that follow the OK can never be missed.
    """

    def __init__(
        self,
        peer: PeerAsync,
        prefix: str,
        on_event: Optional[OnEvent],
        max_queue: int,
        query: Optional[Query] = None,
    ) -> None:
        self._peer = peer
        self.prefix = prefix
        self.query = query  # None: FETCH_STATES of ``prefix``; else FETCH_QUERY (PROTOCOL.md 14.3)
        self._sorted = SortedWindow(query.window_from if query is not None else 1)
        self.rows: list[WindowRow] = self._sorted.rows  # a sorted fetch's window, kept from FETCH_WINDOW
        self.window: tuple[WindowRow, ...] = ()  # the same, as of its last complete update
        self.on_event = on_event
        self.fetch_id: Optional[int] = None
        self.active = False
        self._ready: asyncio.Future[Fetch] = peer._loop.create_future()
        self._queue: deque[FetchEvent] = deque()
        self._max_queue = max_queue
        self._waiter: Optional[asyncio.Future[None]] = None
        self._end: Optional[BaseException] = None  # set when the fetch ends
        self._async_callback = on_event is not None and inspect.iscoroutinefunction(on_event)
        self._runner: Optional[asyncio.Task[None]] = None
        # Kept only with reconnect=True: what the application has been told, so that a
        # restored fetch reports the difference (PROTOCOL.md gives no end marker for
        # the initial adds; a barrier request does, see PeerAsync._restore).
        self._known: Optional[KnownEntries] = KnownEntries() if peer.reconnect else None

    def __await__(self) -> Generator[Any, None, Fetch]:
        return self._ready.__await__()

    async def __aenter__(self) -> Fetch:
        return await self

    async def __aexit__(self, *exc: object) -> None:
        if self.active:
            with contextlib.suppress(ConnectionClosed):
                await self.unfetch()

    def __aiter__(self) -> AsyncIterator[FetchEvent]:
        if self.on_event is not None:
            raise LocalProtocolError("this fetch delivers to its callback; iterate a fetch made without one")
        return self

    async def __anext__(self) -> FetchEvent:
        if not self._ready.done():
            await self._ready
        while not self._queue:
            if self._end is not None:
                if isinstance(self._end, StopAsyncIteration):
                    raise StopAsyncIteration
                raise self._end
            self._waiter = self._peer._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._queue.popleft()

    async def next_batch(self) -> list[FetchEvent]:
        """Wait for at least one event and return every event queued (iterator mode).

        Raises:
            StopAsyncIteration: when the fetch ended normally (unfetch or close).
            PeerError: ConnectionClosed or Overloaded when it ended in failure.
        """
        first = await self.__anext__()
        batch = [first, *self._queue]
        self._queue.clear()
        return batch

    async def unfetch(self, *, timeout: Optional[float] = None) -> None:
        """End the fetch (UNFETCH, PROTOCOL.md 6.9). No event is delivered after this
        is called; an iterator ends (StopAsyncIteration).

        Raises:
            PeerError: NotFound, Timeout, ConnectionClosed.
        """
        await self._ready
        if not self.active:
            raise LocalProtocolError(f"fetch {self.prefix!r} is not active")
        fetch_id = self.fetch_id
        self._finish(StopAsyncIteration())
        if fetch_id is not None and self._peer._fetches.get(fetch_id) is self:
            del self._peer._fetches[fetch_id]
            await self._peer._request(Unfetch, (fetch_id,), convert_empty, timeout)

    def _apply_window(self, message: FetchWindow) -> None:
        """PROTOCOL.md 14.2: deliver the whole window after ``message``."""
        window = self._sorted.apply(message)
        self.window = window  # one assignment: other threads (peer.sync) see a whole window
        self._deliver(EventKind.WINDOW, "", NONE, window)

    def _deliver(self, kind: EventKind, key: str, raw: Value, rows: tuple[WindowRow, ...] = ()) -> None:
        known = self._known
        if known is not None:
            noted = known.note(kind, key, raw)
            if noted is None:
                return  # a restored fetch re-announced what the application knows
            kind = noted
        event = FetchEvent(kind, key, raw, rows)
        callback = self.on_event
        if (callback is None or self._async_callback) and len(self._queue) >= self._max_queue:
            # A consumer this far behind would make the peer's memory grow without bound.
            error = Overloaded(f"fetch {self.prefix!r}: consumer fell {self._max_queue} events behind")
            if callback is not None:
                log.warning("%s; the fetch is ended", error.message)
            self._peer._drop_fetch(self)
            self._finish(error)
            return
        if callback is None:
            self._queue.append(event)
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)
        elif self._async_callback:
            # Async callbacks run one at a time, in order, on a task of their own.
            self._queue.append(event)
            if self._runner is None or self._runner.done():
                self._runner = self._peer._loop.create_task(self._run_callbacks())
        else:
            try:
                callback(event)
            except Exception:
                log.exception("fetch %r: callback failed on %s %s", self.prefix, kind, key)

    async def _run_callbacks(self) -> None:
        assert self.on_event is not None
        while self._queue:
            event = self._queue.popleft()
            try:
                await self.on_event(event)
            except Exception:
                log.exception("fetch %r: callback failed on %s %s", self.prefix, event.kind, event.key)

    def _finish(self, reason: BaseException) -> None:
        self.active = False
        if self._end is None:
            self._end = reason
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if not self._ready.done():
            if isinstance(reason, StopAsyncIteration):
                reason = ConnectionClosed("peer closed")
            self._ready.set_exception(reason)
            self._ready.exception()  # retrieved: no "never retrieved" warning

    def __repr__(self) -> str:
        return f"<Fetch {self.prefix!r} id={self.fetch_id} {'active' if self.active else 'ended'}>"



class _Link(asyncio.Protocol):
    """One TCP connection: decode what arrives, batch what leaves."""

    def __init__(self, peer: PeerAsync, max_body: int) -> None:
        self.peer = peer
        self.decoder = Decoder(max_body=max_body)
        self.transport: Optional[asyncio.Transport] = None
        self.out: list[bytes] = []
        self.closed = False
        self.lost: asyncio.Future[None] = peer._loop.create_future()
        self.info: asyncio.Future[Info] = peer._loop.create_future()
        self.close_reason: Optional[Close] = None
        self.seen_info = False  # PROTOCOL.md 11.1: the daemon's first frame must be INFO
        self.writable: Optional[asyncio.Future[None]] = None
        self.local_error: Optional[str] = None  # why this side closed the link
        self.head = b""  # the daemon's first bytes, until its INFO: is it a jet daemon at all?

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass: no isinstance check.
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(  # type: ignore[attr-defined]
            high=DEFAULT_WRITE_HIGH_WATER, low=DEFAULT_WRITE_HIGH_WATER // 4
        )

    def send(self, frame: bytes) -> None:
        if self.closed:
            raise ConnectionClosed("connection lost")
        out = self.out
        if not out:
            # One write per loop iteration however many frames were queued in it.
            self.peer._loop.call_soon(self.flush)
        out.append(frame)

    def flush(self) -> None:
        if self.out and not self.closed and self.transport is not None:
            data = b"".join(self.out)
            self.out.clear()
            self.transport.write(data)
        else:
            self.out.clear()

    def close(self, close: Optional[Close] = None) -> None:
        if self.closed:
            return
        if close is not None:
            self.out.append(encode(close))
        self.flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if not self.seen_info and len(self.head) < 64 and not self._sniff(data):
            return
        decoder = self.decoder
        decoder.receive_data(data)
        peer = self.peer
        while not self.closed:
            try:
                for message in decoder.messages():
                    if not self.seen_info and not self._first_frame(message):
                        return
                    if type(message) is Response:
                        peer._on_response(message)
                    else:
                        peer._on_message(self, message)
                    if self.closed:
                        return
                return
            except RemoteProtocolError as exc:
                peer._on_bad_frame(self, exc)

    def _sniff(self, data: bytes) -> bool:
        """Before INFO: False (and the link closed, the connect failed) when the first
        bytes cannot begin a daemon's INFO (PROTOCOL.md 4.4)."""
        self.head += data[: 64 - len(self.head)]
        foreign = describe_first_bytes(self.head)
        if foreign is None:
            return True
        peer = self.peer
        text = f"{peer.host}:{peer.port} is not a jet daemon: {foreign}"
        self.local_error = text
        # PROTOCOL.md 11.1: an INFO header with a length beyond reason is TOO_LARGE.
        self.close(Close(Status.TOO_LARGE if self.head[0] == INFO_FRAME else Status.MALFORMED, text[:200]))
        if not self.info.done():
            self.info.set_exception(NotJetDaemon(text, self.head, tls=self.head[0] in (0x14, 0x15, 0x16, 0x17)))
        return False

    def _first_frame(self, message: Message) -> bool:
        """PROTOCOL.md 11.1: a first frame other than INFO is fatal (CLOSE MALFORMED)."""
        if isinstance(message, Info):
            self.seen_info = True
            return True
        text = f"the daemon's first frame is {type(message).__name__}, not INFO"
        self.local_error = text
        self.close(Close(Status.MALFORMED, text))
        if not self.info.done():
            self.info.set_exception(Malformed(text))
        return False

    def pause_writing(self) -> None:
        self.writable = self.peer._loop.create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.closed = True
        self.resume_writing()
        if not self.lost.done():
            self.lost.set_result(None)
        if not self.info.done():
            if not self.head and self.local_error is None:
                # A daemon sends INFO first, even to refuse (PROTOCOL.md 10.7).
                address = f"{self.peer.host}:{self.peer.port}"
                self.info.set_exception(NotJetDaemon(closed_without_a_word(address, bool(self.peer.ssl)),
                                                     tls=not self.peer.ssl))
            else:
                self.info.set_exception(ConnectionClosed(self.describe_close(exc)))
            self.info.exception()
        self.peer._on_link_lost(self, exc)

    def describe_close(self, exc: Optional[BaseException] = None) -> str:
        if self.close_reason is not None:
            return f"daemon closed the connection: {self.close_reason.status.name} {self.close_reason.message}"
        if self.local_error is not None:
            return f"connection closed: {self.local_error}"
        if exc is not None:
            return f"connection lost: {exc}"
        return "connection closed"


class PeerAsync:
    """An asyncio jet peer: owner, client and fetcher on one connection.

    Create it with :meth:`connect`. All methods must be called on the event loop the
    peer was connected on (use :class:`peer.Peer` from other threads).

    Attributes:
        name: the name sent to the daemon in this peer's INFO.
        reconnect: whether the peer reconnects and restores itself after a link loss.
        timeout: the default timeout (seconds) of every request.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        name: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT,
        reconnect: bool = False,
        reconnect_min_delay: float = DEFAULT_RECONNECT_MIN_DELAY,
        reconnect_max_delay: float = DEFAULT_RECONNECT_MAX_DELAY,
        max_body: int = DEFAULT_MAX_BODY,
        fetch_queue: int = DEFAULT_FETCH_QUEUE,
        user: Optional[str] = None,
        password: Optional[str] = None,
        ssl: Union[ssl_module.SSLContext, bool, None] = None,
        info_timeout: Optional[float] = None,
    ) -> None:
        self._requests: RequestTable[asyncio.Future[Any]] = RequestTable(timeout)  # ValueError for timeout <= 0
        self.info_timeout = info_timeout
        self.host = host
        self.port = port
        self.name = name if name is not None else "peer"
        self.timeout = timeout
        self.reconnect = reconnect
        self.reconnect_min_delay = reconnect_min_delay
        self.reconnect_max_delay = reconnect_max_delay
        self.max_body = max_body
        self.fetch_queue = fetch_queue
        self.user = user
        self._password = password  # kept to authenticate again after a reconnect
        self.ssl = ssl
        self._loop = asyncio.get_running_loop()
        self._link: Optional[_Link] = None
        self._info: Optional[Info] = None
        self._sweeper: Optional[asyncio.TimerHandle] = None  # the one timer of self._requests
        self._sweep_at: Optional[float] = None  # when it fires
        self._states: dict[str, State] = {}
        self._methods: dict[str, Method] = {}
        self._fetches: dict[int, Fetch] = {}
        self._query_results: dict[int, list[QueryResult]] = {}  # QUERY_ONCE id -> entries so far
        self._fetch_objects: list[Fetch] = []  # every active fetch, for restore
        self._closing = False
        self._closed_error: Optional[ConnectionClosed] = None
        self._ready = True  # False while a reconnect is restoring
        self._backlog: list[tuple[int, bytes]] = []  # requests made while reconnecting
        self._restored: asyncio.Event = asyncio.Event()
        self._restored.set()
        self._reconnector: Optional[asyncio.Task[None]] = None
        self._handler_tasks: set[asyncio.Task[Any]] = set()
        self.reconnects = 0  # completed reconnections, for observability

    # --- connecting -------------------------------------------------------------------

    @classmethod
    async def connect(
        cls, host: str = "127.0.0.1", port: int = DEFAULT_PORT, **options: Unpack[ConnectOptions]
    ) -> PeerAsync:
        """Connect to a daemon, send this peer's INFO and wait for the daemon's.

        Args (all but ``host`` and ``port`` keyword-only; the defaults are those of
        :class:`PeerAsync`'s constructor):
            host, port: the daemon's address.
            name: this peer's name in the daemon's logs (default ``"peer"``).
            timeout: seconds for the connection and the default for every request.
            reconnect: after a link loss, reconnect with exponential backoff (between
                ``reconnect_min_delay`` and ``reconnect_max_delay`` seconds, with
                jitter) and restore states (current values), methods and fetches.
                Requests in flight when the link drops fail with ConnectionClosed
                (whether the daemon carried them out is unknown); requests made while
                reconnecting wait for the restore (within their timeout). The first
                connection must succeed.
            max_body: the largest body this peer accepts (announced in its INFO).
            fetch_queue: how many events a fetch iterated with ``async for``, or served
                by an async callback, may fall behind before it ends with
                :class:`Overloaded`.
            user, password: authenticate as ``user`` right after connecting (and after
                every reconnect) with AUTHENTICATE (PROTOCOL.md 15.2); ``password``
                defaults to empty. Without ``user`` the peer does not authenticate
                (anonymous, or a TLS client certificate names it).
            ssl: TLS: True for the default context (system CAs), or an
                :class:`ssl.SSLContext` (own CA, client certificate; PROTOCOL.md 15.6).
            info_timeout: seconds to wait for the daemon's INFO once connected, which a
                daemon sends at once (default, and at most: ``timeout``).

        Returns:
            The connected peer.

        Raises:
            NotJetDaemon: the server is not a jet daemon: its first bytes cannot begin
                INFO (an HTTP server, a TLS listener), it closed the connection without
                a word, or it sent nothing within ``info_timeout``.
            ConnectionClosed: the connection failed or the daemon closed it.
            Timeout: no INFO from the daemon within ``timeout``.
            Malformed: the daemon speaks another major version.
            AuthFailed: unknown user or wrong password.
            UnknownFunction: ``user`` given, and the daemon speaks protocol 1.0.
        """
        peer = cls(host, port, **options)
        await peer._open()
        return peer

    async def _open(self) -> _Link:
        loop = self._loop
        link: Optional[_Link] = None
        wait = self.timeout if self.info_timeout is None else min(self.info_timeout, self.timeout)
        try:
            async with asyncio.timeout(self.timeout):
                _, link = await loop.create_connection(
                    lambda: _Link(self, self.max_body), self.host, self.port, ssl=self.ssl or None
                )
                self._link = link
                # PROTOCOL.md 4.4: our INFO first; requests may follow without waiting.
                # FEATURE_LIMITS asks a 1.2 daemon for its limits (4.4.1).
                link.send(encode(Info(self.name, self.max_body, FEATURE_LIMITS)))
                # A daemon sends its INFO at once: silence means something else listens.
                info = await asyncio.wait_for(link.info, wait)
                if self.user is not None:
                    # PROTOCOL.md 15.2: before anything that needs the permissions.
                    await self._request(
                        Authenticate, (self.user, self._password or ""), convert_empty, None, restoring=True
                    )
        except TimeoutError:
            self._abort_link()
            if link is not None and not link.head and not link.seen_info:
                raise NotJetDaemon(
                    f"{self.host}:{self.port} sent nothing in {wait:g} s (a jet daemon sends its INFO at once): "
                    "not a jet daemon, or a stuck one"
                ) from None
            if link is None and self.ssl:
                raise Timeout(
                    f"no answer to the TLS handshake from {self.host}:{self.port} within {self.timeout:g} s: "
                    "not a TLS listener?"
                ) from None
            raise Timeout(f"no INFO from {self.host}:{self.port} within {self.timeout:g} s") from None
        except OSError as exc:
            self._abort_link()
            raise ConnectionClosed(
                f"cannot connect to {self.host}:{self.port}: {_connect_error(exc, self.host)}"
            ) from None
        except BaseException:
            self._abort_link()
            raise
        self._info = info
        return link

    def _abort_link(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None

    @property
    def info(self) -> Info:
        """The daemon's INFO (name, max_body, features, version; from a 1.2 daemon also
        ``max_key_length`` and ``route_timeout_ms``, PROTOCOL.md 4.4.1, else None)."""
        if self._info is None:
            raise LocalProtocolError("not connected yet")
        return self._info

    @property
    def connected(self) -> bool:
        """True while a link is up and (after a reconnect) restored."""
        return self._link is not None and not self._link.closed and self._ready

    async def __aenter__(self) -> PeerAsync:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection. Pending requests fail with :class:`ConnectionClosed`,
        fetch iterators end; no reconnect follows. Idempotent."""
        if self._closing:
            if self._link is not None and not self._link.lost.done():
                await asyncio.shield(self._link.lost)
            return
        self._closing = True
        self._closed_error = ConnectionClosed("peer closed")
        if self._reconnector is not None:
            self._reconnector.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reconnector
        link = self._link
        if link is not None:
            # PROTOCOL.md 7.3: a peer MAY say goodbye; the daemon treats it as a disconnect.
            link.close(Close(Status.OK, "peer closing"))
            try:
                async with asyncio.timeout(2.0):
                    await link.lost
            except TimeoutError:
                if link.transport is not None:
                    link.transport.abort()
        self._fail_pending(self._closed_error)
        self._backlog.clear()  # their futures were in _requests, failed just above
        for fetch in list(self._fetch_objects):
            fetch._finish(StopAsyncIteration())
        self._fetch_objects.clear()
        self._fetches.clear()
        for task in list(self._handler_tasks):
            task.cancel()
        if self._handler_tasks:
            await asyncio.gather(*self._handler_tasks, return_exceptions=True)

    async def wait_closed(self) -> None:
        """Wait until the current link is lost (e.g. the daemon shut down) and no
        reconnect is under way."""
        while True:
            link = self._link
            if link is not None and not link.lost.done():
                await asyncio.shield(link.lost)
            if self._reconnector is not None and not self._reconnector.done():
                await asyncio.shield(self._reconnector)
                continue
            if link is self._link:
                return

    async def drain(self) -> None:
        """Wait until the socket's write buffer is below its low-water mark (use it when
        pipelining very many requests without awaiting them)."""
        link = self._link
        if link is not None:
            link.flush()
            if link.writable is not None:
                await link.writable

    # --- sending ----------------------------------------------------------------------

    def _copy_closed_error(self) -> ConnectionClosed:
        # A fresh exception per raise: one instance raised twice grows its traceback.
        error = self._closed_error
        if error is None:
            return ConnectionClosed("peer closed")
        return ConnectionClosed(error.message, error.status)

    def _frame(self, message: Message) -> bytes:
        return encode_checked(message, self._info)

    def _request(
        self,
        cls: type[Any],
        fields: tuple[Any, ...],
        convert: Converter,
        timeout: Optional[float],
        *,
        restoring: bool = False,
    ) -> asyncio.Future[Any]:
        """Send the REQUEST ``cls(id, *fields)`` (the id is assigned here) and return
        the future of its converted result."""
        if self._closing:
            raise self._copy_closed_error()
        loop = self._loop
        future: asyncio.Future[Any] = loop.create_future()
        requests = self._requests
        rid = requests.open(future, convert, loop.time(), timeout)
        try:
            frame = encode_checked(cls(rid, *fields), self._info)
        except BaseException:
            requests.pop(rid)
            raise
        link = self._link
        if (restoring or self._ready) and link is not None and not link.closed:
            link.send(frame)
        elif self.reconnect:
            # Made while reconnecting: sent after the restore, if still pending then.
            self._backlog.append((rid, frame))
        else:
            requests.pop(rid)
            raise self._copy_closed_error()
        if requests.timer_at != self._sweep_at:
            self._arm(requests.timer_at)
        return future

    def _arm(self, when: Optional[float]) -> None:
        """Have the one timer fire at ``when`` (None: not at all)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._sweep_at = when
        if when is not None:
            self._sweeper = self._loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        """Fail the requests whose deadline passed; re-arm the timer."""
        self._sweeper = None
        expired, timer_at = self._requests.expire(self._loop.time())
        for future, error in expired:
            if not future.done():
                future.set_exception(error)
        self._arm(timer_at)

    def _send_event(self, message: Message) -> None:
        if self._closing:
            raise self._copy_closed_error()
        frame = self._frame(message)
        link = self._link
        if link is None or link.closed or not self._ready:
            # PROTOCOL.md 7.1: fire-and-forget; while reconnecting it is queued and sent
            # after the restore, when the link is down for good it is dropped.
            if self.reconnect:
                self._backlog.append((-1, frame))
            return
        link.send(frame)

    def _on_response(self, response: Response) -> None:
        answered = self._requests.answer(response)
        if answered is None:
            log.debug("response to unknown request %d dropped (late after a timeout?)", response.id)
            return
        future, ok, outcome = answered
        if future.done():
            return
        if ok:
            future.set_result(outcome)
        else:
            future.set_exception(outcome)

    def _fail_pending(self, error: PeerError) -> None:
        waiting = self._requests.take_all()
        self._arm(None)
        for future in waiting:
            if not future.done():
                future.set_exception(type(error)(error.message, error.status))

    # --- client role ------------------------------------------------------------------

    def set(self, key: str, value: Any, *, timeout: Optional[float] = None) -> asyncio.Future[PythonValue]:
        """Ask the owner of state ``key`` to take ``value`` (SET_STATE, PROTOCOL.md 6.3).

        Returns:
            A future of the value now in effect, as the owner answered (mapped to Python).

        Raises:
            LocalProtocolError: at once, for a value with no jet mapping or a bad key.
            PeerError: (from the future) NotFound, WrongKind, Rejected (or any status the
                owner answered), Timeout, OwnerGone, LimitExceeded, ConnectionClosed.
        """
        return self._request(SetState, (key, as_value(value)), convert_value, timeout)

    def set_nowait(self, key: str, value: Any) -> None:
        """Fire-and-forget set (EVENT form, PROTOCOL.md 7.1): nothing reports the outcome."""
        self._send_event(SetState(None, key, as_value(value)))

    def call(self, key: str, args: Any = None, *, timeout: Optional[float] = None) -> asyncio.Future[PythonValue]:
        """Call method ``key`` with ``args`` (CALL_METHOD, PROTOCOL.md 6.5).

        Returns:
            A future of the method's result, mapped to Python.

        Raises:
            PeerError: (from the future) NotFound, WrongKind, Rejected (or any status the
                owner answered), Timeout, OwnerGone, LimitExceeded, ConnectionClosed.
        """
        return self._request(CallMethod, (key, as_value(args)), convert_value, timeout)

    def call_nowait(self, key: str, args: Any = None) -> None:
        """Fire-and-forget call (EVENT form, PROTOCOL.md 7.1)."""
        self._send_event(CallMethod(None, key, as_value(args)))

    def get(self, key: str, *, timeout: Optional[float] = None) -> asyncio.Future[PythonValue]:
        """Read the daemon's cached value of state ``key`` (GET_STATE, PROTOCOL.md 6.10).

        Raises:
            PeerError: (from the future) NotFound, WrongKind, Timeout, ConnectionClosed.
        """
        return self._request(GetState, (key,), convert_value, timeout)

    def get_raw(self, key: str, *, timeout: Optional[float] = None) -> asyncio.Future[Value]:
        """Like :meth:`get`, but the future yields the :class:`jetwire.Value` unmapped."""
        return self._request(GetState, (key,), convert_raw, timeout)

    def fetch(
        self,
        prefix: str = "",
        on_event: Optional[OnEvent] = None,
        *,
        timeout: Optional[float] = None,
        **query_options: Unpack[QueryOptions],
    ) -> Fetch:
        """Fetch every state whose key starts with ``prefix`` (PROTOCOL.md 6.8), or, with
        any query argument, a query fetch (FETCH_QUERY, protocol 1.1, PROTOCOL.md 14.3).

        Query arguments (see :mod:`peer.query`): ``match`` path matchers
        (``key.ends_with("/temp")``, ``~key.contains("x")``); ``where`` value filters
        (``field("gender") == "female"``, ``value > 3``); ``sort_by`` ``"key"``,
        ``"value"`` or a field path, with ``descending`` and a window ``top=N`` or
        ``window=(from, to)`` (1-based); ``methods`` and ``nodes`` add those entries.
        A sorted fetch delivers WINDOW events whose ``rows`` are the whole window;
        ``Fetch.rows`` holds it too. A filtered fetch delivers UNMATCH when a state
        stops matching.

        With ``on_event`` (a function or coroutine function taking a
        :class:`FetchEvent`), every event is passed to it in order; without, iterate the
        returned :class:`Fetch` with ``async for``. Await the result to wait for the
        daemon's OK.

        Raises:
            PeerError: (when awaited or iterated) LimitExceeded, Timeout,
                ConnectionClosed.
        """
        query = build_query(prefix, **query_options)
        fetch = Fetch(self, prefix, on_event, self.fetch_queue, None if is_plain_prefix(query) else query)
        self._start_fetch(fetch, timeout)
        return fetch

    def query(
        self,
        prefix: str = "",
        *,
        timeout: Optional[float] = None,
        **query_options: Unpack[QueryOptions],
    ) -> asyncio.Future[list[QueryResult]]:
        """Answer a query once (QUERY_ONCE, PROTOCOL.md 14.4): the matching entries in
        order (byte order of key, or the sort's window). Arguments as :meth:`fetch`.

        Raises:
            PeerError: (when awaited) InvalidQuery, LimitExceeded, TooLarge, Malformed,
                Timeout, ConnectionClosed.
        """
        query = build_query(prefix, **query_options)
        results = self._query_results

        def collect(response: Response) -> list[QueryResult]:
            return results.pop(response.id, [])

        future = self._request(QueryOnce, (query,), collect, timeout)
        rid = self._requests.last_id
        results[rid] = []
        future.add_done_callback(lambda _: results.pop(rid, None))
        return future

    def _start_fetch(self, fetch: Fetch, timeout: Optional[float], *, restoring: bool = False) -> asyncio.Future[Any]:
        def activate(response: Response) -> int:
            # Runs inside the data_received call that carries the OK: registering the
            # fetch id here is what makes the initial adds that follow it impossible
            # to miss (PROTOCOL.md 10.5: OK first, then the initial adds).
            fetch_id = convert_fetch_id(response)
            fetch.fetch_id = fetch_id
            if fetch._end is None:
                fetch.active = True
                self._fetches[fetch_id] = fetch
                if fetch not in self._fetch_objects:
                    self._fetch_objects.append(fetch)
                if not fetch._ready.done():
                    fetch._ready.set_result(fetch)
            return fetch_id

        if fetch.query is not None:
            fetch._sorted.clear()  # a restored sorted fetch starts with its whole window again
            fetch.window = ()
            future = self._request(FetchQuery, (fetch.query,), activate, timeout, restoring=restoring)
        else:
            future = self._request(FetchStates, (fetch.prefix,), activate, timeout, restoring=restoring)
        if not restoring:

            def ready(done: asyncio.Future[Any]) -> None:
                if fetch._ready.done():
                    return
                if done.cancelled():
                    fetch._ready.cancel()
                elif (error := done.exception()) is not None:
                    fetch._finish(error)
                else:
                    fetch._ready.set_result(fetch)

            future.add_done_callback(ready)
        return future

    def _drop_fetch(self, fetch: Fetch) -> None:
        """Stop a fetch locally and tell the daemon, without waiting for its answer."""
        if fetch.fetch_id is not None and self._fetches.get(fetch.fetch_id) is fetch:
            del self._fetches[fetch.fetch_id]
            if self._link is not None and not self._link.closed:
                self._request(Unfetch, (fetch.fetch_id,), convert_empty, None).add_done_callback(_ignore)
        if fetch in self._fetch_objects:
            self._fetch_objects.remove(fetch)

    # --- owner role -------------------------------------------------------------------

    async def add_state(
        self,
        key: str,
        value: Any,
        *,
        on_set: Optional[OnSet] = None,
        timeout: Optional[float] = None,
    ) -> State:
        """Add a state owned by this peer (ADD_STATE, PROTOCOL.md 6.1).

        Args:
            key: the state's key.
            value: its initial value (Python, or a :class:`jetwire.Value`).
            on_set: called with the requested value (mapped to Python) for every set,
                on the event loop; may be a coroutine function. It returns the value to
                keep: the requested one, an adapted one (clamped, rounded...), or None to
                keep the requested value unchanged (return ``Value.of(None)`` to really
                set NONE). Raise :class:`Rejected` to refuse with a message, or any
                :class:`PeerError` to answer its status; any other exception answers
                INTERNAL with ``"<handler> failed: <Type>: <message>"`` and is logged.
                Without ``on_set`` the state is read-only: sets get REJECTED.
            timeout: seconds to wait for the daemon.

        Returns:
            The :class:`State` handle.

        Raises:
            PeerError: AlreadyExists, TooLarge, LimitExceeded, Timeout, ConnectionClosed.
        """
        raw = as_value(value)
        if key in self._states or key in self._methods:
            raise LocalProtocolError(f"this peer already owns {key!r}")
        state = State(self, key, raw, on_set)
        self._states[key] = state
        try:
            await self._request(AddState, (key, raw), convert_empty, timeout)
        except BaseException:
            if self._states.get(key) is state:
                del self._states[key]
            raise
        return state

    async def add_method(
        self, key: str, handler: MethodHandler, *, timeout: Optional[float] = None
    ) -> Method:
        """Add a method owned by this peer (ADD_METHOD, PROTOCOL.md 6.6).

        Args:
            key: the method's key.
            handler: called with the argument (mapped to Python), sync or async; its
                return value is the result (None gives NONE). Errors are answered as
                for ``on_set`` in :meth:`add_state`.

        Raises:
            PeerError: AlreadyExists, TooLarge, LimitExceeded, Timeout, ConnectionClosed.
        """
        if key in self._states or key in self._methods:
            raise LocalProtocolError(f"this peer already owns {key!r}")
        method = Method(self, key, handler)
        self._methods[key] = method
        try:
            await self._request(AddMethod, (key,), convert_empty, timeout)
        except BaseException:
            if self._methods.get(key) is method:
                del self._methods[key]
            raise
        return method

    # --- receiving --------------------------------------------------------------------

    def _on_message(self, link: _Link, message: Message) -> None:
        event = fetch_event(message)
        if event is not None:
            fetch = self._fetches.get(event[0])
            if fetch is not None:
                fetch._deliver(event[1], event[2], event[3])
            return
        if isinstance(message, FetchWindow):
            fetch = self._fetches.get(message.fetch_id)
            if fetch is not None and fetch.query is not None:
                fetch._apply_window(message)
            return
        if isinstance(message, QueryEntry):
            collected = self._query_results.get(message.id)
            if collected is not None:
                collected.append(query_result(message))
            return
        if isinstance(message, SetState):
            self._serve_set(link, message)
        elif isinstance(message, CallMethod):
            self._serve_call(link, message)
        elif isinstance(message, Info):
            text = unsupported_version(message)
            if text is not None:
                link.close(Close(Status.MALFORMED, text))
                if not link.info.done():
                    link.info.set_exception(Malformed(text))
            elif not link.info.done():
                if not limits_follow(message):
                    link.info.set_result(message)
            else:
                self._info = message
        elif isinstance(message, Close):
            link.close_reason = message
            link.close()
        else:
            # PROTOCOL.md 6: a daemon routes only SET_STATE and CALL_METHOD to owners.
            log.warning("unexpected %s from the daemon", type(message).__name__)
            refusal = refuse_unexpected(message)
            if refusal is not None:
                link.send(encode(refusal))

    def _on_bad_frame(self, link: _Link, exc: RemoteProtocolError) -> None:
        if exc.fatal or exc.request_id is None:
            # PROTOCOL.md 9.2 / 9.3: the stream (or an unanswerable event) is bad.
            log.error("closing: the daemon sent a bad frame: %s", exc.message)
            link.local_error = f"the daemon sent a bad frame ({exc.status.name}): {exc.message}"
            if not link.info.done():
                link.info.set_exception(error_for_status(exc.status, exc.message))
            link.close(Close(exc.status, exc.message[:MAX_ERROR_MESSAGE]))
            return
        if exc.frame_type == FrameType.RESPONSE:
            entry = self._requests.pop(exc.request_id)
            if entry is not None and not entry[0].done():
                entry[0].set_exception(Malformed(f"malformed response: {exc.message}"))
            return
        answer = answer_bad_request(exc)
        if answer is not None:
            link.send(encode(answer))

    def _serve_set(self, link: _Link, request: SetState) -> None:
        state = self._states.get(request.key)
        rid = request.id
        if state is None:
            self._answer_error(link, rid, NotFound(f"this peer owns no state {request.key!r}"))
            return
        handler = state.on_set
        if handler is None:
            self._answer_error(link, rid, Rejected(f"state {request.key!r} is read-only"))
            return
        self._run_handler(link, rid, handler, request.value, partial(self._finish_set, link, rid, state, request.value))

    def _run_handler(
        self, link: _Link, rid: Optional[int], handler: Any, value: Value, finish: Callable[[Any, Any], None]
    ) -> None:
        """Call a set or method handler; ``finish(outcome, handler)`` answers its result."""
        try:
            result = handler(to_python(value))
        except Exception as exc:
            self._answer_error(link, rid, exc, handler)
            return
        if inspect.isawaitable(result):
            self._spawn(self._finish_async(link, rid, result, handler, finish))
        else:
            finish(result, handler)

    async def _finish_async(
        self, link: _Link, rid: Optional[int], result: Awaitable[Any], handler: Any, finish: Callable[[Any, Any], None]
    ) -> None:
        try:
            outcome = await result
        except Exception as exc:
            self._answer_error(link, rid, exc, handler)
            return
        finish(outcome, handler)

    def _finish_set(
        self, link: _Link, rid: Optional[int], state: State, requested: Value, outcome: Any, handler: Any
    ) -> None:
        try:
            new = requested if outcome is None else as_value(outcome)
        except LocalProtocolError as exc:
            self._answer_error(link, rid, unmappable_result(handler, exc))
            return
        if state.removed:
            self._answer_error(link, rid, NotFound(f"state {state.key!r} was removed"))
            return
        state.raw = new
        if link.closed:
            return  # the daemon answers OWNER_GONE; the restore notifies the value
        # PROTOCOL.md 10.3 / 11: NOTIFY_STATE with the complete new value first, then
        # OK carrying that value, so every fetcher sees the change before the OK.
        link.send(encode(NotifyState(None, state.key, new)))
        if rid is not None:
            link.send(encode(Response(rid, Status.OK, new)))

    def _serve_call(self, link: _Link, request: CallMethod) -> None:
        method = self._methods.get(request.key)
        rid = request.id
        if method is None:
            self._answer_error(link, rid, NotFound(f"this peer owns no method {request.key!r}"))
            return
        self._run_handler(link, rid, method.handler, request.value, partial(self._finish_call, link, rid))

    def _finish_call(self, link: _Link, rid: Optional[int], outcome: Any, handler: Any) -> None:
        if rid is None or link.closed:
            return
        try:
            value = as_value(outcome)
        except LocalProtocolError as exc:
            self._answer_error(link, rid, unmappable_result(handler, exc))
            return
        link.send(encode(Response(rid, Status.OK, value)))

    def _answer_error(self, link: _Link, rid: Optional[int], exc: Exception, handler: Any = None) -> None:
        answer = error_answer(rid, exc, handler)
        if answer is not None and not link.closed:
            link.send(encode(answer))

    def _spawn(self, coro: Any) -> None:
        task = self._loop.create_task(coro)
        self._handler_tasks.add(task)
        task.add_done_callback(self._handler_tasks.discard)

    # --- losing and restoring the link -----------------------------------------------

    def _on_link_lost(self, link: _Link, exc: Optional[Exception]) -> None:
        if link is not self._link:
            return
        reason = link.describe_close(exc)
        status = link.close_reason.status if link.close_reason is not None else None
        self._fail_pending(ConnectionClosed(reason, status))
        if self._closing:
            return
        if self._reconnector is not None and not self._reconnector.done():
            return  # lost during a restore: the running reconnect loop tries again
        if self.reconnect:
            self._ready = False
            self._restored.clear()
            # Sent requests were failed above; what was queued but never sent waits.
            self._reconnector = self._loop.create_task(self._reconnect_loop())
            return
        self._closed_error = ConnectionClosed(reason, status)
        self._closing = True
        for fetch in list(self._fetch_objects):
            fetch._finish(ConnectionClosed(reason, status))
        self._fetch_objects.clear()
        self._fetches.clear()

    async def _reconnect_loop(self) -> None:
        delay = self.reconnect_min_delay
        while not self._closing:
            await asyncio.sleep(delay * (0.5 + random.random() / 2))
            delay = min(delay * 2, self.reconnect_max_delay)
            try:
                link = await self._open()
                await self._restore(link)
            except (PeerError, OSError) as exc:
                log.info("reconnect to %s:%d failed: %s", self.host, self.port, exc)
                self._abort_link()
                continue
            self.reconnects += 1
            self._ready = True
            self._restored.set()
            backlog, self._backlog = self._backlog, []
            for rid, frame in backlog:
                if rid < 0 or rid in self._requests:
                    link.send(frame)
            log.info("reconnected to %s:%d and restored", self.host, self.port)
            return

    async def _restore(self, link: _Link) -> None:
        """Re-add states (current values) and methods, re-fetch, in one pipelined batch."""
        waits: list[asyncio.Future[Any]] = []
        lost: list[tuple[str, asyncio.Future[Any]]] = []
        for state in list(self._states.values()):
            future = self._request(AddState, (state.key, state.raw), convert_empty, None, restoring=True)
            lost.append((state.key, future))
        for method in list(self._methods.values()):
            future = self._request(AddMethod, (method.key,), convert_empty, None, restoring=True)
            lost.append((method.key, future))
        self._fetches.clear()
        for fetch in list(self._fetch_objects):
            if fetch._known is not None:
                fetch._known.begin_restore()
            waits.append(self._start_fetch(fetch, None, restoring=True))
        # The barrier's answer comes after every initial FETCH_ADD of the fetches above
        # (PROTOCOL.md 10.1: one connection's frames are processed and answered in order).
        barrier = self._request(GetState, (_BARRIER_KEY,), convert_raw, None, restoring=True)
        results = await asyncio.gather(*(f for _, f in lost), *waits, return_exceptions=True)
        with contextlib.suppress(NotFound, NotAuthorized):  # NOT_AUTHORIZED: no read of the key
            await barrier
        for (key, _), result in zip(lost, results, strict=False):
            if isinstance(result, ConnectionClosed):
                raise result
            if isinstance(result, BaseException):
                # Typically ALREADY_EXISTS: another peer took the key while we were
                # away. Its handle is dead from now on; nothing is served for it.
                log.error("could not restore %r after reconnecting: %s", key, result)
                handle = self._states.pop(key, None) or self._methods.pop(key, None)
                if handle is not None:
                    handle.removed = True
                    handle.restore_error = result
        for result in results[len(lost) :]:
            if isinstance(result, ConnectionClosed):
                raise result
        for fetch in list(self._fetch_objects):
            if fetch._known is not None:
                for key, raw in fetch._known.end_restore():
                    fetch._deliver(EventKind.REMOVE, key, raw)


def _ignore(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()

