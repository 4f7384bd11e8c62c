"""Area 19, TLS handshakes (issue 29, PROTOCOL.md 10.7 and 15.6): a handshake in progress
is a connection. It counts against ``--max-connections`` and the descriptor budget, it
is closed after ``--tls-handshake-timeout``, and a connection refused on a TLS port gets
a TLS alert and a close, never plaintext jet bytes. On the jet TLS port and on the
WebSocket (https) port alike.

Real jetd processes with a real TLS listener on 127.0.0.1; the idle "handshakes" are
plain TCP connections that never send a ClientHello. Waits are generous and no test
asserts how fast anything happened, only what happened.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import selectors
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from jetwire import Close
from jetwire import Decoder
from jetwire import Info
from jetwire import Status
from tests.conftest import REPO
from tests.conftest import DaemonProcess
from tests.jetd.tls_testlib import client_context

LIMIT = 8  # --max-connections in these tests: small, so that the tests stay small
WAIT = 30.0  # seconds we wait for something jetd must do (generous: the machine is shared)
# PROTOCOL.md 15.6: the record jetd refuses a TLS connection with, a fatal internal_error
# alert (content type 21, record version 3.3, length 2, level 2 fatal, description 80).
ALERT = b"\x15\x03\x03\x00\x02\x02\x50"
FD_LIMIT = 64




def tls_args(pki: dict[str, Path], *more: str) -> tuple[str, ...]:
    return ("--tls-cert", str(pki["server"]), "--tls-key", str(pki["server-key"]), *more)


def idle(address: tuple[str, int], count: int, into: list[socket.socket]) -> list[socket.socket]:
    """``count`` TCP connections that never send a byte (no ClientHello)."""
    made = []
    for _ in range(count):
        sock = socket.create_connection(address, timeout=WAIT)
        sock.setblocking(False)
        made.append(sock)
        into.append(sock)
    return made


def open_sockets(daemon: DaemonProcess) -> int:
    """Sockets jetd holds (its other descriptors, such as the loop's own reserve of
    /dev/null, may be opened lazily: they are not counted)."""
    fd_dir = f"/proc/{daemon.proc.pid}/fd"
    count = 0
    for name in os.listdir(fd_dir):
        with contextlib.suppress(OSError):  # closed meanwhile
            count += os.readlink(f"{fd_dir}/{name}").startswith("socket:")
    return count


def wait_for_sockets(daemon: DaemonProcess, at_least: int) -> int:
    """Wait until jetd holds ``at_least`` sockets (it accepted what we opened)."""
    deadline = time.monotonic() + WAIT
    while (held := open_sockets(daemon)) < at_least:
        assert time.monotonic() < deadline, f"jetd holds {held} sockets, expected {at_least}: {daemon.stderr()}"
        time.sleep(0.05)
    return held


def ended(sock: socket.socket, timeout: float = WAIT) -> bytes | None:
    """What jetd sent on ``sock`` before closing it, or None if it is still open after
    ``timeout`` seconds. A reset counts as closed, with what was read before it."""
    got = b""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            return None
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            continue
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk


def still_open(sock: socket.socket) -> bool:
    return ended(sock, timeout=0.05) is None


def tls_refusal(address: tuple[str, int], pki: dict[str, Path]) -> BaseException:
    """A real TLS client's handshake against a full jetd: returns the error it got."""
    raw = socket.create_connection(address, timeout=WAIT)
    try:
        client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1").close()
    except (ssl.SSLError, ConnectionError) as exc:
        return exc
    finally:
        raw.close()
    raise AssertionError("a TLS peer completed its handshake with a full jetd")


def assert_clean_refusal(error: BaseException) -> None:
    """PROTOCOL.md 15.6: an alert or a close, never plaintext (which OpenSSL reports as
    WRONG_VERSION_NUMBER or a record it cannot parse)."""
    text = str(error)
    assert "WRONG_VERSION_NUMBER" not in text and "RECORD_LAYER" not in text, text
    assert "ALERT_INTERNAL_ERROR" in text or isinstance(error, (ssl.SSLEOFError, ConnectionError)), repr(error)


def logged_count(log: str, pattern: str) -> int:
    """The sum of the counts of jetd's rate-limited log lines matching ``pattern`` (one
    group: the count)."""
    return sum(int(found) for found in re.findall(pattern, log))


