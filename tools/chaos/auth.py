"""Issue 29's login attacks: password checks (argon2id at its default cost) flooded by
many connections, while a real user logs in now and then from another address.

The attackers connect from 127.0.0.2, the real user from 127.0.0.1 (Linux routes all of
127/8 to loopback), so the per-source limit of PROTOCOL.md 15.2 can tell them apart as it
would two machines. The daemon's "password checks idle" log lines give how many checks
ran, were dropped (their connection had closed) and were refused (queue full)."""

from __future__ import annotations

import re
import selectors
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Optional

from jetwire import Authenticate
from jetwire import Decoder
from jetwire import Info
from jetwire import Response
from jetwire import Status
from jetwire import encode

from .harness import Daemon
from .harness import Target
from .harness import watched

Row = dict[str, object]

ATTACKER_HOST = "127.0.0.2"
USER, PASSWORD = "alice", "alice-pw"
IDLE_LINE = re.compile(r"password checks idle: (\d+) run, (\d+) dropped \(connection closed\), (\d+) refused")
LOGIN_TIMEOUT = 120.0


def users_file(target: Target) -> Path:
    """A users file: ``alice`` with a default-cost argon2id hash (as ``jetd user add``
    writes it); anonymous peers may do anything, so the health peer works."""
    from argon2 import PasswordHasher

    from jetd.users import Grants
    from jetd.users import User
    from jetd.users import UsersFile

    path = target.workdir / "chaos-users.toml"
    if not path.exists():
        users = UsersFile()
        users.anonymous = Grants(own=[""], read=[""], write=[""])
        users.users[USER] = User(password=PasswordHasher().hash(PASSWORD), read=[""])
        users.save(path)
    return path


