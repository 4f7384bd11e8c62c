"""jetd (pure Python and compiled) against nats-server and the Python floor, CPU per
message (issue 19).

    python -m tools.bench.brokers [--repeat 5] [--messages 200000] [--compiled SITE]

The shapes of issue 19's table: fan-out of 16-byte payloads over 100 keys to 1, 10 and
50 subscribers (jet: NOTIFY_STATE events to FETCH_STATES fetchers; NATS: PUB to SUB
``k.>``), and request/reply with 100 in flight (jet: CALL_METHOD routed to an owner
peer that answers each with its own write; NATS: PUB with a reply inbox to a
responder). The broker runs pinned to CPU 0 (taskset), this load generator to CPU 1;
the broker's CPU (user + system, /proc) over the measured phase is divided by the
messages it delivered. Fan-out is paced in batches that every subscriber reads before
the next, so nothing is conflated. Medians of ``--repeat`` interleaved runs.

``--compiled SITE``: a directory holding the compiled jetd (an unpacked wheel of
``pip wheel .``; built on the fly into a temporary directory when not given, if it can
be). nats-server comes from Debian's package; without it its rows say so.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path

from jetwire import AddMethod
from jetwire import AddState
from jetwire import CallMethod
from jetwire import Decoder
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchStates
from jetwire import NotifyState
from jetwire import Response
from jetwire import Value
from jetwire import encode

from .daemon_procs import DaemonProcess
from .daemon_procs import _spawn

REPO = Path(__file__).resolve().parents[2]
PAYLOAD = b"0123456789abcdef"  # 16 bytes
KEYS = 100
BATCH = 1000  # fan-out events per paced batch (37 KB per subscriber: below any slow-consumer limit)
IN_FLIGHT = 100
BROKER_CPU, GENERATOR_CPU = 0, 1


def _pinned(cmd: list[str]) -> list[str]:
    return ["taskset", "-c", str(BROKER_CPU), *cmd] if shutil.which("taskset") else cmd


@contextlib.contextmanager
def jetd(source: Path) -> Iterator[DaemonProcess]:
    cmd = _pinned([sys.executable, "-m", "jetd", "--host", "127.0.0.1", "--port", "0", "--log-level", "WARNING"])
    env = {**os.environ, "PYTHONPATH": str(source), "PYTHONUNBUFFERED": "1"}
    with _spawn("jetd", cmd, "jetd listening on ", env, source) as daemon:
        yield daemon


@contextlib.contextmanager
def floor() -> Iterator[DaemonProcess]:
    """The Python floor (tools/bench/floor.py): cuts frames and relays them verbatim."""
    cmd = _pinned([sys.executable, "-m", "tools.bench.floor", "--host", "127.0.0.1", "--port", "0"])
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    with _spawn("floor", cmd, "floor listening on ", env, REPO) as daemon:
        yield daemon


@contextlib.contextmanager
def nats() -> Iterator[DaemonProcess]:
    """nats-server on a free port of 127.0.0.1 (it prints no line we can wait for on
    stdout, so the port is chosen here and polled)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = _pinned(["nats-server", "-a", "127.0.0.1", "-p", str(port)])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("nats-server did not start") from None
                time.sleep(0.05)
        yield DaemonProcess("nats", proc, "127.0.0.1", port, Path(os.devnull))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_exact(sock: socket.socket, size: int) -> None:
    while size > 0:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        size -= len(chunk)


def _read_until(sock: socket.socket, marker: bytes, have: bytes = b"") -> bytes:
    while marker not in have:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        have += chunk
    return have


# --- fan-out ---------------------------------------------------------------------------


def _jet_info(sock: socket.socket) -> None:
    decoder = Decoder()
    while decoder.next_message() is None:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the broker closed the connection before its INFO")
        decoder.receive_data(chunk)


def jet_fanout(daemon: DaemonProcess, subscribers: int, messages: int) -> float:
    owner = _connect(daemon.address)
    _jet_info(owner)
    owner.sendall(b"".join(encode(AddState(i, f"k/{i:02d}", Value.of(PAYLOAD))) for i in range(KEYS)))
    _read_exact(owner, KEYS * len(encode(Response(0))))
    subs = []
    for _ in range(subscribers):
        sock = _connect(daemon.address)
        _jet_info(sock)
        sock.sendall(encode(FetchStates(1, "k/")))
        _read_exact(sock, len(encode(Response(1, fetch_id=1))) + KEYS * len(encode(FetchAdd(1, "k/00", Value.of(PAYLOAD)))))
        subs.append(sock)
    batch = b"".join(encode(NotifyState(None, f"k/{i % KEYS:02d}", Value.of(PAYLOAD))) for i in range(BATCH))
    event = len(encode(FetchChange(1, "k/00", Value.of(PAYLOAD))))
    # The floor relays the NOTIFY_STATE frames as they came; jetd sends FETCH_CHANGE events.
    delivered = len(batch) if daemon.kind == "floor" else BATCH * event
    return _paced(daemon, owner, subs, batch, delivered, messages)


