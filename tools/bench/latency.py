"""Latency through the broker at a fixed rate, jetd against nats-server (issue 29:
slicing costs no latency).

    python -m tools.bench.latency [--repeat 5] [--seconds 5] [--compiled SITE] [--also LABEL=DIR] [--busy]

Two shapes, paced open loop (the generator sends on a clock, never waiting for answers):

- ``events``: 10,000 events/s of 16 bytes over 100 keys to one fetcher (jet: the owner's
  NOTIFY_STATE, delivered as FETCH_CHANGE; NATS: PUB to a SUB ``k.>``);
- ``routed``: 20,000 requests/s (jet: SET_STATE routed to the state's owner peer, which
  answers each; ``--routed call``: CALL_METHOD; NATS: request/reply through an inbox).

The latency of a message runs from the write that sent it to the read that got it (its
answer, for requests), both in this process; p50, p99 and max per run, and the broker's
CPU per message (user + system from /proc over the paced phase). The broker runs pinned
to CPU 0, this generator (owner, fetcher and client in one loop) to CPU 1, as in
:mod:`tools.bench.brokers`. Rows are medians of ``--repeat`` interleaved runs. Every row
carries the 1-minute load average at the end of its runs: the machine may be shared,
and the generator's own CPU share over the paced phase (it should stay well below 100%,
or the generator is what is measured).

``--busy``: two spinners (``yes > /dev/null``, unpinned) run for the whole run and are
stopped at its end, so the brokers compete with other work for both cores.
``--also LABEL=DIR``: one more jetd, run from DIR (a checkout: pure Python, or an
unpacked wheel: compiled), e.g. the same two builds at an older commit.
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
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from jetwire import AddMethod
from jetwire import AddState
from jetwire import CallMethod
from jetwire import Decoder
from jetwire import FetchChange
from jetwire import FetchStates
from jetwire import FrameType
from jetwire import Message
from jetwire import NotifyState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import encode

from .brokers import GENERATOR_CPU
from .brokers import _connect
from .brokers import _jet_info
from .brokers import _nats_connect
from .brokers import _read_until
from .brokers import build_compiled
from .brokers import jetd
from .brokers import labelled_dir
from .brokers import nats
from .daemon_procs import DaemonProcess

REPO = Path(__file__).resolve().parents[2]
KEYS = 100
EVENT_RATE = 10_000
ROUTED_RATE = 20_000
DRAIN_SECONDS = 10.0  # after the last send: what has not arrived by then is lost
PAYLOAD_WIDTH = 16  # b"%016d" % sequence number: the payload is the message's own id
REQUEST_FRAME, RESPONSE_FRAME, EVENT_FRAME = FrameType.REQUEST, FrameType.RESPONSE, FrameType.EVENT


@dataclass
class Sample:
    """One run of one shape against one broker."""

    latencies: list[float]  # seconds, of the messages that arrived
    sent: int
    cpu_per_message: float  # broker CPU seconds per message
    load: float  # 1-minute load average at the end of the run
    generator_busy: float  # this process's CPU over the paced phase / its wall time

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


class Clock:
    """Open-loop pacing: message ``i`` is due at ``start + i / rate``; ``run`` sends what
    is due (in one write when late), reads what arrives meanwhile, and waits for the
    stragglers at the end."""

    def __init__(self, rate: int, seconds: float) -> None:
        self.rate = rate
        self.total = max(1, int(rate * seconds))
        self.sent_at = [0.0] * self.total
        self.received_at = [0.0] * self.total
        self.received = 0
        self.generator_busy = 0.0

    def arrived(self, sequence: int, now: float) -> None:
        if 0 <= sequence < self.total and not self.received_at[sequence]:
            self.received_at[sequence] = now
            self.received += 1

    def run(self, send: Callable[[int, int], None], readers: dict[socket.socket, Callable[[float], None]]) -> None:
        """``send(first, last)`` writes messages first..last-1; each reader reads its
        socket once (it is readable) and calls :meth:`arrived`."""
        selector = selectors.DefaultSelector()
        for sock, read in readers.items():
            selector.register(sock, selectors.EVENT_READ, read)
        perf = time.perf_counter
        start = perf()
        cpu_start = time.process_time()
        sent = 0
        try:
            while sent < self.total:
                now = perf()
                due = min(self.total, int((now - start) * self.rate) + 1)
                if due > sent:
                    send(sent, due)
                    for i in range(sent, due):
                        self.sent_at[i] = now
                    sent = due
                wait = start + sent / self.rate - perf()
                for key, _ in selector.select(max(0.0, wait)):
                    key.data(perf())
            self.generator_busy = (time.process_time() - cpu_start) / (perf() - start)
            deadline = perf() + DRAIN_SECONDS
            while self.received < self.total and perf() < deadline:
                for key, _ in selector.select(0.05):
                    key.data(perf())
        finally:
            selector.close()

    def sample(self, cpu_seconds: float) -> Sample:
        latencies = [r - s for s, r in zip(self.sent_at, self.received_at, strict=True) if r]
        return Sample(latencies, self.total, cpu_seconds / self.total, os.getloadavg()[0], self.generator_busy)


def _payload(sequence: int) -> bytes:
    return b"%016d" % sequence


def _reader(sock: socket.socket, on_data: Callable[[bytes, float], None]) -> Callable[[float], None]:
    def read(now: float) -> None:
        data = sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the broker closed the connection")
        on_data(data, now)
    return read


# --- jet -----------------------------------------------------------------------------
#
# The generator's side of jet is cut by hand, as NATS's is by a regular expression: a
# frame is a template (encoded once by jetwire and checked by decoding it back) with the
# id and the 16-byte payload put in place, and frames read are split on their headers
# (PROTOCOL.md 3) and read at fixed offsets. Encoding and decoding every message with the
# pure-Python jetwire cost ~20 µs per routed request here: at 20,000/s that alone would
# fill the generator's core and count as the broker's latency.

_HEADER = struct.Struct(">BI")  # PROTOCOL.md 3: type, body length
_ID = struct.Struct(">I")  # the request or response id, first in the body (PROTOCOL.md 4)


class _Template:
    """Frames of one message shape differing only in id and payload."""

    def __init__(self, message: Message, expect: Callable[[int, bytes], Message]) -> None:
        frame = encode(message)
        if not frame.endswith(_payload(0)):
            raise RuntimeError(f"the payload is not at the end of {message}")
        self.has_id = getattr(message, "id", None) is not None
        self.head = frame[:5]
        self.middle = frame[9 if self.has_id else 5 : -PAYLOAD_WIDTH]
        check = self.frame(7, _payload(7))  # the template must say what jetwire would
        decoder = Decoder()
        decoder.receive_data(check)
        if decoder.next_message() != expect(7, _payload(7)):
            raise RuntimeError(f"the template of {message} does not decode to its message")

    def frame(self, rid: int, payload: bytes) -> bytes:
        return self.head + _ID.pack(rid) + self.middle + payload if self.has_id else self.head + self.middle + payload


class _Frames:
    """Split a stream into (type, body) frames."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buffer = self.buffer + data if self.buffer else data
        frames = []
        pos, size = 0, len(buffer)
        while size - pos >= 5:
            ftype, length = _HEADER.unpack_from(buffer, pos)
            if size - pos - 5 < length:
                break
            frames.append((ftype, buffer[pos + 5 : pos + 5 + length]))
            pos += 5 + length
        self.buffer = buffer[pos:]
        return frames


