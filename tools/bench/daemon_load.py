"""Load-generator plumbing for the daemon benchmark: connections and a non-blocking pump.

Everything runs in one process with plain sockets and a ``selectors`` loop: the hot
paths only scan frame headers (see :mod:`tools.bench.daemon_wire`), which leaves the
daemon, not the generator, as the thing being measured. Every loop is bounded by a
deadline.
"""

from __future__ import annotations

import selectors
import socket
import struct
import time
from collections.abc import Callable
from collections.abc import Sequence

from .daemon_procs import DaemonProcess
from .daemon_wire import BenchError
from .daemon_wire import Dialect
from .daemon_wire import ResponseScanner

IO_TIMEOUT = 30.0
RECV_SIZE = 1 << 20
_HEADER = struct.Struct(">BI")


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise BenchError("daemon closed the connection")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def loopback_socket(port: int, *, rcvbuf: int | None = None, sndbuf: int | None = None) -> socket.socket:
    """A blocking TCP connection to 127.0.0.1:``port`` with TCP_NODELAY and IO_TIMEOUT;
    ``rcvbuf``/``sndbuf`` set SO_RCVBUF/SO_SNDBUF before connecting."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if sndbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(IO_TIMEOUT)
        sock.connect(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock


def connect(daemon: DaemonProcess, dialect: Dialect, name: str, *, rcvbuf: int | None = None,
            sndbuf: int | None = None) -> socket.socket:
    """Open a blocking connection to the daemon on 127.0.0.1 and say hello.

    For jet the daemon's INFO is read here, so the socket is at a frame boundary after.
    ``rcvbuf`` sets SO_RCVBUF before connecting (a deliberately slow consumer);
    ``sndbuf`` bounds SO_SNDBUF (a flooding owner then queues little in the kernel).
    """
    if daemon.host != "127.0.0.1":
        raise BenchError(f"refusing to load anything but 127.0.0.1, got {daemon.host}")
    sock = loopback_socket(daemon.port, rcvbuf=rcvbuf, sndbuf=sndbuf)
    try:
        hello = dialect.hello(name)
        if hello:
            sock.sendall(hello)
        if dialect.greets():
            ftype, length = _HEADER.unpack(_recv_exact(sock, 5))
            if ftype != 4:
                raise BenchError(f"daemon's first frame is type {ftype}, not INFO")
            _recv_exact(sock, length)
    except BaseException:
        sock.close()
        raise
    return sock


def wait_responses(sock: socket.socket, scanner: ResponseScanner, count: int, deadline: float) -> None:
    """Read from a blocking socket until ``scanner`` has seen ``count`` responses.

    Raises:
        BenchError: an error response, the daemon closing, or the deadline passing.
    """
    while scanner.ok + scanner.errors < count:
        if scanner.errors:
            raise BenchError(f"error response: {scanner.first_error[:200]!r}")
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for responses ({scanner.ok}/{count})")
        data = sock.recv(RECV_SIZE)
        if not data:
            raise BenchError("daemon closed the connection")
        scanner.feed(data)
    if scanner.errors:
        raise BenchError(f"error response: {scanner.first_error[:200]!r}")


def add_states(sock: socket.socket, dialect: Dialect, keys: Sequence[str], values: Sequence[int], *,
               batch: int = 1000, timeout: float = 300.0) -> None:
    """Add states over one connection, keeping at most two batches of requests in flight."""
    scanner = dialect.response_scanner()
    deadline = time.monotonic() + timeout
    sent = 0
    for start in range(0, len(keys), batch):
        chunk = dialect.add_states(start + 1, keys[start : start + batch], values[start : start + batch])
        sock.sendall(chunk)
        sent += len(keys[start : start + batch])
        wait_responses(sock, scanner, sent - batch, deadline)
    wait_responses(sock, scanner, sent, deadline)


class Channel:
    """One non-blocking socket in a :class:`Pump`.

    ``on_data(bytes) -> bytes | None`` handles received bytes and may return bytes to
    send; ``produce() -> bytes`` is asked for more whenever the socket can take it (a
    peer that sends as fast as the daemon reads).
    """

    def __init__(self, sock: socket.socket, on_data: Callable[[bytes], bytes | None] | None = None,
                 produce: Callable[[], bytes] | None = None) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.on_data = on_data
        self.produce = produce
        self.pending = memoryview(b"")
        self.sent_bytes = 0
        self._pump: Pump | None = None

    def write(self, data: bytes) -> None:
        """Send now as far as the socket takes it; queue the rest."""
        if self.pending:
            self.pending = memoryview(bytes(self.pending) + data)
        else:
            self.pending = memoryview(data)
            self.flush()
        if self._pump is not None:
            self._pump.watch(self)

    def flush(self) -> None:
        """Send queued bytes (and produced ones) until the socket would block."""
        while True:
            if not self.pending:
                if self.produce is None:
                    return
                self.pending = memoryview(self.produce())
            try:
                sent = self.sock.send(self.pending)
            except BlockingIOError:
                return
            self.sent_bytes += sent
            self.pending = self.pending[sent:]
            if self.pending:
                return

    def wants_write(self) -> bool:
        return bool(self.pending) or self.produce is not None


class Pump:
    """A selectors loop over :class:`Channel` objects, run in bounded slices."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._masks: dict[int, int] = {}

    def add(self, channel: Channel) -> Channel:
        """Start serving ``channel``."""
        channel._pump = self
        mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if channel.wants_write() else 0)
        self._selector.register(channel.sock, mask, channel)
        self._masks[channel.sock.fileno()] = mask
        return channel

    def watch(self, channel: Channel) -> None:
        """Update the write interest of ``channel`` after its queue changed."""
        mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if channel.wants_write() else 0)
        fd = channel.sock.fileno()
        if self._masks.get(fd) != mask:
            self._selector.modify(channel.sock, mask, channel)
            self._masks[fd] = mask

    def remove(self, channel: Channel) -> None:
        """Stop serving ``channel`` (the socket stays open)."""
        self._selector.unregister(channel.sock)
        self._masks.pop(channel.sock.fileno(), None)
        channel._pump = None

    def run_until(self, deadline: float, done: Callable[[], bool] | None = None, *, busy_poll: bool = False) -> None:
        """Serve every channel until ``deadline`` (time.perf_counter) or until ``done()``.

        ``busy_poll``: poll without sleeping, so this process never waits to be woken up
        (on an idle machine a wake-up costs tens of µs: NOTES.md); it then uses a whole core.

        Raises:
            BenchError: a daemon closed a connection.
        """
        select = self._selector.select
        while True:
            now = time.perf_counter()
            if now >= deadline or (done is not None and done()):
                return
            for key, mask in select(0 if busy_poll else min(0.05, deadline - now)):
                channel: Channel = key.data
                if mask & selectors.EVENT_READ:
                    try:
                        data = channel.sock.recv(RECV_SIZE)
                    except BlockingIOError:
                        data = None
                    except ConnectionError as exc:
                        raise BenchError(f"connection lost: {exc}") from None
                    if data == b"":
                        raise BenchError("daemon closed a connection")
                    if data and channel.on_data is not None:
                        out = channel.on_data(data)
                        if out:
                            channel.write(out)
                if mask & selectors.EVENT_WRITE:
                    try:
                        channel.flush()
                    except ConnectionError as exc:
                        raise BenchError(f"connection lost: {exc}") from None
                    self.watch(channel)

    def close(self) -> None:
        """Release the selector (sockets are closed by their owners)."""
        self._selector.close()