def _connect(address: tuple[str, int], source: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.settimeout(LOGIN_TIMEOUT)
    sock.connect(address)
    return sock


def login_seconds(address: tuple[str, int]) -> Optional[float]:
    """One real login from 127.0.0.1 on a new connection: seconds from sending
    AUTHENTICATE to its OK (None: another answer, or none within LOGIN_TIMEOUT)."""
    sock = _connect(address, "127.0.0.1")
    decoder = Decoder(max_body=1 << 24)
    try:
        started = 0.0
        sent = False
        deadline = time.monotonic() + LOGIN_TIMEOUT
        while time.monotonic() < deadline:
            data = sock.recv(65536)
            if not data:
                return None
            decoder.receive_data(data)
            for message in decoder.messages():
                if isinstance(message, Info) and not sent:
                    started = time.monotonic()
                    sock.sendall(encode(Authenticate(1, USER, PASSWORD)))
                    sent = True
                elif isinstance(message, Response) and message.id == 1:
                    return time.monotonic() - started if message.status == Status.OK else None
        return None
    except OSError:
        return None
    finally:
        sock.close()


class Flood:
    """``connections`` attackers from 127.0.0.2, each sending a wrong AUTHENTICATE and,
    when ``repeat``, another one as soon as it is answered (a new connection when the
    daemon closes it); without ``repeat`` each closes right after sending."""

    def __init__(self, address: tuple[str, int], connections: int, repeat: bool) -> None:
        self.address = address
        self.connections = connections
        self.repeat = repeat
        self.sent = 0
        self.answers: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="auth-flood", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _open(self, selector: selectors.BaseSelector) -> None:
        try:
            sock = _connect(self.address, ATTACKER_HOST)
        except OSError:
            return
        sock.sendall(encode(Authenticate(1, USER, "wrong")))
        self.sent += 1
        if not self.repeat:
            sock.close()
            return
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, Decoder(max_body=1 << 24))

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        for _ in range(self.connections):
            self._open(selector)
        if not self.repeat:
            return
        while not self._stop.is_set():
            for key, _events in selector.select(0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                decoder: Decoder = key.data
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if data:
                    decoder.receive_data(data)
                    for message in decoder.messages():
                        if isinstance(message, Response):
                            name = message.status.name
                            self.answers[name] = self.answers.get(name, 0) + 1
                            try:
                                sock.sendall(encode(Authenticate(1, USER, "wrong")))
                                self.sent += 1
                            except OSError:
                                pass
                    continue
                selector.unregister(sock)
                sock.close()
                self._open(selector)  # the daemon closed it: come back
        for key in list(selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        selector.close()


def _checks(daemon: Daemon) -> str:
    found = IDLE_LINE.findall(daemon.stderr())
    if not found:
        return "checks: no 'password checks idle' line"
    run, dropped, refused = (int(x) for x in found[-1])
    return f"checks {run} run, {dropped} dropped, {refused} refused"


def _logins(times: list[Optional[float]]) -> str:
    done = sorted(t for t in times if t is not None)
    failed = len(times) - len(done)
    if not done:
        return f"real logins: none of {len(times)} answered OK"
    text = (f"real logins from another address: {len(done)}, p50 {statistics.median(done):.2f} s, "
            f"max {done[-1]:.2f} s")
    return text + (f", {failed} not OK" if failed else "")


def auth_close(target: Target, connections: int = 60) -> Row:
    """ISSUE 29: 60 connections each send one wrong AUTHENTICATE and close; then a real
    login (figures: checks run/dropped/refused, the login's time)."""
    row: Row = {}
    users = users_file(target)
    with target.daemon("--auth", str(users), "--log-level", "INFO", own=True) as daemon:
        with watched(daemon, row):
            flood = Flood(daemon.address, connections, repeat=False)
            flood.start()
            flood.stop()
            first = login_seconds(daemon.address)
            time.sleep(1.0)  # the dropped checks' line
        row["outcome"] = f"{flood.sent} wrong AUTHENTICATE then close; {_checks(daemon)}; " + _logins([first])
    return row


def auth_flood(target: Target, connections: int = 60, seconds: float = 30.0) -> Row:
    """ISSUE 29: 60 connections repeat wrong AUTHENTICATEs for 30 s; a real user logs in
    from another address every 2 s (figures: its login times)."""
    row: Row = {}
    users = users_file(target)
    times: list[Optional[float]] = []
    with target.daemon("--auth", str(users), "--log-level", "INFO", own=True) as daemon:
        with watched(daemon, row):
            flood = Flood(daemon.address, connections, repeat=True)
            flood.start()
            try:
                time.sleep(1.0)  # the flood is on
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    times.append(login_seconds(daemon.address))
                    time.sleep(2.0)
            finally:
                flood.stop()
            time.sleep(1.0)
        answers = ", ".join(f"{n} {name}" for name, n in sorted(flood.answers.items()))
        row["outcome"] = (f"{flood.sent} wrong AUTHENTICATE ({answers}); {_checks(daemon)}; " + _logins(times))
    return row


def auth_logins(target: Target, clients: int = 8, seconds: float = 20.0) -> Row:
    """ISSUE 29: ``clients`` real users log in with the right password, each again as
    soon as it is answered, from 127.0.0.1: no failure delay holds a check back, so
    checks run back to back, as many at once as jetd runs (what an attacker with many
    addresses and a password list would cause). Figures: the health peer's latency
    while the checks take what CPU jetd gives them, and the logins' times."""
    row: Row = {}
    users = users_file(target)
    times: list[Optional[float]] = []
    lock = threading.Lock()
    end = time.monotonic() + seconds

    with target.daemon("--auth", str(users), own=True) as daemon:

        def client() -> None:
            while time.monotonic() < end:
                took = login_seconds(daemon.address)
                with lock:
                    times.append(took)

        with watched(daemon, row):
            threads = [threading.Thread(target=client, name=f"login-{i}", daemon=True) for i in range(clients)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(seconds + LOGIN_TIMEOUT)
        done = sorted(t for t in times if t is not None)
        rate = f"{len(done) / seconds:.1f}/s"
        row["outcome"] = f"{clients} clients logging in back to back: {rate}; " + _logins(times).replace(
            "real logins from another address", "logins")
    return row