def jet_events(daemon: DaemonProcess, rate: int, seconds: float) -> Sample:
    """The owner's NOTIFY_STATE (100 keys in turn) to one FETCH_STATES fetcher."""
    owner = _connect(daemon.address)
    fetcher = _connect(daemon.address)
    try:
        _jet_info(owner)
        _jet_info(fetcher)
        owner.sendall(b"".join(encode(AddState(i + 1, f"k/{i:02d}", Value.of(_payload(0)))) for i in range(KEYS)))
        _await_response(owner, KEYS)
        fetcher.sendall(encode(FetchStates(1, "k/")))
        decoder = Decoder()
        adds = 0
        while adds < KEYS:  # the response and the initial adds
            decoder.receive_data(fetcher.recv(1 << 20))
            adds += sum(1 for m in decoder.messages() if not isinstance(m, Response))
        notify = [_Template(NotifyState(None, f"k/{k:02d}", Value.of(_payload(0))),
                            lambda rid, payload, k=k: NotifyState(None, f"k/{k:02d}", Value.of(payload)))  # type: ignore[misc]
                  for k in range(KEYS)]
        change = _Template(FetchChange(1, "k/00", Value.of(_payload(0))),
                           lambda rid, payload: FetchChange(1, "k/00", Value.of(payload)))
        change_prefix = change.middle[:1]  # PROTOCOL.md 5: the event code comes first
        clock = Clock(rate, seconds)
        frames = _Frames()

        def send(first: int, last: int) -> None:
            owner.sendall(b"".join(notify[i % KEYS].frame(0, _payload(i)) for i in range(first, last)))

        def on_events(data: bytes, now: float) -> None:
            for ftype, body in frames.feed(data):
                if ftype == EVENT_FRAME and body[:1] == change_prefix:
                    clock.arrived(int(body[-PAYLOAD_WIDTH:]), now)

        owner_sink = _reader(owner, lambda data, now: None)  # nothing is expected: keep the buffer empty
        begin = daemon.cpu_seconds()
        clock.run(send, {fetcher: _reader(fetcher, on_events), owner: owner_sink})
        return clock.sample(daemon.cpu_seconds() - begin)
    finally:
        owner.close()
        fetcher.close()