def nats_fanout(daemon: DaemonProcess, subscribers: int, messages: int) -> float:
    pub = _nats_connect(daemon)
    subs = []
    for _ in range(subscribers):
        sock = _nats_connect(daemon)
        sock.sendall(b"SUB k.> 1\r\nPING\r\n")
        _read_until(sock, b"PONG\r\n")
        subs.append(sock)
    batch = b"".join(b"PUB k.%02d 16\r\n%s\r\n" % (i % KEYS, PAYLOAD) for i in range(BATCH))
    delivered = sum(len(b"MSG k.%02d 1 16\r\n%s\r\n" % (i % KEYS, PAYLOAD)) for i in range(BATCH))
    return _paced(daemon, pub, subs, batch, delivered, messages)


def _nats_connect(daemon: DaemonProcess) -> socket.socket:
    sock = _connect(daemon.address)
    _read_until(sock, b"\r\n")  # INFO {...}
    sock.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
    _read_until(sock, b"PONG\r\n")
    return sock


def _paced(daemon: DaemonProcess, pub: socket.socket, subs: list[socket.socket], batch: bytes, batch_bytes: int,
           messages: int) -> float:
    """Send ``batch`` until ``messages`` are published, each batch read whole by every
    subscriber before the next; the broker's CPU per delivered message."""
    rounds = max(1, messages // BATCH)
    begin = daemon.cpu_seconds()
    for _ in range(rounds):
        pub.sendall(batch)
        for sock in subs:
            _read_exact(sock, batch_bytes)
    used = daemon.cpu_seconds() - begin
    for sock in [pub, *subs]:
        sock.close()
    return used / (rounds * BATCH * len(subs))


# --- request/reply ---------------------------------------------------------------------


def jet_request_reply(daemon: DaemonProcess, messages: int) -> float:
    owner = _connect(daemon.address)
    _jet_info(owner)
    owner.sendall(encode(AddMethod(1, "svc")))
    _read_exact(owner, len(encode(Response(1))))
    client = _connect(daemon.address)
    _jet_info(client)
    owner_decoder, client_decoder = Decoder(), Decoder()
    calls = [encode(CallMethod(i, "svc", Value.of(PAYLOAD))) for i in range(IN_FLIGHT)]

    def answer_routed() -> None:
        owner_decoder.receive_data(owner.recv(1 << 20))
        answers = [encode(Response(m.id, value=Value.of(PAYLOAD))) for m in owner_decoder.messages()
                   if isinstance(m, CallMethod) and m.id is not None]
        for frame in answers:  # each answer its own write, as real owners do
            owner.sendall(frame)

    def count_answers() -> int:
        client_decoder.receive_data(client.recv(1 << 20))
        return sum(1 for m in client_decoder.messages() if isinstance(m, Response))

    return _in_flight(daemon, client, owner, calls, answer_routed, count_answers, messages)


def nats_request_reply(daemon: DaemonProcess, messages: int) -> float:
    owner = _nats_connect(daemon)
    owner.sendall(b"SUB svc 1\r\nPING\r\n")
    _read_until(owner, b"PONG\r\n")
    client = _nats_connect(daemon)
    client.sendall(b"SUB _INBOX.r.* 2\r\nPING\r\n")
    _read_until(client, b"PONG\r\n")
    calls = [b"PUB svc _INBOX.r.%d 16\r\n%s\r\n" % (i, PAYLOAD) for i in range(IN_FLIGHT)]
    msg = re.compile(rb"MSG svc 1 (\S+) 16\r\n.{16}\r\n", re.S)
    pending = [b""]

    def answer_routed() -> None:
        data = pending[0] + owner.recv(1 << 20)
        last = 0
        for found in msg.finditer(data):
            owner.sendall(b"PUB %s 16\r\n%s\r\n" % (found.group(1), PAYLOAD))
            last = found.end()
        pending[0] = data[last:]

    reply = re.compile(rb"MSG \S+ 2 16\r\n.{16}\r\n", re.S)
    tail = [b""]

    def count_answers() -> int:
        data = tail[0] + client.recv(1 << 20)
        count = last = 0
        for found in reply.finditer(data):
            count += 1
            last = found.end()
        tail[0] = data[last:]
        return count

    return _in_flight(daemon, client, owner, calls, answer_routed, count_answers, messages)


def _in_flight(daemon: DaemonProcess, client: socket.socket, owner: socket.socket, calls: list[bytes],
               answer_routed: Callable[[], None], count_answers: Callable[[], int], messages: int) -> float:
    """Keep IN_FLIGHT requests outstanding until ``messages`` are answered; the broker's
    CPU per request."""
    selector = selectors.DefaultSelector()
    selector.register(owner, selectors.EVENT_READ, "owner")
    selector.register(client, selectors.EVENT_READ, "client")
    begin = daemon.cpu_seconds()
    sent = answered = 0
    client.sendall(b"".join(calls))
    sent = len(calls)
    deadline = time.monotonic() + 300
    while answered < messages:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{daemon.kind}: {answered} of {messages} answered in 300 s")
        for key, _ in selector.select(5):
            if key.data == "owner":
                answer_routed()
            else:
                got = count_answers()
                answered += got
                if sent < messages and got:
                    more = min(got, messages - sent)
                    client.sendall(b"".join(calls[(sent + i) % len(calls)] for i in range(more)))
                    sent += more
    used = daemon.cpu_seconds() - begin
    selector.close()
    owner.close()
    client.close()
    return used / answered


# --- the run ---------------------------------------------------------------------------


def build_compiled(into: Path) -> Path:
    """``pip wheel .`` (mypyc), unpacked: the compiled jetd and jetwire."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(into),
                    str(REPO)], check=True, env={k: v for k, v in os.environ.items() if k != "JET_PURE_PYTHON"})
    [wheel] = into.glob("jet-*.whl")
    site = into / "site"
    zipfile.ZipFile(wheel).extractall(site)
    if not list((site / "jetd").glob("core.*.so")):
        raise RuntimeError("the wheel has no compiled core (no C compiler?)")
    return site


def labelled_dir(text: str) -> tuple[str, Path]:
    """``LABEL=DIR`` of ``--also``: one more jetd, run from DIR."""
    label, sep, path = text.partition("=")
    if not sep or not label or not Path(path).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL=DIR with DIR a directory")
    return label, Path(path).resolve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="interleaved runs per row (median)")
    parser.add_argument("--messages", type=int, default=1_000_000, help="deliveries per fan-out run (requests: a quarter)")
    parser.add_argument("--compiled", type=Path, help="directory with the compiled jetd (default: build one)")
    parser.add_argument("--also", type=labelled_dir, action="append", default=[], metavar="LABEL=DIR",
                        help="one more jetd, run from DIR (a checkout or an unpacked wheel; repeatable)")
    args = parser.parse_args(argv)
    if shutil.which("taskset"):
        os.sched_setaffinity(0, {GENERATOR_CPU})
    with tempfile.TemporaryDirectory(prefix="bench-brokers-") as tmp:
        site = args.compiled or build_compiled(Path(tmp))
        brokers: dict[str, Callable[[], contextlib.AbstractContextManager[DaemonProcess]]] = {
            "jetd pure": lambda: jetd(REPO), "jetd compiled": lambda: jetd(site), "Python floor": floor}
        for label, directory in args.also:
            brokers[label] = lambda directory=directory: jetd(directory)  # type: ignore[misc]
        if shutil.which("nats-server"):
            brokers["nats-server"] = nats
        else:
            print("nats-server is not installed (apt-get install nats-server): its column is missing", file=sys.stderr)
        rows: dict[str, Callable[[DaemonProcess], float]] = {}
        messages = args.messages

        def fanout(subs: int) -> Callable[[DaemonProcess], float]:
            def measure(d: DaemonProcess) -> float:
                return (nats_fanout if d.kind == "nats" else jet_fanout)(d, subs, messages // subs)
            return measure

        for subs in (1, 10, 50):
            rows[f"fan-out, {subs} subscriber{'s' if subs > 1 else ''}"] = fanout(subs)
        rows["request/reply, 100 in flight"] = (
            lambda d: (nats_request_reply if d.kind == "nats" else jet_request_reply)(d, args.messages // 4))
        results: dict[tuple[str, str], list[float]] = {}
        for run in range(args.repeat):
            for row, measure in rows.items():
                for name, start in brokers.items():
                    with start() as daemon:
                        results.setdefault((row, name), []).append(measure(daemon) * 1e6)
            print(f"run {run + 1} of {args.repeat} done", file=sys.stderr, flush=True)
    names = list(brokers)
    print(f"\nbroker CPU per delivered message (µs), medians of {args.repeat} interleaved runs; broker on CPU "
          f"{BROKER_CPU}, generator on CPU {GENERATOR_CPU}\n")
    pairs = (("jetd pure", "jetd compiled"), ("jetd compiled", "nats-server"), ("jetd compiled", "Python floor"))
    ratios = [f"{a} / {b}" for a, b in pairs if b in names]
    print("| shape | " + " | ".join(names) + " | " + " | ".join(ratios) + " |")
    print("|---|" + "---:|" * (len(names) + len(ratios)))
    for row in rows:
        med = {name: statistics.median(results[(row, name)]) for name in names}
        cells = [f"{med[n]:.3f}" for n in names]
        cells += [f"{med[a] / med[b]:.2f}" for a, b in pairs if b in names]
        print(f"| {row} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