REFUSED = r"refused (\d+) (?:more )?connection"


def test_idle_handshakes_count_against_max_connections(start_jetd: Callable[..., DaemonProcess],
                                                       pki: dict[str, Path], sockets: list[socket.socket]) -> None:
    """(a), (c): LIMIT idle handshakes fill the limit; the next connections get the alert
    and a close, with no handshake; a real TLS peer is refused the same way, cleanly."""
    daemon = start_jetd(*tls_args(pki, "--max-connections", str(LIMIT), "--tls-handshake-timeout", "120"))
    base = open_sockets(daemon)
    held = idle(daemon.address, LIMIT, sockets)
    wait_for_sockets(daemon, base + LIMIT)
    extra = idle(daemon.address, 6, sockets)
    for sock in extra:
        assert ended(sock) == ALERT
    assert_clean_refusal(tls_refusal(daemon.address, pki))
    assert all(still_open(sock) for sock in held)
    assert open_sockets(daemon) == base + LIMIT, (open_sockets(daemon), base)
    assert daemon.stop() == 0
    log = daemon.stderr()
    assert logged_count(log, REFUSED) == 7, log
    assert "refused=7 tls_handshake_timeouts=0" in log, log  # the exit line's counters
    assert f"too many connections (max {LIMIT})" in log, log


@pytest.mark.parametrize("loop", ["auto", "asyncio"])  # uvloop's and asyncio's ssl_handshake_timeout
def test_idle_handshakes_time_out_and_a_real_peer_gets_in(start_jetd: Callable[..., DaemonProcess],
                                                         pki: dict[str, Path], sockets: list[socket.socket],
                                                         loop: str) -> None:
    """(b), (d): handshakes not completed within --tls-handshake-timeout are closed; then a
    real TLS peer connects and works."""
    from peer import Peer

    daemon = start_jetd(*tls_args(pki, "--max-connections", str(LIMIT), "--tls-handshake-timeout", "1",
                                  "--loop", loop))
    base = open_sockets(daemon)
    held = idle(daemon.address, LIMIT, sockets)
    for sock in held:
        assert ended(sock) == b""  # a plain close: no byte, plaintext or not
    deadline = time.monotonic() + WAIT
    while open_sockets(daemon) > base:
        assert time.monotonic() < deadline, (open_sockets(daemon), base)
        time.sleep(0.05)
    # At once: jetd's count lets go of a handshake when it expires, before its socket closes.
    try:
        with Peer(*daemon.address, ssl=client_context(pki), timeout=WAIT) as real:
            real.add_state("tls/t", 1.5)
            assert real.get("tls/t") == 1.5
    except Exception as exc:
        raise AssertionError(f"the real TLS peer: {exc!r}; jetd's log:\n{daemon.stderr()}") from exc
    assert daemon.stop() == 0
    log = daemon.stderr()
    assert logged_count(log, r"closed (\d+) (?:more )?connection\(s\) whose TLS handshake") == LIMIT, log
    assert f"tls_handshake_timeouts={LIMIT}" in log, log