def _await_response(sock: socket.socket, last_id: int) -> None:
    decoder = Decoder()
    while True:
        decoder.receive_data(sock.recv(1 << 20))
        for message in decoder.messages():
            if isinstance(message, Response):
                if message.status != Status.OK:
                    raise RuntimeError(f"jetd refused the set-up: {message}")
                if message.id == last_id:
                    return


def jet_routed(daemon: DaemonProcess, rate: int, seconds: float, kind: str) -> Sample:
    """SET_STATE (``kind`` "set") or CALL_METHOD ("call") routed to an owner peer that
    answers each request with its own write, as real owners do."""
    owner = _connect(daemon.address)
    client = _connect(daemon.address)
    try:
        _jet_info(owner)
        _jet_info(client)
        owner.sendall(encode(AddState(1, "svc", Value.of(_payload(0))) if kind == "set" else AddMethod(1, "svc")))
        _await_response(owner, 1)
        make = SetState if kind == "set" else CallMethod
        request = _Template(make(1, "svc", Value.of(_payload(0))), lambda rid, payload: make(rid, "svc", Value.of(payload)))
        answer = _Template(Response(1, Status.OK, Value.of(_payload(0))),
                           lambda rid, payload: Response(rid, Status.OK, Value.of(payload)))
        ok = answer.middle[:1]  # the status byte follows the id
        clock = Clock(rate, seconds)
        owner_frames, client_frames = _Frames(), _Frames()

        def send(first: int, last: int) -> None:
            client.sendall(b"".join(request.frame(i + 1, _payload(i)) for i in range(first, last)))

        def on_routed(data: bytes, now: float) -> None:
            for ftype, body in owner_frames.feed(data):
                if ftype == REQUEST_FRAME:  # each answer its own write
                    owner.sendall(answer.frame(_ID.unpack_from(body)[0], body[-PAYLOAD_WIDTH:]))

        def on_answers(data: bytes, now: float) -> None:
            for ftype, body in client_frames.feed(data):
                if ftype == RESPONSE_FRAME and body[4:5] == ok:
                    clock.arrived(_ID.unpack_from(body)[0] - 1, now)

        begin = daemon.cpu_seconds()
        clock.run(send, {owner: _reader(owner, on_routed), client: _reader(client, on_answers)})
        return clock.sample(daemon.cpu_seconds() - begin)
    finally:
        owner.close()
        client.close()


