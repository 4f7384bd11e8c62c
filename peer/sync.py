"""The synchronous jet peer: :class:`Peer`.

The same API as :class:`peer.PeerAsync`, blocking, for scripts and threads. It runs a
:class:`PeerAsync` on a private event loop in a thread of its own (the design of
websockets' sync API and of hbk::jet::Peer); every public method may be called from any
thread at any time.

Threads and handlers:
    Set handlers, method handlers and fetch callbacks run **on the peer's thread**, one
    at a time, in the order their frames arrived. A handler must not block for long (it
    holds up everything else the peer does), and it must not make *blocking* calls on
    its own peer: they would wait for the thread they block, so they raise
    :class:`jetwire.LocalProtocolError` at once. Use the ``*_future`` or ``*_nowait``
    variants from handlers instead.

Naming:
    ``peer.set(...)`` blocks and returns the result; ``peer.set_future(...)`` returns a
    :class:`concurrent.futures.Future` at once; ``peer.set_nowait(...)`` is the
    fire-and-forget EVENT form (PROTOCOL.md 7.1). The same holds for every request.

The private loop is made by ``asyncio.new_event_loop()``, so it is uvloop when the
application installed uvloop's event loop policy, and asyncio's own loop otherwise.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterator
from typing import TYPE_CHECKING
from typing import Any
from typing import Optional
from typing import TypeVar
from typing import Union

from jetwire import Info
from jetwire import LocalProtocolError
from jetwire import Value
from jetwire.values import PythonValue

from .aio import DEFAULT_PORT
from .aio import DEFAULT_TIMEOUT
from .aio import ConnectOptions
from .aio import Fetch
from .aio import FetchEvent
from .aio import Method
from .aio import MethodHandler
from .aio import OnEvent
from .aio import OnSet
from .aio import PeerAsync
from .aio import QueryResult
from .aio import State
from .aio import WindowRow
from .errors import ConnectionClosed
from .query import QueryOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.12

__all__ = ["Peer", "SyncFetch", "SyncMethod", "SyncState"]

T = TypeVar("T")
R = TypeVar("R")

# A blocking call waits for the peer's own timeout to fail it; this margin only guards
# against a loop that died under us.
_RESULT_MARGIN = 5.0


async def _cancel_all_tasks() -> None:
    """Cancel every other task of the running loop and wait until they are done."""
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class _SyncOwned:
    """A state or method owned by a :class:`Peer`: what removing one takes."""

    def __init__(self, peer: Peer, owned: Union[State, Method]) -> None:
        self._peer = peer
        self._owned = owned
        self.key = owned.key

    def remove(self, *, timeout: Optional[float] = None) -> None:
        """Remove it (REMOVE_STATE or REMOVE_METHOD, PROTOCOL.md 6.2, 6.7); it is not
        restored after a reconnect.

        Raises:
            PeerError: NotFound, NotOwner, Timeout, ConnectionClosed.
        """
        self._peer._wait(self.remove_future(timeout=timeout), timeout)

    def remove_future(self, *, timeout: Optional[float] = None) -> concurrent.futures.Future[None]:
        """Like :meth:`remove`, returning a future at once."""
        return self._peer._submit(self._owned.remove, timeout=timeout)


class SyncState(_SyncOwned):
    """A state owned by a :class:`Peer` (see :class:`peer.State`)."""

    def __init__(self, peer: Peer, state: State) -> None:
        super().__init__(peer, state)
        self._state = state

    @property
    def value(self) -> PythonValue:
        """The current value (as last added or notified), mapped to Python."""
        return self._state.value

    @property
    def raw(self) -> Value:
        """The current value as a :class:`jetwire.Value`."""
        return self._state.raw

    def notify(self, value: Any, *, timeout: Optional[float] = None) -> None:
        """Announce a new complete value and wait for the daemon's OK (PROTOCOL.md 6.4).

        Raises:
            PeerError: NotFound, NotOwner, Timeout, ConnectionClosed.
        """
        self._peer._wait(self.notify_future(value, timeout=timeout), timeout)

    def notify_future(self, value: Any, *, timeout: Optional[float] = None) -> concurrent.futures.Future[None]:
        """Like :meth:`notify`, returning a future at once."""
        return self._peer._submit(self._state.notify, value, timeout=timeout)

    def notify_nowait(self, value: Any) -> None:
        """Fire-and-forget notify (EVENT form, PROTOCOL.md 7.1).

        Raises:
            LocalProtocolError: at once, for a value with no jet mapping.
        """
        Value.of(value)  # refuse unmappable values here, in the caller's thread
        self._peer._submit(self._state.notify_nowait, value)

    def __repr__(self) -> str:
        return repr(self._state).replace("<State", "<SyncState", 1)


class SyncMethod(_SyncOwned):
    """A method owned by a :class:`Peer` (see :class:`peer.Method`)."""


class SyncFetch:
    """A fetch made by a :class:`Peer` (see :class:`peer.Fetch`).

    Made without a callback, it is an iterator of :class:`FetchEvent` (``for event in
    fetch``) that ends when the fetch is unfetched or the peer closed, and raises
    :class:`ConnectionClosed` if the connection is lost. It is a context manager that
    unfetches on exit.
    """

    def __init__(self, peer: Peer, fetch: Fetch) -> None:
        self._peer = peer
        self._fetch = fetch
        self.prefix = fetch.prefix
        self._buffer: list[FetchEvent] = []
        self._inflight: Optional[concurrent.futures.Future[list[FetchEvent]]] = None

    @property
    def fetch_id(self) -> Optional[int]:
        """The daemon's id of this fetch (it changes when a reconnect restores it)."""
        return self._fetch.fetch_id

    @property
    def active(self) -> bool:
        """False once unfetched or ended."""
        return self._fetch.active

    @property
    def rows(self) -> tuple[WindowRow, ...]:
        """A sorted fetch's whole window, in order (PROTOCOL.md 14.2): the latest the
        peer has received, whether or not its WINDOW event has been iterated yet (each
        event's own ``rows`` is the window as of that event). Empty for an unsorted
        fetch, and until the first window arrives."""
        return self._fetch.window

    def unfetch(self, *, timeout: Optional[float] = None) -> None:
        """End the fetch (PROTOCOL.md 6.9); no callback runs after this returns.

        Raises:
            PeerError: NotFound, Timeout, ConnectionClosed.
        """
        self._peer._wait(self.unfetch_future(timeout=timeout), timeout)

    def unfetch_future(self, *, timeout: Optional[float] = None) -> concurrent.futures.Future[None]:
        """Like :meth:`unfetch`, returning a future at once."""
        return self._peer._submit(self._fetch.unfetch, timeout=timeout)

    def __enter__(self) -> SyncFetch:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fetch.active and not self._peer.closed:
            with contextlib.suppress(ConnectionClosed):
                self.unfetch()

    def __iter__(self) -> Iterator[FetchEvent]:
        if self._fetch.on_event is not None:
            raise LocalProtocolError("this fetch delivers to its callback; iterate a fetch made without one")
        return self

    def __next__(self) -> FetchEvent:
        try:
            return self.next(timeout=None)
        except StopAsyncIteration:
            raise StopIteration from None

    def next(self, timeout: Optional[float] = None) -> FetchEvent:
        """Return the next event, waiting at most ``timeout`` seconds (None: forever).

        Raises:
            TimeoutError: no event within ``timeout``.
            StopAsyncIteration: the fetch ended (``for`` loops see StopIteration).
            PeerError: ConnectionClosed or Overloaded when the fetch ended in failure.
        """
        if not self._buffer:
            self._peer._check_thread()
            future = self._inflight
            if future is None:
                if self._peer._loop.is_closed():
                    raise StopAsyncIteration
                future = self._inflight = self._peer._submit(self._fetch.next_batch)
            try:
                batch = future.result(timeout)
            except concurrent.futures.TimeoutError:
                # The wait on the peer's loop goes on; the next call picks it up, so
                # no event is lost to a timeout.
                raise TimeoutError(f"no fetch event within {timeout} s") from None
            finally:
                if future.done():
                    self._inflight = None
            batch.reverse()
            self._buffer = batch
        return self._buffer.pop()