def test_tls_refusal_out_of_descriptors_is_never_plaintext(start_jetd: Callable[..., DaemonProcess],
                                                           pki: dict[str, Path], tmp_path: Path,
                                                           sockets: list[socket.socket]) -> None:
    """The reported case: with few descriptors (64 here, 256 in the report), idle
    handshakes used to take them all, and a real TLS peer was then refused with INFO and
    CLOSE in plaintext (its client saw WRONG_VERSION_NUMBER)."""
    (tmp_path / "sitecustomize.py").write_text(
        f"import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, ({FD_LIMIT}, {FD_LIMIT}))\n"
    )
    daemon = start_jetd(*tls_args(pki, "--tls-handshake-timeout", "120"),
                        env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    opened = idle(daemon.address, FD_LIMIT + 16, sockets)
    assert ended(opened[-1]) == ALERT  # beyond the descriptors jetd has: refused
    refused = [got for got in (ended(sock, timeout=0.05) for sock in opened[:-1]) if got is not None]
    assert all(got == ALERT for got in refused), refused[:3]
    assert len(refused) >= 16, len(refused)
    assert_clean_refusal(tls_refusal(daemon.address, pki))
    assert daemon.stop() == 0
    log = daemon.stderr()
    assert "out of file descriptors" in log, log


def web_port(daemon: DaemonProcess) -> int:
    assert daemon.proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(daemon.proc.stdout, selectors.EVENT_READ)
    line = b""
    while not line.endswith(b"\n"):
        assert selector.select(WAIT), daemon.stderr()
        line += os.read(daemon.proc.stdout.fileno(), 1)
    selector.close()
    text = line.decode().strip()
    assert text.startswith("web on https://127.0.0.1:"), text
    return int(text.rsplit(":", 1)[1].rstrip("/"))


def test_websocket_tls_handshakes_share_the_count_and_the_timeout(start_jetd: Callable[..., DaemonProcess],
                                                                  pki: dict[str, Path],
                                                                  sockets: list[socket.socket]) -> None:
    """The https/wss listener: its handshakes count with the jet port's in one limit,
    are refused with the same alert, and time out with the same flag."""
    # 5 s, not less: the wss peer at the end must finish its own handshake within it on a
    # loaded machine (it once did not in a fresh-clone run at 2 s; not explained yet).
    daemon = start_jetd(*tls_args(pki, "--max-connections", str(LIMIT), "--tls-handshake-timeout", "5",
                                  "--http-port", "0"))
    web = ("127.0.0.1", web_port(daemon))
    base = open_sockets(daemon)
    held = idle(daemon.address, LIMIT // 2, sockets) + idle(web, LIMIT // 2, sockets)
    wait_for_sockets(daemon, base + LIMIT)
    for address in (web, daemon.address):
        (extra,) = idle(address, 1, sockets)
        assert ended(extra) == ALERT
    assert_clean_refusal(tls_refusal(web, pki))
    for sock in held:
        assert ended(sock) == b""  # --tls-handshake-timeout on both ports
    # Then both ports serve again: a wss peer gets its INFO.
    from websockets.sync.client import connect

    with connect(f"wss://127.0.0.1:{web[1]}/jet", ssl=client_context(pki), subprotocols=["jet"],
                 open_timeout=WAIT) as ws:
        decoder = Decoder()
        decoder.receive_data(ws.recv(timeout=WAIT))
        assert isinstance(decoder.next_message(), Info)
    assert daemon.stop() == 0


def test_a_tls_peer_beyond_a_limit_full_of_peers_is_told_inside_tls(start_jetd: Callable[..., DaemonProcess],
                                                                    pki: dict[str, Path]) -> None:
    """PROTOCOL.md 15.6: when the peers alone fill the limit, one connection at a time is
    let through its handshake, and gets INFO and CLOSE LIMIT_EXCEEDED inside TLS."""
    from peer import Peer

    daemon = start_jetd(*tls_args(pki, "--max-connections", "2"))
    with Peer(*daemon.address, ssl=client_context(pki), timeout=WAIT) as first, \
            Peer(*daemon.address, ssl=client_context(pki), timeout=WAIT) as second:
        first.add_state("tls/a", 1)
        assert second.get("tls/a") == 1
        raw = socket.create_connection(daemon.address, timeout=WAIT)
        with client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as third:
            decoder = Decoder()
            got: list[object] = []
            while len(got) < 2:
                message = decoder.next_message()
                if message is not None:
                    got.append(message)
                    continue
                data = third.recv(65536)
                assert data, got
                decoder.receive_data(data)
        assert isinstance(got[0], Info), got
        assert isinstance(got[1], Close) and got[1].status == Status.LIMIT_EXCEEDED, got
        assert "too many connections (max 2)" in got[1].message, got
    assert daemon.stop() == 0


def test_the_flag_defaults_to_10_s_is_checked_and_documented() -> None:
    from jetd.config import ConfigError
    from jetd.config import build_parser
    from jetd.config import config_from_args

    assert config_from_args([]).tls_handshake_timeout == 10.0
    assert config_from_args(["--tls-handshake-timeout", "0.5"]).tls_handshake_timeout == 0.5
    for bad in ("0", "-1"):
        with pytest.raises(ConfigError, match="tls_handshake_timeout must be positive"):
            config_from_args(["--tls-handshake-timeout", bad])
    assert "--tls-handshake-timeout" in build_parser().format_help()
