"""WebSocket peers against TCP peers (issue 16): W1 and W2 of the daemon benchmark with the
requester, or the fetchers, on jetd's WebSocket endpoint (PROTOCOL.md 13) instead of TCP,
side by side in one run, daemon CPU per message from /proc.

The workloads are the daemon benchmark's own (:mod:`tools.bench.daemon_workloads`); only
the connections named ``w1-requester`` and ``fetcher-N`` are opened over WebSocket, by a
small Python WebSocket client (:class:`WsSocket`, the sans-IO ``websockets`` protocol
over a plain socket) that looks like a socket to the benchmark's pump. The daemon is
pinned to core 0 and this generator to core 1 (NOTES.md: pinning makes CPU per message
far steadier than rates). TCP and WebSocket runs alternate, on one daemon per run.

    python -m tools.bench.web [--repeat N] [--window S] [--json FILE]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any
from typing import Optional

from websockets.frames import Frame
from websockets.frames import Opcode
from websockets.protocol import OPEN
from websockets.protocol import Protocol
from websockets.protocol import Side

from tools.procs import stop_process

from . import daemon_workloads
from .daemon_load import connect as tcp_connect
from .daemon_load import loopback_socket
from .daemon_procs import REPO
from .daemon_procs import SHUTDOWN_TIMEOUT
from .daemon_procs import DaemonProcess
from .daemon_procs import _exit_stats
from .daemon_wire import BenchError
from .daemon_wire import Dialect
from .daemon_wire import JetDialect
from .daemon_workloads import Sample
from .daemon_workloads import Sizes
from .daemon_workloads import w1_routed_set
from .daemon_workloads import w2_fanout

IO_TIMEOUT = 30.0


class WsSocket:
    """A jet connection over WebSocket that quacks like the socket the benchmark's pump
    and helpers use: ``send``/``sendall`` frame jet bytes as one masked binary message,
    ``recv`` returns the payloads of the binary messages received (raising
    BlockingIOError in non-blocking mode while no whole message is in)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.ws = Protocol(Side.CLIENT, state=OPEN, max_size=None)
        self.blocking = True
        self.timeout: Optional[float] = IO_TIMEOUT

    # --- socket API used by the benchmark -----------------------------------------------

    def fileno(self) -> int:
        return self.sock.fileno()

    def setblocking(self, flag: bool) -> None:
        self.blocking = flag
        self.sock.setblocking(flag)
        if flag:
            self.sock.settimeout(self.timeout)

    def settimeout(self, timeout: Optional[float]) -> None:
        self.timeout = timeout
        self.blocking = timeout != 0
        self.sock.settimeout(timeout)

    def send(self, data: Any) -> int:
        frame = Frame(Opcode.BINARY, bytes(data)).serialize(mask=True, extensions=[])
        if self.blocking:
            self.sock.sendall(frame)
        else:
            # Writes here are small (sets released by responses, one fetch request): send
            # the whole message, blocking briefly if the kernel buffer is full.
            self.sock.settimeout(IO_TIMEOUT)
            try:
                self.sock.sendall(frame)
            finally:
                self.sock.setblocking(False)
        return len(data)

    def sendall(self, data: Any) -> None:
        self.send(data)

    def recv(self, size: int) -> bytes:
        while True:
            data = self.sock.recv(size)  # BlockingIOError passes through in non-blocking mode
            if not data:
                return b""
            self.ws.receive_data(data)
            payload = [f.data for f in self.ws.events_received()
                       if isinstance(f, Frame) and f.opcode in (Opcode.BINARY, Opcode.CONT)]
            for out in self.ws.data_to_send():
                if out:
                    self.sock.sendall(out)
            if payload:
                return b"".join(payload)
            if not self.blocking:
                raise BlockingIOError

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WsSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ws_connect(daemon: DaemonProcess, dialect: Dialect, name: str, *, rcvbuf: Optional[int] = None,
               sndbuf: Optional[int] = None) -> WsSocket:
    """Like :func:`tools.bench.daemon_load.connect`, over the daemon's /jet endpoint."""
    port: int = daemon.web_port  # type: ignore[attr-defined]
    sock = loopback_socket(port, rcvbuf=rcvbuf, sndbuf=sndbuf)
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            (f"GET /jet HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: jet\r\n\r\n").encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                raise BenchError("daemon closed the WebSocket handshake")
            head += chunk
        status_line, _, _ = head.partition(b"\r\n")
        if b" 101 " not in status_line:
            raise BenchError(f"WebSocket handshake refused: {status_line!r}")
        ws = WsSocket(sock)
        rest = head.partition(b"\r\n\r\n")[2]
        stream = b""
        if rest:
            ws.ws.receive_data(rest)
            stream = b"".join(f.data for f in ws.ws.events_received() if isinstance(f, Frame))
        # The daemon's INFO first (PROTOCOL.md 13.1): read it whole, nothing more.
        while len(stream) < 5 or len(stream) < 5 + int.from_bytes(stream[1:5], "big"):
            stream += ws.recv(65536)
        if stream[0] != 4 or len(stream) != 5 + int.from_bytes(stream[1:5], "big"):
            raise BenchError("the daemon's first WebSocket data is not exactly its INFO")
        hello = dialect.hello(name)
        if hello:
            ws.sendall(hello)
    except BaseException:
        sock.close()
        raise
    return ws