class Peer:
    """A blocking, thread-safe jet peer running on a private event-loop thread.

    Args:
        host, port, name, timeout, reconnect, reconnect_min_delay,
        reconnect_max_delay, max_body, fetch_queue, user, password, ssl,
        info_timeout: as for :meth:`peer.PeerAsync.connect`.

    Raises:
        NotJetDaemon: the server is not a jet daemon (a ConnectionClosed).
        ConnectionClosed: the connection failed.
        Timeout: the daemon sent no INFO within ``timeout``.

    Use it as a context manager, or call :meth:`close`, which joins the thread.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, **options: Unpack[ConnectOptions]) -> None:
        self.timeout = options.get("timeout", DEFAULT_TIMEOUT)
        name = options.get("name")
        self.closed = False
        self._close_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        started: queue.Queue[None] = queue.Queue()
        self._thread = threading.Thread(
            target=self._run_loop, args=(started,), name=f"jet-peer-{name or 'peer'}", daemon=True
        )
        self._thread.start()
        started.get()
        connecting = asyncio.run_coroutine_threadsafe(PeerAsync.connect(host, port, **options), self._loop)
        try:
            self._aio: PeerAsync = connecting.result()
        except BaseException:
            # Interrupted (Ctrl-C) or failed: let the connect finish its cancellation on
            # the loop, or it is destroyed pending and Python prints its traceback at exit.
            connecting.cancel()
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_cancel_all_tasks(), self._loop).result(_RESULT_MARGIN)
            self._stop_thread()
            self.closed = True
            raise

    @classmethod
    def connect(cls, host: str = "127.0.0.1", port: int = DEFAULT_PORT, **options: Unpack[ConnectOptions]) -> Peer:
        """Same as ``Peer(host, port, **options)``, for symmetry with PeerAsync."""
        return cls(host, port, **options)

    def _run_loop(self, started: queue.Queue[None]) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(started.put, None)
        try:
            self._loop.run_forever()
        finally:
            asyncio.set_event_loop(None)

    def _stop_thread(self) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    # --- plumbing ---------------------------------------------------------------------

    def _check_thread(self) -> None:
        if threading.get_ident() == self._thread.ident:
            raise LocalProtocolError(
                "a blocking call on the peer's own thread (inside a handler or callback) "
                "would deadlock; use the *_future or *_nowait variant"
            )

    def _submit(
        self,
        function: Callable[..., Any],
        *args: Any,
        wrap: Optional[Callable[[Any], Any]] = None,
        **kwargs: Any,
    ) -> concurrent.futures.Future[Any]:
        """Run ``function(*args, **kwargs)`` on the peer's loop; if it returns an
        awaitable, the future resolves with its result (passed through ``wrap``)."""
        result: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self.closed:
            result.set_exception(ConnectionClosed("peer closed"))
            return result

        def settle(done: asyncio.Future[Any]) -> None:
            if done.cancelled():
                result.set_exception(concurrent.futures.CancelledError())
            elif (error := done.exception()) is not None:
                result.set_exception(error)
            else:
                try:
                    result.set_result(wrap(done.result()) if wrap is not None else done.result())
                except BaseException as exc:
                    result.set_exception(exc)

        def start() -> None:
            if not result.set_running_or_notify_cancel():
                return
            try:
                outcome = function(*args, **kwargs)
            except BaseException as exc:
                result.set_exception(exc)
                return
            if isinstance(outcome, Awaitable):
                task = asyncio.ensure_future(outcome)
                task.add_done_callback(settle)
                # A cancelled concurrent future cannot reach us once running; Future
                # semantics still allow cancel() before start.
            else:
                result.set_result(wrap(outcome) if wrap is not None else outcome)

        try:
            self._loop.call_soon_threadsafe(start)
        except RuntimeError:
            result = concurrent.futures.Future()
            result.set_exception(ConnectionClosed("peer closed"))
        return result

    def _wait(self, future: concurrent.futures.Future[T], timeout: Optional[float]) -> T:
        self._check_thread()
        limit = (self.timeout if timeout is None else timeout) + _RESULT_MARGIN
        try:
            return future.result(limit)
        except concurrent.futures.TimeoutError:
            raise ConnectionClosed("the peer's event loop stopped answering") from None

    def _call(self, function: Callable[..., Any], *args: Any, timeout: Optional[float] = None, **kwargs: Any) -> Any:
        self._check_thread()
        return self._wait(self._submit(function, *args, timeout=timeout, **kwargs), timeout)

    # --- properties -------------------------------------------------------------------

    @property
    def info(self) -> Info:
        """The daemon's INFO."""
        return self._aio.info

    @property
    def name(self) -> str:
        """The name this peer sent in its INFO."""
        return self._aio.name

    @property
    def connected(self) -> bool:
        """True while the link is up (and restored after a reconnect)."""
        return not self.closed and self._aio.connected

    @property
    def reconnects(self) -> int:
        """How many times the peer reconnected and restored itself."""
        return self._aio.reconnects

    # --- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection and join the peer's thread. Pending requests fail with
        :class:`ConnectionClosed`; fetch iterators end. Idempotent.

        Raises:
            LocalProtocolError: when called from a handler (the thread cannot join itself).
        """
        self._check_thread()
        with self._close_lock:
            if self.closed:
                return
            try:
                asyncio.run_coroutine_threadsafe(self._aio.close(), self._loop).result(self.timeout + _RESULT_MARGIN)
            finally:
                self.closed = True
                self._stop_thread()

    def wait_closed(self, timeout: Optional[float] = None) -> bool:
        """Block until the connection is lost for good (the daemon shut down, or the
        link dropped without ``reconnect``) or the peer is closed.

        Returns:
            True if it closed, False if ``timeout`` seconds passed first.
        """
        self._check_thread()
        if self.closed:
            return True
        future = self._submit(self._aio.wait_closed)
        try:
            future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return False
        except (ConnectionClosed, concurrent.futures.CancelledError):
            pass
        return True

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- client role ------------------------------------------------------------------

    def set(self, key: str, value: Any, *, timeout: Optional[float] = None) -> PythonValue:
        """Set state ``key``; return the value now in effect (PROTOCOL.md 6.3).

        Raises:
            PeerError: NotFound, WrongKind, Rejected (or the owner's status), Timeout,
                OwnerGone, LimitExceeded, ConnectionClosed.
        """
        return self._call(self._aio.set, key, value, timeout=timeout)  # type: ignore[no-any-return]

    def set_future(
        self, key: str, value: Any, *, timeout: Optional[float] = None
    ) -> concurrent.futures.Future[PythonValue]:
        """Like :meth:`set`, returning a future at once."""
        return self._submit(self._aio.set, key, value, timeout=timeout)

    def set_nowait(self, key: str, value: Any) -> None:
        """Fire-and-forget set (EVENT form, PROTOCOL.md 7.1)."""
        Value.of(value)  # refuse unmappable values here, in the caller's thread
        self._submit(self._aio.set_nowait, key, value)

    def call(self, key: str, args: Any = None, *, timeout: Optional[float] = None) -> PythonValue:
        """Call method ``key``; return its result (PROTOCOL.md 6.5).

        Raises:
            PeerError: NotFound, WrongKind, Rejected (or the owner's status), Timeout,
                OwnerGone, LimitExceeded, ConnectionClosed.
        """
        return self._call(self._aio.call, key, args, timeout=timeout)  # type: ignore[no-any-return]

    def call_future(
        self, key: str, args: Any = None, *, timeout: Optional[float] = None
    ) -> concurrent.futures.Future[PythonValue]:
        """Like :meth:`call`, returning a future at once."""
        return self._submit(self._aio.call, key, args, timeout=timeout)

    def call_nowait(self, key: str, args: Any = None) -> None:
        """Fire-and-forget call (EVENT form, PROTOCOL.md 7.1)."""
        Value.of(args)
        self._submit(self._aio.call_nowait, key, args)

    def get(self, key: str, *, timeout: Optional[float] = None) -> PythonValue:
        """Return the daemon's cached value of state ``key`` (PROTOCOL.md 6.10).

        Raises:
            PeerError: NotFound, WrongKind, Timeout, ConnectionClosed.
        """
        return self._call(self._aio.get, key, timeout=timeout)  # type: ignore[no-any-return]

    def get_future(self, key: str, *, timeout: Optional[float] = None) -> concurrent.futures.Future[PythonValue]:
        """Like :meth:`get`, returning a future at once."""
        return self._submit(self._aio.get, key, timeout=timeout)

    def get_raw(self, key: str, *, timeout: Optional[float] = None) -> Value:
        """Like :meth:`get`, returning the :class:`jetwire.Value` unmapped."""
        return self._call(self._aio.get_raw, key, timeout=timeout)  # type: ignore[no-any-return]

    def get_raw_future(self, key: str, *, timeout: Optional[float] = None) -> concurrent.futures.Future[Value]:
        """Like :meth:`get_raw`, returning a future at once."""
        return self._submit(self._aio.get_raw, key, timeout=timeout)

    def fetch(
        self, prefix: str = "", on_event: Optional[OnEvent] = None, *, timeout: Optional[float] = None, **query: Unpack[QueryOptions]
    ) -> SyncFetch:
        """Fetch the states whose key starts with ``prefix`` (PROTOCOL.md 6.8), or a query
        fetch with the query arguments of :meth:`peer.PeerAsync.fetch` (``match``,
        ``where``, ``sort_by``, ``descending``, ``top``, ``window``, ``methods``,
        ``nodes``; PROTOCOL.md 14.3).

        ``on_event`` runs on the peer's thread for every event, in order; without it,
        iterate the returned :class:`SyncFetch`.

        Raises:
            PeerError: LimitExceeded, InvalidQuery, Timeout, ConnectionClosed.
        """
        self._check_thread()
        return self._wait(self.fetch_future(prefix, on_event, timeout=timeout, **query), timeout)

    def fetch_future(
        self, prefix: str = "", on_event: Optional[OnEvent] = None, *, timeout: Optional[float] = None, **query: Unpack[QueryOptions]
    ) -> concurrent.futures.Future[SyncFetch]:
        """Like :meth:`fetch`, returning a future at once."""
        return self._submit(
            self._aio.fetch, prefix, on_event, timeout=timeout, wrap=lambda fetch: SyncFetch(self, fetch), **query
        )

    def query(self, prefix: str = "", *, timeout: Optional[float] = None, **query: Unpack[QueryOptions]) -> list[QueryResult]:
        """Answer a query once (QUERY_ONCE, PROTOCOL.md 14.4); arguments as
        :meth:`peer.PeerAsync.query`. Returns the entries in order.

        Raises:
            PeerError: InvalidQuery, LimitExceeded, TooLarge, Timeout, ConnectionClosed.
        """
        return self._call(self._aio.query, prefix, timeout=timeout, **query)  # type: ignore[no-any-return]

    # --- owner role -------------------------------------------------------------------

    def add_state(
        self, key: str, value: Any, *, on_set: Optional[OnSet] = None, timeout: Optional[float] = None
    ) -> SyncState:
        """Add a state owned by this peer (PROTOCOL.md 6.1); ``on_set`` runs on the
        peer's thread and follows the rules of :meth:`peer.PeerAsync.add_state`.

        Raises:
            PeerError: AlreadyExists, TooLarge, LimitExceeded, Timeout, ConnectionClosed.
        """
        self._check_thread()
        return self._wait(self.add_state_future(key, value, on_set=on_set, timeout=timeout), timeout)

    def add_state_future(
        self, key: str, value: Any, *, on_set: Optional[OnSet] = None, timeout: Optional[float] = None
    ) -> concurrent.futures.Future[SyncState]:
        """Like :meth:`add_state`, returning a future at once."""
        return self._submit(
            self._aio.add_state, key, value, on_set=on_set, timeout=timeout, wrap=lambda s: SyncState(self, s)
        )

    def add_method(self, key: str, handler: MethodHandler, *, timeout: Optional[float] = None) -> SyncMethod:
        """Add a method owned by this peer (PROTOCOL.md 6.6); ``handler`` runs on the
        peer's thread and its return value is the result.

        Raises:
            PeerError: AlreadyExists, TooLarge, LimitExceeded, Timeout, ConnectionClosed.
        """
        self._check_thread()
        return self._wait(self.add_method_future(key, handler, timeout=timeout), timeout)

    def add_method_future(
        self, key: str, handler: MethodHandler, *, timeout: Optional[float] = None
    ) -> concurrent.futures.Future[SyncMethod]:
        """Like :meth:`add_method`, returning a future at once."""
        return self._submit(
            self._aio.add_method, key, handler, timeout=timeout, wrap=lambda m: SyncMethod(self, m)
        )
