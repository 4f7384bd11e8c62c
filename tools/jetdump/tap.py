"""``jetdump tap``: a TCP proxy between peers and a daemon that shows every frame.

Bytes are forwarded first and decoded after, so the tap adds one proxy hop and nothing
for the decoding; flow control follows the slower side (reading from one side pauses
while the other side's write buffer is above its high-water mark). The printed lines go
through a bounded buffer (:class:`DroppingWriter`): a slow terminal loses lines, counted
and reported, and never slows the bus.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import IO
from typing import Optional
from typing import cast

from .events import Data
from .events import End
from .events import Event
from .events import Note
from .events import Open

DEFAULT_LISTEN_HOST = "127.0.0.1"
WRITE_HIGH_WATER = 1 << 20
WRITE_LOW_WATER = 256 * 1024

Sink = Callable[[Event], None]


class _Side(asyncio.Protocol):
    """One TCP connection of a proxied pair (the client's or the upstream's)."""

    def __init__(self, tap: _Pair, direction: int) -> None:
        self.tap = tap
        self.direction = direction  # direction of the bytes this side receives
        self.transport: Optional[asyncio.Transport] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)

    def data_received(self, data: bytes) -> None:
        self.tap.forward(self.direction, data)

    def eof_received(self) -> bool:
        self.tap.eof(self.direction)
        return True  # keep the other half open until it closes too

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.tap.lost(self.direction)

    def pause_writing(self) -> None:
        self.tap.other(self).pause()

    def resume_writing(self) -> None:
        self.tap.other(self).resume()

    def pause(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()


class _Pair:
    """A client connection and its upstream connection."""

    def __init__(self, stream: int, sink: Sink) -> None:
        self.stream = stream
        self.sink = sink
        self.client = _Side(self, 0)
        self.upstream = _Side(self, 1)
        self.ended = [False, False]
        self.early: list[bytes] = []  # bytes from the client before upstream is ready
        self.ready = False

    def upstream_ready(self) -> None:
        """The upstream connection is up: send what the client sent meanwhile, in order."""
        transport = self.upstream.transport
        if transport is not None and self.early:
            transport.write(b"".join(self.early))
        self.early.clear()
        self.ready = True

    def other(self, side: _Side) -> _Side:
        return self.upstream if side is self.client else self.client

    def forward(self, direction: int, data: bytes) -> None:
        target = self.upstream if direction == 0 else self.client
        if direction == 0 and not self.ready:
            self.early.append(data)  # keeps order until upstream_ready() flushes
        elif target.transport is not None:
            target.transport.write(data)  # forward first: decoding adds no latency
        self.sink(Data(self.stream, direction, time.time(), data))

    def eof(self, direction: int) -> None:
        target = self.upstream if direction == 0 else self.client
        if target.transport is not None and target.transport.can_write_eof():
            target.transport.write_eof()
        self._end(direction)

    def lost(self, direction: int) -> None:
        self._end(direction)
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.close()
        self._end(1 - direction)

    def _end(self, direction: int) -> None:
        if not self.ended[direction]:
            self.ended[direction] = True
            self.sink(End(self.stream, direction, time.time()))


async def serve_tap(
    listen_host: str,
    listen_port: int,
    upstream_host: str,
    upstream_port: int,
    sink: Sink,
    *,
    on_ready: Callable[[str, int], None] = lambda host, port: None,
    stop: Optional[asyncio.Event] = None,
) -> None:
    """Run the tap until ``stop`` is set (or SIGINT/SIGTERM when ``stop`` is None).

    Every accepted connection gets its own upstream connection and stream number; its
    events go to ``sink`` as they pass.
    """
    loop = asyncio.get_running_loop()
    counter = 0

    def accept() -> asyncio.Protocol:
        nonlocal counter
        pair = _Pair(counter, sink)
        counter += 1
        return _Accepted(pair, upstream_host, upstream_port)

    server = await loop.create_server(accept, listen_host, listen_port)
    host, port = server.sockets[0].getsockname()[:2]
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    on_ready(host, port)
    try:
        await stop.wait()
    finally:
        server.close()
        await server.wait_closed()


class _Accepted(_Side):
    """The client side: connects upstream before reading from the client."""

    def __init__(self, pair: _Pair, upstream_host: str, upstream_port: int) -> None:
        super().__init__(pair, 0)
        pair.client = self
        self.upstream_address = (upstream_host, upstream_port)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.transport.pause_reading()
        peer = transport.get_extra_info("peername")
        client_label = f"{peer[0]}:{peer[1]}" if peer else "client"
        host, port = self.upstream_address
        self.tap.sink(Open(self.tap.stream, (client_label, f"{host}:{port}")))
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        host, port = self.upstream_address
        try:
            await loop.create_connection(lambda: self.tap.upstream, host, port)
        except OSError as exc:
            self.tap.sink(Note(self.tap.stream, time.time(), "upstream-failed",
                               f"cannot connect to upstream {host}:{port}: {exc.strerror or exc}"))
            if self.transport is not None:
                self.transport.close()
            return
        if self.transport is not None and not self.transport.is_closing():
            self.tap.upstream_ready()
            self.transport.resume_reading()
        else:
            up = self.tap.upstream.transport
            if up is not None:
                up.close()


DEFAULT_OUTPUT_BUFFER = 8 << 20  # bytes of rendered output held for a slow terminal


class DroppingWriter:
    """A text stream for the tap's output that never blocks the event loop.

    ``write`` queues text for a writer thread and returns at once; when more than
    ``max_bytes`` would be waiting (the terminal or pipe is slower than the traffic), new
    text is dropped and its lines counted. When there is room again, a line made by
    ``note(count)`` says how many were lost, in the output where they would have been.
    """

    def __init__(self, stream: IO[str], note: Callable[[int], str], *,
                 max_bytes: int = DEFAULT_OUTPUT_BUFFER) -> None:
        self.stream = stream
        self.note = note
        self.max_bytes = max_bytes
        self.queued: deque[str] = deque()
        self.queued_bytes = 0
        self.pending_drops = 0  # lines dropped since the last note
        self.dropped = 0  # lines dropped in all
        self.closed = False
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="jetdump-tap-output", daemon=True)
        self.thread.start()

    def write(self, text: str) -> int:
        with self.cond:
            # One write larger than the whole buffer still goes out when nothing waits.
            if self.queued_bytes and self.queued_bytes + len(text) > self.max_bytes:
                lines = text.count("\n")
                self.pending_drops += lines
                self.dropped += lines
                return len(text)
            if self.pending_drops:
                notice = self.note(self.pending_drops) + "\n"
                self.pending_drops = 0
                self.queued.append(notice)
                self.queued_bytes += len(notice)
            self.queued.append(text)
            self.queued_bytes += len(text)
            self.cond.notify()
        return len(text)

    def flush(self) -> None:
        """Nothing to do: the writer thread writes as fast as the stream takes it."""

    def isatty(self) -> bool:
        return self.stream.isatty()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queued and not self.closed:
                    self.cond.wait()
                if not self.queued and self.closed:
                    return
                chunk = "".join(self.queued)
                self.queued.clear()
            try:
                self.stream.write(chunk)
                self.stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                with self.cond:
                    self.closed = True
                    self.queued.clear()
                return
            finally:
                with self.cond:
                    self.queued_bytes = max(0, self.queued_bytes - len(chunk))

    def close(self) -> None:
        """Write what is queued (and a last note of drops), then stop the thread."""
        with self.cond:
            if self.pending_drops:
                self.queued.append(self.note(self.pending_drops) + "\n")
                self.pending_drops = 0
            self.closed = True
            self.cond.notify()
        self.thread.join()
