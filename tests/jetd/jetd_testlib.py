"""A raw TCP jet peer for the jetd tests: blocking sockets + jetwire, nothing else."""

from __future__ import annotations

import socket
import struct
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any
from typing import Optional

from jetwire import AddState
from jetwire import Close
from jetwire import Decoder
from jetwire import FetchStates
from jetwire import Info
from jetwire import Message
from jetwire import Request
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import encode
from jetwire.log import LogHeader
from jetwire.log import LogKind
from jetwire.log import LogRecord
from jetwire.log import iter_log
from jetwire.log import parse_record_data

DEFAULT_TIMEOUT = 5.0


class PeerClosed(Exception):
    """The daemon closed the connection (EOF or reset)."""


class FramedPeer:
    """What the tests' jet peers share, whatever carries their bytes: request ids, the
    INFO exchange, reading the next message and waiting for one. A subclass says how
    bytes go out (``write``) and come in (``read``)."""

    def __init__(self) -> None:
        self.decoder = Decoder(max_body=64 * 1024 * 1024)
        self._next_id = 1
        self.info: Optional[Info] = None

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def read(self, deadline: float, timeout: float) -> Optional[bytes]:
        """Bytes from the daemon until ``deadline`` (``time.monotonic()``), None if none
        came yet; raises at the end of the connection or once the deadline passed."""
        raise NotImplementedError

    def start(self, name: Optional[str], read_info: bool) -> None:
        """Read the daemon's INFO (PROTOCOL.md 4) if ``read_info``; send ours if named."""
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
        self.write(b"".join(encode(m) for m in messages))

    def recv(self, timeout: float = DEFAULT_TIMEOUT) -> Message:
        """The next message; what ``read`` raises at the end or on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            message = self.decoder.next_message()
            if message is not None:
                return message
            data = self.read(deadline, timeout)
            if data is not None:
                self.decoder.receive_data(data)

    def recv_until(self, match: Callable[[Message], bool], timeout: float = DEFAULT_TIMEOUT) -> tuple[Message, list[Message]]:
        """Read until ``match``; returns the match and the messages before it."""
        skipped: list[Message] = []
        deadline = time.monotonic() + timeout
        while True:
            message = self.recv(max(0.01, deadline - time.monotonic()))
            if match(message):
                return message, skipped
            skipped.append(message)

    def request(self, make: Callable[[int], Request], timeout: float = DEFAULT_TIMEOUT) -> Response:
        """Send ``make(id)`` and return its response (it must be the next message)."""
        rid = self.next_id()
        self.send(make(rid))
        message = self.recv(timeout)
        assert isinstance(message, Response) and message.id == rid, message
        return message


class RawPeer(FramedPeer):
    """One connection to jetd on 127.0.0.1; reads the daemon's INFO at once. ``recv``
    raises PeerClosed at EOF, AssertionError on timeout."""

    def __init__(
        self,
        address: tuple[str, int],
        name: Optional[str] = None,
        *,
        rcvbuf: Optional[int] = None,
        read_info: bool = True,
    ) -> None:
        assert address[0] == "127.0.0.1"
        super().__init__()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(DEFAULT_TIMEOUT)
        self.sock.connect(address)
        self.eof = False
        self.start(name, read_info)

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, deadline: float, timeout: float) -> Optional[bytes]:
        if self.eof:
            raise PeerClosed("daemon closed the connection")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no message from jetd within {timeout} s")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return None
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
        return data

    def recv_n(self, n: int, timeout: float = DEFAULT_TIMEOUT) -> list[Message]:
        return [self.recv(timeout) for _ in range(n)]

    def nothing_within(self, seconds: float) -> None:
        """Assert that no message arrives within ``seconds``."""
        try:
            message = self.recv(seconds)
        except AssertionError:
            return
        raise AssertionError(f"unexpected message {message}")

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


def routed_set(address: tuple[str, int]) -> tuple[RawPeer, RawPeer, Request]:
    """An owner of state "k" (1) and a client whose SET_STATE id 1 of "k" to 2 has been
    routed to it, not answered yet; returns (owner, client, the routed request)."""
    owner = RawPeer(address)
    client = RawPeer(address)
    owner.request(lambda rid: AddState(rid, "k", v(1)))
    client.send(SetState(1, "k", v(2)))
    routed = owner.recv()
    assert isinstance(routed, SetState), routed
    return owner, client, routed


def fetching(address: tuple[str, int], key: str, value: Any, prefix: str) -> tuple[RawPeer, RawPeer, int]:
    """An owner of state ``key`` and a peer fetching ``prefix`` that has read the
    initial add; returns (owner, fetcher, fetch id)."""
    owner = RawPeer(address)
    owner.request(lambda rid: AddState(rid, key, v(value)))
    fetcher = RawPeer(address)
    fetch_id = fetcher.request(lambda rid: FetchStates(rid, prefix)).fetch_id
    assert fetch_id is not None
    fetcher.recv()
    return owner, fetcher, fetch_id


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """A memory figure of a process from /proc, KiB: VmRSS (resident now), VmHWM (its
    peak)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field}")


_U32 = struct.Struct(">I")
_REQUEST, _RESPONSE = 1, 2


def log_records(*directories: Path) -> list[LogRecord]:
    """Every record of every segment of ``directories``, in order (a truncated last
    record is allowed: a SIGKILL or a failed write ends a segment in one)."""
    records: list[LogRecord] = []
    for directory in directories:
        for path in sorted(directory.glob("jet-*.jetlog")):
            with open(path, "rb") as stream:
                items = list(iter_log(stream))
            assert isinstance(items[0], LogHeader)
            records.extend(i for i in items[1:] if isinstance(i, LogRecord))
    return records


def logged_ids(*directories: Path) -> tuple[dict[str, set[int]], dict[str, set[int]]]:
    """Per peer name: the ids of the REQUEST frames logged as received from it, and of
    the RESPONSE frames logged as sent to it, over every segment of ``directories``. A
    connection's name comes from its CONN_NAME or a segment's CONN_SNAPSHOT."""
    records = log_records(*directories)
    names: dict[int, str] = {}
    for r in records:
        if r.kind in (LogKind.CONN_NAME, LogKind.CONN_SNAPSHOT):
            name = str(parse_record_data(r.kind, r.data)["name"])
            if name:
                names[r.conn_id] = name
    requests: dict[str, set[int]] = defaultdict(set)
    responses: dict[str, set[int]] = defaultdict(set)
    for record in records:
        name = names.get(record.conn_id)
        if name is None or len(record.data) < 9:
            continue
        if record.kind == LogKind.FRAME_IN and record.data[0] == _REQUEST:
            requests[name].add(_U32.unpack_from(record.data, 5)[0])
        elif record.kind == LogKind.FRAME_OUT and record.data[0] == _RESPONSE:
            responses[name].add(_U32.unpack_from(record.data, 5)[0])
    return requests, responses