# --- NATS ----------------------------------------------------------------------------

_NATS_EVENT = re.compile(rb"MSG k\.\d\d 1 16\r\n(\d{16})\r\n")
_NATS_REQUEST = re.compile(rb"MSG svc 1 (\S+) 16\r\n(.{16})\r\n", re.S)
_NATS_REPLY = re.compile(rb"MSG _INBOX\.r\.(\d+) 2 16\r\n.{16}\r\n", re.S)


def _nats_frames(pattern: re.Pattern[bytes], on_match: Callable[[re.Match[bytes], float], None]
                 ) -> Callable[[bytes, float], None]:
    """Cut NATS protocol lines with ``pattern``; the unmatched tail waits for more."""
    tail = [b""]

    def on_data(data: bytes, now: float) -> None:
        buffered = tail[0] + data
        last = 0
        for found in pattern.finditer(buffered):
            on_match(found, now)
            last = found.end()
        tail[0] = buffered[last:]
    return on_data


def nats_events(daemon: DaemonProcess, rate: int, seconds: float) -> Sample:
    pub = _nats_connect(daemon)
    sub = _nats_connect(daemon)
    try:
        sub.sendall(b"SUB k.> 1\r\nPING\r\n")
        _read_until(sub, b"PONG\r\n")
        clock = Clock(rate, seconds)

        def send(first: int, last: int) -> None:
            pub.sendall(b"".join(b"PUB k.%02d 16\r\n%s\r\n" % (i % KEYS, _payload(i)) for i in range(first, last)))

        on_events = _nats_frames(_NATS_EVENT, lambda found, now: clock.arrived(int(found.group(1)), now))
        begin = daemon.cpu_seconds()
        clock.run(send, {sub: _reader(sub, on_events), pub: _reader(pub, lambda data, now: None)})
        return clock.sample(daemon.cpu_seconds() - begin)
    finally:
        pub.close()
        sub.close()


def nats_routed(daemon: DaemonProcess, rate: int, seconds: float) -> Sample:
    owner = _nats_connect(daemon)
    client = _nats_connect(daemon)
    try:
        owner.sendall(b"SUB svc 1\r\nPING\r\n")
        _read_until(owner, b"PONG\r\n")
        client.sendall(b"SUB _INBOX.r.* 2\r\nPING\r\n")
        _read_until(client, b"PONG\r\n")
        clock = Clock(rate, seconds)

        def send(first: int, last: int) -> None:
            client.sendall(b"".join(b"PUB svc _INBOX.r.%d 16\r\n%s\r\n" % (i, _payload(i)) for i in range(first, last)))

        def answer(found: re.Match[bytes], now: float) -> None:  # each answer its own write
            owner.sendall(b"PUB %s 16\r\n%s\r\n" % (found.group(1), found.group(2)))

        on_requests = _nats_frames(_NATS_REQUEST, answer)
        on_answers = _nats_frames(_NATS_REPLY, lambda found, now: clock.arrived(int(found.group(1)), now))
        begin = daemon.cpu_seconds()
        clock.run(send, {owner: _reader(owner, on_requests), client: _reader(client, on_answers)})
        return clock.sample(daemon.cpu_seconds() - begin)
    finally:
        owner.close()
        client.close()


# --- the run ---------------------------------------------------------------------------


