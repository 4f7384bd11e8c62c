"""Query benchmark (issue 15): a live scoreboard against jetd and node-jet 2.

    python -m tools.bench.queries [--players 100000] [--changes 1000000]
        [--nodejet-changes 2000] [--nodejet-seconds 60] [--skip-nodejet] [--seed 1]

Every daemon runs as a child process on 127.0.0.1. The owner adds ``--players`` players
as JSON states ``players/pN`` = ``{"name", "gender", "score"}``; then the workload's
fetchers fetch; then the owner notifies random score changes (fire-and-forget NOTIFY
events for jetd, ``change`` notifications for node-jet), in batches each followed by a
round trip, so the daemon has processed every change when the clock stops. Daemon CPU
is read from /proc (user + system) around the change phase only; fetchers read on
threads of their own all along, so nobody is parked for not reading.

Workloads:
- ``sorted``: 10 fetchers, each ``players/`` + ``gender == "female"`` sorted by
  ``score`` descending, window 1..10 (jetd FETCH_QUERY; node-jet 2 ``fetch`` with
  ``valueField`` and ``sort.byValueField``, ``from``/``to``);
- ``filtered`` (jetd): 1 fetcher of the female filter, unsorted;
- ``plain`` (jetd): no fetcher and no query at all.

node-jet 2 re-sorts every match on every change, so it gets ``--nodejet-changes``
changes (or ``--nodejet-seconds``, whichever ends first); CPU per change is a ratio and
compares across the two counts. node-jet 2.1.2 is installed with npm into a temporary
directory (``--nodejet-prefix`` to reuse one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from jetwire import SORT_DESCENDING
from jetwire import AddState
from jetwire import Decoder
from jetwire import FetchQuery
from jetwire import FilterOp
from jetwire import GetState
from jetwire import PathMatcher
from jetwire import PathOp
from jetwire import Query
from jetwire import Response
from jetwire import SortBy
from jetwire import Value
from jetwire import ValueFilter
from jetwire import ValueType
from jetwire import encode
from tools.bench.daemon_procs import DaemonProcess
from tools.bench.daemon_procs import _spawn
from tools.bench.daemon_procs import start_jetd

NODEJET2_SOURCE = Path(__file__).resolve().parent / "nodejet2"
NODEJET2_VERSION = "2.1.2"
BATCH = 5000  # changes per batch before a round trip (jetd)
NODE_BATCH = 100  # node-jet: its input is slow to drain; keep the batches small
FETCHERS = 10
TOP = 10


@dataclass
class Row:
    daemon: str
    workload: str
    changes: int
    cpu_seconds: float
    events: int
    rss_states: int = 0  # bytes: after the adds, before any fetch
    rss_fetched: int = 0  # bytes: after the fetches' initial answers
    players: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def us_per_change(self) -> float:
        return self.cpu_seconds / self.changes * 1e6 if self.changes else float("nan")


def _player(i: int, rng: random.Random) -> dict[str, object]:
    return {"name": f"p{i}", "gender": "female" if i % 2 else "male", "score": rng.randrange(1_000_000)}


# --- jetd ------------------------------------------------------------------------------------

_EVT_KEY = struct.Struct(">BIBH")
_VHEAD = struct.Struct(">BI")


def _notify_event(key: bytes, data: bytes) -> bytes:
    """A NOTIFY_STATE event (PROTOCOL.md 7.1) built directly: the generator must not be
    the bottleneck."""
    return _EVT_KEY.pack(3, 1 + 2 + len(key) + 5 + len(data), 4, len(key)) + key + _VHEAD.pack(5, len(data)) + data


def _recv_until(sock: socket.socket, decoder: Decoder, count: int) -> list[object]:
    got: list[object] = []
    while len(got) < count:
        data = sock.recv(1 << 20)
        if not data:
            raise RuntimeError("daemon closed the connection")
        decoder.receive_data(data)
        got.extend(decoder.messages())
    return got


class Reader(threading.Thread):
    """Reads a fetcher's socket until it closes, counting frames (fetch events).

    It takes over what was read before it started: a jetd ``Decoder`` with its
    buffered bytes, or node-jet's leftover bytes (``rest``).
    """

    def __init__(self, sock: socket.socket, decoder: Decoder | None = None, rest: bytes = b"") -> None:
        super().__init__(daemon=True)
        self.sock = sock
        self.frames = 0
        self.decoder = decoder
        self.rest = rest

    def run(self) -> None:
        buf = self.rest
        decoder = self.decoder
        with contextlib.suppress(OSError):
            while True:
                if decoder is not None:
                    self.frames += sum(1 for _ in decoder.messages())
                else:
                    pos = 0
                    while len(buf) - pos >= 4:  # node-jet: length u32 + JSON text
                        length = struct.unpack_from(">I", buf, pos)[0]
                        if len(buf) - pos < 4 + length:
                            break
                        pos += 4 + length
                        self.frames += 1
                    buf = buf[pos:]
                data = self.sock.recv(1 << 20)
                if not data:
                    return
                if decoder is not None:
                    decoder.receive_data(data)
                else:
                    buf += data


def _connect(daemon: DaemonProcess) -> socket.socket:
    sock = socket.create_connection(daemon.address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def scoreboard_query() -> Query:
    return Query(
        (PathMatcher(PathOp.STARTS_WITH, ("players/",)),),
        (ValueFilter(FilterOp.EQ, Value.of("female"), "gender"),),
        SortBy.FIELD,
        "score",
        SORT_DESCENDING,
        1,
        TOP,
    )


def run_jetd(workload: str, players: int, changes: int, seed: int) -> Row:
    rng = random.Random(seed)
    with start_jetd() as daemon:
        owner = _connect(daemon)
        owner_decoder = Decoder(max_body=1 << 30)
        _recv_until(owner, owner_decoder, 1)  # INFO
        values = [_player(i, rng) for i in range(players)]
        for start in range(0, players, 10_000):
            batch = range(start, min(players, start + 10_000))
            owner.sendall(b"".join(
                encode(AddState(i + 1, f"players/p{i}", Value(ValueType.JSON, json.dumps(values[i]).encode())))
                for i in batch
            ))
            _recv_until(owner, owner_decoder, len(batch))
        time.sleep(0.2)
        row = Row("jetd", workload, changes, 0.0, 0, players=players, rss_states=daemon.rss_bytes())
        readers = []
        if workload != "plain":
            if workload == "sorted":
                query, count = scoreboard_query(), FETCHERS
            else:
                query, count = Query(scoreboard_query().matchers, scoreboard_query().filters), 1
            for n in range(count):
                sock = _connect(daemon)
                sock.sendall(encode(FetchQuery(1, query)))
                decoder = Decoder(max_body=1 << 30)
                first = _recv_until(sock, decoder, 2)  # INFO, OK (+ the initial events)
                assert isinstance(first[1], Response) and first[1].ok, first[1]
                reader = Reader(sock, decoder=decoder)
                readers.append(reader)
                reader.start()
                if n == 0:
                    time.sleep(0.5)  # the group is built: measure it
                    row.rss_fetched = daemon.rss_bytes()
        time.sleep(0.5)
        before_frames = sum(r.frames for r in readers)
        keys = [f"players/p{i}".encode() for i in range(players)]
        names = [json.dumps(v["name"]) for v in values]
        genders = [json.dumps(v["gender"]) for v in values]
        cpu0 = daemon.cpu_seconds()
        sent = 0
        while sent < changes:
            n = min(BATCH, changes - sent)
            frames = []
            for _ in range(n):
                i = rng.randrange(players)
                data = f'{{"name":{names[i]},"gender":{genders[i]},"score":{rng.randrange(1_000_000)}}}'.encode()
                frames.append(_notify_event(keys[i], data))
            frames.append(encode(GetState(0xFFFF_FFFF, "players/p0")))
            owner.sendall(b"".join(frames))
            _recv_until(owner, owner_decoder, 1)
            sent += n
        row.cpu_seconds = daemon.cpu_seconds() - cpu0
        time.sleep(0.3)
        row.events = sum(r.frames for r in readers) - before_frames
        owner.close()
        for reader in readers:
            reader.sock.close()
    return row


# --- node-jet 2 ---------------------------------------------------------------------------------


def ensure_nodejet2(prefix: Path) -> Path:
    """npm install node-jet@2.1.2 into ``prefix`` (once)."""
    if (prefix / "node_modules" / "node-jet" / "package.json").exists():
        return prefix
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise RuntimeError("node and npm are needed for node-jet 2")
    prefix.mkdir(parents=True, exist_ok=True)
    subprocess.run([npm, "install", "--prefix", str(prefix), f"node-jet@{NODEJET2_VERSION}", "--no-audit", "--no-fund"],
                   check=True, capture_output=True, timeout=300)
    return prefix


@contextlib.contextmanager
def start_nodejet2(prefix: Path) -> Iterator[DaemonProcess]:
    node = shutil.which("node")
    assert node is not None
    cmd = [node, str(NODEJET2_SOURCE / "launch.js"), str(prefix), "0"]
    with _spawn("node-jet2", cmd, "nodejet2 listening on ", dict(os.environ), NODEJET2_SOURCE) as daemon:
        yield daemon


def _jframe(obj: object) -> bytes:
    text = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(text)) + text


def _jrecv(sock: socket.socket, state: dict[str, bytes], count: int) -> list[object]:
    """``count`` JSON messages (a batch array counts as its elements)."""
    out: list[object] = []
    buf = state.get("buf", b"")
    while len(out) < count:
        while len(buf) >= 4:
            length = struct.unpack_from(">I", buf)[0]
            if len(buf) < 4 + length:
                break
            message = json.loads(buf[4 : 4 + length])
            buf = buf[4 + length :]
            out.extend(message if isinstance(message, list) else [message])
        if len(out) >= count:
            break
        data = sock.recv(1 << 20)
        if not data:
            raise RuntimeError("node-jet closed the connection")
        buf += data
    state["buf"] = buf
    return out


def run_nodejet2(prefix: Path, players: int, changes: int, seconds: float, seed: int) -> Row:
    rng = random.Random(seed)
    with start_nodejet2(prefix) as daemon:
        owner = _connect(daemon)
        state: dict[str, bytes] = {}
        values = [_player(i, rng) for i in range(players)]
        for start in range(0, players, 2000):
            batch = range(start, min(players, start + 2000))
            owner.sendall(_jframe([
                {"id": i + 1, "method": "add", "params": {"path": f"players/p{i}", "value": values[i]}} for i in batch
            ]))
            _jrecv(owner, state, len(batch))
        time.sleep(0.2)
        row = Row("node-jet 2", "sorted", 0, 0.0, 0, players=players, rss_states=daemon.rss_bytes())
        readers = []
        for n in range(FETCHERS):
            sock = _connect(daemon)
            sock.sendall(_jframe({"id": 1, "method": "fetch", "params": {
                "id": "top", "path": {"startsWith": "players/"},
                "valueField": {"gender": {"equals": "female"}},
                "sort": {"byValueField": {"score": "number"}, "descending": True, "from": 1, "to": TOP},
            }}))
            fstate: dict[str, bytes] = {}
            _jrecv(sock, fstate, 1)  # the first message (result or initial window)
            reader = Reader(sock, rest=fstate.get("buf", b""))
            readers.append(reader)
            reader.start()
            if n == 0:
                time.sleep(0.5)
                row.rss_fetched = daemon.rss_bytes()
        time.sleep(1.0)
        before_frames = sum(r.frames for r in readers)
        cpu0 = daemon.cpu_seconds()
        started = time.monotonic()
        sent = 0
        while sent < changes and time.monotonic() - started < seconds:
            n = min(NODE_BATCH, changes - sent)
            messages: list[object] = []
            for _ in range(n):
                i = rng.randrange(players)
                value = dict(values[i], score=rng.randrange(1_000_000))
                messages.append({"method": "change", "params": {"path": f"players/p{i}", "value": value}})
            messages.append({"id": "sync", "method": "echo", "params": {}})
            owner.sendall(_jframe(messages))
            _jrecv(owner, state, 1)
            sent += n
        row.cpu_seconds = daemon.cpu_seconds() - cpu0
        row.changes = sent
        time.sleep(0.5)
        row.events = sum(r.frames for r in readers) - before_frames
        owner.close()
        for reader in readers:
            reader.sock.close()
    return row


# --- report ------------------------------------------------------------------------------------


def report(rows: list[Row]) -> str:
    lines = [
        "| daemon | workload | changes | daemon CPU per change | window/fetch events delivered | memory per matching state |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        memory = ""
        if row.rss_fetched and row.players:
            # The sorted group holds the female half of the players.
            matching = row.players // 2
            memory = f"{(row.rss_fetched - row.rss_states) / matching:.0f} B"
        lines.append(
            f"| {row.daemon} | {row.workload} | {row.changes:,} | {row.us_per_change:.2f} µs | {row.events:,} | {memory} |"
        )
    by = {(r.daemon, r.workload): r for r in rows}
    jetd, node = by.get(("jetd", "sorted")), by.get(("node-jet 2", "sorted"))
    if jetd and node and jetd.changes and node.changes:
        lines.append("")
        lines.append(f"jetd is {node.us_per_change / jetd.us_per_change:.0f}x below node-jet 2 in CPU per change (sorted, same run).")
    for row in rows:
        if row.rss_states and row.players:
            lines.append(f"{row.daemon} {row.workload}: RSS per cached state before any fetch {row.rss_states / row.players:.0f} B")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.queries", description=__doc__.split("\n\n")[0])
    parser.add_argument("--players", type=int, default=100_000)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--nodejet-changes", type=int, default=2000)
    parser.add_argument("--nodejet-seconds", type=float, default=60.0)
    parser.add_argument("--nodejet-prefix", type=Path, default=None, help="reuse an npm prefix holding node-jet 2.1.2")
    parser.add_argument("--skip-nodejet", action="store_true")
    parser.add_argument("--workloads", default="sorted,filtered,plain")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rows = []
    for workload in args.workloads.split(","):
        print(f"jetd {workload} ...", flush=True)
        rows.append(run_jetd(workload, args.players, args.changes, args.seed))
        print(f"  {rows[-1].us_per_change:.2f} us per change, {rows[-1].events} events", flush=True)
    if not args.skip_nodejet:
        with tempfile.TemporaryDirectory(prefix="nodejet2-") as tmp:
            prefix = args.nodejet_prefix or Path(tmp)
            try:
                ensure_nodejet2(prefix)
            except (RuntimeError, subprocess.SubprocessError) as exc:
                print(f"node-jet 2 skipped: {exc}")
            else:
                print("node-jet 2 sorted ...", flush=True)
                rows.append(run_nodejet2(prefix, args.players, args.nodejet_changes, args.nodejet_seconds, args.seed))
                print(f"  {rows[-1].us_per_change:.2f} us per change, {rows[-1].events} events", flush=True)
    print()
    print(report(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
