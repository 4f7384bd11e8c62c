"""A raw TCP jet peer for the jetd tests: blocking sockets + jetwire, nothing else."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, Optional

from jetwire import (
    Close,
    Decoder,
    Info,
    Message,
    Request,
    Response,
    Status,
    Value,
    encode,
)

DEFAULT_TIMEOUT = 5.0


class PeerClosed(Exception):
    """The daemon closed the connection (EOF or reset)."""


class RawPeer:
    """One connection to jetd on 127.0.0.1; reads the daemon's INFO at once."""

    def __init__(
        self,
        address: tuple[str, int],
        name: Optional[str] = None,
        *,
        rcvbuf: Optional[int] = None,
        read_info: bool = True,
    ) -> None:
        assert address[0] == "127.0.0.1"
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(DEFAULT_TIMEOUT)
        self.sock.connect(address)
        self.decoder = Decoder(max_body=64 * 1024 * 1024)
        self.eof = False
        self._next_id = 1
        self.info: Optional[Info] = None
        if read_info:
            first = self.recv()
            assert isinstance(first, Info), first
            self.info = first
        if name is not None:
            self.send(Info(name))

    def next_id(self) -> int:
        rid = self._next_id
        self._next_id += 1
        return rid

    def send(self, *messages: Message) -> None:
        self.sock.sendall(b"".join(encode(m) for m in messages))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = DEFAULT_TIMEOUT) -> Message:
        """The next message; raises PeerClosed at EOF, AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            message = self.decoder.next_message()
            if message is not None:
                return message
            if self.eof:
                raise PeerClosed("daemon closed the connection")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no message from jetd within {timeout} s")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
            self.decoder.receive_data(data)

    def recv_n(self, n: int, timeout: float = DEFAULT_TIMEOUT) -> list[Message]:
        return [self.recv(timeout) for _ in range(n)]

    def recv_until(self, match: Callable[[Message], bool], timeout: float = DEFAULT_TIMEOUT) -> tuple[Message, list[Message]]:
        """Read until ``match``; returns the match and the messages before it."""
        skipped: list[Message] = []
        deadline = time.monotonic() + timeout
        while True:
            message = self.recv(max(0.01, deadline - time.monotonic()))
            if match(message):
                return message, skipped
            skipped.append(message)

    def nothing_within(self, seconds: float) -> None:
        """Assert that no message arrives within ``seconds``."""
        try:
            message = self.recv(seconds)
        except AssertionError:
            return
        raise AssertionError(f"unexpected message {message}")

    def request(self, make: Callable[[int], Request], timeout: float = DEFAULT_TIMEOUT) -> Response:
        """Send ``make(id)`` and return its response (it must be the next message)."""
        rid = self.next_id()
        self.send(make(rid))
        message = self.recv(timeout)
        assert isinstance(message, Response) and message.id == rid, message
        return message

    def expect_close(self, status: Status, timeout: float = DEFAULT_TIMEOUT) -> Close:
        """The next message is CLOSE with ``status``, then EOF."""
        message = self.recv(timeout)
        assert isinstance(message, Close), message
        assert message.status == status, message
        self.expect_eof(timeout)
        return message

    def expect_eof(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        try:
            message = self.recv(timeout)
        except PeerClosed:
            return
        raise AssertionError(f"expected EOF, got {message}")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawPeer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def v(obj: Any) -> Value:
    return Value.of(obj)


def rss_kib(pid: int) -> int:
    """VmRSS of a process, KiB (from /proc)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")