@contextlib.contextmanager
def spinners(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` processes spinning on CPU (``yes > /dev/null``), stopped at the end."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="interleaved runs per row (median; default 5)")
    parser.add_argument("--seconds", type=float, default=5.0, help="paced seconds per run (default 5)")
    parser.add_argument("--event-rate", type=int, default=EVENT_RATE, help="events per second (default 10,000)")
    parser.add_argument("--routed-rate", type=int, default=ROUTED_RATE, help="requests per second (default 20,000)")
    parser.add_argument("--routed", choices=("set", "call"), default="set",
                        help="jet's routed request: SET_STATE (default) or CALL_METHOD")
    parser.add_argument("--compiled", type=Path, help="directory with the compiled jetd (default: build one)")
    parser.add_argument("--no-pure", action="store_true", help="leave out the pure-Python jetd of this checkout")
    parser.add_argument("--also", type=labelled_dir, action="append", default=[], metavar="LABEL=DIR",
                        help="one more jetd, run from DIR (repeatable)")
    parser.add_argument("--busy", action="store_true", help="two CPU spinners run for the whole run")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if shutil.which("taskset"):
        os.sched_setaffinity(0, {GENERATOR_CPU})
    command = "python -m tools.bench.latency " + " ".join(argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp, spinners(2 if args.busy else 0):
        site = args.compiled or build_compiled(Path(tmp))
        brokers: dict[str, Callable[[], contextlib.AbstractContextManager[DaemonProcess]]] = {
            "jetd compiled": lambda: jetd(site)}
        if not args.no_pure:
            brokers["jetd pure"] = lambda: jetd(REPO)
        for label, directory in args.also:
            brokers[label] = lambda directory=directory: jetd(directory)  # type: ignore[misc]
        if shutil.which("nats-server"):
            brokers["nats-server"] = nats
        else:
            print("nats-server is not installed (apt-get install nats-server): its rows are missing", file=sys.stderr)
        shapes: dict[str, Callable[[DaemonProcess], Sample]] = {
            f"events {args.event_rate:,}/s": lambda d: (
                nats_events(d, args.event_rate, args.seconds) if d.kind == "nats"
                else jet_events(d, args.event_rate, args.seconds)),
            f"routed {'SET' if args.routed == 'set' else 'CALL'} {args.routed_rate:,}/s": lambda d: (
                nats_routed(d, args.routed_rate, args.seconds) if d.kind == "nats"
                else jet_routed(d, args.routed_rate, args.seconds, args.routed)),
        }
        load_start = os.getloadavg()[0]
        results: dict[tuple[str, str], list[Sample]] = {}
        for run in range(args.repeat):
            for shape, measure in shapes.items():
                for name, start in brokers.items():
                    with start() as daemon:
                        results.setdefault((shape, name), []).append(measure(daemon))
            print(f"run {run + 1} of {args.repeat} done (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    print(f"\n`{command}`: latency from send to receipt in the generator, µs, medians of {args.repeat} "
          f"interleaved runs of {args.seconds:g} s; broker on CPU 0, generator on CPU 1; "
          f"{'two spinners busy' if args.busy else 'no spinners'}; load average (1 min) {load_start:.2f} at the "
          f"start, {os.getloadavg()[0]:.2f} at the end\n")
    print("| shape | broker | p50 µs | p99 µs | max µs | broker CPU µs/msg | arrived | generator CPU | load |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for shape in shapes:
        for name in brokers:
            samples = results[(shape, name)]
            med = statistics.median
            arrived = sum(len(s.latencies) for s in samples)
            sent = sum(s.sent for s in samples)
            print(f"| {shape} | {name} | {med(s.percentile(0.5) for s in samples) * 1e6:,.0f} "
                  f"| {med(s.percentile(0.99) for s in samples) * 1e6:,.0f} "
                  f"| {med(max(s.latencies, default=float('nan')) for s in samples) * 1e6:,.0f} "
                  f"| {med(s.cpu_per_message for s in samples) * 1e6:.2f} | {arrived:,} of {sent:,} "
                  f"| {med(s.generator_busy for s in samples):.0%} "
                  f"| {med(s.load for s in samples):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