@contextlib.contextmanager
def start_jetd_web(pin: Optional[int]) -> Iterator[DaemonProcess]:
    """jetd with ``--http-port 0``, pinned to core ``pin``; its ``web_port`` is set."""
    cmd = [sys.executable, "-m", "jetd", "--host", "127.0.0.1", "--port", "0", "--http-port", "0"]
    if pin is not None:
        cmd = ["taskset", "-c", str(pin), *cmd]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory(prefix="bench-web-") as tmp:
        stderr_path = Path(tmp) / "stderr"
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, cwd=REPO)
        try:
            out = b""
            deadline = time.monotonic() + 20
            assert proc.stdout is not None
            with selectors.DefaultSelector() as selector:
                selector.register(proc.stdout, selectors.EVENT_READ)
                while out.count(b"\n") < 2:
                    if time.monotonic() > deadline or not selector.select(deadline - time.monotonic()):
                        raise BenchError(f"jetd did not start: {stderr_path.read_text()[-2000:]}")
                    chunk = os.read(proc.stdout.fileno(), 256)
                    if not chunk:
                        raise BenchError(f"jetd exited: {stderr_path.read_text()[-2000:]}")
                    out += chunk
            first, second = out.decode().splitlines()[:2]
            tcp_port = int(first.rpartition(":")[2])
            web_port = int(second.rstrip("/").rpartition(":")[2])
            daemon = DaemonProcess("jetd", proc, "127.0.0.1", tcp_port, stderr_path)
            daemon.web_port = web_port  # type: ignore[attr-defined]
            yield daemon
        finally:
            stop_process(proc, SHUTDOWN_TIMEOUT)
        daemon.exit_stats = _exit_stats(stderr_path)


def _connect_over(transport: str) -> Any:
    """A ``connect`` for the workloads that opens the requester and the fetchers over
    ``transport`` and everything else (owners) over TCP."""

    def connect(daemon: DaemonProcess, dialect: Dialect, name: str, **kwargs: Any) -> Any:
        if transport == "ws" and (name == "w1-requester" or name.startswith("fetcher-")):
            return ws_connect(daemon, dialect, name, **kwargs)
        return tcp_connect(daemon, dialect, name, **kwargs)

    return connect


def run(sizes: Sizes, pin: bool) -> dict[tuple[str, str, str], list[float]]:
    """Alternate TCP and WebSocket runs of W1 and W2; returns samples by (transport, workload, metric)."""
    results: dict[tuple[str, str, str], list[float]] = {}
    dialect = JetDialect()
    if pin:
        os.sched_setaffinity(0, {1})
    one = replace(sizes, repeat=1)
    for rep in range(sizes.repeat):
        for transport in (("tcp", "ws") if rep % 2 == 0 else ("ws", "tcp")):
            # The workloads look their connect() up at call time: swap it for this run.
            setattr(daemon_workloads, "connect", _connect_over(transport))  # noqa: B010
            try:
                for workload in (w1_routed_set, w2_fanout):
                    samples: list[Sample] = workload(lambda: start_jetd_web(0 if pin else None), dialect, one)
                    for sample in samples:
                        results.setdefault((transport, sample.workload, f"{sample.metric} [{sample.unit}]"), []).extend(
                            sample.values
                        )
            finally:
                setattr(daemon_workloads, "connect", tcp_connect)  # noqa: B010
            print(f"  rep {rep + 1}/{sizes.repeat} {transport} done", file=sys.stderr, flush=True)
    return results


WANTED = (
    ("W1 routed set", "daemon CPU per routed set [µs]"),
    ("W1 routed set", "pipelined (100 in flight) sets/s [/s]"),
    ("W1 routed set", "sequential round trip p50 [µs]"),
    ("W2 fan-out", "1 fetchers: daemon CPU per delivered event [µs]"),
    ("W2 fan-out", "1 fetchers: delivered events/s [/s]"),
    ("W2 fan-out", "10 fetchers: daemon CPU per delivered event [µs]"),
    ("W2 fan-out", "10 fetchers: delivered events/s [/s]"),
)


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 1000 else f"{x:.2f}"


def report(results: dict[tuple[str, str, str], list[float]]) -> str:
    """A Markdown table: median over the repetitions for TCP and WebSocket, and WS/TCP."""
    lines = ["| workload | metric | TCP | WebSocket | WS / TCP |", "|---|---|---|---|---|"]
    for workload, metric in WANTED:
        tcp = results.get(("tcp", workload, metric))
        ws = results.get(("ws", workload, metric))
        if not tcp or not ws:
            continue
        t, w = statistics.median(tcp), statistics.median(ws)
        lines.append(f"| {workload} | {metric} | {_fmt(t)} | {_fmt(w)} | {w / t:.2f} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="alternating TCP/WebSocket runs (default 5)")
    parser.add_argument("--window", type=float, default=1.5, help="seconds per measured window (default 1.5)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the daemon (core 0) and generator (core 1)")
    parser.add_argument("--json", type=Path, help="also write every sample to this JSON file")
    args = parser.parse_args(argv)
    sizes = replace(Sizes(), repeat=args.repeat, window=args.window, w1_sequential=2000, w2_fetchers=(1, 10))
    pin = not args.no_pin and len(os.sched_getaffinity(0)) >= 2
    try:
        results = run(sizes, pin)
    except BenchError as exc:
        print(f"bench web: {exc}", file=sys.stderr)
        return 1
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps([{"transport": t, "workload": w, "metric": m, "values": v}
                                         for (t, w, m), v in results.items()], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
