"""The attacks of issue 12, one function each. Every function takes the :class:`Run`
and returns one result row (a dict: see ``COLUMNS`` in :mod:`tools.chaos.cli`)."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from jetwire import AddState
from jetwire import Close
from jetwire import FetchStates
from jetwire import FrameType
from jetwire import GetState
from jetwire import NotifyState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import decode_frame
from jetwire import encode
from jetwire.log import LogKind
from jetwire.log import LogRecord
from jetwire.log import iter_log

from .auth import auth_close
from .auth import auth_flood
from .auth import auth_logins
from .harness import HEADER
from .harness import Daemon
from .harness import Drainer
from .harness import MiB
from .harness import PeerGone
from .harness import RawPeer
from .harness import Target
from .harness import Watch
from .harness import add_states
from .harness import close_all
from .harness import closures
from .harness import describe
from .harness import open_and_send
from .harness import owner_with_state
from .harness import pump_all
from .harness import send_partial_frame
from .harness import wait_until
from .harness import watched
from .tls import tls_handshakes
from .together import all_at_once
from .websocket import RawWsPeer
from .websocket import web_address
from .websocket import ws_closures

Row = dict[str, object]


@dataclass
class Run:
    """The target and how big the attacks are (``scale`` 1 is the issue's size)."""

    target: Target
    scale: float = 1.0
    without: frozenset[str] = frozenset()  # parts all-at-once leaves out (tools/chaos/together.py)

    def n(self, full: int, least: int = 1) -> int:
        """A count scaled down, never below ``least``."""
        return max(least, round(full * self.scale))

    def seconds(self, full: float, least: float = 0.3) -> float:
        """An observation window scaled down, never below ``least``."""
        return max(least, full * self.scale)


# --- 1. output amplification inside one read ---------------------------------------

FLOOD_WATCH = 35.0  # ISSUE 12: held for ~33 s, until jetd's slow-consumer deadline (30 s)


def _held(watch: Watch, since: float) -> str:
    if watch.memory.pid is None:
        return "RSS not watched (no pid)"
    return f"RSS {watch.memory.last_kib / 1024:,.0f} MB after {time.monotonic() - since:.0f} s"



def get_flood(run: Run, count: int, connections: int) -> Row:
    """``count`` GET_STATE of a 1 MiB state in one write, by peers that never read."""
    row: Row = {}
    count = run.n(count)
    with run.target.daemon() as daemon:
        owner, size = owner_with_state(daemon, "chaos/big", MiB)
        payload = b"".join(encode(GetState(i + 1, "chaos/big")) for i in range(count))
        attackers: list[RawPeer] = []
        try:
            with watched(daemon, row) as watch:
                # All connected first: once one has sent, the daemon may not even greet the next.
                attackers = [RawPeer(daemon.address, rcvbuf=4096) for _ in range(connections)]
                for attacker in attackers:
                    attacker.send_raw(payload)
                started = time.monotonic()
                watch.settle(run.seconds(FLOOD_WATCH), run.seconds(FLOOD_WATCH + 15), run.seconds(5))
                held = _held(watch, started)
        finally:
            close_all([*attackers, owner])
    row["outcome"] = (f"{connections} x {count} answers of {size / MiB:.2f} MiB asked in {len(payload):,} B; "
                      f"{count * connections * size / 1e6:,.0f} MB owed; {held}")
    return row


def fetch_flood(run: Run) -> Row:
    """100 FETCH_STATES("") over 2,000 states of 4 KiB, one write, never read."""
    row: Row = {}
    states, fetches = run.n(2000), run.n(100)
    with run.target.daemon() as daemon:
        owners = add_states(daemon, "chaos/f/", states, 4096)
        attacker: Optional[RawPeer] = None
        try:
            with watched(daemon, row) as watch:
                attacker = RawPeer(daemon.address, rcvbuf=4096)
                attacker.send_raw(b"".join(encode(FetchStates(i + 1, "")) for i in range(fetches)))
                started = time.monotonic()
                watch.settle(run.seconds(FLOOD_WATCH), run.seconds(FLOOD_WATCH + 15), run.seconds(5))
                held = _held(watch, started)
        finally:
            close_all([*owners, *([attacker] if attacker else [])])
    row["outcome"] = f"{fetches} fetches x {states:,} adds of 4 KiB: {fetches * states * 4096 / 1e6:,.0f} MB owed; {held}"
    return row


# --- 2. partial frames ---------------------------------------------------------------


def partial_frames(run: Run) -> Row:
    """400 connections each send all but the last byte of a 1 MiB frame, then wait."""
    row: Row = {}
    count = run.n(400)
    peers: list[RawPeer] = []
    with run.target.daemon() as daemon:
        try:
            with watched(daemon, row):
                sent = open_and_send(peers, count, run.seconds(60, 5), lambda: RawPeer(daemon.address),
                                     send_partial_frame)
                time.sleep(run.seconds(12))
                ends = closures(peers, run.seconds(1, 0.2))
        finally:
            close_all(peers)
    row["outcome"] = f"{sent} of {count} frames held 1 byte short; after the wait: {describe(ends)}"
    return row


def ws_partial_frames(run: Run) -> Row:
    """Issue 29: 100 upgraded WebSocket connections each announce a 1 MiB WebSocket
    frame and send all of it but one byte, then wait 30 s (default flags: the 64 MiB
    input budget, the 10 s frame timeout)."""
    row: Row = {}
    count = run.n(100)
    peers: list[RawWsPeer] = []
    # Scaled down, the frame timeout is too (the wait must pass it); at full size jetd's 10 s.
    flags = ["--http-port", "0"]
    if run.scale < 1:
        flags += ["--frame-timeout", f"{max(1.0, 10 * run.scale):g}"]
    wait = run.seconds(30, 3)
    with run.target.daemon(*flags, own=True) as daemon:
        web = web_address(daemon)
        try:
            with watched(daemon, row):
                sent = open_and_send(peers, count, run.seconds(60, 5),
                                     lambda: RawWsPeer((web.host, web.port), tls=web.tls),
                                     lambda peer, timeout: peer.send_frame_start(MiB, MiB - 1, timeout))
                early = ws_closures(peers, run.seconds(1, 0.5))
                early_text = describe(early)
                ends = ws_closures(peers, wait)  # 30 s as in the issue
        finally:
            for peer in peers:
                peer.close()
    row["outcome"] = (f"{sent} of {count} WebSocket frames held 1 byte short; within 1 s: {early_text}; "
                      f"after {wait:g} s: {describe(ends)}")
    return row


def trickle(run: Run) -> Row:
    """Frames trickled in 2-byte writes over 20 connections, round robin."""
    row: Row = {}
    conns, rounds = 20, run.n(25_000, 10)
    peers: list[RawPeer] = []
    trickled = 0
    with run.target.daemon() as daemon:
        try:
            with watched(daemon, row):
                peers = [RawPeer(daemon.address) for _ in range(conns)]
                for peer in peers:
                    peer.send_raw(HEADER.pack(FrameType.REQUEST, peer.max_body))
                alive = list(peers)
                deadline = time.monotonic() + run.seconds(30, 2)
                for _ in range(rounds):
                    if not alive or time.monotonic() > deadline:
                        break
                    for peer in list(alive):
                        try:
                            peer.sock.send(b"\x00\x00")
                            trickled += 2
                        except OSError:
                            alive.remove(peer)
                    time.sleep(0)  # let the daemon read each pair apart
                time.sleep(run.seconds(2))
                ends = closures(peers, run.seconds(0.5, 0.2))
        finally:
            close_all(peers)
    growth = row.get("rss_growth_mb")
    per_byte = f"; {float(growth) * MiB / trickled:.1f} B of RSS per byte" if isinstance(growth, float) and trickled else ""
    row["outcome"] = f"{trickled:,} B trickled in 2-byte writes{per_byte}; {describe(ends)}"
    return row


# --- 3. event log --------------------------------------------------------------------


class RoutedOwner:
    """Owns ``key`` and answers every routed SET_STATE OK with its value, pipelined."""

    def __init__(self, daemon: Daemon, key: str) -> None:
        self.peer = RawPeer(daemon.address)
        self.peer.send(AddState(1, key, Value.of(0)))
        self.peer.answer(1)
        self._thread = threading.Thread(target=self._run, name="chaos-owner", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        peer = self.peer
        try:
            while True:
                peer.fill(30)
                answers = [Response(m.id, Status.OK, m.value) for m in peer.decoder.messages()
                           if isinstance(m, SetState) and m.id is not None]
                if answers:
                    peer.sock.sendall(b"".join(encode(a) for a in answers))
        except Exception:  # EOF, reset or SIGKILL of the daemon: the owner's job is over
            return


class SetClient:
    """Pipelines routed sets (``window`` in flight) and records the ids answered OK."""

    def __init__(self, daemon: Daemon, key: str, first_id: int, window: int = 32, size: int = 8) -> None:
        self.peer = RawPeer(daemon.address)
        self.key, self.next_id, self.window = key, first_id, window
        self.value = Value.of(b"\x5a" * size)
        self.acked: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-setter", daemon=True)
        self._thread.start()

    def _send(self, n: int) -> None:
        frames = [encode(SetState(self.next_id + i, self.key, self.value)) for i in range(n)]
        self.next_id += n
        self.peer.sock.sendall(b"".join(frames))

    def _run(self) -> None:
        try:
            self._send(self.window)
            while not self._stop.is_set():
                self.peer.fill(30)
                done = [m.id for m in self.peer.decoder.messages() if isinstance(m, Response) and m.status == Status.OK]
                self.acked += done
                if done and not self._stop.is_set():
                    self._send(len(done))
        except Exception:  # the daemon was killed: what was acknowledged is what counts
            return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(35)
        self.peer.close()


def logged_set_ids(log_dir: Path, key: str) -> set[int]:
    """Ids of every SET_STATE of ``key`` received by the daemon according to its log."""
    ids: set[int] = set()
    for path in sorted(log_dir.iterdir()) if log_dir.is_dir() else []:
        with open(path, "rb") as stream:
            try:
                for item in iter_log(stream):
                    if isinstance(item, LogRecord) and item.kind == LogKind.FRAME_IN:
                        with contextlib.suppress(Exception):
                            message = decode_frame(item.data)
                            if isinstance(message, SetState) and message.key == key and message.id is not None:
                                ids.add(message.id)
            except Exception:  # a segment whose header the crash cut: nothing of it is readable
                continue
    return ids


def fsync_always(run: Run) -> Row:
    """Routed sets of 4 KiB values (4 clients, 32 in flight each) under ``--log-fsync
    always``, then SIGKILL: how many acknowledged sets are not in the log?"""
    row: Row = {}
    key, clients = "chaos/durable", 4
    with run.target.daemon("--log-fsync", "always", log=True, own=True) as daemon:
        owner = RoutedOwner(daemon, key)
        setters: list[SetClient] = []
        with watched(daemon, row):
            setters = [SetClient(daemon, key, (c + 1) * 10_000_000, size=4096) for c in range(clients)]
            started = time.monotonic()
            time.sleep(run.seconds(15, 0.5))
            daemon.signal(signal.SIGKILL)
            elapsed = time.monotonic() - started
            daemon.wait(10)
        for setter in setters:
            setter.stop()
        owner.peer.close()
        assert daemon.log_dir is not None
        logged = logged_set_ids(daemon.log_dir, key)
    acked = [i for s in setters for i in s.acked]
    missing = sum(1 for i in acked if i not in logged)
    # The issue saw a contiguous tail: every lost set answered after every logged one.
    tail = all(not any(i in logged for i in s.acked[s.acked.index(first):])
               for s in setters if (first := next((i for i in s.acked if i not in logged), None)) is not None)
    row["log_lost"] = (f"{missing:,} of {len(acked):,} ({100 * missing / max(1, len(acked)):.1f}%)"
                       + ((", a tail" if tail else ", not only a tail") if missing else ""))
    row["outcome"] = f"{len(acked) / elapsed:,.0f} acknowledged sets/s of 4 KiB by {clients} clients, then SIGKILL"
    return row


def log_growth(run: Run) -> Row:
    """``--log-events``: an owner notifies a 64 KiB state as fast as it can, 10 fetchers."""
    row: Row = {}
    key, seconds = "chaos/grow", run.seconds(15)
    with run.target.daemon("--log-events", log=True, own=True) as daemon:
        owner, size = owner_with_state(daemon, key, 64 * 1024)
        fetchers = [RawPeer(daemon.address) for _ in range(10)]
        for fetcher in fetchers:
            fetcher.send(FetchStates(1, key))
            fetcher.answer(1)
        drainer = Drainer(fetchers)
        batch = b"".join(encode(NotifyState(None, key, Value.of(bytes([i]) * size))) for i in range(16))
        notified = 0
        try:
            with watched(daemon, row):
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline and owner.send_raw(batch, timeout=max(0.1, deadline - time.monotonic())):
                    notified += 16
                grown = _dir_bytes(daemon.log_dir)
        finally:
            drainer.stop()
            close_all([owner, *fetchers])
    row["log_lost"] = "n/a"
    row["outcome"] = (f"log grew {grown / 1e6:,.0f} MB in {seconds:.0f} s ({grown / 1e6 / seconds:,.0f} MB/s; "
                      f"{notified:,} notifies of {size // 1024} KiB x 10 fetchers)")
    return row


def _dir_bytes(path: Optional[Path]) -> int:
    if path is None or not path.is_dir():
        return 0
    return sum(os.stat(p).st_size for p in path.iterdir() if p.is_file())


# --- 4. one request stalls everyone --------------------------------------------------


def big_fetch(run: Run) -> Row:
    """One FETCH_STATES("") over 1,000,000 states."""
    row: Row = {}
    states = run.n(1_000_000, 10)
    with run.target.daemon() as daemon:
        owners = add_states(daemon, "chaos/m/", states, 8)
        fetcher = RawPeer(daemon.address)
        drainer = Drainer([fetcher])
        try:
            with watched(daemon, row):
                started = time.monotonic()
                fetcher.sock.sendall(encode(FetchStates(1, "")))
                complete = wait_until(lambda: drainer.frames(fetcher, FrameType.EVENT) >= states, 120, 0.01)
                took = time.monotonic() - started
                time.sleep(run.seconds(1))
        finally:
            drainer.stop()
            close_all([fetcher, *owners])
    adds = drainer.frames(fetcher, FrameType.EVENT)
    row["outcome"] = f"{adds:,} FETCH_ADD {'in' if complete else 'only, after'} {took:.2f} s"
    return row


def route_timeouts(run: Run) -> Row:
    """A burst of 200,000 routed sets to owners that never answer (short route timeout)."""
    row: Row = {}
    total, per_owner = run.n(200_000, 10), 10_000  # jetd's default max_pending_per_owner
    timeout = max(0.5, round(5 * run.scale, 1))  # jetd's default: long enough to route them all first
    with run.target.daemon("--route-timeout", str(timeout)) as daemon:
        owners = [owner_with_state(daemon, f"chaos/rt/{k}", 1)[0] for k in range(math.ceil(total / per_owner))]
        requester = RawPeer(daemon.address)
        drainer = Drainer([*owners, requester])
        burst = b"".join(encode(SetState(i + 1, f"chaos/rt/{i // per_owner}", Value.of(i))) for i in range(total))
        try:
            with watched(daemon, row) as watch:
                started = time.monotonic()
                requester.sock.settimeout(60)
                requester.sock.sendall(burst)
                wait_until(lambda: sum(drainer.frames(o, FrameType.REQUEST) for o in owners) >= total, 60, 0.01)
                routed = time.monotonic()
                answered = wait_until(lambda: drainer.frames(requester, FrameType.RESPONSE) >= total, 60, 0.01)
                took = time.monotonic() - started
                time.sleep(run.seconds(1))
                ended = time.monotonic()
        finally:
            drainer.stop()
            close_all([requester, *owners])
    health = watch.health  # stopped by now: its waits are here
    assert health is not None
    stalls = (health.max_wait_ms(started, routed), health.max_wait_ms(max(routed, started + timeout) + 0.01, ended))
    got = drainer.frames(requester, FrameType.RESPONSE)
    row["outcome"] = (f"{got:,} of {total:,} sets answered (TIMEOUT) {'within' if answered else 'not within'} "
                      f"{took:.1f} s; health max {stalls[0]} ms while routing, {stalls[1]} ms while timing out")
    return row


# --- 5. lost CLOSE frames ------------------------------------------------------------


def overload_close(run: Run) -> Row:
    """A slow consumer: asks for 100 MiB in one write (100 GET of a 1 MiB state, past
    the 64 MiB hard limit) and reads 64 KiB every 50 ms (1.3 MB/s), until the daemon
    closes it OVERLOADED (slow deadline 3 s): does its CLOSE arrive?"""
    row: Row = {}
    gets = run.n(100)
    with run.target.daemon("--slow-deadline", "3") as daemon:
        owner, size = owner_with_state(daemon, "chaos/big", MiB)
        attacker = RawPeer(daemon.address, rcvbuf=65536)
        how, started = "still open", time.monotonic()
        try:
            with watched(daemon, row):
                attacker.send_raw(b"".join(encode(GetState(i + 1, "chaos/big")) for i in range(gets)))
                deadline = started + run.seconds(30, 3)
                while attacker.close_frame is None and not attacker.eof and time.monotonic() < deadline:
                    time.sleep(0.05)
                    attacker.pump(65536)
                if attacker.close_frame is not None:
                    how = f"got CLOSE {attacker.close_frame.status.name}"
                elif attacker.eof:
                    how = "EOF/reset without CLOSE"
        finally:
            close_all([owner, attacker])
    row["outcome"] = (f"{gets} GET of {size / MiB:.2f} MiB in one write: {how} after "
                      f"{time.monotonic() - started:.1f} s and {attacker.received / 1e6:,.1f} MB read")
    return row


def shutdown_close(run: Run) -> Row:
    """10 peers pipelining GETs of a 1 MiB state (32 in flight) and reading slowly
    (about 3 MB/s each), so that megabytes are queued for them when the daemon gets
    SIGTERM: how many read a CLOSE before their connection ends?"""
    row: Row = {}
    count = run.n(10)
    ends: Counter[str] = Counter()
    with run.target.daemon(own=True) as daemon:
        owner, _ = owner_with_state(daemon, "chaos/big", MiB)
        peers = [RawPeer(daemon.address, rcvbuf=65536) for _ in range(count)]
        give_up = threading.Event()
        in_flight = run.n(32)

        def pipeline(peer: RawPeer) -> None:
            rid = in_flight
            sending = peer.send_raw(b"".join(encode(GetState(i + 1, "chaos/big")) for i in range(in_flight)), 1)
            peer.sock.settimeout(1)
            try:
                while not give_up.is_set():
                    time.sleep(0.02)
                    try:
                        data = peer.sock.recv(65536)
                    except TimeoutError:
                        continue
                    if not data:
                        ends["EOF without CLOSE"] += 1
                        return
                    peer.decoder.receive_data(data)
                    for message in peer.decoder.messages():
                        if isinstance(message, Close):
                            ends[f"CLOSE {message.status.name}"] += 1
                            return
                        if isinstance(message, Response) and sending:
                            # A send the daemon refuses (closed, or not reading) ends the
                            # sending only: the CLOSE may still be on its way.
                            rid += 1
                            sending = peer.send_raw(encode(GetState(rid, "chaos/big")), 1)
                            peer.sock.settimeout(1)
                ends["still open"] += 1
            except OSError:
                ends["reset without CLOSE"] += 1

        threads = [threading.Thread(target=pipeline, args=(p,), daemon=True) for p in peers]
        with watched(daemon, row, health=False):
            for thread in threads:
                thread.start()
            time.sleep(run.seconds(3))
            daemon.signal(signal.SIGTERM)
            started = time.monotonic()
            code = daemon.wait(30)
            exit_s = time.monotonic() - started
        deadline = time.monotonic() + 20
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        give_up.set()
        for thread in threads:
            thread.join(5)
        close_all([owner, *peers])
    row["outcome"] = f"{count} slow pipelining peers at SIGTERM: {describe(ends)}; jetd exited {code} in {exit_s:.1f} s"
    return row


# --- 6. smaller ----------------------------------------------------------------------


def notify_edge(run: Run) -> Row:
    """NOTIFY_STATE events whose body is max_body - 4 .. max_body, no fetcher."""
    row: Row = {}
    outcomes: list[str] = []
    with run.target.daemon() as daemon, watched(daemon, row):
        for short in range(4, -1, -1):
            owner = RawPeer(daemon.address)
            try:
                owner.send(AddState(1, "chaos/edge", Value.of(0)))
                owner.answer(1)
                empty_body = len(encode(NotifyState(None, "chaos/edge", Value.of(b"")))) - 5
                owner.send_raw(encode(NotifyState(None, "chaos/edge", Value.of(b"\x00" * (owner.max_body - short - empty_body)))))
                owner.send(GetState(2, "chaos/edge"))
                try:
                    owner.answer(2)
                    outcomes.append(f"-{short}: kept")
                except PeerGone:
                    close = owner.close_frame
                    outcomes.append(f"-{short}: CLOSE {close.status.name}" if close else f"-{short}: EOF")
                except TimeoutError:
                    outcomes.append(f"-{short}: no answer")
            finally:
                owner.close()
    row["outcome"] = "owner after an event of max_body " + ", ".join(outcomes)
    return row


def fd_limit(run: Run) -> Row:
    """jetd under RLIMIT_NOFILE 64 (max_connections 10,000); 100 connections."""
    row: Row = {}
    nofile, count = 64, 100
    peers: list[RawPeer] = []
    with run.target.daemon(nofile=nofile) as daemon:
        with watched(daemon, row, health=False):
            states: Counter[str] = Counter()
            for _ in range(count):
                try:
                    peers.append(RawPeer(daemon.address, read_info=False, timeout=2))
                except OSError:
                    states["connect failed"] += 1
            ends = _first_answers(peers, run.seconds(3, 0.5))
            states.update(ends)
            alive = daemon.proc is not None and daemon.proc.poll() is None
        close_all(peers)
        time.sleep(0.2)
        lines = [line for line in daemon.stderr().splitlines()
                 if any(w in line.lower() for w in FD_WORDS)]
    first = f" (first: {lines[0][-120:]!r})" if lines else ""
    row["outcome"] = (f"RLIMIT_NOFILE {nofile}, {count} connections: {describe(states)}; "
                      f"{len(lines)} log line(s) about it{first}{'' if alive else '; jetd died'}")
    return row


FD_WORDS = ("accept", "too many open files", "emfile", "refus", "descriptor", "rlimit", "nofile")


def _first_answers(peers: Sequence[RawPeer], timeout: float) -> Counter[str]:
    """What each connection got: INFO and nothing more, INFO then CLOSE, EOF, nothing."""
    pump_all(peers, timeout)
    result: Counter[str] = Counter()
    for peer in peers:
        got = "INFO" if peer.info is not None else "no INFO"
        if peer.close_frame is not None:
            got += f", CLOSE {peer.close_frame.status.name}"
        if peer.eof:
            got += ", EOF" if peer.close_frame is not None else ", EOF without CLOSE"
        result[got] += 1
    return result


ATTACKS: dict[str, tuple[str, Callable[[Run], Row]]] = {
    "get-400": ("400 GET_STATE of a 1 MiB state in one write, never read", lambda r: get_flood(r, 400, 1)),
    "get-2000": ("2,000 GET_STATE of a 1 MiB state in one write, never read", lambda r: get_flood(r, 2000, 1)),
    "get-2000x2": ("the same on two connections", lambda r: get_flood(r, 2000, 2)),
    "fetch-100": ('100 FETCH_STATES("") over 2,000 states of 4 KiB in one write, never read', fetch_flood),
    "partial-400": ("400 connections each send all but the last byte of a 1 MiB frame", partial_frames),
    "trickle": ("frames trickled in 2-byte writes, 20 connections", trickle),
    "ws-partial-100": ("100 WebSocket connections each send all but the last byte of a 1 MiB WebSocket frame",
                       ws_partial_frames),
    "fsync-always": ("--log-fsync always: routed sets of 4 KiB, SIGKILL, acknowledged ids missing from the log",
                     fsync_always),
    "log-growth": ("--log-events: a 64 KiB state notified flat out to 10 fetchers", log_growth),
    "fetch-1m": ('one FETCH_STATES("") over 1,000,000 states', big_fetch),
    "route-timeouts": ("a burst of 200,000 route timeouts (owners never answer, --route-timeout 5)", route_timeouts),
    "overload-close": ("a slow consumer closed OVERLOADED: does it get its CLOSE?", overload_close),
    "shutdown-close": ("pipelining peers at SIGTERM: do they get CLOSE?", shutdown_close),
    "notify-edge": ("NOTIFY_STATE event within 4 bytes of max_body, no fetcher", notify_edge),
    "fd-limit": ("RLIMIT_NOFILE 64 < max_connections: 100 connections", fd_limit),
    # Issue 29: authentication that cannot be starved (PROTOCOL.md 15.2; tools/chaos/auth.py).
    "auth-close": ("60 connections each send one wrong AUTHENTICATE and close; then a real login",
                   lambda r: auth_close(r.target, r.n(60))),
    "auth-flood": ("60 connections repeat wrong AUTHENTICATEs for 30 s; a real login from another address every 2 s",
                   lambda r: auth_flood(r.target, r.n(60), r.seconds(30.0, 3.0))),
    "auth-logins": ("8 clients log in with the right password back to back for 20 s: password checks never idle",
                    lambda r: auth_logins(r.target, r.n(8), r.seconds(20.0, 3.0))),
    # Issue 29's figure that matters (tools/chaos/together.py): sorted windows, a 1M-state
    # seed, the auth flood and partial TCP and WebSocket frames together, probed.
    "all-at-once": ("every issue-29 scenario at once; a probe's GET and routed SET p50/p99/max, PASS/FAIL per target",
                    all_at_once),
    # Issue 29: a TLS handshake is a connection (PROTOCOL.md 15.6; tools/chaos/tls.py).
    "tls-handshakes": ("300 idle TLS handshakes (no ClientHello) under RLIMIT_NOFILE 256; a real TLS peer tries",
                       lambda r: tls_handshakes(r.target, r.n(300), r.seconds(20.0, 3.0),
                                                handshake_timeout=r.seconds(10.0, 1.0))),
}


def iter_attacks(names: Optional[Sequence[str]]) -> Iterator[tuple[str, str, Callable[[Run], Row]]]:
    for name in names or list(ATTACKS):
        description, function = ATTACKS[name]
        yield name, description, function
