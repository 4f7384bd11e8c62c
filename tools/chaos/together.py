"""Issue 29's figure that matters: every attack at once, while a probe peer measures
what other peers wait.

One daemon (``--auth`` with a users file whose anonymous entry may do anything, and a
WebSocket listener) holds N JSON states for sorted windows and M more for one big sorted
query. Then, all at the same time for ``seconds``:

- one connection opens F sorted-window fetches (filter ``kind == "a"``, sorted by
  ``score``, a 1,000-row window) while an owner changes scores as fast as it is answered;
- another opens one sorted query over the M states (a new query group: every state is
  evaluated);
- A connections from 127.0.0.2 repeat wrong AUTHENTICATEs; a real login from 127.0.0.1
  every 2 s;
- W WebSocket connections each send all but one byte of a 1 MiB WebSocket frame;
- P TCP connections each send all but one byte of a max_body frame;
- with TLS (a ``--tls-port`` beside the plain one): H idle handshakes (no ClientHello)
  and K handshakes each sending 100 KiB of a ClientHello never completed, charged to
  the input budget; a real TLS peer tries at the end;
- a probe peer in its own process GETs a state and sets another one (routed to its owner,
  which answers) every 20 ms: p50, p99 and max of each.

``--without PART`` (windows, seed, auth, ws, tcp, tls) leaves a part out, to see which one
costs the probe its waits.

The row says whether the targets hold: probe p99 <= 20 ms and max <= 50 ms, the daemon's
RSS growth during the attacks within its configured budgets (``max_input_buffer`` for
every held input together, ``hard_limit`` of output for each of the two fetching
connections, and argon2id's 64 MiB for each password check running: jetd runs two at
once), every fetch answered.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import statistics
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any
from typing import Optional

from jetwire import FrameType
from jetwire import Status
from jetwire import Value
from jetwire import encode
from jetwire.messages import AddState
from jetwire.messages import FetchQuery
from jetwire.messages import NotifyState
from jetwire.messages import Query
from jetwire.messages import Response
from jetwire.messages import SetState
from peer.query import build_query
from peer.query import field

from .auth import Flood
from .auth import login_seconds
from .auth import users_file
from .harness import Drainer
from .harness import HealthPeer
from .harness import MiB
from .harness import RawPeer
from .harness import _HealthLoop
from .harness import close_all
from .harness import closures
from .harness import describe
from .harness import open_and_send
from .harness import send_partial_frame
from .harness import stdout_line
from .harness import wait_until
from .harness import watched
from .tls import huge_client_hello
from .tls import real_tls_peer
from .tls import self_signed
from .tls import tls_endings
from .websocket import RawWsPeer
from .websocket import web_address
from .websocket import ws_closures

if TYPE_CHECKING:
    from .attacks import Run

Row = dict[str, object]

PROBE_PERIOD = 0.02
ALL_AT_ONCE_PARTS = ("windows", "seed", "auth", "ws", "tcp", "tls")  # what --without can leave out
TARGET_P99_MS = 20.0  # ISSUE 29, on 2 cores
TARGET_MAX_MS = 50.0
DEFAULT_MAX_INPUT_BUFFER = 64 * MiB  # jetd's defaults (jetd/config.py), which chaos does not change
DEFAULT_HARD_LIMIT = 64 * MiB
ARGON2_MEMORY = 64 * MiB  # argon2-cffi's default memory_cost, per check
CHECKS_AT_ONCE = 2  # jetd/access.py: password checks running at once
WINDOW = 1000


def _sorted_query(prefix: str) -> Query:
    """PROTOCOL.md 14.1: keys under ``prefix`` whose ``kind`` is "a", by ``score``
    descending, rows 1..1000."""
    return build_query(prefix, where=[field("kind") == "a"], sort_by="score", descending=True, top=WINDOW)


def _json_states(daemon_address: tuple[str, int], prefix: str, count: int, per_owner: int = 100_000) -> list[RawPeer]:
    """``count`` JSON states ``{"score": .., "kind": ..}``, pipelined, ``per_owner`` per
    connection (jetd's default max_states_per_connection)."""
    owners: list[RawPeer] = []
    for first in range(0, count, per_owner):
        owner = RawPeer(daemon_address, timeout=120)
        owners.append(owner)
        last = min(count, first + per_owner)
        for start in range(first, last, 10_000):
            stop = min(last, start + 10_000)
            owner.sock.sendall(b"".join(
                encode(AddState(i + 1, f"{prefix}{i:07d}", Value.of({"score": i % 1000, "kind": "b" if i % 10 else "a"})))
                for i in range(start, stop)))
            answer = owner.answer(stop, timeout=300)
            if answer.status != Status.OK:
                raise RuntimeError(f"jetd refused a state: {answer}")
    return owners


class _ProbeLoop(_HealthLoop):
    """Another peer's view: a GET of one state and a SET of another, routed to the
    connection that owns it (which answers at once), every 20 ms."""

    KINDS = ("get", "set")
    PERIOD = PROBE_PERIOD
    ROUTED_KEY = "chaos/probe-routed"

    def __init__(self, address: tuple[str, int], stop: Any) -> None:
        super().__init__(address, stop)  # self.peer owns KEY: the GET's state
        self.owner = RawPeer(address)
        self.owner.send(AddState(1, self.ROUTED_KEY, Value.of(0)))
        self.owner.answer(1)

    def ask(self, kind: str, rid: int) -> bool:
        if kind == "get":
            return super().ask(kind, rid)
        self.peer.send(SetState(rid, self.ROUTED_KEY, Value.of(rid)))
        with selectors.DefaultSelector() as selector:  # answer it as its owner; wait for the setter's answer
            selector.register(self.peer.sock, selectors.EVENT_READ, self.peer)
            selector.register(self.owner.sock, selectors.EVENT_READ, self.owner)

            def answered(timeout: float) -> bool:
                for key, _ in selector.select(timeout):
                    peer: RawPeer = key.data
                    peer.fill(timeout)
                    for message in peer.decoder.messages():
                        if peer is self.owner and isinstance(message, SetState) and message.id is not None:
                            self.owner.send(Response(message.id, Status.OK, message.value))
                        elif peer is self.peer and isinstance(message, Response) and message.id == rid:
                            return True
                return False

            # The attack's end gives a set in flight the same grace as a GET (it once
            # counted a set answered a few ms later as lost, failing test_chaos_all).
            return self._wait(answered)

    def close(self) -> None:
        super().close()
        self.owner.close()


def _quantiles(waits: Sequence[float]) -> tuple[Optional[float], Optional[float], Optional[float]]:
    if not waits:
        return None, None, None
    ordered = sorted(waits)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (round(statistics.median(ordered) * 1000, 1), round(p99 * 1000, 1), round(ordered[-1] * 1000, 1))


class _Changer:
    """An owner changing scores of its states, one NOTIFY_STATE at a time, each sent
    when the last is answered (the issue's owner)."""

    def __init__(self, owner: RawPeer, prefix: str, count: int) -> None:
        self.owner, self.prefix, self.count = owner, prefix, count
        self.changes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-changer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rid = 10_000_000
        try:
            while not self._stop.is_set():
                rid += 1
                index = (self.changes * 7919) % self.count
                value = Value.of({"score": (self.changes * 31) % 1000, "kind": "a"})
                self.owner.send(NotifyState(rid, f"{self.prefix}{index:07d}", value))
                self.owner.answer(rid, 60)
                self.changes += 1
        except Exception:  # the daemon went away or did not answer in 60 s: counted as is
            return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(70)


def all_at_once(run: Run) -> Row:
    """Every scenario of issue 29 at once (see the module's docstring)."""
    row: Row = {}
    target = run.target
    def part(name: str, count: int) -> int:
        return 0 if name in run.without else count

    windowed, seeded = part("windows", run.n(100_000, 100)), part("seed", run.n(1_000_000, 100))
    fetches, attackers = part("windows", run.n(100)), part("auth", run.n(60))
    ws_count, partial_count = part("ws", run.n(100)), part("tcp", run.n(400))
    idle_handshakes, hellos = part("tls", run.n(300)), part("tls", run.n(100))
    seconds = run.seconds(30.0, 3.0)
    flags = ["--auth", str(users_file(target)), "--http-port", "0"]
    if run.scale < 1:  # the partial frames must outlive their timeout, as at full size
        flags += ["--frame-timeout", f"{max(1.0, 10 * run.scale):g}"]
    if "tls" not in run.without:
        cert, key = self_signed(target.workdir)
        flags += ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-port", "0"]
    with target.daemon(*flags, own=True) as daemon:
        web = web_address(daemon)
        tls_address: Optional[tuple[str, int]] = None
        if "tls" not in run.without and daemon.proc is not None:
            line = stdout_line(daemon.proc, 15.0).decode().strip()  # "tls on HOST:PORT", after the web line
            tls_address = (daemon.address[0], int(line.rpartition(":")[2]))
        tls_socks: list[socket.socket] = []
        tls_after = "not tried"
        owners = _json_states(daemon.address, "q/", windowed)
        owners += _json_states(daemon.address, "s/", seeded)
        window_peer = RawPeer(daemon.address)
        seed_peer = RawPeer(daemon.address)
        drainer = Drainer([window_peer, seed_peer])
        tcp_peers: list[RawPeer] = []
        ws_peers: list[RawWsPeer] = []
        ws_sent = 0
        logins: list[Optional[float]] = []
        flood = Flood(daemon.address, attackers, repeat=True)
        changer: Optional[_Changer] = None
        wanted = fetches + (1 if seeded else 0)

        def answered() -> int:
            return drainer.frames(window_peer, FrameType.RESPONSE) + drainer.frames(seed_peer, FrameType.RESPONSE)

        try:
            with watched(daemon, row, health=False):
                probe = HealthPeer(daemon.address, _ProbeLoop)
                try:
                    started = time.monotonic()
                    if attackers:
                        flood.start()
                    if fetches:
                        window_peer.sock.sendall(b"".join(encode(FetchQuery(i + 1, _sorted_query("q/")))
                                                          for i in range(fetches)))
                        changer = _Changer(owners[0], "q/", min(windowed, 100_000))
                    if seeded:
                        seed_peer.sock.sendall(encode(FetchQuery(1, _sorted_query("s/"))))
                    ws_sent = open_and_send(ws_peers, ws_count, seconds,
                                            lambda: RawWsPeer((web.host, web.port), tls=web.tls),
                                            lambda peer, timeout: peer.send_frame_start(MiB, MiB - 1, timeout))
                    open_and_send(tcp_peers, partial_count, seconds, lambda: RawPeer(daemon.address),
                                  send_partial_frame)
                    if tls_address is not None:
                        hello = huge_client_hello()
                        for index in range(idle_handshakes + hellos):
                            try:
                                sock = socket.create_connection(tls_address, timeout=5)
                            except OSError:
                                continue
                            tls_socks.append(sock)
                            if index >= idle_handshakes:
                                with contextlib.suppress(OSError):
                                    sock.sendall(hello)
                            sock.setblocking(False)
                    end = started + seconds
                    while time.monotonic() < end:
                        if attackers:
                            logins.append(login_seconds(daemon.address))
                        time.sleep(max(0.0, min(2.0, end - time.monotonic())))
                    wait_until(lambda: answered() >= wanted, 60.0, 0.05)  # returns once all are in
                finally:
                    row.update(probe.stop())
                    kinds = probe.result.get("kinds", [])
                    for kind in ("get", "set"):
                        waits = [w for k, w in zip(kinds, probe.waits, strict=False) if k == kind]
                        row[f"{kind}_p50_ms"], row[f"{kind}_p99_ms"], row[f"{kind}_max_ms"] = _quantiles(waits)
                    if attackers:
                        flood.stop()
                    if changer is not None:
                        changer.stop()
            ws_ends = ws_closures(ws_peers, 1.0)
            tcp_ends = closures(tcp_peers, 1.0)
            tls_ends = tls_endings(tls_socks, 1.0)
            if tls_address is not None:
                tls_after = real_tls_peer(tls_address)
        finally:
            for sock in tls_socks:
                sock.close()
            drainer.stop()
            for ws in ws_peers:
                ws.close()
            close_all([*tcp_peers, window_peer, seed_peer, *owners])
    got = answered()
    budget_mb = (DEFAULT_MAX_INPUT_BUFFER + 2 * DEFAULT_HARD_LIMIT + CHECKS_AT_ONCE * ARGON2_MEMORY) / MiB
    row["rss_budget_mb"] = round(budget_mb, 1)
    row["fetches_answered"] = f"{got} of {wanted}"
    row["changes"] = changer.changes if changer is not None else 0
    done = sorted(t for t in logins if t is not None)
    row["login_max_s"] = round(done[-1], 2) if done else None
    row["targets"] = targets(row, got == wanted)
    row["outcome"] = (
        (f"without {', '.join(sorted(run.without))}; " if run.without else "")
        + f"{windowed:,} + {seeded:,} JSON states; {fetches} window fetches + {1 if seeded else 0} seed: "
        f"{got} of {wanted} answered; "
        f"{row['changes']:,} owner changes; {flood.sent} wrong AUTHENTICATE from {attackers} connections, "
        f"real logins {len(done)} of {len(logins)} OK (max {row['login_max_s']} s); "
        f"WebSocket partial frames ({ws_sent} of {ws_count} sent): {describe(ws_ends)}; TCP partial frames: {describe(tcp_ends)}; "
        f"TLS: {idle_handshakes} idle handshakes + {hellos} of 100 KiB: {describe(tls_ends)}, real TLS peer: {tls_after}; "
        f"probe timeouts {row.get('health_timeouts')}{'; ' + str(row['health_lost']) if row.get('health_lost') else ''}")
    return row


def targets(row: Row, all_answered: bool) -> dict[str, str]:
    """PASS or FAIL per target of issue 29, with the figure measured."""
    out: dict[str, str] = {}

    def check(name: str, value: object, limit: float, waits: bool = False) -> None:
        # A probe request still unanswered at the end waited longer than any figure says.
        ok = isinstance(value, (int, float)) and value <= limit and not (waits and row.get("health_timeouts"))
        out[name] = f"{'PASS' if ok else 'FAIL'} ({value}; target <= {limit:g})"

    for kind in ("get", "set"):
        check(f"{kind.upper()} p99 ms", row.get(f"{kind}_p99_ms"), TARGET_P99_MS, waits=True)
        check(f"{kind.upper()} max ms", row.get(f"{kind}_max_ms"), TARGET_MAX_MS, waits=True)
    check("RSS growth MB", row.get("rss_growth_mb"), float(str(row.get("rss_budget_mb"))))
    out["every fetch answered"] = f"{'PASS' if all_answered else 'FAIL'} ({row.get('fetches_answered')})"
    return out

